//! The `attach_events` table: the attach history, one hash chain per volume
//! (`domain/history.rs`), each chain's head on its volume's row and, once retention pruned its
//! oldest events, its start in `attach_event_starts`. Appended in the transaction of the change
//! it records, which holds the volume's row: a volume's events are written one at a time, on any
//! node.

use super::sql::{Param, Row, Tx};
use super::{DbKind, StoreError};
use crate::domain::history::{Access, AttachEvent, EventFilter, GENESIS, Head, NewEvent};
use crate::domain::list::Scope;
use crate::params;

const COLUMNS: &str = "id, seq, volume_id, at, event, access, outcome, project_id, attachment_id, \
     instance_uuid, host, initiator, user_id, caller_project_id, roles, service_token, request_id, \
     global_request_id, node, driver_digest, prev_hash, hash";

fn from_row(r: &Row) -> Result<AttachEvent, StoreError> {
    let id = r.text(0)?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("attach event {id}: {what}"));
    let access = Access::parse(&r.text(5)?).ok_or_else(|| corrupt("access"))?;
    let roles: Vec<String> = serde_json::from_str(&r.text(14)?).map_err(|_| corrupt("roles"))?;
    Ok(AttachEvent {
        seq: r.int(1)?,
        fields: NewEvent {
            volume_id: r.text(2)?,
            at: r.int(3)?,
            event: r.text(4)?,
            access,
            outcome: r.text(6)?,
            project_id: r.text(7)?,
            attachment_id: r.opt_text(8)?,
            instance_uuid: r.opt_text(9)?,
            host: r.opt_text(10)?,
            initiator: r.opt_text(11)?,
            user_id: r.text(12)?,
            caller_project_id: r.text(13)?,
            roles,
            service_token: r.flag(15)?,
            request_id: r.opt_text(16)?,
            global_request_id: r.opt_text(17)?,
            node: r.text(18)?,
            driver_digest: r.opt_text(19)?,
        },
        prev_hash: r.text(20)?,
        hash: r.text(21)?,
        id,
    })
}

fn events(rows: Vec<Row>) -> Result<Vec<AttachEvent>, StoreError> {
    rows.iter().map(from_row).collect()
}

/// The heads this process last wrote, by volume: a guess that saves reading the head when it is
/// right (the usual case: a volume's events come from one node, one after the other). Never
/// trusted: the head is moved on only where it still is what the guess says (`seq` and `hash`,
/// in the statement that moves it), so a guess made stale by another node, or by a transaction
/// of this process that rolled back, costs one statement that changes nothing, then the head is
/// read.
static HEADS: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, (i64, String)>>> =
    std::sync::LazyLock::new(Default::default);

/// Guesses kept at most; beyond, the guesses are dropped and made again.
const HEADS_KEPT: usize = 100_000;

fn guessed_head(volume_id: &str) -> Option<(i64, String)> {
    HEADS.lock().unwrap_or_else(|p| p.into_inner()).get(volume_id).cloned()
}

fn guess_head(volume_id: &str, seq: i64, hash: &str) {
    let mut heads = HEADS.lock().unwrap_or_else(|p| p.into_inner());
    if heads.len() >= HEADS_KEPT {
        heads.clear();
    }
    heads.insert(volume_id.to_string(), (seq, hash.to_string()));
}

/// Appends an event to its volume's chain. The caller's transaction holds the volume's row,
/// which holds the chain's head (`history_seq`, `history_hash`).
pub async fn append(tx: &mut Tx, fields: NewEvent) -> Result<AttachEvent, StoreError> {
    // The head as this process left it, if it still is: moved on and the event inserted by one
    // statement on PostgreSQL (a round trip each), by two on SQLite (no data-modifying `WITH`).
    if let Some((seq, prev)) = guessed_head(&fields.volume_id) {
        let event = AttachEvent::link(event_id(fields.at), seq + 1, prev, fields);
        let appended = match tx.kind() {
            DbKind::Postgres => tx.execute(&APPEND_AFTER_HEAD, &row(&event)).await? == 1,
            DbKind::Sqlite => {
                let moved = tx
                    .execute(
                        "UPDATE volumes SET history_seq = $2, history_hash = $3 \
                         WHERE id = $1 AND history_seq = $4 AND history_hash = $5",
                        &params![&event.fields.volume_id, event.seq, &event.hash, seq, &event.prev_hash],
                    )
                    .await?
                    == 1;
                if moved {
                    insert(tx, &event).await?;
                }
                moved
            }
        };
        if appended {
            guess_head(&event.fields.volume_id, event.seq, &event.hash);
            return Ok(event);
        }
        return append_after_reading(tx, event.fields).await;
    }
    append_after_reading(tx, fields).await
}

/// [`append`], reading the chain's head first.
async fn append_after_reading(tx: &mut Tx, fields: NewEvent) -> Result<AttachEvent, StoreError> {
    let rows = tx
        .query("SELECT history_seq, history_hash FROM volumes WHERE id = $1", &params![&fields.volume_id])
        .await?;
    let row = rows.first().ok_or_else(|| {
        StoreError::Corrupt(format!("an event of volume {}, which has no row", fields.volume_id))
    })?;
    let (seq, prev) = match row.int(0)? {
        0 => (1, GENESIS.to_string()),
        last => (last + 1, row.text(1)?),
    };
    let event = AttachEvent::link(event_id(fields.at), seq, prev, fields);
    insert(tx, &event).await?;
    let f = &event.fields;
    tx.execute(
        "UPDATE volumes SET history_seq = $2, history_hash = $3 WHERE id = $1",
        &params![&f.volume_id, event.seq, &event.hash],
    )
    .await?;
    guess_head(&f.volume_id, event.seq, &event.hash);
    Ok(event)
}

/// A new event's id: a UUIDv7 whose time is the event's millisecond, so that [`get`] finds it
/// through the time index (events have no index on their id: one page fewer for each written).
fn event_id(at: i64) -> String {
    let at = u64::try_from(at).unwrap_or(0);
    let (secs, nanos) = (at / 1_000_000, (at % 1_000_000) as u32 * 1000);
    uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, secs, nanos)).to_string()
}

/// The millisecond a UUIDv7 event id carries (`None`: not such an id; an event recorded before
/// migration 0010 has a v4 id).
fn id_millis(id: &str) -> Option<i64> {
    let id = uuid::Uuid::parse_str(id).ok()?;
    if id.get_version_num() != 7 {
        return None;
    }
    let b = id.as_bytes();
    Some(b[..6].iter().fold(0i64, |ms, byte| (ms << 8) | i64::from(*byte)))
}

/// An event's row as parameters `$1..$22`, in the order of [`COLUMNS`].
fn row(event: &AttachEvent) -> Vec<Param> {
    let f = &event.fields;
    let roles = serde_json::to_string(&f.roles).expect("roles serialise");
    Vec::from(params![
        &event.id,
        event.seq,
        &f.volume_id,
        f.at,
        &f.event,
        f.access.as_str(),
        &f.outcome,
        &f.project_id,
        &f.attachment_id,
        &f.instance_uuid,
        &f.host,
        &f.initiator,
        &f.user_id,
        &f.caller_project_id,
        roles,
        f.service_token,
        &f.request_id,
        &f.global_request_id,
        &f.node,
        &f.driver_digest,
        &event.prev_hash,
        &event.hash,
    ])
}

/// The placeholders of [`row`].
const VALUES: &str = "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, \
     $19, $20, $21, $22";

/// An event's insert (made once: it runs for every event).
static INSERT: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("INSERT INTO attach_events ({COLUMNS}) VALUES ({VALUES})"));

/// PostgreSQL's [`append`] of a guessed head: the head moved on and the event inserted by one
/// statement, or neither when the guess is stale.
static APPEND_AFTER_HEAD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH moved AS (UPDATE volumes SET history_seq = $2, history_hash = $22 \
         WHERE id = $3 AND history_seq = $2 - 1 AND history_hash = $21 RETURNING id) \
         INSERT INTO attach_events ({COLUMNS}) SELECT {VALUES} FROM moved"
    )
});

async fn insert(tx: &mut Tx, event: &AttachEvent) -> Result<(), StoreError> {
    tx.execute(&INSERT, &row(event)).await?;
    Ok(())
}

/// Events in time order (`at`, then id), those of `scope`'s projects matching `filter`, after
/// the event `marker`, at most `limit`.
pub async fn list(
    tx: &mut Tx,
    scope: Scope<'_>,
    filter: &EventFilter,
    marker: Option<&AttachEvent>,
    limit: i64,
) -> Result<Vec<AttachEvent>, StoreError> {
    let (sql, params) = list_query(scope, filter, marker, limit);
    events(tx.query(&sql, &params).await?)
}

/// [`list`]'s statement. A volume's events are found through the chain's index, an attachment's
/// through its volume's (every event of an attachment is in its volume's chain), and a project's
/// or everyone's through the indexes in time order; nothing else is indexed, so that each event
/// written costs as few index pages as the lists allow.
pub(super) fn list_query(
    scope: Scope<'_>,
    filter: &EventFilter,
    marker: Option<&AttachEvent>,
    limit: i64,
) -> (String, Vec<Param>) {
    let mut clauses: Vec<String> = Vec::new();
    let mut params: Vec<Param> = Vec::new();
    let mut add = |clause: &str, values: Vec<Param>| {
        let mut text = clause.to_string();
        for v in values {
            params.push(v);
            text = text.replacen('?', &format!("${}", params.len()), 1);
        }
        clauses.push(text);
    };
    // With a volume or an attachment named, the chain's index answers (a volume's few rows,
    // sorted); the project's or the time index, which are in order, would walk every event of the
    // project or of all: the expressions keep either planner off them.
    let narrow = filter.volume_id.is_some() || filter.attachment_id.is_some();
    if let Scope::Project(p) = scope {
        add(if narrow { "project_id || '' = ?" } else { "project_id = ?" }, vec![p.into()]);
    }
    let text = |v: &Option<String>| v.clone().map(Param::from);
    if let Some(v) = text(&filter.volume_id) {
        add("volume_id = ?", vec![v]);
    }
    if let Some(a) = text(&filter.attachment_id) {
        add("volume_id IN (SELECT volume_id FROM volume_attachment WHERE id = ?)", vec![a.clone()]);
        add("attachment_id = ?", vec![a]);
    }
    for (column, value) in [("instance_uuid", &filter.instance_uuid), ("outcome", &filter.outcome)] {
        if let Some(v) = text(value) {
            add(&format!("{column} = ?"), vec![v]);
        }
    }
    if let Some(h) = &filter.host {
        add("(host = ? OR initiator = ?)", vec![h.into(), h.into()]);
    }
    if let Some(a) = filter.access {
        add("access = ?", vec![a.as_str().into()]);
    }
    let at = if narrow { "at + 0" } else { "at" };
    if let Some(t) = filter.since {
        add(&format!("{at} >= ?"), vec![t.into()]);
    }
    if let Some(t) = filter.until {
        add(&format!("{at} <= ?"), vec![t.into()]);
    }
    if let Some(m) = marker {
        add(
            &format!("({at} > ? OR ({at} = ? AND id > ?))"),
            vec![m.fields.at.into(), m.fields.at.into(), (&m.id).into()],
        );
    }
    let condition =
        if clauses.is_empty() { String::new() } else { format!("WHERE {}", clauses.join(" AND ")) };
    params.push(limit.into());
    let order = if narrow { "at + 0, id || ''" } else { "at, id" };
    (
        format!("SELECT {COLUMNS} FROM attach_events {condition} ORDER BY {order} LIMIT ${}", params.len()),
        params,
    )
}

/// One event, when `scope` may see it. An id made by [`event_id`] is looked up within its
/// millisecond through the time index; an event recorded before migration 0010 through
/// `attach_event_earlier_ids`; any other id is found in neither, without a scan.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<AttachEvent>, StoreError> {
    let (mut sql, mut params) = match id_millis(id) {
        Some(ms) => (
            format!("SELECT {COLUMNS} FROM attach_events WHERE id = $1 AND at >= $2 AND at < $3"),
            Vec::from(params![id, ms.saturating_mul(1000), ms.saturating_add(1).saturating_mul(1000)]),
        ),
        None => (
            format!(
                "SELECT {COLUMNS} FROM attach_events WHERE id = $1 AND (volume_id, seq) IN \
                 (SELECT volume_id, seq FROM attach_event_earlier_ids WHERE id = $1)"
            ),
            Vec::from(params![id]),
        ),
    };
    if let Scope::Project(p) = scope {
        params.push(p.into());
        sql.push_str(&format!(" AND project_id = ${}", params.len()));
    }
    Ok(events(tx.query(&sql, &params).await?)?.pop())
}

/// One volume's chain, in order, from `from_seq` on, at most `limit` events.
pub async fn chain(
    tx: &mut Tx,
    volume_id: &str,
    from_seq: i64,
    limit: i64,
) -> Result<Vec<AttachEvent>, StoreError> {
    events(
        tx.query(
            &format!(
                "SELECT {COLUMNS} FROM attach_events WHERE volume_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3"
            ),
            &params![volume_id, from_seq, limit],
        )
        .await?,
    )
}

/// Every volume's events in chain order (volume, then seq), after the place `after`, recorded
/// before `until` (all: `None`), at most `limit`: the whole history, or a segment of it, in pages,
/// through the chain's index.
pub async fn chains_after(
    tx: &mut Tx,
    after: Option<(&str, i64)>,
    until: Option<i64>,
    limit: i64,
) -> Result<Vec<AttachEvent>, StoreError> {
    let until = until.unwrap_or(i64::MAX);
    let rows = match after {
        None => {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM attach_events WHERE at < $1 ORDER BY volume_id, seq LIMIT $2"
                ),
                &params![until, limit],
            )
            .await?
        }
        Some((volume_id, seq)) => {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM attach_events WHERE (volume_id, seq) > ($1, $2) AND at < $3 \
                     ORDER BY volume_id, seq LIMIT $4"
                ),
                &params![volume_id, seq, until, limit],
            )
            .await?
        }
    };
    events(rows)
}

/// Every chain's recorded head, and a made-up one (seq 0) for volumes whose events have no
/// head (a head reset by hand): verifying those reports the events as unexpected.
pub async fn heads(tx: &mut Tx) -> Result<Vec<Head>, StoreError> {
    let mut out = Vec::new();
    for r in tx
        .query(
            "SELECT v.id, v.history_seq, v.history_hash, s.first_seq, s.first_prev \
             FROM volumes v LEFT JOIN attach_event_starts s ON s.volume_id = v.id \
             WHERE v.history_seq > 0 ORDER BY v.id",
            &[],
        )
        .await?
    {
        out.push(Head {
            volume_id: r.text(0)?,
            seq: r.int(1)?,
            hash: r.text(2)?,
            first_seq: r.opt_int(3)?.unwrap_or(1),
            first_prev: r.opt_text(4)?.unwrap_or_else(|| GENESIS.into()),
        });
    }
    for r in tx
        .query(
            "SELECT DISTINCT volume_id FROM attach_events e WHERE NOT EXISTS \
             (SELECT 1 FROM volumes v WHERE v.id = e.volume_id AND v.history_seq > 0)",
            &[],
        )
        .await?
    {
        out.push(Head {
            volume_id: r.text(0)?,
            seq: 0,
            hash: GENESIS.into(),
            first_seq: 1,
            first_prev: GENESIS.into(),
        });
    }
    Ok(out)
}

/// The PostgreSQL advisory lock [`prune`] holds for its write (any number no other part of Berth
/// takes: "berthprn").
const PRUNE_LOCK: i64 = 0x6265_7274_6870_726e;

/// What one [`prune`] deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub events: u64,
    /// When the last of them was recorded: where the next call may start.
    pub through: i64,
}

/// Deletes the oldest events recorded from `since` to before `before` (microseconds), at most
/// `limit` of them, and moves the start of each chain they were in to its first event left (so
/// the rest still verifies). `None` once no such event is left.
///
/// Bounded so that retention is a series of short writes (`attach::history::prune`): one write of
/// every old event held SQLite's only writer for seconds among a million. The events go in time
/// order, a range of the time index from the first to the `limit`-th (`since`, the last time of
/// the previous call, spares PostgreSQL's scans the index entries of the events it deleted, which
/// stay until a vacuum). Their chains and ids are named in lists of `limit` parameters (the last
/// repeated to fill them), so that each statement's text is the same at every call and PostgreSQL
/// plans it as lookups by key whatever its statistics say of the range.
pub async fn prune(tx: &mut Tx, since: i64, before: i64, limit: i64) -> Result<Option<Pruned>, StoreError> {
    let limit = limit.max(1);
    if tx.kind() == DbKind::Postgres {
        // Nodes prune one write at a time (SQLite has one writer anyway). Else a node still on a
        // batch another had deleted computed its chains' starts from a snapshot taken before the
        // other's next batch committed, and wrote them over that batch's: a start moved back onto
        // a deleted event, and `verify` reported the chain broken.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &params![PRUNE_LOCK]).await?;
    }
    let oldest = tx
        .query(
            "SELECT at, id, volume_id FROM attach_events WHERE at >= $1 AND at < $2 ORDER BY at, id LIMIT $3",
            &params![since, before, limit],
        )
        .await?;
    let (Some(first), Some(last)) = (oldest.first(), oldest.last()) else { return Ok(None) };
    let through = last.int(0)?;
    let range = params![through, last.text(1)?, first.int(0)?];
    const IN_RANGE: &str = "at >= $3 AND at <= $1 AND (at < $1 OR id <= $2)";
    let padded = |mut values: Vec<String>| {
        let fill = values.last().cloned().unwrap_or_default();
        values.resize(limit as usize, fill);
        values.into_iter().map(Param::from)
    };
    let ids: Vec<Param> = padded(oldest.iter().map(|r| r.text(1)).collect::<Result<_, _>>()?).collect();
    let mut volumes = oldest.iter().map(|r| r.text(2)).collect::<Result<Vec<_>, _>>()?;
    volumes.sort_unstable();
    volumes.dedup();
    let mut chains = Vec::from(range.clone());
    chains.extend(padded(volumes));
    // Where each chain the range cuts starts once it is gone: its first event after the range, or
    // (none left) after its head. A chain that still starts at its first event has no row (a
    // clock set back on some node can put a later event of a chain in the range, not its first).
    tx.execute(
        &format!(
            "INSERT INTO attach_event_starts (volume_id, first_seq, first_prev) \
             SELECT id, first_seq, first_prev FROM (SELECT v.id, \
                 COALESCE((SELECT MIN(e.seq) FROM attach_events e WHERE e.volume_id = v.id \
                     AND NOT (e.{IN_RANGE})), v.history_seq + 1) AS first_seq, \
                 COALESCE((SELECT e.prev_hash FROM attach_events e WHERE e.volume_id = v.id \
                     AND NOT (e.{IN_RANGE}) ORDER BY e.seq LIMIT 1), v.history_hash) AS first_prev \
                 FROM volumes v WHERE v.id IN ({}) AND v.history_seq > 0) starts \
             WHERE first_seq <> 1 \
             ON CONFLICT (volume_id) DO UPDATE SET first_seq = excluded.first_seq, \
                 first_prev = excluded.first_prev",
            super::placeholders(4, limit as usize)
        ),
        &chains,
    )
    .await?;
    // The ids migration 0010 kept of the events recorded before it go with their events.
    tx.execute(
        &format!(
            "DELETE FROM attach_event_earlier_ids WHERE id IN ({})",
            super::placeholders(1, limit as usize)
        ),
        &ids,
    )
    .await?;
    // Those events and no other: on PostgreSQL an event committed since they were read may lie in
    // the range too (`berth history prune --before` a time to come), and its chain was not moved.
    let mut exactly = Vec::from(range.clone());
    exactly.extend(ids.iter().cloned());
    let events = tx
        .execute(
            &format!(
                "DELETE FROM attach_events WHERE {IN_RANGE} AND id IN ({})",
                super::placeholders(4, limit as usize)
            ),
            &exactly,
        )
        .await?;
    Ok(Some(Pruned { events, through }))
}

/// What the history's tests share: a database of their own, a volume row for a chain's head,
/// an event.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use crate::store::{Store, StoreOptions};

    /// A new SQLite store in a directory of its own (kept while the directory is).
    pub(crate) async fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
        (dir, store)
    }

    /// A new PostgreSQL database on the server at `BERTH_TEST_POSTGRES` (CI's), if one is named.
    pub(crate) async fn postgres_store() -> Option<Store> {
        let url = postgres_database().await?;
        Some(Store::open(&url, &StoreOptions::default()).await.unwrap())
    }

    /// The URL of a new, empty PostgreSQL database on the server at `BERTH_TEST_POSTGRES`.
    pub(crate) async fn postgres_database() -> Option<String> {
        use sqlx::{Connection, Executor};
        let admin = std::env::var("BERTH_TEST_POSTGRES").ok()?;
        let name = format!("berth_unit_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&admin).await.expect("reach BERTH_TEST_POSTGRES");
        conn.execute(format!("CREATE DATABASE {name}").as_str()).await.unwrap();
        conn.close().await.ok();
        let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
        Some(format!("{base}/{name}"))
    }

    pub(crate) fn event(volume_id: &str, at: i64) -> NewEvent {
        NewEvent {
            volume_id: volume_id.to_string(),
            at,
            event: "reserve".into(),
            access: Access::None,
            outcome: "reserved".into(),
            project_id: "p".into(),
            attachment_id: None,
            instance_uuid: None,
            host: None,
            initiator: None,
            user_id: "u".into(),
            caller_project_id: "p".into(),
            roles: Vec::new(),
            service_token: false,
            request_id: None,
            global_request_id: None,
            node: "n".into(),
            driver_digest: None,
        }
    }

    /// The row of volume `id` in project `p`, whose chain has no event yet.
    pub(crate) async fn volume_row(tx: &mut Tx, id: &str) -> Result<u64, StoreError> {
        tx.execute(
            "INSERT INTO volumes (id, project_id, user_id, size_gib, volume_type, backend, multiattach, \
             status, attach_status, driver_data, metadata, created_at, updated_at) \
             VALUES ($1, 'p', 'u', 1, 'default', 'fake', 0, 'available', 'detached', '{}', '{}', 0, 0)",
            &params![id],
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{event, temp_store, volume_row};
    use super::*;
    use crate::domain::history::verify_chain;
    use crate::store::{Store, StoreOptions};
    use std::str::FromStr;

    #[tokio::test]
    async fn an_event_is_found_by_its_id_within_its_millisecond_and_an_earlier_one_through_the_ids_kept() {
        let (_dir, store) = temp_store().await;
        let v = uuid::Uuid::new_v4().to_string();
        let at = 1_764_000_000_123_456;
        let event = store
            .write(async |tx| {
                volume_row(tx, &v).await?;
                append(tx, event(&v, at)).await
            })
            .await
            .unwrap();
        assert_eq!(id_millis(&event.id), Some(at / 1000));
        let (plan, found, other_project) = store
            .read(async |tx| {
                let plan = tx
                    .query(
                        "EXPLAIN QUERY PLAN SELECT id FROM attach_events WHERE id = $1 AND at >= $2 AND at < $3",
                        &params![&event.id, 0, 1],
                    )
                    .await?;
                let plan: Vec<String> = plan.iter().map(|r| r.text(3)).collect::<Result<_, _>>()?;
                Ok::<_, StoreError>((
                    plan.join("; "),
                    get(tx, &event.id, Scope::All).await?,
                    get(tx, &event.id, Scope::Project("q")).await?,
                ))
            })
            .await
            .unwrap();
        assert!(plan.contains("attach_events_by_time"), "{plan}");
        assert_eq!(found.as_ref(), Some(&event));
        assert_eq!(other_project, None);

        // An event recorded before ids carried their time (migration 0010): found through the
        // ids the migration kept, and a random id that is not one of them is not found, all
        // without a scan of the events.
        let earlier = uuid::Uuid::new_v4().to_string();
        let (unknown, found, plan) = store
            .write(async |tx| {
                tx.execute("UPDATE attach_events SET id = $1 WHERE volume_id = $2", &params![&earlier, &v])
                    .await?;
                let unknown = get(tx, &earlier, Scope::Project("p")).await?;
                tx.execute(
                    "INSERT INTO attach_event_earlier_ids (id, volume_id, seq) VALUES ($1, $2, 1)",
                    &params![&earlier, &v],
                )
                .await?;
                let found = get(tx, &earlier, Scope::Project("p")).await?;
                let plan = tx
                    .query(
                        "EXPLAIN QUERY PLAN SELECT id FROM attach_events WHERE id = $1 AND (volume_id, seq) IN \
                         (SELECT volume_id, seq FROM attach_event_earlier_ids WHERE id = $1)",
                        &params![&earlier],
                    )
                    .await?;
                let plan: Vec<String> = plan.iter().map(|r| r.text(3)).collect::<Result<_, _>>()?;
                Ok::<_, StoreError>((unknown, found, plan.join("; ")))
            })
            .await
            .unwrap();
        assert_eq!(unknown, None);
        assert_eq!(found.map(|e| e.seq), Some(1));
        assert!(!plan.contains("SCAN"), "{plan}");
        // And an id that names a millisecond its event is not in is not found.
        let elsewhere = event_id(at + 5_000);
        assert_eq!(store.read(async |tx| get(tx, &elsewhere, Scope::All).await).await.unwrap(), None);
    }

    /// Events one [`prune`] from the start deleted.
    async fn prune_from_the_start(store: &Store, before: i64, limit: i64) -> u64 {
        let pruned = store.write(async |tx| prune(tx, i64::MIN, before, limit).await).await.unwrap();
        pruned.map_or(0, |p| p.events)
    }

    /// Verifies every chain: how many chains and events.
    async fn verify(store: &Store) -> (usize, usize) {
        let heads = store.read(async |tx| heads(tx).await).await.unwrap();
        let mut events = 0;
        for head in &heads {
            let chain = store.read(async |tx| chain(tx, &head.volume_id, 0, i64::MAX).await).await.unwrap();
            verify_chain(head, &chain).expect("the chain holds");
            events += chain.len();
        }
        (heads.len(), events)
    }

    #[tokio::test]
    async fn chains_recorded_before_migration_0010_still_verify_are_found_and_go_on() {
        use sqlx::migrate::Migrator;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        // The database as migrations 1 to 9 left it.
        let before = dir.path().join("migrations");
        std::fs::create_dir(&before).unwrap();
        for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if name.as_str() < "0010" {
                std::fs::copy(&path, before.join(name)).unwrap();
            }
        }
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url).unwrap().create_if_missing(true);
        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        Migrator::new(before.as_path()).await.unwrap().run(&pool).await.unwrap();
        // Two chains of three events with random (v4) ids; the second's first event pruned.
        let (whole, pruned) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
        let mut chains = Vec::new();
        for v in [&whole, &pruned] {
            let mut prev = GENESIS.to_string();
            let mut chain = Vec::new();
            for seq in 1..=3 {
                let e = AttachEvent::link(uuid::Uuid::new_v4().to_string(), seq, prev, event(v, seq * 1000));
                prev = e.hash.clone();
                chain.push(e);
            }
            chains.push(chain);
        }
        chains[1].remove(0);
        for (v, chain) in [&whole, &pruned].into_iter().zip(&chains) {
            sqlx::query(
                "INSERT INTO volumes (id, project_id, user_id, size_gib, volume_type, backend, multiattach, \
                 status, attach_status, driver_data, metadata, created_at, updated_at) \
                 VALUES (?, 'p', 'u', 1, 'default', 'fake', 0, 'available', 'detached', '{}', '{}', 0, 0)",
            )
            .bind(v)
            .execute(&pool)
            .await
            .unwrap();
            for e in chain {
                sqlx::query(
                    "INSERT INTO attach_events (id, seq, volume_id, at, event, access, outcome, project_id, \
                     user_id, caller_project_id, roles, service_token, node, prev_hash, hash) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '[]', 0, ?, ?, ?)",
                )
                .bind(&e.id)
                .bind(e.seq)
                .bind(v)
                .bind(e.fields.at)
                .bind(&e.fields.event)
                .bind(e.fields.access.as_str())
                .bind(&e.fields.outcome)
                .bind(&e.fields.project_id)
                .bind(&e.fields.user_id)
                .bind(&e.fields.caller_project_id)
                .bind(&e.fields.node)
                .bind(&e.prev_hash)
                .bind(&e.hash)
                .execute(&pool)
                .await
                .unwrap();
            }
            let (first, last) = (&chain[0], &chain[chain.len() - 1]);
            sqlx::query("INSERT INTO attach_event_heads (volume_id, seq, hash, first_seq, first_prev) VALUES (?, ?, ?, ?, ?)")
                .bind(v).bind(last.seq).bind(&last.hash).bind(first.seq).bind(&first.prev_hash)
                .execute(&pool)
                .await
                .unwrap();
        }
        pool.close().await;

        // Opened by this version: migration 0010 runs.
        let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
        assert_eq!(verify(&store).await, (2, 5));
        let old = &chains[1][1];
        let found = store.read(async |tx| get(tx, &old.id, Scope::Project("p")).await).await.unwrap();
        assert_eq!(found.as_ref(), Some(old));
        // Each chain goes on from its head.
        for (v, chain) in [&whole, &pruned].into_iter().zip(&chains) {
            let next = store.write(async |tx| append(tx, event(v, 9000)).await).await.unwrap();
            assert_eq!((next.seq, &next.prev_hash), (4, &chain[chain.len() - 1].hash));
        }
        assert_eq!(verify(&store).await, (2, 7));

        // Pruned, the earlier events take their ids along; the ones left are still found.
        let earlier_ids = async || {
            let rows = store
                .read(async |tx| tx.query("SELECT COUNT(*) FROM attach_event_earlier_ids", &[]).await)
                .await
                .unwrap();
            rows[0].int(0).unwrap()
        };
        assert_eq!(earlier_ids().await, 5);
        assert_eq!(prune_from_the_start(&store, 2500, 100).await, 3);
        assert_eq!(earlier_ids().await, 2, "the ids of the two events at 3000 stay, nothing else");
        let kept = &chains[1][1];
        let found = store.read(async |tx| get(tx, &kept.id, Scope::All).await).await.unwrap();
        assert_eq!(found.as_ref(), Some(kept));
        assert_eq!(verify(&store).await, (2, 4));
    }

    /// Retention in short writes: each deletes the oldest events up to its limit and leaves every
    /// chain verifying, those it emptied included; later events and other chains are untouched.
    #[tokio::test]
    async fn pruning_deletes_the_oldest_events_a_limited_number_at_a_time_and_every_chain_still_verifies() {
        let (_dir, store) = temp_store().await;
        prunes_the_oldest_in_steps(&store).await;
    }

    #[tokio::test]
    async fn pruning_in_steps_on_postgresql() {
        match testing::postgres_store().await {
            Some(store) => prunes_the_oldest_in_steps(&store).await,
            None => eprintln!("skipped: BERTH_TEST_POSTGRES is not set"),
        }
    }

    async fn prunes_the_oldest_in_steps(store: &Store) {
        // Three chains of four events, interleaved in time: the k-th events of the first two at
        // 10k (the same microsecond), the third's at 10k + 1.
        let volumes: Vec<String> = (0..3).map(|_| uuid::Uuid::new_v4().to_string()).collect();
        for v in &volumes {
            store.write(async |tx| volume_row(tx, v).await).await.unwrap();
        }
        for k in 1..=4 {
            for (i, v) in volumes.iter().enumerate() {
                store.write(async |tx| append(tx, event(v, 10 * k + i as i64 / 2)).await).await.unwrap();
            }
        }
        let times = async || {
            let rows =
                store.read(async |tx| tx.query("SELECT at FROM attach_events ORDER BY at", &[]).await).await;
            rows.unwrap().iter().map(|r| r.int(0).unwrap()).collect::<Vec<_>>()
        };
        // Before 31: the eight events at 10 to 30 go, two a write, oldest first, each write going
        // on from the time the last one ended at (a step may end between two events of one time).
        let mut left = times().await;
        let mut since = i64::MIN;
        for step in 0..4 {
            let pruned = store.write(async |tx| prune(tx, since, 31, 2).await).await.unwrap().unwrap();
            assert_eq!(pruned.events, 2, "step {step}");
            since = pruned.through;
            left.drain(..2);
            assert_eq!(times().await, left);
            assert_eq!(verify(store).await, (3, left.len()));
        }
        assert_eq!(since, 30);
        assert_eq!(store.write(async |tx| prune(tx, since, 31, 2).await).await.unwrap(), None);
        assert_eq!(times().await, vec![31, 40, 40, 41]);
        // A chain emptied by pruning goes on after its head.
        assert_eq!(prune_from_the_start(store, 41, 10).await, 3, "31 and the two at 40");
        assert_eq!(verify(store).await, (3, 1));
        let next = store.write(async |tx| append(tx, event(&volumes[0], 50)).await).await.unwrap();
        assert_eq!(next.seq, 5);
        assert_eq!(verify(store).await, (3, 2));
    }

    /// Every node runs the retention (`[history] keep_days`): four pruning one database at once,
    /// in steps of three events, leave every chain verifying and no old event behind. (Without
    /// [`PRUNE_LOCK`] a chain broke in about one run in twenty to forty-five.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nodes_pruning_at_once_leave_every_chain_verifying() {
        let Some(url) = testing::postgres_database().await else {
            return eprintln!("skipped: BERTH_TEST_POSTGRES is not set");
        };
        let mut nodes = Vec::new();
        for _ in 0..4 {
            nodes.push(Store::open(&url, &StoreOptions::default()).await.unwrap());
        }
        let store = &nodes[0];
        // 40 chains of 25 events, interleaved in time.
        let volumes: Vec<String> = (0..40).map(|_| uuid::Uuid::new_v4().to_string()).collect();
        for v in &volumes {
            store.write(async |tx| volume_row(tx, v).await).await.unwrap();
        }
        for k in 0..25 {
            for (i, v) in volumes.iter().enumerate() {
                store.write(async |tx| append(tx, event(v, 1000 * k + 7 * i as i64)).await).await.unwrap();
            }
        }
        for round in 1..=4 {
            let before = 5000 * round;
            let prune_all = async |node: &Store| {
                let mut since = i64::MIN;
                while let Some(step) = node.write(async |tx| prune(tx, since, before, 7).await).await.unwrap()
                {
                    since = step.through;
                }
            };
            tokio::join!(
                prune_all(&nodes[0]),
                prune_all(&nodes[1]),
                prune_all(&nodes[2]),
                prune_all(&nodes[3])
            );
            assert_eq!(verify(store).await, (40, 40 * (25 - 5 * round as usize)), "round {round}");
        }
    }

    #[tokio::test]
    async fn a_guessed_head_made_stale_by_a_rollback_or_another_writer_is_read_again() {
        let (_dir, store) = temp_store().await;
        a_stale_guess_is_read_again(&store).await;
    }

    /// PostgreSQL moves the head on and inserts the event in one statement.
    #[tokio::test]
    async fn a_guessed_head_made_stale_is_read_again_on_postgresql() {
        match testing::postgres_store().await {
            Some(store) => a_stale_guess_is_read_again(&store).await,
            None => eprintln!("skipped: BERTH_TEST_POSTGRES is not set"),
        }
    }

    async fn a_stale_guess_is_read_again(store: &Store) {
        let v = uuid::Uuid::new_v4().to_string();
        store.write(async |tx| volume_row(tx, &v).await).await.unwrap();
        let first = store.write(async |tx| append(tx, event(&v, 1)).await).await.unwrap();
        // Appended in a transaction that rolls back: the guess names an event that is not there.
        let rolled_back: Result<(), StoreError> = store
            .write(async |tx| {
                append(tx, event(&v, 2)).await?;
                Err(StoreError::Corrupt("rolled back".into()))
            })
            .await;
        assert!(rolled_back.is_err());
        let second = store.write(async |tx| append(tx, event(&v, 3)).await).await.unwrap();
        assert_eq!((second.seq, &second.prev_hash), (2, &first.hash));
        // Another writer (another node) moves the head on; this process's guess is the old head.
        let third = store.write(async |tx| append_after_reading(tx, event(&v, 4)).await).await.unwrap();
        guess_head(&v, second.seq, &second.hash);
        let fourth = store.write(async |tx| append(tx, event(&v, 5)).await).await.unwrap();
        assert_eq!((fourth.seq, &fourth.prev_hash), (4, &third.hash));
        // And a right guess moves the head on without reading it.
        let fifth = store.write(async |tx| append(tx, event(&v, 6)).await).await.unwrap();
        assert_eq!((fifth.seq, &fifth.prev_hash), (5, &fourth.hash));

        let (heads, chain) = store
            .read(async |tx| Ok::<_, StoreError>((heads(tx).await?, chain(tx, &v, 0, i64::MAX).await?)))
            .await
            .unwrap();
        assert_eq!(chain.len(), 5);
        verify_chain(&heads[0], &chain).expect("the chain holds");
    }
}

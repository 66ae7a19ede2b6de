//! The `attach_events` and `attach_event_heads` tables: the attach history, one hash chain per
//! volume (`domain/history.rs`). Appended in the transaction of the change it records, which
//! holds the volume's row: a volume's events are written one at a time, on any node.

use super::StoreError;
use super::sql::{Param, Row, Tx};
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

/// Appends an event to its volume's chain. The caller's transaction holds the volume's row.
pub async fn append(tx: &mut Tx, fields: NewEvent) -> Result<AttachEvent, StoreError> {
    // The head as this process left it, if it still is: moved on in one statement.
    if let Some((seq, prev)) = guessed_head(&fields.volume_id) {
        let event = AttachEvent::link(uuid::Uuid::new_v4().to_string(), seq + 1, prev.clone(), fields);
        let moved = tx
            .execute(
                "UPDATE attach_event_heads SET seq = $2, hash = $3 WHERE volume_id = $1 AND seq = $4 AND hash = $5",
                &params![&event.fields.volume_id, event.seq, &event.hash, seq, &prev],
            )
            .await?;
        if moved == 1 {
            insert(tx, &event).await?;
            guess_head(&event.fields.volume_id, event.seq, &event.hash);
            return Ok(event);
        }
        return append_after_reading(tx, event.fields).await;
    }
    append_after_reading(tx, fields).await
}

/// [`append`], reading the chain's head first.
async fn append_after_reading(tx: &mut Tx, fields: NewEvent) -> Result<AttachEvent, StoreError> {
    let head = tx
        .query("SELECT seq, hash FROM attach_event_heads WHERE volume_id = $1", &params![&fields.volume_id])
        .await?
        .first()
        .map(|r| Ok::<_, StoreError>((r.int(0)?, r.text(1)?)))
        .transpose()?;
    let (seq, prev) = match &head {
        Some((seq, hash)) => (seq + 1, hash.clone()),
        None => (1, GENESIS.to_string()),
    };
    let event = AttachEvent::link(uuid::Uuid::new_v4().to_string(), seq, prev, fields);
    insert(tx, &event).await?;
    let f = &event.fields;
    if head.is_some() {
        tx.execute(
            "UPDATE attach_event_heads SET seq = $2, hash = $3 WHERE volume_id = $1",
            &params![&f.volume_id, event.seq, &event.hash],
        )
        .await?;
    } else {
        tx.execute(
            "INSERT INTO attach_event_heads (volume_id, seq, hash, first_seq, first_prev) \
             VALUES ($1, $2, $3, 1, $4)",
            &params![&f.volume_id, event.seq, &event.hash, GENESIS],
        )
        .await?;
    }
    guess_head(&f.volume_id, event.seq, &event.hash);
    Ok(event)
}

async fn insert(tx: &mut Tx, event: &AttachEvent) -> Result<(), StoreError> {
    let f = &event.fields;
    let roles = serde_json::to_string(&f.roles).expect("roles serialise");
    tx.execute(
        &format!(
            "INSERT INTO attach_events ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
             $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)"
        ),
        &params![
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
        ],
    )
    .await?;
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

/// One event, when `scope` may see it.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<AttachEvent>, StoreError> {
    let found = match scope {
        Scope::All => {
            tx.query(&format!("SELECT {COLUMNS} FROM attach_events WHERE id = $1"), &params![id]).await?
        }
        Scope::Project(p) => {
            tx.query(
                &format!("SELECT {COLUMNS} FROM attach_events WHERE id = $1 AND project_id = $2"),
                &params![id, p],
            )
            .await?
        }
    };
    Ok(events(found)?.pop())
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

/// Every chain's recorded head, and a made-up one (seq 0) for volumes whose events have no
/// head row (a head deleted by hand): verifying those reports the events as unexpected.
pub async fn heads(tx: &mut Tx) -> Result<Vec<Head>, StoreError> {
    let mut out = Vec::new();
    for r in tx
        .query(
            "SELECT volume_id, seq, hash, first_seq, first_prev FROM attach_event_heads ORDER BY volume_id",
            &[],
        )
        .await?
    {
        out.push(Head {
            volume_id: r.text(0)?,
            seq: r.int(1)?,
            hash: r.text(2)?,
            first_seq: r.int(3)?,
            first_prev: r.text(4)?,
        });
    }
    for r in tx
        .query(
            "SELECT DISTINCT volume_id FROM attach_events e WHERE NOT EXISTS \
             (SELECT 1 FROM attach_event_heads h WHERE h.volume_id = e.volume_id)",
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

/// Deletes the events recorded before `before` (microseconds), and moves each chain's start to
/// its first event left (so the rest still verifies). Returns how many were deleted.
pub async fn prune(tx: &mut Tx, before: i64) -> Result<u64, StoreError> {
    let deleted = tx.execute("DELETE FROM attach_events WHERE at < $1", &params![before]).await?;
    if deleted > 0 {
        tx.execute(
            "UPDATE attach_event_heads SET \
             first_prev = COALESCE((SELECT e.prev_hash FROM attach_events e \
                 WHERE e.volume_id = attach_event_heads.volume_id ORDER BY e.seq LIMIT 1), hash), \
             first_seq = COALESCE((SELECT MIN(e.seq) FROM attach_events e \
                 WHERE e.volume_id = attach_event_heads.volume_id), seq + 1)",
            &[],
        )
        .await?;
    }
    Ok(deleted)
}

/// Every event recorded before `until` (all: `None`), chain by chain, in order: a segment to
/// archive before [`prune`].
pub async fn segment(tx: &mut Tx, until: Option<i64>) -> Result<Vec<AttachEvent>, StoreError> {
    let until = until.unwrap_or(i64::MAX);
    events(
        tx.query(
            &format!("SELECT {COLUMNS} FROM attach_events WHERE at < $1 ORDER BY volume_id, seq"),
            &params![until],
        )
        .await?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::history::verify_chain;
    use crate::store::{Store, StoreOptions};

    fn event(volume_id: &str, n: i64) -> NewEvent {
        NewEvent {
            volume_id: volume_id.to_string(),
            at: n,
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

    #[tokio::test]
    async fn a_guessed_head_made_stale_by_a_rollback_or_another_writer_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
        let v = uuid::Uuid::new_v4().to_string();
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

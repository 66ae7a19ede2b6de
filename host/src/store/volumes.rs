//! The `volumes` table, read into the attach room's [`Volume`].

use std::collections::BTreeMap;

use super::sql::{Param, Row, Tx};
use super::{StoreError, now_micros, placeholders, still_purgeable};
use crate::domain::list::{MAX_PAGE, Page, Scope, VolumeFilter};
use crate::domain::model::Volume;
use crate::domain::state::{Rows, Transition, VolumeAttachStatus, VolumeStatus};
use crate::params;
use crate::runtime::model::VolumeFields;

const COLUMNS: &str = "id, project_id, user_id, name, description, size_gib, volume_type, backend, multiattach, \
     status, attach_status, provider_location, provider_auth, provider_id, driver_data, metadata, \
     shared_targets, service_uuid, created_at, updated_at, bootable, image_metadata";

fn from_row(r: &Row) -> Result<Volume, StoreError> {
    let id = r.text(0)?;
    let corrupt = |what: &str, value: &str| StoreError::Corrupt(format!("volume {id} has {what} {value:?}"));
    let status = r.text(9)?;
    let attach_status = r.text(10)?;
    let driver_data = r.text(14)?;
    let metadata = r.text(15)?;
    Ok(Volume {
        project_id: r.text(1)?,
        user_id: r.text(2)?,
        name: r.opt_text(3)?,
        description: r.opt_text(4)?,
        size_gib: r.int(5)?,
        volume_type: r.text(6)?,
        backend: r.text(7)?,
        multiattach: r.flag(8)?,
        status: VolumeStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        attach_status: VolumeAttachStatus::parse(&attach_status)
            .ok_or_else(|| corrupt("attach status", &attach_status))?,
        fields: VolumeFields {
            provider_location: r.opt_text(11)?,
            provider_auth: r.opt_text(12)?,
            provider_id: r.opt_text(13)?,
            driver_data: serde_json::from_str(&driver_data)
                .map_err(|_| corrupt("driver data", "(not a map)"))?,
        },
        metadata: serde_json::from_str(&metadata).map_err(|_| corrupt("metadata", "(not a map)"))?,
        shared_targets: r.opt_int(16)?.map(|v| v != 0),
        service_uuid: r.opt_text(17)?,
        created_at: r.int(18)?,
        updated_at: r.int(19)?,
        bootable: r.flag(20)?,
        image_metadata: serde_json::from_str(&r.text(21)?)
            .map_err(|_| corrupt("image metadata", "(not a map)"))?,
        id,
    })
}

fn volumes(rows: Vec<Row>) -> Result<Vec<Volume>, StoreError> {
    rows.iter().map(from_row).collect()
}

fn map_text(map: &BTreeMap<String, String>) -> String {
    serde_json::to_string(map).expect("a map of strings serialises")
}

pub async fn insert(tx: &mut Tx, v: &Volume) -> Result<(), StoreError> {
    tx.execute(
        &format!(
            "INSERT INTO volumes ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
             $15, $16, $17, $18, $19, $20, $21, $22)"
        ),
        &params![
            &v.id,
            &v.project_id,
            &v.user_id,
            &v.name,
            &v.description,
            v.size_gib,
            &v.volume_type,
            &v.backend,
            v.multiattach,
            v.status.as_str(),
            v.attach_status.as_str(),
            &v.fields.provider_location,
            &v.fields.provider_auth,
            &v.fields.provider_id,
            map_text(&v.fields.driver_data),
            map_text(&v.metadata),
            v.shared_targets.map(i64::from),
            &v.service_uuid,
            v.created_at,
            v.updated_at,
            v.bootable,
            map_text(&v.image_metadata),
        ],
    )
    .await?;
    Ok(())
}

/// A live volume visible in `scope`.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<Volume>, StoreError> {
    let found = match scope {
        Scope::Project(p) => {
            tx.query(
                &format!("SELECT {COLUMNS} FROM volumes WHERE id = $1 AND deleted = 0 AND project_id = $2"),
                &params![id, p],
            )
            .await?
        }
        Scope::All => {
            tx.query(&format!("SELECT {COLUMNS} FROM volumes WHERE id = $1 AND deleted = 0"), &params![id])
                .await?
        }
    };
    Ok(volumes(found)?.pop())
}

/// A volume, deleted or not (the reconciler removes what a deleted volume may have left).
pub async fn get_even_deleted(tx: &mut Tx, id: &str) -> Result<Option<Volume>, StoreError> {
    let found = tx.query(&format!("SELECT {COLUMNS} FROM volumes WHERE id = $1"), &params![id]).await?;
    Ok(volumes(found)?.pop())
}

/// The backend (and node) of each of these volumes, deleted or not.
pub async fn backends(tx: &mut Tx, ids: &[String]) -> Result<BTreeMap<String, Served>, StoreError> {
    let mut out = BTreeMap::new();
    for chunk in ids.chunks(500) {
        let q = format!(
            "SELECT id, backend, service_uuid, deleted, status FROM volumes WHERE id IN ({})",
            placeholders(1, chunk.len())
        );
        let params: Vec<Param> = chunk.iter().map(Param::from).collect();
        for r in tx.query(&q, &params).await? {
            out.insert(
                r.text(0)?,
                Served {
                    backend: r.text(1)?,
                    service_uuid: r.opt_text(2)?,
                    deleted: r.flag(3)?,
                    unmanaged: r.text(4)? == VolumeStatus::Unmanaged.as_str(),
                },
            );
        }
    }
    Ok(out)
}

/// Which backend serves a volume, and on which node (its `service_uuid` names both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    pub backend: String,
    pub service_uuid: Option<String>,
    /// The volume was deleted (its row is kept).
    pub deleted: bool,
    /// The volume was unmanaged: deleted, and its data is the operator's (nothing removes it).
    pub unmanaged: bool,
}

/// The volumes of a backend that are settled in one of `statuses` (not deleted), by id: what the
/// reconciler expects to find on the backend.
pub async fn settled_of_backend(
    tx: &mut Tx,
    backend: &str,
    statuses: &[VolumeStatus],
) -> Result<Vec<String>, StoreError> {
    let mut params: Vec<Param> = vec![Param::from(backend)];
    let clause = status_in(statuses, &mut params);
    let rows = tx
        .query(&format!("SELECT id FROM volumes WHERE backend = $1 AND deleted = 0 AND {clause}"), &params)
        .await?;
    rows.iter().map(|r| r.text(0)).collect()
}

/// `status IN (...)` for a list of statuses, its parameters appended to `params`; never true for
/// an empty list.
fn status_in(list: &[VolumeStatus], params: &mut Vec<Param>) -> String {
    if list.is_empty() {
        return "1 = 0".into();
    }
    let clause = format!("status IN ({})", placeholders(params.len() + 1, list.len()));
    params.extend(list.iter().map(|s| Param::from(s.as_str())));
    clause
}

/// What a flow did to a volume's driver fields: they were `from` when it read the volume, and
/// `to` when it finished.
pub type FieldsChange<'a> = (&'a VolumeFields, &'a VolumeFields);

/// Locks a live volume for the rest of the transaction when the event `t` may start from its
/// status (the table's list for a multiattach volume or not), and writes what a flow changed in
/// its driver fields, when given, as a merge onto the fields as stored now
/// ([`VolumeFields::merge`]): never a blind overwrite. Returns the volume as written, or `None`
/// when it is gone or in another status.
pub async fn lock(
    tx: &mut Tx,
    id: &str,
    t: &Transition,
    fields: Option<FieldsChange<'_>>,
) -> Result<Option<Volume>, StoreError> {
    if matches!(t.volume_from, Rows::New) {
        return Err(StoreError::Corrupt(format!("{:?} creates a volume and cannot lock one", t.event)));
    }
    let mut params: Vec<Param> = Vec::from(params![id, now_micros()]);
    let single = status_in(t.volume_from(false), &mut params);
    let multi = status_in(t.volume_from(true), &mut params);
    let q = format!(
        "UPDATE volumes SET updated_at = $2 WHERE id = $1 AND deleted = 0 AND \
         ((multiattach = 0 AND {single}) OR (multiattach = 1 AND {multi})) RETURNING {COLUMNS}"
    );
    let Some(mut locked) = volumes(tx.query(&q, &params).await?)?.pop() else { return Ok(None) };
    if let Some((from, to)) = fields.filter(|(from, to)| from != to) {
        let mut merged = locked.fields.clone();
        merged.merge(from, to);
        if merged != locked.fields {
            tx.execute(
                "UPDATE volumes SET provider_location = $2, provider_auth = $3, provider_id = $4, \
                 driver_data = $5 WHERE id = $1",
                &params![
                    id,
                    &merged.provider_location,
                    &merged.provider_auth,
                    &merged.provider_id,
                    map_text(&merged.driver_data)
                ],
            )
            .await?;
            locked.fields = merged;
        }
    }
    Ok(Some(locked))
}

/// Locks a volume's row (live or not) for the rest of the transaction without changing it: a
/// transaction that will lock other rows of the volume's (its operation) takes the volume's row
/// first, in the order every write transaction takes them, so that two cannot deadlock.
///
/// On SQLite a write transaction holds the whole database (one writer at a time): there is no
/// row to lock, and the statement would cost more than nothing, since SQLite checks the foreign
/// keys of every child row of a key it updates, even to the same value (`volume_attachment`'s,
/// whose indexes on `volume_id` are partial and cannot serve the check: a scan of every attachment
/// ever made, deleted ones included).
///
/// On PostgreSQL the lock is the one an `UPDATE` that changes no key takes (`FOR NO KEY UPDATE`:
/// other writers of the row wait; a child row's foreign-key check does not), taken without
/// writing a new version of the row.
pub async fn hold_row(tx: &mut Tx, id: &str) -> Result<(), StoreError> {
    if tx.kind() == super::DbKind::Sqlite {
        return Ok(());
    }
    tx.query("SELECT id FROM volumes WHERE id = $1 FOR NO KEY UPDATE", &params![id]).await?;
    Ok(())
}

/// Gives a locked volume another volume type (a retype), and the type's multiattach.
pub async fn set_type(tx: &mut Tx, id: &str, volume_type: &str, multiattach: bool) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volumes SET volume_type = $2, multiattach = $3, updated_at = $4 WHERE id = $1",
        &params![id, volume_type, i64::from(multiattach), now_micros()],
    )
    .await?;
    Ok(())
}

/// Gives a locked volume to another project and user (a transfer accepted).
pub async fn set_owner(tx: &mut Tx, id: &str, project_id: &str, user_id: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volumes SET project_id = $2, user_id = $3, updated_at = $4 WHERE id = $1",
        &params![id, project_id, user_id, now_micros()],
    )
    .await?;
    Ok(())
}

/// Sets the status of a locked volume; returns it as written.
pub async fn set_status(
    tx: &mut Tx,
    id: &str,
    status: VolumeStatus,
    attach_status: VolumeAttachStatus,
) -> Result<Volume, StoreError> {
    let q = format!(
        "UPDATE volumes SET status = $2, attach_status = $3, updated_at = $4 WHERE id = $1 RETURNING {COLUMNS}"
    );
    let rows = tx.query(&q, &params![id, status.as_str(), attach_status.as_str(), now_micros()]).await?;
    volumes(rows)?.pop().ok_or_else(|| StoreError::Corrupt(format!("volume {id} vanished while locked")))
}

/// Sets the size of a locked volume (a finished extend).
pub async fn set_size(tx: &mut Tx, id: &str, size_gib: i64) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volumes SET size_gib = $2, updated_at = $3 WHERE id = $1",
        &params![id, size_gib, now_micros()],
    )
    .await?;
    Ok(())
}

/// The user's fields of a volume: what its users change, and no driver or attachment sees.
#[derive(Debug, Clone, Default)]
pub struct UserFields {
    pub name: Option<String>,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub bootable: bool,
    pub image_metadata: BTreeMap<String, String>,
}

/// Writes the user's fields of a locked volume.
pub async fn set_user_fields(tx: &mut Tx, id: &str, f: &UserFields) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volumes SET name = $2, description = $3, metadata = $4, bootable = $5, image_metadata = $6, \
         updated_at = $7 WHERE id = $1",
        &params![
            id,
            &f.name,
            &f.description,
            map_text(&f.metadata),
            f.bootable,
            map_text(&f.image_metadata),
            now_micros()
        ],
    )
    .await?;
    Ok(())
}

/// Marks a volume deleted, in `status` (`deleted`, or `unmanaged`: its data left on the
/// backend).
pub async fn soft_delete(tx: &mut Tx, id: &str, status: VolumeStatus) -> Result<bool, StoreError> {
    debug_assert!(status.is_gone(), "a deleted row's status, not {status}");
    let changed = tx
        .execute(
            "UPDATE volumes SET deleted = 1, deleted_at = $2, updated_at = $2, status = $3 \
         WHERE id = $1 AND deleted = 0",
            &params![id, now_micros(), status.as_str()],
        )
        .await?;
    Ok(changed == 1)
}

/// What lets a deleted volume's row go for good once no attachment row names it (`v`: the row;
/// `$1`: the time before which it was deleted): no operation, no recorded target and no event of
/// its history left (each found through an index).
const PURGEABLE: &str = "v.deleted = 1 AND v.deleted_at < $1 \
     AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.volume_id = v.id) \
     AND NOT EXISTS (SELECT 1 FROM targets t WHERE t.volume_id = v.id) \
     AND NOT EXISTS (SELECT 1 FROM attach_events e WHERE e.volume_id = v.id)";

/// Up to `limit` volumes deleted before `before` (microseconds) whose rows may go for good
/// ([`purge`]): [`PURGEABLE`], and no attachment row left (after the attachments' own purge). A
/// read, without holding the writer: no index serves a deleted volume's attachment rows, so both
/// tables are read once, joined (SQLite builds an index of the attachments for it, PostgreSQL
/// hashes them; a correlated `NOT EXISTS` would read the attachments once per volume on SQLite).
pub async fn purgeable(tx: &mut Tx, before: i64, limit: i64) -> Result<Vec<String>, StoreError> {
    let q = format!(
        "SELECT v.id FROM volumes v LEFT JOIN volume_attachment a ON a.volume_id = v.id \
         WHERE a.id IS NULL AND {PURGEABLE} LIMIT $2"
    );
    tx.query(&q, &params![before, limit]).await?.iter().map(|r| r.text(0)).collect()
}

/// Deletes for good the rows of these volumes that are still [`PURGEABLE`] before `before`, with
/// where their history's chain started. No attachment row is checked again: none is ever made for
/// a deleted volume, so none appeared since [`purgeable`] read them. Returns how many went.
pub async fn purge(tx: &mut Tx, ids: &[String], before: i64) -> Result<u64, StoreError> {
    if ids.is_empty() {
        return Ok(0);
    }
    let (still, params) = still_purgeable("volumes", "v", PURGEABLE, ids, before);
    tx.execute(&format!("DELETE FROM attach_event_starts WHERE volume_id IN ({still})"), &params).await?;
    tx.execute(&format!("DELETE FROM volumes WHERE id IN ({still})"), &params).await
}

/// `<select> FROM volumes WHERE ...` for a scope and a filter, with its parameters.
fn filtered(select: &str, scope: Scope<'_>, filter: &VolumeFilter) -> Query {
    let mut q = Query::new(&format!("{select} FROM volumes WHERE deleted = 0"));
    if let Scope::Project(p) = scope {
        q.and("project_id = ?", p);
    }
    if let Some(v) = &filter.name {
        q.and("name = ?", v);
    }
    if let Some(v) = &filter.status {
        q.and("status = ?", v);
    }
    if let Some(v) = &filter.volume_type {
        q.and("volume_type = ?", v);
    }
    if let Some(v) = filter.multiattach {
        q.and("multiattach = ?", v);
    }
    if let Some((op, at)) = filter.created_at {
        q.and(&format!("created_at {} ?", op.sql()), at);
    }
    if let Some((op, at)) = filter.updated_at {
        q.and(&format!("updated_at {} ?", op.sql()), at);
    }
    for (key, value) in &filter.metadata {
        // The item as it is written in the stored metadata (compact JSON of a sorted map), which
        // holds that text exactly when it has the item: a quote outside a JSON string is
        // always unescaped, and one inside always escaped. `REPLACE` finds it on SQLite and
        // PostgreSQL alike, case-sensitive.
        let item =
            format!("{}:{}", serde_json::Value::from(key.as_str()), serde_json::Value::from(value.as_str()));
        q.and("REPLACE(metadata, ?, '') <> metadata", item);
    }
    for (key, value) in &filter.image_metadata {
        let item =
            format!("{}:{}", serde_json::Value::from(key.as_str()), serde_json::Value::from(value.as_str()));
        q.and("REPLACE(image_metadata, ?, '') <> image_metadata", item);
    }
    if let Some(size) = filter.size_gib {
        q.and("size_gib = ?", size);
    }
    if let Some(bootable) = filter.bootable {
        q.and("bootable = ?", bootable);
    }
    if filter.nothing {
        q.sql.push_str(" AND 1 = 0");
    }
    q
}

/// Live volumes visible in `scope`, filtered and paged.
pub async fn list(
    tx: &mut Tx,
    scope: Scope<'_>,
    filter: &VolumeFilter,
    page: &Page,
    marker: Option<&Volume>,
) -> Result<Vec<Volume>, StoreError> {
    let q = list_query(scope, filter, page, marker);
    volumes(tx.query(&q.sql, &q.params).await?)
}

/// The statement of [`list`].
pub(crate) fn list_query(
    scope: Scope<'_>,
    filter: &VolumeFilter,
    page: &Page,
    marker: Option<&Volume>,
) -> Query {
    let mut q = filtered(&format!("SELECT {COLUMNS}"), scope, filter);
    let marker = marker.map(|m| {
        vec![
            ("created_at", Param::from(m.created_at)),
            ("updated_at", Param::from(m.updated_at)),
            ("id", Param::from(&m.id)),
            ("name", Param::from(m.name.clone().unwrap_or_default())),
            ("status", Param::from(m.status.as_str())),
            ("size_gib", Param::from(m.size_gib)),
            ("volume_type", Param::from(&m.volume_type)),
        ]
    });
    q.page(page, marker);
    q
}

/// How many live volumes `scope` has, their size in GiB together, and the metadata of those
/// that have any (for a summary).
pub async fn summary(
    tx: &mut Tx,
    scope: Scope<'_>,
) -> Result<(i64, i64, Vec<BTreeMap<String, String>>), StoreError> {
    let all = VolumeFilter::default();
    let q = filtered("SELECT COUNT(*), CAST(COALESCE(SUM(size_gib), 0) AS BIGINT)", scope, &all);
    let totals = tx.query(&q.sql, &q.params).await?;
    let (count, size) = (totals[0].int(0)?, totals[0].int(1)?);
    let q = filtered("SELECT metadata", scope, &all);
    let q = Query { sql: format!("{} AND metadata <> '{{}}'", q.sql), params: q.params };
    let metadata = tx
        .query(&q.sql, &q.params)
        .await?
        .iter()
        .map(|r| {
            serde_json::from_str(&r.text(0)?)
                .map_err(|e| StoreError::Corrupt(format!("volume metadata: {e}")))
        })
        .collect::<Result<_, _>>()?;
    Ok((count, size, metadata))
}

/// The live volumes in `scope` by volume type: each type's name, how many and their size in GiB.
pub async fn usage_by_type(tx: &mut Tx, scope: Scope<'_>) -> Result<Vec<(String, i64, i64)>, StoreError> {
    let all = VolumeFilter::default();
    let q = filtered("SELECT volume_type, COUNT(*), CAST(COALESCE(SUM(size_gib), 0) AS BIGINT)", scope, &all);
    let rows = tx.query(&format!("{} GROUP BY volume_type", q.sql), &q.params).await?;
    rows.iter().map(|r| Ok((r.text(0)?, r.int(1)?, r.int(2)?))).collect()
}

/// The live volumes of each service (`service_uuid`; `None` for volumes from before nodes had
/// names) and backend: how many, and their GiB.
pub async fn usage_by_service(tx: &mut Tx) -> Result<Vec<(Option<String>, String, i64, i64)>, StoreError> {
    let all = VolumeFilter::default();
    let q = filtered(
        "SELECT service_uuid, backend, COUNT(*), CAST(COALESCE(SUM(size_gib), 0) AS BIGINT)",
        Scope::All,
        &all,
    );
    let rows = tx.query(&format!("{} GROUP BY service_uuid, backend", q.sql), &q.params).await?;
    rows.iter().map(|r| Ok((r.opt_text(0)?, r.text(1)?, r.int(2)?, r.int(3)?))).collect()
}

/// The sizes of the live volumes of `backend` as served by `service_uuid` (and of those from
/// before nodes had names, which are this node's), added up, in GiB.
pub async fn provisioned(tx: &mut Tx, backend: &str, service_uuid: &str) -> Result<i64, StoreError> {
    let rows = tx
        .query(
            "SELECT CAST(COALESCE(SUM(size_gib), 0) AS BIGINT) FROM volumes WHERE deleted = 0 AND backend = $1 \
             AND (service_uuid = $2 OR service_uuid IS NULL)",
            &params![backend, service_uuid],
        )
        .await?;
    rows[0].int(0)
}

/// How many live volumes in `scope` match `filter`.
pub async fn count(tx: &mut Tx, scope: Scope<'_>, filter: &VolumeFilter) -> Result<i64, StoreError> {
    let q = filtered("SELECT COUNT(*)", scope, filter);
    tx.query(&q.sql, &q.params).await?[0].int(0)
}

/// A query built from conditions, with keyset paging.
pub(crate) struct Query {
    pub(crate) sql: String,
    pub(crate) params: Vec<Param>,
}

impl Query {
    pub(crate) fn new(base: &str) -> Self {
        Query { sql: base.to_string(), params: Vec::new() }
    }

    /// Adds ` AND <clause>`, whose `?` is the next parameter.
    pub(crate) fn and(&mut self, clause: &str, value: impl Into<Param>) {
        self.params.push(value.into());
        self.sql.push_str(" AND ");
        self.sql.push_str(&clause.replace('?', &format!("${}", self.params.len())));
    }

    /// Adds the keyset condition that starts after the marker row, the ORDER BY, LIMIT and
    /// OFFSET. Sorting always ends with `created_at`, `id` so that the order is total.
    pub(crate) fn page(&mut self, page: &Page, marker: Option<Vec<(&str, Param)>>) {
        let mut keys = page.sort.clone();
        if keys.is_empty() {
            keys.push(("created_at".into(), false));
        }
        for tie in ["created_at", "id"] {
            if !keys.iter().any(|(k, _)| k == tie) {
                let asc = keys.last().map(|(_, a)| *a).unwrap_or(false);
                keys.push((tie.into(), asc));
            }
        }
        if let Some(values) = marker {
            let value_of =
                |k: &str| values.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).expect("marker key");
            // Every key in one direction: one row-value comparison, which an index on the keys
            // serves (SQLite 3.15+, PostgreSQL).
            if keys.iter().all(|(_, asc)| *asc == keys[0].1) {
                let mut lhs = Vec::new();
                let mut rhs = Vec::new();
                for (k, _) in &keys {
                    self.params.push(value_of(k));
                    lhs.push(expr(k));
                    rhs.push(format!("${}", self.params.len()));
                }
                let op = if keys[0].1 { ">" } else { "<" };
                self.sql.push_str(&format!(" AND ({}) {op} ({})", lhs.join(", "), rhs.join(", ")));
                self.order_limit(&keys, page);
                return;
            }
            // (k1 > v1) OR (k1 = v1 AND k2 > v2) OR ..., each comparison in its key's direction.
            let mut ors = Vec::new();
            for i in 0..keys.len() {
                let mut ands = Vec::new();
                for (k, _) in &keys[..i] {
                    self.params.push(value_of(k));
                    ands.push(format!("{} = ${}", expr(k), self.params.len()));
                }
                let (k, asc) = &keys[i];
                self.params.push(value_of(k));
                ands.push(format!("{} {} ${}", expr(k), if *asc { ">" } else { "<" }, self.params.len()));
                ors.push(format!("({})", ands.join(" AND ")));
            }
            self.sql.push_str(&format!(" AND ({})", ors.join(" OR ")));
        }
        self.order_limit(&keys, page);
    }

    fn order_limit(&mut self, keys: &[(String, bool)], page: &Page) {
        let order: Vec<String> = keys
            .iter()
            .map(|(k, asc)| format!("{} {}", expr(k), if *asc { "ASC" } else { "DESC" }))
            .collect();
        self.sql.push_str(&format!(" ORDER BY {}", order.join(", ")));
        let limit = page.limit.unwrap_or(MAX_PAGE).clamp(0, MAX_PAGE);
        self.sql.push_str(&format!(" LIMIT {limit}"));
        if let Some(offset) = page.offset {
            self.sql.push_str(&format!(" OFFSET {offset}"));
        }
    }
}

/// The SQL expression a sort key stands for (nullable columns sort as empty or zero).
fn expr(key: &str) -> String {
    match key {
        "name" | "instance_uuid" | "attach_mode" | "resource_uuid" | "request_id" => {
            format!("COALESCE({key}, '')")
        }
        "attach_time" | "detach_time" => format!("COALESCE({key}, 0)"),
        _ => key.to_string(),
    }
}

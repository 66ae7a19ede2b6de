//! The `volumes` table.

use super::sql::{Param, Row, Tx};
use super::{Page, Scope, StoreError, now_micros, placeholders};
use crate::params;

const COLUMNS: &str = "id, project_id, user_id, name, description, size_gib, volume_type, backend, multiattach, \
     status, attach_status, provider_location, provider_auth, provider_id, driver_data, metadata, \
     shared_targets, service_uuid, created_at, updated_at";

/// A live volume as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeRow {
    pub id: String,
    pub project_id: String,
    pub user_id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub size_gib: i64,
    pub volume_type: String,
    pub backend: String,
    pub multiattach: bool,
    pub status: String,
    pub attach_status: String,
    pub provider_location: Option<String>,
    pub provider_auth: Option<String>,
    pub provider_id: Option<String>,
    /// Driver-private key/values, a JSON object of strings.
    pub driver_data: String,
    /// User metadata, a JSON object of strings.
    pub metadata: String,
    pub shared_targets: Option<bool>,
    pub service_uuid: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl VolumeRow {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(VolumeRow {
            id: r.text(0)?,
            project_id: r.text(1)?,
            user_id: r.text(2)?,
            name: r.opt_text(3)?,
            description: r.opt_text(4)?,
            size_gib: r.int(5)?,
            volume_type: r.text(6)?,
            backend: r.text(7)?,
            multiattach: r.flag(8)?,
            status: r.text(9)?,
            attach_status: r.text(10)?,
            provider_location: r.opt_text(11)?,
            provider_auth: r.opt_text(12)?,
            provider_id: r.opt_text(13)?,
            driver_data: r.text(14)?,
            metadata: r.text(15)?,
            shared_targets: r.opt_int(16)?.map(|v| v != 0),
            service_uuid: r.opt_text(17)?,
            created_at: r.int(18)?,
            updated_at: r.int(19)?,
        })
    }

    pub fn driver_fields(&self) -> DriverFields {
        DriverFields {
            provider_location: self.provider_location.clone(),
            provider_auth: self.provider_auth.clone(),
            provider_id: self.provider_id.clone(),
            driver_data: self.driver_data.clone(),
        }
    }
}

fn rows(rows: Vec<Row>) -> Result<Vec<VolumeRow>, StoreError> {
    rows.iter().map(VolumeRow::from_row).collect()
}

/// The driver-owned fields of a volume after a model update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFields {
    pub provider_location: Option<String>,
    pub provider_auth: Option<String>,
    pub provider_id: Option<String>,
    pub driver_data: String,
}

pub async fn insert(tx: &mut Tx, v: &VolumeRow) -> Result<(), StoreError> {
    tx.execute(
        &format!(
            "INSERT INTO volumes ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
             $15, $16, $17, $18, $19, $20)"
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
            &v.status,
            &v.attach_status,
            &v.provider_location,
            &v.provider_auth,
            &v.provider_id,
            &v.driver_data,
            &v.metadata,
            v.shared_targets.map(i64::from),
            &v.service_uuid,
            v.created_at,
            v.updated_at,
        ],
    ).await?;
    Ok(())
}

/// A live volume visible in `scope`.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<VolumeRow>, StoreError> {
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
    Ok(rows(found)?.pop())
}

/// Locks a live volume for the rest of the transaction, if its status is one of `from` (any
/// status when `from` is empty), and sets the driver fields when given. Returns the row as it
/// was, or `None` when the volume is gone or in another status.
pub async fn lock(
    tx: &mut Tx,
    id: &str,
    from: &[&str],
    fields: Option<&DriverFields>,
) -> Result<Option<VolumeRow>, StoreError> {
    let mut params: Vec<Param> = Vec::from(params![id, now_micros()]);
    let set = match fields {
        Some(f) => {
            params.extend(params![&f.provider_location, &f.provider_auth, &f.provider_id, &f.driver_data]);
            ", provider_location = $3, provider_auth = $4, provider_id = $5, driver_data = $6"
        }
        None => "",
    };
    let status = if from.is_empty() {
        String::new()
    } else {
        let clause = format!(" AND status IN ({})", placeholders(params.len() + 1, from.len()));
        params.extend(from.iter().map(|s| Param::from(*s)));
        clause
    };
    let q = format!(
        "UPDATE volumes SET updated_at = $2{set} WHERE id = $1 AND deleted = 0{status} RETURNING {COLUMNS}"
    );
    Ok(rows(tx.query(&q, &params).await?)?.pop())
}

/// Sets the status of a locked volume.
pub async fn set_status(tx: &mut Tx, id: &str, status: &str, attach_status: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volumes SET status = $2, attach_status = $3, updated_at = $4 WHERE id = $1",
        &params![id, status, attach_status, now_micros()],
    )
    .await?;
    Ok(())
}

/// Replaces the user metadata of a locked volume.
pub async fn set_metadata(tx: &mut Tx, id: &str, metadata: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volumes SET metadata = $2, updated_at = $3 WHERE id = $1",
        &params![id, metadata, now_micros()],
    )
    .await?;
    Ok(())
}

/// Marks a volume deleted.
pub async fn soft_delete(tx: &mut Tx, id: &str) -> Result<bool, StoreError> {
    let changed = tx
        .execute(
            "UPDATE volumes SET deleted = 1, deleted_at = $2, updated_at = $2, status = 'deleted' \
         WHERE id = $1 AND deleted = 0",
            &params![id, now_micros()],
        )
        .await?;
    Ok(changed == 1)
}

/// Filters of a volume list.
#[derive(Debug, Clone, Default)]
pub struct VolumeFilter {
    pub name: Option<String>,
    pub status: Option<String>,
    pub volume_type: Option<String>,
    pub multiattach: Option<bool>,
}

/// The columns a volume list may be sorted by.
pub const SORT_KEYS: &[&str] =
    &["created_at", "updated_at", "id", "name", "status", "size_gib", "volume_type"];

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
    q
}

/// Live volumes visible in `scope`, filtered and paged.
pub async fn list(
    tx: &mut Tx,
    scope: Scope<'_>,
    filter: &VolumeFilter,
    page: &Page,
    marker: Option<&VolumeRow>,
) -> Result<Vec<VolumeRow>, StoreError> {
    let mut q = filtered(&format!("SELECT {COLUMNS}"), scope, filter);
    let marker = marker.map(|m| {
        vec![
            ("created_at", Param::from(m.created_at)),
            ("updated_at", Param::from(m.updated_at)),
            ("id", Param::from(&m.id)),
            ("name", Param::from(m.name.clone().unwrap_or_default())),
            ("status", Param::from(&m.status)),
            ("size_gib", Param::from(m.size_gib)),
            ("volume_type", Param::from(&m.volume_type)),
        ]
    });
    q.page(page, marker);
    rows(tx.query(&q.sql, &q.params).await?)
}

/// How many live volumes in `scope` match `filter`.
pub async fn count(tx: &mut Tx, scope: Scope<'_>, filter: &VolumeFilter) -> Result<i64, StoreError> {
    let q = filtered("SELECT COUNT(*)", scope, filter);
    tx.query(&q.sql, &q.params).await?[0].int(0)
}

/// The most rows one page returns (Cinder's `osapi_max_limit`).
pub const MAX_PAGE: i64 = 1000;

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
        "name" | "instance_uuid" | "attach_mode" => format!("COALESCE({key}, '')"),
        "attach_time" | "detach_time" => format!("COALESCE({key}, 0)"),
        _ => key.to_string(),
    }
}

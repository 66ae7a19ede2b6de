//! The `volumes` table.

use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Executor, FromRow, Row};

use super::{Page, Scope, StoreError, now_micros, placeholders};

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

impl<'r> FromRow<'r, AnyRow> for VolumeRow {
    fn from_row(row: &'r AnyRow) -> Result<Self, sqlx::Error> {
        Ok(VolumeRow {
            id: row.try_get("id")?,
            project_id: row.try_get("project_id")?,
            user_id: row.try_get("user_id")?,
            name: row.try_get("name")?,
            description: row.try_get("description")?,
            size_gib: row.try_get("size_gib")?,
            volume_type: row.try_get("volume_type")?,
            backend: row.try_get("backend")?,
            multiattach: row.try_get::<i64, _>("multiattach")? != 0,
            status: row.try_get("status")?,
            attach_status: row.try_get("attach_status")?,
            provider_location: row.try_get("provider_location")?,
            provider_auth: row.try_get("provider_auth")?,
            provider_id: row.try_get("provider_id")?,
            driver_data: row.try_get("driver_data")?,
            metadata: row.try_get("metadata")?,
            shared_targets: row.try_get::<Option<i64>, _>("shared_targets")?.map(|v| v != 0),
            service_uuid: row.try_get("service_uuid")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

/// The driver-owned fields of a volume after a model update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFields {
    pub provider_location: Option<String>,
    pub provider_auth: Option<String>,
    pub provider_id: Option<String>,
    pub driver_data: String,
}

impl VolumeRow {
    pub fn driver_fields(&self) -> DriverFields {
        DriverFields {
            provider_location: self.provider_location.clone(),
            provider_auth: self.provider_auth.clone(),
            provider_id: self.provider_id.clone(),
            driver_data: self.driver_data.clone(),
        }
    }
}

pub async fn insert(conn: &mut AnyConnection, v: &VolumeRow) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO volumes ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
         $15, $16, $17, $18, $19, $20)"
    ))
    .bind(&v.id)
    .bind(&v.project_id)
    .bind(&v.user_id)
    .bind(&v.name)
    .bind(&v.description)
    .bind(v.size_gib)
    .bind(&v.volume_type)
    .bind(&v.backend)
    .bind(v.multiattach as i64)
    .bind(&v.status)
    .bind(&v.attach_status)
    .bind(&v.provider_location)
    .bind(&v.provider_auth)
    .bind(&v.provider_id)
    .bind(&v.driver_data)
    .bind(&v.metadata)
    .bind(v.shared_targets.map(i64::from))
    .bind(&v.service_uuid)
    .bind(v.created_at)
    .bind(v.updated_at)
    .execute(conn)
    .await
    .map_err(StoreError::from_db)?;
    Ok(())
}

/// A live volume visible in `scope`.
pub async fn get<'e>(
    e: impl Executor<'e, Database = Any>,
    id: &str,
    scope: Scope<'_>,
) -> Result<Option<VolumeRow>, StoreError> {
    let q = match scope {
        Scope::Project(_) => {
            format!("SELECT {COLUMNS} FROM volumes WHERE id = $1 AND deleted = 0 AND project_id = $2")
        }
        Scope::All => format!("SELECT {COLUMNS} FROM volumes WHERE id = $1 AND deleted = 0"),
    };
    let mut query = sqlx::query_as::<_, VolumeRow>(&q).bind(id);
    if let Scope::Project(p) = scope {
        query = query.bind(p);
    }
    Ok(query.fetch_optional(e).await?)
}

/// Locks a live volume for the rest of the transaction, if its status is one of `from`
/// (any status when `from` is empty). Returns the row, or `None` when it is gone or in another
/// status.
pub async fn lock(
    conn: &mut AnyConnection,
    id: &str,
    from: &[&str],
) -> Result<Option<VolumeRow>, StoreError> {
    let status = if from.is_empty() {
        String::new()
    } else {
        format!(" AND status IN ({})", placeholders(3, from.len()))
    };
    let q = format!(
        "UPDATE volumes SET updated_at = $2 WHERE id = $1 AND deleted = 0{status} RETURNING {COLUMNS}"
    );
    let mut query = sqlx::query_as::<_, VolumeRow>(&q).bind(id).bind(now_micros());
    for s in from {
        query = query.bind(*s);
    }
    Ok(query.fetch_optional(conn).await?)
}

/// Sets the status of a locked volume.
pub async fn set_status(
    conn: &mut AnyConnection,
    id: &str,
    status: &str,
    attach_status: &str,
) -> Result<(), StoreError> {
    sqlx::query("UPDATE volumes SET status = $2, attach_status = $3, updated_at = $4 WHERE id = $1")
        .bind(id)
        .bind(status)
        .bind(attach_status)
        .bind(now_micros())
        .execute(conn)
        .await?;
    Ok(())
}

/// Sets the driver-owned fields of a locked volume.
pub async fn set_driver_fields(
    conn: &mut AnyConnection,
    id: &str,
    f: &DriverFields,
) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE volumes SET provider_location = $2, provider_auth = $3, provider_id = $4, driver_data = $5, \
         updated_at = $6 WHERE id = $1",
    )
    .bind(id)
    .bind(&f.provider_location)
    .bind(&f.provider_auth)
    .bind(&f.provider_id)
    .bind(&f.driver_data)
    .bind(now_micros())
    .execute(conn)
    .await?;
    Ok(())
}

/// Marks a volume deleted.
pub async fn soft_delete(conn: &mut AnyConnection, id: &str) -> Result<bool, StoreError> {
    let now = now_micros();
    let done = sqlx::query(
        "UPDATE volumes SET deleted = 1, deleted_at = $2, updated_at = $2, status = 'deleted' \
         WHERE id = $1 AND deleted = 0",
    )
    .bind(id)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
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

/// Live volumes visible in `scope`, filtered and paged (sorted by `page.sort`, then `created_at`
/// and `id` descending).
pub async fn list<'e>(
    e: impl Executor<'e, Database = Any>,
    scope: Scope<'_>,
    filter: &VolumeFilter,
    page: &Page,
    marker: Option<&VolumeRow>,
) -> Result<Vec<VolumeRow>, StoreError> {
    let (mut sql, mut args) = filtered(&format!("SELECT {COLUMNS}"), scope, filter);
    let (order, after) = keyset(page, marker.map(marker_values));
    if let Some((clause, values)) = after {
        let mut c = clause;
        for v in values {
            args.push(v);
            c = c.replacen('?', &format!("${}", args.len()), 1);
        }
        sql.push_str(&c);
    }
    sql.push_str(&order);
    paginate(&mut sql, page);
    let mut query = sqlx::query_as::<_, VolumeRow>(&sql);
    for a in args {
        query = a.bind(query);
    }
    Ok(query.fetch_all(e).await?)
}

/// `<select> FROM volumes WHERE ...` for a scope and a filter, with its arguments.
fn filtered(select: &str, scope: Scope<'_>, filter: &VolumeFilter) -> (String, Vec<Arg>) {
    let mut sql = format!("{select} FROM volumes WHERE deleted = 0");
    let mut args: Vec<Arg> = Vec::new();
    let mut push = |clause: &str, arg: Arg| {
        args.push(arg);
        sql.push_str(&clause.replace('?', &format!("${}", args.len())));
    };
    if let Scope::Project(p) = scope {
        push(" AND project_id = ?", Arg::Text(p.to_string()));
    }
    if let Some(v) = &filter.name {
        push(" AND name = ?", Arg::Text(v.clone()));
    }
    if let Some(v) = &filter.status {
        push(" AND status = ?", Arg::Text(v.clone()));
    }
    if let Some(v) = &filter.volume_type {
        push(" AND volume_type = ?", Arg::Text(v.clone()));
    }
    if let Some(v) = filter.multiattach {
        push(" AND multiattach = ?", Arg::Int(v as i64));
    }
    (sql, args)
}

/// How many live volumes in `scope` match `filter`.
pub async fn count<'e>(
    e: impl Executor<'e, Database = Any>,
    scope: Scope<'_>,
    filter: &VolumeFilter,
) -> Result<i64, StoreError> {
    let (sql, args) = filtered("SELECT COUNT(*) AS n", scope, filter);
    let mut query = sqlx::query_scalar::<_, i64>(&sql);
    for a in args {
        query = match a {
            Arg::Text(s) => query.bind(s),
            Arg::Int(i) => query.bind(i),
        };
    }
    Ok(query.fetch_one(e).await?)
}

fn marker_values(m: &VolumeRow) -> Vec<(String, Arg)> {
    vec![
        ("created_at".into(), Arg::Int(m.created_at)),
        ("updated_at".into(), Arg::Int(m.updated_at)),
        ("id".into(), Arg::Text(m.id.clone())),
        ("name".into(), Arg::Text(m.name.clone().unwrap_or_default())),
        ("status".into(), Arg::Text(m.status.clone())),
        ("size_gib".into(), Arg::Int(m.size_gib)),
        ("volume_type".into(), Arg::Text(m.volume_type.clone())),
    ]
}

/// A bound argument of a dynamically built query.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    Text(String),
    Int(i64),
}

impl Arg {
    pub(crate) fn bind<'q, O>(
        self,
        q: sqlx::query::QueryAs<'q, Any, O, sqlx::any::AnyArguments<'q>>,
    ) -> sqlx::query::QueryAs<'q, Any, O, sqlx::any::AnyArguments<'q>> {
        match self {
            Arg::Text(s) => q.bind(s),
            Arg::Int(i) => q.bind(i),
        }
    }
}

/// The ORDER BY of a paged list, and the keyset condition that starts after the marker row.
/// Sorting always ends with `created_at`, `id` so that the order is total.
pub(crate) fn keyset(
    page: &Page,
    marker: Option<Vec<(String, Arg)>>,
) -> (String, Option<(String, Vec<Arg>)>) {
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
    let order = format!(
        " ORDER BY {}",
        keys.iter()
            .map(|(k, asc)| format!("{} {}", expr(k), if *asc { "ASC" } else { "DESC" }))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let after = marker.map(|values| {
        // (k1 > v1) OR (k1 = v1 AND k2 > v2) OR ... with the comparison per direction.
        let value_of =
            |k: &str| values.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).expect("marker key");
        let mut ors = Vec::new();
        let mut binds = Vec::new();
        for i in 0..keys.len() {
            let mut ands = Vec::new();
            for (k, _) in &keys[..i] {
                ands.push(format!("{} = ?", expr(k)));
                binds.push(value_of(k));
            }
            let (k, asc) = &keys[i];
            ands.push(format!("{} {} ?", expr(k), if *asc { ">" } else { "<" }));
            binds.push(value_of(k));
            ors.push(format!("({})", ands.join(" AND ")));
        }
        (format!(" AND ({})", ors.join(" OR ")), binds)
    });
    (order, after)
}

/// The most rows one page returns (Cinder's `osapi_max_limit`).
pub const MAX_PAGE: i64 = 1000;

pub(crate) fn paginate(sql: &mut String, page: &Page) {
    let limit = page.limit.unwrap_or(MAX_PAGE).clamp(0, MAX_PAGE);
    sql.push_str(&format!(" LIMIT {limit}"));
    if let Some(offset) = page.offset {
        sql.push_str(&format!(" OFFSET {offset}"));
    }
}

/// The SQL expression a sort key stands for (nullable text sorts as the empty string).
fn expr(key: &str) -> String {
    match key {
        "name" | "instance_uuid" | "attach_mode" => format!("COALESCE({key}, '')"),
        "attach_time" | "detach_time" => format!("COALESCE({key}, 0)"),
        _ => key.to_string(),
    }
}

/// Replaces the user metadata of a locked volume.
pub async fn set_metadata(conn: &mut AnyConnection, id: &str, metadata: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE volumes SET metadata = $2, updated_at = $3 WHERE id = $1")
        .bind(id)
        .bind(metadata)
        .bind(now_micros())
        .execute(conn)
        .await?;
    Ok(())
}

//! The `volume_attachment` and `attachment_specs` tables.

use std::collections::HashMap;

use serde_json::{Map, Value as Json};
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, Executor, FromRow, Row};

use super::volumes::{Arg, keyset, paginate};
use super::{Page, Scope, StoreError, now_micros, placeholders};

const COLUMNS: &str = "id, volume_id, project_id, instance_uuid, attached_host, mountpoint, attach_mode, \
     attach_status, exclusive, connection_info, attach_time, detach_time, created_at, updated_at";

/// A live attachment as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachmentRow {
    pub id: String,
    pub volume_id: String,
    pub project_id: String,
    pub instance_uuid: Option<String>,
    pub attached_host: Option<String>,
    pub mountpoint: Option<String>,
    /// `rw`, `ro`, or Cinder's literal string `null` when the client did not choose.
    pub attach_mode: Option<String>,
    pub attach_status: String,
    pub exclusive: bool,
    /// The flattened connection info as JSON text.
    pub connection_info: Option<String>,
    pub attach_time: Option<i64>,
    pub detach_time: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl<'r> FromRow<'r, AnyRow> for AttachmentRow {
    fn from_row(row: &'r AnyRow) -> Result<Self, sqlx::Error> {
        Ok(AttachmentRow {
            id: row.try_get("id")?,
            volume_id: row.try_get("volume_id")?,
            project_id: row.try_get("project_id")?,
            instance_uuid: row.try_get("instance_uuid")?,
            attached_host: row.try_get("attached_host")?,
            mountpoint: row.try_get("mountpoint")?,
            attach_mode: row.try_get("attach_mode")?,
            attach_status: row.try_get("attach_status")?,
            exclusive: row.try_get::<i64, _>("exclusive")? != 0,
            connection_info: row.try_get("connection_info")?,
            attach_time: row.try_get("attach_time")?,
            detach_time: row.try_get("detach_time")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        })
    }
}

pub async fn insert(conn: &mut AnyConnection, a: &AttachmentRow) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO volume_attachment ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
         $13, $14)"
    ))
    .bind(&a.id)
    .bind(&a.volume_id)
    .bind(&a.project_id)
    .bind(&a.instance_uuid)
    .bind(&a.attached_host)
    .bind(&a.mountpoint)
    .bind(&a.attach_mode)
    .bind(&a.attach_status)
    .bind(a.exclusive as i64)
    .bind(&a.connection_info)
    .bind(a.attach_time)
    .bind(a.detach_time)
    .bind(a.created_at)
    .bind(a.updated_at)
    .execute(conn)
    .await
    .map_err(StoreError::from_db)?;
    Ok(())
}

/// A live attachment visible in `scope`.
pub async fn get<'e>(
    e: impl Executor<'e, Database = Any>,
    id: &str,
    scope: Scope<'_>,
) -> Result<Option<AttachmentRow>, StoreError> {
    let q = match scope {
        Scope::Project(_) => {
            format!(
                "SELECT {COLUMNS} FROM volume_attachment WHERE id = $1 AND deleted = 0 AND project_id = $2"
            )
        }
        Scope::All => format!("SELECT {COLUMNS} FROM volume_attachment WHERE id = $1 AND deleted = 0"),
    };
    let mut query = sqlx::query_as::<_, AttachmentRow>(&q).bind(id);
    if let Scope::Project(p) = scope {
        query = query.bind(p);
    }
    Ok(query.fetch_optional(e).await?)
}

/// The live attachments of a volume, oldest first.
pub async fn of_volume<'e>(
    e: impl Executor<'e, Database = Any>,
    volume_id: &str,
) -> Result<Vec<AttachmentRow>, StoreError> {
    let q = format!(
        "SELECT {COLUMNS} FROM volume_attachment WHERE volume_id = $1 AND deleted = 0 ORDER BY created_at, id"
    );
    Ok(sqlx::query_as::<_, AttachmentRow>(&q).bind(volume_id).fetch_all(e).await?)
}

/// The live attachments of several volumes (for volume lists).
pub async fn of_volumes<'e>(
    e: impl Executor<'e, Database = Any>,
    volume_ids: &[String],
) -> Result<Vec<AttachmentRow>, StoreError> {
    if volume_ids.is_empty() {
        return Ok(Vec::new());
    }
    let q = format!(
        "SELECT {COLUMNS} FROM volume_attachment WHERE volume_id IN ({}) AND deleted = 0 ORDER BY created_at, id",
        placeholders(1, volume_ids.len())
    );
    let mut query = sqlx::query_as::<_, AttachmentRow>(&q);
    for id in volume_ids {
        query = query.bind(id);
    }
    Ok(query.fetch_all(e).await?)
}

/// What a connect writes on an attachment.
#[derive(Debug, Clone)]
pub struct Connected {
    pub connection_info: String,
    pub attach_mode: String,
    pub attached_host: Option<String>,
    pub mountpoint: Option<String>,
}

/// Moves a live attachment whose status is one of `from` to `to`, with the connect fields when
/// given. Returns whether it moved.
pub async fn transition(
    conn: &mut AnyConnection,
    id: &str,
    from: &[&str],
    to: &str,
    connected: Option<&Connected>,
) -> Result<bool, StoreError> {
    let now = now_micros();
    let (set, first) = match connected {
        Some(_) => (
            ", connection_info = $4, attach_mode = $5, attached_host = $6, mountpoint = $7, attach_time = $3",
            8,
        ),
        None => ("", 4),
    };
    let q = format!(
        "UPDATE volume_attachment SET attach_status = $2, updated_at = $3{set} \
         WHERE id = $1 AND deleted = 0 AND attach_status IN ({})",
        placeholders(first, from.len())
    );
    let mut query = sqlx::query(&q).bind(id).bind(to).bind(now);
    if let Some(c) = connected {
        query =
            query.bind(&c.connection_info).bind(&c.attach_mode).bind(&c.attached_host).bind(&c.mountpoint);
    }
    for s in from {
        query = query.bind(*s);
    }
    Ok(query.execute(conn).await?.rows_affected() == 1)
}

/// Deletes an attachment (soft, as Cinder does) and its connector.
pub async fn soft_delete(conn: &mut AnyConnection, id: &str) -> Result<bool, StoreError> {
    let now = now_micros();
    let done = sqlx::query(
        "UPDATE volume_attachment SET deleted = 1, deleted_at = $2, detach_time = $2, updated_at = $2, \
         attach_status = 'detached' WHERE id = $1 AND deleted = 0",
    )
    .bind(id)
    .bind(now)
    .execute(&mut *conn)
    .await?;
    if done.rows_affected() == 1 {
        sqlx::query("DELETE FROM attachment_specs WHERE attachment_id = $1").bind(id).execute(conn).await?;
    }
    Ok(done.rows_affected() == 1)
}

/// Replaces the stored connector of an attachment: one row per key, the value as JSON text.
pub async fn put_connector(
    conn: &mut AnyConnection,
    attachment_id: &str,
    connector: &Map<String, Json>,
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM attachment_specs WHERE attachment_id = $1")
        .bind(attachment_id)
        .execute(&mut *conn)
        .await?;
    if connector.is_empty() {
        return Ok(());
    }
    let rows = placeholders(1, connector.len() * 3);
    let rows: Vec<String> =
        rows.split(", ").collect::<Vec<_>>().chunks(3).map(|c| format!("({})", c.join(", "))).collect();
    let q = format!("INSERT INTO attachment_specs (attachment_id, key, value) VALUES {}", rows.join(", "));
    let mut query = sqlx::query(&q);
    for (key, value) in connector {
        query = query.bind(attachment_id).bind(key).bind(value.to_string());
    }
    query.execute(conn).await?;
    Ok(())
}

/// The stored connectors of attachments (absent when an attachment has none).
pub async fn connectors<'e>(
    e: impl Executor<'e, Database = Any>,
    attachment_ids: &[&str],
) -> Result<HashMap<String, Map<String, Json>>, StoreError> {
    if attachment_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let q = format!(
        "SELECT attachment_id, key, value FROM attachment_specs WHERE attachment_id IN ({})",
        placeholders(1, attachment_ids.len())
    );
    let mut query = sqlx::query(&q);
    for id in attachment_ids {
        query = query.bind(*id);
    }
    let mut out: HashMap<String, Map<String, Json>> = HashMap::new();
    for row in query.fetch_all(e).await? {
        let (id, key, value): (String, String, String) = (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
        let value: Json = serde_json::from_str(&value)
            .map_err(|e| StoreError::Corrupt(format!("attachment_specs {id}/{key}: {e}")))?;
        out.entry(id).or_default().insert(key, value);
    }
    Ok(out)
}

/// Filters of an attachment list.
#[derive(Debug, Clone, Default)]
pub struct AttachmentFilter {
    pub volume_id: Option<String>,
    pub instance_uuid: Option<String>,
    pub attach_status: Option<String>,
}

/// The columns an attachment list may be sorted by (Cinder: columns of `volume_attachment`).
pub const SORT_KEYS: &[&str] = &[
    "created_at",
    "updated_at",
    "id",
    "volume_id",
    "instance_uuid",
    "attach_status",
    "attach_mode",
    "attach_time",
    "detach_time",
];

/// Live attachments visible in `scope`, filtered and paged.
pub async fn list<'e>(
    e: impl Executor<'e, Database = Any>,
    scope: Scope<'_>,
    filter: &AttachmentFilter,
    page: &Page,
    marker: Option<&AttachmentRow>,
) -> Result<Vec<AttachmentRow>, StoreError> {
    let mut sql = format!("SELECT {COLUMNS} FROM volume_attachment WHERE deleted = 0");
    let mut args: Vec<Arg> = Vec::new();
    let mut push = |sql: &mut String, clause: &str, arg: Arg| {
        args.push(arg);
        sql.push_str(&clause.replace('?', &format!("${}", args.len())));
    };
    if let Scope::Project(p) = scope {
        push(&mut sql, " AND project_id = ?", Arg::Text(p.to_string()));
    }
    if let Some(v) = &filter.volume_id {
        push(&mut sql, " AND volume_id = ?", Arg::Text(v.clone()));
    }
    if let Some(v) = &filter.instance_uuid {
        push(&mut sql, " AND instance_uuid = ?", Arg::Text(v.clone()));
    }
    if let Some(v) = &filter.attach_status {
        push(&mut sql, " AND attach_status = ?", Arg::Text(v.clone()));
    }
    let marker = marker.map(|m| {
        vec![
            ("created_at".to_string(), Arg::Int(m.created_at)),
            ("updated_at".to_string(), Arg::Int(m.updated_at)),
            ("id".to_string(), Arg::Text(m.id.clone())),
            ("volume_id".to_string(), Arg::Text(m.volume_id.clone())),
            ("instance_uuid".to_string(), Arg::Text(m.instance_uuid.clone().unwrap_or_default())),
            ("attach_status".to_string(), Arg::Text(m.attach_status.clone())),
            ("attach_mode".to_string(), Arg::Text(m.attach_mode.clone().unwrap_or_default())),
            ("attach_time".to_string(), Arg::Int(m.attach_time.unwrap_or(0))),
            ("detach_time".to_string(), Arg::Int(m.detach_time.unwrap_or(0))),
        ]
    });
    let (order, after) = keyset(page, marker);
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
    let mut query = sqlx::query_as::<_, AttachmentRow>(&sql);
    for a in args {
        query = a.bind(query);
    }
    Ok(query.fetch_all(e).await?)
}

//! The `volume_attachment` and `attachment_specs` tables.

use std::collections::HashMap;

use serde_json::{Map, Value as Json};

use super::sql::{Param, Row, Tx};
use super::volumes::Query;
use super::{Page, Scope, StoreError, now_micros, placeholders};
use crate::params;

const COLUMNS: &str = "id, volume_id, project_id, instance_uuid, attached_host, mountpoint, attach_mode, \
     attach_status, exclusive, connection_info, attach_time, detach_time, created_at, updated_at, legacy";

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
    /// Made by the legacy volume actions (`os-reserve`, `os-initialize_connection`).
    pub legacy: bool,
}

impl AttachmentRow {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(AttachmentRow {
            id: r.text(0)?,
            volume_id: r.text(1)?,
            project_id: r.text(2)?,
            instance_uuid: r.opt_text(3)?,
            attached_host: r.opt_text(4)?,
            mountpoint: r.opt_text(5)?,
            attach_mode: r.opt_text(6)?,
            attach_status: r.text(7)?,
            exclusive: r.flag(8)?,
            connection_info: r.opt_text(9)?,
            attach_time: r.opt_int(10)?,
            detach_time: r.opt_int(11)?,
            created_at: r.int(12)?,
            updated_at: r.int(13)?,
            legacy: r.flag(14)?,
        })
    }
}

fn rows(rows: Vec<Row>) -> Result<Vec<AttachmentRow>, StoreError> {
    rows.iter().map(AttachmentRow::from_row).collect()
}

pub async fn insert(tx: &mut Tx, a: &AttachmentRow) -> Result<(), StoreError> {
    tx.execute(
        &format!(
            "INSERT INTO volume_attachment ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
             $13, $14, $15)"
        ),
        &params![
            &a.id,
            &a.volume_id,
            &a.project_id,
            &a.instance_uuid,
            &a.attached_host,
            &a.mountpoint,
            &a.attach_mode,
            &a.attach_status,
            a.exclusive,
            &a.connection_info,
            a.attach_time,
            a.detach_time,
            a.created_at,
            a.updated_at,
            a.legacy,
        ],
    ).await?;
    Ok(())
}

/// A live attachment visible in `scope`.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<AttachmentRow>, StoreError> {
    let found = match scope {
        Scope::Project(p) => tx.query(
            &format!("SELECT {COLUMNS} FROM volume_attachment WHERE id = $1 AND deleted = 0 AND project_id = $2"),
            &params![id, p],
        ).await?,
        Scope::All => {
            tx.query(&format!("SELECT {COLUMNS} FROM volume_attachment WHERE id = $1 AND deleted = 0"), &params![id]).await?
        }
    };
    Ok(rows(found)?.pop())
}

/// The live attachments of a volume, oldest first.
pub async fn of_volume(tx: &mut Tx, volume_id: &str) -> Result<Vec<AttachmentRow>, StoreError> {
    rows(tx.query(
        &format!("SELECT {COLUMNS} FROM volume_attachment WHERE volume_id = $1 AND deleted = 0 ORDER BY created_at, id"),
        &params![volume_id],
    ).await?)
}

/// The statuses of a volume's live attachments, each with its `legacy` mark.
pub async fn statuses(tx: &mut Tx, volume_id: &str) -> Result<Vec<(String, bool)>, StoreError> {
    tx.query(
        "SELECT attach_status, legacy FROM volume_attachment WHERE volume_id = $1 AND deleted = 0",
        &params![volume_id],
    )
    .await?
    .iter()
    .map(|r| Ok((r.text(0)?, r.flag(1)?)))
    .collect()
}

/// The live attachments of several volumes (for volume lists).
pub async fn of_volumes(tx: &mut Tx, volume_ids: &[String]) -> Result<Vec<AttachmentRow>, StoreError> {
    if volume_ids.is_empty() {
        return Ok(Vec::new());
    }
    let q = format!(
        "SELECT {COLUMNS} FROM volume_attachment WHERE volume_id IN ({}) AND deleted = 0 ORDER BY created_at, id",
        placeholders(1, volume_ids.len())
    );
    let params: Vec<Param> = volume_ids.iter().map(Param::from).collect();
    rows(tx.query(&q, &params).await?)
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
    tx: &mut Tx,
    id: &str,
    from: &[&str],
    to: &str,
    connected: Option<&Connected>,
) -> Result<bool, StoreError> {
    let mut params: Vec<Param> = Vec::from(params![id, to, now_micros()]);
    let set = match connected {
        Some(c) => {
            params.extend(params![&c.connection_info, &c.attach_mode, &c.attached_host, &c.mountpoint]);
            ", connection_info = $4, attach_mode = $5, attached_host = $6, mountpoint = $7, attach_time = $3"
        }
        None => "",
    };
    let q = format!(
        "UPDATE volume_attachment SET attach_status = $2, updated_at = $3{set} \
         WHERE id = $1 AND deleted = 0 AND attach_status IN ({})",
        placeholders(params.len() + 1, from.len())
    );
    params.extend(from.iter().map(|s| Param::from(*s)));
    Ok(tx.execute(&q, &params).await? == 1)
}

/// Records where a legacy `os-attach` says the volume is attached.
pub async fn set_attached_details(
    tx: &mut Tx,
    id: &str,
    instance_uuid: Option<&str>,
    attached_host: Option<&str>,
    mountpoint: &str,
    attach_mode: &str,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volume_attachment SET instance_uuid = COALESCE($2, instance_uuid), \
         attached_host = COALESCE($3, attached_host), mountpoint = $4, attach_mode = $5, updated_at = $6 \
         WHERE id = $1 AND deleted = 0",
        &params![id, instance_uuid, attached_host, mountpoint, attach_mode, now_micros()],
    )
    .await?;
    Ok(())
}

/// Deletes an attachment (soft, as Cinder does) and its connector.
pub async fn soft_delete(tx: &mut Tx, id: &str) -> Result<bool, StoreError> {
    let changed = tx
        .execute(
            "UPDATE volume_attachment SET deleted = 1, deleted_at = $2, detach_time = $2, updated_at = $2, \
         attach_status = 'detached' WHERE id = $1 AND deleted = 0",
            &params![id, now_micros()],
        )
        .await?;
    if changed == 1 {
        tx.execute("DELETE FROM attachment_specs WHERE attachment_id = $1", &params![id]).await?;
    }
    Ok(changed == 1)
}

/// Replaces the stored connector of an attachment: one row per key, the value as JSON text.
pub async fn put_connector(
    tx: &mut Tx,
    attachment_id: &str,
    connector: &Map<String, Json>,
) -> Result<(), StoreError> {
    tx.execute("DELETE FROM attachment_specs WHERE attachment_id = $1", &params![attachment_id]).await?;
    if connector.is_empty() {
        return Ok(());
    }
    let values: Vec<String> =
        (0..connector.len()).map(|i| format!("($1, ${}, ${})", 2 * i + 2, 2 * i + 3)).collect();
    let q = format!("INSERT INTO attachment_specs (attachment_id, key, value) VALUES {}", values.join(", "));
    let mut params: Vec<Param> = Vec::from(params![attachment_id]);
    for (key, value) in connector {
        params.extend(params![key, value.to_string()]);
    }
    tx.execute(&q, &params).await?;
    Ok(())
}

/// The stored connectors of attachments (absent when an attachment has none).
pub async fn connectors(
    tx: &mut Tx,
    attachment_ids: &[&str],
) -> Result<HashMap<String, Map<String, Json>>, StoreError> {
    if attachment_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let q = format!(
        "SELECT attachment_id, key, value FROM attachment_specs WHERE attachment_id IN ({})",
        placeholders(1, attachment_ids.len())
    );
    let params: Vec<Param> = attachment_ids.iter().map(|id| Param::from(*id)).collect();
    let mut out: HashMap<String, Map<String, Json>> = HashMap::new();
    for row in tx.query(&q, &params).await? {
        let (id, key, value) = (row.text(0)?, row.text(1)?, row.text(2)?);
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
pub async fn list(
    tx: &mut Tx,
    scope: Scope<'_>,
    filter: &AttachmentFilter,
    page: &Page,
    marker: Option<&AttachmentRow>,
) -> Result<Vec<AttachmentRow>, StoreError> {
    let mut q = Query::new(&format!("SELECT {COLUMNS} FROM volume_attachment WHERE deleted = 0"));
    if let Scope::Project(p) = scope {
        q.and("project_id = ?", p);
    }
    if let Some(v) = &filter.volume_id {
        q.and("volume_id = ?", v);
    }
    if let Some(v) = &filter.instance_uuid {
        q.and("instance_uuid = ?", v);
    }
    if let Some(v) = &filter.attach_status {
        q.and("attach_status = ?", v);
    }
    let marker = marker.map(|m| {
        vec![
            ("created_at", Param::from(m.created_at)),
            ("updated_at", Param::from(m.updated_at)),
            ("id", Param::from(&m.id)),
            ("volume_id", Param::from(&m.volume_id)),
            ("instance_uuid", Param::from(m.instance_uuid.clone().unwrap_or_default())),
            ("attach_status", Param::from(&m.attach_status)),
            ("attach_mode", Param::from(m.attach_mode.clone().unwrap_or_default())),
            ("attach_time", Param::from(m.attach_time.unwrap_or(0))),
            ("detach_time", Param::from(m.detach_time.unwrap_or(0))),
        ]
    });
    q.page(page, marker);
    rows(tx.query(&q.sql, &q.params).await?)
}

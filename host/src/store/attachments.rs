//! The `volume_attachment` and `attachment_specs` tables, read into the attach room's
//! [`Attachment`] and [`Connector`].

use std::collections::HashMap;

use serde_json::{Map, Value as Json};

use super::sql::{Param, Row, Tx};
use super::volumes::Query;
use super::{StoreError, now_micros, placeholders, still_purgeable};
use crate::domain::list::{AttachmentFilter, Page, Scope};
use crate::domain::model::{AttachMode, Attachment, Connector, Live};
use crate::domain::state::{AttachStatus, AttachTo, Slot, Transition};
use crate::params;

const COLUMNS: &str = "id, volume_id, project_id, instance_uuid, attached_host, mountpoint, attach_mode, \
     attach_status, exclusive, connection_info, attach_time, detach_time, created_at, updated_at, legacy";

/// The most values one `IN (...)` list binds (SQLite allows 32,766 parameters per statement).
const CHUNK: usize = 500;

fn from_row(r: &Row) -> Result<Attachment, StoreError> {
    let id = r.text(0)?;
    let corrupt =
        |what: &str, value: &str| StoreError::Corrupt(format!("attachment {id} has {what} {value:?}"));
    let status = r.text(7)?;
    let slot = r.int(8)?;
    let connection_info = match r.opt_text(9)? {
        Some(text) => {
            Some(serde_json::from_str(&text).map_err(|_| corrupt("connection_info", "(not JSON)"))?)
        }
        None => None,
    };
    Ok(Attachment {
        volume_id: r.text(1)?,
        project_id: r.text(2)?,
        instance_uuid: r.opt_text(3)?,
        attached_host: r.opt_text(4)?,
        mountpoint: r.opt_text(5)?,
        attach_mode: AttachMode::parse(r.opt_text(6)?.as_deref()),
        status: AttachStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        slot: Slot::from_code(slot).ok_or_else(|| corrupt("slot", &slot.to_string()))?,
        connection_info,
        attach_time: r.opt_int(10)?,
        detach_time: r.opt_int(11)?,
        created_at: r.int(12)?,
        updated_at: r.int(13)?,
        legacy: r.flag(14)?,
        id,
    })
}

fn attachments(rows: Vec<Row>) -> Result<Vec<Attachment>, StoreError> {
    rows.iter().map(from_row).collect()
}

pub async fn insert(tx: &mut Tx, a: &Attachment) -> Result<(), StoreError> {
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
            a.attach_mode.as_str(),
            a.status.as_str(),
            a.slot.code(),
            a.connection_info.as_ref().map(Json::to_string),
            a.attach_time,
            a.detach_time,
            a.created_at,
            a.updated_at,
            a.legacy,
        ],
    )
    .await?;
    Ok(())
}

/// A live attachment visible in `scope`.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<Attachment>, StoreError> {
    let found = match scope {
        Scope::Project(p) => {
            tx.query(
                &format!(
                    "SELECT {COLUMNS} FROM volume_attachment WHERE id = $1 AND deleted = 0 AND project_id = $2"
                ),
                &params![id, p],
            )
            .await?
        }
        Scope::All => {
            tx.query(&format!("SELECT {COLUMNS} FROM volume_attachment WHERE id = $1 AND deleted = 0"), &params![id])
                .await?
        }
    };
    Ok(attachments(found)?.pop())
}

/// The live attachments of a volume, oldest first.
pub async fn of_volume(tx: &mut Tx, volume_id: &str) -> Result<Vec<Attachment>, StoreError> {
    attachments(
        tx.query(
            &format!(
                "SELECT {COLUMNS} FROM volume_attachment WHERE volume_id = $1 AND deleted = 0 ORDER BY created_at, id"
            ),
            &params![volume_id],
        )
        .await?,
    )
}

/// The live attachments of a volume with their connectors, oldest first.
pub async fn live(tx: &mut Tx, volume_id: &str) -> Result<Vec<Live>, StoreError> {
    let all = of_volume(tx, volume_id).await?;
    let ids: Vec<&str> = all.iter().map(|a| a.id.as_str()).collect();
    let mut connectors = connectors(tx, &ids).await?;
    Ok(all
        .into_iter()
        .map(|attachment| {
            let connector = connectors.remove(&attachment.id);
            Live { attachment, connector }
        })
        .collect())
}

/// How many live attachments a volume has.
pub async fn count_live(tx: &mut Tx, volume_id: &str) -> Result<i64, StoreError> {
    tx.query(
        "SELECT COUNT(*) FROM volume_attachment WHERE volume_id = $1 AND deleted = 0",
        &params![volume_id],
    )
    .await?[0]
        .int(0)
}

/// The statuses of a volume's live attachments, each with its `legacy` mark.
pub async fn statuses(tx: &mut Tx, volume_id: &str) -> Result<Vec<(AttachStatus, bool)>, StoreError> {
    tx.query(
        "SELECT attach_status, legacy FROM volume_attachment WHERE volume_id = $1 AND deleted = 0",
        &params![volume_id],
    )
    .await?
    .iter()
    .map(|r| {
        let text = r.text(0)?;
        let status = AttachStatus::parse(&text).ok_or_else(|| {
            StoreError::Corrupt(format!("an attachment of {volume_id} has status {text:?}"))
        })?;
        Ok((status, r.flag(1)?))
    })
    .collect()
}

/// The live attachments of several volumes (for volume lists).
pub async fn of_volumes(tx: &mut Tx, volume_ids: &[String]) -> Result<Vec<Attachment>, StoreError> {
    let mut out = Vec::new();
    for chunk in volume_ids.chunks(CHUNK) {
        let q = format!(
            "SELECT {COLUMNS} FROM volume_attachment WHERE volume_id IN ({}) AND deleted = 0 ORDER BY created_at, id",
            placeholders(1, chunk.len())
        );
        let params: Vec<Param> = chunk.iter().map(Param::from).collect();
        out.extend(attachments(tx.query(&q, &params).await?)?);
    }
    Ok(out)
}

/// Every live attachment in a connected status (`attaching`, `attached`) that has a connector:
/// what the backends owe access to.
pub async fn connected(tx: &mut Tx) -> Result<Vec<Live>, StoreError> {
    let rows = attachments(
        tx.query(
            &connected_query(),
            &params![AttachStatus::Attaching.as_str(), AttachStatus::Attached.as_str()],
        )
        .await?,
    )?;
    let ids: Vec<&str> = rows.iter().map(|a| a.id.as_str()).collect();
    let mut connectors = connectors(tx, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|attachment| {
            let connector = connectors.remove(&attachment.id);
            Live { attachment, connector }
        })
        .collect())
}

/// The statement of [`connected`]: it reads the live rows through the partial index of live
/// attachments, whatever the number of deleted ones.
pub(crate) fn connected_query() -> String {
    format!(
        "SELECT {COLUMNS} FROM volume_attachment a WHERE deleted = 0 AND attach_status IN ($1, $2) AND \
         EXISTS (SELECT 1 FROM attachment_specs s WHERE s.attachment_id = a.id) ORDER BY volume_id"
    )
}

/// What a connect writes on an attachment.
#[derive(Debug, Clone)]
pub struct Connected {
    pub connection_info: Json,
    pub attach_mode: AttachMode,
    pub attached_host: Option<String>,
    pub mountpoint: Option<String>,
}

/// Moves a live attachment to the status the event `t` sets, when it is in one of the statuses
/// `t` starts from, with the connect fields when given. Returns the attachment as written.
pub async fn transition(
    tx: &mut Tx,
    id: &str,
    t: &Transition,
    connected: Option<&Connected>,
) -> Result<Option<Attachment>, StoreError> {
    let to = t
        .attachment_to()
        .ok_or_else(|| StoreError::Corrupt(format!("{:?} does not set an attachment status", t.event)))?;
    let from = t.attachment_from();
    let mut params: Vec<Param> = Vec::from(params![id, to.as_str(), now_micros()]);
    let set = match connected {
        Some(c) => {
            params.extend(params![
                c.connection_info.to_string(),
                c.attach_mode.as_str(),
                &c.attached_host,
                &c.mountpoint
            ]);
            ", connection_info = $4, attach_mode = $5, attached_host = $6, mountpoint = $7, attach_time = $3"
        }
        None => "",
    };
    let q = format!(
        "UPDATE volume_attachment SET attach_status = $2, updated_at = $3{set} \
         WHERE id = $1 AND deleted = 0 AND attach_status IN ({}) RETURNING {COLUMNS}",
        placeholders(params.len() + 1, from.len())
    );
    params.extend(from.iter().map(|s| Param::from(s.as_str())));
    Ok(attachments(tx.query(&q, &params).await?)?.pop())
}

/// Records where a legacy `os-attach` says the volume is attached.
pub async fn set_attached_details(
    tx: &mut Tx,
    id: &str,
    instance_uuid: Option<&str>,
    attached_host: Option<&str>,
    mountpoint: &str,
    attach_mode: AttachMode,
) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volume_attachment SET instance_uuid = COALESCE($2, instance_uuid), \
         attached_host = COALESCE($3, attached_host), mountpoint = $4, attach_mode = $5, updated_at = $6 \
         WHERE id = $1 AND deleted = 0",
        &params![id, instance_uuid, attached_host, mountpoint, attach_mode.as_str(), now_micros()],
    )
    .await?;
    Ok(())
}

/// Deletes a live attachment in one of the statuses the event `t` removes from (soft, as Cinder
/// does), with its connector and its connection info (which holds credentials nobody may use any
/// more). Returns whether it was deleted.
pub async fn remove(tx: &mut Tx, id: &str, t: &Transition) -> Result<bool, StoreError> {
    if !matches!(t.attachment, Some((_, AttachTo::Removed))) {
        return Err(StoreError::Corrupt(format!("{:?} does not remove attachments", t.event)));
    }
    let from = t.attachment_from();
    let mut params: Vec<Param> = Vec::from(params![id, now_micros(), AttachStatus::Detached.as_str()]);
    let q = format!(
        "UPDATE volume_attachment SET deleted = 1, deleted_at = $2, detach_time = $2, updated_at = $2, \
         attach_status = $3, connection_info = NULL WHERE id = $1 AND deleted = 0 AND attach_status IN ({})",
        placeholders(params.len() + 1, from.len())
    );
    params.extend(from.iter().map(|s| Param::from(s.as_str())));
    let changed = tx.execute(&q, &params).await?;
    if changed == 1 {
        tx.execute("DELETE FROM attachment_specs WHERE attachment_id = $1", &params![id]).await?;
    }
    Ok(changed == 1)
}

/// What makes a deleted attachment's row purgeable (`a`: the row; `$1`: the time before which it
/// was deleted): no operation and no event of the history names it (the history's list by
/// attachment finds its volume through this row).
const PURGEABLE: &str = "a.deleted = 1 AND a.deleted_at < $1 \
     AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.attachment_id = a.id) \
     AND NOT EXISTS (SELECT 1 FROM attach_events e WHERE e.volume_id = a.volume_id AND e.attachment_id = a.id)";

/// Up to `limit` attachments deleted before `before` (microseconds) whose rows may go for good
/// ([`purge`]). A read: the table is scanned without holding the writer.
pub async fn purgeable(tx: &mut Tx, before: i64, limit: i64) -> Result<Vec<String>, StoreError> {
    let q = format!("SELECT a.id FROM volume_attachment a WHERE {PURGEABLE} LIMIT $2");
    tx.query(&q, &params![before, limit]).await?.iter().map(|r| r.text(0)).collect()
}

/// Deletes for good the rows of these attachments that are still [`purgeable`] before `before`,
/// with whatever connector rows they kept. Returns how many went.
pub async fn purge(tx: &mut Tx, ids: &[String], before: i64) -> Result<u64, StoreError> {
    if ids.is_empty() {
        return Ok(0);
    }
    let (still, params) = still_purgeable("volume_attachment", "a", PURGEABLE, ids, before);
    tx.execute(&format!("DELETE FROM attachment_specs WHERE attachment_id IN ({still})"), &params).await?;
    tx.execute(&format!("DELETE FROM volume_attachment WHERE id IN ({still})"), &params).await
}

/// Forgets an attachment's connection info (its access was revoked; it held credentials).
pub async fn clear_connection_info(tx: &mut Tx, id: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volume_attachment SET connection_info = NULL, updated_at = $2 WHERE id = $1",
        &params![id, now_micros()],
    )
    .await?;
    Ok(())
}

/// Promotes a live migration's attachment to the volume's one attachment (its source is gone).
pub async fn promote_migration(tx: &mut Tx, volume_id: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE volume_attachment SET exclusive = $2 WHERE volume_id = $1 AND deleted = 0 AND exclusive = $3",
        &params![volume_id, Slot::Exclusive.code(), Slot::Migration.code()],
    )
    .await?;
    Ok(())
}

/// Replaces the stored connector of an attachment (none: it has no connector any more): one row
/// per key, the value as JSON text.
pub async fn put_connector(
    tx: &mut Tx,
    attachment_id: &str,
    connector: Option<&Connector>,
) -> Result<(), StoreError> {
    tx.execute("DELETE FROM attachment_specs WHERE attachment_id = $1", &params![attachment_id]).await?;
    let Some(connector) = connector.filter(|c| !c.json().is_empty()) else { return Ok(()) };
    let json = connector.json();
    let values: Vec<String> =
        (0..json.len()).map(|i| format!("($1, ${}, ${})", 2 * i + 2, 2 * i + 3)).collect();
    let q = format!("INSERT INTO attachment_specs (attachment_id, key, value) VALUES {}", values.join(", "));
    let mut params: Vec<Param> = Vec::from(params![attachment_id]);
    for (key, value) in json {
        params.extend(params![key, value.to_string()]);
    }
    tx.execute(&q, &params).await?;
    Ok(())
}

/// The stored connectors of attachments (absent when an attachment has none), parsed.
pub async fn connectors(
    tx: &mut Tx,
    attachment_ids: &[&str],
) -> Result<HashMap<String, Connector>, StoreError> {
    let mut maps: HashMap<String, Map<String, Json>> = HashMap::new();
    for chunk in attachment_ids.chunks(CHUNK) {
        let q = format!(
            "SELECT attachment_id, key, value FROM attachment_specs WHERE attachment_id IN ({})",
            placeholders(1, chunk.len())
        );
        let params: Vec<Param> = chunk.iter().map(|id| Param::from(*id)).collect();
        for row in tx.query(&q, &params).await? {
            let (id, key, value) = (row.text(0)?, row.text(1)?, row.text(2)?);
            let value: Json = serde_json::from_str(&value)
                .map_err(|e| StoreError::Corrupt(format!("attachment_specs {id}/{key}: {e}")))?;
            maps.entry(id).or_default().insert(key, value);
        }
    }
    maps.into_iter()
        .map(|(id, json)| {
            let c = Connector::parse(json)
                .map_err(|e| StoreError::Corrupt(format!("the connector of attachment {id}: {e}")))?;
            Ok((id, c))
        })
        .collect()
}

/// Live attachments visible in `scope`, filtered and paged.
pub async fn list(
    tx: &mut Tx,
    scope: Scope<'_>,
    filter: &AttachmentFilter,
    page: &Page,
    marker: Option<&Attachment>,
) -> Result<Vec<Attachment>, StoreError> {
    let q = list_query(scope, filter, page, marker);
    attachments(tx.query(&q.sql, &q.params).await?)
}

/// The statement of [`list`].
pub(crate) fn list_query(
    scope: Scope<'_>,
    filter: &AttachmentFilter,
    page: &Page,
    marker: Option<&Attachment>,
) -> Query {
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
            ("attach_status", Param::from(m.status.as_str())),
            ("attach_mode", Param::from(m.attach_mode.as_str())),
            ("attach_time", Param::from(m.attach_time.unwrap_or(0))),
            ("detach_time", Param::from(m.detach_time.unwrap_or(0))),
        ]
    });
    q.page(page, marker);
    q
}

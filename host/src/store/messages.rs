//! The `messages` table: user messages (`attach/messages.rs`), a row each until it expires or a
//! user deletes it.

use super::sql::{Param, Row, Tx};
use super::volumes::Query;
use super::{StoreError, now_micros};
use crate::domain::list::{MessageFilter, Page, Scope};
use crate::params;

/// A message as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: String,
    pub project_id: String,
    pub request_id: Option<String>,
    pub resource_type: String,
    pub resource_uuid: Option<String>,
    pub event_id: String,
    pub action_id: String,
    pub detail_id: String,
    pub message_level: String,
    pub created_at: i64,
    pub expires_at: i64,
}

const COLUMNS: &str = "id, project_id, request_id, resource_type, resource_uuid, event_id, action_id, \
     detail_id, message_level, created_at, expires_at";

fn from_row(r: &Row) -> Result<Message, StoreError> {
    Ok(Message {
        id: r.text(0)?,
        project_id: r.text(1)?,
        request_id: r.opt_text(2)?,
        resource_type: r.text(3)?,
        resource_uuid: r.opt_text(4)?,
        event_id: r.text(5)?,
        action_id: r.text(6)?,
        detail_id: r.text(7)?,
        message_level: r.text(8)?,
        created_at: r.int(9)?,
        expires_at: r.int(10)?,
    })
}

pub async fn insert(tx: &mut Tx, m: &Message) -> Result<(), StoreError> {
    tx.execute(
        &format!("INSERT INTO messages ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"),
        &params![
            &m.id,
            &m.project_id,
            &m.request_id,
            &m.resource_type,
            &m.resource_uuid,
            &m.event_id,
            &m.action_id,
            &m.detail_id,
            &m.message_level,
            m.created_at,
            m.expires_at
        ],
    )
    .await?;
    Ok(())
}

/// A message by id, among those of `scope`'s projects that have not expired.
pub async fn get(tx: &mut Tx, id: &str, scope: Scope<'_>) -> Result<Option<Message>, StoreError> {
    let mut q = Query::new(&format!("SELECT {COLUMNS} FROM messages WHERE id = $1"));
    q.params.push(Param::from(id));
    q.and("expires_at > ?", now_micros());
    if let Scope::Project(p) = scope {
        q.and("project_id = ?", p);
    }
    let rows = tx.query(&q.sql, &q.params).await?;
    rows.iter().map(from_row).next().transpose()
}

/// The messages of `scope`'s projects that have not expired, filtered and paged (newest first
/// unless sorted otherwise).
pub async fn list(
    tx: &mut Tx,
    scope: Scope<'_>,
    filter: &MessageFilter,
    page: &Page,
    marker: Option<&Message>,
) -> Result<Vec<Message>, StoreError> {
    let mut q = Query::new(&format!("SELECT {COLUMNS} FROM messages WHERE expires_at > $1"));
    q.params.push(Param::from(now_micros()));
    if let Scope::Project(p) = scope {
        q.and("project_id = ?", p);
    }
    let filters = [
        ("resource_uuid", &filter.resource_uuid),
        ("resource_type", &filter.resource_type),
        ("event_id", &filter.event_id),
        ("request_id", &filter.request_id),
        ("message_level", &filter.message_level),
    ];
    for (column, value) in filters {
        if let Some(v) = value {
            q.and(&format!("{column} = ?"), v);
        }
    }
    let marker = marker.map(|m| {
        vec![
            ("created_at", Param::from(m.created_at)),
            ("id", Param::from(&m.id)),
            ("event_id", Param::from(&m.event_id)),
            ("resource_uuid", Param::from(m.resource_uuid.clone().unwrap_or_default())),
            ("resource_type", Param::from(&m.resource_type)),
            ("request_id", Param::from(m.request_id.clone().unwrap_or_default())),
            ("message_level", Param::from(&m.message_level)),
        ]
    });
    q.page(page, marker);
    tx.query(&q.sql, &q.params).await?.iter().map(from_row).collect()
}

/// Deletes a message; false when it was gone already.
pub async fn delete(tx: &mut Tx, id: &str) -> Result<bool, StoreError> {
    Ok(tx.execute("DELETE FROM messages WHERE id = $1", &params![id]).await? == 1)
}

/// Deletes at most `limit` of the messages that expired before `now` (microseconds), oldest
/// first; how many. Bounded so that a purge is a series of short writes (`expires_at`'s index
/// finds them), as the history's retention is.
pub async fn purge_expired(tx: &mut Tx, now: i64, limit: i64) -> Result<u64, StoreError> {
    tx.execute(
        "DELETE FROM messages WHERE id IN \
         (SELECT id FROM messages WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2)",
        &params![now, limit.max(1)],
    )
    .await
}

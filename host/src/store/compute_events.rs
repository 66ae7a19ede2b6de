//! The `compute_events` table: events owed to Nova (`attach/compute.rs`), a row each until Nova
//! took it or it was given up.

use super::StoreError;
use super::sql::{Row, Tx};
use crate::params;

/// An event owed: `volume-extended` for `servers`, asked by the request `request_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeEvent {
    pub id: String,
    pub volume_id: String,
    pub servers: Vec<String>,
    pub request_id: Option<String>,
    /// Sent to Nova as `X-OpenStack-Request-ID`.
    pub global_id: Option<String>,
    /// Tries so far (this one included, once claimed).
    pub attempts: i64,
    pub created_at: i64,
}

const COLUMNS: &str = "id, volume_id, servers, request_id, global_id, attempts, created_at";

fn from_row(r: &Row) -> Result<ComputeEvent, StoreError> {
    let servers = r.text(2)?;
    Ok(ComputeEvent {
        id: r.text(0)?,
        volume_id: r.text(1)?,
        servers: serde_json::from_str(&servers)
            .map_err(|e| StoreError::Corrupt(format!("compute_events.servers {servers:?}: {e}")))?,
        request_id: r.opt_text(3)?,
        global_id: r.opt_text(4)?,
        attempts: r.int(5)?,
        created_at: r.int(6)?,
    })
}

/// Owes `e`, due at once.
pub async fn insert(tx: &mut Tx, e: &ComputeEvent) -> Result<(), StoreError> {
    let servers = serde_json::to_string(&e.servers).expect("a list of strings serialises");
    tx.execute(
        &format!("INSERT INTO compute_events ({COLUMNS}, due_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"),
        &params![
            &e.id,
            &e.volume_id,
            &servers,
            &e.request_id,
            &e.global_id,
            e.attempts,
            e.created_at,
            e.created_at
        ],
    )
    .await?;
    Ok(())
}

/// The ids of the events due at `now`, oldest first, at most `limit`.
pub async fn due(tx: &mut Tx, now: i64, limit: i64) -> Result<Vec<String>, StoreError> {
    let rows = tx
        .query(
            "SELECT id FROM compute_events WHERE due_at <= $1 ORDER BY due_at LIMIT $2",
            &params![now, limit],
        )
        .await?;
    rows.iter().map(|r| r.text(0)).collect()
}

/// How many events are owed (by every node: the table is shared).
pub async fn count(tx: &mut Tx) -> Result<i64, StoreError> {
    let rows = tx.query("SELECT COUNT(*) FROM compute_events", &[]).await?;
    rows.first().map_or(Ok(0), |r| r.int(0))
}

/// Claims an event due at `now` for `node` until `until` (one more attempt): the event, or `None`
/// when it is gone or another sender has it.
pub async fn claim(
    tx: &mut Tx,
    id: &str,
    node: &str,
    now: i64,
    until: i64,
) -> Result<Option<ComputeEvent>, StoreError> {
    let claimed = tx
        .execute(
            "UPDATE compute_events SET due_at = $1, attempts = attempts + 1, claimed_by = $2 \
             WHERE id = $3 AND due_at <= $4",
            &params![until, node, id, now],
        )
        .await?;
    if claimed == 0 {
        return Ok(None);
    }
    let rows = tx.query(&format!("SELECT {COLUMNS} FROM compute_events WHERE id = $1"), &params![id]).await?;
    rows.iter().map(from_row).next().transpose()
}

/// Frees the claims of `node` (it started again: its sends of before ended with it), due at
/// `now`; how many.
pub async fn release(tx: &mut Tx, node: &str, now: i64) -> Result<u64, StoreError> {
    tx.execute(
        "UPDATE compute_events SET due_at = $1, claimed_by = NULL WHERE claimed_by = $2 AND due_at > $1",
        &params![now, node],
    )
    .await
}

/// Tries the event again at `due_at`.
pub async fn postpone(tx: &mut Tx, id: &str, due_at: i64) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE compute_events SET due_at = $1, claimed_by = NULL WHERE id = $2",
        &params![due_at, id],
    )
    .await?;
    Ok(())
}

pub async fn delete(tx: &mut Tx, id: &str) -> Result<(), StoreError> {
    tx.execute("DELETE FROM compute_events WHERE id = $1", &params![id]).await?;
    Ok(())
}

/// Every event owed (tests and the operator's view).
pub async fn all(tx: &mut Tx) -> Result<Vec<ComputeEvent>, StoreError> {
    let rows = tx.query(&format!("SELECT {COLUMNS} FROM compute_events ORDER BY created_at"), &[]).await?;
    rows.iter().map(from_row).collect()
}

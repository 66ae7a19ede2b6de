//! The `disabled_services` table: the services (`node@backend`) an admin disabled, with the
//! reason given (`attach/services.rs`). A row per disabled service; enabling deletes it.

use super::sql::{Row, Tx};
use super::{DbKind, StoreError, now_micros};
use crate::params;

/// A disabled service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    /// `node@backend`.
    pub host: String,
    pub reason: Option<String>,
    pub disabled_at: i64,
}

fn from_row(r: &Row) -> Result<Disabled, StoreError> {
    Ok(Disabled { host: r.text(0)?, reason: r.opt_text(1)?, disabled_at: r.int(2)? })
}

/// The PostgreSQL advisory lock that orders the changes of this table against the creates that
/// read it (any number no other part of Berth takes: "berthsvc").
const ORDER_LOCK: i64 = 0x6265_7274_6873_7663;

/// Holds, until the transaction ends, the right to read this table for a new volume: shared with
/// the other creates, never with a disable or enable ([`hold_for_change`]). So a disable answers
/// only once every create that read the table before it has committed, and every create that
/// reads it later sees the disable: on PostgreSQL, whose writes at `READ COMMITTED` would otherwise
/// let a create that read the table before a disable commit after the disable answered. SQLite's
/// one writer orders them already.
pub async fn hold_for_create(tx: &mut Tx) -> Result<(), StoreError> {
    if tx.kind() == DbKind::Postgres {
        tx.execute("SELECT pg_advisory_xact_lock_shared($1)", &params![ORDER_LOCK]).await?;
    }
    Ok(())
}

/// Holds, until the transaction ends, the right to change this table: alone, once the creates
/// that read it have ended ([`hold_for_create`]).
pub async fn hold_for_change(tx: &mut Tx) -> Result<(), StoreError> {
    if tx.kind() == DbKind::Postgres {
        tx.execute("SELECT pg_advisory_xact_lock($1)", &params![ORDER_LOCK]).await?;
    }
    Ok(())
}

/// Every disabled service.
pub async fn list(tx: &mut Tx) -> Result<Vec<Disabled>, StoreError> {
    let rows =
        tx.query("SELECT host, reason, disabled_at FROM disabled_services ORDER BY host", &params![]).await?;
    rows.iter().map(from_row).collect()
}

/// `host`, if it is disabled.
pub async fn get(tx: &mut Tx, host: &str) -> Result<Option<Disabled>, StoreError> {
    let rows = tx
        .query("SELECT host, reason, disabled_at FROM disabled_services WHERE host = $1", &params![host])
        .await?;
    rows.iter().map(from_row).next().transpose()
}

/// Disables `host` (again: a new reason replaces the old one; no reason keeps it, as Cinder's
/// `disable` does).
pub async fn disable(tx: &mut Tx, host: &str, reason: Option<&str>) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO disabled_services (host, reason, disabled_at) VALUES ($1, $2, $3) \
         ON CONFLICT (host) DO UPDATE SET reason = COALESCE(excluded.reason, disabled_services.reason)",
        &params![host, reason, now_micros()],
    )
    .await?;
    Ok(())
}

/// Enables `host`; false when it was not disabled.
pub async fn enable(tx: &mut Tx, host: &str) -> Result<bool, StoreError> {
    Ok(tx.execute("DELETE FROM disabled_services WHERE host = $1", &params![host]).await? > 0)
}

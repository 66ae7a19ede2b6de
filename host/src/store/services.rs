//! The `disabled_services` table: the services (`node@backend`) an admin disabled, with the
//! reason given (`attach/services.rs`). A row per disabled service; enabling deletes it.

use super::sql::{Row, Tx};
use super::{StoreError, now_micros};
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

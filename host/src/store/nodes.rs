//! The `nodes` table: each `berth serve` registers itself at start (its backends, its version)
//! and beats its heart while it runs.

use super::sql::Tx;
use super::{StoreError, now_micros};
use crate::params;

/// A registered node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub backends: Vec<String>,
    pub version: String,
    pub started_at: i64,
    pub heartbeat_at: i64,
}

/// Registers (or registers again) a node that starts now.
pub async fn register(tx: &mut Tx, name: &str, backends: &[String], version: &str) -> Result<(), StoreError> {
    let now = now_micros();
    // An upsert both databases understand.
    tx.execute("DELETE FROM nodes WHERE name = $1", &params![name]).await?;
    tx.execute(
        "INSERT INTO nodes (name, backends, version, started_at, heartbeat_at) VALUES ($1, $2, $3, $4, $4)",
        &params![name, backends.join(","), version, now],
    )
    .await?;
    Ok(())
}

/// Records that the node is alive now.
pub async fn heartbeat(tx: &mut Tx, name: &str) -> Result<(), StoreError> {
    tx.execute("UPDATE nodes SET heartbeat_at = $2 WHERE name = $1", &params![name, now_micros()]).await?;
    Ok(())
}

/// Every node, by name.
pub async fn list(tx: &mut Tx) -> Result<Vec<Node>, StoreError> {
    tx.query("SELECT name, backends, version, started_at, heartbeat_at FROM nodes ORDER BY name", &[])
        .await?
        .iter()
        .map(|r| {
            Ok(Node {
                name: r.text(0)?,
                backends: r.text(1)?.split(',').filter(|b| !b.is_empty()).map(str::to_string).collect(),
                version: r.text(2)?,
                started_at: r.int(3)?,
                heartbeat_at: r.int(4)?,
            })
        })
        .collect()
}

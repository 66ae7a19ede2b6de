//! The `nodes` table: each `berth serve` registers itself at start (its backends, the ones it
//! serves together with other nodes, the URL other nodes reach it at, its version) and beats its
//! heart while it runs.

use super::sql::Tx;
use super::{StoreError, now_micros};
use crate::params;

/// A registered node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    /// Every backend it serves.
    pub backends: Vec<String>,
    /// Those of its backends that other nodes serve too (`shared = true`).
    pub shared_backends: Vec<String>,
    /// Where other nodes forward requests for the volumes it owns.
    pub url: Option<String>,
    pub version: String,
    pub started_at: i64,
    pub heartbeat_at: i64,
}

/// What a node registers.
#[derive(Debug, Clone, Default)]
pub struct Registration<'a> {
    pub name: &'a str,
    pub backends: &'a [String],
    pub shared_backends: &'a [String],
    pub url: Option<&'a str>,
    pub version: &'a str,
}

/// Registers (or registers again) a node that starts now.
pub async fn register(tx: &mut Tx, node: &Registration<'_>) -> Result<(), StoreError> {
    let now = now_micros();
    // An upsert both databases understand.
    tx.execute("DELETE FROM nodes WHERE name = $1", &params![node.name]).await?;
    tx.execute(
        "INSERT INTO nodes (name, backends, shared_backends, url, version, started_at, heartbeat_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $6)",
        &params![
            node.name,
            node.backends.join(","),
            node.shared_backends.join(","),
            node.url,
            node.version,
            now
        ],
    )
    .await?;
    Ok(())
}

/// Records that the node is alive now.
pub async fn heartbeat(tx: &mut Tx, name: &str) -> Result<(), StoreError> {
    tx.execute("UPDATE nodes SET heartbeat_at = $2 WHERE name = $1", &params![name, now_micros()]).await?;
    Ok(())
}

fn list_of(text: String) -> Vec<String> {
    text.split(',').filter(|b| !b.is_empty()).map(str::to_string).collect()
}

/// Every node, by name.
pub async fn list(tx: &mut Tx) -> Result<Vec<Node>, StoreError> {
    tx.query(
        "SELECT name, backends, shared_backends, url, version, started_at, heartbeat_at FROM nodes ORDER BY name",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        Ok(Node {
            name: r.text(0)?,
            backends: list_of(r.text(1)?),
            shared_backends: list_of(r.text(2)?),
            url: r.opt_text(3)?,
            version: r.text(4)?,
            started_at: r.int(5)?,
            heartbeat_at: r.int(6)?,
        })
    })
    .collect()
}

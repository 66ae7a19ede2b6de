//! The `nodes` table: each `berth serve` registers itself at start (its backends, the ones it
//! serves together with other nodes, the URL other nodes reach it at, its version, the process
//! that holds its name and what it runs) and beats its heart while it runs.

use std::collections::BTreeMap;

use super::sql::Tx;
use super::{StoreError, now_micros};
use crate::params;

/// What a node runs for one backend, as the other nodes compare it.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct BackendInfo {
    pub shared: bool,
    /// The driver's name and version, as it reports them.
    pub driver: String,
    pub version: String,
    /// sha256 of the driver's `.wasm`.
    pub digest: String,
    /// The LUNs the backend's target service may hold on the node's machine (none: it has no
    /// target service). Not compared between nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lun_ceiling: Option<u64>,
    /// Since when (Unix time, microseconds) the node has run this driver for the backend, and how it
    /// came to (`configured`, `upgraded`, `rolled back`). Not compared between nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<String>,
    /// The driver's vendor, the protocols it speaks (as Cinder's `storage_protocol` names them)
    /// and whether its volumes may have several attachments: what `get_pools` shows. Not
    /// compared between nodes (the digest is).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vendor: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protocols: Vec<String>,
    #[serde(default)]
    pub multiattach: bool,
    /// Its attached volumes may be extended (`online_extend`). Not compared between nodes.
    #[serde(default)]
    pub online_extend: bool,
    /// The filesystem its volumes are files on, when they are (what `get_pools` shows of its
    /// capacity), as last published. Not compared between nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<FilesystemInfo>,
}

/// A backend's filesystem, as a node publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct FilesystemInfo {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// As Cinder's pools show it (`"20.0"`).
    pub max_over_subscription_ratio: String,
    pub reserved_percentage: u32,
}

/// What a node's configuration makes of volume types: the type volumes get when they name none,
/// and what each type and each set of QoS specs is, by name. Nodes compare it: a name must mean
/// one thing on every live node.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TypeDefinitions {
    pub default_type: String,
    pub types: BTreeMap<String, TypeDefinition>,
    pub qos_specs: BTreeMap<String, QosDefinition>,
}

/// A volume type, as configured (`[[volume_types]]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct TypeDefinition {
    pub backend: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub extra_specs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_specs: Option<String>,
}

/// A set of QoS specs, as configured (`[[qos_specs]]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct QosDefinition {
    pub consumer: crate::domain::qos::QosConsumer,
    #[serde(default)]
    pub specs: BTreeMap<String, String>,
}

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
    /// 0 once the node has stopped cleanly.
    pub heartbeat_at: i64,
    /// The process that holds the name now.
    pub incarnation: String,
    /// Where that process runs (host and data directory).
    pub holder: String,
    pub lease_seconds: i64,
    /// What it runs, by backend.
    pub backend_info: BTreeMap<String, BackendInfo>,
    /// Its volume types (none: registered by a berth that did not publish them).
    pub types: Option<TypeDefinitions>,
}

/// What a node registers.
#[derive(Debug, Clone)]
pub struct Registration<'a> {
    pub name: &'a str,
    pub backends: &'a [String],
    pub shared_backends: &'a [String],
    pub url: Option<&'a str>,
    pub version: &'a str,
    pub incarnation: &'a str,
    pub holder: &'a str,
    pub lease_seconds: i64,
    pub backend_info: &'a BTreeMap<String, BackendInfo>,
    pub types: &'a TypeDefinitions,
}

/// Registers (or registers again) a node that starts now.
pub async fn register(tx: &mut Tx, node: &Registration<'_>) -> Result<(), StoreError> {
    let now = now_micros();
    // An upsert both databases understand.
    tx.execute("DELETE FROM nodes WHERE name = $1", &params![node.name]).await?;
    tx.execute(
        "INSERT INTO nodes (name, backends, shared_backends, url, version, started_at, heartbeat_at, \
         incarnation, holder, lease_seconds, backend_info, volume_types) \
         VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9, $10, $11)",
        &params![
            node.name,
            node.backends.join(","),
            node.shared_backends.join(","),
            node.url,
            node.version,
            now,
            node.incarnation,
            node.holder,
            node.lease_seconds,
            serde_json::to_string(node.backend_info).expect("backend info serialises"),
            serde_json::to_string(node.types).expect("type definitions serialise")
        ],
    )
    .await?;
    Ok(())
}

/// Replaces what a node registered it runs (after a driver switch), if `incarnation` still holds
/// its name.
pub async fn set_backend_info(
    tx: &mut Tx,
    name: &str,
    incarnation: &str,
    info: &BTreeMap<String, BackendInfo>,
) -> Result<bool, StoreError> {
    Ok(tx
        .execute(
            "UPDATE nodes SET backend_info = $3 WHERE name = $1 AND incarnation = $2",
            &params![name, incarnation, serde_json::to_string(info).expect("backend info serialises")],
        )
        .await?
        == 1)
}

/// Records that the node is alive now, if `incarnation` still holds its name; false when another
/// process has taken it.
pub async fn heartbeat(tx: &mut Tx, name: &str, incarnation: &str) -> Result<bool, StoreError> {
    Ok(tx
        .execute(
            "UPDATE nodes SET heartbeat_at = $3 WHERE name = $1 AND incarnation = $2",
            &params![name, incarnation, now_micros()],
        )
        .await?
        == 1)
}

/// Marks a node down at once (a clean stop), if `incarnation` still holds its name.
pub async fn mark_down(tx: &mut Tx, name: &str, incarnation: &str) -> Result<(), StoreError> {
    tx.execute(
        "UPDATE nodes SET heartbeat_at = 0 WHERE name = $1 AND incarnation = $2",
        &params![name, incarnation],
    )
    .await?;
    Ok(())
}

fn list_of(text: String) -> Vec<String> {
    text.split(',').filter(|b| !b.is_empty()).map(str::to_string).collect()
}

/// Every node, by name.
pub async fn list(tx: &mut Tx) -> Result<Vec<Node>, StoreError> {
    tx.query(
        "SELECT name, backends, shared_backends, url, version, started_at, heartbeat_at, incarnation, holder, \
         lease_seconds, backend_info, volume_types FROM nodes ORDER BY name",
        &[],
    )
    .await?
    .iter()
    .map(|r| {
        let name = r.text(0)?;
        let info = r.text(10)?;
        let backend_info = serde_json::from_str(&info)
            .map_err(|e| StoreError::Corrupt(format!("node {name}: backend_info: {e}")))?;
        let types = r.text(11)?;
        let types = (!types.is_empty())
            .then(|| serde_json::from_str(&types))
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("node {name}: volume_types: {e}")))?;
        Ok(Node {
            backends: list_of(r.text(1)?),
            shared_backends: list_of(r.text(2)?),
            url: r.opt_text(3)?,
            version: r.text(4)?,
            started_at: r.int(5)?,
            heartbeat_at: r.int(6)?,
            incarnation: r.text(7)?,
            holder: r.text(8)?,
            lease_seconds: r.int(9)?,
            backend_info,
            types,
            name,
        })
    })
    .collect()
}

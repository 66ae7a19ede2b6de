//! The nodes of this service and their backends. Each `berth serve` registers itself with its
//! backends and the URL other nodes reach it at, and beats its heart every third of a lease; a
//! node whose heartbeat is older than a lease is `down`.
//!
//! **Where a volume's driver calls run** ([`Service::placement`]). A backend whose targets are
//! local to a node (tgt: each node has its own tgtd) is owned by that node, and so are its
//! volumes: the volume's `service_uuid` names node and backend, and only that node runs their
//! driver calls. A backend marked `shared` (a driver that reaches its backend over the network)
//! has one `service_uuid` on every node that serves it, and any of them runs its volumes' calls.
//! A request that needs another node is forwarded there by the API (`api/forward.rs`); when that
//! node is down, it is refused with 503 and `Retry-After`, and no other node touches its targets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::catalog::{service_uuid, shared_service_uuid};
use super::model::Volume;
use super::{AttachError, Service};
use crate::store::nodes::{self, Node, Registration};
use crate::store::sql::Tx;
use crate::store::{now_micros, volumes};

/// How a shared backend is named in `os-vol-host-attr:host` (Cinder names an active-active
/// backend by its cluster): every node that serves it may run its volumes.
pub const CLUSTER: &str = "berth";

/// One line of the services listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceState {
    /// `berth-api` for a node, `cinder-volume` for one of its backends (as Cinder names it, so
    /// that clients that look for volume services find them).
    pub binary: &'static str,
    /// `node` or `node@backend`.
    pub host: String,
    /// `berth@backend` for a shared backend (its cluster, in Cinder's words).
    pub cluster: Option<String>,
    pub up: bool,
    pub updated_at: i64,
}

/// The `service_uuid` of each backend of a node.
fn backends_of(n: &Node) -> impl Iterator<Item = (String, &String, bool)> {
    n.backends.iter().map(move |b| {
        let shared = n.shared_backends.contains(b);
        let uuid = if shared { shared_service_uuid(b) } else { service_uuid(&n.name, b) };
        (uuid, b, shared)
    })
}

/// Which node serves each backend, by `service_uuid`: Cinder's `os-vol-host-attr:host`.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// `service_uuid` to `node@backend` (`berth@backend` when shared).
    by_uuid: HashMap<String, String>,
    this_node: String,
}

impl Hosts {
    pub fn of(nodes: &[Node], this_node: &str) -> Hosts {
        let by_uuid = nodes
            .iter()
            .flat_map(|n| {
                backends_of(n).map(move |(uuid, b, shared)| {
                    (uuid, format!("{}@{b}", if shared { CLUSTER } else { n.name.as_str() }))
                })
            })
            .collect();
        Hosts { by_uuid, this_node: this_node.to_string() }
    }

    /// `node@backend#pool` (the pool is the backend) of a volume; this node's for a volume that
    /// names no node.
    pub fn host(&self, v: &Volume) -> String {
        let served = v.service_uuid.as_ref().and_then(|u| self.by_uuid.get(u));
        match served {
            Some(h) => format!("{h}#{}", v.backend),
            None => format!("{}@{}#{}", self.this_node, v.backend, v.backend),
        }
    }
}

/// Where a volume's driver calls run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// On this node.
    Here,
    /// On another node.
    Elsewhere(Remote),
}

/// A node that runs a volume's driver calls instead of this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    pub volume: String,
    /// The node's name; its `service_uuid` when no registered node serves the volume.
    pub node: String,
    /// Where it takes forwarded requests.
    pub url: Option<String>,
    /// Its heartbeat is younger than a lease.
    pub up: bool,
    /// Seconds since its last heartbeat.
    pub silent_for: i64,
}

/// Where the API sends a request it cannot answer itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    pub node: String,
    pub url: String,
}

impl Remote {
    /// Where to forward the request, if the node is up and reachable.
    pub fn forwardable(&self) -> Option<Forward> {
        let url = self.url.as_ref().filter(|_| self.up)?;
        Some(Forward { node: self.node.clone(), url: url.clone() })
    }
}

impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (volume, node) = (&self.volume, &self.node);
        match (&self.url, self.up) {
            (Some(_), true) => write!(
                f,
                "Volume {volume} is served by another Berth node, {node} (up), which did not answer a \
                 forwarded request; retry."
            ),
            (None, true) => write!(
                f,
                "Volume {volume} is served by another Berth node, {node} (up), which registered no \
                 address to forward requests to; send the request to that node."
            ),
            (_, false) => write!(
                f,
                "Volume {volume} is served by another Berth node, {node} (down: no heartbeat for {} s), \
                 whose targets this node cannot reach; retry when it is back.",
                self.silent_for
            ),
        }
    }
}

impl Service {
    /// Which node serves each backend (for `os-vol-host-attr:host`).
    pub async fn hosts(&self) -> Result<Hosts, AttachError> {
        let nodes: Vec<Node> = self.store.read(async |tx| nodes::list(tx).await).await?;
        Ok(Hosts::of(&nodes, &self.owner.node))
    }

    /// Where the driver calls of a volume run (see the module notes). A volume that does not
    /// exist is placed here: the flow then answers that it does not exist.
    pub(crate) async fn placement(&self, tx: &mut Tx, volume_id: &str) -> Result<Placement, AttachError> {
        let served = volumes::backends(tx, &[volume_id.to_string()]).await?;
        let Some(served) = served.get(volume_id) else { return Ok(Placement::Here) };
        let here = self.catalog.backend(&served.backend);
        let Some(owner) = &served.service_uuid else {
            // A volume from before nodes had names: this node's, if it has the backend.
            return match here {
                Some(_) => Ok(Placement::Here),
                None => Err(AttachError::BackendUnavailable(served.backend.clone())),
            };
        };
        if here.is_some_and(|b| b.service_uuid == *owner) {
            return Ok(Placement::Here);
        }
        // The nodes that serve it, those up first.
        let lease = i64::try_from(self.owner.lease.as_micros()).unwrap_or(i64::MAX);
        let now = now_micros();
        let mut candidates: Vec<Remote> = nodes::list(tx)
            .await?
            .into_iter()
            .filter(|n| n.name != self.owner.node && backends_of(n).any(|(uuid, _, _)| uuid == *owner))
            .map(|n| Remote {
                volume: volume_id.to_string(),
                up: now - n.heartbeat_at <= lease,
                silent_for: (now - n.heartbeat_at) / 1_000_000,
                node: n.name,
                url: n.url,
            })
            .collect();
        candidates.sort_by_key(|r| (!r.up, r.url.is_none(), r.silent_for));
        Ok(Placement::Elsewhere(candidates.into_iter().next().unwrap_or(Remote {
            volume: volume_id.to_string(),
            node: owner.clone(),
            url: None,
            up: false,
            silent_for: 0,
        })))
    }

    /// Refuses, naming the node that serves it, a volume whose driver calls run elsewhere.
    pub(crate) async fn check_placement(&self, tx: &mut Tx, volume_id: &str) -> Result<(), AttachError> {
        match self.placement(tx, volume_id).await? {
            Placement::Here => Ok(()),
            Placement::Elsewhere(remote) => Err(AttachError::Elsewhere(remote)),
        }
    }

    /// Registers this node, its backends and the URL other nodes forward requests to.
    pub async fn register_node(&self, url: Option<&str>) -> Result<(), AttachError> {
        let mut backends: Vec<String> = self.catalog.backends.keys().cloned().collect();
        backends.sort();
        let shared: Vec<String> =
            backends.iter().filter(|b| self.catalog.backends[*b].shared).cloned().collect();
        let registration = Registration {
            name: &self.owner.node,
            backends: &backends,
            shared_backends: &shared,
            url,
            version: env!("CARGO_PKG_VERSION"),
        };
        self.store.write(async |tx| nodes::register(tx, &registration).await).await?;
        Ok(())
    }

    /// Beats this node's heart until the task is dropped.
    pub async fn keep_alive(self: Arc<Self>) {
        let every = (self.owner.lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let node = self.owner.node.clone();
            if let Err(e) = self.store.write(async |tx| nodes::heartbeat(tx, &node).await).await {
                tracing::warn!("could not record this node's heartbeat: {e}");
            }
        }
    }

    /// Every node and backend, with whether it is up.
    pub async fn services(&self) -> Result<Vec<ServiceState>, AttachError> {
        let nodes: Vec<Node> = self.store.read(async |tx| nodes::list(tx).await).await?;
        let lease = i64::try_from(self.owner.lease.as_micros()).unwrap_or(i64::MAX);
        let now = now_micros();
        let mut out = Vec::new();
        for n in &nodes {
            let up = now - n.heartbeat_at <= lease;
            out.push(ServiceState {
                binary: "berth-api",
                host: n.name.clone(),
                cluster: None,
                up,
                updated_at: n.heartbeat_at,
            });
            for (_, b, shared) in backends_of(n) {
                out.push(ServiceState {
                    binary: "cinder-volume",
                    host: format!("{}@{b}", n.name),
                    cluster: shared.then(|| format!("{CLUSTER}@{b}")),
                    up,
                    updated_at: n.heartbeat_at,
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, backends: &[&str], shared: &[&str], heartbeat_at: i64) -> Node {
        Node {
            name: name.into(),
            backends: backends.iter().map(|b| b.to_string()).collect(),
            shared_backends: shared.iter().map(|b| b.to_string()).collect(),
            url: Some(format!("http://{name}:8776")),
            version: "0".into(),
            started_at: 0,
            heartbeat_at,
        }
    }

    #[test]
    fn a_node_local_backend_is_named_by_its_node_and_a_shared_one_by_the_cluster() {
        let nodes =
            [node("a", &["tgt", "array"], &["array"], 0), node("b", &["tgt", "array"], &["array"], 0)];
        let hosts = Hosts::of(&nodes, "a");
        assert_eq!(hosts.by_uuid[&service_uuid("a", "tgt")], "a@tgt");
        assert_eq!(hosts.by_uuid[&service_uuid("b", "tgt")], "b@tgt");
        assert_eq!(hosts.by_uuid[&shared_service_uuid("array")], "berth@array");
        assert!(!hosts.by_uuid.contains_key(&service_uuid("a", "array")));
    }

    #[test]
    fn a_remote_node_is_forwarded_to_only_when_it_is_up_and_has_an_address() {
        let remote = |url: Option<&str>, up| Remote {
            volume: "v".into(),
            node: "a".into(),
            url: url.map(str::to_string),
            up,
            silent_for: 42,
        };
        assert_eq!(
            remote(Some("http://a"), true).forwardable(),
            Some(Forward { node: "a".into(), url: "http://a".into() })
        );
        assert_eq!(remote(Some("http://a"), false).forwardable(), None);
        assert_eq!(remote(None, true).forwardable(), None);
        let down = remote(Some("http://a"), false).to_string();
        assert!(down.contains("a (down: no heartbeat for 42 s)"), "{down}");
    }
}

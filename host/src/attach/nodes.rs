//! The nodes of this service and their backends, as Cinder's services listing shows them: each
//! `berth serve` registers itself with its backends at start and beats its heart every third of a
//! lease; a node whose heartbeat is older than a lease is `down`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::catalog::service_uuid;
use super::model::Volume;
use super::{AttachError, Service};
use crate::store::nodes::{self, Node};
use crate::store::now_micros;

/// One line of the services listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceState {
    /// `berth-api` for a node, `cinder-volume` for one of its backends (as Cinder names it, so
    /// that clients that look for volume services find them).
    pub binary: &'static str,
    /// `node` or `node@backend`.
    pub host: String,
    pub up: bool,
    pub updated_at: i64,
}

/// Which node serves each backend, by `service_uuid`: Cinder's `os-vol-host-attr:host`.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// `service_uuid` to `node@backend`.
    by_uuid: HashMap<String, String>,
    this_node: String,
}

impl Hosts {
    pub fn of(nodes: &[Node], this_node: &str) -> Hosts {
        let by_uuid = nodes
            .iter()
            .flat_map(|n| {
                n.backends.iter().map(move |b| (service_uuid(&n.name, b), format!("{}@{b}", n.name)))
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

    /// The node that serves a `service_uuid`, if known.
    pub fn node_of(&self, uuid: &str) -> Option<&str> {
        self.by_uuid.get(uuid).and_then(|h| h.split_once('@')).map(|(n, _)| n)
    }
}

impl Service {
    /// Which node serves each backend (for `os-vol-host-attr:host`).
    pub async fn hosts(&self) -> Result<Hosts, AttachError> {
        let nodes: Vec<Node> = self.store.read(async |tx| nodes::list(tx).await).await?;
        Ok(Hosts::of(&nodes, &self.owner.node))
    }

    /// Registers this node and its backends.
    pub async fn register_node(&self) -> Result<(), AttachError> {
        let mut backends: Vec<String> = self.catalog.backends.keys().cloned().collect();
        backends.sort();
        let node = self.owner.node.clone();
        self.store
            .write(async |tx| nodes::register(tx, &node, &backends, env!("CARGO_PKG_VERSION")).await)
            .await?;
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
        for n in nodes {
            let up = now - n.heartbeat_at <= lease;
            out.push(ServiceState {
                binary: "berth-api",
                host: n.name.clone(),
                up,
                updated_at: n.heartbeat_at,
            });
            for b in &n.backends {
                out.push(ServiceState {
                    binary: "cinder-volume",
                    host: format!("{}@{b}", n.name),
                    up,
                    updated_at: n.heartbeat_at,
                });
            }
        }
        Ok(out)
    }
}

//! Disabling a service (`cinder service-disable`, `PUT /os-services/disable` and
//! `disable-log-reason`) and enabling it again. A service here is a node's backend,
//! `node@backend` (binary `cinder-volume`, as `GET /os-services` lists it): a disabled one makes
//! no new volume, as a disabled Cinder volume service is given none by the scheduler, and serves
//! the volumes it has as before: attaches, detaches, extends, deletes. It is how an operator
//! drains a backend before its array's maintenance or retirement. The state is in the database
//! (`store/services.rs`), so every node sees it, and a create checks it in the transaction that
//! records the volume, on PostgreSQL under a lock that a disable waits for
//! (`store/services.rs`): a disable answers once every create that read it as enabled is
//! recorded, and a create that begins once `disable` has answered is refused. A create already
//! recorded may still finish (its driver call), as a Cinder volume already scheduled does.
//!
//! A shared backend's services together are its cluster, `berth@backend` ([`Cluster`]):
//! disabling the cluster stops new volumes on it through every node.
//!
//! A node (`berth-api`) cannot be disabled: what it would stop is not a scheduling decision
//! (its volumes are served only by it); disable its backends.
//!
//! The listing itself (`GET /os-services`) is here too: each node, up or down by its heartbeat
//! (`attach/nodes.rs`), and each of its backends, enabled or disabled; and the pools, as Cinder's
//! scheduler lists them (`cinder get-pools`): the backends that take new volumes now.

use std::collections::BTreeMap;

use super::catalog::CLUSTER;
use super::nodes::backends_of;
use super::{AttachError, Service};
use crate::store::nodes::{self, BackendInfo, Node};
use crate::store::services::{self, Disabled};
use crate::store::sql::Tx;
use crate::store::{StoreError, volumes};

/// The binary of a node's backend in `GET /os-services`, as Cinder names a volume service.
pub const VOLUME_BINARY: &str = "cinder-volume";

/// The longest reason (Cinder's limit).
pub const MAX_REASON: usize = 255;

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
    /// A backend's driver, as the node that serves it registered it.
    pub runs: Option<BackendInfo>,
    /// A node's operations lease, in seconds, and its version.
    pub lease_seconds: Option<i64>,
    pub version: Option<String>,
    /// A backend's LUNs in its target service now (this node's backends only).
    pub luns: Option<u64>,
    /// Since when and why a backend is disabled; `None`: enabled.
    pub disabled: Option<Disabled>,
    /// A backend that takes new volumes now, one of the pools ([`Service::pools`]): its node is
    /// up, and neither it nor its cluster is disabled.
    pub takes_volumes: bool,
}

/// A pool, as Cinder's scheduler reports it: a backend that takes new volumes now (a node that
/// serves it is up, and has not disabled it). Its name is the host its volumes show
/// (`node@backend`, or `berth@backend` for a shared backend, listed once for all its nodes), then
/// `#` and the backend: each backend is one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub backend: String,
    /// The newest heartbeat of the nodes that serve it.
    pub updated_at: i64,
    /// The driver, as one of those nodes registered it.
    pub runs: BackendInfo,
    /// The volume types that lead to it.
    pub volume_types: Vec<String>,
    /// Its live volumes, and their GiB.
    pub volumes: i64,
    pub allocated_gib: i64,
}

impl Service {
    /// The pools (see [`Pool`]), by name.
    pub async fn pools(&self) -> Result<Vec<Pool>, AttachError> {
        let ((nodes, disabled), usage) = self
            .store
            .read(async |tx| {
                Ok::<_, StoreError>((nodes_and_disabled(tx).await?, volumes::usage_by_service(tx).await?))
            })
            .await?;
        let live = self.liveness();
        let mut pools: BTreeMap<String, Pool> = BTreeMap::new();
        for n in nodes.iter().filter(|n| live.up(n)) {
            for (uuid, b, shared) in backends_of(n) {
                let host = format!("{}@{b}", n.name);
                let cluster = shared.then(|| format!("{CLUSTER}@{b}"));
                if !takes_volumes(&disabled, &host, cluster.as_deref()) {
                    continue;
                }
                let (count, gib) = usage
                    .iter()
                    .filter(|(u, backend, _, _)| {
                        backend == b
                            && (u.as_deref() == Some(uuid.as_str())
                                // A volume from before nodes had names is this node's.
                                || (u.is_none() && n.name == self.owner.node))
                    })
                    .fold((0, 0), |(c, g), (_, _, count, gib)| (c + count, g + gib));
                let name = format!("{}@{b}#{b}", if shared { CLUSTER } else { n.name.as_str() });
                let pool = pools.entry(name.clone()).or_insert_with(|| Pool {
                    name,
                    backend: b.clone(),
                    updated_at: n.heartbeat_at,
                    runs: n.backend_info.get(b).cloned().unwrap_or_default(),
                    volume_types: self
                        .catalog
                        .types
                        .iter()
                        .filter(|t| t.backend == *b)
                        .map(|t| t.name.clone())
                        .collect(),
                    volumes: count,
                    allocated_gib: gib,
                });
                pool.updated_at = pool.updated_at.max(n.heartbeat_at);
            }
        }
        Ok(pools.into_values().collect())
    }

    /// Every node and backend, with whether it is up.
    pub async fn services(&self) -> Result<Vec<ServiceState>, AttachError> {
        let (nodes, disabled) = self.store.read(async |tx| nodes_and_disabled(tx).await).await?;
        let live = self.liveness();
        let mut out = Vec::new();
        for n in &nodes {
            let up = live.up(n);
            out.push(ServiceState {
                binary: "berth-api",
                host: n.name.clone(),
                cluster: None,
                up,
                updated_at: n.heartbeat_at,
                runs: None,
                lease_seconds: Some(n.lease_seconds),
                version: Some(n.version.clone()),
                luns: None,
                disabled: None,
                takes_volumes: false,
            });
            for (_, b, shared) in backends_of(n) {
                let host = format!("{}@{b}", n.name);
                let cluster = shared.then(|| format!("{CLUSTER}@{b}"));
                out.push(ServiceState {
                    binary: VOLUME_BINARY,
                    disabled: disabled.iter().find(|d| d.host == host).cloned(),
                    takes_volumes: up && takes_volumes(&disabled, &host, cluster.as_deref()),
                    host,
                    cluster,
                    up,
                    updated_at: n.heartbeat_at,
                    runs: n.backend_info.get(b).cloned(),
                    lease_seconds: None,
                    version: None,
                    // Known live for this node's own backends only.
                    luns: (n.name == self.owner.node)
                        .then(|| self.catalog.backend(b.as_str()).and_then(|b| self.luns_of(&b)))
                        .flatten()
                        .map(|c| c.held),
                });
            }
        }
        Ok(out)
    }

    /// Disables `host` (`node@backend`), with `reason` if given (otherwise a reason given before
    /// stays), or enables it; answers the service as it is now.
    pub async fn set_service_disabled(
        &self,
        host: &str,
        binary: &str,
        disabled: bool,
        reason: Option<String>,
    ) -> Result<ServiceState, AttachError> {
        let reason = checked_reason(reason)?;
        let Some(service) = self.services().await?.into_iter().find(|s| s.host == host && s.binary == binary)
        else {
            return Err(AttachError::NotFound(format!("Could not find binary {binary} on host {host}.")));
        };
        if service.binary != VOLUME_BINARY {
            return Err(AttachError::InvalidInput(format!(
                "Service {host} is a Berth node ({binary}), which cannot be disabled: disable its backends \
                 (binary {VOLUME_BINARY}, host {host}@<backend>), each then makes no new volume"
            )));
        }
        // A service disabled again without a reason keeps the one it had, as Cinder's.
        let now = self.write_disabled("service", host, disabled, reason, true).await?;
        Ok(ServiceState { disabled: now, ..service })
    }

    /// Whether this node may make a new volume, `volume`, on `backend`: not while the backend's
    /// cluster is disabled (a shared backend), nor while this node's service of it is. A shared
    /// backend's volume is then made by another node of the cluster whose service is enabled
    /// and up: the request is forwarded there ([`AttachError::Elsewhere`]), as Cinder's scheduler
    /// would send it to another service of the cluster.
    pub(crate) async fn check_enabled(
        &self,
        tx: &mut Tx,
        backend: &super::Backend,
        volume: &str,
    ) -> Result<(), AttachError> {
        services::hold_for_create(tx).await?;
        let cluster = format!("{CLUSTER}@{}", backend.name);
        if backend.shared && services::get(tx, &cluster).await?.is_some() {
            return Err(AttachError::ServiceDisabled(cluster));
        }
        let host = format!("{}@{}", self.owner.node, backend.name);
        if services::get(tx, &host).await?.is_none() {
            return Ok(());
        }
        if backend.shared {
            let live = self.liveness();
            let (nodes, disabled) = nodes_and_disabled(tx).await?;
            let other = nodes.into_iter().find(|n| {
                n.name != self.owner.node
                    && n.url.is_some()
                    && live.up(n)
                    && n.shared_backends.contains(&backend.name)
                    && !disabled.iter().any(|d| d.host == format!("{}@{}", n.name, backend.name))
            });
            if let Some(n) = other {
                return Err(AttachError::Elsewhere(super::nodes::Remote {
                    volume: volume.to_string(),
                    up: true,
                    silent_for: live.silent_for(&n),
                    node: n.name,
                    url: n.url,
                }));
            }
        }
        Err(AttachError::ServiceDisabled(host))
    }

    /// The clusters: each shared backend, `berth@backend`, with the nodes that serve it.
    pub async fn clusters(&self) -> Result<Vec<Cluster>, AttachError> {
        let (nodes, disabled) = self.store.read(async |tx| nodes_and_disabled(tx).await).await?;
        let live = self.liveness();
        let mut clusters: BTreeMap<String, Cluster> = BTreeMap::new();
        for n in &nodes {
            for (_, b, _) in backends_of(n).filter(|(_, _, shared)| *shared) {
                let name = format!("{CLUSTER}@{b}");
                let c = clusters.entry(name.clone()).or_insert_with(|| Cluster {
                    disabled: disabled.iter().find(|d| d.host == name).cloned(),
                    name,
                    backend: b.clone(),
                    num_hosts: 0,
                    num_down_hosts: 0,
                    last_heartbeat: 0,
                    created_at: n.started_at,
                });
                c.num_hosts += 1;
                c.num_down_hosts += i64::from(!live.up(n));
                c.last_heartbeat = c.last_heartbeat.max(n.heartbeat_at);
                c.created_at = c.created_at.min(n.started_at);
            }
        }
        Ok(clusters.into_values().collect())
    }

    /// Disables the cluster `name` (`berth@backend`), with `reason`, or enables it; answers it
    /// as it is now.
    pub async fn set_cluster_disabled(
        &self,
        name: &str,
        binary: &str,
        disabled: bool,
        reason: Option<String>,
    ) -> Result<Cluster, AttachError> {
        let reason = checked_reason(reason)?;
        let found = self.clusters().await?.into_iter().find(|c| c.name == name && binary == VOLUME_BINARY);
        let Some(cluster) = found else {
            return Err(AttachError::NotFound(format!("Cluster {name} could not be found.")));
        };
        // A cluster's reason is what this request says, as Cinder's (none: none).
        let now = self.write_disabled("cluster", name, disabled, reason, false).await?;
        Ok(Cluster { disabled: now, ..cluster })
    }

    /// Records `key` (a service or a cluster, `what`) disabled with `reason` (or, with
    /// `keep_reason` and no reason, the one it had), or enabled; answers its state now.
    async fn write_disabled(
        &self,
        what: &str,
        key: &str,
        disabled: bool,
        reason: Option<String>,
        keep_reason: bool,
    ) -> Result<Option<Disabled>, AttachError> {
        let now = self
            .store
            .write(async |tx| {
                services::hold_for_change(tx).await?;
                if !disabled || !keep_reason {
                    services::enable(tx, key).await?;
                }
                if disabled {
                    services::disable(tx, key, reason.as_deref()).await?;
                }
                services::get(tx, key).await
            })
            .await?;
        match &now {
            Some(d) => tracing::info!(what, key, reason = d.reason.as_deref(), "disabled"),
            None => tracing::info!(what, key, "enabled"),
        }
        Ok(now)
    }
}

/// The nodes, and the services and clusters disabled, as one read sees them: what decides where
/// a new volume may be made.
async fn nodes_and_disabled(tx: &mut Tx) -> Result<(Vec<Node>, Vec<Disabled>), StoreError> {
    Ok((nodes::list(tx).await?, services::list(tx).await?))
}

/// Whether the backend `host` (`node@backend`, of the cluster `cluster` if shared) takes new
/// volumes while its node is up: neither it nor its cluster is disabled.
fn takes_volumes(disabled: &[Disabled], host: &str, cluster: Option<&str>) -> bool {
    !disabled.iter().any(|d| d.host == host || Some(d.host.as_str()) == cluster)
}

/// A reason given to disable a service or cluster, trimmed: 1 to 255 characters, none of them a
/// control character.
fn checked_reason(reason: Option<String>) -> Result<Option<String>, AttachError> {
    match reason.map(|r| r.trim().to_string()) {
        Some(r) if r.is_empty() || r.chars().count() > MAX_REASON || r.chars().any(char::is_control) => {
            Err(AttachError::InvalidInput(format!(
                "Disabled reason contains invalid characters or is too long: it must be 1 to {MAX_REASON} \
                 characters, none of them a control character"
            )))
        }
        other => Ok(other),
    }
}

/// A shared backend as Cinder names an active-active backend's services together: a cluster,
/// `berth@backend`. Disabled, it makes no new volume on any node (`[`Service::check_enabled`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    pub backend: String,
    /// The nodes that serve it, and those of them down.
    pub num_hosts: i64,
    pub num_down_hosts: i64,
    /// The newest heartbeat of its nodes, and the earliest start.
    pub last_heartbeat: i64,
    pub created_at: i64,
    pub disabled: Option<Disabled>,
}

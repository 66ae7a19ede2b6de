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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::catalog::{CLUSTER, service_uuid, shared_service_uuid};
use super::model::Volume;
use super::{AttachError, Service};
use crate::store::nodes::{
    self, BackendInfo, FilesystemInfo, Node, QosDefinition, Registration, TypeDefinition, TypeDefinitions,
};
use crate::store::sql::Tx;
use crate::store::{StoreError, now_micros, volumes};

/// Why a node may not start as `me`, given the registered `nodes` (`None`: it may). A node is
/// live when its heartbeat is younger than its lease.
///
/// - Its name is held by another live process that runs elsewhere (another host or data
///   directory; a restart from the same data directory holds that directory's lock, so its
///   predecessor is gone).
/// - A live node disagrees on what the guarantees depend on: the operations' lease (fencing
///   margins are a quarter of it on every node), and, for a backend both serve, whether it is
///   shared, and for a shared one, the driver (by digest) that runs its volumes' calls.
/// - A live node gives a name another meaning: the default volume type, a volume type both
///   configure (its backend, description, extra specs or QoS specs) or a set of QoS specs both
///   configure (consumer, specs). A type or specs that only one of them has is no disagreement,
///   so that a new type can be added one node at a time.
pub fn refusal(me: &Registration<'_>, nodes: &[Node], lease: Duration, now: i64) -> Option<String> {
    let live = |n: &Node| {
        let lease = if n.lease_seconds > 0 { n.lease_seconds * 1_000_000 } else { lease.as_micros() as i64 };
        n.heartbeat_at > 0 && now - n.heartbeat_at <= lease
    };
    let silent = |n: &Node| (now - n.heartbeat_at) / 1_000_000;
    let mut why = Vec::new();
    for n in nodes.iter().filter(|n| live(n)) {
        if n.name == me.name {
            if n.incarnation != me.incarnation && n.holder != me.holder {
                why.push(format!(
                    "another process runs as node {} (at {}, from {}, last heartbeat {} s ago): give this one \
                     another `node` name, or stop that one first",
                    n.name,
                    n.url.as_deref().unwrap_or("no address"),
                    if n.holder.is_empty() { "an unknown place" } else { n.holder.as_str() },
                    silent(n)
                ));
            }
            continue;
        }
        if n.lease_seconds > 0 && n.lease_seconds != me.lease_seconds {
            why.push(format!(
                "[operations] lease_seconds: node {} has {}, this node ({}) has {}",
                n.name, n.lease_seconds, me.name, me.lease_seconds
            ));
        }
        for (backend, mine) in me.backend_info {
            let Some(theirs) = n.backend_info.get(backend) else { continue };
            if theirs.shared != mine.shared {
                why.push(format!(
                    "backend {backend}: shared = {} on node {}, shared = {} on this node ({})",
                    theirs.shared, n.name, mine.shared, me.name
                ));
            } else if mine.shared && theirs.digest != mine.digest {
                why.push(format!(
                    "backend {backend} (shared): node {} runs driver {} {} (sha256 {}), this node ({}) runs {} {} \
                     (sha256 {})",
                    n.name, theirs.driver, theirs.version, theirs.digest, me.name, mine.driver, mine.version, mine.digest
                ));
            }
        }
        if let Some(theirs) = &n.types {
            why.extend(type_disagreements(&n.name, theirs, me.name, me.types));
        }
    }
    (!why.is_empty()).then(|| format!("node {} refuses to start: {}", me.name, why.join("; ")))
}

/// Where node `other`'s volume types (`theirs`) give a name another meaning than this node's.
fn type_disagreements(
    other: &str,
    theirs: &TypeDefinitions,
    me: &str,
    mine: &TypeDefinitions,
) -> Vec<String> {
    let mut why = Vec::new();
    if theirs.default_type != mine.default_type {
        why.push(format!(
            "default_volume_type: node {other} gives volumes without a type {}, this node ({me}) {}",
            theirs.default_type, mine.default_type
        ));
    }
    for (name, m) in &mine.types {
        if let Some(t) = theirs.types.get(name).filter(|t| *t != m) {
            why.push(format!(
                "volume type {name}: node {other} has {}, this node ({me}) has {} \
                 (give a changed type a new name, or change it on every node together)",
                shown(t),
                shown(m)
            ));
        }
    }
    for (name, m) in &mine.qos_specs {
        if let Some(q) = theirs.qos_specs.get(name).filter(|q| *q != m) {
            why.push(format!(
                "qos specs {name}: node {other} has {}, this node ({me}) has {}",
                shown(q),
                shown(m)
            ));
        }
    }
    why
}

/// A definition as the refusal shows it: its JSON.
fn shown(definition: &impl serde::Serialize) -> String {
    serde_json::to_string(definition).expect("a definition serialises")
}

/// Another node that serves a shared backend.
#[derive(Debug, Clone)]
pub struct Peer {
    pub node: String,
    pub url: Option<String>,
    /// What it runs for the backend, as it registered it.
    pub runs: Option<BackendInfo>,
}

/// The `service_uuid` of each backend of a node.
pub(super) fn backends_of(n: &Node) -> impl Iterator<Item = (String, &String, bool)> {
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

/// Whether nodes are up, as of one moment: a node whose heartbeat is younger than a lease is.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Liveness {
    lease: i64,
    now: i64,
}

impl Liveness {
    pub(crate) fn up(&self, n: &Node) -> bool {
        self.now - n.heartbeat_at <= self.lease
    }

    /// Seconds since its last heartbeat.
    pub(crate) fn silent_for(&self, n: &Node) -> i64 {
        (self.now - n.heartbeat_at) / 1_000_000
    }
}

impl Service {
    /// Whether nodes are up now.
    pub(crate) fn liveness(&self) -> Liveness {
        let lease = i64::try_from(self.owner.lease.as_micros()).unwrap_or(i64::MAX);
        Liveness { lease, now: now_micros() }
    }

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
        if here.as_ref().is_some_and(|b| b.service_uuid == *owner) {
            return Ok(Placement::Here);
        }
        // The nodes that serve it, those up first.
        let live = self.liveness();
        let mut candidates: Vec<Remote> = nodes::list(tx)
            .await?
            .into_iter()
            .filter(|n| n.name != self.owner.node && backends_of(n).any(|(uuid, _, _)| uuid == *owner))
            .map(|n| Remote {
                volume: volume_id.to_string(),
                up: live.up(&n),
                silent_for: live.silent_for(&n),
                node: n.name,
                url: n.url,
            })
            .collect();
        candidates.sort_by_key(|r| (!r.up, r.url.is_none(), r.silent_for));
        match candidates.into_iter().next() {
            Some(remote) => Ok(Placement::Elsewhere(remote)),
            // No node has the backend in its configuration (it was taken out, or its node
            // was never started again): nothing can run the volume's driver calls.
            None if here.is_none() => Err(AttachError::BackendUnavailable(served.backend.clone())),
            // This node has a backend of that name, but not the one that made the volume: a
            // node-local backend is its node's (the node was renamed, or the backend was
            // shared and no longer is, or the other way round).
            None => Err(AttachError::Unavailable(format!(
                "Volume {volume_id} was made by backend {} of another node (service_uuid {owner}), which no \
                 registered node serves; this node's backend {} is another service. Start the node that \
                 made it under its name, with the backend as it was.",
                served.backend, served.backend
            ))),
        }
    }

    /// Refuses, naming the node that serves it, a volume whose driver calls run elsewhere.
    pub(crate) async fn check_placement(&self, tx: &mut Tx, volume_id: &str) -> Result<(), AttachError> {
        match self.placement(tx, volume_id).await? {
            Placement::Here => Ok(()),
            Placement::Elsewhere(remote) => Err(AttachError::Elsewhere(remote)),
        }
    }

    /// The LUNs a backend of this node holds in its target service, and its ceiling.
    pub(super) fn luns_of(&self, b: &super::Backend) -> Option<crate::capabilities::iscsi::LunCapacity> {
        b.driver.target_service().filter(|_| b.uses_targets).and_then(|s| s.lun_capacity())
    }

    /// What this node runs, by backend, as the other nodes compare it.
    pub fn backend_info(&self) -> BTreeMap<String, BackendInfo> {
        self.catalog
            .backends()
            .iter()
            .map(|b| {
                let info = b.driver.info();
                let running = self.catalog.slot(&b.name).map(|s| s.running().0);
                let run = BackendInfo {
                    filesystem: filesystem_of(b),
                    shared: b.shared,
                    driver: info.name.clone(),
                    version: info.version.clone(),
                    digest: b.driver.digest().to_string(),
                    lun_ceiling: self.luns_of(b).map(|c| c.ceiling),
                    since: running.as_ref().map(|r| r.since),
                    how: running.map(|r| r.how.to_string()),
                    vendor: info.vendor.clone(),
                    protocols: info.protocols.iter().map(super::catalog::storage_protocol).collect(),
                    multiattach: info.capabilities.multiattach,
                    online_extend: b.extends_attached,
                };
                (b.name.clone(), run)
            })
            .collect()
    }

    /// What this node's configuration makes of volume types, as the other nodes compare it.
    pub fn type_definitions(&self) -> TypeDefinitions {
        let c = &self.catalog;
        TypeDefinitions {
            default_type: c.default_type.clone(),
            types: (c.types.iter())
                .map(|t| {
                    let definition = TypeDefinition {
                        backend: t.backend.clone(),
                        description: t.description.clone(),
                        extra_specs: t.extra_specs.clone(),
                        qos_specs: t.qos_specs.as_ref().map(|q| q.name.clone()),
                    };
                    (t.name.clone(), definition)
                })
                .collect(),
            qos_specs: (c.qos_specs.iter())
                .map(|q| (q.name.clone(), QosDefinition { consumer: q.consumer, specs: q.specs.clone() }))
                .collect(),
        }
    }

    /// Registers this node, its backends and the URL other nodes forward requests to, as the
    /// process that holds the node's name (`holder`: where it runs). Refused, with a message that
    /// names what and whom, when another live process holds the name, or when this node's
    /// configuration disagrees with a live node's where the guarantees depend on agreement
    /// ([`refusal`]).
    pub async fn register_node(&self, url: Option<&str>, holder: &str) -> Result<(), AttachError> {
        let all = self.catalog.backends();
        let backends: Vec<String> = all.iter().map(|b| b.name.clone()).collect();
        let shared: Vec<String> = all.iter().filter(|b| b.shared).map(|b| b.name.clone()).collect();
        let info = self.backend_info();
        let types = self.type_definitions();
        let registration = Registration {
            name: &self.owner.node,
            backends: &backends,
            shared_backends: &shared,
            url,
            version: env!("CARGO_PKG_VERSION"),
            incarnation: &self.owner.incarnation,
            holder,
            lease_seconds: self.owner.lease.as_secs() as i64,
            backend_info: &info,
            types: &types,
        };
        let lease = self.owner.lease;
        self.store
            .write(async |tx| {
                let nodes = nodes::list(tx).await?;
                if let Some(why) = refusal(&registration, &nodes, lease, now_micros()) {
                    return Err(AttachError::Conflict(why));
                }
                Ok(nodes::register(tx, &registration).await?)
            })
            .await
    }

    /// Records again what this node runs, after a driver was switched (`upgrade/`) or a
    /// backend's filesystem changed, so that `os-services`, the pools and the other nodes see it.
    pub async fn publish_drivers(&self) -> Result<(), AttachError> {
        let info = self.backend_info();
        let (node, incarnation) = (self.owner.node.clone(), self.owner.incarnation.clone());
        self.store.write(async |tx| nodes::set_backend_info(tx, &node, &incarnation, &info).await).await?;
        Ok(())
    }

    /// Beats this node's heart until the task is dropped. A heartbeat that finds the name held
    /// by another process says so, loudly, every time.
    /// Publishes again what this node runs when a backend's filesystem has changed by a GiB or
    /// more since it was last published (so that every node's pools show it).
    pub async fn keep_alive(self: Arc<Self>) {
        let every = (self.owner.lease / 3).max(Duration::from_millis(100));
        let filesystems = |s: &Self| -> BTreeMap<String, FilesystemInfo> {
            s.catalog.backends().iter().filter_map(|b| Some((b.name.clone(), filesystem_of(b)?))).collect()
        };
        let mut published = filesystems(&self);
        loop {
            tokio::time::sleep(every).await;
            let now = filesystems(&self);
            let moved = now.iter().any(|(b, f)| {
                published.get(b).is_none_or(|p| {
                    p.total_bytes != f.total_bytes || p.free_bytes.abs_diff(f.free_bytes) >= 1 << 30
                })
            });
            if moved {
                match self.publish_drivers().await {
                    Ok(()) => published = now,
                    Err(e) => tracing::warn!("could not publish this node's backends' filesystems: {e}"),
                }
            }
            let (node, incarnation) = (self.owner.node.clone(), self.owner.incarnation.clone());
            let beat = self
                .store
                .write(async |tx| {
                    let held = nodes::heartbeat(tx, &node, &incarnation).await?;
                    Ok::<_, StoreError>((held, crate::store::schema_applied(tx).await?))
                })
                .await;
            if let Ok((_, applied)) = beat
                && self.owner.note_schema(applied)
            {
                tracing::error!(
                    applied,
                    known = crate::store::schema_known(),
                    "a newer berth has upgraded the database's schema: this node refuses every change (503) \
                     until it runs that version or a later one"
                );
            }
            match beat.map(|(held, _)| held) {
                Ok(true) => {}
                Ok(false) => tracing::error!(
                    %node,
                    "another process has registered as node {node} since this one started; this process no \
                     longer counts as the node (stop one of them)"
                ),
                Err(e) => tracing::warn!("could not record this node's heartbeat: {e}"),
            }
        }
    }

    /// Marks this node down at once, for a clean stop: the other nodes answer for its volumes
    /// with 503 straight away instead of waiting a lease.
    pub async fn mark_down(&self) -> Result<(), AttachError> {
        let (node, incarnation) = (&self.owner.node, &self.owner.incarnation);
        Ok(self.store.write(async |tx| nodes::mark_down(tx, node, incarnation).await).await?)
    }

    /// Whether a node is down now (no heartbeat for a lease, or stopped).
    pub async fn is_down(&self, node: &str) -> Result<bool, AttachError> {
        let nodes = self.store.read(async |tx| nodes::list(tx).await).await?;
        let live = self.liveness();
        Ok(nodes.iter().find(|n| n.name == node).is_none_or(|n| !live.up(n)))
    }

    /// Returns once `node` is down, checking a few times a lease.
    pub async fn until_down(&self, node: &str) {
        let every = (self.owner.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            if self.is_down(node).await.unwrap_or(false) {
                return;
            }
            tokio::time::sleep(every).await;
        }
    }

    /// The other nodes, each with whether it is up now.
    pub async fn others(&self) -> Result<Vec<(Node, bool)>, AttachError> {
        let nodes: Vec<Node> = self.store.read(async |tx| nodes::list(tx).await).await?;
        let live = self.liveness();
        Ok(nodes
            .into_iter()
            .filter(|n| n.name != self.owner.node)
            .map(|n| {
                let up = live.up(&n);
                (n, up)
            })
            .collect())
    }

    /// The other nodes up now that serve the shared backend `backend`, and what each runs for it.
    pub async fn peers_serving(&self, backend: &str) -> Result<Vec<Peer>, AttachError> {
        Ok(self
            .others()
            .await?
            .into_iter()
            .filter_map(|(n, up)| up.then_some(n))
            .filter(|n| n.shared_backends.iter().any(|b| b == backend))
            .map(|n| Peer { runs: n.backend_info.get(backend).cloned(), node: n.name, url: n.url })
            .collect())
    }
}

/// The filesystem `backend`'s volumes are files on, as this node publishes it (none when they are
/// not, or when its size cannot be read now).
fn filesystem_of(backend: &super::catalog::Backend) -> Option<FilesystemInfo> {
    let f = backend.filesystem.as_ref()?;
    let space = f.stores.space().ok()?;
    Some(FilesystemInfo {
        total_bytes: space.total_bytes,
        free_bytes: space.free_bytes,
        max_over_subscription_ratio: format!("{:?}", f.max_over_subscription_ratio),
        reserved_percentage: f.reserved_percentage,
    })
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
            incarnation: format!("{name}-1"),
            holder: format!("host:/var/lib/{name}"),
            lease_seconds: 30,
            backend_info: backends
                .iter()
                .map(|b| {
                    let run = BackendInfo {
                        shared: shared.contains(b),
                        driver: "fake".into(),
                        version: "1".into(),
                        digest: "d1".into(),
                        ..BackendInfo::default()
                    };
                    (b.to_string(), run)
                })
                .collect(),
            types: None,
        }
    }

    const NOW: i64 = 1_000_000_000_000;

    /// No volume types: nothing to disagree on.
    static NO_TYPES: TypeDefinitions =
        TypeDefinitions { default_type: String::new(), types: BTreeMap::new(), qos_specs: BTreeMap::new() };

    /// A registration of `name` from `holder`, like [`node`]'s.
    fn me<'a>(
        name: &'a str,
        holder: &'a str,
        info: &'a BTreeMap<String, BackendInfo>,
        lease: i64,
    ) -> Registration<'a> {
        Registration {
            name,
            backends: &[],
            shared_backends: &[],
            url: None,
            version: "0",
            incarnation: "me-2",
            holder,
            lease_seconds: lease,
            backend_info: info,
            types: &NO_TYPES,
        }
    }

    /// Types `gold` (on backend `tgt`, with QoS specs `fast`) and `plain`, `plain` the default.
    fn types() -> TypeDefinitions {
        let gold = TypeDefinition {
            backend: "tgt".into(),
            extra_specs: [("multiattach".to_string(), "<is> True".to_string())].into(),
            qos_specs: Some("fast".into()),
            ..TypeDefinition::default()
        };
        let plain = TypeDefinition { backend: "tgt".into(), ..TypeDefinition::default() };
        let fast = QosDefinition {
            consumer: crate::domain::qos::QosConsumer::FrontEnd,
            specs: [("total_iops_sec".to_string(), "500".to_string())].into(),
        };
        TypeDefinitions {
            default_type: "plain".into(),
            types: [("gold".to_string(), gold), ("plain".to_string(), plain)].into(),
            qos_specs: [("fast".to_string(), fast)].into(),
        }
    }

    #[test]
    fn a_name_that_would_mean_two_things_on_two_live_nodes_is_refused_a_name_only_one_has_is_not() {
        let lease = Duration::from_secs(30);
        let info = BTreeMap::new();
        let mut other = node("b", &["tgt"], &[], NOW);
        other.types = Some(types());
        let starts = |mine: &TypeDefinitions, other: &Node| {
            refusal(
                &Registration { types: mine, ..me("c", "h:/c", &info, 30) },
                std::slice::from_ref(other),
                lease,
                NOW,
            )
        };
        assert_eq!(starts(&types(), &other), None);
        // A type or specs added on one node only: the others learn it when they restart.
        let mut more = types();
        more.types
            .insert("new".into(), TypeDefinition { backend: "tgt".into(), ..TypeDefinition::default() });
        more.qos_specs.insert("slow".into(), QosDefinition::default());
        assert_eq!(starts(&more, &other), None);
        let mut fewer = types();
        fewer.types.remove("gold");
        fewer.qos_specs.clear();
        assert_eq!(starts(&fewer, &other), None);

        let mut backend = types();
        backend.types.get_mut("gold").unwrap().backend = "array".into();
        let why = starts(&backend, &other).unwrap();
        assert!(
            why.starts_with("node c refuses to start: volume type gold: node b has {\"backend\":\"tgt\""),
            "{why}"
        );
        assert!(why.contains("this node (c) has {\"backend\":\"array\""), "{why}");
        let mut specs = types();
        specs.types.get_mut("plain").unwrap().extra_specs.insert("multiattach".into(), "<is> True".into());
        assert!(starts(&specs, &other).unwrap().contains("volume type plain: node b has"));
        let mut qos = types();
        qos.types.get_mut("gold").unwrap().qos_specs = None;
        assert!(starts(&qos, &other).unwrap().contains("volume type gold"));
        let mut limits = types();
        limits.qos_specs.get_mut("fast").unwrap().specs.insert("total_iops_sec".into(), "900".into());
        let why = starts(&limits, &other).unwrap();
        assert!(why.contains("qos specs fast: node b has") && why.contains("\"900\""), "{why}");
        let mut default = types();
        default.default_type = "gold".into();
        let why = starts(&default, &other).unwrap();
        assert!(
            why.contains(
                "default_volume_type: node b gives volumes without a type plain, this node (c) gold"
            )
        );

        // Not compared: a node that is down, or one registered before nodes published types.
        other.heartbeat_at = NOW - 60_000_000;
        assert_eq!(starts(&default, &other), None);
        other.heartbeat_at = NOW;
        other.types = None;
        assert_eq!(starts(&default, &other), None);
    }

    #[test]
    fn a_live_nodes_name_is_refused_to_a_process_elsewhere_but_not_to_its_own_restart() {
        let live = node("a", &["tgt"], &[], NOW - 1_000_000);
        let info = live.backend_info.clone();
        let lease = Duration::from_secs(30);
        let why = refusal(&me("a", "other:/srv/berth", &info, 30), std::slice::from_ref(&live), lease, NOW)
            .unwrap();
        assert!(why.contains("another process runs as node a") && why.contains("http://a:8776"), "{why}");
        // The same data directory: this process holds its lock, so the other is gone.
        assert_eq!(
            refusal(&me("a", "host:/var/lib/a", &info, 30), std::slice::from_ref(&live), lease, NOW),
            None
        );
        // Silent for more than a lease, or stopped cleanly: gone.
        let silent = node("a", &["tgt"], &[], NOW - 31_000_000);
        assert_eq!(refusal(&me("a", "other:/srv", &info, 30), &[silent], lease, NOW), None);
        let stopped = node("a", &["tgt"], &[], 0);
        assert_eq!(refusal(&me("a", "other:/srv", &info, 30), &[stopped], lease, NOW), None);
    }

    /// (the other node's backend, this node's) -> refused?
    #[test]
    fn disagreements_on_what_guarantees_depend_on_are_refused_naming_key_nodes_and_values() {
        let lease = Duration::from_secs(30);
        let other = node("b", &["array", "tgt"], &["array"], NOW);
        let run = |shared, digest: &str| BackendInfo {
            shared,
            driver: "fake".into(),
            version: "1".into(),
            digest: digest.into(),
            lun_ceiling: Some(1),
            ..BackendInfo::default()
        };
        let agree: BTreeMap<String, BackendInfo> =
            [("array".to_string(), run(true, "d1")), ("tgt".to_string(), run(false, "other"))].into();
        assert_eq!(refusal(&me("c", "h:/c", &agree, 30), std::slice::from_ref(&other), lease, NOW), None);
        let not_shared: BTreeMap<String, BackendInfo> = [("array".to_string(), run(false, "d1"))].into();
        let why =
            refusal(&me("c", "h:/c", &not_shared, 30), std::slice::from_ref(&other), lease, NOW).unwrap();
        assert!(
            why.contains("backend array: shared = true on node b, shared = false on this node (c)"),
            "{why}"
        );
        let other_driver: BTreeMap<String, BackendInfo> = [("array".to_string(), run(true, "d2"))].into();
        let why =
            refusal(&me("c", "h:/c", &other_driver, 30), std::slice::from_ref(&other), lease, NOW).unwrap();
        assert!(why.contains("sha256 d1") && why.contains("sha256 d2"), "{why}");
        let why = refusal(&me("c", "h:/c", &agree, 3), std::slice::from_ref(&other), lease, NOW).unwrap();
        assert!(why.contains("[operations] lease_seconds: node b has 30, this node (c) has 3"), "{why}");
        // A node that is down is not compared.
        let down = node("b", &["array"], &["array"], NOW - 60_000_000);
        assert_eq!(refusal(&me("c", "h:/c", &not_shared, 3), &[down], lease, NOW), None);
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

//! Volume types and the backends behind them, as the operator configured them. As in Cinder, a
//! volume's type picks its backend, the type's extra spec `multiattach="<is> True"` makes its
//! volumes multiattach, and the QoS specs it names travel with its volumes' connections when the
//! compute host is to enforce them.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::domain::qos::{QosConsumer, QosSpecs};
use crate::runtime::Driver;

use crate::runtime::slot::DriverSlot;

/// How a shared backend is named in `os-vol-host-attr:host` (Cinder names an active-active
/// backend by its cluster): every node that serves it may run its volumes.
pub const CLUSTER: &str = "berth";

/// A namespace for Berth's name-based UUIDs (volume type ids, backend service ids).
const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6f1c_58a2_9e0b_4d52_b1e4_2d8a_7c3b_9f10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeType {
    /// Stable across restarts: a UUID derived from the name.
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub backend: String,
    pub extra_specs: BTreeMap<String, String>,
    /// The QoS specs associated with the type.
    pub qos_specs: Option<QosSpecs>,
}

impl VolumeType {
    pub fn new(
        name: &str,
        backend: &str,
        description: Option<String>,
        extra_specs: BTreeMap<String, String>,
    ) -> Self {
        VolumeType {
            id: type_id(name),
            name: name.to_string(),
            description,
            backend: backend.to_string(),
            extra_specs,
            qos_specs: None,
        }
    }

    /// The type with the QoS specs it is associated with.
    pub fn with_qos_specs(self, qos_specs: Option<QosSpecs>) -> Self {
        VolumeType { qos_specs, ..self }
    }

    /// Cinder's test: `extra_specs['multiattach'] == '<is> True'`.
    pub fn multiattach(&self) -> bool {
        self.says("multiattach")
    }

    /// Whether the host may cache its volumes' connections: `cacheable = '<is> True'`.
    pub fn cacheable(&self) -> bool {
        self.says("cacheable")
    }

    /// Whether the extra spec `key` is `<is> True` (spaces around it and the case aside).
    fn says(&self, key: &str) -> bool {
        self.extra_specs.get(key).is_some_and(|v| v.trim().eq_ignore_ascii_case("<is> true"))
    }

    /// The QoS specs the compute host enforces for volumes of this type: those of consumer
    /// `front-end` or `both`.
    pub fn front_end_qos(&self) -> Option<&QosSpecs> {
        self.qos_specs.as_ref().filter(|q| q.consumer != QosConsumer::BackEnd)
    }

    /// Whether an attached volume of this type may be retyped to `to` (Cinder's
    /// `volume_qos_allows_retype`): the compute host enforces the same QoS either way, since both
    /// types have the same specs or neither has front-end ones (nothing tells the compute host
    /// of new limits for a connection it holds).
    pub fn keeps_front_end_qos(&self, to: &VolumeType) -> bool {
        let id = |t: &VolumeType| t.qos_specs.as_ref().map(|q| q.id.clone());
        id(self) == id(to) || self.front_end_qos().is_none() && to.front_end_qos().is_none()
    }
}

/// A configured backend: its name and its driver, as of the moment it was asked for (an operation
/// holds this snapshot from its start to its end, so a driver switched meanwhile
/// (`attach/drivers.rs`) serves only the operations that start after the switch).
#[derive(Clone)]
pub struct Backend {
    pub name: String,
    pub driver: Driver,
    /// Cinder's `service_uuid`: a stable identity clients lock on for shared targets.
    pub service_uuid: String,
    /// The driver was granted the host's iSCSI target service: the reconciler compares that
    /// service's targets with this backend's attachments.
    pub uses_targets: bool,
    /// Served by every node that configures it (`shared = true`: the driver reaches its backend
    /// over the network), rather than owned by this node.
    pub shared: bool,
    /// Its attached volumes may be extended (`online_extend`).
    pub extends_attached: bool,
    /// Where its volumes take room on this node, when they are sparse files in its data
    /// directory: creates and extends are checked against it, and pools show it.
    pub filesystem: Option<Filesystem>,
}

/// The filesystem a backend's sparse files are on, and how full of volumes it may get.
#[derive(Debug, Clone)]
pub struct Filesystem {
    pub stores: std::sync::Arc<crate::capabilities::backing::BackingStores>,
    pub max_over_subscription_ratio: f64,
    pub reserved_percentage: u32,
    /// The GiB of its volumes as last counted in the database, when, and what this node has let
    /// in since (shared by every copy of the backend).
    provisioned: std::sync::Arc<std::sync::Mutex<Option<(i64, std::time::Instant)>>>,
}

/// How long a count of a backend's volumes stands: within it, a check adds what this node let
/// in to the count rather than counting again (a count reads every live volume of the backend:
/// a millisecond or more at 10,000 volumes). Only this node makes or grows its backend's
/// volumes, so between counts the figure errs only by what was let in and then rolled back
/// (more, never less), as Cinder's scheduler counts between its backends' reports.
pub const RECOUNT: std::time::Duration = std::time::Duration::from_secs(10);

impl Filesystem {
    pub fn new(
        stores: std::sync::Arc<crate::capabilities::backing::BackingStores>,
        max_over_subscription_ratio: f64,
        reserved_percentage: u32,
    ) -> Self {
        Filesystem {
            stores,
            max_over_subscription_ratio,
            reserved_percentage,
            provisioned: Default::default(),
        }
    }

    /// The GiB of its volumes, as counted less than [`RECOUNT`] ago (with what was let in since).
    pub fn provisioned(&self) -> Option<i64> {
        let counted = self.provisioned.lock().unwrap_or_else(|p| p.into_inner());
        counted.filter(|(_, at)| at.elapsed() < RECOUNT).map(|(gib, _)| gib)
    }

    /// Records a count of its volumes, made now.
    pub fn counted(&self, gib: i64) {
        *self.provisioned.lock().unwrap_or_else(|p| p.into_inner()) = Some((gib, std::time::Instant::now()));
    }

    /// Adds `gib` let in to the standing count.
    pub fn let_in(&self, gib: i64) {
        if let Some((counted, _)) = self.provisioned.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            *counted += gib;
        }
    }

    /// Its room now, with volumes of `provisioned_gib` on it.
    pub fn room(&self, provisioned_gib: i64) -> std::io::Result<crate::domain::capacity::Room> {
        let space = self.stores.space()?;
        Ok(crate::domain::capacity::Room {
            total_bytes: space.total_bytes,
            free_bytes: space.free_bytes,
            provisioned_gib,
            max_over_subscription_ratio: self.max_over_subscription_ratio,
            reserved_percentage: self.reserved_percentage,
        })
    }
}

impl Backend {
    /// The backend `name` as served by `node`: its `service_uuid` names both, or only the backend
    /// when it is shared.
    pub fn new(node: &str, name: &str, driver: Driver, uses_targets: bool, shared: bool) -> Self {
        let service_uuid = if shared { shared_service_uuid(name) } else { service_uuid(node, name) };
        Backend {
            name: name.to_string(),
            service_uuid,
            driver,
            uses_targets,
            shared,
            extends_attached: false,
            filesystem: None,
        }
    }
}

/// The id of the volume type named `name`: stable, the same on every node.
pub fn type_id(name: &str) -> String {
    uuid::Uuid::new_v5(&NAMESPACE, format!("volume-type:{name}").as_bytes()).to_string()
}

/// The id of the QoS specs named `name`: stable, the same on every node.
pub fn qos_specs_id(name: &str) -> String {
    uuid::Uuid::new_v5(&NAMESPACE, format!("qos-specs:{name}").as_bytes()).to_string()
}

/// The cluster (Cinder's `cluster_name`) of a volume's backend when it is shared between nodes:
/// `berth@<backend>`; none for a node-local backend.
pub fn cluster_of(backend: &str, service_uuid: Option<&str>) -> Option<String> {
    (service_uuid == Some(shared_service_uuid(backend).as_str())).then(|| format!("{}@{backend}", CLUSTER))
}

/// Cinder's `service_uuid` of backend `backend` on node `node`: stable, and different for the same
/// backend on another node.
pub fn service_uuid(node: &str, backend: &str) -> String {
    uuid::Uuid::new_v5(&NAMESPACE, format!("backend:{node}@{backend}").as_bytes()).to_string()
}

/// The `service_uuid` of a shared backend: the same on every node that serves it.
pub fn shared_service_uuid(backend: &str) -> String {
    uuid::Uuid::new_v5(&NAMESPACE, format!("shared-backend:{backend}").as_bytes()).to_string()
}

/// Every volume type and backend.
#[derive(Clone)]
pub struct Catalog {
    pub types: Vec<VolumeType>,
    pub default_type: String,
    /// Every configured set of QoS specs, associated with a type or not.
    pub qos_specs: Vec<QosSpecs>,
    /// Each backend as configured, with the slot that holds the driver it runs now.
    backends: HashMap<String, (Backend, Arc<DriverSlot>)>,
}

impl Catalog {
    /// Checks that every type names a loaded backend, that the default type exists, and that a
    /// multiattach type's driver supports multiattach.
    pub fn new(
        types: Vec<VolumeType>,
        default_type: String,
        backends: Vec<Backend>,
    ) -> Result<Catalog, String> {
        let backends: HashMap<String, Backend> = backends.into_iter().map(|b| (b.name.clone(), b)).collect();
        for t in &types {
            let Some(backend) = backends.get(&t.backend) else {
                return Err(format!(
                    "volume type {} names backend {}, which is not configured",
                    t.name, t.backend
                ));
            };
            if t.multiattach() && !backend.driver.info().capabilities.multiattach {
                return Err(format!(
                    "volume type {} is multiattach but driver {} of backend {} does not support multiattach",
                    t.name,
                    backend.driver.info().name,
                    t.backend
                ));
            }
        }
        if !types.iter().any(|t| t.name == default_type) {
            return Err(format!("the default volume type {default_type} is not configured"));
        }
        let backends = backends
            .into_iter()
            .map(|(name, b)| {
                let slot = Arc::new(DriverSlot::new(b.driver.clone()));
                (name, (b, slot))
            })
            .collect();
        Ok(Catalog { types, default_type, qos_specs: Vec::new(), backends })
    }

    /// The catalog with every configured set of QoS specs (those the types name among them).
    pub fn with_qos_specs(self, qos_specs: Vec<QosSpecs>) -> Self {
        Catalog { qos_specs, ..self }
    }

    /// A type by name or id; the default type when `None`.
    pub fn volume_type(&self, name_or_id: Option<&str>) -> Option<&VolumeType> {
        let wanted = name_or_id.unwrap_or(&self.default_type);
        self.types.iter().find(|t| t.name == wanted || t.id == wanted)
    }

    /// The backend `name` with the driver it runs now.
    pub fn backend(&self, name: &str) -> Option<Backend> {
        self.backends.get(name).map(|(b, slot)| Backend { driver: slot.current(), ..b.clone() })
    }

    /// Every backend with the driver it runs now, in name order.
    pub fn backends(&self) -> Vec<Backend> {
        let mut names: Vec<&String> = self.backends.keys().collect();
        names.sort();
        names.into_iter().filter_map(|n| self.backend(n)).collect()
    }

    /// The slot of backend `name`: where its driver is switched.
    pub fn slot(&self, name: &str) -> Option<&Arc<DriverSlot>> {
        self.backends.get(name).map(|(_, slot)| slot)
    }
}

/// A protocol as Cinder's drivers report it in their stats (`storage_protocol`).
pub fn storage_protocol(p: &crate::runtime::contract::Protocol) -> String {
    use crate::runtime::contract::Protocol;
    match p {
        Protocol::Iscsi => "iSCSI".into(),
        Protocol::Iser => "iSER".into(),
        Protocol::Nvmeof => "NVMe-oF".into(),
        Protocol::FibreChannel => "FC".into(),
        Protocol::Rbd => "ceph".into(),
        Protocol::Nfs => "NFS".into(),
        Protocol::Other(name) => name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_of_a_backends_volumes_stands_with_what_was_let_in_since() {
        let dir = tempfile::tempdir().unwrap();
        let namespace = crate::capabilities::namespace::Namespace::new("b", &Default::default()).unwrap();
        let stores = crate::capabilities::backing::BackingStores::new(
            dir.path().join("volumes"),
            &namespace,
            std::time::Duration::from_secs(5),
        )
        .unwrap();
        let filesystem = Filesystem::new(std::sync::Arc::new(stores), 20.0, 0);
        filesystem.let_in(3);
        assert_eq!(filesystem.provisioned(), None, "nothing counted yet: nothing to add to");
        filesystem.counted(5);
        filesystem.clone().let_in(2);
        assert_eq!(filesystem.provisioned(), Some(7), "every copy of the backend shares the count");
        let room = filesystem.room(7).unwrap();
        assert!(room.total_bytes > 0 && room.free_bytes <= room.total_bytes);
    }

    #[test]
    fn type_ids_are_stable_and_multiattach_follows_the_extra_spec() {
        let a = VolumeType::new("gold", "tgt", None, BTreeMap::new());
        let b = VolumeType::new("gold", "tgt", None, BTreeMap::new());
        assert_eq!(a.id, b.id);
        assert!(!a.multiattach());
        let spec = |v: &str| BTreeMap::from([("multiattach".to_string(), v.to_string())]);
        assert!(VolumeType::new("m", "tgt", None, spec("<is> True")).multiattach());
        assert!(!VolumeType::new("m", "tgt", None, spec("True")).multiattach());
        assert!(!VolumeType::new("m", "tgt", None, spec("<is> False")).multiattach());
    }
}

//! One check's environment: the driver loaded with a fresh target service and fresh backing
//! stores, and the host's side of each call (a volume record that carries the model updates
//! the driver returns, as the service would persist them). Every call is metered with fuel and
//! recorded, and its cost is added to the check's [`Measure`].

use crate::capabilities::iscsi::initiators::InitiatorKey;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value as Json, json};

use super::target::{Daemon, HeldSession, Snapshot, Target, TargetMode};
use crate::capabilities::backing::BackingStores;
use crate::capabilities::iscsi::IscsiCapability;
use crate::capabilities::namespace::Namespace;
use crate::capabilities::network::NetFault;
use crate::capabilities::{DriverCapabilities, Grant};
use crate::runtime::contract::{
    AccessMode, Attachment, Connector, ContractVersion, DriverError, DriverInfo, Guarantee, ModelUpdate,
    Protocol, Termination, Volume,
};
use crate::runtime::json::{connection_data_to_json, connector_from_json};
use crate::runtime::model::VolumeFields;
use crate::runtime::{
    CallError, CallErrorKind, CallOptions, CapabilityCall, Driver, DriverSpec, Limits, Request, Response,
    Runtime, WasmSource,
};

/// What a check cost, over all its driver calls.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Measure {
    pub calls: u32,
    pub fuel_total: u64,
    pub fuel_max: u64,
    pub peak_memory: usize,
    pub capability_calls: u32,
    /// Capability calls the host refused as invalid (`op(args): error`).
    #[serde(skip)]
    pub invalid_arguments: Vec<String>,
}

impl Measure {
    pub fn merge(&mut self, other: &Measure) {
        self.calls += other.calls;
        self.fuel_total += other.fuel_total;
        self.fuel_max = self.fuel_max.max(other.fuel_max);
        self.peak_memory = self.peak_memory.max(other.peak_memory);
        self.capability_calls += other.capability_calls;
        self.invalid_arguments.extend(other.invalid_arguments.iter().cloned());
    }
}

/// What every check of a run shares.
pub struct Shared {
    pub runtime: Runtime,
    pub wasm: PathBuf,
    /// The network of a driver granted it (one pool for the whole run).
    pub network: Option<Arc<crate::capabilities::network::NetworkCapability>>,
    /// The cephx capability of a driver granted it.
    pub cephx: Option<Arc<crate::capabilities::cephx::CephxCapability>>,
    pub settings: Arc<BTreeMap<String, String>>,
    /// The configuration says the backend extends attached volumes.
    pub online_extend: bool,
    pub grants: BTreeSet<Grant>,
    pub limits: Limits,
    pub fuel_per_call: u64,
    pub mode: TargetMode,
    pub daemon: Option<Arc<Daemon>>,
    pub work: PathBuf,
    /// From the driver's `info()` at load.
    pub info: DriverInfo,
    /// The driver's promises (`guarantees()`, none before contract 0.2.0).
    pub guarantees: Vec<Guarantee>,
    /// The contract version the driver was built for.
    pub contract: Option<ContractVersion>,
    pub imports: Vec<String>,
    /// The volumes `create-volume` made on a real backend and no `delete-volume` removed yet,
    /// by any environment of the check under way: removed when the check ends.
    pub created: std::sync::Mutex<Vec<Volume>>,
    /// The key of per-initiator CHAP credentials, one for the run (as a node has one).
    pub initiator_key: InitiatorKey,
}

impl Shared {
    pub fn speaks_iscsi(&self) -> bool {
        self.info.protocols.iter().any(|p| matches!(p, Protocol::Iscsi))
    }

    pub fn uses_target_service(&self) -> bool {
        self.imports.iter().any(|i| i.starts_with("berth:driver/iscsi-target@"))
    }

    pub fn multiattach(&self) -> bool {
        self.info.capabilities.multiattach
    }

    pub fn promises(&self, guarantee: Guarantee) -> bool {
        self.guarantees.contains(&guarantee)
    }

    /// Whether the driver asks the host for cephx identities and the configuration lets the host
    /// make them.
    pub fn uses_cephx(&self) -> bool {
        self.imports.iter().any(|i| i.starts_with("berth:cephx/identities@"))
            && self.cephx.as_ref().is_some_and(|c| c.configured())
    }

    /// Whether the driver talks to its backend over the network (`wasi:http`): its volumes live
    /// on a real backend that outlives each check's environment.
    pub fn uses_network(&self) -> bool {
        self.imports.iter().any(|i| i.starts_with("wasi:http/outgoing-handler@"))
    }
}

/// A check's environment.
pub struct Env<'s> {
    pub shared: &'s Shared,
    pub driver: Driver,
    pub target: Target,
    stores: Arc<BackingStores>,
    pub measure: Measure,
    /// The capability calls of the last driver call.
    pub last_calls: Vec<CapabilityCall>,
    /// `Some` when each call runs in the instance the last one left, as the calls of one
    /// operation do in service; `None`, each in a fresh instance.
    sharing: Option<Option<crate::runtime::Kept>>,
}

/// The backend name a driver under test runs as.
const BACKEND: &str = "conformance";
/// The owner (project) of every volume the suite makes (per-initiator CHAP accounts are per owner).
const OWNER: &str = "conformance";

impl<'s> Env<'s> {
    pub async fn new(shared: &'s Shared) -> Result<Env<'s>, String> {
        let dir = tempfile::Builder::new()
            .prefix("env-")
            .tempdir_in(&shared.work)
            .map_err(|e| format!("cannot make a work directory: {e}"))?
            .keep();
        // The driver runs confined as it would be in `berth serve`: its own store directory and
        // target prefix, which it learns from the `target_prefix` setting.
        let namespace = Namespace::new(BACKEND, &shared.settings)?;
        let stores = Arc::new(
            BackingStores::new(dir.join("volumes"), &namespace, Duration::from_secs(10))
                .map_err(|e| format!("cannot make the backing store directory: {e}"))?,
        );
        let target = match shared.mode {
            TargetMode::Model => Target::model(),
            TargetMode::Tgtd => {
                let daemon = shared.daemon.clone().expect("a tgtd run has a daemon");
                daemon.clear().await?;
                Target::tgtd(daemon)
            }
        };
        let mut caps = DriverCapabilities {
            settings: Arc::new(namespace.settings(&shared.settings)),
            ..Default::default()
        };
        if shared.grants.contains(&Grant::BackingStore) {
            caps.backing = Some(stores.clone());
        }
        if shared.grants.contains(&Grant::IscsiTarget) {
            caps.iscsi = Some(IscsiCapability {
                service: target.service(),
                portals: vec![target.portal()],
                chap: Default::default(),
                stores: stores.clone(),
                namespace,
                initiator_key: shared.initiator_key.clone(),
            });
        }
        if shared.grants.contains(&Grant::Network) {
            caps.network = shared.network.clone();
        }
        if shared.grants.contains(&Grant::Cephx) {
            caps.cephx = shared.cephx.clone();
        }
        let spec = DriverSpec {
            backend: BACKEND.into(),
            wasm: WasmSource::File(shared.wasm.clone()),
            grants: shared.grants.clone(),
            limits: shared.limits,
            capabilities: caps,
        };
        let driver = shared.runtime.load(spec).await.map_err(|e| e.to_string())?;
        Ok(Env {
            shared,
            driver,
            target,
            stores,
            measure: Measure::default(),
            last_calls: Vec::new(),
            sharing: None,
        })
    }

    /// The same environment, but each call runs in the instance the last one left (as long as it
    /// answered by itself), as the calls of one operation do in `berth serve`.
    pub fn sharing_instances(mut self) -> Self {
        self.sharing = Some(None);
        self
    }

    /// Removes what a check left on a real backend (a network driver's volumes, made in this
    /// environment or another of the same check; the target model and the stores of other
    /// drivers are each environment's own and go with it): every such volume is terminated for
    /// everyone, unexported and deleted, as an operator would clean up. What cannot be removed
    /// is named.
    pub async fn cleanup(&mut self) -> Result<(), String> {
        if !self.shared.uses_network() {
            return Ok(());
        }
        let mut left = Vec::new();
        let created = std::mem::take(&mut *self.shared.created.lock().unwrap_or_else(|p| p.into_inner()));
        for v in created {
            let options = CallOptions {
                fuel: Some(self.shared.fuel_per_call),
                owner: Some(OWNER.into()),
                ..Default::default()
            };
            for request in [
                Request::TerminateConnection(v.clone(), None, Vec::new()),
                Request::RemoveExport(v.clone()),
                Request::DeleteVolume(v.clone()),
            ] {
                let r = self.driver.invoke(&request, &options).await.result;
                if let (Request::DeleteVolume(_), Err(e)) = (&request, r)
                    && !e.is_unsupported()
                {
                    left.push(format!("{}: {}", v.name, failed(&e)));
                }
            }
        }
        if left.is_empty() { Ok(()) } else { Err(format!("could not delete: {}", left.join("; "))) }
    }

    /// One call, metered and recorded.
    pub async fn call(&mut self, request: Request) -> Result<Response, CallError> {
        self.call_with(request, None).await
    }

    /// One call, trapping at the n-th capability call when `trap_at` is given.
    pub async fn call_with(&mut self, request: Request, trap_at: Option<u32>) -> Result<Response, CallError> {
        self.call_faulted(request, trap_at, None).await
    }

    /// One call, with the n-th request to the network failing as `fault` says.
    pub async fn call_with_network_fault(
        &mut self,
        request: Request,
        fault: (u32, NetFault),
    ) -> Result<Response, CallError> {
        self.call_faulted(request, None, Some(fault)).await
    }

    async fn call_faulted(
        &mut self,
        request: Request,
        trap_at: Option<u32>,
        network_fault: Option<(u32, NetFault)>,
    ) -> Result<Response, CallError> {
        if let Request::CreateVolume(v) = &request {
            let mut created = self.shared.created.lock().unwrap_or_else(|p| p.into_inner());
            if !created.iter().any(|c| c.id == v.id) {
                created.push(v.clone());
            }
        }
        let options = CallOptions {
            record: true,
            trap_at_capability_call: trap_at,
            fuel: Some(self.shared.fuel_per_call),
            network_fault,
            owner: Some(OWNER.into()),
            before_lasting: None,
        };
        let outcome = self.driver.run(&request, &options, self.sharing.as_mut()).await;
        let s = &outcome.stats;
        let m = &mut self.measure;
        m.calls += 1;
        let fuel = s.fuel.unwrap_or(0);
        m.fuel_total += fuel;
        m.fuel_max = m.fuel_max.max(fuel);
        m.peak_memory = m.peak_memory.max(s.peak_memory);
        m.capability_calls += s.capability_calls.len() as u32;
        for c in &s.capability_calls {
            if c.outcome.starts_with("invalid argument") {
                m.invalid_arguments.push(format!("{}({}): {}", c.op, c.args.join(", "), c.outcome));
            }
        }
        self.last_calls = outcome.stats.capability_calls;
        if let (Request::DeleteVolume(v), Ok(_)) = (&request, &outcome.result) {
            self.shared.created.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| c.id != v.id);
        }
        outcome.result
    }

    /// The backing stores that exist.
    pub fn stores(&self) -> Vec<String> {
        std::fs::read_dir(self.stores.dir())
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }

    pub async fn snapshot(&self) -> Result<Snapshot, String> {
        self.target.snapshot().await
    }

    /// Fails, saying `what` and the difference, unless the target service is as in `before`.
    pub async fn unchanged_since(&self, before: &Snapshot, what: &str) -> Result<(), String> {
        let now = self.snapshot().await?;
        if now == *before { Ok(()) } else { Err(format!("{what}: {:?}", before.diff(&now))) }
    }

    /// A new volume record, as the service makes one before `create-volume`.
    pub fn volume(&self, multiattach: bool) -> Volume {
        new_volume(multiattach)
    }

    /// `create-volume`, applying its update (a driver may leave volumes to its backend:
    /// `unsupported` is accepted).
    pub async fn create_volume(&mut self, multiattach: bool) -> Result<Volume, String> {
        let v = self.volume(multiattach);
        self.create(v).await
    }

    /// `create-volume` for a given record.
    pub async fn create(&mut self, mut v: Volume) -> Result<Volume, String> {
        match self.call(Request::CreateVolume(v.clone())).await {
            Ok(Response::ModelUpdate(u)) => apply(&mut v, &u),
            Ok(other) => return Err(unexpected("create-volume", &other)),
            Err(e) if e.is_unsupported() => {}
            Err(e) => return Err(failed(&e)),
        }
        Ok(v)
    }

    /// `extend-volume` to `new_size_gib` with the record as the host passes it (the old size),
    /// applying its update; `false` when the driver answered `unsupported`.
    pub async fn extend(&mut self, v: &mut Volume, new_size_gib: u64) -> Result<bool, String> {
        match self.call(Request::ExtendVolume(v.clone(), new_size_gib)).await {
            Ok(Response::ModelUpdate(u)) => {
                apply(v, &u);
                Ok(true)
            }
            Ok(other) => Err(unexpected("extend-volume", &other)),
            Err(e) if e.is_unsupported() => Ok(false),
            Err(e) => Err(failed(&e)),
        }
    }

    /// The backing stores and their sizes in bytes.
    pub fn store_sizes(&self) -> BTreeMap<String, u64> {
        std::fs::read_dir(self.stores.dir())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| {
                        Some((e.file_name().to_string_lossy().into_owned(), e.metadata().ok()?.len()))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub async fn delete_volume(&mut self, v: &Volume) -> Result<(), String> {
        self.call(Request::DeleteVolume(v.clone())).await.map(drop).map_err(|e| failed(&e))
    }

    /// `create-export`, applying its update.
    pub async fn export(&mut self, v: &mut Volume) -> Result<ModelUpdate, String> {
        match self.call(Request::CreateExport(v.clone(), None)).await {
            Ok(Response::ModelUpdate(u)) => {
                apply(v, &u);
                Ok(u)
            }
            Ok(other) => Err(unexpected("create-export", &other)),
            Err(e) if e.is_unsupported() => Ok(crate::runtime::model::no_update()),
            Err(e) => Err(failed(&e)),
        }
    }

    /// `remove-export`, applying its update.
    pub async fn remove_export(&mut self, v: &mut Volume) -> Result<(), String> {
        match self.call(Request::RemoveExport(v.clone())).await {
            Ok(Response::ModelUpdate(u)) => {
                apply(v, &u);
                Ok(())
            }
            Ok(other) => Err(unexpected("remove-export", &other)),
            Err(e) if e.is_unsupported() => Ok(()),
            Err(e) => Err(failed(&e)),
        }
    }

    /// `initialize-connection`: the raw result, with its update applied on success.
    pub async fn try_connect(&mut self, v: &mut Volume, c: &Connector) -> Result<Connected, CallError> {
        match self.call(Request::InitializeConnection(v.clone(), c.clone())).await? {
            Response::Connection(conn) => {
                apply(v, &conn.update);
                let data = connection_data_to_json(&conn.info).map_err(|m| CallError {
                    driver: "conformance".into(),
                    version: String::new(),
                    call: crate::runtime::Call::InitializeConnection,
                    kind: CallErrorKind::InvalidOutput(m),
                })?;
                Ok(Connected { driver_volume_type: conn.info.driver_volume_type, data })
            }
            other => Err(CallError {
                driver: "conformance".into(),
                version: String::new(),
                call: crate::runtime::Call::InitializeConnection,
                kind: CallErrorKind::InvalidOutput(format!("unexpected answer {other:?}")),
            }),
        }
    }

    pub async fn connect(&mut self, v: &mut Volume, c: &Connector) -> Result<Connected, String> {
        self.try_connect(v, c).await.map_err(|e| failed(&e))
    }

    /// `terminate-connection`: the raw result, with its update applied on success.
    pub async fn try_terminate(
        &mut self,
        v: &mut Volume,
        c: Option<&Connector>,
        others: &[Attachment],
    ) -> Result<Termination, CallError> {
        let answer =
            match self.call(Request::TerminateConnection(v.clone(), c.cloned(), others.to_vec())).await {
                // Nothing to revoke, as the service takes it.
                Err(e) if e.is_unsupported() => {
                    return Ok(Termination {
                        export_in_use: others.iter().any(|a| a.connector.is_some()),
                        update: crate::runtime::model::no_update(),
                    });
                }
                answer => answer?,
            };
        match answer {
            Response::Termination(t) => {
                apply(v, &t.update);
                Ok(t)
            }
            other => Err(CallError {
                driver: "conformance".into(),
                version: String::new(),
                call: crate::runtime::Call::TerminateConnection,
                kind: CallErrorKind::InvalidOutput(format!("unexpected answer {other:?}")),
            }),
        }
    }

    pub async fn terminate(
        &mut self,
        v: &mut Volume,
        c: Option<&Connector>,
        others: &[Attachment],
    ) -> Result<Termination, String> {
        self.try_terminate(v, c, others).await.map_err(|e| failed(&e))
    }

    /// Whether `initiator` can log in with what `initialize-connection` returned.
    pub async fn login(&self, conn: &Connected, initiator: &str) -> Result<(), String> {
        let iqn = conn.data.get("target_iqn").and_then(Json::as_str).ok_or("no target_iqn")?;
        let lun = conn.data.get("target_lun").and_then(Json::as_i64).ok_or("no integer target_lun")?;
        let chap = conn.chap();
        self.target
            .login(iqn, lun as u32, initiator, chap.as_ref().map(|(u, s)| (u.as_str(), s.as_str())))
            .await
    }

    /// Logs `initiator` in with what `conn` says and keeps the session open (see
    /// [`Target::hold_session`]).
    pub async fn hold_session(&self, conn: &Connected, initiator: &str) -> Result<HeldSession, String> {
        let iqn = conn.data.get("target_iqn").and_then(Json::as_str).ok_or("no target_iqn")?;
        let lun = conn.data.get("target_lun").and_then(Json::as_i64).ok_or("no integer target_lun")?;
        let chap = conn.chap();
        self.target
            .hold_session(iqn, lun as u32, initiator, chap.as_ref().map(|(u, s)| (u.as_str(), s.as_str())))
            .await
    }

    /// How many sessions `initiator` has on the target of `conn` now.
    pub async fn sessions_of(&self, conn: &Connected, initiator: &str) -> Result<usize, String> {
        let iqn = conn.data.get("target_iqn").and_then(Json::as_str).ok_or("no target_iqn")?;
        self.target.sessions_of(iqn, initiator).await
    }

    /// Whether `initiator` can log in with the given CHAP credentials instead.
    pub async fn login_as(
        &self,
        conn: &Connected,
        initiator: &str,
        chap: Option<(&str, &str)>,
    ) -> Result<(), String> {
        let iqn = conn.data.get("target_iqn").and_then(Json::as_str).ok_or("no target_iqn")?;
        let lun = conn.data.get("target_lun").and_then(Json::as_i64).ok_or("no integer target_lun")?;
        self.target.login(iqn, lun as u32, initiator, chap).await
    }
}

/// What `initialize-connection` returned, with its data as Cinder's JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Connected {
    pub driver_volume_type: String,
    pub data: Map<String, Json>,
}

impl Connected {
    pub fn chap(&self) -> Option<(String, String)> {
        match self.data.get("auth_method").and_then(Json::as_str) {
            Some(m) if m.eq_ignore_ascii_case("chap") => Some((
                self.data.get("auth_username").and_then(Json::as_str).unwrap_or_default().to_string(),
                self.data.get("auth_password").and_then(Json::as_str).unwrap_or_default().to_string(),
            )),
            _ => None,
        }
    }
}

/// A new 1 GiB volume record with a fresh id, as the service makes one before `create-volume`.
pub fn new_volume(multiattach: bool) -> Volume {
    let id = uuid::Uuid::new_v4().to_string();
    Volume {
        name: format!("volume-{id}"),
        id,
        size_gib: 1,
        multiattach,
        provider_location: None,
        provider_auth: None,
        provider_id: None,
        driver_data: Vec::new(),
        metadata: Vec::new(),
    }
}

/// Applies a model update to a volume record, as the service persists it (the runtime's one
/// implementation, `runtime::model`; an update the service would refuse changes nothing).
pub fn apply(v: &mut Volume, u: &ModelUpdate) {
    let mut fields = VolumeFields::of(v);
    if fields.apply(u).is_ok() {
        fields.write_to(v);
    }
}

/// The connector os-brick reports for `host`: the iSCSI initiator given, and, as on a host with
/// every kind of initiator, an NVMe host NQN and Fibre Channel ports of its own, so that drivers
/// of every protocol can be checked with the same connectors.
pub fn connector(initiator: &str, host: &str, mode: AccessMode) -> Connector {
    let n = host.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))) & 0xffff;
    let j = json!({
        "initiator": initiator, "host": host, "ip": "192.0.2.10", "platform": "x86_64", "os_type": "linux",
        "multipath": false, "enforce_multipath": false,
        "nqn": format!("nqn.2014-08.org.nvmexpress:{host}"),
        "wwpns": [format!("10000090fa53{n:04x}")], "wwnns": [format!("20000090fa53{n:04x}")],
    });
    connector_from_json(j.as_object().expect("an object"), mode).expect("a valid connector")
}

/// A connector from arbitrary JSON (for hostile and unusual ones).
pub fn connector_json(j: Json) -> Connector {
    connector_from_json(j.as_object().expect("an object"), AccessMode::Rw).expect("a connector")
}

/// A live attachment of `c`, as the service passes it to the driver.
pub fn attachment(c: &Connector) -> Attachment {
    Attachment {
        id: uuid::Uuid::new_v4().to_string(),
        connector: Some(c.clone()),
        instance: None,
        mode: c.mode,
    }
}

pub fn failed(e: &CallError) -> String {
    e.kind.to_string()
}

fn unexpected(call: &str, r: &Response) -> String {
    format!("{call} answered {r:?}")
}

/// The typed error of a failed call, if it is one.
pub fn driver_error(e: &CallError) -> Option<&DriverError> {
    e.driver_error()
}

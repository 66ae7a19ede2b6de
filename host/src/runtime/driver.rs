//! A loaded driver, and the one place that calls into it.
//!
//! Every call runs in a fresh store and instance (so a driver cannot keep state between calls,
//! and a trapped instance is never reused), with the driver's memory limit, a CPU-time budget
//! enforced by epoch callbacks, a wall-time timeout, and a cap on the size of its result. Any
//! failure fails that call only and names the driver, its version and the call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::Component;
use wasmtime::{Engine, Store};

use super::bindings::{latest, v0_1, v0_2};
use super::cache::Provenance;
use super::call::{Call, CallOptions, CallStats, Effect, Outcome, Request, Response};
use super::contract::{
    Attachment, Capabilities, Connection, Connector, DriverError, DriverInfo, Guarantee, ModelUpdate,
    Termination, Volume,
};
use super::error::{CallError, CallErrorKind};
use super::limits::Limits;
use super::loader::ContractVersion;
use super::model::VolumeFields;
use super::outcome::judge;
use super::state::{CallScope, HostState};
use super::store::call_store;
use crate::capabilities::DriverCapabilities;
use crate::capabilities::secret::Redactor;
use crate::runtime::glue::network::CallNetwork;

/// A loaded driver. Cheap to clone.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
}

/// A driver compiled and linked, ready to instantiate, bound to the contract version it was
/// built for. Each version's calls take and return the same host types (see `bindings.rs`).
pub(crate) enum Pre {
    Latest(latest::StorageDriverPre<HostState>),
    V0_2(v0_2::StorageDriverPre<HostState>),
    V0_1(v0_1::StorageDriverPre<HostState>),
}

impl Pre {
    fn contract(&self) -> ContractVersion {
        match self {
            Pre::Latest(_) => ContractVersion::LATEST,
            Pre::V0_2(_) => ContractVersion::V0_2,
            Pre::V0_1(_) => ContractVersion::V0_1,
        }
    }
}

/// What the loader hands over to make a [`Driver`].
pub(crate) struct Parts {
    pub(crate) backend: String,
    pub(crate) digest: String,
    pub(crate) provenance: Provenance,
    pub(crate) engine: Engine,
    pub(crate) component: Component,
    pub(crate) pre: Pre,
    pub(crate) limits: Limits,
    pub(crate) caps: DriverCapabilities,
    pub(crate) fuel_enabled: bool,
    pub(crate) slots: Arc<tokio::sync::Semaphore>,
}

struct Inner {
    backend: Arc<str>,
    info: DriverInfo,
    guarantees: Vec<Guarantee>,
    digest: String,
    provenance: Provenance,
    engine: Engine,
    component: Component,
    pre: Pre,
    limits: Limits,
    caps: DriverCapabilities,
    fuel_enabled: bool,
    slots: Arc<tokio::sync::Semaphore>,
    /// What this driver's calls came to, for the watch after an upgrade (`slot.rs`).
    tally: super::slot::Tally,
}

impl Driver {
    /// Runs `info()` on a freshly prepared driver and wraps it. Used by the loader.
    pub(crate) async fn prepare(parts: Parts) -> Result<Driver, CallError> {
        let placeholder = DriverInfo {
            name: parts.backend.clone(),
            version: "(loading)".into(),
            vendor: String::new(),
            description: String::new(),
            protocols: Vec::new(),
            capabilities: Capabilities { multiattach: false, shared_targets: true },
        };
        let mut driver = Driver {
            inner: Arc::new(Inner {
                backend: parts.backend.as_str().into(),
                info: placeholder,
                guarantees: Vec::new(),
                digest: parts.digest,
                provenance: parts.provenance,
                engine: parts.engine,
                component: parts.component,
                pre: parts.pre,
                limits: parts.limits,
                caps: parts.caps,
                fuel_enabled: parts.fuel_enabled,
                slots: parts.slots,
                tally: Default::default(),
            }),
        };
        let info = match driver.invoke(&Request::Info, &CallOptions::default()).await.result? {
            Response::Info(info) => info,
            other => unreachable!("info() answered {other:?}"),
        };
        let guarantees = match driver.inner.pre {
            Pre::V0_1(_) => Vec::new(),
            Pre::Latest(_) | Pre::V0_2(_) => {
                match driver.invoke(&Request::Guarantees, &CallOptions::default()).await.result? {
                    Response::Guarantees(mut g) => {
                        g.sort_by_key(|g| g.as_str());
                        g.dedup();
                        g
                    }
                    other => unreachable!("guarantees() answered {other:?}"),
                }
            }
        };
        let inner = Arc::get_mut(&mut driver.inner).expect("not shared yet");
        inner.info = info;
        inner.guarantees = guarantees;
        Ok(driver)
    }

    /// The backend this driver serves.
    pub fn backend(&self) -> &str {
        &self.inner.backend
    }

    /// What the driver said about itself at load time.
    pub fn info(&self) -> &DriverInfo {
        &self.inner.info
    }

    /// The promises the driver made at load time (none for drivers built against 0.1.0).
    pub fn guarantees(&self) -> &[Guarantee] {
        &self.inner.guarantees
    }

    /// Whether the driver promised `guarantee`.
    pub fn promises(&self, guarantee: Guarantee) -> bool {
        self.inner.guarantees.contains(&guarantee)
    }

    /// The contract version the driver was built for.
    pub fn contract(&self) -> ContractVersion {
        self.inner.pre.contract()
    }

    /// sha256 of the `.wasm`, hex.
    /// The iSCSI target service this driver was granted, if any.
    pub fn target_service(&self) -> Option<&Arc<dyn crate::capabilities::iscsi::TargetService>> {
        self.inner.caps.iscsi.as_ref().map(|i| &i.service)
    }

    /// The cephx capability this driver was granted, if any.
    pub fn cephx(&self) -> Option<&Arc<crate::capabilities::cephx::CephxCapability>> {
        self.inner.caps.cephx.as_ref()
    }

    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// The outcomes of this driver's calls so far.
    pub fn tally(&self) -> super::slot::Counts {
        self.inner.tally.counts()
    }

    /// Whether the component was compiled at load or came from the artifact cache.
    pub fn provenance(&self) -> Provenance {
        self.inner.provenance
    }

    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// The imports of the component, as `namespace:package/interface@version` names.
    pub fn imports(&self) -> Vec<String> {
        self.inner
            .component
            .component_type()
            .imports(&self.inner.engine)
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// Runs one call in a fresh instance.
    pub async fn invoke(&self, request: &Request, options: &CallOptions) -> Outcome<Response> {
        let inner = &*self.inner;
        let call = request.call();
        let started = Instant::now();
        // Waiting for a slot is part of the call's wall time (its deadline bounds the wait) but not
        // of its CPU time. Declared before the store, so the instance is gone before the slot is
        // released.
        let deadline = tokio::time::Instant::from_std(started) + inner.limits.timeout();
        let _slot = match tokio::time::timeout_at(deadline, inner.slots.acquire()).await {
            Ok(permit) => permit.expect("the semaphore is never closed"),
            Err(_) => {
                let error = CallError {
                    driver: inner.backend.to_string(),
                    version: inner.info.version.clone(),
                    call,
                    kind: CallErrorKind::Timeout(inner.limits.timeout()),
                };
                tracing::warn!(driver = %inner.backend, call = call.as_str(), "no call slot before the deadline: {error}");
                return Outcome {
                    result: Err(error),
                    stats: CallStats { wall: started.elapsed(), ..Default::default() },
                };
            }
        };
        let mut redactor = Redactor::default();
        if let Some(auth) = request.volume().and_then(|v| v.provider_auth.as_deref()) {
            redactor.add_provider_auth(auth);
        }
        if let Some(network) = &inner.caps.network {
            for secret in network.secret_values() {
                redactor.add_network(secret);
            }
        }
        let requests = inner.caps.network.as_ref().filter(|_| options.record).map(|_| Arc::default());
        let network = CallNetwork::new(
            inner.caps.network.clone().map(|n| (n, redactor.clone(), requests.clone())),
            deadline.into_std(),
            options.network_fault,
        );
        let scope = CallScope {
            driver: inner.backend.clone(),
            call,
            caps: inner.caps.clone(),
            redactor,
            log_limit: inner.limits.log_messages,
            logs: 0,
            dropped_logs: 0,
            options: options.clone(),
            capability_calls: Vec::new(),
            effects: Vec::new(),
            started: 0,
            current: None,
        };
        let fuel = options.fuel.filter(|_| inner.fuel_enabled);
        let mut store = call_store(
            &inner.engine,
            HostState::new(scope, inner.limits.memory_bytes(), network),
            &inner.limits,
            inner.fuel_enabled,
            fuel,
        );

        let mut instantiation = Duration::ZERO;
        let run = async {
            let instantiating = Instant::now();
            match &inner.pre {
                Pre::Latest(pre) => {
                    let instance = pre.instantiate_async(&mut store).await.map_err(|e| (true, e))?;
                    instantiation = instantiating.elapsed();
                    dispatch_latest(instance.berth_driver_driver(), &mut store, request).await
                }
                Pre::V0_2(pre) => {
                    let instance = pre.instantiate_async(&mut store).await.map_err(|e| (true, e))?;
                    instantiation = instantiating.elapsed();
                    dispatch_v0_2(instance.berth_driver_driver(), &mut store, request).await
                }
                Pre::V0_1(pre) => {
                    let instance = pre.instantiate_async(&mut store).await.map_err(|e| (true, e))?;
                    instantiation = instantiating.elapsed();
                    dispatch_v0_1(instance.berth_driver_driver(), &mut store, request).await
                }
            }
            .map_err(|e| (false, e))
        };
        let raw = tokio::time::timeout_at(deadline, run).await;

        let state = store.data();
        let stats = CallStats {
            wall: started.elapsed(),
            instantiation,
            guest_time: state.clock.guest_time(),
            fuel: fuel.map(|f| f.saturating_sub(store.get_fuel().unwrap_or(0))),
            peak_memory: state.memory.peak,
            capability_calls: {
                let mut calls = state.scope.capability_calls.clone();
                if let Some(requests) = &requests {
                    calls.extend(requests.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned());
                }
                calls
            },
            effects: state.scope.effects.clone(),
            output: state.stderr.text(),
        };
        if state.scope.dropped_logs > 0 {
            tracing::warn!(
                driver = %inner.backend, call = call.as_str(),
                "dropped {} log messages beyond the limit of {}", state.scope.dropped_logs, inner.limits.log_messages
            );
        }
        let kind = judge(raw, state, &inner.limits, fuel, &stats.output);
        inner.tally.count(call, &kind, stats.wall);
        crate::metrics::driver_call(
            &inner.backend,
            call.as_str(),
            match &kind {
                Ok(_) => "ok",
                Err(k) => k.label(),
            },
            stats.wall,
            stats.fuel,
        );
        let result = kind.map_err(|kind| {
            let error = CallError {
                driver: inner.backend.to_string(),
                version: inner.info.version.clone(),
                call,
                kind,
            };
            if !matches!(error.kind, CallErrorKind::Driver(_)) {
                tracing::warn!(driver = %inner.backend, call = call.as_str(), "{error}");
            }
            error
        });
        Outcome { result, stats }
    }
}

/// One dispatcher per contract version. The calls are the same but for what a version added;
/// `$guarantees` answers `guarantees()` (new in 0.2.0), `$extend` `extend-volume` (new in 0.3.0).
macro_rules! dispatcher {
    ($name:ident, $guest:ty, |$g:ident, $s:ident| $guarantees:expr, |$v:ident, $n:ident| $extend:expr) => {
        async fn $name(
            $g: &$guest,
            store: &mut Store<HostState>,
            request: &Request,
        ) -> wasmtime::Result<Result<Response, DriverError>> {
            let $s = &mut *store;
            Ok(match request {
                Request::Info => Ok(Response::Info($g.call_info(&mut *$s).await?)),
                Request::Guarantees => Ok(Response::Guarantees($guarantees)),
                Request::ValidateConnector(c) => {
                    $g.call_validate_connector($s, c).await?.map(|()| Response::Unit)
                }
                Request::CreateVolume(v) => $g.call_create_volume($s, v).await?.map(Response::ModelUpdate),
                Request::DeleteVolume(v) => $g.call_delete_volume($s, v).await?.map(|()| Response::Unit),
                Request::ExtendVolume($v, $n) => $extend,
                Request::CreateExport(v, c) => {
                    $g.call_create_export($s, v, c.as_ref()).await?.map(Response::ModelUpdate)
                }
                Request::RemoveExport(v) => $g.call_remove_export($s, v).await?.map(Response::ModelUpdate),
                Request::InitializeConnection(v, c) => {
                    $g.call_initialize_connection($s, v, c).await?.map(Response::Connection)
                }
                Request::TerminateConnection(v, c, others) => {
                    $g.call_terminate_connection($s, v, c.as_ref(), others).await?.map(Response::Termination)
                }
                Request::SharedConnections(v, c, all) => {
                    $g.call_shared_connections($s, v, c, all).await?.map(Response::Ids)
                }
            })
        }
    };
}

dispatcher!(
    dispatch_latest,
    latest::exports::berth::driver::driver::Guest,
    |g, s| g.call_guarantees(s).await?,
    |v, n| g.call_extend_volume(s, v, *n).await?.map(Response::ModelUpdate)
);
dispatcher!(
    dispatch_v0_2,
    v0_2::exports::berth::driver::driver::Guest,
    |g, s| g
        .call_guarantees(s)
        .await?
        .into_iter()
        .map(|g| match g {
            v0_2::exports::berth::driver::driver::Guarantee::TerminateEndsSessions => {
                Guarantee::TerminateEndsSessions
            }
        })
        .collect(),
    |v, n| {
        let _ = (v, n);
        Err(DriverError::Unsupported("extend-volume: the driver is built for contract 0.2.0".into()))
    }
);
dispatcher!(
    dispatch_v0_1,
    v0_1::exports::berth::driver::driver::Guest,
    |g, s| {
        let _ = (g, s);
        Vec::new()
    },
    |v, n| {
        let _ = (v, n);
        Err(DriverError::Unsupported("extend-volume: the driver is built for contract 0.1.0".into()))
    }
);

impl Driver {
    /// A session of calls for one operation of the service (see [`DriverCalls`]).
    pub fn calls(&self) -> DriverCalls<'_> {
        DriverCalls { driver: self, effects: Vec::new(), guard: None }
    }

    /// Applies a model update a call of this driver returned; a result that would overfill the
    /// volume's driver data is the driver's invalid output.
    pub fn apply(
        &self,
        call: Call,
        fields: &mut VolumeFields,
        update: &ModelUpdate,
    ) -> Result<(), CallError> {
        fields.apply(update).map_err(|message| self.invalid(call, message))
    }

    /// An invalid-output error of this driver.
    pub fn invalid(&self, call: Call, message: String) -> CallError {
        CallError {
            driver: self.backend().to_string(),
            version: self.info().version.clone(),
            call,
            kind: CallErrorKind::InvalidOutput(message),
        }
    }
}

/// Typed calls for the service, which needs no stats, but needs to know what the capability
/// calls of every call changed ([`Effect`]s, collected whether a call succeeds or fails).
pub struct DriverCalls<'d> {
    driver: &'d Driver,
    pub effects: Vec<Effect>,
    guard: Option<Guard>,
}

/// A condition checked before every call of a [`DriverCalls`]: when it answers a reason, the call
/// is not made and fails with [`CallErrorKind::NotMade`] (an operation that lost its lease).
pub(super) type Guard = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl<'d> DriverCalls<'d> {
    pub fn driver(&self) -> &'d Driver {
        self.driver
    }

    /// The same calls, each made only while `guard` allows it.
    pub fn guarded(mut self, guard: Guard) -> Self {
        self.guard = Some(guard);
        self
    }

    async fn expect<T>(
        &mut self,
        request: Request,
        pick: impl FnOnce(Response) -> Option<T>,
    ) -> Result<T, CallError> {
        let call = request.call();
        if let Some(reason) = self.guard.as_ref().and_then(|allows| allows()) {
            return Err(CallError {
                driver: self.driver.backend().to_string(),
                version: self.driver.info().version.clone(),
                call,
                kind: CallErrorKind::NotMade(reason),
            });
        }
        let outcome = self.driver.invoke(&request, &CallOptions::default()).await;
        self.effects.extend(outcome.stats.effects);
        let response = outcome.result?;
        pick(response).ok_or_else(|| self.driver.invalid(call, "unexpected response type".into()))
    }

    pub async fn validate_connector(&mut self, connector: &Connector) -> Result<(), CallError> {
        self.expect(Request::ValidateConnector(connector.clone()), |r| {
            matches!(r, Response::Unit).then_some(())
        })
        .await
    }

    pub async fn create_volume(&mut self, volume: &Volume) -> Result<ModelUpdate, CallError> {
        self.expect(Request::CreateVolume(volume.clone()), Response::into_model_update).await
    }

    pub async fn delete_volume(&mut self, volume: &Volume) -> Result<(), CallError> {
        self.expect(Request::DeleteVolume(volume.clone()), |r| matches!(r, Response::Unit).then_some(()))
            .await
    }

    pub async fn extend_volume(
        &mut self,
        volume: &Volume,
        new_size_gib: u64,
    ) -> Result<ModelUpdate, CallError> {
        self.expect(Request::ExtendVolume(volume.clone(), new_size_gib), Response::into_model_update).await
    }

    pub async fn create_export(
        &mut self,
        volume: &Volume,
        connector: Option<&Connector>,
    ) -> Result<ModelUpdate, CallError> {
        self.expect(Request::CreateExport(volume.clone(), connector.cloned()), Response::into_model_update)
            .await
    }

    pub async fn remove_export(&mut self, volume: &Volume) -> Result<ModelUpdate, CallError> {
        self.expect(Request::RemoveExport(volume.clone()), Response::into_model_update).await
    }

    pub async fn initialize_connection(
        &mut self,
        volume: &Volume,
        connector: &Connector,
    ) -> Result<Connection, CallError> {
        self.expect(Request::InitializeConnection(volume.clone(), connector.clone()), |r| match r {
            Response::Connection(c) => Some(c),
            _ => None,
        })
        .await
    }

    pub async fn terminate_connection(
        &mut self,
        volume: &Volume,
        connector: Option<&Connector>,
        others: &[Attachment],
    ) -> Result<Termination, CallError> {
        self.expect(Request::TerminateConnection(volume.clone(), connector.cloned(), others.to_vec()), |r| {
            match r {
                Response::Termination(t) => Some(t),
                _ => None,
            }
        })
        .await
    }

    pub async fn shared_connections(
        &mut self,
        volume: &Volume,
        connector: &Connector,
        attachments: &[Attachment],
    ) -> Result<Vec<String>, CallError> {
        self.expect(
            Request::SharedConnections(volume.clone(), connector.clone(), attachments.to_vec()),
            |r| match r {
                Response::Ids(ids) => Some(ids),
                _ => None,
            },
        )
        .await
    }
}

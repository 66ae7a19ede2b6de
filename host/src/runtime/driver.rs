//! A loaded driver, and the one place that calls into it.
//!
//! A call runs in a fresh store and instance, or in the instance an earlier call of the same
//! operation left (`session.rs`), never in one another operation used (so a driver cannot keep
//! state between operations) nor in one whose call timed out, trapped or was refused memory. Each
//! call has the driver's CPU-time budget enforced by epoch callbacks, a wall-time timeout and a
//! cap on the size of its result; the memory limit bounds the instance. Any failure fails that
//! call only and names the driver, its version and the call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::Component;
use wasmtime::{Engine, Store};

use super::bindings::{latest, v0_1, v0_2};
use super::cache::Provenance;
use super::call::{Call, CallOptions, CallStats, Request, Response};
use super::contract::{Capabilities, DriverError, DriverInfo, Guarantee, ModelUpdate};
use super::error::{CallError, CallErrorKind};
use super::limits::Limits;
use super::model::VolumeFields;
use super::network::CallNetwork;
use super::outcome::Outcome;
use super::outcome::judge;
use super::state::{CallScope, HostState};
use super::store::{call_store, renew};
use super::version::ContractVersion;
use crate::capabilities::DriverCapabilities;
use crate::capabilities::secret::Redactor;

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
    pub(crate) keeping: Arc<tokio::sync::Semaphore>,
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
    /// Permits for instances kept between the calls of an operation.
    keeping: Arc<tokio::sync::Semaphore>,
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
                keeping: parts.keeping,
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

    /// The iSCSI target service this driver was granted, if any.
    pub fn target_service(&self) -> Option<&Arc<dyn crate::capabilities::iscsi::TargetService>> {
        self.inner.caps.iscsi.as_ref().map(|i| &i.service)
    }

    /// The cephx capability this driver was granted, if any.
    pub fn cephx(&self) -> Option<&Arc<crate::capabilities::cephx::CephxCapability>> {
        self.inner.caps.cephx.as_ref()
    }

    /// sha256 of the `.wasm`, hex.
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
        self.run(request, options, None).await
    }

    /// Runs one call: in the instance `kept` holds, when it is this driver's and the last call
    /// in it ended with the guest's own answer, otherwise in a fresh one; afterwards `kept` holds
    /// the instance again if the call ended that way too and the runtime has room to keep it.
    /// With `None`, the call's instance is dropped with it.
    pub(crate) async fn run(
        &self,
        request: &Request,
        options: &CallOptions,
        mut kept: Option<&mut Option<Kept>>,
    ) -> Outcome<Response> {
        let inner = &*self.inner;
        let call = request.call();
        let started = Instant::now();
        let reused = match kept {
            Some(ref mut slot) => {
                slot.take().filter(|k| std::ptr::eq(k.driver.as_ptr(), Arc::as_ptr(&self.inner)))
            }
            None => None,
        };
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
            options.before_lasting.clone(),
        );
        let scope = CallScope::new(
            inner.backend.clone(),
            call,
            inner.caps.clone(),
            redactor,
            inner.limits.log_messages,
            options.clone(),
        );
        let fuel = options.fuel.filter(|_| inner.fuel_enabled);
        // The permit to keep an instance is declared before the store: one not kept again is
        // released after its store is gone, as the call slot is.
        let (live, keeping) = match reused {
            Some(Kept { live, keeping, .. }) => {
                (Some(live.into_inner().unwrap_or_else(|p| p.into_inner())), Some(keeping))
            }
            None => (None, None),
        };
        let (mut store, mut instance) = match live {
            Some((mut store, instance)) => {
                store.data_mut().renew(scope, network);
                renew(&mut store, &inner.limits, inner.fuel_enabled, fuel);
                (store, Some(instance))
            }
            None => {
                let state = HostState::new(scope, inner.limits.memory_bytes(), network);
                (call_store(&inner.engine, state, &inner.limits, inner.fuel_enabled, fuel), None)
            }
        };
        let reused = instance.is_some();

        let mut instantiation = Duration::ZERO;
        let run = async {
            if instance.is_none() {
                let instantiating = Instant::now();
                instance = Some(inner.pre.instantiate(&mut store).await.map_err(|e| (true, e))?);
                instantiation = instantiating.elapsed();
                crate::metrics::driver_instance(&inner.backend);
            }
            let instance = instance.as_ref().expect("instantiated above");
            instance.dispatch(&mut store, request).await.map_err(|e| (false, e))
        };
        let raw = tokio::time::timeout_at(deadline, run).await;
        // Only an instance whose guest answered by itself serves another call: after a timeout,
        // a trap or a refused allocation it is dropped with its store.
        let answered = matches!(raw, Ok(Ok(_))) && store.data().memory.refused.is_none();

        let state = store.data();
        let stats = CallStats {
            wall: started.elapsed(),
            instantiation,
            reused,
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
        if let (Some(slot), Some(instance)) = (kept, instance)
            && answered
            && matches!(kind, Ok(_) | Err(CallErrorKind::Driver(_)))
            && let Some(keeping) = keeping.or_else(|| inner.keeping.clone().try_acquire_owned().ok())
        {
            *slot = Some(Kept::new(store, instance, keeping, &self.inner));
        }
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

/// An instance kept between the calls of one operation ([`DriverCalls`]), with its store. It
/// holds a permit of the runtime's kept instances (never waited for: when none is free the
/// instance is not kept), so kept instances and running calls never exhaust the instance pool
/// together, and no call waits for an instance that another operation keeps.
pub(crate) struct Kept {
    /// The store and its instance; in a mutex only so that a `Kept` is `Sync` (a flow may hold a
    /// reference to what holds one across an await): it is only ever reached by value.
    live: std::sync::Mutex<(Store<HostState>, Instance)>,
    /// Released after the store, so the instance is gone first.
    keeping: tokio::sync::OwnedSemaphorePermit,
    /// Whose instance it is: a kept instance serves only calls of the driver that made it.
    driver: std::sync::Weak<Inner>,
}

impl Kept {
    fn new(
        store: Store<HostState>,
        instance: Instance,
        keeping: tokio::sync::OwnedSemaphorePermit,
        driver: &Arc<Inner>,
    ) -> Kept {
        Kept { live: std::sync::Mutex::new((store, instance)), keeping, driver: Arc::downgrade(driver) }
    }
}

/// An instance of a driver, bound to the contract version it was built for.
enum Instance {
    Latest(latest::StorageDriver),
    V0_2(v0_2::StorageDriver),
    V0_1(v0_1::StorageDriver),
}

impl Pre {
    async fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Instance> {
        Ok(match self {
            Pre::Latest(pre) => Instance::Latest(pre.instantiate_async(store).await?),
            Pre::V0_2(pre) => Instance::V0_2(pre.instantiate_async(store).await?),
            Pre::V0_1(pre) => Instance::V0_1(pre.instantiate_async(store).await?),
        })
    }
}

impl Instance {
    async fn dispatch(
        &self,
        store: &mut Store<HostState>,
        request: &Request,
    ) -> wasmtime::Result<Result<Response, DriverError>> {
        match self {
            Instance::Latest(i) => dispatch_latest(i.berth_driver_driver(), store, request).await,
            Instance::V0_2(i) => dispatch_v0_2(i.berth_driver_driver(), store, request).await,
            Instance::V0_1(i) => dispatch_v0_1(i.berth_driver_driver(), store, request).await,
        }
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

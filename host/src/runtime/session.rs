//! The calls of one operation of the service, typed ([`DriverCalls`]): the first runs in a
//! fresh instance, the next ones in the instance the last one left, as long as it answered by
//! itself (`driver.rs` says when an instance is dropped). A driver may find what an earlier call
//! of the same operation left in its memory, or a fresh instance; it must work with either, and
//! never finds what another operation left (docs/writing-a-driver.md, "Instances").

use super::call::{BeforeLasting, CallOptions, Effect, Request, Response};
use super::contract::{Attachment, Connection, Connector, ModelUpdate, Termination, Volume};
use super::driver::{Driver, Kept};
use super::error::{CallError, CallErrorKind};

/// Typed calls for the service, which needs no stats, but needs to know what the capability
/// calls of every call changed ([`Effect`]s, collected whether a call succeeds or fails).
pub struct DriverCalls<'d> {
    driver: &'d Driver,
    pub effects: Vec<Effect>,
    guard: Option<Guard>,
    /// The instance the last call left, for the next.
    kept: Option<Kept>,
    /// The owner of the volume the calls are about (`CallOptions::owner`).
    owner: Option<std::sync::Arc<str>>,
    /// Fuel each call is metered with (`CallOptions::fuel`), and what the last call used.
    budget: Option<u64>,
    last_fuel: Option<u64>,
    /// What each call awaits before a change that outlives the power (`CallOptions::before_lasting`).
    before_lasting: Option<BeforeLasting>,
}

impl Driver {
    /// A session of calls for one operation of the service (see [`DriverCalls`]).
    pub fn calls(&self) -> DriverCalls<'_> {
        DriverCalls::new(self)
    }
}

/// When an operation's calls are done, the instance the last one left is dropped off the
/// operation's path: dropping a store gives its memory back (for a Python driver, the pages of
/// interpreter heap its calls wrote), which the operation's answer need not wait for. Its permit
/// of the kept instances goes with it, so the runtime's count of instances stays exact.
impl Drop for DriverCalls<'_> {
    fn drop(&mut self) {
        if let Some(kept) = self.kept.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || drop(kept))),
                Err(_) => drop(kept),
            }
        }
    }
}

/// An instance one [`DriverCalls`] leaves for another of the same operation
/// ([`DriverCalls::keep_instance`]): a flow that validates a connector before it holds the volume
/// hands the instance to the calls of the operation it then begins.
pub struct KeptInstance(Kept);

impl std::fmt::Debug for KeptInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeptInstance")
    }
}

/// A condition checked before every call of a [`DriverCalls`]: when it answers a reason, the call
/// is not made and fails with [`CallErrorKind::NotMade`] (an operation that lost its lease).
pub(super) type Guard = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl<'d> DriverCalls<'d> {
    pub(super) fn new(driver: &'d Driver) -> Self {
        DriverCalls {
            driver,
            effects: Vec::new(),
            guard: None,
            kept: None,
            owner: None,
            budget: None,
            last_fuel: None,
            before_lasting: None,
        }
    }

    /// The same calls, about a volume of `owner` (its project): per-initiator CHAP accounts are
    /// made per owner (`capabilities/iscsi/initiators.rs`).
    pub fn for_owner(mut self, owner: &str) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// The instance the last call left, taken out for a later [`DriverCalls`] of the same
    /// operation ([`DriverCalls::with_instance`]).
    pub fn keep_instance(&mut self) -> Option<KeptInstance> {
        self.kept.take().map(KeptInstance)
    }

    /// The same calls, the first of them in `instance` (if it is this driver's; an instance of
    /// another driver, say the one an upgrade replaced since, is dropped).
    pub fn with_instance(mut self, instance: Option<KeptInstance>) -> Self {
        self.kept = instance.map(|k| k.0);
        self
    }

    /// The same calls, each metered with `budget` units of fuel when the runtime meters fuel
    /// (`RuntimeOptions::fuel`, benchmarks and the conformance suite; `berth serve` does not):
    /// what the last call used is [`DriverCalls::last_fuel`].
    pub fn metered(mut self, budget: u64) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The fuel the last call used (WebAssembly instructions, roughly), if it was metered.
    pub fn last_fuel(&self) -> Option<u64> {
        self.last_fuel
    }

    pub fn driver(&self) -> &'d Driver {
        self.driver
    }

    /// The same calls, each awaiting `before` ahead of any capability call whose change outlives
    /// the machine's power.
    pub fn before_lasting(mut self, before: BeforeLasting) -> Self {
        self.before_lasting = Some(before);
        self
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
        let options = CallOptions {
            owner: self.owner.clone(),
            fuel: self.budget,
            before_lasting: self.before_lasting.clone(),
            ..CallOptions::default()
        };
        let outcome = self.driver.run(&request, &options, Some(&mut self.kept)).await;
        self.last_fuel = outcome.stats.fuel;
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

//! Operations the service owns.
//!
//! - **Outliving the request.** [`Service::owned`] runs a flow as a task of the service: the HTTP
//!   handler awaits it, but a client that disconnects (which drops the handler) changes nothing
//!   about how far the flow goes. Shutdown waits for these tasks ([`Owner::drain`]).
//! - **Intent before effect.** A flow that calls a driver to change a backend takes the volume's
//!   lock, writes an [`Operation`] row in the same transaction as the state change that starts
//!   it ([`Op::begin`]), and deletes it in the transaction that records the outcome
//!   ([`Op::finish`]). One operation per volume at a time (a unique index).
//! - **An intent synced only when it must be.** The intent of an operation whose every change
//!   comes through its driver calls ([`ChangesBy::Driver`]: attaching and detaching) is
//!   written but not synced ([`Durability::Written`]): a kill of the process keeps it (the
//!   operating system holds it), and a power failure loses it only along with the changes it
//!   guards, as long as they die with the power too, as the local tgtd's targets do. Before any
//!   capability call whose change outlives the power (a backing store, a network request, a Ceph
//!   identity) the operation's calls sync it first ([`Op::calls`], `runtime::BeforeLasting`). The
//!   outcome's commit is on disk before anyone is answered, as every other write is.
//! - **Orphans.** Every flow holds its volume's lock from before it writes its operation until
//!   after it finishes it, so whoever holds the lock and still finds an operation of this node on
//!   the volume knows its owner is gone (a killed process, a flow that could not record its
//!   outcome). An operation of another node is orphaned once its lease has expired. Either is
//!   driven to a safe end by `recover.rs` before anything else happens to the volume
//!   ([`Service::hold`]).
//! - **Across nodes** (a shared backend, whose volumes any of its nodes may change): the volume's
//!   operation row is the lock. [`Service::hold`] waits while another node's operation on the
//!   volume holds its lease; two nodes that begin at the same moment are told apart by the unique
//!   index, and the one refused runs its flow again ([`AttachError::Busy`], [`Service::owned`]).
//! - **Fencing.** An operation holds a lease and a generation. A node that takes an orphan over
//!   moves it to the next generation, and every write of an owner names the generation it holds
//!   ([`Op::finish`], lease renewals), so an owner that lost its lease records nothing more; its
//!   driver calls stop too: each is made only while the lease, as this process last renewed it,
//!   has a margin left ([`Op::calls`]). (Nodes' clocks must agree to within that margin, a
//!   quarter of the lease.)

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use tokio::sync::{Notify, OwnedMutexGuard};

use super::model::{Connector, OpKind, Operation, Volume};
use super::nodes::Placement;
use super::{AttachError, Caller, Service};
use crate::runtime::{BeforeLasting, Driver, DriverCalls, KeptInstance};
use crate::store::sql::Tx;
use crate::store::{Durability, ONE_OPERATION_PER_VOLUME, StoreError, now_micros, operations, volumes};

/// This process as the owner of operations: the node it runs as, and this run of it.
pub struct Owner {
    /// The node's identity (configured, or generated once and kept in the data directory).
    pub node: String,
    /// This process: a fresh id at every start.
    pub incarnation: String,
    /// How long an operation stays ours without renewal.
    pub lease: Duration,
    /// Operations this process is running now, with their leases.
    running: Mutex<HashMap<String, Arc<Lease>>>,
    /// Flows in flight (tasks started by [`Service::owned`]).
    in_flight: AtomicUsize,
    idle: Notify,
    /// The database's last migration when the heartbeat found it newer than this build knows (a
    /// newer berth upgraded the schema while this process ran), else 0: this process then makes
    /// no change, which its statements could no longer write right ([`Owner::schema_refusal`]).
    schema_ahead: AtomicI64,
}

impl Owner {
    pub fn new(node: &str, lease: Duration) -> Owner {
        Owner {
            node: node.to_string(),
            incarnation: uuid::Uuid::new_v4().to_string(),
            lease,
            running: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            schema_ahead: AtomicI64::new(0),
        }
    }

    /// Notes the database's last migration, as the heartbeat read it; true when it is newer than
    /// this build knows.
    pub(crate) fn note_schema(&self, applied: i64) -> bool {
        let ahead = applied > crate::store::schema_known();
        self.schema_ahead.store(if ahead { applied } else { 0 }, Ordering::Release);
        ahead
    }

    /// Why this process may make no change: a newer berth has upgraded the database's schema.
    pub fn schema_refusal(&self) -> Option<AttachError> {
        match self.schema_ahead.load(Ordering::Acquire) {
            0 => None,
            applied => Some(AttachError::Unavailable(format!(
                "this node's berth is older than the database's schema (migration {applied}; this build \
                 knows up to {}): another node runs a newer berth; upgrade this node",
                crate::store::schema_known()
            ))),
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Lease>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease's end for an operation started or renewed now.
    pub fn lease_until(&self) -> i64 {
        now_micros() + self.lease.as_micros() as i64
    }

    /// A lease held from now, at `generation`.
    fn new_lease(&self, generation: i64) -> Arc<Lease> {
        Arc::new(Lease {
            generation,
            until: AtomicI64::new(self.lease_until()),
            margin: (self.lease.as_micros() / 4) as i64,
        })
    }

    /// Whether an unfinished operation has lost its owner: this node's, when the caller holds the
    /// volume's lock; another node's, when its lease has expired.
    pub fn is_orphaned(&self, op: &Operation) -> bool {
        op.node == self.node || op.lease_until < now_micros()
    }

    /// Flows still in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Waits until no flow is in flight, or `timeout`; returns how many are left.
    pub async fn drain(&self, timeout: Duration) -> usize {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                if self.in_flight() == 0 {
                    return;
                }
                idle.await;
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
        self.in_flight()
    }
}

/// Counts one flow in flight until dropped.
struct InFlight(Arc<Service>);

impl Drop for InFlight {
    fn drop(&mut self) {
        crate::metrics::METRICS.operations_in_flight.dec();
        if self.0.owner.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.owner.idle.notify_waiters();
        }
    }
}

/// An operation's lease as this process holds it.
pub(crate) struct Lease {
    generation: i64,
    /// Until when (this process's clock, microseconds); 0 once lost.
    until: AtomicI64,
    /// How long before `until` the owner stops acting.
    margin: i64,
}

impl Lease {
    /// Why the owner may no longer act, if so.
    fn lost(&self) -> Option<String> {
        let until = self.until.load(Ordering::Acquire);
        (now_micros() >= until - self.margin).then(|| {
            if until == 0 {
                "the operation was taken over by another node".to_string()
            } else {
                "the operation's lease ran out before it could be renewed".to_string()
            }
        })
    }
}

/// An operation of this process, from its creation to its end. Dropping it (the flow ended, or
/// panicked) stops renewing its lease; a row left behind is then an orphan.
pub(crate) struct Op<'s> {
    service: &'s Service,
    pub(crate) record: Operation,
    lease: Arc<Lease>,
    /// The digest of the driver whose calls this operation made (the history names it).
    ran_by: std::sync::Mutex<Option<String>>,
    /// The instance that validated the operation's connector, for its first calls.
    handed: std::sync::Mutex<Option<KeptInstance>>,
    /// The intent was written and is not known to be on disk yet ([`Op::write_intent`]).
    unsynced: Arc<AtomicBool>,
}

/// The volume an operation begins on ([`Service::begin_operation`]).
#[derive(Clone, Copy)]
pub(crate) enum Subject<'a> {
    /// As the flow read it, with the attachments it hands the driver: the operation begins only
    /// if neither changed since.
    AsRead(&'a Volume),
    /// By id: a volume of which the flow read no row (the reconciler's, for what a volume it
    /// does not know left behind).
    Id(&'a str),
}

impl Subject<'_> {
    fn id(&self) -> &str {
        match self {
            Subject::AsRead(v) => &v.id,
            Subject::Id(id) => id,
        }
    }

    fn read_at(&self) -> Option<i64> {
        match self {
            Subject::AsRead(v) => Some(v.updated_at),
            Subject::Id(_) => None,
        }
    }
}

/// Where an operation's changes come from, which decides how its intent is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangesBy {
    /// From its driver calls only: the intent is written, and synced before the first
    /// capability call whose change outlives the machine's power ([`Op::write_intent`]).
    Driver,
    /// Also from the host's own calls (the reconciler's repairs): the intent is on disk before
    /// anything is changed.
    Host,
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        self.service.owner.running().remove(&self.record.id);
    }
}

impl<'s> Op<'s> {
    fn new(service: &'s Service, record: Operation, lease: Arc<Lease>) -> Op<'s> {
        Op {
            service,
            record,
            lease,
            ran_by: Default::default(),
            handed: Default::default(),
            unsynced: Default::default(),
        }
    }
}

impl Op<'_> {
    /// Records the operation, in the transaction that starts it; the caller holds the volume
    /// ([`Service::hold`], which checked that its calls run here). A volume that has one already
    /// (another node began one since `hold` looked) refuses it: [`AttachError::Busy`], and the
    /// transaction records nothing.
    pub(crate) async fn begin(&self, tx: &mut Tx) -> Result<(), AttachError> {
        self.begin_as_read(tx, None).await
    }

    /// [`Op::begin`]; with `read_at` (the volume's `updated_at` as the flow read it with its
    /// attachments), refused as [`AttachError::Busy`] too when the volume changed since: the
    /// volume's lock is this node's alone, and on a backend the nodes share another node may have
    /// run a whole operation between the read and this one, so what the flow would hand the
    /// driver (the other attachments, which decide what a revoke keeps) may be gone.
    async fn begin_as_read(&self, tx: &mut Tx, read_at: Option<i64>) -> Result<(), AttachError> {
        match operations::insert(tx, &self.record, read_at).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(AttachError::Busy(self.record.volume_id.clone())),
            Err(e) if e.is_constraint(ONE_OPERATION_PER_VOLUME) => {
                Err(AttachError::Busy(self.record.volume_id.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The service that runs the operation.
    pub(crate) fn service(&self) -> &Service {
        self.service
    }

    /// The instance that validated this operation's connector ([`Service::validated`]): the
    /// operation's calls run in it, one instance for the whole operation.
    pub(crate) fn handed(self, instance: Option<KeptInstance>) -> Self {
        *self.handed.lock().unwrap_or_else(|p| p.into_inner()) = instance;
        self
    }

    /// The driver calls of this operation: each is made only while it holds its lease; the first
    /// runs in the instance handed to the operation, if any.
    pub(crate) fn calls<'d>(&self, driver: &'d Driver) -> DriverCalls<'d> {
        *self.ran_by.lock().unwrap_or_else(|p| p.into_inner()) = Some(driver.digest().to_string());
        let lease = self.lease.clone();
        let handed = self.handed.lock().unwrap_or_else(|p| p.into_inner()).take();
        let calls = driver.calls().with_instance(handed).guarded(Arc::new(move || lease.lost()));
        if !self.unsynced.load(Ordering::Acquire) {
            return calls;
        }
        let (store, unsynced) = (self.service.store.clone(), self.unsynced.clone());
        calls.before_lasting(BeforeLasting::new(move || {
            let (store, unsynced) = (store.clone(), unsynced.clone());
            Box::pin(async move {
                if unsynced.load(Ordering::Acquire) {
                    store
                        .sync()
                        .await
                        .map_err(|e| format!("the operation's intent could not be synced: {e}"))?;
                    unsynced.store(false, Ordering::Release);
                }
                Ok(())
            })
        }))
    }

    /// Writes `f`, the transaction that begins this operation ([`Op::begin`]), as the intent of
    /// an operation whose changes all come through its driver calls ([`ChangesBy::Driver`]):
    /// written, not synced; its calls sync it before a change that outlives the power.
    pub(crate) async fn write_intent<T>(
        &self,
        f: impl AsyncFnOnce(&mut Tx) -> Result<T, AttachError>,
    ) -> Result<T, AttachError> {
        let value = self.service.store.write_with(Durability::Written, f).await?;
        self.unsynced.store(true, Ordering::Release);
        Ok(value)
    }

    /// Runs `f` as a write transaction of this operation: first, in the same transaction, a
    /// check that the operation is still held at its generation (its row locked), so that
    /// nothing `f` writes, driver fields included, commits for an owner that was taken over. A
    /// fenced-off owner gets [`AttachError::Unavailable`] and the transaction records nothing.
    /// (The volume's row is locked before the operation's, in the order every write transaction
    /// takes them: a reservation that begins an operation locks the volume, then inserts into
    /// the operations; the other order deadlocks on PostgreSQL.)
    pub(crate) async fn write<T>(
        &self,
        f: impl AsyncFnOnce(&mut Tx) -> Result<T, AttachError>,
    ) -> Result<T, AttachError> {
        self.service
            .store
            .write(async |tx| {
                volumes::hold_row(tx, &self.record.volume_id).await?;
                if !operations::fence(tx, &self.record.id, self.lease.generation).await? {
                    return Err(self.taken_over());
                }
                let ran_by = self.ran_by.lock().unwrap_or_else(|p| p.into_inner()).clone();
                super::history::ran_by(ran_by, f(tx)).await
            })
            .await
    }

    fn taken_over(&self) -> AttachError {
        AttachError::Unavailable(format!(
            "the operation on volume {} was taken over by another node after its lease expired; \
             nothing more was recorded",
            self.record.volume_id
        ))
    }

    /// Ends the operation after driver calls, in the transaction that records its outcome: the
    /// targets those calls created or removed are recorded with it (what the reconciler later
    /// compares with the target service).
    pub(crate) async fn finish_with(
        &self,
        tx: &mut Tx,
        backend: &str,
        calls: &DriverCalls<'_>,
    ) -> Result<(), AttachError> {
        crate::store::targets::record(tx, backend, &self.record.volume_id, &calls.effects).await?;
        self.finish(tx).await
    }

    /// Ends the operation, in the transaction that records its outcome.
    pub(crate) async fn finish(&self, tx: &mut Tx) -> Result<(), AttachError> {
        if !operations::finish(tx, &self.record.id, self.lease.generation).await? {
            // Taken over by another node after our lease expired: what it decided stands, and
            // this transaction must not commit a second outcome.
            return Err(self.taken_over());
        }
        Ok(())
    }
}

impl Service {
    /// Runs a changing flow as a task the service owns (see the module notes), and returns its
    /// result to whoever is still waiting. A flow that met another node's operation beginning at
    /// the same moment ([`AttachError::Busy`]) recorded nothing and runs again on its `input`, for
    /// up to a lease. What it records in the attach history names `caller`.
    pub(super) async fn owned<I, T, F, Fut>(
        self: &Arc<Self>,
        caller: Caller,
        input: I,
        flow: F,
    ) -> Result<T, AttachError>
    where
        I: Clone + Send + 'static,
        F: Fn(Arc<Service>, I) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, AttachError>> + Send + 'static,
        T: Send + 'static,
    {
        if let Some(refused) = self.owner.schema_refusal() {
            return Err(refused);
        }
        self.owner.in_flight.fetch_add(1, Ordering::AcqRel);
        crate::metrics::METRICS.operations_in_flight.inc();
        let counted = InFlight(self.clone());
        let service = self.clone();
        // The operation logs in the span of the request that started it (its request id).
        let task = tokio::spawn(super::history::on_behalf_of(
            caller,
            async move {
                let _counted = counted;
                let deadline = Instant::now() + service.owner.lease;
                let mut pause = Duration::from_millis(2);
                loop {
                    match flow(service.clone(), input.clone()).await {
                        Err(AttachError::Busy(volume)) if Instant::now() < deadline => {
                            tracing::debug!(%volume, "another node began an operation on the volume; running again");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(Duration::from_millis(100));
                        }
                        outcome => return outcome,
                    }
                }
            }
            .instrument(tracing::Span::current()),
        ));
        match task.await {
            Ok(result) => self.unless_schema_ahead(result).await,
            Err(e) => Err(AttachError::Internal(format!("the operation stopped: {e}"))),
        }
    }

    /// A database error may come from a schema a newer berth has migrated since the last
    /// heartbeat looked: then the answer is the refusal that names it (503), not the error.
    async fn unless_schema_ahead<T>(&self, outcome: Result<T, AttachError>) -> Result<T, AttachError> {
        if let Err(e @ AttachError::Store(StoreError::Db(_) | StoreError::Sqlite(_))) = &outcome
            && let Ok(applied) = self.store.read(async |tx| crate::store::schema_applied(tx).await).await
            && self.owner.note_schema(applied)
            && let Some(refused) = self.owner.schema_refusal()
        {
            tracing::error!(applied, "a change failed on a schema a newer berth has upgraded: {e}");
            return Err(refused);
        }
        outcome
    }

    /// A new operation of this process (written by [`Op::begin`]).
    pub(crate) fn operation(
        &self,
        kind: OpKind,
        volume_id: &str,
        attachment_id: Option<&str>,
        connector: Option<&Connector>,
    ) -> Op<'_> {
        let record = Operation {
            id: uuid::Uuid::new_v4().to_string(),
            kind,
            volume_id: volume_id.to_string(),
            attachment_id: attachment_id.map(str::to_string),
            connector: connector.cloned(),
            step: "intent".into(),
            node: self.owner.node.clone(),
            incarnation: self.owner.incarnation.clone(),
            lease_until: self.owner.lease_until(),
            created_at: now_micros(),
            generation: 1,
        };
        let lease = self.owner.new_lease(record.generation);
        self.owner.running().insert(record.id.clone(), lease.clone());
        Op::new(self, record, lease)
    }

    /// A new operation of this process, begun in a transaction of its own ([`Op::begin`]): for an
    /// operation whose intent is all its first commit holds, written as its `changes` allow.
    pub(crate) async fn begin_operation(
        &self,
        kind: OpKind,
        volume: Subject<'_>,
        attachment_id: Option<&str>,
        connector: Option<&Connector>,
        changes: ChangesBy,
    ) -> Result<Op<'_>, AttachError> {
        let op = self.operation(kind, volume.id(), attachment_id, connector);
        let read_at = volume.read_at();
        match changes {
            ChangesBy::Driver => op.write_intent(async |tx| op.begin_as_read(tx, read_at).await).await?,
            ChangesBy::Host => self.store.write(async |tx| op.begin_as_read(tx, read_at).await).await?,
        }
        Ok(op)
    }

    /// Makes an orphaned operation this process's, atomically: only if it is still at the
    /// generation it had when it was read, and at the next one from now on (the owner it had can
    /// no longer finish it, and two nodes cannot both take it over).
    pub(crate) async fn take_over(&self, mut record: Operation) -> Result<Op<'_>, AttachError> {
        let until = self.owner.lease_until();
        let (node, incarnation) = (self.owner.node.clone(), self.owner.incarnation.clone());
        let taken = self
            .store
            .write(async |tx| {
                // Another node's volume stays its own: its operation waits for that node.
                self.check_placement(tx, &record.volume_id).await?;
                Ok::<_, AttachError>(
                    operations::take_over(tx, &record.id, record.generation, &node, &incarnation, until)
                        .await?,
                )
            })
            .await?;
        let Some(generation) = taken else {
            return Err(AttachError::Unavailable(format!(
                "the interrupted operation on volume {} was taken over by another node",
                record.volume_id
            )));
        };
        record.node = node;
        record.incarnation = incarnation;
        record.lease_until = until;
        record.generation = generation;
        let lease = self.owner.new_lease(generation);
        self.owner.running().insert(record.id.clone(), lease.clone());
        Ok(Op::new(self, record, lease))
    }

    /// Takes a volume before anything happens to it, for as long as the guard lives: its lock in
    /// this process, after checking that its driver calls run here ([`AttachError::Elsewhere`]
    /// otherwise, which the API forwards); then an operation that lost its owner is driven to
    /// its end, and one that another node runs now is waited for (503 after a lease).
    pub(crate) async fn hold(&self, volume_id: &str) -> Result<OwnedMutexGuard<()>, AttachError> {
        let guard = self.locks.lock(volume_id).await;
        let (placed, mut found) = self
            .store
            .read(async |tx| {
                Ok::<_, AttachError>((
                    self.placement(tx, volume_id).await?,
                    operations::of_volume(tx, volume_id).await?,
                ))
            })
            .await?;
        if let Placement::Elsewhere(remote) = placed {
            return Err(AttachError::Elsewhere(remote));
        }
        let deadline = Instant::now() + self.owner.lease;
        let mut pause = Duration::from_millis(2);
        loop {
            let Some(op) = found.take() else {
                return Ok(guard);
            };
            if self.owner.is_orphaned(&op) {
                self.recovery().recover(op).await?;
                return Ok(guard);
            }
            if Instant::now() >= deadline {
                return Err(AttachError::Unavailable(format!(
                    "an operation on volume {volume_id} is in progress on node {}",
                    op.node
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
            found = self.store.read(async |tx| operations::of_volume(tx, volume_id).await).await?;
        }
    }

    /// Extends the leases of the operations this process runs, every third of a lease, for as
    /// long as the service lives. An operation whose row is at another generation was taken over:
    /// its lease is lost at once, and its owner stops acting. (A lease that is not renewed, for
    /// whatever reason, runs out by itself.)
    pub async fn renew_leases(self: Arc<Self>) {
        let every = (self.owner.lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let held: Vec<(String, Arc<Lease>)> =
                self.owner.running().iter().map(|(id, l)| (id.clone(), l.clone())).collect();
            if held.is_empty() {
                continue;
            }
            let until = self.owner.lease_until();
            let ids: Vec<(String, i64)> = held.iter().map(|(id, l)| (id.clone(), l.generation)).collect();
            match self.store.write(async |tx| operations::renew(tx, &ids, until).await).await {
                Ok(found) => {
                    for (id, lease) in &held {
                        if found.renewed.contains(id) {
                            lease.until.fetch_max(until, Ordering::AcqRel);
                        } else if found.taken_over.contains(id) {
                            tracing::warn!(operation = %id, "the operation was taken over by another node");
                            lease.until.store(0, Ordering::Release);
                        }
                    }
                }
                Err(e) => tracing::warn!("could not renew the leases of {} operations: {e}", held.len()),
            }
        }
    }
}

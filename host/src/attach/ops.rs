//! Operations the service owns.
//!
//! - **Outliving the request.** [`Service::owned`] runs a flow as a task of the service: the HTTP
//!   handler awaits it, but a client that disconnects (which drops the handler) changes nothing
//!   about how far the flow goes. Shutdown waits for these tasks ([`Owner::drain`]).
//! - **Intent before effect.** A flow that calls a driver to change a backend takes the volume's
//!   lock, writes an [`Operation`] row in the same transaction as the state change that starts
//!   it ([`Op::begin`]), and deletes it in the transaction that records the outcome
//!   ([`Op::finish`]). One operation per volume at a time (a unique index).
//! - **Orphans.** Every flow holds its volume's lock from before it writes its operation until
//!   after it finishes it, so whoever holds the lock and still finds an operation of this node on
//!   the volume knows its owner is gone (a killed process, a flow that could not record its
//!   outcome). An operation of another node is orphaned once its lease has expired. Either is
//!   driven to a safe end by `recover.rs` before anything else happens to the volume
//!   ([`Service::clear_interrupted`]).

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::Instrument;

use tokio::sync::Notify;

use super::model::{Connector, OpKind, Operation};
use super::{AttachError, Service};
use crate::store::sql::Tx;
use crate::store::{ONE_OPERATION_PER_VOLUME, now_micros, operations, volumes};

/// This process as the owner of operations: the node it runs as, and this run of it.
pub struct Owner {
    /// The node's identity (configured, or generated once and kept in the data directory).
    pub node: String,
    /// This process: a fresh id at every start.
    pub incarnation: String,
    /// How long an operation stays ours without renewal.
    pub lease: Duration,
    /// Operations this process is running now.
    running: Mutex<HashSet<String>>,
    /// Flows in flight (tasks started by [`Service::owned`]).
    in_flight: AtomicUsize,
    idle: Notify,
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
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease's end for an operation started or renewed now.
    pub fn lease_until(&self) -> i64 {
        now_micros() + self.lease.as_micros() as i64
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

/// An operation of this process, from its creation to its end. Dropping it (the flow ended, or
/// panicked) stops renewing its lease; a row left behind is then an orphan.
pub(crate) struct Op<'s> {
    service: &'s Service,
    pub(crate) record: Operation,
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        self.service.owner.running().remove(&self.record.id);
    }
}

impl Op<'_> {
    /// Records the operation, in the transaction that starts it. A volume that has one already
    /// (which the caller's [`Service::clear_interrupted`] makes a race with another node) refuses
    /// it with a 409.
    pub(crate) async fn begin(&self, tx: &mut Tx) -> Result<(), AttachError> {
        self.service.check_owner(tx, &self.record.volume_id).await?;
        match operations::insert(tx, &self.record).await {
            Ok(()) => Ok(()),
            Err(e) if e.is_constraint(ONE_OPERATION_PER_VOLUME) => Err(AttachError::Conflict(format!(
                "another operation on volume {} is in progress; retry",
                self.record.volume_id
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Ends the operation, in the transaction that records its outcome.
    pub(crate) async fn finish(&self, tx: &mut Tx) -> Result<(), AttachError> {
        if !operations::finish(tx, &self.record.id).await? {
            // Taken over by another node after our lease expired: what it decided stands, and
            // this transaction must not commit a second outcome.
            return Err(AttachError::Unavailable(format!(
                "the operation on volume {} was taken over after its lease expired",
                self.record.volume_id
            )));
        }
        Ok(())
    }
}

impl Service {
    /// Runs a changing flow as a task the service owns (see the module notes), and returns its
    /// result to whoever is still waiting.
    pub async fn owned<T, F, Fut>(self: &Arc<Self>, flow: F) -> Result<T, AttachError>
    where
        F: FnOnce(Arc<Service>) -> Fut,
        Fut: Future<Output = Result<T, AttachError>> + Send + 'static,
        T: Send + 'static,
    {
        self.owner.in_flight.fetch_add(1, Ordering::AcqRel);
        crate::metrics::METRICS.operations_in_flight.inc();
        let counted = InFlight(self.clone());
        let work = flow(self.clone());
        // The operation logs in the span of the request that started it (its request id).
        let task = tokio::spawn(
            async move {
                let _counted = counted;
                work.await
            }
            .instrument(tracing::Span::current()),
        );
        match task.await {
            Ok(result) => result,
            Err(e) => Err(AttachError::Internal(format!("the operation stopped: {e}"))),
        }
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
        };
        self.owner.running().insert(record.id.clone());
        Op { service: self, record }
    }

    /// Makes an orphaned operation this process's, atomically: only if its row still names the
    /// owner it had when it was read (a node that lost its lease can no longer finish it, and two
    /// nodes cannot both take it over).
    pub(crate) async fn take_over(&self, mut record: Operation) -> Result<Op<'_>, AttachError> {
        let (previous, until) = (record.incarnation.clone(), self.owner.lease_until());
        let (node, incarnation) = (self.owner.node.clone(), self.owner.incarnation.clone());
        let taken = self
            .store
            .write(async |tx| {
                // Another node's volume stays its own: its operation waits for that node.
                self.check_owner(tx, &record.volume_id).await?;
                Ok::<_, AttachError>(
                    operations::take_over(tx, &record.id, &previous, &node, &incarnation, until).await?,
                )
            })
            .await?;
        if !taken {
            return Err(AttachError::Unavailable(format!(
                "the interrupted operation on volume {} was taken over by another node",
                record.volume_id
            )));
        }
        record.node = node;
        record.incarnation = incarnation;
        record.lease_until = until;
        self.owner.running().insert(record.id.clone());
        Ok(Op { service: self, record })
    }

    /// Refuses (503) an operation on a volume another node owns. A backend's targets are local to
    /// its node (each node has its own tgtd), and a volume belongs to the node whose backend
    /// created it (its `service_uuid` names that node and backend): only that node may run its
    /// driver calls, so no node ever exports another node's volume from its own target service.
    pub(crate) async fn check_owner(&self, tx: &mut Tx, volume_id: &str) -> Result<(), AttachError> {
        let served = volumes::backends(tx, &[volume_id.to_string()]).await?;
        let Some(served) = served.get(volume_id) else { return Ok(()) };
        let mine = self.catalog.backend(&served.backend).map(|b| b.service_uuid.as_str());
        let Some(owner) = served.service_uuid.as_ref().filter(|o| mine != Some(o.as_str())) else {
            return Ok(());
        };
        let nodes = crate::store::nodes::list(tx).await?;
        let hosts = super::nodes::Hosts::of(&nodes, &self.owner.node);
        let node = hosts.node_of(owner);
        let lease = i64::try_from(self.owner.lease.as_micros()).unwrap_or(i64::MAX);
        let state = match nodes.iter().find(|n| Some(n.name.as_str()) == node) {
            Some(n) if now_micros() - n.heartbeat_at <= lease => "up".to_string(),
            Some(n) => format!("down: no heartbeat for {} s", (now_micros() - n.heartbeat_at) / 1_000_000),
            None => "unknown".to_string(),
        };
        Err(AttachError::Unavailable(format!(
            "Volume {volume_id} is served by another Berth node, {} ({state}), whose targets this node \
             cannot reach; send the request to that node.",
            node.unwrap_or(owner)
        )))
    }

    /// Before anything else happens to a volume whose lock the caller holds: drives an operation
    /// that lost its owner to its end. An operation another node still owns makes the volume
    /// unavailable for now (503).
    pub(crate) async fn clear_interrupted(&self, volume_id: &str) -> Result<(), AttachError> {
        let Some(op) = self.store.read(async |tx| operations::of_volume(tx, volume_id).await).await? else {
            return Ok(());
        };
        if !self.owner.is_orphaned(&op) {
            return Err(AttachError::Unavailable(format!(
                "an operation on volume {volume_id} is in progress on node {}",
                op.node
            )));
        }
        self.recover(op).await
    }

    /// Extends the leases of the operations this process runs, every third of a lease, for as
    /// long as the service lives.
    pub async fn renew_leases(self: Arc<Self>) {
        let every = (self.owner.lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let ids: Vec<String> = self.owner.running().iter().cloned().collect();
            if ids.is_empty() {
                continue;
            }
            let until = self.owner.lease_until();
            let incarnation = self.owner.incarnation.clone();
            let renewed =
                self.store.write(async |tx| operations::renew(tx, &ids, &incarnation, until).await).await;
            if let Err(e) = renewed {
                tracing::warn!("could not renew the leases of {} operations: {e}", ids.len());
            }
        }
    }
}

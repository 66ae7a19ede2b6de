//! Reconciliation, at start-up (in the background: the API answers at once) and periodically. A
//! pass does two things:
//!
//! 1. **Orphaned operations** (`ops.rs`) are driven to their safe end (`recover.rs`), each under
//!    its volume's lock.
//! 2. **Backends are made to match the database, both ways**, for the backends granted the iSCSI
//!    target service: one listing of the target service is compared with the connected
//!    attachments (`attaching`, `attached`, with a connector) and the targets this service
//!    recorded creating (the `targets` table). Healthy volumes cost no driver call and change
//!    nothing. For the others, under the volume's lock and after checking again:
//!    - a target, LUN or ACL entry that a connected attachment needs is missing: the driver's
//!      idempotent `create-export` and `initialize-connection` are replayed (a `repair`);
//!    - an ACL entry that no connected attachment needs (an error row's, a crash's leftover, a
//!      manual edit) is revoked through the driver's `terminate-connection` (a `revoke`);
//!    - a target this service created for a volume with no connected attachment is removed
//!      through `remove-export` (a `remove-export`);
//!    - a LUN that serves another size than its store has now (a store grown by an extend whose
//!      reopen failed or was cut short), or a target left taking no login (`State: offline`), is
//!      opened again by the target service (`reopen-luns`: the hosts log in again; a `refresh`).
//!
//!    Removals and refreshes wait until the difference has been seen for the grace period (an
//!    extend in flight shows both for a moment), and in report-only mode removals are only
//!    logged. Targets this service did not create are reported as drift and
//!    never touched. Every change is an operation, so a crash in the middle of one is recovered
//!    like any other, and every change is logged with its reason.
//!
//! 3. **Cephx identities** (backends granted `cephx` with a `[backends.cephx]` table): every identity
//!    the host made for the backend (`client.berth.<backend>.<image>.<host digest>`) that no
//!    connected attachment of that volume on that host holds (a crash between making it and
//!    recording the attachment, a detach whose revoke failed) is removed once it has been seen for
//!    the grace period, under an operation on its volume (so no flow of any node runs on the
//!    volume meanwhile). Volumes with an operation in flight are left for the next pass. The
//!    other way round, a connected attachment whose identity is missing (removed behind the
//!    service's back) has it made again with the key its connection info holds (a `repair`).
//!    And the images of the backend's pools named after a volume: one whose volume was deleted is
//!    deleted through the driver (after the grace period, under an operation); one of a volume
//!    this database does not know is drift, left alone; a settled volume whose image is in none
//!    of the pools is reported (nothing can make its data again).
//!
//! Access it ends (an ACL entry, an identity, a target, a deleted volume's image) is recorded in
//! the attach history as a `revoke` of the service's own, in the transaction that ends its
//! operation; what it gives back (an export rebuilt, an identity made again) is access the
//! history already says was granted, and is logged only.
//!
//! Not compared: CHAP accounts (an account is bound to its target and goes with it; a crash inside
//! `set-chap` closes the target's ACL, which a repair then reopens) and targets of backends that
//! were not granted the target service.
//!
//! Here the pass and what both halves share (the grace period, the report); `iscsi.rs` the
//! targets (2), `cephx.rs` the identities and images (3).

mod cephx;
mod iscsi;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::history::Change;
use super::model::{Connector, Live, Volume};
use super::state::Event;
use super::{AttachError, Service};
use crate::capabilities::iscsi::TargetService;
use crate::domain::history::Access;
use crate::store::attachments as rows;
use crate::store::{operations, volumes};

/// Repairs run at the same time (each is a few driver calls and target-service requests).
const REPAIRS_AT_ONCE: usize = 4;

/// How a reconciliation acts.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long a target or ACL entry nobody needs must have been seen before it is removed.
    pub grace: Duration,
    /// Remove what nobody needs (false: report it only).
    pub remove: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { grace: Duration::from_secs(60), remove: true }
    }
}

/// What a pass did.
#[derive(Debug, Default, Clone)]
pub struct Reconciled {
    /// Interrupted operations driven to their end.
    pub recovered: usize,
    /// Volumes whose exports and connections were replayed.
    pub repaired: Vec<String>,
    /// Volumes whose LUNs were opened again (their stores' size had changed behind them, or a
    /// target took no login).
    pub refreshed: Vec<String>,
    /// ACL entries revoked: (target, initiator).
    pub revoked: Vec<(String, String)>,
    /// Targets removed.
    pub removed: Vec<String>,
    /// Differences still inside their grace period.
    pub waiting: usize,
    /// Removals left to the operator (report-only mode).
    pub reported: Vec<String>,
    /// Targets the target service has that this service did not create.
    pub drift: Vec<String>,
    /// Cephx identities removed (no connected attachment held them).
    pub identities_removed: Vec<String>,
    /// Images of deleted volumes deleted: `pool/image`.
    pub images_removed: Vec<String>,
    /// Unused objects the target service's housekeeping removed (tgtd: kept CHAP accounts).
    pub swept: usize,
    /// What could not be done, with the reason.
    pub failed: Vec<(String, String)>,
    /// How long the target service took to list its targets (tgtd serves nobody meanwhile).
    pub listing: std::time::Duration,
}

impl Reconciled {
    /// Whether the pass changed anything.
    pub fn changed(&self) -> bool {
        self.recovered > 0
            || !self.repaired.is_empty()
            || !self.refreshed.is_empty()
            || !self.revoked.is_empty()
            || !self.removed.is_empty()
            || !self.identities_removed.is_empty()
            || !self.images_removed.is_empty()
    }
}

/// What the reconciler remembers between passes.
pub struct Memory {
    seen: Mutex<Seen>,
    /// False from the start of `berth serve` until its first pass has finished.
    first_pass_done: std::sync::atomic::AtomicBool,
}

impl Default for Memory {
    fn default() -> Self {
        // A service without a reconciler (tests that embed it) has nothing to wait for.
        Memory { seen: Mutex::default(), first_pass_done: std::sync::atomic::AtomicBool::new(true) }
    }
}

#[derive(Default)]
struct Seen {
    /// When each unneeded ACL entry (target, initiator) and each orphan target was first seen.
    first_seen: HashMap<(String, Option<String>), Instant>,
    /// Drift already reported (once per target per process).
    reported: HashSet<String>,
    /// When each unneeded cephx identity and each image of a deleted volume was first seen.
    cephx: HashMap<String, Instant>,
    /// When each target was first seen taking no login or with stale LUNs: (target, offline,
    /// stale stores).
    stale: HashMap<(String, bool, Vec<String>), Instant>,
}

impl Memory {
    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn first_pass_done(&self) -> bool {
        self.first_pass_done.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// The reconciler's passes, over the service's shared core.
pub struct Reconcile<'a>(&'a Service);

impl std::ops::Deref for Reconcile<'_> {
    type Target = Service;

    fn deref(&self) -> &Service {
        self.0
    }
}

impl Reconcile<'_> {
    /// Marks the start of a service whose reconciler has not run yet (`berth serve`).
    pub fn awaiting_first_pass(&self) {
        self.reconciler.first_pass_done.store(false, std::sync::atomic::Ordering::Release);
    }

    /// Marks the end of the reconciler's first pass.
    pub fn first_pass_finished(&self) {
        self.reconciler.first_pass_done.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl Reconcile<'_> {
    /// One reconciliation pass (see the module notes). `targets` is the target service shared by
    /// the backends granted it, if any.
    pub async fn pass(
        &self,
        targets: Option<&dyn TargetService>,
        options: &Options,
    ) -> Result<Reconciled, AttachError> {
        if let Some(refused) = self.owner.schema_refusal() {
            return Err(refused);
        }
        let mut report = Reconciled::default();
        self.recover_orphans(&mut report).await?;
        self.compare_identities(options, &mut report).await?;
        if let Some(service) = targets {
            self.compare(service, options, &mut report).await?;
            match service.sweep().await {
                Ok(n) => report.swept = n,
                Err(e) => {
                    report.failed.push((String::new(), format!("housekeeping of the target service: {e}")))
                }
            }
        }
        Ok(report)
    }

    /// Drives every orphaned operation of a volume whose calls run here to its end (another
    /// node's volume waits for its node).
    async fn recover_orphans(&self, report: &mut Reconciled) -> Result<(), AttachError> {
        for op in self.store.read(async |tx| operations::all(tx).await).await? {
            let _lock = self.locks.lock(&op.volume_id).await;
            let placed = self.store.read(async |tx| self.placement(tx, &op.volume_id).await).await;
            if !matches!(placed, Ok(super::nodes::Placement::Here)) {
                continue;
            }
            let now = self.store.read(async |tx| operations::of_volume(tx, &op.volume_id).await).await?;
            let Some(now) = now.filter(|n| n.id == op.id && self.owner.is_orphaned(n)) else { continue };
            match self.recovery().recover(now).await {
                Ok(()) => report.recovered += 1,
                Err(e) => report.failed.push((op.volume_id.clone(), e.to_string())),
            }
        }
        Ok(())
    }

    /// Whether an unneeded thing has been seen for the grace period and may be removed now; in
    /// report-only mode it is reported instead.
    fn due<K: std::hash::Hash + Eq + Clone>(
        &self,
        seen: fn(&mut Seen) -> &mut HashMap<K, Instant>,
        key: &K,
        options: &Options,
        report: &mut Reconciled,
        what: &str,
    ) -> bool {
        let first = *seen(&mut self.reconciler.seen()).entry(key.clone()).or_insert_with(Instant::now);
        if first.elapsed() < options.grace {
            report.waiting += 1;
            return false;
        }
        if !options.remove {
            tracing::warn!("reconcile (report only): {what} is not needed by any connected attachment");
            report.reported.push(what.to_string());
            return false;
        }
        true
    }

    /// A volume's row (deleted or not) and its live attachments, read together.
    async fn volume_and_live(&self, volume_id: &str) -> Result<(Option<Volume>, Vec<Live>), AttachError> {
        self.store
            .read(async |tx| {
                Ok::<_, AttachError>((
                    volumes::get_even_deleted(tx, volume_id).await?,
                    rows::live(tx, volume_id).await?,
                ))
            })
            .await
    }

    /// Records, in the transaction that ends the reconciler's operation, that access nobody
    /// was owed was ended (`connector`: whose, when known).
    async fn record_revoked(
        &self,
        tx: &mut crate::store::sql::Tx,
        volume: &Volume,
        connector: Option<&Connector>,
        outcome: &str,
    ) -> Result<(), AttachError> {
        let change = Change {
            event: Event::Revoke,
            access: Access::Revoked,
            attachment: None,
            connector,
            outcome: Some(outcome),
        };
        self.record(tx, volume, change).await
    }
}

impl Service {
    /// Reconcile: the flows of `reconcile/`.
    pub fn reconcile(&self) -> Reconcile<'_> {
        Reconcile(self)
    }
}

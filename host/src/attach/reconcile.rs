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
//!      through `remove-export` (a `remove-export`).
//!
//!    Removals wait until the difference has been seen for the grace period, and in report-only
//!    mode they are only logged. Targets this service did not create are reported as drift and
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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::history::Change;
use super::model::{Connector, Live, OpKind, Volume};
use super::state::{Event, VolumeStatus};

use super::{AttachError, Service, record_fields};
use crate::capabilities::iscsi::{Iqn, TargetService, TargetState};
use crate::domain::history::Access;
use crate::failpoint;
use crate::runtime::Call;
use crate::store::attachments as rows;
use crate::store::{operations, targets, volumes};

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
}

impl Reconciled {
    /// Whether the pass changed anything.
    pub fn changed(&self) -> bool {
        self.recovered > 0
            || !self.repaired.is_empty()
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

/// Whether a volume's export serves every initiator in `wanted`: it has recorded targets, and each
/// exists with a LUN and all of them in its ACL.
fn export_complete<'a>(
    wanted: &BTreeSet<String>,
    recorded: &[String],
    state: impl Fn(&str) -> Option<&'a TargetState>,
) -> bool {
    !recorded.is_empty()
        && recorded.iter().all(|iqn| {
            state(iqn).is_some_and(|t| !t.luns.is_empty() && wanted.iter().all(|i| t.initiators.contains(i)))
        })
}

/// The database's side of a comparison, per volume.
#[derive(Default)]
struct Expected {
    /// Connected attachments.
    connected: Vec<Live>,
    /// Targets recorded for the volume.
    targets: Vec<String>,
}

impl Expected {
    fn initiators(&self) -> BTreeSet<String> {
        self.connected.iter().filter_map(|l| l.connector.as_ref()?.initiator().map(str::to_string)).collect()
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

    async fn compare(
        &self,
        service: &dyn TargetService,
        options: &Options,
        report: &mut Reconciled,
    ) -> Result<(), AttachError> {
        let actual: BTreeMap<String, TargetState> = service
            .list()
            .await
            .map_err(|e| AttachError::Unavailable(format!("cannot list the target service's targets: {e}")))?
            .into_iter()
            .map(|t| (t.iqn.clone(), t))
            .collect();
        // Where a long listing (thousands of targets) leaves time for flows to change things.
        failpoint::hit("reconcile.listed");
        let (connected, recorded, busy) = self
            .store
            .read(async |tx| {
                let connected = rows::connected(tx).await?;
                let recorded = targets::all(tx).await?;
                let busy: HashSet<String> =
                    operations::all(tx).await?.into_iter().map(|o| o.volume_id).collect();
                Ok::<_, AttachError>((connected, recorded, busy))
            })
            .await?;
        let recorded_iqns: HashSet<&str> = recorded.iter().map(|t| t.iqn.as_str()).collect();
        let mut by_volume: BTreeMap<String, Expected> = BTreeMap::new();
        for live in connected {
            let volume = live.attachment.volume_id.clone();
            by_volume.entry(volume).or_default().connected.push(live);
        }
        for t in &recorded {
            by_volume.entry(t.volume_id.clone()).or_default().targets.push(t.iqn.clone());
        }
        let backends = self.store.read(async |tx| {
            let ids: Vec<String> = by_volume.keys().cloned().collect();
            volumes::backends(tx, &ids).await
        });
        let backends = backends.await?;
        let mut still_seen = HashSet::new();
        let mut to_repair = Vec::new();

        for (volume_id, expected) in &by_volume {
            // Only this node's volumes: another node's targets live in its own target service.
            let ours = backends.get(volume_id).and_then(|s| {
                let b = self.catalog.backend(&s.backend)?;
                s.service_uuid.as_ref().is_none_or(|u| *u == b.service_uuid).then_some(b)
            });
            let uses_targets = ours.is_some_and(|b| b.uses_targets);
            if busy.contains(volume_id) || !uses_targets {
                continue;
            }
            let wanted = expected.initiators();
            if !expected.connected.is_empty() {
                if !export_complete(&wanted, &expected.targets, |iqn| actual.get(iqn)) {
                    // A candidate only: the listing and the database were read at different
                    // moments. `repair` compares them again under the volume's lock.
                    to_repair.push(volume_id.clone());
                }
                for iqn in &expected.targets {
                    let Some(target) = actual.get(iqn) else { continue };
                    for extra in target.initiators.iter().filter(|i| !wanted.contains(*i)) {
                        let key = (iqn.clone(), Some(extra.clone()));
                        still_seen.insert(key.clone());
                        if !self.due(
                            |s| &mut s.first_seen,
                            &key,
                            options,
                            report,
                            &format!("ACL entry {extra} on {iqn}"),
                        ) {
                            continue;
                        }
                        match self.revoke_unneeded(volume_id, iqn, extra, service).await {
                            Ok(true) => report.revoked.push((iqn.clone(), extra.clone())),
                            Ok(false) => {}
                            Err(e) => report.failed.push((volume_id.clone(), format!("revoke {extra}: {e}"))),
                        }
                    }
                }
            } else {
                for iqn in &expected.targets {
                    if !actual.contains_key(iqn) {
                        let forgotten = self.store.write(async |tx| targets::forget(tx, iqn).await).await;
                        if let Err(e) = forgotten {
                            report.failed.push((volume_id.clone(), format!("forget {iqn}: {e}")));
                        }
                        continue;
                    }
                    let key = (iqn.clone(), None);
                    still_seen.insert(key.clone());
                    if !self.due(|s| &mut s.first_seen, &key, options, report, &format!("target {iqn}")) {
                        continue;
                    }
                    match self.remove_unused(volume_id, iqn, service).await {
                        Ok(true) => report.removed.push(iqn.clone()),
                        Ok(false) => {}
                        Err(e) => report.failed.push((volume_id.clone(), format!("remove {iqn}: {e}"))),
                    }
                }
            }
        }
        self.reconciler.seen().first_seen.retain(|k, _| still_seen.contains(k));

        // After a restart of the target service every volume needs a repair: several at a time.
        let repaired: Vec<(String, Result<bool, AttachError>)> = futures_util::stream::iter(to_repair)
            .map(|volume_id| async move {
                let outcome = self.repair(&volume_id, service).await;
                (volume_id, outcome)
            })
            .buffer_unordered(REPAIRS_AT_ONCE)
            .collect()
            .await;
        for (volume_id, outcome) in repaired {
            match outcome {
                Ok(true) => report.repaired.push(volume_id),
                Ok(false) => {}
                Err(e) => report.failed.push((volume_id, format!("repair: {e}"))),
            }
        }

        for iqn in actual.keys().filter(|iqn| !recorded_iqns.contains(iqn.as_str())) {
            report.drift.push(iqn.clone());
            if self.reconciler.seen().reported.insert(iqn.clone()) {
                let t = &actual[iqn];
                tracing::warn!(
                    target_iqn = %iqn, tid = t.tid, sessions = t.sessions,
                    "drift: this target exists in the target service but this service did not create it; left alone"
                );
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

    /// Replays the exports and connections of a volume's connected attachments, when, compared
    /// again under the volume's lock (the database read first, then the target service: no flow
    /// of this node can change either in between), they are still incomplete; false when they are
    /// complete after all, or the volume has no connected attachment any more.
    async fn repair(&self, volume_id: &str, service: &dyn TargetService) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let (live, recorded) = self
            .store
            .read(async |tx| {
                Ok::<_, AttachError>((
                    rows::live(tx, volume_id).await?,
                    targets::of_volume(tx, volume_id).await?,
                ))
            })
            .await?;
        let wanted: BTreeSet<String> = live
            .iter()
            .filter(|l| l.is_connected())
            .filter_map(|l| l.connector.as_ref()?.initiator().map(str::to_string))
            .collect();
        let iqns: Vec<String> = recorded.into_iter().map(|t| t.iqn).collect();
        let mut now: BTreeMap<String, TargetState> = BTreeMap::new();
        for iqn in &iqns {
            let Ok(name) = Iqn::parse(iqn) else { continue };
            let shown = service
                .show(&name)
                .await
                .map_err(|e| AttachError::Unavailable(format!("cannot show target {iqn}: {e}")))?;
            if let Some(state) = shown {
                now.insert(iqn.clone(), state);
            }
        }
        if !wanted.is_empty() && export_complete(&wanted, &iqns, |iqn| now.get(iqn)) {
            tracing::debug!(volume = %volume_id, "reconcile: the export is complete when looked at again; nothing to do");
            return Ok(false);
        }
        self.repair_locked(volume_id).await
    }

    /// Until the first pass after start-up has finished, a volume about to be connected is
    /// reconciled first: its connected attachments' export is replayed, so that a target service
    /// that lost its targets while Berth was down does not leave them without access once this
    /// volume's export is made again. The caller holds the volume's lock.
    pub(super) async fn reconciled_first(&self, volume_id: &str) -> Result<(), AttachError> {
        if self.reconciler.first_pass_done() {
            return Ok(());
        }
        self.repair_locked(volume_id).await.map(drop)
    }

    /// [`Service::repair`] for a caller that holds the volume's lock.
    async fn repair_locked(&self, volume_id: &str) -> Result<bool, AttachError> {
        let (volume, live) = self
            .store
            .read(async |tx| {
                let volume = volumes::get(tx, volume_id, super::list::Scope::All).await?;
                Ok::<_, AttachError>((volume, rows::live(tx, volume_id).await?))
            })
            .await?;
        let connected: Vec<&Live> = live.iter().filter(|l| l.is_connected()).collect();
        let Some(volume) = volume.filter(|_| !connected.is_empty()) else { return Ok(false) };
        tracing::warn!(
            volume = %volume_id, attachments = connected.len(),
            "reconcile: the export of connected attachments is incomplete (was the target service restarted?); re-creating it"
        );
        let backend = self.backend(&volume)?;
        let op = self.operation(OpKind::Repair, volume_id, None, None);
        self.store.write(async |tx| op.begin(tx).await).await?;
        failpoint::hit("reconcile.repair.intent");
        let mut calls = op.calls(&backend.driver);
        let mut fields = volume.fields.clone();
        let replayed: Result<(), AttachError> = async {
            match calls.create_export(&volume.contract(), None).await {
                Ok(update) => backend.driver.apply(Call::CreateExport, &mut fields, &update)?,
                Err(e) if e.is_unsupported() => {}
                Err(e) => return Err(e.into()),
            }
            for l in &connected {
                let conn = l.contract().connector.expect("a connected attachment has a connector");
                let c = calls.initialize_connection(&volume.with_fields(&fields).contract(), &conn).await?;
                backend.driver.apply(Call::InitializeConnection, &mut fields, &c.update)?;
            }
            Ok(())
        }
        .await;
        failpoint::hit("reconcile.repair.commit");
        op.write(async |tx| {
            if replayed.is_ok() {
                record_fields(tx, &volume, &fields).await?;
            }
            op.finish_with(tx, &volume.backend, &calls).await
        })
        .await?;
        replayed.map(|()| true)
    }

    /// Revokes an ACL entry that no connected attachment of the volume needs, after checking
    /// again under the volume's lock; false when it turned out to be needed or gone.
    async fn revoke_unneeded(
        &self,
        volume_id: &str,
        iqn: &str,
        initiator: &str,
        service: &dyn TargetService,
    ) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let live = self.store.read(async |tx| rows::live(tx, volume_id).await).await?;
        let connected: Vec<&Live> = live.iter().filter(|l| l.is_connected()).collect();
        if connected.iter().any(|l| l.connector.as_ref().and_then(Connector::initiator) == Some(initiator)) {
            return Ok(false);
        }
        if !self.still_there(service, iqn, Some(initiator)).await? {
            return Ok(false);
        }
        // The connector of an attachment that had it (an error row), else just the initiator.
        let holder =
            live.iter().find(|l| l.connector.as_ref().and_then(Connector::initiator) == Some(initiator));
        let connector =
            holder.and_then(|l| l.connector.clone()).unwrap_or_else(|| Connector::of_initiator(initiator));
        tracing::warn!(
            volume = %volume_id, target_iqn = %iqn, initiator,
            "reconcile: revoking an ACL entry that no connected attachment needs"
        );
        let others: Vec<_> = connected.iter().map(|l| l.contract()).collect();
        self.legacy().revoke(volume_id, &connector, &others, holder.map(|l| &l.attachment)).await?;
        Ok(true)
    }

    /// Removes a target this service created for a volume that has no connected attachment,
    /// after checking again under the volume's lock; false when it is needed again or gone.
    async fn remove_unused(
        &self,
        volume_id: &str,
        iqn: &str,
        service: &dyn TargetService,
    ) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let (volume, live) = self.volume_and_live(volume_id).await?;
        if live.iter().any(Live::is_connected) {
            return Ok(false);
        }
        let Some(state) = self.shown(service, iqn).await? else { return Ok(false) };
        let Some(volume) = volume else {
            return Err(AttachError::NotFound(format!("volume {volume_id} of target {iqn} is unknown")));
        };
        tracing::warn!(
            volume = %volume_id, target_iqn = %iqn, status = %volume.status,
            "reconcile: removing a target that no connected attachment uses"
        );
        let backend = self.backend(&volume)?;
        let op = self.operation(OpKind::RemoveExport, volume_id, None, None);
        self.store.write(async |tx| op.begin(tx).await).await?;
        failpoint::hit("reconcile.remove-export.intent");
        let mut calls = op.calls(&backend.driver);
        let mut fields = volume.fields.clone();
        let removed = match calls.remove_export(&volume.contract()).await {
            Ok(update) => backend.driver.apply(Call::RemoveExport, &mut fields, &update),
            Err(e) => Err(e),
        };
        failpoint::hit("reconcile.remove-export.commit");
        let gone = calls
            .effects
            .iter()
            .any(|e| matches!(e, crate::runtime::Effect::TargetDeleted { iqn: d } if d == iqn));
        op.write(async |tx| {
                if removed.is_ok() && volume.status != super::state::VolumeStatus::Deleted {
                    record_fields(tx, &volume, &fields).await?;
                }
                targets::record(tx, &volume.backend, volume_id, &calls.effects).await?;
                if removed.is_ok() && !gone {
                    // The driver's export is elsewhere: this target is not its to remove.
                    tracing::warn!(target_iqn = %iqn, "the driver's remove-export left this target; no longer tracking it");
                    targets::forget(tx, iqn).await?;
                }
                if removed.is_ok() && gone {
                    // Whose access went with the target: each initiator of its ACL, with the
                    // attachment that had it (an error row), if any.
                    for initiator in &state.initiators {
                        let holder = live.iter().find(|l| {
                            l.connector.as_ref().and_then(Connector::initiator) == Some(initiator.as_str())
                        });
                        let connector = holder
                            .and_then(|l| l.connector.clone())
                            .unwrap_or_else(|| Connector::of_initiator(initiator));
                        let change = Change {
                            event: Event::Revoke,
                            access: Access::Revoked,
                            attachment: holder.map(|l| &l.attachment),
                            connector: Some(&connector),
                            outcome: Some("export removed"),
                        };
                        self.record(tx, &volume, change).await?;
                    }
                    if state.initiators.is_empty() {
                        self.record_revoked(tx, &volume, None, "export removed").await?;
                    }
                }
                op.finish(tx).await
            })
            .await?;
        removed?;
        Ok(gone)
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

    /// The target as the target service has it now; none if it is gone (or not a valid name).
    async fn shown(
        &self,
        service: &dyn TargetService,
        iqn: &str,
    ) -> Result<Option<TargetState>, AttachError> {
        let Ok(name) = Iqn::parse(iqn) else { return Ok(None) };
        service
            .show(&name)
            .await
            .map_err(|e| AttachError::Unavailable(format!("cannot show target {iqn}: {e}")))
    }

    /// Whether the target (and the initiator in its ACL, when given) still exists.
    async fn still_there(
        &self,
        service: &dyn TargetService,
        iqn: &str,
        initiator: Option<&str>,
    ) -> Result<bool, AttachError> {
        let shown = self.shown(service, iqn).await?;
        Ok(match (shown, initiator) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(t), Some(i)) => t.initiators.iter().any(|x| x == i),
        })
    }
}

impl Reconcile<'_> {
    /// Removes the cephx identities that no connected attachment holds (see the module notes).
    async fn compare_identities(
        &self,
        options: &Options,
        report: &mut Reconciled,
    ) -> Result<(), AttachError> {
        let mut still_seen = HashSet::new();
        for backend in self.catalog.backends() {
            let Some(cephx) = backend.driver.cephx().filter(|c| c.configured()).cloned() else { continue };
            let held = match cephx.held().await {
                Ok(held) => held,
                Err(e) => {
                    report.failed.push((String::new(), format!("cephx identities of {}: {e}", backend.name)));
                    continue;
                }
            };
            let ids: Vec<String> =
                held.iter().filter_map(|h| h.image.strip_prefix("volume-").map(str::to_string)).collect();
            let (connected, busy, known) = self
                .store
                .read(async |tx| {
                    let connected = rows::connected(tx).await?;
                    let busy: HashSet<String> =
                        operations::all(tx).await?.into_iter().map(|o| o.volume_id).collect();
                    let known = volumes::backends(tx, &ids).await?;
                    Ok::<_, AttachError>((connected, busy, known))
                })
                .await?;
            let wanted: HashSet<(String, String)> = connected.iter().filter_map(holder).collect();
            let present: HashSet<String> = held.iter().map(|h| h.entity.clone()).collect();
            self.restore_identities(&backend.name, &cephx, &connected, &busy, &present, report).await?;
            self.compare_images(&backend.name, &cephx, options, report, &mut still_seen).await?;
            for identity in held {
                let Some(volume_id) = identity.image.strip_prefix("volume-") else { continue };
                // A volume this database does not know (another deployment's backend of the same
                // name on the same cluster) is not this service's to judge: drift, left alone.
                if known.get(volume_id).is_none_or(|s| s.backend != backend.name) {
                    if self.reconciler.seen().reported.insert(identity.entity.clone()) {
                        tracing::warn!(identity = %identity.entity, "drift: a cephx identity of this backend for a volume this service does not know; left alone");
                    }
                    report.drift.push(identity.entity.clone());
                    continue;
                }
                if busy.contains(volume_id)
                    || wanted.contains(&(volume_id.to_string(), identity.host_digest.clone()))
                {
                    continue;
                }
                still_seen.insert(identity.entity.clone());
                if !self.due(|s| &mut s.cephx, &identity.entity, options, report, &identity.entity) {
                    continue;
                }
                match self.remove_identity(volume_id, &identity, &cephx).await {
                    Ok(true) => report.identities_removed.push(identity.entity.clone()),
                    Ok(false) => {}
                    Err(e) => report
                        .failed
                        .push((volume_id.to_string(), format!("remove {}: {e}", identity.entity))),
                }
            }
        }
        self.reconciler.seen().cephx.retain(|k, _| still_seen.contains(k));
        Ok(())
    }

    /// The images of the backend's pools named after a volume (`volume-<id>`): one whose volume
    /// was deleted (an image made again behind the service's back, or left by a delete whose
    /// success was wrong) is deleted through the driver, under an operation on the volume, once it
    /// has been seen for the grace period; one of a volume this database does not know is drift,
    /// left alone (another deployment's pool, or an operator's image).
    async fn compare_images(
        &self,
        backend: &str,
        cephx: &crate::capabilities::cephx::CephxCapability,
        options: &Options,
        report: &mut Reconciled,
        still_seen: &mut HashSet<String>,
    ) -> Result<(), AttachError> {
        // Read before the listing: a volume made after it is not taken for one without its image.
        let settled = self
            .store
            .read(async |tx| {
                volumes::settled_of_backend(tx, backend, &[VolumeStatus::Available, VolumeStatus::InUse])
                    .await
            })
            .await?;
        let mut images = Vec::new();
        for pool in cephx.pools() {
            match cephx.images(pool).await {
                Ok(names) => images.extend(names.into_iter().map(|i| (pool.clone(), i))),
                Err(e) => {
                    report
                        .failed
                        .push((String::new(), format!("the images of {backend}'s pool {pool}: {e}")));
                    return Ok(());
                }
            }
        }
        let ids: Vec<String> =
            images.iter().filter_map(|(_, i)| i.strip_prefix("volume-").map(str::to_string)).collect();
        let (known, busy) = self
            .store
            .read(async |tx| {
                let known = volumes::backends(tx, &ids).await?;
                let busy: HashSet<String> =
                    operations::all(tx).await?.into_iter().map(|o| o.volume_id).collect();
                Ok::<_, AttachError>((known, busy))
            })
            .await?;
        let listed: HashSet<String> = images.iter().map(|(_, i)| i.clone()).collect();
        for (pool, image) in images {
            let Some(volume_id) = image.strip_prefix("volume-") else { continue };
            let what = format!("image {pool}/{image}");
            match known.get(volume_id) {
                None => {
                    if self.reconciler.seen().reported.insert(what.clone()) {
                        tracing::warn!(image = %what, "drift: an image named after a volume this service does not know; left alone");
                    }
                    report.drift.push(what);
                }
                Some(s) if s.backend == backend && s.deleted && !busy.contains(volume_id) => {
                    still_seen.insert(what.clone());
                    if !self.due(|s| &mut s.cephx, &what, options, report, &what) {
                        continue;
                    }
                    match self.remove_orphan_image(volume_id, &what).await {
                        Ok(true) => report.images_removed.push(format!("{pool}/{image}")),
                        Ok(false) => {}
                        Err(e) => report.failed.push((volume_id.to_string(), format!("remove {what}: {e}"))),
                    }
                }
                Some(_) => {}
            }
        }
        // The other way: a settled volume whose image is in none of the pools. Nothing can make
        // its data again: reported (once per process), after a second look at the image and the
        // row.
        for volume_id in settled.iter().filter(|v| !listed.contains(&format!("volume-{v}"))) {
            let name = format!("volume-{volume_id}");
            let mut found = false;
            for pool in cephx.pools() {
                match cephx.image_exists(pool, &name).await {
                    Ok(false) => {}
                    Ok(true) | Err(_) => found = true,
                }
            }
            let still = self.store.read(async |tx| volumes::get_even_deleted(tx, volume_id).await).await?;
            let settled_now =
                still.is_some_and(|v| matches!(v.status, VolumeStatus::Available | VolumeStatus::InUse));
            if found || !settled_now {
                continue;
            }
            let what = format!("volume {volume_id}: its image {name} is in none of the pools of {backend}");
            if self.reconciler.seen().reported.insert(what.clone()) {
                tracing::error!(volume = %volume_id, image = %name, "reconcile: a volume's image is missing from the backend; nothing can make its data again");
            }
            report.drift.push(what);
        }
        Ok(())
    }

    /// Deletes the image of a deleted volume through the driver's idempotent `delete-volume`,
    /// after checking again under the volume's lock; false when the volume is not deleted after
    /// all.
    async fn remove_orphan_image(&self, volume_id: &str, what: &str) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let volume = self.store.read(async |tx| volumes::get_even_deleted(tx, volume_id).await).await?;
        let Some(volume) = volume.filter(|v| v.status == super::state::VolumeStatus::Deleted) else {
            return Ok(false);
        };
        let backend = self.backend(&volume)?;
        let op = self.operation(OpKind::DeleteVolume, volume_id, None, None);
        self.store.write(async |tx| op.begin(tx).await).await?;
        tracing::warn!(volume = %volume_id, image = %what, "reconcile: deleting the image of a deleted volume");
        let mut calls = op.calls(&backend.driver);
        let deleted = calls.delete_volume(&volume.contract()).await;
        op.write(async |tx| {
            if deleted.is_ok() {
                self.record_revoked(tx, &volume, None, "image of the deleted volume deleted").await?;
            }
            op.finish(tx).await
        })
        .await?;
        deleted.map_err(AttachError::Driver)?;
        Ok(true)
    }

    /// Makes again, with the key its attachment was given, the identity of each connected
    /// attachment of the backend whose identity is missing (removed behind the service's back),
    /// under an operation on the volume; the attachment's host can then open the image again.
    async fn restore_identities(
        &self,
        backend: &str,
        cephx: &crate::capabilities::cephx::CephxCapability,
        connected: &[Live],
        busy: &HashSet<String>,
        present: &HashSet<String>,
        report: &mut Reconciled,
    ) -> Result<(), AttachError> {
        let missing: Vec<&Live> = connected
            .iter()
            .filter(|l| l.is_connected() && !busy.contains(&l.attachment.volume_id))
            .filter(|l| {
                let Some((_, image, host, _)) = identity_of(l) else { return false };
                !present.contains(&cephx.entity(&image, &host))
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = missing.iter().map(|l| l.attachment.volume_id.clone()).collect();
        let served = self.store.read(async |tx| volumes::backends(tx, &ids).await).await?;
        for live in missing {
            let volume_id = &live.attachment.volume_id;
            if served.get(volume_id).is_none_or(|s| s.backend != backend) {
                continue;
            }
            match self.restore_identity(live, cephx).await {
                Ok(true) => report.repaired.push(volume_id.clone()),
                Ok(false) => {}
                Err(e) => report.failed.push((volume_id.clone(), format!("restore its cephx identity: {e}"))),
            }
        }
        Ok(())
    }

    /// One restore, after checking again under the volume's lock that the attachment is still
    /// connected with the same connection.
    async fn restore_identity(
        &self,
        live: &Live,
        cephx: &crate::capabilities::cephx::CephxCapability,
    ) -> Result<bool, AttachError> {
        let volume_id = &live.attachment.volume_id;
        let _held = self.hold(volume_id).await?;
        let now = self.store.read(async |tx| rows::live(tx, volume_id).await).await?;
        let Some(current) = now.iter().find(|l| l.attachment.id == live.attachment.id && l.is_connected())
        else {
            return Ok(false);
        };
        let Some((pool, image, host, keyring)) = identity_of(current) else { return Ok(false) };
        let op = self.operation(OpKind::Repair, volume_id, None, None);
        self.store.write(async |tx| op.begin(tx).await).await?;
        tracing::warn!(
            volume = %volume_id, attachment = %live.attachment.id, identity = %cephx.entity(&image, &host),
            "reconcile: the cephx identity of a connected attachment may be missing; making it again with its key"
        );
        let restored = cephx.restore(&pool, &image, &host, &keyring).await;
        op.write(async |tx| op.finish(tx).await).await?;
        restored.map_err(|e| AttachError::Unavailable(e.to_string()))
    }

    /// Removes an identity no connected attachment holds, after checking again under the
    /// volume's lock, inside an operation on the volume (no flow of any node runs on it
    /// meanwhile); false when an attachment holds it after all.
    async fn remove_identity(
        &self,
        volume_id: &str,
        identity: &crate::capabilities::cephx::Held,
        cephx: &crate::capabilities::cephx::CephxCapability,
    ) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let (volume, live) = self.volume_and_live(volume_id).await?;
        if live.iter().filter_map(holder).any(|(_, digest)| digest == identity.host_digest) {
            return Ok(false);
        }
        let op = self.operation(OpKind::Revoke, volume_id, None, None);
        self.store.write(async |tx| op.begin(tx).await).await?;
        failpoint::hit("reconcile.cephx.intent");
        tracing::warn!(volume = %volume_id, identity = %identity.entity, "reconcile: removing a cephx identity that no connected attachment holds");
        let removed = cephx.remove(identity).await;
        op.write(async |tx| {
            if removed.is_ok()
                && let Some(volume) = &volume
            {
                let host = self.host_of_digest(tx, volume_id, &identity.host_digest).await?;
                let connector = host.as_deref().map(Connector::of_host);
                self.record_revoked(tx, volume, connector.as_ref(), "cephx identity removed").await?;
            }
            op.finish(tx).await
        })
        .await?;
        removed.map_err(|e| AttachError::Unavailable(format!("cannot remove {}: {e}", identity.entity)))?;
        Ok(true)
    }
}

/// The identity a connected attachment was given, from its connection info: (pool, image,
/// connector's host, keyring); none for an attachment without one (`identities = shared`,
/// another protocol).
fn identity_of(live: &Live) -> Option<(String, String, String, String)> {
    let host = live.connector.as_ref()?.host()?.to_string();
    let info = live.attachment.connection_info.as_ref()?;
    let info = info.get("data").unwrap_or(info);
    let keyring = info.get("keyring")?.as_str()?.to_string();
    let (pool, image) = info.get("name")?.as_str()?.split_once('/')?;
    Some((pool.to_string(), image.to_string(), host, keyring))
}

/// The (volume, digest of the connector's host) a connected attachment holds an identity for.
fn holder(live: &Live) -> Option<(String, String)> {
    let host = live.connector.as_ref().filter(|_| live.is_connected())?.host()?;
    Some((live.attachment.volume_id.clone(), crate::capabilities::cephx::host_digest(host)))
}

impl Service {
    /// Reconcile: the flows of `reconcile.rs`.
    pub fn reconcile(&self) -> Reconcile<'_> {
        Reconcile(self)
    }
}

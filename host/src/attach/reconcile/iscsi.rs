//! The iSCSI half of a pass: one listing of the target service against the connected
//! attachments and the targets this service recorded (the module notes, 2).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Instant;

use futures_util::StreamExt;

use super::{Options, REPAIRS_AT_ONCE, Reconcile, Reconciled};
use crate::attach::history::Change;
use crate::attach::model::{Connector, Live, OpKind};
use crate::attach::ops::{ChangesBy, Subject};
use crate::attach::state::Event;
use crate::attach::{AttachError, record_fields};
use crate::capabilities::iscsi::{Iqn, TargetService, TargetState};
use crate::domain::history::Access;
use crate::failpoint;
use crate::runtime::Call;
use crate::store::attachments as rows;
use crate::store::{operations, targets, volumes};

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
    pub(super) async fn compare(
        &self,
        service: &dyn TargetService,
        options: &Options,
        report: &mut Reconciled,
    ) -> Result<(), AttachError> {
        let listing = std::time::Instant::now();
        let actual: BTreeMap<String, TargetState> = service
            .list()
            .await
            .map_err(|e| AttachError::Unavailable(format!("cannot list the target service's targets: {e}")))?
            .into_iter()
            .map(|t| (t.iqn.clone(), t))
            .collect();
        report.listing += listing.elapsed();
        // Where a long listing (thousands of targets) leaves time for flows to change things.
        failpoint::hit("reconcile.listed").await;
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
        let mut stale_seen = HashSet::new();
        let mut to_repair = Vec::new();
        let mut to_refresh = BTreeSet::new();

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
                    if target.offline || !target.stale_stores.is_empty() {
                        let key = (iqn.clone(), target.offline, target.stale_stores.clone());
                        stale_seen.insert(key.clone());
                        let first = *self.reconciler.seen().stale.entry(key).or_insert_with(Instant::now);
                        if first.elapsed() < options.grace {
                            report.waiting += 1;
                        } else {
                            to_refresh.insert(volume_id.clone());
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
        self.reconciler.seen().stale.retain(|k, _| stale_seen.contains(k));

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

        for volume_id in to_refresh {
            match self.refresh(&volume_id, service).await {
                Ok(true) => report.refreshed.push(volume_id),
                Ok(false) => {}
                Err(e) => report.failed.push((volume_id, format!("refresh: {e}"))),
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

    /// Opens again the LUNs of a volume's targets that serve another size than their stores
    /// have, and opens to logins a target left taking none (the target service's `reopen-luns`:
    /// the target closed, its sessions ended, each LUN on the store opened again, the target
    /// opened), when a listing made under the volume's lock (no flow of this node can change the
    /// stores or the targets meanwhile) still shows it; false when it does not.
    async fn refresh(&self, volume_id: &str, service: &dyn TargetService) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let recorded = self.store.read(async |tx| targets::of_volume(tx, volume_id).await).await?;
        let listed = service.list().await.map_err(|e| {
            AttachError::Unavailable(format!("cannot list the target service's targets: {e}"))
        })?;
        let mut stores = BTreeSet::new();
        for t in listed.iter().filter(|t| recorded.iter().any(|r| r.iqn == t.iqn)) {
            stores.extend(t.stale_stores.iter().cloned());
            if t.offline {
                stores.extend(t.luns.iter().map(|(_, store)| store.clone()));
            }
        }
        if stores.is_empty() {
            return Ok(false);
        }
        tracing::warn!(
            volume = %volume_id, ?stores,
            "reconcile: a LUN serves another size than its store has, or a target takes no login; opening them again"
        );
        for store in &stores {
            service
                .reopen_luns(store)
                .await
                .map_err(|e| AttachError::Unavailable(format!("cannot open {store} again: {e}")))?;
        }
        Ok(true)
    }

    /// Until the first pass after start-up has finished, a volume about to be connected is
    /// reconciled first: its connected attachments' export is replayed, so that a target service
    /// that lost its targets while Berth was down does not leave them without access once this
    /// volume's export is made again. The caller holds the volume's lock.
    pub(in crate::attach) async fn reconciled_first(&self, volume_id: &str) -> Result<(), AttachError> {
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
                let volume = volumes::get(tx, volume_id, crate::attach::list::Scope::All).await?;
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
        let op = self
            .begin_operation(OpKind::Repair, Subject::AsRead(&volume), None, None, ChangesBy::Host)
            .await?;
        failpoint::hit("reconcile.repair.intent").await;
        let mut calls = op.calls(&backend.driver).for_owner(&volume.project_id);
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
        failpoint::hit("reconcile.repair.commit").await;
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
        let (volume, live) = self.volume_and_live(volume_id).await?;
        let Some(volume) = volume.filter(|v| !v.status.is_gone()) else {
            return Ok(false);
        };
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
        self.legacy().revoke(&volume, &connector, &others, holder.map(|l| &l.attachment)).await?;
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
        let op = self
            .begin_operation(OpKind::RemoveExport, Subject::AsRead(&volume), None, None, ChangesBy::Host)
            .await?;
        failpoint::hit("reconcile.remove-export.intent").await;
        let mut calls = op.calls(&backend.driver);
        let mut fields = volume.fields.clone();
        let removed = match calls.remove_export(&volume.contract()).await {
            Ok(update) => backend.driver.apply(Call::RemoveExport, &mut fields, &update),
            Err(e) => Err(e),
        };
        failpoint::hit("reconcile.remove-export.commit").await;
        let gone = calls
            .effects
            .iter()
            .any(|e| matches!(e, crate::runtime::Effect::TargetDeleted { iqn: d } if d == iqn));
        op.write(async |tx| {
                if removed.is_ok() && !volume.status.is_gone() {
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

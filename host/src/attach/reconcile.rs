//! Start-up reconciliation. Targets live in tgtd's memory, so a restart of tgtd or of the host
//! loses them; the database still says which attachments are live. For every volume with
//! connected live attachments this replays `create-export` and each attachment's
//! `initialize-connection` (both idempotent by contract), which re-creates exactly what is
//! missing and changes nothing that is there.
//!
//! The replay records the drivers' iSCSI capability calls, so it also knows which targets belong
//! to live attachments: every other target the service has is drift, reported (not deleted: an
//! operator may have made it on purpose).

use std::collections::BTreeSet;

use super::{AttachError, Service, apply_update, contract_attachment, contract_volume, with_fields};
use crate::runtime::{Call, CallOptions, Request, Response};
use crate::store::Scope;
use crate::store::attachments as rows;
use crate::store::volumes;

/// What a reconciliation did.
#[derive(Debug, Default, Clone)]
pub struct Reconciled {
    /// Volumes whose exports were replayed.
    pub volumes: usize,
    /// Attachments whose connections were replayed.
    pub attachments: usize,
    /// Volumes that could not be replayed, with the reason.
    pub failed: Vec<(String, String)>,
    /// iSCSI targets (IQNs) the drivers touched: the targets of live attachments.
    pub targets: BTreeSet<String>,
}

impl Service {
    /// Replays the exports and connections of every connected live attachment.
    pub async fn reconcile(&self) -> Result<Reconciled, AttachError> {
        let volume_ids: Vec<String> = self
            .store()
            .read(async |tx| {
                let rows = tx
                    .query(
                        "SELECT DISTINCT a.volume_id FROM volume_attachment a WHERE a.deleted = 0 AND EXISTS \
                         (SELECT 1 FROM attachment_specs s WHERE s.attachment_id = a.id) ORDER BY a.volume_id",
                        &[],
                    )
                    .await?;
                rows.iter().map(|r| r.text(0)).collect::<Result<Vec<_>, _>>()
            })
            .await?;
        let mut report = Reconciled::default();
        for id in volume_ids {
            let _guard = self.locks.lock(&id).await;
            match self.replay(&id, &mut report).await {
                Ok(true) => report.volumes += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(volume = %id, "could not re-create the volume's export: {e}");
                    report.failed.push((id, e.to_string()));
                }
            }
        }
        Ok(report)
    }

    /// Replays one volume; false when it no longer has a connected live attachment.
    async fn replay(&self, id: &str, report: &mut Reconciled) -> Result<bool, AttachError> {
        let (volume, attachments, connectors) = self
            .store()
            .read(async |tx| {
                let volume =
                    volumes::get(tx, id, Scope::All).await?.ok_or_else(|| super::volume_not_found(id))?;
                let all = rows::of_volume(tx, id).await?;
                let ids: Vec<&str> = all.iter().map(|r| r.id.as_str()).collect();
                let connectors = rows::connectors(tx, &ids).await?;
                Ok::<_, AttachError>((volume, all, connectors))
            })
            .await?;
        // The list of volumes was read before this volume's lock was taken: its last connected
        // attachment may have been removed since, and then there is nothing to re-create.
        if !attachments.iter().any(|r| connectors.get(&r.id).is_some_and(|c| !c.is_empty())) {
            return Ok(false);
        }
        let driver = self.driver(&volume)?;
        let record = CallOptions { record: true, ..Default::default() };
        let mut fields = volume.driver_fields();
        let mut note = |stats: &crate::runtime::CallStats| {
            for call in stats.capability_calls.iter().filter(|c| c.interface == "iscsi-target") {
                if let Some(iqn) = call.args.first() {
                    report.targets.insert(iqn.clone());
                }
            }
        };

        let outcome = driver.invoke(&Request::CreateExport(contract_volume(&volume), None), &record).await;
        note(&outcome.stats);
        match outcome.result {
            Ok(Response::ModelUpdate(update)) => {
                apply_update(driver, Call::CreateExport, &mut fields, &update)?
            }
            Ok(_) => {}
            Err(e) if e.is_unsupported() => {}
            Err(e) => return Err(e.into()),
        }
        for row in &attachments {
            let Some(attachment) = contract_attachment(row, connectors.get(&row.id)).connector else {
                continue;
            };
            let exported = contract_volume(&with_fields(&volume, &fields));
            let outcome = driver.invoke(&Request::InitializeConnection(exported, attachment), &record).await;
            note(&outcome.stats);
            match outcome.result {
                Ok(Response::Connection(c)) => {
                    apply_update(driver, Call::InitializeConnection, &mut fields, &c.update)?;
                    report.attachments += 1;
                }
                Ok(_) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.store().write(async |tx| volumes::lock(tx, id, &[], Some(&fields)).await).await?;
        Ok(true)
    }
}

//! Driving an operation that lost its owner to a safe end. The caller holds the volume's lock
//! (`ops.rs` explains why that makes the operation an orphan). Every step is one of the driver's
//! idempotent calls, so it does not matter how far the owner got; an unfinished operation never
//! committed its outcome, since the outcome and the end of the operation are one transaction.
//!
//! | kind | safe end |
//! |---|---|
//! | create-volume | `create-volume` again; `available`, or `error` when it fails |
//! | delete-volume | `delete-volume` again; deleted, or `error_deleting` when it fails |
//! | connect | undone: its connector (and any it replaced) revoked, the export removed when unused; a create's attachment removed, an update's reserved again without connector; `error_attaching` when revoking fails |
//! | reconnect, repair | nothing to undo: the attachments it served are connected |
//! | disconnect | finished: access revoked, then the attachment removed (or its connector cleared); `error_detaching` when revoking fails |
//! | force-detach | finished: access revoked, the attachments removed; nothing changes in the database when revoking fails |
//! | revoke, remove-export | finished |
//!
//! Nothing is ever granted here: an interrupted connect is revoked, not completed, so a connector
//! whose last recorded intent was a revoke never gets access back. A failure that may pass
//! (`retryable`, a timeout) leaves the operation for the next pass and the volume unavailable
//! (503) until then; a final failure records the error status as the live flow would.

use super::disconnect::disconnect;
use super::history::Change;
use super::legacy::finish_force_detach;
use super::model::{AttachMode, Connector, Live, OpKind, Operation};
use super::ops::Op;
use super::state::{Event, VolumeStatus};
use super::{AttachError, Service, record_fields};
use crate::domain::history::Access;
use crate::runtime::Failure;
use crate::runtime::contract::Attachment as DriverAttachment;
use crate::store::attachments as rows;
use crate::store::volumes;

/// Crash recovery's flows, over the service's shared core.
pub struct Recovery<'a>(&'a Service);

impl std::ops::Deref for Recovery<'_> {
    type Target = Service;

    fn deref(&self) -> &Service {
        self.0
    }
}

impl Recovery<'_> {
    /// Takes over an orphaned operation and drives it to its end (see the module notes).
    pub(crate) async fn recover(&self, record: Operation) -> Result<(), AttachError> {
        tracing::warn!(
            operation = %record.id, kind = record.kind.name(), volume = %record.volume_id,
            attachment = ?record.attachment_id, owner = %record.node, step = %record.step,
            "recovering an interrupted operation"
        );
        // The same row, now ours: `Op::finish` deletes it when the safe end is recorded.
        let op = self.take_over(record).await?;
        let record = op.record.clone();
        let outcome = self.drive(&op, &record).await;
        match &outcome {
            Ok(()) => tracing::info!(operation = %record.id, volume = %record.volume_id, "recovered"),
            Err(e) => {
                tracing::warn!(operation = %record.id, volume = %record.volume_id, "recovery did not finish: {e}")
            }
        }
        outcome
    }

    async fn drive(&self, op: &Op<'_>, record: &Operation) -> Result<(), AttachError> {
        let id = &record.volume_id;
        let Some(volume) = self.store.read(async |tx| volumes::get_even_deleted(tx, id).await).await? else {
            return self.end(op).await;
        };
        let live: Vec<Live> = self.store.read(async |tx| rows::live(tx, id).await).await?;
        let except = |ids: &[&str]| -> Vec<DriverAttachment> {
            live.iter().filter(|l| !ids.contains(&l.attachment.id.as_str())).map(Live::contract).collect()
        };
        let this = record.attachment_id.as_deref().and_then(|a| live.iter().find(|l| l.attachment.id == a));
        let mode = this.map(|l| l.attachment.attach_mode).unwrap_or(AttachMode::Null);
        match &record.kind {
            OpKind::CreateVolume => {
                if volume.status != VolumeStatus::Creating {
                    return self.end(op).await;
                }
                match self.volumes().finish_create(op, &volume).await {
                    Err(AttachError::Driver(e)) if e.failure() == Failure::Transient => {
                        Err(unavailable(id, &e))
                    }
                    // A final failure is recorded (`error`): the operation has ended.
                    Ok(_) | Err(AttachError::Driver(_)) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            OpKind::DeleteVolume => {
                if volume.status != VolumeStatus::Deleting {
                    return self.end(op).await;
                }
                match self.volumes().finish_delete(op, &volume).await {
                    Err(AttachError::Driver(e)) if e.failure() == Failure::Transient => {
                        Err(unavailable(id, &e))
                    }
                    Ok(()) | Err(AttachError::Driver(_)) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            OpKind::ExtendVolume { new_size_gib } => {
                if volume.status != VolumeStatus::Extending {
                    return self.end(op).await;
                }
                match self.volumes().finish_extend(op, &volume, *new_size_gib).await {
                    Err(AttachError::Driver(e)) if e.failure() == Failure::Transient => {
                        Err(unavailable(id, &e))
                    }
                    // A final failure is recorded (available at the old size): ended.
                    Ok(_) | Err(AttachError::Driver(_)) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            OpKind::Connect { origin, revoke } => {
                let mut connectors: Vec<Connector> = record.connector.iter().cloned().collect();
                if let Some(json) = revoke {
                    connectors.push(Connector::parse(json.clone()).map_err(AttachError::InvalidInput)?);
                }
                let Some(this) = this else {
                    // The attachment is gone: revoke what may remain, and end.
                    return self.revoke_and_end(op, &volume, &connectors, &except(&[])).await;
                };
                let backend = self.backend(&volume)?;
                let calls = op.calls(&backend.driver);
                let interrupted = AttachError::Unavailable("the connect was interrupted".into());
                let _ = self
                    .attachments()
                    .undo_connect(
                        op,
                        calls,
                        &volume,
                        volume.fields.clone(),
                        &this.attachment,
                        connectors,
                        *origin,
                        interrupted,
                    )
                    .await;
                self.ended(op).await
            }
            OpKind::Reconnect | OpKind::Repair => self.end(op).await,
            OpKind::Disconnect { then } => {
                let others = match &record.attachment_id {
                    Some(a) => except(&[a.as_str()]),
                    None => except(&[]),
                };
                let backend = self.backend(&volume)?;
                let mut calls = op.calls(&backend.driver);
                let conn = record.connector.as_ref().map(|c| mode.driver_connector(c));
                match disconnect(&mut calls, &volume, &others, conn.as_ref()).await {
                    Ok(fields) => {
                        let attachment = record.attachment_id.clone().filter(|_| this.is_some());
                        op.write(async |tx| {
                            match &attachment {
                                Some(a) => {
                                    self.attachments()
                                        .apply_after(tx, &volume, a, *then, Some(&fields))
                                        .await?;
                                }
                                None => {
                                    record_fields(tx, &volume, &fields).await?;
                                }
                            }
                            op.finish_with(tx, &volume.backend, &calls).await
                        })
                        .await
                    }
                    Err(AttachError::Driver(e)) if e.failure() == Failure::Transient => {
                        Err(unavailable(id, &e))
                    }
                    Err(_) => {
                        let ids: Vec<String> = record.attachment_id.iter().cloned().collect();
                        self.attachments().fail_detach(op, &volume, &ids, &calls).await;
                        self.ended(op).await
                    }
                }
            }
            OpKind::ForceDetach { attachments } => {
                let refs: Vec<&str> = attachments.iter().map(String::as_str).collect();
                let backend = self.backend(&volume)?;
                let mut calls = op.calls(&backend.driver);
                let conn = record.connector.as_ref().map(|c| mode.driver_connector(c));
                match disconnect(&mut calls, &volume, &except(&refs), conn.as_ref()).await {
                    Ok(fields) => finish_force_detach(op, &volume, attachments, &fields, &calls).await,
                    Err(AttachError::Driver(e)) if e.failure() == Failure::Transient => {
                        Err(unavailable(id, &e))
                    }
                    Err(_) => self.end(op).await,
                }
            }
            OpKind::Revoke => {
                let connectors: Vec<Connector> = record.connector.iter().cloned().collect();
                self.revoke_and_end(op, &volume, &connectors, &except(&[])).await
            }
            OpKind::RemoveExport => {
                let backend = self.backend(&volume)?;
                let mut calls = op.calls(&backend.driver);
                let mut fields = volume.fields.clone();
                let removed = match calls.remove_export(&volume.contract()).await {
                    Ok(update) => {
                        backend.driver.apply(crate::runtime::Call::RemoveExport, &mut fields, &update)
                    }
                    Err(e) if e.is_unsupported() => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = &removed
                    && e.failure() == Failure::Transient
                {
                    return Err(unavailable(id, e));
                }
                op.write(async |tx| {
                    if removed.is_ok() {
                        record_fields(tx, &volume, &fields).await?;
                    }
                    op.finish_with(tx, &volume.backend, &calls).await
                })
                .await
            }
        }
    }

    /// Revokes connectors that no attachment holds, then ends the operation.
    async fn revoke_and_end(
        &self,
        op: &Op<'_>,
        volume: &super::model::Volume,
        connectors: &[Connector],
        others: &[DriverAttachment],
    ) -> Result<(), AttachError> {
        let backend = self.backend(volume)?;
        let mut calls = op.calls(&backend.driver);
        let mut fields = volume.fields.clone();
        let mut revoked = Vec::new();
        for c in connectors {
            let conn = AttachMode::Null.driver_connector(c);
            match disconnect(&mut calls, &volume.with_fields(&fields), others, Some(&conn)).await {
                Ok(f) => {
                    fields = f;
                    revoked.push(c);
                }
                Err(AttachError::Driver(e)) if e.failure() == Failure::Transient => {
                    return Err(unavailable(&volume.id, &e));
                }
                Err(e) => {
                    tracing::warn!(volume = %volume.id, "revoking an interrupted operation's access failed: {e}")
                }
            }
        }
        op.write(async |tx| {
            record_fields(tx, volume, &fields).await?;
            // Access ended where no attachment held it: in the history, as the flow that was
            // interrupted would have recorded it (`Service::revoke`).
            for c in &revoked {
                let change = Change {
                    event: Event::Revoke,
                    access: Access::Revoked,
                    attachment: None,
                    connector: Some(c),
                    outcome: Some("revoked"),
                };
                self.record(tx, volume, change).await?;
            }
            op.finish_with(tx, &volume.backend, &calls).await
        })
        .await
    }

    /// Ends an operation with nothing left to do.
    async fn end(&self, op: &Op<'_>) -> Result<(), AttachError> {
        op.write(async |tx| op.finish(tx).await).await
    }

    /// Whether a flow that records its own outcome (and ends the operation in that transaction)
    /// did so; if it could not, the operation is ended now.
    async fn ended(&self, op: &Op<'_>) -> Result<(), AttachError> {
        let left = self
            .store
            .read(async |tx| crate::store::operations::of_volume(tx, &op.record.volume_id).await)
            .await?;
        match left {
            Some(still) if still.id == op.record.id => Err(AttachError::Unavailable(format!(
                "the interrupted operation on volume {} could not record its end; it will be retried",
                op.record.volume_id
            ))),
            _ => Ok(()),
        }
    }
}

/// A failure that may pass: retrying later is the safe choice.
fn unavailable(volume_id: &str, e: &crate::runtime::CallError) -> AttachError {
    AttachError::Unavailable(format!(
        "volume {volume_id} has an interrupted operation that cannot be finished yet ({e}); retry later"
    ))
}

impl Service {
    /// Recovery: the flows of `recover.rs`.
    pub fn recovery(&self) -> Recovery<'_> {
        Recovery(self)
    }
}

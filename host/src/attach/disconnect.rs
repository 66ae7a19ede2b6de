//! The disconnect half of the attachment flows (`attachments.rs` says the flows): revoking a
//! connector through the driver, and what a disconnect makes of its attachment.

use super::attachments::Attachments;
use super::history::Change;
use super::list::Scope;
use super::model::{AfterDisconnect, Attachment, Live, OpKind, Volume};
use super::ops::{ChangesBy, Op, Subject};
use super::state::{AttachStatus, Event, transition};
use super::{AttachError, Caller, attachment_not_found, conclude, names, volume_not_found};
use crate::domain::history::Access;
use crate::domain::messages::{Action, Detail};
use crate::failpoint;
use crate::runtime::contract::{self, Attachment as DriverAttachment};
use crate::runtime::model::VolumeFields;
use crate::runtime::{Call, DriverCalls};
use crate::store::attachments as rows;
use crate::store::sql::Tx;
use crate::store::volumes;

impl Attachments<'_> {
    /// Revokes an attachment's access and then removes it (`Remove`, `Detach`) or keeps it
    /// without connector (`Terminate`); the caller holds the volume's lock. Returns the volume's
    /// remaining live attachments.
    pub(crate) async fn remove_locked(
        &self,
        caller: &Caller,
        id: &str,
        then: AfterDisconnect,
    ) -> Result<Vec<Attachment>, AttachError> {
        let (volume, live) = self
            .store
            .read(async |tx| {
                let row = rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id))?;
                let volume = volumes::get(tx, &row.volume_id, Scope::All)
                    .await?
                    .ok_or_else(|| volume_not_found(&row.volume_id))?;
                let live = rows::live(tx, &volume.id).await?;
                Ok::<_, AttachError>((volume, live))
            })
            .await?;
        failpoint::pause("attach.remove.read").await;
        let this = live.iter().find(|l| l.attachment.id == id).ok_or_else(|| attachment_not_found(id))?;
        // OSSA-2023-003: an instance's connected attachment is the compute service's to end;
        // a user who ends it behind the compute service's back leaves a guest with a stale device.
        if let (Some(instance), Some(_)) = (&this.attachment.instance_uuid, &this.connector)
            && !(caller.is_service || caller.is_admin())
        {
            return Err(AttachError::InstanceUsing(instance.clone()));
        }
        let t = transition(after_event(then));
        if !t.allows(volume.status, volume.multiattach) {
            return Err(AttachError::InvalidVolume(format!(
                "volume {} is {}; attachments can be removed only when it is {}",
                volume.id,
                volume.status,
                names(t.volume_from(volume.multiattach))
            )));
        }
        let Some(connector) = this.connector.clone() else {
            // Only reserved: nothing was exported for it, so no driver call and no operation.
            return self.store.write(async |tx| self.apply_after(tx, &volume, id, then, None).await).await;
        };
        let others: Vec<DriverAttachment> =
            live.iter().filter(|l| l.attachment.id != id).map(Live::contract).collect();
        let op = self
            .begin_operation(
                OpKind::Disconnect { then },
                Subject::AsRead(&volume),
                Some(id),
                Some(&connector),
                ChangesBy::Driver,
            )
            .await?;
        failpoint::hit("attach.remove.intent").await;
        let backend = self.backend(&volume)?;
        let mut calls = op.calls(&backend.driver);
        let conn = this.attachment.driver_connector(&connector);
        match disconnect(&mut calls, &volume, &others, Some(&conn)).await {
            Ok(fields) => {
                failpoint::hit("attach.remove.commit").await;
                op.write(async |tx| {
                    let remaining = self.apply_after(tx, &volume, id, then, Some(&fields)).await?;
                    op.finish_with(tx, &volume.backend, &calls).await?;
                    Ok(remaining)
                })
                .await
            }
            Err(error) => {
                self.fail_detach(&op, &volume, &[id.to_string()], &calls).await;
                Err(error)
            }
        }
    }

    /// After a failed disconnect: the attachments are `error_detaching`, the operation ends.
    pub(super) async fn fail_detach(
        &self,
        op: &Op<'_>,
        volume: &Volume,
        ids: &[String],
        calls: &DriverCalls<'_>,
    ) {
        let t = transition(Event::FailDetach);
        let recorded: Result<(), AttachError> = op
            .write(async |tx| {
                if let Some(locked) = volumes::lock(tx, &volume.id, t, None).await? {
                    let mut failed = Vec::new();
                    for id in ids {
                        failed.extend(rows::transition(tx, id, t, None).await?);
                    }
                    conclude(tx, &locked, t).await?;
                    for a in &failed {
                        self.record(tx, &locked, Change::of(t.event, Access::None, a)).await?;
                    }
                    self.tell(tx, &locked, Action::UpdateAttachment, Detail::DetachError).await?;
                }
                op.finish_with(tx, &volume.backend, calls).await
            })
            .await;
        if let Err(e) = recorded {
            tracing::error!(volume = %volume.id, "could not record the outcome of a failed detach: {e}");
        }
    }
}

/// The event that ends a disconnect.
pub(super) fn after_event(then: AfterDisconnect) -> Event {
    match then {
        AfterDisconnect::Remove => Event::Remove,
        AfterDisconnect::Detach => Event::Detach,
        AfterDisconnect::Terminate => Event::Terminate,
    }
}

impl Attachments<'_> {
    /// In a write transaction: what a disconnect does to its attachment once access is revoked, with
    /// the driver's fields afterwards (`volume` is as the disconnect read it). Returns the volume's
    /// remaining live attachments.
    pub(super) async fn apply_after(
        &self,
        tx: &mut Tx,
        volume: &Volume,
        id: &str,
        then: AfterDisconnect,
        fields: Option<&VolumeFields>,
    ) -> Result<Vec<Attachment>, AttachError> {
        let t = transition(after_event(then));
        let Some(locked) = volumes::lock(tx, &volume.id, t, fields.map(|f| (&volume.fields, f))).await?
        else {
            let now = volumes::get(tx, &volume.id, Scope::All)
                .await?
                .ok_or_else(|| volume_not_found(&volume.id))?;
            return Err(AttachError::InvalidVolume(format!(
                "volume {} is {}; attachments can be removed only when it is {}",
                now.id,
                now.status,
                names(t.volume_from(now.multiattach))
            )));
        };
        let before = rows::get(tx, id, Scope::All).await?;
        let connector = rows::connectors(tx, &[id]).await?.remove(id);
        match then {
            AfterDisconnect::Terminate => {
                if before.as_ref().is_none_or(|a| !t.allows_attachment(a.status)) {
                    return Err(attachment_not_found(id));
                }
                // Access is revoked: the connector and the connection info (with its credentials) go.
                rows::put_connector(tx, id, None).await?;
                rows::clear_connection_info(tx, id).await?;
            }
            AfterDisconnect::Remove | AfterDisconnect::Detach => {
                if !rows::remove(tx, id, t).await? {
                    return Err(attachment_not_found(id));
                }
                rows::promote_migration(tx, &volume.id).await?;
            }
        }
        conclude(tx, &locked, t).await?;
        if let Some(a) = &before {
            let access = if connector.is_some() { Access::Revoked } else { Access::None };
            let outcome = match then {
                AfterDisconnect::Terminate => t.attachment_to().map_or("terminated", |s| s.as_str()),
                AfterDisconnect::Remove | AfterDisconnect::Detach => AttachStatus::Detached.as_str(),
            };
            let change = Change {
                connector: connector.as_ref(),
                outcome: Some(outcome),
                ..Change::of(t.event, access, a)
            };
            self.record(tx, &locked, change).await?;
        }
        Ok(rows::of_volume(tx, &volume.id).await?)
    }
}

/// Revokes a connector's access through the driver (none: every access, a force detach), and
/// removes the export when nothing else uses it. Returns the volume's driver fields afterwards.
/// `unsupported` answers count as "nothing to do".
pub(super) async fn disconnect(
    calls: &mut DriverCalls<'_>,
    volume: &Volume,
    others: &[DriverAttachment],
    conn: Option<&contract::Connector>,
) -> Result<VolumeFields, AttachError> {
    let driver = calls.driver().clone();
    let mut fields = volume.fields.clone();
    let in_use = match calls.terminate_connection(&volume.contract(), conn, others).await {
        Ok(t) => {
            driver.apply(Call::TerminateConnection, &mut fields, &t.update)?;
            t.export_in_use
        }
        Err(e) if e.is_unsupported() => others.iter().any(|a| a.connector.is_some()),
        Err(e) => return Err(e.into()),
    };
    failpoint::hit("attach.disconnect.terminate-connection").await;
    if !in_use {
        match calls.remove_export(&volume.with_fields(&fields).contract()).await {
            Ok(update) => driver.apply(Call::RemoveExport, &mut fields, &update)?,
            Err(e) if e.is_unsupported() => {}
            Err(e) => return Err(e.into()),
        }
        failpoint::hit("attach.disconnect.remove-export").await;
    }
    Ok(fields)
}

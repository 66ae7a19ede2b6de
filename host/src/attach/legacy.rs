//! The legacy six-call workflow (`POST /volumes/{id}/action`: reserve, initialize_connection,
//! attach; begin_detaching, terminate_connection, detach; plus unreserve, roll_detaching and the
//! admin's force_detach), on the same transition table and the same flows as the attachments
//! API. There is no second set of rules: a legacy attach is an attachment row like any other.
//!
//! - `os-reserve` reserves an attachment (`Event::Reserve`) marked `legacy`, since the legacy
//!   calls name no attachment: later calls find their pending reservation by that mark.
//! - `os-initialize_connection` gives that reservation the connector and connects it
//!   (`Event::Connect`), so the connector is stored as for any attachment and a later detach by
//!   either API revokes its access (Cinder stores nothing and leaks the export when flows mix).
//!   Called again for a connector that already has an attachment (clients do this to detach), it
//!   replays the driver's idempotent calls and changes no state. Called with no reservation, it
//!   reserves one itself, so access is never granted without a row that can revoke it.
//! - `os-attach` completes the connected reservation (`Event::Complete`) and records the
//!   instance, host and mountpoint.
//! - `os-begin_detaching` / `os-roll_detaching` set and release the volume's `detaching` lock
//!   (`Event::BeginDetaching`, `Event::RollDetaching`).
//! - `os-terminate_connection` revokes a connector's access (`Event::Remove` for a reservation
//!   that never completed, which is Cinder's "terminate, then unreserve"); a completed attachment
//!   keeps its row, without connector, until `os-detach` removes it.
//! - `os-force_detach` revokes access on the backend first, and changes the database only when
//!   that succeeded.
//!
//! Every call that reaches a driver is an operation of `ops.rs`, as in the attachments API.

use serde_json::Value as Json;

use super::attachments::NewAttachment;
use super::connect::flatten;
use super::disconnect::disconnect;
use super::history::Change;
use super::list::Scope;
use super::model::{AfterDisconnect, AttachMode, Attachment, Connector, Live, OpKind};
use super::ops::{ChangesBy, Subject};
use super::state::{AttachStatus, Event, transition};
use super::{
    AttachError, Caller, Service, attachment_not_found, conclude, names, record_fields, volume_not_found,
};
use crate::domain::history::Access;
use crate::failpoint;
use crate::runtime::Call;
use crate::runtime::contract::Attachment as DriverAttachment;
use crate::store::attachments as rows;
use crate::store::volumes;

/// `os-attach`'s request.
#[derive(Debug, Clone)]
pub struct LegacyAttach {
    pub instance_uuid: Option<String>,
    pub host_name: Option<String>,
    pub mountpoint: String,
    pub mode: AttachMode,
}

/// A volume's live attachments with their stored connectors, oldest first.
struct Volume {
    live: Vec<Live>,
}

impl Volume {
    fn matching<'a>(&'a self, c: &'a Connector) -> impl Iterator<Item = &'a Attachment> + 'a {
        self.live
            .iter()
            .filter(|l| l.connector.as_ref().is_some_and(|s| s.same_connection(c)))
            .map(|l| &l.attachment)
    }

    fn connected(&self) -> impl Iterator<Item = &Attachment> {
        self.live.iter().filter(|l| l.connector.is_some()).map(|l| &l.attachment)
    }

    fn connector_of(&self, id: &str) -> Option<&Connector> {
        self.live.iter().find(|l| l.attachment.id == id).and_then(|l| l.connector.as_ref())
    }

    /// The others, as the driver sees them.
    fn except(&self, ids: &[&str]) -> Vec<DriverAttachment> {
        self.live.iter().filter(|l| !ids.contains(&l.attachment.id.as_str())).map(Live::contract).collect()
    }
}

/// A legacy reservation that `os-attach` has not completed (or whose removal failed and may be
/// retried).
fn is_pending(a: &Attachment) -> bool {
    a.legacy && a.status != AttachStatus::Attached
}

/// The legacy six-call flows, over the service's shared core.
pub struct Legacy<'a>(&'a Service);

impl Service {
    /// Legacy: the flows of `legacy.rs`.
    pub fn legacy(&self) -> Legacy<'_> {
        Legacy(self)
    }
}

impl std::ops::Deref for Legacy<'_> {
    type Target = Service;

    fn deref(&self) -> &Service {
        self.0
    }
}

impl Legacy<'_> {
    async fn legacy_volume(&self, volume_id: &str) -> Result<Volume, AttachError> {
        Ok(Volume { live: self.store.read(async |tx| rows::live(tx, volume_id).await).await? })
    }

    /// The volume's row and its live attachments, read together: what a flow hands the driver,
    /// and the volume its operation begins on (`Subject::AsRead`).
    async fn volume_with_live(&self, volume_id: &str) -> Result<(super::model::Volume, Volume), AttachError> {
        self.store
            .read(async |tx| {
                Ok::<_, AttachError>((
                    volumes::get(tx, volume_id, Scope::All)
                        .await?
                        .ok_or_else(|| volume_not_found(volume_id))?,
                    Volume { live: rows::live(tx, volume_id).await? },
                ))
            })
            .await
    }

    /// `os-reserve`.
    pub(super) async fn reserve(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        let request = NewAttachment { volume_id: volume_id.to_string(), legacy: true, ..Default::default() };
        self.attachments().create(caller, request).await.map(drop)
    }

    /// `os-unreserve`: removes the newest pending legacy reservation, revoking any access it was
    /// given. Nothing to do is not an error.
    pub(super) async fn unreserve(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        self.volume(caller, volume_id).await?;
        let _held = self.hold(volume_id).await?;
        let volume = self.legacy_volume(volume_id).await?;
        let Some(pending) = volume.live.iter().rev().find(|l| is_pending(&l.attachment)) else {
            return Ok(());
        };
        self.attachments()
            .remove_locked(caller, &pending.attachment.id, AfterDisconnect::Remove)
            .await
            .map(drop)
    }

    /// `os-initialize_connection`: Cinder's flattened connection info of the connector's
    /// attachment (see the module's notes).
    pub(super) async fn initialize(
        &self,
        caller: &Caller,
        volume_id: &str,
        connector: Connector,
    ) -> Result<Json, AttachError> {
        let found = self.volume(caller, volume_id).await?;
        let validated = self.validated(&found, &AttachMode::Null.driver_connector(&connector)).await?;
        let _held = self.hold(volume_id).await?;
        self.reconcile().reconciled_first(volume_id).await?;
        let volume = self.legacy_volume(volume_id).await?;
        if let Some(row) = volume.matching(&connector).next() {
            return self.reinitialize(row, &connector).await;
        }
        let reserved = volume
            .live
            .iter()
            .find(|l| is_pending(&l.attachment) && l.connector.is_none())
            .map(|l| l.attachment.id.clone());
        let row = match reserved {
            Some(id) => {
                self.attachments().update_locked(caller, volume_id, &id, connector, validated).await?
            }
            None => {
                let request = NewAttachment {
                    volume_id: volume_id.to_string(),
                    connector: Some(connector),
                    legacy: true,
                    ..Default::default()
                };
                self.attachments().create_locked(&found, request, validated).await?
            }
        };
        connection_info(&row)
    }

    /// Replays `create-export` and `initialize-connection` for an attachment that has its
    /// connection already: both are idempotent by contract, so this changes no state and returns
    /// the same answer. The caller holds the volume's lock.
    async fn reinitialize(&self, row: &Attachment, connector: &Connector) -> Result<Json, AttachError> {
        let volume = self.fresh_volume(&row.volume_id).await?;
        let backend = self.backend(&volume)?;
        let op = self
            .begin_operation(
                OpKind::Reconnect,
                Subject::AsRead(&volume),
                Some(&row.id),
                Some(connector),
                ChangesBy::Driver,
            )
            .await?;
        failpoint::hit("legacy.reinitialize.intent").await;
        let mut calls = op.calls(&backend.driver).for_owner(&volume.project_id);
        let conn = row.driver_connector(connector);
        let mut fields = volume.fields.clone();
        let replayed = async {
            match calls.create_export(&volume.contract(), Some(&conn)).await {
                Ok(update) => backend.driver.apply(Call::CreateExport, &mut fields, &update)?,
                Err(e) if e.is_unsupported() => {}
                Err(e) => return Err(e),
            }
            let connection =
                calls.initialize_connection(&volume.with_fields(&fields).contract(), &conn).await?;
            backend.driver.apply(Call::InitializeConnection, &mut fields, &connection.update)?;
            flatten(&calls, &connection.info, &row.id, &conn, &self.additions(&volume, &backend))
        }
        .await;
        failpoint::hit("legacy.reinitialize.commit").await;
        op.write(async |tx| {
            if replayed.is_ok() {
                record_fields(tx, &volume, &fields).await?;
            }
            op.finish_with(tx, &volume.backend, &calls).await
        })
        .await?;
        Ok(replayed?)
    }

    /// `os-attach`: completes the connected legacy reservation (the one whose connector names
    /// `host_name`, else the oldest). Repeating it for an instance or host that is attached
    /// changes nothing.
    pub(super) async fn attach(
        &self,
        caller: &Caller,
        volume_id: &str,
        req: LegacyAttach,
    ) -> Result<(), AttachError> {
        let found = self.volume(caller, volume_id).await?;
        let _held = self.hold(volume_id).await?;
        let volume = self.legacy_volume(volume_id).await?;
        let connected: Vec<&Attachment> = volume
            .live
            .iter()
            .filter(|l| {
                l.attachment.legacy && l.attachment.status == AttachStatus::Attaching && l.connector.is_some()
            })
            .map(|l| &l.attachment)
            .collect();
        let host_of = |a: &Attachment| volume.connector_of(&a.id).and_then(Connector::host);
        let chosen = connected
            .iter()
            .find(|a| req.host_name.is_some() && host_of(a) == req.host_name.as_deref())
            .or(connected.first());
        let Some(row) = chosen else {
            let done = volume.live.iter().any(|l| {
                let a = &l.attachment;
                a.status == AttachStatus::Attached
                    && ((req.instance_uuid.is_some() && a.instance_uuid == req.instance_uuid)
                        || (req.host_name.is_some() && a.attached_host == req.host_name))
            });
            if done {
                return Ok(());
            }
            let step = if volume.live.iter().any(|l| is_pending(&l.attachment)) {
                "call os-initialize_connection before os-attach"
            } else {
                "call os-reserve and os-initialize_connection first"
            };
            return Err(AttachError::InvalidVolume(format!(
                "volume {volume_id} has no connected reservation to attach: {step}"
            )));
        };
        let t = transition(Event::Complete);
        let id = row.id.clone();
        self.store
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, volume_id, t, None).await? else {
                    return Err(AttachError::InvalidVolume(format!(
                        "volume {volume_id} is {}; it can be attached only when it is {}",
                        found.status,
                        names(t.volume_from(found.multiattach))
                    )));
                };
                if rows::transition(tx, &id, t, None).await?.is_none() {
                    return Err(attachment_not_found(&id));
                }
                rows::set_attached_details(
                    tx,
                    &id,
                    req.instance_uuid.as_deref(),
                    req.host_name.as_deref(),
                    &req.mountpoint,
                    req.mode,
                )
                .await?;
                conclude(tx, &locked, t).await?;
                let written =
                    rows::get(tx, &id, Scope::All).await?.ok_or_else(|| attachment_not_found(&id))?;
                self.record(tx, &locked, Change::of(t.event, Access::None, &written)).await?;
                Ok(())
            })
            .await
    }

    /// `os-begin_detaching`: an `in-use` volume becomes `detaching` until it is detached or the
    /// detach is rolled back.
    pub(super) async fn begin_detaching(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        let volume = self.volume(caller, volume_id).await?;
        let t = transition(Event::BeginDetaching);
        self.store
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, volume_id, t, None).await? else {
                    return Err(AttachError::InvalidVolume(format!(
                        "Unable to detach volume. Volume status must be {} to begin detaching, but it is {}.",
                        names(t.volume_from(volume.multiattach)),
                        volume.status
                    )));
                };
                conclude(tx, &locked, t).await?;
                Ok(())
            })
            .await
    }

    /// `os-roll_detaching`: releases the `detaching` lock. Nothing to do is not an error.
    pub(super) async fn roll_detaching(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        self.volume(caller, volume_id).await?;
        let t = transition(Event::RollDetaching);
        self.store
            .write(async |tx| {
                if let Some(locked) = volumes::lock(tx, volume_id, t, None).await? {
                    conclude(tx, &locked, t).await?;
                }
                Ok(())
            })
            .await
    }

    /// `os-terminate_connection`: revokes the connector's access. A reservation that never
    /// completed is removed; a completed attachment keeps its row, without its connector, for
    /// `os-detach`. With no connector, the volume's one connection (several need an admin, or a
    /// connector, or `os-detach` with an attachment id). An unknown connector is not an error: the
    /// driver is still asked to revoke whatever access it may have.
    pub(super) async fn terminate(
        &self,
        caller: &Caller,
        volume_id: &str,
        connector: Option<Connector>,
    ) -> Result<(), AttachError> {
        self.volume(caller, volume_id).await?;
        let _held = self.hold(volume_id).await?;
        let (read, volume) = self.volume_with_live(volume_id).await?;
        let targets: Vec<(String, bool)> = match &connector {
            Some(c) => volume.matching(c).map(|a| (a.id.clone(), is_pending(a))).collect(),
            None => volume.connected().map(|a| (a.id.clone(), is_pending(a))).collect(),
        };
        if connector.is_none() && targets.len() > 1 && !caller.is_admin() {
            return Err(AttachError::Conflict(format!(
                "volume {volume_id} has {} connections: name the connector, or detach one attachment by its id",
                targets.len()
            )));
        }
        if targets.is_empty() {
            return match connector {
                Some(c) => self.revoke(&read, &c, &volume.except(&[]), None).await,
                None => Ok(()),
            };
        }
        // Reservations that never completed go the way of any attachment removal; completed
        // attachments keep their row.
        for (id, pending) in targets {
            let then = if pending { AfterDisconnect::Remove } else { AfterDisconnect::Terminate };
            self.attachments().remove_locked(caller, &id, then).await?;
        }
        Ok(())
    }

    /// Revokes a connector that no connected attachment holds (the driver may still grant it
    /// access); the caller holds the volume's lock. Recorded in the history as `revoke`, on
    /// `holder` (an attachment in error that had the connector) when there is one.
    ///
    /// `volume` and `others` are as the caller read them together: the operation begins only on
    /// the volume as read (`Subject::AsRead`).
    pub(super) async fn revoke(
        &self,
        volume: &super::model::Volume,
        connector: &Connector,
        others: &[DriverAttachment],
        holder: Option<&Attachment>,
    ) -> Result<(), AttachError> {
        let backend = self.backend(volume)?;
        let op = self
            .begin_operation(
                OpKind::Revoke,
                Subject::AsRead(volume),
                None,
                Some(connector),
                ChangesBy::Driver,
            )
            .await?;
        failpoint::hit("attach.revoke.intent").await;
        let mut calls = op.calls(&backend.driver);
        let conn = AttachMode::Null.driver_connector(connector);
        let revoked = disconnect(&mut calls, volume, others, Some(&conn)).await;
        failpoint::hit("attach.revoke.commit").await;
        op.write(async |tx| {
            if let Ok(fields) = &revoked {
                record_fields(tx, volume, fields).await?;
                let change = Change {
                    event: Event::Revoke,
                    access: Access::Revoked,
                    attachment: holder,
                    connector: Some(connector),
                    outcome: Some("revoked"),
                };
                self.record(tx, volume, change).await?;
            }
            op.finish_with(tx, &volume.backend, &calls).await
        })
        .await?;
        revoked.map(drop)
    }

    /// `os-detach`: removes the attachment (the volume's only one when no id is given), revoking
    /// its access if `os-terminate_connection` did not, and releases the `detaching` lock.
    pub(super) async fn detach(
        &self,
        caller: &Caller,
        volume_id: &str,
        attachment_id: Option<&str>,
    ) -> Result<(), AttachError> {
        self.volume(caller, volume_id).await?;
        let _held = self.hold(volume_id).await?;
        let volume = self.legacy_volume(volume_id).await?;
        let id = match attachment_id {
            Some(id) => match volume.live.iter().find(|l| l.attachment.id == id) {
                Some(l) => l.attachment.id.clone(),
                None => {
                    return Err(AttachError::InvalidAttachment(format!(
                        "Detach volume failed: attachment {id} is not a live attachment of volume {volume_id}."
                    )));
                }
            },
            None => match volume.live.as_slice() {
                [] => {
                    let t = transition(Event::RollDetaching);
                    return self
                        .store
                        .write(async |tx| {
                            if let Some(locked) = volumes::lock(tx, volume_id, t, None).await? {
                                conclude(tx, &locked, t).await?;
                            }
                            Ok(())
                        })
                        .await;
                }
                [only] => only.attachment.id.clone(),
                _ => {
                    return Err(AttachError::Conflict(format!(
                        "Detach volume failed: More than one attachment, but no attachment_id provided \
                         (volume {volume_id})."
                    )));
                }
            },
        };
        self.attachments().remove_locked(caller, &id, AfterDisconnect::Detach).await.map(drop)
    }

    /// `os-force_detach` (admins): revokes access on the backend (the attachment's, the
    /// connector's, or, with neither, all of the volume's), then removes the attachments
    /// concerned. A backend failure changes nothing in the database.
    pub(super) async fn force_detach(
        &self,
        caller: &Caller,
        volume_id: &str,
        connector: Option<Connector>,
        attachment_id: Option<&str>,
    ) -> Result<(), AttachError> {
        self.fresh_volume(volume_id).await?;
        let _held = self.hold(volume_id).await?;
        let (volume, live) = self.volume_with_live(volume_id).await?;
        let targets: Vec<&Attachment> = match (attachment_id, &connector) {
            (Some(id), _) => match live.live.iter().find(|l| l.attachment.id == id) {
                Some(l) => vec![&l.attachment],
                None => return Err(attachment_not_found(id)),
            },
            (None, Some(c)) => live.matching(c).collect(),
            (None, None) => live.live.iter().map(|l| &l.attachment).collect(),
        };
        let ids: Vec<String> = targets.iter().map(|a| a.id.clone()).collect();
        let given = match (attachment_id, &connector) {
            (_, Some(c)) => Some(c.clone()),
            (Some(id), None) => live.connector_of(id).cloned(),
            (None, None) => None,
        };
        // Nothing to revoke for a reservation without a connector, unless the call is "all".
        let revoke = given.is_some() || (attachment_id.is_none() && connector.is_none());
        let backend = self.backend(&volume)?;
        let op = self
            .begin_operation(
                OpKind::ForceDetach { attachments: ids.clone() },
                Subject::AsRead(&volume),
                ids.first().map(String::as_str),
                given.as_ref(),
                ChangesBy::Driver,
            )
            .await?;
        failpoint::hit("legacy.force-detach.intent").await;
        let mut calls = op.calls(&backend.driver);
        let mut fields = volume.fields.clone();
        if revoke {
            let conn = given.as_ref().map(|c| AttachMode::Null.driver_connector(c));
            let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            match disconnect(&mut calls, &volume, &live.except(&id_refs), conn.as_ref()).await {
                Ok(f) => fields = f,
                Err(error) => {
                    let ended = op.write(async |tx| op.finish_with(tx, &volume.backend, &calls).await).await;
                    if let Err(e) = ended {
                        tracing::error!(volume = %volume_id, "could not end a failed force-detach: {e}");
                    }
                    return Err(error);
                }
            }
        }
        failpoint::hit("legacy.force-detach.commit").await;
        finish_force_detach(&op, &volume, &ids, &fields, &calls).await?;
        tracing::info!(volume = %volume_id, attachments = ?ids, admin = %caller.user_id, "force-detached");
        Ok(())
    }
}

/// The transaction that ends a force detach: the attachments are removed.
pub(super) async fn finish_force_detach(
    op: &super::ops::Op<'_>,
    volume: &super::model::Volume,
    ids: &[String],
    fields: &crate::runtime::model::VolumeFields,
    calls: &crate::runtime::DriverCalls<'_>,
) -> Result<(), AttachError> {
    let t = transition(Event::ForceDetach);
    op.write(async |tx| {
        if let Some(locked) = volumes::lock(tx, &volume.id, t, Some((&volume.fields, fields))).await? {
            let id_refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            let mut connectors = rows::connectors(tx, &id_refs).await?;
            let mut removed = Vec::new();
            for id in ids {
                let before = rows::get(tx, id, Scope::All).await?;
                if rows::remove(tx, id, t).await? {
                    removed.extend(before);
                }
            }
            rows::promote_migration(tx, &volume.id).await?;
            conclude(tx, &locked, t).await?;
            for a in &removed {
                let connector = connectors.remove(&a.id);
                let access = if connector.is_some() { Access::Revoked } else { Access::None };
                let change = Change {
                    connector: connector.as_ref(),
                    outcome: Some("detached"),
                    ..Change::of(t.event, access, a)
                };
                op.service().record(tx, &locked, change).await?;
            }
        }
        op.finish_with(tx, &volume.backend, calls).await
    })
    .await
}

/// The flattened connection info a connect stored on the attachment.
fn connection_info(row: &Attachment) -> Result<Json, AttachError> {
    row.connection_info.clone().ok_or_else(|| {
        AttachError::InvalidAttachment(format!("attachment {} has no connection information", row.id))
    })
}

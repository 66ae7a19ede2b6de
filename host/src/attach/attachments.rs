//! Attachment flows: reserve, connect, complete, remove, show with shared connections. As the
//! seeds describe them (the Ocata attach API), on the operations of `ops.rs`:
//!
//! - **Reserve** (create without connector): one transaction; no driver, no operation.
//! - **Connect** (create with connector, update, legacy initialize): under the volume's lock,
//!   the connector and the operation are written with the reservation; then `create-export` and
//!   `initialize-connection`; then one transaction records the connection and ends the
//!   operation. A failure revokes whatever may have been granted: a create's reservation goes
//!   (Cinder leaves it, LP 1907295 / Q5), an update's stays reserved without connector; when
//!   revoking fails too, the attachment is `error_attaching` and deleting it cleans up.
//! - **Complete**: one transaction.
//! - **Remove** (delete; legacy unreserve, detach, terminate): the operation is written, then
//!   `terminate-connection` and, when nothing else uses the export, `remove-export`; then one
//!   transaction removes the attachment and ends the operation. A failure leaves it
//!   `error_detaching`.

use serde_json::Value as Json;

use super::history::Change;
use super::list::{AttachmentFilter, Page, Scope};
use super::model::{AfterDisconnect, AttachMode, Attachment, ConnectOrigin, Connector, Live, OpKind, Volume};
use super::ops::Op;
use super::state::{AttachStatus, Event, Slot, is_connected, transition};
use super::{AttachError, Caller, Service, attachment_not_found, conclude, names, volume_not_found};
use crate::domain::history::Access;
use crate::failpoint;
use crate::runtime::KeptInstance;
use crate::runtime::contract::{self, Attachment as DriverAttachment};
use crate::runtime::json::connection_data_to_json;
use crate::runtime::model::VolumeFields;
use crate::runtime::{Call, CallError, DriverCalls};
use crate::store::attachments::{self as rows, Connected};
use crate::store::sql::Tx;
use crate::store::{ONE_ATTACHMENT_PER_SLOT, now_micros, targets, volumes};

/// A request to create an attachment.
#[derive(Debug, Clone, Default)]
pub struct NewAttachment {
    pub volume_id: String,
    pub instance_uuid: Option<String>,
    /// The connector; `None` reserves only.
    pub connector: Option<Connector>,
    /// `rw` or `ro` (microversion 3.54); `None` stores Cinder's literal `null`.
    pub mode: Option<contract::AccessMode>,
    /// Made by the legacy volume actions (`legacy.rs`).
    pub legacy: bool,
}

/// The attachments API's flows, over the service's shared core.
pub struct Attachments<'a>(&'a Service);

impl Service {
    /// Attachments: the flows of `attachments.rs`.
    pub fn attachments(&self) -> Attachments<'_> {
        Attachments(self)
    }
}

impl std::ops::Deref for Attachments<'_> {
    type Target = Service;

    fn deref(&self) -> &Service {
        self.0
    }
}

impl Attachments<'_> {
    pub(super) async fn create(
        &self,
        caller: &Caller,
        req: NewAttachment,
    ) -> Result<Attachment, AttachError> {
        let volume = self.volume(caller, &req.volume_id).await?;
        let Some(c) = &req.connector else {
            return self.reserve(&volume, &req, None).await;
        };
        let mode = AttachMode::from_request(req.mode).effective(Some(c));
        let validated = self.validated(&volume, &c.for_mode(mode)).await?;
        let _held = self.hold(&volume.id).await?;
        self.create_locked(caller, req, validated).await
    }

    /// A create with a connector; the caller holds the volume ([`Service::hold`]) and has
    /// validated the connector (in the instance it hands over, if it kept one).
    pub(super) async fn create_locked(
        &self,
        caller: &Caller,
        req: NewAttachment,
        validated: Option<KeptInstance>,
    ) -> Result<Attachment, AttachError> {
        let volume = self.volume(caller, &req.volume_id).await?;
        self.reconcile().reconciled_first(&volume.id).await?;
        let connector = req.connector.clone().expect("a create that connects has a connector");
        let id = uuid::Uuid::new_v4().to_string();
        let op = self
            .operation(
                OpKind::Connect { origin: ConnectOrigin::Create, revoke: None },
                &volume.id,
                Some(&id),
                Some(&connector),
            )
            .handed(validated);
        let row = self.reserve(&volume, &req, Some((&id, &op))).await?;
        failpoint::hit("attach.create.intent");
        self.connect(&op, row, &connector, ConnectOrigin::Create, Vec::new()).await
    }

    /// Reserves a new attachment (`Event::Reserve`, or `ReserveForMigration` for a second
    /// attachment of a non-multiattach volume's instance). With a connector, the same
    /// transaction stores it and begins the connect's operation.
    async fn reserve(
        &self,
        volume: &Volume,
        req: &NewAttachment,
        connect: Option<(&str, &Op<'_>)>,
    ) -> Result<Attachment, AttachError> {
        let now = now_micros();
        let row = Attachment {
            id: connect.map(|(id, _)| id.to_string()).unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            volume_id: volume.id.clone(),
            project_id: volume.project_id.clone(),
            instance_uuid: req.instance_uuid.clone(),
            attached_host: None,
            mountpoint: None,
            attach_mode: AttachMode::from_request(req.mode),
            status: AttachStatus::Reserved,
            slot: if volume.multiattach { Slot::Shared } else { Slot::Exclusive },
            connection_info: None,
            attach_time: None,
            detach_time: None,
            created_at: now,
            updated_at: now,
            legacy: req.legacy,
        };
        let reserved = self
            .store
            .write(async |tx| {
                let live = rows::count_live(tx, &volume.id).await?;
                if live >= i64::from(self.limits.max_attachments_per_volume) {
                    return Err(AttachError::TooManyAttachments {
                        volume: volume.id.clone(),
                        max: self.limits.max_attachments_per_volume,
                    });
                }
                let Some((row, locked, t)) =
                    reserve_in(tx, row.clone(), req.instance_uuid.as_deref()).await?
                else {
                    return Ok::<_, AttachError>(None);
                };
                if let Some((_, op)) = connect {
                    rows::put_connector(tx, &row.id, req.connector.as_ref()).await?;
                    op.begin(tx).await?;
                }
                conclude(tx, &locked, t).await?;
                let change =
                    Change { connector: req.connector.as_ref(), ..Change::of(t.event, Access::None, &row) };
                self.record(tx, &locked, change).await?;
                Ok(Some(row))
            })
            .await?;
        match reserved {
            Some(row) => Ok(row),
            None => Err(self.refusal(volume).await),
        }
    }

    pub(super) async fn update(
        &self,
        caller: &Caller,
        id: &str,
        connector: Connector,
    ) -> Result<Attachment, AttachError> {
        let row = self.attachment(caller, id).await?;
        let volume = self.volume(caller, &row.volume_id).await?;
        if matches!(
            volume.status,
            super::state::VolumeStatus::Error | super::state::VolumeStatus::ErrorDeleting
        ) {
            return Err(AttachError::Conflict(format!(
                "Volume attachments can not be updated if the volume is in an error state. The Volume {} \
                 currently has a status of: {}",
                volume.id, volume.status
            )));
        }
        let mode = row.attach_mode.effective(Some(&connector));
        let validated = self.validated(&volume, &connector.for_mode(mode)).await?;
        let _held = self.hold(&volume.id).await?;
        self.update_locked(caller, id, connector, validated).await
    }

    /// Gives an attachment a (validated) connector and connects it; the caller holds the volume's
    /// lock. An attachment holds access for one connector at most: a different one replaces the
    /// old, whose access is revoked first (Cinder leaves it, and the old host keeps the LUN).
    pub(super) async fn update_locked(
        &self,
        caller: &Caller,
        id: &str,
        connector: Connector,
        validated: Option<KeptInstance>,
    ) -> Result<Attachment, AttachError> {
        let row = self.attachment(caller, id).await?;
        self.reconcile().reconciled_first(&row.volume_id).await?;
        let (row, stored) = self
            .store
            .read(async |tx| {
                let row = rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id))?;
                let stored = rows::connectors(tx, &[id]).await?.remove(id);
                Ok::<_, AttachError>((row, stored))
            })
            .await?;
        // OSSA-2023-003, for moves: a new connector on an instance's connected attachment takes
        // the instance's host off the volume and gives another host access behind the compute
        // service's back. The same connector again (a replay) moves nothing.
        if let (Some(instance), Some(old)) = (&row.instance_uuid, &stored)
            && old.json() != connector.json()
            && is_connected(row.status)
            && !(caller.is_service || caller.is_admin())
        {
            return Err(AttachError::InstanceMoving(instance.clone()));
        }
        let t = transition(Event::Connect);
        if !t.allows_attachment(row.status) {
            return Err(AttachError::InvalidAttachment(format!(
                "attachment {id} is {}; it can be updated only when it is {}",
                row.status,
                names(t.attachment_from())
            )));
        }
        // An attachment completed without a connection (a shelved-offloaded server) gets one now;
        // undone, it is left as it was.
        let origin = if row.status == AttachStatus::Attached && stored.is_none() {
            ConnectOrigin::UpdateUnconnected
        } else {
            ConnectOrigin::Update
        };
        let replaced = stored.filter(|old| old.json() != connector.json());
        let op = self
            .operation(
                OpKind::Connect { origin, revoke: replaced.as_ref().map(|c| c.json().clone()) },
                &row.volume_id,
                Some(id),
                Some(&connector),
            )
            .handed(validated);
        let refresh = transition(Event::Refresh);
        self.store
            .write(async |tx| {
                // The volume row first, as every write does (an `os-complete` that looks for a
                // connector waits for this one).
                volumes::lock(tx, &row.volume_id, refresh, None).await?;
                rows::put_connector(tx, id, Some(&connector)).await?;
                op.begin(tx).await
            })
            .await?;
        failpoint::hit("attach.update.intent");
        self.connect(&op, row, &connector, origin, replaced.into_iter().collect()).await
    }

    /// Refuses, before any driver call, a connection that needs a new LUN (the volume has none
    /// in the backend's target service) while the service is at its ceiling on this machine:
    /// the host and tgtd are never pushed past what they can hold.
    async fn admit_export(
        &self,
        backend: &super::catalog::Backend,
        volume: &Volume,
    ) -> Result<(), AttachError> {
        let Some(service) = backend.driver.target_service() else { return Ok(()) };
        let Err(why) = service.admit_lun() else { return Ok(()) };
        let recorded = self.store.read(async |tx| targets::of_volume(tx, &volume.id).await).await?;
        if recorded.iter().any(|t| service.holds_luns(&t.iqn)) {
            return Ok(());
        }
        Err(AttachError::ExportCeiling { backend: backend.name.clone(), why })
    }

    /// Connects an attachment whose connector and operation are recorded: revokes the connectors
    /// it replaces (`revoke`), exports, initializes, and records the connection. The caller holds
    /// the volume's lock.
    pub(super) async fn connect(
        &self,
        op: &Op<'_>,
        row: Attachment,
        connector: &Connector,
        origin: ConnectOrigin,
        revoke: Vec<Connector>,
    ) -> Result<Attachment, AttachError> {
        let volume = self.fresh_volume(&row.volume_id).await?;
        let backend = self.backend(&volume)?;
        let mut calls = op.calls(&backend.driver);
        let mode = row.attach_mode.effective(Some(connector));
        let conn = connector.for_mode(mode);
        let mut fields = volume.fields.clone();
        let connected = async {
            self.admit_export(&backend, &volume).await?;
            if !revoke.is_empty() {
                let others = self.other_attachments(&volume.id, &row.id).await?;
                for old in &revoke {
                    let old = old.for_mode(row.attach_mode.effective(Some(old)));
                    fields =
                        disconnect(&mut calls, &volume.with_fields(&fields), &others, Some(&old)).await?;
                }
            }
            match calls.create_export(&volume.with_fields(&fields).contract(), Some(&conn)).await {
                Ok(update) => backend.driver.apply(Call::CreateExport, &mut fields, &update)?,
                Err(e) if e.is_unsupported() => {}
                Err(e) => return Err(e.into()),
            }
            failpoint::hit("attach.connect.create-export");
            let connection =
                calls.initialize_connection(&volume.with_fields(&fields).contract(), &conn).await?;
            backend.driver.apply(Call::InitializeConnection, &mut fields, &connection.update)?;
            failpoint::hit("attach.connect.initialize-connection");
            let info = flatten(&calls, &connection.info, &row.id, &conn)?;
            if backend.uses_targets {
                self.verify_export(&calls, &info, &conn).await?;
            }
            Ok::<_, AttachError>(info)
        }
        .await;
        let info = match connected {
            Ok(info) => info,
            Err(error) => {
                let mut all = vec![connector.clone()];
                all.extend(revoke);
                return Err(self.undo_connect(op, calls, &volume, fields, &row, all, origin, error).await);
            }
        };

        let t = transition(Event::Connect);
        let done = Connected {
            connection_info: info,
            attach_mode: mode.into(),
            attached_host: connector.host().map(str::to_string),
            mountpoint: Some(connector.mountpoint().unwrap_or("na").to_string()),
        };
        failpoint::hit("attach.connect.commit");
        // One transaction, all or nothing: the merged driver fields commit only with the
        // connection, and only while the operation is still this process's (`Op::write`).
        let finished = op
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, &volume.id, t, Some((&volume.fields, &fields))).await?
                else {
                    return Err(AttachError::InvalidVolume(format!(
                        "volume {} changed state during the attach",
                        volume.id
                    )));
                };
                let Some(written) = rows::transition(tx, &row.id, t, Some(&done)).await? else {
                    return Err(attachment_not_found(&row.id));
                };
                conclude(tx, &locked, t).await?;
                for old in &revoke {
                    let change = Change {
                        connector: Some(old),
                        outcome: Some("replaced"),
                        ..Change::of(t.event, Access::Revoked, &written)
                    };
                    self.record(tx, &locked, change).await?;
                }
                let change =
                    Change { connector: Some(connector), ..Change::of(t.event, Access::Granted, &written) };
                self.record(tx, &locked, change).await?;
                op.finish_with(tx, &volume.backend, &calls).await?;
                Ok(written)
            })
            .await;
        match finished {
            Ok(written) => Ok(written),
            Err(error) => {
                let revoke = vec![connector.clone()];
                Err(self.undo_connect(op, calls, &volume, fields, &row, revoke, origin, error).await)
            }
        }
    }

    /// Checks, on the target service itself, that the export a connection names is complete
    /// before the connection is acknowledged: the target exists with a LUN, and admits the
    /// connector's initiator. A driver that answered success without it fails the call (an
    /// invalid result, 502), and the connect is undone.
    async fn verify_export(
        &self,
        calls: &DriverCalls<'_>,
        info: &Json,
        conn: &contract::Connector,
    ) -> Result<(), AttachError> {
        let (Some(targets), Some(iqn), Some(initiator)) =
            (&self.targets, info.get("target_iqn").and_then(Json::as_str), conn.initiator.as_deref())
        else {
            return Ok(());
        };
        let name = crate::capabilities::iscsi::Iqn::parse(iqn).map_err(|e| {
            calls.driver().invalid(Call::InitializeConnection, format!("target_iqn {iqn:?}: {e}"))
        })?;
        let state = targets.show(&name).await.map_err(|e| {
            AttachError::Unavailable(format!("cannot verify the export of target {iqn}: {e}"))
        })?;
        let missing = match state {
            None => Some("does not exist".to_string()),
            Some(t) if t.luns.is_empty() => Some("has no LUN".to_string()),
            Some(t) if !t.initiators.iter().any(|i| i == initiator) => {
                Some(format!("does not admit initiator {initiator}"))
            }
            Some(_) => None,
        };
        match missing {
            Some(what) => Err(calls
                .driver()
                .invalid(Call::InitializeConnection, format!("the export is incomplete: target {iqn} {what}"))
                .into()),
            None => Ok(()),
        }
    }

    /// After a failed connect: revokes whatever access may have been granted (every connector in
    /// `revoke`), then rolls the attachment back (`Remove` for a create, `UndoConnect` for an
    /// update), or marks it `error_attaching` when revoking failed; ends the operation. Returns
    /// `error`. Also what recovery does with an interrupted connect. `volume` is as the operation
    /// read it; `fields`, its driver fields as the connect left them.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn undo_connect(
        &self,
        op: &Op<'_>,
        mut calls: DriverCalls<'_>,
        volume: &Volume,
        mut fields: VolumeFields,
        row: &Attachment,
        revoke: Vec<Connector>,
        origin: ConnectOrigin,
        error: AttachError,
    ) -> AttachError {
        let cleaned: Result<(), AttachError> = async {
            let others = self.other_attachments(&volume.id, &row.id).await?;
            for c in &revoke {
                let conn = c.for_mode(row.attach_mode.effective(Some(c)));
                fields = disconnect(&mut calls, &volume.with_fields(&fields), &others, Some(&conn)).await?;
            }
            Ok(())
        }
        .await;
        let event = match (&cleaned, origin) {
            (Ok(()), ConnectOrigin::Create) => Event::Remove,
            (Ok(()), ConnectOrigin::Update) => Event::UndoConnect,
            (Ok(()), ConnectOrigin::UpdateUnconnected) => Event::UndoConnectUnconnected,
            (Err(_), _) => Event::FailAttach,
        };
        let t = transition(event);
        let recorded: Result<(), AttachError> = op
            .write(async |tx| {
                let change = cleaned.is_ok().then_some((&volume.fields, &fields));
                let locked = volumes::lock(tx, &volume.id, t, change).await?;
                match (locked, event) {
                    (Some(locked), Event::Remove) => {
                        rows::remove(tx, &row.id, t).await?;
                        rows::promote_migration(tx, &volume.id).await?;
                        conclude(tx, &locked, t).await?;
                        self.record_undone(tx, &locked, event, row, &revoke, cleaned.is_ok()).await?;
                    }
                    (Some(locked), _) => {
                        if matches!(event, Event::UndoConnect | Event::UndoConnectUnconnected) {
                            rows::put_connector(tx, &row.id, None).await?;
                        }
                        rows::transition(tx, &row.id, t, None).await?;
                        conclude(tx, &locked, t).await?;
                        self.record_undone(tx, &locked, event, row, &revoke, cleaned.is_ok()).await?;
                    }
                    // The attachment or volume is gone already: nothing to roll back.
                    (None, _) => {}
                }
                op.finish_with(tx, &volume.backend, &calls).await
            })
            .await;
        if let Err(e) = recorded {
            tracing::error!(attachment = %row.id, "could not record the outcome of a failed attach: {e}");
        }
        if let Err(e) = &cleaned {
            tracing::warn!(attachment = %row.id, "attach failed and revoking its access failed too ({e}); the attachment is error_attaching");
        }
        error
    }

    /// Records a connect that failed: its connection was never handed over. When the cleanup
    /// revoked every connector it was given (the new one, and those it replaced), each is
    /// recorded as revoked: the connector may have held access before (a connect replayed with
    /// the connector an attachment already had, or a replaced one), and has none now. When the
    /// cleanup failed, what each holds is unknown: the attachment is `error_attaching`, and the
    /// history keeps what it said before.
    async fn record_undone(
        &self,
        tx: &mut Tx,
        locked: &Volume,
        event: Event,
        row: &Attachment,
        revoke: &[Connector],
        revoked: bool,
    ) -> Result<(), AttachError> {
        let access = if revoked { Access::Revoked } else { Access::None };
        for connector in revoke {
            let change = Change {
                connector: Some(connector),
                outcome: Some("failed"),
                ..Change::of(event, access, row)
            };
            self.record(tx, locked, change).await?;
        }
        Ok(())
    }

    /// The volume's live attachments other than `except`, as the driver sees them.
    pub(super) async fn other_attachments(
        &self,
        volume_id: &str,
        except: &str,
    ) -> Result<Vec<DriverAttachment>, AttachError> {
        let live = self.store.read(async |tx| rows::live(tx, volume_id).await).await?;
        Ok(live.iter().filter(|l| l.attachment.id != except).map(Live::contract).collect())
    }

    /// `os-complete`: a connected attachment is attached; so is a reservation that has no
    /// connector (Nova's shelved-offloaded server, whose connector comes later with an update),
    /// without a connection. A reservation whose connect is under way has its connector already,
    /// and is refused.
    pub(super) async fn complete(&self, caller: &Caller, id: &str) -> Result<(), AttachError> {
        let t = transition(Event::Complete);
        self.store
            .write(async |tx| {
                let row = rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id))?;
                let Some(locked) = volumes::lock(tx, &row.volume_id, t, None).await? else {
                    let volume = volumes::get(tx, &row.volume_id, Scope::All)
                        .await?
                        .ok_or_else(|| volume_not_found(&row.volume_id))?;
                    return Err(AttachError::InvalidVolume(format!(
                        "volume {} is {}; attachments complete only when it is {}",
                        volume.id,
                        volume.status,
                        names(t.volume_from(volume.multiattach))
                    )));
                };
                // Read again under the volume's lock: a connect stores its connector first.
                let row = rows::get(tx, id, Scope::All).await?.ok_or_else(|| attachment_not_found(id))?;
                let unconnected = row.status == AttachStatus::Reserved
                    && !rows::connectors(tx, &[id]).await?.contains_key(id);
                let t = if unconnected { transition(Event::CompleteUnconnected) } else { t };
                let Some(written) = rows::transition(tx, id, t, None).await? else {
                    return Err(AttachError::InvalidAttachment(format!(
                        "attachment {id} is {}; only a connected attachment ({}), or a reservation without \
                         connector, can be completed",
                        if row.status == AttachStatus::Reserved {
                            "reserved and being connected".to_string()
                        } else {
                            row.status.to_string()
                        },
                        names(t.attachment_from())
                    )));
                };
                conclude(tx, &locked, t).await?;
                self.record(tx, &locked, Change::of(t.event, Access::None, &written)).await?;
                Ok(())
            })
            .await
    }

    /// Removes an attachment: revokes its connector's access (and the export, when unused), then
    /// deletes it. Returns the volume's remaining live attachments. As Cinder's
    /// `attachment_delete`, the volume's status is derived afresh from what remains: a detach lock
    /// (`os-begin_detaching`, which Nova sends before this delete) goes with it, so a multiattach
    /// volume that other attachments keep is `in-use` again.
    pub(super) async fn delete(&self, caller: &Caller, id: &str) -> Result<Vec<Attachment>, AttachError> {
        let row = self.attachment(caller, id).await?;
        let _held = self.hold(&row.volume_id).await?;
        self.remove_locked(caller, id, AfterDisconnect::Detach).await
    }

    /// Revokes an attachment's access and then removes it (`Remove`, `Detach`) or keeps it
    /// without connector (`Terminate`); the caller holds the volume's lock. Returns the volume's
    /// remaining live attachments.
    pub(crate) async fn remove_locked(
        &self,
        caller: &Caller,
        id: &str,
        then: AfterDisconnect,
    ) -> Result<Vec<Attachment>, AttachError> {
        let row = self.attachment(caller, id).await?;
        let (volume, live) = self
            .store
            .read(async |tx| {
                let volume = volumes::get(tx, &row.volume_id, Scope::All)
                    .await?
                    .ok_or_else(|| volume_not_found(&row.volume_id))?;
                let live = rows::live(tx, &volume.id).await?;
                Ok::<_, AttachError>((volume, live))
            })
            .await?;
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
        let op = self.operation(OpKind::Disconnect { then }, &volume.id, Some(id), Some(&connector));
        self.store.write(async |tx| op.begin(tx).await).await?;
        failpoint::hit("attach.remove.intent");
        let backend = self.backend(&volume)?;
        let mut calls = op.calls(&backend.driver);
        let conn = connector.for_mode(this.attachment.attach_mode.effective(Some(&connector)));
        match disconnect(&mut calls, &volume, &others, Some(&conn)).await {
            Ok(fields) => {
                failpoint::hit("attach.remove.commit");
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
                }
                op.finish_with(tx, &volume.backend, calls).await
            })
            .await;
        if let Err(e) = recorded {
            tracing::error!(volume = %volume.id, "could not record the outcome of a failed detach: {e}");
        }
    }

    /// An attachment with the ids of the volume's other live attachments that share its
    /// connection, per the driver's shared-connection query (all of them if the driver fails: the
    /// safe answer).
    pub async fn show(&self, caller: &Caller, id: &str) -> Result<(Attachment, Vec<String>), AttachError> {
        let row = self.attachment(caller, id).await?;
        let live = self.store.read(async |tx| rows::live(tx, &row.volume_id).await).await?;
        let Some(connector) = live.iter().find(|l| l.attachment.id == id).and_then(|l| l.connector.clone())
        else {
            return Ok((row, Vec::new()));
        };
        let others: Vec<DriverAttachment> = live
            .iter()
            .filter(|l| l.attachment.id != id && l.connector.is_some())
            .map(Live::contract)
            .collect();
        if others.is_empty() {
            return Ok((row, Vec::new()));
        }
        let volume = self.fresh_volume(&row.volume_id).await?;
        let conn = connector.for_mode(row.attach_mode.effective(Some(&connector)));
        let ids: Vec<String> = others.iter().map(|a| a.id.clone()).collect();
        let shared = match self
            .driver(&volume)
            .await?
            .calls()
            .shared_connections(&volume.contract(), &conn, &others)
            .await
        {
            Ok(answer) => answer.into_iter().filter(|i| ids.contains(i)).collect(),
            Err(e) => {
                tracing::warn!(attachment = %id, "shared-connection query failed, answering with every attachment: {e}");
                ids
            }
        };
        Ok((row, shared))
    }

    pub async fn list(
        &self,
        scope: Scope<'_>,
        filter: &AttachmentFilter,
        page: &Page,
    ) -> Result<Vec<Attachment>, AttachError> {
        self.store
            .read(async |tx| {
                let marker = match &page.marker {
                    Some(m) => Some(rows::get(tx, m, scope).await?.ok_or_else(|| {
                        AttachError::NotFound(format!("Marker attachment {m} could not be found."))
                    })?),
                    None => None,
                };
                Ok(rows::list(tx, scope, filter, page, marker.as_ref()).await?)
            })
            .await
    }

    /// The error for a refused reserve, naming the volume's current status.
    async fn refusal(&self, volume: &Volume) -> AttachError {
        match self.fresh_volume(&volume.id).await {
            Ok(now) => reserve_refused(&now),
            Err(e) => e,
        }
    }
}

/// In a write transaction: reserves `row` on its volume when the table allows (`Reserve`; for a
/// non-multiattach volume in use, `ReserveForMigration` when the request names the instance of
/// its attachment). Returns the reservation with the locked volume and the event applied.
async fn reserve_in(
    tx: &mut Tx,
    mut row: Attachment,
    instance: Option<&str>,
) -> Result<Option<(Attachment, Volume, &'static super::state::Transition)>, AttachError> {
    let t = transition(Event::Reserve);
    if let Some(locked) = volumes::lock(tx, &row.volume_id, t, None).await? {
        return Ok(insert_reservation(tx, &row).await?.then_some((row, locked, t)));
    }
    let Some(instance) = instance else { return Ok(None) };
    let t = transition(Event::ReserveForMigration);
    let Some(locked) = volumes::lock(tx, &row.volume_id, t, None).await? else { return Ok(None) };
    let live = rows::of_volume(tx, &row.volume_id).await?;
    let same_instance =
        live.iter().any(|a| a.slot == Slot::Exclusive && a.instance_uuid.as_deref() == Some(instance));
    if !same_instance {
        return Ok(None);
    }
    row.slot = Slot::Migration;
    Ok(insert_reservation(tx, &row).await?.then_some((row, locked, t)))
}

/// Inserts a reservation; false when the backstop (one attachment per slot) refuses it.
async fn insert_reservation(tx: &mut Tx, row: &Attachment) -> Result<bool, AttachError> {
    match rows::insert(tx, row).await {
        Ok(()) => Ok(true),
        Err(e) if e.is_constraint(ONE_ATTACHMENT_PER_SLOT) => Ok(false),
        Err(e) => Err(e.into()),
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
    failpoint::hit("attach.disconnect.terminate-connection");
    if !in_use {
        match calls.remove_export(&volume.with_fields(&fields).contract()).await {
            Ok(update) => driver.apply(Call::RemoveExport, &mut fields, &update)?,
            Err(e) if e.is_unsupported() => {}
            Err(e) => return Err(e.into()),
        }
        failpoint::hit("attach.disconnect.remove-export");
    }
    Ok(fields)
}

pub(super) fn reserve_refused(volume: &Volume) -> AttachError {
    let t = transition(Event::Reserve);
    AttachError::InvalidVolume(format!(
        "Volume {} status must be {} to reserve, but the current status is {}.",
        volume.id,
        names(t.volume_from(volume.multiattach)),
        volume.status
    ))
}

impl AttachMode {
    /// The mode a create asked for (`None`: Cinder's `null`).
    pub fn from_request(mode: Option<contract::AccessMode>) -> AttachMode {
        mode.map(AttachMode::from).unwrap_or(AttachMode::Null)
    }
}

/// Cinder's flattened `connection_info`: the driver's data at the top level, plus
/// `driver_volume_type`, `attachment_id`, `enforce_multipath`, and the keys Cinder's volume
/// manager adds when the driver did not (`qos_specs`, `access_mode`, `encrypted`, `cacheable`).
/// Unlike Cinder (Q7), `access_mode` follows the attachment's mode.
pub(super) fn flatten(
    calls: &DriverCalls<'_>,
    info: &contract::ConnectionInfo,
    attachment_id: &str,
    conn: &contract::Connector,
) -> Result<Json, CallError> {
    let mut data = connection_data_to_json(info)
        .map_err(|message| calls.driver().invalid(Call::InitializeConnection, message))?;
    data.entry("qos_specs").or_insert(Json::Null);
    data.insert("access_mode".into(), Json::String(conn.mode.as_str().into()));
    data.entry("encrypted").or_insert(Json::Bool(false));
    data.entry("cacheable").or_insert(Json::Bool(false));
    data.insert("driver_volume_type".into(), Json::String(info.driver_volume_type.clone()));
    data.insert("attachment_id".into(), Json::String(attachment_id.to_string()));
    data.insert("enforce_multipath".into(), Json::Bool(conn.enforce_multipath));
    Ok(Json::Object(data))
}

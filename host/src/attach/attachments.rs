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
//!
//! Here the entry points and the reservation; the connect half is in `connect.rs`, the
//! disconnect half in `disconnect.rs`.

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
use crate::store::attachments as rows;
use crate::store::sql::Tx;
use crate::store::{ONE_ATTACHMENT_PER_SLOT, now_micros, volumes};

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
            return Ok(self.reserve(&volume, &req, None).await?.0);
        };
        let validated =
            self.validated(&volume, &AttachMode::from_request(req.mode).driver_connector(c)).await?;
        let _held = self.hold(&volume.id).await?;
        self.create_locked(&volume, req, validated).await
    }

    /// A create with a connector; the caller holds the volume ([`Service::hold`]) and has
    /// validated the connector (in the instance it hands over, if it kept one). `volume` is the
    /// caller's read of it, made before the lock: only what never changes of a volume (its id,
    /// project and multiattach) is taken from it; the reservation locks the row as it is now.
    pub(super) async fn create_locked(
        &self,
        volume: &Volume,
        req: NewAttachment,
        validated: Option<KeptInstance>,
    ) -> Result<Attachment, AttachError> {
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
        let (row, volume) = self.reserve(volume, &req, Some((&id, &op))).await?;
        failpoint::hit("attach.create.intent").await;
        self.connect(&op, volume, row, &connector, ConnectOrigin::Create, Vec::new()).await
    }

    /// Reserves a new attachment (`Event::Reserve`, or `ReserveForMigration` for a second
    /// attachment of a non-multiattach volume's instance). With a connector, the same
    /// transaction stores it and begins the connect's operation. Returns the reservation and its
    /// volume as the reservation left it.
    async fn reserve(
        &self,
        volume: &Volume,
        req: &NewAttachment,
        connect: Option<(&str, &Op<'_>)>,
    ) -> Result<(Attachment, Volume), AttachError> {
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
        let reserve = async |tx: &mut Tx| {
            let live = rows::count_live(tx, &volume.id).await?;
            if live >= i64::from(self.limits.max_attachments_per_volume) {
                return Err(AttachError::TooManyAttachments {
                    volume: volume.id.clone(),
                    max: self.limits.max_attachments_per_volume,
                });
            }
            let Some((row, locked, t)) = reserve_in(tx, row.clone(), req.instance_uuid.as_deref()).await?
            else {
                return Ok::<_, AttachError>(None);
            };
            if let Some((_, op)) = connect {
                rows::put_connector(tx, &row.id, req.connector.as_ref()).await?;
                op.begin(tx).await?;
            }
            let concluded = conclude(tx, &locked, t).await?;
            let change =
                Change { connector: req.connector.as_ref(), ..Change::of(t.event, Access::None, &row) };
            self.record(tx, &locked, change).await?;
            Ok(Some((row, concluded)))
        };
        // With a connect, the reservation is its operation's intent; alone, it is the answer.
        let reserved = match connect {
            Some((_, op)) => op.write_intent(reserve).await?,
            None => self.store.write(reserve).await?,
        };
        match reserved {
            Some(reservation) => Ok(reservation),
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
        let validated = self.validated(&volume, &row.driver_connector(&connector)).await?;
        let _held = self.hold(&volume.id).await?;
        self.update_locked(caller, &volume.id, id, connector, validated).await
    }

    /// Gives an attachment of volume `volume_id` a (validated) connector and connects it; the
    /// caller holds the volume's lock. An attachment holds access for one connector at most: a
    /// different one replaces the old, whose access is revoked first (Cinder leaves it, and the
    /// old host keeps the LUN).
    pub(super) async fn update_locked(
        &self,
        caller: &Caller,
        volume_id: &str,
        id: &str,
        connector: Connector,
        validated: Option<KeptInstance>,
    ) -> Result<Attachment, AttachError> {
        self.reconcile().reconciled_first(volume_id).await?;
        let (row, stored) = self
            .store
            .read(async |tx| {
                let row = rows::get(tx, id, caller.scope())
                    .await?
                    .filter(|row| row.volume_id == volume_id)
                    .ok_or_else(|| attachment_not_found(id))?;
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
        let locked = op
            .write_intent(async |tx| {
                // The volume row first, as every write does (an `os-complete` that looks for a
                // connector waits for this one).
                let locked = volumes::lock(tx, &row.volume_id, refresh, None).await?;
                rows::put_connector(tx, id, Some(&connector)).await?;
                op.begin(tx).await?;
                Ok::<_, AttachError>(locked)
            })
            .await?;
        failpoint::hit("attach.update.intent").await;
        let volume = match locked {
            Some(volume) => volume,
            None => self.fresh_volume(&row.volume_id).await?,
        };
        self.connect(&op, volume, row, &connector, origin, replaced.into_iter().collect()).await
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
        let conn = row.driver_connector(&connector);
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

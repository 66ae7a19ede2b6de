//! Attachment flows: reserve, connect, complete, remove, show with shared connections.
//!
//! The pattern of every flow: a conditional update derived from the transition table (which
//! records the intent, e.g. the connector, before any driver call), the driver calls under the
//! volume's lock, then one transaction that persists the driver's model update and the final
//! state. A driver failure is undone when it can be (the reservation of a failed create is rolled
//! back, Cinder's LP 1907295 / Q5); when it cannot, the attachment is left in `error_attaching` or
//! `error_detaching` with its connector stored, so deleting it later cleans up.

use serde_json::{Map, Value as Json};

use super::state::{AttachStatus, Event, VolumeStatus, settle, transition};
use super::{
    AttachError, Caller, Service, access_mode, apply_update, attach_status, attachment_not_found, connector,
    contract_attachment, contract_volume, volume_not_found, volume_status, with_fields,
};
use crate::runtime::contract::{AccessMode, Attachment, Connector};
use crate::runtime::json::connection_data_to_json;
use crate::runtime::{Call, CallError, CallErrorKind, Driver};
use crate::store::attachments::{self as rows, AttachmentFilter, AttachmentRow, Connected};
use crate::store::volumes::{self, DriverFields, VolumeRow};
use crate::store::{Page, Scope, Tx, now_micros};

/// A request to create an attachment.
#[derive(Debug, Clone, Default)]
pub struct NewAttachment {
    pub volume_id: String,
    pub instance_uuid: Option<String>,
    /// The connector; `None` or an empty object reserves only.
    pub connector: Option<Map<String, Json>>,
    /// `rw` or `ro` (microversion 3.54); `None` stores Cinder's literal `null`.
    pub mode: Option<String>,
}

/// Why `connect` runs: it decides what a failure undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A create with a connector: a failure rolls the reservation back.
    Create,
    /// An update: a failure leaves the attachment reserved without a connector.
    Update,
}

impl Service {
    pub async fn create_attachment(
        &self,
        caller: &Caller,
        req: NewAttachment,
    ) -> Result<AttachmentRow, AttachError> {
        let volume = self.volume(caller, &req.volume_id).await?;
        if volume.status.contains("error") {
            return Err(reserve_refused(&volume));
        }
        let connector_json = req.connector.filter(|c| !c.is_empty());
        if let Some(json) = &connector_json {
            // Checked before anything is reserved: a bad connector changes nothing.
            let mode = access_mode(req.mode.as_deref(), Some(json));
            self.driver(&volume)?.validate_connector(&connector(json, mode)?).await?;
        }
        let now = now_micros();
        let row = AttachmentRow {
            id: uuid::Uuid::new_v4().to_string(),
            volume_id: volume.id.clone(),
            project_id: volume.project_id.clone(),
            instance_uuid: req.instance_uuid,
            attached_host: None,
            mountpoint: None,
            attach_mode: Some(req.mode.unwrap_or_else(|| "null".into())),
            attach_status: AttachStatus::Reserved.as_str().into(),
            exclusive: !volume.multiattach,
            connection_info: None,
            attach_time: None,
            detach_time: None,
            created_at: now,
            updated_at: now,
        };

        let mut tx = self.store().begin().await?;
        let t = transition(Event::Reserve);
        let Some(locked) =
            volumes::lock(&mut tx, &volume.id, &t.volume_from_text(volume.multiattach)).await?
        else {
            drop(tx);
            return Err(self.refusal(caller, &volume.id).await);
        };
        match rows::insert(&mut tx, &row).await {
            Ok(()) => {}
            Err(crate::store::StoreError::Constraint(_)) => {
                drop(tx);
                return Err(self.refusal(caller, &volume.id).await);
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(json) = &connector_json {
            rows::put_connector(&mut tx, &row.id, json).await?;
        }
        settle_volume(&mut tx, &locked, true).await?;
        tx.commit().await?;

        let Some(json) = connector_json else { return Ok(row) };
        let _guard = self.locks.lock(&volume.id).await;
        self.connect(&row.id, &volume.id, &json, Origin::Create).await
    }

    pub async fn update_attachment(
        &self,
        caller: &Caller,
        id: &str,
        connector_json: Map<String, Json>,
    ) -> Result<AttachmentRow, AttachError> {
        let row = rows::get(self.store().reader(), id, caller.scope())
            .await?
            .ok_or_else(|| attachment_not_found(id))?;
        let volume = self.volume(caller, &row.volume_id).await?;
        if volume.status.contains("error") {
            return Err(AttachError::Conflict(format!(
                "Volume attachments can not be updated if the volume is in an error state. The Volume {} \
                 currently has a status of: {}",
                volume.id, volume.status
            )));
        }
        let mode = access_mode(row.attach_mode.as_deref(), Some(&connector_json));
        let new = connector(&connector_json, mode)?;
        let driver = self.driver(&volume)?;
        driver.validate_connector(&new).await?;

        let _guard = self.locks.lock(&volume.id).await;
        let row = rows::get(self.store().reader(), id, caller.scope())
            .await?
            .ok_or_else(|| attachment_not_found(id))?;
        let status = attach_status(&row)?;
        if !transition(Event::Connect).attachment_from.contains(&status) {
            return Err(AttachError::InvalidAttachment(format!(
                "attachment {id} is {status}; it can be updated only when {}",
                names(transition(Event::Connect).attachment_from)
            )));
        }
        // An attachment holds access for one connector at most: a different one replaces the old,
        // whose access is revoked first (Cinder leaves it, and the old host keeps the LUN).
        let stored = rows::connectors(self.store().reader(), &[id]).await?.remove(id);
        if let Some(old) = stored.as_ref().filter(|old| **old != connector_json) {
            let volume = self.fresh_volume(&volume.id).await?;
            let old_connector = super::connector(old, access_mode(row.attach_mode.as_deref(), Some(old)))?;
            let fields = self.disconnect(driver, &volume, id, Some(&old_connector)).await?;
            let mut tx = self.store().begin().await?;
            volumes::set_driver_fields(&mut tx, &volume.id, &fields).await?;
            tx.commit().await?;
        }
        let mut tx = self.store().begin().await?;
        rows::put_connector(&mut tx, id, &connector_json).await?;
        tx.commit().await?;
        self.connect(id, &volume.id, &connector_json, Origin::Update).await
    }

    /// Connects an attachment whose connector is stored: export, initialize, persist. The caller
    /// holds the volume's lock.
    async fn connect(
        &self,
        id: &str,
        volume_id: &str,
        connector_json: &Map<String, Json>,
        origin: Origin,
    ) -> Result<AttachmentRow, AttachError> {
        let volume = self.fresh_volume(volume_id).await?;
        let row = rows::get(self.store().reader(), id, Scope::All)
            .await?
            .ok_or_else(|| attachment_not_found(id))?;
        let driver = self.driver(&volume)?;
        let mode = access_mode(row.attach_mode.as_deref(), Some(connector_json));
        let conn = connector(connector_json, mode)?;

        let mut fields = volume.driver_fields();
        let connected = async {
            let update = driver.create_export(&contract_volume(&volume), Some(&conn)).await;
            match update {
                Ok(update) => apply_update(driver, Call::CreateExport, &mut fields, &update)?,
                Err(e) if e.is_unsupported() => {}
                Err(e) => return Err(e),
            }
            let exported = with_fields(&volume, &fields);
            let connection = driver.initialize_connection(&contract_volume(&exported), &conn).await?;
            apply_update(driver, Call::InitializeConnection, &mut fields, &connection.update)?;
            let info = flatten(driver, &connection.info, id, &conn)?;
            Ok(info)
        }
        .await;

        let info = match connected {
            Ok(info) => info,
            Err(error) => {
                return Err(self
                    .undo_connect(driver, &with_fields(&volume, &fields), &row, &conn, origin, error)
                    .await);
            }
        };
        let t = transition(Event::Connect);
        let mut tx = self.store().begin().await?;
        let Some(locked) = volumes::lock(&mut tx, volume_id, &t.volume_from_text(volume.multiattach)).await?
        else {
            drop(tx);
            let error =
                AttachError::InvalidVolume(format!("volume {volume_id} changed state during the attach"));
            return Err(self
                .undo_after(driver, &with_fields(&volume, &fields), &row, &conn, origin, error)
                .await);
        };
        let done = Connected {
            connection_info: info.to_string(),
            attach_mode: mode_text(mode),
            attached_host: conn.host.clone(),
            mountpoint: Some(conn.mountpoint.clone().unwrap_or_else(|| "na".into())),
        };
        if !rows::transition(
            &mut tx,
            id,
            &t.attachment_from_text(),
            AttachStatus::Attaching.as_str(),
            Some(&done),
        )
        .await?
        {
            drop(tx);
            let error = attachment_not_found(id);
            return Err(self
                .undo_after(driver, &with_fields(&volume, &fields), &row, &conn, origin, error)
                .await);
        }
        volumes::set_driver_fields(&mut tx, volume_id, &fields).await?;
        settle_volume(&mut tx, &locked, true).await?;
        tx.commit().await?;
        let mut row = row;
        row.attach_status = AttachStatus::Attaching.as_str().into();
        row.connection_info = Some(done.connection_info);
        row.attach_mode = Some(done.attach_mode);
        row.attached_host = done.attached_host;
        row.mountpoint = done.mountpoint;
        row.attach_time = Some(now_micros());
        Ok(row)
    }

    /// After a failed connect: revoke whatever access may have been granted, then roll the
    /// attachment back (or mark it `error_attaching` when that is not possible).
    async fn undo_connect(
        &self,
        driver: &Driver,
        volume: &VolumeRow,
        row: &AttachmentRow,
        conn: &Connector,
        origin: Origin,
        error: CallError,
    ) -> AttachError {
        self.undo_after(driver, volume, row, conn, origin, AttachError::Driver(error)).await
    }

    async fn undo_after(
        &self,
        driver: &Driver,
        volume: &VolumeRow,
        row: &AttachmentRow,
        conn: &Connector,
        origin: Origin,
        error: AttachError,
    ) -> AttachError {
        let cleaned = self.disconnect(driver, volume, &row.id, Some(conn)).await;
        let result: Result<(), AttachError> = async {
            let mut tx = self.store().begin().await?;
            let Some(locked) = volumes::lock(&mut tx, &volume.id, &[]).await? else { return Ok(()) };
            match (&cleaned, origin) {
                (Ok(fields), Origin::Create) => {
                    rows::soft_delete(&mut tx, &row.id).await?;
                    volumes::set_driver_fields(&mut tx, &volume.id, fields).await?;
                }
                (Ok(fields), Origin::Update) => {
                    rows::put_connector(&mut tx, &row.id, &Map::new()).await?;
                    let from = transition(Event::Connect).attachment_from_text();
                    rows::transition(&mut tx, &row.id, &from, AttachStatus::Reserved.as_str(), None).await?;
                    volumes::set_driver_fields(&mut tx, &volume.id, fields).await?;
                }
                (Err(_), _) => {
                    let t = transition(Event::FailAttach);
                    rows::transition(
                        &mut tx,
                        &row.id,
                        &t.attachment_from_text(),
                        AttachStatus::ErrorAttaching.as_str(),
                        None,
                    )
                    .await?;
                }
            }
            settle_volume(&mut tx, &locked, true).await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        if let Err(e) = result {
            tracing::error!(attachment = %row.id, "could not record the outcome of a failed attach: {e}");
        }
        if let Err(e) = &cleaned {
            tracing::warn!(attachment = %row.id, "attach failed and its cleanup failed too ({e}); the attachment is error_attaching");
        }
        error
    }

    /// Revokes a connector's access through the driver, and removes the export when nothing else
    /// uses it. Returns the volume's driver fields afterwards. `unsupported` answers count as
    /// "nothing to do".
    async fn disconnect(
        &self,
        driver: &Driver,
        volume: &VolumeRow,
        attachment_id: &str,
        conn: Option<&Connector>,
    ) -> Result<DriverFields, CallError> {
        let others = self.other_attachments(&volume.id, attachment_id).await.map_err(|e| CallError {
            driver: driver.backend().to_string(),
            version: driver.info().version.clone(),
            call: Call::TerminateConnection,
            kind: CallErrorKind::InvalidOutput(format!("cannot read the volume's attachments: {e}")),
        })?;
        let mut fields = volume.driver_fields();
        let in_use = match driver.terminate_connection(&contract_volume(volume), conn, &others).await {
            Ok(t) => {
                apply_update(driver, Call::TerminateConnection, &mut fields, &t.update)?;
                t.export_in_use
            }
            Err(e) if e.is_unsupported() => others.iter().any(|a| a.connector.is_some()),
            Err(e) => return Err(e),
        };
        if !in_use {
            match driver.remove_export(&contract_volume(&with_fields(volume, &fields))).await {
                Ok(update) => apply_update(driver, Call::RemoveExport, &mut fields, &update)?,
                Err(e) if e.is_unsupported() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(fields)
    }

    /// The volume's live attachments other than `except`, as the driver sees them.
    async fn other_attachments(&self, volume_id: &str, except: &str) -> Result<Vec<Attachment>, AttachError> {
        let all = rows::of_volume(self.store().reader(), volume_id).await?;
        let others: Vec<&AttachmentRow> = all.iter().filter(|r| r.id != except).collect();
        let ids: Vec<&str> = others.iter().map(|r| r.id.as_str()).collect();
        let connectors = rows::connectors(self.store().reader(), &ids).await?;
        Ok(others.iter().map(|r| contract_attachment(r, connectors.get(&r.id))).collect())
    }

    pub async fn complete_attachment(&self, caller: &Caller, id: &str) -> Result<(), AttachError> {
        let row = rows::get(self.store().reader(), id, caller.scope())
            .await?
            .ok_or_else(|| attachment_not_found(id))?;
        let volume = self.volume(caller, &row.volume_id).await?;
        let t = transition(Event::Complete);
        let mut tx = self.store().begin().await?;
        let Some(locked) =
            volumes::lock(&mut tx, &volume.id, &t.volume_from_text(volume.multiattach)).await?
        else {
            return Err(AttachError::InvalidVolume(format!(
                "volume {} is {}; attachments complete only when it is {}",
                volume.id,
                volume.status,
                names(t.volume_from(volume.multiattach))
            )));
        };
        if !rows::transition(&mut tx, id, &t.attachment_from_text(), AttachStatus::Attached.as_str(), None)
            .await?
        {
            drop(tx);
            let now = rows::get(self.store().reader(), id, caller.scope())
                .await?
                .ok_or_else(|| attachment_not_found(id))?;
            return Err(AttachError::InvalidAttachment(format!(
                "attachment {id} is {}; only a connected attachment ({}) can be completed",
                now.attach_status,
                names(t.attachment_from)
            )));
        }
        settle_volume(&mut tx, &locked, true).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes an attachment: revokes its connector's access (and the export, when unused), then
    /// deletes it. Returns the volume's remaining live attachments.
    pub async fn delete_attachment(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<AttachmentRow>, AttachError> {
        let row = rows::get(self.store().reader(), id, caller.scope())
            .await?
            .ok_or_else(|| attachment_not_found(id))?;
        let _guard = self.locks.lock(&row.volume_id).await;
        self.remove_locked(caller, id, false).await?;
        Ok(rows::of_volume(self.store().reader(), &row.volume_id).await?)
    }

    /// Removes an attachment; the caller holds the volume's lock. `release_detaching` ends a
    /// legacy detach lock (`os-detach`).
    pub(crate) async fn remove_locked(
        &self,
        caller: &Caller,
        id: &str,
        release_detaching: bool,
    ) -> Result<(), AttachError> {
        let row = rows::get(self.store().reader(), id, caller.scope())
            .await?
            .ok_or_else(|| attachment_not_found(id))?;
        let volume = self.fresh_volume(&row.volume_id).await?;
        let stored = rows::connectors(self.store().reader(), &[id]).await?.remove(id);
        let fields = match &stored {
            Some(json) if !json.is_empty() => {
                let driver = self.driver(&volume)?;
                let conn = connector(json, access_mode(row.attach_mode.as_deref(), Some(json)))?;
                match self.disconnect(driver, &volume, id, Some(&conn)).await {
                    Ok(fields) => fields,
                    Err(error) => {
                        self.mark(&volume, id, Event::FailDetach, AttachStatus::ErrorDetaching).await?;
                        return Err(AttachError::Driver(error));
                    }
                }
            }
            // Only reserved: nothing was exported for it.
            _ => volume.driver_fields(),
        };
        let t = transition(Event::Remove);
        let mut tx = self.store().begin().await?;
        let Some(locked) =
            volumes::lock(&mut tx, &volume.id, &t.volume_from_text(volume.multiattach)).await?
        else {
            return Err(AttachError::InvalidVolume(format!(
                "volume {} is {}; attachments can be removed only when it is {}",
                volume.id,
                volume.status,
                names(t.volume_from(volume.multiattach))
            )));
        };
        if !rows::soft_delete(&mut tx, id).await? {
            return Err(attachment_not_found(id));
        }
        volumes::set_driver_fields(&mut tx, &volume.id, &fields).await?;
        settle_volume(&mut tx, &locked, !release_detaching).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Moves an attachment to an error status after a driver failure.
    async fn mark(
        &self,
        volume: &VolumeRow,
        id: &str,
        event: Event,
        to: AttachStatus,
    ) -> Result<(), AttachError> {
        let mut tx = self.store().begin().await?;
        let Some(locked) = volumes::lock(&mut tx, &volume.id, &[]).await? else { return Ok(()) };
        rows::transition(&mut tx, id, &transition(event).attachment_from_text(), to.as_str(), None).await?;
        settle_volume(&mut tx, &locked, true).await?;
        tx.commit().await?;
        Ok(())
    }

    /// An attachment with the ids of the volume's other live attachments that share its
    /// connection, per the driver's shared-connection query (all of them if the driver fails: the
    /// safe answer).
    pub async fn show_attachment(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(AttachmentRow, Vec<String>), AttachError> {
        let row = rows::get(self.store().reader(), id, caller.scope())
            .await?
            .ok_or_else(|| attachment_not_found(id))?;
        let stored =
            rows::connectors(self.store().reader(), &[id]).await?.remove(id).filter(|c| !c.is_empty());
        let Some(json) = stored else { return Ok((row, Vec::new())) };
        let volume = self.fresh_volume(&row.volume_id).await?;
        let others: Vec<Attachment> = self
            .other_attachments(&volume.id, id)
            .await?
            .into_iter()
            .filter(|a| a.connector.is_some())
            .collect();
        if others.is_empty() {
            return Ok((row, Vec::new()));
        }
        let conn = connector(&json, access_mode(row.attach_mode.as_deref(), Some(&json)))?;
        let ids: Vec<String> = others.iter().map(|a| a.id.clone()).collect();
        let shared = match self
            .driver(&volume)?
            .shared_connections(&contract_volume(&volume), &conn, &others)
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

    pub async fn list_attachments(
        &self,
        scope: Scope<'_>,
        filter: &AttachmentFilter,
        page: &Page,
    ) -> Result<Vec<AttachmentRow>, AttachError> {
        let marker = match &page.marker {
            Some(m) => Some(rows::get(self.store().reader(), m, scope).await?.ok_or_else(|| {
                AttachError::NotFound(format!("Marker attachment {m} could not be found."))
            })?),
            None => None,
        };
        Ok(rows::list(self.store().reader(), scope, filter, page, marker.as_ref()).await?)
    }

    /// The live volume as stored now (after any earlier driver call persisted its update).
    pub(crate) async fn fresh_volume(&self, id: &str) -> Result<VolumeRow, AttachError> {
        volumes::get(self.store().reader(), id, Scope::All).await?.ok_or_else(|| volume_not_found(id))
    }

    /// The error for a refused reserve, naming the volume's current status.
    async fn refusal(&self, caller: &Caller, volume_id: &str) -> AttachError {
        match self.volume(caller, volume_id).await {
            Ok(volume) => reserve_refused(&volume),
            Err(e) => e,
        }
    }
}

fn reserve_refused(volume: &VolumeRow) -> AttachError {
    let t = transition(Event::Reserve);
    AttachError::InvalidVolume(format!(
        "Volume {} status must be {} to reserve, but the current status is {}.",
        volume.id,
        names(t.volume_from(volume.multiattach)),
        volume.status
    ))
}

fn names<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(" or ")
}

pub(crate) fn mode_text(mode: AccessMode) -> String {
    mode.as_str().to_string()
}

/// Derives and writes the volume's status from its live attachments. The volume is locked.
/// `keep_detaching` keeps a legacy detach lock in place.
pub(crate) async fn settle_volume(
    tx: &mut Tx,
    locked: &VolumeRow,
    keep_detaching: bool,
) -> Result<(), AttachError> {
    let live = rows::of_volume(&mut **tx, &locked.id).await?;
    let statuses: Vec<AttachStatus> = live.iter().map(attach_status).collect::<Result<_, _>>()?;
    let detaching = keep_detaching && volume_status(locked)? == VolumeStatus::Detaching;
    let (status, attach) = settle(&statuses, detaching);
    volumes::set_status(tx, &locked.id, status.as_str(), attach.as_str()).await?;
    Ok(())
}

/// Cinder's flattened `connection_info`: the driver's data at the top level, plus
/// `driver_volume_type`, `attachment_id`, `enforce_multipath`, and the keys Cinder's volume
/// manager adds when the driver did not (`qos_specs`, `access_mode`, `encrypted`, `cacheable`).
/// Unlike Cinder (Q7), `access_mode` follows the attachment's mode.
fn flatten(
    driver: &Driver,
    info: &crate::runtime::contract::ConnectionInfo,
    attachment_id: &str,
    conn: &Connector,
) -> Result<Json, CallError> {
    let mut data = connection_data_to_json(info).map_err(|message| CallError {
        driver: driver.backend().to_string(),
        version: driver.info().version.clone(),
        call: Call::InitializeConnection,
        kind: CallErrorKind::InvalidOutput(message),
    })?;
    data.entry("qos_specs").or_insert(Json::Null);
    data.insert("access_mode".into(), Json::String(conn.mode.as_str().into()));
    data.entry("encrypted").or_insert(Json::Bool(false));
    data.entry("cacheable").or_insert(Json::Bool(false));
    data.insert("driver_volume_type".into(), Json::String(info.driver_volume_type.clone()));
    data.insert("attachment_id".into(), Json::String(attachment_id.to_string()));
    data.insert("enforce_multipath".into(), Json::Bool(conn.enforce_multipath));
    Ok(Json::Object(data))
}

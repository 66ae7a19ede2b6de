//! Attachment flows: reserve, connect, complete, remove, show with shared connections.
//!
//! The pattern of every flow: a conditional update derived from the transition table (which
//! records the intent, e.g. the connector, before any driver call), the driver calls under the
//! volume's lock, then one transaction that persists the driver's model update and the final
//! state. A driver failure is undone when it can be (the reservation of a failed create is rolled
//! back, Cinder's LP 1907295 / Q5); when it cannot, the attachment is left in `error_attaching` or
//! `error_detaching` with its connector stored, so deleting it later cleans up.

use serde_json::{Map, Value as Json};

use super::state::{AttachStatus, Event, VolumeStatus, as_seen, settle, transition};
use super::{
    AttachError, Caller, Service, access_mode, apply_update, attach_status, attachment_not_found, connector,
    contract_attachment, contract_volume, volume_not_found, volume_status, with_fields,
};
use crate::runtime::contract::{Attachment, Connector};
use crate::runtime::json::connection_data_to_json;
use crate::runtime::{Call, CallError, CallErrorKind, Driver};
use crate::store::attachments::{self as rows, AttachmentFilter, AttachmentRow, Connected};
use crate::store::sql::Tx;
use crate::store::volumes::{self, DriverFields, VolumeRow};
use crate::store::{Page, Scope, StoreError, now_micros};

/// A request to create an attachment.
#[derive(Debug, Clone, Default)]
pub struct NewAttachment {
    pub volume_id: String,
    pub instance_uuid: Option<String>,
    /// The connector; `None` or an empty object reserves only.
    pub connector: Option<Map<String, Json>>,
    /// `rw` or `ro` (microversion 3.54); `None` stores Cinder's literal `null`.
    pub mode: Option<String>,
    /// Made by the legacy volume actions (`legacy.rs`).
    pub legacy: bool,
}

/// Why `connect` runs: it decides what a failure undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
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
            legacy: req.legacy,
        };

        let t = transition(Event::Reserve);
        let reserved = self
            .store()
            .write(async |tx| {
                let from = t.volume_from_text(volume.multiattach);
                let Some(locked) = volumes::lock(tx, &volume.id, &from, None).await? else {
                    return Ok(false);
                };
                match rows::insert(tx, &row).await {
                    Ok(()) => {}
                    // The backstop: another attachment won the race.
                    Err(StoreError::Constraint(_)) => return Ok(false),
                    Err(e) => return Err(AttachError::from(e)),
                }
                if let Some(json) = &connector_json {
                    rows::put_connector(tx, &row.id, json).await?;
                }
                settle_volume(tx, &locked, true).await?;
                Ok(true)
            })
            .await?;
        if !reserved {
            return Err(self.refusal(caller, &volume.id).await);
        }

        let Some(json) = connector_json else { return Ok(row) };
        let _guard = self.locks.lock(&volume.id).await;
        self.connect(row, &json, Origin::Create).await
    }

    pub async fn update_attachment(
        &self,
        caller: &Caller,
        id: &str,
        connector_json: Map<String, Json>,
    ) -> Result<AttachmentRow, AttachError> {
        let row = self.attachment(caller, id).await?;
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
        self.driver(&volume)?.validate_connector(&new).await?;

        let _guard = self.locks.lock(&volume.id).await;
        self.update_locked(caller, id, connector_json).await
    }

    /// Gives an attachment a (validated) connector and connects it; the caller holds the volume's
    /// lock.
    pub(super) async fn update_locked(
        &self,
        caller: &Caller,
        id: &str,
        connector_json: Map<String, Json>,
    ) -> Result<AttachmentRow, AttachError> {
        let (row, stored) = self
            .store()
            .read(async |tx| {
                let row = rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id))?;
                let stored = rows::connectors(tx, &[id]).await?.remove(id);
                Ok::<_, AttachError>((row, stored))
            })
            .await?;
        let status = attach_status(&row)?;
        if !transition(Event::Connect).attachment_from.contains(&status) {
            return Err(AttachError::InvalidAttachment(format!(
                "attachment {id} is {status}; it can be updated only when {}",
                names(transition(Event::Connect).attachment_from)
            )));
        }
        // An attachment holds access for one connector at most: a different one replaces the old,
        // whose access is revoked first (Cinder leaves it, and the old host keeps the LUN).
        let volume = self.fresh_volume(&row.volume_id).await?;
        let driver = self.driver(&volume)?;
        let fields = match stored.as_ref().filter(|old| **old != connector_json) {
            Some(old) => {
                let old_connector = connector(old, access_mode(row.attach_mode.as_deref(), Some(old)))?;
                let others = self.other_attachments(&volume.id, id).await?;
                Some(self.disconnect(driver, &volume, &others, Some(&old_connector)).await?)
            }
            None => None,
        };
        self.store()
            .write(async |tx| {
                if let Some(fields) = &fields {
                    volumes::lock(tx, &volume.id, &[], Some(fields)).await?;
                }
                rows::put_connector(tx, id, &connector_json).await
            })
            .await?;
        self.connect(row, &connector_json, Origin::Update).await
    }

    /// Connects an attachment whose connector is stored: export, initialize, persist. The caller
    /// holds the volume's lock.
    pub(super) async fn connect(
        &self,
        row: AttachmentRow,
        connector_json: &Map<String, Json>,
        origin: Origin,
    ) -> Result<AttachmentRow, AttachError> {
        let volume = self.fresh_volume(&row.volume_id).await?;
        let driver = self.driver(&volume)?;
        let mode = access_mode(row.attach_mode.as_deref(), Some(connector_json));
        let conn = connector(connector_json, mode)?;

        let mut fields = volume.driver_fields();
        let connected = async {
            match driver.create_export(&contract_volume(&volume), Some(&conn)).await {
                Ok(update) => apply_update(driver, Call::CreateExport, &mut fields, &update)?,
                Err(e) if e.is_unsupported() => {}
                Err(e) => return Err(e),
            }
            let exported = with_fields(&volume, &fields);
            let connection = driver.initialize_connection(&contract_volume(&exported), &conn).await?;
            apply_update(driver, Call::InitializeConnection, &mut fields, &connection.update)?;
            flatten(driver, &connection.info, &row.id, &conn)
        }
        .await;
        let info = match connected {
            Ok(info) => info,
            Err(error) => {
                let volume = with_fields(&volume, &fields);
                return Err(self
                    .undo(driver, &volume, &row, &conn, origin, AttachError::Driver(error))
                    .await);
            }
        };

        let t = transition(Event::Connect);
        let done = Connected {
            connection_info: info.to_string(),
            attach_mode: mode.as_str().to_string(),
            attached_host: conn.host.clone(),
            mountpoint: Some(conn.mountpoint.clone().unwrap_or_else(|| "na".into())),
        };
        let finished = self
            .store()
            .write(async |tx| {
                let from = t.volume_from_text(volume.multiattach);
                let Some(locked) = volumes::lock(tx, &volume.id, &from, Some(&fields)).await? else {
                    let changed = format!("volume {} changed state during the attach", volume.id);
                    return Ok(Err(AttachError::InvalidVolume(changed)));
                };
                let to = AttachStatus::Attaching.as_str();
                if !rows::transition(tx, &row.id, &t.attachment_from_text(), to, Some(&done)).await? {
                    return Ok(Err(attachment_not_found(&row.id)));
                }
                settle_volume(tx, &locked, true).await?;
                Ok::<_, AttachError>(Ok(()))
            })
            .await?;
        if let Err(error) = finished {
            return Err(self.undo(driver, &with_fields(&volume, &fields), &row, &conn, origin, error).await);
        }
        Ok(AttachmentRow {
            attach_status: AttachStatus::Attaching.as_str().into(),
            connection_info: Some(done.connection_info),
            attach_mode: Some(done.attach_mode),
            attached_host: done.attached_host,
            mountpoint: done.mountpoint,
            attach_time: Some(now_micros()),
            ..row
        })
    }

    /// After a failed connect: revoke whatever access may have been granted, then roll the
    /// attachment back (or mark it `error_attaching` when that is not possible). Returns `error`.
    async fn undo(
        &self,
        driver: &Driver,
        volume: &VolumeRow,
        row: &AttachmentRow,
        conn: &Connector,
        origin: Origin,
        error: AttachError,
    ) -> AttachError {
        let cleaned = match self.other_attachments(&volume.id, &row.id).await {
            Ok(others) => {
                self.disconnect(driver, volume, &others, Some(conn)).await.map_err(AttachError::Driver)
            }
            Err(e) => Err(e),
        };
        let recorded: Result<(), AttachError> = self
            .store()
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, &volume.id, &[], cleaned.as_ref().ok()).await? else {
                    return Ok(());
                };
                match (&cleaned, origin) {
                    (Ok(_), Origin::Create) => {
                        rows::soft_delete(tx, &row.id).await?;
                    }
                    (Ok(_), Origin::Update) => {
                        rows::put_connector(tx, &row.id, &Map::new()).await?;
                        let from = transition(Event::Connect).attachment_from_text();
                        rows::transition(tx, &row.id, &from, AttachStatus::Reserved.as_str(), None).await?;
                    }
                    (Err(_), _) => {
                        let from = transition(Event::FailAttach).attachment_from_text();
                        rows::transition(tx, &row.id, &from, AttachStatus::ErrorAttaching.as_str(), None)
                            .await?;
                    }
                }
                settle_volume(tx, &locked, true).await
            })
            .await;
        if let Err(e) = recorded {
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
    pub(super) async fn disconnect(
        &self,
        driver: &Driver,
        volume: &VolumeRow,
        others: &[Attachment],
        conn: Option<&Connector>,
    ) -> Result<DriverFields, CallError> {
        let mut fields = volume.driver_fields();
        let in_use = match driver.terminate_connection(&contract_volume(volume), conn, others).await {
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
    pub(super) async fn other_attachments(
        &self,
        volume_id: &str,
        except: &str,
    ) -> Result<Vec<Attachment>, AttachError> {
        self.store()
            .read(async |tx| {
                let all = rows::of_volume(tx, volume_id).await?;
                let others: Vec<&AttachmentRow> = all.iter().filter(|r| r.id != except).collect();
                let ids: Vec<&str> = others.iter().map(|r| r.id.as_str()).collect();
                let connectors = rows::connectors(tx, &ids).await?;
                Ok(others.iter().map(|r| contract_attachment(r, connectors.get(&r.id))).collect())
            })
            .await
    }

    pub async fn complete_attachment(&self, caller: &Caller, id: &str) -> Result<(), AttachError> {
        let t = transition(Event::Complete);
        self.store()
            .write(async |tx| {
                let row = rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id))?;
                let volume = volumes::get(tx, &row.volume_id, Scope::All)
                    .await?
                    .ok_or_else(|| volume_not_found(&row.volume_id))?;
                let from = t.volume_from_text(volume.multiattach);
                let Some(locked) = volumes::lock(tx, &volume.id, &from, None).await? else {
                    return Err(AttachError::InvalidVolume(format!(
                        "volume {} is {}; attachments complete only when it is {}",
                        volume.id,
                        volume.status,
                        names(t.volume_from(volume.multiattach))
                    )));
                };
                if !rows::transition(tx, id, &t.attachment_from_text(), AttachStatus::Attached.as_str(), None)
                    .await?
                {
                    return Err(AttachError::InvalidAttachment(format!(
                        "attachment {id} is {}; only a connected attachment ({}) can be completed",
                        row.attach_status,
                        names(t.attachment_from)
                    )));
                }
                settle_volume(tx, &locked, true).await
            })
            .await
    }

    /// Removes an attachment: revokes its connector's access (and the export, when unused), then
    /// deletes it. Returns the volume's remaining live attachments.
    pub async fn delete_attachment(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<AttachmentRow>, AttachError> {
        let row = self.attachment(caller, id).await?;
        let _guard = self.locks.lock(&row.volume_id).await;
        self.remove_locked(caller, id, false).await
    }

    /// Removes an attachment; the caller holds the volume's lock. `release_detaching` ends a
    /// legacy detach lock (`os-detach`). Returns the volume's remaining live attachments.
    pub(crate) async fn remove_locked(
        &self,
        caller: &Caller,
        id: &str,
        release_detaching: bool,
    ) -> Result<Vec<AttachmentRow>, AttachError> {
        let (row, volume, mut connectors, all) = self
            .store()
            .read(async |tx| {
                let row = rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id))?;
                let volume = volumes::get(tx, &row.volume_id, Scope::All)
                    .await?
                    .ok_or_else(|| volume_not_found(&row.volume_id))?;
                let all = rows::of_volume(tx, &volume.id).await?;
                let ids: Vec<&str> = all.iter().map(|r| r.id.as_str()).collect();
                let connectors = rows::connectors(tx, &ids).await?;
                Ok::<_, AttachError>((row, volume, connectors, all))
            })
            .await?;
        let stored = connectors.remove(id);
        let others: Vec<Attachment> = all
            .iter()
            .filter(|r| r.id != id)
            .map(|r| contract_attachment(r, connectors.get(&r.id)))
            .collect();
        let fields = match &stored {
            Some(json) if !json.is_empty() => {
                let driver = self.driver(&volume)?;
                let conn = connector(json, access_mode(row.attach_mode.as_deref(), Some(json)))?;
                match self.disconnect(driver, &volume, &others, Some(&conn)).await {
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
        self.store()
            .write(async |tx| {
                let from = t.volume_from_text(volume.multiattach);
                let Some(locked) = volumes::lock(tx, &volume.id, &from, Some(&fields)).await? else {
                    return Err(AttachError::InvalidVolume(format!(
                        "volume {} is {}; attachments can be removed only when it is {}",
                        volume.id,
                        volume.status,
                        names(t.volume_from(volume.multiattach))
                    )));
                };
                if !rows::soft_delete(tx, id).await? {
                    return Err(attachment_not_found(id));
                }
                settle_volume(tx, &locked, !release_detaching).await?;
                Ok(rows::of_volume(tx, &volume.id).await?)
            })
            .await
    }

    /// Moves an attachment to an error status after a driver failure.
    async fn mark(
        &self,
        volume: &VolumeRow,
        id: &str,
        event: Event,
        to: AttachStatus,
    ) -> Result<(), AttachError> {
        self.store()
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, &volume.id, &[], None).await? else { return Ok(()) };
                rows::transition(tx, id, &transition(event).attachment_from_text(), to.as_str(), None)
                    .await?;
                settle_volume(tx, &locked, true).await
            })
            .await
    }

    /// An attachment with the ids of the volume's other live attachments that share its
    /// connection, per the driver's shared-connection query (all of them if the driver fails: the
    /// safe answer).
    pub async fn show_attachment(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(AttachmentRow, Vec<String>), AttachError> {
        let (row, stored) = self
            .store()
            .read(async |tx| {
                let row = rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id))?;
                let stored = rows::connectors(tx, &[id]).await?.remove(id).filter(|c| !c.is_empty());
                Ok::<_, AttachError>((row, stored))
            })
            .await?;
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
        self.store()
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

    /// The live volume as stored now (after any earlier driver call persisted its update).
    pub(crate) async fn fresh_volume(&self, id: &str) -> Result<VolumeRow, AttachError> {
        self.store()
            .read(async |tx| volumes::get(tx, id, Scope::All).await?.ok_or_else(|| volume_not_found(id)))
            .await
    }

    /// An attachment visible to the caller.
    pub(crate) async fn attachment(&self, caller: &Caller, id: &str) -> Result<AttachmentRow, AttachError> {
        self.store()
            .read(async |tx| rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id)))
            .await
    }

    /// The error for a refused reserve, naming the volume's current status.
    async fn refusal(&self, caller: &Caller, volume_id: &str) -> AttachError {
        match self.volume(caller, volume_id).await {
            Ok(volume) => reserve_refused(&volume),
            Err(e) => e,
        }
    }
}

pub(super) fn reserve_refused(volume: &VolumeRow) -> AttachError {
    let t = transition(Event::Reserve);
    AttachError::InvalidVolume(format!(
        "Volume {} status must be {} to reserve, but the current status is {}.",
        volume.id,
        names(t.volume_from(volume.multiattach)),
        volume.status
    ))
}

pub(super) fn names<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(" or ")
}

/// Derives and writes the volume's status from its live attachments. The volume is locked.
/// `keep_detaching` keeps a legacy detach lock in place.
pub(crate) async fn settle_volume(
    tx: &mut Tx,
    locked: &VolumeRow,
    keep_detaching: bool,
) -> Result<(), AttachError> {
    let statuses: Vec<AttachStatus> = rows::statuses(tx, &locked.id)
        .await?
        .iter()
        .map(|(s, legacy)| {
            AttachStatus::parse(s)
                .map(|s| as_seen(s, *legacy))
                .ok_or_else(|| StoreError::Corrupt(format!("attachment status {s:?}")))
        })
        .collect::<Result<_, _>>()?;
    let detaching = keep_detaching && volume_status(locked)? == VolumeStatus::Detaching;
    let (status, attach) = settle(&statuses, detaching);
    volumes::set_status(tx, &locked.id, status.as_str(), attach.as_str()).await?;
    Ok(())
}

/// Cinder's flattened `connection_info`: the driver's data at the top level, plus
/// `driver_volume_type`, `attachment_id`, `enforce_multipath`, and the keys Cinder's volume
/// manager adds when the driver did not (`qos_specs`, `access_mode`, `encrypted`, `cacheable`).
/// Unlike Cinder (Q7), `access_mode` follows the attachment's mode.
pub(super) fn flatten(
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

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

use serde_json::{Map, Value as Json};

use super::attachments::{NewAttachment, flatten, names, settle_volume};
use super::state::{AttachStatus, Event, transition};
use super::{
    AttachError, Caller, Service, access_mode, apply_update, connector, contract_attachment, contract_volume,
    with_fields,
};
use crate::runtime::Call;
use crate::runtime::contract::Attachment;
use crate::store::attachments::{self as rows, AttachmentRow};
use crate::store::volumes;

/// `os-attach`'s request.
#[derive(Debug, Clone)]
pub struct LegacyAttach {
    pub instance_uuid: Option<String>,
    pub host_name: Option<String>,
    pub mountpoint: String,
    /// `rw` or `ro`.
    pub mode: String,
}

/// A volume's live attachments with their stored connectors, oldest first.
struct Live {
    rows: Vec<(AttachmentRow, Option<Map<String, Json>>)>,
}

impl Live {
    fn matching<'a>(&'a self, json: &'a Map<String, Json>) -> impl Iterator<Item = &'a AttachmentRow> + 'a {
        self.rows.iter().filter(|(_, c)| c.as_ref().is_some_and(|c| same_connector(c, json))).map(|(r, _)| r)
    }

    fn connected(&self) -> impl Iterator<Item = &AttachmentRow> {
        self.rows.iter().filter(|(_, c)| c.is_some()).map(|(r, _)| r)
    }

    fn connector_of(&self, id: &str) -> Option<&Map<String, Json>> {
        self.rows.iter().find(|(r, _)| r.id == id).and_then(|(_, c)| c.as_ref())
    }

    /// The others, as the driver sees them.
    fn except(&self, ids: &[&str]) -> Vec<Attachment> {
        self.rows
            .iter()
            .filter(|(r, _)| !ids.contains(&r.id.as_str()))
            .map(|(r, c)| contract_attachment(r, c.as_ref()))
            .collect()
    }
}

/// Two connectors name the same connection when they agree on the host and every initiator
/// identity they carry (iSCSI initiator, NVMe host NQN, FC WWPNs).
pub fn same_connector(a: &Map<String, Json>, b: &Map<String, Json>) -> bool {
    ["host", "initiator", "nqn", "wwpns"]
        .iter()
        .all(|k| a.get(*k).filter(|v| !v.is_null()) == b.get(*k).filter(|v| !v.is_null()))
}

/// A legacy reservation that `os-attach` has not completed (or whose removal failed and may be
/// retried).
fn is_pending(row: &AttachmentRow) -> bool {
    row.legacy && row.attach_status != AttachStatus::Attached.as_str()
}

impl Service {
    async fn live(&self, volume_id: &str) -> Result<Live, AttachError> {
        self.store()
            .read(async |tx| {
                let all = rows::of_volume(tx, volume_id).await?;
                let ids: Vec<&str> = all.iter().map(|r| r.id.as_str()).collect();
                let mut connectors = rows::connectors(tx, &ids).await?;
                let rows = all
                    .into_iter()
                    .map(|r| {
                        let c = connectors.remove(&r.id).filter(|c| !c.is_empty());
                        (r, c)
                    })
                    .collect();
                Ok::<_, AttachError>(Live { rows })
            })
            .await
    }

    /// `os-reserve`.
    pub async fn legacy_reserve(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        let request = NewAttachment { volume_id: volume_id.to_string(), legacy: true, ..Default::default() };
        self.create_attachment(caller, request).await.map(drop)
    }

    /// `os-unreserve`: removes the newest pending legacy reservation, revoking any access it was
    /// given. Nothing to do is not an error.
    pub async fn legacy_unreserve(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        self.volume(caller, volume_id).await?;
        let _guard = self.locks.lock(volume_id).await;
        let live = self.live(volume_id).await?;
        let Some((row, _)) = live.rows.iter().rev().find(|(r, _)| is_pending(r)) else { return Ok(()) };
        self.remove_locked(caller, &row.id, false).await.map(drop)
    }

    /// `os-initialize_connection`: Cinder's flattened connection info of the connector's
    /// attachment (see the module's notes).
    pub async fn legacy_initialize(
        &self,
        caller: &Caller,
        volume_id: &str,
        json: Map<String, Json>,
    ) -> Result<Json, AttachError> {
        let volume = self.volume(caller, volume_id).await?;
        let conn = connector(&json, access_mode(None, Some(&json)))?;
        self.driver(&volume)?.validate_connector(&conn).await?;
        {
            let _guard = self.locks.lock(volume_id).await;
            let live = self.live(volume_id).await?;
            if let Some(row) = live.matching(&json).next() {
                return self.reinitialize(row, &json).await;
            }
            let reserved =
                live.rows.iter().find(|(r, c)| is_pending(r) && c.is_none()).map(|(r, _)| r.id.clone());
            if let Some(id) = reserved {
                let row = self.update_locked(caller, &id, json).await?;
                return connection_info(&row);
            }
        }
        let request = NewAttachment {
            volume_id: volume_id.to_string(),
            connector: Some(json),
            legacy: true,
            ..Default::default()
        };
        connection_info(&self.create_attachment(caller, request).await?)
    }

    /// Replays `create-export` and `initialize-connection` for an attachment that has its
    /// connection already: both are idempotent by contract, so this changes no state and returns
    /// the same answer. The caller holds the volume's lock.
    async fn reinitialize(&self, row: &AttachmentRow, json: &Map<String, Json>) -> Result<Json, AttachError> {
        let volume = self.fresh_volume(&row.volume_id).await?;
        let driver = self.driver(&volume)?;
        let conn = connector(json, access_mode(row.attach_mode.as_deref(), Some(json)))?;
        let mut fields = volume.driver_fields();
        match driver.create_export(&contract_volume(&volume), Some(&conn)).await {
            Ok(update) => apply_update(driver, Call::CreateExport, &mut fields, &update)?,
            Err(e) if e.is_unsupported() => {}
            Err(e) => return Err(e.into()),
        }
        let exported = contract_volume(&with_fields(&volume, &fields));
        let connection = driver.initialize_connection(&exported, &conn).await?;
        apply_update(driver, Call::InitializeConnection, &mut fields, &connection.update)?;
        let info = flatten(driver, &connection.info, &row.id, &conn)?;
        self.store().write(async |tx| volumes::lock(tx, &volume.id, &[], Some(&fields)).await).await?;
        Ok(info)
    }

    /// `os-attach`: completes the connected legacy reservation (the one whose connector names
    /// `host_name`, else the oldest). Repeating it for an instance or host that is attached
    /// changes nothing.
    pub async fn legacy_attach(
        &self,
        caller: &Caller,
        volume_id: &str,
        req: LegacyAttach,
    ) -> Result<(), AttachError> {
        let volume = self.volume(caller, volume_id).await?;
        let _guard = self.locks.lock(volume_id).await;
        let live = self.live(volume_id).await?;
        let connected: Vec<&AttachmentRow> = live
            .rows
            .iter()
            .filter(|(r, c)| r.legacy && r.attach_status == AttachStatus::Attaching.as_str() && c.is_some())
            .map(|(r, _)| r)
            .collect();
        let host_of =
            |r: &AttachmentRow| live.connector_of(&r.id).and_then(|c| c.get("host")).and_then(Json::as_str);
        let chosen = connected
            .iter()
            .find(|r| req.host_name.is_some() && host_of(r) == req.host_name.as_deref())
            .or(connected.first());
        let Some(row) = chosen else {
            let done = live.rows.iter().any(|(r, _)| {
                r.attach_status == AttachStatus::Attached.as_str()
                    && ((req.instance_uuid.is_some() && r.instance_uuid == req.instance_uuid)
                        || (req.host_name.is_some() && r.attached_host == req.host_name))
            });
            if done {
                return Ok(());
            }
            let step = if live.rows.iter().any(|(r, _)| is_pending(r)) {
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
        self.store()
            .write(async |tx| {
                let from = t.volume_from_text(volume.multiattach);
                let Some(locked) = volumes::lock(tx, volume_id, &from, None).await? else {
                    return Err(AttachError::InvalidVolume(format!(
                        "volume {volume_id} is {}; it can be attached only when it is {}",
                        volume.status,
                        names(t.volume_from(volume.multiattach))
                    )));
                };
                let to = AttachStatus::Attached.as_str();
                if !rows::transition(tx, &id, &t.attachment_from_text(), to, None).await? {
                    return Err(super::attachment_not_found(&id));
                }
                rows::set_attached_details(
                    tx,
                    &id,
                    req.instance_uuid.as_deref(),
                    req.host_name.as_deref(),
                    &req.mountpoint,
                    &req.mode,
                )
                .await?;
                settle_volume(tx, &locked, true).await
            })
            .await
    }

    /// `os-begin_detaching`: an `in-use` volume becomes `detaching` until it is detached or the
    /// detach is rolled back.
    pub async fn legacy_begin_detaching(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        let volume = self.volume(caller, volume_id).await?;
        let t = transition(Event::BeginDetaching);
        self.store()
            .write(async |tx| {
                let from = t.volume_from_text(volume.multiattach);
                if volumes::lock(tx, volume_id, &from, None).await?.is_none() {
                    return Err(AttachError::InvalidVolume(format!(
                        "Unable to detach volume. Volume status must be {} to begin detaching, but it is {}.",
                        names(t.volume_from(volume.multiattach)),
                        volume.status
                    )));
                }
                volumes::set_status(tx, volume_id, "detaching", "attached").await?;
                Ok(())
            })
            .await
    }

    /// `os-roll_detaching`: releases the `detaching` lock. Nothing to do is not an error.
    pub async fn legacy_roll_detaching(&self, caller: &Caller, volume_id: &str) -> Result<(), AttachError> {
        let volume = self.volume(caller, volume_id).await?;
        let t = transition(Event::RollDetaching);
        self.store()
            .write(async |tx| {
                match volumes::lock(tx, volume_id, &t.volume_from_text(volume.multiattach), None).await? {
                    Some(locked) => settle_volume(tx, &locked, false).await,
                    None => Ok(()),
                }
            })
            .await
    }

    /// `os-terminate_connection`: revokes the connector's access. A reservation that never
    /// completed is removed; a completed attachment keeps its row, without its connector, for
    /// `os-detach`. With no connector, the volume's one connection (several need an admin, or a
    /// connector, or `os-detach` with an attachment id). An unknown connector is not an error: the
    /// driver is still asked to revoke whatever access it may have.
    pub async fn legacy_terminate(
        &self,
        caller: &Caller,
        volume_id: &str,
        json: Option<Map<String, Json>>,
    ) -> Result<(), AttachError> {
        let volume = self.volume(caller, volume_id).await?;
        let _guard = self.locks.lock(volume_id).await;
        let targets = |live: &Live| -> Vec<String> {
            match &json {
                Some(json) => live.matching(json).map(|r| r.id.clone()).collect(),
                None => live.connected().map(|r| r.id.clone()).collect(),
            }
        };
        let mut live = self.live(volume_id).await?;
        if json.is_none() && targets(&live).len() > 1 && !caller.is_admin() {
            return Err(AttachError::Conflict(format!(
                "volume {volume_id} has {} connections: name the connector, or detach one attachment by its id",
                targets(&live).len()
            )));
        }
        // Reservations that never completed go the way of any attachment removal.
        let pending: Vec<String> = live
            .rows
            .iter()
            .filter(|(r, _)| is_pending(r) && targets(&live).contains(&r.id))
            .map(|(r, _)| r.id.clone())
            .collect();
        for id in &pending {
            self.remove_locked(caller, id, false).await?;
        }
        if !pending.is_empty() {
            live = self.live(volume_id).await?;
        }
        let completed = targets(&live);
        if completed.is_empty() && json.is_none() {
            return Ok(());
        }
        let ids: Vec<&str> = completed.iter().map(String::as_str).collect();
        let given = match (&json, ids.as_slice()) {
            (Some(json), _) => Some(json),
            (None, [one]) => live.connector_of(one),
            (None, _) => None,
        };
        let volume = self.fresh_volume(&volume.id).await?;
        let driver = self.driver(&volume)?;
        let conn = given.map(|j| connector(j, access_mode(None, Some(j)))).transpose()?;
        let fields = self.disconnect(driver, &volume, &live.except(&ids), conn.as_ref()).await?;
        self.store()
            .write(async |tx| {
                volumes::lock(tx, volume_id, &[], Some(&fields)).await?;
                for id in &ids {
                    rows::put_connector(tx, id, &Map::new()).await?;
                }
                Ok::<_, AttachError>(())
            })
            .await
    }

    /// `os-detach`: removes the attachment (the volume's only one when no id is given), revoking
    /// its access if `os-terminate_connection` did not, and releases the `detaching` lock.
    pub async fn legacy_detach(
        &self,
        caller: &Caller,
        volume_id: &str,
        attachment_id: Option<&str>,
    ) -> Result<(), AttachError> {
        let volume = self.volume(caller, volume_id).await?;
        let _guard = self.locks.lock(volume_id).await;
        let live = self.live(volume_id).await?;
        let id = match attachment_id {
            Some(id) => match live.rows.iter().find(|(r, _)| r.id == id) {
                Some((r, _)) => r.id.clone(),
                None => {
                    return Err(AttachError::InvalidAttachment(format!(
                        "Detach volume failed: attachment {id} is not a live attachment of volume {volume_id}."
                    )));
                }
            },
            None => match live.rows.as_slice() {
                [] => {
                    return self
                        .store()
                        .write(async |tx| match volumes::lock(tx, volume_id, &[], None).await? {
                            Some(locked) => settle_volume(tx, &locked, false).await,
                            None => Ok(()),
                        })
                        .await;
                }
                [(only, _)] => only.id.clone(),
                _ => {
                    return Err(AttachError::Conflict(format!(
                        "Detach volume failed: More than one attachment, but no attachment_id provided \
                         (volume {}).",
                        volume.id
                    )));
                }
            },
        };
        self.remove_locked(caller, &id, true).await.map(drop)
    }

    /// `os-force_detach` (admins): revokes access on the backend (the attachment's, the
    /// connector's, or, with neither, all of the volume's), then removes the attachments
    /// concerned. A backend failure changes nothing in the database.
    pub async fn force_detach(
        &self,
        caller: &Caller,
        volume_id: &str,
        json: Option<Map<String, Json>>,
        attachment_id: Option<&str>,
    ) -> Result<(), AttachError> {
        let volume = self.fresh_volume(volume_id).await?;
        let _guard = self.locks.lock(volume_id).await;
        let live = self.live(volume_id).await?;
        let targets: Vec<&AttachmentRow> = match (attachment_id, &json) {
            (Some(id), _) => match live.rows.iter().find(|(r, _)| r.id == id) {
                Some((r, _)) => vec![r],
                None => return Err(super::attachment_not_found(id)),
            },
            (None, Some(json)) => live.matching(json).collect(),
            (None, None) => live.rows.iter().map(|(r, _)| r).collect(),
        };
        let ids: Vec<&str> = targets.iter().map(|r| r.id.as_str()).collect();
        let given = match (attachment_id, &json) {
            (_, Some(json)) => Some(json),
            (Some(id), None) => live.connector_of(id),
            (None, None) => None,
        };
        // Nothing to revoke for a reservation without a connector, unless the call is "all".
        let revoke = given.is_some() || (attachment_id.is_none() && json.is_none());
        let mut fields = volume.driver_fields();
        if revoke {
            let driver = self.driver(&volume)?;
            let conn = given.map(|j| connector(j, access_mode(None, Some(j)))).transpose()?;
            let others = live.except(&ids);
            fields = self.disconnect(driver, &volume, &others, conn.as_ref()).await?;
        }
        self.store()
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, volume_id, &[], Some(&fields)).await? else {
                    return Ok(());
                };
                for id in &ids {
                    rows::soft_delete(tx, id).await?;
                }
                settle_volume(tx, &locked, false).await
            })
            .await?;
        tracing::info!(volume = %volume_id, attachments = ?ids, admin = %caller.user_id, "force-detached");
        Ok(())
    }
}

/// The flattened connection info a connect stored on the attachment.
fn connection_info(row: &AttachmentRow) -> Result<Json, AttachError> {
    let text = row.connection_info.as_deref().ok_or_else(|| {
        AttachError::InvalidAttachment(format!("attachment {} has no connection information", row.id))
    })?;
    serde_json::from_str(text).map_err(|e| {
        AttachError::Store(crate::store::StoreError::Corrupt(format!("connection_info of {}: {e}", row.id)))
    })
}

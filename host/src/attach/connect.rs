//! The connect half of the attachment flows (`attachments.rs` says the flows): what may be
//! exported, the driver's calls, the check of the export, and the undo of a connect that failed.

use serde_json::Value as Json;

use super::attachments::Attachments;
use super::disconnect::disconnect;
use super::history::Change;
use super::model::{Attachment, ConnectOrigin, Connector, Volume};
use super::ops::Op;
use super::state::{Event, transition};
use super::{AttachError, attachment_not_found, conclude};
use crate::domain::history::Access;
use crate::domain::messages::{Action, Detail};
use crate::failpoint;
use crate::runtime::contract;
use crate::runtime::json::connection_data_to_json;
use crate::runtime::model::VolumeFields;
use crate::runtime::{Call, CallError, DriverCalls};
use crate::store::attachments::{self as rows, Connected};
use crate::store::sql::Tx;
use crate::store::{targets, volumes};

impl Attachments<'_> {
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
    /// the volume's lock; `volume` is as the write that recorded the operation left it.
    pub(super) async fn connect(
        &self,
        op: &Op<'_>,
        volume: Volume,
        row: Attachment,
        connector: &Connector,
        origin: ConnectOrigin,
        revoke: Vec<Connector>,
    ) -> Result<Attachment, AttachError> {
        let backend = self.backend(&volume)?;
        let mut calls = op.calls(&backend.driver).for_owner(&volume.project_id);
        let conn = row.driver_connector(connector);
        let mut fields = volume.fields.clone();
        let connected = async {
            self.admit_export(&backend, &volume).await?;
            if !revoke.is_empty() {
                let others = self.other_attachments(&volume.id, &row.id).await?;
                for old in &revoke {
                    let old = row.driver_connector(old);
                    fields =
                        disconnect(&mut calls, &volume.with_fields(&fields), &others, Some(&old)).await?;
                }
            }
            match calls.create_export(&volume.with_fields(&fields).contract(), Some(&conn)).await {
                Ok(update) => backend.driver.apply(Call::CreateExport, &mut fields, &update)?,
                Err(e) if e.is_unsupported() => {}
                Err(e) => return Err(e.into()),
            }
            failpoint::hit("attach.connect.create-export").await;
            let connection =
                calls.initialize_connection(&volume.with_fields(&fields).contract(), &conn).await?;
            backend.driver.apply(Call::InitializeConnection, &mut fields, &connection.update)?;
            failpoint::hit("attach.connect.initialize-connection").await;
            let info = flatten(&calls, &connection.info, &row.id, &conn, &self.additions(&volume, &backend))?;
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
            attach_mode: conn.mode.into(),
            attached_host: connector.host().map(str::to_string),
            mountpoint: Some(connector.mountpoint().unwrap_or("na").to_string()),
        };
        failpoint::hit("attach.connect.commit").await;
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
                let conn = row.driver_connector(c);
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
                        self.tell(tx, &locked, Action::UpdateAttachment, Detail::AttachError).await?;
                    }
                    (Some(locked), _) => {
                        if matches!(event, Event::UndoConnect | Event::UndoConnectUnconnected) {
                            rows::put_connector(tx, &row.id, None).await?;
                        }
                        rows::transition(tx, &row.id, t, None).await?;
                        conclude(tx, &locked, t).await?;
                        self.record_undone(tx, &locked, event, row, &revoke, cleaned.is_ok()).await?;
                        self.tell(tx, &locked, Action::UpdateAttachment, Detail::AttachError).await?;
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
}

/// What Cinder's volume manager adds to a driver's connection (`_parse_connection_options`): from
/// the volume's type, the front-end QoS specs with their per-GB values by the volume's size
/// (`null` without) and whether the host may cache it; from the backend, whether it takes
/// discards (Cinder's `report_discard_supported`; here: its LUNs take UNMAP).
pub(super) struct Additions {
    qos_specs: Json,
    cacheable: bool,
    discard: bool,
}

impl super::Service {
    /// What the host adds to the connections of `volume` on `backend` (nothing from a type no
    /// longer configured).
    pub(super) fn additions(&self, volume: &Volume, backend: &super::Backend) -> Additions {
        let t = self.catalog.volume_type(Some(&volume.volume_type));
        Additions {
            qos_specs: t
                .and_then(super::VolumeType::front_end_qos)
                .map_or(Json::Null, |q| Json::Object(q.for_connection(volume.size_gib))),
            cacheable: t.is_some_and(super::VolumeType::cacheable),
            discard: backend.uses_targets && backend.driver.target_service().is_some_and(|s| s.unmaps()),
        }
    }
}

/// Cinder's flattened `connection_info`: the driver's data at the top level, plus
/// `driver_volume_type`, `attachment_id`, `enforce_multipath`, and what Cinder's volume manager
/// sets: `qos_specs` from the type (whatever the driver said), `cacheable` from the type unless
/// the driver said false, `discard` when the driver did not and the backend takes discards, and
/// `access_mode`, `encrypted` when the driver did not.
/// Unlike Cinder (Q7), `access_mode` follows the attachment's mode.
pub(super) fn flatten(
    calls: &DriverCalls<'_>,
    info: &contract::ConnectionInfo,
    attachment_id: &str,
    conn: &contract::Connector,
    options: &Additions,
) -> Result<Json, CallError> {
    let mut data = connection_data_to_json(info)
        .map_err(|message| calls.driver().invalid(Call::InitializeConnection, message))?;
    data.insert("qos_specs".into(), options.qos_specs.clone());
    data.insert("access_mode".into(), Json::String(conn.mode.as_str().into()));
    data.entry("encrypted").or_insert(Json::Bool(false));
    let driver_allows = data.get("cacheable").is_none_or(|v| v.is_null() || truthy(v));
    data.insert("cacheable".into(), Json::Bool(driver_allows && options.cacheable));
    if options.discard && data.get("discard").is_none_or(Json::is_null) {
        data.insert("discard".into(), Json::Bool(true));
    }
    data.insert("driver_volume_type".into(), Json::String(info.driver_volume_type.clone()));
    data.insert("attachment_id".into(), Json::String(attachment_id.to_string()));
    data.insert("enforce_multipath".into(), Json::Bool(conn.enforce_multipath));
    Ok(Json::Object(data))
}

/// Python's truth of a JSON value, as Cinder's `bool(...)` of a driver's answer.
fn truthy(v: &Json) -> bool {
    match v {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64() != Some(0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(a) => !a.is_empty(),
        Json::Object(o) => !o.is_empty(),
    }
}

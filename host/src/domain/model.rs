//! The attach room's records: volumes, attachments and connectors as the service works with them,
//! statuses typed and JSON parsed when they are read. The store reads rows into these types and
//! writes them back; the API renders them. No I/O here.

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

use super::state::{AttachStatus, Slot, VolumeAttachStatus, VolumeStatus};
use crate::runtime::contract::{self, AccessMode};
use crate::runtime::json::connector_from_json;
use crate::runtime::model::VolumeFields;

/// A live volume.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    pub id: String,
    pub project_id: String,
    pub user_id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub size_gib: i64,
    pub volume_type: String,
    pub backend: String,
    pub multiattach: bool,
    pub status: VolumeStatus,
    pub attach_status: VolumeAttachStatus,
    /// What the driver keeps with the volume (`provider_location`, `provider_auth`, ...).
    pub fields: VolumeFields,
    /// The user's metadata.
    pub metadata: BTreeMap<String, String>,
    pub shared_targets: Option<bool>,
    pub service_uuid: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Whether it may be booted from (`os-set_bootable`).
    pub bootable: bool,
    /// Its image properties (Cinder's `volume_image_metadata`, `os-set_image_metadata`): what
    /// Nova reads of a volume it boots from. Not the driver's to see.
    pub image_metadata: BTreeMap<String, String>,
}

impl Volume {
    /// The volume record a driver receives.
    pub fn contract(&self) -> contract::Volume {
        contract::Volume {
            id: self.id.clone(),
            name: format!("volume-{}", self.id),
            size_gib: self.size_gib as u64,
            multiattach: self.multiattach,
            provider_location: self.fields.provider_location.clone(),
            provider_auth: self.fields.provider_auth.clone(),
            provider_id: self.fields.provider_id.clone(),
            driver_data: self.fields.driver_data.clone().into_iter().collect(),
            metadata: self.metadata.clone().into_iter().collect(),
        }
    }

    /// The same volume with other driver fields.
    pub fn with_fields(&self, fields: &VolumeFields) -> Volume {
        Volume { fields: fields.clone(), ..self.clone() }
    }
}

/// An attachment's stored mode (`attach_mode`): `rw`, `ro`, or Cinder's literal string `null` when
/// the client did not choose (microversion 3.54's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    Null,
    Rw,
    Ro,
}

impl AttachMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Null => "null",
            AttachMode::Rw => "rw",
            AttachMode::Ro => "ro",
        }
    }

    /// `rw`, `ro`, or anything else (including NULL) as `null`.
    pub fn parse(text: Option<&str>) -> AttachMode {
        match text.and_then(AccessMode::parse) {
            Some(AccessMode::Rw) => AttachMode::Rw,
            Some(AccessMode::Ro) => AttachMode::Ro,
            None => AttachMode::Null,
        }
    }

    /// The effective access mode (Cinder's `attachment_update`): the stored mode wins unless it is
    /// `null`, then the connector's `mode`, then `rw`.
    pub fn effective(self, connector: Option<&Connector>) -> AccessMode {
        match self {
            AttachMode::Rw => AccessMode::Rw,
            AttachMode::Ro => AccessMode::Ro,
            AttachMode::Null => connector.and_then(Connector::requested_mode).unwrap_or(AccessMode::Rw),
        }
    }

    /// The connector as a driver receives it for an attachment of this stored mode (the one
    /// place the effective mode is put into a driver's connector).
    pub fn driver_connector(self, connector: &Connector) -> contract::Connector {
        connector.for_mode(self.effective(Some(connector)))
    }
}

impl From<AccessMode> for AttachMode {
    fn from(mode: AccessMode) -> Self {
        match mode {
            AccessMode::Rw => AttachMode::Rw,
            AccessMode::Ro => AttachMode::Ro,
        }
    }
}

/// A live attachment.
#[derive(Debug, Clone, PartialEq)]
pub struct Attachment {
    pub id: String,
    pub volume_id: String,
    pub project_id: String,
    pub instance_uuid: Option<String>,
    pub attached_host: Option<String>,
    pub mountpoint: Option<String>,
    pub attach_mode: AttachMode,
    pub status: AttachStatus,
    pub slot: Slot,
    /// The flattened connection info a connect returned.
    pub connection_info: Option<Json>,
    pub attach_time: Option<i64>,
    pub detach_time: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Made by the legacy volume actions (`os-reserve`, `os-initialize_connection`).
    pub legacy: bool,
}

impl Attachment {
    /// `connector` as a driver receives it for this attachment.
    pub fn driver_connector(&self, connector: &Connector) -> contract::Connector {
        self.attach_mode.driver_connector(connector)
    }

    /// The attachment as a driver sees it.
    pub fn contract(&self, connector: Option<&Connector>) -> contract::Attachment {
        let mode = self.attach_mode.effective(connector);
        contract::Attachment {
            id: self.id.clone(),
            connector: connector.map(|c| c.for_mode(mode)),
            instance: self.instance_uuid.clone(),
            mode,
        }
    }
}

/// A client's connector: os-brick's dictionary as it was sent (stored key by key in
/// `attachment_specs`, and compared to find a connector's attachment) and its typed form, parsed
/// once, for drivers.
#[derive(Debug, Clone, PartialEq)]
pub struct Connector {
    json: Map<String, Json>,
    typed: contract::Connector,
}

impl Connector {
    /// Parses a connector; the error names the offending key.
    pub fn parse(json: Map<String, Json>) -> Result<Connector, String> {
        let typed = connector_from_json(&json, AccessMode::Rw)?;
        Ok(Connector { json, typed })
    }

    pub fn json(&self) -> &Map<String, Json> {
        &self.json
    }

    /// The connector as a driver receives it, for an attachment of this access mode.
    pub fn for_mode(&self, mode: AccessMode) -> contract::Connector {
        contract::Connector { mode, ..self.typed.clone() }
    }

    /// The `mode` key, when it is `rw` or `ro`.
    pub fn requested_mode(&self) -> Option<AccessMode> {
        self.json.get("mode").and_then(Json::as_str).and_then(AccessMode::parse)
    }

    pub fn host(&self) -> Option<&str> {
        self.typed.host.as_deref()
    }

    pub fn initiator(&self) -> Option<&str> {
        self.typed.initiator.as_deref()
    }

    pub fn mountpoint(&self) -> Option<&str> {
        self.typed.mountpoint.as_deref()
    }

    pub fn enforce_multipath(&self) -> bool {
        self.typed.enforce_multipath
    }

    /// Two connectors name the same connection when they agree on the host and every initiator
    /// identity they carry (iSCSI initiator, NVMe host NQN, FC WWPNs).
    pub fn same_connection(&self, other: &Connector) -> bool {
        ["host", "initiator", "nqn", "wwpns"].iter().all(|k| {
            self.json.get(*k).filter(|v| !v.is_null()) == other.json.get(*k).filter(|v| !v.is_null())
        })
    }

    /// A connector that names only an initiator: what the reconciler knows of an ACL entry that
    /// no attachment accounts for.
    pub fn of_initiator(initiator: &str) -> Connector {
        let mut json = Map::new();
        json.insert("initiator".into(), Json::String(initiator.to_string()));
        Connector::parse(json).expect("a one-key connector parses")
    }

    /// A connector that names only a compute host (what a cephx identity's host is known by).
    pub fn of_host(host: &str) -> Connector {
        let mut json = Map::new();
        json.insert("host".into(), Json::String(host.to_string()));
        Connector::parse(json).expect("a one-key connector parses")
    }
}

/// An attachment with its stored connector (none while it is only reserved).
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub attachment: Attachment,
    pub connector: Option<Connector>,
}

impl Live {
    /// Connected, with a connector: the backend owes it access.
    pub fn is_connected(&self) -> bool {
        self.connector.is_some() && super::state::is_connected(self.attachment.status)
    }

    pub fn contract(&self) -> contract::Attachment {
        self.attachment.contract(self.connector.as_ref())
    }
}

/// An operation the service owns: a flow that changes a backend through a driver, recorded before
/// its first driver call and deleted in the transaction that records its outcome (see
/// `attach/ops.rs`; what recovery does with each kind is in `attach/recover.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Operation {
    pub id: String,
    pub kind: OpKind,
    pub volume_id: String,
    pub attachment_id: Option<String>,
    /// The connector the operation grants or revokes.
    pub connector: Option<Connector>,
    /// The last step its owner recorded.
    pub step: String,
    /// The node and the process (incarnation) that own it, and until when.
    pub node: String,
    pub incarnation: String,
    pub lease_until: i64,
    pub created_at: i64,
    /// The fencing generation: 1 when written, one more at every take-over. The owner's writes
    /// name the generation it holds, so an owner that was taken over can no longer record
    /// anything.
    pub generation: i64,
}

/// What an operation does, with what it needs to be finished or undone.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OpKind {
    /// The driver allocates a new volume. Finished on recovery (create is idempotent).
    CreateVolume,
    /// The driver releases a volume. Finished on recovery.
    DeleteVolume,
    /// The driver grows an available volume to `new_size_gib`. Finished on recovery (extend is
    /// idempotent).
    ExtendVolume { new_size_gib: i64 },
    /// A connector is granted access to the volume for an attachment. Undone on recovery:
    /// the connector (and `revoke`, a connector this update replaced) is revoked, and the
    /// attachment removed (`origin = create`), reserved again (`update`) or attached again
    /// without connector (`update-unconnected`).
    Connect {
        origin: ConnectOrigin,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revoke: Option<Map<String, Json>>,
    },
    /// A connected attachment's connection is replayed (legacy initialize again). Nothing to undo.
    Reconnect,
    /// An attachment's access is revoked, then `then` is applied to it. Finished on recovery.
    Disconnect { then: AfterDisconnect },
    /// An admin revokes access (the connector's, or all with none) and removes these attachments.
    /// Finished on recovery.
    ForceDetach { attachments: Vec<String> },
    /// The reconciler re-creates what the volume's connected attachments need. Nothing to undo.
    Repair,
    /// The reconciler revokes an access that no attachment is owed. Finished on recovery.
    Revoke,
    /// The reconciler removes an export that no attachment uses. Finished on recovery.
    RemoveExport,
}

impl OpKind {
    /// The `kind` column.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::CreateVolume => "create-volume",
            OpKind::DeleteVolume => "delete-volume",
            OpKind::ExtendVolume { .. } => "extend-volume",
            OpKind::Connect { .. } => "connect",
            OpKind::Reconnect => "reconnect",
            OpKind::Disconnect { .. } => "disconnect",
            OpKind::ForceDetach { .. } => "force-detach",
            OpKind::Repair => "repair",
            OpKind::Revoke => "revoke",
            OpKind::RemoveExport => "remove-export",
        }
    }
}

/// What undoing a connect leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConnectOrigin {
    /// A create with a connector: the reservation was never acknowledged, it goes too.
    Create,
    /// An update of an acknowledged reservation (or a legacy initialize of an `os-reserve`d one):
    /// it stays, reserved without connector.
    Update,
    /// An update of an attachment completed without a connection (Nova's shelved-offloaded
    /// server, at unshelve): it stays as it was, attached without connector.
    UpdateUnconnected,
}

/// What a disconnect does to its attachment once access is revoked (the event applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AfterDisconnect {
    /// Deleted; a legacy detach lock stays (`Event::Remove`: `os-unreserve`, the
    /// `os-terminate_connection` of a reservation).
    Remove,
    /// Deleted, and a detach lock released (`Event::Detach`: legacy `os-detach`, and attachment
    /// delete, as Cinder's `attachment_delete` derives the volume's status afresh).
    Detach,
    /// Kept without connector (`Event::Terminate`, a completed legacy attachment).
    Terminate,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn connector(j: Json) -> Connector {
        Connector::parse(j.as_object().unwrap().clone()).unwrap()
    }

    #[test]
    fn the_stored_mode_wins_then_the_connectors_then_rw() {
        let ro = connector(json!({"initiator": "iqn.2004-10.com.ubuntu:01:a", "mode": "ro"}));
        let plain = connector(json!({"initiator": "iqn.2004-10.com.ubuntu:01:a"}));
        assert_eq!(AttachMode::Rw.effective(Some(&ro)), AccessMode::Rw);
        assert_eq!(AttachMode::Null.effective(Some(&ro)), AccessMode::Ro);
        assert_eq!(AttachMode::Null.effective(Some(&plain)), AccessMode::Rw);
        assert_eq!(AttachMode::Null.effective(None), AccessMode::Rw);
        assert_eq!(AttachMode::parse(Some("null")), AttachMode::Null);
        assert_eq!(AttachMode::parse(None), AttachMode::Null);
    }

    #[test]
    fn a_driver_receives_the_connector_with_the_attachments_effective_mode() {
        let ro = connector(json!({"initiator": "iqn.2004-10.com.ubuntu:01:a", "mode": "ro"}));
        assert_eq!(AttachMode::Rw.driver_connector(&ro).mode, AccessMode::Rw);
        assert_eq!(AttachMode::Null.driver_connector(&ro).mode, AccessMode::Ro);
        assert_eq!(AttachMode::Ro.driver_connector(&ro).initiator, ro.typed.initiator);
    }

    #[test]
    fn connectors_are_the_same_connection_when_host_and_initiators_agree() {
        let a = connector(json!({"initiator": "iqn.2004-10.com.ubuntu:01:a", "host": "h", "ip": "1"}));
        let b = connector(json!({"initiator": "iqn.2004-10.com.ubuntu:01:a", "host": "h", "ip": "2"}));
        let c = connector(json!({"initiator": "iqn.2004-10.com.ubuntu:01:a", "host": "other"}));
        assert!(a.same_connection(&b));
        assert!(!a.same_connection(&c));
        assert!(Connector::parse(json!({"initiator": 5}).as_object().unwrap().clone()).is_err());
    }
}

//! Response bodies in Cinder's exact shapes (`cinder/api/v3/views/attachments.py`,
//! `cinder/api/v3/views/volumes.py`, `cinder/api/v2/views/types.py`), as types: what they
//! serialise to is the answer, and their JSON Schema is what the OpenAPI document says of it
//! (`openapi.rs`). A field that exists only from a microversion on, or only for admins, is
//! skipped when absent.
//!
//! Kept Cinder quirks that clients print or parse (cinder-compat.md 11): an attachment's
//! `attach_mode` is the string `"null"` when no mode was chosen (Q2), and unset times are `""`
//! (Q3). Fixed ones: `status` is the real status (Q1).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value as Json};

use super::microversion::{
    CLUSTER_NAME, CONSUMES_QUOTA, GROUP_ID, PROVIDER_ID, SHARED_TARGETS, SHARED_TARGETS_TRISTATE,
    VOLUME_TYPE_ID, Version,
};
use crate::attach::catalog::{cluster_of, type_id};
use crate::attach::nodes::Hosts;
use crate::attach::{Caller, VolumeType};
use crate::domain::model::{Attachment, Volume};
use crate::domain::state::AttachStatus;

/// Cinder's timestamp format: naive UTC, `%Y-%m-%dT%H:%M:%S.%f`.
pub fn timestamp(micros: i64) -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]"
    );
    time::OffsetDateTime::from_unix_timestamp_nanos(micros as i128 * 1000)
        .ok()
        .and_then(|t| t.format(&format).ok())
        .unwrap_or_default()
}

fn optional_time(micros: Option<i64>) -> String {
    micros.map(timestamp).unwrap_or_default()
}

/// An attachment in lists and in the delete answer.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AttachmentSummary {
    pub id: String,
    /// `reserved`, `attaching`, `attached`, `detaching`, `error_attaching` or `error_detaching`.
    pub status: String,
    /// The instance's UUID, when it has one.
    pub instance: Option<String>,
    pub volume_id: String,
}

/// An attachment in show, detail lists, create and update.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AttachmentDetail {
    #[serde(flatten)]
    pub summary: AttachmentSummary,
    /// When it was completed: Cinder's naive UTC time, `""` when not (yet).
    pub attached_at: String,
    /// `""` while live.
    pub detached_at: String,
    /// `rw`, `ro`, or the string `"null"` when no mode was chosen (as Cinder answers).
    pub attach_mode: String,
    /// The driver's connection data, flattened as Cinder's attachments API does (`target_iqn`,
    /// `auth_password`, ..., `driver_volume_type`, `attachment_id`), or `{}` when not connected.
    pub connection_info: Map<String, Json>,
    /// The ids of the volume's other attachments that share this one's connection (show only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_connections_by_attachment: Option<Vec<String>>,
}

/// The summary view: index lists and the delete response.
pub fn attachment_summary(a: &Attachment) -> AttachmentSummary {
    AttachmentSummary {
        id: a.id.clone(),
        status: a.status.as_str().to_string(),
        instance: a.instance_uuid.clone(),
        volume_id: a.volume_id.clone(),
    }
}

/// Whether a caller sees the secrets in an attachment's connection info.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secrets {
    /// A caller who may use the attachment (its project's members, services, admins: who may
    /// update it).
    Shown,
    /// A reader: the connection info without its secrets (Cinder shows them to anyone who can
    /// read the attachment).
    Removed,
}

/// Whether a connection-info key holds a secret: CHAP passwords (`auth_password`,
/// `discovery_auth_password`, any `*password`), a Ceph `keyring`, anything named `secret`.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("password") || key == "keyring" || key == "secret" || key.ends_with("_secret")
}

/// The detail view: show, detail lists, create, update.
pub fn attachment_detail(a: &Attachment, secrets: Secrets) -> AttachmentDetail {
    let mut connection_info = match &a.connection_info {
        Some(Json::Object(map)) => map.clone(),
        _ => Map::new(),
    };
    if secrets == Secrets::Removed {
        connection_info.retain(|k, _| !is_secret_key(k));
    }
    AttachmentDetail {
        summary: attachment_summary(a),
        attached_at: optional_time(a.attach_time),
        detached_at: optional_time(a.detach_time),
        attach_mode: a.attach_mode.as_str().to_string(),
        connection_info,
        shared_connections_by_attachment: None,
    }
}

/// `{"attachment": ...}`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AttachmentBody {
    pub attachment: AttachmentDetail,
}

/// `{"attachments": [...]}` of summaries.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AttachmentList {
    pub attachments: Vec<AttachmentSummary>,
}

/// `{"attachments": [...]}` of details.
#[derive(Debug, Serialize, JsonSchema)]
pub struct AttachmentDetailList {
    pub attachments: Vec<AttachmentDetail>,
}

/// A link to a resource.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Link {
    pub href: String,
    /// `self` or `bookmark`.
    pub rel: String,
}

/// Where a resource lives, for `links`.
#[derive(Debug, Clone)]
pub struct Links {
    /// `http://host:port` as the client reached us (or the configured public endpoint).
    pub base: String,
}

impl Links {
    pub fn of(&self, project: &str, collection: &str, id: &str) -> Vec<Link> {
        vec![
            Link { href: format!("{}/v3/{project}/{collection}/{id}", self.base), rel: "self".into() },
            Link { href: format!("{}/{project}/{collection}/{id}", self.base), rel: "bookmark".into() },
        ]
    }
}

/// A volume in the index list.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeSummary {
    pub id: String,
    pub name: Option<String>,
    pub links: Vec<Link>,
}

pub fn volume_summary(v: &Volume, links: &Links) -> VolumeSummary {
    VolumeSummary { id: v.id.clone(), name: v.name.clone(), links: links.of(&v.project_id, "volumes", &v.id) }
}

/// A completed attachment, as a volume lists it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeAttachment {
    /// The volume's id (Cinder's field).
    pub id: String,
    pub attachment_id: String,
    pub volume_id: String,
    pub server_id: Option<String>,
    /// The attached host (admins only; `null` for others).
    pub host_name: Option<String>,
    pub device: Option<String>,
    pub attached_at: String,
}

/// A volume in show, detail lists and the create answer, at a microversion.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeDetail {
    pub id: String,
    pub name: Option<String>,
    pub description: Option<String>,
    /// `creating`, `available`, `reserved`, `attaching`, `in-use`, `detaching`, `deleting`,
    /// `error` or `error_deleting`.
    pub status: String,
    /// GiB.
    pub size: i64,
    pub availability_zone: String,
    pub created_at: String,
    pub updated_at: String,
    pub attachments: Vec<VolumeAttachment>,
    pub links: Vec<Link>,
    /// Always `"false"` (a string, as Cinder answers).
    pub bootable: String,
    pub encrypted: bool,
    pub multiattach: bool,
    pub metadata: BTreeMap<String, String>,
    pub snapshot_id: Option<String>,
    pub source_volid: Option<String>,
    pub consistencygroup_id: Option<String>,
    pub replication_status: Option<String>,
    pub user_id: String,
    pub volume_type: String,
    #[serde(rename = "os-vol-tenant-attr:tenant_id")]
    pub tenant_id: String,
    /// `node@backend#pool` of the node that serves it (admins only).
    #[serde(rename = "os-vol-host-attr:host", skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Admins only; always `null`.
    #[serde(rename = "os-vol-mig-status-attr:migstat", skip_serializing_if = "Option::is_none")]
    pub migstat: Option<Option<String>>,
    /// Admins only; always `null`.
    #[serde(rename = "os-vol-mig-status-attr:name_id", skip_serializing_if = "Option::is_none")]
    pub name_id: Option<Option<String>>,
    /// Admins only; always `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_status: Option<Option<String>>,
    /// From microversion 3.13; always `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_id: Option<Option<String>>,
    /// From microversion 3.21, admins only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<Option<String>>,
    /// From microversion 3.48: whether the backend shares targets between volumes (from 3.69,
    /// `null` means "always lock", as for NVMe-oF; before it, such a volume shows `true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_targets: Option<Option<bool>>,
    /// From microversion 3.48: the backend (and node) that serves the volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_uuid: Option<Option<String>>,
    /// From microversion 3.61, admins only: `berth@<backend>` for a backend shared between nodes
    /// (its cluster, in Cinder's words), `null` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<Option<String>>,
    /// From microversion 3.63: the volume type's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_type_id: Option<String>,
    /// From microversion 3.65: whether the volume counts against quota (every user volume does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumes_quota: Option<bool>,
    /// Its image properties (`os-set_image_metadata`), when it has any and the caller may read
    /// them (`volume_extension:volume_image_metadata:show`), as Cinder shows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_image_metadata: Option<BTreeMap<String, String>>,
}

/// What a caller may see of volumes beyond what every reader sees, as the policy and its role
/// decide.
pub struct Sight {
    /// The node that serves each volume (admins only).
    pub hosts: Option<Hosts>,
    /// Their image properties (`volume_extension:volume_image_metadata:show`).
    pub image_metadata: bool,
}

/// The volume detail view at a microversion, for a caller who sees what `sight` says.
pub fn volume_detail(
    v: &Volume,
    attachments: &[Attachment],
    caller: &Caller,
    version: Version,
    links: &Links,
    sight: &Sight,
) -> VolumeDetail {
    let admin = caller.is_admin();
    let attached = attachments
        .iter()
        .filter(|a| a.status == AttachStatus::Attached)
        .map(|a| VolumeAttachment {
            id: v.id.clone(),
            attachment_id: a.id.clone(),
            volume_id: v.id.clone(),
            server_id: a.instance_uuid.clone(),
            host_name: if admin { a.attached_host.clone() } else { None },
            device: a.mountpoint.clone(),
            attached_at: optional_time(a.attach_time),
        })
        .collect();
    let host = sight.hosts.as_ref().filter(|_| admin).map(|h| h.host(v));
    let admin_null = host.as_ref().map(|_| None);
    VolumeDetail {
        id: v.id.clone(),
        name: v.name.clone(),
        description: v.description.clone(),
        status: v.status.as_str().to_string(),
        size: v.size_gib,
        availability_zone: super::zones::ZONE.into(),
        created_at: timestamp(v.created_at),
        updated_at: timestamp(v.updated_at),
        attachments: attached,
        links: links.of(&v.project_id, "volumes", &v.id),
        bootable: v.bootable.to_string(),
        encrypted: false,
        multiattach: v.multiattach,
        metadata: v.metadata.clone(),
        snapshot_id: None,
        source_volid: None,
        consistencygroup_id: None,
        replication_status: None,
        user_id: v.user_id.clone(),
        volume_type: v.volume_type.clone(),
        tenant_id: v.project_id.clone(),
        migstat: admin_null.clone(),
        name_id: admin_null.clone(),
        migration_status: admin_null,
        host,
        group_id: (version >= GROUP_ID).then_some(None),
        provider_id: (version >= PROVIDER_ID && admin).then(|| v.fields.provider_id.clone()),
        // Before 3.69 a `null` (lock always) is shown as `true` (Cinder's view).
        shared_targets: match version {
            v2 if v2 >= SHARED_TARGETS_TRISTATE => Some(v.shared_targets),
            v2 if v2 >= SHARED_TARGETS => Some(Some(v.shared_targets.unwrap_or(true))),
            _ => None,
        },
        service_uuid: (version >= SHARED_TARGETS).then(|| v.service_uuid.clone()),
        cluster_name: (version >= CLUSTER_NAME && admin)
            .then(|| cluster_of(&v.backend, v.service_uuid.as_deref())),
        volume_type_id: (version >= VOLUME_TYPE_ID).then(|| type_id(&v.volume_type)),
        consumes_quota: (version >= CONSUMES_QUOTA).then_some(true),
        volume_image_metadata: (sight.image_metadata && !v.image_metadata.is_empty())
            .then(|| v.image_metadata.clone()),
    }
}

/// `{"volume": ...}`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeBody {
    pub volume: VolumeDetail,
}

/// `{"volumes": [...]}` of summaries, with their `count` when asked (3.45, `with_count=true`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeList {
    pub volumes: Vec<VolumeSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// `{"volumes": [...]}` of details, with their `count` when asked (3.45, `with_count=true`).
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeDetailList {
    pub volumes: Vec<VolumeDetail>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// Extra specs anyone may read (Cinder's user-visible extra specs); admins see all.
const USER_VISIBLE_SPECS: &[&str] = &["multiattach", "RESKEY:availability_zones", "replication_enabled"];

/// A volume type.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeTypeView {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub is_public: bool,
    /// Those a user may read; an admin sees all.
    pub extra_specs: BTreeMap<String, String>,
    #[serde(rename = "os-volume-type-access:is_public")]
    pub access_is_public: bool,
    /// The id of the type's QoS specs (`null`: none), for who passes
    /// `volume_extension:access_types_qos_specs_id` (admins); absent for others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos_specs_id: Option<Option<String>>,
}

/// A volume type as `caller` sees it; `qos` says whether it sees the type's QoS specs' id.
pub fn volume_type(t: &VolumeType, caller: &Caller, qos: bool) -> VolumeTypeView {
    VolumeTypeView {
        id: t.id.clone(),
        name: t.name.clone(),
        description: t.description.clone(),
        is_public: true,
        extra_specs: t
            .extra_specs
            .iter()
            .filter(|(k, _)| caller.is_admin() || USER_VISIBLE_SPECS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        access_is_public: true,
        qos_specs_id: qos.then(|| t.qos_specs.as_ref().map(|q| q.id.clone())),
    }
}

/// `{"volume_type": ...}`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeTypeBody {
    pub volume_type: VolumeTypeView,
}

/// `{"volume_types": [...]}`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct VolumeTypeList {
    pub volume_types: Vec<VolumeTypeView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_naive_utc_with_microseconds() {
        assert_eq!(timestamp(1_442_395_732_000_000), "2015-09-16T09:28:52.000000");
        assert_eq!(timestamp(1_442_395_732_123_456), "2015-09-16T09:28:52.123456");
    }

    #[test]
    fn a_reserved_attachment_looks_like_cinders() {
        let a = Attachment {
            id: "a".into(),
            volume_id: "v".into(),
            project_id: "p".into(),
            instance_uuid: Some("i".into()),
            attached_host: None,
            mountpoint: None,
            attach_mode: crate::domain::model::AttachMode::Null,
            status: AttachStatus::Reserved,
            slot: crate::domain::state::Slot::Exclusive,
            connection_info: None,
            attach_time: None,
            detach_time: None,
            created_at: 0,
            updated_at: 0,
            legacy: false,
        };
        assert_eq!(
            serde_json::to_value(attachment_detail(&a, Secrets::Shown)).unwrap(),
            serde_json::json!({"id": "a", "status": "reserved", "instance": "i", "volume_id": "v", "attached_at": "",
                   "detached_at": "", "attach_mode": "null", "connection_info": {}})
        );
    }
}

//! Response bodies in Cinder's exact shapes (`cinder/api/v3/views/attachments.py`,
//! `cinder/api/v3/views/volumes.py`, `cinder/api/v2/views/types.py`).
//!
//! Kept Cinder quirks that clients print or parse (cinder-compat.md 11): an attachment's
//! `attach_mode` is the string `"null"` when no mode was chosen (Q2), and unset times are `""`
//! (Q3). Fixed ones: `status` is the real status (Q1).

use serde_json::{Map, Value as Json, json};

use super::microversion::{GROUP_ID, PROVIDER_ID, SHARED_TARGETS, Version};
use crate::attach::model::{Attachment, Volume};
use crate::attach::nodes::Hosts;
use crate::attach::state::AttachStatus;
use crate::attach::{Caller, VolumeType};

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

fn optional_time(micros: Option<i64>) -> Json {
    Json::String(micros.map(timestamp).unwrap_or_default())
}

/// The summary view: index lists and the delete response.
pub fn attachment_summary(a: &Attachment) -> Json {
    json!({
        "id": a.id,
        "status": a.status.as_str(),
        "instance": a.instance_uuid,
        "volume_id": a.volume_id,
    })
}

/// The detail view: show, detail lists, create, update.
pub fn attachment_detail(a: &Attachment) -> Json {
    let mut view = attachment_summary(a);
    let connection_info = a.connection_info.clone().unwrap_or_else(|| Json::Object(Map::new()));
    let extra = json!({
        "attached_at": optional_time(a.attach_time),
        "detached_at": optional_time(a.detach_time),
        "attach_mode": a.attach_mode.as_str(),
        "connection_info": connection_info,
    });
    merge(&mut view, extra);
    view
}

fn merge(into: &mut Json, from: Json) {
    if let (Json::Object(into), Json::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// Where a resource lives, for `links`.
#[derive(Debug, Clone)]
pub struct Links {
    /// `http://host:port` as the client reached us (or the configured public endpoint).
    pub base: String,
}

impl Links {
    fn of(&self, project: &str, collection: &str, id: &str) -> Json {
        json!([
            {"href": format!("{}/v3/{project}/{collection}/{id}", self.base), "rel": "self"},
            {"href": format!("{}/{project}/{collection}/{id}", self.base), "rel": "bookmark"},
        ])
    }
}

pub fn volume_summary(v: &Volume, links: &Links) -> Json {
    json!({ "id": v.id, "name": v.name, "links": links.of(&v.project_id, "volumes", &v.id) })
}

/// The volume detail view at a microversion, for a caller. `hosts` (admins only) names the node
/// that serves each volume.
pub fn volume_detail(
    v: &Volume,
    attachments: &[Attachment],
    caller: &Caller,
    version: Version,
    links: &Links,
    hosts: Option<&Hosts>,
) -> Json {
    let admin = caller.is_admin();
    let attached: Vec<Json> = attachments
        .iter()
        .filter(|a| a.status == AttachStatus::Attached)
        .map(|a| {
            json!({
                "id": v.id,
                "attachment_id": a.id,
                "volume_id": v.id,
                "server_id": a.instance_uuid,
                "host_name": if admin { json!(a.attached_host) } else { Json::Null },
                "device": a.mountpoint,
                "attached_at": optional_time(a.attach_time),
            })
        })
        .collect();
    let mut view = json!({
        "id": v.id,
        "name": v.name,
        "description": v.description,
        "status": v.status.as_str(),
        "size": v.size_gib,
        "availability_zone": "nova",
        "created_at": timestamp(v.created_at),
        "updated_at": timestamp(v.updated_at),
        "attachments": attached,
        "links": links.of(&v.project_id, "volumes", &v.id),
        "bootable": "false",
        "encrypted": false,
        "multiattach": v.multiattach,
        "metadata": v.metadata,
        "snapshot_id": null,
        "source_volid": null,
        "consistencygroup_id": null,
        "replication_status": null,
        "user_id": v.user_id,
        "volume_type": v.volume_type,
        "os-vol-tenant-attr:tenant_id": v.project_id,
    });
    if let (true, Some(hosts)) = (admin, hosts) {
        merge(
            &mut view,
            json!({
                "os-vol-host-attr:host": hosts.host(v),
                "os-vol-mig-status-attr:migstat": null,
                "os-vol-mig-status-attr:name_id": null,
                "migration_status": null,
            }),
        );
    }
    if version >= GROUP_ID {
        merge(&mut view, json!({ "group_id": null }));
    }
    if version >= PROVIDER_ID && admin {
        merge(&mut view, json!({ "provider_id": v.fields.provider_id }));
    }
    if version >= SHARED_TARGETS {
        merge(
            &mut view,
            json!({ "shared_targets": v.shared_targets.unwrap_or(true), "service_uuid": v.service_uuid }),
        );
    }
    view
}

/// Extra specs anyone may read (Cinder's user-visible extra specs); admins see all.
const USER_VISIBLE_SPECS: &[&str] = &["multiattach", "RESKEY:availability_zones", "replication_enabled"];

pub fn volume_type(t: &VolumeType, caller: &Caller) -> Json {
    let specs: Map<String, Json> = t
        .extra_specs
        .iter()
        .filter(|(k, _)| caller.is_admin() || USER_VISIBLE_SPECS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), Json::String(v.clone())))
        .collect();
    json!({
        "id": t.id,
        "name": t.name,
        "description": t.description,
        "is_public": true,
        "extra_specs": specs,
        "os-volume-type-access:is_public": true,
        "qos_specs_id": null,
    })
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
            attach_mode: crate::attach::model::AttachMode::Null,
            status: AttachStatus::Reserved,
            slot: crate::attach::state::Slot::Exclusive,
            connection_info: None,
            attach_time: None,
            detach_time: None,
            created_at: 0,
            updated_at: 0,
            legacy: false,
        };
        assert_eq!(
            attachment_detail(&a),
            json!({"id": "a", "status": "reserved", "instance": "i", "volume_id": "v", "attached_at": "",
                   "detached_at": "", "attach_mode": "null", "connection_info": {}})
        );
    }
}

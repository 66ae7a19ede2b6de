//! `GET /v3/{project_id}/extensions` (`cinder list-extensions`, `openstack extension list
//! --volume`; a client may ask it whether a feature is there): the extensions of Cinder's API that
//! this service serves, under Cinder's names, aliases, descriptions and dates. Only those whose
//! calls answer here; snapshots, backups, volume and snapshot management, host administration,
//! type management and type access are not listed.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::Serialize;

use super::error::ApiError;
use super::openapi::Endpoint;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/extensions", index, "listExtensions")
            .summary("extensions", "List the extensions of Cinder's API that this service serves")
            .answers::<ExtensionList>(StatusCode::OK, "The extensions"),
    ]
}

/// (name, alias, updated, description), as Cinder's `cinder/api/contrib/` describe them.
const SERVED: [(&str, &str, &str, &str); 20] = [
    ("AdminActions", "os-admin-actions", "2012-08-25T00:00:00+00:00", "Enable admin actions."),
    (
        "AvailabilityZones",
        "os-availability-zone",
        "2013-06-27T00:00:00+00:00",
        "Describe Availability Zones.",
    ),
    ("Capabilities", "capabilities", "2015-08-31T00:00:00+00:00", "Capabilities support."),
    ("ExtendedServices", "os-extended-services", "2014-01-10T00:00:00-00:00", "Extended services support."),
    ("Qos_specs_manage", "qos-specs", "2013-08-02T00:00:00+00:00", "QoS specs support."),
    ("QuotaClasses", "os-quota-class-sets", "2012-03-12T00:00:00+00:00", "Quota classes management support."),
    ("Quotas", "os-quota-sets", "2011-08-08T00:00:00+00:00", "Quota management support."),
    ("Scheduler_stats", "scheduler-stats", "2014-09-07T00:00:00+00:00", "Scheduler stats support."),
    ("Services", "os-services", "2012-10-28T00:00:00-00:00", "Services support."),
    ("TypesExtraSpecs", "os-types-extra-specs", "2011-08-24T00:00:00+00:00", "Type extra specs support."),
    (
        "UsedLimits",
        "os-used-limits",
        "2013-10-03T00:00:00+00:00",
        "Provide data on limited resources that are being used.",
    ),
    ("VolumeActions", "os-volume-actions", "2012-05-31T00:00:00+00:00", "Enable volume actions."),
    (
        "VolumeEncryptionMetadata",
        "os-volume-encryption-metadata",
        "2013-07-10T00:00:00+00:00",
        "Volume encryption metadata retrieval support.",
    ),
    (
        "VolumeHostAttribute",
        "os-vol-host-attr",
        "2011-11-03T00:00:00+00:00",
        "Expose host as an attribute of a volume.",
    ),
    (
        "VolumeImageMetadata",
        "os-vol-image-meta",
        "2012-12-07T00:00:00+00:00",
        "Show image metadata associated with the volume.",
    ),
    (
        "VolumeMigStatusAttribute",
        "os-vol-mig-status-attr",
        "2013-08-08T00:00:00+00:00",
        "Expose migration_status as an attribute of a volume.",
    ),
    (
        "VolumeTenantAttribute",
        "os-vol-tenant-attr",
        "2011-11-03T00:00:00+00:00",
        "Expose the internal project_id as an attribute of a volume.",
    ),
    (
        "VolumeTransfer",
        "os-volume-transfer",
        "2013-05-29T00:00:00+00:00",
        "Volume transfer management support.",
    ),
    (
        "VolumeTypeEncryption",
        "encryption",
        "2013-07-01T00:00:00+00:00",
        "Encryption support for volume types.",
    ),
    (
        "VolumeUnmanage",
        "os-volume-unmanage",
        "2012-05-31T00:00:00+00:00",
        "Enable volume unmanage operation.",
    ),
];

/// `{"extensions": [...]}`.
#[derive(Serialize, JsonSchema)]
struct ExtensionList {
    extensions: Vec<Extension>,
}

#[derive(Serialize, JsonSchema)]
struct Extension {
    name: String,
    alias: String,
    description: String,
    updated: String,
    /// Always empty, as Cinder's.
    links: Vec<String>,
}

/// Any caller's: Cinder has no rule for it.
async fn index() -> Result<Response, ApiError> {
    let extensions = SERVED
        .iter()
        .map(|(name, alias, updated, description)| Extension {
            name: name.to_string(),
            alias: alias.to_string(),
            description: description.to_string(),
            updated: updated.to_string(),
            links: Vec::new(),
        })
        .collect();
    Ok(Json(ExtensionList { extensions }).into_response())
}

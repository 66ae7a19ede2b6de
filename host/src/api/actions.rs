//! `POST /v3/{project_id}/volumes/{id}/action`: the legacy attach and detach actions (and the
//! volume's other actions: extend, retype, image properties, ...), with
//! Cinder's bodies and status codes (`cinder/api/contrib/volume_actions.py`,
//! `admin_actions.py`, `cinder/api/schemas/volume_actions.py`). Available from 3.0. The rules
//! are the attachments API's: see `attach/legacy.rs`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::attachments::connector as parse_connector;
use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{EXTEND_VOLUME_COMPLETION, MIN, REIMAGE, VOLUME_EXTEND_INUSE, Version};
use super::openapi::{Endpoint, SchemaFn};
use super::path::VolumeId;
use super::policy::Rule;
use super::{AppState, uuid_param};
use crate::attach::Caller;
use crate::attach::legacy::LegacyAttach;
use crate::attach::volumes::VolumeChange;
use crate::domain::model::{AttachMode, Connector};
use crate::domain::state::VolumeStatus;
use crate::runtime::contract::AccessMode;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::post("/volumes/{id}/action", action, "volumeAction")
            .summary("volume actions", "A legacy attach or detach action (one per request)")
            .body_with(body_schema)
            .answers::<ActionAnswer>(
                StatusCode::OK,
                "`os-initialize_connection`: the connection; `os-set_image_metadata`, `os-unset_image_metadata` \
                 and `os-show_image_metadata`: the volume's image properties",
            )
            .answers_empty(StatusCode::ACCEPTED, "Every other action: done"),
    ]
}

/// The actions this endpoint knows: each one's name, lowest microversion, policy rule and
/// argument. Below its microversion an action is unknown (404, as Cinder answers a method that
/// its version does not have).
const ACTIONS: &[(&str, Version, Rule, SchemaFn)] = &[
    ("os-reserve", MIN, Rule::Reserve, no_argument),
    ("os-unreserve", MIN, Rule::Unreserve, no_argument),
    ("os-initialize_connection", MIN, Rule::InitializeConnection, |g| g.subschema_for::<Initialize>()),
    ("os-attach", MIN, Rule::Attach, |g| g.subschema_for::<Attach>()),
    ("os-begin_detaching", MIN, Rule::BeginDetaching, no_argument),
    ("os-roll_detaching", MIN, Rule::RollDetaching, no_argument),
    ("os-terminate_connection", MIN, Rule::TerminateConnection, |g| g.subschema_for::<Terminate>()),
    ("os-detach", MIN, Rule::Detach, |g| g.subschema_for::<Option<Detach>>()),
    ("os-force_detach", MIN, Rule::ForceDetach, |g| g.subschema_for::<Option<ForceDetach>>()),
    ("os-extend", MIN, Rule::Extend, |g| g.subschema_for::<Extend>()),
    // `cinder force-delete`: `DELETE /volumes/{id}?force=true` as an action, under one rule.
    ("os-force_delete", MIN, Rule::VolumeForceDelete, no_argument),
    // `cinder unmanage`: Berth forgets the volume and leaves its data on the backend.
    ("os-unmanage", MIN, Rule::VolumeUnmanage, no_argument),
    // `cinder retype`: another volume type of the volume's backend.
    ("os-retype", MIN, Rule::Retype, |g| g.subschema_for::<Retype>()),
    // Whether the volume may be booted from, a change of the volume as `PUT` makes.
    ("os-set_bootable", MIN, Rule::VolumeUpdate, |g| g.subschema_for::<SetBootable>()),
    ("os-reimage", REIMAGE, Rule::Reimage, |g| g.subschema_for::<Reimage>()),
    // A volume's image properties, which Nova reads of a volume it boots from.
    ("os-set_image_metadata", MIN, Rule::ImageMetadataSet, |g| g.subschema_for::<SetImageMetadata>()),
    ("os-unset_image_metadata", MIN, Rule::ImageMetadataRemove, |g| g.subschema_for::<UnsetImageMetadata>()),
    ("os-show_image_metadata", MIN, Rule::VolumeGet, no_argument),
    ("os-extend_volume_completion", EXTEND_VOLUME_COMPLETION, Rule::ExtendVolumeCompletion, |g| {
        g.subschema_for::<ExtendCompletion>()
    }),
];

fn no_argument(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({"description": "No argument (its value is ignored)."})
}

/// The body: one object naming one action, with its argument.
fn body_schema(g: &mut SchemaGenerator) -> Schema {
    let one_of: Vec<Value> = ACTIONS
        .iter()
        .map(|(name, _, _, argument)| {
            json!({
                "type": "object",
                "properties": { *name: argument(g) },
                "required": [name],
                "additionalProperties": false,
            })
        })
        .collect();
    schemars::json_schema!({ "oneOf": one_of })
}

/// What an action answers with 200.
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
enum ActionAnswer {
    Connection(ConnectionInfoBody),
    ImageMetadata(ImageMetadataBody),
}

/// `{"metadata": {...}}`: a volume's image properties.
#[derive(Serialize, JsonSchema)]
struct ImageMetadataBody {
    metadata: std::collections::BTreeMap<String, String>,
}

/// `os-set_image_metadata`'s argument: the properties to add or change.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetImageMetadata {
    metadata: std::collections::BTreeMap<String, String>,
}

/// `os-unset_image_metadata`'s argument: the property to remove.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UnsetImageMetadata {
    key: String,
}

/// `os-initialize_connection`'s argument.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Initialize {
    /// os-brick's connector of the host, or a string holding one.
    #[schemars(extend("type" = ["object", "string"]))]
    connector: Value,
}

/// `os-terminate_connection`'s argument.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Terminate {
    /// The connector whose access ends, or a string holding one.
    #[schemars(extend("type" = ["object", "string"]))]
    connector: Value,
}

/// `os-attach`'s argument.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Attach {
    /// 1 to 255 characters.
    #[schemars(length(min = 1, max = 255))]
    mountpoint: String,
    #[serde(default)]
    #[schemars(extend("format" = "uuid"))]
    instance_uuid: Option<String>,
    /// 1 to 255 characters.
    #[serde(default)]
    #[schemars(length(min = 1, max = 255))]
    host_name: Option<String>,
    #[serde(default)]
    #[schemars(extend("enum" = ["rw", "ro", null]))]
    mode: Option<String>,
}

/// `os-detach`'s argument.
#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Detach {
    #[serde(default)]
    #[schemars(extend("format" = "uuid"))]
    attachment_id: Option<String>,
}

/// `os-force_detach`'s argument.
#[derive(Deserialize, Default, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ForceDetach {
    #[serde(default)]
    #[schemars(extend("type" = ["object", "string", "null"]))]
    connector: Option<Value>,
    #[serde(default)]
    #[schemars(extend("format" = "uuid"))]
    attachment_id: Option<String>,
}

/// `os-extend`'s argument.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Extend {
    /// The new size in GiB, larger than the current one (an integer, or a string of digits).
    #[schemars(extend("type" = ["integer", "string"], "pattern" = "^[0-9]+$", "minimum" = 1))]
    new_size: Value,
}

/// `os-retype`'s argument.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Retype {
    /// The volume type's name or id.
    new_type: String,
    /// `never` (the default) or `on-demand`: whether the volume may be migrated. Berth never
    /// migrates: a type of another backend is refused either way.
    migration_policy: Option<String>,
}

/// `os-set_bootable`'s argument.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetBootable {
    /// `true` or `false` (or a string Cinder reads as one: `"True"`, `"0"`, `"yes"`...).
    #[schemars(extend("type" = ["boolean", "string"]))]
    bootable: Value,
}

/// `os-reimage`'s argument (3.68).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Reimage {
    /// The image to write onto the volume.
    #[schemars(extend("format" = "uuid"))]
    image_id: String,
    /// Whether a `reserved` volume may be re-imaged (Nova's rebuild reserves it first).
    #[serde(default)]
    reimage_reserved: bool,
}

/// `os-extend_volume_completion`'s argument (3.71).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExtendCompletion {
    /// Whether the compute service failed to extend.
    #[serde(default)]
    #[allow(dead_code)] // Parsed for its schema; no extend here waits on a compute service.
    error: bool,
}

/// `os-initialize_connection`'s answer.
#[derive(Serialize, JsonSchema)]
struct ConnectionInfoBody {
    connection_info: LegacyConnection,
}

/// The legacy answer nests the driver's data (the attachments API flattens it).
#[derive(Serialize, JsonSchema)]
struct LegacyConnection {
    /// `iscsi`, `fibre_channel`, `nvmeof`, ...
    driver_volume_type: Value,
    /// The driver's connection data (`target_portal`, `target_iqn`, `auth_password`, ...).
    data: Map<String, Value>,
    enforce_multipath: Value,
}

/// An action's argument, parsed strictly; `null` is the default when the action allows it.
fn argument<T: DeserializeOwned>(action: &str, value: Value, null_ok: Option<T>) -> Result<T, ApiError> {
    if value.is_null()
        && let Some(default) = null_ok
    {
        return Ok(default);
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { action.to_string() } else { format!("{action}.{path}") };
        ApiError::bad_request(format!("Invalid input for field/attribute {at}: {}", e.into_inner()))
    })
}

/// A connector given as an object, or as a string holding one (Cinder accepts both).
fn connector(value: Value) -> Result<Connector, ApiError> {
    let value = match value {
        Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
        other => other,
    };
    match value {
        Value::Object(map) => parse_connector(map),
        other => Err(ApiError::bad_request(format!(
            "Invalid input for field/attribute connector. Value: {other}. The connector must be an object"
        ))),
    }
}

fn optional_connector(value: Option<Value>) -> Result<Option<Connector>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => connector(v).map(Some),
    }
}

fn attachment_id(value: Option<String>) -> Result<Option<String>, ApiError> {
    value.as_deref().map(|a| uuid_param("attachment_id", a)).transpose()
}

/// Why a volume action Cinder has is not one of this service's, where a client would ask.
fn not_here(name: &str) -> Option<&'static str> {
    Some(match name {
        "os-reset_status" => {
            "Statuses are not overwritten here: every error state is left through the API itself, by \
             deleting, trying again or unmanaging (docs/operations.md, \"The outcomes\")."
        }
        "os-migrate_volume" | "os-migrate_volume_completion" => {
            "Volumes do not move between backends here (a retype stays on its backend)."
        }
        "os-update_readonly_flag" => "Read-only access is the attachment's `mode` (`ro`), from 3.54.",
        "os-volume_upload_image" => "Volumes are not uploaded to images here (no image service).",
        "revert" => "This service takes no snapshots to revert to.",
        _ => return None,
    })
}

async fn action(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    VolumeId(volume): VolumeId,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Response, ApiError> {
    let mut entries = body.into_iter();
    let (name, value) = match (entries.next(), entries.next()) {
        (Some(entry), None) => entry,
        _ => {
            return Err(ApiError::bad_request(
                "Invalid input: a volume action body names exactly one action",
            ));
        }
    };
    let Some((_, since, rule, _)) = ACTIONS.iter().find(|(n, _, _, _)| *n == name) else {
        return Err(ApiError::bad_request(match not_here(&name) {
            Some(why) => format!("There is no such action: {name}. {why}"),
            None => format!("There is no such action: {name}"),
        }));
    };
    if version < *since {
        return Err(ApiError::no_such_resource());
    }
    state.authorize(&caller, *rule)?;
    let service = &state.service;
    match name.as_str() {
        "os-reserve" => service.commands().legacy_reserve(caller, volume).await?,
        "os-unreserve" => service.commands().legacy_unreserve(caller, volume).await?,
        "os-begin_detaching" => service.commands().legacy_begin_detaching(caller, volume).await?,
        "os-roll_detaching" => service.commands().legacy_roll_detaching(caller, volume).await?,
        "os-initialize_connection" => {
            let arg: Initialize = argument(&name, value, None)?;
            let c = connector(arg.connector)?;
            let info = service.commands().legacy_initialize(caller, volume, c).await?;
            return Ok((
                StatusCode::OK,
                Json(ActionAnswer::Connection(ConnectionInfoBody { connection_info: nested(info) })),
            )
                .into_response());
        }
        "os-attach" => {
            let arg: Attach = argument(&name, value, None)?;
            let req = attach_request(arg)?;
            service.commands().legacy_attach(caller, volume, req).await?;
        }
        "os-terminate_connection" => {
            let arg: Terminate = argument(&name, value, None)?;
            let c = optional_connector(Some(arg.connector))?;
            service.commands().legacy_terminate(caller, volume, c).await?;
        }
        "os-detach" => {
            let arg: Detach = argument(&name, value, Some(Detach::default()))?;
            let id = attachment_id(arg.attachment_id)?;
            service.commands().legacy_detach(caller, volume, id).await?;
        }
        "os-force_detach" => {
            let arg: ForceDetach = argument(&name, value, Some(ForceDetach::default()))?;
            let c = optional_connector(arg.connector)?;
            let id = attachment_id(arg.attachment_id)?;
            service.commands().force_detach(caller, volume, c, id).await?;
        }
        "os-extend" => {
            let arg: Extend = argument(&name, value, None)?;
            let size = match &arg.new_size {
                Value::Number(n) => n.as_i64(),
                Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
                _ => None,
            }
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Invalid input for field/attribute new_size. Value: {}. It must be an integer of 1 or more",
                    arg.new_size
                ))
            })?;
            // From 3.42 an attached volume grows too, under a rule of its own (Cinder picks the
            // rule by the volume's status).
            let attached = version >= VOLUME_EXTEND_INUSE
                && match state.authorize(&caller, Rule::ExtendAttached) {
                    Ok(()) => true,
                    Err(forbidden) => {
                        let (shown, _) = service.volumes().show(&caller, &volume).await?;
                        if shown.status == VolumeStatus::InUse {
                            return Err(forbidden);
                        }
                        false
                    }
                };
            service.commands().extend_volume(caller, volume, size, attached).await.map(drop)?;
        }
        "os-force_delete" => service.commands().delete_volume(caller, volume, true).await?,
        "os-unmanage" => service.commands().unmanage_volume(caller, volume).await?,
        "os-retype" => {
            let arg: Retype = argument(&name, value, None)?;
            if let Some(p) = arg.migration_policy.as_deref().filter(|p| !matches!(*p, "never" | "on-demand"))
            {
                return Err(ApiError::bad_request(format!(
                    "Invalid input for field/attribute migration_policy. Value: {p}. It must be never or on-demand"
                )));
            }
            let to =
                state.service.catalog().types.iter().find(|t| t.id == arg.new_type || t.name == arg.new_type);
            // Cinder asks `volume:multiattach` only of a retype that makes a volume multiattach,
            // not of one between two multiattach types.
            if to.is_some_and(|t| t.multiattach()) {
                let (current, _) = service.volumes().show(&caller, &volume).await?;
                if !current.multiattach {
                    state.authorize(&caller, Rule::Multiattach)?;
                }
            }
            service.commands().retype_volume(caller, volume, arg.new_type).await?;
        }
        "os-set_bootable" => {
            let arg: SetBootable = argument(&name, value, None)?;
            let bootable = match &arg.bootable {
                Value::Bool(b) => *b,
                Value::String(s) => super::volumes::boolean("bootable", s)?,
                other => {
                    return Err(ApiError::bad_request(format!(
                        "Invalid input for field/attribute bootable. Value: {other}. It must be a boolean"
                    )));
                }
            };
            // 202 as every action but `os-initialize_connection` (Cinder answers 200 with no
            // body, which the one document of this endpoint cannot say apart from a connection).
            let change = VolumeChange { bootable: Some(bootable), ..Default::default() };
            service.commands().update_volume(caller, volume, change).await?;
        }
        "os-reimage" => {
            let arg: Reimage = argument(&name, value, None)?;
            uuid_param("image_id", &arg.image_id)?;
            service.volumes().reimage(&caller, &volume, arg.reimage_reserved).await?;
        }
        "os-set_image_metadata" | "os-unset_image_metadata" | "os-show_image_metadata" => {
            let metadata = match name.as_str() {
                "os-set_image_metadata" => {
                    let arg: SetImageMetadata = argument(&name, value, None)?;
                    service.commands().update_image_metadata(caller, volume, arg.metadata, None).await?
                }
                "os-unset_image_metadata" => {
                    let arg: UnsetImageMetadata = argument(&name, value, None)?;
                    let changes = Default::default();
                    service.commands().update_image_metadata(caller, volume, changes, Some(arg.key)).await?
                }
                _ => service.volumes().show(&caller, &volume).await?.0.image_metadata,
            };
            // 200 with the properties (Cinder's unset answers 200 with no body: its properties
            // left are answered here, as the one document of this endpoint says).
            return Ok(Json(ActionAnswer::ImageMetadata(ImageMetadataBody { metadata })).into_response());
        }
        "os-extend_volume_completion" => {
            let _: ExtendCompletion = argument(&name, value, None)?;
            service.volumes().extend_volume_completion(&caller, &volume).await?;
        }
        _ => unreachable!("every name in ACTIONS has a branch"),
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

/// Cinder's `os-attach` schema: a mountpoint of 1 to 255 characters, an instance UUID or a host
/// name (at most 255 characters), and `rw` (the default) or `ro`.
fn attach_request(arg: Attach) -> Result<LegacyAttach, ApiError> {
    if arg.mountpoint.is_empty() || arg.mountpoint.chars().count() > 255 {
        return Err(ApiError::bad_request(
            "Invalid input for field/attribute mountpoint: it must be 1 to 255 characters",
        ));
    }
    if arg.instance_uuid.is_none() && arg.host_name.is_none() {
        return Err(ApiError::bad_request(
            "Invalid input received: os-attach needs an instance_uuid or a host_name",
        ));
    }
    if arg.host_name.as_ref().is_some_and(|h| h.is_empty() || h.chars().count() > 255) {
        return Err(ApiError::bad_request(
            "Invalid input for field/attribute host_name: it must be 1 to 255 characters",
        ));
    }
    let mode = match super::mode_param(arg.mode.as_deref().unwrap_or("rw"))? {
        AccessMode::Rw => AttachMode::Rw,
        AccessMode::Ro => AttachMode::Ro,
    };
    Ok(LegacyAttach {
        instance_uuid: arg.instance_uuid.as_deref().map(|i| uuid_param("instance_uuid", i)).transpose()?,
        host_name: arg.host_name,
        mountpoint: arg.mountpoint,
        mode,
    })
}

/// The legacy answer nests the driver's data (the attachments API flattens it):
/// `{"driver_volume_type": t, "data": {...}, "enforce_multipath": b}`.
fn nested(flat: Value) -> LegacyConnection {
    let Value::Object(mut data) = flat else {
        return LegacyConnection {
            driver_volume_type: Value::Null,
            data: Map::new(),
            enforce_multipath: false.into(),
        };
    };
    let driver_volume_type = data.remove("driver_volume_type").unwrap_or(Value::Null);
    data.remove("attachment_id");
    let enforce_multipath = data.get("enforce_multipath").cloned().unwrap_or(Value::Bool(false));
    LegacyConnection { driver_volume_type, data, enforce_multipath }
}

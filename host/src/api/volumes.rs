//! `/v3/{project_id}/volumes`: as much of Cinder's volume API as attaching needs and users expect
//! (create, show, list, list detail, update, delete, metadata). Create and delete go through the
//! driver.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::AppState;
use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{
    CONSUMES_QUOTA, RESOURCE_FILTER, TIME_COMPARISON_FILTERS, VOLUME_LIST_COUNT, VOLUME_LIST_GLANCE_METADATA,
    VOLUME_LIST_GROUP, VOLUME_SCHEMA_CHANGES, VOLUME_SUMMARY, VOLUME_SUMMARY_METADATA, Version,
};
use super::openapi::Endpoint;
use super::path::VolumeId;
use super::policy::Rule;
use super::query::{ListSpec, param, parse};
use super::views::{Links, Sight, VolumeBody, VolumeDetailList, VolumeList, volume_detail, volume_summary};
use super::zones::ZONE;
use crate::attach::Caller;
use crate::attach::volumes::{MAX_SIZE_GIB, NewVolume, VolumeChange};
use crate::domain::list::{Compare, Scope, VOLUME_SORT_KEYS, VolumeFilter};

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "volumes";
    vec![
        Endpoint::get("/volumes", index, "listVolumes")
            .summary(TAG, "List volumes")
            .list(&LIST)
            .answers::<VolumeList>(StatusCode::OK, "The volumes"),
        Endpoint::post("/volumes", create, "createVolume")
            .summary(TAG, "Create a volume on the backend of its type")
            .body::<CreateVolumeBody>()
            .answers::<VolumeBody>(StatusCode::ACCEPTED, "The volume")
            .link("show", "showVolume", "id", "/volume/id")
            .link("update", "updateVolume", "id", "/volume/id")
            .link("delete", "deleteVolume", "id", "/volume/id")
            .link("metadata", "showVolumeMetadata", "id", "/volume/id")
            .link("metadataMerge", "mergeVolumeMetadata", "id", "/volume/id")
            .link("metadataReplace", "replaceVolumeMetadata", "id", "/volume/id")
            .link("action", "volumeAction", "id", "/volume/id")
            .link("attach", "createAttachment", "/attachment/volume_uuid", "/volume/id"),
        Endpoint::get("/volumes/detail", detail, "listVolumesDetail")
            .summary(TAG, "List volumes with their details")
            .list(&LIST)
            .answers::<VolumeDetailList>(StatusCode::OK, "The volumes"),
        Endpoint::get("/volumes/summary", summary, "showVolumeSummary")
            .since(VOLUME_SUMMARY)
            .summary(TAG, "How many volumes, their size together, and their metadata's keys and values")
            .query("all_tenants", "Every project's (admins only).")
            .answers::<SummaryBody>(StatusCode::OK, "The summary"),
        Endpoint::get("/volumes/{id}", show, "showVolume")
            .summary(TAG, "Show a volume")
            .answers::<VolumeBody>(StatusCode::OK, "The volume"),
        Endpoint::put("/volumes/{id}", update, "updateVolume")
            .summary(TAG, "Change a volume's name, description or metadata (any status)")
            .body::<UpdateVolumeBody>()
            .answers::<VolumeBody>(StatusCode::OK, "The volume"),
        Endpoint::delete("/volumes/{id}", remove, "deleteVolume")
            .summary(TAG, "Delete a volume that has no attachment")
            .query("force", "`true`: also a volume stuck in `creating` or `deleting` (admins only).")
            .query("cascade", "Accepted and ignored (Berth has no snapshots).")
            .answers_empty(StatusCode::ACCEPTED, "Deleted"),
        Endpoint::get("/volumes/{id}/encryption", encryption_show, "showVolumeEncryptionMetadata")
            .summary(TAG, "A volume's encryption metadata: none (no volume type here is encrypted)")
            .answers::<EncryptionMetadata>(StatusCode::OK, "The encryption metadata"),
        Endpoint::get("/volumes/{id}/metadata", metadata_show, "showVolumeMetadata")
            .summary(TAG, "Show a volume's metadata")
            .answers::<MetadataBody>(StatusCode::OK, "The metadata"),
        Endpoint::post("/volumes/{id}/metadata", metadata_merge, "mergeVolumeMetadata")
            .summary(TAG, "Add to a volume's metadata")
            .body::<MetadataBody>()
            .answers::<MetadataBody>(StatusCode::OK, "The metadata now"),
        Endpoint::put("/volumes/{id}/metadata", metadata_replace, "replaceVolumeMetadata")
            .summary(TAG, "Replace a volume's metadata")
            .body::<MetadataBody>()
            .answers::<MetadataBody>(StatusCode::OK, "The metadata now"),
        Endpoint::get("/volumes/{id}/metadata/{key}", metadata_item, "showVolumeMetadataItem")
            .summary(TAG, "Show one metadata item")
            .answers::<MetaItem>(StatusCode::OK, "The item"),
        Endpoint::delete("/volumes/{id}/metadata/{key}", metadata_delete, "deleteVolumeMetadataItem")
            .summary(TAG, "Delete one metadata item")
            .answers_empty(StatusCode::OK, "Deleted"),
    ]
}

/// `{"metadata": {...}}`: a volume's metadata, key to value.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct MetadataBody {
    /// Keys of 1 to 255 characters, values of at most 255; a volume has at most 128 items.
    #[schemars(extend(
        "propertyNames" = {"minLength": 1, "maxLength": 255},
        "additionalProperties" = {"type": "string", "maxLength": 255}
    ))]
    metadata: BTreeMap<String, String>,
}

/// `{"meta": {"<key>": "<value>"}}`: one metadata item.
#[derive(Serialize, JsonSchema)]
struct MetaItem {
    meta: BTreeMap<String, String>,
}

async fn metadata_show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    VolumeId(id): VolumeId,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MetadataGet)?;
    let (volume, _) = state.service.volumes().show(&caller, &id).await?;
    Ok(Json(MetadataBody { metadata: volume.metadata }).into_response())
}

async fn metadata_change(
    state: AppState,
    caller: Caller,
    id: String,
    changes: BTreeMap<String, String>,
    replace: bool,
) -> Result<Response, ApiError> {
    state.authorize(&caller, if replace { Rule::MetadataUpdate } else { Rule::MetadataCreate })?;
    let metadata = state.service.commands().update_metadata(caller, id, changes, replace, None).await?;
    Ok(Json(MetadataBody { metadata }).into_response())
}

async fn metadata_merge(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    VolumeId(id): VolumeId,
    JsonBody(body): JsonBody<MetadataBody>,
) -> Result<Response, ApiError> {
    metadata_change(state, caller, id, body.metadata, false).await
}

async fn metadata_replace(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    VolumeId(id): VolumeId,
    JsonBody(body): JsonBody<MetadataBody>,
) -> Result<Response, ApiError> {
    metadata_change(state, caller, id, body.metadata, true).await
}

async fn metadata_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    VolumeId(id): VolumeId,
    Path((_, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MetadataGet)?;
    let (volume, _) = state.service.volumes().show(&caller, &id).await?;
    let value = volume
        .metadata
        .get(&key)
        .ok_or_else(|| ApiError::not_found(format!("Metadata item was not found: {key}")))?;
    Ok(Json(MetaItem { meta: BTreeMap::from([(key.clone(), value.clone())]) }).into_response())
}

async fn metadata_delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    VolumeId(id): VolumeId,
    Path((_, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MetadataDelete)?;
    state.service.commands().update_metadata(caller, id, BTreeMap::new(), false, Some(key)).await?;
    Ok(StatusCode::OK.into_response())
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateVolumeBody {
    volume: CreateVolume,
    /// Accepted and ignored.
    #[serde(default, rename = "OS-SCH-HNT:scheduler_hints")]
    _scheduler_hints: Option<Value>,
}

/// Cinder's create schema; the sources Berth does not support are accepted only as `null`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateVolume {
    /// GiB, 1 to 65,536: an integer, or a string holding one.
    #[schemars(required, extend("anyOf" = [
        {"type": "integer", "minimum": 1, "maximum": MAX_SIZE_GIB},
        {"type": "string", "pattern": "^ *0*([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-6]) *$"}
    ]))]
    size: Option<Value>,
    /// At most 255 characters.
    #[serde(default)]
    #[schemars(length(max = 255))]
    name: Option<String>,
    /// At most 255 characters.
    #[serde(default)]
    #[schemars(length(max = 255))]
    display_name: Option<String>,
    /// At most 255 characters.
    #[serde(default)]
    #[schemars(length(max = 255))]
    description: Option<String>,
    /// At most 255 characters.
    #[serde(default)]
    #[schemars(length(max = 255))]
    display_description: Option<String>,
    /// The type's name or id (the configured types; the default type when absent).
    #[serde(default)]
    volume_type: Option<String>,
    /// At most 128 items; keys of 1 to 255 characters, values of at most 255.
    #[serde(default)]
    #[schemars(extend(
        "propertyNames" = {"minLength": 1, "maxLength": 255},
        "maxProperties" = 128,
        "additionalProperties" = {"type": "string", "maxLength": 255}
    ))]
    metadata: Option<BTreeMap<String, String>>,
    /// `nova`, the only zone.
    #[serde(default)]
    #[schemars(extend("enum" = [ZONE, null]))]
    availability_zone: Option<String>,
    /// `true` only with a multiattach type (multiattach comes from the type).
    #[serde(default)]
    multiattach: Option<bool>,
    /// Not supported: `null` only.
    #[serde(default)]
    #[schemars(extend("type" = "null"))]
    snapshot_id: Option<Value>,
    /// Not supported: `null` only.
    #[serde(default)]
    #[schemars(extend("type" = "null"))]
    source_volid: Option<Value>,
    /// Not supported: `null` only.
    #[serde(default, rename = "imageRef")]
    #[schemars(extend("type" = "null"))]
    image_ref: Option<Value>,
    /// Not supported: `null` only.
    #[serde(default)]
    #[schemars(extend("type" = "null"))]
    backup_id: Option<Value>,
    /// Not supported: `null` only.
    #[serde(default)]
    #[schemars(extend("type" = "null"))]
    consistencygroup_id: Option<Value>,
    /// Not supported: `null` only.
    #[serde(default)]
    #[schemars(extend("type" = "null"))]
    group_id: Option<Value>,
    /// Not supported: `null` only.
    #[serde(default)]
    #[schemars(extend("type" = "null"))]
    source_replica: Option<Value>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateVolumeBody {
    volume: UpdateVolume,
}

/// Cinder's update schema: each field present is changed (`null` clears a name or description),
/// each absent one kept; from 3.53 at least one must be present. Names and descriptions lose
/// the white space around them.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateVolume {
    /// At most 255 characters.
    #[serde(default, deserialize_with = "present")]
    #[schemars(length(max = 255))]
    name: Option<Option<String>>,
    /// At most 255 characters (`name` wins when both are given).
    #[serde(default, deserialize_with = "present")]
    #[schemars(length(max = 255))]
    display_name: Option<Option<String>>,
    /// At most 255 characters.
    #[serde(default, deserialize_with = "present")]
    #[schemars(length(max = 255))]
    description: Option<Option<String>>,
    /// At most 255 characters (`description` wins when both are given).
    #[serde(default, deserialize_with = "present")]
    #[schemars(length(max = 255))]
    display_description: Option<Option<String>>,
    /// The whole new metadata (it replaces the old): at most 128 items; keys of 1 to 255
    /// characters, values of at most 255.
    #[serde(default)]
    #[schemars(extend(
        "propertyNames" = {"minLength": 1, "maxLength": 255},
        "maxProperties" = 128,
        "additionalProperties" = {"type": "string", "maxLength": 255}
    ))]
    metadata: Option<BTreeMap<String, String>>,
}

/// A field that is present, `null` or not: `Some(None)` for `null`, `None` (the default) when
/// the field is absent.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    VolumeId(id): VolumeId,
    JsonBody(body): JsonBody<UpdateVolumeBody>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::VolumeUpdate)?;
    let v = body.volume;
    let change = VolumeChange {
        name: v.name.or(v.display_name),
        description: v.description.or(v.display_description),
        metadata: v.metadata,
        bootable: None,
    };
    if version >= VOLUME_SCHEMA_CHANGES
        && change.name.is_none()
        && change.description.is_none()
        && change.metadata.is_none()
    {
        return Err(ApiError::bad_request(
            "Invalid input for field/attribute volume: name, description, display_name, display_description \
             or metadata is required",
        ));
    }
    let view_caller = caller.clone();
    state.service.commands().update_volume(caller, id.clone(), change).await?;
    let (volume, attachments) = state.service.volumes().show(&view_caller, &id).await?;
    let sight = sight(&state, &view_caller).await?;
    let view = volume_detail(&volume, &attachments, &view_caller, version, &links(&state, &headers), &sight);
    Ok(Json(VolumeBody { volume: view }).into_response())
}

fn size(value: Option<&Value>) -> Result<i64, ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "Invalid input for field/attribute size. Value: {}. Volume size must be an integer and greater than 0",
            value.map(Value::to_string).unwrap_or_else(|| "None".into())
        ))
    };
    match value {
        // An integer, however it is written (`2` or `2.0`: JSON Schema's integers).
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 1e15).map(|f| f as i64))
            .filter(|s| *s > 0)
            .ok_or_else(bad),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok().filter(|s| *s > 0).ok_or_else(bad),
        _ => Err(bad()),
    }
}

async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateVolumeBody>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::VolumeCreate)?;
    let v = body.volume;
    for (field, value) in [
        ("snapshot_id", &v.snapshot_id),
        ("source_volid", &v.source_volid),
        ("imageRef", &v.image_ref),
        ("backup_id", &v.backup_id),
        ("consistencygroup_id", &v.consistencygroup_id),
        ("group_id", &v.group_id),
        ("source_replica", &v.source_replica),
    ] {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad_request(format!(
                "Invalid input received: creating a volume from {field} is not supported by this service"
            )));
        }
    }
    if let Some(zone) = v.availability_zone.as_deref().filter(|z| *z != ZONE) {
        return Err(ApiError::bad_request(format!(
            "Invalid input received: Availability zone '{zone}' is invalid."
        )));
    }
    let size = size(v.size.as_ref())?;
    let mut request = NewVolume {
        size_gib: size,
        name: v.name.or(v.display_name),
        description: v.description.or(v.display_description),
        volume_type: v.volume_type,
        metadata: v.metadata.unwrap_or_default(),
    };
    // The type it will have: the one named, or the project's default (default types, 3.62), or
    // the configured default. One that cannot be found is the create's to refuse, after its
    // other checks.
    let vtype = state.service.volume_type_for(&caller.project_id, request.volume_type.as_deref()).await.ok();
    let multiattach = vtype.as_ref().is_some_and(|t| t.multiattach());
    request.volume_type = vtype.map(|t| t.name).or(request.volume_type);
    if v.multiattach == Some(true) && !multiattach {
        return Err(ApiError::bad_request(
            "Invalid input received: multiattach comes from the volume type; use a type with \
             multiattach=\"<is> True\"",
        ));
    }
    if multiattach {
        state.authorize(&caller, Rule::Multiattach)?;
    }
    let view_caller = caller.clone();
    let row = state.service.commands().create_volume(caller, request).await?;
    let (caller, links) = (view_caller, links(&state, &headers));
    let sight = sight(&state, &caller).await?;
    let view = volume_detail(&row, &[], &caller, version, &links, &sight);
    Ok((StatusCode::ACCEPTED, Json(VolumeBody { volume: view })).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    VolumeId(id): VolumeId,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::VolumeGet)?;
    let (volume, attachments) = state.service.volumes().show(&caller, &id).await?;
    let sight = sight(&state, &caller).await?;
    let view = volume_detail(&volume, &attachments, &caller, version, &links(&state, &headers), &sight);
    Ok(Json(VolumeBody { volume: view }).into_response())
}

/// `{"encryption_key_id": null}`: what Cinder answers for a volume of an unencrypted type, as
/// every type here is (Berth has no key manager; a driver may encrypt at rest on its own).
#[derive(Serialize, JsonSchema)]
struct EncryptionMetadata {
    encryption_key_id: Option<String>,
}

async fn encryption_show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    VolumeId(id): VolumeId,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::EncryptionMetadataGet)?;
    state.service.volumes().show(&caller, &id).await?;
    Ok(Json(EncryptionMetadata { encryption_key_id: None }).into_response())
}

/// `{"volume-summary": {...}}`.
#[derive(Serialize, JsonSchema)]
struct SummaryBody {
    #[serde(rename = "volume-summary")]
    volume_summary: SummaryView,
}

#[derive(Serialize, JsonSchema)]
struct SummaryView {
    total_count: i64,
    /// GiB.
    total_size: i64,
    /// From 3.36: each metadata key, with the values it has among the volumes.
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<BTreeMap<String, Vec<String>>>,
}

/// `GET /volumes/summary` (3.12; the metadata from 3.36): the caller's project's volumes, or
/// every project's for an admin who asks with `all_tenants`.
async fn summary(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::VolumeGetAll)?;
    let all_tenants = param(raw.as_deref(), "all_tenants").is_some();
    let scope = if caller.is_admin() && all_tenants { Scope::All } else { caller.own_project() };
    let s = state.service.volumes().summary(scope).await?;
    let metadata = (version >= VOLUME_SUMMARY_METADATA)
        .then(|| s.metadata.into_iter().map(|(k, values)| (k, values.into_iter().collect())).collect());
    let view = SummaryView { total_count: s.count, total_size: s.size_gib, metadata };
    Ok(Json(SummaryBody { volume_summary: view }).into_response())
}

/// Which node serves each volume, for an admin's view (`os-vol-host-attr:host`).
/// What `caller` sees of volumes (see [`Sight`]).
async fn sight(state: &AppState, caller: &Caller) -> Result<Sight, ApiError> {
    let hosts = match caller.is_admin() {
        true => Some(state.service.hosts().await?),
        false => None,
    };
    Ok(Sight { hosts, image_metadata: state.policy.allows(caller, Rule::ImageMetadataShow) })
}

pub(super) const LIST: ListSpec = ListSpec {
    sort_keys: VOLUME_SORT_KEYS,
    // cinderclient's `--sort name` sends `display_name`; Cinder's column for the size is `size`.
    sort_aliases: &[("display_name", "name"), ("size", "size_gib")],
    filters: &[
        ("name", "name"),
        ("status", "status"),
        ("volume_type", "volume_type"),
        ("multiattach", "multiattach"),
    ],
    // Filters that appear at a microversion, or that need parsing (checked in `list`).
    flags: &[
        "with_count",
        "is_public",
        "created_at",
        "updated_at",
        "consumes_quota",
        "metadata",
        "size",
        "bootable",
        "availability_zone",
        "migration_status",
        "group_id",
        "glance_metadata",
        "project_id",
    ],
};

/// A boolean filter's or argument's value, as Cinder reads one from 3.2 on
/// (`strutils.bool_from_string`, strict).
pub(super) fn boolean(key: &str, value: &str) -> Result<bool, ApiError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Ok(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Ok(false),
        _ => Err(ApiError::bad_request(format!("Invalid input received: {key}={value:?} is not a boolean"))),
    }
}

/// The `metadata` filter's value: a dictionary of strings, as Python writes one (what
/// cinderclient's `list --metadata k=v` sends: `{'k': 'v'}`, read by Cinder with
/// `ast.literal_eval`) or as JSON; numbers stand for their decimal text.
fn metadata_filter(value: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "Invalid input received: metadata={value:?}: give a dictionary of strings, e.g. {{'key': 'value'}}"
        ))
    };
    let map: BTreeMap<String, Value> = serde_json::from_str(value)
        .ok()
        .or_else(|| serde_json::from_str(&python_literal_as_json(value)?).ok())
        .ok_or_else(bad)?;
    map.into_iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k, s)),
            Value::Number(n) => Ok((k, n.to_string())),
            _ => Err(bad()),
        })
        .collect()
}

/// A Python literal of strings, numbers and punctuation written as JSON: its strings in single
/// or double quotes (with Python's backslash escapes of quotes and backslashes) become JSON
/// strings; other characters stay. `None` for an unterminated string.
fn python_literal_as_json(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\'' && c != '"' {
            out.push(c);
            continue;
        }
        let mut string = String::new();
        loop {
            match chars.next()? {
                '\\' => string.push(chars.next()?),
                q if q == c => break,
                other => string.push(other),
            }
        }
        out.push_str(&Value::from(string).to_string());
    }
    Some(out)
}

/// A time filter's value, `<op>:<ISO 8601 time>` (microversion 3.60; Cinder's
/// `_process_volume_filters`): `gt`, `gte`, `eq`, `neq`, `lt` or `lte`, and a time with or
/// without its offset (UTC when it has none), or a date.
fn time_filter(key: &str, value: &str) -> Result<(Compare, i64), ApiError> {
    let bad = || {
        ApiError::bad_request(format!(
            "Invalid input received: {key}={value:?}: use <op>:<time>, op one of gt, gte, eq, neq, lt, lte, \
             and an ISO 8601 time"
        ))
    };
    let (op, at) = value.split_once(':').ok_or_else(bad)?;
    let op = Compare::parse(op).ok_or_else(bad)?;
    Ok((op, parse_time(at).ok_or_else(bad)?))
}

/// An ISO 8601 time with or without its offset (UTC when it has none), or a date, in
/// microseconds since the epoch.
pub fn parse_time(at: &str) -> Option<i64> {
    let at = at.trim();
    let parsed = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .ok()
        .or_else(|| {
            let naive = time::macros::format_description!(
                version = 2,
                "[year]-[month]-[day][optional [T[hour]:[minute][optional [:[second][optional [.[subsecond]]]]]]]"
            );
            time::PrimitiveDateTime::parse(at, naive)
                .ok()
                .or_else(|| {
                    time::Date::parse(at, time::macros::format_description!("[year]-[month]-[day]"))
                        .ok()
                        .map(|d| d.midnight())
                })
                .map(|t| t.assume_utc())
        })
    ;
    parsed.map(|t| (t.unix_timestamp_nanos() / 1000) as i64)
}

async fn list(
    state: &AppState,
    caller: &Caller,
    version: Version,
    headers: &HeaderMap,
    raw: Option<String>,
    detailed: bool,
) -> Result<Response, ApiError> {
    state.authorize(caller, Rule::VolumeGetAll)?;
    let q = parse(raw.as_deref(), &LIST, version)?;
    let scope = if caller.is_admin() && q.all_tenants { Scope::All } else { caller.own_project() };
    let multiattach = match q.filters.get("multiattach").map(|s| s.to_ascii_lowercase()) {
        None => None,
        Some(s) if s == "true" => Some(true),
        Some(s) if s == "false" => Some(false),
        Some(s) => {
            return Err(ApiError::bad_request(format!(
                "Invalid input received: multiattach={s:?} is not a boolean"
            )));
        }
    };
    // Filters that came with a microversion are unknown below it: 400 from 3.31 on, as any
    // unknown filter; ignored before, as Cinder ignored unknown filters.
    let mut too_new: Vec<&str> = Vec::new();
    let mut since = |key: &'static str, at: Version| -> Option<&String> {
        let value = q.flags.get(key)?;
        if version >= at {
            Some(value)
        } else {
            too_new.push(key);
            None
        }
    };
    let created_at =
        since("created_at", TIME_COMPARISON_FILTERS).map(|v| time_filter("created_at", v)).transpose()?;
    let updated_at =
        since("updated_at", TIME_COMPARISON_FILTERS).map(|v| time_filter("updated_at", v)).transpose()?;
    let consumes_quota =
        since("consumes_quota", CONSUMES_QUOTA).map(|v| boolean("consumes_quota", v)).transpose()?;
    let group_id = since("group_id", VOLUME_LIST_GROUP).is_some();
    let glance_metadata = since("glance_metadata", VOLUME_LIST_GLANCE_METADATA).cloned();
    if !too_new.is_empty() && version >= RESOURCE_FILTER {
        return Err(ApiError::bad_request(format!(
            "Invalid filters {} are found in query options.",
            too_new.join(",")
        )));
    }
    let flag = |key: &str| q.flags.get(key).map(String::as_str);
    let metadata = flag("metadata").map(metadata_filter).transpose()?.unwrap_or_default();
    let image_metadata = glance_metadata.as_deref().map(metadata_filter).transpose()?.unwrap_or_default();
    let size_gib = flag("size")
        .map(|v| {
            v.trim().parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("Invalid input received: size={v:?} is not an integer"))
            })
        })
        .transpose()?;
    let bootable = flag("bootable").map(|v| boolean("bootable", v)).transpose()?;
    // Every volume here is in zone `nova`, counts against quota, and is in no migration or
    // group: a filter asking otherwise matches nothing.
    let mut nothing = flag("availability_zone").is_some_and(|zone| zone != ZONE)
        || consumes_quota == Some(false)
        || flag("migration_status").is_some()
        || group_id;
    // An admin's `project_id` (cinderclient's `list --all-tenants --tenant <project>`); for
    // others it is an unknown filter, as in Cinder.
    let scope = match flag("project_id") {
        None => scope,
        Some(_) if !caller.is_admin() && version < RESOURCE_FILTER => scope,
        Some(_) if !caller.is_admin() => {
            return Err(ApiError::bad_request("Invalid filters project_id are found in query options."));
        }
        Some(project) => match scope {
            Scope::All => Scope::Project(project),
            Scope::Project(own) => {
                nothing |= own != project;
                scope
            }
        },
    };
    let filter = VolumeFilter {
        name: q.filters.get("name").cloned(),
        status: q.filters.get("status").cloned(),
        volume_type: q.filters.get("volume_type").cloned(),
        multiattach,
        created_at,
        updated_at,
        metadata,
        image_metadata,
        size_gib,
        bootable,
        nothing,
    };
    let rows = state.service.volumes().list(scope, &filter, &q.page).await?;
    let links = links(state, headers);
    let count = match version >= VOLUME_LIST_COUNT
        && q.flags.get("with_count").is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        true => Some(state.service.volumes().count(scope, &filter).await?),
        false => None,
    };
    if !detailed {
        let volumes = rows.iter().map(|(v, _)| volume_summary(v, &links)).collect();
        return Ok(Json(VolumeList { volumes, count }).into_response());
    }
    let sight = sight(state, caller).await?;
    let volumes = rows.iter().map(|(v, a)| volume_detail(v, a, caller, version, &links, &sight)).collect();
    Ok(Json(VolumeDetailList { volumes, count }).into_response())
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, version, &headers, raw, false).await
}

async fn detail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, version, &headers, raw, true).await
}

/// `DELETE /volumes/{id}[?force=true][&cascade=...]`: `force` (admins only) also deletes volumes
/// stuck in `creating` or `deleting`; a volume with attachments is never deleted.
async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    VolumeId(id): VolumeId,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let force = param(raw.as_deref(), "force")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"));
    state.authorize(&caller, if force { Rule::VolumeForceDelete } else { Rule::VolumeDelete })?;
    state.service.commands().delete_volume(caller, id, force).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// Links point where the client reached us, unless a public endpoint is configured.
pub(super) fn links(state: &AppState, headers: &HeaderMap) -> Links {
    let base = state.public_endpoint.clone().unwrap_or_else(|| {
        let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        format!("{}://{host}", state.scheme)
    });
    Links { base: base.trim_end_matches('/').to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_filter_is_read_as_python_or_json_writes_a_dictionary() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        // What cinderclient sends for `list --metadata a=b c=d`.
        assert_eq!(metadata_filter("{'a': 'b', 'c': 'd'}").unwrap(), map(&[("a", "b"), ("c", "d")]));
        assert_eq!(metadata_filter(r#"{"a": "b"}"#).unwrap(), map(&[("a", "b")]));
        assert_eq!(metadata_filter("{'n': 5}").unwrap(), map(&[("n", "5")]));
        // Quotes of the other kind and escaped ones, inside a string.
        assert_eq!(
            metadata_filter(r#"{'it"s': 'don\'t', "back": "a\\b"}"#).unwrap(),
            map(&[("it\"s", "don't"), ("back", "a\\b")])
        );
        assert_eq!(metadata_filter("{}").unwrap(), map(&[]));
        for bad in ["a=b", "{'a': 'b'", "{'a': ['b']}", "['a']", "{'a': None}", "{'a: 'b'}"] {
            assert_eq!(metadata_filter(bad).unwrap_err().status.as_u16(), 400, "{bad}");
        }
    }

    #[test]
    fn boolean_filters_are_read_strictly() {
        assert!(boolean("bootable", "True").unwrap() && !boolean("bootable", "0").unwrap());
        assert_eq!(boolean("bootable", "maybe").unwrap_err().status.as_u16(), 400);
    }
}

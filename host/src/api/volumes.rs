//! `/v3/{project_id}/volumes`: as much of Cinder's volume API as attaching needs and users expect
//! (create, show, list, list detail, delete). Create and delete go through the driver.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{VOLUME_LIST_COUNT, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::{ListSpec, parse};
use super::views::{Links, VolumeBody, VolumeDetailList, VolumeList, volume_detail, volume_summary};
use super::{AppState, uuid_param};
use crate::attach::Caller;
use crate::attach::list::{Scope, VOLUME_SORT_KEYS, VolumeFilter};
use crate::attach::nodes::Hosts;
use crate::attach::volumes::{MAX_SIZE_GIB, NewVolume};

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
        Endpoint::get("/volumes/{id}", show, "showVolume")
            .summary(TAG, "Show a volume")
            .answers::<VolumeBody>(StatusCode::OK, "The volume"),
        Endpoint::delete("/volumes/{id}", remove, "deleteVolume")
            .summary(TAG, "Delete a volume that has no attachment")
            .query("force", "`true`: also a volume stuck in `creating` or `deleting` (admins only).")
            .query("cascade", "Accepted and ignored (Berth has no snapshots).")
            .answers_empty(StatusCode::ACCEPTED, "Deleted"),
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
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MetadataGet)?;
    let id = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    let (volume, _) = state.service.show_volume(&caller, &id).await?;
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
    let id = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    let metadata = state
        .service
        .owned((caller, id, changes), move |s, (caller, id, changes)| async move {
            s.update_metadata(&caller, &id, changes, replace, None).await
        })
        .await?;
    Ok(Json(MetadataBody { metadata }).into_response())
}

async fn metadata_merge(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<MetadataBody>,
) -> Result<Response, ApiError> {
    metadata_change(state, caller, id, body.metadata, false).await
}

async fn metadata_replace(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<MetadataBody>,
) -> Result<Response, ApiError> {
    metadata_change(state, caller, id, body.metadata, true).await
}

async fn metadata_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MetadataGet)?;
    let id = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    let (volume, _) = state.service.show_volume(&caller, &id).await?;
    let value = volume
        .metadata
        .get(&key)
        .ok_or_else(|| ApiError::not_found(format!("Metadata item was not found: {key}")))?;
    Ok(Json(MetaItem { meta: BTreeMap::from([(key.clone(), value.clone())]) }).into_response())
}

async fn metadata_delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MetadataDelete)?;
    let id = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    state
        .service
        .owned((caller, id, key), |s, (caller, id, key)| async move {
            s.update_metadata(&caller, &id, BTreeMap::new(), false, Some(&key)).await
        })
        .await?;
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
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    display_description: Option<String>,
    /// The type's name or id (the configured types; the default type when absent).
    #[serde(default)]
    volume_type: Option<String>,
    /// Keys of 1 to 255 characters.
    #[serde(default)]
    #[schemars(extend("propertyNames" = {"minLength": 1, "maxLength": 255}))]
    metadata: Option<BTreeMap<String, String>>,
    /// `nova`, the only zone.
    #[serde(default)]
    #[schemars(extend("enum" = ["nova", null]))]
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
    if let Some(zone) = v.availability_zone.as_deref().filter(|z| *z != "nova") {
        return Err(ApiError::bad_request(format!(
            "Invalid input received: Availability zone '{zone}' is invalid."
        )));
    }
    let size = size(v.size.as_ref())?;
    let request = NewVolume {
        size_gib: size,
        name: v.name.or(v.display_name),
        description: v.description.or(v.display_description),
        volume_type: v.volume_type,
        metadata: v.metadata.unwrap_or_default(),
    };
    if let Some(key) = request.metadata.keys().find(|k| k.is_empty() || k.len() > 255) {
        return Err(ApiError::bad_request(format!(
            "Invalid input received: metadata key {key:?} must be 1 to 255 characters"
        )));
    }
    if v.multiattach == Some(true) {
        let multiattach = state
            .service
            .catalog()
            .volume_type(request.volume_type.as_deref())
            .is_some_and(|t| t.multiattach());
        if !multiattach {
            return Err(ApiError::bad_request(
                "Invalid input received: multiattach comes from the volume type; use a type with \
                 multiattach=\"<is> True\"",
            ));
        }
    }
    let view_caller = caller.clone();
    let row = state
        .service
        .owned(
            (caller, request),
            |s, (caller, request)| async move { s.create_volume(&caller, request).await },
        )
        .await?;
    let (caller, links) = (view_caller, links(&state, &headers));
    let hosts = hosts(&state, &caller).await?;
    let view = volume_detail(&row, &[], &caller, version, &links, hosts.as_ref());
    Ok((StatusCode::ACCEPTED, Json(VolumeBody { volume: view })).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::VolumeGet)?;
    let id = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    let (volume, attachments) = state.service.show_volume(&caller, &id).await?;
    let hosts = hosts(&state, &caller).await?;
    let view =
        volume_detail(&volume, &attachments, &caller, version, &links(&state, &headers), hosts.as_ref());
    Ok(Json(VolumeBody { volume: view }).into_response())
}

/// Which node serves each volume, for an admin's view (`os-vol-host-attr:host`).
async fn hosts(state: &AppState, caller: &Caller) -> Result<Option<Hosts>, ApiError> {
    if !caller.is_admin() {
        return Ok(None);
    }
    Ok(Some(state.service.hosts().await?))
}

const LIST: ListSpec = ListSpec {
    sort_keys: VOLUME_SORT_KEYS,
    filters: &[
        ("name", "name"),
        ("status", "status"),
        ("volume_type", "volume_type"),
        ("multiattach", "multiattach"),
    ],
    flags: &["with_count", "is_public"],
};

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
    let filter = VolumeFilter {
        name: q.filters.get("name").cloned(),
        status: q.filters.get("status").cloned(),
        volume_type: q.filters.get("volume_type").cloned(),
        multiattach,
    };
    let rows = state.service.list_volumes(scope, &filter, &q.page).await?;
    let links = links(state, headers);
    let count = match version >= VOLUME_LIST_COUNT
        && q.flags.get("with_count").is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        true => Some(state.service.count_volumes(scope, &filter).await?),
        false => None,
    };
    if !detailed {
        let volumes = rows.iter().map(|(v, _)| volume_summary(v, &links)).collect();
        return Ok(Json(VolumeList { volumes, count }).into_response());
    }
    let hosts = hosts(state, caller).await?;
    let volumes =
        rows.iter().map(|(v, a)| volume_detail(v, a, caller, version, &links, hosts.as_ref())).collect();
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
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let id = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    let force = form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
        .any(|(k, v)| k == "force" && matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"));
    state.authorize(&caller, if force { Rule::VolumeForceDelete } else { Rule::VolumeDelete })?;
    state
        .service
        .owned((caller, id), move |s, (caller, id)| async move { s.delete_volume(&caller, &id, force).await })
        .await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// Links point where the client reached us, unless a public endpoint is configured.
pub(super) fn links(state: &AppState, headers: &HeaderMap) -> Links {
    let base = state.public_endpoint.clone().unwrap_or_else(|| {
        let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        format!("http://{host}")
    });
    Links { base: base.trim_end_matches('/').to_string() }
}

//! `/v3/{project_id}/volumes`: as much of Cinder's volume API as attaching needs and users expect
//! (create, show, list, list detail, delete). Create and delete go through the driver.

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{VOLUME_LIST_COUNT, Version};
use super::policy::Rule;
use super::query::{ListSpec, parse};
use super::views::{Links, volume_detail, volume_summary};
use super::{AppState, uuid_param};
use crate::attach::Caller;
use crate::attach::list::{Scope, VOLUME_SORT_KEYS, VolumeFilter};
use crate::attach::nodes::Hosts;
use crate::attach::volumes::NewVolume;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/volumes", get(index).post(create))
        .route("/volumes/detail", get(detail))
        .route("/volumes/{id}", get(show).delete(remove))
        .route("/volumes/{id}/metadata", get(metadata_show).post(metadata_merge).put(metadata_replace))
        .route("/volumes/{id}/metadata/{key}", get(metadata_item).delete(metadata_delete))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MetadataBody {
    metadata: BTreeMap<String, String>,
}

async fn metadata_show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MetadataGet)?;
    let id = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    let (volume, _) = state.service.show_volume(&caller, &id).await?;
    Ok(Json(json!({ "metadata": volume.metadata })).into_response())
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
    Ok(Json(json!({ "metadata": metadata })).into_response())
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
    Ok(Json(json!({ "meta": { key: value } })).into_response())
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    volume: CreateVolume,
    #[serde(default, rename = "OS-SCH-HNT:scheduler_hints")]
    _scheduler_hints: Option<Value>,
}

/// Cinder's create schema; the sources Berth does not support are accepted only as `null`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateVolume {
    size: Option<Value>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    display_description: Option<String>,
    #[serde(default)]
    volume_type: Option<String>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    availability_zone: Option<String>,
    #[serde(default)]
    multiattach: Option<bool>,
    #[serde(default)]
    snapshot_id: Option<Value>,
    #[serde(default)]
    source_volid: Option<Value>,
    #[serde(default, rename = "imageRef")]
    image_ref: Option<Value>,
    #[serde(default)]
    backup_id: Option<Value>,
    #[serde(default)]
    consistencygroup_id: Option<Value>,
    #[serde(default)]
    group_id: Option<Value>,
    #[serde(default)]
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
        Some(Value::Number(n)) => n.as_i64().filter(|s| *s > 0).ok_or_else(bad),
        Some(Value::String(s)) => s.trim().parse::<i64>().ok().filter(|s| *s > 0).ok_or_else(bad),
        _ => Err(bad()),
    }
}

async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateBody>,
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
    Ok((StatusCode::ACCEPTED, Json(json!({ "volume": view }))).into_response())
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
    Ok(Json(json!({ "volume": view })).into_response())
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
    let hosts = if detailed { hosts(state, caller).await? } else { None };
    let views: Vec<Value> = rows
        .iter()
        .map(|(v, a)| {
            if detailed {
                volume_detail(v, a, caller, version, &links, hosts.as_ref())
            } else {
                volume_summary(v, &links)
            }
        })
        .collect();
    let mut body = json!({ "volumes": views });
    if version >= VOLUME_LIST_COUNT
        && q.flags.get("with_count").is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        body["count"] = json!(state.service.count_volumes(scope, &filter).await?);
    }
    Ok(Json(body).into_response())
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

//! `/v3/{project_id}/types`: the configured volume types, each naming a backend, and their extra
//! specs (`cinder extra-specs-list`). Types are Berth's configuration (`[[volume_types]]`), so
//! there is no call that makes or changes one. A member sees only the extra specs Cinder shows
//! users (`multiattach`, ...); an admin sees all.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::AppState;
use super::error::ApiError;
use super::openapi::Endpoint;
use super::policy::Rule;
use super::views::{VolumeTypeBody, VolumeTypeList, volume_type};
use crate::attach::Caller;
use crate::attach::catalog::VolumeType;

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "volume types";
    vec![
        Endpoint::get("/types", index, "listVolumeTypes")
            .summary(TAG, "List the volume types")
            .answers::<VolumeTypeList>(StatusCode::OK, "The types"),
        Endpoint::get("/types/{id}", show, "showVolumeType")
            .summary(TAG, "Show a volume type (by id or name; `default` for the default type)")
            .answers::<VolumeTypeBody>(StatusCode::OK, "The type"),
        Endpoint::get("/types/{id}/encryption", encryption, "showVolumeTypeEncryption")
            .summary(TAG, "A volume type's encryption: none (`{}`; no type here is encrypted; admins only)")
            .answers::<BTreeMap<String, String>>(StatusCode::OK, "`{}`"),
        Endpoint::get("/types/{id}/extra_specs", extra_specs, "listVolumeTypeExtraSpecs")
            .summary(TAG, "A volume type's extra specs (a member's: those Cinder shows users)")
            .answers::<ExtraSpecs>(StatusCode::OK, "The extra specs"),
        Endpoint::get("/types/{id}/extra_specs/{key}", extra_spec, "showVolumeTypeExtraSpec")
            .summary(TAG, "One extra spec of a volume type")
            .answers::<BTreeMap<String, String>>(StatusCode::OK, "`{key: value}`"),
    ]
}

/// `{"extra_specs": {...}}`.
#[derive(serde::Serialize, schemars::JsonSchema)]
struct ExtraSpecs {
    extra_specs: BTreeMap<String, String>,
}

/// A type by id or name; `default`: the caller's project's default type (3.62), or the
/// configured default.
async fn find(state: &AppState, caller: &Caller, id: &str) -> Result<VolumeType, ApiError> {
    if id == "default" {
        return Ok(state.service.volume_type_for(&caller.project_id, None).await?);
    }
    let types = &state.service.catalog().types;
    types
        .iter()
        .find(|t| t.id == id || t.name == id)
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("Volume type {id} could not be found.")))
}

/// Cinder's answer for a type without encryption, as every type here is: `{}`.
async fn encryption(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TypeEncryptionGet)?;
    find(&state, &caller, &id).await?;
    Ok(Json(BTreeMap::<String, String>::new()).into_response())
}

async fn extra_specs(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ExtraSpecsGetAll)?;
    let t = find(&state, &caller, &id).await?;
    Ok(Json(ExtraSpecs { extra_specs: volume_type(&t, &caller, false).extra_specs }).into_response())
}

async fn extra_spec(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, key)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ExtraSpecsGet)?;
    let t = find(&state, &caller, &id).await?;
    let Some(value) = volume_type(&t, &caller, false).extra_specs.remove(&key) else {
        return Err(ApiError::not_found(format!("Volume Type {id} has no extra specs with key {key}.")));
    };
    Ok(Json(BTreeMap::from([(key, value)])).into_response())
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TypeGetAll)?;
    let qos = state.policy.allows(&caller, Rule::TypeQosSpecsId);
    let volume_types = state.service.catalog().types.iter().map(|t| volume_type(t, &caller, qos)).collect();
    Ok(Json(VolumeTypeList { volume_types }).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TypeGet)?;
    let t = find(&state, &caller, &id).await?;
    let qos = state.policy.allows(&caller, Rule::TypeQosSpecsId);
    Ok(Json(VolumeTypeBody { volume_type: volume_type(&t, &caller, qos) }).into_response())
}

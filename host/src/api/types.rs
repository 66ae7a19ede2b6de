//! `/v3/{project_id}/types`: the configured volume types, each naming a backend.

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

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "volume types";
    vec![
        Endpoint::get("/types", index, "listVolumeTypes")
            .summary(TAG, "List the volume types")
            .answers::<VolumeTypeList>(StatusCode::OK, "The types"),
        Endpoint::get("/types/{id}", show, "showVolumeType")
            .summary(TAG, "Show a volume type (by id or name; `default` for the default type)")
            .answers::<VolumeTypeBody>(StatusCode::OK, "The type"),
    ]
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TypeGetAll)?;
    let volume_types = state.service.catalog().types.iter().map(|t| volume_type(t, &caller)).collect();
    Ok(Json(VolumeTypeList { volume_types }).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TypeGet)?;
    let catalog = state.service.catalog();
    let t = match id.as_str() {
        "default" => catalog.volume_type(None),
        id => catalog.types.iter().find(|t| t.id == id || t.name == id),
    }
    .ok_or_else(|| ApiError::not_found(format!("Volume type {id} could not be found.")))?;
    Ok(Json(VolumeTypeBody { volume_type: volume_type(t, &caller) }).into_response())
}

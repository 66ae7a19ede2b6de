//! `/v3/{project_id}/types`: the configured volume types, each naming a backend.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use super::policy::Rule;
use super::views::volume_type;
use crate::attach::Caller;

pub fn routes() -> Router<AppState> {
    Router::new().route("/types", get(index)).route("/types/{id}", get(show))
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TypeGetAll)?;
    let types: Vec<_> = state.service.catalog().types.iter().map(|t| volume_type(t, &caller)).collect();
    Ok(Json(json!({ "volume_types": types })).into_response())
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
    Ok(Json(json!({ "volume_type": volume_type(t, &caller) })).into_response())
}

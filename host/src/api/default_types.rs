//! `/v3/{project_id}/default-types` (3.62; `cinder default-type-set`, `default-type-list`,
//! `default-type-unset`; admins): a project's own default volume type, which a volume made there
//! without a type gets (`attach/default_types.rs`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::check_project;
use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::DEFAULT_TYPE_OVERRIDES;
use super::openapi::Endpoint;
use super::policy::Rule;
use crate::attach::Caller;

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "default types";
    vec![
        Endpoint::put("/default-types/{id}", set, "setDefaultType")
            .since(DEFAULT_TYPE_OVERRIDES)
            .summary(TAG, "Set a project's default volume type")
            .body::<DefaultTypeSet>()
            .answers::<DefaultTypeBody>(StatusCode::OK, "The project's default type"),
        Endpoint::get("/default-types/{id}", show, "showDefaultType")
            .since(DEFAULT_TYPE_OVERRIDES)
            .summary(TAG, "A project's default volume type")
            .answers::<DefaultTypeBody>(StatusCode::OK, "The project's default type"),
        Endpoint::get("/default-types", index, "listDefaultTypes")
            .since(DEFAULT_TYPE_OVERRIDES)
            .summary(TAG, "Every project's default volume type")
            .answers::<DefaultTypeList>(StatusCode::OK, "The default types"),
        Endpoint::delete("/default-types/{id}", unset, "unsetDefaultType")
            .since(DEFAULT_TYPE_OVERRIDES)
            .summary(TAG, "Unset a project's default volume type: the configured default again")
            .answers_empty(StatusCode::NO_CONTENT, "Unset"),
    ]
}

/// `{"default_type": {"volume_type": "<name or id>"}}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DefaultTypeSet {
    default_type: NamedType,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NamedType {
    volume_type: String,
}

/// `{"default_type": {"project_id": "...", "volume_type_id": "..."}}`.
#[derive(Serialize, JsonSchema)]
struct DefaultTypeBody {
    default_type: DefaultTypeView,
}

/// `{"default_types": [...]}`.
#[derive(Serialize, JsonSchema)]
struct DefaultTypeList {
    default_types: Vec<DefaultTypeView>,
}

#[derive(Serialize, JsonSchema)]
struct DefaultTypeView {
    project_id: String,
    volume_type_id: String,
}

async fn set(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project): Path<String>,
    JsonBody(body): JsonBody<DefaultTypeSet>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::DefaultTypeSet)?;
    check_project(&project)?;
    let volume_type_id = state.service.set_default_type(&project, &body.default_type.volume_type).await?;
    Ok(Json(DefaultTypeBody { default_type: DefaultTypeView { project_id: project, volume_type_id } })
        .into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::DefaultTypeGet)?;
    check_project(&project)?;
    let Some(volume_type_id) = state.service.default_type_of(&project).await? else {
        return Err(ApiError::not_found(format!("Default type for project {project} not found.")));
    };
    Ok(Json(DefaultTypeBody { default_type: DefaultTypeView { project_id: project, volume_type_id } })
        .into_response())
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::DefaultTypeGetAll)?;
    let default_types = state
        .service
        .default_types()
        .await?
        .into_iter()
        .map(|(project_id, volume_type_id)| DefaultTypeView { project_id, volume_type_id })
        .collect();
    Ok(Json(DefaultTypeList { default_types }).into_response())
}

async fn unset(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(project): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::DefaultTypeUnset)?;
    check_project(&project)?;
    state.service.unset_default_type(&project).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

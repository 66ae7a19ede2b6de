//! `/v3/{project_id}/attachments` (3.27+; `os-complete` 3.44; `mode` 3.54): request schemas,
//! wrappers and status codes as Cinder has them (`cinder/api/v3/attachments.py`,
//! `cinder/api/schemas/attachments.py`).

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{ATTACHMENT_CREATE_MODE, NEW_ATTACH, NEW_ATTACH_COMPLETION, Version};
use super::policy::Rule;
use super::query::{ListSpec, parse};
use super::views::{attachment_detail, attachment_summary};
use super::{AppState, uuid_param};
use crate::attach::attachments::NewAttachment;
use crate::attach::list::{ATTACHMENT_SORT_KEYS, AttachmentFilter, Scope};
use crate::attach::model::{Attachment, Connector};
use crate::attach::{AttachError, Caller};
use crate::runtime::contract::AccessMode;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/attachments", get(index).post(create))
        .route("/attachments/detail", get(detail))
        .route("/attachments/{id}", get(show).put(update).delete(remove))
        .route("/attachments/{id}/action", post(action))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    attachment: CreateAttachment,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateAttachment {
    volume_uuid: String,
    #[serde(default)]
    instance_uuid: Option<String>,
    #[serde(default)]
    connector: Option<Map<String, Value>>,
    #[serde(default)]
    mode: Option<String>,
}

async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<Response, ApiError> {
    version.require(NEW_ATTACH)?;
    state.authorize(&caller, Rule::AttachmentCreate)?;
    let a = body.attachment;
    if a.mode.is_some() && version < ATTACHMENT_CREATE_MODE {
        return Err(ApiError::bad_request(
            "Invalid input for field/attribute attachment: Additional properties are not allowed ('mode' was unexpected)",
        ));
    }
    if let Some(mode) = &a.mode
        && mode != "rw"
        && mode != "ro"
    {
        return Err(ApiError::bad_request(format!(
            "Invalid input for field/attribute mode. Value: {mode}. '{mode}' is not one of ['rw', 'ro']"
        )));
    }
    let request = NewAttachment {
        volume_id: uuid_param("volume_uuid", &a.volume_uuid)?,
        instance_uuid: a.instance_uuid.as_deref().map(|i| uuid_param("instance_uuid", i)).transpose()?,
        connector: a.connector.filter(|c| !c.is_empty()).map(connector).transpose()?,
        mode: a.mode.map(|m| if m == "ro" { AccessMode::Ro } else { AccessMode::Rw }),
        legacy: false,
    };
    let row = state
        .service
        .owned((caller, request), |s, (caller, request)| async move {
            s.create_attachment(&caller, request).await
        })
        .await?;
    Ok(Json(json!({ "attachment": attachment_detail(&row) })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    attachment: UpdateAttachment,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateAttachment {
    connector: Map<String, Value>,
}

async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<UpdateBody>,
) -> Result<Response, ApiError> {
    version.require(NEW_ATTACH)?;
    state.authorize(&caller, Rule::AttachmentUpdate)?;
    if body.attachment.connector.is_empty() {
        return Err(ApiError::bad_request(
            "Invalid input for field/attribute connector. Value: {}. {} does not have enough properties",
        ));
    }
    let id = uuid_param("attachment_id", &id).map_err(|_| crate::attach::attachment_not_found(&id))?;
    let c = connector(body.attachment.connector)?;
    let row = state
        .service
        .owned(
            (caller, id, c),
            |s, (caller, id, c)| async move { s.update_attachment(&caller, &id, c).await },
        )
        .await?;
    Ok(Json(json!({ "attachment": attachment_detail(&row) })).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    version.require(NEW_ATTACH)?;
    state.authorize(&caller, Rule::AttachmentGet)?;
    let id = uuid_param("attachment_id", &id).map_err(|_| crate::attach::attachment_not_found(&id))?;
    let (row, shared) = state.service.show_attachment(&caller, &id).await?;
    let mut view = attachment_detail(&row);
    view["shared_connections_by_attachment"] = json!(shared);
    Ok(Json(json!({ "attachment": view })).into_response())
}

/// Parses a client's connector; a malformed one is a 400 naming the key.
pub(super) fn connector(json: Map<String, Value>) -> Result<Connector, ApiError> {
    Connector::parse(json).map_err(|e| AttachError::InvalidInput(e).into())
}

const LIST: ListSpec = ListSpec {
    sort_keys: ATTACHMENT_SORT_KEYS,
    filters: &[
        ("volume_id", "volume_id"),
        ("instance_id", "instance_uuid"),
        ("attach_status", "attach_status"),
        // Cinder filters on a non-existent column and always answers [] (Q4); here it is an alias.
        ("status", "attach_status"),
        ("project_id", "project_id"),
    ],
    flags: &[],
};

async fn list(
    state: &AppState,
    caller: &Caller,
    version: Version,
    raw: Option<String>,
    view: fn(&Attachment) -> Value,
) -> Result<Response, ApiError> {
    version.require(NEW_ATTACH)?;
    state.authorize(caller, Rule::AttachmentGetAll)?;
    let q = parse(raw.as_deref(), &LIST, version)?;
    let project_filter = q.filters.get("project_id").cloned();
    let scope = match &project_filter {
        _ if !(caller.is_admin() && q.all_tenants) => caller.own_project(),
        Some(project) => Scope::Project(project),
        None => Scope::All,
    };
    let filter = AttachmentFilter {
        volume_id: q.filters.get("volume_id").cloned(),
        instance_uuid: q.filters.get("instance_uuid").cloned(),
        attach_status: q.filters.get("attach_status").cloned(),
    };
    let rows = state.service.list_attachments(scope, &filter, &q.page).await?;
    Ok(Json(json!({ "attachments": rows.iter().map(view).collect::<Vec<_>>() })).into_response())
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, version, raw, attachment_summary).await
}

async fn detail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, version, raw, attachment_detail).await
}

async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    version.require(NEW_ATTACH)?;
    state.authorize(&caller, Rule::AttachmentDelete)?;
    let id = uuid_param("attachment_id", &id).map_err(|_| crate::attach::attachment_not_found(&id))?;
    let remaining = state
        .service
        .owned((caller, id), |s, (caller, id)| async move { s.delete_attachment(&caller, &id).await })
        .await?;
    Ok(Json(json!({ "attachments": remaining.iter().map(attachment_summary).collect::<Vec<_>>() }))
        .into_response())
}

async fn action(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Response, ApiError> {
    version.require(NEW_ATTACH_COMPLETION)?;
    state.authorize(&caller, Rule::AttachmentComplete)?;
    if body.len() != 1 || !body.contains_key("os-complete") {
        let keys: Vec<&String> = body.keys().collect();
        return Err(ApiError::bad_request(format!(
            "Invalid input: the only attachment action is 'os-complete' (got {keys:?})"
        )));
    }
    let id = uuid_param("attachment_id", &id).map_err(|_| crate::attach::attachment_not_found(&id))?;
    state
        .service
        .owned((caller, id), |s, (caller, id)| async move { s.complete_attachment(&caller, &id).await })
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

//! `POST /v3/{project_id}/volumes/{id}/action`: the legacy attach and detach actions, with
//! Cinder's bodies and status codes (`cinder/api/contrib/volume_actions.py`,
//! `admin_actions.py`, `cinder/api/schemas/volume_actions.py`). Available from 3.0. The rules
//! are the attachments API's: see `attach/legacy.rs`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::attachments::connector as parse_connector;
use super::body::JsonBody;
use super::error::ApiError;
use super::policy::Rule;
use super::{AppState, uuid_param};
use crate::attach::Caller;
use crate::attach::legacy::LegacyAttach;
use crate::attach::model::{AttachMode, Connector};

pub fn routes() -> Router<AppState> {
    Router::new().route("/volumes/{id}/action", post(action))
}

/// The actions this endpoint knows.
const ACTIONS: &[&str] = &[
    "os-reserve",
    "os-unreserve",
    "os-initialize_connection",
    "os-attach",
    "os-begin_detaching",
    "os-roll_detaching",
    "os-terminate_connection",
    "os-detach",
    "os-force_detach",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Initialize {
    connector: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Terminate {
    connector: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Attach {
    mountpoint: String,
    #[serde(default)]
    instance_uuid: Option<String>,
    #[serde(default)]
    host_name: Option<String>,
    #[serde(default)]
    mode: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Detach {
    #[serde(default)]
    attachment_id: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ForceDetach {
    #[serde(default)]
    connector: Option<Value>,
    #[serde(default)]
    attachment_id: Option<String>,
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

async fn action(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Response, ApiError> {
    let volume = uuid_param("volume_id", &id).map_err(|_| crate::attach::volume_not_found(&id))?;
    let mut entries = body.into_iter();
    let (name, value) = match (entries.next(), entries.next()) {
        (Some(entry), None) => entry,
        _ => {
            return Err(ApiError::bad_request(
                "Invalid input: a volume action body names exactly one action",
            ));
        }
    };
    if !ACTIONS.contains(&name.as_str()) {
        return Err(ApiError::bad_request(format!("There is no such action: {name}")));
    }
    state.authorize(&caller, action_rule(&name))?;
    let service = &state.service;
    match name.as_str() {
        "os-reserve" => {
            service
                .owned((caller, volume), |s, (caller, volume)| async move {
                    s.legacy_reserve(&caller, &volume).await
                })
                .await?
        }
        "os-unreserve" => {
            service
                .owned((caller, volume), |s, (caller, volume)| async move {
                    s.legacy_unreserve(&caller, &volume).await
                })
                .await?
        }
        "os-begin_detaching" => {
            service
                .owned((caller, volume), |s, (caller, volume)| async move {
                    s.legacy_begin_detaching(&caller, &volume).await
                })
                .await?
        }
        "os-roll_detaching" => {
            service
                .owned((caller, volume), |s, (caller, volume)| async move {
                    s.legacy_roll_detaching(&caller, &volume).await
                })
                .await?
        }
        "os-initialize_connection" => {
            let arg: Initialize = argument(&name, value, None)?;
            let c = connector(arg.connector)?;
            let info = service
                .owned((caller, volume, c), |s, (caller, volume, c)| async move {
                    s.legacy_initialize(&caller, &volume, c).await
                })
                .await?;
            return Ok((StatusCode::OK, Json(json!({ "connection_info": nested(info) }))).into_response());
        }
        "os-attach" => {
            let arg: Attach = argument(&name, value, None)?;
            let req = attach_request(arg)?;
            service
                .owned((caller, volume, req), |s, (caller, volume, req)| async move {
                    s.legacy_attach(&caller, &volume, req).await
                })
                .await?;
        }
        "os-terminate_connection" => {
            let arg: Terminate = argument(&name, value, None)?;
            let c = optional_connector(Some(arg.connector))?;
            service
                .owned((caller, volume, c), |s, (caller, volume, c)| async move {
                    s.legacy_terminate(&caller, &volume, c).await
                })
                .await?;
        }
        "os-detach" => {
            let arg: Detach = argument(&name, value, Some(Detach::default()))?;
            let id = attachment_id(arg.attachment_id)?;
            service
                .owned((caller, volume, id), |s, (caller, volume, id)| async move {
                    s.legacy_detach(&caller, &volume, id.as_deref()).await
                })
                .await?;
        }
        "os-force_detach" => {
            let arg: ForceDetach = argument(&name, value, Some(ForceDetach::default()))?;
            let c = optional_connector(arg.connector)?;
            let id = attachment_id(arg.attachment_id)?;
            service
                .owned((caller, volume, c, id), |s, (caller, volume, c, id)| async move {
                    s.force_detach(&caller, &volume, c, id.as_deref()).await
                })
                .await?;
        }
        _ => unreachable!("every name in ACTIONS has a branch"),
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

/// The policy rule of a volume action (one of [`ACTIONS`]).
fn action_rule(name: &str) -> Rule {
    match name {
        "os-reserve" => Rule::Reserve,
        "os-unreserve" => Rule::Unreserve,
        "os-begin_detaching" => Rule::BeginDetaching,
        "os-roll_detaching" => Rule::RollDetaching,
        "os-initialize_connection" => Rule::InitializeConnection,
        "os-attach" => Rule::Attach,
        "os-terminate_connection" => Rule::TerminateConnection,
        "os-detach" => Rule::Detach,
        "os-force_detach" => Rule::ForceDetach,
        _ => unreachable!("every name in ACTIONS has a rule"),
    }
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
    let mode = match arg.mode.as_deref().unwrap_or("rw") {
        "rw" => AttachMode::Rw,
        "ro" => AttachMode::Ro,
        mode => {
            return Err(ApiError::bad_request(format!(
                "Invalid input for field/attribute mode. Value: {mode}. '{mode}' is not one of ['rw', 'ro']"
            )));
        }
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
fn nested(flat: Value) -> Value {
    let Value::Object(mut data) = flat else { return flat };
    let driver_volume_type = data.remove("driver_volume_type").unwrap_or(Value::Null);
    data.remove("attachment_id");
    let enforce_multipath = data.get("enforce_multipath").cloned().unwrap_or(Value::Bool(false));
    json!({ "driver_volume_type": driver_volume_type, "data": data, "enforce_multipath": enforce_multipath })
}

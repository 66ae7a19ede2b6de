//! `GET /v3/{project_id}/os-services`: the nodes of this service and their backends, with their
//! state, in Cinder's shape (what `cinder service-list` prints). Admins only, as in Cinder. A
//! backend shared by several nodes names its cluster (`berth@backend`), as an active-active
//! Cinder backend does.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::AppState;
use super::error::ApiError;
use super::openapi::Endpoint;
use super::policy::Rule;
use super::views::timestamp;
use crate::attach::Caller;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/os-services", index, "listServices")
            .summary("services", "List the nodes and their backends, up or down (admins only)")
            .answers::<ServiceList>(StatusCode::OK, "The services"),
    ]
}

/// `{"services": [...]}`.
#[derive(Serialize, JsonSchema)]
struct ServiceList {
    services: Vec<ServiceView>,
}

/// A node (`berth-api`) or one of its backends (`cinder-volume`), as Cinder lists services.
#[derive(Serialize, JsonSchema)]
struct ServiceView {
    binary: String,
    /// `node` or `node@backend`.
    host: String,
    zone: String,
    /// Always `enabled`.
    status: String,
    /// `up` or `down`.
    state: String,
    updated_at: String,
    disabled_reason: Option<String>,
    /// `berth@backend` for a backend shared by several nodes.
    cluster: Option<String>,
    replication_status: String,
    active_backend_id: Option<String>,
    frozen: bool,
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ServiceIndex)?;
    let services: Vec<_> = state
        .service
        .services()
        .await?
        .into_iter()
        .map(|s| ServiceView {
            binary: s.binary.into(),
            host: s.host,
            zone: "nova".into(),
            status: "enabled".into(),
            state: if s.up { "up" } else { "down" }.into(),
            updated_at: timestamp(s.updated_at),
            disabled_reason: None,
            cluster: s.cluster,
            replication_status: "disabled".into(),
            active_backend_id: None,
            frozen: false,
        })
        .collect();
    Ok(Json(ServiceList { services }).into_response())
}

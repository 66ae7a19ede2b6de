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
    /// Berth's: a backend's driver (name and version) and the sha256 of its `.wasm`, as the node
    /// that serves it runs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    driver: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_digest: Option<String>,
    /// Berth's: since when the node runs that driver for the backend, and how it came to
    /// (`configured`, `upgraded` by `berth driver upgrade`, `rolled back`).
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    driver_how: Option<String>,
    /// Berth's: whether the backend is shared between nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    shared: Option<bool>,
    /// Berth's: a node's operations lease, in seconds, and its version.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    /// Berth's: for a backend with an iSCSI target service, the LUNs it holds now (known for the
    /// node that answers) and how many it may hold on its node's machine; a new export beyond
    /// is refused with 413.
    #[serde(skip_serializing_if = "Option::is_none")]
    luns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lun_ceiling: Option<u64>,
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
            zone: super::zones::ZONE.into(),
            status: "enabled".into(),
            state: if s.up { "up" } else { "down" }.into(),
            updated_at: timestamp(s.updated_at),
            disabled_reason: None,
            cluster: s.cluster,
            replication_status: "disabled".into(),
            active_backend_id: None,
            frozen: false,
            driver: s.runs.as_ref().map(|r| format!("{} {}", r.driver, r.version)),
            driver_digest: s.runs.as_ref().map(|r| r.digest.clone()),
            driver_since: s.runs.as_ref().and_then(|r| r.since).map(timestamp),
            driver_how: s.runs.as_ref().and_then(|r| r.how.clone()),
            shared: s.runs.as_ref().map(|r| r.shared),
            lease_seconds: s.lease_seconds,
            version: s.version,
            luns: s.luns,
            lun_ceiling: s.runs.as_ref().and_then(|r| r.lun_ceiling),
        })
        .collect();
    Ok(Json(ServiceList { services }).into_response())
}

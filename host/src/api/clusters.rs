//! `/v3/{project_id}/clusters` (3.7; `cinder cluster-list`, `cluster-show`, `cluster-disable`,
//! `cluster-enable`; admins): each shared backend is a cluster, `berth@backend`, as Cinder groups
//! an active-active backend's services (`attach/services.rs`). Disabling one stops new volumes on
//! it through every node, as disabling each node's service does for that node; its volumes are
//! served as before.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{CLUSTER_SUPPORT, REPLICATION_CLUSTER, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::param;
use super::views::timestamp;
use crate::attach::Caller;
use crate::attach::services::{Cluster, VOLUME_BINARY};

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "clusters";
    vec![
        Endpoint::get("/clusters", index, "listClusters")
            .since(CLUSTER_SUPPORT)
            .summary(TAG, "List the clusters: each shared backend (admins only)")
            .query("name", "Only this cluster (`berth@backend`).")
            .query("binary", "Only clusters of this binary (`cinder-volume`).")
            .query("is_up", "A node that serves it is up.")
            .query("disabled", "It is disabled.")
            .query("num_hosts", "It has this many nodes.")
            .query("num_down_hosts", "It has this many nodes down.")
            .answers::<ClusterList>(StatusCode::OK, "The clusters"),
        Endpoint::get("/clusters/detail", detail, "listClustersDetail")
            .since(CLUSTER_SUPPORT)
            .summary(TAG, "List the clusters with their nodes and heartbeats (admins only)")
            .answers::<ClusterList>(StatusCode::OK, "The clusters"),
        Endpoint::get("/clusters/{id}", show, "showCluster")
            .since(CLUSTER_SUPPORT)
            .summary(TAG, "Show a cluster (`berth@backend`; `binary`, `cinder-volume` by default)")
            .query("binary", "The cluster's binary (`cinder-volume`).")
            .answers::<ClusterBody>(StatusCode::OK, "The cluster"),
        Endpoint::put("/clusters/disable", disable, "disableCluster")
            .since(CLUSTER_SUPPORT)
            .summary(TAG, "Disable a cluster: no node makes new volumes on its backend")
            .body::<ClusterChange>()
            .answers::<ClusterBody>(StatusCode::OK, "The cluster, disabled"),
        Endpoint::put("/clusters/enable", enable, "enableCluster")
            .since(CLUSTER_SUPPORT)
            .summary(TAG, "Enable a cluster again")
            .body::<ClusterEnable>()
            .answers::<ClusterBody>(StatusCode::OK, "The cluster, enabled"),
    ]
}

/// `{"clusters": [...]}`.
#[derive(Serialize, JsonSchema)]
struct ClusterList {
    clusters: Vec<ClusterView>,
}

/// `{"cluster": {...}}`.
#[derive(Serialize, JsonSchema)]
struct ClusterBody {
    cluster: ClusterView,
}

/// A cluster as Cinder shows it: the summary fields, and with detail its nodes and times; from
/// 3.26 its replication (none here).
#[derive(Serialize, JsonSchema)]
struct ClusterView {
    name: String,
    binary: String,
    /// `up` when a node that serves it is up.
    state: String,
    /// `enabled` or `disabled`.
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    replication_status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    num_hosts: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    num_down_hosts: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_heartbeat: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    updated_at: Option<String>,
    /// Detail's (and an update's answer): why it is disabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_reason: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frozen: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    active_backend_id: Option<Option<String>>,
}

fn summary(c: &Cluster, version: Version) -> ClusterView {
    let replication = version >= REPLICATION_CLUSTER;
    ClusterView {
        name: c.name.clone(),
        binary: VOLUME_BINARY.into(),
        state: if c.num_down_hosts < c.num_hosts { "up" } else { "down" }.into(),
        status: if c.disabled.is_some() { "disabled" } else { "enabled" }.into(),
        replication_status: replication.then(|| "disabled".into()),
        num_hosts: None,
        num_down_hosts: None,
        last_heartbeat: None,
        created_at: None,
        updated_at: None,
        disabled_reason: None,
        frozen: None,
        active_backend_id: None,
    }
}

fn detailed(c: &Cluster, version: Version) -> ClusterView {
    let replication = version >= REPLICATION_CLUSTER;
    ClusterView {
        num_hosts: Some(c.num_hosts),
        num_down_hosts: Some(c.num_down_hosts),
        last_heartbeat: Some(timestamp(c.last_heartbeat)),
        created_at: Some(timestamp(c.created_at)),
        updated_at: Some(c.disabled.as_ref().map(|d| timestamp(d.disabled_at)).unwrap_or_default()),
        disabled_reason: Some(c.disabled.as_ref().and_then(|d| d.reason.clone())),
        frozen: replication.then_some(false),
        active_backend_id: replication.then_some(None),
        ..summary(c, version)
    }
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, version, raw, summary).await
}

async fn detail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, version, raw, detailed).await
}

/// One filter of a cluster list.
type Keep = Box<dyn Fn(&Cluster) -> bool + Send + Sync>;

async fn list(
    state: &AppState,
    caller: &Caller,
    version: Version,
    raw: Option<String>,
    view: fn(&Cluster, Version) -> ClusterView,
) -> Result<Response, ApiError> {
    state.authorize(caller, Rule::ClusterGetAll)?;
    let mut keep: Vec<Keep> = Vec::new();
    for (key, value) in form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes()) {
        let (key, value) = (key.into_owned(), value.into_owned());
        let number = |v: &str| {
            v.trim().parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("Invalid input received: {key}={v:?} is not an integer"))
            })
        };
        match key.as_str() {
            "name" => keep.push(Box::new(move |c| c.name == value)),
            "binary" => keep.push(Box::new(move |_| value == VOLUME_BINARY)),
            "is_up" => {
                let up = super::volumes::boolean("is_up", &value)?;
                keep.push(Box::new(move |c| (c.num_down_hosts < c.num_hosts) == up));
            }
            "disabled" => {
                let disabled = super::volumes::boolean("disabled", &value)?;
                keep.push(Box::new(move |c| c.disabled.is_some() == disabled));
            }
            "num_hosts" => {
                let n = number(&value)?;
                keep.push(Box::new(move |c| c.num_hosts == n));
            }
            "num_down_hosts" => {
                let n = number(&value)?;
                keep.push(Box::new(move |c| c.num_down_hosts == n));
            }
            // No cluster here replicates: it is `disabled`, not frozen, on no other backend.
            "replication_status" if version >= REPLICATION_CLUSTER => {
                keep.push(Box::new(move |_| value == "disabled"));
            }
            "frozen" if version >= REPLICATION_CLUSTER => {
                let frozen = super::volumes::boolean("frozen", &value)?;
                keep.push(Box::new(move |_| !frozen));
            }
            "active_backend_id" if version >= REPLICATION_CLUSTER => keep.push(Box::new(|_| false)),
            other => {
                return Err(ApiError::bad_request(format!(
                    "Invalid input received: Invalid filter keys: {other}"
                )));
            }
        }
    }
    let clusters = state
        .service
        .clusters()
        .await?
        .iter()
        .filter(|c| keep.iter().all(|k| k(c)))
        .map(|c| view(c, version))
        .collect();
    Ok(Json(ClusterList { clusters }).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ClusterGet)?;
    let binary = param(raw.as_deref(), "binary").unwrap_or_else(|| VOLUME_BINARY.into());
    let found =
        state.service.clusters().await?.into_iter().find(|c| c.name == name && binary == VOLUME_BINARY);
    let cluster = found.ok_or_else(|| ApiError::not_found(format!("Cluster {name} could not be found.")))?;
    Ok(Json(ClusterBody { cluster: detailed(&cluster, version) }).into_response())
}

/// `{"name": "berth@backend", "binary": "cinder-volume", "disabled_reason": "..."}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ClusterChange {
    name: String,
    binary: Option<String>,
    disabled_reason: Option<String>,
}

/// `{"name": "berth@backend", "binary": "cinder-volume"}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ClusterEnable {
    name: String,
    binary: Option<String>,
}

async fn disable(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    JsonBody(body): JsonBody<ClusterChange>,
) -> Result<Response, ApiError> {
    change(&state, &caller, version, body.name, body.binary, true, body.disabled_reason).await
}

async fn enable(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    JsonBody(body): JsonBody<ClusterEnable>,
) -> Result<Response, ApiError> {
    change(&state, &caller, version, body.name, body.binary, false, None).await
}

async fn change(
    state: &AppState,
    caller: &Caller,
    version: Version,
    name: String,
    binary: Option<String>,
    disabled: bool,
    reason: Option<String>,
) -> Result<Response, ApiError> {
    state.authorize(caller, Rule::ClusterUpdate)?;
    let binary = binary.unwrap_or_else(|| VOLUME_BINARY.into());
    let now = state.service.set_cluster_disabled(&name, &binary, disabled, reason).await?;
    // Cinder answers the summary and the reason.
    let cluster = ClusterView {
        disabled_reason: Some(now.disabled.as_ref().and_then(|d| d.reason.clone())),
        ..summary(&now, version)
    };
    Ok(Json(ClusterBody { cluster }).into_response())
}

//! `/v3/{project_id}/os-services`: the nodes of this service and their backends, with their
//! state, in Cinder's shape (what `cinder service-list` prints), and `disable`,
//! `disable-log-reason` and `enable` of a node's backend (`cinder service-disable`,
//! `service-enable`; what a disabled backend does is in `attach/services.rs`). Admins only, as in
//! Cinder. A backend shared by several nodes names its cluster (`berth@backend`), as an
//! active-active Cinder backend does.

use axum::extract::{RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::body::JsonBody;
use super::error::ApiError;
use super::forward::Relayed;
use super::microversion::{BACKEND_STATE_REPORT, LOG_LEVEL, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::param;
use super::views::timestamp;
use crate::attach::Caller;
use crate::attach::nodes::Forward;
use crate::attach::services::{ServiceState, VOLUME_BINARY};

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "services";
    vec![
        Endpoint::get("/os-services", index, "listServices")
            .summary(TAG, "List the nodes and their backends, up or down, enabled or disabled (admins only)")
            .query("host", "Only the service of this host (`node` or `node@backend`).")
            .query("binary", "Only services of this binary (`berth-api` or `cinder-volume`).")
            .answers::<ServiceList>(StatusCode::OK, "The services"),
        Endpoint::put("/os-services/disable", disable, "disableService")
            .summary(TAG, "Disable a node's backend: it makes no new volume and serves its volumes as before")
            .body::<ServiceChange>()
            .answers::<ServiceChanged>(StatusCode::OK, "The service, disabled"),
        Endpoint::put("/os-services/disable-log-reason", disable_log_reason, "disableServiceLogReason")
            .summary(TAG, "Disable a node's backend, saying why (shown in the service list)")
            .body::<ServiceChangeWithReason>()
            .answers::<ServiceChanged>(StatusCode::OK, "The service, disabled"),
        Endpoint::put("/os-services/set-log", set_log, "setServiceLogLevels")
            .since(LOG_LEVEL)
            .summary(TAG, "Set a log level while serving (a module path's, or the default), on the node `server` names or on every node up")
            .body::<SetLog>()
            .answers_empty(StatusCode::ACCEPTED, "Set"),
        Endpoint::put("/os-services/get-log", get_log, "getServiceLogLevels")
            .since(LOG_LEVEL)
            .summary(TAG, "The log levels by module path, of the node `server` names or of every node up")
            .body::<GetLog>()
            .answers::<LogLevels>(StatusCode::OK, "The levels"),
        Endpoint::put("/os-services/enable", enable, "enableService")
            .summary(TAG, "Enable a node's backend again: it makes new volumes")
            .body::<ServiceChange>()
            .answers::<ServiceChanged>(StatusCode::OK, "The service, enabled"),
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
    /// `enabled`, or `disabled` (a backend that makes no new volume).
    status: String,
    /// `up` or `down`.
    state: String,
    updated_at: String,
    /// Why it is disabled, as the admin said.
    disabled_reason: Option<String>,
    /// `berth@backend` for a backend shared by several nodes.
    cluster: Option<String>,
    /// A backend's (3.49): `up` while it takes new volumes (one of the pools), else null, as
    /// Cinder's for a backend its scheduler has no pool of. (Berth has no health check of a
    /// backend beyond its node's heartbeat.)
    #[serde(skip_serializing_if = "Option::is_none")]
    backend_state: Option<Option<&'static str>>,
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
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ServiceIndex)?;
    let (host, binary) = (param(raw.as_deref(), "host"), param(raw.as_deref(), "binary"));
    let services: Vec<_> = state
        .service
        .services()
        .await?
        .into_iter()
        .filter(|s| {
            host.as_ref().is_none_or(|h| *h == s.host) && binary.as_ref().is_none_or(|b| b == s.binary)
        })
        .map(|s| view(s, version))
        .collect();
    Ok(Json(ServiceList { services }).into_response())
}

fn view(s: ServiceState, version: Version) -> ServiceView {
    let backend_state = (version >= BACKEND_STATE_REPORT && s.binary == VOLUME_BINARY)
        .then_some(s.takes_volumes.then_some("up"));
    ServiceView {
        backend_state,
        binary: s.binary.into(),
        host: s.host,
        zone: super::zones::ZONE.into(),
        status: status(s.disabled.is_some()).into(),
        state: if s.up { "up" } else { "down" }.into(),
        updated_at: timestamp(s.updated_at),
        disabled_reason: s.disabled.and_then(|d| d.reason),
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
    }
}

fn status(disabled: bool) -> &'static str {
    if disabled { "disabled" } else { "enabled" }
}

/// `{"host": "node@backend", "binary": "cinder-volume"}` (`service`: Cinder's older name of
/// `binary`).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ServiceChange {
    host: String,
    binary: Option<String>,
    service: Option<String>,
}

/// [`ServiceChange`] with `disabled_reason` (1 to 255 characters).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ServiceChangeWithReason {
    host: String,
    binary: Option<String>,
    service: Option<String>,
    disabled_reason: Option<String>,
}

/// The service after the change, as Cinder answers it.
#[derive(Serialize, JsonSchema)]
struct ServiceChanged {
    host: String,
    binary: String,
    /// The `service` the request named, or `""`.
    service: String,
    /// `enabled` or `disabled`.
    status: String,
    disabled: bool,
    /// `disable-log-reason`'s only: the reason it now has.
    #[serde(skip_serializing_if = "Option::is_none")]
    disabled_reason: Option<String>,
}

async fn disable(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<ServiceChange>,
) -> Result<Response, ApiError> {
    change(&state, &caller, body.host, body.binary, body.service, true, None).await
}

async fn disable_log_reason(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<ServiceChangeWithReason>,
) -> Result<Response, ApiError> {
    let reason = Some(body.disabled_reason.unwrap_or_default());
    change(&state, &caller, body.host, body.binary, body.service, true, reason).await
}

async fn enable(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<ServiceChange>,
) -> Result<Response, ApiError> {
    change(&state, &caller, body.host, body.binary, body.service, false, None).await
}

async fn change(
    state: &AppState,
    caller: &Caller,
    host: String,
    binary: Option<String>,
    service: Option<String>,
    disabled: bool,
    reason: Option<String>,
) -> Result<Response, ApiError> {
    state.authorize(caller, Rule::ServiceUpdate)?;
    // Cinder's: `binary`, or the deprecated `service`, names it.
    let Some(named) = binary.clone().or(service.clone()).filter(|b| !b.is_empty()) else {
        return Err(ApiError::bad_request("Invalid input: the request names no binary (`binary`)"));
    };
    let with_reason = reason.is_some();
    let now = state.service.set_service_disabled(&host, &named, disabled, reason).await?;
    Ok(Json(ServiceChanged {
        host: now.host,
        binary: binary.unwrap_or_default(),
        service: service.unwrap_or_default(),
        status: status(now.disabled.is_some()).into(),
        disabled: now.disabled.is_some(),
        disabled_reason: now.disabled.and_then(|d| d.reason).filter(|_| with_reason),
    })
    .into_response())
}

/// `{"binary": "*", "server": "node", "prefix": "berth::attach", "level": "DEBUG"}`: every key but
/// `level` may be left out (the default level: no `prefix`).
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetLog {
    binary: Option<String>,
    server: Option<String>,
    prefix: Option<String>,
    level: Option<String>,
}

/// `{"binary": "*", "server": "node", "prefix": "berth"}`.
#[derive(Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetLog {
    binary: Option<String>,
    server: Option<String>,
    prefix: Option<String>,
}

/// `{"log_levels": [{"host": "node", "binary": "berth-api", "levels": {"berth::attach": "DEBUG"}}]}`.
#[derive(Serialize, Deserialize, JsonSchema)]
struct LogLevels {
    log_levels: Vec<LogLevelsOf>,
}

#[derive(Serialize, Deserialize, JsonSchema)]
struct LogLevelsOf {
    host: String,
    binary: String,
    /// By module path (`""`: the default).
    levels: std::collections::BTreeMap<String, String>,
}

/// Whose log a log request is for.
enum LogTarget {
    /// None of Berth's: a scheduler's or a backup service's log (Berth has neither).
    Nobody,
    /// This node's.
    Here,
    /// Another node's: the request is forwarded there.
    Node(Forward),
    /// Every node's (no `server`, as Cinder's changes every service's): this one's, and each
    /// other node up, which this node sends the request on to, naming it.
    Every(Vec<Forward>),
}

/// Whose log a request is for, by its `binary` (those of a node's one process: its own and its
/// backends') and its `server` (a node, or one of its backends `node@backend`; none: every
/// node). A node that is down or unknown is refused, naming it: its levels are those it starts
/// with.
async fn log_target(
    state: &AppState,
    request: &Relayed,
    binary: Option<&str>,
    server: Option<&str>,
) -> Result<LogTarget, ApiError> {
    match binary.unwrap_or("") {
        "" | "*" | "berth-api" | "cinder-api" | "cinder-volume" => {}
        "cinder-scheduler" | "cinder-backup" => return Ok(LogTarget::Nobody),
        b => {
            return Err(ApiError::bad_request(format!(
                "Invalid input received: binary {b:?}: a node's log is that of berth-api and cinder-volume"
            )));
        }
    }
    let node = &state.service.owner().node;
    let named = server.filter(|s| !s.is_empty()).map(|s| s.split_once('@').map_or(s, |(n, _)| n));
    if named.is_none_or(|n| n == node) {
        if named.is_some() || request.arrived_forwarded() {
            return Ok(LogTarget::Here);
        }
        let peers = state.service.others().await?.into_iter().filter_map(|(n, up)| {
            let url = n.url.filter(|_| up)?;
            Some(Forward { node: n.name, url })
        });
        return Ok(LogTarget::Every(peers.collect()));
    }
    let named = named.unwrap_or_default();
    let others = state.service.others().await?;
    match others.into_iter().find(|(n, _)| n.name == named) {
        Some((n, true)) if !request.arrived_forwarded() && n.url.is_some() => {
            Ok(LogTarget::Node(Forward { node: n.name, url: n.url.unwrap_or_default() }))
        }
        Some(_) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Berth node {named} is down or cannot be reached: its log levels are those it starts with"
            ),
        )),
        None => Err(ApiError::bad_request(format!(
            "Invalid input received: server {named:?} is no Berth node (this one is {node})"
        ))),
    }
}

/// A request for another node's log: forwarded there (`forward.rs`), with this error as the
/// answer if it cannot be.
fn forwarded_to(peer: Forward) -> ApiError {
    let message = format!("Berth node {} did not answer for its log levels", peer.node);
    ApiError { forward: Some(peer), ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message) }
}

/// Sends `body(node)` on to every peer at once (`PUT`, as the caller sent it); their answers in
/// the peers' order.
async fn to_every<B: serde::Serialize>(
    state: &AppState,
    request: &Relayed,
    peers: &[Forward],
    body: impl Fn(String) -> B,
) -> Vec<(StatusCode, String)> {
    let sends = peers.iter().map(|peer| {
        let json = serde_json::to_value(body(peer.node.clone())).expect("serialises");
        async move { request.send(state, peer, Method::PUT, &json).await }
    });
    futures_util::future::join_all(sends).await
}

/// What `Every` sent on to each other node that did not take it: 503 naming them (the request
/// may be sent again, to them alone with `server`).
fn unreached(missed: Vec<String>) -> Result<(), ApiError> {
    if missed.is_empty() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "Log levels not reached on every node: {}; retry, naming the node as server",
            missed.join("; ")
        ),
    ))
}

async fn set_log(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: Relayed,
    JsonBody(body): JsonBody<SetLog>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ServiceUpdate)?;
    let target = log_target(&state, &request, body.binary.as_deref(), body.server.as_deref()).await?;
    let Some(level) = body.level.as_deref() else {
        return Err(ApiError::bad_request("Invalid input received: the request names no level (`level`)"));
    };
    crate::logging::checked(body.prefix.as_deref(), level)?;
    match target {
        LogTarget::Nobody => {}
        LogTarget::Here => crate::logging::set(body.prefix.as_deref(), level)?,
        LogTarget::Node(peer) => return Err(forwarded_to(peer)),
        LogTarget::Every(peers) => {
            crate::logging::set(body.prefix.as_deref(), level)?;
            let answers =
                to_every(&state, &request, &peers, |node| SetLog { server: Some(node), ..body.clone() });
            let missed = (peers.iter().zip(answers.await))
                .filter(|(_, (status, _))| !status.is_success())
                .map(|(peer, (status, text))| {
                    format!("node {} answered {}: {text}", peer.node, status.as_u16())
                });
            unreached(missed.collect())?;
        }
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

async fn get_log(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: Relayed,
    JsonBody(body): JsonBody<GetLog>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ServiceUpdate)?;
    let target = log_target(&state, &request, body.binary.as_deref(), body.server.as_deref()).await?;
    let peers = match target {
        LogTarget::Nobody => return Ok(Json(LogLevels { log_levels: Vec::new() }).into_response()),
        LogTarget::Node(peer) => return Err(forwarded_to(peer)),
        LogTarget::Here => Vec::new(),
        LogTarget::Every(peers) => peers,
    };
    let levels = crate::logging::levels(body.prefix.as_deref())?;
    let host = state.service.owner().node.clone();
    let mut log_levels = vec![LogLevelsOf { host, binary: "berth-api".into(), levels }];
    let mut missed = Vec::new();
    let answers = to_every(&state, &request, &peers, |node| GetLog { server: Some(node), ..body.clone() });
    for (peer, (status, text)) in peers.iter().zip(answers.await) {
        match serde_json::from_str::<LogLevels>(&text) {
            Ok(theirs) if status.is_success() => log_levels.extend(theirs.log_levels),
            _ => missed.push(format!("node {} answered {}: {text}", peer.node, status.as_u16())),
        }
    }
    unreached(missed)?;
    Ok(Json(LogLevels { log_levels }).into_response())
}

//! The HTTP API: Cinder's Block Storage v3 shapes and microversions. One router per resource,
//! merged in [`router`]; one error type mapped to HTTP in `error.rs`. Handlers only translate
//! between HTTP and the attach service.
//!
//! **Adding a route** (follow `attachments.rs`'s `os-complete`): one row in its resource's
//! `endpoints()` (method, path, handler, operation id, `since` the lowest microversion, which the
//! router enforces, body and answer types, which the OpenAPI document shows); a handler that
//! takes typed path ids (`path.rs`: a malformed id is Cinder's 404), authorizes one policy rule,
//! calls the service (a change through `service.commands()`, a read through the family's handle),
//! and answers a view of `views.rs`.

pub mod absent;
pub mod actions;
pub mod attachments;
pub mod auth;
pub mod body;
pub mod clusters;
pub mod default_types;
pub mod drivers;
pub mod error;
pub mod extensions;
#[cfg(feature = "failpoints")]
mod failpoints;
pub mod filters;
pub mod forward;
pub mod history;
pub mod limits;
pub mod messages;
pub mod microversion;
pub mod openapi;
pub mod path;
pub mod policy;
pub mod pools;
pub mod qos_specs;
pub mod query;
pub mod quotas;
pub mod server;
pub mod services;
pub mod transfers;
pub mod types;
pub mod versions;
pub mod views;
pub mod volumes;
pub mod zones;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::HeaderValue;
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::response::Response;
use tracing::Instrument;

use crate::attach::Service;
use auth::Auth;
use error::ApiError;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub service: Arc<Service>,
    /// Driver upgrades of this node's backends (`upgrade/`); none in a service built without
    /// `berth serve`'s runtime.
    pub upgrades: Option<Arc<crate::upgrade::Upgrades>>,
    pub auth: Arc<Auth>,
    /// Which roles may call what (`policy.rs`).
    pub policy: Arc<policy::Policy>,
    /// The bound on requests in flight (`server.rs`).
    pub in_flight: server::InFlight,
    /// The URL clients use to reach this service, for links; the request's Host when unset.
    pub public_endpoint: Option<String>,
    /// `https` when the API is served over TLS, else `http`: the scheme of links to the
    /// request's Host.
    pub scheme: &'static str,
    /// Sends requests this node cannot answer to the node that can (`forward.rs`).
    pub forwarder: forward::Forwarder,
    /// How long a request's body may take to arrive once its headers are in (`body.rs`).
    pub body_read_timeout: std::time::Duration,
}

impl AppState {
    /// Checks a policy rule for the caller: Cinder's 403 when it does not pass.
    pub fn authorize(&self, caller: &crate::attach::Caller, rule: policy::Rule) -> Result<(), ApiError> {
        self.policy.authorize(caller, rule)
    }

    /// Whether the caller sees the secrets of connection info: only those who may use an
    /// attachment (who may update one: members of its project, admins) and services; a reader
    /// gets the rest (Cinder shows them to every reader).
    pub fn secrets_for(&self, caller: &crate::attach::Caller) -> views::Secrets {
        if caller.is_service || self.policy.allows(caller, policy::Rule::AttachmentUpdate) {
            views::Secrets::Shown
        } else {
            views::Secrets::Removed
        }
    }
}

/// Every operation of the API, with its description, the document's own included: the router
/// and the OpenAPI document are built from this one list.
pub fn endpoints() -> Vec<openapi::Endpoint> {
    [
        versions::endpoints(),
        vec![openapi_endpoint()],
        volumes::endpoints(),
        actions::endpoints(),
        attachments::endpoints(),
        history::endpoints(),
        types::endpoints(),
        services::endpoints(),
        pools::endpoints(),
        clusters::endpoints(),
        default_types::endpoints(),
        filters::endpoints(),
        drivers::endpoints(),
        zones::endpoints(),
        limits::endpoints(),
        quotas::endpoints(),
        transfers::endpoints(),
        messages::endpoints(),
        absent::endpoints(),
        extensions::endpoints(),
        qos_specs::endpoints(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// `GET /openapi.json`: the document of [`endpoints`].
fn openapi_endpoint() -> openapi::Endpoint {
    openapi::Endpoint::get("/openapi.json", openapi_json, "openapi")
        .summary("versions", "This document: the API in OpenAPI 3.1")
        .unversioned()
        .answers::<serde_json::Map<String, serde_json::Value>>(axum::http::StatusCode::OK, "The document")
}

async fn openapi_json(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let catalog = state.service.catalog();
    let deployment = openapi::Deployment {
        volume_types: catalog.types.iter().flat_map(|t| [t.name.clone(), t.id.clone()]).collect(),
        connector_requires: openapi::connector_requires(
            catalog.backends().iter().map(|b| &b.driver.info().protocols),
        ),
    };
    axum::Json(openapi::document(&endpoints(), &deployment)).into_response()
}

/// The routes, without the project-stripping rewrite (see [`app`]).
pub fn router(state: AppState) -> Router {
    let mut v3: Router<AppState> = Router::new();
    let mut root: Router<AppState> = Router::new();
    for e in endpoints() {
        match e.doc.since {
            // The route table is the truth: below the version the document names, the route
            // does not exist (Cinder's 404), whatever its handler does.
            Some(since) => {
                let route =
                    e.route.route_layer(middleware::from_fn_with_state(since, microversion::at_least));
                v3 = v3.route(e.path, route)
            }
            None => root = root.route(e.path, e.route),
        }
    }
    #[cfg(feature = "failpoints")]
    let root = root.merge(failpoints::routes());
    // The order a request meets them, from the outside in (the last layer is the outermost): its
    // log line; authentication, on the headers alone, before a byte of the body is read; the
    // whole body, bounded in size and time; only then a slot of the bound on requests in flight,
    // so that neither a client without credentials nor a slow one can hold every slot.
    root.nest("/v3", v3)
        .fallback(|uri: axum::extract::OriginalUri| async move { no_route(uri.path()) })
        .method_not_allowed_fallback(|uri: axum::extract::OriginalUri| async move { not_allowed(uri.path()) })
        .layer(middleware::from_fn(microversion::negotiate))
        .layer(middleware::from_fn_with_state(state.clone(), forward::forward))
        .layer(DefaultBodyLimit::max(body::MAX_BODY))
        .layer(middleware::from_fn_with_state(state.in_flight.clone(), server::shed))
        .layer(middleware::from_fn_with_state(state.body_read_timeout, body::read_whole))
        .layer(middleware::from_fn_with_state(state.auth.clone(), auth::authenticate))
        .layer(middleware::from_fn(request_log))
        .with_state(state)
}

/// 405 for a method a path does not take, saying why where Cinder would take it: volume types
/// and QoS specs are configuration here, read through the API and changed in the configuration.
fn not_allowed(path: &str) -> ApiError {
    let rest = path.strip_prefix("/v3").unwrap_or(path);
    let configured = ["/types", "/qos-specs"]
        .iter()
        .any(|prefix| rest.strip_prefix(prefix).is_some_and(|tail| tail.is_empty() || tail.starts_with('/')));
    if configured {
        return configuration();
    }
    ApiError::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, "The method is not allowed for this resource.")
}

/// 405: volume types and QoS specs are changed in the configuration, not through the API.
fn configuration() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "Volume types and QoS specs are this service's configuration (`[[volume_types]]` and \
         `[[qos_specs]]`, the same on every node): the API reads them and does not change them.",
    )
}

/// A path no route has: 404, but for Cinder's calls that change types and QoS specs by a path of
/// their own (`cinder type-access-add`, `qos-associate`, `qos-unset-key`: 405, they are
/// configuration here) and a type's access list (every type here is public: Cinder's 404).
fn no_route(path: &str) -> ApiError {
    let rest = path.strip_prefix("/v3").unwrap_or(path);
    let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        ["types", _, "os-volume-type-access"] => {
            ApiError::not_found("Access list not available for public volume types.")
        }
        ["types", _, "action"]
        | ["qos-specs", _, "associate" | "disassociate" | "disassociate_all" | "delete_keys"] => {
            configuration()
        }
        _ => ApiError::no_such_resource(),
    }
}

/// The complete service: both URL forms (`/v3/{project_id}/...` and `/v3/...`) reach the same
/// routes, because the project segment is taken out before routing. Tests call it without a
/// socket.
pub type App = tower::util::MapRequest<Router, fn(Request) -> Request>;

pub fn app(state: AppState) -> App {
    tower::ServiceBuilder::new()
        .map_request(auth::strip_project as fn(Request) -> Request)
        .service(router(state))
}

/// The header of request ids, oslo.context's.
pub const REQUEST_ID: &str = "x-openstack-request-id";

/// This request's id (`req-<uuid>`), for what the request does elsewhere (`forward.rs`).
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// The caller's global request id, when it sent a valid one.
#[derive(Debug, Clone)]
pub struct GlobalRequestId(pub String);

/// Adds `x-openstack-request-id` and logs each request (method, path, status, time; never
/// headers or bodies, which carry tokens and CHAP secrets). Everything logged while the request
/// is handled, the operation it starts and its driver calls included, is in a span that carries
/// the request id and the caller's global request id (an `X-OpenStack-Request-Id: req-<uuid>`
/// header sent by the caller, as oslo.context accepts it; anything else is ignored).
async fn request_log(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = format!("req-{}", uuid::Uuid::new_v4());
    request.extensions_mut().insert(RequestId(id.clone()));
    let global = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_request_id(v))
        .map(str::to_string);
    if let Some(g) = &global {
        request.extensions_mut().insert(GlobalRequestId(g.clone()));
    }
    let span = match &global {
        Some(g) => tracing::info_span!("request", request_id = %id, global_request_id = %g),
        None => tracing::info_span!("request", request_id = %id),
    };
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let mut response = next.run(request).instrument(span.clone()).await;
    let _entered = span.enter();
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    let status = response.status();
    crate::metrics::http(method.as_str(), &path, status.as_u16(), started.elapsed());
    let micros = started.elapsed().as_micros();
    if status.is_server_error() {
        tracing::warn!(request_id = %id, %method, %path, status = status.as_u16(), micros, "request failed");
    } else {
        tracing::debug!(request_id = %id, %method, %path, status = status.as_u16(), micros, "request");
    }
    response
}

/// `req-` and a UUID, as oslo.context's global request ids are.
fn is_request_id(value: &str) -> bool {
    value.strip_prefix("req-").is_some_and(|u| u.len() == 36 && uuid::Uuid::parse_str(u).is_ok())
}

/// Parses a UUID path or body value (any form `uuid` accepts), as lower-case hyphenated text.
/// A request's `mode`: `rw` or `ro`, or Cinder's 400.
pub fn mode_param(mode: &str) -> Result<crate::runtime::contract::AccessMode, ApiError> {
    crate::runtime::contract::AccessMode::parse(mode).ok_or_else(|| {
        ApiError::bad_request(format!(
            "Invalid input for field/attribute mode. Value: {mode}. '{mode}' is not one of ['rw', 'ro']"
        ))
    })
}

pub fn uuid_param(field: &str, value: &str) -> Result<String, ApiError> {
    uuid::Uuid::parse_str(value).map(|u| u.hyphenated().to_string()).map_err(|_| {
        ApiError::bad_request(format!(
            "Invalid input for field/attribute {field}. Value: {value}. '{value}' is not a 'uuid'"
        ))
    })
}

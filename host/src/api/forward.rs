//! Any node answers every request: a request whose volume's driver calls run on another node
//! (the node that owns it, or one that serves its shared backend; `attach/nodes.rs`) is sent
//! there, and its answer is this node's answer.
//!
//! The attach service says so by failing with [`AttachError::Elsewhere`] before it has recorded
//! anything; the error's response carries a [`Forward`] extension, and this middleware, which
//! kept the request's body, sends the same request (method, path, query, headers, body) to that
//! node's registered URL, marked with `X-Berth-Forwarded-By`. The other node authenticates the
//! caller's own credentials again (the same token, Keystone or noauth headers), applies its policy
//! and runs the operation as its own: the forwarded call is authenticated by the caller, not by
//! trust between nodes, and an operation goes on there even if this node or the client goes away
//! (`attach/ops.rs`). A request is forwarded once at most: one that arrives forwarded is answered
//! where it lands. When the other node does not answer, or goes down (no heartbeat for a lease,
//! or a clean stop) while it has the request, the caller gets 503 with `Retry-After` at once.
//!
//! [`AttachError::Elsewhere`]: crate::attach::AttachError::Elsewhere

use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, OriginalUri, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::body::{MAX_BODY, is_too_large, too_large};
use super::error::ApiError;
use crate::attach::nodes::Forward;

/// The header a forwarded request carries: the node that forwarded it.
pub const FORWARDED_BY: &str = "x-berth-forwarded-by";

/// Headers that belong to one connection, never forwarded (RFC 9110, section 7.6.1). (The length
/// is computed again; the `Host` the caller used is kept, so that links in the answer name it.)
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Sends requests to other nodes.
#[derive(Clone)]
pub struct Forwarder {
    client: reqwest::Client,
    /// This node's name, for `X-Berth-Forwarded-By`.
    node: String,
}

impl Forwarder {
    /// A forwarder that trusts the system's roots and those of `ca_file` (`[http] ca_file`).
    pub fn new(
        node: &str,
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Forwarder, String> {
        let builder = reqwest::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none());
        let client = crate::tls::with_ca_file(builder, ca_file)
            .map_err(|e| format!("[http] ca_file: {e}"))?
            .build()
            .map_err(|e| format!("cannot build an HTTP client to forward with: {e}"))?;
        Ok(Forwarder { client, node: node.to_string() })
    }

    /// Sends `request` (its body read into `body`) to `to`; its answer, or 503 when it gives none.
    async fn send(&self, to: &Forward, parts: &axum::http::request::Parts, body: bytes::Bytes) -> Response {
        let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let id = parts.extensions.get::<super::RequestId>().map(|r| r.0.as_str());
        self.send_to(to, parts.method.clone(), path, &parts.headers, id, body).await
    }

    /// Sends a request (the caller's method, path, headers and body) to `to`, marked as
    /// forwarded: its answer, or 503 when it gives none. The other node authenticates the
    /// caller's own credentials.
    pub async fn send_to(
        &self,
        to: &Forward,
        method: Method,
        path: &str,
        caller_headers: &HeaderMap,
        request_id: Option<&str>,
        body: bytes::Bytes,
    ) -> Response {
        let url = format!("{}{path}", to.url);
        let mut headers = copyable(caller_headers);
        headers.insert(
            FORWARDED_BY,
            HeaderValue::from_str(&self.node).unwrap_or_else(|_| HeaderValue::from_static("?")),
        );
        // The other node's log lines carry this node's request id as the global one, unless the
        // caller sent its own.
        if let Some(id) = request_id
            && !headers.contains_key(super::REQUEST_ID)
            && let Ok(value) = HeaderValue::from_str(id)
        {
            headers.insert(super::REQUEST_ID, value);
        }
        let sent = self.client.request(method, &url).headers(headers).body(body).send().await;
        let outcome = match sent {
            Ok(answer) => {
                let status = answer.status();
                let headers = copyable(answer.headers());
                match answer.bytes().await {
                    Ok(bytes) => {
                        let mut response = Response::new(Body::from(bytes));
                        *response.status_mut() = status;
                        *response.headers_mut() = headers;
                        Ok(response)
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        crate::metrics::forwarded(&to.node, if outcome.is_ok() { "answered" } else { "unanswered" });
        outcome.unwrap_or_else(|e| {
            tracing::warn!(node = %to.node, url = %to.url, "a forwarded request got no answer: {e}");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "The request was forwarded to Berth node {}, which serves its volume, and got no answer; \
                     it may or may not have been carried out there. Retry.",
                    to.node
                ),
            )
            .into_response()
        })
    }
}

/// A caller's request as a handler sends it on to other nodes itself (a driver upgrade of a
/// shared backend, log levels set on every node): its path, its headers (the caller's
/// credentials, which each node checks again) and its request id. Each is sent marked as
/// forwarded, and a node that received one forwarded sends it on to no one.
pub struct Relayed {
    path: String,
    headers: HeaderMap,
    request_id: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Relayed {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let uri = parts.extensions.get::<OriginalUri>().map_or(&parts.uri, |o| &o.0);
        Ok(Relayed {
            path: uri.path_and_query().map_or_else(|| uri.path().to_string(), |p| p.as_str().to_string()),
            headers: parts.headers.clone(),
            request_id: parts.extensions.get::<super::RequestId>().map(|r| r.0.clone()),
        })
    }
}

impl Relayed {
    /// Whether another node sent this request on (it then goes no further).
    pub fn arrived_forwarded(&self) -> bool {
        self.headers.contains_key(FORWARDED_BY)
    }

    /// Sends `body` as the caller's request (`method`, its path) to `peer`: its status and answer
    /// (503 once `peer` shows down, as for a forwarded request).
    pub async fn send(
        &self,
        state: &AppState,
        peer: &Forward,
        method: Method,
        body: &serde_json::Value,
    ) -> (StatusCode, String) {
        let bytes = bytes::Bytes::from(serde_json::to_vec(body).expect("serialises"));
        let sent = state.forwarder.send_to(
            peer,
            method,
            &self.path,
            &self.headers,
            self.request_id.as_deref(),
            bytes,
        );
        let answer = tokio::select! {
            answer = sent => answer,
            () = state.service.until_down(&peer.node) => {
                let message = format!("Berth node {} went down before it answered", peer.node);
                return (StatusCode::SERVICE_UNAVAILABLE, message);
            }
        };
        let status = answer.status();
        let text = axum::body::to_bytes(answer.into_body(), 1 << 20).await.unwrap_or_default();
        (status, String::from_utf8_lossy(&text).into_owned())
    }
}

/// The headers of a request or an answer that cross to the other side.
fn copyable(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for name in HOP_BY_HOP.iter().chain([&header::CONTENT_LENGTH]) {
        out.remove(name);
    }
    out
}

/// The middleware (see the module notes).
pub async fn forward(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(e) if is_too_large(&e) => return too_large().into_response(),
        Err(e) => return ApiError::bad_request(format!("Cannot read the request body: {e}")).into_response(),
    };
    let arrived_forwarded = parts.headers.contains_key(FORWARDED_BY);
    let kept = parts.clone();
    let response = next.run(Request::from_parts(parts, Body::from(body.clone()))).await;
    match response.extensions().get::<Forward>() {
        Some(to) if !arrived_forwarded => {
            let to = to.clone();
            tracing::debug!(node = %to.node, "forwarding the request to the node that serves its volume");
            // Bounded by the owner's liveness: once it shows down (no heartbeat for a lease, or
            // stopped), waiting on it is pointless.
            tokio::select! {
                answer = state.forwarder.send(&to, &kept, body) => answer,
                () = state.service.until_down(&to.node) => {
                    crate::metrics::forwarded(&to.node, "owner-down");
                    tracing::warn!(node = %to.node, "the node a request was forwarded to went down before it answered");
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "The request was forwarded to Berth node {}, which serves its volume, and that node went \
                             down before it answered; it may or may not have been carried out there. Retry when \
                             the node is back.",
                            to.node
                        ),
                    )
                    .into_response()
                }
            }
        }
        _ => response,
    }
}

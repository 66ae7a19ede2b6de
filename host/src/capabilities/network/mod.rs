//! `network`: HTTPS (and, where the operator lists it, HTTP) from a driver to its storage, as a
//! careful WebAssembly host gives it (Spin's `allowed_outbound_hosts`, wasmtime's `wasi:http`,
//! whose `send_request` is the host's). The driver speaks the standard `wasi:http`
//! (`runtime/` turns it into calls of [`NetworkCapability::send`]); this room decides whether
//! each request goes out, and how:
//!
//! - only to an entry of the backend's allow-list (`allow.rs`): scheme, host, port, `*.`
//!   wildcards; every redirect is a new request, checked the same way. Anything else is refused
//!   before a socket opens ([`NetError::Denied`]), and the operator's log says so. A name that
//!   resolves to this machine or the cloud's metadata service is refused unless that address is
//!   listed itself ([`NetError::Prohibited`]); the connection goes to the address that was checked.
//! - with TLS by rustls: the system's roots and the backend's `ca_file`, an optional client
//!   certificate; verification off only by the backend's `insecure_skip_verify`, which is logged
//!   at every start.
//! - within bounds: connect, first-byte and idle timeouts, all inside what remains of the call's
//!   wall time; request and response bodies of bounded size; a bounded number of requests at once
//!   per call (more wait their turn).
//! - with the array's credentials added by the host (`secrets.rs`): the driver writes
//!   `{{secret:<name>}}`, or the operator configures a header per host; a secret goes only to its
//!   hosts. Values the operator marks as secret in answers (a login's token) are redacted from
//!   the driver's log lines, errors and stored model updates like the configured secrets.
//! - on connections and TLS sessions that belong to the host, pooled per backend across calls.
//!
//! Every request is one log line (method, allowed host, path without its query, status,
//! duration; never headers or bodies) and counted by backend, allowed host, method and status
//! class.

pub mod allow;
pub mod secrets;
pub mod sessions;
mod transport;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderValue;
use serde::Deserialize;

pub use allow::{AllowList, AllowedHost};
pub use secrets::SecretSource;
use secrets::{FillError, NamedSecret};
use sessions::Session;
pub use sessions::SessionConfig;

/// With the `network` grant: the hosts the driver may reach, TLS, bounds, and the array's
/// credentials (`capabilities/network`; docs/security.md says how each kind of login is kept).
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Where the driver may send requests: `https://host[:port]` (or `http://`, only where
    /// listed so); `*.example.com` for any name below a domain.
    pub allowed_hosts: Vec<String>,
    /// PEM certificates trusted besides the system's roots (arrays ship self-signed ones).
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM), for arrays that ask for one.
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's key (PEM; not readable by group or others).
    pub client_key_file: Option<PathBuf>,
    /// Accept any server certificate. Logged as a warning at every start; never in production.
    pub insecure_skip_verify: bool,
    /// Fixed addresses for names (as `curl --resolve`), e.g. arrays on a private DNS.
    pub resolve: BTreeMap<String, IpAddr>,
    /// Until the TCP connection and the TLS handshake are done.
    pub connect_timeout_ms: u64,
    /// Until the answer's headers arrive.
    pub first_byte_timeout_ms: u64,
    /// Between two pieces of an answer's body.
    pub idle_timeout_ms: u64,
    /// The largest request body a driver may send.
    pub max_request_kib: u64,
    /// The largest answer body a driver may get (a larger one fails the request).
    pub max_response_kib: u64,
    /// Requests one driver call may have under way at once; more wait.
    pub max_concurrent_requests: u32,
    /// The array's credentials, by name (`{{secret:<name>}}` in a request).
    pub secrets: BTreeMap<String, SecretSource>,
    /// Headers the host adds to every request to an allowed host (values may name secrets), by
    /// entry of `allowed_hosts`: e.g. `Authorization = "Basic {{secret:array-basic}}"`.
    pub headers: BTreeMap<String, BTreeMap<String, String>>,
    /// Fields of JSON answers that hold secrets the driver must see (a login's token), as JSON
    /// pointers (`/token`): redacted like the configured secrets.
    pub secret_response_fields: Vec<String>,
    /// The same for answer headers (`x-auth-token`).
    pub secret_response_headers: Vec<String>,
    /// Logins the host makes and keeps, by name: their tokens go on the requests to their hosts,
    /// and the driver never holds them (`sessions.rs`).
    pub sessions: BTreeMap<String, SessionConfig>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            allowed_hosts: Vec::new(),
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            insecure_skip_verify: false,
            resolve: BTreeMap::new(),
            connect_timeout_ms: 5_000,
            first_byte_timeout_ms: 30_000,
            idle_timeout_ms: 10_000,
            max_request_kib: 1024,
            max_response_kib: 8192,
            max_concurrent_requests: 4,
            secrets: BTreeMap::new(),
            headers: BTreeMap::new(),
            secret_response_fields: Vec::new(),
            secret_response_headers: Vec::new(),
            sessions: BTreeMap::new(),
        }
    }
}

/// The bounds of a backend's requests.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub connect: Duration,
    pub first_byte: Duration,
    pub idle: Duration,
    pub max_request: usize,
    pub max_response: usize,
    pub max_concurrent: u32,
}

/// Why a request did not get an answer. The driver sees each as the matching `wasi:http` error
/// code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// Not on the allow-list, or names a secret it may not carry: refused before any socket.
    #[error("refused: {0}")]
    Denied(String),
    /// The name resolves to an address of this machine or the cloud's that is not listed.
    #[error("refused: {0}")]
    Prohibited(String),
    #[error("DNS: {0}")]
    Dns(String),
    #[error("connection refused: {0}")]
    Refused(String),
    #[error("connect timeout")]
    ConnectTimeout,
    #[error("TLS: {0}")]
    Tls(String),
    #[error("TLS certificate: {0}")]
    Certificate(String),
    #[error("no answer within {0:?}")]
    FirstByteTimeout(Duration),
    #[error("the answer stalled for {0:?}")]
    IdleTimeout(Duration),
    #[error("the request body is larger than {0} bytes")]
    RequestTooLarge(usize),
    #[error("the answer's body is larger than {0} bytes")]
    ResponseTooLarge(usize),
    #[error("the connection ended before the answer")]
    ConnectionLost,
    #[error("HTTP: {0}")]
    Protocol(String),
}

/// A fault the conformance suite injects in front of the real endpoint, at one request of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetFault {
    /// The request is sent and applied; its answer is lost (the connection ends).
    LostAnswer,
    /// No answer comes in time (the request is not sent).
    Timeout,
    /// The endpoint answers 503 (the request is not sent).
    ServerError,
}

/// An answer, with the secret values it holds (from `secret_response_*`).
#[derive(Debug)]
pub struct Answer {
    pub response: http::Response<Bytes>,
    pub secrets: Vec<String>,
}

/// One backend's network: its policy, its credentials, and its pool of connections.
pub struct NetworkCapability {
    backend: Arc<str>,
    allow: Arc<AllowList>,
    secrets: BTreeMap<String, NamedSecret>,
    headers: Vec<(String, Vec<(http::HeaderName, String)>)>,
    secret_fields: Vec<String>,
    secret_headers: Vec<http::HeaderName>,
    sessions: Vec<Session>,
    pub bounds: Bounds,
    client: transport::Client,
}

impl std::fmt::Debug for NetworkCapability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkCapability").field("backend", &self.backend).finish_non_exhaustive()
    }
}

impl NetworkCapability {
    /// Builds a backend's network from its configuration: the allow-list, the secrets (read now:
    /// a missing or world-readable one refuses the start), TLS, the pool.
    pub fn new(backend: &str, config: &NetworkConfig) -> Result<NetworkCapability, String> {
        let allow = AllowList::parse(&config.allowed_hosts).map_err(|e| format!("backend {backend}: {e}"))?;
        if allow.hosts.is_empty() {
            return Err(format!(
                "backend {backend}: the network grant needs [backends.network] allowed_hosts"
            ));
        }
        let secrets =
            secrets::load(&config.secrets, &allow.hosts).map_err(|e| format!("backend {backend}: {e}"))?;
        let mut headers = Vec::new();
        for (entry, fields) in &config.headers {
            let parsed = AllowedHost::parse(entry).map_err(|e| format!("backend {backend}: headers: {e}"))?;
            if !allow.hosts.iter().any(|a| a.entry == parsed.entry) {
                return Err(format!("backend {backend}: headers for {entry}, which is not in allowed_hosts"));
            }
            let mut list = Vec::new();
            for (name, value) in fields {
                let name = http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("backend {backend}: headers: {name:?} is not a header name"))?;
                // A header's secrets must be allowed to go to its host (checked now, not per request).
                secrets::fill(value.as_bytes(), &secrets, &parsed.entry, false)
                    .map_err(|e| format!("backend {backend}: headers for {entry}: {e}"))?;
                list.push((name, value.clone()));
            }
            headers.push((parsed.entry, list));
        }
        let sessions =
            sessions::load(&config.sessions, &allow.hosts).map_err(|e| format!("backend {backend}: {e}"))?;
        for session in &sessions {
            let login = session.login.request();
            let host = login.uri().host().unwrap_or_default().to_string();
            let https = login.uri().scheme_str() == Some("https");
            let port = login.uri().port_u16().unwrap_or(if https { 443 } else { 80 });
            let entry = allow.find(https, &host, port).map(|a| a.entry.clone()).ok_or_else(|| {
                format!("backend {backend}: session {}: login_url is not on an allowed host", session.name)
            })?;
            for (_, value) in &session.login.headers {
                secrets::fill(value.as_bytes(), &secrets, &entry, false)
                    .map_err(|e| format!("backend {backend}: session {}: {e}", session.name))?;
            }
            secrets::fill(&session.login.body, &secrets, &entry, false)
                .map_err(|e| format!("backend {backend}: session {}: {e}", session.name))?;
        }
        let secret_headers = config
            .secret_response_headers
            .iter()
            .map(|h| {
                http::HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("backend {backend}: {h:?} is not a header name"))
            })
            .collect::<Result<_, _>>()?;
        if config.insecure_skip_verify {
            tracing::warn!(
                backend,
                "[backends.network] insecure_skip_verify = true: this backend's TLS certificates are not checked; \
                 anyone between Berth and the array can read and change what the driver sends, credentials included"
            );
        }
        let bounds = Bounds {
            connect: Duration::from_millis(config.connect_timeout_ms.max(1)),
            first_byte: Duration::from_millis(config.first_byte_timeout_ms.max(1)),
            idle: Duration::from_millis(config.idle_timeout_ms.max(1)),
            max_request: (config.max_request_kib as usize).saturating_mul(1024),
            max_response: (config.max_response_kib as usize).saturating_mul(1024),
            max_concurrent: config.max_concurrent_requests.max(1),
        };
        let allow = Arc::new(allow);
        let client = transport::client(backend, config, allow.clone(), bounds)?;
        Ok(NetworkCapability {
            backend: backend.into(),
            allow,
            secrets,
            headers,
            secret_fields: config.secret_response_fields.clone(),
            secret_headers,
            sessions,
            bounds,
            client,
        })
    }

    /// The allow-list, as configured (for `berth driver inspect` and messages).
    pub fn allowed_hosts(&self) -> Vec<String> {
        self.allow.hosts.iter().map(|h| h.entry.clone()).collect()
    }

    /// Every configured secret value (the call's redactor scrubs them).
    pub fn secret_values(&self) -> impl Iterator<Item = &str> {
        self.secrets.values().map(|s| s.value.expose())
    }

    /// Sends one request of a driver's call (see the module notes), by `deadline` at the latest
    /// (the call's end); `fault` injects a fault instead of, or after, sending it.
    pub async fn send(
        &self,
        request: http::Request<Bytes>,
        deadline: Instant,
        fault: Option<NetFault>,
    ) -> Result<Answer, NetError> {
        let started = Instant::now();
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let (entry, outcome) = match self.check(request) {
            Ok((entry, request)) => {
                let outcome = match self.session_of(&entry, &request) {
                    Some(session) => self.exchange_in_session(session, request, deadline, fault).await,
                    None => self.exchange(request, deadline, fault).await,
                };
                (entry, outcome)
            }
            Err((what, e)) => (what, Err(e)),
        };
        let took = started.elapsed();
        let class = match &outcome {
            Ok(a) => format!("{}xx", a.response.status().as_u16() / 100),
            Err(NetError::Denied(_) | NetError::Prohibited(_)) => "refused".into(),
            Err(_) => "error".into(),
        };
        crate::metrics::outbound(&self.backend, &entry, method.as_str(), &class, took);
        match &outcome {
            Ok(a) => tracing::info!(
                backend = %self.backend, %method, host = %entry, %path, status = a.response.status().as_u16(),
                micros = took.as_micros() as u64, "outbound request"
            ),
            Err(e @ (NetError::Denied(_) | NetError::Prohibited(_))) => tracing::warn!(
                backend = %self.backend, %method, host = %entry, %path, "outbound request {e}"
            ),
            Err(e) => tracing::warn!(
                backend = %self.backend, %method, host = %entry, %path, micros = took.as_micros() as u64,
                "outbound request failed: {e}"
            ),
        }
        outcome
    }

    /// The allow-list and the credentials: the request as it goes out, and the entry it goes out
    /// under; or why not (with what to name it by in the log: the entry, or `unlisted`).
    fn check(
        &self,
        mut request: http::Request<Bytes>,
    ) -> Result<(String, http::Request<Bytes>), (String, NetError)> {
        let uri = request.uri();
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            other => {
                return Err((
                    "unlisted".into(),
                    NetError::Denied(format!("scheme {other:?} is not http or https")),
                ));
            }
        };
        let Some(host) = uri.host() else {
            return Err(("unlisted".into(), NetError::Denied("the request names no host".into())));
        };
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let Some(allowed) = self.allow.find(https, host, port) else {
            let scheme = if https { "https" } else { "http" };
            return Err((
                "unlisted".into(),
                NetError::Denied(format!("{scheme}://{host}:{port} is not in the backend's allowed_hosts")),
            ));
        };
        let entry = allowed.entry.clone();
        if request.body().len() > self.bounds.max_request {
            return Err((entry, NetError::RequestTooLarge(self.bounds.max_request)));
        }
        let deny = |e: FillError| (entry.clone(), NetError::Denied(e.to_string()));
        // A secret's value itself (one the driver got hold of anyway: an answer that echoed it)
        // does not go to a host it is not for either.
        for (name, secret) in &self.secrets {
            if secret.hosts.contains(&entry) {
                continue;
            }
            let value = secret.value.expose().as_bytes();
            let carried = request.body().windows(value.len()).any(|w| w == value)
                || request.headers().values().any(|v| v.as_bytes().windows(value.len()).any(|w| w == value))
                || request.uri().to_string().contains(secret.value.expose());
            if carried {
                return Err((
                    entry.clone(),
                    NetError::Denied(format!(
                        "the request carries secret {name}, which may not be sent to {entry}"
                    )),
                ));
            }
        }
        // Secrets the driver names, in its headers and body.
        for value in request.headers_mut().values_mut() {
            if let Some(filled) =
                secrets::fill(value.as_bytes(), &self.secrets, &entry, false).map_err(deny)?
            {
                *value = HeaderValue::from_bytes(&filled).map_err(|_| {
                    (entry.clone(), NetError::Denied("a secret does not fit in a header".into()))
                })?;
                value.set_sensitive(true);
            }
        }
        let json = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.contains("json"));
        if let Some(filled) = secrets::fill(request.body(), &self.secrets, &entry, json).map_err(deny)? {
            request.headers_mut().remove(http::header::CONTENT_LENGTH);
            *request.body_mut() = Bytes::from(filled);
        }
        // Headers the operator configured for this host.
        if let Some((_, fields)) = self.headers.iter().find(|(e, _)| *e == entry) {
            for (name, template) in fields {
                let value = secrets::fill(template.as_bytes(), &self.secrets, &entry, false)
                    .map_err(deny)?
                    .unwrap_or_else(|| template.as_bytes().to_vec());
                let mut value = HeaderValue::from_bytes(&value).map_err(|_| {
                    (entry.clone(), NetError::Denied(format!("header {name} is not a valid value")))
                })?;
                value.set_sensitive(true);
                request.headers_mut().insert(name.clone(), value);
            }
        }
        Ok((entry, request))
    }

    /// The exchange itself, bounded by the backend's timeouts and the call's deadline.
    async fn exchange(
        &self,
        request: http::Request<Bytes>,
        deadline: Instant,
        fault: Option<NetFault>,
    ) -> Result<Answer, NetError> {
        let left = deadline.saturating_duration_since(Instant::now());
        match fault {
            Some(NetFault::Timeout) => {
                return Err(NetError::FirstByteTimeout(self.bounds.first_byte.min(left)));
            }
            Some(NetFault::ServerError) => {
                let response = http::Response::builder()
                    .status(503)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Bytes::from_static(br#"{"error": "injected by the conformance suite"}"#))
                    .expect("a valid response");
                return Ok(Answer { response, secrets: Vec::new() });
            }
            _ => {}
        }
        let response = self.client.exchange(request, deadline, &self.bounds).await?;
        if fault == Some(NetFault::LostAnswer) {
            return Err(NetError::ConnectionLost);
        }
        let secrets = self.learned(&response);
        Ok(Answer { response, secrets })
    }

    /// The session whose token a request to `entry` carries (not its own login).
    fn session_of(&self, entry: &str, request: &http::Request<Bytes>) -> Option<&Session> {
        self.sessions.iter().find(|s| s.hosts.iter().any(|h| h == entry) && request.uri() != &s.login.uri)
    }

    /// A request with its session's token; once more with a new token if the array answers 401.
    async fn exchange_in_session(
        &self,
        session: &Session,
        request: http::Request<Bytes>,
        deadline: Instant,
        fault: Option<NetFault>,
    ) -> Result<Answer, NetError> {
        let (parts, body) = request.into_parts();
        let mut stale = None;
        loop {
            let token = match self.session_token(session, stale.as_deref(), deadline).await? {
                Ok(token) => token,
                // The login itself was refused: the driver sees that answer.
                Err(refused) => return Ok(Answer { response: refused, secrets: Vec::new() }),
            };
            let mut request = http::Request::builder()
                .method(parts.method.clone())
                .uri(parts.uri.clone())
                .version(parts.version)
                .body(body.clone())
                .expect("rebuilt from a valid request");
            *request.headers_mut() = parts.headers.clone();
            let value = session.header_value(&token).ok_or_else(|| {
                NetError::Protocol(format!("session {}: the token does not fit in a header", session.name))
            })?;
            request.headers_mut().insert(session.header.clone(), value);
            let mut answer = self.exchange(request, deadline, fault).await?;
            if answer.response.status() == http::StatusCode::UNAUTHORIZED && stale.is_none() {
                stale = Some(token);
                continue;
            }
            // Should the array echo the token, the call's redactor knows it.
            answer.secrets.push(token);
            return Ok(answer);
        }
    }

    /// The session's token: the one held, unless it is `stale` or too old; else a new login's.
    /// `Ok(Err(answer))` when the array refused the login.
    async fn session_token(
        &self,
        session: &Session,
        stale: Option<&str>,
        deadline: Instant,
    ) -> Result<Result<String, http::Response<Bytes>>, NetError> {
        let mut held = tokio::time::timeout_at(deadline.into(), session.token.lock())
            .await
            .map_err(|_| NetError::FirstByteTimeout(self.bounds.first_byte))?;
        if let Some((token, at)) = held.as_ref()
            && Some(token.as_str()) != stale
            && session.fresh(*at)
        {
            return Ok(Ok(token.clone()));
        }
        *held = None;
        let started = Instant::now();
        let login = session.login.request();
        let path = login.uri().path().to_string();
        let (entry, login) = self.check(login).map_err(|(_, e)| e)?;
        let outcome = self.client.exchange(login, deadline, &self.bounds).await;
        let took = started.elapsed();
        let class = match &outcome {
            Ok(r) => format!("{}xx", r.status().as_u16() / 100),
            Err(_) => "error".into(),
        };
        crate::metrics::outbound(&self.backend, &entry, session.login.method.as_str(), &class, took);
        let response = match outcome {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(backend = %self.backend, session = %session.name, host = %entry, %path,
                    "session login failed: {e}");
                return Err(e);
            }
        };
        let status = response.status().as_u16();
        tracing::info!(backend = %self.backend, session = %session.name, host = %entry, %path, status,
            micros = took.as_micros() as u64, "session login");
        if !response.status().is_success() {
            return Ok(Err(response));
        }
        let token = session.token_of(&response).ok_or_else(|| {
            NetError::Protocol(format!("session {}: the login's answer holds no token", session.name))
        })?;
        *held = Some((token.clone(), Instant::now()));
        Ok(Ok(token))
    }

    /// The secret values an answer holds (`secret_response_fields`, `secret_response_headers`).
    fn learned(&self, response: &http::Response<Bytes>) -> Vec<String> {
        let mut out: Vec<String> = self
            .secret_headers
            .iter()
            .filter_map(|h| response.headers().get(h)?.to_str().ok().map(str::to_string))
            .collect();
        if !self.secret_fields.is_empty()
            && let Ok(json) = serde_json::from_slice::<serde_json::Value>(response.body())
        {
            for pointer in &self.secret_fields {
                if let Some(serde_json::Value::String(s)) = json.pointer(pointer) {
                    out.push(s.clone());
                }
            }
        }
        out
    }
}

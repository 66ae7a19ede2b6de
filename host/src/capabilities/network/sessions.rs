//! Sessions kept by the host. Many management APIs log in once (a password for a token) and then
//! want the token on every request. A driver is stateless between calls, so left to itself it
//! would log in on every call (Ceph's dashboard spends about 170 ms on bcrypt per login) and hold
//! the token it got. With a session configured, the host logs in itself, when a request to one
//! of the session's hosts first needs it, keeps the token (shared by every call of the backend),
//! and adds it to those requests; the driver never sees the password or the token. An answer 401
//! means the token expired (or the array restarted): the host logs in again and sends the request
//! once more, which is safe, as the array refused the first one.
//!
//! ```toml
//! [backends.network.sessions.dashboard]
//! login_url = "https://ceph-mgr.example:8443/api/auth"
//! login_body = '{"username": "berth", "password": "{{secret:dashboard-password}}"}'
//! login_headers = { Accept = "application/vnd.ceph.api.v1.0+json", Content-Type = "application/json" }
//! token_field = "/token"
//! header = "Authorization"
//! value = "Bearer {{session}}"
//! hosts = ["https://ceph-mgr.example:8443"]
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;

use super::allow::AllowedHost;

/// A login the host makes and keeps for the backend: the token it answers goes, in a header, on
/// every request to the session's hosts (its login request's own excepted).
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionConfig {
    /// The login request's URL, on an allowed host.
    pub login_url: String,
    /// Its method.
    #[serde(default = "post")]
    pub login_method: String,
    /// Its body, which may name secrets (`{{secret:<name>}}`) that may go to that host.
    #[serde(default)]
    pub login_body: String,
    /// Its headers (values may name secrets too).
    #[serde(default)]
    pub login_headers: BTreeMap<String, String>,
    /// Where the token is in the login's answer: a JSON pointer into its body (`/token`)...
    #[serde(default)]
    pub token_field: Option<String>,
    /// ...or a header of the answer (`x-auth-token`).
    #[serde(default)]
    pub token_header: Option<String>,
    /// The header the host adds to the session's requests (`Authorization`).
    pub header: String,
    /// Its value, where `{{session}}` is the token.
    #[serde(default = "bearer")]
    pub value: String,
    /// The `allowed_hosts` entries whose requests carry the session.
    pub hosts: Vec<String>,
    /// Log in again after this long, whatever the array says (0: only when it answers 401).
    #[serde(default)]
    pub lifetime_seconds: u64,
}

fn post() -> String {
    "POST".into()
}

fn bearer() -> String {
    "Bearer {{session}}".into()
}

/// A session: its configuration, checked, and the token it holds.
pub(super) struct Session {
    pub name: String,
    pub login: Login,
    pub token_field: Option<String>,
    pub token_header: Option<http::HeaderName>,
    pub header: http::HeaderName,
    pub value: String,
    /// Entries of the allow-list.
    pub hosts: Vec<String>,
    pub lifetime: Option<Duration>,
    /// The token and when it was got. Held while logging in, so that concurrent calls share one
    /// login.
    pub token: tokio::sync::Mutex<Option<(String, Instant)>>,
}

/// A login request, as configured.
pub(super) struct Login {
    pub method: http::Method,
    pub uri: http::Uri,
    pub headers: Vec<(http::HeaderName, String)>,
    pub body: Bytes,
}

impl Login {
    pub(super) fn request(&self) -> http::Request<Bytes> {
        let mut r = http::Request::builder().method(self.method.clone()).uri(self.uri.clone());
        for (name, value) in &self.headers {
            r = r.header(name, value);
        }
        r.body(self.body.clone()).expect("checked when the session was configured")
    }
}

/// Checks the sessions of a backend against its allow-list.
pub(super) fn load(
    sessions: &BTreeMap<String, SessionConfig>,
    allowed: &[AllowedHost],
) -> Result<Vec<Session>, String> {
    let mut out = Vec::new();
    for (name, c) in sessions {
        let what = format!("session {name}");
        let uri: http::Uri = c.login_url.parse().map_err(|_| format!("{what}: login_url is not a URL"))?;
        let method = http::Method::from_bytes(c.login_method.as_bytes())
            .map_err(|_| format!("{what}: login_method {:?} is not a method", c.login_method))?;
        let mut headers = Vec::new();
        for (k, v) in &c.login_headers {
            let name = http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("{what}: {k:?} is not a header name"))?;
            headers.push((name, v.clone()));
        }
        let token_header = match &c.token_header {
            Some(h) => Some(
                http::HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("{what}: {h:?} is not a header name"))?,
            ),
            None => None,
        };
        if c.token_field.is_some() == token_header.is_some() {
            return Err(format!("{what}: give exactly one of token_field or token_header"));
        }
        let header = http::HeaderName::from_bytes(c.header.as_bytes())
            .map_err(|_| format!("{what}: {:?} is not a header name", c.header))?;
        if !c.value.contains("{{session}}") {
            return Err(format!("{what}: value must name the token as {{{{session}}}}"));
        }
        if c.hosts.is_empty() {
            return Err(format!("{what}: name the allowed hosts whose requests carry it (hosts = [...])"));
        }
        let mut hosts = Vec::new();
        for h in &c.hosts {
            let parsed = AllowedHost::parse(h).map_err(|e| format!("{what}: {e}"))?;
            if !allowed.iter().any(|a| a.entry == parsed.entry) {
                return Err(format!("{what}: {h} is not one of the backend's allowed_hosts"));
            }
            hosts.push(parsed.entry);
        }
        let login = Login { method, uri, headers, body: Bytes::from(c.login_body.clone()) };
        // The request must be well formed now, not at the first call.
        let _ = http::Request::builder()
            .method(login.method.clone())
            .uri(login.uri.clone())
            .body(())
            .map_err(|e| format!("{what}: {e}"))?;
        out.push(Session {
            name: name.clone(),
            login,
            token_field: c.token_field.clone(),
            token_header,
            header,
            value: c.value.clone(),
            hosts,
            lifetime: (c.lifetime_seconds > 0).then(|| Duration::from_secs(c.lifetime_seconds)),
            token: tokio::sync::Mutex::new(None),
        });
    }
    Ok(out)
}

impl Session {
    /// The token in a login's answer.
    pub(super) fn token_of(&self, response: &http::Response<Bytes>) -> Option<String> {
        if let Some(h) = &self.token_header {
            return response.headers().get(h)?.to_str().ok().map(str::to_string);
        }
        let json: serde_json::Value = serde_json::from_slice(response.body()).ok()?;
        json.pointer(self.token_field.as_deref()?)?.as_str().map(str::to_string)
    }

    /// The header value that carries `token`.
    pub(super) fn header_value(&self, token: &str) -> Option<http::HeaderValue> {
        let mut v = http::HeaderValue::from_str(&self.value.replace("{{session}}", token)).ok()?;
        v.set_sensitive(true);
        Some(v)
    }

    /// Whether a token got at `at` is still to be used.
    pub(super) fn fresh(&self, at: Instant) -> bool {
        self.lifetime.is_none_or(|l| at.elapsed() < l)
    }
}

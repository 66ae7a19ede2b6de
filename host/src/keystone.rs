//! Keystone (OpenStack Identity v3), as both sides of Berth talk to it: password authentication
//! (`POST /v3/auth/tokens`: the service's own token, and the attach client's), token validation
//! (`GET /v3/auth/tokens` with `X-Subject-Token`, as keystonemiddleware does) and the service
//! catalog of a token. Tokens and passwords are never logged or put into errors.

use reqwest::StatusCode;
use serde_json::{Value as Json, json};
use time::OffsetDateTime;

/// A user, project or domain named by name or by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    Name(String),
    Id(String),
}

impl Named {
    fn json(&self) -> Json {
        match self {
            Named::Name(n) => json!({ "name": n }),
            Named::Id(i) => json!({ "id": i }),
        }
    }
}

/// What password authentication needs; the project scopes the token.
#[derive(Clone)]
pub struct Password {
    /// Keystone's v3 URL (see [`v3_url`]).
    pub auth_url: String,
    pub user: Named,
    /// The user's domain (ignored when the user is named by id).
    pub user_domain: Named,
    pub password: String,
    pub project: Named,
    /// The project's domain (ignored when the project is named by id).
    pub project_domain: Named,
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Password")
            .field("auth_url", &self.auth_url)
            .field("user", &self.user)
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

/// Why Keystone could not answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeystoneError {
    /// Not reachable, or a 5xx: try again later.
    #[error("Keystone at {url} is unavailable: {detail}")]
    Unavailable { url: String, detail: String },
    /// Keystone refused the credentials or the request (401, 403, ...).
    #[error("Keystone at {url} answered {status}: {message}")]
    Refused { url: String, status: u16, message: String },
    /// An answer that is not what Identity v3 sends.
    #[error("Keystone at {url} sent an answer Berth cannot read: {detail}")]
    Malformed { url: String, detail: String },
}

/// An issued token: its id (the `X-Subject-Token`) and its body (`{"token": ...}`'s inside).
#[derive(Clone)]
pub struct Issued {
    pub id: String,
    pub token: Json,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").field("expires_at", &expires_at(&self.token)).finish_non_exhaustive()
    }
}

/// Who a token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user_id: String,
    /// The project the token is scoped to (none for a domain- or system-scoped token).
    pub project_id: Option<String>,
    pub roles: Vec<String>,
    pub expires_at: Option<OffsetDateTime>,
}

/// A service's own token (password authentication as the service's user), kept until shortly
/// before it expires or until a caller says Keystone or another service refused it
/// ([`Session::forget`]); one authentication at a time. Its body holds the catalog.
pub struct Session {
    http: reqwest::Client,
    password: Password,
    own: tokio::sync::Mutex<Option<(std::sync::Arc<Issued>, std::time::Instant)>>,
}

/// The own token is renewed this long before it expires.
const RENEW_BEFORE: std::time::Duration = std::time::Duration::from_secs(120);

impl Session {
    pub fn new(http: reqwest::Client, password: Password) -> Session {
        Session { http, password, own: tokio::sync::Mutex::new(None) }
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Keystone's v3 URL.
    pub fn auth_url(&self) -> &str {
        &self.password.auth_url
    }

    /// The own token, authenticating first when there is none or it is about to expire.
    pub async fn token(&self) -> Result<std::sync::Arc<Issued>, KeystoneError> {
        use std::time::{Duration, Instant};
        let mut own = self.own.lock().await;
        if let Some((issued, _)) = own.as_ref().filter(|(_, renew_at)| *renew_at > Instant::now()) {
            return Ok(issued.clone());
        }
        let issued = authenticate(&self.http, &self.password).await.inspect_err(|e| {
            if let KeystoneError::Refused { .. } = e {
                tracing::error!(
                    "Keystone refused Berth's own credentials ([keystone] username/password): {e}"
                );
            }
        })?;
        let left = expires_at(&issued.token)
            .and_then(|at| Duration::try_from(at - OffsetDateTime::now_utc()).ok())
            .unwrap_or(Duration::from_secs(3600));
        let renew_at = Instant::now() + left.saturating_sub(RENEW_BEFORE).max(Duration::from_secs(1));
        tracing::info!(auth_url = %self.password.auth_url, "authenticated with Keystone");
        let issued = std::sync::Arc::new(issued);
        *own = Some((issued.clone(), renew_at));
        Ok(issued)
    }

    /// Forgets the own token (it was refused: revoked, or expired early); the next
    /// [`Session::token`] authenticates again.
    pub async fn forget(&self) {
        *self.own.lock().await = None;
    }
}

/// Keystone's v3 URL from what operators and clients write: `http://h:5000`, `http://h:5000/`,
/// `http://h:5000/v3` and `http://h:5000/identity/v3/` all work.
pub fn v3_url(auth_url: &str) -> String {
    let trimmed = auth_url.trim().trim_end_matches('/');
    if trimmed.ends_with("/v3") { trimmed.to_string() } else { format!("{trimmed}/v3") }
}

/// Password authentication scoped to a project: `POST /v3/auth/tokens`.
pub async fn authenticate(http: &reqwest::Client, p: &Password) -> Result<Issued, KeystoneError> {
    let url = format!("{}/auth/tokens", p.auth_url);
    let mut user = p.user.json();
    if let Named::Name(_) = p.user {
        user["domain"] = p.user_domain.json();
    }
    user["password"] = Json::String(p.password.clone());
    let mut project = p.project.json();
    if let Named::Name(_) = p.project {
        project["domain"] = p.project_domain.json();
    }
    let body = json!({ "auth": {
        "identity": { "methods": ["password"], "password": { "user": user } },
        "scope": { "project": project },
    }});
    let response = http
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|e| KeystoneError::Unavailable { url: p.auth_url.clone(), detail: root_cause(&e) })?;
    let status = response.status();
    let id = response.headers().get("x-subject-token").and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = response.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(refusal(&p.auth_url, status, &text));
    }
    let id = id.ok_or_else(|| KeystoneError::Malformed {
        url: p.auth_url.clone(),
        detail: "no X-Subject-Token header".into(),
    })?;
    let token = token_body(&p.auth_url, &text)?;
    Ok(Issued { id, token })
}

/// Validates `subject` with the service's own token: `Ok(Some(body))` when it is valid,
/// `Ok(None)` when Keystone says it is not (404: unknown, expired or revoked).
pub async fn validate(
    http: &reqwest::Client,
    auth_url: &str,
    service_token: &str,
    subject: &str,
) -> Result<Option<Json>, KeystoneError> {
    let response = http
        .get(format!("{auth_url}/auth/tokens"))
        .header("X-Auth-Token", service_token)
        .header("X-Subject-Token", subject)
        .send()
        .await
        .map_err(|e| KeystoneError::Unavailable { url: auth_url.to_string(), detail: root_cause(&e) })?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    match status {
        s if s.is_success() => token_body(auth_url, &text).map(Some),
        StatusCode::NOT_FOUND => Ok(None),
        s => Err(refusal(auth_url, s, &text)),
    }
}

/// Who a validated or issued token speaks for.
pub fn identity(token: &Json) -> Option<Identity> {
    let user_id = token["user"]["id"].as_str()?.to_string();
    let project_id = token["project"]["id"].as_str().map(str::to_string);
    let roles = token["roles"]
        .as_array()
        .map(|roles| roles.iter().filter_map(|r| r["name"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    Some(Identity { user_id, project_id, roles, expires_at: expires_at(token) })
}

/// The token's `expires_at`.
pub fn expires_at(token: &Json) -> Option<OffsetDateTime> {
    let text = token["expires_at"].as_str()?;
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

/// The URL of the first catalog entry of one of `types` (in order of preference) at `interface`
/// (`public`, `internal`, `admin`), in `region` when one is named.
pub fn catalog_url(token: &Json, types: &[&str], interface: &str, region: Option<&str>) -> Option<String> {
    let catalog = token["catalog"].as_array()?;
    types.iter().find_map(|wanted| {
        catalog.iter().filter(|s| s["type"].as_str() == Some(*wanted)).find_map(|service| {
            service["endpoints"].as_array()?.iter().find_map(|e| {
                let interface_ok = e["interface"].as_str() == Some(interface);
                let region_ok = region
                    .is_none_or(|r| e["region_id"].as_str() == Some(r) || e["region"].as_str() == Some(r));
                (interface_ok && region_ok).then(|| e["url"].as_str().map(str::to_string)).flatten()
            })
        })
    })
}

fn token_body(url: &str, text: &str) -> Result<Json, KeystoneError> {
    let mut body: Json = serde_json::from_str(text)
        .map_err(|e| KeystoneError::Malformed { url: url.to_string(), detail: e.to_string() })?;
    match body.get_mut("token").map(Json::take) {
        Some(token @ Json::Object(_)) => Ok(token),
        _ => Err(KeystoneError::Malformed { url: url.to_string(), detail: "no token object".into() }),
    }
}

fn refusal(url: &str, status: StatusCode, text: &str) -> KeystoneError {
    if status.is_server_error() {
        return KeystoneError::Unavailable { url: url.to_string(), detail: format!("status {status}") };
    }
    // Keystone's errors: {"error": {"code": 401, "message": "...", "title": "Unauthorized"}}.
    let message = serde_json::from_str::<Json>(text)
        .ok()
        .and_then(|j| j["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_string());
    KeystoneError::Refused { url: url.to_string(), status: status.as_u16(), message }
}

/// The innermost cause of an HTTP client's error (what says why: refused, timed out, ...).
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Json {
        json!({
            "user": { "id": "u1", "name": "alice" },
            "project": { "id": "p1", "name": "demo" },
            "roles": [{ "id": "r1", "name": "member" }, { "id": "r2", "name": "reader" }],
            "expires_at": "2026-11-23T13:25:50.000000Z",
            "catalog": [
                { "type": "identity", "endpoints": [{ "interface": "public", "region_id": "R", "url": "http://k/v3" }] },
                { "type": "volumev3", "endpoints": [
                    { "interface": "internal", "region_id": "R", "url": "http://internal/v3/p1" },
                    { "interface": "public", "region_id": "Other", "url": "http://other/v3/p1" },
                    { "interface": "public", "region_id": "R", "url": "http://public/v3/p1" },
                ]},
                { "type": "block-storage", "endpoints": [{ "interface": "public", "region_id": "R", "url": "http://bs/v3/p1" }] },
            ],
        })
    }

    #[test]
    fn auth_urls_are_normalised_to_v3() {
        for url in ["http://h:5000", "http://h:5000/", "http://h:5000/v3", "http://h:5000/v3/"] {
            assert_eq!(v3_url(url), "http://h:5000/v3", "{url}");
        }
        assert_eq!(v3_url("https://h/identity/v3"), "https://h/identity/v3");
    }

    #[test]
    fn a_token_gives_its_user_project_roles_and_expiry() {
        let id = identity(&token()).unwrap();
        assert_eq!((id.user_id.as_str(), id.project_id.as_deref()), ("u1", Some("p1")));
        assert_eq!(id.roles, ["member", "reader"]);
        assert_eq!(id.expires_at.unwrap().unix_timestamp(), 1_795_440_350);
        let mut domain_scoped = token();
        domain_scoped.as_object_mut().unwrap().remove("project");
        assert_eq!(identity(&domain_scoped).unwrap().project_id, None);
        assert_eq!(identity(&json!({ "roles": [] })), None);
    }

    #[test]
    fn the_catalog_is_searched_by_type_preference_interface_and_region() {
        let t = token();
        let find = |types: &[&str], interface, region| catalog_url(&t, types, interface, region);
        assert_eq!(find(&["block-storage", "volumev3"], "public", None).as_deref(), Some("http://bs/v3/p1"));
        assert_eq!(
            find(&["volumev3", "block-storage"], "public", Some("R")).as_deref(),
            Some("http://public/v3/p1")
        );
        assert_eq!(find(&["volumev3"], "public", None).as_deref(), Some("http://other/v3/p1"));
        assert_eq!(find(&["volumev3"], "internal", None).as_deref(), Some("http://internal/v3/p1"));
        assert_eq!(find(&["volumev3"], "admin", None), None);
        assert_eq!(find(&["volume"], "public", None), None);
    }
}

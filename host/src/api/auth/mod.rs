//! Who is calling. Two strategies:
//!
//! - `noauth`, compatible with python-cinderclient's noauth plugin and Cinder's `NoAuthMiddleware`:
//!   `X-Auth-Token: <user>:<project>` (project defaults to user). As in Cinder, the caller is an
//!   admin unless `X-Roles` names its roles. Allowed only on a loopback listener.
//! - `token`: static tokens from a file, each mapped to a user, a project and roles. The file
//!   stores only sha256 digests of the tokens (`berth token new` makes one).
//! - `keystone`: tokens validated by a Keystone server, as keystonemiddleware does
//!   (`keystone.rs`).
//!
//! Every request is then scoped to the caller's project; a URL whose project differs is refused
//! as Cinder refuses it ("Malformed request url").

use std::collections::HashMap;
use std::path::Path;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::attach::Caller;

pub mod keystone;

/// How callers authenticate.
pub enum Auth {
    NoAuth,
    Tokens(HashMap<[u8; 32], Caller>),
    Keystone(Box<keystone::KeystoneAuth>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    /// Hex sha256 of the token.
    sha256: String,
    user_id: String,
    project_id: String,
    #[serde(default)]
    roles: Vec<String>,
}

impl Auth {
    /// Reads a tokens file (TOML: `[[tokens]] sha256 = "...", user_id, project_id, roles`).
    pub fn from_tokens_file(path: &Path) -> Result<Auth, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file: TokensFile = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut table = HashMap::new();
        for t in file.tokens {
            let digest: [u8; 32] = hex::decode(&t.sha256)
                .ok()
                .and_then(|d| d.try_into().ok())
                .ok_or_else(|| format!("{}: sha256 {:?} is not 64 hex digits", path.display(), t.sha256))?;
            check_project(&t.project_id).map_err(|e| format!("{}: {}", path.display(), e.message))?;
            check_user(&t.user_id).map_err(|e| format!("{}: {e}", path.display()))?;
            let is_service = t.roles.iter().any(|r| r == "service");
            table.insert(
                digest,
                Caller {
                    user_id: t.user_id,
                    project_id: t.project_id,
                    roles: t.roles,
                    is_service,
                    request: Default::default(),
                },
            );
        }
        Ok(Auth::Tokens(table))
    }

    /// The caller of a request.
    pub async fn identify(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if let Auth::Keystone(keystone) = self {
            return keystone.identify(headers).await;
        }
        let token = headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        match self {
            Auth::NoAuth => {
                let (user, project) = token.split_once(':').unwrap_or((token, token));
                check_project(project)?;
                let roles: Vec<String> = match headers.get("x-roles").and_then(|v| v.to_str().ok()) {
                    Some(roles) => {
                        roles.split(',').map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).collect()
                    }
                    None => vec!["admin".into()],
                };
                let is_service = headers
                    .get("x-service-roles")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|r| r.split(',').any(|r| r.trim() == "service"));
                Ok(Caller {
                    user_id: user.to_string(),
                    project_id: project.to_string(),
                    roles,
                    is_service,
                    request: Default::default(),
                })
            }
            Auth::Tokens(table) => {
                let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
                table.get(&digest).cloned().ok_or_else(unauthorized)
            }
            Auth::Keystone(_) => unreachable!("answered above"),
        }
    }
}

fn unauthorized() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "The request you have made requires authentication.")
}

/// Project ids are 1 to 64 characters of `[A-Za-z0-9_-]`.
pub fn check_project(project: &str) -> Result<(), ApiError> {
    let ok = !project.is_empty()
        && project.len() <= 64
        && project.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!("Malformed request url: bad project id {project:?}")))
    }
}

/// The project named in the URL (`/v3/{project_id}/...`), taken out of the path before routing.
#[derive(Debug, Clone)]
pub struct PathProject(pub String);

/// The collections that may follow `/v3/` directly, Berth's and the rest of Cinder's (so that
/// one Berth does not serve is a 404, not a URL whose project is not the caller's: a 400);
/// anything else there is a project id.
const COLLECTIONS: &[&str] = &[
    // Berth's.
    "volumes",
    "attachments",
    "types",
    "os-services",
    "os-availability-zone",
    "limits",
    "os-attachment-events",
    "os-drivers",
    // Cinder's others.
    "snapshots",
    "backups",
    "groups",
    "group_types",
    "group_snapshots",
    "consistencygroups",
    "cgsnapshots",
    "messages",
    "clusters",
    "workers",
    "manageable_volumes",
    "manageable_snapshots",
    "volume-transfers",
    "os-volume-transfer",
    "os-volume-manage",
    "os-snapshot-manage",
    "os-quota-sets",
    "os-quota-class-sets",
    "os-hosts",
    "qos-specs",
    "scheduler-stats",
    "capabilities",
    "default-types",
    "resource_filters",
    "extensions",
];

/// Rewrites `/v3/{project_id}/rest` to `/v3/rest`, remembering the project, so that both URL
/// forms reach the same routes.
pub fn strip_project(mut request: Request) -> Request {
    let path = request.uri().path();
    let Some(rest) = path.strip_prefix("/v3/") else { return request };
    let (first, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if first.is_empty() || COLLECTIONS.contains(&first) || tail.is_empty() && !rest.contains('/') {
        return request;
    }
    let project = first.to_string();
    let new_path = format!("/v3/{tail}");
    let new_uri = match request.uri().query() {
        Some(q) => format!("{new_path}?{q}"),
        None => new_path,
    };
    if let Ok(uri) = new_uri.parse::<Uri>() {
        *request.uri_mut() = uri;
        request.extensions_mut().insert(PathProject(project));
    }
    request
}

/// Whether a path (with its project taken out) is a `/v3` resource, which needs a caller; the
/// version documents (`/v3`, `/v3/`) and everything outside `/v3` do not.
fn needs_caller(path: &str) -> bool {
    path.strip_prefix("/v3/").is_some_and(|rest| !rest.is_empty())
}

/// Middleware: for `/v3` resources, authenticates (on the headers alone: it runs before the body
/// is read), checks the URL's project, and stores the [`Caller`] in the request.
pub async fn authenticate(
    State(auth): State<std::sync::Arc<Auth>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !needs_caller(request.uri().path()) {
        return next.run(request).await;
    }
    let mut caller = match auth.identify(request.headers()).await {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    if let Some(PathProject(project)) = request.extensions().get::<PathProject>()
        && *project != caller.project_id
    {
        return ApiError::bad_request("Malformed request url").into_response();
    }
    caller.request = crate::attach::RequestIds {
        id: request.extensions().get::<super::RequestId>().map(|r| r.0.clone()),
        global: request.extensions().get::<super::GlobalRequestId>().map(|g| g.0.clone()),
    };
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// A token's user: named (the history and the logs show who acted).
fn check_user(user: &str) -> Result<(), String> {
    match user.trim().is_empty() {
        true => Err("a token's user_id must not be empty".into()),
        false => Ok(()),
    }
}

/// A new random token and the line to add to a tokens file.
pub fn new_token(user: &str, project: &str, roles: &[String]) -> Result<(String, String), String> {
    check_project(project).map_err(|e| e.message)?;
    check_user(user)?;
    let token = crate::capabilities::iscsi::random_alphanumeric(40);
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    // TOML's own quoting, whatever the names hold.
    let quoted = |text: &str| toml::Value::String(text.to_string()).to_string();
    let roles = roles.iter().map(|r| quoted(r)).collect::<Vec<_>>().join(", ");
    let entry = format!(
        "[[tokens]]\nsha256 = \"{digest}\"\nuser_id = {}\nproject_id = {}\nroles = [{roles}]\n",
        quoted(user),
        quoted(project)
    );
    Ok((token, entry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[tokio::test]
    async fn a_new_tokens_entry_reads_back_as_the_same_caller() {
        let (token, entry) = new_token("al\"ice\u{7f} \\", "p1", &["member".into(), "a\"b".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.toml");
        std::fs::write(&file, &entry).unwrap();
        let auth = Auth::from_tokens_file(&file).expect(&entry);
        let c = auth.identify(&headers(&[("x-auth-token", token.as_str())])).await.unwrap();
        assert_eq!((c.user_id.as_str(), c.project_id.as_str()), ("al\"ice\u{7f} \\", "p1"));
        assert_eq!(c.roles, ["member", "a\"b"]);
        assert!(new_token(" ", "p1", &[]).is_err(), "a user without a name");
        let sha = entry.lines().find(|l| l.starts_with("sha256")).unwrap();
        std::fs::write(&file, format!("[[tokens]]\n{sha}\nuser_id = \"\"\nproject_id = \"p1\"\n")).unwrap();
        let refused = Auth::from_tokens_file(&file).err().expect("an empty user_id is refused");
        assert!(refused.ends_with("a token's user_id must not be empty"), "{refused}");
    }

    #[tokio::test]
    async fn noauth_reads_user_and_project_like_cinder() {
        let c = Auth::NoAuth.identify(&headers(&[("x-auth-token", "alice:p1")])).await.unwrap();
        assert_eq!((c.user_id.as_str(), c.project_id.as_str(), c.is_admin()), ("alice", "p1", true));
        let c = Auth::NoAuth.identify(&headers(&[("x-auth-token", "bob")])).await.unwrap();
        assert_eq!(c.project_id, "bob");
        let c = Auth::NoAuth
            .identify(&headers(&[("x-auth-token", "bob:p2"), ("x-roles", "member,reader")]))
            .await
            .unwrap();
        assert!(!c.is_admin());
        assert_eq!(
            Auth::NoAuth.identify(&HeaderMap::new()).await.unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            Auth::NoAuth.identify(&headers(&[("x-auth-token", "u:p/../x")])).await.unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn tokens_are_stored_hashed_and_mapped_to_projects() {
        let (token, entry) = new_token("carol", "p3", &["member".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, &entry).unwrap();
        assert!(
            !std::fs::read_to_string(&path).unwrap().contains(&token),
            "the file must not hold the token"
        );
        let auth = Auth::from_tokens_file(&path).unwrap();
        let c = auth.identify(&headers(&[("x-auth-token", &token)])).await.unwrap();
        assert_eq!((c.user_id.as_str(), c.project_id.as_str(), c.is_admin()), ("carol", "p3", false));
        assert_eq!(
            auth.identify(&headers(&[("x-auth-token", "carol:p3")])).await.unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn the_project_segment_is_taken_out_of_the_path() {
        let strip = |uri: &str| {
            let r = strip_project(Request::builder().uri(uri).body(axum::body::Body::empty()).unwrap());
            (r.uri().to_string(), r.extensions().get::<PathProject>().map(|p| p.0.clone()))
        };
        assert_eq!(
            strip("/v3/p1/attachments?volume_id=x"),
            ("/v3/attachments?volume_id=x".into(), Some("p1".into()))
        );
        assert_eq!(strip("/v3/attachments/abc"), ("/v3/attachments/abc".into(), None));
        assert_eq!(strip("/v3/p1/volumes/abc/action"), ("/v3/volumes/abc/action".into(), Some("p1".into())));
        assert_eq!(strip("/v3/"), ("/v3/".into(), None));
        assert_eq!(strip("/"), ("/".into(), None));
    }
}

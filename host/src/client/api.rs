//! The attachments API of a Berth or Cinder endpoint, as the attach client uses it.
//!
//! Endpoint and credentials come from flags or the usual OpenStack environment, as
//! python-brick-cinderclient-ext reads it:
//!
//! - Keystone password authentication: `OS_AUTH_URL`, `OS_USERNAME` (or `OS_USER_ID`),
//!   `OS_PASSWORD`, `OS_PROJECT_NAME` (or `OS_PROJECT_ID`), `OS_USER_DOMAIN_NAME` /
//!   `OS_PROJECT_DOMAIN_NAME` (or their `_ID`s; default: the `default` domain), and optionally
//!   `OS_REGION_NAME` and `OS_INTERFACE` (default `public`). The volume endpoint is taken from the
//!   token's catalog (`block-storage`, then `volumev3`), unless `CINDER_ENDPOINT` names one.
//! - A token for the endpoint: `OS_TOKEN` (Berth's `[auth] strategy = "token"`, or a Keystone
//!   token) with `CINDER_ENDPOINT` (or `OS_ENDPOINT`) and `OS_PROJECT_ID`.
//! - noauth (cinderclient's `X-Auth-Token: user:project`), the default without a token:
//!   `OS_USER_ID`, `OS_PROJECT_ID`; the endpoint defaults to `http://127.0.0.1:8776/v3`, a local
//!   `berth serve`.
//!
//! `OS_CACERT` (`--os-cacert`) names a CA bundle that verifies HTTPS endpoints (the API's
//! `[http] tls_cert_file`, Keystone's) besides the system's roots.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Map, Value as Json, json};

use super::error::ClientError;
use crate::keystone::{self, KeystoneError, Named, Password};

/// Where to reach the API and as whom. Fields left `None` fall back to the environment.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Credentials {
    /// The volume endpoint, e.g. http://127.0.0.1:8776/v3 [env: CINDER_ENDPOINT, OS_ENDPOINT]
    #[arg(long = "os-endpoint", visible_alias = "endpoint", global = true)]
    pub endpoint: Option<String>,
    /// [env: OS_PROJECT_ID]
    #[arg(long = "os-project-id", global = true)]
    pub project_id: Option<String>,
    /// [env: OS_USER_ID]
    #[arg(long = "os-user-id", global = true)]
    pub user_id: Option<String>,
    /// noauth, token or password (the default when OS_AUTH_URL is set) [env: OS_AUTH_TYPE]
    #[arg(long = "os-auth-type", global = true)]
    pub auth_type: Option<String>,
    /// A token for the endpoint (Berth's static token, or a Keystone token) [env: OS_TOKEN]
    #[arg(long = "os-token", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Keystone's URL, for password authentication [env: OS_AUTH_URL]
    #[arg(long = "os-auth-url", global = true)]
    pub auth_url: Option<String>,
    /// [env: OS_USERNAME]
    #[arg(long = "os-username", global = true)]
    pub username: Option<String>,
    /// [env: OS_PASSWORD]
    #[arg(long = "os-password", global = true, hide_env_values = true)]
    pub password: Option<String>,
    /// [env: OS_PROJECT_NAME, OS_TENANT_NAME]
    #[arg(long = "os-project-name", global = true)]
    pub project_name: Option<String>,
    /// [env: OS_USER_DOMAIN_NAME; or OS_USER_DOMAIN_ID]
    #[arg(long = "os-user-domain-name", global = true)]
    pub user_domain_name: Option<String>,
    /// [env: OS_PROJECT_DOMAIN_NAME; or OS_PROJECT_DOMAIN_ID]
    #[arg(long = "os-project-domain-name", global = true)]
    pub project_domain_name: Option<String>,
    /// The catalog region to use [env: OS_REGION_NAME]
    #[arg(long = "os-region-name", global = true)]
    pub region_name: Option<String>,
    /// The catalog interface: public, internal or admin [env: OS_INTERFACE, OS_ENDPOINT_TYPE]
    #[arg(long = "os-interface", global = true)]
    pub interface: Option<String>,
    /// A CA bundle (PEM) that verifies the API's and Keystone's HTTPS certificates, besides the
    /// system's roots [env: OS_CACERT]
    #[arg(long = "os-cacert", global = true)]
    pub cacert: Option<std::path::PathBuf>,
}

/// The default endpoint: a `berth serve` on this machine.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:8776/v3";

/// The catalog's names for the block-storage v3 service, in order of preference.
pub const CATALOG_TYPES: &[&str] = &["block-storage", "volumev3"];

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A resolved endpoint with its credentials.
#[derive(Clone)]
pub struct Endpoint {
    http: reqwest::Client,
    /// `.../v3/{project}`.
    base: String,
    token: String,
    /// The token is a noauth `user:project`.
    noauth: bool,
    /// Send the token as a service token too ([`Endpoint::as_service`]).
    service: bool,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("base", &self.base).finish_non_exhaustive()
    }
}

impl Endpoint {
    /// The endpoint and token the credentials name; with Keystone password authentication, a
    /// token is issued first and the endpoint found in its catalog.
    pub async fn resolve(c: &Credentials) -> Result<Endpoint, ClientError> {
        let cacert = c.cacert.clone().or_else(|| env("OS_CACERT").map(Into::into));
        let builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .connect_timeout(Duration::from_secs(10));
        let http = crate::tls::with_ca_file(builder, cacert.as_deref())
            .map_err(|e| ClientError::Usage(format!("OS_CACERT (--os-cacert): {e}")))?
            .build()
            .map_err(|e| ClientError::Usage(format!("cannot build an HTTP client: {e}")))?;
        let endpoint = c.endpoint.clone().or_else(|| env("CINDER_ENDPOINT")).or_else(|| env("OS_ENDPOINT"));
        let auth_url = c.auth_url.clone().or_else(|| env("OS_AUTH_URL"));
        let token = c.token.clone().or_else(|| env("OS_TOKEN"));
        let auth_type = c.auth_type.clone().or_else(|| env("OS_AUTH_TYPE"));
        let password_auth = match auth_type.as_deref() {
            Some("password" | "v3password") => true,
            None => auth_url.is_some() && token.is_none(),
            _ => false,
        };
        if password_auth {
            let (token, catalog) = Self::password(&http, c, auth_url).await?;
            let endpoint = endpoint.or(catalog).ok_or_else(|| {
                ClientError::Usage(format!(
                    "the token's catalog has no {} endpoint at that interface and region; name the volume \
                     endpoint with CINDER_ENDPOINT",
                    CATALOG_TYPES.join(" or ")
                ))
            })?;
            let base = base_url(&endpoint, &token.project_id)?;
            return Ok(Endpoint { http, base, token: token.id, noauth: false, service: false });
        }
        let user = c.user_id.clone().or_else(|| env("OS_USER_ID")).or_else(|| env("USER"));
        let user = user.unwrap_or_else(|| "admin".into());
        let project = c.project_id.clone().or_else(|| env("OS_PROJECT_ID")).unwrap_or_else(|| user.clone());
        let noauth = token.is_none() && matches!(auth_type.as_deref(), None | Some("noauth"));
        let token = match (auth_type.as_deref(), token) {
            (None | Some("noauth"), None) => format!("{user}:{project}"),
            (None | Some("token" | "v3token" | "admin_token" | "noauth"), Some(token)) => token,
            (Some("token" | "v3token" | "admin_token"), None) => {
                return Err(ClientError::Usage(
                    "OS_AUTH_TYPE asks for a token: set OS_TOKEN or --os-token".into(),
                ));
            }
            (Some(other), _) => {
                return Err(ClientError::Usage(format!(
                    "OS_AUTH_TYPE={other} is not supported by berth's client: use password (Keystone, \
                     with OS_AUTH_URL), a token (OS_TOKEN) with the volume endpoint (CINDER_ENDPOINT), \
                     or noauth"
                )));
            }
        };
        let endpoint = endpoint.unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let base = base_url(&endpoint, &project)?;
        Ok(Endpoint { http, base, token, noauth, service: false })
    }

    /// Keystone password authentication: the token, and the volume endpoint its catalog names.
    async fn password(
        http: &reqwest::Client,
        c: &Credentials,
        auth_url: Option<String>,
    ) -> Result<(ScopedToken, Option<String>), ClientError> {
        let missing = |what: &str| ClientError::Usage(format!("password authentication needs {what}"));
        let auth_url = auth_url.ok_or_else(|| missing("OS_AUTH_URL (--os-auth-url)"))?;
        let user = match (
            c.username.clone().or_else(|| env("OS_USERNAME")),
            c.user_id.clone().or_else(|| env("OS_USER_ID")),
        ) {
            (Some(name), _) => Named::Name(name),
            (None, Some(id)) => Named::Id(id),
            (None, None) => return Err(missing("OS_USERNAME or OS_USER_ID (--os-username)")),
        };
        let password = c
            .password
            .clone()
            .or_else(|| env("OS_PASSWORD"))
            .ok_or_else(|| missing("OS_PASSWORD (--os-password)"))?;
        let project_name =
            c.project_name.clone().or_else(|| env("OS_PROJECT_NAME")).or_else(|| env("OS_TENANT_NAME"));
        let project = match (project_name, c.project_id.clone().or_else(|| env("OS_PROJECT_ID"))) {
            (_, Some(id)) => Named::Id(id),
            (Some(name), None) => Named::Name(name),
            (None, None) => return Err(missing("OS_PROJECT_NAME or OS_PROJECT_ID (--os-project-name)")),
        };
        let domain = |name: Option<String>, name_var: &str, id_var: &str| match (
            name.or_else(|| env(name_var)),
            env(id_var),
        ) {
            (Some(name), _) => Named::Name(name),
            (None, Some(id)) => Named::Id(id),
            (None, None) => Named::Id("default".into()),
        };
        let p = Password {
            auth_url: keystone::v3_url(&auth_url),
            user,
            user_domain: domain(c.user_domain_name.clone(), "OS_USER_DOMAIN_NAME", "OS_USER_DOMAIN_ID"),
            password,
            project,
            project_domain: domain(
                c.project_domain_name.clone(),
                "OS_PROJECT_DOMAIN_NAME",
                "OS_PROJECT_DOMAIN_ID",
            ),
        };
        let issued = keystone::authenticate(http, &p).await.map_err(|e| match e {
            KeystoneError::Unavailable { .. } => ClientError::Unreachable(e.to_string()),
            KeystoneError::Refused { .. } => ClientError::Api(format!(
                "{e} (check OS_USERNAME, OS_PASSWORD, OS_PROJECT_NAME and their domains)"
            )),
            KeystoneError::Malformed { .. } => ClientError::Api(e.to_string()),
        })?;
        let project_id = keystone::identity(&issued.token)
            .and_then(|i| i.project_id)
            .ok_or_else(|| ClientError::Api("Keystone issued a token without a project".into()))?;
        let interface =
            c.interface.clone().or_else(|| env("OS_INTERFACE")).or_else(|| env("OS_ENDPOINT_TYPE"));
        let interface = interface.unwrap_or_else(|| "public".into());
        let interface = interface.trim_end_matches("URL").to_string();
        let region = c.region_name.clone().or_else(|| env("OS_REGION_NAME"));
        let url = keystone::catalog_url(&issued.token, CATALOG_TYPES, &interface, region.as_deref());
        Ok((ScopedToken { id: issued.id, project_id }, url))
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// The same endpoint, calling as a service, as Nova's compute service does: its own token is
    /// also sent as `X-Service-Token` (with noauth, the `service` role in `X-Service-Roles`).
    /// Cinder (and Berth) require it to end an instance's access (OSSA-2023-003); the user needs
    /// the `service` role.
    pub fn as_service(&self) -> Endpoint {
        Endpoint { service: true, ..self.clone() }
    }

    /// One call of the volume API at a microversion; the answer's JSON (`null` when empty).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        version: &str,
        body: Option<Json>,
    ) -> Result<Json, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method.clone(), &url)
            .header("X-Auth-Token", &self.token)
            .header("OpenStack-API-Version", format!("volume {version}"))
            .header("Accept", "application/json");
        if self.service {
            request = request.header("X-Service-Token", &self.token);
            if self.noauth {
                request = request.header("X-Service-Roles", "service");
            }
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| {
            ClientError::Unreachable(format!(
                "cannot reach the volume API at {}: {}",
                self.base,
                root_cause(&e)
            ))
        })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let json: Json = if text.trim().is_empty() {
            Json::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Json::Null)
        };
        if status.is_success() {
            return Ok(json);
        }
        let message = fault_message(&json).unwrap_or_else(|| text.chars().take(300).collect());
        let message = format!("{method} {path}: {} {message}", status.as_u16());
        Err(match status {
            StatusCode::NOT_FOUND => ClientError::NotFound(message),
            StatusCode::CONFLICT => ClientError::Busy(message),
            StatusCode::BAD_REQUEST if message.contains("Invalid volume") => ClientError::Busy(message),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ClientError::Api(format!(
                "{message} (check the credentials: OS_AUTH_URL and OS_USERNAME, or OS_TOKEN, or OS_USER_ID and OS_PROJECT_ID)"
            )),
            _ => ClientError::Api(message),
        })
    }

    /// `POST /volumes`: a volume of `size_gib`, of the given type (the default type when none);
    /// returns its id. (Cinder creates it asynchronously: see [`Endpoint::wait_available`].)
    pub async fn create_volume(
        &self,
        size_gib: u64,
        volume_type: Option<&str>,
    ) -> Result<String, ClientError> {
        let mut volume = json!({ "size": size_gib });
        if let Some(t) = volume_type {
            volume["volume_type"] = json!(t);
        }
        let created = self.call(Method::POST, "/volumes", "3.0", Some(json!({ "volume": volume }))).await?;
        created["volume"]["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| ClientError::Api("POST /volumes: no volume id in the answer".into()))
    }

    /// Waits until a volume is `available` (or fails when it turns `error`).
    pub async fn wait_available(&self, id: &str, timeout: Duration) -> Result<(), ClientError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let status = self.volume(id).await?["status"].as_str().unwrap_or_default().to_string();
            match status.as_str() {
                "available" => return Ok(()),
                "error" | "error_deleting" => {
                    return Err(ClientError::Api(format!("volume {id} is {status}")));
                }
                _ if std::time::Instant::now() > deadline => {
                    return Err(ClientError::Api(format!("volume {id} is still {status}")));
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// `DELETE /volumes/{id}`.
    pub async fn delete_volume(&self, id: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &format!("/volumes/{id}"), "3.0", None).await.map(drop)
    }

    /// `POST /volumes/{id}/action {action: arg}` (the legacy actions); the answer.
    pub async fn volume_action(&self, id: &str, action: &str, arg: Json) -> Result<Json, ClientError> {
        self.call(Method::POST, &format!("/volumes/{id}/action"), "3.0", Some(json!({ action: arg }))).await
    }

    /// `GET /volumes/{id}`.
    pub async fn volume(&self, id: &str) -> Result<Json, ClientError> {
        Ok(self.call(Method::GET, &format!("/volumes/{id}"), "3.0", None).await?["volume"].take())
    }

    /// `POST /attachments` with a connector (3.54 when a mode is given, else 3.44).
    pub async fn create_attachment(
        &self,
        volume: &str,
        connector: &Map<String, Json>,
        mode: Option<&str>,
    ) -> Result<Json, ClientError> {
        let mut attachment = json!({ "volume_uuid": volume, "connector": connector });
        let version = match mode {
            Some(mode) => {
                attachment["mode"] = json!(mode);
                "3.54"
            }
            None => "3.44",
        };
        let body = json!({ "attachment": attachment });
        Ok(self.call(Method::POST, "/attachments", version, Some(body)).await?["attachment"].take())
    }

    /// `POST /attachments/{id}/action {"os-complete": null}`.
    pub async fn complete(&self, id: &str) -> Result<(), ClientError> {
        let body = json!({ "os-complete": null });
        self.call(Method::POST, &format!("/attachments/{id}/action"), "3.44", Some(body)).await.map(drop)
    }

    /// `DELETE /attachments/{id}`.
    pub async fn delete_attachment(&self, id: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &format!("/attachments/{id}"), "3.44", None).await.map(drop)
    }

    /// `GET /attachments/{id}`.
    pub async fn attachment(&self, id: &str) -> Result<Json, ClientError> {
        Ok(self.call(Method::GET, &format!("/attachments/{id}"), "3.44", None).await?["attachment"].take())
    }

    /// `GET /attachments?volume_id=...`: the volume's attachments.
    pub async fn attachments_of(&self, volume: &str) -> Result<Vec<Json>, ClientError> {
        let listed =
            self.call(Method::GET, &format!("/attachments?volume_id={volume}"), "3.44", None).await?;
        Ok(listed["attachments"].as_array().cloned().unwrap_or_default())
    }
}

fn fault_message(body: &Json) -> Option<String> {
    body.as_object()?.values().next()?.get("message")?.as_str().map(str::to_string)
}

struct ScopedToken {
    id: String,
    project_id: String,
}

/// `.../v3/{project}` from the common forms of a volume endpoint: `http://host:8776`,
/// `http://host:8776/v3` or a catalog entry `http://host:8776/v3/<project>`.
fn base_url(endpoint: &str, project: &str) -> Result<String, ClientError> {
    if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
        return Err(ClientError::Usage(format!(
            "the endpoint {endpoint:?} is not an http:// or https:// URL"
        )));
    }
    let trimmed = endpoint.trim_end_matches('/');
    Ok(match trimmed.rsplit_once("/v3") {
        Some((_, "")) => format!("{trimmed}/{project}"),
        Some((_, rest)) if rest.starts_with('/') => trimmed.to_string(),
        _ => format!("{trimmed}/v3/{project}"),
    })
}

/// The innermost cause of an HTTP error ("Connection refused (os error 111)").
fn root_cause(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_common_form_of_endpoint_reaches_the_project() {
        let base = |endpoint| base_url(endpoint, "p").unwrap();
        assert_eq!(base("http://h:8776/v3"), "http://h:8776/v3/p");
        assert_eq!(base("http://h:8776/v3/"), "http://h:8776/v3/p");
        assert_eq!(base("http://h:8776"), "http://h:8776/v3/p");
        assert_eq!(base("http://h:8776/v3/abc"), "http://h:8776/v3/abc");
        assert!(matches!(base_url("ftp://x", "p"), Err(ClientError::Usage(_))));
    }

    #[tokio::test]
    async fn unsupported_or_incomplete_authentication_is_a_usage_error() {
        let c = Credentials { auth_type: Some("password".into()), auth_url: None, ..Default::default() };
        assert!(
            matches!(Endpoint::resolve(&c).await, Err(ClientError::Usage(m)) if m.contains("OS_AUTH_URL"))
        );
        let c = Credentials {
            auth_url: Some("http://127.0.0.1:1/v3".into()),
            username: Some("u".into()),
            ..Default::default()
        };
        assert!(
            matches!(Endpoint::resolve(&c).await, Err(ClientError::Usage(m)) if m.contains("OS_PASSWORD"))
        );
        let c = Credentials { auth_type: Some("v2password".into()), ..Default::default() };
        assert!(
            matches!(Endpoint::resolve(&c).await, Err(ClientError::Usage(m)) if m.contains("v2password"))
        );
        let c = Credentials { endpoint: Some("ftp://x".into()), ..Default::default() };
        assert!(matches!(Endpoint::resolve(&c).await, Err(ClientError::Usage(_))));
    }

    #[tokio::test]
    async fn an_unreachable_keystone_is_reported_as_unreachable() {
        let c = Credentials {
            auth_url: Some(format!("http://127.0.0.1:{}", closed_port())),
            username: Some("u".into()),
            password: Some("pw".into()),
            project_name: Some("p".into()),
            ..Default::default()
        };
        let e = Endpoint::resolve(&c).await.unwrap_err();
        assert!(matches!(&e, ClientError::Unreachable(m) if m.contains("Keystone")), "{e:?}");
        assert!(!e.to_string().contains("pw"), "{e}");
    }

    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }
}

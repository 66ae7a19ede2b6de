//! The attachments API of a Berth or Cinder endpoint, as the attach client uses it.
//!
//! Endpoint and credentials come from flags or the usual environment: `CINDER_ENDPOINT` (or
//! `OS_ENDPOINT`; default `http://127.0.0.1:8776/v3`, a local `berth serve`), `OS_PROJECT_ID`,
//! `OS_USER_ID`, and either `OS_AUTH_TYPE=noauth` (cinderclient's `X-Auth-Token: user:project`)
//! or a token in `OS_TOKEN`. Keystone password authentication is not supported.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Map, Value as Json, json};

use super::error::ClientError;

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
    /// noauth (the default without a token) or token [env: OS_AUTH_TYPE]
    #[arg(long = "os-auth-type", global = true)]
    pub auth_type: Option<String>,
    /// A static token (Berth's `[auth] strategy = "token"`) [env: OS_TOKEN]
    #[arg(long = "os-token", global = true, hide_env_values = true)]
    pub token: Option<String>,
}

/// The default endpoint: a `berth serve` on this machine.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:8776/v3";

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
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("base", &self.base).finish_non_exhaustive()
    }
}

impl Endpoint {
    pub fn resolve(c: &Credentials) -> Result<Endpoint, ClientError> {
        let endpoint = c
            .endpoint
            .clone()
            .or_else(|| env("CINDER_ENDPOINT"))
            .or_else(|| env("OS_ENDPOINT"))
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let user = c.user_id.clone().or_else(|| env("OS_USER_ID")).or_else(|| env("USER"));
        let user = user.unwrap_or_else(|| "admin".into());
        let project = c.project_id.clone().or_else(|| env("OS_PROJECT_ID")).unwrap_or_else(|| user.clone());
        let token = c.token.clone().or_else(|| env("OS_TOKEN"));
        let auth_type = c.auth_type.clone().or_else(|| env("OS_AUTH_TYPE"));
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
                    "OS_AUTH_TYPE={other} is not supported by berth's client: use noauth, or a token \
                     (OS_TOKEN) with the volume endpoint (CINDER_ENDPOINT)"
                )));
            }
        };
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            return Err(ClientError::Usage(format!(
                "the endpoint {endpoint:?} is not an http:// or https:// URL"
            )));
        }
        let trimmed = endpoint.trim_end_matches('/');
        // `http://host:8776`, `http://host:8776/v3` or a catalog entry `http://host:8776/v3/<project>`.
        let base = match trimmed.rsplit_once("/v3") {
            Some((_, "")) => format!("{trimmed}/{project}"),
            Some((_, rest)) if rest.starts_with('/') => trimmed.to_string(),
            _ => format!("{trimmed}/v3/{project}"),
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ClientError::Usage(format!("cannot build an HTTP client: {e}")))?;
        Ok(Endpoint { http, base, token })
    }

    pub fn base(&self) -> &str {
        &self.base
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
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                ClientError::Api(format!("{message} (check OS_PROJECT_ID, OS_USER_ID and OS_TOKEN)"))
            }
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

    fn base(endpoint: &str) -> String {
        let c = Credentials {
            endpoint: Some(endpoint.into()),
            project_id: Some("p".into()),
            user_id: Some("u".into()),
            auth_type: Some("noauth".into()),
            token: None,
        };
        Endpoint::resolve(&c).unwrap().base
    }

    #[test]
    fn every_common_form_of_endpoint_reaches_the_project() {
        assert_eq!(base("http://h:8776/v3"), "http://h:8776/v3/p");
        assert_eq!(base("http://h:8776/v3/"), "http://h:8776/v3/p");
        assert_eq!(base("http://h:8776"), "http://h:8776/v3/p");
        assert_eq!(base("http://h:8776/v3/abc"), "http://h:8776/v3/abc");
    }

    #[test]
    fn unsupported_authentication_is_a_usage_error() {
        let c = Credentials { auth_type: Some("password".into()), ..Default::default() };
        assert!(matches!(Endpoint::resolve(&c), Err(ClientError::Usage(m)) if m.contains("password")));
        let c = Credentials { endpoint: Some("ftp://x".into()), ..Default::default() };
        assert!(matches!(Endpoint::resolve(&c), Err(ClientError::Usage(_))));
    }
}

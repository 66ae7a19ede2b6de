//! `[auth] strategy = "keystone"`: what keystonemiddleware's auth_token does in front of Cinder.
//!
//! - Berth authenticates as its own user (password, `[keystone]`) and keeps that token until
//!   shortly before it expires, or until Keystone refuses it (then it authenticates again, once;
//!   `keystone::Session`, shared with the compute notifier).
//! - Each caller's `X-Auth-Token` is validated with `GET /v3/auth/tokens`; the caller's user,
//!   project and roles come from Keystone's answer. A token that is not project-scoped is refused.
//! - Validations, valid or not, are remembered for `cache_seconds` (never past the token's
//!   expiry), keyed by the token's sha256; the token itself is not kept.
//! - An `X-Service-Token` is validated the same way; with one of `service_token_roles` it marks the
//!   request as a service's (OSSA-2023-003: only a service may delete an attachment an instance
//!   uses). An invalid one is refused (401), as is, with `service_token_roles_required`, a valid one
//!   without such a role.
//! - Keystone unreachable (or failing): 503 with `Retry-After`, never a 500; refusals are 401 with
//!   `WWW-Authenticate: Keystone uri="..."`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::api::error::ApiError;
use crate::attach::Caller;
use crate::config::KeystoneConfig;
use crate::keystone::{self, Identity, KeystoneError, Named, Password, Session};
use crate::metrics::METRICS;

/// Validations remembered at most (the oldest half is dropped when full).
const CACHE_ENTRIES: usize = 10_000;

pub struct KeystoneAuth {
    /// Berth's own token, shared with the compute notifier (`compute.rs`).
    session: Arc<Session>,
    /// Sent in `WWW-Authenticate` with a 401.
    www_authenticate: String,
    cache_for: Duration,
    service_roles: Vec<String>,
    service_roles_required: bool,
    cache: Mutex<HashMap<[u8; 32], Cached>>,
}

#[derive(Clone)]
struct Cached {
    /// `None`: Keystone said the token is not valid.
    identity: Option<Identity>,
    until: Instant,
}

impl KeystoneAuth {
    /// Keystone's client, trusting the system's roots and those of `ca_file` (`[http] ca_file`).
    pub fn new(c: &KeystoneConfig, ca_file: Option<&std::path::Path>) -> Result<KeystoneAuth, String> {
        let auth_url =
            c.auth_url.as_deref().ok_or("[auth] strategy = \"keystone\" needs [keystone] auth_url")?;
        if !auth_url.starts_with("http://") && !auth_url.starts_with("https://") {
            return Err(format!("[keystone] auth_url {auth_url:?} is not an http:// or https:// URL"));
        }
        let username =
            c.username.clone().ok_or("[auth] strategy = \"keystone\" needs [keystone] username")?;
        let password =
            c.password.clone().ok_or("[auth] strategy = \"keystone\" needs [keystone] password")?.0;
        let builder = reqwest::Client::builder().timeout(Duration::from_secs_f64(c.timeout_seconds.max(0.1)));
        let http = crate::tls::with_ca_file(builder, ca_file)
            .map_err(|e| format!("[http] ca_file: {e}"))?
            .build()
            .map_err(|e| format!("cannot build an HTTP client for Keystone: {e}"))?;
        let auth_url = keystone::v3_url(auth_url);
        Ok(KeystoneAuth {
            www_authenticate: format!(
                "Keystone uri=\"{}\"",
                c.www_authenticate_uri.as_deref().unwrap_or(&auth_url).replace('"', "")
            ),
            session: Arc::new(Session::new(
                http,
                Password {
                    auth_url,
                    user: Named::Name(username),
                    user_domain: Named::Name(c.user_domain_name.clone()),
                    password,
                    project: Named::Name(c.project_name.clone()),
                    project_domain: Named::Name(c.project_domain_name.clone()),
                },
            )),
            cache_for: Duration::from_secs(c.cache_seconds),
            service_roles: c.service_token_roles.clone(),
            service_roles_required: c.service_token_roles_required,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Berth's own Keystone session (its token and catalog).
    pub fn session(&self) -> Arc<Session> {
        self.session.clone()
    }

    /// The caller of a request: its `X-Auth-Token` (and `X-Service-Token`) validated.
    pub async fn identify(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let token = header(headers, "x-auth-token").ok_or_else(|| self.refuse())?;
        let user = self.validate(token).await?.ok_or_else(|| self.refuse())?;
        let Some(project_id) = user.project_id else {
            return Err(self.refuse_because("The token is not scoped to a project."));
        };
        let is_service = match header(headers, "x-service-token") {
            None => false,
            Some(service) => {
                let service = self.validate(service).await?.ok_or_else(|| self.refuse())?;
                let has_role = service.roles.iter().any(|r| self.service_roles.contains(r));
                if !has_role && self.service_roles_required {
                    tracing::warn!(
                        user = %service.user_id,
                        "refused a service token without any of the roles {:?}",
                        self.service_roles
                    );
                    return Err(self.refuse());
                }
                has_role
            }
        };
        super::check_project(&project_id)?;
        Ok(Caller {
            user_id: user.user_id,
            project_id,
            roles: user.roles,
            is_service,
            request: Default::default(),
        })
    }

    /// Whom a token speaks for: from the cache, else from Keystone. `Ok(None)`: not valid.
    async fn validate(&self, token: &str) -> Result<Option<Identity>, ApiError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(hit) = self.cache.lock().expect("cache lock").get(&digest).filter(|c| c.until > now) {
            METRICS.keystone_validations.get_or_create(&outcome("cached")).inc();
            return Ok(hit.identity.clone());
        }
        let answer = match self.ask(token).await {
            Err(KeystoneError::Refused { status: 401, .. }) => {
                // Berth's own token was revoked or expired early: authenticate again, once.
                self.session.forget().await;
                self.ask(token).await
            }
            other => other,
        };
        let body = match answer {
            Ok(body) => body,
            Err(e) => {
                METRICS.keystone_validations.get_or_create(&outcome("unavailable")).inc();
                tracing::warn!("cannot validate a token: {e}");
                return Err(unavailable());
            }
        };
        let identity = body.as_ref().and_then(keystone::identity);
        METRICS
            .keystone_validations
            .get_or_create(&outcome(if identity.is_some() { "valid" } else { "invalid" }))
            .inc();
        let mut until = now + self.cache_for;
        if let Some(expires) = identity.as_ref().and_then(|i| i.expires_at) {
            let left = (expires - OffsetDateTime::now_utc()).try_into().unwrap_or(Duration::ZERO);
            until = until.min(now + left);
        }
        if !self.cache_for.is_zero() {
            let mut cache = self.cache.lock().expect("cache lock");
            if cache.len() >= CACHE_ENTRIES {
                cache.retain(|_, c| c.until > now);
                if cache.len() >= CACHE_ENTRIES {
                    let mut ends: Vec<Instant> = cache.values().map(|c| c.until).collect();
                    ends.sort_unstable();
                    let cut = ends[ends.len() / 2];
                    cache.retain(|_, c| c.until > cut);
                }
            }
            cache.insert(digest, Cached { identity: identity.clone(), until });
        }
        Ok(identity)
    }

    /// One validation with Berth's own token (authenticating first when it has none).
    async fn ask(&self, token: &str) -> Result<Option<serde_json::Value>, KeystoneError> {
        let own = self.session.token().await?;
        keystone::validate(self.session.http(), self.session.auth_url(), &own.id, token).await
    }

    fn refuse(&self) -> ApiError {
        self.refuse_because("The request you have made requires authentication.")
    }

    fn refuse_because(&self, message: &str) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, message)
            .with_header("www-authenticate", &self.www_authenticate)
    }
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|t| !t.is_empty())
}

fn outcome(outcome: &'static str) -> crate::metrics::OutcomeLabels {
    crate::metrics::OutcomeLabels { outcome: outcome.into() }
}

fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "The identity service (Keystone) is unavailable; the token could not be validated. Retry later.",
    )
}

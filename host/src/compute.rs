//! The compute service (Nova), as Cinder talks to it (`cinder/compute/nova.py`): when an attached
//! volume has grown, Nova is sent one `volume-extended` server external event per instance
//! attached (`POST /os-server-external-events`, microversion 2.51), and grows the disk its guest
//! sees. Berth authenticates as its own Keystone user (`keystone::Session`, shared with the API's
//! token validation) and finds Nova in that token's catalog, or at `[nova] endpoint_override`.
//!
//! The event is owed in the transaction that records the new size and sent after its commit (Nova
//! reads the volume when it handles the event); `attach/compute.rs` keeps it until Nova answers,
//! across restarts and while Nova is unreachable. An event Nova refused (or gave up after its
//! tries) is a user message on the volume, as in Cinder ("extend volume:Compute service failed to
//! extend volume."), and the guest sees the new size once its host rescans. An event Nova took but
//! could not apply to one instance (its code in the answer is not 200) is Nova's to report; it is
//! logged here.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value as Json, json};

use crate::config::NovaConfig;
use crate::keystone::{KeystoneError, Session, root_cause};

/// Nova's microversion that knows `volume-extended` (Cinder sends the same).
pub const EXTEND_MICROVERSION: &str = "2.51";

/// Why Nova did not take the events.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("{0}")]
    Keystone(#[from] KeystoneError),
    #[error("no compute endpoint at interface {interface}{} in Berth's Keystone catalog", .region.as_ref().map(|r| format!(" in region {r}")).unwrap_or_default())]
    NoEndpoint { interface: String, region: Option<String> },
    #[error("Nova at {url} is unreachable: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("Nova at {url} answered {status}: {message}")]
    Refused { url: String, status: u16, message: String },
    #[error("Nova at {url} sent an answer Berth cannot read: {detail}")]
    Malformed { url: String, detail: String },
}

impl ComputeError {
    /// Whether trying again later may succeed: Nova or Keystone unreachable or failing (5xx).
    /// Refusals (4xx: no such instance, not allowed), answers Berth cannot read and a catalog
    /// without Nova stay as they are.
    pub fn is_transient(&self) -> bool {
        match self {
            ComputeError::Keystone(KeystoneError::Unavailable { .. }) | ComputeError::Unreachable { .. } => {
                true
            }
            ComputeError::Refused { status, .. } => *status >= 500,
            _ => false,
        }
    }
}

/// What Nova answered for one event: the instance and the event's code (200: Nova took it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub server_uuid: String,
    pub code: u16,
}

/// A client of Nova's server external events.
pub struct Nova {
    session: Arc<Session>,
    http: reqwest::Client,
    endpoint_override: Option<String>,
    interface: String,
    region: Option<String>,
}

impl Nova {
    /// Nova's client, trusting the system's roots and those of `ca_file` (`[http] ca_file`).
    pub fn new(
        session: Arc<Session>,
        c: &NovaConfig,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Nova, String> {
        if let Some(url) = &c.endpoint_override
            && !url.starts_with("http://")
            && !url.starts_with("https://")
        {
            return Err(format!("[nova] endpoint_override {url:?} is not an http:// or https:// URL"));
        }
        if !["public", "internal", "admin"].contains(&c.interface.as_str()) {
            return Err(format!("[nova] interface must be public, internal or admin, not {:?}", c.interface));
        }
        let builder = reqwest::Client::builder().timeout(Duration::from_secs_f64(c.timeout_seconds.max(0.1)));
        let http = crate::tls::with_ca_file(builder, ca_file)
            .map_err(|e| format!("[http] ca_file: {e}"))?
            .build()
            .map_err(|e| format!("cannot build an HTTP client for Nova: {e}"))?;
        Ok(Nova {
            session,
            http,
            endpoint_override: c.endpoint_override.clone(),
            interface: c.interface.clone(),
            region: c.region_name.clone(),
        })
    }

    /// Tells Nova that `volume_id` grew under each of `servers` (`volume-extended`, tagged with
    /// the volume). `request_id` goes to Nova as the global request id. A token Nova refuses is
    /// renewed once.
    pub async fn volume_extended(
        &self,
        volume_id: &str,
        servers: &[String],
        request_id: Option<&str>,
    ) -> Result<Vec<Delivered>, ComputeError> {
        let events: Vec<Json> = servers
            .iter()
            .map(|s| json!({ "name": "volume-extended", "server_uuid": s, "tag": volume_id }))
            .collect();
        let body = json!({ "events": events });
        match self.send(&body, request_id).await {
            Err(ComputeError::Refused { status: 401, .. }) => {
                self.session.forget().await;
                self.send(&body, request_id).await
            }
            other => other,
        }
    }

    async fn send(&self, body: &Json, request_id: Option<&str>) -> Result<Vec<Delivered>, ComputeError> {
        let token = self.session.token().await?;
        let base = match &self.endpoint_override {
            Some(url) => url.clone(),
            None => crate::keystone::catalog_url(
                &token.token,
                &["compute"],
                &self.interface,
                self.region.as_deref(),
            )
            .ok_or_else(|| ComputeError::NoEndpoint {
                interface: self.interface.clone(),
                region: self.region.clone(),
            })?,
        };
        let url = format!("{}/os-server-external-events", base.trim_end_matches('/'));
        let mut request = self
            .http
            .post(&url)
            .header("X-Auth-Token", &token.id)
            .header("X-OpenStack-Nova-API-Version", EXTEND_MICROVERSION)
            .header("OpenStack-API-Version", format!("compute {EXTEND_MICROVERSION}"))
            .json(body);
        if let Some(id) = request_id {
            request = request.header("X-OpenStack-Request-ID", id);
        }
        let response = request
            .send()
            .await
            .map_err(|e| ComputeError::Unreachable { url: url.clone(), detail: root_cause(&e) })?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        if status != StatusCode::OK && status != StatusCode::MULTI_STATUS {
            return Err(ComputeError::Refused { url, status: status.as_u16(), message: nova_message(&text) });
        }
        delivered(&text).map_err(|detail| ComputeError::Malformed { url, detail })
    }
}

/// The events of Nova's answer, each with its code (Cinder counts an event without one as an
/// answer it cannot read).
fn delivered(text: &str) -> Result<Vec<Delivered>, String> {
    let body: Json = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let events = body["events"].as_array().ok_or("no events list")?;
    events
        .iter()
        .map(|e| {
            let code = e["code"].as_u64().ok_or_else(|| format!("an event without a code: {e}"))?;
            Ok(Delivered {
                server_uuid: e["server_uuid"].as_str().unwrap_or_default().to_string(),
                code: u16::try_from(code).map_err(|_| format!("an event's code {code}"))?,
            })
        })
        .collect()
}

/// Nova's fault message (`{"itemNotFound": {"message": ..., "code": 404}}`), else nothing.
fn nova_message(text: &str) -> String {
    serde_json::from_str::<Json>(text)
        .ok()
        .and_then(|j| j.as_object()?.values().find_map(|fault| fault["message"].as_str().map(str::to_string)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn novas_answer_gives_each_events_code_and_a_missing_code_is_unreadable() {
        let answer = r#"{"events": [
            {"name": "volume-extended", "server_uuid": "s1", "tag": "v", "status": "completed", "code": 200},
            {"name": "volume-extended", "server_uuid": "s2", "tag": "v", "status": "failed", "code": 422}]}"#;
        assert_eq!(
            delivered(answer).unwrap(),
            [
                Delivered { server_uuid: "s1".into(), code: 200 },
                Delivered { server_uuid: "s2".into(), code: 422 }
            ]
        );
        assert!(delivered(r#"{"events": [{"server_uuid": "s1"}]}"#).unwrap_err().contains("without a code"));
        assert!(delivered("[]").is_err());
        assert_eq!(
            nova_message(r#"{"itemNotFound": {"code": 404, "message": "No instances found for any event"}}"#),
            "No instances found for any event"
        );
        assert_eq!(nova_message("<html>"), "");
    }
}

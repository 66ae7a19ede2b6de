//! `GET /v3/{project_id}/os-drivers` and `POST /v3/{project_id}/os-drivers/{backend}/action`:
//! the driver each of this node's backends runs, and its upgrade and rollback while serving
//! (`upgrade/`), a Berth extension for admins. The new component is named by its path on the
//! node (`os-upgrade: {"wasm": "/path/new.wasm"}`): the service reads it itself, as it reads the
//! components its configuration names, so the API's bound on request bodies stays as it is and
//! only a file the operator put on the node can become a driver. `berth driver upgrade` and
//! `berth driver rollback` call these.
//!
//! A backend shared by several nodes runs one driver on all of them: the node that gets the
//! upgrade switches first, then sends the same request (the caller's credentials, marked as
//! forwarded, `forward.rs`) to every other node up that serves the backend, each of which
//! checks the component at the same path on its own disk and switches; if one refuses, every
//! node that switched goes back, and the answer names the node and why. A rollback on one node
//! (by hand or by its watch) is followed by the others (`Upgrades::follow`).

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::body::JsonBody;
use super::error::ApiError;
use super::forward::Relayed;
use super::openapi::Endpoint;
use super::policy::Rule;
use crate::attach::Caller;
use crate::attach::nodes::Forward;
use crate::upgrade::Upgrades;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/os-drivers", index, "listDrivers")
            .summary(
                "drivers",
                "The driver each backend of this node runs, the one before it and its watch (admins only)",
            )
            .answers::<serde_json::Map<String, serde_json::Value>>(StatusCode::OK, "The drivers"),
        Endpoint::post("/os-drivers/{backend}/action", action, "driverAction")
            .summary(
                "drivers",
                "Upgrade a backend's driver while serving (inspected, checked by the conformance suite, \
                 switched between operations, then watched), or roll it back (admins only)",
            )
            .body::<DriverAction>()
            .answers::<serde_json::Map<String, serde_json::Value>>(StatusCode::OK, "What was done"),
    ]
}

/// One action on a backend's driver.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
enum DriverAction {
    /// Switch to the component at `wasm`, a path on this node; with `live`, after one volume's
    /// life on the real backend through it (a scratch volume, removed afterwards).
    #[serde(rename = "os-upgrade")]
    Upgrade {
        wasm: String,
        #[serde(default)]
        live: bool,
    },
    /// Switch back to the driver that ran before; with `from`, only if the backend runs the
    /// driver of that sha256 now (nothing is done otherwise).
    #[serde(rename = "os-rollback")]
    Rollback {
        #[serde(default)]
        from: Option<String>,
    },
}

fn upgrades(state: &AppState) -> Result<&std::sync::Arc<Upgrades>, ApiError> {
    state.upgrades.as_ref().ok_or_else(|| {
        ApiError::new(StatusCode::NOT_IMPLEMENTED, "This service was built without driver upgrades.")
    })
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::DriverGetAll)?;
    Ok(Json(upgrades(&state)?.list(&state.service)).into_response())
}

async fn action(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: Relayed,
    Path(backend): Path<String>,
    JsonBody(body): JsonBody<DriverAction>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::DriverUpgrade)?;
    let upgrades = upgrades(&state)?.clone();
    // The first node of a shared backend's upgrade sends it on to the others.
    let fan_out = upgrades.is_shared(&backend) && !request.arrived_forwarded();
    match body {
        DriverAction::Upgrade { wasm, live } => {
            let path = std::path::PathBuf::from(&wasm);
            if !path.is_absolute() {
                return Err(ApiError::bad_request(format!(
                    "wasm must be an absolute path on the node, not {wasm:?}"
                )));
            }
            // The check takes seconds: it runs to its end even if the client goes away, so an
            // upgrade is either refused or done, never half done.
            let (service, relay) = (state.service.clone(), state.clone());
            let forwarded = request.arrived_forwarded();
            let done = tokio::spawn(async move {
                let done = match upgrades.upgrade(&service, &backend, &path, live).await {
                    // Sent on by another node of a shared backend, to a node that runs it
                    // already (an upgrade sent again after it reached some nodes): nothing to do.
                    Err(crate::upgrade::UpgradeError::AlreadyRunning(_)) if forwarded => return Ok(None),
                    done => done?,
                };
                if fan_out {
                    let body = json!({"os-upgrade": {"wasm": wasm, "live": live}});
                    let new = done.driver["sha256"].as_str().unwrap_or_default().to_string();
                    upgrade_peers(&relay, &upgrades, &backend, &request, body, &new).await?;
                }
                Ok::<_, ApiError>(Some(done))
            })
            .await
            .map_err(ApiError::internal)??;
            Ok(Json(json!({ "upgrade": done })).into_response())
        }
        DriverAction::Rollback { from } => {
            let why = if request.arrived_forwarded() {
                "sent on by another node of the shared backend"
            } else {
                "by hand (berth driver rollback)"
            };
            let done = upgrades.rollback(&state.service, &backend, why, from.as_deref()).await?;
            if fan_out && let Some(done) = &done {
                // The others would follow within a second or two on their own; told, they go
                // back at once (only from the driver this node left).
                let from = done["previous"]["sha256"].clone();
                for peer in peers(&state, &backend).await? {
                    request.send(&state, &peer, Method::POST, &json!({"os-rollback": {"from": from}})).await;
                }
            }
            Ok(Json(json!({ "rollback": done })).into_response())
        }
    }
}

async fn peers(state: &AppState, backend: &str) -> Result<Vec<Forward>, ApiError> {
    let peers = state.service.peers_serving(backend).await?;
    let mut out = Vec::new();
    for p in peers {
        let Some(url) = p.url else {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("node {} serves backend {backend} but registered no address to reach it at", p.node),
            ));
        };
        out.push(Forward { node: p.node, url });
    }
    Ok(out)
}

/// The same upgrade on every other node of a shared backend; if one refuses, every node that
/// switched (this one included) goes back, and the answer says which node refused and why.
async fn upgrade_peers(
    state: &AppState,
    upgrades: &Upgrades,
    backend: &str,
    request: &Relayed,
    body: serde_json::Value,
    new: &str,
) -> Result<(), ApiError> {
    let mut switched = Vec::new();
    let mut refusal = None;
    match peers(state, backend).await {
        Ok(peers) => {
            for peer in peers {
                let (status, text) = request.send(state, &peer, Method::POST, &body).await;
                if status.is_success() {
                    switched.push(peer);
                } else {
                    let message = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .and_then(|j| {
                            j.as_object()?.values().next()?.get("message")?.as_str().map(str::to_string)
                        })
                        .unwrap_or(text);
                    refusal = Some(format!("node {} answered {}: {message}", peer.node, status.as_u16()));
                    break;
                }
            }
        }
        Err(e) => refusal = Some(e.message),
    }
    let Some(refusal) = refusal else { return Ok(()) };
    let why = format!("the upgrade of the shared backend failed elsewhere: {refusal}");
    if let Err(e) = upgrades.rollback(&state.service, backend, &why, Some(new)).await {
        tracing::error!(backend = %backend, "could not roll back this node after a refused upgrade: {e}");
    }
    for peer in &switched {
        let (status, text) =
            request.send(state, peer, Method::POST, &json!({"os-rollback": {"from": new}})).await;
        if !status.is_success() {
            tracing::error!(backend = %backend, node = %peer.node, "could not roll back node after a refused upgrade: {text}");
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        format!(
            "the new driver was refused for shared backend {backend}: {refusal}; every node runs the previous \
             driver again"
        ),
    ))
}

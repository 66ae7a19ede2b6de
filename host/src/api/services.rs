//! `GET /v3/{project_id}/os-services`: the nodes of this service and their backends, with their
//! state, in Cinder's shape (what `cinder service-list` prints). Admins only, as in Cinder. A
//! backend shared by several nodes names its cluster (`berth@backend`), as an active-active
//! Cinder backend does.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use super::policy::Rule;
use super::views::timestamp;
use crate::attach::Caller;

pub fn routes() -> Router<AppState> {
    Router::new().route("/os-services", get(index))
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::ServiceIndex)?;
    let services: Vec<_> = state
        .service
        .services()
        .await?
        .into_iter()
        .map(|s| {
            json!({
                "binary": s.binary,
                "host": s.host,
                "zone": "nova",
                "status": "enabled",
                "state": if s.up { "up" } else { "down" },
                "updated_at": timestamp(s.updated_at),
                "disabled_reason": null,
                "cluster": s.cluster,
                "replication_status": "disabled",
                "active_backend_id": null,
                "frozen": false,
            })
        })
        .collect();
    Ok(Json(json!({ "services": services })).into_response())
}

//! `/v3/{project_id}/limits`: a project's absolute limits and what it uses, in Cinder's shape
//! (`cinder absolute-limits`, `openstack limits show --absolute`, Horizon's overview): the
//! project's quotas on volumes and gigabytes (`-1`: unlimited; `attach/quotas.rs`); Berth has no
//! snapshots or backups, so none are allowed (`0`). No rate limits.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::AppState;
use super::auth::check_project;
use super::error::ApiError;
use super::microversion::{LIMITS_OF_A_PROJECT, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::param;
use crate::attach::Caller;
use crate::domain::list::Scope;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/limits", index, "showLimits")
            .summary("limits", "The project's absolute limits (its volume quotas) and what it uses")
            .query("project_id", "From 3.39, admins: another project's.")
            .answers::<LimitsBody>(StatusCode::OK, "The limits"),
    ]
}

/// `{"limits": {"rate": [], "absolute": {...}}}`.
#[derive(Serialize, JsonSchema)]
struct LimitsBody {
    limits: Limits,
}

#[derive(Serialize, JsonSchema)]
struct Limits {
    /// Always empty: no rate limits.
    rate: Vec<serde_json::Value>,
    absolute: Absolute,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Absolute {
    /// The project's `volumes` quota (`-1`: unlimited).
    max_total_volumes: i64,
    /// The project's `gigabytes` quota (`-1`: unlimited).
    max_total_volume_gigabytes: i64,
    /// `0`: Berth has no snapshots.
    max_total_snapshots: i64,
    /// `0`: Berth has no backups.
    max_total_backups: i64,
    max_total_backup_gigabytes: i64,
    total_volumes_used: i64,
    total_gigabytes_used: i64,
    total_snapshots_used: i64,
    total_backups_used: i64,
    total_backup_gigabytes_used: i64,
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::LimitsGet)?;
    let asked =
        param(raw.as_deref(), "project_id").filter(|_| caller.is_admin() && version >= LIMITS_OF_A_PROJECT);
    if let Some(project) = &asked {
        check_project(project)?;
    }
    let scope = asked.as_deref().map(Scope::Project).unwrap_or_else(|| caller.own_project());
    let used = state.service.volumes().summary(scope).await?;
    let quotas = state.service.project_quotas(asked.as_deref().unwrap_or(&caller.project_id)).await?;
    let absolute = Absolute {
        max_total_volumes: quotas.get("volumes"),
        max_total_volume_gigabytes: quotas.get("gigabytes"),
        max_total_snapshots: 0,
        max_total_backups: 0,
        max_total_backup_gigabytes: 0,
        total_volumes_used: used.count,
        total_gigabytes_used: used.size_gib,
        total_snapshots_used: 0,
        total_backups_used: 0,
        total_backup_gigabytes_used: 0,
    };
    Ok(Json(LimitsBody { limits: Limits { rate: Vec::new(), absolute } }).into_response())
}

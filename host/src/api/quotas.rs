//! `/v3/{project_id}/os-quota-sets/{target}`: a project's volume quotas in Cinder's shape
//! (`cinder quota-show`, `quota-usage`, `quota-defaults`, `quota-update`, `quota-delete`;
//! `openstack quota show`, `quota set`; Horizon's overview), enforced by `attach/quotas.rs`:
//! `volumes`, `gigabytes`, `per_volume_gigabytes` and each volume type's `volumes_<type>` and
//! `gigabytes_<type>` (`-1`: unlimited, which they are until an admin sets them). Berth has no
//! snapshots, backups or groups, so none are allowed (`0`), and those keys can be set to nothing
//! else. With `usage=true` each quota says what the project uses. An update (admins) sets the
//! quotas it names, all or none; a delete takes the project's own quotas away, back to the
//! defaults. Quota classes (`/os-quota-class-sets/{class}`, `cinder quota-class-show`,
//! `quota-class-update`; admins): the `default` class's quotas are every project's where it
//! has none of its own; other classes have the same and cannot be set (nothing would use them).

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::AppState;
use super::auth::check_project;
use super::body::JsonBody;
use super::error::ApiError;
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::param;
use crate::attach::Caller;
use crate::domain::quotas::{Limits, Usage};
use crate::store::quotas::Holder;

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "quotas";
    vec![
        Endpoint::get("/os-quota-sets/{id}", show, "showQuotaSet")
            .summary(TAG, "A project's volume quotas (`-1`: unlimited) and, with `usage`, its use")
            .query("usage", "`true`: each quota with its limit, what is in use and reserved.")
            .answers::<QuotaSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::get("/os-quota-sets/{id}/defaults", defaults, "showDefaultQuotaSet")
            .summary(TAG, "The default volume quotas: the `default` quota class's")
            .answers::<QuotaSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::put("/os-quota-sets/{id}", update, "updateQuotaSet")
            .summary(TAG, "Set a project's quotas (admins): all those named, or none")
            .body::<QuotaUpdate>()
            .answers::<QuotaSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::get("/os-quota-class-sets/{id}", show_class, "showQuotaClassSet")
            .summary(TAG, "A quota class's volume quotas: the `default` class's")
            .answers::<QuotaClassSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::put("/os-quota-class-sets/{id}", update_class, "updateQuotaClassSet")
            .summary(TAG, "Set the `default` quota class's quotas: every project's without its own")
            .body::<QuotaClassUpdate>()
            .answers::<QuotaClassSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::delete("/os-quota-sets/{id}", remove, "deleteQuotaSet")
            .summary(TAG, "Reset a project's quotas to the defaults")
            .answers_empty(StatusCode::OK, "Done"),
    ]
}

/// `{"quota_set": {"id": "<project>", "volumes": -1, ...}}`.
#[derive(Serialize, JsonSchema)]
struct QuotaSetBody {
    quota_set: BTreeMap<String, Quota>,
}

/// The project's id (`id`), or a quota: its limit alone, or with what is used.
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
enum Quota {
    Id(String),
    Limit(i64),
    Usage { limit: i64, in_use: i64, reserved: i64 },
}

/// Cinder's quotas of what Berth does not have (snapshots, backups, groups): none allowed, and
/// nothing else can be set.
fn none_allowed(state: &AppState) -> Vec<String> {
    let mut keys: Vec<String> =
        ["snapshots", "backups", "backup_gigabytes", "groups"].iter().map(|k| k.to_string()).collect();
    keys.extend(state.service.catalog().types.iter().map(|t| format!("snapshots_{}", t.name)));
    keys
}

/// Each quota of `id` (a project or a class) with its limit in `limits` and, with `used`, what
/// is in use of it: Cinder's keys, those of every volume type of this deployment included.
fn quota_set(state: &AppState, id: &str, limits: &Limits, used: Option<&Usage>) -> BTreeMap<String, Quota> {
    let quota = |limit: i64, used: Option<(i64, i64)>| match used {
        Some((in_use, reserved)) => Quota::Usage { limit, in_use, reserved },
        None => Quota::Limit(limit),
    };
    let mut set = BTreeMap::from([("id".to_string(), Quota::Id(id.to_string()))]);
    for resource in state.service.quota_resources() {
        let of = used.map(|u| (u.in_use(&resource), u.reserved(&resource)));
        set.insert(resource.clone(), quota(limits.get(&resource), of));
    }
    for key in none_allowed(state) {
        set.insert(key, quota(0, used.map(|_| (0, 0))));
    }
    set
}

/// The target project, when the caller may read its quotas: its own, or any for an admin
/// (Cinder's rule takes the target project as the policy's target).
fn target(caller: &Caller, id: &str, rule: Rule) -> Result<(), ApiError> {
    check_project(id)?;
    if caller.is_admin() || caller.project_id == id { Ok(()) } else { Err(ApiError::forbidden(rule.name())) }
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaShow)?;
    target(&caller, &id, Rule::QuotaShow)?;
    let usage = match param(raw.as_deref(), "usage") {
        Some(v) => super::volumes::boolean("usage", &v)?,
        None => false,
    };
    let limits = state.service.project_quotas(&id).await?;
    let used = match usage {
        true => Some(state.service.quota_usage(&id).await?),
        false => None,
    };
    Ok(Json(QuotaSetBody { quota_set: quota_set(&state, &id, &limits, used.as_ref()) }).into_response())
}

async fn defaults(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaShow)?;
    target(&caller, &id, Rule::QuotaShow)?;
    let limits = state.service.default_quotas().await?;
    Ok(Json(QuotaSetBody { quota_set: quota_set(&state, &id, &limits, None) }).into_response())
}

/// `{"quota_set": {"volumes": 10, ...}}`: the quotas to set.
#[derive(Deserialize, JsonSchema)]
struct QuotaUpdate {
    quota_set: BTreeMap<String, serde_json::Value>,
}

async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<QuotaUpdate>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaUpdate)?;
    check_project(&id)?;
    let limits = asked(&state, &body.quota_set)?;
    state.service.set_quotas(&caller, Holder::Project(&id), &limits).await?;
    let mut set = quota_set(&state, &id, &state.service.project_quotas(&id).await?, None);
    set.remove("id");
    Ok(Json(QuotaSetBody { quota_set: set }).into_response())
}

/// The limits `asked` sets, each an integer (or a string of one, as Cinder takes them); a quota
/// of what Berth does not have may only be named with `0`.
fn asked(
    state: &AppState,
    asked: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, i64>, ApiError> {
    let none = none_allowed(state);
    let mut limits = BTreeMap::new();
    // Cinder skips these keys of a quota set, as not quotas.
    for (key, value) in asked.iter().filter(|(k, _)| !matches!(k.as_str(), "id" | "tenant_id")) {
        let limit = value.as_i64().or_else(|| value.as_str().and_then(|s| s.trim().parse().ok()));
        let Some(limit) = limit else {
            return Err(ApiError::bad_request(format!(
                "Invalid input for field/attribute {key}. Value: {value}. {value} is not an integer"
            )));
        };
        if none.contains(key) {
            if limit != 0 {
                return Err(ApiError::bad_request(format!(
                    "Invalid input for field/attribute {key}. Value: {value}. Berth has no snapshots, backups or \
                     groups: {key} is 0 and cannot be set to another value"
                )));
            }
            continue;
        }
        limits.insert(key.clone(), limit);
    }
    Ok(limits)
}

/// `{"quota_class_set": {"id": "<class>", "volumes": -1, ...}}`.
#[derive(Serialize, JsonSchema)]
struct QuotaClassSetBody {
    quota_class_set: BTreeMap<String, Quota>,
}

/// `{"quota_class_set": {"volumes": -1, ...}}`: the quotas of a class to set.
#[derive(Deserialize, JsonSchema)]
struct QuotaClassUpdate {
    quota_class_set: BTreeMap<String, serde_json::Value>,
}

/// The quota class Berth applies: every project's limits where it has none of its own.
const DEFAULT_CLASS: &str = "default";

/// A quota class (`default`, or any name: every class has the default class's quotas).
async fn show_class(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(class): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaClassShow)?;
    check_project(&class)?;
    let limits = state.service.default_quotas().await?;
    Ok(Json(QuotaClassSetBody { quota_class_set: quota_set(&state, &class, &limits, None) }).into_response())
}

async fn update_class(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(class): Path<String>,
    JsonBody(body): JsonBody<QuotaClassUpdate>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaClassUpdate)?;
    check_project(&class)?;
    let limits = asked(&state, &body.quota_class_set)?;
    if class != DEFAULT_CLASS && !limits.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Quota class {class} is not used by Berth: every project gets the quotas of class {DEFAULT_CLASS} \
             (where it has none of its own); set those instead"
        )));
    }
    state.service.set_quotas(&caller, Holder::DefaultClass, &limits).await?;
    let mut set = quota_set(&state, &class, &state.service.default_quotas().await?, None);
    set.remove("id");
    Ok(Json(QuotaClassSetBody { quota_class_set: set }).into_response())
}

async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaDelete)?;
    check_project(&id)?;
    state.service.reset_quotas(&caller, &id).await?;
    Ok(StatusCode::OK.into_response())
}

//! `/v3/{project_id}/os-quota-sets/{target}`: a project's volume quotas in Cinder's shape
//! (`cinder quota-show`, `quota-usage`, `quota-defaults`; `openstack quota show`; Horizon's
//! overview), as `limits.rs` answers them: Berth enforces no volume quotas, so volumes and
//! gigabytes are unlimited (`-1`), of every volume type too, and it has no snapshots, backups or
//! groups, so none are allowed (`0`). With `usage=true` each quota says what the project uses.
//! An update may only name a quota with the value it has (a no-op, so that a tool that writes
//! back what it read works); any other value is refused with 400, saying why. A delete (back to
//! the defaults) changes nothing: the defaults are all there is. Quota classes
//! (`/os-quota-class-sets/{class}`, `cinder quota-class-show`, `quota-class-update`; admins) are
//! the same defaults, whatever the class.

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
use crate::domain::list::Scope;

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "quotas";
    vec![
        Endpoint::get("/os-quota-sets/{id}", show, "showQuotaSet")
            .summary(TAG, "A project's volume quotas (none enforced: unlimited) and, with `usage`, its use")
            .query("usage", "`true`: each quota with its limit, what is in use and reserved.")
            .answers::<QuotaSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::get("/os-quota-sets/{id}/defaults", defaults, "showDefaultQuotaSet")
            .summary(TAG, "The default volume quotas (none enforced: unlimited)")
            .answers::<QuotaSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::put("/os-quota-sets/{id}", update, "updateQuotaSet")
            .summary(TAG, "Set quotas: only to the values they have (none enforced)")
            .body::<QuotaUpdate>()
            .answers::<QuotaSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::get("/os-quota-class-sets/{id}", show_class, "showQuotaClassSet")
            .summary(TAG, "A quota class's volume quotas: the defaults (none enforced)")
            .answers::<QuotaClassSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::put("/os-quota-class-sets/{id}", update_class, "updateQuotaClassSet")
            .summary(TAG, "Set a quota class's quotas: only to the values they have (none enforced)")
            .body::<QuotaClassUpdate>()
            .answers::<QuotaClassSetBody>(StatusCode::OK, "The quotas"),
        Endpoint::delete("/os-quota-sets/{id}", remove, "deleteQuotaSet")
            .summary(TAG, "Reset a project's quotas to the defaults (nothing to do: none enforced)")
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

/// Unlimited.
const UNLIMITED: i64 = -1;

/// Each quota's limit and what `used` says is in use of it, for `project`: Cinder's keys, those
/// of every volume type of this deployment's catalogue included.
fn quota_set(
    state: &AppState,
    project: &str,
    used: Option<&[(String, i64, i64)]>,
) -> BTreeMap<String, Quota> {
    let total = |pick: fn(&(String, i64, i64)) -> i64| used.map(|u| u.iter().map(pick).sum::<i64>());
    let of_type = |name: &str, pick: fn(&(String, i64, i64)) -> i64| {
        used.map(|u| u.iter().filter(|t| t.0 == name).map(pick).sum::<i64>())
    };
    let quota = |limit: i64, in_use: Option<i64>| match in_use {
        Some(in_use) => Quota::Usage { limit, in_use, reserved: 0 },
        None => Quota::Limit(limit),
    };
    let none = used.map(|_| 0);
    let mut set = BTreeMap::from([
        ("id".to_string(), Quota::Id(project.to_string())),
        ("volumes".to_string(), quota(UNLIMITED, total(|t| t.1))),
        ("gigabytes".to_string(), quota(UNLIMITED, total(|t| t.2))),
        ("per_volume_gigabytes".to_string(), quota(UNLIMITED, none)),
        ("snapshots".to_string(), quota(0, none)),
        ("backups".to_string(), quota(0, none)),
        ("backup_gigabytes".to_string(), quota(0, none)),
        ("groups".to_string(), quota(0, none)),
    ]);
    for t in &state.service.catalog().types {
        let name = &t.name;
        set.insert(format!("volumes_{name}"), quota(UNLIMITED, of_type(name, |t| t.1)));
        set.insert(format!("gigabytes_{name}"), quota(UNLIMITED, of_type(name, |t| t.2)));
        set.insert(format!("snapshots_{name}"), quota(0, none));
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
    let used = match usage {
        true => Some(state.service.volumes().usage_by_type(Scope::Project(&id)).await?),
        false => None,
    };
    Ok(Json(QuotaSetBody { quota_set: quota_set(&state, &id, used.as_deref()) }).into_response())
}

async fn defaults(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaShow)?;
    target(&caller, &id, Rule::QuotaShow)?;
    Ok(Json(QuotaSetBody { quota_set: quota_set(&state, &id, None) }).into_response())
}

/// `{"quota_set": {"volumes": -1, ...}}`: the quotas to set.
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
    let set = written(quota_set(&state, &id, None), &body.quota_set)?;
    Ok(Json(QuotaSetBody { quota_set: set }).into_response())
}

/// `set` after writing `asked` to it: every quota named with the value it has (a no-op), or a
/// 400 that says Berth enforces none.
fn written(
    mut set: BTreeMap<String, Quota>,
    asked: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, Quota>, ApiError> {
    // Cinder skips these keys of a quota set, as not quotas.
    for (key, value) in asked.iter().filter(|(k, _)| !matches!(k.as_str(), "id" | "tenant_id")) {
        let Some(Quota::Limit(limit)) = set.get(key) else {
            return Err(ApiError::bad_request(format!("Bad key(s) in quota set: {key}")));
        };
        let asked = value.as_i64().or_else(|| value.as_str().and_then(|s| s.parse().ok()));
        if asked != Some(*limit) {
            return Err(ApiError::bad_request(format!(
                "Invalid input for field/attribute {key}. Value: {value}. Berth enforces no volume quotas: \
                 {key} is {limit} ({}) and cannot be set to another value",
                if *limit == UNLIMITED { "unlimited" } else { "Berth has none" }
            )));
        }
    }
    set.remove("id");
    Ok(set)
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

/// A quota class (`default`, or any name: every class has the defaults, as every project does).
async fn show_class(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(class): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaClassShow)?;
    check_project(&class)?;
    Ok(Json(QuotaClassSetBody { quota_class_set: quota_set(&state, &class, None) }).into_response())
}

async fn update_class(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(class): Path<String>,
    JsonBody(body): JsonBody<QuotaClassUpdate>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaClassUpdate)?;
    check_project(&class)?;
    let set = written(quota_set(&state, &class, None), &body.quota_class_set)?;
    Ok(Json(QuotaClassSetBody { quota_class_set: set }).into_response())
}

async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QuotaDelete)?;
    check_project(&id)?;
    Ok(StatusCode::OK.into_response())
}

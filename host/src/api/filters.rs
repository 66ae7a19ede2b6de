//! `GET /v3/{project_id}/resource_filters` (3.33; `cinder list-filters`): the filters each list
//! of this API takes, in the shape of Cinder's answer from its `resource_filters.json`. Read off
//! the lists' own specifications (`volumes.rs`, `attachments.rs`, `history.rs`, `pools.rs`,
//! `messages.rs`), so
//! that what is advertised is what is taken; `tests/api/volumes.rs` sends each one. `resource`
//! names one list; a resource without a list here answers none, as Cinder does.

use axum::Json;
use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use schemars::JsonSchema;
use serde::Serialize;

use super::error::ApiError;
use super::microversion::RESOURCE_FILTER_CONFIG;
use super::openapi::Endpoint;
use super::query::{ListSpec, param};

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/resource_filters", index, "listResourceFilters")
            .since(RESOURCE_FILTER_CONFIG)
            .summary("resource filters", "The filters each list takes")
            .query(
                "resource",
                "Only this resource's (`volume`, `attachment`, `pool`, `message`, `snapshot`, `backup`, `group`, `group_snapshot`, `attachment_event`).",
            )
            .answers::<FilterList>(StatusCode::OK, "The filters"),
    ]
}

/// `{"resource_filters": [{"resource": "volume", "filters": [...]}, ...]}`.
#[derive(Serialize, JsonSchema)]
struct FilterList {
    resource_filters: Vec<ResourceFilters>,
}

#[derive(Serialize, JsonSchema)]
struct ResourceFilters {
    resource: String,
    filters: Vec<String>,
}

/// A list's filters: its query keys and the flags that filter (not `with_count`, `is_public`,
/// nor `project_id`, an admin's with `all_tenants`, which Cinder does not list either).
fn of(spec: &ListSpec) -> Vec<String> {
    let keys = spec.filters.iter().map(|(key, _)| *key).chain(spec.flags.iter().copied());
    let mut keys: Vec<String> =
        keys.filter(|k| !matches!(*k, "with_count" | "is_public" | "project_id")).map(String::from).collect();
    keys.sort();
    keys.dedup();
    keys
}

/// Every list's filters, by resource.
fn all() -> Vec<ResourceFilters> {
    let lists = [
        ("volume", of(&super::volumes::LIST)),
        ("attachment", of(&super::attachments::LIST)),
        ("pool", super::pools::FILTERS.iter().map(|k| k.to_string()).collect()),
        ("message", of(&super::messages::LIST)),
        // Lists that are always empty here, whose filters are still checked.
        ("snapshot", of(&super::absent::SNAPSHOT_LIST)),
        ("backup", of(&super::absent::BACKUP_LIST)),
        ("group", of(&super::absent::GROUP_LIST)),
        ("group_snapshot", of(&super::absent::GROUP_SNAPSHOT_LIST)),
        // Berth's: the attach history (`GET /os-attachment-events`).
        ("attachment_event", of(&super::history::LIST)),
    ];
    lists
        .into_iter()
        .map(|(resource, filters)| ResourceFilters { resource: resource.into(), filters })
        .collect()
}

/// Any caller's: Cinder has no rule for it.
async fn index(RawQuery(raw): RawQuery) -> Result<Response, ApiError> {
    let resource = param(raw.as_deref(), "resource");
    let resource_filters =
        all().into_iter().filter(|r| resource.as_ref().is_none_or(|wanted| *wanted == r.resource)).collect();
    Ok(Json(FilterList { resource_filters }).into_response())
}

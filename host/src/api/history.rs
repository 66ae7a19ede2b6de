//! `GET /v3/{project_id}/os-attachment-events`: the attach history (`attach/history.rs`), a
//! Berth extension. Members read their project's events; admins every project's with
//! `all_tenants`. Oldest first; `limit` and `marker` page it.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::AppState;
use super::error::ApiError;
use super::microversion::Version;
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::{ListSpec, parse};
use super::views::timestamp;
use super::volumes::parse_time;
use crate::attach::Caller;
use crate::domain::history::{Access, AttachEvent, EventFilter};
use crate::domain::list::MAX_PAGE;

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/os-attachment-events", index, "listAttachmentEvents")
            .summary(
                "attachment-events",
                "The attach history: every change to a volume's or an attachment's access, oldest first",
            )
            .list(&LIST)
            .answers::<EventList>(StatusCode::OK, "The events"),
    ]
}

pub(super) const LIST: ListSpec = ListSpec {
    sort_keys: &[],
    sort_aliases: &[],
    filters: &[
        ("volume_id", "volume_id"),
        ("attachment_id", "attachment_id"),
        ("instance_id", "instance_uuid"),
        ("instance_uuid", "instance_uuid"),
        // The connector's host name or its initiator.
        ("host", "host"),
        ("outcome", "outcome"),
        // granted, revoked or none.
        ("access", "access"),
        // ISO 8601 times (UTC when they have no offset), inclusive.
        ("since", "since"),
        ("until", "until"),
    ],
    flags: &[],
};

/// One event of the attach history.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct EventView {
    pub id: String,
    pub volume_id: String,
    /// Its place in the volume's hash chain, from 1.
    pub seq: i64,
    /// When it was committed (naive UTC, as Cinder's timestamps).
    pub time: String,
    /// The state machine's event (`reserve`, `connect`, `complete`, `detach`, `force-detach`, ...).
    pub event: String,
    /// What it did to a host's access: `granted`, `revoked` or `none`.
    pub access: String,
    /// The attachment's status after the change; `failed` for a connect that was undone,
    /// `replaced` for a connector an update replaced.
    pub outcome: String,
    pub project_id: String,
    pub attachment_id: Option<String>,
    pub instance_uuid: Option<String>,
    pub host: Option<String>,
    pub initiator: Option<String>,
    pub user_id: String,
    pub caller_project_id: String,
    pub roles: Vec<String>,
    /// Whether the caller presented a service token.
    pub service_token: bool,
    pub request_id: Option<String>,
    pub global_request_id: Option<String>,
    /// The Berth node that made the change.
    pub node: String,
    /// The sha256 of the driver component that ran the change's calls.
    pub driver_digest: Option<String>,
    pub prev_hash: String,
    pub hash: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EventList {
    pub attachment_events: Vec<EventView>,
    /// A `next` link when the page is full.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attachment_events_links: Option<Vec<NextLink>>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NextLink {
    pub rel: String,
    pub href: String,
}

pub fn event_view(e: &AttachEvent) -> EventView {
    let f = &e.fields;
    EventView {
        id: e.id.clone(),
        volume_id: f.volume_id.clone(),
        seq: e.seq,
        time: timestamp(f.at),
        event: f.event.clone(),
        access: f.access.as_str().to_string(),
        outcome: f.outcome.clone(),
        project_id: f.project_id.clone(),
        attachment_id: f.attachment_id.clone(),
        instance_uuid: f.instance_uuid.clone(),
        host: f.host.clone(),
        initiator: f.initiator.clone(),
        user_id: f.user_id.clone(),
        caller_project_id: f.caller_project_id.clone(),
        roles: f.roles.clone(),
        service_token: f.service_token,
        request_id: f.request_id.clone(),
        global_request_id: f.global_request_id.clone(),
        node: f.node.clone(),
        driver_digest: f.driver_digest.clone(),
        prev_hash: e.prev_hash.clone(),
        hash: e.hash.clone(),
    }
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::AttachmentEventGetAll)?;
    let q = parse(raw.as_deref(), &LIST, version)?;
    if q.page.offset.is_some() || !q.page.sort.is_empty() {
        return Err(ApiError::bad_request(
            "Invalid input received: the attach history is paged with limit and marker, oldest first",
        ));
    }
    let time = |key: &str| {
        q.filters
            .get(key)
            .map(|v| {
                parse_time(v).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "Invalid input received: {key}={v:?} is not an ISO 8601 time"
                    ))
                })
            })
            .transpose()
    };
    let access = q
        .filters
        .get("access")
        .map(|v| {
            Access::parse(v).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Invalid input received: access={v:?} is not one of granted, revoked, none"
                ))
            })
        })
        .transpose()?;
    let filter = EventFilter {
        volume_id: q.filters.get("volume_id").cloned(),
        attachment_id: q.filters.get("attachment_id").cloned(),
        instance_uuid: q.filters.get("instance_uuid").cloned(),
        host: q.filters.get("host").cloned(),
        outcome: q.filters.get("outcome").cloned(),
        access,
        since: time("since")?,
        until: time("until")?,
    };
    let limit = q.page.limit.unwrap_or(MAX_PAGE).clamp(0, MAX_PAGE);
    let events =
        state.service.list_events(&caller, q.all_tenants, &filter, q.page.marker.as_deref(), limit).await?;
    let mut links = None;
    if limit > 0
        && events.len() as i64 == limit
        && let Some(last) = events.last()
    {
        let mut next: Vec<(String, String)> = form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
            .filter(|(k, _)| k != "marker")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        next.push(("marker".into(), last.id.clone()));
        let query = form_urlencoded::Serializer::new(String::new()).extend_pairs(next).finish();
        links = Some(vec![NextLink { rel: "next".into(), href: format!("os-attachment-events?{query}") }]);
    }
    Ok(Json(EventList {
        attachment_events: events.iter().map(event_view).collect(),
        attachment_events_links: links,
    })
    .into_response())
}

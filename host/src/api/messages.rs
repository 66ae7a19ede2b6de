//! `/v3/{project_id}/messages` (3.3): user messages (`cinder message-list`, `message-show`,
//! `message-delete`), why an operation on a volume failed, as `attach/messages.rs` records them.
//! A project's readers read its messages and its members delete them; an admin reads every
//! project's, as in Cinder.

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::error::ApiError;
use super::microversion::{MESSAGES, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::{ListSpec, parse};
use super::views::{Link, timestamp};
use super::volumes::links;
use super::{AppState, uuid_param};
use crate::attach::Caller;
use crate::domain::list::{MESSAGE_SORT_KEYS, MessageFilter};
use crate::domain::messages::user_message;
use crate::store::messages::Message;

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "messages";
    vec![
        Endpoint::get("/messages", index, "listMessages")
            .since(MESSAGES)
            .summary(TAG, "List the project's messages: why operations on its volumes failed (an admin's: every project's)")
            .list(&LIST)
            .answers::<MessageList>(StatusCode::OK, "The messages, newest first"),
        Endpoint::get("/messages/{id}", show, "showMessage")
            .since(MESSAGES)
            .summary(TAG, "Show a message")
            .answers::<MessageBody>(StatusCode::OK, "The message"),
        Endpoint::delete("/messages/{id}", remove, "deleteMessage")
            .since(MESSAGES)
            .summary(TAG, "Delete a message")
            .answers_empty(StatusCode::NO_CONTENT, "Deleted"),
    ]
}

/// Cinder's message filters (`resource_filters.json`), sort keys and paging.
pub(super) const LIST: ListSpec = ListSpec {
    sort_keys: MESSAGE_SORT_KEYS,
    sort_aliases: &[],
    filters: &[
        ("resource_uuid", "resource_uuid"),
        ("resource_type", "resource_type"),
        ("event_id", "event_id"),
        ("request_id", "request_id"),
        ("message_level", "message_level"),
    ],
    flags: &[],
};

#[derive(Serialize, JsonSchema)]
struct MessageList {
    messages: Vec<MessageView>,
}

#[derive(Serialize, JsonSchema)]
struct MessageBody {
    message: MessageView,
}

/// A message, as Cinder shows it.
#[derive(Serialize, JsonSchema)]
struct MessageView {
    id: String,
    /// Cinder's: `VOLUME_<resource>_<action>_<detail>`.
    event_id: String,
    /// `<action>:<detail>`, in Cinder's words.
    user_message: String,
    /// `ERROR`.
    message_level: String,
    resource_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_uuid: Option<String>,
    created_at: String,
    /// When it expires (`[messages] keep_days` after it was made).
    guaranteed_until: String,
    /// The request that failed (none: the service's own work, such as a recovery).
    request_id: Option<String>,
    links: Vec<Link>,
}

fn view(m: &Message, links: &super::views::Links) -> MessageView {
    MessageView {
        id: m.id.clone(),
        event_id: m.event_id.clone(),
        user_message: user_message(&m.action_id, &m.detail_id),
        message_level: m.message_level.clone(),
        resource_type: m.resource_type.clone(),
        resource_uuid: m.resource_uuid.clone(),
        created_at: timestamp(m.created_at),
        guaranteed_until: timestamp(m.expires_at),
        request_id: m.request_id.clone(),
        links: links.of(&m.project_id, "messages", &m.id),
    }
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MessageGetAll)?;
    let q = parse(raw.as_deref(), &LIST, version)?;
    let filter = MessageFilter {
        resource_uuid: q.filters.get("resource_uuid").cloned(),
        resource_type: q.filters.get("resource_type").cloned(),
        event_id: q.filters.get("event_id").cloned(),
        request_id: q.filters.get("request_id").cloned(),
        message_level: q.filters.get("message_level").cloned(),
    };
    let links = links(&state, &headers);
    let rows = state.service.messages(caller.scope(), &filter, &q.page).await?;
    Ok(Json(MessageList { messages: rows.iter().map(|m| view(m, &links)).collect() }).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MessageGet)?;
    uuid_param("message_id", &id)?;
    let m = state.service.message(&caller, &id).await?;
    Ok(Json(MessageBody { message: view(&m, &links(&state, &headers)) }).into_response())
}

async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::MessageDelete)?;
    uuid_param("message_id", &id)?;
    state.service.delete_message(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

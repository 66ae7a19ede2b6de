//! `/v3/{project_id}/attachments` (3.27+; `os-complete` 3.44; `mode` 3.54): request schemas,
//! wrappers and status codes as Cinder has them (`cinder/api/v3/attachments.py`,
//! `cinder/api/schemas/attachments.py`).

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{ATTACHMENT_CREATE_MODE, NEW_ATTACH, NEW_ATTACH_COMPLETION, Version};
use super::openapi::Endpoint;
use super::path::AttachmentId;
use super::policy::Rule;
use super::query::{ListSpec, parse};
use super::views::{
    AttachmentBody, AttachmentDetail, AttachmentDetailList, AttachmentList, Secrets, attachment_detail,
    attachment_summary,
};
use super::{AppState, uuid_param};
use crate::attach::attachments::NewAttachment;
use crate::attach::{AttachError, Caller};
use crate::domain::list::{ATTACHMENT_SORT_KEYS, AttachmentFilter, Scope};
use crate::domain::model::{Attachment, Connector};

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "attachments";
    let follow = |e: Endpoint| {
        e.link("show", "showAttachment", "id", "/attachment/id")
            .link("update", "updateAttachment", "id", "/attachment/id")
            .link("complete", "completeAttachment", "id", "/attachment/id")
            .link("delete", "deleteAttachment", "id", "/attachment/id")
    };
    vec![
        Endpoint::get("/attachments", index, "listAttachments")
            .summary(TAG, "List attachments")
            .since(NEW_ATTACH)
            .list(&LIST)
            .answers::<AttachmentList>(StatusCode::OK, "The attachments"),
        follow(
            Endpoint::post("/attachments", create, "createAttachment")
                .summary(TAG, "Reserve a volume, and connect it when a connector is given")
                .since(NEW_ATTACH)
                .body::<CreateAttachmentBody>()
                .answers::<AttachmentBody>(StatusCode::OK, "The attachment, connected or reserved"),
        ),
        Endpoint::get("/attachments/detail", detail, "listAttachmentsDetail")
            .summary(TAG, "List attachments with their details")
            .since(NEW_ATTACH)
            .list(&LIST)
            .answers::<AttachmentDetailList>(StatusCode::OK, "The attachments"),
        Endpoint::get("/attachments/{id}", show, "showAttachment")
            .summary(TAG, "Show an attachment, with the others that share its connection")
            .since(NEW_ATTACH)
            .answers::<AttachmentBody>(StatusCode::OK, "The attachment"),
        follow(
            Endpoint::put("/attachments/{id}", update, "updateAttachment")
                .summary(TAG, "Give a reserved attachment its connector and connect it")
                .since(NEW_ATTACH)
                .body::<UpdateAttachmentBody>()
                .answers::<AttachmentBody>(StatusCode::OK, "The connected attachment"),
        ),
        Endpoint::delete("/attachments/{id}", remove, "deleteAttachment")
            .summary(TAG, "Revoke an attachment's access and remove it")
            .since(NEW_ATTACH)
            .answers::<AttachmentList>(StatusCode::OK, "The volume's remaining attachments"),
        Endpoint::post("/attachments/{id}/action", action, "completeAttachment")
            .summary(TAG, "Mark a connected attachment attached (`os-complete`)")
            .since(NEW_ATTACH_COMPLETION)
            .body::<CompleteBody>()
            .answers_empty(StatusCode::NO_CONTENT, "Completed"),
    ]
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateAttachmentBody {
    attachment: CreateAttachment,
}

/// A new attachment: a reservation of the volume, connected when a connector is given.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateAttachment {
    /// The volume's id.
    #[schemars(extend("format" = "uuid"))]
    volume_uuid: String,
    /// The instance's id, if any (Nova's live migration names the same instance twice).
    #[serde(default)]
    #[schemars(extend("format" = "uuid"))]
    instance_uuid: Option<String>,
    /// os-brick's connector of the host.
    #[serde(default)]
    #[schemars(with = "Option<ConnectorDoc>")]
    connector: Option<Map<String, Value>>,
    /// `rw` (the default) or `ro`; from microversion 3.54.
    #[serde(default)]
    #[schemars(extend("enum" = ["rw", "ro", null]))]
    mode: Option<String>,
}

/// `{"os-complete": null}`: the only action of an attachment.
#[derive(JsonSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Describes the body `action` reads as a map, for the document.
struct CompleteBody {
    #[serde(rename = "os-complete")]
    complete: (),
}

async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    JsonBody(body): JsonBody<CreateAttachmentBody>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::AttachmentCreate)?;
    let a = body.attachment;
    if a.mode.is_some() && version < ATTACHMENT_CREATE_MODE {
        return Err(ApiError::bad_request(
            "Invalid input for field/attribute attachment: Additional properties are not allowed ('mode' was unexpected)",
        ));
    }
    let mode = a.mode.as_deref().map(super::mode_param).transpose()?;
    let request = NewAttachment {
        volume_id: uuid_param("volume_uuid", &a.volume_uuid)?,
        instance_uuid: a.instance_uuid.as_deref().map(|i| uuid_param("instance_uuid", i)).transpose()?,
        connector: a.connector.filter(|c| !c.is_empty()).map(connector).transpose()?,
        mode,
        legacy: false,
    };
    let row = state.service.commands().create_attachment(caller, request).await?;
    Ok(Json(AttachmentBody { attachment: attachment_detail(&row, Secrets::Shown) }).into_response())
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateAttachmentBody {
    attachment: UpdateAttachment,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateAttachment {
    /// os-brick's connector of the host (not empty).
    #[schemars(with = "ConnectorDoc")]
    connector: Map<String, Value>,
}

/// os-brick's connector of a host (`get_connector_properties`), as the API reads it: the keys
/// below, typed, and any others, passed to the driver as they are. A driver says which it needs
/// (iSCSI: `initiator`). (Cinder's clients also send booleans as strings, and `wwpns` as one
/// string; both are accepted.)
#[derive(JsonSchema)]
#[schemars(extend("minProperties" = 1, "examples" = [{
    "initiator": "iqn.1993-08.org.debian:01:host-a", "host": "host-a", "ip": "127.0.0.1",
    "multipath": false, "platform": "x86_64", "os_type": "linux", "do_local_attach": false
}]))]
#[allow(dead_code)] // Describes the map `connector` parses, for the document.
pub(super) struct ConnectorDoc {
    /// The host's iSCSI initiator name (`iqn.YYYY-MM.reversed.domain[:unique]`, `eui.` or `naa.`).
    #[schemars(
        regex(
            pattern = r"^(iqn\.[0-9]{4}-(0[1-9]|1[0-2])\.[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*(:[a-z0-9.:-]+)?|eui\.[0-9a-f]{16}|naa\.([0-9a-f]{16}|[0-9a-f]{32}))$"
        ),
        length(max = 223)
    )]
    initiator: Option<String>,
    host: Option<String>,
    ip: Option<String>,
    multipath: Option<bool>,
    enforce_multipath: Option<bool>,
    platform: Option<String>,
    os_type: Option<String>,
    /// The host's NVMe qualified name.
    nqn: Option<String>,
    /// Fibre Channel port names.
    wwpns: Option<Vec<String>>,
    wwnns: Option<Vec<String>>,
    mountpoint: Option<String>,
    /// `rw` or `ro`.
    #[schemars(extend("enum" = ["rw", "ro", null]))]
    mode: Option<String>,
}

async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    AttachmentId(id): AttachmentId,
    JsonBody(body): JsonBody<UpdateAttachmentBody>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::AttachmentUpdate)?;
    if body.attachment.connector.is_empty() {
        return Err(ApiError::bad_request(
            "Invalid input for field/attribute connector. Value: {}. {} does not have enough properties",
        ));
    }
    let c = connector(body.attachment.connector)?;
    let row = state.service.commands().update_attachment(caller, id, c).await?;
    Ok(Json(AttachmentBody { attachment: attachment_detail(&row, Secrets::Shown) }).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    AttachmentId(id): AttachmentId,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::AttachmentGet)?;
    let (row, shared) = state.service.attachments().show(&caller, &id).await?;
    let secrets = state.secrets_for(&caller);
    let view = AttachmentDetail {
        shared_connections_by_attachment: Some(shared),
        ..attachment_detail(&row, secrets)
    };
    Ok(Json(AttachmentBody { attachment: view }).into_response())
}

/// Parses a client's connector; a malformed one is a 400 naming the key.
pub(super) fn connector(json: Map<String, Value>) -> Result<Connector, ApiError> {
    Connector::parse(json).map_err(|e| AttachError::InvalidInput(e).into())
}

pub(super) const LIST: ListSpec = ListSpec {
    sort_keys: ATTACHMENT_SORT_KEYS,
    sort_aliases: &[],
    filters: &[
        ("volume_id", "volume_id"),
        ("instance_id", "instance_uuid"),
        ("attach_status", "attach_status"),
        // Cinder filters on a non-existent column and always answers [] (Q4); here it is an alias.
        ("status", "attach_status"),
        ("project_id", "project_id"),
    ],
    flags: &[],
};

async fn list(
    state: &AppState,
    caller: &Caller,
    version: Version,
    raw: Option<String>,
) -> Result<Vec<Attachment>, ApiError> {
    state.authorize(caller, Rule::AttachmentGetAll)?;
    let q = parse(raw.as_deref(), &LIST, version)?;
    let project_filter = q.filters.get("project_id").cloned();
    let scope = match &project_filter {
        _ if !(caller.is_admin() && q.all_tenants) => caller.own_project(),
        Some(project) => Scope::Project(project),
        None => Scope::All,
    };
    let filter = AttachmentFilter {
        volume_id: q.filters.get("volume_id").cloned(),
        instance_uuid: q.filters.get("instance_uuid").cloned(),
        attach_status: q.filters.get("attach_status").cloned(),
    };
    Ok(state.service.attachments().list(scope, &filter, &q.page).await?)
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let rows = list(&state, &caller, version, raw).await?;
    Ok(Json(AttachmentList { attachments: rows.iter().map(attachment_summary).collect() }).into_response())
}

async fn detail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let rows = list(&state, &caller, version, raw).await?;
    let secrets = state.secrets_for(&caller);
    Ok(Json(AttachmentDetailList {
        attachments: rows.iter().map(|a| attachment_detail(a, secrets)).collect(),
    })
    .into_response())
}

async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    AttachmentId(id): AttachmentId,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::AttachmentDelete)?;
    let remaining = state.service.commands().delete_attachment(caller, id).await?;
    Ok(Json(AttachmentList { attachments: remaining.iter().map(attachment_summary).collect() })
        .into_response())
}

async fn action(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    AttachmentId(id): AttachmentId,
    JsonBody(body): JsonBody<Map<String, Value>>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::AttachmentComplete)?;
    if body.len() != 1 || !body.contains_key("os-complete") {
        let keys: Vec<&String> = body.keys().collect();
        return Err(ApiError::bad_request(format!(
            "Invalid input: the only attachment action is 'os-complete' (got {keys:?})"
        )));
    }
    state.service.commands().complete_attachment(caller, id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

//! `/v3/{project_id}/snapshots` and `/v3/{project_id}/backups`: resources this service has none
//! of. Its driver contract has no call that makes a snapshot or a backup, so, as a Cinder whose
//! backends take no snapshots and which runs no backup service, the lists are empty (their
//! filters, paging and microversions checked as every list's), a snapshot or backup named by id
//! is 404, and a request to make one is refused with 400 saying why. Clients that list
//! snapshots or backups (`cinder snapshot-list`, `openstack volume snapshot list`, openstacksdk's
//! `snapshots()`) get an empty list where they got an error.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{VOLUME_LIST_COUNT, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::{ListQuery, ListSpec, parse};
use super::{AppState, uuid_param};
use crate::attach::Caller;

pub fn endpoints() -> Vec<Endpoint> {
    const SNAPSHOTS: &str = "snapshots";
    const BACKUPS: &str = "backups";
    vec![
        Endpoint::get("/snapshots", list_snapshots, "listSnapshots")
            .summary(SNAPSHOTS, "List snapshots: always empty (no driver here takes snapshots)")
            .list(&SNAPSHOT_LIST)
            .answers::<SnapshotList>(StatusCode::OK, "No snapshot"),
        Endpoint::get("/snapshots/detail", list_snapshots, "listSnapshotsDetail")
            .summary(SNAPSHOTS, "List snapshots with details: always empty")
            .list(&SNAPSHOT_LIST)
            .answers::<SnapshotList>(StatusCode::OK, "No snapshot"),
        Endpoint::get("/snapshots/{id}", show_snapshot, "showSnapshot")
            .summary(SNAPSHOTS, "Show a snapshot: none exists (404)"),
        Endpoint::delete("/snapshots/{id}", delete_snapshot, "deleteSnapshot")
            .summary(SNAPSHOTS, "Delete a snapshot: none exists (404)"),
        Endpoint::post("/snapshots", create_snapshot, "createSnapshot")
            .summary(SNAPSHOTS, "Create a snapshot: refused (400), no driver here takes snapshots")
            .body::<Value>(),
        Endpoint::get("/backups", list_backups, "listBackups")
            .summary(BACKUPS, "List backups: always empty (no backup service runs here)")
            .list(&BACKUP_LIST)
            .answers::<BackupList>(StatusCode::OK, "No backup"),
        Endpoint::get("/backups/detail", list_backups, "listBackupsDetail")
            .summary(BACKUPS, "List backups with details: always empty")
            .list(&BACKUP_LIST)
            .answers::<BackupList>(StatusCode::OK, "No backup"),
        Endpoint::get("/backups/{id}", show_backup, "showBackup")
            .summary(BACKUPS, "Show a backup: none exists (404)"),
        Endpoint::delete("/backups/{id}", delete_backup, "deleteBackup")
            .summary(BACKUPS, "Delete a backup: none exists (404)"),
        Endpoint::post("/backups", create_backup, "createBackup")
            .summary(BACKUPS, "Create a backup: refused (400), no backup service runs here")
            .body::<Value>(),
    ]
}

/// Cinder's snapshot filters (`resource_filters.json`) and sort keys.
pub(super) const SNAPSHOT_LIST: ListSpec = ListSpec {
    sort_keys: &["created_at", "updated_at", "id", "name", "status", "volume_id", "size"],
    sort_aliases: &[("display_name", "name")],
    filters: &[
        ("name", "name"),
        ("status", "status"),
        ("volume_id", "volume_id"),
        ("metadata", "metadata"),
        ("availability_zone", "availability_zone"),
        ("consumes_quota", "consumes_quota"),
        ("project_id", "project_id"),
    ],
    flags: &["with_count"],
};

/// Cinder's backup filters and sort keys.
pub(super) const BACKUP_LIST: ListSpec = ListSpec {
    sort_keys: &["created_at", "updated_at", "id", "name", "status", "volume_id", "size"],
    sort_aliases: &[("display_name", "name")],
    filters: &[
        ("name", "name"),
        ("status", "status"),
        ("volume_id", "volume_id"),
        ("project_id", "project_id"),
    ],
    flags: &["with_count"],
};

/// `{"snapshots": []}`, with `count` from 3.45 when `with_count=true` is asked.
#[derive(Serialize, JsonSchema)]
struct SnapshotList {
    /// Always empty.
    snapshots: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<i64>,
}

/// `{"backups": []}`, with `count` from 3.45 when `with_count=true` is asked.
#[derive(Serialize, JsonSchema)]
struct BackupList {
    /// Always empty.
    backups: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<i64>,
}

/// The list query of a resource that has nothing: checked as any list's, and a marker, which
/// names nothing here, is 404 as an unknown marker is in every list. `count` when asked.
fn nothing(
    raw: Option<&str>,
    spec: &ListSpec,
    version: Version,
    what: &str,
) -> Result<Option<i64>, ApiError> {
    let q: ListQuery = parse(raw, spec, version)?;
    if let Some(m) = &q.page.marker {
        return Err(ApiError::not_found(format!("Marker {what} {m} could not be found.")));
    }
    let counted = version >= VOLUME_LIST_COUNT
        && q.flags.get("with_count").is_some_and(|v| v.eq_ignore_ascii_case("true"));
    Ok(counted.then_some(0))
}

/// A request to make one, refused once its body has the shape Cinder asks for: `{"<key>":
/// {"volume_id": "<uuid>", ...}}`.
fn refuse_to_make(body: &Value, key: &str, why: &str) -> ApiError {
    let Some(fields) = body.get(key).and_then(Value::as_object) else {
        return ApiError::bad_request(format!("Missing required element '{key}' in request body."));
    };
    match fields.get("volume_id") {
        Some(Value::String(id)) => match uuid_param("volume_id", id) {
            Ok(_) => ApiError::bad_request(format!("Invalid input received: {why}")),
            Err(e) => e,
        },
        _ => ApiError::bad_request(format!(
            "Invalid input for field/attribute {key}. Value: {body}. 'volume_id' is a required property"
        )),
    }
}

async fn list_snapshots(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::SnapshotGetAll)?;
    let count = nothing(raw.as_deref(), &SNAPSHOT_LIST, version, "snapshot")?;
    Ok(Json(SnapshotList { snapshots: Vec::new(), count }).into_response())
}

async fn show_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::SnapshotGet)?;
    Err(ApiError::not_found(format!("Snapshot {id} could not be found.")))
}

async fn delete_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::SnapshotDelete)?;
    Err(ApiError::not_found(format!("Snapshot {id} could not be found.")))
}

async fn create_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::SnapshotCreate)?;
    Err(refuse_to_make(
        &body,
        "snapshot",
        "this service takes no snapshots: its storage drivers have no snapshot call",
    ))
}

async fn list_backups(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::BackupGetAll)?;
    let count = nothing(raw.as_deref(), &BACKUP_LIST, version, "backup")?;
    Ok(Json(BackupList { backups: Vec::new(), count }).into_response())
}

async fn show_backup(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::BackupGet)?;
    Err(ApiError::not_found(format!("Backup {id} could not be found.")))
}

async fn delete_backup(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::BackupDelete)?;
    Err(ApiError::not_found(format!("Backup {id} could not be found.")))
}

async fn create_backup(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::BackupCreate)?;
    Err(refuse_to_make(&body, "backup", "this service makes no backups: no backup service runs here"))
}

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
use super::openapi::{Endpoint, SchemaFn};
use super::policy::Rule;
use super::query::{ListQuery, ListSpec, parse};
use super::{AppState, uuid_param};
use crate::attach::Caller;

pub fn endpoints() -> Vec<Endpoint> {
    let mut out = of(&SNAPSHOTS);
    out.extend(of(&BACKUPS));
    out
}

/// A resource this service has none of, and what its calls say.
struct Absent {
    /// Its list's key and path (`snapshots`), its name in a request body and a marker's message
    /// (`snapshot`), and in a 404's (`Snapshot`).
    plural: &'static str,
    singular: &'static str,
    title: &'static str,
    list: &'static ListSpec,
    /// Why none can be made.
    why: &'static str,
    /// The rules of its list, show, create and delete.
    rules: [Rule; 4],
    /// The paths (the list, its detail, one by id) and their operations' ids and summaries, as
    /// the document names them: list, list with details, show, delete, create.
    paths: [&'static str; 3],
    /// Its list's answer, as the document describes it.
    answer: SchemaFn,
    ids: [&'static str; 5],
    summaries: [&'static str; 5],
}

const SNAPSHOTS: Absent = Absent {
    plural: "snapshots",
    singular: "snapshot",
    title: "Snapshot",
    list: &SNAPSHOT_LIST,
    why: "this service takes no snapshots: its storage drivers have no snapshot call",
    rules: [Rule::SnapshotGetAll, Rule::SnapshotGet, Rule::SnapshotCreate, Rule::SnapshotDelete],
    paths: ["/snapshots", "/snapshots/detail", "/snapshots/{id}"],
    answer: |g| g.subschema_for::<SnapshotList>(),
    ids: ["listSnapshots", "listSnapshotsDetail", "showSnapshot", "deleteSnapshot", "createSnapshot"],
    summaries: [
        "List snapshots: always empty (no driver here takes snapshots)",
        "List snapshots with details: always empty",
        "Show a snapshot: none exists (404)",
        "Delete a snapshot: none exists (404)",
        "Create a snapshot: refused (400), no driver here takes snapshots",
    ],
};

const BACKUPS: Absent = Absent {
    plural: "backups",
    singular: "backup",
    title: "Backup",
    list: &BACKUP_LIST,
    why: "this service makes no backups: no backup service runs here",
    rules: [Rule::BackupGetAll, Rule::BackupGet, Rule::BackupCreate, Rule::BackupDelete],
    paths: ["/backups", "/backups/detail", "/backups/{id}"],
    answer: |g| g.subschema_for::<BackupList>(),
    ids: ["listBackups", "listBackupsDetail", "showBackup", "deleteBackup", "createBackup"],
    summaries: [
        "List backups: always empty (no backup service runs here)",
        "List backups with details: always empty",
        "Show a backup: none exists (404)",
        "Delete a backup: none exists (404)",
        "Create a backup: refused (400), no backup service runs here",
    ],
};

/// The calls of one absent resource.
fn of(a: &'static Absent) -> Vec<Endpoint> {
    let [all, detail, one] = a.paths;
    let [list_id, detail_id, show_id, delete_id, create_id] = a.ids;
    let [list_says, detail_says, show_says, delete_says, create_says] = a.summaries;
    let listed = |path, id, says| {
        Endpoint::get(
            path,
            move |State(state): State<AppState>,
                  Extension(caller): Extension<Caller>,
                  Extension(version): Extension<Version>,
                  RawQuery(raw): RawQuery| async move { list(&state, &caller, version, raw, a) },
            id,
        )
        .summary(a.plural, says)
        .list(a.list)
        .answers_with(StatusCode::OK, "None", a.answer)
    };
    let none = move |rule: Rule| {
        move |State(state): State<AppState>, Extension(caller): Extension<Caller>, Path(id): Path<String>| async move {
            state.authorize(&caller, rule)?;
            Err::<Response, _>(ApiError::not_found(format!("{} {id} could not be found.", a.title)))
        }
    };
    vec![
        listed(all, list_id, list_says),
        listed(detail, detail_id, detail_says),
        Endpoint::get(one, none(a.rules[1]), show_id).summary(a.plural, show_says),
        Endpoint::delete(one, none(a.rules[3]), delete_id).summary(a.plural, delete_says),
        Endpoint::post(
            all,
            move |State(state): State<AppState>,
                  Extension(caller): Extension<Caller>,
                  JsonBody(body): JsonBody<Value>| async move {
                state.authorize(&caller, a.rules[2])?;
                Err::<Response, _>(refuse_to_make(&body, a.singular, a.why))
            },
            create_id,
        )
        .summary(a.plural, create_says)
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

/// The list of a resource that has nothing: its query checked as any list's, and a marker,
/// which names nothing here, 404 as an unknown marker is in every list; `count` when asked.
fn list(
    state: &AppState,
    caller: &Caller,
    version: Version,
    raw: Option<String>,
    a: &Absent,
) -> Result<Response, ApiError> {
    state.authorize(caller, a.rules[0])?;
    let q: ListQuery = parse(raw.as_deref(), a.list, version)?;
    if let Some(m) = &q.page.marker {
        return Err(ApiError::not_found(format!("Marker {} {m} could not be found.", a.singular)));
    }
    let mut body = serde_json::Map::new();
    body.insert(a.plural.to_string(), Value::Array(Vec::new()));
    if version >= VOLUME_LIST_COUNT
        && q.flags.get("with_count").is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        body.insert("count".to_string(), Value::from(0));
    }
    Ok(Json(Value::Object(body)).into_response())
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

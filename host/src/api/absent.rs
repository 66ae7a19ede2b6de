//! Resources this service has none of, answered as a Cinder without them answers: snapshots and
//! backups (`/snapshots`, `/backups`: its driver contract has no snapshot call and no backup
//! service runs here), and groups (`/groups`, `/group_snapshots`, `/group_types`, from 3.13, 3.14
//! and 3.11: its drivers have no group calls). The lists are empty (their filters, paging and
//! microversions checked as every list's), one named by id is 404, and a request to make one is
//! refused with 400 saying why, once its body has the shape Cinder asks for. Clients that list
//! them (`cinder snapshot-list`, `group-list`, `openstack volume snapshot list`, openstacksdk's
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
use super::microversion::{
    GROUP_SNAPSHOTS as GROUP_SNAPSHOTS_SINCE, GROUP_TYPE, GROUP_VOLUME, VOLUME_LIST_COUNT, Version,
};
use super::openapi::{Endpoint, SchemaFn};
use super::policy::Rule;
use super::query::{ListQuery, ListSpec, parse};
use super::{AppState, uuid_param};
use crate::attach::Caller;

pub fn endpoints() -> Vec<Endpoint> {
    [&SNAPSHOTS, &BACKUPS, &GROUPS, &GROUP_SNAPSHOTS, &GROUP_TYPES].into_iter().flat_map(of).collect()
}

/// One call's operation id and summary, as the document names them.
struct Call {
    id: &'static str,
    says: &'static str,
}

/// A resource this service has none of, and what its calls say.
struct Absent {
    /// Its list's key and path (`snapshots`), its name in a request body and a marker's message
    /// (`snapshot`), and in a 404's (`Snapshot`).
    plural: &'static str,
    singular: &'static str,
    title: &'static str,
    filters: &'static ListSpec,
    /// Why none can be made.
    why: &'static str,
    /// The microversion that brought it; below it the routes do not exist (Cinder's 404).
    since: Option<Version>,
    /// The rules of its list, show, create, and delete or actions; `None` where Cinder checks
    /// none (a group type's list and show).
    rules: [Option<Rule>; 4],
    /// Its paths: the list, one by id.
    all: &'static str,
    one: &'static str,
    /// Its calls, each with its path where it has one of its own: the list and its detail (when
    /// it has one), show, `DELETE` one, `POST` one's `/action` (a group's delete is an action),
    /// create, and another path a create is posted to with its body's key (`/groups/action`: a
    /// group made from another).
    list: Call,
    detail: Option<(&'static str, Call)>,
    show: Call,
    delete: Option<Call>,
    action: Option<(&'static str, Call)>,
    create: Call,
    create_from: Option<(&'static str, &'static str, Call)>,
    /// What a create's body must name before it is refused for the reason above (Cinder's
    /// required property: a snapshot's `volume_id`, a group's `group_type`); the other path's
    /// body needs only its key.
    required: &'static str,
    /// What `GET <one>/default` says (group types: Cinder's own message for no default).
    no_default: Option<&'static str>,
    /// Its list's answer, as the document describes it.
    answer: SchemaFn,
}

const SNAPSHOTS: Absent = Absent {
    plural: "snapshots",
    singular: "snapshot",
    title: "Snapshot",
    filters: &SNAPSHOT_LIST,
    why: "this service takes no snapshots: its storage drivers have no snapshot call",
    since: None,
    rules: [
        Some(Rule::SnapshotGetAll),
        Some(Rule::SnapshotGet),
        Some(Rule::SnapshotCreate),
        Some(Rule::SnapshotDelete),
    ],
    all: "/snapshots",
    one: "/snapshots/{id}",
    list: Call { id: "listSnapshots", says: "List snapshots: always empty (no driver here takes snapshots)" },
    detail: Some((
        "/snapshots/detail",
        Call { id: "listSnapshotsDetail", says: "List snapshots with details: always empty" },
    )),
    show: Call { id: "showSnapshot", says: "Show a snapshot: none exists (404)" },
    delete: Some(Call { id: "deleteSnapshot", says: "Delete a snapshot: none exists (404)" }),
    action: None,
    create: Call {
        id: "createSnapshot",
        says: "Create a snapshot: refused (400), no driver here takes snapshots",
    },
    create_from: None,
    required: "volume_id",
    no_default: None,
    answer: |g| g.subschema_for::<SnapshotList>(),
};

const BACKUPS: Absent = Absent {
    plural: "backups",
    singular: "backup",
    title: "Backup",
    filters: &BACKUP_LIST,
    why: "this service makes no backups: no backup service runs here",
    since: None,
    rules: [
        Some(Rule::BackupGetAll),
        Some(Rule::BackupGet),
        Some(Rule::BackupCreate),
        Some(Rule::BackupDelete),
    ],
    all: "/backups",
    one: "/backups/{id}",
    list: Call { id: "listBackups", says: "List backups: always empty (no backup service runs here)" },
    detail: Some((
        "/backups/detail",
        Call { id: "listBackupsDetail", says: "List backups with details: always empty" },
    )),
    show: Call { id: "showBackup", says: "Show a backup: none exists (404)" },
    delete: Some(Call { id: "deleteBackup", says: "Delete a backup: none exists (404)" }),
    action: None,
    create: Call { id: "createBackup", says: "Create a backup: refused (400), no backup service runs here" },
    create_from: None,
    required: "volume_id",
    no_default: None,
    answer: |g| g.subschema_for::<BackupList>(),
};

const NO_GROUPS: &str = "this service makes no groups: its storage drivers have no group calls";

const GROUPS: Absent = Absent {
    plural: "groups",
    singular: "group",
    title: "Group",
    filters: &GROUP_LIST,
    why: NO_GROUPS,
    since: Some(GROUP_VOLUME),
    rules: [Some(Rule::GroupGetAll), Some(Rule::GroupGet), Some(Rule::GroupCreate), Some(Rule::GroupUpdate)],
    all: "/groups",
    one: "/groups/{id}",
    list: Call { id: "listGroups", says: "List groups: always empty (no driver here makes groups)" },
    detail: Some((
        "/groups/detail",
        Call { id: "listGroupsDetail", says: "List groups with details: always empty" },
    )),
    show: Call { id: "showGroup", says: "Show a group: none exists (404)" },
    delete: None,
    action: Some((
        "/groups/{id}/action",
        Call { id: "actOnGroup", says: "Delete, update or reset a group: none exists (404)" },
    )),
    create: Call { id: "createGroup", says: "Create a group: refused (400), no driver here makes groups" },
    create_from: Some((
        "/groups/action",
        "create-from-src",
        Call { id: "createGroupFromSource", says: "Create a group from another: refused (400)" },
    )),
    required: "group_type",
    no_default: None,
    answer: |g| g.subschema_for::<GroupList>(),
};

const GROUP_SNAPSHOTS: Absent = Absent {
    plural: "group_snapshots",
    singular: "group_snapshot",
    title: "GroupSnapshot",
    filters: &GROUP_SNAPSHOT_LIST,
    why: NO_GROUPS,
    since: Some(GROUP_SNAPSHOTS_SINCE),
    rules: [
        Some(Rule::GroupSnapshotGetAll),
        Some(Rule::GroupSnapshotGet),
        Some(Rule::GroupSnapshotCreate),
        Some(Rule::GroupSnapshotDelete),
    ],
    all: "/group_snapshots",
    one: "/group_snapshots/{id}",
    list: Call { id: "listGroupSnapshots", says: "List group snapshots: always empty (no groups here)" },
    detail: Some((
        "/group_snapshots/detail",
        Call { id: "listGroupSnapshotsDetail", says: "List group snapshots with details: always empty" },
    )),
    show: Call { id: "showGroupSnapshot", says: "Show a group snapshot: none exists (404)" },
    delete: Some(Call { id: "deleteGroupSnapshot", says: "Delete a group snapshot: none exists (404)" }),
    action: Some((
        "/group_snapshots/{id}/action",
        Call { id: "actOnGroupSnapshot", says: "Reset a group snapshot's status: none exists (404)" },
    )),
    create: Call {
        id: "createGroupSnapshot",
        says: "Create a group snapshot: refused (400), no groups here",
    },
    create_from: None,
    required: "group_id",
    no_default: None,
    answer: |g| g.subschema_for::<GroupSnapshotList>(),
};

const GROUP_TYPES: Absent = Absent {
    plural: "group_types",
    singular: "group_type",
    title: "Group type",
    filters: &GROUP_TYPE_LIST,
    why: NO_GROUPS,
    since: Some(GROUP_TYPE),
    rules: [None, None, Some(Rule::GroupTypeCreate), Some(Rule::GroupTypeDelete)],
    all: "/group_types",
    one: "/group_types/{id}",
    list: Call { id: "listGroupTypes", says: "List group types: always empty (no groups here)" },
    detail: None,
    show: Call { id: "showGroupType", says: "Show a group type (or `default`): none exists (404)" },
    delete: Some(Call { id: "deleteGroupType", says: "Delete a group type: none exists (404)" }),
    action: None,
    create: Call { id: "createGroupType", says: "Create a group type: refused (400), no groups here" },
    create_from: None,
    required: "name",
    no_default: Some("Default group type can not be found."),
    answer: |g| g.subschema_for::<GroupTypeList>(),
};

/// The calls of one absent resource.
fn of(a: &'static Absent) -> Vec<Endpoint> {
    let since = |e: Endpoint| match a.since {
        Some(v) => e.since(v),
        None => e,
    };
    let listed = |path, call: &'static Call| {
        Endpoint::get(
            path,
            move |State(state): State<AppState>,
                  Extension(caller): Extension<Caller>,
                  Extension(version): Extension<Version>,
                  RawQuery(raw): RawQuery| async move { list(&state, &caller, version, raw, a) },
            call.id,
        )
        .summary(a.plural, call.says)
        .list(a.filters)
        .answers_with(StatusCode::OK, "None", a.answer)
    };
    let none = move |rule: Option<Rule>| {
        move |State(state): State<AppState>, Extension(caller): Extension<Caller>, Path(id): Path<String>| async move {
            if let Some(rule) = rule {
                state.authorize(&caller, rule)?;
            }
            Err::<Response, _>(match a.no_default {
                Some(said) if id == "default" => ApiError::not_found(said),
                _ => ApiError::not_found(format!("{} {id} could not be found.", a.title)),
            })
        }
    };
    let refused =
        move |path: &'static str, key: &'static str, required: Option<&'static str>, call: &'static Call| {
            Endpoint::post(
                path,
                move |State(state): State<AppState>,
                      Extension(caller): Extension<Caller>,
                      JsonBody(body): JsonBody<Value>| async move {
                    if let Some(rule) = a.rules[2] {
                        state.authorize(&caller, rule)?;
                    }
                    Err::<Response, _>(refuse_to_make(&body, key, required, a.why))
                },
                call.id,
            )
            .summary(a.plural, call.says)
            .body::<Value>()
        };
    let mut out = vec![listed(a.all, &a.list)];
    if let Some((path, call)) = &a.detail {
        out.push(listed(path, call));
    }
    out.push(Endpoint::get(a.one, none(a.rules[1]), a.show.id).summary(a.plural, a.show.says));
    if let Some(call) = &a.delete {
        out.push(Endpoint::delete(a.one, none(a.rules[3]), call.id).summary(a.plural, call.says));
    }
    if let Some((path, call)) = &a.action {
        out.push(
            Endpoint::post(path, none(a.rules[3]), call.id).summary(a.plural, call.says).body::<Value>(),
        );
    }
    out.push(refused(a.all, a.singular, Some(a.required), &a.create));
    if let Some((path, key, call)) = &a.create_from {
        out.push(refused(path, key, None, call));
    }
    out.into_iter().map(since).collect()
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

/// Cinder's group filters and sort keys (a group's columns).
pub(super) const GROUP_LIST: ListSpec = ListSpec {
    sort_keys: &["created_at", "updated_at", "id", "name", "status"],
    sort_aliases: &[],
    filters: &[("name", "name"), ("project_id", "project_id")],
    flags: &[],
};

/// Cinder's group snapshot filters and sort keys.
pub(super) const GROUP_SNAPSHOT_LIST: ListSpec = ListSpec {
    sort_keys: &["created_at", "updated_at", "id", "name", "status", "group_id"],
    sort_aliases: &[],
    filters: &[
        ("name", "name"),
        ("status", "status"),
        ("group_id", "group_id"),
        ("project_id", "project_id"),
    ],
    flags: &[],
};

/// A group type list's one filter (an admin's `is_public`) and sort keys.
const GROUP_TYPE_LIST: ListSpec = ListSpec {
    sort_keys: &["created_at", "updated_at", "id", "name"],
    sort_aliases: &[],
    filters: &[],
    flags: &["is_public"],
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

/// `{"groups": []}`.
#[derive(Serialize, JsonSchema)]
struct GroupList {
    /// Always empty.
    groups: Vec<Value>,
}

/// `{"group_snapshots": []}`.
#[derive(Serialize, JsonSchema)]
struct GroupSnapshotList {
    /// Always empty.
    group_snapshots: Vec<Value>,
}

/// `{"group_types": []}`.
#[derive(Serialize, JsonSchema)]
struct GroupTypeList {
    /// Always empty.
    group_types: Vec<Value>,
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
    if let Some(rule) = a.rules[0] {
        state.authorize(caller, rule)?;
    }
    let q: ListQuery = parse(raw.as_deref(), a.filters, version)?;
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
/// {"<required>": ..., ...}}`, a volume's or a group's id a UUID.
fn refuse_to_make(body: &Value, key: &str, required: Option<&str>, why: &str) -> ApiError {
    let Some(fields) = body.get(key).and_then(Value::as_object) else {
        return ApiError::bad_request(format!("Missing required element '{key}' in request body."));
    };
    let refused = ApiError::bad_request(format!("Invalid input received: {why}"));
    let Some(required) = required else { return refused };
    match fields.get(required) {
        Some(Value::String(id)) if required.ends_with("_id") => match uuid_param(required, id) {
            Ok(_) => refused,
            Err(e) => e,
        },
        Some(Value::String(_)) => refused,
        _ => ApiError::bad_request(format!(
            "Invalid input for field/attribute {key}. Value: {body}. '{required}' is a required property"
        )),
    }
}

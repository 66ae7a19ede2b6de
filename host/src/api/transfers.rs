//! `/v3/{project_id}/os-volume-transfer` (and `/volume-transfers` from 3.55): Cinder's volume
//! transfers (`cinder transfer-create`, `transfer-accept`, `transfer-list`, `transfer-show`,
//! `transfer-delete`; `openstack volume transfer request ...`). The flows are
//! `attach/transfers.rs`'s.

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::body::JsonBody;
use super::error::ApiError;
use super::microversion::{MIN, TRANSFER_PROJECTS, VOLUME_TRANSFERS, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::query::param;
use super::views::{Link, Links, timestamp};
use super::volumes::links;
use super::{AppState, uuid_param};
use crate::attach::Caller;
use crate::store::transfers::Transfer;

/// The paths and operation ids of one name of the transfers' resource.
struct Names {
    since: Version,
    base: &'static str,
    detail: &'static str,
    one: &'static str,
    accept: &'static str,
    /// create, list, list in detail, show, accept, delete.
    ids: [&'static str; 6],
}

const NAMES: [Names; 2] = [
    Names {
        since: MIN,
        base: "/os-volume-transfer",
        detail: "/os-volume-transfer/detail",
        one: "/os-volume-transfer/{id}",
        accept: "/os-volume-transfer/{id}/accept",
        ids: [
            "createVolumeTransfer",
            "listVolumeTransfers",
            "listVolumeTransfersDetail",
            "showVolumeTransfer",
            "acceptVolumeTransfer",
            "deleteVolumeTransfer",
        ],
    },
    Names {
        since: VOLUME_TRANSFERS,
        base: "/volume-transfers",
        detail: "/volume-transfers/detail",
        one: "/volume-transfers/{id}",
        accept: "/volume-transfers/{id}/accept",
        ids: [
            "createVolumeTransferNew",
            "listVolumeTransfersNew",
            "listVolumeTransfersDetailNew",
            "showVolumeTransferNew",
            "acceptVolumeTransferNew",
            "deleteVolumeTransferNew",
        ],
    },
];

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "volume transfers";
    let mut out = Vec::new();
    for n in &NAMES {
        let [create_id, list_id, detail_id, show_id, accept_id, delete_id] = n.ids;
        out.extend([
            Endpoint::post(n.base, create, create_id)
                .since(n.since)
                .summary(TAG, "Offer an available volume to another project; the answer holds the key")
                .body::<CreateBody>()
                .answers::<TransferBody>(StatusCode::ACCEPTED, "The transfer, with its key"),
            Endpoint::get(n.base, index, list_id)
                .since(n.since)
                .summary(TAG, "List the project's transfers")
                .query("all_tenants", "Every project's (admins only).")
                .answers::<TransferList>(StatusCode::OK, "The transfers"),
            Endpoint::get(n.detail, detail, detail_id)
                .since(n.since)
                .summary(TAG, "List the project's transfers with details")
                .query("all_tenants", "Every project's (admins only).")
                .answers::<TransferList>(StatusCode::OK, "The transfers"),
            Endpoint::get(n.one, show, show_id)
                .since(n.since)
                .summary(TAG, "Show a transfer")
                .answers::<TransferBody>(StatusCode::OK, "The transfer"),
            Endpoint::post(n.accept, accept, accept_id)
                .since(n.since)
                .summary(TAG, "Take the volume over with the transfer's key (any project)")
                .body::<AcceptBody>()
                .answers::<TransferBody>(StatusCode::ACCEPTED, "The transfer accepted"),
            Endpoint::delete(n.one, remove, delete_id)
                .since(n.since)
                .summary(TAG, "Withdraw a transfer: the volume is available to its project again")
                .answers_empty(StatusCode::ACCEPTED, "Withdrawn"),
        ]);
    }
    out
}

/// `{"transfer": {"volume_id": "...", "name": "..."}}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    transfer: NewTransfer,
}

#[derive(Deserialize, JsonSchema)]
struct NewTransfer {
    volume_id: String,
    name: Option<String>,
    /// 3.55: whether the volume's snapshots stay behind. Berth has no snapshots: ignored.
    #[allow(dead_code)]
    no_snapshots: Option<serde_json::Value>,
}

/// `{"accept": {"auth_key": "..."}}`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AcceptBody {
    accept: Accept,
}

#[derive(Deserialize, JsonSchema)]
struct Accept {
    auth_key: String,
}

#[derive(Serialize, JsonSchema)]
struct TransferBody {
    transfer: TransferView,
}

#[derive(Serialize, JsonSchema)]
struct TransferList {
    transfers: Vec<TransferView>,
}

/// A transfer, as Cinder shows it: `created_at` in details, the key when it is made, and from
/// 3.57 its projects (no destination, not accepted: an accepted transfer is gone).
#[derive(Serialize, JsonSchema)]
struct TransferView {
    id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    created_at: Option<String>,
    name: Option<String>,
    volume_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    auth_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    destination_project_id: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    accepted: Option<bool>,
    links: Vec<Link>,
}

fn view(t: &Transfer, detailed: bool, version: Version, links: &Links) -> TransferView {
    let projects = detailed && version >= TRANSFER_PROJECTS;
    TransferView {
        id: t.id.clone(),
        created_at: detailed.then(|| timestamp(t.created_at)),
        name: t.name.clone(),
        volume_id: t.volume_id.clone(),
        auth_key: None,
        source_project_id: projects.then(|| t.source_project_id.clone()),
        destination_project_id: projects.then_some(None),
        accepted: projects.then_some(false),
        links: links.of(&t.source_project_id, "os-volume-transfer", &t.id),
    }
}

async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CreateBody>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TransferCreate)?;
    uuid_param("volume_id", &body.transfer.volume_id)?;
    let offered =
        state.service.transfers().create(&caller, &body.transfer.volume_id, body.transfer.name).await?;
    let mut v = view(&offered.transfer, true, version, &links(&state, &headers));
    v.auth_key = Some(offered.auth_key);
    Ok((StatusCode::ACCEPTED, Json(TransferBody { transfer: v })).into_response())
}

async fn list(
    state: &AppState,
    caller: &Caller,
    raw: Option<&str>,
    detailed: bool,
    version: Version,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    state.authorize(caller, Rule::TransferGetAll)?;
    let all = caller.is_admin() && param(raw, "all_tenants").is_some();
    let scope = if all { crate::domain::list::Scope::All } else { caller.own_project() };
    let links = links(state, headers);
    let transfers = state.service.transfers().list(scope).await?;
    let transfers = transfers.iter().map(|t| view(t, detailed, version, &links)).collect();
    Ok(Json(TransferList { transfers }).into_response())
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, raw.as_deref(), false, version, &headers).await
}

async fn detail(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    list(&state, &caller, raw.as_deref(), true, version, &headers).await
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TransferGet)?;
    uuid_param("transfer_id", &id)?;
    let t = state.service.transfers().show(&caller, &id).await?;
    Ok(Json(TransferBody { transfer: view(&t, true, version, &links(&state, &headers)) }).into_response())
}

async fn accept(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<AcceptBody>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TransferAccept)?;
    uuid_param("transfer_id", &id)?;
    let t = state.service.transfers().accept(&caller, &id, &body.accept.auth_key).await?;
    let v = view(&t, false, version, &links(&state, &headers));
    Ok((StatusCode::ACCEPTED, Json(TransferBody { transfer: v })).into_response())
}

async fn remove(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::TransferDelete)?;
    uuid_param("transfer_id", &id)?;
    state.service.transfers().delete(&caller, &id).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

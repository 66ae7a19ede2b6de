//! `GET /v3/{project_id}/scheduler-stats/get_pools`: the pools new volumes may go to, as Cinder's
//! scheduler lists them (`cinder get-pools`, `openstack volume backend pool list`), admins only.
//! Each backend that takes new volumes now is one pool (`attach/services.rs`): with `detail`,
//! its capabilities in Cinder's keys. A backend whose volumes are sparse files in its node's data
//! directory (`tgt-iscsi`) shows that filesystem's size and free space (`total_capacity_gb`,
//! `free_capacity_gb`, as its node last published them), thin provisioning and its
//! `max_over_subscription_ratio`; other drivers do not report their capacity (the contract has no
//! call for it), so theirs are `unknown`, as Cinder drivers say when they cannot tell;
//! `allocated_capacity_gb` is what the volumes Berth made there add up to. Filters: `name` from
//! 3.28, `volume_type` (name or id) from 3.35. And
//! `GET /capabilities/{host}` (`cinder get-capabilities`): a backend's driver and the properties
//! a volume type may ask of it.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::AppState;
use super::error::ApiError;
use super::microversion::{POOL_FILTER, POOL_TYPE_FILTER, Version};
use super::openapi::Endpoint;
use super::policy::Rule;
use super::views::timestamp;
use crate::attach::Caller;
use crate::attach::services::Pool;

/// The filters a list of pools takes (`name` from 3.28, `volume_type` from 3.35).
pub const FILTERS: [&str; 2] = ["name", "volume_type"];

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/scheduler-stats/get_pools", index, "listPools")
            .summary(
                "pools",
                "The pools new volumes may go to: each backend that takes them now (admins only)",
            )
            .query("detail", "`true`: each pool with its capabilities.")
            .query("name", "From 3.28: only the pool of this name (`host@backend#backend`).")
            .query("volume_type", "From 3.35: only the pools of this volume type (name or id).")
            .answers::<PoolList>(StatusCode::OK, "The pools"),
        Endpoint::get("/capabilities/{id}", capabilities_of, "showBackendCapabilities")
            .summary(
                "pools",
                "A backend's capabilities (`node@backend`, or a shared one's `berth@backend`; admins only)",
            )
            .answers::<BackendCapabilities>(StatusCode::OK, "The capabilities"),
    ]
}

/// A backend's capabilities, as `cinder get-capabilities` prints them: its driver, and the
/// properties a volume type's extra specs may ask of it.
#[derive(Serialize, JsonSchema)]
struct BackendCapabilities {
    namespace: String,
    vendor_name: String,
    volume_backend_name: String,
    pool_name: String,
    driver_version: String,
    storage_protocol: String,
    display_name: String,
    description: Option<String>,
    visibility: Option<String>,
    replication_targets: Vec<String>,
    properties: std::collections::BTreeMap<String, Property>,
}

/// A property a volume type may ask for.
#[derive(Serialize, JsonSchema)]
struct Property {
    title: String,
    description: String,
    #[serde(rename = "type")]
    kind: String,
}

async fn capabilities_of(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(host): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::Capabilities)?;
    let services = state.service.services().await?;
    let runs = services
        .into_iter()
        .filter(|s| s.binary == crate::attach::services::VOLUME_BINARY)
        .find(|s| s.host == host || s.cluster.as_deref() == Some(host.as_str()))
        .and_then(|s| s.runs.map(|r| (s.host, r)));
    let Some((service, runs)) = runs else {
        return Err(ApiError::not_found(format!("Can't find service: {host}")));
    };
    let backend = service.split_once('@').map_or(service.as_str(), |(_, b)| b).to_string();
    let multiattach = Property {
        title: "Multiattach".into(),
        description: if runs.multiattach {
            "Volumes of a type with `multiattach = <is> True` may be attached to several hosts at once."
        } else {
            "This driver attaches a volume to one host at a time: no type of it may be multiattach."
        }
        .into(),
        kind: "boolean".into(),
    };
    Ok(Json(BackendCapabilities {
        namespace: format!("OS::Storage::Capabilities::{host}"),
        vendor_name: runs.vendor.clone(),
        volume_backend_name: backend.clone(),
        pool_name: backend,
        driver_version: format!("{} {}", runs.driver, runs.version).trim().to_string(),
        storage_protocol: runs.protocols.first().cloned().unwrap_or_else(|| "unknown".into()),
        display_name: format!("Capabilities of the Berth driver {}", runs.driver),
        description: None,
        visibility: None,
        replication_targets: Vec::new(),
        properties: [("multiattach".to_string(), multiattach)].into(),
    })
    .into_response())
}

/// `{"pools": [...]}`.
#[derive(Serialize, JsonSchema)]
struct PoolList {
    pools: Vec<PoolView>,
}

#[derive(Serialize, JsonSchema)]
struct PoolView {
    /// `node@backend#backend`, or `berth@backend#backend` for a shared backend.
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    capabilities: Option<Capabilities>,
}

/// A pool's capabilities, in the keys of Cinder's driver stats.
#[derive(Serialize, JsonSchema)]
struct Capabilities {
    pool_name: String,
    volume_backend_name: String,
    vendor_name: String,
    /// The driver's name and version.
    driver_version: String,
    /// `iSCSI`, `ceph`, ... (the first the driver speaks).
    storage_protocol: String,
    /// GiB (two decimals) of the filesystem a backend's sparse files are on; `unknown` for a
    /// backend whose driver keeps its volumes elsewhere (the contract has no call for its
    /// capacity).
    total_capacity_gb: Capacity,
    /// What of it is free.
    free_capacity_gb: Capacity,
    /// The GiB of the volumes Berth made there.
    allocated_capacity_gb: i64,
    provisioned_capacity_gb: i64,
    total_volumes: i64,
    reserved_percentage: u32,
    /// Sparse files: thin (with a filesystem), as far as Berth knows.
    thin_provisioning_support: bool,
    thick_provisioning_support: bool,
    /// How many times the filesystem's size the volumes may add up to (sparse files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_over_subscription_ratio: Option<String>,
    multiattach: bool,
    /// Attached volumes may be extended (3.42's `os-extend` of an `in-use` volume).
    online_extend_support: bool,
    #[serde(rename = "QoS_support")]
    qos_support: bool,
    backend_state: String,
    /// The newest heartbeat of the nodes that serve it.
    timestamp: String,
    /// Berth's: the volume types that lead to it.
    volume_types: Vec<String>,
}

/// A capacity in GiB, or `unknown`.
#[derive(Serialize, JsonSchema)]
#[serde(untagged)]
enum Capacity {
    Gib(f64),
    Unknown(String),
}

impl Capacity {
    fn of(bytes: Option<u64>) -> Capacity {
        match bytes {
            Some(b) => Capacity::Gib((crate::domain::capacity::gib(b) * 100.0).round() / 100.0),
            None => Capacity::Unknown("unknown".into()),
        }
    }
}

fn capabilities(p: &Pool) -> Capabilities {
    let fs = p.runs.filesystem.as_ref();
    Capabilities {
        pool_name: p.backend.clone(),
        volume_backend_name: p.backend.clone(),
        vendor_name: p.runs.vendor.clone(),
        driver_version: format!("{} {}", p.runs.driver, p.runs.version).trim().to_string(),
        storage_protocol: p.runs.protocols.first().cloned().unwrap_or_else(|| "unknown".into()),
        total_capacity_gb: Capacity::of(fs.map(|f| f.total_bytes)),
        free_capacity_gb: Capacity::of(fs.map(|f| f.free_bytes)),
        allocated_capacity_gb: p.allocated_gib,
        provisioned_capacity_gb: p.allocated_gib,
        total_volumes: p.volumes,
        reserved_percentage: fs.map(|f| f.reserved_percentage).unwrap_or(0),
        thin_provisioning_support: fs.is_some(),
        thick_provisioning_support: false,
        max_over_subscription_ratio: fs.map(|f| f.max_over_subscription_ratio.clone()),
        multiattach: p.runs.multiattach,
        online_extend_support: p.runs.online_extend,
        qos_support: false,
        backend_state: "up".into(),
        timestamp: timestamp(p.updated_at),
        volume_types: p.volume_types.clone(),
    }
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(version): Extension<Version>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::GetPools)?;
    let mut detail = false;
    let (mut name, mut volume_type) = (None, None);
    for (key, value) in form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "detail" => detail = super::volumes::boolean("detail", &value)?,
            // Below 3.28 Cinder ignores every filter.
            _ if version < POOL_FILTER => {}
            "name" => name = Some(value.into_owned()),
            "volume_type" if version >= POOL_TYPE_FILTER => volume_type = Some(value.into_owned()),
            other => return Err(ApiError::bad_request(format!("Invalid filters {other} are provided."))),
        }
    }
    let backend = match &volume_type {
        Some(t) => {
            let types = &state.service.catalog().types;
            let Some(found) = types.iter().find(|x| x.name == *t || x.id == *t) else {
                return Err(ApiError::not_found(format!("Volume type with name {t} could not be found.")));
            };
            Some(found.backend.clone())
        }
        None => None,
    };
    let pools = state
        .service
        .pools()
        .await?
        .into_iter()
        .filter(|p| {
            name.as_ref().is_none_or(|n| *n == p.name) && backend.as_ref().is_none_or(|b| *b == p.backend)
        })
        .map(|p| PoolView { capabilities: detail.then(|| capabilities(&p)), name: p.name })
        .collect();
    Ok(Json(PoolList { pools }).into_response())
}

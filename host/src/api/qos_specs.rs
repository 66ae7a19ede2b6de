//! `/v3/{project_id}/qos-specs`: the configured QoS specs (`[[qos_specs]]`) and the volume types
//! associated with each (`cinder qos-list`, `qos-show`, `qos-get-association`), for admins, as in
//! Cinder. Like the types, they are Berth's configuration, so there is no call that makes,
//! changes or associates them; what volumes of a type get from its specs is in
//! `attach/connect.rs` (`Additions`).

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::AppState;
use super::error::ApiError;
use super::openapi::Endpoint;
use super::policy::Rule;
use super::views::{Link, Links};
use super::volumes::links;
use crate::attach::Caller;
use crate::domain::qos::{QosConsumer, QosSpecs};

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "qos specs";
    vec![
        Endpoint::get("/qos-specs", index, "listQosSpecs")
            .summary(TAG, "List the QoS specs (admins)")
            .answers::<QosSpecsList>(StatusCode::OK, "The QoS specs, by name"),
        Endpoint::get("/qos-specs/{id}", show, "showQosSpecs")
            .summary(TAG, "Show a set of QoS specs (admins)")
            .answers::<QosSpecsBody>(StatusCode::OK, "The QoS specs"),
        Endpoint::get("/qos-specs/{id}/associations", associations, "listQosSpecsAssociations")
            .summary(TAG, "The volume types associated with a set of QoS specs (admins)")
            .answers::<Associations>(StatusCode::OK, "The associations"),
    ]
}

/// A set of QoS specs.
#[derive(Serialize, JsonSchema)]
struct QosSpecsView {
    id: String,
    name: String,
    /// Who enforces them; `front-end` and `both` travel with each connection (`qos_specs`).
    consumer: QosConsumer,
    specs: BTreeMap<String, String>,
}

/// `{"qos_specs": [...]}`.
#[derive(Serialize, JsonSchema)]
struct QosSpecsList {
    qos_specs: Vec<QosSpecsView>,
}

/// `{"qos_specs": {...}, "links": [...]}`.
#[derive(Serialize, JsonSchema)]
struct QosSpecsBody {
    qos_specs: QosSpecsView,
    links: Vec<Link>,
}

/// `{"qos_associations": [...]}`.
#[derive(Serialize, JsonSchema)]
struct Associations {
    qos_associations: Vec<Association>,
}

/// A volume type associated with the specs.
#[derive(Serialize, JsonSchema)]
struct Association {
    /// `volume_type`.
    association_type: &'static str,
    name: String,
    id: String,
}

fn view(q: &QosSpecs) -> QosSpecsView {
    QosSpecsView { id: q.id.clone(), name: q.name.clone(), consumer: q.consumer, specs: q.specs.clone() }
}

/// The specs of id `id`, or Cinder's 404.
fn find<'a>(state: &'a AppState, id: &str) -> Result<&'a QosSpecs, ApiError> {
    state
        .service
        .catalog()
        .qos_specs
        .iter()
        .find(|q| q.id == id)
        .ok_or_else(|| ApiError::not_found(format!("QoS Specs {id} could not be found.")))
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QosSpecsGetAll)?;
    let mut qos_specs: Vec<QosSpecsView> = state.service.catalog().qos_specs.iter().map(view).collect();
    qos_specs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(QosSpecsList { qos_specs }).into_response())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QosSpecsGet)?;
    let q = find(&state, &id)?;
    let links: Links = links(&state, &headers);
    let body = QosSpecsBody { qos_specs: view(q), links: links.of(&caller.project_id, "qos-specs", &q.id) };
    Ok(Json(body).into_response())
}

async fn associations(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::QosSpecsGetAll)?;
    let q = find(&state, &id)?;
    let qos_associations = (state.service.catalog().types.iter())
        .filter(|t| t.qos_specs.as_ref().is_some_and(|s| s.id == q.id))
        .map(|t| Association { association_type: "volume_type", name: t.name.clone(), id: t.id.clone() })
        .collect();
    Ok(Json(Associations { qos_associations }).into_response())
}

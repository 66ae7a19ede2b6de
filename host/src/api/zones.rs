//! `/v3/{project_id}/os-availability-zone`: the one availability zone, `nova`, as Cinder lists
//! its zones (`cinder availability-zone-list`; Nova's `[cinder] cross_az_attach = false` compares
//! an instance's zone with its volumes'). Every volume and every backend of Berth is in it.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use schemars::JsonSchema;
use serde::Serialize;

use super::AppState;
use super::error::ApiError;
use super::openapi::Endpoint;
use super::policy::Rule;
use crate::attach::Caller;

/// The zone of every volume and backend, Cinder's default zone's name.
pub const ZONE: &str = "nova";

pub fn endpoints() -> Vec<Endpoint> {
    vec![
        Endpoint::get("/os-availability-zone", index, "listAvailabilityZones")
            .summary("availability zones", "List the availability zones (one: `nova`)")
            .answers::<ZoneList>(StatusCode::OK, "The zones"),
    ]
}

/// `{"availabilityZoneInfo": [...]}`.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct ZoneList {
    availability_zone_info: Vec<Zone>,
}

#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct Zone {
    zone_name: String,
    zone_state: ZoneState,
}

#[derive(Serialize, JsonSchema)]
struct ZoneState {
    available: bool,
}

async fn index(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    state.authorize(&caller, Rule::AvailabilityZoneList)?;
    let zone = Zone { zone_name: ZONE.into(), zone_state: ZoneState { available: true } };
    Ok(Json(ZoneList { availability_zone_info: vec![zone] }).into_response())
}

//! Version discovery: `GET /` (300 Multiple Choices) and `GET /v3/` (200; `GET /v3` redirects
//! there), with Cinder's
//! `versions` document (`cinder/api/views/versions.py`). Clients read `version`/`min_version` of
//! the entry whose version starts with "3." to choose their microversion.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::{Value, json};

use super::AppState;
use super::microversion::{MAX, MIN};

fn document(state: &AppState, headers: &HeaderMap) -> Value {
    let base = super::volumes::links(state, headers).base;
    json!({ "versions": [{
        "id": "v3.0",
        "status": "CURRENT",
        "version": MAX.to_string(),
        "min_version": MIN.to_string(),
        "updated": "2026-11-21T00:00:00Z",
        "links": [
            {"rel": "describedby", "type": "text/html", "href": "https://docs.openstack.org/"},
            {"rel": "self", "href": format!("{base}/v3/")},
        ],
        "media-types": [{"base": "application/json", "type": "application/vnd.openstack.volume+json;version=3"}],
    }]})
}

pub async fn root(State(state): State<AppState>, headers: HeaderMap) -> Response {
    (StatusCode::MULTIPLE_CHOICES, Json(document(&state, &headers))).into_response()
}

pub async fn v3(State(state): State<AppState>, headers: HeaderMap) -> Response {
    Json(document(&state, &headers)).into_response()
}

/// `GET /v3`: redirected to `/v3/` as Cinder's router does (302, an absolute `Location`, which
/// keystoneauth's version discovery needs to follow it).
pub async fn v3_redirect(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let base = super::volumes::links(&state, &headers).base;
    let mut r = Redirect::to(&format!("{base}/v3/")).into_response();
    *r.status_mut() = StatusCode::FOUND;
    r.headers_mut().insert(header::CACHE_CONTROL, "no-cache".parse().expect("static header"));
    r
}

pub async fn healthcheck() -> &'static str {
    "OK"
}

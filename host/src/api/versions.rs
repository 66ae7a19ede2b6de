//! Version discovery: `GET /` (300 Multiple Choices) and `GET /v3/` (200; `GET /v3` redirects
//! there), with Cinder's
//! `versions` document (`cinder/api/views/versions.py`). Clients read `version`/`min_version` of
//! the entry whose version starts with "3." to choose their microversion.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use schemars::JsonSchema;
use serde::Serialize;

use super::AppState;
use super::microversion::{MAX, MIN};
use super::openapi::Endpoint;

pub fn endpoints() -> Vec<Endpoint> {
    const TAG: &str = "versions";
    vec![
        Endpoint::get("/", root, "listVersions")
            .summary(TAG, "The API versions (300 Multiple Choices, as Cinder)")
            .unversioned()
            .answers::<Versions>(StatusCode::MULTIPLE_CHOICES, "The versions"),
        Endpoint::get("/v3", v3_redirect, "redirectV3")
            .summary(TAG, "Redirects to `/v3/`")
            .unversioned()
            .answers_empty(StatusCode::FOUND, "See `Location`"),
        Endpoint::get("/v3/", v3, "showV3")
            .summary(TAG, "The v3 API: its microversions")
            .unversioned()
            .answers::<Versions>(StatusCode::OK, "The version"),
        Endpoint::get("/healthcheck", healthcheck, "healthcheck")
            .summary(TAG, "Whether the service answers")
            .unversioned()
            .media_type("text/plain")
            .answers::<String>(StatusCode::OK, "`OK`"),
    ]
}

/// `{"versions": [...]}`.
#[derive(Serialize, JsonSchema)]
pub struct Versions {
    versions: Vec<VersionEntry>,
}

#[derive(Serialize, JsonSchema)]
struct VersionEntry {
    id: String,
    status: String,
    /// The highest microversion.
    version: String,
    /// The lowest microversion.
    min_version: String,
    updated: String,
    links: Vec<VersionLink>,
    #[serde(rename = "media-types")]
    media_types: Vec<MediaType>,
}

#[derive(Serialize, JsonSchema)]
struct VersionLink {
    rel: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    href: String,
}

#[derive(Serialize, JsonSchema)]
struct MediaType {
    base: String,
    #[serde(rename = "type")]
    media_type: String,
}

fn document(state: &AppState, headers: &HeaderMap) -> Versions {
    let base = super::volumes::links(state, headers).base;
    Versions {
        versions: vec![VersionEntry {
            id: "v3.0".into(),
            status: "CURRENT".into(),
            version: MAX.to_string(),
            min_version: MIN.to_string(),
            updated: "2026-11-21T00:00:00Z".into(),
            links: vec![
                VersionLink {
                    rel: "describedby".into(),
                    media_type: Some("text/html".into()),
                    href: "https://docs.openstack.org/".into(),
                },
                VersionLink { rel: "self".into(), media_type: None, href: format!("{base}/v3/") },
            ],
            media_types: vec![MediaType {
                base: "application/json".into(),
                media_type: "application/vnd.openstack.volume+json;version=3".into(),
            }],
        }],
    }
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

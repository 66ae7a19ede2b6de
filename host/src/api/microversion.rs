//! Microversions (`OpenStack-API-Version: volume X.Y`), as Cinder negotiates them
//! (`cinder/api/openstack/wsgi.py`, `Request.set_api_version_request`): no header means 3.0,
//! `latest` means the maximum, a malformed value is a 400, one outside the range a 406, and a call
//! below its minimum a 404. Every v3 response says which version answered, and `Vary`.

use std::fmt;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

pub const HEADER: HeaderName = HeaderName::from_static("openstack-api-version");

/// A microversion `3.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    pub const fn new(major: u32, minor: u32) -> Self {
        Version { major, minor }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The lowest version served.
pub const MIN: Version = Version::new(3, 0);
/// The highest version, Cinder 29's: every change up to it that concerns volumes and
/// attachments is implemented (the attachments API 3.27, `os-complete` 3.44,
/// `shared_targets`/`service_uuid` 3.48, the attachment `mode` 3.54, time filters 3.60,
/// `cluster_name` 3.61, `volume_type_id` 3.63, `consumes_quota` 3.65, a `null` `shared_targets`
/// 3.69), and the actions of resources Berth does not have (`os-reimage` 3.68,
/// `os-extend_volume_completion` 3.71) answer as Cinder does for a backend without them.
/// So are the resources of Berth's own that came with a version (transfers 3.55, default types
/// 3.62, clusters 3.7, log levels 3.32, resource filters 3.33). Versions that change only
/// resources Berth does not serve (snapshots, backups, groups) change nothing here.
pub const MAX: Version = Version::new(3, 71);

// Versions where behaviour changes.

/// The `glance_metadata` and `group_id` volume filters (Berth's volumes have neither).
pub const VOLUME_LIST_GLANCE_METADATA: Version = Version::new(3, 4);
pub const VOLUME_LIST_GROUP: Version = Version::new(3, 10);
/// `GET /volumes/summary`, and its metadata.
pub const VOLUME_SUMMARY: Version = Version::new(3, 12);
/// User messages (`/messages`), and from 3.5 their lists paged, sorted and filtered.
pub const MESSAGES: Version = Version::new(3, 3);
pub const VOLUME_SUMMARY_METADATA: Version = Version::new(3, 36);
/// An admin's `project_id` on `GET /limits`.
pub const LIMITS_OF_A_PROJECT: Version = Version::new(3, 39);
pub const NEW_ATTACH: Version = Version::new(3, 27);
pub const RESOURCE_FILTER: Version = Version::new(3, 31);
/// `GET /resource_filters`: the filters each list takes.
pub const RESOURCE_FILTER_CONFIG: Version = Version::new(3, 33);
/// `/clusters` (a shared backend's nodes together), and their replication fields from 3.26.
pub const CLUSTER_SUPPORT: Version = Version::new(3, 7);
pub const REPLICATION_CLUSTER: Version = Version::new(3, 26);
/// `os-services/set-log` and `get-log`: log levels changed while serving.
pub const LOG_LEVEL: Version = Version::new(3, 32);
/// `/default-types`: a project's own default volume type.
pub const DEFAULT_TYPE_OVERRIDES: Version = Version::new(3, 62);
/// `get_pools` takes filters (`name`) from 3.28, and `volume_type` from 3.35.
pub const POOL_FILTER: Version = Version::new(3, 28);
pub const POOL_TYPE_FILTER: Version = Version::new(3, 35);
/// `os-extend` grows an attached (`in-use`) volume too.
pub const VOLUME_EXTEND_INUSE: Version = Version::new(3, 42);
pub const NEW_ATTACH_COMPLETION: Version = Version::new(3, 44);
pub const VOLUME_LIST_COUNT: Version = Version::new(3, 45);
pub const SHARED_TARGETS: Version = Version::new(3, 48);
/// A volume service's `backend_state` in `GET /os-services`.
pub const BACKEND_STATE_REPORT: Version = Version::new(3, 49);
/// A volume update must change something (Cinder's `SUPPORT_VOLUME_SCHEMA_CHANGES`).
pub const VOLUME_SCHEMA_CHANGES: Version = Version::new(3, 53);
pub const ATTACHMENT_CREATE_MODE: Version = Version::new(3, 54);
/// `/volume-transfers`, the transfers' new name (`/os-volume-transfer` stays).
pub const VOLUME_TRANSFERS: Version = Version::new(3, 55);
/// A transfer's detail names its projects and whether it was accepted.
pub const TRANSFER_PROJECTS: Version = Version::new(3, 57);
pub const TIME_COMPARISON_FILTERS: Version = Version::new(3, 60);
pub const CLUSTER_NAME: Version = Version::new(3, 61);
pub const VOLUME_TYPE_ID: Version = Version::new(3, 63);
pub const CONSUMES_QUOTA: Version = Version::new(3, 65);
pub const REIMAGE: Version = Version::new(3, 68);
pub const SHARED_TARGETS_TRISTATE: Version = Version::new(3, 69);
pub const EXTEND_VOLUME_COMPLETION: Version = Version::new(3, 71);
pub const GROUP_ID: Version = Version::new(3, 13);
/// Cinder's group types, groups and group snapshots (always empty here, `absent.rs`).
pub const GROUP_TYPE: Version = Version::new(3, 11);
pub const GROUP_VOLUME: Version = Version::new(3, 13);
pub const GROUP_SNAPSHOTS: Version = Version::new(3, 14);
pub const PROVIDER_ID: Version = Version::new(3, 21);

/// Parses the header's value; `Ok(None)` when it has no `volume` entry (the caller treats a
/// missing entry as a bad request, as Cinder does).
pub fn parse(header_value: &str) -> Result<Version, ApiError> {
    let Some(entry) = header_value.split(',').map(str::trim).find(|e| e.contains("volume")) else {
        return Err(ApiError::bad_request(format!(
            "OpenStack-API-Version header {header_value:?} has no \"volume X.Y\" entry."
        )));
    };
    let mut words = entry.split_whitespace();
    let (service, value) = (words.next(), words.next());
    if service != Some("volume") || words.next().is_some() {
        return Err(invalid_format(entry));
    }
    let value = value.ok_or_else(|| invalid_format(entry))?;
    if value == "latest" {
        return Ok(MAX);
    }
    let (major, minor) = value.split_once('.').ok_or_else(|| invalid_format(value))?;
    let number = |s: &str, zero_ok: bool| -> Option<u32> {
        let valid = !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" && zero_ok || !s.starts_with('0'))
            && s.len() <= 6;
        valid.then(|| s.parse().ok()).flatten()
    };
    match (number(major, false), number(minor, true)) {
        (Some(major), Some(minor)) => Ok(Version::new(major, minor)),
        _ => Err(invalid_format(value)),
    }
}

fn invalid_format(value: &str) -> ApiError {
    ApiError::bad_request(format!(
        "API Version String {value} is of invalid format. Must be of format MajorNum.MinorNum."
    ))
}

/// Middleware for `/v3`: negotiates the version, stores it in the request, and stamps the
/// response with it.
pub async fn negotiate(mut request: Request, next: Next) -> Response {
    let version = match request.headers().get(HEADER) {
        None => MIN,
        Some(value) => match value.to_str().map_err(|_| invalid_format("(not text)")).and_then(parse) {
            Ok(v) => v,
            Err(e) => return e.into_response(),
        },
    };
    if version < MIN || version > MAX {
        let mut response = ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            format!("Version {version} is not supported by the API. Minimum is {MIN} and maximum is {MAX}."),
        )
        .into_response();
        stamp(&mut response, version);
        return response;
    }
    request.extensions_mut().insert(version);
    let mut response = next.run(request).await;
    stamp(&mut response, version);
    response
}

fn stamp(response: &mut Response, version: Version) {
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&format!("volume {version}")) {
        headers.insert(HEADER, value);
    }
    headers.insert(header::VARY, HeaderValue::from_static("OpenStack-API-Version"));
}

/// The router's check of a route's lowest microversion (`Endpoint::since`): below it, the route
/// does not exist, as in Cinder (404), before its handler reads anything.
pub async fn at_least(
    axum::extract::State(since): axum::extract::State<Version>,
    request: Request,
    next: Next,
) -> Response {
    match request.extensions().get::<Version>() {
        Some(version) if *version < since => ApiError::no_such_resource().into_response(),
        _ => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_are_parsed_as_cinder_does() {
        assert_eq!(parse("volume 3.27").unwrap(), Version::new(3, 27));
        assert_eq!(parse("volume 3.0").unwrap(), Version::new(3, 0));
        assert_eq!(parse("volume latest").unwrap(), MAX);
        assert_eq!(parse("compute 2.1, volume 3.44").unwrap(), Version::new(3, 44));
        for bad in [
            "volume 3",
            "volume 3.x",
            "volume 03.1",
            "volume 3.01",
            "volume",
            "volume 3.1 extra",
            "volume -3.1",
        ] {
            assert_eq!(parse(bad).unwrap_err().status, StatusCode::BAD_REQUEST, "{bad}");
        }
        assert_eq!(parse("compute 2.1").unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn versions_order_numerically() {
        assert!(Version::new(3, 9) < Version::new(3, 27));
        assert!(Version::new(3, 54) < Version::new(4, 0));
    }
}

//! The API's one error type and its one mapping to HTTP, in Cinder's fault shape
//! `{"<faultName>": {"code": N, "message": "..."}}` (fault names from Cinder's
//! `cinder/api/openstack/wsgi.py`). Internal failures are logged with their detail and answered
//! with a generic message; nothing internal reaches a client.
//!
//! Driver failures (documented in README.md, "Errors"):
//!
//! | driver outcome                                   | status | fault               |
//! |--------------------------------------------------|--------|---------------------|
//! | `invalid-connector`                              | 400    | badRequest          |
//! | `not-found`, `incompatible`                      | 409    | conflictingRequest  |
//! | `unsupported`                                    | 501    | notImplemented      |
//! | `retryable`                                      | 503    | serviceUnavailable  |
//! | not made (the operation lost its lease)          | 503    | serviceUnavailable  |
//! | `backend`, crash, limit hit, invalid result      | 502    | computeFault        |
//! | wall-time limit hit                              | 504    | computeFault        |
//!
//! A new export beyond the target service's ceiling on this machine is refused before any driver
//! call with 413 `overLimit`, as a limit on attachments per volume is, and so are a volume or an
//! extend its backend's filesystem has no room for and a change past a project's volume quota
//! (with `Retry-After: 0`, as Cinder's `QuotaError`).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::attach::AttachError;
use crate::runtime::contract::DriverError;
use crate::runtime::{CallError, CallErrorKind};
use crate::store::{StoreError, Unavailable};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Extra response headers (e.g. `WWW-Authenticate` with a 401).
    pub headers: Vec<(&'static str, String)>,
    /// The node that can answer this request instead (`forward.rs` sends it there; the error is
    /// the answer when it cannot).
    pub forward: Option<crate::attach::nodes::Forward>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), headers: Vec::new(), forward: None }
    }

    /// The same error with one more response header.
    pub fn with_header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_string()));
        self
    }

    /// 400 badRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404 itemNotFound.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 404 for a path or a call below its microversion (webob's generic text, as Cinder).
    pub fn no_such_resource() -> Self {
        Self::not_found("The resource could not be found.")
    }

    /// 403 forbidden.
    pub fn forbidden(rule: &str) -> Self {
        Self::new(StatusCode::FORBIDDEN, format!("Policy doesn't allow {rule} to be performed."))
    }

    /// 500 computeFault, with the detail logged but not sent.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        let id = uuid::Uuid::new_v4();
        tracing::error!(error_id = %id, "internal error: {detail}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "The server has either erred or is incapable of performing the requested operation. (error {id})"
            ),
        )
    }
}

/// Cinder's fault name for a status.
pub fn fault_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 => "badRequest",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "itemNotFound",
        405 => "badMethod",
        409 => "conflictingRequest",
        413 => "overLimit",
        415 => "badMediaType",
        501 => "notImplemented",
        503 => "serviceUnavailable",
        _ => "computeFault",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({ fault_name(self.status): { "code": self.status.as_u16(), "message": self.message } });
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        for (name, value) in self.headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(name, value);
            }
        }
        if let Some(forward) = self.forward {
            response.extensions_mut().insert(forward);
        }
        response
    }
}

impl From<CallError> for ApiError {
    fn from(e: CallError) -> Self {
        let message = e.to_string();
        let status = match &e.kind {
            CallErrorKind::Driver(DriverError::InvalidConnector(c)) => {
                return ApiError::bad_request(format!("Invalid input received: {}", c.reason));
            }
            CallErrorKind::Driver(DriverError::NotFound(_) | DriverError::Incompatible(_)) => {
                StatusCode::CONFLICT
            }
            CallErrorKind::Driver(DriverError::Unsupported(_)) => StatusCode::NOT_IMPLEMENTED,
            CallErrorKind::Driver(DriverError::Retryable(_)) | CallErrorKind::NotMade(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            CallErrorKind::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            CallErrorKind::Driver(DriverError::Backend(_))
            | CallErrorKind::Trap(_)
            | CallErrorKind::CpuTime(_)
            | CallErrorKind::Memory { .. }
            | CallErrorKind::Fuel(_)
            | CallErrorKind::OutputTooLarge { .. }
            | CallErrorKind::CopyTooLarge { .. }
            | CallErrorKind::InvalidOutput(_)
            | CallErrorKind::Injected(_)
            | CallErrorKind::Instantiate(_) => StatusCode::BAD_GATEWAY,
        };
        ApiError::new(status, message)
    }
}

impl From<AttachError> for ApiError {
    fn from(e: AttachError) -> Self {
        match e {
            AttachError::NotFound(m) => ApiError::not_found(m),
            e @ (AttachError::InvalidVolume(_)
            | AttachError::InvalidAttachment(_)
            | AttachError::InvalidInput(_)) => ApiError::bad_request(e.to_string()),
            e @ (AttachError::Conflict(_)
            | AttachError::InstanceUsing(_)
            | AttachError::InstanceMoving(_)
            | AttachError::Busy(_)) => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            AttachError::Forbidden(m) => ApiError::new(StatusCode::FORBIDDEN, m),
            e @ (AttachError::TooManyAttachments { .. }
            | AttachError::ExportCeiling { .. }
            | AttachError::NoRoom { .. }) => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
            // Cinder's `QuotaError`: trying again at once is pointless until something is freed.
            AttachError::OverQuota(over) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, over.to_string()).with_header("Retry-After", "0")
            }
            e @ (AttachError::BackendUnavailable(_)
            | AttachError::ServiceDisabled(_)
            | AttachError::Unavailable(_)) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            AttachError::Elsewhere(remote) => {
                let forward = remote.forwardable();
                let mut error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, remote.to_string());
                error.forward = forward;
                error
            }
            AttachError::NotImplemented(m) => ApiError::new(StatusCode::NOT_IMPLEMENTED, m),
            AttachError::Internal(detail) => ApiError::internal(detail),
            AttachError::Driver(call) => call.into(),
            AttachError::Store(e) => e.into(),
        }
    }
}

/// A driver upgrade or rollback that did not happen: 404 for a backend this node does not
/// serve, 400 for a file that is not a component, 409 for a driver refused (with why), an
/// upgrade already under way or a rollback with nothing to go back to.
impl From<crate::upgrade::UpgradeError> for ApiError {
    fn from(e: crate::upgrade::UpgradeError) -> Self {
        use crate::upgrade::UpgradeError as U;
        match e {
            U::NotFound(_) => ApiError::not_found(e.to_string()),
            U::Invalid(_) => ApiError::bad_request(e.to_string()),
            U::Refused { .. } | U::Busy(_) | U::AlreadyRunning(_) | U::NothingToRollBackTo(_) => {
                ApiError::new(StatusCode::CONFLICT, e.to_string())
            }
            U::Internal(m) => ApiError::internal(m),
        }
    }
}

/// A log level not set: 400 for a level or prefix that is not one, 409 when this process's log
/// is not `berth serve`'s.
impl From<crate::logging::LogError> for ApiError {
    fn from(e: crate::logging::LogError) -> Self {
        use crate::logging::LogError as L;
        match e {
            L::Level(_) | L::Prefix(_) => ApiError::bad_request(e.to_string()),
            L::NotServing => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e.unavailable() {
            Some(Unavailable::Busy) => {
                tracing::warn!("database unavailable: {e}");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "The database is busy or unavailable; retry later.",
                )
            }
            Some(Unavailable::DiskFull) => {
                tracing::error!("the database's disk is full: {e}");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "The database has no room for the change: its disk is full. Retry once space is freed; \
                     an operation this request began is finished or undone then.",
                )
            }
            None => ApiError::internal(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_have_cinders_names() {
        let cases = [
            (400, "badRequest"),
            (401, "unauthorized"),
            (403, "forbidden"),
            (404, "itemNotFound"),
            (405, "badMethod"),
            (406, "computeFault"),
            (409, "conflictingRequest"),
            (413, "overLimit"),
            (415, "badMediaType"),
            (500, "computeFault"),
            (501, "notImplemented"),
            (502, "computeFault"),
            (503, "serviceUnavailable"),
        ];
        for (code, name) in cases {
            assert_eq!(fault_name(StatusCode::from_u16(code).unwrap()), name, "{code}");
        }
    }
}

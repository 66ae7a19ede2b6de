//! Request bodies: JSON only (`application/json` or Cinder's `application/vnd.openstack.volume+json`),
//! at most [`MAX_BODY`] bytes, parsed strictly into the request's type (unknown fields are refused,
//! as Cinder's schemas have `additionalProperties: false`). Every failure is a 4xx that names the
//! problem, and nothing has happened yet when it is returned.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The largest request body accepted.
pub const MAX_BODY: usize = 256 * 1024;

/// The answer to a body larger than [`MAX_BODY`].
pub fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("Request is too large (the limit is {MAX_BODY} bytes)."),
    )
}

/// Middleware: reads a request's whole body, at most [`MAX_BODY`] bytes within `timeout` (408
/// otherwise), before anything else is done for it: a client that sends its body slowly holds no
/// slot of the bound on requests in flight (`server.rs`, which comes after this) and no longer
/// than `timeout`. Runs after authentication, so a client without credentials never gets this
/// far. The headers have their own bound (hyper's header-read timeout).
pub async fn read_whole(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_BODY)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) if is_too_large(&e) => return too_large().into_response(),
        Ok(Err(e)) => {
            return ApiError::bad_request(format!("Cannot read the request body: {e}")).into_response();
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("The request body did not arrive within {} s.", timeout.as_secs_f64()),
            )
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Whether a body read failed on [`MAX_BODY`].
pub fn is_too_large(e: &axum::Error) -> bool {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// A JSON request body of type `T`.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type =
            request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_string);
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                too_large()
            } else {
                ApiError::bad_request(format!("Cannot read the request body: {rejection}"))
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request("The request body is missing."));
        }
        let media =
            content_type.as_deref().map(|c| c.split(';').next().unwrap_or("").trim().to_ascii_lowercase());
        match media.as_deref() {
            Some("application/json") | Some("application/vnd.openstack.volume+json") => {}
            _ => {
                return Err(ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    format!(
                        "Unsupported Content-Type {:?}: use application/json",
                        content_type.as_deref().unwrap_or("(none)")
                    ),
                ));
            }
        }
        parse(&bytes).map(JsonBody)
    }
}

/// The 400 for a NUL character, which no field of Cinder's API may hold (PostgreSQL cannot store
/// one in text, and no name, host or id needs one).
pub fn nul_refused(where_: &str) -> ApiError {
    ApiError::bad_request(format!("Invalid input: {where_} contains a NUL character, which is not allowed"))
}

/// The path of the first string (or key) holding a NUL character in a JSON value.
fn nul_at(value: &serde_json::Value, path: &mut Vec<String>) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().enumerate().any(|(i, v)| {
            path.push(i.to_string());
            nul_at(v, path) || {
                path.pop();
                false
            }
        }),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| {
            path.push(k.clone());
            k.contains('\0') || nul_at(v, path) || {
                path.pop();
                false
            }
        }),
        _ => false,
    }
}

/// Refuses a body with a NUL character in any string (JSON can hold one only as the escape
/// `\u0000`, which is all that needs looking for), naming where it is.
fn refuse_nul(bytes: &[u8]) -> Result<(), ApiError> {
    if !bytes.windows(6).any(|w| w == b"\\u0000") {
        return Ok(());
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Ok(()) };
    let mut path = Vec::new();
    if nul_at(&value, &mut path) {
        return Err(nul_refused(&format!("field/attribute {}", path.join("."))));
    }
    Ok(())
}

/// Parses a JSON document into `T`, naming the offending field on failure.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    refuse_nul(bytes)?;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::bad_request(format!("Malformed request body: {inner}"))
        } else if path == "." {
            ApiError::bad_request(format!("Invalid input: {inner}"))
        } else {
            ApiError::bad_request(format!("Invalid input for field/attribute {path}: {inner}"))
        }
    })?;
    de.end().map_err(|e| ApiError::bad_request(format!("Malformed request body: {e}")))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        attachment: Inner,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        volume_uuid: String,
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse::<Outer>(br#"{"attachment": {"volume_uuid": 5}}"#).unwrap_err();
        assert!(
            e.message.starts_with("Invalid input for field/attribute attachment.volume_uuid"),
            "{}",
            e.message
        );
        let e = parse::<Outer>(br#"{"attachment": {"volume_uuid": "x", "mode": "ro"}}"#).unwrap_err();
        assert!(e.message.contains("unknown field `mode`"), "{}", e.message);
        let e = parse::<Outer>(br#"{"attachment": "#).unwrap_err();
        assert!(e.message.starts_with("Malformed request body"), "{}", e.message);
        let e = parse::<Outer>(br#"{"attachment": {"volume_uuid": "x"}} trailing"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn a_nul_character_anywhere_is_refused_naming_where() {
        let e = parse::<Outer>(br#"{"attachment": {"volume_uuid": "a\u0000b"}}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("attachment.volume_uuid") && e.message.contains("NUL"), "{}", e.message);
        let e = parse::<serde_json::Value>(br#"{"a": [{"k\u0000": 1}]}"#).unwrap_err();
        assert!(e.message.contains("a.0.k"), "{}", e.message);
        // An escaped backslash followed by u0000 is text, not a NUL.
        parse::<Outer>(br#"{"attachment": {"volume_uuid": "\\u0000"}}"#).unwrap();
    }
}

//! Request bodies: JSON only (`application/json` or Cinder's `application/vnd.openstack.volume+json`),
//! at most [`MAX_BODY`] bytes, parsed strictly into the request's type (unknown fields are refused,
//! as Cinder's schemas have `additionalProperties: false`). Every failure is a 4xx that names the
//! problem, and nothing has happened yet when it is returned.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
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

/// Parses a JSON document into `T`, naming the offending field on failure.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
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
}

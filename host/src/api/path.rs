//! Typed ids from the path: a route's `{id}` as the resource it names. An id that is not a UUID
//! names nothing, so it is Cinder's 404 for that resource, before the handler runs.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;

use super::error::ApiError;
use crate::attach::{attachment_not_found, volume_not_found};

/// `{id}` of a `/volumes/{id}...` route, hyphenated and lower case.
pub struct VolumeId(pub String);

/// `{id}` of an `/attachments/{id}...` route, hyphenated and lower case.
pub struct AttachmentId(pub String);

/// The route's `{id}`, or `None` when it is missing.
async fn raw_id<S: Send + Sync>(parts: &mut Parts, state: &S) -> Option<String> {
    let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state).await.ok()?;
    params.get("id").cloned()
}

fn uuid(raw: &str) -> Option<String> {
    uuid::Uuid::parse_str(raw).ok().map(|u| u.hyphenated().to_string())
}

impl<S: Send + Sync> FromRequestParts<S> for VolumeId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = raw_id(parts, state).await.ok_or_else(ApiError::no_such_resource)?;
        uuid(&raw).map(VolumeId).ok_or_else(|| volume_not_found(&raw).into())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for AttachmentId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let raw = raw_id(parts, state).await.ok_or_else(ApiError::no_such_resource)?;
        uuid(&raw).map(AttachmentId).ok_or_else(|| attachment_not_found(&raw).into())
    }
}

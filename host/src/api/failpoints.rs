//! `/_failpoints`: arms and traces the failpoints of `crate::failpoint`. Compiled only into test
//! builds (the `failpoints` feature); a release build has no such route.
//!
//! - `POST /_failpoints/reset {"trace": true}` disarms everything and starts a new trace;
//! - `POST /_failpoints/arm {"name": "...", "nth": 1, "action": "kill" | "sleep" | "fail", "millis": 0}`;
//! - `GET /_failpoints/hits` lists the failpoints passed since the last reset, in order.

use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use crate::failpoint;

#[derive(Deserialize)]
struct Reset {
    #[serde(default)]
    trace: bool,
}

#[derive(Deserialize)]
struct Arm {
    name: String,
    #[serde(default = "one")]
    nth: u32,
    action: failpoint::Action,
    #[serde(default)]
    millis: u64,
}

fn one() -> u32 {
    1
}

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/_failpoints/reset",
            post(|Json(r): Json<Reset>| async move {
                failpoint::reset(r.trace);
                Json(json!({}))
            }),
        )
        .route(
            "/_failpoints/arm",
            post(|Json(a): Json<Arm>| async move {
                failpoint::arm(&a.name, a.nth, a.action, a.millis);
                Json(json!({}))
            }),
        )
        .route("/_failpoints/hits", get(|| async { Json(Value::from(failpoint::hits())) }))
}

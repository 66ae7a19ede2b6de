//! The Ceph manager's dashboard REST API (Ceph 16, `mgr/dashboard`), as this driver uses it:
//! versioned media types on every request, RBD images by `pool%2Fimage`, and the asynchronous
//! tasks a changing call may turn into (202 Accepted, then `GET /api/task` until it finished).
//!
//! The host keeps the dashboard's login (a session in the backend's `[backends.network]`): the
//! driver's requests carry the token without the driver ever holding it.

use std::time::{Duration, Instant};

use berth_driver_sdk::config;
use berth_driver_sdk::http::{Request, Response};
use berth_driver_sdk::prelude::*;
use serde_json::{Value, json};

/// The media type every endpoint wants (the image list alone is 2.0; this driver does not list).
const ACCEPT: &str = "application/vnd.ceph.api.v1.0+json";

/// The dashboard's base URL, from the backend's settings.
fn base() -> DriverResult<String> {
    let url = config::get("dashboard").ok_or_else(|| {
        DriverError::Backend("the backend's settings name no dashboard (its https://host:port)".into())
    })?;
    Ok(url.trim_end_matches('/').to_string())
}

/// How often a request the manager answered "not connected to RADOS yet" is sent again, and the
/// first pause between (doubled each time: about 3 s in all).
const NOT_CONNECTED_TRIES: u32 = 5;
const NOT_CONNECTED_PAUSE: Duration = Duration::from_millis(200);

fn send(request: Request) -> DriverResult<Response> {
    let request = request.header("accept", ACCEPT);
    let mut pause = NOT_CONNECTED_PAUSE;
    let mut tries = 1;
    let answer = loop {
        let answer = request.clone().send()?;
        // The manager connects its RADOS handle at its first use; a request that arrives while
        // another one's connect is under way (after the manager started or failed over) is
        // answered 400 `RadosStateError` ("in state configuring"): nothing was done, and a
        // moment later it works.
        if !(answer.status == 400 && code(&answer).as_deref() == Some("RadosStateError")) {
            break answer;
        }
        if tries == NOT_CONNECTED_TRIES {
            return Err(DriverError::Retryable(format!(
                "the manager is not connected to the cluster yet: {}",
                detail(&answer)
            )));
        }
        std::thread::sleep(pause);
        pause *= 2;
        tries += 1;
    };
    match answer.status {
        401 => Err(DriverError::Backend(
            "the dashboard refused the session: check the backend's [backends.network.sessions] login".into(),
        )),
        403 => Err(DriverError::Backend(format!(
            "the dashboard's account may not do this (it needs the block-manager role): {}",
            detail(&answer)
        ))),
        s if s >= 500 => {
            Err(DriverError::Retryable(format!("the dashboard answered {s}: {}", detail(&answer))))
        }
        _ => Ok(answer),
    }
}

/// The `detail` of an error answer, or its text.
pub(crate) fn detail(answer: &Response) -> String {
    let text = answer.text();
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("detail").and_then(Value::as_str).map(str::to_string))
        .unwrap_or(text)
}

/// The `code` of an error answer (`"17"`: exists, `"2"`: no such pool).
fn code(answer: &Response) -> Option<String> {
    let v: Value = serde_json::from_slice(&answer.body).ok()?;
    match v.get("code")? {
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// `pool/image`, URL-encoded as one path segment.
fn spec(pool: &str, image: &str) -> String {
    format!("{pool}%2F{image}")
}

/// An image's size in bytes, or `None` if it does not exist.
pub(crate) fn image_size(pool: &str, image: &str) -> DriverResult<Option<u64>> {
    let answer = send(Request::get(&format!("{}/api/block/image/{}", base()?, spec(pool, image))))?;
    match answer.status {
        200 => {
            let v: Value = serde_json::from_slice(&answer.body)
                .map_err(|e| DriverError::Backend(format!("the image's answer is not JSON: {e}")))?;
            v.get("size").and_then(Value::as_u64).map(Some).ok_or_else(|| {
                DriverError::Backend(format!("the dashboard answered no size for {pool}/{image}"))
            })
        }
        404 => Ok(None),
        s => Err(DriverError::Backend(format!("reading {pool}/{image}: {s} {}", detail(&answer)))),
    }
}

/// What a changing call ended with.
pub(crate) enum Done {
    Ok,
    /// The call (or its task) failed: the answer's status, code and detail.
    Failed {
        status: u16,
        code: Option<String>,
        detail: String,
    },
}

/// Makes an image of `size` bytes.
pub(crate) fn create_image(pool: &str, image: &str, size: u64) -> DriverResult<Done> {
    let body = json!({"name": image, "pool_name": pool, "size": size});
    let answer = send(Request::post(&format!("{}/api/block/image", base()?)).json(&body.to_string()))?;
    finish(answer, &[200, 201])
}

/// Resizes an image to `size` bytes.
pub(crate) fn resize_image(pool: &str, image: &str, size: u64) -> DriverResult<Done> {
    let body = json!({"size": size});
    let url = format!("{}/api/block/image/{}", base()?, spec(pool, image));
    finish(send(Request::put(&url).json(&body.to_string()))?, &[200])
}

/// Deletes an image.
pub(crate) fn delete_image(pool: &str, image: &str) -> DriverResult<Done> {
    let url = format!("{}/api/block/image/{}", base()?, spec(pool, image));
    finish(send(Request::delete(&url))?, &[200, 204])
}

/// The monitors' addresses (`host`, `port`), as Cinder's driver reads them from the monitor map:
/// each monitor's v1 address.
pub(crate) fn monitors() -> DriverResult<Vec<(String, String)>> {
    let answer = send(Request::get(&format!("{}/api/monitor", base()?)))?;
    if answer.status != 200 {
        return Err(DriverError::Backend(format!(
            "reading the monitors: {} {}",
            answer.status,
            detail(&answer)
        )));
    }
    let v: Value = serde_json::from_slice(&answer.body)
        .map_err(|e| DriverError::Backend(format!("the monitors' answer is not JSON: {e}")))?;
    let mons = v.pointer("/mon_status/monmap/mons").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for mon in mons {
        // "127.0.0.1:6789/0", or "[::1]:6789/0".
        let Some(addr) = mon.get("addr").and_then(Value::as_str) else { continue };
        let addr = addr.split('/').next().unwrap_or(addr);
        if let Some((host, port)) = addr.rsplit_once(':') {
            out.push((host.trim_start_matches('[').trim_end_matches(']').to_string(), port.to_string()));
        }
    }
    if out.is_empty() {
        return Err(DriverError::Backend("the dashboard named no monitors".into()));
    }
    Ok(out)
}

/// A changing call's answer: done (one of `ok`), failed, or a task to follow (202).
fn finish(answer: Response, ok: &[u16]) -> DriverResult<Done> {
    match answer.status {
        s if ok.contains(&s) => Ok(Done::Ok),
        202 => follow(&answer),
        status => Ok(Done::Failed { status, code: code(&answer), detail: detail(&answer) }),
    }
}

/// Follows a task the dashboard answered 202 for, until it finished or the backend's
/// `task_wait_seconds` (default 30) pass: then the call is retryable (the task goes on, and the
/// call, retried, finds what it did).
fn follow(accepted: &Response) -> DriverResult<Done> {
    let task: Value = serde_json::from_slice(&accepted.body)
        .map_err(|e| DriverError::Backend(format!("the 202 answer is not JSON: {e}")))?;
    let name = task.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    let metadata = task.get("metadata").cloned().unwrap_or(Value::Null);
    let wait = config::get("task_wait_seconds").and_then(|s| s.parse().ok()).unwrap_or(30u64);
    let until = Instant::now() + Duration::from_secs(wait);
    let mut pause = Duration::from_millis(50);
    loop {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(500));
        let url = format!("{}/api/task?name={}", base()?, name.replace('/', "%2F"));
        let answer = send(Request::get(&url))?;
        if answer.status != 200 {
            return Err(DriverError::Retryable(format!("following task {name}: {}", answer.status)));
        }
        let v: Value = serde_json::from_slice(&answer.body)
            .map_err(|e| DriverError::Backend(format!("the task list is not JSON: {e}")))?;
        let ours = |t: &&Value| {
            t.get("name").and_then(Value::as_str) == Some(&name) && t.get("metadata") == Some(&metadata)
        };
        let list = |key: &str| v.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
        let executing = list("executing_tasks").iter().any(|t| ours(&t));
        if !executing {
            // The latest of the finished ones (an earlier call may have left one with the same
            // name and image).
            let finished = list("finished_tasks");
            let last = finished.iter().filter(ours).max_by(|a, b| {
                a["end_time"].as_str().unwrap_or("").cmp(b["end_time"].as_str().unwrap_or(""))
            });
            if let Some(t) = last {
                if t.get("success").and_then(Value::as_bool) == Some(true) {
                    return Ok(Done::Ok);
                }
                let exception = t.get("exception").cloned().unwrap_or(Value::Null);
                let detail = exception
                    .get("detail")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| exception.to_string());
                let code =
                    exception.get("code").map(|c| c.as_str().map(str::to_string).unwrap_or(c.to_string()));
                return Ok(Done::Failed { status: 400, code, detail });
            }
        }
        if Instant::now() >= until {
            return Err(DriverError::Retryable(format!(
                "task {name} {metadata} has not finished after {wait} s; it goes on in the manager"
            )));
        }
    }
}

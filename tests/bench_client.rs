//! `berth bench attach` as a client of any Cinder-compatible endpoint: run against a real Berth
//! through a recording proxy, its requests are checked against what Cinder 29 accepts and what
//! Nova sends (`os-detach` names the attachment: Cinder answers a `null` argument with a 500 and
//! leaves the volume `detaching`; `os-attach` names an instance or a host; a service token when
//! it ends an instance's access).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use berth_tests::process::berth_binary;
use berth_tests::server::{Db, TestServer};
use serde_json::Value;

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: HeaderMap,
    body: Value,
    status: u16,
}

#[derive(Clone)]
struct Proxy {
    to: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn forward(State(p): State<Proxy>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let path = parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let mut headers = parts.headers.clone();
    headers.remove("host");
    let answer = reqwest::Client::new()
        .request(parts.method.clone(), format!("{}{path}", p.to))
        .headers(headers)
        .body(bytes.clone())
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let text = answer.bytes().await.unwrap();
    p.seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path,
        headers: parts.headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        status: status.as_u16(),
    });
    (StatusCode::from_u16(status.as_u16()).unwrap(), [("content-type", "application/json")], text)
        .into_response()
}

async fn proxy_to(base: &str) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app =
        axum::Router::new().fallback(forward).with_state(Proxy { to: base.to_string(), seen: seen.clone() });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

async fn bench(endpoint: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["bench", "attach", "--clients", "2", "--duration", "1", "--warmup", "0"];
    args.extend_from_slice(extra);
    tokio::process::Command::new(berth_binary())
        .args(&args)
        .env("OS_AUTH_TYPE", "noauth")
        .env("CINDER_ENDPOINT", format!("{endpoint}/v3"))
        .env("OS_PROJECT_ID", "bench")
        .env("OS_USER_ID", "nova")
        .output()
        .await
        .unwrap()
}

fn actions<'a>(seen: &'a [Seen], name: &str) -> Vec<&'a Seen> {
    seen.iter().filter(|s| s.path.ends_with("/action") && s.body.get(name).is_some()).collect()
}

/// The legacy flow, as Nova drove Cinder: `os-detach` names the attachment the volume lists, and
/// `os-attach` a host; every call answers, and nothing is left attached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_benchmark_drives_the_six_calls_as_nova_does() {
    let s = TestServer::start(Db::Sqlite).await;
    let (url, seen) = proxy_to(&s.base).await;
    let out = bench(&url, &["--legacy"]).await;
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|r| r.status < 400),
        "a call failed: {:?}",
        seen.iter().find(|r| r.status >= 400)
    );
    let detaches = actions(&seen, "os-detach");
    assert!(!detaches.is_empty());
    for d in &detaches {
        let id = d.body["os-detach"]["attachment_id"].as_str();
        assert!(
            id.is_some_and(|i| uuid::Uuid::parse_str(i).is_ok()),
            "os-detach must name the attachment: {}",
            d.body
        );
    }
    for a in actions(&seen, "os-attach") {
        let arg = a.body["os-attach"].as_object().unwrap();
        assert!(
            arg.contains_key("mountpoint")
                && (arg.contains_key("host_name") || arg.contains_key("instance_uuid"))
        );
        assert!(
            arg.keys().all(|k| ["mountpoint", "host_name", "instance_uuid", "mode"].contains(&k.as_str()))
        );
    }
    let c = s.client("bench");
    let volumes = c.get("/volumes/detail").await.expect(200);
    assert!(volumes.body["volumes"].as_array().unwrap().is_empty(), "the benchmark cleans up");
}

/// With `--service-token`, each attachment names an instance (Nova's), and ending its access goes
/// with a service token, which Cinder and Berth require (OSSA-2023-003); both flows run clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_service_token_the_benchmark_attaches_instances_and_detaches_them_as_nova() {
    for legacy in [true, false] {
        let s = TestServer::start(Db::Sqlite).await;
        let (url, seen) = proxy_to(&s.base).await;
        let mut flags = vec!["--service-token"];
        if legacy {
            flags.push("--legacy");
        }
        let out = tokio::process::Command::new(berth_binary())
            .args(["bench", "attach", "--clients", "1", "--duration", "1", "--warmup", "0"])
            .args(&flags)
            .env("OS_AUTH_TYPE", "noauth")
            .env("CINDER_ENDPOINT", format!("{url}/v3"))
            .env("OS_PROJECT_ID", "bench")
            .env("OS_USER_ID", "nova")
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "legacy={legacy}: {}", String::from_utf8_lossy(&out.stderr));
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter().all(|r| r.status < 400),
            "legacy={legacy}: {:?}",
            seen.iter().find(|r| r.status >= 400)
        );
        let ending: Vec<&Seen> = seen
            .iter()
            .filter(|r| {
                r.method == "DELETE" && r.path.contains("/attachments/") || r.body.get("os-detach").is_some()
            })
            .collect();
        assert!(!ending.is_empty(), "legacy={legacy}");
        for r in ending {
            assert_eq!(r.headers.get("x-service-roles").map(|v| v.to_str().unwrap()), Some("service"));
            assert!(r.headers.contains_key("x-service-token"));
        }
        let instances = if legacy {
            actions(&seen, "os-attach")
                .iter()
                .filter(|a| a.body["os-attach"].get("instance_uuid").is_some())
                .count()
        } else {
            seen.iter().filter(|r| r.body["attachment"].get("instance_uuid").is_some()).count()
        };
        assert!(instances > 0, "legacy={legacy}: no attachment named an instance");
    }
}

//! Request ids: every response carries `X-OpenStack-Request-Id`, a caller's global request id is
//! accepted, and every log line of a request (its operation and its driver's own log lines
//! included) carries both, one JSON object per line with `--log-format json`.

use berth_tests::process::BerthProcess;
use serde_json::{Value, json};

const CONFIG: &str = berth_tests::process::FAKE_BACKEND;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_log_line_of_a_request_carries_its_ids_in_json() {
    let server = BerthProcess::start_with_env("", CONFIG, &[("BERTH_LOG_FORMAT", "json")]);
    let global = format!("req-{}", uuid::Uuid::new_v4());
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/v3/p1/volumes", server.base))
        .header("x-auth-token", "u:p1")
        .header("x-openstack-request-id", &global)
        .json(&json!({"volume": {"size": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let local = response.headers()["x-openstack-request-id"].to_str().unwrap().to_string();
    assert!(local.starts_with("req-") && local != global, "{local}");
    let volume: Value = response.json().await.unwrap();
    let id = volume["volume"]["id"].as_str().unwrap().to_string();
    // Wait for the driver's own log line of that create (the log is written as it happens).
    let needle = format!("fake: created volume {id}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !server.log_text().contains(&needle) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let log = server.log_text();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l}"))
        })
        .collect();
    let of_request: Vec<&Value> = lines.iter().filter(|l| l["span"]["request_id"] == json!(local)).collect();
    assert!(of_request.iter().all(|l| l["span"]["global_request_id"] == json!(global)), "{of_request:?}");
    let messages: Vec<String> = of_request.iter().map(|l| l["fields"]["message"].to_string()).collect();
    assert!(messages.iter().any(|m| m.contains("request")), "the request's own line: {messages:?}");
    assert!(
        messages.iter().any(|m| m.contains(&format!("fake: created volume {id}"))),
        "the driver's log line carries the request id: {messages:?}\n{log}"
    );
    // A malformed global id is ignored, not echoed into the log.
    let r = http
        .get(format!("{}/v3/p1/volumes", server.base))
        .header("x-auth-token", "u:p1")
        .header("x-openstack-request-id", "req-not-a-uuid\"}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(!server.log_text().contains("req-not-a-uuid"));
}

//! The Prometheus endpoint of a running `berth serve`, scraped after real traffic and read with
//! the official Python client's OpenMetrics parser (PyPI `prometheus-client`): request counts and
//! latencies by route and status, driver calls by backend, call and outcome, database transaction
//! latency, operations in flight, reconcile passes.

use std::collections::BTreeMap;

use berth_tests::pg::free_port;
use berth_tests::process::BerthProcess;
use berth_tests::python::python;
use berth_tests::server::{Client, connector};
use serde_json::{Value, json};

/// `berth serve` on the fake driver, with its metrics listener: the server and the listener's port.
fn serve_with_metrics() -> (BerthProcess, u16) {
    let port = free_port();
    let config = format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\n[[backends]]\nname = \"fake\"\ndriver = \"fake\"\n\
         [[volume_types]]\nname = \"__DEFAULT__\"\nbackend = \"fake\"\n"
    );
    (BerthProcess::start(&config), port)
}

const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    out[family.name] = {"type": family.type, "samples": [[s.name, s.labels, s.value] for s in family.samples]}
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_is_valid_openmetrics_and_counts_what_happened() {
    let (server, port) = serve_with_metrics();
    let c = Client::for_base(&server.base, "p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let a = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:m", "m"))).await.expect(200);
    let id = a.body["attachment"]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/attachments/{id}")).await.expect(200);
    c.get("/volumes/00000000-0000-4000-8000-000000000000").await.expect(404);

    let response = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    let text = response.text().await.unwrap();
    let mut parse = python(PARSE, &[]);
    parse.stdin(std::process::Stdio::piped());
    let parsed: BTreeMap<String, Value> = {
        use std::io::Write;
        let mut child = parse.stdout(std::process::Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "the official parser refused the text:\n{text}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let samples = |family: &str| -> Vec<Value> {
        parsed.get(family).unwrap_or_else(|| panic!("no family {family}: {:?}", parsed.keys()))["samples"]
            .as_array()
            .unwrap()
            .clone()
    };
    let has = |family: &str, name: &str, labels: Value| {
        samples(family).iter().any(|s| {
            s[0] == name
                && labels.as_object().unwrap().iter().all(|(k, v)| s[1][k] == *v)
                && s[2].as_f64().unwrap() > 0.0
        })
    };
    assert!(has(
        "berth_http_requests",
        "berth_http_requests_total",
        json!({"route": "/v3/volumes", "method": "POST", "status": "202"})
    ));
    assert!(has(
        "berth_http_requests",
        "berth_http_requests_total",
        json!({"route": "/v3/volumes/{id}", "method": "GET", "status": "404"})
    ));
    assert!(has(
        "berth_http_request_seconds",
        "berth_http_request_seconds_count",
        json!({"route": "/v3/attachments/{id}", "method": "DELETE"})
    ));
    assert!(has(
        "berth_driver_calls",
        "berth_driver_calls_total",
        json!({"backend": "fake", "call": "create-volume", "outcome": "ok"})
    ));
    assert!(has(
        "berth_driver_calls",
        "berth_driver_calls_total",
        json!({"backend": "fake", "call": "initialize-connection", "outcome": "ok"})
    ));
    assert!(has("berth_driver_call_seconds", "berth_driver_call_seconds_count", json!({"backend": "fake"})));
    assert!(has(
        "berth_db_transaction_seconds",
        "berth_db_transaction_seconds_count",
        json!({"kind": "write"})
    ));
    assert!(has("berth_reconcile_passes", "berth_reconcile_passes_total", json!({})));
    for family in [
        "berth_operations_in_flight",
        "berth_operations_past_lease",
        "berth_capability_calls",
        "berth_reconcile_changes",
    ] {
        assert!(parsed.contains_key(family), "no family {family}");
    }
    assert_eq!(parsed["berth_operations_in_flight"]["type"], "gauge");
    // What a slot keeps between instances: the default 32 MiB, or nothing where the kernel may
    // swap berth's pages out (this suite runs without swap; `.ci/test` turns it on for one test).
    let swapping =
        std::fs::read_to_string("/proc/swaps").unwrap().lines().skip(1).any(|l| !l.trim().is_empty());
    let kept = samples("berth_runtime_kept_resident_bytes")[0][2].as_f64().unwrap();
    assert_eq!(kept, if swapping { 0.0 } else { f64::from(32 << 20) }, "{text}");
    // No raw ids in labels.
    assert!(!text.contains(&volume) && !text.contains(&id));
}

/// The hardening issue's items 15 and 16: any request, without a token, with a made-up HTTP
/// method added a series for ever; and the metrics listener had no header or idle timeout. Now a
/// method outside the known set counts as `other`, and the metrics listener closes a connection
/// that sends no complete request within the API's header-read timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_add_no_series_and_the_metrics_listener_has_the_apis_bounds() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port = free_port();
    let config = format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\n[http]\nheader_read_timeout_seconds = 0.5\n\
         [[backends]]\nname = \"fake\"\ndriver = \"fake\"\n[[volume_types]]\nname = \"__DEFAULT__\"\nbackend = \"fake\"\n"
    );
    let server = BerthProcess::start(&config);
    let http = reqwest::Client::new();
    for i in 0..20 {
        let method = reqwest::Method::from_bytes(format!("MADEUP{i}").as_bytes()).unwrap();
        let r = http.request(method, format!("{}/v3/p1/volumes", server.base)).send().await.unwrap();
        assert!(r.status().is_client_error(), "{}", r.status());
    }
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap();
    assert!(!text.contains("MADEUP"), "a made-up method became a label:\n{text}");
    assert!(text.contains("method=\"other\""), "{text}");

    // A silent connection and a stalled header, on the metrics listener.
    for sent in [&b""[..], &b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: "[..]] {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        stream.write_all(sent).await.unwrap();
        let mut buf = [0u8; 1024];
        let closed = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the metrics listener kept a connection that sent {sent:?}");
    }
}

/// The sum of a counter's samples for the `fake` backend in OpenMetrics text.
fn fake_total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains("backend=\"fake\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The performance issue's "fresh instances per operation": an attachment create with a
/// connector makes three driver calls (validate-connector, create-export, initialize-connection)
/// and its detach two (terminate-connection, remove-export); each operation's calls run in one
/// instance, counted by `berth_driver_instances_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_driver_calls_of_one_operation_share_one_instance() {
    let (server, port) = serve_with_metrics();
    let c = Client::for_base(&server.base, "p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let scrape = || async {
        let text =
            reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap();
        (fake_total(&text, "berth_driver_calls_total"), fake_total(&text, "berth_driver_instances_total"))
    };

    let before = scrape().await;
    let a = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:m", "m"))).await.expect(200);
    let attached = scrape().await;
    assert_eq!(
        (attached.0 - before.0, attached.1 - before.1),
        (3.0, 1.0),
        "the attach's calls and instances (before {before:?}, after {attached:?})"
    );

    let id = a.body["attachment"]["id"].as_str().unwrap();
    c.delete(&format!("/attachments/{id}")).await.expect(200);
    let detached = scrape().await;
    assert!(detached.0 - attached.0 >= 2.0, "the detach made its calls: {attached:?} {detached:?}");
    assert_eq!(detached.1 - attached.1, 1.0, "in one instance: {attached:?} {detached:?}");
}

/// `[metrics] tls = true`: the metrics are served over TLS with the API's certificate, verified
/// with its CA; plain HTTP on the metrics port gets no answer; without the API's certificate the
/// start is refused, naming what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_listener_serves_over_tls_with_the_apis_certificate() {
    let port = free_port();
    let body = format!(
        "[metrics]\nlisten = \"127.0.0.1:{port}\"\ntls = true\n[[backends]]\nname = \"fake\"\ndriver = \"fake\"\n\
         [[volume_types]]\nname = \"__DEFAULT__\"\nbackend = \"fake\"\n"
    );
    let refused =
        BerthProcess::try_start("", &body, &[]).err().expect("refused without the API's certificate");
    assert!(
        refused.contains("[metrics] tls = true needs [http] tls_cert_file and tls_key_file"),
        "{refused}"
    );

    let certs = tempfile::tempdir().unwrap();
    let files = berth_tests::https::TestCa::new().server_files(certs.path());
    let _server = BerthProcess::start_full(&files.http_table(), &body);
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&files.ca).unwrap()).unwrap();
    let trusting = reqwest::Client::builder().add_root_certificate(ca).build().unwrap();
    let scraped = trusting.get(format!("https://localhost:{port}/metrics")).send().await.unwrap();
    assert_eq!(scraped.status(), 200);
    assert!(scraped.text().await.unwrap().contains("berth_operations_in_flight"));
    let plain = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
}

//! The OpenAPI 3.1 document `berth serve` publishes at `/openapi.json` (generated from the code:
//! `host/src/api/openapi.rs`), checked three ways: it is a valid OpenAPI 3.1 document
//! (openapi-spec-validator from PyPI); every operation it lists is a route the server has; and
//! schemathesis (PyPI) runs against a running server from it, stateful links included (volume
//! create, then attachment create, show, update, complete, delete), with 0 server errors, 0
//! answers that break the document (status, content type, body schema, so every 4xx has Cinder's
//! JSON fault body).
//!
//! Short here; `BERTH_SCHEMATHESIS_EXAMPLES` (per operation and phase, default 15) makes the long
//! mode (see BENCHMARKS.md).

use std::collections::BTreeMap;

use berth_tests::process::{BerthProcess, FAKE_BACKEND};
use berth_tests::python::venv;
use reqwest::Method;
use serde_json::Value;

/// The fake driver behind the default volume type and a multiattach one.
fn config() -> String {
    format!(
        "{FAKE_BACKEND}[[volume_types]]\nname = \"multiattach\"\nbackend = \"fake\"\nextra_specs = {{ multiattach = \"<is> True\" }}\n"
    )
}

async fn document(base: &str) -> Value {
    let r = reqwest::get(format!("{base}/openapi.json")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    r.json().await.unwrap()
}

#[tokio::test]
async fn the_document_is_valid_openapi_3_1_and_describes_microversions_and_faults() {
    let server = BerthProcess::start(&config());
    let doc = document(&server.base).await;
    assert_eq!(doc["openapi"], "3.1.0");
    let file = server.dir.path().join("openapi.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let check = "import json, sys\nfrom openapi_spec_validator import validate\nvalidate(json.load(open(sys.argv[1])))";
    let out = std::process::Command::new(venv().join("bin/python"))
        .args(["-c", check])
        .arg(&file)
        .output()
        .expect("run openapi-spec-validator (installed by .ci/setup)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Microversions: an operation's lowest, and the fields that come later.
    let op = |path: &str, method: &str| doc["paths"][path][method].clone();
    assert_eq!(op("/v3/attachments", "post")["x-openstack-microversion"], "3.27");
    assert_eq!(op("/v3/attachments/{id}/action", "post")["x-openstack-microversion"], "3.44");
    assert_eq!(op("/v3/volumes", "post")["x-openstack-microversion"], "3.0");
    let schemas = &doc["components"]["schemas"];
    let detail = &schemas["VolumeDetail"]["properties"];
    assert!(detail["service_uuid"]["description"].as_str().unwrap().contains("3.48"), "{detail}");
    assert!(
        schemas["CreateAttachment"]["properties"]["mode"]["description"].as_str().unwrap().contains("3.54")
    );
    // Every operation answers errors in Cinder's fault shape; the configured types are listed.
    for (path, methods) in doc["paths"].as_object().unwrap() {
        for (method, op) in methods.as_object().unwrap() {
            assert_eq!(
                op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/Fault",
                "{method} {path}"
            );
        }
    }
    assert_eq!(schemas["Fault"]["maxProperties"], 1);
    let types: Vec<&str> = schemas["CreateVolume"]["properties"]["volume_type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(types.contains(&"__DEFAULT__") && types.contains(&"multiattach"), "{types:?}");
    // The links that make schemathesis's stateful phase attach, update, complete and delete.
    let links = &op("/v3/attachments", "post")["responses"]["200"]["links"];
    for target in ["updateAttachment", "completeAttachment", "deleteAttachment"] {
        assert!(links.as_object().unwrap().values().any(|l| l["operationId"] == target), "{target}: {links}");
    }
    let attach = &op("/v3/volumes", "post")["responses"]["202"]["links"]["attach"];
    assert_eq!(attach["requestBody"]["attachment"]["volume_uuid"], "$response.body#/volume/id");
}

#[tokio::test]
async fn every_operation_in_the_document_is_a_route_of_the_server() {
    let server = BerthProcess::start(&config());
    let doc = document(&server.base).await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let mut seen = 0;
    for (path, methods) in doc["paths"].as_object().unwrap() {
        let concrete = path.replace("{id}", &uuid::Uuid::new_v4().to_string()).replace("{key}", "k");
        for method in methods.as_object().unwrap().keys() {
            let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let r = client
                .request(method.clone(), format!("{}{concrete}", server.base))
                .header("x-auth-token", "me:demo")
                .header("openstack-api-version", "volume latest")
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            let unrouted =
                status == 405 || body["itemNotFound"]["message"] == "The resource could not be found.";
            assert!(!unrouted, "{method} {path}: the server has no such route ({status} {body})");
            seen += 1;
        }
    }
    assert!(seen >= 25, "only {seen} operations");
    // And a route the document does not list is none of the server's.
    let r = client
        .get(format!("{}/v3/groups", server.base))
        .header("x-auth-token", "me:demo")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// Runs schemathesis against `base` with `args`; returns what it printed, and every request it
/// made with the status it got, by (method, path with ids as `{id}`).
fn schemathesis(
    base: &str,
    dir: &std::path::Path,
    args: &[&str],
) -> (String, BTreeMap<(String, String), Vec<u16>>) {
    let har = dir.join(format!("schemathesis-{}.har", uuid::Uuid::new_v4()));
    let bin = venv().join("bin/schemathesis");
    assert!(bin.exists(), "{} is missing: run .ci/setup", bin.display());
    let out = std::process::Command::new(bin)
        .args(["run", &format!("{base}/openapi.json"), "--url", base])
        .args(["-H", "X-Auth-Token: schemathesis:demo"])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        ])
        .args([
            "--seed",
            "1",
            "--no-color",
            "--generation-database",
            "none",
            "--report",
            "har",
            "--report-har-path",
        ])
        .arg(&har)
        .args(args)
        .env("PYTHONWARNINGS", "ignore")
        // Its caches (`.schemathesis/`) go to the test's directory, not the source tree.
        .current_dir(dir)
        .output()
        .expect("run schemathesis");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "schemathesis {args:?} found problems:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let har: Value = serde_json::from_str(&std::fs::read_to_string(&har).unwrap()).unwrap();
    let mut answered: BTreeMap<(String, String), Vec<u16>> = BTreeMap::new();
    let uuid = regex::Regex::new("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").unwrap();
    for e in har["log"]["entries"].as_array().unwrap() {
        let url = e["request"]["url"].as_str().unwrap();
        let path = url.trim_start_matches(base).split('?').next().unwrap();
        let path = uuid.replace_all(path, "{id}").into_owned();
        let key = (e["request"]["method"].as_str().unwrap().to_string(), path);
        answered.entry(key).or_default().push(e["response"]["status"].as_u64().unwrap() as u16);
    }
    (text, answered)
}

#[test]
fn schemathesis_finds_no_server_error_and_no_answer_outside_the_document() {
    let server = BerthProcess::start(&config());
    let examples = std::env::var("BERTH_SCHEMATHESIS_EXAMPLES").unwrap_or_else(|_| "15".into());
    // Every phase (examples, coverage, fuzzing, stateful), then the stateful phase alone with
    // valid data on the operations of the attach path, which follows their links further:
    // volume create, attachment create, show, update, complete, delete. (On every operation,
    // which walk the seed gives depends on the whole document: an operation more, and it may
    // never start from a volume.)
    let (broad, mut answered) = schemathesis(&server.base, server.dir.path(), &["--max-examples", &examples]);
    let deep_examples = (examples.parse::<u32>().unwrap_or(15) * 20).to_string();
    let (deep, more) = schemathesis(
        &server.base,
        server.dir.path(),
        &[
            "--phases",
            "stateful",
            "--mode",
            "positive",
            "--max-examples",
            &deep_examples,
            "--include-operation-id-regex",
            "^(createVolume|showVolume|createAttachment|showAttachment|updateAttachment|completeAttachment|deleteAttachment)$",
        ],
    );
    for (key, statuses) in more {
        answered.entry(key).or_default().extend(statuses);
    }
    let requests: usize = answered.values().map(Vec::len).sum();
    let summary =
        |text: &str| text.lines().skip_while(|l| !l.contains("SUMMARY")).collect::<Vec<_>>().join("\n");
    eprintln!("schemathesis: {requests} requests\n{}\n{}", summary(&broad), summary(&deep));
    for ((method, path), statuses) in answered.iter().filter(|((_, p), _)| p.starts_with("/v3/attachments")) {
        let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
        for s in statuses {
            *counts.entry(*s).or_default() += 1;
        }
        eprintln!("  {method} {path}: {counts:?}");
    }
    let got = |method: &str, path: &str, status: u16| {
        answered.get(&(method.to_string(), path.to_string())).is_some_and(|s| s.contains(&status))
    };
    assert!(!answered.values().flatten().any(|s| *s >= 500 && *s != 503), "a server error");
    // The links were followed: attachments were made on the volumes it created, shown, given a
    // connector and deleted.
    assert!(got("POST", "/v3/volumes", 202), "no volume was created");
    assert!(got("POST", "/v3/attachments", 200), "no attachment was created through the links");
    assert!(got("GET", "/v3/attachments/{id}", 200), "no attachment was shown");
    assert!(got("PUT", "/v3/attachments/{id}", 200), "no attachment was given a connector");
    assert!(got("DELETE", "/v3/attachments/{id}", 200), "no attachment was deleted");
    assert!(requests > 1000, "too few requests to mean anything: {requests}");
}

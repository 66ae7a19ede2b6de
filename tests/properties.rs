//! Properties checked on generated inputs (proptest): what decodes untrusted bytes or text never
//! panics and never lets through what it must refuse. The request decoders, the connector and IQN
//! validators, tgtd's request builder and answer parsers, and the host-guest value conversion.
//!
//! `PROPTEST_CASES` sets the number of inputs per property (256 by default, what CI runs); the
//! long mode in BENCHMARKS.md runs 100,000.

use berth::capabilities::iscsi::tgt::{Request, parse_accounts, parse_connections, parse_show};
use berth::domain::model::Connector;
use berth::runtime::json::{value_from_json, value_to_json};
use berth_driver_sdk::names::{MAX_ISCSI_NAME, check_iscsi_name};
use berth_tests::server::{Db, TestServer};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Arbitrary JSON, a few levels deep, with the strings clients and attackers send.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        "\\PC{0,40}".prop_map(Value::String),
        "iqn\\.[0-9]{4}-[0-9]{2}\\.[a-z.-]{1,12}(:[ -~]{0,20})?".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}|\\PC{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A connector-shaped object: os-brick's keys with arbitrary values, plus arbitrary extra keys.
fn any_connector() -> impl Strategy<Value = Map<String, Value>> {
    const KEYS: &[&str] =
        &["initiator", "host", "ip", "platform", "os_type", "multipath", "mode", "wwpns", "nqn"];
    (prop::collection::vec((prop::sample::select(KEYS), any_json()), 0..8), any_json()).prop_map(
        |(pairs, extra)| {
            let mut m: Map<String, Value> = pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            if let Value::Object(more) = extra {
                m.extend(more);
            }
            m
        },
    )
}

proptest! {
    #[test]
    fn an_accepted_iscsi_name_holds_only_safe_characters(name in "\\PC{0,240}|iqn\\.[0-9]{4}-[0-9]{2}\\.[a-z0-9.-]{1,20}(:[ -~]{0,60})?") {
        if check_iscsi_name(&name).is_ok() {
            prop_assert!(name.len() <= MAX_ISCSI_NAME);
            prop_assert!(name.chars().all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-' | '.' | ':')), "{name:?}");
        }
    }

    #[test]
    fn a_connector_is_parsed_or_refused_and_its_typed_form_is_what_was_sent(obj in any_connector()) {
        if let Ok(c) = Connector::parse(obj.clone()) {
            prop_assert_eq!(c.json(), &obj, "the connector is kept as it was sent");
            let typed = c.for_mode(berth::runtime::contract::AccessMode::Rw);
            prop_assert_eq!(typed.initiator.as_deref(), obj.get("initiator").and_then(Value::as_str));
            prop_assert_eq!(typed.host.as_deref(), obj.get("host").and_then(Value::as_str));
        } else {
            // Refused only for a typed key of the wrong type, or too many keys.
            let typed_wrong = ["initiator", "host", "ip", "platform", "os_type", "nqn"]
                .iter()
                .any(|k| obj.get(*k).is_some_and(|v| !v.is_string() && !v.is_null()));
            prop_assert!(typed_wrong || obj.len() > berth::runtime::json::MAX_CONNECTOR_KEYS || obj.contains_key("multipath") || obj.contains_key("wwpns") || obj.contains_key("mode"), "{obj:?}");
        }
    }

    #[test]
    fn a_tgt_request_says_its_own_length_and_ends_with_nul(tid in any::<u32>(), sid in any::<u64>(), cid in any::<u32>(), lun in 0u32..1024, params in "[ -~]{0,300}") {
        for request in [
            Request::delete_connection(tid, sid, cid),
            Request::new_lun(tid, lun, &params),
            Request::bind_initiator(tid, &params),
        ] {
            let bytes = request.encode();
            let len = u32::from_ne_bytes(bytes[72..76].try_into().unwrap()) as usize;
            prop_assert_eq!(len, bytes.len());
            prop_assert_eq!(*bytes.last().unwrap(), 0u8);
            prop_assert!(!bytes[120..bytes.len() - 1].contains(&0), "no NUL inside the parameters");
        }
    }

    #[test]
    fn tgtds_answers_are_parsed_without_panicking(text in "(\\PC{0,60}\n){0,40}|((Target [0-9]+: [a-z.:-]{1,20}\n)|( {4,12}[A-Za-z _:]{1,20}: [ -~]{0,20}\n)|(Session: [0-9]{1,3}\n)|( +Initiator: [ -~]{0,30}\n)){0,60}") {
        let _ = parse_show(&text);
        let _ = parse_accounts(&text);
        for c in parse_connections(&text) {
            prop_assert!(!c.initiator.contains(char::is_whitespace));
        }
    }

    #[test]
    fn host_guest_values_round_trip(v in any_json()) {
        let guest = value_from_json(&v);
        if let Ok(back) = value_to_json(&guest) {
            // Numbers may change representation (an integral float), nothing else.
            if !has_float(&v) {
                prop_assert_eq!(back, v);
            }
        }
    }
}

fn has_float(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

/// Every route that decodes a body, with arbitrary bytes and arbitrary JSON: never a 5xx, and every
/// refusal in Cinder's fault shape.
#[test]
fn request_bodies_never_cause_a_server_error() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let s = rt.block_on(TestServer::start(Db::Sqlite));
    let c = s.client("p1").at("3.71");
    let volume = rt.block_on(c.create_volume(json!({"size": 1})));
    let attachment =
        rt.block_on(c.attach(&volume, None)).body["attachment"]["id"].as_str().unwrap().to_string();
    let routes: Vec<(reqwest::Method, String)> = vec![
        (reqwest::Method::POST, "/volumes".into()),
        (reqwest::Method::POST, "/attachments".into()),
        (reqwest::Method::PUT, format!("/attachments/{attachment}")),
        (reqwest::Method::POST, format!("/attachments/{attachment}/action")),
        (reqwest::Method::POST, format!("/volumes/{volume}/action")),
        (reqwest::Method::POST, format!("/volumes/{volume}/metadata")),
        (reqwest::Method::PUT, format!("/volumes/{volume}/metadata")),
        (reqwest::Method::PUT, format!("/volumes/{volume}")),
        (reqwest::Method::PUT, "/os-quota-sets/p1".into()),
        (reqwest::Method::PUT, "/os-quota-class-sets/default".into()),
        (reqwest::Method::POST, "/os-volume-transfer".into()),
        (reqwest::Method::POST, format!("/os-volume-transfer/{volume}/accept")),
        (reqwest::Method::POST, "/snapshots".into()),
        (reqwest::Method::POST, "/backups".into()),
        (reqwest::Method::PUT, "/default-types/p1".into()),
    ];
    let bodies = prop_oneof![
        any_json().prop_map(|v| v.to_string().into_bytes()),
        // Bodies shaped like the real ones, with arbitrary members.
        (
            prop::sample::select(
                &[
                    "volume",
                    "attachment",
                    "os-reserve",
                    "os-attach",
                    "os-initialize_connection",
                    "os-terminate_connection",
                    "os-detach",
                    "os-force_detach",
                    "os-complete",
                    "metadata",
                    "connector",
                    "quota_set",
                    "quota_class_set",
                    "transfer",
                    "accept",
                    "snapshot",
                    "backup",
                    "default_type"
                ][..]
            ),
            any_json()
        )
            .prop_map(|(k, v)| json!({ k: v }).to_string().into_bytes()),
        prop::collection::vec(any::<u8>(), 0..200),
    ];
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&(prop::sample::select(routes), bodies), |((method, path), body)| {
            let r = rt.block_on(c.raw(method.clone(), &path, Some("application/json"), body.clone()));
            prop_assert!(
                r.status < 500,
                "{method} {path} {:?}: {} {}",
                String::from_utf8_lossy(&body),
                r.status,
                r.body
            );
            if r.status >= 400 {
                let fault = r.body.as_object().filter(|o| o.len() == 1).and_then(|o| o.values().next());
                prop_assert!(
                    fault.is_some_and(|f| f["code"] == json!(r.status) && f["message"].is_string()),
                    "{method} {path}: {} {}",
                    r.status,
                    r.body
                );
            }
            Ok(())
        })
        .unwrap();
}

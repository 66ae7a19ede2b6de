//! Version discovery and microversion negotiation (cinder-compat.md 1.2).

use berth_tests::server::{Db, TestServer, fake_config};
use serde_json::{Value, json};

async fn server() -> TestServer {
    TestServer::start(Db::Sqlite).await
}

#[tokio::test]
async fn the_root_answers_300_with_cinders_versions_document() {
    let s = server().await;
    let c = s.client("p1");
    let r = c.send(reqwest::Method::GET, &format!("{}/", s.base), None).await.expect(300);
    let v = &r.body["versions"][0];
    assert_eq!(v["id"], "v3.0");
    assert_eq!(v["status"], "CURRENT");
    assert_eq!(v["version"], "3.71");
    assert_eq!(v["min_version"], "3.0");
    assert_eq!(v["links"][1]["rel"], "self");
    assert_eq!(v["links"][1]["href"], json!(format!("{}/v3/", s.base)));
    assert_eq!(v["media-types"][0]["type"], "application/vnd.openstack.volume+json;version=3");
    let r = c.send(reqwest::Method::GET, &format!("{}/v3/", s.base), None).await.expect(200);
    assert_eq!(r.body["versions"][0]["version"], "3.71");
    // `/v3` redirects there with an absolute Location, which keystoneauth's discovery follows.
    let no_follow = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let r = no_follow.get(format!("{}/v3", s.base)).send().await.unwrap();
    assert_eq!(r.status(), 302);
    assert_eq!(r.headers()["location"], format!("{}/v3/", s.base).as_str());
}

#[tokio::test]
async fn no_header_means_3_0_and_every_response_says_which_version_answered() {
    let s = server().await;
    let r = s.client("p1").get("/volumes").await.expect(200);
    assert_eq!(r.header("openstack-api-version"), Some("volume 3.0"));
    assert_eq!(r.header("vary"), Some("OpenStack-API-Version"));
    assert!(r.header("x-openstack-request-id").is_some_and(|id| id.starts_with("req-")));
    let r = s.client("p1").at("latest").get("/volumes").await.expect(200);
    assert_eq!(r.header("openstack-api-version"), Some("volume 3.71"));
    let r = s.client("p1").at("3.27").get("/attachments/detail").await.expect(200);
    assert_eq!(r.header("openstack-api-version"), Some("volume 3.27"));
}

#[tokio::test]
async fn a_malformed_version_is_a_400_and_one_out_of_range_a_406_that_echoes_it() {
    let s = server().await;
    for bad in ["3", "3.x", "three", "3.01"] {
        let r = s.client("p1").at(bad).get("/volumes").await;
        let message = r.fault(400, "badRequest");
        assert!(message.contains("invalid format"), "{message}");
    }
    let r = s.client("p1").at("3.99").get("/volumes").await;
    let message = r.fault(406, "computeFault");
    assert_eq!(message, "Version 3.99 is not supported by the API. Minimum is 3.0 and maximum is 3.71.");
    assert_eq!(r.header("openstack-api-version"), Some("volume 3.99"));
    s.client("p1").at("2.0").get("/volumes").await.fault(406, "computeFault");
}

#[tokio::test]
async fn calls_below_their_microversion_do_not_exist() {
    let s = server().await;
    let c = s.client("p1");
    for r in [
        c.get("/attachments").await,
        c.at("3.26").get("/attachments").await,
        c.at("3.26").get("/attachments/detail").await,
    ] {
        assert_eq!(r.fault(404, "itemNotFound"), "The resource could not be found.");
    }
    let volume = c.create_volume(json!({"size": 1})).await;
    let a = c.attach(&volume, None).await.expect(200);
    let id = a.body["attachment"]["id"].as_str().unwrap();
    c.at("3.43")
        .post(&format!("/attachments/{id}/action"), json!({"os-complete": null}))
        .await
        .fault(404, "itemNotFound");
}

/// The route table is the truth: every operation of the OpenAPI document that names a lowest
/// microversion above 3.0 does not exist one version below it (404, whatever the body, before
/// the handler reads anything), so the document and the code cannot disagree.
#[tokio::test]
async fn every_operation_is_absent_below_the_microversion_its_document_names() {
    let s = server().await;
    let c = s.client("p1");
    let doc: Value = reqwest::get(format!("{}/openapi.json", s.base)).await.unwrap().json().await.unwrap();
    let id = "00000000-0000-4000-8000-000000000000";
    let mut checked = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let Some(since) = op["x-openstack-microversion"].as_str() else { continue };
            let minor: u32 = since.strip_prefix("3.").unwrap().parse().unwrap();
            if minor == 0 {
                continue;
            }
            let url = path.trim_start_matches("/v3").replace("{id}", id).replace("{key}", "k");
            let method: reqwest::Method = method.to_uppercase().parse().unwrap();
            let below = c.at(&format!("3.{}", minor - 1));
            let r = below.send(method.clone(), &below.url(&url), Some(json!({"not": "valid"}))).await;
            assert_eq!(r.status, 404, "{method} {url} at 3.{}: {} {}", minor - 1, r.status, r.body);
            assert_eq!(r.fault(404, "itemNotFound"), "The resource could not be found.");
            checked += 1;
        }
    }
    assert!(checked >= 7, "only {checked} versioned operations");
}

#[tokio::test]
async fn both_url_forms_reach_the_same_resources() {
    let s = server().await;
    let c = s.client("p1");
    let volume = c.create_volume(json!({"size": 1})).await;
    let r = c.without_project_in_url().get(&format!("/volumes/{volume}")).await.expect(200);
    assert_eq!(r.body["volume"]["id"], json!(volume));
    let r = c
        .without_project_in_url()
        .at("3.27")
        .get(&format!("/attachments?volume_id={volume}"))
        .await
        .expect(200);
    assert_eq!(r.body["attachments"], json!([]));
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_in_cinders_fault_shape() {
    let s = server().await;
    let c = s.client("p1");
    c.get("/no-such-thing").await.fault(404, "itemNotFound");
    c.send(reqwest::Method::PATCH, &c.url("/volumes"), None).await.fault(405, "badMethod");
    let r = c.send(reqwest::Method::GET, &format!("{}/healthcheck", s.base), None).await.expect(200);
    assert_eq!(r.body, json!("OK"));
}

/// A server with, besides the fake iSCSI backend, a fake NVMe-oF one that shares targets (whose
/// volumes Cinder marks `shared_targets: null`, "always lock").
async fn with_nvme() -> TestServer {
    let mut config = fake_config();
    let mut nvme = config.backends[0].clone();
    nvme.name = "nvme".into();
    nvme.settings =
        [("protocol".to_string(), "nvmeof".to_string()), ("shared_targets".to_string(), "true".to_string())]
            .into();
    config.backends.push(nvme);
    let mut nvme_type = config.volume_types[0].clone();
    nvme_type.name = "nvme".into();
    nvme_type.backend = "nvme".into();
    config.volume_types.push(nvme_type);
    TestServer::start_with(Db::Sqlite, config).await
}

/// The hardening issue's item 3: Cinder 29 answers up to 3.71 and Nova asks for 3.68 to 3.71.
/// Every microversion up to 3.71 is accepted and echoed, and the volume gains each version's
/// fields: `cluster_name` (3.61, admins), `volume_type_id` (3.63), `consumes_quota` (3.65), and a
/// `shared_targets` that may be `null` (3.69; shown `true` before).
#[tokio::test]
async fn every_microversion_up_to_3_71_is_accepted_with_the_fields_it_adds() {
    let s = with_nvme().await;
    let admin = s.client("p1");
    let volume = admin.create_volume(json!({"size": 1})).await;
    let nvme = admin.create_volume(json!({"size": 1, "volume_type": "nvme"})).await;
    let types = admin.get("/types").await.expect(200);
    let default_id = types.body["volume_types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "__DEFAULT__")
        .unwrap()["id"]
        .clone();
    for minor in 0..=71 {
        let at = format!("3.{minor}");
        let r = admin.at(&at).get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!(r.header("openstack-api-version"), Some(format!("volume {at}").as_str()));
        let v = &r.body["volume"];
        assert_eq!(v.get("cluster_name").is_some(), minor >= 61, "{at}: cluster_name");
        assert_eq!(v.get("volume_type_id").is_some(), minor >= 63, "{at}: volume_type_id");
        assert_eq!(v.get("consumes_quota").is_some(), minor >= 65, "{at}: consumes_quota");
        assert_eq!(v.get("shared_targets").is_some(), minor >= 48, "{at}: shared_targets");
        if minor >= 63 {
            assert_eq!(v["volume_type_id"], default_id);
        }
        if minor >= 65 {
            assert_eq!(v["consumes_quota"], true);
        }
        if minor >= 61 {
            assert_eq!(v["cluster_name"], Value::Null, "a node-local backend has no cluster");
        }
        let n = admin.at(&at).get(&format!("/volumes/{nvme}")).await.expect(200).body["volume"].clone();
        match minor {
            0..=47 => assert!(n.get("shared_targets").is_none()),
            48..=68 => assert_eq!(n["shared_targets"], true, "{at}: null is shown as true before 3.69"),
            _ => assert_eq!(n["shared_targets"], Value::Null, "{at}"),
        }
        assert_eq!(r.body["volume"]["shared_targets"], if minor >= 48 { json!(false) } else { Value::Null });
    }
    // cluster_name is for admins.
    let member = s.client("p1").with_roles("member").at("3.71");
    assert!(
        member.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"]
            .get("cluster_name")
            .is_none()
    );
    s.client("p1").at("3.72").get("/volumes").await.fault(406, "computeFault");
}

/// 3.60's time filters and 3.65's `consumes_quota` filter on volume lists; unknown below their
/// microversion (a 400 from 3.31, as any unknown filter).
#[tokio::test]
async fn time_and_quota_filters_come_with_their_microversions() {
    let s = server().await;
    let c = s.client("p1");
    let before = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let volume = c.create_volume(json!({"size": 1})).await;
    let after = time::OffsetDateTime::now_utc() + time::Duration::seconds(1);
    let one = vec![volume.clone()];
    let fmt = |t: time::OffsetDateTime| t.format(&time::format_description::well_known::Rfc3339).unwrap();
    let ids = |r: berth_tests::server::Resp| -> Vec<String> {
        r.body["volumes"].as_array().unwrap().iter().map(|v| v["id"].as_str().unwrap().to_string()).collect()
    };
    let at = c.at("3.60");
    let q = |k: &str, op: &str, t: time::OffsetDateTime| {
        format!("/volumes?{k}={op}:{}", fmt(t).replace('+', "%2B"))
    };
    assert_eq!(ids(at.get(&q("created_at", "gt", before)).await.expect(200)), one);
    assert!(ids(at.get(&q("created_at", "gt", after)).await.expect(200)).is_empty());
    assert_eq!(ids(at.get(&q("created_at", "lte", after)).await.expect(200)), one);
    assert_eq!(ids(at.get(&q("updated_at", "gte", before)).await.expect(200)), one);
    // A time without an offset is UTC, and a date is its midnight.
    let naive = before
        .format(time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]"))
        .unwrap();
    assert_eq!(ids(at.get(&format!("/volumes/detail?created_at=gt:{naive}")).await.expect(200)), one);
    at.get("/volumes?created_at=after:2020-01-01").await.fault(400, "badRequest");
    at.get("/volumes?created_at=gt:yesterday").await.fault(400, "badRequest");
    c.at("3.59").get(&q("created_at", "gt", before)).await.fault(400, "badRequest");
    assert_eq!(
        ids(c.at("3.30").get(&q("created_at", "gt", after)).await.expect(200)),
        one,
        "ignored before 3.31"
    );

    let at = c.at("3.65");
    assert_eq!(ids(at.get("/volumes?consumes_quota=true").await.expect(200)), one);
    assert!(ids(at.get("/volumes?consumes_quota=false").await.expect(200)).is_empty());
    c.at("3.64").get("/volumes?consumes_quota=true").await.fault(400, "badRequest");
}

/// The actions of 3.68 and 3.71 need what Berth lacks (an image service; volume extension):
/// unknown below their microversion, then Cinder's checks of the volume's status, then a clear
/// refusal; nothing changes.
#[tokio::test]
async fn reimage_and_extend_completion_answer_as_for_a_backend_without_them() {
    let s = server().await;
    let c = s.client("p1");
    let volume = c.create_volume(json!({"size": 1})).await;
    let action = |v: &str, body: Value| {
        let path = format!("/volumes/{v}/action");
        let c = c.clone();
        async move { (c.clone(), path, body) }
    };
    let image = "6b2c1f0e-3a4d-4e5f-8a9b-0c1d2e3f4a5b";
    let (c0, path, body) = action(&volume, json!({"os-reimage": {"image_id": image}})).await;
    c0.at("3.67").post(&path, body.clone()).await.fault(404, "itemNotFound");
    let m = c0.at("3.68").post(&path, body).await.fault(501, "notImplemented");
    assert!(m.contains("image service"), "{m}");
    c0.at("3.68")
        .post(&path, json!({"os-reimage": {"image_id": "not-a-uuid"}}))
        .await
        .fault(400, "badRequest");
    c0.at("3.68").post(&path, json!({"os-reimage": {}})).await.fault(400, "badRequest");
    // A volume in use is refused first, as Cinder refuses it.
    let used = c.create_volume(json!({"size": 1})).await;
    c.attach(&used, Some(berth_tests::server::connector("iqn.1993-08.org.debian:01:h", "h")))
        .await
        .expect(200);
    let m = c
        .at("3.68")
        .post(
            &format!("/volumes/{used}/action"),
            json!({"os-reimage": {"image_id": image, "reimage_reserved": true}}),
        )
        .await
        .fault(400, "badRequest");
    assert!(m.contains("attaching"), "{m}");
    assert_eq!(c.volume_status(&volume).await, "available");

    let body = json!({"os-extend_volume_completion": {"error": false}});
    c.at("3.70").post(&path, body.clone()).await.fault(404, "itemNotFound");
    c.with_roles("member").at("3.71").post(&path, body.clone()).await.fault(403, "forbidden");
    let m = c.at("3.71").post(&path, body).await.fault(400, "badRequest");
    assert!(m.contains("extending"), "{m}");
    assert_eq!(c.volume_status(&volume).await, "available");
}

//! Version discovery and microversion negotiation (cinder-compat.md 1.2).

use berth_tests::server::{Db, TestServer};
use serde_json::json;

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
    assert_eq!(v["version"], "3.54");
    assert_eq!(v["min_version"], "3.0");
    assert_eq!(v["links"][1]["rel"], "self");
    assert_eq!(v["links"][1]["href"], json!(format!("{}/v3/", s.base)));
    assert_eq!(v["media-types"][0]["type"], "application/vnd.openstack.volume+json;version=3");
    let r = c.send(reqwest::Method::GET, &format!("{}/v3/", s.base), None).await.expect(200);
    assert_eq!(r.body["versions"][0]["version"], "3.54");
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
    assert_eq!(r.header("openstack-api-version"), Some("volume 3.54"));
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
    assert_eq!(message, "Version 3.99 is not supported by the API. Minimum is 3.0 and maximum is 3.54.");
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

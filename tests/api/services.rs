//! `GET /v3/{project}/os-services`: this node and its backends, with their state, in Cinder's
//! shape; each backend's `service_uuid` names the node and the backend.

use berth_tests::server::{Db, TestServer};
use serde_json::json;

#[tokio::test]
async fn the_services_listing_shows_this_node_and_its_backends_up() {
    let s = TestServer::start(Db::Sqlite).await;
    let admin = s.client("p1");
    let r = admin.get("/os-services").await.expect(200);
    let services = r.body["services"].as_array().unwrap();
    let node = &s.service.owner().node;
    let api = services.iter().find(|x| x["binary"] == "berth-api").expect("the node");
    assert_eq!(api["host"], json!(node));
    assert_eq!(api["state"], "up");
    let volume = services.iter().find(|x| x["binary"] == "cinder-volume").expect("its backend");
    assert_eq!(volume["host"], json!(format!("{node}@fake")));
    assert_eq!(
        (volume["state"].as_str(), volume["status"].as_str(), volume["zone"].as_str()),
        (Some("up"), Some("enabled"), Some("nova"))
    );
    assert!(volume["updated_at"].as_str().is_some_and(|t| t.len() >= 19), "{volume}");
    // Also without the project in the URL, and refused to members.
    admin.without_project_in_url().get("/os-services").await.expect(200);
    let message = s.client("p1").with_roles("member").get("/os-services").await.fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume_extension:services:index to be performed.");
    // A volume's service_uuid names its backend on its node: the same backend on another node
    // is another service.
    let uuid_of = |s: &TestServer| {
        let c = s.client("p1").at("3.48");
        async move {
            let v = c.create_volume(json!({"size": 1})).await;
            c.get(&format!("/volumes/{v}")).await.expect(200).body["volume"]["service_uuid"].clone()
        }
    };
    let here = uuid_of(&s).await;
    assert_eq!(uuid_of(&s).await, here, "stable on one node");
    let mut config = berth_tests::server::fake_config();
    config.node = Some("another-node".into());
    let other = TestServer::start_with(Db::Sqlite, config).await;
    assert_ne!(uuid_of(&other).await, here);
}

//! `GET /v3/{project}/os-services`: this node and its backends, with their state, in Cinder's
//! shape; each backend's `service_uuid` names the node and the backend. A volume belongs to the
//! node whose backend made it: another node on the same database refuses to change it.

use berth_tests::server::{Db, TestServer, connector};
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

#[tokio::test]
async fn only_the_node_that_owns_a_volume_changes_it() {
    // Two nodes on one PostgreSQL database, each with its own (node-local) backend "fake".
    let url = berth_tests::pg::fresh_database().await;
    let node = |name: &str| {
        let mut config = berth_tests::server::fake_config();
        config.node = Some(name.into());
        config
    };
    let a = TestServer::start_on(Db::Postgres, Some(url.clone()), node("node-a")).await;
    let b = TestServer::start_on(Db::Postgres, Some(url), node("node-b")).await;
    let on_a = a.client("p1").at("3.54");
    let on_b = b.client("p1").at("3.54");
    let volume = on_a.create_volume(json!({"size": 1})).await;
    let made =
        on_a.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:host-a", "host-a"))).await.expect(200);
    let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
    on_a.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);

    // The other node reads it, but refuses every change that needs the owner's backend, before
    // anything is recorded.
    assert_eq!(on_b.volume_status(&volume).await, "in-use");
    let spare = on_a.create_volume(json!({"size": 1})).await;
    let refused = [
        on_b.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:host-b", "host-b"))).await,
        on_b.delete(&format!("/attachments/{id}")).await,
        on_b.delete(&format!("/volumes/{spare}")).await,
        on_b.post(
            &format!("/volumes/{volume}/action"),
            json!({"os-terminate_connection": {"connector": connector("iqn.1993-08.org.debian:01:host-a", "host-a")}}),
        )
        .await,
    ];
    for r in refused {
        let message = r.fault(503, "serviceUnavailable");
        assert!(message.contains("served by another Berth node, node-a (up)"), "{message}");
        assert_eq!(r.header("retry-after"), Some("1"));
    }
    let shown = on_a.get(&format!("/attachments/{id}")).await.expect(200);
    assert_eq!(shown.body["attachment"]["status"], "attached");
    assert_eq!(on_a.volume_status(&volume).await, "in-use");
    assert_eq!(on_a.volume_status(&spare).await, "available");
    let listed = on_a.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    assert_eq!(listed.body["attachments"].as_array().unwrap().len(), 1, "no attachment was added");
    let ops = a.service.store().read(async |tx| berth::store::operations::all(tx).await).await.unwrap();
    assert!(ops.is_empty(), "no operation was recorded: {ops:?}");

    // Both nodes name its node as Cinder does (admins see `node@backend#pool`).
    for c in [&on_a, &on_b] {
        let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!(shown.body["volume"]["os-vol-host-attr:host"], "node-a@fake#fake");
    }
    let listed = on_b.get("/volumes/detail").await.expect(200);
    assert!(
        listed.body["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["os-vol-host-attr:host"] == "node-a@fake#fake")
    );

    // Its owner still does.
    on_a.delete(&format!("/attachments/{id}")).await.expect(200);
    assert_eq!(on_a.volume_status(&volume).await, "available");
}

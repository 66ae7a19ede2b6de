//! Bad input: each case gets the right 4xx in Cinder's fault shape, and nothing changes.

use berth_tests::both_databases;
use berth_tests::server::{Client, connector};
use reqwest::Method;
use serde_json::json;

/// Volumes and attachments the project has, to check that a refused request changed nothing.
async fn census(c: &Client) -> (usize, usize, Vec<String>) {
    let volumes = c.get("/volumes/detail").await.expect(200);
    let attachments = c.at("3.27").get("/attachments").await.expect(200);
    let statuses = volumes.body["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["status"].as_str().unwrap().to_string())
        .collect();
    (
        volumes.body["volumes"].as_array().unwrap().len(),
        attachments.body["attachments"].as_array().unwrap().len(),
        statuses,
    )
}

both_databases! {
    async fn bad_requests_are_4xx_in_cinders_shape_and_change_nothing(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let before = census(&c).await;
        let json_ct = Some("application/json");

        let m = c.raw(Method::POST, "/attachments", json_ct, b"{\"attachment\": ".to_vec()).await.fault(400, "badRequest");
        assert!(m.starts_with("Malformed request body"), "{m}");
        let m = c.raw(Method::POST, "/volumes", json_ct, b"[1, 2]".to_vec()).await.fault(400, "badRequest");
        assert!(m.starts_with("Invalid input"), "{m}");
        let m = c.post("/volumes", json!({"volume": {"size": "abc"}})).await.fault(400, "badRequest");
        assert!(m.contains("size"), "{m}");
        c.post("/volumes", json!({"volume": {"size": 0}})).await.fault(400, "badRequest");
        c.post("/volumes", json!({"volume": {"size": 1.5}})).await.fault(400, "badRequest");
        c.post("/volumes", json!({"volume": {"size": 1_000_000}})).await.fault(400, "badRequest");
        c.post("/volumes", json!({"volume": {"size": 1, "snapshot_id": uuid::Uuid::new_v4()}})).await.fault(400, "badRequest");
        c.post("/volumes", json!({"volume": {"size": 1, "availability_zone": "mars"}})).await.fault(400, "badRequest");
        c.post("/volumes", json!({"size": 1})).await.fault(400, "badRequest");
        let m = c.post("/attachments", json!({"attachment": {"volume_uuid": 5}})).await.fault(400, "badRequest");
        assert!(m.contains("attachment.volume_uuid"), "{m}");
        let m = c.post("/attachments", json!({"attachment": {"volume_uuid": volume, "colour": "red"}})).await.fault(400, "badRequest");
        assert!(m.contains("unknown field `colour`"), "{m}");
        c.post("/attachments", json!({"attachment": {"volume_uuid": "not-a-uuid"}})).await.fault(400, "badRequest");
        c.post("/attachments", json!({"attachment": {"volume_uuid": volume, "instance_uuid": "nope"}})).await.fault(400, "badRequest");
        c.post("/attachments", json!({"attachment": {"volume_uuid": volume, "connector": "iqn"}})).await.fault(400, "badRequest");
        c.post("/attachments", json!({"attachment": {"volume_uuid": volume, "connector": {"initiator": ["a"]}}})).await.fault(400, "badRequest");

        let big = json!({"volume": {"size": 1, "description": "x".repeat(300 * 1024)}}).to_string().into_bytes();
        c.raw(Method::POST, "/volumes", json_ct, big).await.fault(413, "overLimit");
        let m = c.raw(Method::POST, "/volumes", Some("text/plain"), b"{\"volume\": {\"size\": 1}}".to_vec()).await.fault(415, "badMediaType");
        assert!(m.contains("text/plain"), "{m}");
        c.raw(Method::POST, "/volumes", None, b"{\"volume\": {\"size\": 1}}".to_vec()).await.fault(415, "badMediaType");
        c.raw(Method::POST, "/volumes", json_ct, Vec::new()).await.fault(400, "badRequest");
        // Cinder's own media type is accepted.
        c.raw(Method::POST, "/volumes", Some("application/vnd.openstack.volume+json"), b"{\"volume\": {\"size\": 1}}".to_vec()).await.expect(202);
        let after_accepted = census(&c).await;
        assert_eq!(after_accepted.0, before.0 + 1);

        let unknown = uuid::Uuid::new_v4();
        let m = c.get(&format!("/volumes/{unknown}")).await.fault(404, "itemNotFound");
        assert_eq!(m, format!("Volume {unknown} could not be found."));
        let m = c.get(&format!("/attachments/{unknown}")).await.fault(404, "itemNotFound");
        assert_eq!(m, format!("Volume attachment could not be found with filter: attachment_id = {unknown}."));
        c.get("/attachments/not-a-uuid").await.fault(404, "itemNotFound");
        c.attach(&unknown.to_string(), Some(connector("iqn.1993-08.org.debian:01:aa", "h"))).await.fault(404, "itemNotFound");
        c.delete(&format!("/attachments/{unknown}")).await.fault(404, "itemNotFound");
        c.put(&format!("/attachments/{unknown}"), json!({"attachment": {"connector": {"initiator": "iqn.2000-01.a:b"}}})).await.fault(404, "itemNotFound");
        c.delete(&format!("/volumes/{unknown}")).await.fault(404, "itemNotFound");

        let after = census(&c).await;
        assert_eq!((after.0, after.1), (after_accepted.0, before.1), "a refused request changed something");
    }

    async fn illegal_transitions_are_400s_that_change_nothing(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let r = c.attach(&volume, None).await.expect(200);
        let att = r.body["attachment"]["id"].as_str().unwrap().to_string();
        c.post(&format!("/attachments/{att}/action"), json!({"os-complete": null})).await.fault(400, "badRequest");
        c.attach(&volume, None).await.fault(400, "badRequest");
        c.delete(&format!("/volumes/{volume}")).await.fault(400, "badRequest");
        assert_eq!(c.volume_status(&volume).await, "reserved");
        c.delete(&format!("/attachments/{att}")).await.expect(200);
        c.delete(&format!("/attachments/{att}")).await.fault(404, "itemNotFound");
        assert_eq!(c.volume_status(&volume).await, "available");
    }
}

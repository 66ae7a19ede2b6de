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
        c.post(&format!("/volumes/{volume}/action"), json!({"os-begin_detaching": null})).await.fault(400, "badRequest");
        c.attach(&volume, None).await.fault(400, "badRequest");
        c.delete(&format!("/volumes/{volume}")).await.fault(400, "badRequest");
        assert_eq!(c.volume_status(&volume).await, "reserved");
        c.delete(&format!("/attachments/{att}")).await.expect(200);
        c.delete(&format!("/attachments/{att}")).await.fault(404, "itemNotFound");
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    /// The hardening issue's item 17: a create took 200 metadata items of 1,000 bytes and a name
    /// of 200,000 characters that an update would refuse. One set of bounds now, everywhere:
    /// names and descriptions of 255 characters, 128 metadata items, keys and values of 255.
    async fn a_volume_create_has_the_bounds_of_an_update(s) {
        let c = s.client("p1").at("3.54");
        let before = census(&c).await;
        let many: serde_json::Map<String, serde_json::Value> =
            (0..200).map(|i| (format!("k{i}"), json!("v"))).collect();
        let m = c.post("/volumes", json!({"volume": {"size": 1, "metadata": many}})).await.fault(400, "badRequest");
        assert!(m.contains("128"), "{m}");
        let long_value = "x".repeat(1000);
        let m = c.post("/volumes", json!({"volume": {"size": 1, "metadata": {"k": long_value}}})).await.fault(400, "badRequest");
        assert!(m.contains("255"), "{m}");
        let m = c.post("/volumes", json!({"volume": {"size": 1, "name": "n".repeat(200_000)}})).await.fault(400, "badRequest");
        assert!(m.contains("name") && m.contains("255"), "{m}");
        c.post("/volumes", json!({"volume": {"size": 1, "description": "d".repeat(256)}})).await.fault(400, "badRequest");
        c.post("/volumes", json!({"volume": {"size": 1, "display_name": "n".repeat(256)}})).await.fault(400, "badRequest");
        assert_eq!(census(&c).await, before, "a refused create changed something");

        // At the bounds, accepted; and an update cannot go past them either.
        let at_most: serde_json::Map<String, serde_json::Value> =
            (0..128).map(|i| (format!("k{i}"), json!("v".repeat(255)))).collect();
        let volume = c.create_volume(json!({"size": 1, "name": "é".repeat(255), "description": "d".repeat(255), "metadata": at_most})).await;
        let m = c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"one-more": "v"}})).await.fault(400, "badRequest");
        assert!(m.contains("128"), "{m}");
        c.put(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"k": "x".repeat(256)}})).await.fault(400, "badRequest");
        let shown = c.get(&format!("/volumes/{volume}/metadata")).await.expect(200);
        assert_eq!(shown.body["metadata"].as_object().unwrap().len(), 128);
    }

    /// The hardening issue's item 18: a NUL character was a 500 on PostgreSQL (names,
    /// descriptions, a connector's host, list filters, a marker), and a failed attachment create
    /// left an operation behind. It is a 400 at the boundary on both databases, and nothing is
    /// recorded.
    async fn a_nul_character_is_a_400_that_changes_nothing(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let before = census(&c).await;
        let nul = "a\u{0}b";
        for body in [
            json!({"volume": {"size": 1, "name": nul}}),
            json!({"volume": {"size": 1, "description": nul}}),
            json!({"volume": {"size": 1, "metadata": {"k": nul}}}),
        ] {
            let m = c.post("/volumes", body).await.fault(400, "badRequest");
            assert!(m.contains("NUL"), "{m}");
        }
        let mut with_nul_host = connector("iqn.1993-08.org.debian:01:nul", "h");
        with_nul_host["host"] = json!(nul);
        let m = c.attach(&volume, Some(with_nul_host.clone())).await.fault(400, "badRequest");
        assert!(m.contains("connector.host") && m.contains("NUL"), "{m}");
        let reserved = c.attach(&volume, None).await.expect(200).body["attachment"]["id"].as_str().unwrap().to_string();
        c.put(&format!("/attachments/{reserved}"), json!({"attachment": {"connector": with_nul_host}})).await.fault(400, "badRequest");
        c.delete(&format!("/attachments/{reserved}")).await.expect(200);
        for query in ["/volumes?name=a%00b", "/volumes/detail?status=%00", "/attachments?volume_id=%00", "/volumes?marker=a%00b", "/attachments?marker=%00x"] {
            let m = c.get(query).await.fault(400, "badRequest");
            assert!(m.contains("NUL"), "{query}: {m}");
        }
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {nul: "v"}})).await.fault(400, "badRequest");
        assert_eq!(census(&c).await, before, "a refused request changed something");
        let operations = s
            .service
            .store()
            .read(async |tx| berth::store::operations::all(tx).await)
            .await
            .unwrap();
        assert!(operations.is_empty(), "operations left behind: {operations:?}");
    }
}

/// A volume action Cinder has and this service has not (`cinder reset-state`, `migrate`,
/// `readonly-mode-update`, `upload-to-image`, `revert-to-snapshot`) is Cinder's 400 for an
/// unknown action, saying why it is not here and what to do instead; nothing changes.
#[tokio::test]
async fn a_cinder_action_not_served_here_says_why() {
    let s = berth_tests::server::TestServer::start(berth_tests::server::Db::Sqlite).await;
    let c = s.client("p1").at("3.71");
    let volume = c.create_volume(json!({"size": 1})).await;
    let before = census(&c).await;
    for (action, says) in [
        (json!({"os-reset_status": {"status": "error"}}), "every error state is left through the API itself"),
        (json!({"os-migrate_volume": {"host": "x"}}), "Volumes do not move between backends here"),
        (json!({"os-update_readonly_flag": {"readonly": true}}), "the attachment's `mode`"),
        (json!({"os-volume_upload_image": {"image_name": "i"}}), "no image service"),
        (json!({"revert": {"snapshot_id": volume}}), "takes no snapshots"),
    ] {
        let name = action.as_object().unwrap().keys().next().unwrap().clone();
        let message = c.post(&format!("/volumes/{volume}/action"), action).await.fault(400, "badRequest");
        assert!(
            message.starts_with(&format!("There is no such action: {name}. ")) && message.contains(says),
            "{message}"
        );
    }
    let message = c
        .post(&format!("/volumes/{volume}/action"), json!({"os-dance": null}))
        .await
        .fault(400, "badRequest");
    assert_eq!(message, "There is no such action: os-dance");
    assert_eq!(census(&c).await, before);
}

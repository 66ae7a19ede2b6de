//! Driver failures map to documented statuses (api/error.rs) and leave the volume in a state the
//! API can recover from: rolled back when the failure can be undone, `error_attaching` /
//! `error_detaching` / `error_deleting` when it cannot, and retrying then succeeds.
//! The fake driver's behaviour is scripted through the volume's metadata (`fake.<call>`).

use berth_tests::both_databases;
use berth_tests::server::{Client, connector};
use serde_json::json;

const INITIATOR: &str = "iqn.1993-08.org.debian:01:aaaa";

async fn script(c: &Client, volume: &str, call: &str, directive: &str) {
    c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {format!("fake.{call}"): directive}}))
        .await
        .expect(200);
}

async fn attachment_count(c: &Client, volume: &str) -> usize {
    c.at("3.27").get(&format!("/attachments?volume_id={volume}")).await.expect(200).body["attachments"]
        .as_array()
        .unwrap()
        .len()
}

both_databases! {
    async fn a_failed_attach_rolls_its_reservation_back(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        for (directive, status, fault) in [
            ("backend:the array is on fire", 502, "computeFault"),
            ("retryable:the array is busy", 503, "serviceUnavailable"),
            ("incompatible", 409, "conflictingRequest"),
            ("panic", 502, "computeFault"),
        ] {
            script(&c, &volume, "initialize-connection", directive).await;
            let r = c.attach(&volume, Some(connector(INITIATOR, "h1"))).await;
            let message = r.fault(status, fault);
            assert!(message.contains("driver fake") && message.contains("initialize-connection"), "{message}");
            if status == 503 {
                assert_eq!(r.header("retry-after"), Some("1"));
            }
            assert_eq!(c.volume_status(&volume).await, "available", "{directive}: the reservation must be rolled back");
            assert_eq!(attachment_count(&c, &volume).await, 0, "{directive}");
        }
        script(&c, &volume, "initialize-connection", "ok").await;
        c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.expect(200);
    }

    async fn a_bad_connector_is_a_400_before_anything_is_reserved(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let message = c.attach(&volume, Some(json!({"host": "h1"}))).await.fault(400, "badRequest");
        assert_eq!(message, "Invalid input received: Connector doesn't have required information: initiator");
        assert_eq!(c.volume_status(&volume).await, "available");
        assert_eq!(attachment_count(&c, &volume).await, 0);
    }

    async fn an_attach_whose_cleanup_fails_is_left_in_error_attaching_and_can_be_deleted(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        script(&c, &volume, "initialize-connection", "backend").await;
        script(&c, &volume, "terminate-connection", "backend").await;
        c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.fault(502, "computeFault");
        let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
        assert_eq!(listed.body["attachments"][0]["status"], "error_attaching");
        assert_eq!(c.volume_status(&volume).await, "in-use", "access may exist: the volume is not free");
        c.attach(&volume, None).await.fault(400, "badRequest");
        let att = listed.body["attachments"][0]["id"].as_str().unwrap().to_string();
        c.delete(&format!("/attachments/{att}")).await.fault(502, "computeFault");
        script(&c, &volume, "terminate-connection", "ok").await;
        c.delete(&format!("/attachments/{att}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    async fn a_failed_detach_leaves_error_detaching_and_a_retry_finishes_it(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let r = c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.expect(200);
        let att = r.body["attachment"]["id"].as_str().unwrap().to_string();
        c.post(&format!("/attachments/{att}/action"), json!({"os-complete": null})).await.expect(204);
        script(&c, &volume, "terminate-connection", "retryable").await;
        c.delete(&format!("/attachments/{att}")).await.fault(503, "serviceUnavailable");
        assert_eq!(c.get(&format!("/attachments/{att}")).await.expect(200).body["attachment"]["status"], "error_detaching");
        assert_eq!(c.volume_status(&volume).await, "in-use");
        script(&c, &volume, "terminate-connection", "ok").await;
        script(&c, &volume, "remove-export", "backend").await;
        c.delete(&format!("/attachments/{att}")).await.fault(502, "computeFault");
        script(&c, &volume, "remove-export", "ok").await;
        c.delete(&format!("/attachments/{att}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    async fn volume_create_and_delete_failures_are_recoverable(s) {
        let c = s.client("p1");
        let r = c.post("/volumes", json!({"volume": {"size": 1, "metadata": {"fake.create-volume": "unsupported"}}})).await;
        r.fault(501, "notImplemented");
        let list = c.get("/volumes/detail").await.expect(200);
        let failed = &list.body["volumes"][0];
        assert_eq!(failed["status"], "error");
        let id = failed["id"].as_str().unwrap().to_string();
        c.delete(&format!("/volumes/{id}")).await.expect(202);

        let id = c.create_volume(json!({"size": 1, "metadata": {"fake.delete-volume": "backend"}})).await;
        c.delete(&format!("/volumes/{id}")).await.fault(502, "computeFault");
        assert_eq!(c.volume_status(&id).await, "error_deleting");
        script(&c, &id, "delete-volume", "ok").await;
        c.delete(&format!("/volumes/{id}")).await.expect(202);
        c.get(&format!("/volumes/{id}")).await.fault(404, "itemNotFound");
    }

    async fn a_failed_update_leaves_the_attachment_reserved(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let att = c.attach(&volume, None).await.expect(200).body["attachment"]["id"].as_str().unwrap().to_string();
        script(&c, &volume, "create-export", "backend").await;
        c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": connector(INITIATOR, "h1")}})).await.fault(502, "computeFault");
        assert_eq!(c.get(&format!("/attachments/{att}")).await.expect(200).body["attachment"]["status"], "reserved");
        assert_eq!(c.volume_status(&volume).await, "reserved");
        script(&c, &volume, "create-export", "ok").await;
        c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": connector(INITIATOR, "h1")}})).await.expect(200);
    }

    async fn a_replaced_connector_whose_revoke_fails_leaves_error_attaching(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let att = c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.expect(200).body["attachment"]["id"].as_str().unwrap().to_string();
        script(&c, &volume, "terminate-connection", "backend").await;
        let other = connector("iqn.1993-08.org.debian:01:bbbb", "h2");
        c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": other}})).await.fault(502, "computeFault");
        assert_eq!(c.get(&format!("/attachments/{att}")).await.expect(200).body["attachment"]["status"], "error_attaching");
        assert_eq!(c.volume_status(&volume).await, "in-use", "access may remain");
        script(&c, &volume, "terminate-connection", "ok").await;
        c.delete(&format!("/attachments/{att}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }
}

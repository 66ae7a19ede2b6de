//! The legacy volume actions (`POST /volumes/{id}/action`): Cinder's bodies, status codes and
//! transitions, through the same state machine as the attachments API, and mixed flows in both
//! directions. The fake driver's calls are scripted through the volume's metadata
//! (`fake.<call>`): a call scripted to fail proves that a flow makes it.

use berth_tests::both_databases;
use berth_tests::server::{Client, connector};
use serde_json::{Value, json};

const ALICE: &str = "iqn.1993-08.org.debian:01:alice";
const BOB: &str = "iqn.1993-08.org.debian:01:bob";
const INSTANCE: &str = "5f1a7b52-8d2c-4f63-9a0e-3b7c1d2e4f60";

async fn act(c: &Client, volume: &str, action: &str, arg: Value) -> berth_tests::server::Resp {
    c.post(&format!("/volumes/{volume}/action"), json!({ action: arg })).await
}

async fn script(c: &Client, volume: &str, call: &str, directive: &str) {
    c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {format!("fake.{call}"): directive}}))
        .await
        .expect(200);
}

async fn attachments(c: &Client, volume: &str) -> Vec<Value> {
    c.at("3.27").get(&format!("/attachments/detail?volume_id={volume}")).await.expect(200).body["attachments"]
        .as_array()
        .unwrap()
        .clone()
}

/// The id of the volume's attachment on `host`, from the volume's view.
async fn attachment_of(c: &Client, volume: &str, host: &str) -> String {
    let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
    let list = shown.body["volume"]["attachments"].as_array().unwrap().clone();
    let found = list
        .iter()
        .find(|a| a["host_name"] == host)
        .unwrap_or_else(|| panic!("no attachment on {host}: {list:?}"));
    found["attachment_id"].as_str().unwrap().to_string()
}

/// reserve, initialize_connection, attach: the volume is in-use with one attachment.
async fn legacy_attach(c: &Client, volume: &str, initiator: &str, host: &str) -> Value {
    act(c, volume, "os-reserve", Value::Null).await.expect(202);
    let r =
        act(c, volume, "os-initialize_connection", json!({"connector": connector(initiator, host)})).await;
    let info = r.expect(200).body["connection_info"].clone();
    act(c, volume, "os-attach", json!({"mountpoint": "/dev/vdb", "host_name": host, "mode": "rw"}))
        .await
        .expect(202);
    info
}

both_databases! {
    async fn the_six_calls_attach_and_detach_with_cinders_statuses(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;

        act(&c, &volume, "os-reserve", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "attaching");
        let again = act(&c, &volume, "os-reserve", Value::Null).await.fault(400, "badRequest");
        assert!(again.contains("Invalid volume") && again.contains("attaching"), "{again}");

        let r = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await;
        let info = &r.expect(200).body["connection_info"];
        assert_eq!(info["driver_volume_type"], "iscsi");
        assert_eq!(info["enforce_multipath"], false);
        let data = &info["data"];
        assert_eq!(data["target_iqn"], json!(format!("iqn.2010-10.org.openstack:volume-{volume}")));
        assert_eq!(data["target_lun"], 1);
        assert_eq!(data["volume_id"], json!(volume));
        assert_eq!(data["access_mode"], "rw");
        assert_eq!(data["auth_method"], "CHAP");
        assert_eq!(data["enforce_multipath"], false);
        assert!(data.get("driver_volume_type").is_none() && data.get("attachment_id").is_none(), "nested, not flattened");
        assert_eq!(c.volume_status(&volume).await, "attaching");

        let body = json!({"mountpoint": "/dev/vdb", "instance_uuid": INSTANCE, "host_name": "h1", "mode": "rw"});
        act(&c, &volume, "os-attach", body.clone()).await.expect(202);
        let shown = c.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
        assert_eq!(shown["status"], "in-use");
        assert_eq!(shown["attachments"][0]["server_id"], INSTANCE);
        assert_eq!(shown["attachments"][0]["device"], "/dev/vdb");
        assert_eq!(shown["attachments"][0]["host_name"], "h1");
        act(&c, &volume, "os-attach", body).await.expect(202); // repeating it changes nothing
        let rows = attachments(&c, &volume).await;
        assert_eq!(rows.len(), 1, "the legacy attach is an attachment like any other");
        assert_eq!(rows[0]["status"], "attached");
        assert_eq!(rows[0]["instance"], INSTANCE);

        act(&c, &volume, "os-begin_detaching", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "detaching");
        act(&c, &volume, "os-roll_detaching", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "in-use");
        act(&c, &volume, "os-begin_detaching", Value::Null).await.expect(202);
        act(&c, &volume, "os-terminate_connection", json!({"connector": connector(ALICE, "h1")})).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "detaching");
        let id = rows[0]["id"].as_str().unwrap();
        act(&c, &volume, "os-detach", json!({"attachment_id": id})).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "available");
        assert!(attachments(&c, &volume).await.is_empty());
    }

    async fn unreserve_releases_a_reservation_and_revokes_what_it_was_given(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        act(&c, &volume, "os-unreserve", Value::Null).await.expect(202); // nothing to do
        act(&c, &volume, "os-reserve", Value::Null).await.expect(202);
        act(&c, &volume, "os-unreserve", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "available");
        assert!(attachments(&c, &volume).await.is_empty());

        act(&c, &volume, "os-reserve", Value::Null).await.expect(202);
        act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await.expect(200);
        script(&c, &volume, "terminate-connection", "backend").await;
        act(&c, &volume, "os-unreserve", Value::Null).await.fault(502, "computeFault");
        script(&c, &volume, "terminate-connection", "ok").await;
        act(&c, &volume, "os-unreserve", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "available");
        assert!(attachments(&c, &volume).await.is_empty());
    }

    async fn initialize_connection_is_idempotent_and_never_grants_access_without_a_row(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        // Without os-reserve, the call reserves for itself.
        let first = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await;
        let first = first.expect(200).body["connection_info"].clone();
        assert_eq!(c.volume_status(&volume).await, "attaching");
        let rows = attachments(&c, &volume).await;
        assert_eq!(rows.len(), 1);
        // Again, with the connector as a JSON string (Cinder accepts both): the same answer, no new row.
        let text = connector(ALICE, "h1").to_string();
        let second = act(&c, &volume, "os-initialize_connection", json!({"connector": text})).await;
        assert_eq!(second.expect(200).body["connection_info"], first);
        assert_eq!(attachments(&c, &volume).await.len(), 1);
        act(&c, &volume, "os-attach", json!({"mountpoint": "/dev/vdb", "host_name": "h1"})).await.expect(202);
        // Clients call it again to detach: still the same answer, and the volume stays in-use.
        let third = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await;
        assert_eq!(third.expect(200).body["connection_info"], first);
        assert_eq!(c.volume_status(&volume).await, "in-use");
        // Another host cannot take a volume that is not multiattach.
        let other = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(BOB, "h2")})).await;
        other.fault(400, "badRequest");
        assert_eq!(attachments(&c, &volume).await.len(), 1);
    }

    async fn a_failed_initialize_connection_leaves_the_reservation_for_unreserve(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        act(&c, &volume, "os-reserve", Value::Null).await.expect(202);
        script(&c, &volume, "initialize-connection", "backend").await;
        let r = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await;
        r.fault(502, "computeFault");
        assert_eq!(c.volume_status(&volume).await, "attaching");
        let rows = attachments(&c, &volume).await;
        assert_eq!(rows[0]["status"], "reserved");
        act(&c, &volume, "os-unreserve", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "available");
        // Without a reservation, a failure rolls back the one the call made.
        let r = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await;
        r.fault(502, "computeFault");
        assert_eq!(c.volume_status(&volume).await, "available");
        assert!(attachments(&c, &volume).await.is_empty());
    }

    async fn bad_legacy_requests_are_4xx_and_change_nothing(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        let path = format!("/volumes/{volume}/action");
        for (body, status) in [
            (json!({"os-frobnicate": null}), 400),
            (json!({"os-reserve": null, "os-unreserve": null}), 400),
            (json!({}), 400),
            (json!({"os-initialize_connection": {}}), 400),
            (json!({"os-initialize_connection": {"connector": 7}}), 400),
            (json!({"os-initialize_connection": {"connector": "not json"}}), 400),
            (json!({"os-initialize_connection": {"connector": {"host": "h1"}}}), 400),
            (json!({"os-initialize_connection": {"connector": connector(ALICE, "h"), "extra": 1}}), 400),
            (json!({"os-attach": {"host_name": "h1"}}), 400),
            (json!({"os-attach": {"mountpoint": "/dev/vdb"}}), 400),
            (json!({"os-attach": {"mountpoint": "", "host_name": "h1"}}), 400),
            (json!({"os-attach": {"mountpoint": "/dev/vdb", "host_name": "h1", "mode": "rx"}}), 400),
            (json!({"os-attach": {"mountpoint": "/dev/vdb", "instance_uuid": "nope"}}), 400),
            (json!({"os-attach": {"mountpoint": "/dev/vdb", "host_name": "h1"}}), 400),
            (json!({"os-begin_detaching": null}), 400),
            (json!({"os-detach": {"attachment_id": "nope"}}), 400),
            (json!({"os-detach": {"attachment_id": INSTANCE}}), 400),
            (json!({"os-terminate_connection": {}}), 400),
        ] {
            let r = c.post(&path, body.clone()).await;
            assert_eq!(r.status, status, "{body}: {:?}", r.body);
            assert!(r.body["badRequest"]["message"].is_string(), "{body}: {:?}", r.body);
            assert_eq!(c.volume_status(&volume).await, "available", "{body}");
        }
        assert!(attachments(&c, &volume).await.is_empty());
        let member = c.with_roles("member");
        act(&member, &volume, "os-force_detach", Value::Null).await.fault(403, "forbidden");
        let stranger = s.client("p2").with_roles("member");
        act(&stranger, &volume, "os-reserve", Value::Null).await.fault(404, "itemNotFound");
        let missing = "00000000-0000-4000-8000-000000000000";
        act(&c, missing, "os-reserve", Value::Null).await.fault(404, "itemNotFound");
    }

    async fn a_legacy_attach_is_detached_by_the_attachments_api_without_leaking_its_export(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        legacy_attach(&c, &volume, ALICE, "h1").await;
        let id = attachments(&c, &volume).await[0]["id"].as_str().unwrap().to_string();
        let shown = c.at("3.27").get(&format!("/attachments/{id}")).await.expect(200);
        assert_eq!(shown.body["attachment"]["connection_info"]["target_lun"], 1, "legacy attachments keep their connection");
        // The stored connector is used: terminate-connection is called (here it fails, as scripted).
        script(&c, &volume, "terminate-connection", "backend").await;
        c.at("3.27").delete(&format!("/attachments/{id}")).await.fault(502, "computeFault");
        script(&c, &volume, "terminate-connection", "ok").await;
        c.at("3.27").delete(&format!("/attachments/{id}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    async fn an_attachments_api_attach_is_detached_by_the_legacy_calls(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let r = c.attach(&volume, Some(connector(ALICE, "h1"))).await.expect(200);
        let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
        c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);

        // A detaching client asks for the connection again, as brick-ext does.
        let again = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await;
        assert_eq!(again.expect(200).body["connection_info"]["data"]["target_lun"], 1);
        act(&c, &volume, "os-begin_detaching", Value::Null).await.expect(202);
        script(&c, &volume, "terminate-connection", "backend").await;
        let r = act(&c, &volume, "os-terminate_connection", json!({"connector": connector(ALICE, "h1")})).await;
        r.fault(502, "computeFault");
        script(&c, &volume, "terminate-connection", "ok").await;
        act(&c, &volume, "os-terminate_connection", json!({"connector": connector(ALICE, "h1")})).await.expect(202);
        // Access is revoked once: the detach needs no more driver calls.
        script(&c, &volume, "terminate-connection", "backend").await;
        act(&c, &volume, "os-detach", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "available");
        assert!(attachments(&c, &volume).await.is_empty());
    }

    async fn a_multiattach_volume_is_attached_and_detached_per_host(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        legacy_attach(&c, &volume, ALICE, "h1").await;
        legacy_attach(&c, &volume, BOB, "h2").await;
        assert_eq!(attachments(&c, &volume).await.len(), 2);
        assert_eq!(c.volume_status(&volume).await, "in-use");

        let member = c.with_roles("member");
        act(&member, &volume, "os-terminate_connection", json!({"connector": null})).await.fault(409, "conflictingRequest");
        act(&member, &volume, "os-detach", Value::Null).await.fault(409, "conflictingRequest");

        act(&c, &volume, "os-begin_detaching", Value::Null).await.expect(202);
        act(&c, &volume, "os-terminate_connection", json!({"connector": connector(ALICE, "h1")})).await.expect(202);
        let alice = attachment_of(&c, &volume, "h1").await;
        act(&c, &volume, "os-detach", json!({"attachment_id": alice})).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "in-use", "bob is still attached");
        assert_eq!(attachments(&c, &volume).await.len(), 1);
        attachment_of(&c, &volume, "h2").await;
    }

    async fn an_unknown_connector_on_terminate_is_not_an_error(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        legacy_attach(&c, &volume, ALICE, "h1").await;
        act(&c, &volume, "os-terminate_connection", json!({"connector": connector(BOB, "h2")})).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "in-use");
        let rows = attachments(&c, &volume).await;
        assert_eq!(rows.len(), 1, "alice's attachment is untouched");
        let again = act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await;
        again.expect(200);
        assert_eq!(attachments(&c, &volume).await.len(), 1, "and still has its connector");
    }

    async fn force_detach_revokes_access_before_it_changes_the_database(s) {
        let admin = s.client("p1");
        let c = admin.with_roles("member");
        let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        legacy_attach(&c, &volume, ALICE, "h1").await;
        legacy_attach(&c, &volume, BOB, "h2").await;
        script(&c, &volume, "terminate-connection", "backend").await;
        act(&admin, &volume, "os-force_detach", Value::Null).await.fault(502, "computeFault");
        assert_eq!(attachments(&c, &volume).await.len(), 2, "nothing changed");
        assert_eq!(c.volume_status(&volume).await, "in-use");
        script(&c, &volume, "terminate-connection", "ok").await;

        let bob = attachment_of(&admin, &volume, "h2").await;
        act(&admin, &volume, "os-force_detach", json!({"attachment_id": bob})).await.expect(202);
        assert_eq!(attachments(&c, &volume).await.len(), 1);
        act(&admin, &volume, "os-force_detach", json!({"connector": connector(ALICE, "h1")})).await.expect(202);
        assert!(attachments(&c, &volume).await.is_empty());
        assert_eq!(c.volume_status(&volume).await, "available");

        legacy_attach(&c, &volume, ALICE, "h1").await;
        act(&c, &volume, "os-begin_detaching", Value::Null).await.expect(202);
        act(&admin, &volume, "os-force_detach", json!({})).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "available", "force detach ends a detach lock too");
    }

    async fn a_failed_legacy_terminate_leaves_error_detaching_and_detach_finishes_it(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        legacy_attach(&c, &volume, ALICE, "h1").await;
        act(&c, &volume, "os-begin_detaching", Value::Null).await.expect(202);
        script(&c, &volume, "terminate-connection", "backend").await;
        act(&c, &volume, "os-terminate_connection", json!({"connector": connector(ALICE, "h1")})).await.fault(502, "computeFault");
        assert_eq!(attachments(&c, &volume).await[0]["status"], "error_detaching");
        script(&c, &volume, "terminate-connection", "ok").await;
        act(&c, &volume, "os-detach", Value::Null).await.expect(202);
        assert_eq!(c.volume_status(&volume).await, "available");
        assert!(attachments(&c, &volume).await.is_empty());
    }

    async fn a_failed_replay_of_initialize_connection_changes_nothing(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        legacy_attach(&c, &volume, ALICE, "h1").await;
        script(&c, &volume, "initialize-connection", "backend").await;
        act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await.fault(502, "computeFault");
        let rows = attachments(&c, &volume).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["status"], "attached");
        assert_eq!(c.volume_status(&volume).await, "in-use");
        script(&c, &volume, "initialize-connection", "ok").await;
        act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "h1")})).await.expect(200);
    }

    async fn a_failed_revoke_of_an_unknown_connector_changes_nothing(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        legacy_attach(&c, &volume, ALICE, "h1").await;
        script(&c, &volume, "terminate-connection", "retryable").await;
        act(&c, &volume, "os-terminate_connection", json!({"connector": connector(BOB, "h2")})).await.fault(503, "serviceUnavailable");
        let rows = attachments(&c, &volume).await;
        assert_eq!((rows.len(), rows[0]["status"].clone()), (1, json!("attached")));
        assert_eq!(c.volume_status(&volume).await, "in-use");
    }
}

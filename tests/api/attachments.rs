//! The attachments API: every call, status code and transition (cinder-compat.md 1.4, 2.2).

use berth_tests::both_databases;
use berth_tests::server::{Client, Resp, connector};
use serde_json::{Value, json};

const INITIATOR: &str = "iqn.1993-08.org.debian:01:aaaa";

fn id(r: &Resp) -> String {
    r.body["attachment"]["id"].as_str().expect("an attachment id").to_string()
}

async fn status(c: &Client, attachment: &str) -> Value {
    c.at("3.54").get(&format!("/attachments/{attachment}")).await.expect(200).body["attachment"]["status"]
        .clone()
}

both_databases! {
    async fn reserve_update_complete_and_delete_walk_cinders_state_table(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let instance = uuid::Uuid::new_v4().to_string();

        // POST without a connector: a reservation.
        let r = c.post("/attachments", json!({"attachment": {"volume_uuid": volume, "instance_uuid": instance}})).await.expect(200);
        assert_eq!(r.body["attachment"], json!({
            "id": id(&r), "status": "reserved", "instance": instance, "volume_id": volume,
            "attached_at": "", "detached_at": "", "attach_mode": "null", "connection_info": {}
        }));
        assert_eq!(c.volume_status(&volume).await, "reserved");
        let att = id(&r);

        // PUT a connector: connected.
        let r = c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": connector(INITIATOR, "h1")}})).await.expect(200);
        let a = &r.body["attachment"];
        assert_eq!(a["status"], "attaching", "the real status, not Cinder's stale 'reserved'");
        assert_eq!(a["attach_mode"], "rw");
        assert!(a["attached_at"].as_str().is_some_and(|t| t.len() == 26));
        let info = &a["connection_info"];
        assert_eq!(info["driver_volume_type"], "iscsi");
        assert_eq!(info["attachment_id"], json!(att));
        assert_eq!(info["enforce_multipath"], false);
        assert_eq!(info["target_lun"], 1);
        assert_eq!(info["target_iqn"], json!(format!("iqn.2010-10.org.openstack:volume-{volume}")));
        assert_eq!(info["access_mode"], "rw");
        assert!(info["auth_password"].as_str().is_some_and(|p| p.len() >= 12));
        assert_eq!(c.volume_status(&volume).await, "attaching");
        assert!(c.get(&format!("/volumes/{volume}")).await.body["volume"]["attachments"].as_array().unwrap().is_empty(),
            "a volume lists attached attachments only");

        // os-complete: attached.
        let r = c.post(&format!("/attachments/{att}/action"), json!({"os-complete": null})).await.expect(204);
        assert_eq!(r.body, Value::Null);
        assert_eq!(status(&c, &att).await, "attached");
        assert_eq!(c.volume_status(&volume).await, "in-use");
        let v = c.get(&format!("/volumes/{volume}")).await.expect(200);
        let listed = &v.body["volume"]["attachments"][0];
        assert_eq!(listed["attachment_id"], json!(att));
        assert_eq!(listed["server_id"], json!(instance));
        assert_eq!(listed["host_name"], "h1");
        assert_eq!(listed["device"], "na");

        // DELETE: gone, the volume is available again.
        let r = c.delete(&format!("/attachments/{att}")).await.expect(200);
        assert_eq!(r.body, json!({"attachments": []}));
        assert_eq!(c.volume_status(&volume).await, "available");
        c.get(&format!("/attachments/{att}")).await.fault(404, "itemNotFound");
    }

    async fn a_create_with_a_connector_connects_at_once(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        let r = c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.expect(200);
        assert_eq!(r.body["attachment"]["status"], "attaching");
        assert_eq!(r.body["attachment"]["connection_info"]["attachment_id"], json!(id(&r)));
        assert_eq!(c.volume_status(&volume).await, "attaching");
        // An empty connector only reserves, as in Cinder.
        let other = c.create_volume(json!({"size": 1})).await;
        let r = c.attach(&other, Some(json!({}))).await.expect(200);
        assert_eq!(r.body["attachment"]["status"], "reserved");
    }

    async fn the_mode_is_accepted_from_3_54_and_honoured_in_access_mode(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        let body = |mode: &str| json!({"attachment": {"volume_uuid": volume, "mode": mode, "connector": connector(INITIATOR, "h1")}});
        let message = c.at("3.53").post("/attachments", body("ro")).await.fault(400, "badRequest");
        assert!(message.contains("'mode' was unexpected"), "{message}");
        c.at("3.54").post("/attachments", body("rx")).await.fault(400, "badRequest");
        let r = c.at("3.54").post("/attachments", body("ro")).await.expect(200);
        assert_eq!(r.body["attachment"]["attach_mode"], "ro");
        assert_eq!(r.body["attachment"]["connection_info"]["access_mode"], "ro", "Cinder reports rw here (Q7)");
    }

    async fn a_non_multiattach_volume_refuses_a_second_attachment(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        c.attach(&volume, None).await.expect(200);
        let message = c.attach(&volume, Some(connector(INITIATOR, "h2"))).await.fault(400, "badRequest");
        assert_eq!(message, format!(
            "Invalid volume: Volume {volume} status must be available to reserve, but the current status is reserved."
        ));
        let listed = c.at("3.27").get(&format!("/attachments?volume_id={volume}")).await.expect(200);
        assert_eq!(listed.body["attachments"].as_array().unwrap().len(), 1);
    }

    async fn a_multiattach_volume_takes_many_and_delete_answers_with_the_rest(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        let a = id(&c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.expect(200));
        let b = id(&c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:bbbb", "h2"))).await.expect(200));
        let r = c.attach(&volume, None).await.expect(200);
        let reserved = id(&r);
        assert_eq!(c.volume_status(&volume).await, "attaching");
        let c = c.at("3.44");
        c.post(&format!("/attachments/{a}/action"), json!({"os-complete": {}})).await.expect(204);
        c.post(&format!("/attachments/{b}/action"), json!({"os-complete": {}})).await.expect(204);
        assert_eq!(c.volume_status(&volume).await, "reserved", "the least advanced attachment decides");
        let r = c.delete(&format!("/attachments/{reserved}")).await.expect(200);
        let mut rest: Vec<String> = r.body["attachments"].as_array().unwrap().iter().map(|x| x["id"].as_str().unwrap().to_string()).collect();
        rest.sort();
        let mut expected = vec![a.clone(), b.clone()];
        expected.sort();
        assert_eq!(rest, expected);
        assert_eq!(r.body["attachments"][0]["status"], "attached");
        assert_eq!(c.volume_status(&volume).await, "in-use");
        c.delete(&format!("/attachments/{a}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "in-use");
        c.delete(&format!("/attachments/{b}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    async fn show_answers_which_attachments_share_the_connection(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        let a = id(&c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.expect(200));
        let b = id(&c.attach(&volume, Some(connector(INITIATOR, "h1"))).await.expect(200));
        let other = id(&c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:cccc", "h3"))).await.expect(200));
        let reserved = id(&c.attach(&volume, None).await.expect(200));
        let shown = c.at("3.27").get(&format!("/attachments/{a}")).await.expect(200);
        assert_eq!(shown.body["attachment"]["shared_connections_by_attachment"], json!([b]));
        let shown = c.at("3.27").get(&format!("/attachments/{other}")).await.expect(200);
        assert_eq!(shown.body["attachment"]["shared_connections_by_attachment"], json!([]));
        let shown = c.at("3.27").get(&format!("/attachments/{reserved}")).await.expect(200);
        assert_eq!(shown.body["attachment"]["shared_connections_by_attachment"], json!([]));
    }

    async fn lists_filter_page_and_sort(s) {
        let c = s.client("p1").at("3.54");
        let v1 = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        let v2 = c.create_volume(json!({"size": 1})).await;
        let instance = uuid::Uuid::new_v4().to_string();
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(id(&c.attach(&v1, Some(connector(INITIATOR, "h1"))).await.expect(200)));
        }
        let r = c.post("/attachments", json!({"attachment": {"volume_uuid": v2, "instance_uuid": instance}})).await.expect(200);
        let on_v2 = id(&r);
        c.post(&format!("/attachments/{}/action", ids[0]), json!({"os-complete": null})).await.expect(204);

        let count = |r: Resp| r.body["attachments"].as_array().unwrap().len();
        assert_eq!(count(c.get("/attachments").await.expect(200)), 4);
        assert_eq!(count(c.get(&format!("/attachments?volume_id={v1}")).await.expect(200)), 3);
        let by_instance = c.get(&format!("/attachments?instance_id={instance}")).await.expect(200);
        assert_eq!(by_instance.body["attachments"], json!([{"id": on_v2, "status": "reserved", "instance": instance, "volume_id": v2}]));
        assert_eq!(count(c.get("/attachments?attach_status=attached").await.expect(200)), 1);
        assert_eq!(count(c.get("/attachments?status=attaching").await.expect(200)), 2, "status is an alias (Cinder answers [] here, Q4)");
        let detail = c.get("/attachments/detail?attach_status=attached").await.expect(200);
        assert!(detail.body["attachments"][0]["connection_info"]["target_iqn"].is_string());

        let page = c.get(&format!("/attachments?volume_id={v1}&sort=created_at:asc&limit=2")).await.expect(200);
        let first: Vec<&str> = page.body["attachments"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
        assert_eq!(first, [ids[0].as_str(), ids[1].as_str()]);
        let next = c.get(&format!("/attachments?volume_id={v1}&sort=created_at:asc&marker={}", ids[1])).await.expect(200);
        assert_eq!(next.body["attachments"][0]["id"], json!(ids[2]));
        let last_first = c.get(&format!("/attachments?volume_id={v1}&sort_key=created_at&sort_dir=desc&limit=1")).await.expect(200);
        assert_eq!(last_first.body["attachments"][0]["id"], json!(ids[2]));

        c.get("/attachments?colour=red").await.fault(400, "badRequest");
        c.at("3.30").get("/attachments?colour=red").await.expect(200);
        c.get("/attachments?sort=nonsense").await.fault(400, "badRequest");
        c.get("/attachments?limit=x").await.fault(400, "badRequest");
        c.get(&format!("/attachments?marker={}", uuid::Uuid::new_v4())).await.fault(404, "itemNotFound");
    }

    /// `os-complete` takes a connected attachment, or a reservation without connector (Nova's
    /// shelved-offloaded server; `nova.rs`); an attachment whose connect failed beyond undoing
    /// (`error_attaching`) is not completed.
    async fn complete_needs_a_connected_attachment_or_a_bare_reservation(s) {
        let c = s.client("p1").at("3.44");
        let volume = c.create_volume(json!({"size": 1})).await;
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {
            "fake.initialize-connection": "backend", "fake.terminate-connection": "backend"}})).await.expect(200);
        c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:aa", "h"))).await.fault(502, "computeFault");
        let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
        let att = listed.body["attachments"][0]["id"].as_str().unwrap().to_string();
        assert_eq!(status(&c, &att).await, "error_attaching");
        let message = c.post(&format!("/attachments/{att}/action"), json!({"os-complete": null})).await.fault(400, "badRequest");
        assert!(message.contains("error_attaching"), "{message}");
        assert_eq!(status(&c, &att).await, "error_attaching");
        c.post(&format!("/attachments/{att}/action"), json!({"os-bogus": null})).await.fault(400, "badRequest");
        c.post(&format!("/attachments/{}/action", uuid::Uuid::new_v4()), json!({"os-complete": null})).await.fault(404, "itemNotFound");
    }

    async fn update_needs_a_connector_and_refuses_bad_ones_without_changing_anything(s) {
        let c = s.client("p1").at("3.44");
        let volume = c.create_volume(json!({"size": 1})).await;
        let att = id(&c.attach(&volume, None).await.expect(200));
        c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": {}}})).await.fault(400, "badRequest");
        c.put(&format!("/attachments/{att}"), json!({"attachment": {}})).await.fault(400, "badRequest");
        let message = c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": {"host": "h1"}}})).await.fault(400, "badRequest");
        assert_eq!(message, "Invalid input received: Connector doesn't have required information: initiator");
        c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": {"initiator": 7}}})).await.fault(400, "badRequest");
        assert_eq!(status(&c, &att).await, "reserved");
        assert_eq!(c.volume_status(&volume).await, "reserved");
        // And again with a good one: re-running update on a connected attachment is allowed.
        c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": connector(INITIATOR, "h1")}})).await.expect(200);
        c.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": connector(INITIATOR, "h1")}})).await.expect(200);
        assert_eq!(status(&c, &att).await, "attaching");
    }

    async fn the_connector_is_kept_in_attachment_specs_with_values_of_any_length(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        let long = "x".repeat(20_000);
        let mut conn = connector(INITIATOR, "h1");
        conn["long_key"] = json!(long);
        conn["nested"] = json!({"a": [1, 2, {"b": null}]});
        let att = id(&c.attach(&volume, Some(conn.clone())).await.expect(200));
        let store = s.service.store();
        let stored = store.read(async |tx| berth::store::attachments::connectors(tx, &[att.as_str()]).await).await.unwrap();
        assert_eq!(Value::Object(stored[&att].json().clone()), conn);
        // The store keeps one row per key.
        c.at("3.27").delete(&format!("/attachments/{att}")).await.expect(200);
        let gone = store.read(async |tx| berth::store::attachments::connectors(tx, &[att.as_str()]).await).await.unwrap();
        assert!(gone.is_empty());
    }

    async fn ids_are_matched_in_any_uuid_spelling(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        let r = c.attach(&volume.to_uppercase(), None).await.expect(200);
        assert_eq!(r.body["attachment"]["volume_id"], json!(volume));
        c.at("3.27").get(&format!("/attachments/{}", id(&r).to_uppercase())).await.expect(200);
    }
}

/// An attach's and a detach's intents are written, not synced, and each waits for one durable
/// commit: its outcome's. The fake driver changes nothing that outlives the machine's power; a
/// driver that does has the intent synced first (tests/confinement.rs, tests/network.rs).
/// (The least of three cycles: the node's heartbeat may commit during one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attach_and_a_detach_each_commit_only_their_outcome_durably() {
    let s = berth_tests::server::TestServer::start(berth_tests::server::Db::Sqlite).await;
    let c = s.client("p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let store = s.service.store().clone();
    let (mut attach, mut detach) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let before = store.commits();
        let body = json!({"attachment": {"volume_uuid": volume, "connector": connector(INITIATOR, "h1")}});
        let att = id(&c.post("/attachments", body).await.expect(200));
        attach.push(store.commits() - before);
        let before = store.commits();
        c.delete(&format!("/attachments/{att}")).await.expect(200);
        detach.push(store.commits() - before);
    }
    assert_eq!(attach.iter().min(), Some(&1), "an attach's durable commits: {attach:?}");
    assert_eq!(detach.iter().min(), Some(&1), "a detach's durable commits: {detach:?}");
}

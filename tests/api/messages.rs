//! User messages (3.3; `cinder message-list`): why an operation on a volume failed, for its users
//! to read afterwards, as Cinder records them. A driver that fails to make, grow, attach or detach
//! a volume leaves one message in the volume's project, in Cinder's words (never the driver's),
//! naming the volume and the request that failed; an operation that succeeds leaves none. Readers
//! of the project read them, members delete them, other projects never see them.

use berth_tests::both_databases;
use berth_tests::server::{Client, connector};
use serde_json::{Value, json};

async fn messages(c: &Client, query: &str) -> Vec<Value> {
    c.at("3.5").get(&format!("/messages{query}")).await.expect(200).body["messages"]
        .as_array()
        .unwrap()
        .clone()
}

async fn script(c: &Client, volume: &str, call: &str, directive: &str) {
    c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {format!("fake.{call}"): directive}}))
        .await
        .expect(200);
}

both_databases! {
    async fn each_failed_driver_call_leaves_one_message_in_cinders_words(s) {
        let c = s.client("p1").with_roles("member").at("3.54");
        let fire = "backend:the array at 10.0.0.7 is on fire";

        // A create whose driver fails: the volume is `error`, and the message says why.
        let r = c.post("/volumes", json!({"volume": {"size": 1, "metadata": {"fake.create-volume": fire}}})).await;
        r.fault(502, "computeFault");
        let request = r.header("x-openstack-request-id").unwrap().to_string();
        let failed = c.get("/volumes/detail").await.expect(200).body["volumes"][0].clone();
        assert_eq!(failed["status"], "error");
        let failed = failed["id"].as_str().unwrap().to_string();
        let listed = messages(&c, "").await;
        assert_eq!(listed.len(), 1, "{listed:?}");
        let m = &listed[0];
        assert_eq!(
            (&m["event_id"], &m["user_message"], &m["message_level"], &m["resource_type"], &m["resource_uuid"], &m["request_id"]),
            (
                &json!("VOLUME_VOLUME_008_012"),
                &json!("create volume from backend storage:Driver failed to create the volume."),
                &json!("ERROR"),
                &json!("VOLUME"),
                &json!(failed),
                &json!(request)
            )
        );
        assert!(!m.to_string().contains("10.0.0.7"), "the driver's words are not the user's: {m}");
        assert!(m["guaranteed_until"].as_str().unwrap() > m["created_at"].as_str().unwrap(), "{m}");
        let id = m["id"].as_str().unwrap().to_string();
        assert_eq!(c.at("3.3").get(&format!("/messages/{id}")).await.expect(200).body["message"], *m);

        // An extend, an attach and a detach whose driver fails: one message each, newest first.
        let volume = c.create_volume(json!({"size": 1})).await;
        script(&c, &volume, "extend-volume", fire).await;
        c.post(&format!("/volumes/{volume}/action"), json!({"os-extend": {"new_size": 2}})).await.fault(502, "computeFault");
        script(&c, &volume, "initialize-connection", fire).await;
        c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:m", "m"))).await.fault(502, "computeFault");
        script(&c, &volume, "initialize-connection", "ok").await;
        let a = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:m", "m"))).await.expect(200);
        let a = a.body["attachment"]["id"].as_str().unwrap().to_string();
        script(&c, &volume, "terminate-connection", fire).await;
        c.delete(&format!("/attachments/{a}")).await.fault(502, "computeFault");
        let of_volume = messages(&c, &format!("?resource_uuid={volume}")).await;
        let said: Vec<&str> = of_volume.iter().map(|m| m["user_message"].as_str().unwrap()).collect();
        assert_eq!(said, [
            "update attachment:Failed to detach volume.",
            "update attachment:Failed to attach volume.",
            "extend volume:Volume Driver failed to extend volume.",
        ]);
        assert_eq!(messages(&c, "").await.len(), 4, "the operations that succeeded left none");

        // Filters, sorting and paging (3.5), as Cinder's.
        let attach = messages(&c, "?event_id=VOLUME_VOLUME_004_021").await;
        assert_eq!(attach.len(), 1);
        let oldest = messages(&c, "?sort=created_at:asc&limit=2").await;
        assert_eq!(oldest[0]["id"], json!(id));
        let next = messages(&c, &format!("?sort=created_at:asc&limit=2&marker={}", oldest[1]["id"].as_str().unwrap())).await;
        assert_eq!(next.len(), 2);
        c.at("3.31").get("/messages?colour=blue").await.fault(400, "badRequest");

        // Another project sees none of them, and cannot read or delete one by id.
        let other = s.client("p2").with_roles("member").at("3.3");
        assert!(messages(&other, "").await.is_empty());
        other.get(&format!("/messages/{id}")).await.fault(404, "itemNotFound");
        other.delete(&format!("/messages/{id}")).await.fault(404, "itemNotFound");
        // A reader reads them and may not delete; a member deletes one, once.
        let reader = s.client("p1").with_roles("reader").at("3.3");
        assert_eq!(messages(&reader, "").await.len(), 4);
        reader.delete(&format!("/messages/{id}")).await.fault(403, "forbidden");
        c.at("3.3").delete(&format!("/messages/{id}")).await.expect(204);
        c.at("3.3").get(&format!("/messages/{id}")).await.fault(404, "itemNotFound");
        c.at("3.3").delete(&format!("/messages/{id}")).await.fault(404, "itemNotFound");
        // An admin of any project reads every project's, as in Cinder.
        assert_eq!(messages(&s.client("p9").with_roles("admin"), "").await.len(), 3);
        // Before 3.3 there are no messages.
        c.at("3.2").get("/messages").await.fault(404, "itemNotFound");
        c.at("3.3").get("/messages/not-a-uuid").await.fault(400, "badRequest");
    }
}

/// A message lives `[messages] keep_days`: once expired it is no longer shown, and the hourly
/// purge deletes it, in short writes.
#[tokio::test]
async fn an_expired_message_is_no_longer_shown_and_is_purged() {
    let mut config = berth_tests::server::fake_config();
    config.messages.keep_days = 0;
    let s = berth_tests::server::TestServer::start_with(berth_tests::server::Db::Sqlite, config).await;
    let c = s.client("p1").at("3.54");
    let r = c
        .post("/volumes", json!({"volume": {"size": 1, "metadata": {"fake.create-volume": "backend"}}}))
        .await;
    r.fault(502, "computeFault");
    assert!(messages(&c, "").await.is_empty());
    // Many expired (as after a month of a failing backend): purged in writes of a thousand, all.
    let expired: Vec<berth::store::messages::Message> = (0..2500)
        .map(|i| berth::store::messages::Message {
            id: uuid::Uuid::new_v4().to_string(),
            project_id: "p1".into(),
            request_id: None,
            resource_type: "VOLUME".into(),
            resource_uuid: None,
            event_id: "VOLUME_VOLUME_007_010".into(),
            action_id: "007".into(),
            detail_id: "010".into(),
            message_level: "ERROR".into(),
            created_at: i,
            expires_at: i,
        })
        .collect();
    s.service
        .store()
        .write(async |tx| {
            for m in &expired {
                berth::store::messages::insert(tx, m).await?;
            }
            Ok::<_, berth::store::StoreError>(())
        })
        .await
        .unwrap();
    assert_eq!(s.service.purge_messages().await.unwrap(), 2501);
    assert_eq!(s.service.purge_messages().await.unwrap(), 0);
}

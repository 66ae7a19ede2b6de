//! Volume transfers (`os-volume-transfer`, `volume-transfers` from 3.55): a project offers an
//! available volume with a key; the project that presents the key takes it over.

use berth::params;
use berth_tests::both_databases;
use berth_tests::server::{Client, connector};
use serde_json::{Value, json};

async fn offer(c: &Client, volume: &str) -> (String, String) {
    let r = c
        .post("/os-volume-transfer", json!({"transfer": {"volume_id": volume, "name": "move"}}))
        .await
        .expect(202);
    let t = &r.body["transfer"];
    (t["id"].as_str().unwrap().to_string(), t["auth_key"].as_str().unwrap().to_string())
}

fn ids(r: &Value) -> Vec<String> {
    r["transfers"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_string()).collect()
}

both_databases! {
    async fn a_volume_offered_with_a_key_is_taken_over_by_the_project_that_presents_it(s) {
        let alice = s.client("p1").with_roles("member");
        let bob = s.client("p2").with_roles("member");
        let volume = alice.create_volume(json!({"size": 1})).await;
        let r = alice.post("/os-volume-transfer", json!({"transfer": {"volume_id": volume, "name": " move "}})).await.expect(202);
        let t = &r.body["transfer"];
        let (id, key) = (t["id"].as_str().unwrap().to_string(), t["auth_key"].as_str().unwrap().to_string());
        assert_eq!((t["name"].as_str(), t["volume_id"].as_str()), (Some("move"), Some(volume.as_str())));
        assert!(key.len() == 16 && key.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()), "{key}");
        assert_eq!(alice.volume_status(&volume).await, "awaiting-transfer");
        // The key is kept only as a salted hash.
        let stored: Vec<String> = s.service.store().read(async |tx| {
            let rows = tx.query("SELECT salt, key_hash FROM volume_transfers WHERE id = $1", &params![&id]).await?;
            Ok::<_, berth::store::StoreError>(vec![rows[0].text(0)?, rows[0].text(1)?])
        }).await.unwrap();
        assert!(stored.iter().all(|v| !v.contains(&key)), "{stored:?}");

        // Offered: nothing else may happen to it.
        alice.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:a", "a"))).await.fault(400, "badRequest");
        alice.delete(&format!("/volumes/{volume}")).await.fault(400, "badRequest");
        alice.post("/os-volume-transfer", json!({"transfer": {"volume_id": volume}})).await.fault(400, "badRequest");

        // Alice's to see; Bob sees neither the offer nor the volume.
        assert_eq!(ids(&alice.get("/os-volume-transfer").await.expect(200).body), [id.as_str()]);
        let shown = alice.get(&format!("/os-volume-transfer/{id}")).await.expect(200);
        assert!(shown.body["transfer"]["created_at"].is_string() && shown.body["transfer"].get("auth_key").is_none());
        assert!(ids(&bob.get("/os-volume-transfer/detail").await.expect(200).body).is_empty());
        bob.get(&format!("/os-volume-transfer/{id}")).await.fault(404, "itemNotFound");

        // A wrong key changes nothing.
        let accept = format!("/os-volume-transfer/{id}/accept");
        let message = bob.post(&accept, json!({"accept": {"auth_key": "WRONGWRONGWRONG1"}})).await.fault(400, "badRequest");
        assert_eq!(message, format!("Invalid input received: Attempt to transfer {id} with invalid auth key."));
        assert_eq!(alice.volume_status(&volume).await, "awaiting-transfer");
        bob.post(&accept, json!({"accept": {}})).await.fault(400, "badRequest");

        let r = bob.post(&accept, json!({"accept": {"auth_key": key}})).await.expect(202);
        assert_eq!(r.body["transfer"]["volume_id"], volume.as_str());
        assert_eq!(bob.volume_status(&volume).await, "available");
        let v = bob.get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!(v.body["volume"]["user_id"], "user-p2");
        alice.get(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");
        assert!(ids(&alice.get("/os-volume-transfer").await.expect(200).body).is_empty(), "accepted: gone");
        bob.post(&accept, json!({"accept": {"auth_key": key}})).await.fault(404, "itemNotFound");
        // Bob's now: attached and in his history, with who took it.
        bob.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:b", "b"))).await.expect(200);
        let events = bob.at("3.54").get(&format!("/os-attachment-events?volume_id={volume}")).await.expect(200);
        let first = &events.body["attachment_events"][0];
        assert_eq!((first["event"].as_str(), first["outcome"].as_str()), (Some("accept-transfer"), Some("transferred")));
        assert_eq!(first["project_id"], "p2");
    }

    async fn a_withdrawn_offer_leaves_the_volume_to_its_project(s) {
        let alice = s.client("p1").with_roles("member");
        let volume = alice.create_volume(json!({"size": 1})).await;
        let (id, key) = offer(&alice, &volume).await;
        s.client("p2").with_roles("member").delete(&format!("/os-volume-transfer/{id}")).await.fault(404, "itemNotFound");
        alice.delete(&format!("/os-volume-transfer/{id}")).await.expect(202);
        assert_eq!(alice.volume_status(&volume).await, "available");
        let accept = format!("/os-volume-transfer/{id}/accept");
        s.client("p2").post(&accept, json!({"accept": {"auth_key": key}})).await.fault(404, "itemNotFound");
        alice.get(&format!("/volumes/{volume}")).await.expect(200);
        // An attached volume is not offered.
        alice.attach(&volume, None).await.expect(200);
        let message = alice.post("/os-volume-transfer", json!({"transfer": {"volume_id": volume}})).await.fault(400, "badRequest");
        assert!(message.contains("must be available to transfer"), "{message}");
        let other = uuid::Uuid::new_v4().to_string();
        alice.post("/os-volume-transfer", json!({"transfer": {"volume_id": other}})).await.fault(404, "itemNotFound");
    }

    async fn volume_transfers_is_the_name_from_3_55_and_details_name_the_projects_from_3_57(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1})).await;
        c.at("3.54").get("/volume-transfers").await.fault(404, "itemNotFound");
        let r = c.at("3.55").post("/volume-transfers", json!({"transfer": {"volume_id": volume, "no_snapshots": true}})).await.expect(202);
        let id = r.body["transfer"]["id"].as_str().unwrap().to_string();
        let old = c.at("3.56").get(&format!("/volume-transfers/{id}")).await.expect(200);
        assert!(old.body["transfer"].get("source_project_id").is_none());
        let new = c.at("3.57").get("/volume-transfers/detail").await.expect(200);
        let t = &new.body["transfers"][0];
        assert_eq!((&t["source_project_id"], &t["destination_project_id"], &t["accepted"]), (&json!("p1"), &Value::Null, &json!(false)));
        assert!(c.at("3.57").get("/volume-transfers").await.expect(200).body["transfers"][0].get("created_at").is_none());
        c.at("3.55").delete(&format!("/volume-transfers/{id}")).await.expect(202);
    }
}

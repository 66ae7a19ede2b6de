//! Nova's live migration (Cinder's `_attachment_reserve`, LP 1694530): a non-multiattach volume
//! that is in use gets a second attachment for the same instance, the destination host's; both
//! stay live until Nova deletes one of them. Nova's exact sequence: create the new attachment
//! with the destination connector, complete it, delete the old one, or, when the migration
//! fails, delete the new one instead.

use berth_tests::both_databases;
use berth_tests::server::{Client, Resp, connector};
use serde_json::json;

const SOURCE: &str = "iqn.1993-08.org.debian:01:source";
const DESTINATION: &str = "iqn.1993-08.org.debian:01:destination";
const OTHER: &str = "iqn.1993-08.org.debian:01:other";

async fn create(c: &Client, volume: &str, instance: &str, initiator: &str, host: &str) -> Resp {
    let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": instance, "connector": connector(initiator, host)}});
    c.post("/attachments", body).await
}

fn id(r: &Resp) -> String {
    r.body["attachment"]["id"].as_str().expect("an attachment id").to_string()
}

async fn complete(c: &Client, id: &str) {
    c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
}

async fn live(c: &Client, volume: &str) -> Vec<(String, String)> {
    let r = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    r.body["attachments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["id"].as_str().unwrap().to_string(), a["status"].as_str().unwrap().to_string()))
        .collect()
}

both_databases! {
    async fn a_live_migration_gives_the_same_instance_a_second_attachment_and_nobody_a_third(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let instance = uuid::Uuid::new_v4().to_string();
        let source = id(&create(&c, &volume, &instance, SOURCE, "src").await.expect(200));
        complete(&c, &source).await;

        // The destination's attachment, for the same instance.
        let destination = id(&create(&c, &volume, &instance, DESTINATION, "dst").await.expect(200));
        assert_eq!(c.volume_status(&volume).await, "attaching");
        // Another instance may not attach the volume, nor may the same instance a third time.
        let other = uuid::Uuid::new_v4().to_string();
        let m = create(&c, &volume, &other, OTHER, "other").await.fault(400, "badRequest");
        assert!(m.contains("Invalid volume"), "{m}");
        create(&c, &volume, &instance, OTHER, "other").await.fault(400, "badRequest");
        // Without an instance there is no migration either.
        c.attach(&volume, Some(connector(OTHER, "other"))).await.fault(400, "badRequest");

        complete(&c, &destination).await;
        assert_eq!(c.volume_status(&volume).await, "in-use");
        // Nova deletes the source's attachment: the destination's remains.
        let r = c.delete(&format!("/attachments/{source}")).await.expect(200);
        assert_eq!(r.body["attachments"].as_array().unwrap().len(), 1);
        assert_eq!(live(&c, &volume).await, vec![(destination.clone(), "attached".to_string())]);
        assert_eq!(c.volume_status(&volume).await, "in-use");

        // The destination's attachment is now the volume's: the instance may migrate again.
        let back = id(&create(&c, &volume, &instance, SOURCE, "src").await.expect(200));
        c.delete(&format!("/attachments/{back}")).await.expect(200);
        c.delete(&format!("/attachments/{destination}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    async fn a_failed_live_migration_deletes_the_new_attachment_and_keeps_the_old(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let instance = uuid::Uuid::new_v4().to_string();
        let source = id(&create(&c, &volume, &instance, SOURCE, "src").await.expect(200));
        complete(&c, &source).await;
        let destination = id(&create(&c, &volume, &instance, DESTINATION, "dst").await.expect(200));
        c.delete(&format!("/attachments/{destination}")).await.expect(200);
        assert_eq!(live(&c, &volume).await, vec![(source.clone(), "attached".to_string())]);
        assert_eq!(c.volume_status(&volume).await, "in-use");
        // Another instance still cannot attach it.
        create(&c, &volume, &uuid::Uuid::new_v4().to_string(), OTHER, "o").await.fault(400, "badRequest");
    }
}

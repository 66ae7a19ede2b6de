//! Nova's own sequences, as Nova's compute service drives Cinder (`nova/volume/cinder.py`,
//! `nova/virt/block_device.py`): with a service token, at the microversions it asks for. Each
//! test is a sequence a field trial found Berth answering differently from Cinder, or one a
//! Nova deployment relies on every day (a resize, an evacuation).

use berth_tests::both_databases;
use berth_tests::server::{Client, connector};
use serde_json::{Value, json};

const INSTANCE_1: &str = "0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51";
const INSTANCE_2: &str = "0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f52";

/// Nova, as the compute service: a service token, microversion 3.54.
fn nova(c: &Client) -> Client {
    c.with_service_token().at("3.54")
}

async fn begin_detaching(c: &Client, volume: &str) {
    c.post(&format!("/volumes/{volume}/action"), json!({"os-begin_detaching": null})).await.expect(202);
}

/// Nova's attach of a server on a host: create with the connector, then complete.
async fn attach(c: &Client, volume: &str, instance: &str, initiator: &str, host: &str) -> String {
    let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": instance,
        "connector": connector(initiator, host)}});
    let made = c.post("/attachments", body).await.expect(200);
    let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
    complete(c, &id).await;
    id
}

async fn complete(c: &Client, id: &str) {
    c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
}

async fn attachment(c: &Client, id: &str) -> Value {
    c.get(&format!("/attachments/{id}")).await.expect(200).body["attachment"].clone()
}

both_databases! {
    /// Nova's detach: `os-begin_detaching`, then `DELETE /attachments/{id}`. With another server
    /// still attached to a multiattach volume, Cinder puts the volume back to `in-use`, so the
    /// second server's detach (another `os-begin_detaching`) is accepted.
    async fn detaching_one_server_of_a_multiattach_volume_leaves_it_in_use_for_the_next_detach(s) {
        let c = nova(&s.client("p1"));
        let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        let one = attach(&c, &volume, INSTANCE_1, "iqn.1993-08.org.debian:01:h1", "h1").await;
        let two = attach(&c, &volume, INSTANCE_2, "iqn.1993-08.org.debian:01:h2", "h2").await;
        assert_eq!(c.volume_status(&volume).await, "in-use");

        begin_detaching(&c, &volume).await;
        assert_eq!(c.volume_status(&volume).await, "detaching");
        let left = c.delete(&format!("/attachments/{one}")).await.expect(200);
        let ids: Vec<&str> = left.body["attachments"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
        assert_eq!(ids, [two.as_str()]);
        assert_eq!(c.volume_status(&volume).await, "in-use", "the other server keeps the volume in use");

        begin_detaching(&c, &volume).await;
        c.delete(&format!("/attachments/{two}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    /// The same with one server: the volume is `available` after the delete (and a delete without
    /// a detach lock keeps working as before).
    async fn detaching_the_only_server_leaves_the_volume_available(s) {
        let c = nova(&s.client("p1"));
        let volume = c.create_volume(json!({"size": 1})).await;
        let one = attach(&c, &volume, INSTANCE_1, "iqn.1993-08.org.debian:01:h1", "h1").await;
        begin_detaching(&c, &volume).await;
        c.delete(&format!("/attachments/{one}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    /// A cold migration (resize), its revert, and an evacuation: on the source, Nova creates an
    /// attachment without connector for the same server and deletes the connected one
    /// (`_terminate_volume_connections`; an evacuation's `detach_block_devices` does the same
    /// while the source host is down); on the destination it updates the new attachment with its
    /// connector and completes it. A revert does it all again, back to the source. Each time
    /// the old host's access is revoked and the volume keeps exactly one attachment.
    async fn a_resize_its_revert_and_an_evacuation_move_a_servers_attachment_between_hosts(s) {
        let c = nova(&s.client("p1"));
        let volume = c.create_volume(json!({"size": 1})).await;
        let mut current = attach(&c, &volume, INSTANCE_1, "iqn.1993-08.org.debian:01:src", "src").await;
        for (host, initiator) in [
            ("dst", "iqn.1993-08.org.debian:01:dst"),
            ("src", "iqn.1993-08.org.debian:01:src"),
            ("evac", "iqn.1993-08.org.debian:01:evac"),
        ] {
            let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": INSTANCE_1}});
            let made = c.post("/attachments", body).await.expect(200);
            let next = made.body["attachment"]["id"].as_str().unwrap().to_string();
            assert_eq!(made.body["attachment"]["status"], "reserved");
            c.delete(&format!("/attachments/{current}")).await.expect(200);
            assert_eq!(c.volume_status(&volume).await, "reserved", "the server keeps its reservation");
            let update = json!({"attachment": {"connector": connector(initiator, host)}});
            let updated = c.put(&format!("/attachments/{next}"), update).await.expect(200);
            assert_eq!(updated.body["attachment"]["connection_info"]["driver_volume_type"], "iscsi");
            complete(&c, &next).await;
            assert_eq!(c.volume_status(&volume).await, "in-use");
            let live = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
            let ids: Vec<&str> = live.body["attachments"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
            assert_eq!(ids, [next.as_str()], "on {host}");
            let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
            assert_eq!(shown.body["volume"]["attachments"][0]["host_name"], host);
            current = next;
        }
        // The history names each host whose access ended: the source, the destination (at the
        // revert), the source again (at the evacuation).
        let revoked = c.get(&format!("/os-attachment-events?volume_id={volume}&access=revoked")).await.expect(200);
        let hosts: Vec<&str> = revoked.body["attachment_events"].as_array().unwrap().iter().map(|e| e["host"].as_str().unwrap()).collect();
        assert_eq!(hosts, ["src", "dst", "src"]);
        // Another server still cannot take the volume.
        let other = json!({"attachment": {"volume_uuid": volume, "instance_uuid": INSTANCE_2}});
        c.post("/attachments", other).await.fault(400, "badRequest");
    }

    /// Attaching a volume to a shelved-offloaded server: Nova creates the attachment without a
    /// connector and completes it at once; the connector comes at unshelve, with an update, which
    /// exports the volume and answers with the connection as any update does; Nova completes it
    /// again. Cinder accepts the first complete (volume `in-use`, attachment `attached`).
    async fn a_shelved_offloaded_server_is_attached_without_connector_and_connected_at_unshelve(s) {
        let c = nova(&s.client("p1"));
        let volume = c.create_volume(json!({"size": 1})).await;
        let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": INSTANCE_1}});
        let made = c.post("/attachments", body).await.expect(200);
        let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
        assert_eq!(made.body["attachment"]["status"], "reserved");

        complete(&c, &id).await;
        assert_eq!(c.volume_status(&volume).await, "in-use");
        let shown = attachment(&c, &id).await;
        assert_eq!(shown["status"], "attached");
        assert_eq!(shown["connection_info"], json!({}), "no export yet");

        // Unshelve: the connector arrives.
        let updated = c
            .put(&format!("/attachments/{id}"), json!({"attachment": {"connector": connector("iqn.1993-08.org.debian:01:h1", "h1")}}))
            .await
            .expect(200);
        let info = &updated.body["attachment"]["connection_info"];
        assert_eq!(info["driver_volume_type"], "iscsi");
        assert_eq!(info["target_iqn"], json!(format!("iqn.2010-10.org.openstack:volume-{volume}")));
        assert_eq!(updated.body["attachment"]["status"], "attaching");
        complete(&c, &id).await;
        assert_eq!(attachment(&c, &id).await["status"], "attached");
        assert_eq!(c.volume_status(&volume).await, "in-use");

        begin_detaching(&c, &volume).await;
        c.delete(&format!("/attachments/{id}")).await.expect(200);
        assert_eq!(c.volume_status(&volume).await, "available");
    }

    /// An unshelve whose connect fails leaves the attachment as it was (attached, no connection)
    /// rather than reserved or gone: Nova's instance still has the volume, and a later unshelve
    /// can try again.
    async fn a_failed_connect_at_unshelve_leaves_the_attachment_attached_without_connection(s) {
        let c = nova(&s.client("p1"));
        let volume = c.create_volume(json!({"size": 1})).await;
        let made = c.post("/attachments", json!({"attachment": {"volume_uuid": volume, "instance_uuid": INSTANCE_1}})).await.expect(200);
        let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
        complete(&c, &id).await;
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.initialize-connection": "backend"}}))
            .await
            .expect(200);
        let update = json!({"attachment": {"connector": connector("iqn.1993-08.org.debian:01:h1", "h1")}});
        c.put(&format!("/attachments/{id}"), update.clone()).await.fault(502, "computeFault");
        let shown = attachment(&c, &id).await;
        assert_eq!(shown["status"], "attached");
        assert_eq!(shown["connection_info"], json!({}));
        assert_eq!(c.volume_status(&volume).await, "in-use");

        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.initialize-connection": "ok"}}))
            .await
            .expect(200);
        c.put(&format!("/attachments/{id}"), update).await.expect(200);
    }

    /// A reservation whose connect is under way has its connector already: it is not one to
    /// complete without a connection, and `os-complete` is refused while the connect runs.
    async fn a_reservation_being_connected_is_not_completed(s) {
        let c = nova(&s.client("p1"));
        let volume = c.create_volume(json!({"size": 1})).await;
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.create-export": "delay:1500"}}))
            .await
            .expect(200);
        let connecting = {
            let c = c.clone();
            let volume = volume.clone();
            tokio::spawn(async move { c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h1", "h1"))).await })
        };
        let id = loop {
            let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
            if let Some(a) = listed.body["attachments"].as_array().unwrap().first() {
                break a["id"].as_str().unwrap().to_string();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        let refused = c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.fault(400, "badRequest");
        assert!(refused.contains("being connected"), "{refused}");
        connecting.await.unwrap().expect(200);
        complete(&c, &id).await;
        assert_eq!(attachment(&c, &id).await["status"], "attached");
    }

    /// Nova's swap volume (`nova volume-update`, and the copy of a Cinder migration) with
    /// attachments of 3.44 (`nova/compute/api.py` `swap_volume`, `nova/compute/manager.py`
    /// `_swap_volume`): `os-begin_detaching` on the old volume, an attachment of the server to
    /// the new one without connector, updated with the host's connector and completed once the
    /// hypervisor has copied the disk, then the old attachment deleted. Nova calls
    /// `os-migrate_volume_completion` only for a migration Cinder began (Berth begins none) or for
    /// attachments from before 3.44. When the copy fails, Nova rolls the old volume's detach back
    /// and deletes the new attachment: both volumes are then as they were.
    async fn a_swap_moves_a_server_to_another_volume_and_a_failed_one_leaves_both_as_they_were(s) {
        let c = nova(&s.client("p1"));
        let old = c.create_volume(json!({"size": 1})).await;
        let new = c.create_volume(json!({"size": 2})).await;
        let first = attach(&c, &old, INSTANCE_1, "iqn.1993-08.org.debian:01:h1", "h1").await;

        // A failed swap: the new volume's connection fails on the array.
        c.post(&format!("/volumes/{new}/metadata"), json!({"metadata": {"fake.initialize-connection": "backend"}}))
            .await
            .expect(200);
        begin_detaching(&c, &old).await;
        let body = json!({"attachment": {"volume_uuid": new, "instance_uuid": INSTANCE_1}});
        let made = c.post("/attachments", body.clone()).await.expect(200);
        let failed = made.body["attachment"]["id"].as_str().unwrap().to_string();
        // Nova passes the device in the connector (`nova/volume/cinder.py` `attachment_update`).
        let mut on_h1 = connector("iqn.1993-08.org.debian:01:h1", "h1");
        on_h1["mountpoint"] = json!("/dev/vdb");
        let update = json!({"attachment": {"connector": on_h1}});
        let refused = c.put(&format!("/attachments/{failed}"), update.clone()).await;
        assert!(refused.status >= 500, "the array's failure: {}", refused.body);
        c.post(&format!("/volumes/{old}/action"), json!({"os-roll_detaching": null})).await.expect(202);
        c.delete(&format!("/attachments/{failed}")).await.expect(200);
        assert_eq!((c.volume_status(&old).await, c.volume_status(&new).await), ("in-use".into(), "available".into()));
        assert_eq!(attachment(&c, &first).await["status"], "attached");

        // The swap that works.
        c.post(&format!("/volumes/{new}/metadata"), json!({"metadata": {"fake.initialize-connection": "ok"}}))
            .await
            .expect(200);
        begin_detaching(&c, &old).await;
        let made = c.post("/attachments", body).await.expect(200);
        let second = made.body["attachment"]["id"].as_str().unwrap().to_string();
        let updated = c.put(&format!("/attachments/{second}"), update).await.expect(200);
        assert_eq!(updated.body["attachment"]["connection_info"]["driver_volume_type"], "iscsi");
        complete(&c, &second).await;
        c.delete(&format!("/attachments/{first}")).await.expect(200);
        assert_eq!((c.volume_status(&old).await, c.volume_status(&new).await), ("available".into(), "in-use".into()));
        let shown = attachment(&c, &second).await;
        assert_eq!((&shown["instance"], &shown["status"]), (&json!(INSTANCE_1), &json!("attached")));
        let volume = c.get(&format!("/volumes/{new}")).await.expect(200).body["volume"].clone();
        assert_eq!(volume["attachments"][0]["device"], "/dev/vdb", "{volume}");
        // The old volume's access ended with its attachment: the history says so.
        let revoked = c.get(&format!("/os-attachment-events?volume_id={old}&access=revoked")).await.expect(200);
        assert_eq!(revoked.body["attachment_events"].as_array().unwrap().len(), 1, "{}", revoked.body);
    }
}

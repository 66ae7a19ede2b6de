//! Snapshots, backups and groups, which this service cannot make (no driver call makes one, no
//! backup service runs): as a Cinder whose backends take no snapshots, make no groups and which
//! runs no backup service, the lists answer empty, with their filters, paging and `count`
//! checked as every list's, from the microversion that brought them; one named by id is 404; a
//! request to make one is refused with 400 saying why and changes nothing.
//! And `GET /extensions` lists the extensions of Cinder's API served here, and not those.

use berth_tests::server::{Db, TestServer};
use serde_json::{Value, json};

#[tokio::test]
async fn snapshot_and_backup_lists_are_empty_and_checked_as_every_list() {
    let s = TestServer::start(Db::Sqlite).await;
    let c = s.client("p1").with_roles("reader");
    for (path, key) in [("/snapshots", "snapshots"), ("/backups", "backups")] {
        for list in [path.to_string(), format!("{path}/detail")] {
            assert_eq!(c.get(&list).await.expect(200).body, json!({ key: [] }), "{list}");
            // Cinder's filters, paging and sorting are taken; `count` from 3.45.
            let query = "?name=x&status=available&volume_id=0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51&limit=5&sort=created_at:asc&all_tenants=1";
            assert_eq!(
                c.at("3.71").get(&format!("{list}{query}")).await.expect(200).body,
                json!({ key: [] })
            );
            assert_eq!(
                c.at("3.45").get(&format!("{list}?with_count=true")).await.expect(200).body,
                json!({ key: [], "count": 0 })
            );
            assert_eq!(
                c.at("3.44").get(&format!("{list}?with_count=true")).await.expect(200).body,
                json!({ key: [] })
            );
            // What any list refuses, these refuse.
            c.at("3.71").get(&format!("{list}?color=red")).await.fault(400, "badRequest");
            c.get(&format!("{list}?limit=-1")).await.fault(400, "badRequest");
            c.get(&format!("{list}?sort=color")).await.fault(400, "badRequest");
            let what = &key[..key.len() - 1];
            let message = c.get(&format!("{list}?marker=m1")).await.fault(404, "itemNotFound");
            assert_eq!(message, format!("Marker {what} m1 could not be found."));
        }
    }
    // Nobody at all reads nothing.
    let mut anonymous = s.client("p1");
    anonymous.token = None;
    anonymous.get("/snapshots").await.fault(401, "unauthorized");
}

#[tokio::test]
async fn a_snapshot_or_backup_is_never_found_and_never_made() {
    let s = TestServer::start(Db::Sqlite).await;
    let c = s.client("p1").with_roles("member");
    let volume = c.create_volume(json!({"size": 1})).await;
    let id = "0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51";
    for (path, what) in [("/snapshots", "Snapshot"), ("/backups", "Backup")] {
        assert_eq!(
            c.get(&format!("{path}/{id}")).await.fault(404, "itemNotFound"),
            format!("{what} {id} could not be found.")
        );
        assert_eq!(
            c.delete(&format!("{path}/{id}")).await.fault(404, "itemNotFound"),
            format!("{what} {id} could not be found.")
        );
    }

    let refused =
        c.post("/snapshots", json!({"snapshot": {"volume_id": volume, "force": true, "name": "s"}})).await;
    let message = refused.fault(400, "badRequest");
    assert_eq!(
        message,
        "Invalid input received: this service takes no snapshots: its storage drivers have no snapshot call"
    );
    let refused = c.post("/backups", json!({"backup": {"volume_id": volume, "incremental": false}})).await;
    let message = refused.fault(400, "badRequest");
    assert_eq!(message, "Invalid input received: this service makes no backups: no backup service runs here");
    // A body of the wrong shape is told so first.
    for (path, body, says) in [
        ("/snapshots", json!({"volume_id": volume}), "Missing required element 'snapshot' in request body."),
        ("/backups", json!({"backup": "x"}), "Missing required element 'backup' in request body."),
        ("/snapshots", json!({"snapshot": {"name": "s"}}), "'volume_id' is a required property"),
        ("/backups", json!({"backup": {"volume_id": "v1"}}), "'v1' is not a 'uuid'"),
    ] {
        let message = c.post(path, body).await.fault(400, "badRequest");
        assert!(message.contains(says), "{path}: {message}");
    }
    // Nothing changed: the volume is as it was, and there is still nothing to list.
    let shown = c.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
    assert_eq!(shown["status"], "available");
    assert_eq!(c.get("/snapshots/detail").await.expect(200).body, json!({"snapshots": []}));
    // A reader may not even ask.
    let reader = s.client("p1").with_roles("reader");
    reader.post("/snapshots", json!({"snapshot": {"volume_id": volume}})).await.fault(403, "forbidden");
}

#[tokio::test]
async fn groups_group_snapshots_and_group_types_are_empty_from_their_microversions() {
    let s = TestServer::start(Db::Sqlite).await;
    let c = s.client("p1").with_roles("reader");
    for (path, key, since, before) in [
        ("/group_types", "group_types", "3.11", "3.10"),
        ("/groups", "groups", "3.13", "3.12"),
        ("/groups/detail", "groups", "3.13", "3.12"),
        ("/group_snapshots", "group_snapshots", "3.14", "3.13"),
        ("/group_snapshots/detail", "group_snapshots", "3.14", "3.13"),
    ] {
        c.at(before).get(path).await.fault(404, "itemNotFound");
        assert_eq!(c.at(since).get(path).await.expect(200).body, json!({ key: [] }), "{path}");
        assert_eq!(
            c.at("3.71").get(&format!("{path}?limit=5&sort=created_at:asc")).await.expect(200).body,
            json!({ key: [] })
        );
        c.at("3.71").get(&format!("{path}?color=red")).await.fault(400, "badRequest");
        c.at("3.71").get(&format!("{path}?sort=color")).await.fault(400, "badRequest");
        c.at("3.71").get(&format!("{path}?marker=m1")).await.fault(404, "itemNotFound");
    }
    // Each list's own filters (Cinder's `resource_filters.json`), and no other's.
    let c = c.at("3.71");
    c.get("/groups?name=g").await.expect(200);
    c.get("/groups?status=available").await.fault(400, "badRequest");
    c.get("/group_snapshots?name=g&status=available&group_id=0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51")
        .await
        .expect(200);
    let filters = c.get("/resource_filters").await.expect(200).body["resource_filters"].clone();
    let of = |r: &str| {
        filters.as_array().unwrap().iter().find(|f| f["resource"] == r).map(|f| f["filters"].clone())
    };
    assert_eq!(of("group"), Some(json!(["name"])));
    assert_eq!(of("group_snapshot"), Some(json!(["group_id", "name", "status"])));
}

#[tokio::test]
async fn a_group_group_snapshot_or_group_type_is_never_found_and_never_made() {
    let s = TestServer::start(Db::Sqlite).await;
    let admin = s.client("p1").at("3.71");
    let c = s.client("p1").with_roles("member").at("3.71");
    let id = "0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51";
    let gone = |what: &str| format!("{what} {id} could not be found.");
    assert_eq!(c.get(&format!("/groups/{id}")).await.fault(404, "itemNotFound"), gone("Group"));
    let delete = json!({"delete": {"delete-volumes": false}});
    assert_eq!(
        c.post(&format!("/groups/{id}/action"), delete).await.fault(404, "itemNotFound"),
        gone("Group")
    );
    assert_eq!(
        c.get(&format!("/group_snapshots/{id}")).await.fault(404, "itemNotFound"),
        gone("GroupSnapshot")
    );
    assert_eq!(
        c.delete(&format!("/group_snapshots/{id}")).await.fault(404, "itemNotFound"),
        gone("GroupSnapshot")
    );
    assert_eq!(c.get(&format!("/group_types/{id}")).await.fault(404, "itemNotFound"), gone("Group type"));
    assert_eq!(
        c.get("/group_types/default").await.fault(404, "itemNotFound"),
        "Default group type can not be found."
    );

    let no_groups =
        "Invalid input received: this service makes no groups: its storage drivers have no group calls";
    let group = json!({"group": {"group_type": "gt", "volume_types": ["lvm"], "name": "g"}});
    assert_eq!(c.post("/groups", group).await.fault(400, "badRequest"), no_groups);
    let from = json!({"create-from-src": {"source_group_id": id}});
    assert_eq!(c.post("/groups/action", from).await.fault(400, "badRequest"), no_groups);
    let snapshot = json!({"group_snapshot": {"group_id": id}});
    assert_eq!(c.post("/group_snapshots", snapshot).await.fault(400, "badRequest"), no_groups);
    let group_type = json!({"group_type": {"name": "gt"}});
    assert_eq!(admin.post("/group_types", group_type.clone()).await.fault(400, "badRequest"), no_groups);
    // A member may not make a group type; a body of the wrong shape is told so first.
    c.post("/group_types", group_type).await.fault(403, "forbidden");
    for (path, body, says) in [
        ("/groups", json!({"name": "g"}), "Missing required element 'group' in request body."),
        ("/groups", json!({"group": {"name": "g"}}), "'group_type' is a required property"),
        ("/group_snapshots", json!({"group_snapshot": {"group_id": "g1"}}), "'g1' is not a 'uuid'"),
        ("/groups/action", json!({"x": 1}), "Missing required element 'create-from-src' in request body."),
    ] {
        let message = c.post(path, body).await.fault(400, "badRequest");
        assert!(message.contains(says), "{path}: {message}");
    }
    assert_eq!(c.get("/groups/detail").await.expect(200).body, json!({"groups": []}), "nothing was made");
}

#[tokio::test]
async fn extensions_name_what_is_served_and_not_snapshots_or_backups() {
    let s = TestServer::start(Db::Sqlite).await;
    let c = s.client("p1").with_roles("reader");
    let listed = c.get("/extensions").await.expect(200).body["extensions"].as_array().unwrap().clone();
    let alias = |a: &str| listed.iter().find(|e| e["alias"] == a).cloned();
    assert_eq!(
        alias("os-availability-zone"),
        Some(json!({
            "name": "AvailabilityZones",
            "alias": "os-availability-zone",
            "description": "Describe Availability Zones.",
            "updated": "2013-06-27T00:00:00+00:00",
            "links": []
        }))
    );
    for served in [
        "os-volume-transfer",
        "os-quota-sets",
        "scheduler-stats",
        "os-used-limits",
        "os-vol-host-attr",
        "qos-specs",
    ] {
        assert!(alias(served).is_some(), "{served} missing: {listed:?}");
    }
    for not_served in [
        "backups",
        "os-snapshot-actions",
        "os-volume-manage",
        "os-hosts",
        "os-types-manage",
        "os-volume-type-access",
    ] {
        assert!(alias(not_served).is_none(), "{not_served} listed: {listed:?}");
    }
    let names: Vec<&Value> = listed.iter().map(|e| &e["name"]).collect();
    assert_eq!(names.len(), 20, "{names:?}");
}

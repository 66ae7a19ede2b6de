//! Volumes: create, show, list, list detail, delete, metadata, and the view per microversion.

use berth_tests::both_databases;
use berth_tests::server::{Db, TestServer, connector};
use serde_json::json;

both_databases! {
    async fn a_volume_is_created_shown_listed_and_deleted(s) {
        let c = s.client("p1");
        let r = c.post("/volumes", json!({"volume": {"size": 2, "name": "data", "description": "d",
            "metadata": {"k": "v"}}})).await.expect(202);
        let v = &r.body["volume"];
        assert_eq!((v["status"].as_str(), v["size"].as_i64(), v["name"].as_str()), (Some("available"), Some(2), Some("data")));
        assert_eq!((v["volume_type"].as_str(), v["multiattach"].as_bool()), (Some("__DEFAULT__"), Some(false)));
        assert_eq!(v["metadata"], json!({"k": "v"}));
        assert_eq!(v["attachments"], json!([]));
        assert_eq!(v["os-vol-tenant-attr:tenant_id"], "p1");
        let id = v["id"].as_str().unwrap();

        let shown = c.get(&format!("/volumes/{id}")).await.expect(200);
        assert_eq!(shown.body["volume"]["id"], json!(id));
        let list = c.get("/volumes").await.expect(200);
        assert_eq!(list.body["volumes"][0].as_object().unwrap().keys().collect::<Vec<_>>(), ["id", "links", "name"]);
        let detail = c.get("/volumes/detail").await.expect(200);
        assert_eq!(detail.body["volumes"][0]["size"], 2);

        c.delete(&format!("/volumes/{id}")).await.expect(202);
        c.get(&format!("/volumes/{id}")).await.fault(404, "itemNotFound");
        assert_eq!(c.get("/volumes").await.expect(200).body["volumes"], json!([]));

        // An integer written as a JSON number with a fraction of zero is an integer (JSON
        // Schema's integers, which the OpenAPI document's clients generate).
        let r = c.post("/volumes", json!({"volume": {"size": 3.0}})).await.expect(202);
        assert_eq!(r.body["volume"]["size"], 3);

        // Names and descriptions are kept without the white space around them, as Cinder keeps
        // them.
        let r = c.post("/volumes", json!({"volume": {"size": 1, "name": " padded\t", "description": "\n d "}})).await.expect(202);
        assert_eq!((r.body["volume"]["name"].as_str(), r.body["volume"]["description"].as_str()), (Some("padded"), Some("d")));
    }

    async fn a_volume_types_extra_spec_makes_its_volumes_multiattach(s) {
        let c = s.client("p1");
        let types = c.get("/types").await.expect(200);
        let names: Vec<&str> = types.body["volume_types"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["__DEFAULT__", "multiattach"]);
        let multi = &types.body["volume_types"][1];
        assert_eq!(multi["extra_specs"], json!({"multiattach": "<is> True"}));
        let by_id = c.get(&format!("/types/{}", multi["id"].as_str().unwrap())).await.expect(200);
        assert_eq!(by_id.body["volume_type"]["name"], "multiattach");
        let v = c.post("/volumes", json!({"volume": {"size": 1, "volume_type": "multiattach"}})).await.expect(202);
        assert_eq!(v.body["volume"]["multiattach"], true);
        let v = c.post("/volumes", json!({"volume": {"size": 1, "volume_type": multi["id"]}})).await.expect(202);
        assert_eq!(v.body["volume"]["volume_type"], "multiattach");
        let message = c.post("/volumes", json!({"volume": {"size": 1, "volume_type": "gold"}})).await.fault(404, "itemNotFound");
        assert_eq!(message, "Volume type with name gold could not be found.");
        c.get("/types/nope").await.fault(404, "itemNotFound");
        c.post("/volumes", json!({"volume": {"size": 1, "multiattach": true}})).await.fault(400, "badRequest");
        // Its extra specs, as `cinder extra-specs-list` reads them (by id), and one of them.
        let specs = c.get(&format!("/types/{}/extra_specs", multi["id"].as_str().unwrap())).await.expect(200);
        assert_eq!(specs.body, json!({"extra_specs": {"multiattach": "<is> True"}}));
        let one = c.get("/types/multiattach/extra_specs/multiattach").await.expect(200);
        assert_eq!(one.body, json!({"multiattach": "<is> True"}));
        let message = c.get("/types/multiattach/extra_specs/colour").await.fault(404, "itemNotFound");
        assert_eq!(message, "Volume Type multiattach has no extra specs with key colour.");
        c.get("/types/nope/extra_specs").await.fault(404, "itemNotFound");
        assert_eq!(c.get("/types/default/extra_specs").await.expect(200).body, json!({"extra_specs": {}}));
        // No type here is encrypted: Cinder's answers for an unencrypted type and its volumes.
        assert_eq!(c.get("/types/multiattach/encryption").await.expect(200).body, json!({}));
        c.get("/types/nope/encryption").await.fault(404, "itemNotFound");
        let member = s.client("p1").with_roles("member");
        member.get("/types/multiattach/encryption").await.fault(403, "forbidden");
        let v = member.create_volume(json!({"size": 1})).await;
        let shown = s.client("p1").with_roles("reader").get(&format!("/volumes/{v}/encryption")).await.expect(200);
        assert_eq!(shown.body, json!({"encryption_key_id": null}));
        s.client("p2").with_roles("member").get(&format!("/volumes/{v}/encryption")).await.fault(404, "itemNotFound");
    }

    async fn shared_targets_and_service_uuid_appear_from_3_48(s) {
        let c = s.client("p1");
        let id = c.create_volume(json!({"size": 1})).await;
        let old = c.at("3.47").get(&format!("/volumes/{id}")).await.expect(200);
        assert!(old.body["volume"].get("shared_targets").is_none());
        let new = c.at("3.48").get(&format!("/volumes/{id}")).await.expect(200);
        assert_eq!(new.body["volume"]["shared_targets"], false, "the fake driver does not share targets");
        assert!(new.body["volume"]["service_uuid"].as_str().is_some_and(|u| u.len() == 36));
        assert!(old.body["volume"].get("group_id").is_some(), "group_id exists from 3.13");
        assert!(c.get(&format!("/volumes/{id}")).await.body["volume"].get("group_id").is_none());
    }

    async fn volume_lists_page_sort_filter_and_count(s) {
        let c = s.client("p1");
        for name in ["e", "c", "a", "d", "b"] {
            c.create_volume(json!({"size": 1, "name": name})).await;
        }
        let names = |r: &berth_tests::server::Resp| -> Vec<String> {
            r.body["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect()
        };
        let sorted = c.get("/volumes?sort=name:asc").await.expect(200);
        assert_eq!(names(&sorted), ["a", "b", "c", "d", "e"]);
        let page1 = c.get("/volumes?sort=name:asc&limit=2").await.expect(200);
        assert_eq!(names(&page1), ["a", "b"]);
        let marker = page1.body["volumes"][1]["id"].as_str().unwrap();
        let page2 = c.get(&format!("/volumes?sort=name:asc&limit=2&marker={marker}")).await.expect(200);
        assert_eq!(names(&page2), ["c", "d"]);
        let offset = c.get("/volumes?sort=name:desc&offset=3").await.expect(200);
        assert_eq!(names(&offset), ["b", "a"]);
        // Cinder's names for the keys, as its clients send them (`cinder list --sort name`
        // sends `display_name`).
        assert_eq!(names(&c.get("/volumes?sort=display_name:asc").await.expect(200)), ["a", "b", "c", "d", "e"]);
        assert_eq!(names(&c.get("/volumes?sort_key=display_name&sort_dir=desc").await.expect(200)), ["e", "d", "c", "b", "a"]);
        let big = c.create_volume(json!({"size": 3, "name": "big"})).await;
        assert_eq!(c.get("/volumes/detail?sort=size:desc&limit=1").await.expect(200).body["volumes"][0]["id"], json!(big));
        c.delete(&format!("/volumes/{big}")).await.expect(202);
        assert_eq!(names(&c.get("/volumes?name=c").await.expect(200)), ["c"]);
        let counted = c.at("3.45").get("/volumes?with_count=true&limit=1").await.expect(200);
        assert_eq!((counted.body["count"].as_i64(), counted.body["volumes"].as_array().unwrap().len()), (Some(5), 1));
        assert!(c.at("3.44").get("/volumes?with_count=true").await.expect(200).body.get("count").is_none());
        c.get("/volumes?sort=size_gib:sideways").await.fault(400, "badRequest");
        c.get("/volumes?limit=-1").await.fault(400, "badRequest");
        c.get(&format!("/volumes?marker={}", uuid::Uuid::new_v4())).await.fault(404, "itemNotFound");
        c.at("3.31").get("/volumes?colour=red").await.fault(400, "badRequest");
    }

    /// Cinder's other volume filters, as its clients send them: `metadata` (every item given,
    /// a dictionary written as Python writes it, as `cinder list --metadata` sends it), `size`,
    /// the fields every volume here has one value of (`bootable`, `availability_zone`,
    /// `migration_status`, `group_id`), and an admin's `project_id`.
    async fn volume_lists_filter_by_metadata_size_and_cinders_other_fields(s) {
        let c = s.client("p1");
        let tricky = "a \"quoted\": key";
        let red = c.create_volume(json!({"size": 1, "name": "red", "metadata": {"colour": "red", "tier": "gold", tricky: "x"}})).await;
        let blue = c.create_volume(json!({"size": 2, "name": "blue", "metadata": {"colour": "blue", "tier": "gold"}})).await;
        let plain = c.create_volume(json!({"size": 2, "name": "plain", "metadata": {"note": "colour: red"}})).await;
        let ids = |r: berth_tests::server::Resp| -> Vec<String> {
            let mut ids: Vec<String> =
                r.body["volumes"].as_array().unwrap().iter().map(|v| v["id"].as_str().unwrap().to_string()).collect();
            ids.sort();
            ids
        };
        let sorted = |mut v: Vec<&String>| -> Vec<String> {
            v.sort();
            v.into_iter().cloned().collect()
        };
        let query = |m: &str| format!("/volumes?metadata={}", urlencoding(m));
        assert_eq!(ids(c.get(&query("{'colour': 'red'}")).await.expect(200)), vec![red.clone()]);
        assert_eq!(ids(c.get(&query("{'tier': 'gold'}")).await.expect(200)), sorted(vec![&red, &blue]));
        assert_eq!(ids(c.get(&query("{'tier': 'gold', 'colour': 'blue'}")).await.expect(200)), vec![blue.clone()]);
        assert_eq!(ids(c.get(&query(r#"{"colour": "red"}"#)).await.expect(200)), vec![red.clone()], "JSON too");
        assert_eq!(ids(c.get(&query(&format!("{{'{}': 'x'}}", tricky.replace('\'', "\\'")))).await.expect(200)), vec![red.clone()]);
        assert!(ids(c.get(&query("{'colour': 'Red'}")).await.expect(200)).is_empty(), "values compare exactly");
        assert!(ids(c.get(&query("{'colour': 're'}")).await.expect(200)).is_empty(), "whole values only");
        assert!(ids(c.get(&query("{'olour': 'red'}")).await.expect(200)).is_empty(), "whole keys only");
        assert_eq!(ids(c.get(&query("{'note': 'colour: red'}")).await.expect(200)), vec![plain.clone()]);
        c.get(&query("colour=red")).await.fault(400, "badRequest");
        let counted = c.at("3.45").get(&format!("{}&with_count=true", query("{'tier': 'gold'}"))).await.expect(200);
        assert_eq!(counted.body["count"], 2);

        assert_eq!(ids(c.get("/volumes?size=2").await.expect(200)), sorted(vec![&blue, &plain]));
        c.get("/volumes?size=big").await.fault(400, "badRequest");
        assert_eq!(c.get("/volumes?bootable=false").await.expect(200).body["volumes"].as_array().unwrap().len(), 3);
        assert!(ids(c.get("/volumes?bootable=true").await.expect(200)).is_empty());
        c.get("/volumes?bootable=perhaps").await.fault(400, "badRequest");
        assert_eq!(c.get("/volumes?availability_zone=nova").await.expect(200).body["volumes"].as_array().unwrap().len(), 3);
        assert!(ids(c.get("/volumes?availability_zone=elsewhere").await.expect(200)).is_empty());
        assert!(ids(c.get("/volumes?migration_status=migrating").await.expect(200)).is_empty());
        assert!(ids(c.at("3.10").get("/volumes?group_id=g").await.expect(200)).is_empty());
        c.at("3.31").get("/volumes?group_id=g").await.expect(200);
        c.at("3.9").get("/volumes?group_id=g").await.expect(200);

        // `project_id`: an admin's, with every project's volumes; a member's is refused.
        let other = s.client("p2").create_volume(json!({"size": 1})).await;
        let admin = c.with_roles("admin");
        assert_eq!(ids(admin.get("/volumes?all_tenants=1&project_id=p2").await.expect(200)), vec![other.clone()]);
        assert_eq!(ids(admin.get("/volumes?all_tenants=1&project_id=p1&size=1").await.expect(200)), vec![red.clone()]);
        assert!(ids(admin.get("/volumes?project_id=p2").await.expect(200)).is_empty(), "without all_tenants: its own project only");
        c.with_roles("member").at("3.31").get("/volumes?project_id=p2").await.fault(400, "badRequest");
    }

    /// `GET /volumes/summary` (`cinder summary`): the project's volumes counted and their sizes
    /// added up, and from 3.36 each metadata key with its values; an admin's `all_tenants`
    /// counts every project's. Before 3.12 it is not there.
    async fn the_volume_summary_counts_sizes_and_metadata(s) {
        let c = s.client("p1");
        c.create_volume(json!({"size": 2, "metadata": {"tier": "gold", "team": "a"}})).await;
        c.create_volume(json!({"size": 3, "metadata": {"tier": "silver"}})).await;
        let gone = c.create_volume(json!({"size": 40, "metadata": {"tier": "bronze"}})).await;
        c.delete(&format!("/volumes/{gone}")).await.expect(202);
        s.client("p2").create_volume(json!({"size": 7})).await;

        let r = c.at("3.36").get("/volumes/summary").await.expect(200);
        assert_eq!(
            r.body,
            json!({"volume-summary": {"total_count": 2, "total_size": 5,
                "metadata": {"team": ["a"], "tier": ["gold", "silver"]}}})
        );
        let r = c.at("3.12").get("/volumes/summary").await.expect(200);
        assert_eq!(r.body, json!({"volume-summary": {"total_count": 2, "total_size": 5}}));
        let every = c.at("3.36").get("/volumes/summary?all_tenants=1").await.expect(200);
        assert_eq!((&every.body["volume-summary"]["total_count"], &every.body["volume-summary"]["total_size"]), (&json!(3), &json!(12)));
        let member = c.with_roles("member").at("3.36").get("/volumes/summary?all_tenants=1").await.expect(200);
        assert_eq!(member.body["volume-summary"]["total_count"], 2, "a member's all_tenants is its own project");
        let empty = s.client("p3").at("3.36").get("/volumes/summary").await.expect(200);
        assert_eq!(empty.body, json!({"volume-summary": {"total_count": 0, "total_size": 0, "metadata": {}}}));
        c.at("3.11").get("/volumes/summary").await.fault(404, "itemNotFound");
    }

    /// `GET /limits` (`cinder absolute-limits`): the quotas (volumes and gigabytes unlimited
    /// until an admin sets them, no snapshots or backups), and what the project uses; an admin may ask for another project's
    /// from 3.39, a member may not.
    async fn the_limits_show_the_quotas_and_what_a_project_uses(s) {
        let c = s.client("p1");
        c.create_volume(json!({"size": 2})).await;
        c.create_volume(json!({"size": 3})).await;
        s.client("p2").create_volume(json!({"size": 7})).await;
        let r = c.with_roles("reader").get("/limits").await.expect(200);
        assert_eq!(
            r.body,
            json!({"limits": {"rate": [], "absolute": {
                "maxTotalVolumes": -1, "maxTotalVolumeGigabytes": -1, "maxTotalSnapshots": 0,
                "maxTotalBackups": 0, "maxTotalBackupGigabytes": 0, "totalVolumesUsed": 2,
                "totalGigabytesUsed": 5, "totalSnapshotsUsed": 0, "totalBackupsUsed": 0,
                "totalBackupGigabytesUsed": 0}}})
        );
        let used = |r: berth_tests::server::Resp| r.body["limits"]["absolute"]["totalGigabytesUsed"].clone();
        assert_eq!(used(c.at("3.39").get("/limits?project_id=p2").await.expect(200)), 7);
        assert_eq!(used(c.at("3.38").get("/limits?project_id=p2").await.expect(200)), 5, "before 3.39: its own");
        assert_eq!(used(c.with_roles("member").at("3.39").get("/limits?project_id=p2").await.expect(200)), 5);
        c.at("3.39").get("/limits?project_id=bad%20id").await.fault(400, "badRequest");
    }

    /// `os-quota-sets` (`cinder quota-show`, `quota-usage`, `quota-defaults`, `openstack quota
    /// show`): unlimited until an admin sets them, in Cinder's keys (every volume type's too), and
    /// with `usage` what the project uses; a member reads its own project's only.
    async fn the_quota_sets_show_the_quotas_and_what_a_project_uses(s) {
        let c = s.client("p1");
        c.create_volume(json!({"size": 2})).await;
        c.create_volume(json!({"size": 3, "volume_type": "multiattach"})).await;
        s.client("p2").create_volume(json!({"size": 7})).await;
        let limits = json!({
            "id": "p1", "volumes": -1, "gigabytes": -1, "per_volume_gigabytes": -1, "snapshots": 0,
            "backups": 0, "backup_gigabytes": 0, "groups": 0,
            "volumes___DEFAULT__": -1, "gigabytes___DEFAULT__": -1, "snapshots___DEFAULT__": 0,
            "volumes_multiattach": -1, "gigabytes_multiattach": -1, "snapshots_multiattach": 0});
        let reader = c.with_roles("reader");
        assert_eq!(reader.get("/os-quota-sets/p1").await.expect(200).body, json!({"quota_set": limits}));
        assert_eq!(reader.get("/os-quota-sets/p1/defaults").await.expect(200).body, json!({"quota_set": limits}));
        let usage = reader.get("/os-quota-sets/p1?usage=True").await.expect(200).body;
        let of = |key: &str| (usage["quota_set"][key]["limit"].clone(), usage["quota_set"][key]["in_use"].clone());
        assert_eq!(of("volumes"), (json!(-1), json!(2)));
        assert_eq!(of("gigabytes"), (json!(-1), json!(5)));
        assert_eq!(of("gigabytes_multiattach"), (json!(-1), json!(3)));
        assert_eq!(of("volumes___DEFAULT__"), (json!(-1), json!(1)));
        assert_eq!(of("snapshots"), (json!(0), json!(0)));
        assert_eq!(usage["quota_set"]["volumes"]["reserved"], 0);
        assert_eq!(usage["quota_set"]["id"], "p1");

        let message = reader.get("/os-quota-sets/p2").await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume_extension:quotas:show to be performed.");
        let theirs = c.get("/os-quota-sets/p2?usage=true").await.expect(200).body;
        assert_eq!(theirs["quota_set"]["gigabytes"]["in_use"], 7, "an admin reads any project's");
        c.get("/os-quota-sets/p1?usage=maybe").await.fault(400, "badRequest");
        c.get("/os-quota-sets/bad%20id").await.fault(400, "badRequest");

        // Only an admin sets quotas (`tests/api/quotas.rs` has what they do); a quota of what
        // Berth does not have stays 0; what was read can be written back; a delete goes back to
        // the defaults.
        let update = json!({"quota_set": {"volumes": 10}});
        let message = c.with_roles("member").put("/os-quota-sets/p1", update.clone()).await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume_extension:quotas:update to be performed.");
        let r = c.put("/os-quota-sets/p1", update).await.expect(200);
        assert_eq!((&r.body["quota_set"]["volumes"], r.body["quota_set"].get("id")), (&json!(10), None));
        let message = c.put("/os-quota-sets/p1", json!({"quota_set": {"snapshots": 5}})).await.fault(400, "badRequest");
        assert!(message.contains("Berth has no snapshots, backups or groups: snapshots is 0"), "{message}");
        c.put("/os-quota-sets/p1", json!({"quota_set": {"floppies": -1}})).await.fault(400, "badRequest");
        c.put("/os-quota-sets/p1", json!({"volumes": -1})).await.fault(400, "badRequest");
        let same = json!({"quota_set": {"volumes": -1, "gigabytes_multiattach": "-1", "backups": 0, "tenant_id": "p1"}});
        let r = c.put("/os-quota-sets/p1", same).await.expect(200);
        assert_eq!((&r.body["quota_set"]["volumes"], r.body["quota_set"].get("id")), (&json!(-1), None));
        c.put("/os-quota-sets/p1", json!({"quota_set": {"gigabytes": 100}})).await.expect(200);
        c.with_roles("member").delete("/os-quota-sets/p1").await.fault(403, "forbidden");
        c.delete("/os-quota-sets/p1").await.expect(200);
        assert_eq!(c.get("/os-quota-sets/p1").await.expect(200).body, json!({"quota_set": limits}));

        // Quota classes (`cinder quota-class-show default`, admins): the defaults.
        let mut class = limits.clone();
        class["id"] = json!("default");
        assert_eq!(c.get("/os-quota-class-sets/default").await.expect(200).body, json!({"quota_class_set": class}));
        let message = c.with_roles("member").get("/os-quota-class-sets/default").await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume_extension:quota_classes:get to be performed.");
        let r = c.put("/os-quota-class-sets/default", json!({"quota_class_set": {"gigabytes": -1}})).await.expect(200);
        assert_eq!(r.body["quota_class_set"]["gigabytes"], -1);
    }

    /// A project's own default volume type (3.62, admins): a volume made there without a type
    /// gets it, and `GET /types/default` shows it; other projects keep the configured default.
    async fn a_projects_default_type_is_what_its_volumes_get_without_a_type(s) {
        let admin = s.client("p1").at("3.62");
        let multi_id = admin.get("/types/multiattach").await.expect(200).body["volume_type"]["id"].clone();
        let r = admin.put("/default-types/p1", json!({"default_type": {"volume_type": "multiattach"}})).await.expect(200);
        assert_eq!(r.body, json!({"default_type": {"project_id": "p1", "volume_type_id": multi_id}}));
        let member = s.client("p1").with_roles("member").at("3.62");
        let v = member.post("/volumes", json!({"volume": {"size": 1}})).await.expect(202);
        assert_eq!((&v.body["volume"]["volume_type"], &v.body["volume"]["multiattach"]), (&json!("multiattach"), &json!(true)));
        assert_eq!(member.get("/types/default").await.expect(200).body["volume_type"]["name"], "multiattach");
        let named = member.post("/volumes", json!({"volume": {"size": 1, "volume_type": "__DEFAULT__"}})).await.expect(202);
        assert_eq!(named.body["volume"]["volume_type"], "__DEFAULT__", "a type named is the type");
        let other = s.client("p2").with_roles("member").at("3.62");
        let v = other.post("/volumes", json!({"volume": {"size": 1}})).await.expect(202);
        assert_eq!(v.body["volume"]["volume_type"], "__DEFAULT__");
        assert_eq!(other.get("/types/default").await.expect(200).body["volume_type"]["name"], "__DEFAULT__");

        // Listed and shown to admins only.
        let listed = admin.get("/default-types").await.expect(200);
        assert_eq!(listed.body, json!({"default_types": [{"project_id": "p1", "volume_type_id": multi_id}]}));
        assert_eq!(admin.get("/default-types/p1").await.expect(200).body["default_type"]["volume_type_id"], multi_id);
        let message = admin.get("/default-types/p2").await.fault(404, "itemNotFound");
        assert_eq!(message, "Default type for project p2 not found.");
        let message = member.get("/default-types/p1").await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume_extension:default_get to be performed.");
        member.put("/default-types/p1", json!({"default_type": {"volume_type": "__DEFAULT__"}})).await.fault(403, "forbidden");
        member.delete("/default-types/p1").await.fault(403, "forbidden");

        // A type that does not exist, or a bad body, changes nothing.
        let message = admin.put("/default-types/p1", json!({"default_type": {"volume_type": "gold"}})).await.fault(400, "badRequest");
        assert_eq!(message, "Invalid input received: Volume type with name gold could not be found.");
        admin.put("/default-types/p1", json!({"volume_type": "multiattach"})).await.fault(400, "badRequest");
        admin.put("/default-types/bad%20id", json!({"default_type": {"volume_type": "multiattach"}})).await.fault(400, "badRequest");
        assert_eq!(admin.get("/default-types/p1").await.expect(200).body["default_type"]["volume_type_id"], multi_id);
        s.client("p1").at("3.61").get("/default-types").await.fault(404, "itemNotFound");

        // Unset (twice: nothing to do the second time): the configured default again.
        admin.delete("/default-types/p1").await.expect(204);
        admin.delete("/default-types/p1").await.expect(204);
        let v = member.post("/volumes", json!({"volume": {"size": 1}})).await.expect(202);
        assert_eq!(v.body["volume"]["volume_type"], "__DEFAULT__");
        assert_eq!(admin.get("/default-types").await.expect(200).body, json!({"default_types": []}));
    }

    /// `os-set_bootable` (`cinder set-bootable`): whether a volume may be booted from, which Nova
    /// checks before it boots an instance from a volume; shown as Cinder shows it, and a filter
    /// of volume lists. A reader may not change it; a bad value changes nothing.
    async fn a_volume_is_made_bootable_and_listed_by_it(s) {
        let c = s.client("p1");
        let boot = c.create_volume(json!({"size": 1, "name": "boot"})).await;
        c.create_volume(json!({"size": 1, "name": "data"})).await;
        let action = format!("/volumes/{boot}/action");
        assert_eq!(c.get(&format!("/volumes/{boot}")).await.expect(200).body["volume"]["bootable"], "false");
        c.post(&action, json!({"os-set_bootable": {"bootable": true}})).await.expect(202);
        assert_eq!(c.get(&format!("/volumes/{boot}")).await.expect(200).body["volume"]["bootable"], "true");
        let names = |r: berth_tests::server::Resp| -> Vec<String> {
            r.body["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect()
        };
        assert_eq!(names(c.get("/volumes?bootable=true").await.expect(200)), ["boot"]);
        assert_eq!(names(c.get("/volumes?bootable=false").await.expect(200)), ["data"]);
        c.post(&action, json!({"os-set_bootable": {"bootable": "maybe"}})).await.fault(400, "badRequest");
        c.post(&action, json!({"os-set_bootable": {}})).await.fault(400, "badRequest");
        c.with_roles("reader").post(&action, json!({"os-set_bootable": {"bootable": false}})).await.fault(403, "forbidden");
        assert_eq!(c.get(&format!("/volumes/{boot}")).await.expect(200).body["volume"]["bootable"], "true");
        c.post(&action, json!({"os-set_bootable": {"bootable": "False"}})).await.expect(202);
        assert_eq!(c.get(&format!("/volumes/{boot}")).await.expect(200).body["volume"]["bootable"], "false");
    }

    /// A volume's image properties (`cinder image-metadata`): what Nova reads of a volume it
    /// boots from. Set, merged, shown in the volume's details and by `os-show_image_metadata`,
    /// listed by (`glance_metadata`), removed.
    async fn a_volumes_image_properties_are_set_shown_listed_by_and_removed(s) {
        let c = s.client("p1").with_roles("member").at("3.54");
        let boot = c.create_volume(json!({"size": 1, "name": "boot"})).await;
        c.create_volume(json!({"size": 1, "name": "data"})).await;
        let action = format!("/volumes/{boot}/action");
        let shown = |c: berth_tests::server::Client| {
            let path = format!("/volumes/{boot}");
            async move { c.get(&path).await.expect(200).body["volume"].clone() }
        };
        assert!(shown(c.clone()).await.get("volume_image_metadata").is_none(), "none until set");

        let set = json!({"os-set_image_metadata": {"metadata": {"hw_disk_bus": "scsi", "hw_scsi_model": "virtio-scsi"}}});
        let r = c.post(&action, set).await.expect(200);
        assert_eq!(r.body, json!({"metadata": {"hw_disk_bus": "scsi", "hw_scsi_model": "virtio-scsi"}}));
        let r = c.post(&action, json!({"os-set_image_metadata": {"metadata": {"hw_disk_bus": "virtio"}}})).await.expect(200);
        assert_eq!(r.body["metadata"], json!({"hw_disk_bus": "virtio", "hw_scsi_model": "virtio-scsi"}), "merged");
        assert_eq!(shown(c.clone()).await["volume_image_metadata"], r.body["metadata"]);
        assert!(shown(c.clone()).await["metadata"].as_object().unwrap().is_empty(), "the user's metadata is apart");
        let reader = c.with_roles("reader");
        assert_eq!(reader.post(&action, json!({"os-show_image_metadata": null})).await.expect(200).body, r.body);
        let names = |r: berth_tests::server::Resp| -> Vec<String> {
            r.body["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap().to_string()).collect()
        };
        assert_eq!(names(c.get("/volumes/detail?glance_metadata={'hw_disk_bus': 'virtio'}").await.expect(200)), ["boot"]);
        assert!(names(c.get("/volumes?glance_metadata={'hw_disk_bus': 'ide'}").await.expect(200)).is_empty());
        let listed = c.get("/volumes/detail?name=boot").await.expect(200).body;
        assert_eq!(listed["volumes"][0]["volume_image_metadata"], r.body["metadata"]);

        // Refused, and nothing changes: a reader's change, a key outside Cinder's pattern, a
        // property the volume does not have.
        reader.post(&action, json!({"os-set_image_metadata": {"metadata": {"a": "b"}}})).await.fault(403, "forbidden");
        c.post(&action, json!({"os-set_image_metadata": {"metadata": {"bad*key": "b"}}})).await.fault(400, "badRequest");
        c.post(&action, json!({"os-set_image_metadata": {"metadata": {"a": 1}}})).await.fault(400, "badRequest");
        let message = c.post(&action, json!({"os-unset_image_metadata": {"key": "hw_video_model"}})).await.fault(404, "itemNotFound");
        assert!(message.contains("hw_video_model"), "{message}");
        assert_eq!(shown(c.clone()).await["volume_image_metadata"], r.body["metadata"]);

        let r = c.post(&action, json!({"os-unset_image_metadata": {"key": "hw_disk_bus"}})).await.expect(200);
        assert_eq!(r.body, json!({"metadata": {"hw_scsi_model": "virtio-scsi"}}));
        c.post(&action, json!({"os-unset_image_metadata": {"key": "hw_scsi_model"}})).await.expect(200);
        assert!(shown(c.clone()).await.get("volume_image_metadata").is_none());
        // Another project's volume is not found.
        s.client("p2").with_roles("member").post(&action, json!({"os-show_image_metadata": null})).await.fault(404, "itemNotFound");
    }

    async fn a_volume_with_attachments_cannot_be_deleted(s) {
        let c = s.client("p1");
        let id = c.create_volume(json!({"size": 1})).await;
        let a = c.attach(&id, Some(connector("iqn.1993-08.org.debian:01:aa", "h1"))).await.expect(200);
        let message = c.delete(&format!("/volumes/{id}")).await.fault(400, "badRequest");
        assert!(message.starts_with("Invalid volume: Volume status must be available or error or error_deleting"), "{message}");
        assert_eq!(c.volume_status(&id).await, "attaching");
        let att = a.body["attachment"]["id"].as_str().unwrap();
        c.at("3.27").delete(&format!("/attachments/{att}")).await.expect(200);
        c.delete(&format!("/volumes/{id}")).await.expect(202);
    }

    async fn an_admin_unmanages_a_volume_without_attachments_and_its_driver_only_removes_the_export(s) {
        let admin = s.client("p1").at("3.54");
        let member = s.client("p1").with_roles("member");
        // The fake driver fails a call its metadata scripts: unmanaging must never ask for
        // delete-volume.
        let id = admin.create_volume(json!({"size": 1, "metadata": {"fake.delete-volume": "backend"}})).await;
        let action = format!("/volumes/{id}/action");
        let message = member.post(&action, json!({"os-unmanage": null})).await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume_extension:volume_unmanage to be performed.");

        let a = admin.attach(&id, Some(connector("iqn.1993-08.org.debian:01:aa", "h1"))).await.expect(200);
        let message = admin.post(&action, json!({"os-unmanage": {}})).await.fault(400, "badRequest");
        assert!(message.starts_with("Invalid volume: Volume status must be available or error or error_deleting"), "{message}");
        assert_eq!(admin.volume_status(&id).await, "attaching");
        let att = a.body["attachment"]["id"].as_str().unwrap();
        admin.delete(&format!("/attachments/{att}")).await.expect(200);

        // The export is removed first: when the driver cannot, nothing changes.
        admin.post(&format!("/volumes/{id}/metadata"), json!({"metadata": {"fake.remove-export": "backend"}})).await.expect(200);
        let message = admin.post(&action, json!({"os-unmanage": null})).await.fault(502, "computeFault");
        assert!(message.contains("remove-export"), "{message}");
        assert_eq!(admin.volume_status(&id).await, "available");
        admin.post(&format!("/volumes/{id}/metadata"), json!({"metadata": {"fake.remove-export": "ok"}})).await.expect(200);

        admin.post(&action, json!({"os-unmanage": null})).await.expect(202);
        admin.get(&format!("/volumes/{id}")).await.fault(404, "itemNotFound");
        assert_eq!(admin.get("/volumes").await.expect(200).body["volumes"], json!([]));
        admin.post(&action, json!({"os-unmanage": null})).await.fault(404, "itemNotFound");
        let events = admin.get(&format!("/os-attachment-events?volume_id={id}")).await.expect(200);
        let last = events.body["attachment_events"].as_array().unwrap().last().unwrap().clone();
        assert_eq!((last["event"].as_str(), last["outcome"].as_str()), (Some("unmanage"), Some("unmanaged")));

        // A volume whose delete failed is unmanaged as well (Berth has no `os-reset_status`).
        let id = admin.create_volume(json!({"size": 1, "metadata": {"fake.delete-volume": "backend"}})).await;
        admin.delete(&format!("/volumes/{id}")).await.fault(502, "computeFault");
        assert_eq!(admin.volume_status(&id).await, "error_deleting");
        admin.post(&format!("/volumes/{id}/action"), json!({"os-unmanage": null})).await.expect(202);
        admin.get(&format!("/volumes/{id}")).await.fault(404, "itemNotFound");
    }

    /// `os-retype` (`cinder retype`): another volume type of the volume's backend; multiattach
    /// follows the type, and changes only while the volume is available (as in Cinder).
    async fn a_volume_is_retyped_to_another_type_of_its_backend(s) {
        let c = s.client("p1");
        let id = c.create_volume(json!({"size": 1})).await;
        let action = format!("/volumes/{id}/action");
        let message = c.with_roles("reader").post(&action, json!({"os-retype": {"new_type": "multiattach"}})).await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume:retype to be performed.");
        c.post(&action, json!({"os-retype": {"new_type": "multiattach", "migration_policy": "never"}})).await.expect(202);
        let v = c.get(&format!("/volumes/{id}")).await.expect(200).body["volume"].clone();
        assert_eq!((v["volume_type"].as_str(), v["multiattach"].as_bool()), (Some("multiattach"), Some(true)));
        // Multiattach now: two hosts attach it.
        let one = c.attach(&id, Some(connector("iqn.1993-08.org.debian:01:h1", "h1"))).await.expect(200);
        let two = c.attach(&id, Some(connector("iqn.1993-08.org.debian:01:h2", "h2"))).await.expect(200);
        for a in [&one, &two] {
            let att = a.body["attachment"]["id"].as_str().unwrap();
            c.at("3.44").post(&format!("/attachments/{att}/action"), json!({"os-complete": null})).await.expect(204);
        }
        assert_eq!(c.volume_status(&id).await, "in-use");
        let message = c.post(&action, json!({"os-retype": {"new_type": "__DEFAULT__"}})).await.fault(400, "badRequest");
        assert!(message.contains("retypes affecting multiattach are only allowed on available volumes"), "{message}");
        let message = c.post(&action, json!({"os-retype": {"new_type": "multiattach"}})).await.fault(400, "badRequest");
        assert!(message.contains("the requested type to be different"), "{message}");
        let message = c.post(&action, json!({"os-retype": {"new_type": "gold"}})).await.fault(400, "badRequest");
        assert_eq!(message, "Invalid input received: Invalid volume_type passed: gold.");
        c.post(&action, json!({"os-retype": {"new_type": "__DEFAULT__", "migration_policy": "always"}})).await.fault(400, "badRequest");
        c.post(&action, json!({"os-retype": {}})).await.fault(400, "badRequest");
        assert_eq!(c.get(&format!("/volumes/{id}")).await.expect(200).body["volume"]["volume_type"], "multiattach", "nothing changed");

        for a in [&one, &two] {
            c.at("3.27").delete(&format!("/attachments/{}", a.body["attachment"]["id"].as_str().unwrap())).await.expect(200);
        }
        let default_id = c.get("/types/default").await.expect(200).body["volume_type"]["id"].as_str().unwrap().to_string();
        c.post(&action, json!({"os-retype": {"new_type": default_id}})).await.expect(202);
        let v = c.get(&format!("/volumes/{id}")).await.expect(200).body["volume"].clone();
        assert_eq!((v["volume_type"].as_str(), v["multiattach"].as_bool()), (Some("__DEFAULT__"), Some(false)));
        c.attach(&id, Some(connector("iqn.1993-08.org.debian:01:h1", "h1"))).await.expect(200);
        c.attach(&id, Some(connector("iqn.1993-08.org.debian:01:h2", "h2"))).await.fault(400, "badRequest");
    }

    async fn volume_metadata_can_be_read_merged_replaced_and_deleted(s) {
        let c = s.client("p1");
        let id = c.create_volume(json!({"size": 1, "metadata": {"a": "1"}})).await;
        let merged = c.post(&format!("/volumes/{id}/metadata"), json!({"metadata": {"b": "2"}})).await.expect(200);
        assert_eq!(merged.body["metadata"], json!({"a": "1", "b": "2"}));
        let item = c.get(&format!("/volumes/{id}/metadata/b")).await.expect(200);
        assert_eq!(item.body, json!({"meta": {"b": "2"}}));
        let replaced = c.put(&format!("/volumes/{id}/metadata"), json!({"metadata": {"c": "3"}})).await.expect(200);
        assert_eq!(replaced.body["metadata"], json!({"c": "3"}));
        c.delete(&format!("/volumes/{id}/metadata/c")).await.expect(200);
        c.delete(&format!("/volumes/{id}/metadata/c")).await.fault(404, "itemNotFound");
        assert_eq!(c.get(&format!("/volumes/{id}/metadata")).await.expect(200).body, json!({"metadata": {}}));
    }

    /// `PUT /volumes/{id}` (`cinder rename`, openstacksdk's `update_volume`) changes the fields
    /// it names and keeps the others, in any status: `null` clears a name, white space around a
    /// name is dropped, metadata is replaced whole; from 3.53 an update must name a field. Bad
    /// input is a 400 that changes nothing; another project's volume is a 404, a reader's call a
    /// 403.
    async fn a_volumes_name_description_and_metadata_can_be_changed(s) {
        let c = s.client("p1");
        let id = c.create_volume(json!({"size": 1, "name": "data", "description": "d", "metadata": {"a": "1"}})).await;
        let path = format!("/volumes/{id}");

        let r = c.put(&path, json!({"volume": {"name": "  logs  "}})).await.expect(200);
        let v = &r.body["volume"];
        assert_eq!((v["name"].as_str(), v["description"].as_str(), &v["metadata"]), (Some("logs"), Some("d"), &json!({"a": "1"})));
        let r = c.put(&path, json!({"volume": {"display_description": "old style", "metadata": {"b": "2"}}})).await.expect(200);
        let v = &r.body["volume"];
        assert_eq!((v["name"].as_str(), v["description"].as_str(), &v["metadata"]), (Some("logs"), Some("old style"), &json!({"b": "2"})));
        let r = c.put(&path, json!({"volume": {"name": null}})).await.expect(200);
        assert_eq!(r.body["volume"]["name"], json!(null));
        let shown = c.get(&path).await.expect(200);
        assert_eq!((&shown.body["volume"]["name"], &shown.body["volume"]["description"]), (&json!(null), &json!("old style")));

        // Below 3.53 an empty update is a no-op, as in Cinder; from 3.53 it is refused.
        c.at("3.52").put(&path, json!({"volume": {}})).await.expect(200);
        let message = c.at("3.53").put(&path, json!({"volume": {}})).await.fault(400, "badRequest");
        assert!(message.ends_with("display_description or metadata is required"), "{message}");

        // Bad input changes nothing.
        let long = "x".repeat(256);
        c.put(&path, json!({"volume": {"name": long}})).await.fault(400, "badRequest");
        c.put(&path, json!({"volume": {"size": 2}})).await.fault(400, "badRequest");
        c.put(&path, json!({"volume": {"metadata": {"": "v"}}})).await.fault(400, "badRequest");
        let many: serde_json::Map<String, serde_json::Value> = (0..129).map(|i| (format!("k{i}"), json!("v"))).collect();
        c.put(&path, json!({"volume": {"metadata": many}})).await.fault(400, "badRequest");
        c.put(&path, json!({"name": "no volume key"})).await.fault(400, "badRequest");
        let v = c.get(&path).await.expect(200).body["volume"].clone();
        assert_eq!((&v["name"], &v["description"], &v["metadata"]), (&json!(null), &json!("old style"), &json!({"b": "2"})));

        s.client("p2").with_roles("member").put(&path, json!({"volume": {"name": "theirs"}})).await.fault(404, "itemNotFound");
        c.with_roles("reader").put(&path, json!({"volume": {"name": "read only"}})).await.fault(403, "forbidden");
        c.put("/volumes/00000000-0000-0000-0000-000000000000", json!({"volume": {"name": "x"}})).await.fault(404, "itemNotFound");

        // Any status: an attached volume is renamed and keeps its attachment.
        let a = c.attach(&id, Some(connector("iqn.2004-10.com.example:rename", "rename-host"))).await.expect(200);
        let att = a.body["attachment"]["id"].as_str().unwrap();
        c.at("3.44").post(&format!("/attachments/{att}/action"), json!({"os-complete": null})).await.expect(204);
        let r = c.put(&path, json!({"volume": {"name": "attached"}})).await.expect(200);
        assert_eq!((r.body["volume"]["name"].as_str(), r.body["volume"]["status"].as_str()), (Some("attached"), Some("in-use")));
        assert_eq!(r.body["volume"]["attachments"][0]["attachment_id"], json!(att));
    }

    /// The one availability zone, as `cinder availability-zone-list` reads it.
    async fn the_availability_zone_list_names_the_zone_of_every_volume(s) {
        let c = s.client("p1");
        let zones = c.with_roles("reader").get("/os-availability-zone").await.expect(200);
        assert_eq!(zones.body, json!({"availabilityZoneInfo": [{"zoneName": "nova", "zoneState": {"available": true}}]}));
        let id = c.create_volume(json!({"size": 1})).await;
        assert_eq!(c.get(&format!("/volumes/{id}")).await.expect(200).body["volume"]["availability_zone"], "nova");
    }

    /// `os-extend` grows an available volume through its driver: the new size is shown once the
    /// driver grew it; a size that is not larger, an attached volume and a bad argument are
    /// refused with Cinder's 400s and change nothing; a driver that fails (or cannot grow
    /// volumes: 501) leaves the volume available at its old size, and the extend succeeds when
    /// tried again.
    async fn os_extend_grows_an_available_volume_and_a_failed_one_stays_as_it_was(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let extend = |size: serde_json::Value| json!({"os-extend": {"new_size": size}});
        c.post(&format!("/volumes/{volume}/action"), extend(json!(3))).await.expect(202);
        let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!((shown.body["volume"]["size"].as_i64(), shown.body["volume"]["status"].as_str()), (Some(3), Some("available")));
        // Cinder's string form.
        c.post(&format!("/volumes/{volume}/action"), extend(json!("4"))).await.expect(202);
        assert_eq!(c.get(&format!("/volumes/{volume}")).await.body["volume"]["size"], 4);

        let message = c.post(&format!("/volumes/{volume}/action"), extend(json!(4))).await.fault(400, "badRequest");
        assert!(message.contains("must be greater than current size"), "{message}");
        for bad in [json!(0), json!(-1), json!("x"), json!(1.5), json!(null)] {
            c.post(&format!("/volumes/{volume}/action"), extend(bad)).await.fault(400, "badRequest");
        }

        // A driver failure: available again at the old size; tried again, it works.
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.extend-volume": "backend:no room"}})).await.expect(200);
        c.post(&format!("/volumes/{volume}/action"), extend(json!(8))).await.fault(502, "computeFault");
        let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!((shown.body["volume"]["size"].as_i64(), shown.body["volume"]["status"].as_str()), (Some(4), Some("available")));
        // A driver that cannot grow volumes (as every 0.1.0 and 0.2.0 driver): 501, unchanged.
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.extend-volume": "unsupported"}})).await.expect(200);
        c.post(&format!("/volumes/{volume}/action"), extend(json!(8))).await.fault(501, "notImplemented");
        let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!((shown.body["volume"]["size"].as_i64(), shown.body["volume"]["status"].as_str()), (Some(4), Some("available")));
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.extend-volume": "ok"}})).await.expect(200);
        c.post(&format!("/volumes/{volume}/action"), extend(json!(8))).await.expect(202);
        assert_eq!(c.get(&format!("/volumes/{volume}")).await.body["volume"]["size"], 8);

        // Attached: refused before 3.42 (as in Cinder), and nothing changes.
        c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:ext", "ext"))).await.expect(200);
        let message =
            c.at("3.41").post(&format!("/volumes/{volume}/action"), extend(json!(9))).await.fault(400, "badRequest");
        assert!(message.contains("must be available to extend"), "{message}");
        assert_eq!(c.get(&format!("/volumes/{volume}")).await.body["volume"]["size"], 8);

        // Another project's volume does not exist for its members.
        let other = s.client("p2").at("3.54").with_roles("member");
        other.post(&format!("/volumes/{volume}/action"), extend(json!(9))).await.fault(404, "itemNotFound");
    }

    /// From 3.42 `os-extend` grows an attached volume too (Cinder's `extend_attached_volume`): it
    /// is in use again at the new size, its attachment and connection as they were; a driver
    /// that fails leaves it in use at its old size, and the extend succeeds when tried again.
    async fn os_extend_grows_an_attached_volume_from_3_42(s) {
        let c = s.client("p1").at("3.42");
        let volume = c.create_volume(json!({"size": 1})).await;
        let extend = |size: i64| json!({"os-extend": {"new_size": size}});
        let created = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:grow", "grow"))).await.expect(200);
        let attachment = created.body["attachment"]["id"].as_str().unwrap().to_string();
        c.at("3.44").post(&format!("/attachments/{attachment}/action"), json!({"os-complete": null})).await.expect(204);
        let before = c.at("3.54").get(&format!("/attachments/{attachment}")).await.expect(200).body["attachment"].clone();
        let size_and_status = || async {
            let shown = c.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
            (shown["size"].as_i64().unwrap(), shown["status"].as_str().unwrap().to_string())
        };

        c.post(&format!("/volumes/{volume}/action"), extend(2)).await.expect(202);
        assert_eq!(size_and_status().await, (2, "in-use".to_string()));
        let after = c.at("3.54").get(&format!("/attachments/{attachment}")).await.expect(200).body["attachment"].clone();
        assert_eq!(after["status"], "attached");
        assert_eq!(after["connection_info"], before["connection_info"]);

        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.extend-volume": "backend:no room"}})).await.expect(200);
        c.post(&format!("/volumes/{volume}/action"), extend(5)).await.fault(502, "computeFault");
        assert_eq!(size_and_status().await, (2, "in-use".to_string()));
        c.post(&format!("/volumes/{volume}/metadata"), json!({"metadata": {"fake.extend-volume": "ok"}})).await.expect(200);
        c.post(&format!("/volumes/{volume}/action"), extend(5)).await.expect(202);
        assert_eq!(size_and_status().await, (5, "in-use".to_string()));

        // Detached afterwards as usual: available at its new size.
        c.at("3.54").delete(&format!("/attachments/{attachment}")).await.expect(200);
        assert_eq!(size_and_status().await, (5, "available".to_string()));
    }
}

/// A backend whose driver is a component file extends only available volumes unless its
/// configuration says `online_extend = true` (the 0.3.0 contract promises drivers no more), and
/// its pool says so (`online_extend_support`); a shipped driver's extends attached ones.
#[tokio::test]
async fn an_attached_volume_is_extended_only_on_a_backend_that_extends_attached_volumes() {
    let mut config = berth_tests::server::fake_config();
    config.backends[0].online_extend = Some(false);
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let c = s.client("p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let created =
        c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:grow", "grow"))).await.expect(200);
    let attachment = created.body["attachment"]["id"].as_str().unwrap().to_string();
    c.post(&format!("/attachments/{attachment}/action"), json!({"os-complete": null})).await.expect(204);
    let body = json!({"os-extend": {"new_size": 2}});
    let message = c.post(&format!("/volumes/{volume}/action"), body).await.fault(400, "badRequest");
    assert!(message.contains("does not extend attached volumes (online_extend"), "{message}");
    let shown = c.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
    assert_eq!((shown["size"].as_i64(), shown["status"].as_str()), (Some(1), Some("in-use")));
    let pools = c.get("/scheduler-stats/get_pools?detail=true").await.expect(200);
    assert_eq!(pools.body["pools"][0]["capabilities"]["online_extend_support"], false);

    let s = TestServer::start(Db::Sqlite).await;
    let pools = s.client("p1").get("/scheduler-stats/get_pools?detail=true").await.expect(200);
    assert_eq!(pools.body["pools"][0]["capabilities"]["online_extend_support"], true);
}

/// A query parameter's value, percent-encoded.
fn urlencoding(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// A retype to a type of another backend would move the volume's data: Berth does not migrate
/// volumes, so it is refused whatever `migration_policy` says, and nothing changes.
#[tokio::test]
async fn a_retype_to_another_backend_is_refused_as_a_migration() {
    let config = berth_tests::server::fake_config_with_backend("second");
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let c = s.client("p1");
    let id = c.create_volume(json!({"size": 1})).await;
    for policy in ["never", "on-demand"] {
        let body = json!({"os-retype": {"new_type": "second", "migration_policy": policy}});
        let message = c.post(&format!("/volumes/{id}/action"), body).await.fault(400, "badRequest");
        assert!(
            message.contains("the retype would migrate the volume, which Berth does not do"),
            "{message}"
        );
    }
    assert_eq!(
        c.get(&format!("/volumes/{id}")).await.expect(200).body["volume"]["volume_type"],
        "__DEFAULT__"
    );
}

/// A member reads only the extra specs Cinder shows users; the others are an admin's (they may
/// name the array's internals).
#[tokio::test]
async fn a_member_reads_only_the_extra_specs_cinder_shows_users() {
    let mut config = berth_tests::server::fake_config();
    config.volume_types[1].extra_specs.insert("array:pool".into(), "ssd-tier-3".into());
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let admin = s.client("p1");
    let member = s.client("p1").with_roles("member");
    let all = admin.get("/types/multiattach/extra_specs").await.expect(200);
    assert_eq!(all.body["extra_specs"], json!({"multiattach": "<is> True", "array:pool": "ssd-tier-3"}));
    let visible = member.get("/types/multiattach/extra_specs").await.expect(200);
    assert_eq!(visible.body["extra_specs"], json!({"multiattach": "<is> True"}));
    member.get("/types/multiattach/extra_specs/array:pool").await.fault(404, "itemNotFound");
    admin.get("/types/multiattach/extra_specs/array:pool").await.expect(200);
}

/// `cinder list-filters` (`GET /resource_filters`, 3.33): the filters each list takes. Each one
/// advertised is sent to its list, which takes it.
#[tokio::test]
async fn every_filter_resource_filters_advertises_is_taken_by_its_list() {
    let s = TestServer::start(Db::Sqlite).await;
    let admin = s.client("p1").at("3.71");
    let r = admin.get("/resource_filters").await.expect(200);
    let lists = r.body["resource_filters"].as_array().unwrap().clone();
    let id = "0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51";
    let mut sent = 0;
    for list in &lists {
        let resource = list["resource"].as_str().unwrap();
        let path = match resource {
            "volume" => "/volumes/detail",
            "attachment" => "/attachments",
            "pool" => "/scheduler-stats/get_pools",
            "attachment_event" => "/os-attachment-events",
            "message" => "/messages",
            "snapshot" => "/snapshots/detail",
            "backup" => "/backups/detail",
            "group" => "/groups/detail",
            "group_snapshot" => "/group_snapshots/detail",
            other => panic!("a resource without a list: {other}"),
        };
        for filter in list["filters"].as_array().unwrap() {
            let key = filter.as_str().unwrap();
            let value = match key {
                "name" | "host" => "x",
                "status" if resource == "volume" => "available",
                "status" | "attach_status" => "attached",
                "volume_type" => "__DEFAULT__",
                "multiattach" | "bootable" => "false",
                "consumes_quota" => "true",
                "metadata" | "glance_metadata" => "{'k': 'v'}",
                "size" => "1",
                "availability_zone" => "nova",
                "created_at" | "updated_at" => "gt:2020-01-01T00:00:00",
                "migration_status" => "migrating",
                "group_id" | "volume_id" | "attachment_id" | "instance_id" | "instance_uuid"
                | "resource_uuid" => id,
                "resource_type" => "VOLUME",
                "event_id" => "VOLUME_VOLUME_008_012",
                "request_id" => "req-0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51",
                "message_level" => "ERROR",
                "outcome" => "ok",
                "access" => "granted",
                "since" | "until" => "2020-01-01T00:00:00Z",
                other => panic!("no sample value for {resource}'s filter {other}: add one"),
            };
            let query: String =
                form_urlencoded::Serializer::new(String::new()).append_pair(key, value).finish();
            admin.get(&format!("{path}?{query}")).await.expect(200);
            sent += 1;
        }
    }
    assert!(sent >= 20, "{lists:?}");
    let volume = lists.iter().find(|l| l["resource"] == "volume").unwrap();
    for key in ["name", "status", "metadata", "size", "bootable", "created_at"] {
        assert!(volume["filters"].as_array().unwrap().contains(&json!(key)), "{volume}");
    }
    let pools = admin.get("/resource_filters?resource=pool").await.expect(200);
    assert_eq!(
        pools.body,
        json!({"resource_filters": [{"resource": "pool", "filters": ["name", "volume_type"]}]})
    );
    assert_eq!(
        admin.get("/resource_filters?resource=consistencygroup").await.expect(200).body,
        json!({"resource_filters": []})
    );
    s.client("p1").at("3.32").get("/resource_filters").await.fault(404, "itemNotFound");
}

/// A project's default type that has left the configuration is refused at the next create that
/// would use it, naming it and the way out; a create that names a type is not affected.
#[tokio::test]
async fn a_projects_default_type_no_longer_configured_is_refused_by_name() {
    let url = berth_tests::pg::fresh_database().await;
    let mut with_gold = berth_tests::server::fake_config();
    let mut gold = with_gold.volume_types[0].clone();
    gold.name = "gold".into();
    with_gold.volume_types.push(gold);
    let before = TestServer::start_on(Db::Postgres, Some(url.clone()), with_gold).await;
    let admin = before.client("p1").at("3.62");
    admin.put("/default-types/p1", json!({"default_type": {"volume_type": "gold"}})).await.expect(200);
    assert_eq!(
        admin.post("/volumes", json!({"volume": {"size": 1}})).await.expect(202).body["volume"]["volume_type"],
        "gold"
    );
    drop(before);
    let after = TestServer::start_on(Db::Postgres, Some(url), berth_tests::server::fake_config()).await;
    let member = after.client("p1").with_roles("member").at("3.62");
    let message = member.post("/volumes", json!({"volume": {"size": 1}})).await.fault(404, "itemNotFound");
    assert!(
        message.contains("default type of project p1") && message.contains("no longer in the configuration"),
        "{message}"
    );
    member.post("/volumes", json!({"volume": {"size": 1, "volume_type": "__DEFAULT__"}})).await.expect(202);
}

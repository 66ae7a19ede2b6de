//! `GET /v3/{project}/os-services`: this node and its backends, with their state, in Cinder's
//! shape; each backend's `service_uuid` names the node and the backend. A volume belongs to the
//! node whose backend made it: another node on the same database sends its changes there, and
//! refuses them (503, nothing recorded) while that node does not answer. An admin disables a
//! node's backend to drain it: it makes no new volume, and serves its volumes as before.

use berth_tests::both_databases;
use berth_tests::server::{Client, Db, TestServer, connector};
use serde_json::{Value, json};

#[tokio::test]
async fn the_services_listing_shows_this_node_and_its_backends_up() {
    let s = TestServer::start(Db::Sqlite).await;
    let admin = s.client("p1");
    let r = admin.get("/os-services").await.expect(200);
    let services = r.body["services"].as_array().unwrap();
    let node = &s.service.owner().node;
    let api = services.iter().find(|x| x["binary"] == "berth-api").expect("the node");
    assert_eq!(api["host"], json!(node));
    assert_eq!(api["state"], "up");
    let volume = services.iter().find(|x| x["binary"] == "cinder-volume").expect("its backend");
    assert_eq!(volume["host"], json!(format!("{node}@fake")));
    assert_eq!(
        (volume["state"].as_str(), volume["status"].as_str(), volume["zone"].as_str()),
        (Some("up"), Some("enabled"), Some("nova"))
    );
    assert!(volume["updated_at"].as_str().is_some_and(|t| t.len() >= 19), "{volume}");
    // Also without the project in the URL, and refused to members.
    admin.without_project_in_url().get("/os-services").await.expect(200);
    let message = s.client("p1").with_roles("member").get("/os-services").await.fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume_extension:services:index to be performed.");
    // A volume's service_uuid names its backend on its node: the same backend on another node
    // is another service.
    let uuid_of = |s: &TestServer| {
        let c = s.client("p1").at("3.48");
        async move {
            let v = c.create_volume(json!({"size": 1})).await;
            c.get(&format!("/volumes/{v}")).await.expect(200).body["volume"]["service_uuid"].clone()
        }
    };
    let here = uuid_of(&s).await;
    assert_eq!(uuid_of(&s).await, here, "stable on one node");
    let mut config = berth_tests::server::fake_config();
    config.node = Some("another-node".into());
    let other = TestServer::start_with(Db::Sqlite, config).await;
    assert_ne!(uuid_of(&other).await, here);
}

/// The services listing's entry for `host`.
async fn service(admin: &Client, host: &str) -> Value {
    let r = admin.get(&format!("/os-services?host={host}")).await.expect(200);
    let services = r.body["services"].as_array().unwrap().clone();
    assert_eq!(services.len(), 1, "only {host}: {services:?}");
    services[0].clone()
}

both_databases! {
    async fn a_disabled_backend_makes_no_new_volume_and_serves_its_volumes_as_before(s) {
        let admin = s.client("p1");
        let member = s.client("p1").with_roles("member").at("3.54");
        let host = format!("{}@fake", s.service.owner().node);
        let volume = member.create_volume(json!({"size": 1})).await;
        let first = member.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:host-a", "host-a"))).await.expect(200);
        let first = first.body["attachment"]["id"].as_str().unwrap().to_string();

        // From 3.49 a backend's state is `up` while it takes new volumes (a node has none).
        let at_349 = admin.at("3.49");
        assert_eq!(service(&at_349, &host).await["backend_state"], "up");
        assert!(service(&admin.at("3.48"), &host).await.get("backend_state").is_none());
        assert!(service(&at_349, &s.service.owner().node).await.get("backend_state").is_none());

        let body = json!({"host": host, "binary": "cinder-volume", "disabled_reason": "array firmware upgrade"});
        let r = admin.put("/os-services/disable-log-reason", body).await.expect(200);
        assert_eq!(r.body, json!({
            "host": host, "binary": "cinder-volume", "service": "", "status": "disabled", "disabled": true,
            "disabled_reason": "array firmware upgrade"
        }));
        let listed = service(&admin, &host).await;
        assert_eq!((&listed["status"], &listed["disabled_reason"], &listed["state"]),
            (&json!("disabled"), &json!("array firmware upgrade"), &json!("up")));
        // Disabled, it is no pool: its backend state is null, as Cinder's.
        let listed = service(&at_349, &host).await;
        assert_eq!((listed.get("backend_state"), &listed["state"]), (Some(&Value::Null), &json!("up")));
        // The node itself is listed as it was.
        let node = service(&admin, &s.service.owner().node).await;
        assert_eq!((&node["binary"], &node["status"]), (&json!("berth-api"), &json!("enabled")));
        let only_volumes = admin.get("/os-services?binary=cinder-volume").await.expect(200);
        assert!(only_volumes.body["services"].as_array().unwrap().iter().all(|x| x["binary"] == "cinder-volume"));

        // No new volume, and nothing of the refused one recorded.
        let count = |c: Client| async move { c.get("/volumes").await.expect(200).body["volumes"].as_array().unwrap().len() };
        let before = count(member.clone()).await;
        let message = member.post("/volumes", json!({"volume": {"size": 1}})).await.fault(503, "serviceUnavailable");
        assert!(message.contains(&host) && message.contains("takes no new volumes"), "{message}");
        assert!(!message.contains("firmware"), "the admin's reason is for admins: {message}");
        assert_eq!(count(member.clone()).await, before);

        // Its volume is served as before: detached, and attached to another host.
        member.delete(&format!("/attachments/{first}")).await.expect(200);
        let second = member.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:host-b", "host-b"))).await;
        let second = second.expect(200).body["attachment"]["id"].as_str().unwrap().to_string();
        assert_eq!(member.volume_status(&volume).await, "attaching");
        member.delete(&format!("/attachments/{second}")).await.expect(200);
        assert_eq!(member.volume_status(&volume).await, "available");

        // `disable` without a reason keeps the reason; members may do neither.
        let plain = json!({"host": host, "binary": "cinder-volume"});
        let r = admin.put("/os-services/disable", plain.clone()).await.expect(200);
        assert_eq!(r.body, json!({"host": host, "binary": "cinder-volume", "service": "", "status": "disabled", "disabled": true}));
        assert_eq!(service(&admin, &host).await["disabled_reason"], "array firmware upgrade");
        let message = member.put("/os-services/enable", plain.clone()).await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume_extension:services:update to be performed.");

        // Enabled again (`service`, Cinder's older name of `binary`, works too): volumes are made
        // again, and the reason is gone.
        let r = admin.put("/os-services/enable", json!({"host": host, "service": "cinder-volume"})).await.expect(200);
        assert_eq!(r.body, json!({"host": host, "binary": "", "service": "cinder-volume", "status": "enabled", "disabled": false}));
        let listed = service(&admin, &host).await;
        assert_eq!((&listed["status"], &listed["disabled_reason"]), (&json!("enabled"), &Value::Null));
        let made = member.create_volume(json!({"size": 1})).await;
        assert_eq!(member.volume_status(&made).await, "available");
        member.delete(&format!("/volumes/{volume}")).await.expect(202);
    }

    /// A disable answers once every create it let through is recorded: a create held in its
    /// transaction after it found the backend enabled (1.5 s at a failpoint) is listed when the
    /// disable answers, and made; the create sent after the answer is refused. On PostgreSQL the
    /// disable waits for it (a lock); without, it answered while the create was held, and the
    /// volume appeared after.
    async fn a_disable_answers_once_the_creates_it_let_through_are_recorded(s) {
        let admin = s.client("p1");
        let member = s.client("p1").with_roles("member").at("3.54");
        let node = s.service.owner().node.clone();
        let held = format!("volume.create.check {node}");
        berth::failpoint::arm(&held, 1, berth::failpoint::Action::Sleep, 1500);
        let create = {
            let member = member.clone();
            tokio::spawn(async move { member.post("/volumes", json!({"volume": {"size": 1, "name": "under-way"}})).await })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while berth::failpoint::seen(&held) == 0 {
            assert!(std::time::Instant::now() < deadline, "the create never reached its check");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let body = json!({"host": format!("{node}@fake"), "binary": "cinder-volume"});
        admin.put("/os-services/disable", body.clone()).await.expect(200);
        let listed = admin.get("/volumes/detail?name=under-way").await.expect(200).body;
        assert_eq!(listed["volumes"].as_array().unwrap().len(), 1, "the disable answered before the create it let through was recorded: {listed}");
        let made = create.await.unwrap().expect(202);
        let volume = made.body["volume"]["id"].as_str().unwrap().to_string();
        assert_eq!(member.volume_status(&volume).await, "available");
        member.post("/volumes", json!({"volume": {"size": 1}})).await.fault(503, "serviceUnavailable");
        admin.put("/os-services/enable", body).await.expect(200);
    }

    async fn service_changes_that_name_no_backend_or_a_bad_reason_are_refused_and_change_nothing(s) {
        let admin = s.client("p1");
        let node = s.service.owner().node.clone();
        let host = format!("{node}@fake");
        let refused = [
            ("/os-services/disable", json!({"host": "nowhere@fake", "binary": "cinder-volume"}), 404,
             "Could not find binary cinder-volume on host nowhere@fake."),
            ("/os-services/disable", json!({"host": host, "binary": "cinder-backup"}), 404,
             "Could not find binary cinder-backup on host"),
            ("/os-services/disable", json!({"host": node, "binary": "berth-api"}), 400, "disable its backends"),
            ("/os-services/disable", json!({"host": host}), 400, "names no binary"),
            ("/os-services/disable", json!({"binary": "cinder-volume"}), 400, "host"),
            ("/os-services/disable", json!({"host": host, "binary": "cinder-volume", "disabled_reason": "x"}), 400,
             "disabled_reason"),
            ("/os-services/disable-log-reason", json!({"host": host, "binary": "cinder-volume", "disabled_reason": "  "}), 400,
             "Disabled reason contains invalid characters or is too long"),
            ("/os-services/disable-log-reason", json!({"host": host, "binary": "cinder-volume"}), 400,
             "Disabled reason contains invalid characters or is too long"),
            ("/os-services/disable-log-reason", json!({"host": host, "binary": "cinder-volume", "disabled_reason": "x".repeat(256)}), 400,
             "Disabled reason contains invalid characters or is too long"),
            ("/os-services/disable-log-reason", json!({"host": host, "binary": "cinder-volume", "disabled_reason": "a\nforged log line"}), 400,
             "Disabled reason contains invalid characters or is too long"),
            ("/os-services/enable", json!({"host": host, "binary": "cinder-volume", "cluster": "berth@fake"}), 400,
             "cluster"),
        ];
        for (path, body, status, expected) in refused {
            let fault = if status == 404 { "itemNotFound" } else { "badRequest" };
            let message = admin.put(path, body.clone()).await.fault(status, fault);
            assert!(message.contains(expected), "{path} {body}: {message}");
        }
        let listed = service(&admin, &host).await;
        assert_eq!((&listed["status"], &listed["disabled_reason"]), (&json!("enabled"), &Value::Null));
        // A reason of 255 characters is taken, trimmed.
        let reason = "r".repeat(255);
        let body = json!({"host": host, "binary": "cinder-volume", "disabled_reason": format!(" {reason} ")});
        admin.put("/os-services/disable-log-reason", body).await.expect(200);
        assert_eq!(service(&admin, &host).await["disabled_reason"], json!(reason));
    }
}

/// The names of the pools `get_pools` lists.
async fn pool_names(c: &Client, query: &str) -> Vec<String> {
    let r = c.get(&format!("/scheduler-stats/get_pools{query}")).await.expect(200);
    r.body["pools"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_string()).collect()
}

/// `get_pools`, on both databases.
mod pools {
    use super::*;

    both_databases! {
        async fn the_pools_are_the_backends_that_take_new_volumes_with_what_berth_made_there(s) {
            let admin = s.client("p1");
            let pool = format!("{}@fake#fake", s.service.owner().node);
            let r = admin.get("/scheduler-stats/get_pools").await.expect(200);
            assert_eq!(r.body, json!({"pools": [{"name": pool}]}));

            let one = admin.create_volume(json!({"size": 1})).await;
            admin.create_volume(json!({"size": 3})).await;
            admin.create_volume(json!({"size": 2, "volume_type": "multiattach"})).await;
            admin.delete(&format!("/volumes/{one}")).await.expect(202);
            let r = admin.get("/scheduler-stats/get_pools?detail=true").await.expect(200);
            let c = &r.body["pools"][0]["capabilities"];
            assert_eq!(r.body["pools"][0]["name"], json!(pool));
            assert_eq!(
                (&c["allocated_capacity_gb"], &c["total_volumes"], &c["total_capacity_gb"], &c["free_capacity_gb"]),
                (&json!(5), &json!(2), &json!("unknown"), &json!("unknown")),
                "{c}"
            );
            assert_eq!((&c["volume_backend_name"], &c["storage_protocol"], &c["vendor_name"]), (&json!("fake"), &json!("iSCSI"), &json!("Berth")));
            assert_eq!((&c["multiattach"], &c["backend_state"]), (&json!(true), &json!("up")));
            assert_eq!(c["volume_types"], json!(["__DEFAULT__", "multiattach"]));
            assert!(c["driver_version"].as_str().unwrap().starts_with("fake "), "{c}");

            // Filters: from 3.28 the name, from 3.35 the volume type; below, none.
            assert_eq!(pool_names(&admin.at("3.28"), &format!("?name={}", pool.replace('#', "%23"))).await, vec![pool.clone()]);
            assert!(pool_names(&admin.at("3.28"), "?name=elsewhere@fake%23fake").await.is_empty());
            assert_eq!(pool_names(&admin.at("3.27"), "?name=elsewhere@fake%23fake").await, vec![pool.clone()]);
            assert_eq!(pool_names(&admin.at("3.35"), "?volume_type=multiattach").await, vec![pool.clone()]);
            let bad = [
                ("3.35", "?volume_type=nothing", 404, "itemNotFound"),
                ("3.34", "?volume_type=multiattach", 400, "badRequest"),
                ("3.28", "?colour=blue", 400, "badRequest"),
                ("3.0", "?detail=maybe", 400, "badRequest"),
            ];
            for (version, query, status, fault) in bad {
                admin.at(version).get(&format!("/scheduler-stats/get_pools{query}")).await.fault(status, fault);
            }
            let message = s.client("p1").with_roles("member").get("/scheduler-stats/get_pools").await.fault(403, "forbidden");
            assert_eq!(message, "Policy doesn't allow scheduler_extension:scheduler_stats:get_pools to be performed.");

            // A disabled backend takes no new volume: it is no pool, until it is enabled.
            let host = json!({"host": format!("{}@fake", s.service.owner().node), "binary": "cinder-volume"});
            admin.put("/os-services/disable", host.clone()).await.expect(200);
            assert!(pool_names(&admin, "").await.is_empty());
            admin.put("/os-services/enable", host).await.expect(200);
            assert_eq!(pool_names(&admin, "").await, [pool]);
        }
    }
}

/// `GET /capabilities/{host}` (`cinder get-capabilities`, admins): a backend's driver and what a
/// volume type may ask of it.
#[tokio::test]
async fn a_backends_capabilities_name_its_driver_and_what_a_volume_type_may_ask() {
    let s = TestServer::start(Db::Sqlite).await;
    let admin = s.client("p1");
    let host = format!("{}@fake", s.service.owner().node);
    let r = admin.get(&format!("/capabilities/{host}")).await.expect(200);
    let c = &r.body;
    assert_eq!(c["namespace"], json!(format!("OS::Storage::Capabilities::{host}")));
    assert_eq!(
        (&c["volume_backend_name"], &c["vendor_name"], &c["storage_protocol"]),
        (&json!("fake"), &json!("Berth"), &json!("iSCSI"))
    );
    assert!(c["driver_version"].as_str().unwrap().starts_with("fake "), "{c}");
    assert_eq!(c["properties"]["multiattach"]["type"], "boolean");
    let message = admin.get("/capabilities/nowhere@fake").await.fault(404, "itemNotFound");
    assert_eq!(message, "Can't find service: nowhere@fake");
    admin.get(&format!("/capabilities/{}", s.service.owner().node)).await.fault(404, "itemNotFound");
    let message = s
        .client("p1")
        .with_roles("member")
        .get(&format!("/capabilities/{host}"))
        .await
        .fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume_extension:capabilities to be performed.");
}

/// Each backend is a pool; a volume type's are its backend's.
#[tokio::test]
async fn each_backend_is_a_pool_and_a_volume_type_leads_to_its_own() {
    let s = TestServer::start_with(Db::Sqlite, berth_tests::server::fake_config_with_backend("second")).await;
    let admin = s.client("p1").at("3.35");
    let node = &s.service.owner().node;
    let (fake, second) = (format!("{node}@fake#fake"), format!("{node}@second#second"));
    assert_eq!(pool_names(&admin, "").await, [fake.clone(), second.clone()]);
    assert_eq!(pool_names(&admin, "?volume_type=second").await, vec![second.clone()]);
    assert_eq!(pool_names(&admin, "?volume_type=__DEFAULT__").await, [fake]);
    admin.create_volume(json!({"size": 4, "volume_type": "second"})).await;
    let r = admin.get("/scheduler-stats/get_pools?detail=true&volume_type=second").await.expect(200);
    assert_eq!(r.body["pools"][0]["capabilities"]["allocated_capacity_gb"], 4);
}

/// Two nodes on one PostgreSQL database, each with its own (node-local) backend "fake", with a
/// short lease so that a stopped node is soon seen down.
async fn two_nodes() -> (TestServer, TestServer) {
    let url = berth_tests::pg::fresh_database().await;
    let node = |name: &str| {
        let mut config = berth_tests::server::fake_config();
        config.node = Some(name.into());
        config.operations.lease_seconds = 1;
        config
    };
    let a = TestServer::start_on(Db::Postgres, Some(url.clone()), node("node-a")).await;
    let b = TestServer::start_on(Db::Postgres, Some(url), node("node-b")).await;
    (a, b)
}

fn forwarded_to(node: &str) -> u64 {
    let text = berth::metrics::METRICS.render();
    let line = format!("berth_forwarded_requests_total{{node=\"{node}\",outcome=\"answered\"}} ");
    text.lines().find_map(|l| l.strip_prefix(&line)).map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn any_node_answers_for_a_volume_by_sending_its_changes_to_the_node_that_owns_it() {
    let (a, b) = two_nodes().await;
    let on_a = a.client("p1").at("3.54");
    let on_b = b.client("p1").at("3.54");
    let volume = on_a.create_volume(json!({"size": 1})).await;
    let spare = on_a.create_volume(json!({"size": 1})).await;
    let before = forwarded_to("node-a");

    // Every change sent to node b runs on node a, which owns the volume: b forwards it.
    let made =
        on_b.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:host-b", "host-b"))).await.expect(200);
    let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
    assert_eq!(made.body["attachment"]["connection_info"]["target_lun"], 1, "{}", made.body);
    on_b.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
    assert_eq!(on_b.volume_status(&volume).await, "in-use");
    on_b.get(&format!("/attachments/{id}")).await.expect(200);
    on_b.post(
        &format!("/volumes/{volume}/action"),
        json!({"os-terminate_connection": {"connector": connector("iqn.1993-08.org.debian:01:host-b", "host-b")}}),
    )
    .await
    .expect(202);
    on_b.delete(&format!("/attachments/{id}")).await.expect(200);
    assert_eq!(on_b.volume_status(&volume).await, "available");
    on_b.delete(&format!("/volumes/{spare}")).await.expect(202);
    assert!(
        forwarded_to("node-a") >= before + 4,
        "the changes went through node a: {} forwarded",
        forwarded_to("node-a") - before
    );

    // Both nodes name its node as Cinder does (admins see `node@backend#pool`).
    for c in [&on_a, &on_b] {
        let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!(shown.body["volume"]["os-vol-host-attr:host"], "node-a@fake#fake");
    }
}

#[tokio::test]
async fn a_node_that_does_not_answer_makes_its_volumes_unavailable_and_nothing_is_recorded() {
    let (a, b) = two_nodes().await;
    let on_a = a.client("p1").at("3.54");
    let on_b = b.client("p1").at("3.54");
    let volume = on_a.create_volume(json!({"size": 1})).await;
    let made =
        on_a.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:host-a", "host-a"))).await.expect(200);
    let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
    let status_before = on_b.volume_status(&volume).await;
    let store = b.service.store().clone();
    drop(a);

    let attempts = async |expect: &str| {
        let refused = [
            on_b.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:host-b", "host-b"))).await,
            on_b.delete(&format!("/attachments/{id}")).await,
            on_b.delete(&format!("/volumes/{volume}")).await,
            on_b.post(
                &format!("/volumes/{volume}/action"),
                json!({"os-terminate_connection": {"connector": connector("iqn.1993-08.org.debian:01:host-a", "host-a")}}),
            )
            .await,
        ];
        for r in refused {
            let message = r.fault(503, "serviceUnavailable");
            assert!(message.contains(expect), "{message}");
            assert_eq!(r.header("retry-after"), Some("1"));
        }
    };
    // Registered and beating its heart, but not answering: the forwarded requests get no answer.
    let registration = berth::store::nodes::Registration {
        name: "node-a",
        backends: &["fake".to_string()],
        shared_backends: &[],
        url: Some("http://127.0.0.1:9"),
        version: "test",
        incarnation: "test",
        holder: "elsewhere",
        lease_seconds: 0,
        backend_info: &Default::default(),
        types: &Default::default(),
    };
    store.write(async |tx| berth::store::nodes::register(tx, &registration).await).await.unwrap();
    attempts("forwarded to Berth node node-a, which serves its volume, and got no answer").await;
    // Silent past a lease: down. Nobody else touches its volumes.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    attempts("served by another Berth node, node-a (down: no heartbeat for").await;

    let (status, live, ops) = store
        .read(async |tx| {
            let v = berth::store::volumes::get(tx, &volume, berth::domain::list::Scope::All).await?.unwrap();
            let live = berth::store::attachments::of_volume(tx, &volume).await?;
            let ops = berth::store::operations::all(tx).await?;
            Ok::<_, berth::store::StoreError>((v.status, live, ops))
        })
        .await
        .unwrap();
    assert_eq!(status.as_str(), status_before, "unchanged");
    assert_eq!(live.len(), 1, "no attachment was added or removed: {live:?}");
    assert!(ops.is_empty(), "no operation was recorded: {ops:?}");
}

/// A newer berth that upgrades the database's schema while an older one still runs (a node of a
/// cluster not yet upgraded, or the old process of one node): the older one notices at its next
/// heartbeat and refuses every change with 503 naming the migration, instead of writing with
/// statements the schema no longer fits; reads go on. An older berth that starts on that database
/// is refused the same way. When the schema is one it knows again, it makes changes again.
#[tokio::test]
async fn a_berth_older_than_the_databases_schema_refuses_changes_and_says_why() {
    for db in [Db::Sqlite, Db::Postgres] {
        let mut config = berth_tests::server::fake_config();
        config.operations.lease_seconds = 1;
        let s = TestServer::start_with(db, config).await;
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let newer = berth::store::schema_known() + 1;
        let store = s.service.store();
        store
            .write(async |tx| {
                tx.execute(
                    "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                     VALUES ($1, 'a newer berth', TRUE, '', 0)",
                    &berth::params![newer],
                )
                .await
            })
            .await
            .unwrap();

        // Within a heartbeat (a third of the lease), changes are refused, reads answered.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let refused = loop {
            let r = c.post("/volumes", json!({"volume": {"size": 1}})).await;
            if r.status == 503 {
                break r;
            }
            assert_eq!(r.status, 202, "{db:?}: {}", r.body);
            assert!(std::time::Instant::now() < deadline, "{db:?}: changes were never refused");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };
        let message = refused.body["serviceUnavailable"]["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains(&format!("migration {newer}")), "{db:?}: {message}");
        let attach = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h", "h"))).await;
        assert_eq!(attach.status, 503, "{db:?}: {}", attach.body);
        assert_eq!(c.volume_status(&volume).await, "available", "{db:?}: nothing was changed");

        // An older berth starting on it is refused, naming the migration.
        let url = s.config.database_url.clone().unwrap();
        let Err(e) = berth::store::Store::open(&url, &Default::default()).await else {
            panic!("{db:?}: an older berth opened a newer schema")
        };
        assert!(e.to_string().contains(&format!("migration {newer}, newer than this build")), "{db:?}: {e}");

        // The schema is one this build knows again: changes are made again.
        store
            .write(async |tx| {
                tx.execute("DELETE FROM _sqlx_migrations WHERE version = $1", &berth::params![newer]).await
            })
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h", "h"))).await.status != 200 {
            assert!(std::time::Instant::now() < deadline, "{db:?}: changes stayed refused");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// Between the newer berth's migration and the older one's next heartbeat (a third of the lease),
/// a change whose statements no longer fit the schema is answered with the same 503, not a 500:
/// a failed write looks at the schema before it answers.
#[tokio::test]
async fn a_change_that_fails_on_a_newer_schema_before_the_heartbeat_saw_it_is_refused_not_a_500() {
    for db in [Db::Sqlite, Db::Postgres] {
        // The default lease: the first heartbeat is ten seconds away.
        let s = TestServer::start(db).await;
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let newer = berth::store::schema_known() + 1;
        // The newer schema keeps the history elsewhere, as a migration could.
        s.service
            .store()
            .write(async |tx| {
                tx.execute(
                    "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                     VALUES ($1, 'a newer berth', TRUE, '', 0)",
                    &berth::params![newer],
                )
                .await?;
                tx.execute("ALTER TABLE attach_events RENAME TO attach_events_elsewhere", &[]).await
            })
            .await
            .unwrap();
        let r = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h", "h"))).await;
        let message = r.fault(503, "serviceUnavailable");
        assert!(message.contains(&format!("migration {newer}")), "{db:?}: {message}");
        assert_eq!(c.volume_status(&volume).await, "available", "{db:?}: nothing was changed");
        // From then on every change is refused at once.
        c.post("/volumes", json!({"volume": {"size": 1}})).await.fault(503, "serviceUnavailable");
    }
}

/// A disk that fails a sync of SQLite's write-ahead log (SQLite with `synchronous=FULL`, the
/// default): the change that waited on it is answered 503, never acknowledged, and so is every
/// change after it, since what this process committed before the failure may not be on disk and
/// the next change could build on it; reads go on. A berth started again on the database (what
/// the disk kept) makes changes again.
#[tokio::test]
async fn after_the_disk_fails_a_sync_of_the_log_every_change_is_refused_until_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("berth.db");
    let url = format!("sqlite://{}", db.display());
    let mut config = berth_tests::server::fake_config();
    config.node = Some("the-node".into());
    config.operations.lease_seconds = 1;
    let s = TestServer::start_on(Db::Sqlite, Some(url.clone()), config.clone()).await;
    let c = s.client("p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;

    berth::failpoint::arm(
        &format!("store.wal.sync {}-wal", db.display()),
        1,
        berth::failpoint::Action::Fail,
        0,
    );
    let host = || Some(connector("iqn.1993-08.org.debian:01:h", "h"));
    let attach = c.attach(&volume, host()).await;
    assert_eq!(attach.status, 503, "{}", attach.body);
    for _ in 0..3 {
        let r = c.post("/volumes", json!({"volume": {"size": 1}})).await;
        assert_eq!(r.status, 503, "a change after the failed sync: {}", r.body);
        assert!(r.body["serviceUnavailable"]["message"].is_string(), "{}", r.body);
    }
    assert_eq!(c.get(&format!("/volumes/{volume}")).await.status, 200, "reads go on");
    drop(s);

    // The refusing process writes no heartbeat: once its lease has run out the node is free.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let s = TestServer::start_on(Db::Sqlite, Some(url), config).await;
    let c = s.client("p1").at("3.54");
    // The sync that failed was the attach's first: its outcome's, its intent being written and
    // not synced. What the disk kept of it stands (here all of it, the pages reached the disk:
    // the attachment the 503 answered); like any attachment it is its client's to end.
    let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    for a in listed.body["attachments"].as_array().unwrap() {
        c.delete(&format!("/attachments/{}", a["id"].as_str().unwrap())).await.expect(200);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let r = c.attach(&volume, host()).await;
        if r.status == 200 {
            break;
        }
        // An operation left unfinished would be recovered once its lease ran out.
        assert!(std::time::Instant::now() < deadline, "changes stayed refused: {} {}", r.status, r.body);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    c.create_volume(json!({"size": 1})).await;
}

/// A backend taken out of the configuration: its volumes are still shown, and every change that
/// needs their driver (delete, attach, extend) is refused with a 503 that names the backend and
/// what to do, before anything is recorded; an admin can unmanage them (nothing to ask a driver);
/// once the backend is configured again, they are served as before.
#[tokio::test]
async fn a_volume_whose_backend_no_node_serves_is_refused_until_the_backend_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("berth.db").display());
    let mut two = berth_tests::server::fake_config_with_backend("second");
    two.node = Some("the-node".into());
    // A stopped node's name is free again once its lease has run out.
    two.operations.lease_seconds = 1;
    let lease = std::time::Duration::from_millis(1500);
    let s = TestServer::start_on(Db::Sqlite, Some(url.clone()), two.clone()).await;
    let volume = s.client("p1").create_volume(json!({"size": 1, "volume_type": "second"})).await;
    // And one its backend failed to delete (a decommissioned array's).
    let stuck = s
        .client("p1")
        .create_volume(
            json!({"size": 1, "volume_type": "second", "metadata": {"fake.delete-volume": "backend"}}),
        )
        .await;
    s.client("p1").delete(&format!("/volumes/{stuck}")).await.fault(502, "computeFault");
    drop(s);
    tokio::time::sleep(lease).await;

    let mut one = two.clone();
    one.backends.retain(|b| b.name != "second");
    one.volume_types.retain(|t| t.backend != "second");
    let s = TestServer::start_on(Db::Sqlite, Some(url.clone()), one).await;
    let c = s.client("p1").at("3.54");
    assert_eq!(c.volume_status(&volume).await, "available", "still shown");
    let expected = "Backend second is not served by any Berth node: none has a backend named second in its \
                    configuration; add it back (or start the node that serves it) and retry";
    assert_eq!(c.delete(&format!("/volumes/{volume}")).await.fault(503, "serviceUnavailable"), expected);
    assert_eq!(
        c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h", "h")))
            .await
            .fault(503, "serviceUnavailable"),
        expected
    );
    let extend = c.post(&format!("/volumes/{volume}/action"), json!({"os-extend": {"new_size": 2}})).await;
    assert_eq!(extend.fault(503, "serviceUnavailable"), expected);
    assert_eq!(c.volume_status(&volume).await, "available", "nothing recorded");
    // What an admin can still do: make Berth forget a volume, which needs no driver.
    assert_eq!(c.volume_status(&stuck).await, "error_deleting");
    c.post(&format!("/volumes/{stuck}/action"), json!({"os-unmanage": null})).await.expect(202);
    c.get(&format!("/volumes/{stuck}")).await.fault(404, "itemNotFound");
    assert!(
        c.get(&format!("/attachments?volume_id={volume}")).await.expect(200).body["attachments"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    drop(s);

    // A node of another name has a backend "second" too, but not the one that made the volume
    // (a node-local backend is its node's).
    let mut renamed = two.clone();
    renamed.node = Some("another-node".into());
    let s = TestServer::start_on(Db::Sqlite, Some(url.clone()), renamed).await;
    let message = s.client("p1").delete(&format!("/volumes/{volume}")).await.fault(503, "serviceUnavailable");
    assert!(message.contains("this node's backend second is another service"), "{message}");
    drop(s);
    tokio::time::sleep(lease).await;

    let s = TestServer::start_on(Db::Sqlite, Some(url), two).await;
    s.client("p1").delete(&format!("/volumes/{volume}")).await.expect(202);
}

/// A tmpfs of its own for a test's database, unmounted when dropped (needs root, as the suite
/// has).
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn new(size: &str) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs at {} (the suite runs as root)", dir.path().display());
        SmallDisk(dir)
    }

    fn grow(&self, size: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.0.path())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// The database's disk fills up: the change that finds no room is answered 503 with
/// `Retry-After` and says so (it was a 500), never a 500 before or after it; reads go on; an
/// operation it left half done is finished by the reconciler once there is room, and changes
/// are made again, without a restart.
#[tokio::test]
async fn a_full_disk_under_the_database_is_a_503_and_changes_resume_once_there_is_room() {
    let disk = SmallDisk::new("3m");
    let url = format!("sqlite://{}", disk.0.path().join("berth.db").display());
    let s = TestServer::start_on(Db::Sqlite, Some(url), berth_tests::server::fake_config()).await;
    let c = s.client("p1");
    let metadata: serde_json::Map<String, serde_json::Value> =
        (0..100).map(|i| (format!("k{i}"), json!("y".repeat(250)))).collect();
    let mut created = 0;
    let full = loop {
        let r = c.post("/volumes", json!({"volume": {"size": 1, "metadata": metadata}})).await;
        if r.status != 202 {
            break r;
        }
        created += 1;
        assert!(created < 2000, "3 MiB never filled");
    };
    assert_eq!(full.status, 503, "{}", full.body);
    assert_eq!(full.header("retry-after"), Some("1"));
    let message = full.body["serviceUnavailable"]["message"].as_str().unwrap();
    assert!(message.starts_with("The database has no room for the change: its disk is full."), "{message}");
    let again = c.post("/volumes", json!({"volume": {"size": 1}})).await;
    assert_eq!(again.status, 503, "{}", again.body);
    let listed = c.get("/volumes?limit=1000").await.expect(200);
    assert!(listed.body["volumes"].as_array().unwrap().len() >= created, "reads go on");

    disk.grow("64m");
    s.service.reconcile().pass(None, &Default::default()).await.expect("a reconcile pass");
    let volumes = c.get("/volumes/detail?limit=1000").await.expect(200).body["volumes"].clone();
    let volumes = volumes.as_array().unwrap();
    assert!(volumes.iter().all(|v| v["status"] == "available"), "nothing left half done");
    assert!((created..=created + 1).contains(&volumes.len()), "{} of {created}", volumes.len());
    c.post("/volumes", json!({"volume": {"size": 1}})).await.expect(202);
    drop(s);
}

/// A TCP proxy in front of PostgreSQL that a test can cut (the server "goes down": its port
/// refuses connections and the open ones are closed) and restore on the same port.
struct PgLink {
    port: u16,
    upstream: String,
    tasks: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl PgLink {
    /// A proxy to the server of `url`; answers `url` through it.
    async fn to(url: &str) -> (PgLink, String) {
        let (scheme_user, rest) = url.split_once('@').expect("postgres://user@host:port/db");
        let (authority, path) = rest.split_once('/').expect("a database name");
        let upstream =
            if authority.contains(':') { authority.to_string() } else { format!("{authority}:5432") };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let link = PgLink { port, upstream, tasks: Default::default() };
        link.serve(listener);
        (link, format!("{scheme_user}@127.0.0.1:{port}/{path}"))
    }

    fn serve(&self, listener: tokio::net::TcpListener) {
        let (upstream, tasks) = (self.upstream.clone(), self.tasks.clone());
        let accepting = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tasks.lock().unwrap().push(relay);
            }
        });
        self.tasks.lock().unwrap().push(accepting);
    }

    fn cut(&self) {
        for task in self.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    async fn restore(&self) {
        let listener =
            tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await.expect("the same port again");
        self.serve(listener);
    }
}

/// PostgreSQL goes down under a serving node: every request that needs it is answered 503 (with
/// `Retry-After`), the first within the pool's wait for a connection and the next ones within
/// seconds (before, each waited 30 s for each of its transactions: a minute), and the node
/// serves again as soon as the server is back, without a restart.
#[tokio::test]
async fn while_postgresql_is_down_requests_are_refused_quickly_and_served_again_when_it_is_back() {
    let (link, url) = PgLink::to(&berth_tests::pg::fresh_database().await).await;
    let s = TestServer::start_on(Db::Postgres, Some(url), berth_tests::server::fake_config()).await;
    let c = s.client("p1");
    let volume = c.create_volume(json!({"size": 1})).await;

    link.cut();
    let timed = |r: berth_tests::server::Resp, started: std::time::Instant| {
        assert_eq!(r.status, 503, "{}", r.body);
        assert_eq!(r.header("retry-after"), Some("1"));
        started.elapsed()
    };
    let started = std::time::Instant::now();
    let first = timed(c.post("/volumes", json!({"volume": {"size": 1}})).await, started);
    assert!(first < std::time::Duration::from_secs(25), "the first refusal took {first:?}");
    for path in ["/volumes", "/attachments"] {
        let started = std::time::Instant::now();
        let later = timed(c.at("3.27").get(path).await, started);
        assert!(later < std::time::Duration::from_secs(6), "a later refusal took {later:?}");
    }

    link.restore().await;
    let mut served = None;
    for _ in 0..50 {
        let r = c.get(&format!("/volumes/{volume}")).await;
        if r.status == 200 {
            served = Some(r);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(served.is_some(), "served again once PostgreSQL is back");
    c.post("/volumes", json!({"volume": {"size": 1}})).await.expect(202);
}

/// The state is the database's: every node lists a disabled service as disabled, and only the
/// backend disabled stops making volumes; the other node's backend of the same name goes on.
#[tokio::test]
async fn every_node_sees_a_service_disabled_and_only_that_nodes_backend_stops() {
    // The default lease: the pools listed depend on both nodes staying up.
    let url = berth_tests::pg::fresh_database().await;
    let node = |name: &str| {
        let mut config = berth_tests::server::fake_config();
        config.node = Some(name.into());
        config
    };
    let a = TestServer::start_on(Db::Postgres, Some(url.clone()), node("node-a")).await;
    let b = TestServer::start_on(Db::Postgres, Some(url), node("node-b")).await;
    let (on_a, on_b) = (a.client("p1"), b.client("p1"));
    let body = json!({"host": "node-a@fake", "binary": "cinder-volume", "disabled_reason": "drain"});
    on_b.put("/os-services/disable-log-reason", body).await.expect(200);
    for c in [&on_a, &on_b] {
        let listed = service(c, "node-a@fake").await;
        assert_eq!((&listed["status"], &listed["disabled_reason"]), (&json!("disabled"), &json!("drain")));
        assert_eq!(service(c, "node-b@fake").await["status"], "enabled");
    }
    on_a.post("/volumes", json!({"volume": {"size": 1}})).await.fault(503, "serviceUnavailable");
    on_b.create_volume(json!({"size": 1})).await;
    assert_eq!(pool_names(&on_a, "").await, ["node-b@fake#fake"]);
    on_a.put("/os-services/enable", json!({"host": "node-a@fake", "binary": "cinder-volume"}))
        .await
        .expect(200);
    on_a.create_volume(json!({"size": 1})).await;
    assert_eq!(pool_names(&on_b, "").await, ["node-a@fake#fake", "node-b@fake#fake"]);
}

/// A shared backend is a cluster, `berth@backend` (`cinder cluster-list`, 3.7): disabling it
/// stops new volumes on it through every node; its volumes are served as before; enabling it ends
/// that. Admins only. One node's service of it disabled sends that node's creates to another.
#[tokio::test]
async fn a_shared_backend_is_a_cluster_that_an_admin_disables_for_every_node() {
    let url = berth_tests::pg::fresh_database().await;
    let node = |name: &str| {
        let mut config = berth_tests::server::fake_config();
        config.node = Some(name.into());
        config.backends[0].shared = true;
        config
    };
    let a = TestServer::start_on(Db::Postgres, Some(url.clone()), node("shared-a")).await;
    let b = TestServer::start_on(Db::Postgres, Some(url), node("shared-b")).await;
    let (on_a, on_b) = (a.client("p1").at("3.7"), b.client("p1").at("3.7"));
    let r = on_a.get("/clusters").await.expect(200);
    assert_eq!(
        r.body,
        json!({"clusters": [{"name": "berth@fake", "binary": "cinder-volume", "state": "up", "status": "enabled"}]})
    );
    let detail = on_b.get("/clusters/detail").await.expect(200);
    let c = &detail.body["clusters"][0];
    assert_eq!(
        (&c["num_hosts"], &c["num_down_hosts"], &c["disabled_reason"]),
        (&json!(2), &json!(0), &Value::Null)
    );
    let volume = on_a.create_volume(json!({"size": 1})).await;

    // One node's service disabled: a create that reaches it is made by the other node of the
    // cluster, as Cinder's scheduler would send it to another service of the cluster.
    let node_a = json!({"host": "shared-a@fake", "binary": "cinder-volume"});
    on_b.put("/os-services/disable", node_a.clone()).await.expect(200);
    let before = forwarded_to("shared-b");
    let made = on_a.create_volume(json!({"size": 1})).await;
    assert_eq!(on_b.volume_status(&made).await, "available");
    assert_eq!(forwarded_to("shared-b"), before + 1, "node shared-b made it");
    assert_eq!(pool_names(&on_a, "").await, ["berth@fake#fake"], "node b still serves the pool");
    on_b.put("/os-services/enable", node_a).await.expect(200);

    let body = json!({"name": "berth@fake", "disabled_reason": " array swap "});
    let r = on_b.put("/clusters/disable", body).await.expect(200);
    assert_eq!(
        r.body,
        json!({"cluster": {"name": "berth@fake", "binary": "cinder-volume", "state": "up", "status": "disabled",
            "disabled_reason": "array swap"}})
    );
    for c in [&on_a, &on_b] {
        let message =
            c.post("/volumes", json!({"volume": {"size": 1}})).await.fault(503, "serviceUnavailable");
        assert!(message.contains("berth@fake"), "{message}");
        assert!(pool_names(c, "").await.is_empty(), "a disabled cluster is no pool");
    }
    // Its volume is served as before.
    let made = on_b
        .at("3.54")
        .attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h1", "h1")))
        .await
        .expect(200);
    on_a.at("3.54")
        .delete(&format!("/attachments/{}", made.body["attachment"]["id"].as_str().unwrap()))
        .await
        .expect(200);
    let shown = on_a.get("/clusters/berth@fake").await.expect(200);
    assert_eq!(
        (&shown.body["cluster"]["status"], &shown.body["cluster"]["disabled_reason"]),
        (&json!("disabled"), &json!("array swap"))
    );
    // Filters, replication fields from 3.26, and what is refused.
    assert_eq!(
        on_a.get("/clusters?disabled=true").await.expect(200).body["clusters"].as_array().unwrap().len(),
        1
    );
    assert!(
        on_a.get("/clusters?is_up=false").await.expect(200).body["clusters"].as_array().unwrap().is_empty()
    );
    assert!(
        on_a.get("/clusters?num_hosts=3").await.expect(200).body["clusters"].as_array().unwrap().is_empty()
    );
    on_a.get("/clusters?colour=blue").await.fault(400, "badRequest");
    on_a.get("/clusters?frozen=false").await.fault(400, "badRequest");
    let later = on_a.at("3.26").get("/clusters/detail?frozen=false").await.expect(200);
    assert_eq!(
        (&later.body["clusters"][0]["replication_status"], &later.body["clusters"][0]["frozen"]),
        (&json!("disabled"), &json!(false))
    );
    on_a.get("/clusters/berth@nothing").await.fault(404, "itemNotFound");
    on_a.put("/clusters/disable", json!({"name": "berth@nothing"})).await.fault(404, "itemNotFound");
    on_a.put("/clusters/enable", json!({"name": "berth@fake", "disabled_reason": "x"}))
        .await
        .fault(400, "badRequest");
    on_a.at("3.6").get("/clusters").await.fault(404, "itemNotFound");
    let message =
        a.client("p1").with_roles("member").at("3.7").get("/clusters").await.fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow clusters:get_all to be performed.");

    let r = on_a
        .put("/clusters/enable", json!({"name": "berth@fake", "binary": "cinder-volume"}))
        .await
        .expect(200);
    assert_eq!(
        (&r.body["cluster"]["status"], &r.body["cluster"]["disabled_reason"]),
        (&json!("enabled"), &Value::Null)
    );
    on_a.create_volume(json!({"size": 1})).await;
    on_b.create_volume(json!({"size": 1})).await;
    assert_eq!(pool_names(&on_b, "").await, ["berth@fake#fake"]);
    // One node alone has no cluster.
    drop((a, b));
    let single = TestServer::start(Db::Sqlite).await;
    assert_eq!(
        single.client("p1").at("3.7").get("/clusters").await.expect(200).body,
        json!({"clusters": []})
    );
}

/// `os-services/set-log` and `get-log` (3.32; admins): a level and a prefix are checked before
/// anything changes, and only this node's log is changed here (the real change of a running
/// `berth serve` is `cinderclient::python_cinderclient_sets_log_levels_while_serving_...`). A
/// service in a process whose log `berth serve` did not set up says so.
#[tokio::test]
async fn log_level_requests_are_checked_before_any_log_is_touched() {
    let s = TestServer::start(Db::Sqlite).await;
    let admin = s.client("p1").at("3.32");
    let refused = [
        (json!({"level": "LOUD"}), "is not one of DEBUG"),
        (json!({"prefix": "berth,sqlx=trace", "level": "DEBUG"}), "is not a module path"),
        (json!({"prefix": "berth"}), "names no level"),
        (json!({"server": "another-node", "level": "DEBUG"}), "\"another-node\" is no Berth node"),
        (json!({"binary": "nova-compute", "level": "DEBUG"}), "binary"),
        (json!({"level": "DEBUG", "colour": "blue"}), "colour"),
    ];
    for (body, expected) in refused {
        let message = admin.put("/os-services/set-log", body.clone()).await.fault(400, "badRequest");
        assert!(message.contains(expected), "{body}: {message}");
    }
    // Berth has no backup service: its log is none, and setting it changes nothing.
    admin.put("/os-services/set-log", json!({"binary": "cinder-backup", "level": "DEBUG"})).await.expect(202);
    let none = admin.put("/os-services/get-log", json!({"binary": "cinder-backup"})).await.expect(200);
    assert_eq!(none.body, json!({"log_levels": []}));
    let message =
        admin.put("/os-services/set-log", json!({"level": "DEBUG"})).await.fault(409, "conflictingRequest");
    assert!(message.contains("not set up by berth serve"), "{message}");
    let message = s
        .client("p1")
        .with_roles("member")
        .at("3.32")
        .put("/os-services/get-log", json!({}))
        .await
        .fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume_extension:services:update to be performed.");
    s.client("p1").at("3.31").put("/os-services/get-log", json!({})).await.fault(404, "itemNotFound");
}

//! The attach history (`GET /os-attachment-events`, `berth history`): a scripted day of
//! attaches, detaches, a live migration, a force detach and failed calls by several users is
//! recorded event by event with who asked and on which request; the history answers "which hosts
//! could reach volume V between t1 and t2" exactly; members read their own project's events
//! only; and an event edited or deleted in the database is caught by `verify`.

use berth::domain::history::{Access, AttachEvent, NewEvent, reachable};
use berth::params;
use berth_tests::both_databases;
use berth_tests::server::{Client, TestServer, connector};
use serde_json::{Value, json};

const INSTANCE_1: &str = "0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f51";
const INSTANCE_2: &str = "0f0e2a4c-1b57-4a3e-8f6d-6b1c2d3e4f52";
const GLOBAL: &str = "req-6c8a1d3e-0b7f-4c2a-9e5d-1f2a3b4c5d6e";

fn initiator(host: &str) -> String {
    format!("iqn.1993-08.org.debian:01:{host}")
}

fn now_micros() -> i64 {
    berth::store::now_micros()
}

/// Nova attaching a server on a host: create with the connector, complete. Returns the
/// attachment and the request id of the create.
async fn attach(c: &Client, volume: &str, instance: &str, host: &str) -> (String, String) {
    let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": instance,
        "connector": connector(&initiator(host), host)}});
    let made = c.post("/attachments", body).await.expect(200);
    let request = made.header("x-openstack-request-id").unwrap().to_string();
    let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
    c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
    (id, request)
}

async fn events(c: &Client, query: &str) -> Vec<Value> {
    let r = c.get(&format!("/os-attachment-events?{query}")).await.expect(200);
    r.body["attachment_events"].as_array().unwrap().clone()
}

/// An event of the API as the domain's record, to ask the domain's questions of it.
fn record(v: &Value) -> AttachEvent {
    let text = |k: &str| v[k].as_str().map(str::to_string);
    AttachEvent {
        id: text("id").unwrap(),
        seq: v["seq"].as_i64().unwrap(),
        fields: NewEvent {
            volume_id: text("volume_id").unwrap(),
            at: berth::api::volumes::parse_time(v["time"].as_str().unwrap()).unwrap(),
            event: text("event").unwrap(),
            access: Access::parse(v["access"].as_str().unwrap()).unwrap(),
            outcome: text("outcome").unwrap(),
            project_id: text("project_id").unwrap(),
            attachment_id: text("attachment_id"),
            instance_uuid: text("instance_uuid"),
            host: text("host"),
            initiator: text("initiator"),
            user_id: text("user_id").unwrap(),
            caller_project_id: text("caller_project_id").unwrap(),
            roles: serde_json::from_value(v["roles"].clone()).unwrap(),
            service_token: v["service_token"].as_bool().unwrap(),
            request_id: text("request_id"),
            global_request_id: text("global_request_id"),
            node: text("node").unwrap(),
            driver_digest: text("driver_digest"),
        },
        prev_hash: text("prev_hash").unwrap(),
        hash: text("hash").unwrap(),
    }
}

fn hosts(events: &[AttachEvent], from: i64, to: i64) -> Vec<String> {
    reachable(events, from, to).into_iter().collect()
}

/// The (event, access, outcome, host) of each event, for assertions that read as the story.
fn story(events: &[Value]) -> Vec<(String, String, String, String)> {
    events
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("-").to_string();
            (s("event"), s("access"), s("outcome"), s("host"))
        })
        .collect()
}

fn row(event: &str, access: &str, outcome: &str, host: &str) -> (String, String, String, String) {
    (event.into(), access.into(), outcome.into(), host.into())
}

async fn sql(s: &TestServer, statement: &str, id: &str) {
    s.service.store().write(async |tx| tx.execute(statement, &params![id]).await).await.unwrap();
}

both_databases! {
    /// What `berth history` opens the database with: it must be there, at this build's schema,
    /// and it is left as it is.
    async fn a_tool_opens_the_database_only_as_it_is(s) {
        use berth::store::{Opening, Store, StoreError, StoreOptions};
        let url = s.config.database_url();
        let existing = StoreOptions { max_connections: 2, opening: Opening::Existing, ..Default::default() };
        Store::open(&url, &existing).await.expect("the service's own database opens");
        let known = berth::store::schema_known();
        s.service
            .store()
            .write(async |tx| tx.execute("DELETE FROM _sqlx_migrations WHERE version = $1", &params![known]).await)
            .await
            .unwrap();
        match Store::open(&url, &existing).await {
            Err(StoreError::SchemaBehind { applied, known: k }) => assert_eq!((applied, k), (known - 1, known)),
            other => panic!("{:?}", other.map(|_| ())),
        }
        let left = s
            .service
            .store()
            .read(async |tx| tx.query("SELECT COUNT(*) FROM _sqlx_migrations WHERE version = $1", &params![known]).await)
            .await
            .unwrap();
        assert_eq!(left[0].int(0).unwrap(), 0, "migrated by a tool");
    }

    async fn access_ended_where_no_attachment_held_it_is_recorded_as_revoke(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        // Nova's legacy detach of a connector that no attachment has: the driver is still asked
        // to end whatever access it may give, and the history says so.
        c.post(&format!("/volumes/{volume}/action"),
            json!({"os-terminate_connection": {"connector": connector(&initiator("stray"), "stray")}})).await.expect(202);
        let listed = events(&c, &format!("volume_id={volume}")).await;
        assert_eq!(story(&listed), [row("revoke", "revoked", "revoked", "stray")]);
        assert_eq!(listed[0]["initiator"], json!(initiator("stray")));
        assert_eq!(listed[0]["attachment_id"], Value::Null);
        assert_eq!(listed[0]["user_id"], json!("user-p1"), "on behalf of the caller");
        let chain: Vec<AttachEvent> = listed.iter().map(record).collect();
        assert!(chain.iter().all(AttachEvent::is_intact));
    }

    async fn a_day_of_attaches_is_recorded_and_answers_which_hosts_could_reach_a_volume(s) {
        let admin = s.client("p1").at("3.54");
        let nova = admin.with_roles("member").with_service_token().with_header("x-openstack-request-id", GLOBAL);
        let member = admin.with_roles("member");
        let shared = admin.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;

        let t0 = now_micros();
        let (one, one_request) = attach(&nova, &shared, INSTANCE_1, "h1").await;
        let t1 = now_micros();
        let (two, _) = attach(&nova, &shared, INSTANCE_2, "h2").await;
        let t2 = now_micros();
        // A failed connect by a member: the driver refuses initialize-connection; nothing granted.
        admin.post(&format!("/volumes/{shared}/metadata"),
            json!({"metadata": {"fake.initialize-connection": "backend:the array is on fire"}})).await.expect(200);
        member.attach(&shared, Some(connector(&initiator("h3"), "h3"))).await.expect(502);
        admin.post(&format!("/volumes/{shared}/metadata"),
            json!({"metadata": {"fake.initialize-connection": "ok"}})).await.expect(200);
        let t3 = now_micros();
        // Nova detaches h1; an admin force-detaches h2.
        nova.post(&format!("/volumes/{shared}/action"), json!({"os-begin_detaching": null})).await.expect(202);
        nova.delete(&format!("/attachments/{one}")).await.expect(200);
        let t4 = now_micros();
        admin.post(&format!("/volumes/{shared}/action"),
            json!({"os-force_detach": {"attachment_id": two}})).await.expect(202);
        let t5 = now_micros();

        let listed = events(&admin, &format!("volume_id={shared}")).await;
        assert_eq!(story(&listed), [
            row("reserve", "none", "reserved", "h1"),
            row("connect", "granted", "attaching", "h1"),
            row("complete", "none", "attached", "h1"),
            row("reserve", "none", "reserved", "h2"),
            row("connect", "granted", "attaching", "h2"),
            row("complete", "none", "attached", "h2"),
            row("reserve", "none", "reserved", "h3"),
            row("remove", "revoked", "failed", "h3"),
            row("detach", "revoked", "detached", "h1"),
            row("force-detach", "revoked", "detached", "h2"),
        ]);

        // Who asked, on which request, where, with which driver.
        let connect_one = &listed[1];
        assert_eq!(connect_one["attachment_id"], json!(one));
        assert_eq!(connect_one["instance_uuid"], json!(INSTANCE_1));
        assert_eq!(connect_one["initiator"], json!(initiator("h1")));
        assert_eq!(connect_one["request_id"], json!(one_request), "the request that made the change");
        assert_eq!(connect_one["global_request_id"], json!(GLOBAL));
        assert_eq!((connect_one["service_token"].clone(), connect_one["roles"].clone()), (json!(true), json!(["member"])));
        assert_eq!(connect_one["user_id"], json!("user-p1"));
        assert!(!connect_one["node"].as_str().unwrap().is_empty());
        assert_eq!(connect_one["driver_digest"].as_str().unwrap().len(), 64);
        let forced = &listed[9];
        assert_eq!((forced["service_token"].clone(), forced["roles"].clone()), (json!(false), json!(["admin"])));
        assert_eq!(listed[7]["user_id"], json!("user-p1"));
        assert_eq!(listed[7]["service_token"], json!(false));
        let no_secrets = serde_json::to_string(&listed).unwrap();
        assert!(!no_secrets.contains("auth_password") && !no_secrets.contains("auth_username"));

        // The question an auditor asks, answered exactly for each window.
        let chain: Vec<AttachEvent> = listed.iter().map(record).collect();
        assert!(chain.iter().all(AttachEvent::is_intact), "the API shows each event's own hash");
        assert_eq!(hosts(&chain, 0, t0), Vec::<String>::new());
        assert_eq!(hosts(&chain, t0, t1), ["h1"]);
        assert_eq!(hosts(&chain, t1, t2), ["h1", "h2"]);
        assert_eq!(hosts(&chain, t2, t3), ["h1", "h2"], "the failed connect gave h3 nothing");
        assert_eq!(hosts(&chain, t4, t4), ["h2"], "h1 was detached");
        assert_eq!(hosts(&chain, t5, i64::MAX), Vec::<String>::new(), "h2 was force-detached");

        // Filters: host (name or initiator), access, outcome, a time window.
        let h1 = events(&admin, &format!("volume_id={shared}&host=h1")).await;
        assert_eq!(h1.len(), 4);
        assert_eq!(events(&admin, &format!("host={}", initiator("h2"))).await.len(), 3, "the initiator matches the events that carry a connector");
        let granted = events(&admin, &format!("volume_id={shared}&access=granted")).await;
        assert_eq!(granted.iter().map(|e| e["host"].as_str().unwrap()).collect::<Vec<_>>(), ["h1", "h2"]);
        assert_eq!(events(&admin, "outcome=failed").await.len(), 1);
        let window = |from: i64, to: i64| format!(
            "volume_id={shared}&since={}&until={}",
            berth::api::views::timestamp(from), berth::api::views::timestamp(to));
        assert_eq!(story(&events(&admin, &window(t3, t5)).await), [
            row("detach", "revoked", "detached", "h1"),
            row("force-detach", "revoked", "detached", "h2"),
        ]);
        assert_eq!(events(&admin, &format!("attachment_id={two}")).await.len(), 4);
        assert_eq!(events(&admin, &format!("instance_id={INSTANCE_1}")).await.len(), 4);

        // Paging by marker walks the same events in the same order.
        let mut paged = Vec::new();
        let mut marker = String::new();
        loop {
            let r = admin.get(&format!("/os-attachment-events?volume_id={shared}&limit=3{marker}")).await.expect(200);
            let page = r.body["attachment_events"].as_array().unwrap().clone();
            if page.is_empty() { break; }
            marker = format!("&marker={}", page.last().unwrap()["id"].as_str().unwrap());
            assert_eq!(r.body["attachment_events_links"].is_array(), page.len() == 3);
            paged.extend(page);
        }
        assert_eq!(paged, listed);

        // Bad input is a 400 or a 404 in Cinder's shape.
        admin.get("/os-attachment-events?access=maybe").await.fault(400, "badRequest");
        admin.get("/os-attachment-events?since=yesterday").await.fault(400, "badRequest");
        admin.get("/os-attachment-events?sort=at").await.fault(400, "badRequest");
        admin.get("/os-attachment-events?marker=5d9e0c8a-4f1b-4e7e-9d0c-8a4f1b4e7e9d").await.fault(404, "itemNotFound");
    }

    /// Members read their own project's history; an admin reads every project's with
    /// `all_tenants`. A live migration's two hosts are both in it.
    async fn members_read_their_projects_history_and_a_live_migration_shows_both_hosts(s) {
        let p1 = s.client("p1").at("3.54");
        let p2 = s.client("p2").at("3.54");
        let nova = p1.with_roles("member").with_service_token();
        let volume = p1.create_volume(json!({"size": 1})).await;
        let (source, _) = attach(&nova, &volume, INSTANCE_1, "src").await;
        // Live migration: a second attachment for the same instance on the destination, then the
        // source's goes.
        let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": INSTANCE_1,
            "connector": connector(&initiator("dst"), "dst")}});
        let dest = nova.post("/attachments", body).await.expect(200).body["attachment"]["id"].as_str().unwrap().to_string();
        nova.post(&format!("/attachments/{dest}/action"), json!({"os-complete": null})).await.expect(204);
        let migrated = now_micros();
        nova.delete(&format!("/attachments/{source}")).await.expect(200);
        let theirs = p2.create_volume(json!({"size": 1})).await;
        p2.attach(&theirs, Some(connector(&initiator("h9"), "h9"))).await.expect(200);

        let chain: Vec<AttachEvent> = events(&p1, &format!("volume_id={volume}")).await.iter().map(record).collect();
        assert_eq!(chain.iter().filter(|e| e.fields.event == "reserve-for-migration").count(), 1);
        assert_eq!(hosts(&chain, migrated, migrated), ["dst", "src"]);
        assert_eq!(hosts(&chain, now_micros(), i64::MAX), ["dst"]);

        let member = p1.with_roles("member");
        let own = events(&member, "all_tenants=1").await;
        assert!(!own.is_empty() && own.iter().all(|e| e["project_id"] == "p1"), "members see their project only");
        assert!(events(&p2.with_roles("reader"), "").await.iter().all(|e| e["project_id"] == "p2"));
        let all = events(&p1, "all_tenants=1").await;
        assert!(all.iter().any(|e| e["project_id"] == "p2") && all.iter().any(|e| e["project_id"] == "p1"));
        assert!(events(&p1, "").await.iter().all(|e| e["project_id"] == "p1"), "an admin's own project by default");
        s.client("p3").with_roles("nobody").get("/os-attachment-events").await.fault(403, "forbidden");
    }

    /// A connect that fails on an attachment that already had access with the same connector (an
    /// update replayed, or interrupted and undone by recovery) ends that access: the history says
    /// so, and the host is not counted as reaching the volume afterwards.
    async fn a_failed_reconnect_with_the_same_connector_records_the_access_revoked(s) {
        let c = s.client("p1").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        let made = c.attach(&volume, Some(connector(&initiator("h1"), "h1"))).await.expect(200);
        let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
        c.post(&format!("/volumes/{volume}/metadata"),
            json!({"metadata": {"fake.initialize-connection": "backend:the array is on fire"}})).await.expect(200);
        c.put(&format!("/attachments/{id}"), json!({"attachment": {"connector": connector(&initiator("h1"), "h1")}}))
            .await
            .expect(502);
        let listed = events(&c, &format!("attachment_id={id}")).await;
        assert_eq!(story(&listed).last().unwrap(), &row("undo-connect", "revoked", "failed", "h1"));
        let chain: Vec<AttachEvent> = listed.iter().map(record).collect();
        assert_eq!(hosts(&chain, now_micros(), i64::MAX), Vec::<String>::new());
    }

    /// Tamper evidence: an edited event, a deleted event in the middle of a chain and the deleted
    /// last event of a chain are each found by `verify`, named by volume and event.
    async fn an_edited_or_deleted_event_is_caught_by_verify(s) {
        let c = s.client("p1").at("3.54").with_service_token();
        let mut volumes = Vec::new();
        for host in ["a", "b", "c", "d"] {
            let v = c.create_volume(json!({"size": 1})).await;
            let (id, _) = attach(&c, &v, INSTANCE_1, host).await;
            c.delete(&format!("/attachments/{id}")).await.expect(200);
            volumes.push(v);
        }
        let store = s.service.store();
        let clean = berth::attach::history::verify(store).await.unwrap();
        assert_eq!((clean.chains, clean.events, clean.breaks.len()), (4, 16, 0));

        let chain = |v: &str| {
            let v = v.to_string();
            async move { events(&s.client("p1"), &format!("volume_id={v}")).await.iter().map(record).collect::<Vec<_>>() }
        };
        let edited = chain(&volumes[0]).await[1].clone();
        sql(s, "UPDATE attach_events SET host = 'elsewhere' WHERE id = $1", &edited.id).await;
        let middle = chain(&volumes[1]).await[2].clone();
        sql(s, "DELETE FROM attach_events WHERE id = $1", &middle.id).await;
        let last = chain(&volumes[2]).await[3].clone();
        sql(s, "DELETE FROM attach_events WHERE id = $1", &last.id).await;

        let found = berth::attach::history::verify(store).await.unwrap();
        let mut breaks: Vec<(String, Option<String>, i64)> =
            found.breaks.iter().map(|b| (b.volume_id.clone(), b.event_id.clone(), b.seq)).collect();
        breaks.sort();
        let next_after_middle = chain(&volumes[1]).await[2].clone();
        let mut expected = vec![
            (volumes[0].clone(), Some(edited.id.clone()), 2),
            (volumes[1].clone(), Some(next_after_middle.id.clone()), 4),
            (volumes[2].clone(), None, 3),
        ];
        expected.sort();
        assert_eq!(breaks, expected, "{:?}", found.breaks);
        assert!(found.breaks.iter().all(|b| b.volume_id != volumes[3]), "the untouched chain verifies");

        // Export, prune and verify the archived segment: what is left still verifies from
        // where it now starts (the broken chains aside).
        let mut segment = Vec::new();
        berth::attach::history::export(store, None, |e| {
            segment.push(e.clone());
            Ok::<_, berth::store::StoreError>(())
        })
        .await
        .unwrap();
        assert_eq!(segment.len(), 14);
        let fourth: Vec<AttachEvent> = segment.iter().filter(|e| e.fields.volume_id == volumes[3]).cloned().collect();
        assert_eq!(berth::domain::history::verify_segment(&fourth), Ok(1));
        let cut = fourth[2].fields.at;
        let pruned = berth::attach::history::prune(store, cut).await.unwrap();
        assert!(pruned >= 2, "{pruned}");
        let after = berth::attach::history::verify(store).await.unwrap();
        assert!(after.breaks.iter().all(|b| b.volume_id != volumes[3]), "{:?}", after.breaks);
    }

    /// `[history] keep_days` also bounds the attachments' rows: an attachment deleted before then,
    /// of which no event is left, loses its row for good; one with an event left, one deleted since
    /// and a live one keep theirs, and the API still answers for them.
    async fn attachments_deleted_before_keep_days_lose_their_rows_once_no_event_names_them(s) {
        let c = s.client("p1").at("3.54");
        let three_days = "259200000000";
        let mut made = Vec::new();
        for host in ["gone-host", "kept-host", "recent-host", "live-host"] {
            let volume = c.create_volume(json!({"size": 1})).await;
            let (id, _) = attach(&c, &volume, INSTANCE_1, host).await;
            if host != "live-host" {
                c.delete(&format!("/attachments/{id}")).await.expect(200);
            }
            made.push((volume, id));
        }
        let [(gone_volume, gone), (kept_volume, kept), (_, recent), (_, live)] = &made[..] else { unreachable!() };
        // Three days ago: every event of the first attachment and its deletion; the second's
        // deletion and its first two events only; the live one's creation.
        for e in events(&c, &format!("volume_id={gone_volume}")).await {
            sql(s, &format!("UPDATE attach_events SET at = at - {three_days} WHERE id = $1"), e["id"].as_str().unwrap())
                .await;
        }
        for e in &events(&c, &format!("volume_id={kept_volume}")).await[..2] {
            sql(s, &format!("UPDATE attach_events SET at = at - {three_days} WHERE id = $1"), e["id"].as_str().unwrap())
                .await;
        }
        for id in [gone, kept] {
            sql(s, &format!("UPDATE volume_attachment SET deleted_at = deleted_at - {three_days} WHERE id = $1"), id)
                .await;
        }
        sql(s, &format!("UPDATE volume_attachment SET created_at = created_at - {three_days} WHERE id = $1"), live).await;
        let rows = async || -> Vec<String> {
            let ids = s
                .service
                .store()
                .read(async |tx| tx.query("SELECT id FROM volume_attachment ORDER BY id", &[]).await)
                .await
                .unwrap();
            ids.iter().map(|r| r.text(0).unwrap()).collect()
        };
        assert_eq!(rows().await.len(), 4);

        let pruner = berth::serve::housekeeping(s.service.clone(), Some(1));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), pruner).await;
        let mut left = vec![kept.clone(), recent.clone(), live.clone()];
        left.sort();
        assert_eq!(rows().await, left, "only the attachment deleted three days ago with no event left is gone");
        assert!(events(&c, &format!("attachment_id={gone}")).await.is_empty());
        assert_eq!(events(&c, &format!("attachment_id={kept}")).await.len(), 2, "its events still list");
        c.get(&format!("/attachments/{gone}")).await.expect(404);
        c.get(&format!("/attachments/{live}")).await.expect(200);
        let verified = berth::attach::history::verify(s.service.store()).await.unwrap();
        assert_eq!(verified.breaks.len(), 0, "{:?}", verified.breaks);
    }

    /// `[history] keep_days` bounds the volumes' rows too: a volume deleted before then, of which
    /// no attachment row and no event is left, loses its row for good (with where its chain
    /// started); one with an event left, one deleted since and a live one keep theirs, and the
    /// history of what is left still verifies.
    async fn volumes_deleted_before_keep_days_lose_their_rows_once_nothing_names_them(s) {
        let c = s.client("p1").at("3.54");
        let three_days = "259200000000";
        let mut volumes = Vec::new();
        for host in ["gone-host", "kept-host", "recent-host", "live-host"] {
            let volume = c.create_volume(json!({"size": 1})).await;
            let (id, _) = attach(&c, &volume, INSTANCE_1, host).await;
            c.delete(&format!("/attachments/{id}")).await.expect(200);
            if host != "live-host" {
                c.delete(&format!("/volumes/{volume}")).await.expect(202);
            }
            sql(s, &format!("UPDATE volume_attachment SET deleted_at = deleted_at - {three_days} WHERE id = $1"), &id)
                .await;
            volumes.push(volume);
        }
        let [gone, kept, recent, live] = &volumes[..] else { unreachable!() };
        // Three days ago: every event of the first and the second volume but the second's last,
        // the two volumes' deletion, and the live one's creation.
        for (volume, keep_last) in [(gone, false), (kept, true)] {
            let chain = events(&c, &format!("volume_id={volume}")).await;
            let old = if keep_last { &chain[..chain.len() - 1] } else { &chain[..] };
            for e in old {
                sql(s, &format!("UPDATE attach_events SET at = at - {three_days} WHERE id = $1"), e["id"].as_str().unwrap())
                    .await;
            }
            sql(s, &format!("UPDATE volumes SET deleted_at = deleted_at - {three_days} WHERE id = $1"), volume).await;
        }
        sql(s, &format!("UPDATE volumes SET created_at = created_at - {three_days} WHERE id = $1"), live).await;
        let rows = async |table: &str, column: &str| -> Vec<String> {
            let q = format!("SELECT {column} FROM {table} ORDER BY {column}");
            let found = s.service.store().read(async |tx| tx.query(&q, &[]).await).await.unwrap();
            found.iter().map(|r| r.text(0).unwrap()).collect()
        };
        let mut all = volumes.clone();
        all.sort();
        assert_eq!(rows("volumes", "id").await, all);
        assert!(rows("attach_event_starts", "volume_id").await.is_empty());

        let pruner = berth::serve::housekeeping(s.service.clone(), Some(1));
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), pruner).await;
        let mut left = vec![kept.clone(), recent.clone(), live.clone()];
        left.sort();
        assert_eq!(rows("volumes", "id").await, left, "only the volume deleted three days ago with nothing left is gone");
        assert_eq!(rows("attach_event_starts", "volume_id").await, std::slice::from_ref(kept), "the kept chain starts at its last event");
        assert!(events(&c, &format!("volume_id={gone}")).await.is_empty());
        assert_eq!(events(&c, &format!("volume_id={kept}")).await.len(), 1);
        c.get(&format!("/volumes/{gone}")).await.expect(404);
        c.get(&format!("/volumes/{live}")).await.expect(200);
        let verified = berth::attach::history::verify(s.service.store()).await.unwrap();
        assert_eq!((verified.chains, verified.breaks.len()), (3, 0), "{:?}", verified.breaks);

        // Once the kept volume's last event is old too, its row and where its chain started go.
        for e in events(&c, &format!("volume_id={kept}")).await {
            sql(s, &format!("UPDATE attach_events SET at = at - {three_days} WHERE id = $1"), e["id"].as_str().unwrap())
                .await;
        }
        let retained = berth::attach::history::retain_since(s.service.store(), berth::store::now_micros() - 86_400_000_000)
            .await
            .unwrap();
        assert_eq!((retained.events, retained.volumes), (1, 1), "{retained:?}");
        assert!(rows("attach_event_starts", "volume_id").await.is_empty());
        assert!(!rows("volumes", "id").await.contains(kept));
    }
}

/// `berth history` on the service's SQLite file: `list` prints the events as a table, `verify`
/// passes, then names the edited event and exits 1; an exported segment verifies on its own.
#[tokio::test]
async fn the_history_command_lists_verifies_and_names_what_was_edited() {
    let s = TestServer::start(berth_tests::server::Db::Sqlite).await;
    let c = s.client("p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let (id, _) = attach(&c, &volume, INSTANCE_1, "cli-host").await;
    c.delete(&format!("/attachments/{id}")).await.expect(200);
    let url = s.config.database_url();
    let berth = |args: &[&str]| {
        let out = std::process::Command::new(berth_tests::process::berth_binary())
            .args(["history"])
            .args(args)
            .args(["--database-url", &url])
            .output()
            .expect("run berth history");
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
    };

    let (code, table) = berth(&["list", "--volume", &volume]);
    assert_eq!(code, Some(0), "{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("TIME") && lines.len() == 5, "{table}");
    assert!(
        lines[2].contains("connect") && lines[2].contains("granted") && lines[2].contains("cli-host"),
        "{table}"
    );
    assert!(lines[4].contains("detach") && lines[4].contains("revoked"), "{table}");
    // The API's filters on what a change did: who was given access, and what it left.
    let (code, granted) = berth(&["list", "--volume", &volume, "--access", "granted"]);
    assert_eq!(code, Some(0), "{granted}");
    assert!(granted.lines().count() == 2 && granted.lines().nth(1).unwrap().contains("connect"), "{granted}");
    let (code, detached) = berth(&["list", "--outcome", "detached"]);
    assert_eq!(code, Some(0), "{detached}");
    assert!(
        detached.lines().count() == 2 && detached.lines().nth(1).unwrap().contains("detach"),
        "{detached}"
    );
    // A list cut at its --limit says so, and names the marker the rest follows.
    let page = |extra: &[&str]| {
        let out = std::process::Command::new(berth_tests::process::berth_binary())
            .args(["history", "list", "--limit", "3", "--database-url", &url])
            .args(extra)
            .output()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (first, said) = page(&[]);
    assert_eq!(first.lines().count(), 4, "{first}");
    let marker =
        said.split("--marker ").nth(1).map(str::trim).unwrap_or_else(|| panic!("{said}")).to_string();
    assert!(said.contains("3 events shown, the --limit; more may follow"), "{said}");
    let (rest, said) = page(&["--marker", &marker]);
    assert_eq!(rest.lines().count(), 2, "{rest}");
    assert!(rest.lines().nth(1).unwrap().contains("detach") && said.is_empty(), "{rest}{said}");
    let (code, out) = berth(&["verify"]);
    assert_eq!((code, out.trim()), (Some(0), "verified 4 events in 1 chains: 0 broken"));

    let (code, exported) = berth(&["export"]);
    assert_eq!(code, Some(0));
    let counted = std::process::Command::new(berth_tests::process::berth_binary())
        .args(["history", "export", "--database-url", &url])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&counted.stderr).trim(), "berth: exported 4 events");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), &exported).unwrap();
    let path = file.path().to_str().unwrap().to_string();
    let (code, out) = berth(&["verify", "--file", &path]);
    assert_eq!((code, out.trim()), (Some(0), "verified 4 events in 1 chains"));
    std::fs::write(file.path(), exported.replace("cli-host", "other-host")).unwrap();
    let (code, out) = berth(&["verify", "--file", &path]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("BROKEN") && out.contains("edited"), "{out}");

    let third = events(&c, &format!("volume_id={volume}")).await[2]["id"].as_str().unwrap().to_string();
    sql(&s, "UPDATE attach_events SET user_id = 'someone-else' WHERE id = $1", &third).await;
    let (code, out) = berth(&["verify"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&format!("BROKEN volume {volume}: event {third} (seq 3)")), "{out}");

    // A directory the service never used: refused, and no database is made there (an empty one
    // would have verified, with nothing in it).
    let elsewhere = tempfile::tempdir().unwrap();
    for command in [&["verify"][..], &["list"], &["export"], &["prune", "--before", "2026-01-01"]] {
        let out = std::process::Command::new(berth_tests::process::berth_binary())
            .args(["history"])
            .args(command)
            .args(["--data-dir", elsewhere.path().to_str().unwrap()])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{command:?}: {said}");
        let db = elsewhere.path().join("berth.db");
        assert!(said.contains(&format!("no Berth database at {}", db.display())), "{command:?}: {said}");
        assert!(std::fs::read_dir(elsewhere.path()).unwrap().next().is_none(), "{command:?} made a file");
    }

    // A database whose schema is not this build's is read by the berth that serves it: never
    // migrated by a tool (which would leave an older service refusing every change).
    let migrations = async || {
        s.service
            .store()
            .read(async |tx| tx.query("SELECT version FROM _sqlx_migrations ORDER BY version", &[]).await)
            .await
            .unwrap()
            .iter()
            .map(|r| r.int(0).unwrap())
            .collect::<Vec<i64>>()
    };
    let known = berth::store::schema_known();
    let store = s.service.store();
    store
        .write(async |tx| {
            tx.execute("DELETE FROM _sqlx_migrations WHERE version = $1", &params![known]).await
        })
        .await
        .unwrap();
    let before = migrations().await;
    let out = std::process::Command::new(berth_tests::process::berth_binary())
        .args(["history", "verify", "--database-url", &url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains(&format!("is at migration {}, older than this build of berth (at {known})", known - 1)),
        "{said}"
    );
    assert_eq!(migrations().await, before, "a tool migrated the database");
    let newer = known + 1;
    store
        .write(async |tx| {
            tx.execute(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
                 VALUES ($1, 'a newer berth', TRUE, '', 0)",
                &params![newer],
            )
            .await
        })
        .await
        .unwrap();
    let (code, out) = berth(&["list"]);
    assert_eq!(code, Some(1), "{out}");
    let out = std::process::Command::new(berth_tests::process::berth_binary())
        .args(["history", "list", "--database-url", &url])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("is at migration {newer}, newer than")));
}

/// `[history] keep_days`: the pruner deletes events older than that, and each volume's chain
/// still verifies from its first event left.
#[tokio::test]
async fn events_older_than_keep_days_are_pruned_and_the_rest_still_verifies() {
    let s = TestServer::start(berth_tests::server::Db::Sqlite).await;
    let c = s.client("p1").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let (id, _) = attach(&c, &volume, INSTANCE_1, "old-host").await;
    c.delete(&format!("/attachments/{id}")).await.expect(200);
    let chain = events(&c, &format!("volume_id={volume}")).await;
    assert_eq!(chain.len(), 4);
    // The first two events happened three days ago.
    for e in &chain[..2] {
        sql(&s, "UPDATE attach_events SET at = at - 259200000000 WHERE id = $1", e["id"].as_str().unwrap())
            .await;
    }
    let pruner = berth::serve::housekeeping(s.service.clone(), Some(1));
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), pruner).await;
    let left = events(&c, &format!("volume_id={volume}")).await;
    assert_eq!(left.iter().map(|e| e["seq"].as_i64().unwrap()).collect::<Vec<_>>(), [3, 4]);
    let verified = berth::attach::history::verify(s.service.store()).await.unwrap();
    assert_eq!((verified.events, verified.breaks.len()), (2, 0), "{:?}", verified.breaks);
}

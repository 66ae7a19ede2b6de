//! Volume quotas (`os-quota-sets`, `os-quota-class-sets`): what an admin sets is enforced on
//! every change that adds to a project's volumes (create, extend, retype, transfer accepted),
//! with Cinder's 413 `overLimit`, and never passed, however many requests race for the last
//! place, on one node or several.

use berth_tests::both_databases;
use berth_tests::server::{Client, Db, TestServer, fake_config};
use serde_json::{Value, json};
use tokio::task::JoinSet;

/// The refusal of a change past a quota: 413 `overLimit`, `Retry-After: 0` (Cinder's
/// `QuotaError`), and its message.
async fn over_quota(r: berth_tests::server::Resp) -> String {
    assert_eq!(r.header("retry-after"), Some("0"), "{:?}", r.body);
    r.fault(413, "overLimit")
}

async fn count(c: &Client) -> usize {
    c.get("/volumes").await.expect(200).body["volumes"].as_array().unwrap().len()
}

async fn size(c: &Client, volume: &str) -> Value {
    c.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"]["size"].clone()
}

/// `n` creates of one GiB at once, half through `a`, half through `b`: their statuses.
async fn racing_creates(a: &Client, b: &Client, n: usize) -> Vec<u16> {
    let mut set = JoinSet::new();
    for i in 0..n {
        let c = if i % 2 == 0 { a.clone() } else { b.clone() };
        set.spawn(async move { c.post("/volumes", json!({"volume": {"size": 1}})).await.status });
    }
    set.join_all().await
}

both_databases! {
    /// An admin's quotas on a project refuse the create, the extend, the retype and the accepted
    /// transfer that would pass them, with Cinder's messages, and change nothing; what a delete
    /// frees can be used again; other projects are not limited; a limit below what the project
    /// uses is refused, and an update is all or nothing.
    async fn a_projects_quotas_refuse_each_change_that_would_pass_them(s) {
        let admin = s.client("p1");
        let member = admin.with_roles("member");
        let quotas = json!({"quota_set": {"tenant_id": "p1", "volumes": 2, "gigabytes": "10", "per_volume_gigabytes": 6}});
        let message = member.put("/os-quota-sets/p1", quotas.clone()).await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume_extension:quotas:update to be performed.");
        let r = admin.put("/os-quota-sets/p1", quotas).await.expect(200);
        let set = &r.body["quota_set"];
        assert_eq!((&set["volumes"], &set["gigabytes"], &set["per_volume_gigabytes"], &set["volumes_multiattach"]),
                   (&json!(2), &json!(10), &json!(6), &json!(-1)));

        // The number of volumes.
        let a = member.create_volume(json!({"size": 4})).await;
        let b = member.create_volume(json!({"size": 4})).await;
        let message = over_quota(member.post("/volumes", json!({"volume": {"size": 1}})).await).await;
        assert_eq!(message, "Maximum number of volumes allowed (2) exceeded for quota 'volumes'.");
        assert_eq!(count(&member).await, 2, "nothing was made");
        member.delete(&format!("/volumes/{b}")).await.expect(202);

        // The size of one volume, then the gigabytes.
        let message = over_quota(member.post("/volumes", json!({"volume": {"size": 7}})).await).await;
        assert_eq!(message, "Requested volume size 7G is larger than maximum allowed limit 6G.");
        let c = member.create_volume(json!({"size": 6})).await;
        let extend = json!({"os-extend": {"new_size": 5}});
        let message = over_quota(member.post(&format!("/volumes/{a}/action"), extend).await).await;
        assert_eq!(message, "Requested volume or snapshot exceeds allowed gigabytes quota. Requested 1G, quota is \
                             10G and 10G has been consumed.");
        assert_eq!((size(&member, &a).await, member.volume_status(&a).await), (json!(4), "available".to_string()));
        let limits = member.get("/limits").await.expect(200).body["limits"]["absolute"].clone();
        assert_eq!((&limits["maxTotalVolumes"], &limits["maxTotalVolumeGigabytes"], &limits["totalGigabytesUsed"]),
                   (&json!(2), &json!(10), &json!(10)));
        let usage = member.get("/os-quota-sets/p1?usage=true").await.expect(200).body;
        assert_eq!(usage["quota_set"]["gigabytes"], json!({"limit": 10, "in_use": 10, "reserved": 0}));
        assert_eq!(usage["quota_set"]["volumes___DEFAULT__"], json!({"limit": -1, "in_use": 2, "reserved": 0}));

        // Another project is not limited by p1's quotas.
        s.client("p2").create_volume(json!({"size": 50})).await;

        // A limit below what is used is refused, and the whole update with it.
        let lower = json!({"quota_set": {"per_volume_gigabytes": 1, "volumes": 1}});
        let message = admin.put("/os-quota-sets/p1", lower).await.fault(400, "badRequest");
        assert_eq!(message, "Invalid input received: Quota volumes limit must be equal or greater than existing \
                             resources. Current usage is 2 and the requested limit is 1.");
        assert_eq!(admin.get("/os-quota-sets/p1").await.expect(200).body["quota_set"]["per_volume_gigabytes"], 6);

        // A type's quota: a create of that type and a retype to it.
        let by_type = json!({"quota_set": {"volumes": -1, "gigabytes": -1, "volumes_multiattach": 0}});
        admin.put("/os-quota-sets/p1", by_type).await.expect(200);
        let message = over_quota(member.post("/volumes", json!({"volume": {"size": 1, "volume_type": "multiattach"}})).await).await;
        assert_eq!(message, "Maximum number of volumes allowed (0) exceeded for quota 'volumes_multiattach'.");
        let retype = json!({"os-retype": {"new_type": "multiattach"}});
        let message = over_quota(member.post(&format!("/volumes/{c}/action"), retype.clone()).await).await;
        assert_eq!(message, "Maximum number of volumes allowed (0) exceeded for quota 'volumes_multiattach'.");
        let shown = member.get(&format!("/volumes/{c}")).await.expect(200).body;
        assert_eq!(shown["volume"]["volume_type"], "__DEFAULT__", "the retype changed nothing");
        admin.put("/os-quota-sets/p1", json!({"quota_set": {"volumes_multiattach": 1, "gigabytes": 10}})).await.expect(200);
        member.post(&format!("/volumes/{c}/action"), retype).await.expect(202);

        // A transfer accepted counts against the project that takes the volume.
        let theirs = s.client("p2").with_roles("member");
        let offered = theirs.create_volume(json!({"size": 1})).await;
        let r = theirs.post("/os-volume-transfer", json!({"transfer": {"volume_id": offered}})).await.expect(202);
        let (id, key) = (r.body["transfer"]["id"].as_str().unwrap(), r.body["transfer"]["auth_key"].as_str().unwrap());
        let accept = json!({"accept": {"auth_key": key}});
        let message = over_quota(member.post(&format!("/os-volume-transfer/{id}/accept"), accept.clone()).await).await;
        assert_eq!(message, "Requested volume or snapshot exceeds allowed gigabytes quota. Requested 1G, quota is \
                             10G and 10G has been consumed.");
        assert_eq!(theirs.volume_status(&offered).await, "awaiting-transfer", "still offered, still theirs");
        admin.delete("/os-quota-sets/p1").await.expect(200);
        member.post(&format!("/os-volume-transfer/{id}/accept"), accept).await.expect(202);
        assert_eq!(count(&member).await, 3);

        // Bad quota sets change nothing.
        for bad in [json!({"volumes": -2}), json!({"volumes": "many"}), json!({"floppies": 1}), json!({"snapshots": 5}),
                    json!({"gigabytes": 2147483648u64}), json!({"volumes_gold": 1})] {
            let message = admin.put("/os-quota-sets/p1", json!({"quota_set": bad})).await.fault(400, "badRequest");
            assert!(!message.is_empty(), "{bad}");
        }
        admin.put("/os-quota-sets/p1", json!({"quota_set": {"snapshots": 0, "backups": "0"}})).await.expect(200);
        assert_eq!(admin.get("/os-quota-sets/p1").await.expect(200).body["quota_set"]["volumes"], -1);
    }

    /// The default quota class's quotas are every project's that has none of its own; a
    /// project's own are over them; other classes are not used, and cannot be set.
    async fn the_default_class_limits_every_project_without_its_own(s) {
        let admin = s.client("p1");
        let class = json!({"quota_class_set": {"volumes": 1, "gigabytes": 20}});
        admin.with_roles("member").put("/os-quota-class-sets/default", class.clone()).await.fault(403, "forbidden");
        let r = admin.put("/os-quota-class-sets/default", class).await.expect(200);
        assert_eq!((&r.body["quota_class_set"]["volumes"], &r.body["quota_class_set"]["gigabytes_multiattach"]), (&json!(1), &json!(-1)));
        let message = admin.put("/os-quota-class-sets/gold", json!({"quota_class_set": {"volumes": 3}})).await.fault(400, "badRequest");
        assert!(message.contains("Quota class gold is not used by Berth"), "{message}");
        assert_eq!(admin.get("/os-quota-class-sets/gold").await.expect(200).body["quota_class_set"]["volumes"], 1);

        let p3 = s.client("p3").with_roles("member");
        assert_eq!(p3.get("/os-quota-sets/p3/defaults").await.expect(200).body["quota_set"]["volumes"], 1);
        p3.create_volume(json!({"size": 1})).await;
        let message = over_quota(p3.post("/volumes", json!({"volume": {"size": 1}})).await).await;
        assert_eq!(message, "Maximum number of volumes allowed (1) exceeded for quota 'volumes'.");
        admin.put("/os-quota-sets/p3", json!({"quota_set": {"volumes": 3}})).await.expect(200);
        let shown = p3.get("/os-quota-sets/p3").await.expect(200).body["quota_set"].clone();
        assert_eq!((&shown["volumes"], &shown["gigabytes"]), (&json!(3), &json!(20)), "its own over the class's");
        p3.create_volume(json!({"size": 1})).await;
        admin.delete("/os-quota-sets/p3").await.expect(200);
        over_quota(p3.post("/volumes", json!({"volume": {"size": 1}})).await).await;
        admin.put("/os-quota-class-sets/default", json!({"quota_class_set": {"volumes": -1}})).await.expect(200);
        p3.create_volume(json!({"size": 1})).await;
    }

    /// A volume being extended counts at its new size until the extend ends.
    async fn an_extend_in_flight_counts_at_its_new_size(s) {
        let c = s.client("p1");
        c.put("/os-quota-sets/p1", json!({"quota_set": {"gigabytes": 10}})).await.expect(200);
        let slow = c.create_volume(json!({"size": 2, "metadata": {"fake.extend-volume": "delay:2000"}})).await;
        let extending = {
            let (c, slow) = (c.clone(), slow.clone());
            tokio::spawn(async move {
                c.post(&format!("/volumes/{slow}/action"), json!({"os-extend": {"new_size": 8}})).await.status
            })
        };
        while c.volume_status(&slow).await != "extending" {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let message = over_quota(c.post("/volumes", json!({"volume": {"size": 3}})).await).await;
        assert_eq!(message, "Requested volume or snapshot exceeds allowed gigabytes quota. Requested 3G, quota is \
                             10G and 8G has been consumed.");
        let usage = c.get("/os-quota-sets/p1?usage=true").await.expect(200).body;
        assert_eq!(usage["quota_set"]["gigabytes"], json!({"limit": 10, "in_use": 2, "reserved": 6}), "the growth is reserved");
        assert_eq!(c.volume_status(&slow).await, "extending", "refused while the extend was in flight");
        assert_eq!(extending.await.unwrap(), 202);
        assert_eq!(size(&c, &slow).await, 8);

        // An extend the driver fails takes nothing: its volume counts at its old size again.
        c.post(&format!("/volumes/{slow}/metadata"), json!({"metadata": {"fake.extend-volume": "backend:no room"}})).await.expect(200);
        c.post(&format!("/volumes/{slow}/action"), json!({"os-extend": {"new_size": 10}})).await.fault(502, "computeFault");
        let usage = c.get("/os-quota-sets/p1?usage=true").await.expect(200).body;
        assert_eq!(usage["quota_set"]["gigabytes"]["in_use"], 8);
        c.create_volume(json!({"size": 2})).await;
    }

    /// Creates racing for the last places of a quota: exactly as many pass as it allows.
    async fn creates_racing_for_a_quota_never_pass_it(s) {
        let c = s.client("p1");
        c.put("/os-quota-sets/p1", json!({"quota_set": {"volumes": 5}})).await.expect(200);
        let statuses = racing_creates(&c, &c, 24).await;
        assert_eq!(statuses.iter().filter(|&&s| s == 202).count(), 5, "{statuses:?}");
        assert_eq!(statuses.iter().filter(|&&s| s == 413).count(), 19, "{statuses:?}");
        assert_eq!(count(&c).await, 5);
    }
}

/// Two nodes on one PostgreSQL database: creates of one project racing through both never pass
/// its quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_racing_through_two_nodes_never_pass_a_quota() {
    let url = berth_tests::pg::fresh_database().await;
    let one = TestServer::start_on(Db::Postgres, Some(url.clone()), fake_config()).await;
    let two = TestServer::start_on(Db::Postgres, Some(url), fake_config()).await;
    let (a, b) = (one.client("p1"), two.client("p1"));
    a.put("/os-quota-sets/p1", json!({"quota_set": {"volumes": 7}})).await.expect(200);
    assert_eq!(b.get("/os-quota-sets/p1").await.expect(200).body["quota_set"]["volumes"], 7, "one database");
    let statuses = racing_creates(&a, &b, 30).await;
    assert_eq!(statuses.iter().filter(|&&s| s == 202).count(), 7, "{statuses:?}");
    assert_eq!(count(&a).await, 7);
}

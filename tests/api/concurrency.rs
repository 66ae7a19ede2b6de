//! Races: 64 concurrent attaches of one volume. A non-multiattach volume gets exactly one; a
//! multiattach volume gets all of them and ends consistent.

use berth_tests::both_databases;
use berth_tests::server::{Client, connector};
use serde_json::json;
use tokio::task::JoinSet;

const RACERS: usize = 64;
const TRIALS: usize = 10;

async fn race(c: &Client, volume: &str) -> Vec<(u16, serde_json::Value)> {
    let mut set = JoinSet::new();
    for i in 0..RACERS {
        let (c, volume) = (c.clone(), volume.to_string());
        set.spawn(async move {
            let r = c
                .attach(
                    &volume,
                    Some(connector(&format!("iqn.1993-08.org.debian:01:racer{i}"), &format!("h{i}"))),
                )
                .await;
            (r.status, r.body)
        });
    }
    set.join_all().await
}

both_databases! {
    async fn concurrent_attaches_of_a_non_multiattach_volume_give_exactly_one(s) {
        let c = s.client("p1");
        for trial in 0..TRIALS {
            let volume = c.create_volume(json!({"size": 1})).await;
            let results = race(&c, &volume).await;
            let won = results.iter().filter(|(s, _)| *s == 200).count();
            assert_eq!(won, 1, "trial {trial}: {won} attaches won");
            for (status, body) in results.iter().filter(|(s, _)| *s != 200) {
                assert_eq!(*status, 400, "trial {trial}: {body}");
                assert!(body["badRequest"]["message"].as_str().is_some_and(|m| m.starts_with("Invalid volume")), "{body}");
            }
            let live = c.at("3.27").get(&format!("/attachments?volume_id={volume}")).await.expect(200);
            assert_eq!(live.body["attachments"].as_array().unwrap().len(), 1, "trial {trial}");
            assert_eq!(c.volume_status(&volume).await, "attaching");
        }
    }

    async fn concurrent_attaches_of_a_multiattach_volume_all_succeed_and_end_consistent(s) {
        let c = s.client("p1");
        let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
        let results = race(&c, &volume).await;
        assert!(results.iter().all(|(s, _)| *s == 200), "{:?}", results.iter().find(|(s, _)| *s != 200));
        let ids: Vec<String> = results.iter().map(|(_, b)| b["attachment"]["id"].as_str().unwrap().to_string()).collect();
        assert_eq!(c.volume_status(&volume).await, "attaching");

        let mut set = JoinSet::new();
        for id in ids.clone() {
            let c = c.at("3.44");
            set.spawn(async move { c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.status });
        }
        assert!(set.join_all().await.iter().all(|s| *s == 204));
        assert_eq!(c.volume_status(&volume).await, "in-use");
        let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
        assert_eq!(shown.body["volume"]["attachments"].as_array().unwrap().len(), RACERS);

        let mut set = JoinSet::new();
        for id in ids {
            let c = c.at("3.27");
            set.spawn(async move { c.delete(&format!("/attachments/{id}")).await.status });
        }
        assert!(set.join_all().await.iter().all(|s| *s == 200));
        assert_eq!(c.volume_status(&volume).await, "available");
        let live = c.at("3.27").get(&format!("/attachments?volume_id={volume}")).await.expect(200);
        assert_eq!(live.body["attachments"], json!([]));
    }

}

/// A transaction whose caller is dropped at any moment, `BEGIN` included, leaves no connection of
/// the pool inside a transaction (sqlx 0.8 returned a connection whose `BEGIN` was cancelled to the
/// pool in a transaction it did not know about, and the next write on it failed in a read-only
/// transaction: the 500s a forwarded request's liveness check caused on three nodes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_dropped_at_any_moment_leave_the_postgres_pool_clean() {
    let url = berth_tests::pg::fresh_database().await;
    let options = berth::store::StoreOptions { max_connections: 2, ..Default::default() };
    let store = berth::store::Store::open(&url, &options).await.unwrap();
    for i in 0..3000u64 {
        let read = store.read(async |tx| tx.query("SELECT 1", &[]).await.map(drop));
        let _ = tokio::time::timeout(std::time::Duration::from_micros(i % 400), read).await;
        if i % 10 == 0 {
            let wrote = store
                .write(async |tx| tx.execute("UPDATE nodes SET name = name WHERE name = 'nobody'", &[]).await)
                .await;
            assert!(wrote.is_ok(), "after {i} dropped reads, a write failed: {wrote:?}");
        }
    }
}

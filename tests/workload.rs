//! Random workloads against `berth serve` on a real tgtd, checked as histories
//! (`harness/history.rs`): well-behaved clients on SQLite and on PostgreSQL, and clients that
//! give up on their requests at random points of every flow while others work. And the property
//! behind the latter: an operation outlives the request that started it.
//!
//! Short here; `BERTH_WORKLOAD_SECONDS` and `BERTH_WORKLOAD_CLIENTS` make the long mode (see
//! BENCHMARKS.md).

use std::collections::BTreeSet;
use std::time::Duration;

use berth_tests::history::{self, Workload};
use berth_tests::invariants;
use berth_tests::server::connector;
use berth_tests::tgt::Rig;
use reqwest::Method;
use serde_json::json;

fn workload(abandon: f64) -> Workload {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    Workload {
        clients: env("BERTH_WORKLOAD_CLIENTS", 8) as usize,
        duration: Duration::from_secs(env("BERTH_WORKLOAD_SECONDS", 10)),
        volumes: 6,
        multiattach: 2,
        abandon,
    }
}

async fn run(postgres: bool, abandon: f64) {
    let rig = Rig::start_on_db(postgres).await;
    let c = rig.client();
    let w = workload(abandon);
    let volumes = history::pool(&c, &w).await;
    let store = invariants::open(&rig.db_url()).await;
    let outcome = history::run(std::slice::from_ref(&c), &store, &volumes, &w).await;

    // Quiet: every operation ends, and the backend equals the database.
    let world = match invariants::settled(&store, &rig.tgtd, Duration::from_secs(60)).await {
        Ok(world) => world,
        Err((_, wrong)) => panic!("after the workload: {}", wrong.join("\n  ")),
    };
    let live: BTreeSet<String> = world.attachments.iter().map(|a| a.id.clone()).collect();
    let mut anomalies = outcome.anomalies;
    anomalies.extend(history::check_acknowledged(&outcome.calls, &live));

    let calls = outcome.calls.iter().filter(|c| c.op != "idle").count();
    let ok = outcome.calls.iter().filter(|c| c.op != "idle" && c.ok()).count();
    let unanswered = outcome.calls.iter().filter(|c| c.status.is_none()).count();
    eprintln!(
        "workload ({}, abandon {abandon}): {calls} calls, {ok} acknowledged, {unanswered} abandoned, {} snapshots, {} anomalies",
        if postgres { "PostgreSQL" } else { "SQLite" },
        outcome.snapshots,
        anomalies.len()
    );
    assert!(anomalies.is_empty(), "{} anomalies:\n  {}", anomalies.len(), anomalies.join("\n  "));
    assert!(ok > calls / 10, "too few calls succeeded to mean anything: {ok} of {calls}");
    assert!(outcome.snapshots > 100, "the monitor read too few snapshots");
    if abandon > 0.0 {
        assert!(unanswered > 0, "no request was abandoned");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_workload_keeps_a_consistent_history_on_sqlite() {
    run(false, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_workload_keeps_a_consistent_history_on_postgresql() {
    run(true, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_give_up_at_random_points_leave_nothing_behind() {
    run(false, 0.35).await;
}

async fn arm_sleep(base: &str, name: &str, millis: u64) {
    let body = json!({"name": name, "nth": 1, "action": "sleep", "millis": millis});
    reqwest::Client::new().post(format!("{base}/_failpoints/arm")).json(&body).send().await.unwrap();
}

/// A client that gives up in the middle of a flow changes nothing about how far it goes: the
/// attach goes on to its connection, the detach to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_outlives_the_request_that_started_it() {
    let rig = Rig::start();
    let c = rig.client();
    let store = invariants::open(&rig.db_url()).await;
    let volume = c.create_volume(json!({"size": 1})).await;
    let alice = "iqn.1993-08.org.debian:01:alice";

    // The attach stalls after its export; the client gives up long before it ends.
    arm_sleep(&c.base, "attach.connect.create-export", 500).await;
    let body = json!({"attachment": {"volume_uuid": volume, "connector": connector(alice, "alice-host")}});
    let gave_up =
        c.try_send(Method::POST, "/attachments", Some(body), Some(Duration::from_millis(100))).await;
    assert!(gave_up.is_err(), "the client was to give up: {gave_up:?}");
    let world = invariants::settled(&store, &rig.tgtd, Duration::from_secs(10)).await.expect("consistent");
    let live: Vec<_> = world.live_of(&volume).collect();
    assert_eq!(live.len(), 1, "the abandoned attach went on: {live:?}");
    assert!(live[0].is_connected() && live[0].status == "attaching", "{:?}", live[0]);
    let target = world.target_of(&volume).expect("its target exists");
    assert_eq!(target.initiators, vec![alice.to_string()], "its initiator has access");

    // The detach stalls after revoking; the client gives up; the attachment goes anyway.
    let id = live[0].id.clone();
    arm_sleep(&c.base, "attach.disconnect.terminate-connection", 500).await;
    let gave_up = c
        .try_send(Method::DELETE, &format!("/attachments/{id}"), None, Some(Duration::from_millis(100)))
        .await;
    assert!(gave_up.is_err(), "the client was to give up: {gave_up:?}");
    let world = invariants::settled(&store, &rig.tgtd, Duration::from_secs(10)).await.expect("consistent");
    assert!(world.live_of(&volume).next().is_none(), "the abandoned detach went on");
    assert!(world.target_of(&volume).is_none(), "its export is gone");
    assert_eq!(c.volume_status(&volume).await, "available");
}

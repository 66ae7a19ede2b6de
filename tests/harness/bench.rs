//! The attach cycle the benchmarks measure, and the closed-loop clients that run it.

use std::time::{Duration, Instant};

use berth::domain::history::{Access, NewEvent};
use serde_json::json;

use crate::server::{Client, connector};

/// The measured time of one run: `BERTH_BENCH_SECONDS`, default 5.
pub fn seconds() -> Duration {
    Duration::from_secs(std::env::var("BERTH_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5))
}

/// One full attach cycle: create an attachment with a connector, complete it, delete it.
pub async fn attach_cycle(c: &Client, volume: &str, initiator: &str) {
    let r = c.attach(volume, Some(connector(initiator, "bench-host"))).await.expect(200);
    let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
    c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
    c.delete(&format!("/attachments/{id}")).await.expect(200);
}

/// A client with its own connection, volume and initiator.
pub struct Worker {
    client: Client,
    volume: String,
    initiator: String,
}

/// `clients` workers on `base`'s endpoint, each warmed up with one cycle.
pub async fn workers(base: &Client, clients: usize) -> Vec<Worker> {
    workers_on(std::slice::from_ref(base), clients, json!({"size": 1})).await
}

/// `clients` workers spread over `endpoints` (the nodes of one service), each on a volume made
/// with `volume` (a create request's body) through its own endpoint, warmed up with one cycle.
pub async fn workers_on(endpoints: &[Client], clients: usize, volume: serde_json::Value) -> Vec<Worker> {
    let mut workers = Vec::new();
    for i in 0..clients {
        let client = endpoints[i % endpoints.len()].fresh_connection();
        let volume = client.create_volume(volume.clone()).await;
        let initiator = format!("iqn.1993-08.org.debian:01:bench{i}");
        attach_cycle(&client, &volume, &initiator).await;
        workers.push(Worker { client, volume, initiator });
    }
    workers
}

/// Workers from clients, volumes and initiators made by the caller, each warmed up with one cycle.
pub async fn workers_from(made: Vec<(Client, String, String)>) -> Vec<Worker> {
    let mut workers = Vec::new();
    for (client, volume, initiator) in made {
        attach_cycle(&client, &volume, &initiator).await;
        workers.push(Worker { client, volume, initiator });
    }
    workers
}

/// Every worker cycles, each as soon as its last cycle ended, for `seconds()`. Returns the
/// latency of every cycle and the wall time of the run.
pub async fn closed_loop(workers: Vec<Worker>) -> (Vec<Duration>, Duration) {
    let deadline = Instant::now() + seconds();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in workers {
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                attach_cycle(&w.client, &w.volume, &w.initiator).await;
                latencies.push(t.elapsed());
            }
            latencies
        });
    }
    let latencies = tasks.join_all().await.into_iter().flatten().collect();
    (latencies, started.elapsed())
}

/// The `k`th event of `volume`'s history in the history benchmarks, at `at`: a cycle's reserve,
/// connect, complete and detach in turn, on one of three hosts, with every field filled.
pub fn bench_event(volume: &str, at: i64, k: usize) -> NewEvent {
    let host = format!("host-{}", k % 3);
    NewEvent {
        volume_id: volume.to_string(),
        at,
        event: ["reserve", "connect", "complete", "detach"][k % 4].to_string(),
        access: [Access::None, Access::Granted, Access::None, Access::Revoked][k % 4],
        outcome: "attached".into(),
        project_id: "bench".into(),
        attachment_id: Some(uuid::Uuid::new_v4().to_string()),
        instance_uuid: None,
        initiator: Some(format!("iqn.1993-08.org.debian:01:{host}")),
        host: Some(host),
        user_id: "bench".into(),
        caller_project_id: "bench".into(),
        roles: vec!["member".into()],
        service_token: true,
        request_id: Some(format!("req-{}", uuid::Uuid::new_v4())),
        global_request_id: None,
        node: "bench".into(),
        driver_digest: Some("0".repeat(64)),
    }
}

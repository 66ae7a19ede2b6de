//! A driver upgraded while 16 clients cycle attachments on a real tgtd (`berth serve`, release,
//! tgt-iscsi as released for contract 0.2.0, upgraded to this build's and rolled back): failed
//! requests, and the cycle's p99 before the upgrade, while the upgrade call runs (its
//! inspection and conformance suite share the machine), in the second around the switch itself,
//! and after it.
//!
//! Run: `cargo bench -p berth-tests --bench upgrade` (BERTH_BENCH_SECONDS sets each phase,
//! default 5; BERTH_BENCH_CLIENTS the clients, default 16). Figures go to BENCHMARKS.md.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use berth_tests::bench::seconds;
use berth_tests::drivers::component;
use berth_tests::server::{Client, connector};
use berth_tests::stats::{Summary, human};
use berth_tests::tgt::Rig;
use serde_json::json;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

/// One cycle: when it started and ended, and whether every call of it succeeded.
type Cycle = (Instant, Instant, bool);

async fn cycle(c: &Client, volume: &str, initiator: &str) -> bool {
    let r = c.attach(volume, Some(connector(initiator, "bench-host"))).await;
    if r.status != 200 {
        eprintln!("create: {} {}", r.status, r.body);
        return false;
    }
    let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
    let done = c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await;
    let gone = c.delete(&format!("/attachments/{id}")).await;
    if done.status != 204 || gone.status != 200 {
        eprintln!("complete {} / delete {}: {}", done.status, gone.status, gone.body);
        return false;
    }
    true
}

/// The p99 of the cycles that overlap `[from, to]`, and how many there were.
fn p99_within(cycles: &[Cycle], from: Instant, to: Instant) -> (Duration, usize) {
    let mut latencies: Vec<Duration> =
        cycles.iter().filter(|(s, e, _)| *e >= from && *s <= to).map(|(s, e, _)| *e - *s).collect();
    let n = latencies.len();
    if n == 0 {
        return (Duration::ZERO, 0);
    }
    (Summary::of(&mut latencies).p99, n)
}

async fn run() {
    let released =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../drivers/fixtures/binary/tgt-iscsi-0.2.0.wasm");
    let rig = Rig::start_with(&format!(
        "[[backends]]\nname = \"tgt\"\nwasm = \"{}\"\ngrants = [\"iscsi-target\", \"backing-store\"]\n\
         [[volume_types]]\nname = \"__DEFAULT__\"\nbackend = \"tgt\"\n[upgrades]\nwatch_seconds = 0\n",
        released.display()
    ));
    let c = rig.client();
    let clients: usize = std::env::var("BERTH_BENCH_CLIENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(16);
    let phase = seconds();
    println!(
        "berth driver upgrade benchmark: {clients} clients cycling attachments on tgt-iscsi (real tgtd), \
         upgraded from the 0.2.0 release to this build's, then rolled back; {} s per phase",
        phase.as_secs()
    );
    let mut workers = Vec::new();
    for i in 0..clients {
        let client = c.fresh_connection();
        let volume = client.create_volume(json!({"size": 1})).await;
        workers.push((client, volume, format!("iqn.1993-08.org.debian:01:bench{i}")));
    }
    let stop = Instant::now() + phase * 4 + Duration::from_secs(60);
    let stopping = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for (client, volume, initiator) in workers {
        let stopping = stopping.clone();
        tasks.spawn(async move {
            let mut cycles: Vec<Cycle> = Vec::new();
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < stop {
                let started = Instant::now();
                let ok = cycle(&client, &volume, &initiator).await;
                cycles.push((started, Instant::now(), ok));
            }
            cycles
        });
    }
    // The Unix time of an Instant, to place the switch the service reports.
    let (epoch_instant, epoch_micros) =
        (Instant::now(), SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64);
    let at = |micros: i64| epoch_instant + Duration::from_micros((micros - epoch_micros).max(0) as u64);

    tokio::time::sleep(phase).await;
    let body = json!({"os-upgrade": {"wasm": component("tgt-iscsi").display().to_string()}});
    let upgrade_started = Instant::now();
    let up = c.post("/os-drivers/tgt/action", body).await.expect(200);
    let upgrade_ended = Instant::now();
    let switched = at(up.body["upgrade"]["driver"]["since_us"].as_i64().unwrap());
    tokio::time::sleep(phase).await;
    let rollback_started = Instant::now();
    let back = c.post("/os-drivers/tgt/action", json!({"os-rollback": {}})).await.expect(200);
    let rolled_back = at(back.body["rollback"]["driver"]["since_us"].as_i64().unwrap());
    let rollback_ended = Instant::now();
    tokio::time::sleep(phase).await;
    stopping.store(true, std::sync::atomic::Ordering::Relaxed);
    let cycles: Vec<Cycle> = tasks.join_all().await.into_iter().flatten().collect();

    let failed = cycles.iter().filter(|(_, _, ok)| !ok).count();
    let first = cycles.iter().map(|(s, _, _)| *s).min().unwrap();
    let second = Duration::from_millis(500);
    let (before, n_before) = p99_within(&cycles, first + Duration::from_secs(1), upgrade_started);
    let (during, n_during) = p99_within(&cycles, upgrade_started, upgrade_ended);
    let (around, n_around) = p99_within(&cycles, switched - second, switched + second);
    let (after, n_after) = p99_within(&cycles, upgrade_ended, rollback_started);
    let (around_back, n_back) = p99_within(&cycles, rolled_back - second, rolled_back + second);
    println!("cycles: {} ({failed} failed)", cycles.len());
    println!(
        "upgrade call (inspect, load, conformance suite, switch): {}; rollback call: {}",
        human(upgrade_ended - upgrade_started),
        human(rollback_ended - rollback_started)
    );
    println!("cycle p99 before the upgrade:           {} ({n_before} cycles)", human(before));
    println!(
        "cycle p99 while the upgrade call ran:   {} ({n_during} cycles), {:.2}x before",
        human(during),
        during.as_secs_f64() / before.as_secs_f64()
    );
    println!(
        "cycle p99 within 0.5 s of the switch:   {} ({n_around} cycles), {:.2}x before",
        human(around),
        around.as_secs_f64() / before.as_secs_f64()
    );
    println!("cycle p99 on the new driver:            {} ({n_after} cycles)", human(after));
    println!(
        "cycle p99 within 0.5 s of the rollback: {} ({n_back} cycles), {:.2}x before",
        human(around_back),
        around_back.as_secs_f64() / before.as_secs_f64()
    );
}

//! The full attach cycle through HTTP with the fake driver: create an attachment with a
//! connector, complete it, delete it. Cycles per second and latency at 1 and 16 concurrent
//! clients, on SQLite (synchronous=FULL, and NORMAL as the measure of Berth's own overhead) and on
//! PostgreSQL (fsync on), with the measured fsync latency and the durable commits per cycle.
//!
//! Then where one client's cycle goes (SQLite synchronous=NORMAL): the same cycle called on the
//! service in-process, its three parts, and an HTTP round trip that does nothing.
//!
//! Run: `cargo bench -p berth-tests --bench api` (BERTH_BENCH_SECONDS sets the measured time per
//! run, default 5; BERTH_BENCH_ONLY=<substring> runs only matching runs, e.g. `NORMAL, 16` or
//! `breakdown`).
//! Figures go to BENCHMARKS.md.

use std::io::Write;
use std::time::{Duration, Instant};

use berth::attach::Caller;
use berth::attach::attachments::NewAttachment;
use berth::store::Synchronous;
use berth_tests::bench::{closed_loop, seconds, workers};
use berth_tests::server::{Db, TestServer, connector, fake_config};
use berth_tests::stats::{Summary, human};

/// The same allocator as the `berth` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
    berth_tests::pg::stop_private_clusters();
}

/// The latency of one durable 4 KiB write (write + fdatasync) on the data directory's filesystem.
fn fsync_latency() -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let mut file = std::fs::File::create(dir.path().join("probe")).unwrap();
    let block = [7u8; 4096];
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        file.write_all(&block).unwrap();
        file.sync_data().unwrap();
        samples.push(t.elapsed());
    }
    Summary::of(&mut samples).p50
}

async fn run() {
    let fsync = fsync_latency();
    println!(
        "berth API benchmark: full attach cycle (create with connector, complete, delete) over HTTP, fake driver"
    );
    println!("fsync latency (4 KiB write + fdatasync, p50): {}", human(fsync));
    let runs: [(&str, Db, Synchronous); 3] = [
        ("SQLite synchronous=FULL", Db::Sqlite, Synchronous::Full),
        ("SQLite synchronous=NORMAL", Db::Sqlite, Synchronous::Normal),
        ("PostgreSQL (fsync on)", Db::Postgres, Synchronous::Full),
    ];
    for (label, db, synchronous) in runs {
        for clients in [1usize, 16] {
            let name = format!("{label}, {clients:>2} client(s)");
            if std::env::var("BERTH_BENCH_ONLY").is_ok_and(|only| !name.contains(&only)) {
                continue;
            }
            let mut config = fake_config();
            config.sqlite_synchronous = synchronous;
            let url = match db {
                Db::Sqlite => None,
                Db::Postgres => {
                    Some(berth_tests::pg::fresh_database_on(berth_tests::pg::durable_server()).await)
                }
            };
            let server = TestServer::start_on(db, url, config).await;
            let base = server.client("bench").at("3.54");
            let workers = workers(&base, clients).await;
            let store = server.service.store().clone();
            let commits_before = store.commits();
            let transactions_before = store.transactions();
            let syncs_before = store.syncs();
            let (mut latencies, elapsed) = closed_loop(workers).await;
            let cycles = latencies.len();
            let commits = (store.commits() - commits_before) as f64 / cycles as f64;
            let transactions = (store.transactions() - transactions_before) as f64 / cycles as f64;
            let syncs = store.syncs();
            let (syncs, on_the_spot) = (syncs.0 - syncs_before.0, syncs.1 - syncs_before.1);
            let summary = Summary::of(&mut latencies);
            let rate = cycles as f64 / elapsed.as_secs_f64();
            print!(
                "{name}: {rate:>7.1} cycles/s, cycle p50 {} p99 {}, {commits:.2} durable commits per cycle",
                human(summary.p50),
                human(summary.p99)
            );
            if db == Db::Sqlite {
                print!(" ({transactions:.2} commits of the database)");
            }
            if synchronous == Synchronous::Full {
                print!(
                    ", {:.2} syncs per cycle ({:.0} % on the spot)",
                    syncs as f64 / cycles as f64,
                    100.0 * on_the_spot as f64 / syncs.max(1) as f64
                );
            }
            if clients == 1 && synchronous == Synchronous::Full {
                let floor = fsync.mul_f64(commits);
                print!(
                    "; floor (commits x fsync) {}, cycle / floor = {:.2}",
                    human(floor),
                    summary.p50.as_secs_f64() / floor.as_secs_f64()
                );
            }
            println!();
        }
    }
    if std::env::var("BERTH_BENCH_ONLY").is_ok_and(|only| !"breakdown".contains(&only)) {
        return;
    }
    breakdown().await;
}

/// One client's cycle taken apart: the service without HTTP, and HTTP without the service.
async fn breakdown() {
    let mut config = fake_config();
    config.sqlite_synchronous = Synchronous::Normal;
    let server = TestServer::start_on(Db::Sqlite, None, config).await;
    let volume = server.client("bench").at("3.54").create_volume(serde_json::json!({"size": 1})).await;
    let caller = Caller {
        user_id: "bench".into(),
        project_id: "bench".into(),
        roles: vec![],
        is_service: false,
        request: Default::default(),
    };
    let connector = connector("iqn.1993-08.org.debian:01:bench", "bench-host")
        .as_object()
        .cloned()
        .map(|c| berth::domain::model::Connector::parse(c).unwrap());
    let service = &server.service;
    let (mut cycles, mut parts) = (Vec::new(), [Vec::new(), Vec::new(), Vec::new()]);
    let deadline = Instant::now() + seconds();
    while Instant::now() < deadline {
        let started = Instant::now();
        let request = NewAttachment {
            volume_id: volume.clone(),
            connector: connector.clone(),
            mode: Some(berth::runtime::contract::AccessMode::Rw),
            ..Default::default()
        };
        let row = service.commands().create_attachment(caller.clone(), request).await.unwrap();
        let created = Instant::now();
        service.commands().complete_attachment(caller.clone(), row.id.clone()).await.unwrap();
        let completed = Instant::now();
        service.commands().delete_attachment(caller.clone(), row.id.clone()).await.unwrap();
        let deleted = Instant::now();
        parts[0].push(created - started);
        parts[1].push(completed - created);
        parts[2].push(deleted - completed);
        cycles.push(deleted - started);
    }
    let [create, complete, delete] = parts.map(|mut p| Summary::of(&mut p).p50);
    println!(
        "breakdown, the cycle on the service without HTTP, SQLite synchronous=NORMAL: cycle p50 {} \
         (create {}, complete {}, delete {})",
        human(Summary::of(&mut cycles).p50),
        human(create),
        human(complete),
        human(delete)
    );

    let http = reqwest::Client::new();
    let url = format!("{}/healthcheck", server.base);
    let mut trips = Vec::new();
    let deadline = Instant::now() + seconds();
    while Instant::now() < deadline {
        let t = Instant::now();
        let response = http.get(&url).send().await.unwrap();
        assert!(response.status().is_success());
        response.bytes().await.unwrap();
        trips.push(t.elapsed());
    }
    println!(
        "breakdown, an HTTP round trip that does nothing (GET /healthcheck): p50 {}",
        human(Summary::of(&mut trips).p50)
    );
}

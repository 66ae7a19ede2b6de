//! Attach cycles per second with 1, 2 and 3 Berth nodes on one PostgreSQL database (`fsync=on`),
//! on a shared backend (the fake driver, which any node may run), as real `berth serve`
//! processes: the same clients spread over the nodes, each cycling on its own volume through its
//! node (create with connector, complete, delete).
//!
//! With each run, the CPU time each part used per cycle (the nodes, PostgreSQL, this process's
//! clients), from `/proc`: on one machine every part shares its cores, which is what limits it.
//!
//! Run: `cargo bench -p berth-tests --bench nodes` (`BERTH_BENCH_SECONDS` per run, default 5;
//! `BERTH_BENCH_CLIENTS`, default 16). Figures go to BENCHMARKS.md.

use berth_tests::bench::{closed_loop, workers_on};
use berth_tests::cluster::Cluster;
use berth_tests::stats::{Summary, human};
use serde_json::json;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
    berth_tests::pg::stop_private_clusters();
}

async fn run() {
    let clients: usize = std::env::var("BERTH_BENCH_CLIENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    println!(
        "berth nodes benchmark: full attach cycle over HTTP on a shared backend (fake driver), PostgreSQL fsync=on, \
         {clients} clients spread over the nodes ({} build)",
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    for n in 1..=3 {
        let url = berth_tests::pg::fresh_database_on(berth_tests::pg::durable_server()).await;
        let cluster = Cluster::start_on(url, n, 30);
        let endpoints = cluster.clients();
        let workers = workers_on(&endpoints, clients, json!({"size": 1, "volume_type": "shared"})).await;
        let nodes: Vec<u32> = cluster.nodes.iter().filter_map(|n| n.berth.pid()).collect();
        let before = [cpu(&nodes), cpu(&postgres()), cpu(&[std::process::id()])];
        let (mut latencies, wall) = closed_loop(workers).await;
        let after = [cpu(&nodes), cpu(&postgres()), cpu(&[std::process::id()])];
        let cycles = latencies.len();
        let s = Summary::of(&mut latencies);
        let per_cycle = |i: usize| (after[i] - before[i]) * 1000.0 / cycles as f64;
        println!(
            "{n} node(s): {:>7.1} cycles/s, cycle p50 {} p99 {} (n={cycles}); CPU per cycle: nodes {:.2} ms, \
             PostgreSQL {:.2} ms, clients {:.2} ms",
            cycles as f64 / wall.as_secs_f64(),
            human(s.p50),
            human(s.p99),
            per_cycle(0),
            per_cycle(1),
            per_cycle(2),
        );
    }
}

/// CPU seconds (user and system) the processes have used so far.
fn cpu(pids: &[u32]) -> f64 {
    // SAFETY: sysconf(3) reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // Fields after the command name, which ends with the last ')'.
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split(' ').collect();
            Some(fields[11].parse::<f64>().ok()? + fields[12].parse::<f64>().ok()?)
        })
        .sum::<f64>()
        / ticks
}

/// Every PostgreSQL server process on the machine.
fn postgres() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres")
        })
        .collect()
}

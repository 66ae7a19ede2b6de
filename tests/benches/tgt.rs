//! The full attach cycle (create an attachment with a connector, complete it, delete it) with the
//! tgt-iscsi driver on a real tgtd: every cycle exports the volume in tgtd (its kept target taken
//! back with its LUN, the initiator's CHAP account bound, an ACL entry) and removes it again.
//! `berth serve` (release build) runs as its own process, with SQLite `synchronous=FULL`, as a
//! user would run it.
//!
//! Run: `cargo bench -p berth-tests --bench tgt` (BERTH_BENCH_SECONDS sets the measured time per
//! run, default 5; `BERTH_BENCH_CHAP_ACCOUNTS=per-export` runs the driver with an account per
//! export instead of its default per-initiator accounts; `BERTH_BENCH_TGT` adds keys to the
//! `[tgt]` section, such as `thin_provisioning = false`). Figures go to BENCHMARKS.md.

use std::time::{Duration, Instant};

use berth_tests::bench::{attach_cycle, closed_loop, workers};
use berth_tests::process::BerthProcess;
use berth_tests::server::Client;
use berth_tests::stats::{CpuMeter, Summary, human};
use berth_tests::tgt::TgtdProcess;
use serde_json::json;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

/// One `tgtadm --op show --mode sys` round trip: the cost of a process spawn plus a control-socket
/// exchange, the unit most of a cycle is made of.
fn tgtadm_latency(tgtd: &TgtdProcess) -> Summary {
    let mut samples: Vec<Duration> = (0..100)
        .map(|_| {
            let t = Instant::now();
            assert!(tgtd.tgtadm(&["--op", "show", "--mode", "sys"]).status.success());
            t.elapsed()
        })
        .collect();
    Summary::of(&mut samples)
}

async fn run() {
    println!(
        "berth tgt benchmark: full attach cycle (create with connector, complete, delete) over HTTP, \
         tgt-iscsi driver, real tgtd, SQLite synchronous=FULL"
    );
    let tgtd = TgtdProcess::start();
    println!("one tgtadm command (spawn + control socket): {}", tgtadm_latency(&tgtd));
    let accounts = std::env::var("BERTH_BENCH_CHAP_ACCOUNTS").unwrap_or_else(|_| "per-initiator".into());
    println!("CHAP accounts: {accounts}");
    // `BERTH_BENCH_TGT`: more keys of the `[tgt]` section (`thin_provisioning = false`).
    let tgt_keys = std::env::var("BERTH_BENCH_TGT").map(|k| format!("{k}\n")).unwrap_or_default();
    println!("[tgt] keys: {}", tgt_keys.trim());
    let config = format!(
        "{}[[backends]]\nname = \"tgt\"\ndriver = \"tgt-iscsi\"\ngrants = [\"iscsi-target\", \"backing-store\"]\n\n\
         [backends.settings]\nchap_accounts = \"{accounts}\"\n",
        tgtd.config().replacen("start = false\n", &format!("start = false\n{tgt_keys}"), 1)
    );

    // How many changes a cycle sends to tgtd, counted in berth's log in a short pass.
    {
        let berth = BerthProcess::start(&config);
        let c = Client::for_base(&berth.base, "bench").at("3.54");
        let volume = c.create_volume(json!({"size": 1})).await;
        attach_cycle(&c, &volume, "iqn.1993-08.org.debian:01:warmup").await;
        let changes = || berth.log_text().matches("tgtd change").count();
        let before = changes();
        let n = 20;
        for _ in 0..n {
            attach_cycle(&c, &volume, "iqn.1993-08.org.debian:01:count").await;
        }
        println!("changes sent to tgtd per cycle: {:.1}", (changes() - before) as f64 / n as f64);
    }

    // Measured as a user runs it: the default log level.
    // SAFETY: set before any thread that reads the environment is started by this benchmark.
    unsafe { std::env::set_var("BERTH_TEST_SERVER_LOG", "info") };
    // `BERTH_BENCH_SQLITE_SYNCHRONOUS=normal`: commits without fsync, to see what durability costs.
    let top = std::env::var("BERTH_BENCH_SQLITE_SYNCHRONOUS")
        .map(|s| format!("sqlite_synchronous = \"{s}\""))
        .unwrap_or_default();
    let berth = BerthProcess::start_full(&top, &config);
    let counts: Vec<usize> = std::env::var("BERTH_BENCH_CLIENTS")
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|_| vec![1, 4]);
    for clients in counts {
        let base = Client::for_base(&berth.base, "bench").at("3.54");
        let workers = workers(&base, clients).await;
        let cpu = CpuMeter::start(&[
            ("berth", berth.pid().expect("berth serve runs")),
            ("tgtd", tgtd.pid().expect("tgtd runs")),
            ("client", std::process::id()),
        ]);
        let (mut latencies, elapsed) = closed_loop(workers).await;
        let cpu = cpu.per(latencies.len());
        let rate = latencies.len() as f64 / elapsed.as_secs_f64();
        let summary = Summary::of(&mut latencies);
        println!(
            "{clients} client(s), each on its own volume: {rate:>6.1} cycles/s, cycle p50 {} p99 {} (n={}); \
             CPU per cycle: {cpu}",
            human(summary.p50),
            human(summary.p99),
            summary.n
        );
    }
    // A detached volume's target is kept inert for reuse (`[tgt] keep_exports_seconds`): no
    // initiator may be left in any ACL.
    assert!(tgtd.targets().iter().all(|t| t.initiators.is_empty()), "every cycle revoked its access");
}

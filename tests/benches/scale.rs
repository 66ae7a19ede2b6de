//! Attach cost against the number of live attachments, and restarts with many of them, on a real
//! tgtd with `berth serve` (release build, tgt-iscsi, SQLite `synchronous=FULL`, the default
//! reconciler) as a user runs it, measured with `berth bench attach`'s client:
//!
//! 1. the cycle with 1 client on an empty backend;
//! 2. the fill: N live attachments through the API;
//! 3. the cycle with 1 and 4 clients while N attachments are live;
//! 4. a restart of `berth serve`: how soon the API answers, and how long the first reconciliation
//!    takes and what it changes (nothing, for healthy attachments);
//! 5. a restart of tgtd, which loses every target: how long until every export is back.
//!
//! The fill's attachments are spread over `BERTH_SCALE_HOSTS` hosts (default 100; 0: a host of its
//! own for each), each with its own initiator, as a node serves compute hosts. tgtd runs with
//! Berth's default of 2 I/O threads per LUN.
//!
//! Run: `cargo bench -p berth-tests --bench scale` (`BERTH_SCALE_ATTACHMENTS`, default 10000;
//! `BERTH_BENCH_SECONDS` per cycle run, default 5; `BERTH_SCALE_RESTORE_SECONDS`, default
//! 1800, how long to wait for the exports after the tgtd restart). Figures go to BENCHMARKS.md.

use std::time::{Duration, Instant};

use berth::client::api::{Credentials, Endpoint};
use berth::client::bench::{AttachBench, Report, run as bench};
use berth_tests::process::BerthProcess;
use berth_tests::tgt::TgtdProcess;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn args(clients: usize, fill: usize) -> AttachBench {
    AttachBench {
        clients,
        duration: env("BERTH_BENCH_SECONDS", 5) as f64,
        warmup: 1.0,
        legacy: false,
        service_token: false,
        fill,
        fill_clients: 8,
        fill_hosts: env("BERTH_SCALE_HOSTS", 100) as usize,
        volume_type: None,
        keep: fill > 0,
        json: false,
    }
}

fn line(label: &str, r: &Report) {
    println!(
        "{label}: {:.1} cycles/s, cycle p50 {} p99 {}",
        r.rate(),
        berth::client::bench::human(r.cycle.p50),
        berth::client::bench::human(r.cycle.p99)
    );
}

/// The log of `berth serve` from a byte on, read as it grows: only what was added since the last
/// look is read (the log grows to megabytes during a restore, and reading it whole at every look
/// took CPU from the processes measured).
struct LogTail {
    file: std::fs::File,
    pending: Vec<u8>,
}

impl LogTail {
    fn open(berth: &BerthProcess, from: usize) -> LogTail {
        use std::io::{Seek, SeekFrom};
        let mut file = std::fs::File::open(&berth.log).expect("the log exists");
        file.seek(SeekFrom::Start(from as u64)).expect("seek in the log");
        LogTail { file, pending: Vec::new() }
    }

    /// The next line containing `needle`, or `None` at `deadline`.
    fn wait_for(&mut self, needle: &str, deadline: Instant) -> Option<String> {
        use std::io::Read;
        loop {
            // The complete lines read so far, each looked at once; a partial last line waits.
            let mut start = 0;
            let mut found = None;
            while let Some(len) = self.pending[start..].iter().position(|b| *b == b'\n') {
                let line = String::from_utf8_lossy(&self.pending[start..start + len]).into_owned();
                start += len + 1;
                if line.contains(needle) {
                    found = Some(line.trim_end().to_string());
                    break;
                }
            }
            self.pending.drain(..start);
            if found.is_some() {
                return found;
            }
            let mut chunk = Vec::new();
            self.file.read_to_end(&mut chunk).expect("read the log");
            if chunk.is_empty() {
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            self.pending.extend(chunk);
        }
    }
}

async fn run() {
    let n = env("BERTH_SCALE_ATTACHMENTS", 10_000) as usize;
    let hosts = env("BERTH_SCALE_HOSTS", 100);
    println!(
        "berth scale benchmark: tgt-iscsi on a real tgtd (2 I/O threads per LUN), SQLite synchronous=FULL, {n} live attachments over {} hosts",
        if hosts == 0 { n as u64 } else { hosts }
    );
    // SAFETY: set before this benchmark starts any thread that reads the environment.
    unsafe { std::env::set_var("BERTH_TEST_SERVER_LOG", "info") };
    let mut tgtd = TgtdProcess::start_with_threads(2);
    // The default backend, its volumes (empty sparse files) allowed to add up to 1000 times the
    // filesystem's size: 10,000 volumes of a GiB pass the default ratio (20) on small disks.
    let config = format!(
        "[tgt]\nportal = \"127.0.0.1:{}\"\ncontrol_port = {}\nstart = false\n\n[[backends]]\nname = \"tgt\"\n\
         driver = \"tgt-iscsi\"\ngrants = [\"iscsi-target\", \"backing-store\"]\nmax_over_subscription_ratio = 1000.0\n",
        tgtd.portal_port, tgtd.control_port
    );
    let mut berth = BerthProcess::start(&config);
    let credentials = Credentials {
        endpoint: Some(format!("{}/v3", berth.base)),
        project_id: Some("scale".into()),
        user_id: Some("scale".into()),
        auth_type: Some("noauth".into()),
        ..Default::default()
    };
    let api = Endpoint::resolve(&credentials).await.unwrap();

    let empty = bench(&api, &args(1, 0)).await.unwrap();
    line("1 client, no live attachment", &empty);
    let filled = bench(&api, &args(1, n)).await.unwrap();
    let (count, took) = filled.fill.unwrap();
    println!(
        "fill: {count} live attachments through the API in {:.1} s ({:.0} per s)",
        took.as_secs_f64(),
        count as f64 / took.as_secs_f64()
    );
    line(&format!("1 client, {n} live attachments"), &filled);
    println!(
        "cycle p50 with {n} live attachments / empty: {:.2}",
        filled.cycle.p50.as_secs_f64() / empty.cycle.p50.as_secs_f64()
    );
    let four = bench(&api, &args(4, 0)).await.unwrap();
    line(&format!("4 clients, {n} live attachments"), &four);
    println!("4 clients / 1 client throughput: {:.2}", four.rate() / filled.rate());

    // berth restarts: the API answers at once; the first reconciliation changes nothing.
    let from = berth.log_text().len();
    berth.stop();
    let started = Instant::now();
    berth.start_again();
    let listening = started.elapsed();
    api.volume_action("00000000-0000-0000-0000-000000000000", "os-reserve", serde_json::Value::Null)
        .await
        .ok();
    let answered = started.elapsed();
    let pass = LogTail::open(&berth, from)
        .wait_for("reconcile pass finished", Instant::now() + Duration::from_secs(600))
        .expect("a reconcile pass");
    let reconciled = started.elapsed();
    println!(
        "berth restart with {n} live attachments: listening after {:.0} ms, the API answered after {:.0} ms, first reconciliation done after {:.1} s: {}",
        listening.as_secs_f64() * 1000.0,
        answered.as_secs_f64() * 1000.0,
        reconciled.as_secs_f64(),
        pass.split("reconcile pass finished").nth(1).unwrap_or("").trim()
    );

    // tgtd restarts and loses everything: the reconciler puts every export back. Each reconcile
    // pass says when it is done; after a pass, one listing of tgtd checks that every export is
    // back (a listing of 10,000 targets takes tgtd seconds, during which it restores nothing: it
    // is not repeated while the reconciler works).
    let from = berth.log_text().len();
    tgtd.restart();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(env("BERTH_SCALE_RESTORE_SECONDS", 1800));
    let mut log = LogTail::open(&berth, from);
    let (restored, pass) = loop {
        let Some(pass) = log.wait_for("reconcile pass finished", deadline) else {
            let targets = tgtd.targets();
            let back = targets.iter().filter(|t| !t.initiators.is_empty() && !t.luns.is_empty()).count();
            println!(
                "tgtd restart (every target lost): only {back} of {n} exports back after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            return;
        };
        let at = started.elapsed();
        let targets = tgtd.targets();
        let back = targets.iter().filter(|t| !t.initiators.is_empty() && !t.luns.is_empty()).count();
        if back >= n {
            break (at, pass);
        }
    };
    println!(
        "tgtd restart (every target lost): all {n} exports back after {:.1} s, when the reconcile pass that restored them ended ({})",
        restored.as_secs_f64(),
        pass.split("reconcile pass finished").nth(1).unwrap_or("").trim()
    );
}

//! What each step of an export costs on a real tgtd as its number of targets grows: the evidence
//! behind kept exports (`[tgt] keep_exports_seconds`) and behind the limits in BENCHMARKS.md.
//!
//! tgtd finds a target by name, an account by name and a free account id by walking lists, so
//! creating a target or an account, and deleting either, costs time linear in what it holds (and
//! filling it quadratic). A kept export (stripped of LUN, ACL and account binding, then taken
//! back) avoids the creations and deletions; the first table below is what `berth` does, the
//! second what it would do if it destroyed each export (`keep_exports_seconds = 0`).
//!
//! Run: `cargo bench -p berth-tests --bench tgtd_costs` (`BERTH_TGTD_COUNTS`, default
//! `0,1000,3000`; each count is filled with exports like Berth's: a target, a LUN, a CHAP account
//! bound to it, an initiator allowed). Figures go to BENCHMARKS.md.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use berth::capabilities::iscsi::{ChapPolicy, Iqn, Lun, TargetService};
use berth_tests::tgt::TgtdProcess;

const ALICE: &str = "iqn.1993-08.org.debian:01:alice";
const BOB: &str = "iqn.1993-08.org.debian:01:bob";
const ROUNDS: u32 = 20;

fn iqn(s: &str) -> Iqn {
    Iqn::parse(s).unwrap()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

async fn run() {
    let counts: Vec<usize> = std::env::var("BERTH_TGTD_COUNTS")
        .unwrap_or_else(|_| "0,1000,3000".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let mut tgtd = TgtdProcess::start_with_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let kept = Tgtd::new(TgtdConfig::new(tgtd.control_port, dir.path()));
    let destroyed = Tgtd::new(TgtdConfig {
        keep_exports: Duration::ZERO,
        ..TgtdConfig::new(tgtd.control_port, dir.path())
    });
    let image = |name: &str| {
        let p = dir.path().join(name);
        std::fs::File::create(&p).unwrap().set_len(1 << 20).unwrap();
        p.to_str().unwrap().to_string()
    };
    println!("tgtd costs per step (mean of {ROUNDS} rounds, microseconds), by number of exports held");
    let mut made = 0;
    for goal in counts {
        let fill = Instant::now();
        while made < goal {
            let q = iqn(&format!("iqn.2010-10.org.openstack:volume-fill{made}"));
            destroyed.create_target(&q).await.unwrap();
            destroyed.add_lun(&q, Lun::new(1).unwrap(), &image(&format!("f{made}.img"))).await.unwrap();
            destroyed.set_chap(&q, &ChapPolicy::default().generate()).await.unwrap();
            destroyed.allow_initiator(&q, &iqn(ALICE)).await.unwrap();
            made += 1;
        }
        if goal > 0 {
            println!("{goal} exports: filled in {:.1} s", fill.elapsed().as_secs_f64());
        }
        for (label, service) in [("kept", &kept), ("destroyed", &destroyed)] {
            let times = cycle(service, &image("probe.img")).await;
            let line: Vec<String> = times.iter().map(|(k, v)| format!("{k} {v:.0}")).collect();
            println!("{goal} exports, {label}: {}", line.join(", "));
        }
    }
    tgtd.kill();
}

/// One export's life, `ROUNDS` times; the mean time of each step. The first deletion keeps the
/// target bare when the service keeps exports; the second, of a bare target, destroys it.
async fn cycle(t: &Tgtd, path: &str) -> BTreeMap<&'static str, f64> {
    let q = iqn("iqn.2010-10.org.openstack:volume-probe");
    let chap = ChapPolicy::default().generate();
    let mut times = BTreeMap::<&str, Duration>::new();
    macro_rules! step {
        ($name:literal, $e:expr) => {{
            let s = Instant::now();
            $e.await.unwrap();
            *times.entry($name).or_default() += s.elapsed();
        }};
    }
    for _ in 0..ROUNDS {
        step!("1 create target", t.create_target(&q));
        step!("2 add lun", t.add_lun(&q, Lun::new(1).unwrap(), path));
        step!("3 set chap", t.set_chap(&q, &chap));
        step!("4 allow", t.allow_initiator(&q, &iqn(BOB)));
        step!("5 deny", t.deny_initiator(&q, &iqn(BOB)));
        step!("6 delete target", t.delete_target(&q));
    }
    // Leave nothing behind for the next count: a kept target is destroyed by a second deletion.
    t.delete_target(&q).await.unwrap();
    times.into_iter().map(|(k, v)| (k, v.as_micros() as f64 / f64::from(ROUNDS))).collect()
}

//! What tgtd's I/O threads per LUN (`[tgt] io_threads`, `tgtd -t`) buy an initiator, and what
//! they cost the machine: the evidence behind the default (each LUN costs tgtd that many threads,
//! and threads are what runs out first on a host with thousands of exports).
//!
//! For each thread count, a real tgtd with one target and one LUN (a 1 GiB sparse file, its first
//! 256 MiB written), and 1 or 4 libiscsi initiators, each with its own session, for a few seconds:
//! random 4 KiB writes each followed by a read of the same block, then sequential 1 MiB writes.
//! Also shown: the threads tgtd runs with that one LUN (from `/proc/<pid>/task`).
//!
//! Run: `cargo bench -p berth-tests --bench tgt_io` (`BERTH_IO_THREADS`, default `1,2,4,16`;
//! `BERTH_IO_SECONDS` per measurement, default 4). Figures go to BENCHMARKS.md.

use std::time::{Duration, Instant};

use berth_tests::iscsi::{BLOCK, Session, Target};
use berth_tests::tgt::TgtdProcess;

const IQN: &str = "iqn.2010-10.org.openstack:io-bench";
const REGION: u64 = 256 << 20;

fn main() {
    let counts: Vec<u32> = std::env::var("BERTH_IO_THREADS")
        .unwrap_or_else(|_| "1,2,4,16".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    let seconds: u64 = std::env::var("BERTH_IO_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let span = Duration::from_secs(seconds);
    println!(
        "tgtd I/O by I/O threads per LUN ({seconds} s per figure; 4 KiB: a write and a read of the same block)"
    );
    println!(
        "{:>10} {:>12} {:>14} {:>14} {:>16} {:>16}",
        "io_threads", "tgtd threads", "4K ops/s, 1", "4K ops/s, 4", "seq MiB/s, 1", "seq MiB/s, 4"
    );
    for threads in counts {
        let tgtd = TgtdProcess::start_with_threads(threads);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("lun.img");
        std::fs::File::create(&file).unwrap().set_len(1 << 30).unwrap();
        let ok = |args: &[&str]| {
            let out = tgtd.tgtadm(args);
            assert!(out.status.success(), "tgtadm {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        ok(&["--op", "new", "--mode", "target", "--tid", "1", "-T", IQN]);
        ok(&[
            "--op",
            "new",
            "--mode",
            "logicalunit",
            "--tid",
            "1",
            "--lun",
            "1",
            "-b",
            file.to_str().unwrap(),
        ]);
        ok(&["--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"]);
        let target = Target {
            portal: format!("127.0.0.1:{}", tgtd.portal_port),
            iqn: IQN.to_string(),
            lun: 1,
            chap: None,
        };
        // Written once, so that reads are of data, not of holes.
        {
            let s = Session::login(&target, "iqn.1993-08.org.debian:01:fill").unwrap();
            let chunk = vec![7u8; 1 << 20];
            for i in 0..(REGION >> 20) {
                s.write(i * ((1 << 20) / BLOCK as u64), &chunk).unwrap();
            }
        }
        let task_count = tgtd_threads(&tgtd);
        let random1 = run(&target, 1, span, random_ops);
        let random4 = run(&target, 4, span, random_ops);
        let seq1 = run(&target, 1, span, sequential_mib);
        let seq4 = run(&target, 4, span, sequential_mib);
        println!(
            "{threads:>10} {:>12} {:>14.0} {:>14.0} {:>16.1} {:>16.1}",
            task_count.map_or("?".to_string(), |n| n.to_string()),
            random1,
            random4,
            seq1,
            seq4
        );
    }
}

/// The threads of the tgtd listening on this control port.
fn tgtd_threads(tgtd: &TgtdProcess) -> Option<usize> {
    let port = format!("-C\0{}\0", tgtd.control_port);
    std::fs::read_dir("/proc").ok()?.filter_map(|e| e.ok()).find_map(|e| {
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let ours = comm.trim() == "tgtd" && String::from_utf8_lossy(&cmdline).contains(&port);
        ours.then(|| std::fs::read_dir(e.path().join("task")).map(|t| t.count()).ok())?
    })
}

/// Runs `work` in `clients` threads, each with its own session, for `span`; returns the sum of
/// their rates.
fn run(target: &Target, clients: usize, span: Duration, work: fn(&Session, Duration, u64) -> f64) -> f64 {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                let target = target.clone();
                scope.spawn(move || {
                    let s = Session::login(&target, &format!("iqn.1993-08.org.debian:01:io{i}")).unwrap();
                    work(&s, span, i as u64)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

/// 4 KiB writes at pseudo-random blocks of the region, each read back: operations per second.
fn random_ops(s: &Session, span: Duration, seed: u64) -> f64 {
    let data = vec![seed as u8; 4096];
    let blocks = REGION / 4096;
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let (start, mut ops) = (Instant::now(), 0u64);
    while start.elapsed() < span {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let lba = (x >> 33) % blocks * (4096 / BLOCK as u64);
        s.write(lba, &data).unwrap();
        assert_eq!(s.read(lba, data.len()).unwrap().len(), data.len());
        ops += 2;
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

/// 1 MiB writes in order through the region (each client from its own offset): MiB per second.
fn sequential_mib(s: &Session, span: Duration, seed: u64) -> f64 {
    let data = vec![seed as u8; 1 << 20];
    let per = (1 << 20) / BLOCK as u64;
    let mibs = REGION >> 20;
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < span {
        s.write(((seed * 64 + n) % mibs) * per, &data).unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

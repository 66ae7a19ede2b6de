//! A guest's result is bounded while it is copied into host memory, not after: a driver returning
//! ten million empty strings (8 bytes each in the guest, a 24-byte `String` each in the host,
//! 240 MB) is refused during the copy at eight times its output limit, so the host pays for its
//! guest memory and little more. Alone in its binary, so that the process's peak memory is this
//! call's.

use berth::runtime::{CallErrorKind, CallOptions, Limits, Request};
use berth_tests::drivers::{load, spec, volume};

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[tokio::test]
async fn ten_million_empty_strings_cost_the_host_a_small_multiple_of_the_memory_limit() {
    let mut s = spec("misbehaving");
    s.limits = Limits { memory_mib: 256, ..Limits::default() };
    let limit = 256u64 << 20;
    let driver = load(s).await.unwrap();
    let before = peak_rss_bytes();
    let v =
        volume("cccccccc-0000-4000-8000-000000000003", &[("behave", "empty-strings"), ("count", "10000000")]);
    let outcome = driver.invoke(&Request::CreateVolume(v), &CallOptions::default()).await;
    let guest = outcome.stats.peak_memory as u64;
    let error = outcome.result.expect_err("ten million entries cannot be a valid result");
    assert!(matches!(error.kind, CallErrorKind::CopyTooLarge { limit } if limit == 8 << 20), "{error}");
    let grew = peak_rss_bytes().saturating_sub(before);
    println!(
        "peak RSS grew by {} MiB: the guest's memory {} MiB (limit {} MiB) and the copy",
        grew >> 20,
        guest >> 20,
        limit >> 20
    );
    // Beyond the guest's own memory, the host paid at most a few times the copy bound (8 MiB);
    // copying the whole list would have cost 240 MB.
    assert!(
        grew <= guest + 32 * (1 << 20),
        "the host paid {} MiB beyond the guest's {} MiB",
        (grew - guest) >> 20,
        guest >> 20
    );
    assert!(grew < 2 * limit);
}

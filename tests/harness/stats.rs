//! Summaries of timing samples for the benchmarks.

use std::fmt;
use std::time::{Duration, Instant};

/// Median, 99th percentile and mean of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
}

impl Summary {
    pub fn of(samples: &mut [Duration]) -> Summary {
        assert!(!samples.is_empty(), "no samples");
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        let total: Duration = samples.iter().sum();
        Summary { n: samples.len(), p50: at(0.50), p99: at(0.99), mean: total / samples.len() as u32 }
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p50 {} p99 {} mean {} (n={})", human(self.p50), human(self.p99), human(self.mean), self.n)
    }
}

/// A duration in the unit that reads best.
pub fn human(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 10_000 {
        format!("{ns} ns")
    } else if ns < 10_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{:.2} ms", ns as f64 / 1e6)
    }
}

/// Runs `f(0)`, ..., `f(n - 1)` one after the other and summarises how long each took.
pub async fn timed(n: usize, mut f: impl AsyncFnMut(usize)) -> Summary {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        f(i).await;
        samples.push(t.elapsed());
    }
    Summary::of(&mut samples)
}

/// The CPU time a process has used so far (user and system, all its threads), from
/// `/proc/<pid>/stat`; `None` once it is gone.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are
    // state (3), ..., utime (14) and stime (15).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_micros(ticks * 1_000_000 / per_second))
}

/// The CPU time this process has used so far (user and system, all its threads, to the
/// microsecond), from `getrusage`: [`cpu_time`] counts in clock ticks (10 ms), too coarse for a
/// loop of some tens of milliseconds.
pub fn own_cpu_time() -> Duration {
    let usage = own_usage();
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    Duration::from_micros(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// Page faults this process took so far that needed no I/O (`ru_minflt`): a copy-on-write page of
/// a driver's memory image written, or a page given back to the kernel touched again.
pub fn own_minor_faults() -> u64 {
    own_usage().ru_minflt as u64
}

fn own_usage() -> libc::rusage {
    // SAFETY: `getrusage` writes the zeroed struct it is given and has no other precondition.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    }
}

/// CPU used by some processes over a stretch of work: start with [`CpuMeter::start`], read with
/// [`CpuMeter::per`].
pub struct CpuMeter {
    start: Vec<(&'static str, u32, Duration)>,
}

impl CpuMeter {
    pub fn start(processes: &[(&'static str, u32)]) -> CpuMeter {
        CpuMeter {
            start: processes
                .iter()
                .map(|(name, pid)| (*name, *pid, cpu_time(*pid).unwrap_or_default()))
                .collect(),
        }
    }

    /// Each process's CPU since the start, divided by `n` (cycles), and their sum, as a line:
    /// `berth 1.23 ms, tgtd 0.45 ms, client 0.67 ms; all 2.35 ms`.
    pub fn per(&self, n: usize) -> String {
        let n = n.max(1) as u32;
        let mut total = Duration::ZERO;
        let mut parts = Vec::new();
        for (name, pid, start) in &self.start {
            let used = cpu_time(*pid).unwrap_or_default().saturating_sub(*start) / n;
            total += used;
            parts.push(format!("{name} {}", human(used)));
        }
        format!("{}; all {}", parts.join(", "), human(total))
    }
}

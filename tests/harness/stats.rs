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

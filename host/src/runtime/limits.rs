//! Every per-call resource limit of a driver in one place, and the per-store accounting that
//! enforces them: linear memory (a `ResourceLimiter`), guest CPU time (epoch callbacks that
//! exclude time spent in host calls), wall time, output size and log volume.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;
use wasmtime::CallHook;

/// Limits for every call of one driver. The operator can override each per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Linear memory, summed over the component's memories, in MiB.
    pub memory_mib: u64,
    /// Guest CPU time per call, in milliseconds. Time blocked in host calls does not count:
    /// capability calls carry their own timeouts.
    pub cpu_ms: u64,
    /// Wall time per call, in milliseconds, host calls included.
    pub timeout_ms: u64,
    /// Size of what a call returns, in KiB.
    pub output_kib: u64,
    /// Log messages per call; more are counted and dropped.
    pub log_messages: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { memory_mib: 64, cpu_ms: 2_000, timeout_ms: 60_000, output_kib: 1_024, log_messages: 100 }
    }
}

impl Limits {
    /// The largest memory limit a driver may be given.
    pub const MAX_MEMORY_MIB: u64 = 4096;

    pub fn memory_bytes(&self) -> usize {
        (self.memory_mib as usize) << 20
    }
    pub fn cpu(&self) -> Duration {
        Duration::from_millis(self.cpu_ms)
    }
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
    pub fn output_bytes(&self) -> usize {
        (self.output_kib as usize) << 10
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.memory_mib == 0 || self.memory_mib > Self::MAX_MEMORY_MIB {
            return Err(format!("memory_mib {} must be 1..={}", self.memory_mib, Self::MAX_MEMORY_MIB));
        }
        if self.cpu_ms == 0 || self.timeout_ms == 0 || self.output_kib == 0 {
            return Err("cpu_ms, timeout_ms and output_kib must be positive".into());
        }
        Ok(())
    }
}

/// Caps a store's linear memory (all memories together) and records the peak and any refusal.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    limit: usize,
    total: usize,
    pub(crate) peak: usize,
    /// The total the guest asked for when it was refused.
    pub(crate) refused: Option<usize>,
}

impl MemoryLimiter {
    pub(crate) fn new(limit: usize) -> Self {
        MemoryLimiter { limit, total: 0, peak: 0, refused: None }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let wanted = self.total - current.min(self.total) + desired;
        if wanted > self.limit {
            self.refused = Some(wanted);
            return Ok(false);
        }
        self.total = wanted;
        self.peak = self.peak.max(wanted);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        64
    }
    fn tables(&self) -> usize {
        64
    }
    fn memories(&self) -> usize {
        16
    }
}

/// Measures the guest's own time: wall time since the store was created, minus time spent in
/// host calls (seen through the call hook) and minus time parked in the executor after an epoch
/// yield.
#[derive(Debug)]
pub(crate) struct GuestClock {
    start: Instant,
    host: Duration,
    in_host_since: Option<Instant>,
    parked_nanos: Arc<AtomicU64>,
}

impl GuestClock {
    pub(crate) fn new() -> Self {
        GuestClock {
            start: Instant::now(),
            host: Duration::ZERO,
            in_host_since: None,
            parked_nanos: Arc::default(),
        }
    }

    pub(crate) fn hook(&mut self, hook: CallHook) {
        match hook {
            CallHook::CallingHost => self.in_host_since = Some(Instant::now()),
            CallHook::ReturningFromHost => {
                if let Some(since) = self.in_host_since.take() {
                    self.host += since.elapsed();
                }
            }
            CallHook::CallingWasm | CallHook::ReturningFromWasm => {}
        }
    }

    /// A handle the epoch yield uses to report time parked in the executor.
    pub(crate) fn parked(&self) -> Arc<AtomicU64> {
        self.parked_nanos.clone()
    }

    pub(crate) fn guest_time(&self) -> Duration {
        let in_host = self.in_host_since.map(|s| s.elapsed()).unwrap_or_default();
        let parked = Duration::from_nanos(self.parked_nanos.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(self.host + in_host + parked)
    }
}

/// The error an epoch callback raises when a call used up its CPU time.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the call used up its CPU time")]
pub(crate) struct CpuTimeExceeded;

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn memory_limit_covers_all_memories_together() {
        let mut l = MemoryLimiter::new(100);
        assert!(l.memory_growing(0, 60, None).unwrap());
        assert!(!l.memory_growing(0, 50, None).unwrap(), "a second memory counts against the same limit");
        assert_eq!(l.refused, Some(110));
        assert!(l.memory_growing(0, 40, None).unwrap());
        assert_eq!(l.peak, 100);
    }

    #[test]
    fn host_time_is_not_guest_time() {
        let mut c = GuestClock::new();
        c.hook(CallHook::CallingHost);
        std::thread::sleep(Duration::from_millis(50));
        c.hook(CallHook::ReturningFromHost);
        assert!(c.guest_time() < Duration::from_millis(20), "{:?}", c.guest_time());
    }
}

//! Every per-call resource limit of a driver in one place, and the per-store accounting that
//! enforces them: linear memory (a `ResourceLimiter`), guest CPU time (the running thread's CPU
//! time while in the guest, checked by epoch callbacks), wall time, output size and log volume.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use wasmtime::CallHook;

/// Limits for the calls of one driver: per call, but for memory, which bounds an instance (the
/// calls of one operation share one). The operator can override each per backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Linear memory, summed over the component's memories, in MiB: per instance, so what the
    /// calls of one operation hold together.
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

    /// What one crossing from guest to host may make the host allocate (wasmtime's hostcall
    /// fuel, counted in host bytes): eight times the output limit, at least 1 MiB. A result within
    /// the output limit always fits (its host form is at most a few times its wire size).
    pub fn copy_bytes(&self) -> usize {
        self.output_bytes().saturating_mul(8).max(1 << 20)
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

/// Measures the guest's own CPU time: the CPU time of the thread running it, counted from each
/// entry into the guest (a call into wasm, a return from a host call, a resumption after an epoch
/// yield) to the next exit (a host call, a return from wasm, an epoch yield). Time blocked in host
/// calls, parked in the executor, or waiting for a CPU on a busy machine is not the guest's and
/// does not count, so a correct driver does not fail because the host is loaded; the call's wall
/// time has its own limit.
///
/// Reading a thread's CPU time is a system call, and a call crosses between guest and host tens
/// of times (each capability call twice): about 4 % of the service's CPU in the tgt attach cycle.
/// So a call's segments are timed on the wall clock (no system call), which bounds their CPU time
/// from above, until the call's first epoch tick ([`GuestClock::measure_cpu`]), and on the
/// thread's CPU clock from then on. A call shorter than a tick (nearly every call) never reads
/// the CPU clock; a longer one counts at most one tick of wall time before its CPU time, within
/// the tick the limit is checked at anyway.
#[derive(Debug, Clone, Default)]
pub(crate) struct GuestClock(Arc<ClockState>);

#[derive(Debug, Default)]
struct ClockState {
    /// Time of finished guest segments, in nanoseconds.
    spent: AtomicU64,
    /// When the current segment began, on the clock in use, plus one; 0 when the guest is not
    /// running.
    since: AtomicU64,
    /// Whether segments are timed on the thread's CPU clock (after the first tick) rather than
    /// the wall clock. Changes only between segments.
    cpu: AtomicBool,
}

impl GuestClock {
    pub(crate) fn new() -> Self {
        GuestClock::default()
    }

    pub(crate) fn hook(&self, hook: CallHook) {
        match hook {
            CallHook::CallingWasm | CallHook::ReturningFromHost => self.enter(),
            CallHook::CallingHost | CallHook::ReturningFromWasm => self.leave(),
        }
    }

    /// The time on the clock segments are timed on now.
    fn now(&self) -> u64 {
        if self.0.cpu.load(Ordering::Relaxed) { thread_cpu_nanos() } else { wall_nanos() }
    }

    /// The guest starts running on this thread.
    pub(crate) fn enter(&self) {
        self.0.since.store(self.now() + 1, Ordering::Relaxed);
    }

    /// The guest stops running on this thread.
    pub(crate) fn leave(&self) {
        let since = self.0.since.swap(0, Ordering::Relaxed);
        if since != 0 {
            self.0.spent.fetch_add(self.now().saturating_sub(since - 1), Ordering::Relaxed);
        }
    }

    /// From the next segment on, times segments on the thread's CPU clock. Called between
    /// segments (at the call's first epoch tick, after [`GuestClock::leave`]).
    pub(crate) fn measure_cpu(&self) {
        debug_assert_eq!(self.0.since.load(Ordering::Relaxed), 0, "between segments");
        self.0.cpu.store(true, Ordering::Relaxed);
    }

    /// The guest's CPU time so far; called on the thread running it, or after it stopped.
    pub(crate) fn guest_time(&self) -> Duration {
        let since = self.0.since.load(Ordering::Relaxed);
        let running = if since == 0 { 0 } else { self.now().saturating_sub(since - 1) };
        Duration::from_nanos(self.0.spent.load(Ordering::Relaxed) + running)
    }
}

/// Nanoseconds on the monotonic clock since the first reading in this process (vDSO: no system
/// call).
fn wall_nanos() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_nanos() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; the clock id is valid on
    // every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return 0;
    }
    (t.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(t.tv_nsec as u64)
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
    fn after_the_first_tick_guest_time_is_cpu_time_not_wall_time() {
        let clock = GuestClock::new();
        clock.measure_cpu();
        clock.enter();
        // Off the CPU, as a guest whose thread waits for a CPU on a busy machine.
        std::thread::sleep(Duration::from_millis(100));
        assert!(clock.guest_time() < Duration::from_millis(20), "{:?}", clock.guest_time());
        // On the CPU for 50 ms of this thread's CPU time (however long that takes on a busy
        // machine).
        let cpu = || {
            let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
            // SAFETY: a valid clock id and a valid out-pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
            Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
        };
        let t = cpu();
        while cpu() - t < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        clock.leave();
        let spent = clock.guest_time();
        assert!(spent >= Duration::from_millis(45), "{spent:?}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(clock.guest_time(), spent, "nothing counts while the guest is not running");
    }

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
    fn before_the_first_tick_guest_time_is_wall_time_which_bounds_it_and_is_kept_after() {
        let clock = GuestClock::new();
        clock.enter();
        std::thread::sleep(Duration::from_millis(30));
        clock.leave();
        let wall = clock.guest_time();
        assert!(wall >= Duration::from_millis(30), "the wall clock, read without a system call: {wall:?}");
        clock.measure_cpu();
        assert_eq!(clock.guest_time(), wall, "what was counted stays");
        clock.enter();
        std::thread::sleep(Duration::from_millis(100));
        clock.leave();
        assert!(
            clock.guest_time() < wall + Duration::from_millis(20),
            "after the switch, time off the CPU does not count: {:?}",
            clock.guest_time()
        );
    }

    #[test]
    fn host_time_is_not_guest_time() {
        for cpu in [false, true] {
            host_time_is_not_guest_time_on(cpu);
        }
    }

    fn host_time_is_not_guest_time_on(cpu: bool) {
        let c = GuestClock::new();
        if cpu {
            c.measure_cpu();
        }
        c.hook(CallHook::CallingWasm);
        c.hook(CallHook::CallingHost);
        // The host works on the CPU (a capability call).
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        c.hook(CallHook::ReturningFromHost);
        c.hook(CallHook::ReturningFromWasm);
        assert!(c.guest_time() < Duration::from_millis(20), "{:?}", c.guest_time());
    }
}

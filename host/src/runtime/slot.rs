//! Which driver a backend runs, and how a driver's calls went. A backend's [`DriverSlot`] holds
//! the driver that new operations get; an upgrade switches it (`upgrade/`), and an operation
//! keeps the driver it started with until it ends, so a switch never changes the driver under a
//! call in flight. Each driver counts its calls ([`Tally`]); the watch after a switch compares the
//! new driver's counts with its predecessor's ([`Watch::verdict`]).

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::error::CallErrorKind;
use super::{Call, Driver, Response};
use crate::runtime::contract::DriverError;

/// Counters of one driver's calls.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    calls: AtomicU64,
    failures: AtomicU64,
    wall_micros: AtomicU64,
    /// Calls by kind, in the order of [`Call::ALL`].
    by_call: [AtomicU64; Call::ALL.len()],
}

/// What a driver's calls came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Calls by kind, in the order of [`Call::ALL`] (see [`Counts::of`]).
    pub by_call: [u64; Call::ALL.len()],
    pub calls: u64,
    /// Calls that failed by the driver's fault or its backend's: traps, limits, invalid results,
    /// `backend` and `retryable` errors. Answers about the request (an invalid connector, a
    /// missing volume, something unsupported) are not failures of the driver.
    pub failures: u64,
    pub wall_micros: u64,
}

impl Tally {
    pub(crate) fn count(&self, call: Call, outcome: &Result<Response, CallErrorKind>, wall: Duration) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.by_call[index(call)].fetch_add(1, Ordering::Relaxed);
        self.wall_micros.fetch_add(wall.as_micros() as u64, Ordering::Relaxed);
        if outcome.as_ref().is_err_and(is_failure) {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            by_call: std::array::from_fn(|i| self.by_call[i].load(Ordering::Relaxed)),
            calls: self.calls.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            wall_micros: self.wall_micros.load(Ordering::Relaxed),
        }
    }
}

fn index(call: Call) -> usize {
    Call::ALL.iter().position(|c| *c == call).expect("every call is in Call::ALL")
}

/// Whether an error is the driver's (or its backend's) failure rather than an answer about the
/// request.
fn is_failure(kind: &CallErrorKind) -> bool {
    match kind {
        CallErrorKind::Driver(e) => matches!(e, DriverError::Backend(_) | DriverError::Retryable(_)),
        CallErrorKind::NotMade(_) | CallErrorKind::Injected(_) => false,
        _ => true,
    }
}

impl Counts {
    /// How many `call`s were made.
    pub fn of(&self, call: Call) -> u64 {
        self.by_call[index(call)]
    }

    /// The calls made since `earlier` was taken.
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            by_call: std::array::from_fn(|i| self.by_call[i].saturating_sub(earlier.by_call[i])),
            calls: self.calls.saturating_sub(earlier.calls),
            failures: self.failures.saturating_sub(earlier.failures),
            wall_micros: self.wall_micros.saturating_sub(earlier.wall_micros),
        }
    }

    fn failure_ratio(self) -> f64 {
        if self.calls == 0 { 0.0 } else { self.failures as f64 / self.calls as f64 }
    }

    fn mean_micros(self) -> f64 {
        if self.calls == 0 { 0.0 } else { self.wall_micros as f64 / self.calls as f64 }
    }
}

/// When a new driver is worse enough than the one it replaced to be switched back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Watch {
    /// How long after the switch its calls are compared.
    pub window: Duration,
    /// Calls the new driver must have made before it is judged.
    pub min_calls: u64,
    /// Switched back when its failure ratio exceeds the old driver's by more than this (0.1:
    /// ten points).
    pub max_failure_increase: f64,
    /// Switched back when its mean call time exceeds the old driver's this many times over.
    pub max_latency_factor: f64,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            window: Duration::from_secs(600),
            min_calls: 20,
            max_failure_increase: 0.1,
            max_latency_factor: 4.0,
        }
    }
}

impl Watch {
    /// Why the new driver, with `new` calls since the switch, must give way to the old one,
    /// whose calls before the switch were `old`; `None` while it is not worse (or not yet judged).
    pub fn verdict(&self, old: Counts, new: Counts) -> Option<String> {
        if new.calls < self.min_calls.max(1) {
            return None;
        }
        let (ratio, before) = (new.failure_ratio(), old.failure_ratio());
        if ratio - before > self.max_failure_increase {
            return Some(format!(
                "{} of its {} calls failed ({:.0} %), against {:.0} % of the previous driver's {} calls \
                 (allowed: {:.0} points more)",
                new.failures,
                new.calls,
                ratio * 100.0,
                before * 100.0,
                old.calls,
                self.max_failure_increase * 100.0
            ));
        }
        if old.calls >= self.min_calls.max(1) && old.mean_micros() > 0.0 {
            let factor = new.mean_micros() / old.mean_micros();
            if factor > self.max_latency_factor {
                return Some(format!(
                    "its calls took {:.1} ms on average over {} calls, {factor:.1} times the previous \
                     driver's {:.1} ms (allowed: {} times)",
                    new.mean_micros() / 1000.0,
                    new.calls,
                    old.mean_micros() / 1000.0,
                    self.max_latency_factor
                ));
            }
        }
        None
    }
}

/// A driver as a backend runs it.
#[derive(Clone)]
pub struct Running {
    pub driver: Driver,
    /// When it began serving this backend (Unix time, microseconds).
    pub since: i64,
    /// How it came to: `configured`, `upgraded` or `rolled back`.
    pub how: &'static str,
    /// Its counts when it began serving (a driver switched back to has counted before).
    pub counts_at_start: Counts,
}

impl Running {
    pub fn new(driver: Driver, how: &'static str) -> Running {
        let counts_at_start = driver.tally();
        Running { driver, since: unix_now(), how, counts_at_start }
    }

    /// Its calls since it began serving.
    pub fn counts(&self) -> Counts {
        self.driver.tally().since(self.counts_at_start)
    }
}

/// The driver a backend runs now, and the one before it (what a rollback returns to).
pub struct DriverSlot {
    state: RwLock<(Running, Option<Running>)>,
}

impl DriverSlot {
    pub fn new(driver: Driver) -> DriverSlot {
        DriverSlot { state: RwLock::new((Running::new(driver, "configured"), None)) }
    }

    /// The driver new operations get.
    pub fn current(&self) -> Driver {
        self.read().0.driver.clone()
    }

    /// The running driver and the previous one.
    pub fn running(&self) -> (Running, Option<Running>) {
        self.read().clone()
    }

    /// Makes `driver` the one new operations get; the one it replaces becomes the previous.
    /// Returns the replaced one.
    pub fn switch(&self, driver: Driver, how: &'static str) -> Running {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        let replaced = std::mem::replace(&mut state.0, Running::new(driver, how));
        state.1 = Some(replaced.clone());
        replaced
    }

    /// Switches back to the previous driver, if the running one is still `digest` (`None`: any);
    /// the one it replaces becomes the previous. `None` when there is nothing to go back to, or
    /// when another switch came first.
    pub fn roll_back(&self, digest: Option<&str>) -> Option<(Running, Running)> {
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if digest.is_some_and(|d| d != state.0.driver.digest()) {
            return None;
        }
        let previous = state.1.take()?;
        let replaced = std::mem::replace(&mut state.0, Running::new(previous.driver, "rolled back"));
        state.1 = Some(replaced.clone());
        Some((replaced, state.0.clone()))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, (Running, Option<Running>)> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(calls: u64, failures: u64, mean_ms: u64) -> Counts {
        Counts { calls, failures, wall_micros: calls * mean_ms * 1000, ..Counts::default() }
    }

    #[test]
    fn a_new_driver_is_not_judged_before_it_made_enough_calls() {
        let watch = Watch { min_calls: 10, ..Watch::default() };
        assert_eq!(watch.verdict(counts(100, 0, 5), counts(9, 9, 500)), None);
        assert!(watch.verdict(counts(100, 0, 5), counts(10, 10, 5)).is_some());
    }

    #[test]
    fn more_failures_than_the_old_driver_by_the_margin_switch_back() {
        let watch = Watch { min_calls: 10, max_failure_increase: 0.1, ..Watch::default() };
        // The old driver failed 20 % of its calls: 25 % is within the margin, 35 % is not.
        assert_eq!(watch.verdict(counts(100, 20, 5), counts(100, 25, 5)), None);
        let why = watch.verdict(counts(100, 20, 5), counts(100, 35, 5)).expect("worse");
        assert!(why.contains("35 of its 100 calls failed"), "{why}");
    }

    #[test]
    fn slower_calls_than_the_factor_switch_back_only_against_a_measured_old_driver() {
        let watch = Watch { min_calls: 10, max_latency_factor: 4.0, ..Watch::default() };
        assert_eq!(watch.verdict(counts(100, 0, 5), counts(50, 0, 19)), None);
        let why = watch.verdict(counts(100, 0, 5), counts(50, 0, 25)).expect("slower");
        assert!(why.contains("5.0 times"), "{why}");
        // An old driver with too few calls to compare with: latency alone decides nothing.
        assert_eq!(watch.verdict(counts(3, 0, 5), counts(50, 0, 500)), None);
    }

    #[test]
    fn only_the_drivers_own_failures_count() {
        let tally = Tally::default();
        let ms = Duration::from_millis(1);
        let c = Call::InitializeConnection;
        tally.count(c, &Ok(Response::Unit), ms);
        tally.count(c, &Err(CallErrorKind::Driver(DriverError::NotFound("x".into()))), ms);
        tally.count(c, &Err(CallErrorKind::NotMade("lease".into())), ms);
        tally.count(c, &Err(CallErrorKind::Driver(DriverError::Backend("x".into()))), ms);
        tally.count(Call::CreateExport, &Err(CallErrorKind::Trap("x".into())), ms);
        let counts = tally.counts();
        assert_eq!((counts.calls, counts.failures, counts.wall_micros), (5, 2, 5000));
        assert_eq!((counts.of(c), counts.of(Call::CreateExport), counts.of(Call::Info)), (4, 1, 0));
    }
}

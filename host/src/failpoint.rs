//! Failpoints: named places at the step boundaries of every changing flow (after the intent is
//! written, after each driver and capability call, before the final commit) where a test makes
//! the process die as a crash would, or stall as a slow backend would.
//!
//! Compiled in only with the `failpoints` feature, which the test package enables; in any other
//! build [`hit`] is an empty inline function. Even when compiled in, nothing happens until a test
//! arms a failpoint through the test-only route `/_failpoints` (see `api/mod.rs`), or, for what
//! happens at start-up, through `BERTH_FAILPOINTS` (`name=kill`, `name=sleep:<ms>` or
//! `name=fail`, optionally `@<nth>`, comma-separated).
//!
//! A few places where a disk can fail are points of another kind ([`fails`]): armed with `fail`,
//! the operation there fails as a failing disk would (`store.wal.sync <path of the log>`: a
//! sync of SQLite's write-ahead log). They are not step boundaries and are not traced.
//! Places where a test makes a flow wait while another process acts ([`pause`]: armed with
//! `sleep`; `attach.remove.read`, between a detach's read of the volume and its operation, and
//! `volume.create.check <node>`, in a create's transaction after it found the backend enabled)
//! are not step boundaries either: nothing was written there for a kill to test.
//!
//! Names are `<flow>.<step>` (`attach.connect.intent`, `volume.delete.commit`) and
//! `capability.<interface>.<op>` for the end of a capability call. Every hit is traced (when
//! tracing is on) so that a harness can discover the failpoints a flow passes, in order, and then
//! kill the process at each of them.

#[cfg(feature = "failpoints")]
pub use active::{Action, arm, fails, hit, hit_sync, hits, pause, reset, seen};

/// Marks a failpoint (does nothing: this build has no failpoints).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn hit(_name: &str) {}

/// Marks a failpoint in code that is not async (does nothing: this build has no failpoints).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit_sync(_name: &str) {}

/// Where a fault can be injected (never: this build has no failpoints).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn fails(_name: &str) -> bool {
    false
}
/// Where a test makes a flow wait (never: this build has no failpoints).
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn pause(_name: &str) {}

#[cfg(feature = "failpoints")]
mod active {
    use std::sync::Mutex;
    use std::time::Duration;

    /// What an armed failpoint does.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    pub enum Action {
        /// SIGKILL the process: no destructor, no flush, no shutdown, exactly like a crash.
        Kill,
        /// Sleep this many milliseconds, then go on.
        Sleep,
        /// Make the operation at a [`fails`] point fail, as a failing disk would.
        Fail,
    }

    struct Armed {
        name: String,
        /// Fire at the n-th hit of the name (1-based) counted from arming.
        nth: u32,
        seen: u32,
        action: Action,
        millis: u64,
    }

    struct State {
        armed: Vec<Armed>,
        /// Every hit in order, when tracing (bounded).
        trace: Option<Vec<String>>,
    }

    impl State {
        /// Counts a pass of `name` for each armed point there of the kinds `acts` takes; the one
        /// whose `nth` pass this is fires (its action and sleep).
        fn passed(&mut self, name: &str, acts: impl Fn(Action) -> bool) -> Option<(Action, u64)> {
            let mut fire = None;
            for a in self.armed.iter_mut().filter(|a| a.name == name && acts(a.action)) {
                a.seen += 1;
                if a.seen == a.nth {
                    fire = Some((a.action, a.millis));
                }
            }
            fire
        }
    }

    static STATE: Mutex<State> = Mutex::new(State { armed: Vec::new(), trace: None });

    const MAX_TRACE: usize = 100_000;

    fn state() -> std::sync::MutexGuard<'static, State> {
        STATE.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Arms what `BERTH_FAILPOINTS` names, once per process.
    fn from_environment() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let Ok(spec) = std::env::var("BERTH_FAILPOINTS") else { return };
            for item in spec.split(',').filter(|i| !i.trim().is_empty()) {
                let Some((name, rest)) = item.trim().split_once('=') else { continue };
                let (what, nth) = rest.split_once('@').unwrap_or((rest, "1"));
                let nth = nth.parse().unwrap_or(1);
                match what.split_once(':') {
                    Some(("sleep", ms)) => arm(name, nth, Action::Sleep, ms.parse().unwrap_or(0)),
                    _ if what == "kill" => arm(name, nth, Action::Kill, 0),
                    _ if what == "fail" => arm(name, nth, Action::Fail, 0),
                    _ => {}
                }
            }
        });
    }

    /// Passes the failpoint `name`. A `sleep` armed there stalls this flow only, as a slow
    /// backend's answer would: it waits without holding the thread, so the runtime's other tasks
    /// (the timer of a driver call's deadline among them) go on, however few its workers.
    pub async fn hit(name: &str) {
        if let Some(millis) = passed(name) {
            tokio::time::sleep(Duration::from_millis(millis)).await;
        }
    }

    /// Passes the failpoint `name` in code that is not async (the `berth db` commands): a
    /// `sleep` armed there holds the thread.
    pub fn hit_sync(name: &str) {
        if let Some(millis) = passed(name) {
            std::thread::sleep(Duration::from_millis(millis));
        }
    }

    /// Traces a pass of the failpoint `name` and kills the process when a `kill` armed there
    /// fires; how long to sleep when a `sleep` does.
    fn passed(name: &str) -> Option<u64> {
        from_environment();
        let fire = {
            let mut s = state();
            if let Some(trace) = &mut s.trace
                && trace.len() < MAX_TRACE
            {
                trace.push(name.to_string());
            }
            s.passed(name, |action| action != Action::Fail)
        };
        match fire {
            Some((Action::Kill, _)) => {
                tracing::warn!(failpoint = name, "failpoint: killing the process");
                // SAFETY: kill(2) on our own pid with a signal that cannot be caught.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            Some((Action::Sleep, millis)) => Some(millis),
            Some((Action::Fail, _)) | None => None,
        }
    }

    /// Passes the place `name` where a fault can be injected: true when a `fail` armed there
    /// fires now. Not a step boundary: not traced, so the crash harness does not kill there.
    pub fn fails(name: &str) -> bool {
        from_environment();
        let fire = state().passed(name, |action| action == Action::Fail).is_some();
        if fire {
            tracing::warn!(failpoint = name, "failpoint: failing");
        }
        fire
    }

    /// Passes the place `name` where a test makes the flow wait: sleeps when a `sleep` armed
    /// there fires now. Not a step boundary: not traced.
    pub async fn pause(name: &str) {
        from_environment();
        let fire = state().passed(name, |action| action == Action::Sleep);
        if let Some((_, millis)) = fire {
            tokio::time::sleep(Duration::from_millis(millis)).await;
        }
    }

    /// How many times the points armed as `name` were passed since they were armed: a test waits
    /// on it to act while a flow is held at a [`pause`].
    pub fn seen(name: &str) -> u32 {
        state().armed.iter().filter(|a| a.name == name).map(|a| a.seen).max().unwrap_or(0)
    }

    /// Arms `name` to act at its `nth` hit from now.
    pub fn arm(name: &str, nth: u32, action: Action, millis: u64) {
        state().armed.push(Armed { name: name.to_string(), nth: nth.max(1), seen: 0, action, millis });
    }

    /// Disarms everything and starts a new trace (when `trace`) or stops tracing.
    pub fn reset(trace: bool) {
        let mut s = state();
        s.armed.clear();
        s.trace = trace.then(Vec::new);
    }

    /// The failpoints passed since the last [`reset`] with tracing.
    pub fn hits() -> Vec<String> {
        state().trace.clone().unwrap_or_default()
    }
}

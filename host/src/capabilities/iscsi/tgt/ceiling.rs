//! How many LUNs one tgtd may hold on this machine, and the check made before each new one.
//!
//! tgtd gives every LUN `io_threads` I/O threads (`tgtd -t`) for as long as the LUN exists, and
//! the kernel has a fixed number of threads for the whole machine (`kernel.pid_max` and
//! `kernel.threads-max`; the smaller counts). A tgtd that takes them all leaves every other
//! program unable to fork, then fails itself, taking every export with it. So:
//!
//! - the **ceiling**, computed at start: `(threads of the machine − [tgt] reserve_threads) /
//!   io_threads`, or `[tgt] max_luns` when that is lower. It is what the metrics
//!   (`berth_tgt_lun_ceiling`) and `os-services` show;
//! - the **check** before a new LUN: refused at the ceiling, and refused when the machine, as it
//!   is now (`/proc/loadavg` counts every thread), would have fewer than `reserve_threads`
//!   threads left after the LUN's, so that other programs' threads count too.
//!
//! A refusal names the limit and the setting; nothing is sent to tgtd.

use std::path::Path;

/// The limits of one tgtd's LUNs on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ceiling {
    /// I/O threads each LUN costs.
    pub io_threads: u64,
    /// Threads the machine has (the smaller of `kernel.pid_max` and `kernel.threads-max`).
    pub machine_threads: u64,
    /// Threads always left to the rest of the machine (`[tgt] reserve_threads`).
    pub reserve_threads: u64,
    /// The operator's own limit (`[tgt] max_luns`), if any.
    pub max_luns: Option<u64>,
}

impl Ceiling {
    /// The limits on this machine (read from `/proc`).
    pub fn of_this_machine(io_threads: u32, reserve_threads: u64, max_luns: Option<u64>) -> Ceiling {
        Ceiling::new(machine_threads(Path::new("/proc")), io_threads, reserve_threads, max_luns)
    }

    pub fn new(
        machine_threads: u64,
        io_threads: u32,
        reserve_threads: u64,
        max_luns: Option<u64>,
    ) -> Ceiling {
        Ceiling { io_threads: u64::from(io_threads.max(1)), machine_threads, reserve_threads, max_luns }
    }

    /// How many LUNs fit: the threads the machine has beyond the reserve, by LUN, or the
    /// operator's limit when it is lower.
    pub fn luns(&self) -> u64 {
        let by_threads = self.machine_threads.saturating_sub(self.reserve_threads) / self.io_threads;
        self.max_luns.map_or(by_threads, |m| m.min(by_threads))
    }

    /// Whether one more LUN may be made while tgtd holds `held` LUNs and the machine runs
    /// `threads_now` threads (when known); the refusal says which limit and which setting.
    pub fn admit(&self, held: u64, threads_now: Option<u64>) -> Result<(), String> {
        let ceiling = self.luns();
        if held >= ceiling {
            let why = match self.max_luns {
                Some(m) if m <= ceiling => format!("[tgt] max_luns = {m}"),
                _ => format!(
                    "{} threads on this machine (kernel.pid_max, kernel.threads-max) less [tgt] reserve_threads = {}, \
                     at [tgt] io_threads = {} per LUN",
                    self.machine_threads, self.reserve_threads, self.io_threads
                ),
            };
            return Err(format!(
                "tgtd holds {held} LUNs, its ceiling on this machine ({why}); no new export until one is removed"
            ));
        }
        if let Some(now) = threads_now {
            let left = self.machine_threads.saturating_sub(now + self.io_threads);
            if left < self.reserve_threads {
                return Err(format!(
                    "this machine runs {now} of its {} threads; a new LUN's {} I/O threads would leave fewer than \
                     [tgt] reserve_threads = {} for other programs",
                    self.machine_threads, self.io_threads, self.reserve_threads
                ));
            }
        }
        Ok(())
    }
}

/// The threads the kernel allows on the machine.
fn machine_threads(proc: &Path) -> u64 {
    let read = |name: &str| {
        std::fs::read_to_string(proc.join("sys/kernel").join(name))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    // pid_max counts ids, and every thread takes one.
    [read("pid_max"), read("threads-max")].into_iter().flatten().min().unwrap_or(32_768)
}

/// The threads running on the machine now (`/proc/loadavg`'s fourth field, `running/total`).
pub(super) fn threads_now() -> Option<u64> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_loadavg(text: &str) -> Option<u64> {
    text.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_is_the_machines_threads_beyond_the_reserve_by_lun_or_the_operators_limit() {
        assert_eq!(Ceiling::new(32_768, 4, 4_096, None).luns(), 7_168);
        assert_eq!(Ceiling::new(32_768, 2, 4_096, None).luns(), 14_336);
        assert_eq!(Ceiling::new(32_768, 2, 4_096, Some(100)).luns(), 100);
        assert_eq!(Ceiling::new(32_768, 2, 4_096, Some(1_000_000)).luns(), 14_336);
        // io_threads 0 is tgtd's 1.
        assert_eq!(Ceiling::new(1_000, 0, 0, None).luns(), 1_000);
        assert_eq!(Ceiling::new(1_000, 1, 5_000, None).luns(), 0);
    }

    #[test]
    fn a_new_lun_is_refused_at_the_ceiling_or_when_the_machine_would_keep_less_than_its_reserve() {
        let c = Ceiling::new(32_768, 2, 4_096, Some(10));
        assert!(c.admit(9, Some(500)).is_ok());
        let e = c.admit(10, Some(500)).unwrap_err();
        assert!(e.contains("holds 10 LUNs") && e.contains("[tgt] max_luns = 10"), "{e}");
        let c = Ceiling::new(32_768, 2, 4_096, None);
        let e = c.admit(14_336, None).unwrap_err();
        assert!(e.contains("reserve_threads = 4096") && e.contains("io_threads = 2"), "{e}");
        // Other programs' threads count: 28,671 running leaves 4,095 after a LUN's two.
        assert!(c.admit(10, Some(28_670)).is_ok());
        let e = c.admit(10, Some(28_671)).unwrap_err();
        assert!(e.contains("runs 28671 of its 32768 threads"), "{e}");
    }

    #[test]
    fn the_machine_is_read_from_proc() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/kernel")).unwrap();
        std::fs::write(dir.path().join("sys/kernel/pid_max"), "4194304\n").unwrap();
        std::fs::write(dir.path().join("sys/kernel/threads-max"), "192731\n").unwrap();
        assert_eq!(machine_threads(dir.path()), 192_731);
        assert_eq!(parse_loadavg("1.40 1.61 0.99 3/92 10954\n"), Some(92));
        assert!(threads_now().is_some_and(|n| n > 0));
    }
}

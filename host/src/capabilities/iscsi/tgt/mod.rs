//! Linux's userspace iSCSI target daemon, tgtd, one type per file:
//!
//! - `protocol.rs`: its control protocol (requests, answers, failures);
//! - `config.rs`: how to reach one tgtd ([`TgtdConfig`]);
//! - `ceiling.rs`: how many LUNs it may hold on this machine ([`Ceiling`]);
//! - `model.rs`: what this process knows of its targets;
//! - `accounts.rs`: the CHAP accounts this process made;
//! - `kept.rs`: the kept targets, written down for a restarted Berth;
//! - `tgtd.rs`: [`Tgtd`], the daemon behind its control socket: the model kept fresh, changes
//!   sent, exports kept for reuse and swept;
//! - `preload.rs`: what a tgtd this service starts is started with (its futex hash sized);
//! - `service.rs`: the iSCSI target service (`TargetService`) on it.

/// Runs an operation (an `async` block, evaluated again for each attempt), starting it again at
/// most a few times when tgtd turns out to have been restarted, so that it is decided on the new
/// daemon's state.
macro_rules! retrying {
    ($what:expr, $op:expr) => {{
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result: Result<_, Failure> = $op.await;
            match result {
                Err(Failure::Restarted { .. }) if attempts < 4 => continue,
                result => break result.map_err(|f| f.into_error($what)),
            }
        }
    }};
}

/// Locks a mutex, ignoring poisoning (every critical section leaves the data consistent).
fn guard<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

mod accounts;
mod ceiling;
mod config;
mod kept;
mod model;
pub mod preload;
mod protocol;
mod service;
mod tgtd;

pub use ceiling::Ceiling;
pub use config::TgtdConfig;
pub use protocol::{Request, parse_accounts, parse_connections, parse_show, shown_megabytes};
pub use tgtd::{ISCSI_NOP_NEVER, Tgtd, listens_on};

//! How to reach one tgtd, and what the service keeps of it.

use std::path::PathBuf;
use std::time::Duration;

/// How to reach one tgtd.
#[derive(Debug, Clone)]
pub struct TgtdConfig {
    /// Absolute path of `tgtd` (used only to start a daemon).
    pub tgtd: PathBuf,
    /// tgtd's control port (`tgtd -C <n>`); 0 is the system default.
    pub control_port: u16,
    /// Where tgtd puts its control socket (`/var/run/tgtd`).
    pub socket_dir: PathBuf,
    /// Backing files must lie inside this directory.
    pub backing_dir: PathBuf,
    /// Timeout of one request.
    pub timeout: Duration,
    /// I/O threads per LUN of a tgtd this service starts (`tgtd -t`); what each LUN costs in the
    /// ceiling (`ceiling.rs`), also for a tgtd started by someone else.
    pub io_threads: u32,
    /// Threads always left to the rest of the machine (`ceiling.rs`).
    pub reserve_threads: u64,
    /// The operator's own limit on LUNs, if any.
    pub max_luns: Option<u64>,
    /// How long a deleted target stays in tgtd, inert, for reuse (zero: deleted at once). See the
    /// module notes.
    pub keep_exports: Duration,
    /// How long a CHAP account no target needs stays in tgtd for reuse before the sweep deletes
    /// it (zero: it is deleted at once, when its target goes). Kept short: a driver that gives each
    /// export new credentials (the shipped `tgt-iscsi`) never reuses one, and every account tgtd
    /// holds makes the next account's creation slower.
    pub keep_accounts: Duration,
    /// Every new LUN takes UNMAP, punching holes in its backing file (`thin_provisioning=1`).
    pub thin_provisioning: bool,
    /// Where the kept targets are listed (none: nowhere; a restart forgets them).
    pub state_file: Option<PathBuf>,
    /// Where the library a tgtd this service starts is loaded with is written (`preload.rs`;
    /// none: tgtd is started without it).
    pub preload_dir: Option<PathBuf>,
}

impl TgtdConfig {
    pub fn new(control_port: u16, backing_dir: impl Into<PathBuf>) -> Self {
        TgtdConfig {
            tgtd: PathBuf::from("/usr/sbin/tgtd"),
            control_port,
            socket_dir: PathBuf::from("/var/run/tgtd"),
            backing_dir: backing_dir.into(),
            timeout: Duration::from_secs(10),
            io_threads: 2,
            reserve_threads: 4096,
            max_luns: None,
            keep_exports: Duration::from_secs(3600),
            keep_accounts: Duration::ZERO,
            thin_provisioning: true,
            state_file: None,
            preload_dir: None,
        }
    }

    pub(super) fn socket_path(&self) -> PathBuf {
        self.socket_dir.join(format!("socket.{}", self.control_port))
    }
}

//! What this process knows of one tgtd's targets: the model `show` reads (see `tgtd.rs`).

use std::collections::{BTreeSet, HashMap};

use super::super::TargetState;

/// A control socket's identity: (device, inode, creation time in ns). A restarted tgtd binds a
/// new socket (the inode number may be reused; the creation time is not).
pub(super) type SocketId = (u64, u64, i128);

/// The tgtd a model describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Daemon {
    pub(super) pid: i32,
    pub(super) socket: SocketId,
}

/// What this process knows of one tgtd's targets. Local changes are stamped with an epoch, so
/// that a listing requested before them (by the reconciler, say, while a change of another
/// target is under way) does not undo them when it is installed.
#[derive(Default)]
pub(super) struct Model {
    pub(super) daemon: Option<Daemon>,
    pub(super) targets: HashMap<String, Known>,
    /// Targets deleted by this process, at which epoch.
    pub(super) gone: HashMap<String, u64>,
    /// Target ids being created.
    pub(super) reserved: BTreeSet<u32>,
    /// Targets kept inert after a `delete-target`, hidden from drivers: name -> (tid, since).
    pub(super) kept: HashMap<String, (u32, std::time::Instant)>,
    /// The kept targets were loaded from the state file (once per process).
    pub(super) kept_loaded: bool,
    /// Counts local changes.
    pub(super) epoch: u64,
}

pub(super) struct Known {
    pub(super) state: TargetState,
    /// The epoch of the last local change (0: as listed).
    pub(super) changed: u64,
}

impl Model {
    /// The next id after the highest in use, kept or being created.
    pub(super) fn next_tid(&self) -> u32 {
        let listed = self.targets.values().map(|k| k.state.tid).max().unwrap_or(0);
        let kept = self.kept.values().map(|(t, _)| *t).max().unwrap_or(0);
        listed.max(kept).max(self.reserved.last().copied().unwrap_or(0)) + 1
    }

    pub(super) fn touch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }
}

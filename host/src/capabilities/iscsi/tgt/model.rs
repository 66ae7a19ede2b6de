//! What this process knows of one tgtd's targets: the model `show` reads (see `tgtd.rs`).

use std::collections::{BTreeSet, HashMap};

use super::super::TargetState;

/// The highest target id this process gives a target it creates (ids count down from it).
pub(super) const TOP_TID: u32 = 1 << 20;

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
    /// Targets kept inert after a `delete-target`, hidden from drivers, by name.
    pub(super) kept: HashMap<String, Kept>,
    /// The kept targets were loaded from the state file (once per process).
    pub(super) kept_loaded: bool,
    /// Targets the last listing showed taking no logins (kept ones among them), but for those
    /// this process made take logins since: a reopening of LUNs cut short leaves its target so.
    pub(super) offline: BTreeSet<String>,
    /// The size each store (by path) had when this process opened a LUN on it: the size tgtd
    /// serves until the LUN is opened again, whatever the store's size now.
    pub(super) served: HashMap<String, u64>,
    /// Counts local changes.
    pub(super) epoch: u64,
    /// The epoch at which the newest listing installed was requested: an older one, answered
    /// before it and installed after, is not installed (`Tgtd::install`).
    pub(super) installed: u64,
}

/// A target kept inert for its volume's next export: no ACL entry and no account bound, so it
/// admits nobody; its LUNs stay open on the volume's store, so that the next export does not make
/// them again (a LUN's creation and deletion are the dearest of tgtd's changes: it starts and stops
/// the LUN's I/O threads).
#[derive(Debug, Clone)]
pub(super) struct Kept {
    pub(super) tid: u32,
    pub(super) since: std::time::Instant,
    /// (LUN, store path, the size tgtd serves it at as far as this process knows, from
    /// [`Model::served`]: `None` when not known, as for a target found kept by a listing).
    pub(super) luns: Vec<(u32, String, Option<u64>)>,
}

impl Kept {
    pub(super) fn new(tid: u32, luns: Vec<(u32, String, Option<u64>)>) -> Kept {
        Kept { tid, since: std::time::Instant::now(), luns }
    }
}

pub(super) struct Known {
    pub(super) state: TargetState,
    /// The epoch of the last local change (0: as listed).
    pub(super) changed: u64,
}

impl Model {
    /// The id for a new target: the one below the lowest in use (listed, kept or being created),
    /// counting down from [`TOP_TID`].
    ///
    /// tgtd keeps its targets in a list sorted by id and finds the target of every request by
    /// walking it from the lowest id (`target_lookup` in tgt's `usr/target.c`): a request for the
    /// target with the highest id of 10,000 walks all of them. Counting down puts the newest
    /// targets first, and they are the ones most requests are about (a volume attached, detached,
    /// its target kept and taken back), while long-lived exports move to the end of the list. Once
    /// the ids reach 1, the highest free id below [`TOP_TID`].
    pub(super) fn next_tid(&self) -> u32 {
        let in_use = || {
            self.targets
                .values()
                .map(|k| k.state.tid)
                .chain(self.kept.values().map(|k| k.tid))
                .chain(self.reserved.iter().copied())
        };
        let lowest = in_use().min().unwrap_or(TOP_TID + 1).min(TOP_TID + 1);
        if lowest > 1 {
            return lowest - 1;
        }
        let used: BTreeSet<u32> = in_use().collect();
        (1..=TOP_TID)
            .rev()
            .find(|t| !used.contains(t))
            .unwrap_or_else(|| used.last().copied().unwrap_or(TOP_TID).saturating_add(1))
    }

    pub(super) fn touch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(tids: &[u32]) -> Model {
        let mut model = Model::default();
        for tid in tids {
            let state = TargetState {
                iqn: format!("iqn.2010-10.org.openstack:t{tid}"),
                tid: *tid,
                ..Default::default()
            };
            model.targets.insert(state.iqn.clone(), Known { state, changed: 0 });
        }
        model
    }

    #[test]
    fn new_targets_get_ids_below_every_other_so_tgtd_finds_them_first() {
        assert_eq!(with(&[]).next_tid(), TOP_TID);
        assert_eq!(with(&[TOP_TID, TOP_TID - 1]).next_tid(), TOP_TID - 2);
        let mut model = with(&[500, 9000]);
        model.kept.insert("iqn.2010-10.org.openstack:kept".into(), Kept::new(40, Vec::new()));
        assert_eq!(model.next_tid(), 39, "a kept target's id is in use");
        model.reserved.insert(39);
        assert_eq!(model.next_tid(), 38, "an id being created is in use");
    }

    #[test]
    fn a_target_made_by_someone_else_above_the_top_does_not_move_the_count() {
        assert_eq!(with(&[TOP_TID + 7]).next_tid(), TOP_TID);
        assert_eq!(with(&[3, TOP_TID + 7]).next_tid(), 2);
    }

    #[test]
    fn once_the_count_reaches_one_the_highest_free_id_below_the_top_is_taken() {
        assert_eq!(with(&[1, 2, TOP_TID]).next_tid(), TOP_TID - 1);
        assert_eq!(with(&[1, 5]).next_tid(), TOP_TID);
    }
}

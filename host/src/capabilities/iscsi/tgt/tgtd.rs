//! The iSCSI target service on Linux's userspace target daemon, tgtd, driven over its control
//! socket (`protocol.rs`).
//!
//! Safety rules (reliability-notes section 4; Cinder's tgt helper broke each of them):
//! - No shell, no `tgt-admin` (which runs `system()` on interpolated strings and treats `#` as a
//!   comment), and no `tgtadm` either: every request, changes included, is one exchange on
//!   tgtd's root-only control socket, so no CHAP secret is ever on a command line.
//! - Every argument is a validated newtype (see `iscsi/mod.rs`) and backing paths must lie inside
//!   the configured backing directory.
//! - Every request has a timeout; "already exists" and "can't find" are idempotent outcomes.
//! - Operations act on one target id only: no `--op update` of everything.
//!
//! Cost: one exchange per change, whatever the number of targets. tgtd has no view of one target
//! with its LUNs and ACL (only of all of them), so the service keeps a model of tgtd's targets,
//! loaded with one listing and kept up to date by its own changes; `show` reads it. The model is
//! valid for one tgtd only: it names the daemon's pid and its socket's inode, a restarted tgtd
//! has other ones, and every change is sent only to the daemon the model describes (the socket
//! tells who answers), so a target id is never used on a restarted tgtd where it may name another
//! target. tgtd answers each change with its outcome, which is trusted (the control protocol has
//! no silent success, unlike `tgt-admin --force`, which Cinder re-checks); the reconciler's
//! periodic listing (`list`) reloads the model and compares everything. Target ids are allocated
//! from the model, and changes to different targets run in parallel.
//!
//! Kept exports: tgtd deletes targets and accounts in time quadratic in their number (tgt 1.0.85
//! to 1.0.97: deleting a target looks it up by name through a walk of every target with a list
//! lookup each; adding the k-th account scans for a free id with a list walk per candidate;
//! deleting one walks every target with a lookup each; at 3,000 targets a target deletion costs
//! 50 ms, at 10,000 about half a second, and tgtd serves nobody meanwhile). So an export is not
//! destroyed and made again with every attach cycle. `delete-target` on a target with no session
//! removes its ACL entries and account bindings and *keeps* the target with its LUNs: with an
//! empty ACL it admits nobody, and drivers no longer see it (`show` and `list` leave it out, as
//! if deleted). `create-target` of its name takes it back, LUNs and all (a LUN's creation and
//! deletion are the dearest changes of an attach cycle for tgtd: they start and stop the LUN's
//! I/O threads; a LUN whose store changed size meanwhile is made again); kept LUNs count
//! against the ceiling of LUNs and give way to a new one there. `set-chap` with the volume's
//! stored credentials binds its kept account again, if it is still there: accounts are kept
//! only `keep_accounts` (default zero: deleted with the target's release), because a driver that
//! gives each export new credentials never reuses one, and kept accounts would pile up with every
//! detach and make every later account's creation slower. [`Tgtd::sweep`] (from the reconciler)
//! really deletes what was kept longer than that, a little at a time, and unbound accounts this
//! process does not know. The kept targets are written down in `state_file` (`kept.rs`), so that a restarted
//! Berth still knows them.

// This room starts tgtd (host/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use super::super::initiators::is_initiator_account;
use super::super::{ChapCredentials, Iqn, Portal, TargetError, TargetState};
use super::accounts::Accounts;
use super::ceiling::Ceiling;
use super::config::TgtdConfig;
use super::guard;
use super::kept::KeptJournal;
use super::model::{Daemon, Kept, Known, Model, SocketId};
use super::protocol::{
    Answer, Control, Failure, Request, parse_accounts, parse_connections, parse_nexuses, parse_show,
};

/// What every target of a tgtd Berth starts gets as its NOP-In interval (tgtd's `--iscsi`
/// argument): a ping every 2^31 - 1 seconds, that is never. Not for the pings: tgt 1.0.97's full
/// listing (`tgt_target_show_all`) looks each target's NOP settings up in the list of all iSCSI
/// targets (`iscsi_print_nop_settings`, `usr/iscsi/iscsi_tcp.c`), and stops at the target only when
/// its interval is not 0; with tgtd's default 0 every target's lookup walks the whole list. At
/// 10,000 targets that walk was most of a listing's 4.2 to 4.4 s, during which tgtd serves nobody;
/// with an interval the listing takes half (BENCHMARKS.md). `packaging/tgt.service.d/berth.conf`
/// gives Debian's tgtd the same.
pub const ISCSI_NOP_NEVER: &str = "nop_interval=2147483647";

/// The most of tgtd's time one sweep spends deleting accounts (see [`Tgtd::sweep`]).
pub(crate) const SWEEP_BUDGET: Duration = Duration::from_millis(100);

/// How long a per-initiator account no target binds stays in tgtd before the sweep deletes it.
pub(crate) const INITIATOR_ACCOUNTS_KEPT: Duration = Duration::from_secs(3600);

/// tgtd, reached over its control socket.
pub struct Tgtd {
    pub(super) cfg: TgtdConfig,
    /// How many LUNs it may hold on this machine.
    pub(super) ceiling: Ceiling,
    pub(super) control: Control,
    pub(super) model: Mutex<Model>,
    /// One reload of the model at a time.
    reloading: AsyncMutex<()>,
    /// One change at a time per target; different targets change in parallel.
    locks: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
    /// The kept targets, written down for a restarted Berth (`state_file`).
    kept_journal: KeptJournal,
    /// The CHAP accounts this process made.
    pub(super) accounts: Accounts,
    /// Changes sent to tgtd, and listings of all its targets (for tests and benchmarks).
    changes: AtomicU64,
    listings: AtomicU64,
}

impl Tgtd {
    pub fn new(cfg: TgtdConfig) -> Self {
        let control = Control { socket: cfg.socket_path(), timeout: cfg.timeout };
        let ceiling = Ceiling::of_this_machine(cfg.io_threads, cfg.reserve_threads, cfg.max_luns);
        Tgtd {
            ceiling,
            kept_journal: KeptJournal::new(cfg.state_file.clone()),
            cfg,
            control,
            model: Mutex::default(),
            reloading: AsyncMutex::new(()),
            locks: Mutex::default(),
            accounts: Accounts::default(),
            changes: AtomicU64::new(0),
            listings: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &TgtdConfig {
        &self.cfg
    }

    /// Changes sent to tgtd since this service was made.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Listings of all of tgtd's targets since this service was made.
    pub fn listings(&self) -> u64 {
        self.listings.load(Ordering::Relaxed)
    }

    /// Whether tgtd answers on the control port.
    pub async fn is_running(&self) -> bool {
        self.control.send(&Request::show_system(), None).await.is_ok()
    }

    /// The portals among `portals` that are this machine's addresses and on whose port the
    /// running tgtd does not listen; `None` when that cannot be told from here: tgtd does not
    /// answer, or its descriptors are not this process's to read (another user's tgtd), or it
    /// runs in another network namespace. A portal at an address of another machine (a
    /// translated address in front of this one) is not judged.
    pub async fn portals_not_served(&self, portals: &[Portal]) -> Option<Vec<Portal>> {
        let pid = self.control.send(&Request::show_system(), None).await.ok()?.daemon;
        std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        let netns = |p: &str| std::fs::read_link(p).ok();
        if netns(&format!("/proc/{pid}/ns/net")) != netns("/proc/self/ns/net") {
            return None;
        }
        // An address this machine has is one a socket can be bound to.
        let local = |p: &Portal| std::net::UdpSocket::bind((p.address.as_str(), 0)).is_ok();
        Some(portals.iter().filter(|p| local(p) && !listens_on(pid, p.port)).cloned().collect())
    }

    /// Starts tgtd on `portal` (loopback or as configured) if it does not answer, and waits until
    /// it does. Returns whether it had to start one. The daemon outlives this process, as a
    /// system tgtd would; its targets are re-created by Berth's reconciliation anyway.
    pub async fn ensure_running(&self, portal: &Portal) -> Result<bool, TargetError> {
        if self.is_running().await {
            return Ok(false);
        }
        let address = if portal.address.contains(':') {
            format!("[{}]", portal.address)
        } else {
            portal.address.clone()
        };
        let portal_arg = format!("portal={address}:{},{ISCSI_NOP_NEVER}", portal.port);
        // tgtd daemonises itself; its stale socket from an earlier run would make it fail.
        let _ = std::fs::remove_file(self.cfg.socket_path());
        let _ =
            std::fs::remove_file(self.cfg.socket_dir.join(format!("socket.{}.lock", self.cfg.control_port)));
        let preload = match &self.cfg.preload_dir {
            Some(dir) => super::preload::environment(dir).map_err(|e| {
                TargetError::Failed(format!(
                    "cannot write tgtd's preload library into {}: {e}",
                    dir.display()
                ))
            })?,
            None => Vec::new(),
        };
        let status = tokio::process::Command::new(&self.cfg.tgtd)
            .args(["-C", &self.cfg.control_port.to_string(), "-t", &self.cfg.io_threads.max(1).to_string()])
            .args(["--iscsi", &portal_arg])
            .env_clear()
            .envs(preload)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .map_err(|e| TargetError::Failed(format!("cannot run {}: {e}", self.cfg.tgtd.display())))?;
        if !status.success() {
            return Err(TargetError::Failed(format!("{} exited with {status}", self.cfg.tgtd.display())));
        }
        for _ in 0..100 {
            if self.is_running().await {
                self.check_portal(portal).await?;
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(TargetError::Timeout("tgtd did not start answering within 5 s".into()))
    }

    /// A tgtd that cannot bind its portal (another process holds the port) runs on without it,
    /// logging it only, and every initiator's login then reaches that other process: the tgtd this
    /// process started must hold its portal, or it is stopped and the start refused.
    async fn check_portal(&self, portal: &Portal) -> Result<(), TargetError> {
        let pid = self.reload().await.map_err(|f| f.into_error("read tgtd's process id"))?;
        for _ in 0..100 {
            if listens_on(pid, portal.port) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // SAFETY: a signal to the tgtd this process has just started and found not listening.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        Err(TargetError::Failed(format!(
            "the tgtd started on control port {} could not listen on its portal {}:{}: another process \
             holds the port; set [tgt] portal to a free one, or stop that process",
            self.cfg.control_port, portal.address, portal.port
        )))
    }

    /// The control socket's identity, or `None` when it is not there.
    pub(super) fn socket_id(&self) -> Option<SocketId> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.control.socket.as_path())
            .ok()
            .map(|m| (m.dev(), m.ino(), i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())))
    }

    /// The daemon the model describes, reloading the model first when tgtd changed (or it was
    /// never loaded).
    pub(super) async fn fresh(&self) -> Result<i32, Failure> {
        let daemon = guard(&self.model).daemon;
        match daemon {
            Some(d) if self.socket_id() == Some(d.socket) => Ok(d.pid),
            _ => self.reload().await,
        }
    }

    /// The daemon the model describes, without looking at the socket again: for a request,
    /// whose caller decided on the model as [`Tgtd::fresh`] left it, and which reaches only that
    /// daemon (its pid is checked on the connection, `protocol.rs`).
    async fn described(&self) -> Result<i32, Failure> {
        let daemon = guard(&self.model).daemon;
        match daemon {
            Some(d) => Ok(d.pid),
            None => self.fresh().await,
        }
    }

    /// Loads the model from one listing of tgtd's targets.
    pub(super) async fn reload(&self) -> Result<i32, Failure> {
        let _one = self.reloading.lock().await;
        Ok(self.listing().await?.1)
    }

    /// Lists tgtd's targets and installs the listing in the model; returns it with the daemon.
    pub(super) async fn listing(&self) -> Result<(Vec<TargetState>, i32), Failure> {
        let since = guard(&self.model).epoch;
        let socket = self.socket_id();
        let answer = self.control.send(&Request::show_targets(), None).await?;
        self.listings.fetch_add(1, Ordering::Relaxed);
        let targets = parse_show(&answer.text);
        // Named for this tgtd: a test holds a listing here while the targets change.
        crate::failpoint::pause(&format!("tgt.listing.answered {}", self.cfg.control_port)).await;
        self.install(&targets, answer.daemon, socket, since);
        let visible = {
            let model = guard(&self.model);
            targets.into_iter().filter(|t| !model.kept.contains_key(&t.iqn)).collect()
        };
        Ok((visible, answer.daemon))
    }

    /// Installs a listing requested when the model was at epoch `since`: what this process
    /// changed since then stays as it is in the model. Listings may overlap (the reconciler's and
    /// an operation's reload): one requested before the newest installed is not installed, since
    /// the deletions it predates are no longer remembered (`gone` keeps them only until a listing
    /// requested after them is in), and it would bring their targets back with ids that other
    /// targets may have taken since.
    pub(super) fn install(&self, listed: &[TargetState], pid: i32, socket: Option<SocketId>, since: u64) {
        let mut guarded = guard(&self.model);
        let model = &mut *guarded;
        // (Whichever daemon answered it: an older listing of a daemon restarted since would
        // bring the old daemon back as well.)
        if since < model.installed {
            tracing::debug!(
                since,
                installed = model.installed,
                "a listing older than the model's is not installed"
            );
            return;
        }
        model.installed = since;
        let same_daemon = model.daemon.is_some_and(|d| d.pid == pid);
        if model.daemon.is_some() && !same_daemon {
            tracing::warn!(pid, "tgtd was restarted; reloaded its targets");
        }
        if !same_daemon {
            // A new daemon has none of the accounts this process made.
            self.accounts.clear();
        }
        // Kept targets stay hidden while tgtd still has them, inert; a new daemon has none. At the
        // first listing of this process, the state file says which inert targets were kept.
        if !model.kept_loaded {
            model.kept_loaded = true;
            for (iqn, tid) in self.load_kept() {
                model.kept.insert(iqn, Kept::new(tid, Vec::new()));
            }
        } else if !same_daemon {
            model.kept.clear();
        }
        if !same_daemon {
            model.served.clear();
        }
        // What is known of the stores no listed target exposes any more goes.
        let exposed: std::collections::HashSet<&str> =
            listed.iter().flat_map(|t| t.luns.iter().map(|(_, p)| p.as_str())).collect();
        model.served.retain(|p, _| exposed.contains(p.as_str()));
        // Kept: no ACL entry, no account bound (its LUNs may stay).
        let inert = |t: &TargetState| t.initiators.is_empty() && t.chap_users.is_empty();
        let listed_kept: HashMap<&str, &TargetState> = listed
            .iter()
            .filter(|t| model.kept.get(&t.iqn).is_some_and(|k| k.tid == t.tid) && inert(t))
            .map(|t| (t.iqn.as_str(), t))
            .collect();
        // The LUNs a kept target has are tgtd's: those this process did not keep itself (or
        // whose stores it did not see) are made again when the target is taken back.
        for (iqn, t) in &listed_kept {
            if let Some(k) = model.kept.get_mut(*iqn) {
                let same = k.luns.len() == t.luns.len()
                    && k.luns.iter().all(|(l, p, _)| t.luns.iter().any(|(tl, tp)| tl == l && tp == p));
                if !same {
                    k.luns = t.luns.iter().map(|(l, p)| (*l, p.clone(), None)).collect();
                }
            }
        }
        // A target kept since the listing was requested was listed as it was before (with its
        // LUN, say): it stays kept (`gone` has it from when it was stripped).
        let gone = &model.gone;
        model.kept.retain(|iqn, _| {
            listed_kept.contains_key(iqn.as_str())
                || (same_daemon && gone.get(iqn).is_some_and(|at| *at > since))
        });
        let mut targets: HashMap<String, Known> = listed
            .iter()
            .filter(|t| !listed_kept.contains_key(t.iqn.as_str()))
            .map(|t| (t.iqn.clone(), Known { state: TargetState::known_part(t), changed: 0 }))
            .collect();
        if same_daemon {
            for (iqn, known) in model.targets.drain().filter(|(_, k)| k.changed > since) {
                targets.insert(iqn, known);
            }
            for (iqn, _) in model.gone.iter().filter(|(_, at)| **at > since) {
                targets.remove(iqn);
            }
            model.gone.retain(|_, at| *at > since);
        } else {
            model.gone.clear();
        }
        for iqn in model.kept.keys() {
            targets.remove(iqn);
        }
        model.targets = targets;
        model.offline = listed.iter().filter(|t| t.offline).map(|t| t.iqn.clone()).collect();
        model.daemon = socket.map(|socket| Daemon { pid, socket });
    }

    /// Makes the target take logins again if the last listing showed it taking none (a
    /// reopening of its LUNs cut short, `reopen_luns` in service.rs): it is given a LUN for a
    /// host about to log in. Called with the target's lock held, so no reopening by this process
    /// is under way (one that is turns logins off and on again under the lock).
    pub(super) async fn take_logins(&self, tid: u32, iqn: &Iqn) -> Result<(), Failure> {
        if !guard(&self.model).offline.contains(iqn.as_str()) {
            return Ok(());
        }
        self.change(Request::target_state(tid, "ready"), iqn.as_str()).await?;
        guard(&self.model).offline.remove(iqn.as_str());
        tracing::warn!(target = %iqn, "the target took no logins (a reopening of its LUNs was cut short); it takes them again");
        Ok(())
    }

    /// The kept targets the state file lists: (name, tid).
    pub(super) fn load_kept(&self) -> Vec<(String, u32)> {
        self.kept_journal.load()
    }

    /// Writes down that `iqn` is kept now (`Some(tid)`) or no longer (`None`), in the state file
    /// (`kept.rs`). Called without the model's lock held.
    pub(super) fn note_kept(&self, iqn: &str, tid: Option<u32>) {
        let count = guard(&self.model).kept.len();
        self.kept_journal.note(iqn, tid, count, || {
            guard(&self.model).kept.iter().map(|(iqn, k)| (iqn.clone(), k.tid)).collect()
        });
    }

    /// Sends a change to the daemon the model describes. A restarted daemon gets nothing: the
    /// model is reloaded and the caller starts its operation again.
    pub(super) async fn change(&self, request: Request, iqn: &str) -> Result<Answer, Failure> {
        let pid = self.described().await?;
        let answer = self.control.send(&request, Some(pid)).await;
        match &answer {
            Err(Failure::Restarted { .. }) => {
                self.reload().await?;
            }
            // The model said the target exists: someone removed it behind this service's back.
            // Decide again on tgtd's state.
            Err(Failure::NotFound(m)) if m.contains("can't find the target") => {
                self.reload().await?;
                return Err(Failure::Restarted { expected: pid, found: pid });
            }
            Err(Failure::Timeout) => {}
            _ => {
                self.changes.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    mode = ?request.mode, op = ?request.op, tid = request.tid, target = iqn,
                    ok = answer.is_ok(), "tgtd change"
                );
            }
        }
        answer
    }

    /// Notes the size a store had when its LUN was opened (`None`: not known).
    pub(super) fn serving(&self, path: &str, size: Option<u64>) {
        let mut model = guard(&self.model);
        match size {
            Some(size) => model.served.insert(path.to_string(), size),
            None => model.served.remove(path),
        };
    }

    /// The LUNs tgtd holds, as far as the model knows (kept targets' among them).
    pub(super) fn luns_held(&self) -> u64 {
        let (live, kept) = self.luns_live_and_kept();
        live + kept
    }

    /// The LUNs of the targets drivers see, and those of kept targets.
    pub(super) fn luns_live_and_kept(&self) -> (u64, u64) {
        let model = guard(&self.model);
        let live = model.targets.values().map(|k| k.state.luns.len() as u64).sum();
        (live, model.kept.values().map(|k| k.luns.len() as u64).sum())
    }

    pub(super) fn known(&self, iqn: &Iqn) -> Option<TargetState> {
        guard(&self.model).targets.get(iqn.as_str()).map(|k| k.state.clone())
    }

    pub(super) fn require(&self, iqn: &Iqn) -> Result<TargetState, Failure> {
        self.known(iqn).ok_or_else(|| Failure::NotFound(format!("can't find the target {iqn}")))
    }

    /// Records a change this process made to a target.
    pub(super) fn update(&self, iqn: &Iqn, f: impl FnOnce(&mut TargetState)) {
        let mut model = guard(&self.model);
        let epoch = model.touch();
        if let Some(known) = model.targets.get_mut(iqn.as_str()) {
            f(&mut known.state);
            known.changed = epoch;
        }
    }

    pub(super) async fn lock(&self, iqn: &Iqn) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = guard(&self.locks);
            if map.len() > 1024 {
                map.retain(|_, weak| weak.strong_count() > 0);
            }
            match map.get(iqn.as_str()).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(AsyncMutex::new(()));
                    map.insert(iqn.as_str().to_string(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// The CHAP account names tgtd has.
    pub async fn accounts(&self) -> Result<Vec<String>, TargetError> {
        let answer = self
            .control
            .send(&Request::show_accounts(), None)
            .await
            .map_err(|f| f.into_error("show accounts"))?;
        Ok(parse_accounts(&answer.text))
    }

    pub(super) async fn account_delete(&self, user: &str, iqn: &str) -> Result<(), Failure> {
        match self.change(Request::delete_account(user), iqn).await {
            Ok(_) | Err(Failure::NotFound(_)) => {
                self.accounts.forget(user);
                Ok(())
            }
            Err(f) => Err(f),
        }
    }

    /// A kept target of that name, taken back into the targets drivers see (with no ACL entry
    /// and no account bound). Its LUNs come with it, but for those whose store changed size since
    /// it was kept (a volume extended while detached) or whose size served is not known: their
    /// numbers are returned, to be deleted and made again on the store as it is.
    pub(super) fn take_back(&self, iqn: &Iqn) -> Option<(TargetState, Vec<u32>)> {
        let kept = guard(&self.model).kept.get(iqn.as_str()).cloned()?;
        // A stat per LUN, without the model's lock held.
        let (luns, stale): (Vec<_>, Vec<_>) =
            kept.luns.iter().partition(|(_, path, size)| size.is_some() && *size == store_size(path));
        let state = {
            let mut model = guard(&self.model);
            let tid = model.kept.remove(iqn.as_str())?.tid;
            let luns = luns.into_iter().map(|(l, p, _)| (*l, p.clone())).collect();
            let state = TargetState { iqn: iqn.to_string(), tid, luns, ..Default::default() };
            let changed = model.touch();
            model.gone.remove(iqn.as_str());
            model.targets.insert(iqn.to_string(), Known { state: state.clone(), changed });
            state
        };
        self.note_kept(iqn.as_str(), None);
        Some((state, stale.into_iter().map(|(l, _, _)| *l).collect()))
    }

    /// Closes every connection of `initiator` on the target and checks that none is left (tgtd
    /// closes a connection from its event loop, so the check is repeated for a while). Answers
    /// how many sessions it found open.
    /// Ends the sessions of `initiator` on the target (of every initiator: `None`) and returns
    /// once none is left; answers how many were ended.
    pub(super) async fn end_sessions(
        &self,
        tid: u32,
        iqn: &Iqn,
        initiator: Option<&Iqn>,
    ) -> Result<u32, Failure> {
        // Usually the target has no session left at all: its statistics say so more cheaply than
        // the listing of its connections (see `Request::target_stats`).
        if !self.has_sessions(tid, iqn).await? {
            return Ok(0);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut ended = BTreeSet::new();
        loop {
            let answer = self.change_read(Request::show_connections(tid), iqn.as_str()).await?;
            let mine: Vec<_> = parse_connections(&answer.text)
                .into_iter()
                .filter(|c| initiator.is_none_or(|i| c.initiator == i.as_str()))
                .collect();
            if mine.is_empty() {
                return Ok(ended.len() as u32);
            }
            ended.extend(mine.iter().map(|c| c.sid));
            if std::time::Instant::now() > deadline {
                return Err(Failure::Other(format!(
                    "{} session(s) of {} on {iqn} are still open after being closed",
                    mine.len(),
                    initiator.map_or("its initiators", |i| i.as_str())
                )));
            }
            for c in &mine {
                match self.change(Request::delete_connection(tid, c.sid, c.cid), iqn.as_str()).await {
                    Ok(_) | Err(Failure::NotFound(_)) => {}
                    Err(f) => return Err(f),
                }
            }
            let initiator = initiator.map_or("every initiator", |i| i.as_str());
            tracing::info!(target = %iqn, initiator, connections = mine.len(), "closed connections");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the target has iSCSI sessions now (asked of tgtd, not of the model): its
    /// statistics list an IT nexus for each.
    pub(super) async fn has_sessions(&self, tid: u32, iqn: &Iqn) -> Result<bool, Failure> {
        let answer = self.change_read(Request::target_stats(tid), iqn.as_str()).await?;
        Ok(!parse_nexuses(&answer.text).is_empty())
    }

    /// A read that must reach the daemon the model describes.
    pub(super) async fn change_read(&self, request: Request, iqn: &str) -> Result<Answer, Failure> {
        let pid = self.described().await?;
        match self.control.send(&request, Some(pid)).await {
            Err(Failure::Restarted { .. }) => {
                self.reload().await?;
                Err(Failure::Restarted { expected: pid, found: pid })
            }
            Err(Failure::NotFound(m)) if m.contains("can't find the target") => {
                self.reload().await?;
                Err(Failure::Restarted { expected: pid, found: pid })
            }
            other => other.map_err(|f| match f {
                Failure::Other(m) => Failure::Other(format!("{iqn}: {m}")),
                f => f,
            }),
        }
    }

    /// Deletes a target from tgtd (closing its sessions), and its accounts unless they are kept.
    pub(super) async fn destroy(&self, target: &TargetState, iqn: &Iqn) -> Result<(), Failure> {
        match self.change(Request::delete_target(target.tid), iqn.as_str()).await {
            Ok(_) | Err(Failure::NotFound(_)) => {}
            Err(f) => return Err(f),
        }
        {
            let mut model = guard(&self.model);
            let epoch = model.touch();
            model.targets.remove(iqn.as_str());
            model.gone.insert(iqn.to_string(), epoch);
        }
        for user in &target.chap_users {
            self.release_account(user, iqn.as_str()).await?;
        }
        Ok(())
    }

    /// Empties the target's ACL (`initiators`, as the model had them): nobody logs in any more.
    pub(super) async fn close_acl(&self, tid: u32, iqn: &Iqn, initiators: &[String]) -> Result<(), Failure> {
        for initiator in initiators {
            match self.change(Request::unbind_initiator(tid, initiator), iqn.as_str()).await {
                Ok(_) | Err(Failure::NotFound(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| t.initiators.retain(|i| i != initiator));
        }
        Ok(())
    }

    /// Puts `initiators` back in the target's ACL (after [`Tgtd::close_acl`]).
    pub(super) async fn open_acl(&self, tid: u32, iqn: &Iqn, initiators: &[String]) -> Result<(), Failure> {
        for initiator in initiators {
            match self.change(Request::bind_initiator(tid, initiator), iqn.as_str()).await {
                Ok(_) | Err(Failure::AlreadyExists(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| {
                if !t.initiators.contains(initiator) {
                    t.initiators.push(initiator.clone());
                }
            });
        }
        Ok(())
    }

    /// Keeps a target for reuse when it has no session: its ACL entries go first (so that nobody
    /// logs in any more), then, if no session is left, its account bindings, and the target stays
    /// with its LUNs, hidden from drivers: with no ACL entry tgtd refuses every login to it
    /// (`ip_acl` and `iqn_acl` in tgt's `usr/iscsi/target.c` admit nobody from an empty list),
    /// so its LUNs reach nobody, and the volume's next export finds them made (a LUN's creation
    /// and deletion start and stop its I/O threads: two of a cycle's dearest changes for tgtd).
    /// A target with sessions is destroyed, which closes them: a session must never outlive its
    /// target's export.
    pub(super) async fn strip(&self, target: &TargetState, iqn: &Iqn) -> Result<(), Failure> {
        let (tid, name) = (target.tid, iqn.as_str());
        self.close_acl(tid, iqn, &target.initiators).await?;
        if self.has_sessions(tid, iqn).await? {
            let now = self.known(iqn).unwrap_or_else(|| target.clone());
            return self.destroy(&now, iqn).await;
        }
        // The sizes tgtd serves, as far as this process knows: a LUN whose store has another
        // size when the target is taken back is opened again then.
        let luns: Vec<_> = {
            let model = guard(&self.model);
            target.luns.iter().map(|(l, p)| (*l, p.clone(), model.served.get(p).copied())).collect()
        };
        // Last first: tgtd mishandles unbinding any other (`unbind_account` in service.rs).
        for user in target.chap_users.iter().rev() {
            match self.change(Request::unbind_account(tid, user), name).await {
                Ok(_) | Err(Failure::NotFound(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| t.chap_users.retain(|u| u != user));
            self.release_account(user, name).await?;
        }
        {
            let mut model = guard(&self.model);
            let epoch = model.touch();
            model.targets.remove(name);
            model.gone.insert(name.to_string(), epoch);
            model.kept.insert(name.to_string(), Kept::new(tid, luns));
        }
        self.note_kept(name, Some(tid));
        Ok(())
    }

    /// Creates an account (replacing one of that name whose secret this process does not know:
    /// tgtd never shows secrets).
    ///
    /// The account is known to this process before tgtd has it: the sweep deletes unbound
    /// accounts this process does not know, and one that ran between the creation and the bind
    /// would delete the new account under the bind's feet.
    pub(super) async fn create_account(
        &self,
        credentials: &ChapCredentials,
        iqn: &str,
    ) -> Result<(), Failure> {
        let (user, secret) = (credentials.user.as_str(), credentials.secret.expose());
        let created = async {
            match self.change(Request::new_account(user, secret), iqn).await {
                Ok(_) => {
                    crate::failpoint::hit("tgt.account-created").await;
                    Ok(())
                }
                Err(Failure::AlreadyExists(_)) => {
                    self.account_delete(user, iqn).await?;
                    self.accounts.remember(credentials);
                    self.change(Request::new_account(user, secret), iqn).await.map(drop)
                }
                Err(f) => Err(f),
            }
        };
        self.accounts.remember(credentials);
        let result = created.await;
        if result.is_err() {
            self.accounts.forget(user);
        }
        result
    }

    /// Makes a per-initiator account (`initiators.rs`), or finds it made: its name is derived with
    /// the key its secret is derived with, so an account of that name has that secret (and one
    /// bound to other targets must not be deleted to make it again, as `create_account` would).
    pub(super) async fn ensure_account(
        &self,
        credentials: &ChapCredentials,
        iqn: &str,
    ) -> Result<(), Failure> {
        let (user, secret) = (credentials.user.as_str(), credentials.secret.expose());
        self.accounts.remember(credentials);
        match self.change(Request::new_account(user, secret), iqn).await {
            Ok(_) | Err(Failure::AlreadyExists(_)) => Ok(()),
            Err(f) => {
                self.accounts.forget(user);
                Err(f)
            }
        }
    }

    /// An account no target of this service needs any more: kept unbound for reuse, or deleted.
    /// A per-initiator account is kept (for [`INITIATOR_ACCOUNTS_KEPT`]): its initiator will
    /// likely attach again, and each deletion costs tgtd a walk of every target. It is marked kept
    /// whether other targets still bind it or not (the sweep deletes only what no target binds,
    /// and counts from the last release): asking would look at every target at every detach
    /// (14 % of Berth's CPU in the attach cycle with 10,000 targets).
    pub(super) async fn release_account(&self, user: &str, iqn: &str) -> Result<(), Failure> {
        if is_initiator_account(user) {
            self.accounts.keep(user);
            return Ok(());
        }
        if self.bound_elsewhere(user, &Iqn::parse(iqn).map_err(|e| Failure::Other(e.to_string()))?) {
            return Ok(());
        }
        // Kept only when the operator asked for it (a driver that reuses its credentials): an
        // account left for a sweep that runs every reconcile pass, within a budget, piles up under
        // a steady attach cycle (thousands within minutes), and tgtd's account creation is
        // quadratic in the accounts it holds.
        if self.cfg.keep_exports.is_zero() || self.cfg.keep_accounts.is_zero() || !self.accounts.made(user) {
            return self.account_delete(user, iqn).await;
        }
        self.accounts.keep(user);
        Ok(())
    }

    /// Deletes a LUN of target `tid` (named `iqn`); one already gone is not an error.
    pub(super) async fn delete_lun(&self, tid: u32, lun: u32, iqn: &str) -> Result<(), Failure> {
        match self.change(Request::delete_lun(tid, lun), iqn).await {
            Ok(_) | Err(Failure::NotFound(_)) => Ok(()),
            Err(f) => Err(f),
        }
    }

    /// Deletes a kept target for real (its LUNs with it).
    pub(super) async fn delete_kept(&self, iqn: &str, tid: u32) -> Result<(), Failure> {
        match self.change(Request::delete_target(tid), iqn).await {
            Ok(_) | Err(Failure::NotFound(_)) => {}
            Err(f) => return Err(f),
        }
        {
            // Gone: a listing requested before does not bring it back.
            let mut model = guard(&self.model);
            let epoch = model.touch();
            model.kept.remove(iqn);
            model.gone.insert(iqn.to_string(), epoch);
        }
        self.note_kept(iqn, None);
        Ok(())
    }

    /// Makes room for a new LUN at the ceiling: deletes the LUNs of kept targets, the longest
    /// kept first, until the LUN is admitted or no kept target has one. The targets stay kept,
    /// bare (a target's deletion costs tgtd a walk of every target; a LUN's does not).
    pub(super) async fn evict_kept(&self, admitted: impl Fn() -> bool) -> Result<(), Failure> {
        while !admitted() {
            let oldest = guard(&self.model)
                .kept
                .iter()
                .filter(|(_, k)| !k.luns.is_empty())
                .min_by_key(|(_, k)| k.since)
                .map(|(iqn, k)| (iqn.clone(), k.tid, k.luns.clone()));
            let Some((iqn, tid, luns)) = oldest else { break };
            for (lun, _, _) in &luns {
                self.delete_lun(tid, *lun, &iqn).await?;
                if let Some(k) = guard(&self.model).kept.get_mut(&iqn) {
                    k.luns.retain(|(l, _, _)| l != lun);
                }
            }
            tracing::info!(target_iqn = %iqn, "the LUN of a kept target was deleted to make room for a new one");
        }
        Ok(())
    }

    /// Deletes a target kept longer than `keep_exports`, accounts kept longer than
    /// `keep_accounts` (per-initiator accounts: [`INITIATOR_ACCOUNTS_KEPT`], those of an earlier
    /// run counted from the first sweep that sees them), and other unbound accounts this process
    /// does not know. Each deletion costs tgtd O(targets²), during which it serves nobody: one
    /// target per call, and accounts for at most [`SWEEP_BUDGET`] of tgtd's time (at least one),
    /// so that the sweep keeps up with accounts released by every detach on a small tgtd and
    /// stays short on a large one. Returns how many it deleted.
    pub async fn sweep(&self) -> Result<usize, TargetError> {
        self.fresh().await.map_err(|f| f.into_error("sweep accounts"))?;
        let started = std::time::Instant::now();
        let expired: Vec<String> = self
            .accounts
            .kept_for(self.cfg.keep_accounts)
            .into_iter()
            .filter(|u| !is_initiator_account(u))
            .chain(
                self.accounts
                    .kept_for(INITIATOR_ACCOUNTS_KEPT)
                    .into_iter()
                    .filter(|u| is_initiator_account(u)),
            )
            .collect();
        let bound: BTreeSet<String> =
            guard(&self.model).targets.values().flat_map(|k| k.state.chap_users.clone()).collect();
        let mut unknown = Vec::new();
        for user in self.accounts().await? {
            if bound.contains(&user) || self.accounts.made(&user) {
                continue;
            }
            // A per-initiator account an earlier run made is this run's too (the next grant for its
            // initiator names it again): kept like one released now, not deleted at the first
            // pass after a restart (each deletion costs tgtd a walk of every target).
            if is_initiator_account(&user) {
                self.accounts.adopt(&user);
            } else {
                unknown.push(user);
            }
        }
        let mut deleted = 0;
        // A kept target's deletion is the expensive one: one per sweep.
        let expired_target = guard(&self.model)
            .kept
            .iter()
            .find(|(_, k)| k.since.elapsed() >= self.cfg.keep_exports)
            .map(|(iqn, k)| (iqn.clone(), k.tid));
        if let Some((iqn, tid)) = expired_target {
            self.delete_kept(&iqn, tid).await.map_err(|f| f.into_error("delete a kept target"))?;
            tracing::info!(target_iqn = %iqn, "deleted a target kept unused");
            deleted += 1;
        }
        for user in expired.into_iter().chain(unknown) {
            if deleted > 0 && started.elapsed() >= SWEEP_BUDGET {
                break;
            }
            if bound.contains(&user) {
                self.accounts.unkeep(&user);
                continue;
            }
            self.account_delete(&user, "").await.map_err(|f| f.into_error("delete account"))?;
            tracing::info!("deleted a CHAP account no target uses any more");
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Whether another known target has this account bound.
    pub(super) fn bound_elsewhere(&self, user: &str, iqn: &Iqn) -> bool {
        guard(&self.model)
            .targets
            .values()
            .any(|k| k.state.iqn != iqn.as_str() && k.state.chap_users.iter().any(|u| u == user))
    }

    pub(super) fn check_backing_path(&self, path: &str) -> Result<(), TargetError> {
        let p = Path::new(path);
        let inside = p.is_absolute()
            && p.starts_with(&self.cfg.backing_dir)
            && p.components()
                .all(|c| matches!(c, std::path::Component::RootDir | std::path::Component::Normal(_)))
            && path.bytes().all(|b| b.is_ascii_graphic() && b != b',');
        if !inside {
            return Err(TargetError::InvalidArgument(format!(
                "backing store path is not inside {}",
                self.cfg.backing_dir.display()
            )));
        }
        Ok(())
    }
}

/// Whether process `pid` has a TCP socket listening on `port` (IPv4 or IPv6, any address): a
/// listening socket's inode in `/proc/net/tcp*`, among the process's descriptors.
/// The size of a store (a regular file), if it is one.
pub(super) fn store_size(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().filter(std::fs::Metadata::is_file).map(|m| m.len())
}

pub fn listens_on(pid: i32, port: u16) -> bool {
    let inodes: Vec<String> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    let (address, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
                    let listening =
                        *state == "0A" && u16::from_str_radix(address.rsplit_once(':')?.1, 16).ok()? == port;
                    listening.then(|| format!("socket:[{inode}]"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_paths_must_stay_inside_the_directory() {
        let tgtd = Tgtd::new(TgtdConfig::new(0, "/var/lib/berth/volumes"));
        assert!(tgtd.check_backing_path("/var/lib/berth/volumes/volume-1.img").is_ok());
        for bad in [
            "/etc/shadow",
            "/var/lib/berth/volumes/../../../etc/shadow",
            "relative/volume.img",
            "/var/lib/berth/volumes/a b.img",
            "/var/lib/berth/volumes/a,bstype=sg.img",
        ] {
            assert!(tgtd.check_backing_path(bad).is_err(), "{bad}");
        }
    }
}

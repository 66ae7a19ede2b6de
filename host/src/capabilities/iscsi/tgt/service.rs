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
//! removes its LUNs, ACL entries and account bindings (each cheap) and *keeps* the bare target:
//! it exposes nothing and admits nobody, and drivers no longer see it (`show` and `list` leave it
//! out, as if deleted). `create-target` of its name takes it back; `set-chap` with the volume's
//! stored credentials binds its kept account again. [`Tgtd::sweep`] (from the reconciler) really
//! deletes what was kept longer than `keep_exports`, a little at a time, and unbound accounts
//! this process does not know. The kept targets are listed in `state_file`, so that a restarted
//! Berth still knows them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use super::super::{
    ChapCredentials, ChapUser, Iqn, Lun, Portal, Session, TargetError, TargetService, TargetState,
};
use super::protocol::{Answer, Control, Failure, Request, parse_accounts, parse_connections, parse_show};

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
    /// I/O threads per LUN of a tgtd this service starts (`tgtd -t`).
    pub io_threads: u32,
    /// How long a deleted target and its CHAP account stay in tgtd, inert, for reuse (zero: they
    /// are deleted at once). See the module notes.
    pub keep_exports: Duration,
    /// Where the kept targets are listed (none: nowhere; a restart forgets them).
    pub state_file: Option<PathBuf>,
}

impl TgtdConfig {
    pub fn new(control_port: u16, backing_dir: impl Into<PathBuf>) -> Self {
        TgtdConfig {
            tgtd: PathBuf::from("/usr/sbin/tgtd"),
            control_port,
            socket_dir: PathBuf::from("/var/run/tgtd"),
            backing_dir: backing_dir.into(),
            timeout: Duration::from_secs(10),
            io_threads: 4,
            keep_exports: Duration::from_secs(3600),
            state_file: None,
        }
    }

    fn socket_path(&self) -> PathBuf {
        self.socket_dir.join(format!("socket.{}", self.control_port))
    }
}

/// A control socket's identity: (device, inode, creation time in ns). A restarted tgtd binds a
/// new socket (the inode number may be reused; the creation time is not).
type SocketId = (u64, u64, i128);

/// The tgtd a model describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Daemon {
    pid: i32,
    socket: SocketId,
}

/// What this process knows of one tgtd's targets. Local changes are stamped with an epoch, so
/// that a listing requested before them (by the reconciler, say, while a change of another
/// target is under way) does not undo them when it is installed.
#[derive(Default)]
struct Model {
    daemon: Option<Daemon>,
    targets: HashMap<String, Known>,
    /// Targets deleted by this process, at which epoch.
    gone: HashMap<String, u64>,
    /// Target ids being created.
    reserved: BTreeSet<u32>,
    /// Targets kept inert after a `delete-target`, hidden from drivers: name -> (tid, since).
    kept: HashMap<String, (u32, std::time::Instant)>,
    /// The kept targets were loaded from the state file (once per process).
    kept_loaded: bool,
    /// Counts local changes.
    epoch: u64,
}

struct Known {
    state: TargetState,
    /// The epoch of the last local change (0: as listed).
    changed: u64,
}

impl Model {
    /// The next id after the highest in use, kept or being created.
    fn next_tid(&self) -> u32 {
        let listed = self.targets.values().map(|k| k.state.tid).max().unwrap_or(0);
        let kept = self.kept.values().map(|(t, _)| *t).max().unwrap_or(0);
        listed.max(kept).max(self.reserved.last().copied().unwrap_or(0)) + 1
    }

    fn touch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }
}

/// tgtd, reached over its control socket.
pub struct Tgtd {
    cfg: TgtdConfig,
    control: Control,
    model: Mutex<Model>,
    /// One reload of the model at a time.
    reloading: AsyncMutex<()>,
    /// One change at a time per target; different targets change in parallel.
    locks: Mutex<HashMap<String, Weak<AsyncMutex<()>>>>,
    /// sha256 of the secret of each CHAP account this process created, so that repeating
    /// `set-chap` with the same credentials changes nothing.
    accounts: Mutex<HashMap<String, [u8; 32]>>,
    /// Accounts kept unbound since their target was deleted, and since when.
    kept: Mutex<HashMap<String, std::time::Instant>>,
    /// Changes sent to tgtd, and listings of all its targets (for tests and benchmarks).
    changes: AtomicU64,
    listings: AtomicU64,
}

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
fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Failure {
    fn into_error(self, what: &str) -> TargetError {
        match self {
            Failure::AlreadyExists(m) | Failure::Other(m) => TargetError::Failed(format!("{what}: {m}")),
            Failure::NotFound(m) => TargetError::NotFound(format!("{what}: {m}")),
            Failure::Timeout => TargetError::Timeout(format!("{what}: tgtd did not answer in time")),
            Failure::Restarted { .. } => {
                TargetError::Failed(format!("{what}: tgtd restarted during the change"))
            }
        }
    }
}

impl Tgtd {
    pub fn new(cfg: TgtdConfig) -> Self {
        let control = Control { socket: cfg.socket_path(), timeout: cfg.timeout };
        Tgtd {
            cfg,
            control,
            model: Mutex::default(),
            reloading: AsyncMutex::new(()),
            locks: Mutex::default(),
            accounts: Mutex::default(),
            kept: Mutex::default(),
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

    /// Starts tgtd on `portal` (loopback or as configured) if it does not answer, and waits until
    /// it does. Returns whether it had to start one. The daemon outlives this process, as a
    /// system tgtd would; its targets are re-created by Berth's reconciliation anyway.
    pub async fn ensure_running(&self, portal: &Portal) -> Result<bool, TargetError> {
        if self.is_running().await {
            return Ok(false);
        }
        let portal_arg = if portal.address.contains(':') {
            format!("portal=[{}]:{}", portal.address, portal.port)
        } else {
            format!("portal={}:{}", portal.address, portal.port)
        };
        // tgtd daemonises itself; its stale socket from an earlier run would make it fail.
        let _ = std::fs::remove_file(self.cfg.socket_path());
        let _ =
            std::fs::remove_file(self.cfg.socket_dir.join(format!("socket.{}.lock", self.cfg.control_port)));
        let status = tokio::process::Command::new(&self.cfg.tgtd)
            .args(["-C", &self.cfg.control_port.to_string(), "-t", &self.cfg.io_threads.max(1).to_string()])
            .args(["--iscsi", &portal_arg])
            .env_clear()
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
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(TargetError::Timeout("tgtd did not start answering within 5 s".into()))
    }

    /// The control socket's identity, or `None` when it is not there.
    fn socket_id(&self) -> Option<SocketId> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.control.socket.as_path())
            .ok()
            .map(|m| (m.dev(), m.ino(), i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec())))
    }

    /// The daemon the model describes, reloading the model first when tgtd changed (or it was
    /// never loaded).
    async fn fresh(&self) -> Result<i32, Failure> {
        let daemon = guard(&self.model).daemon;
        match daemon {
            Some(d) if self.socket_id() == Some(d.socket) => Ok(d.pid),
            _ => self.reload().await,
        }
    }

    /// Loads the model from one listing of tgtd's targets.
    async fn reload(&self) -> Result<i32, Failure> {
        let _one = self.reloading.lock().await;
        Ok(self.listing().await?.1)
    }

    /// Lists tgtd's targets and installs the listing in the model; returns it with the daemon.
    async fn listing(&self) -> Result<(Vec<TargetState>, i32), Failure> {
        let since = guard(&self.model).epoch;
        let socket = self.socket_id();
        let answer = self.control.send(&Request::show_targets(), None).await?;
        self.listings.fetch_add(1, Ordering::Relaxed);
        let targets = parse_show(&answer.text);
        self.install(&targets, answer.daemon, socket, since);
        let visible = {
            let model = guard(&self.model);
            targets.into_iter().filter(|t| !model.kept.contains_key(&t.iqn)).collect()
        };
        Ok((visible, answer.daemon))
    }

    /// Installs a listing requested when the model was at epoch `since`: what this process
    /// changed since then stays as it is in the model.
    fn install(&self, listed: &[TargetState], pid: i32, socket: Option<SocketId>, since: u64) {
        let mut model = guard(&self.model);
        let same_daemon = model.daemon.is_some_and(|d| d.pid == pid);
        if model.daemon.is_some() && !same_daemon {
            tracing::warn!(pid, "tgtd was restarted; reloaded its targets");
        }
        if !same_daemon {
            // A new daemon has none of the accounts this process made.
            guard(&self.accounts).clear();
            guard(&self.kept).clear();
        }
        // Kept targets stay hidden while tgtd still has them, bare; a new daemon has none. At the
        // first listing of this process, the state file says which bare targets were kept.
        if !model.kept_loaded {
            model.kept_loaded = true;
            for (iqn, tid) in self.load_kept() {
                model.kept.insert(iqn, (tid, std::time::Instant::now()));
            }
        } else if !same_daemon {
            model.kept.clear();
        }
        let bare = |t: &TargetState| t.luns.is_empty() && t.initiators.is_empty() && t.chap_users.is_empty();
        let listed_kept: HashMap<&str, &TargetState> = listed
            .iter()
            .filter(|t| model.kept.get(&t.iqn).is_some_and(|(tid, _)| *tid == t.tid) && bare(t))
            .map(|t| (t.iqn.as_str(), t))
            .collect();
        model.kept.retain(|iqn, _| listed_kept.contains_key(iqn.as_str()));
        let mut targets: HashMap<String, Known> = listed
            .iter()
            .filter(|t| !listed_kept.contains_key(t.iqn.as_str()))
            .map(|t| (t.iqn.clone(), Known { state: t.clone(), changed: 0 }))
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
        model.daemon = socket.map(|socket| Daemon { pid, socket });
    }

    /// The kept targets the state file lists: (name, tid).
    fn load_kept(&self) -> Vec<(String, u32)> {
        let Some(path) = &self.cfg.state_file else { return Vec::new() };
        let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
        serde_json::from_str::<HashMap<String, u32>>(&text)
            .map(|m| m.into_iter().collect())
            .unwrap_or_default()
    }

    /// Writes the kept targets to the state file (atomically; not synced: a file lost in a power
    /// failure only leaves bare targets that the drift report names).
    fn save_kept(&self) {
        let Some(path) = &self.cfg.state_file else { return };
        let kept: HashMap<String, u32> =
            guard(&self.model).kept.iter().map(|(iqn, (tid, _))| (iqn.clone(), *tid)).collect();
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, serde_json::to_vec(&kept).expect("a map serialises"))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::warn!("cannot write {}: {e}", path.display());
        }
    }

    /// Sends a change to the daemon the model describes. A restarted daemon gets nothing: the
    /// model is reloaded and the caller starts its operation again.
    async fn change(&self, request: Request, iqn: &str) -> Result<Answer, Failure> {
        let pid = self.fresh().await?;
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

    fn known(&self, iqn: &Iqn) -> Option<TargetState> {
        guard(&self.model).targets.get(iqn.as_str()).map(|k| k.state.clone())
    }

    fn require(&self, iqn: &Iqn) -> Result<TargetState, Failure> {
        self.known(iqn).ok_or_else(|| Failure::NotFound(format!("can't find the target {iqn}")))
    }

    /// Records a change this process made to a target.
    fn update(&self, iqn: &Iqn, f: impl FnOnce(&mut TargetState)) {
        let mut model = guard(&self.model);
        let epoch = model.touch();
        if let Some(known) = model.targets.get_mut(iqn.as_str()) {
            f(&mut known.state);
            known.changed = epoch;
        }
    }

    async fn lock(&self, iqn: &Iqn) -> OwnedMutexGuard<()> {
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

    async fn account_delete(&self, user: &str, iqn: &str) -> Result<(), Failure> {
        match self.change(Request::delete_account(user), iqn).await {
            Ok(_) | Err(Failure::NotFound(_)) => {
                guard(&self.accounts).remove(user);
                guard(&self.kept).remove(user);
                Ok(())
            }
            Err(f) => Err(f),
        }
    }

    /// A kept target of that name, taken back (bare) into the targets drivers see.
    fn take_back(&self, iqn: &Iqn) -> Option<TargetState> {
        let state = {
            let mut model = guard(&self.model);
            let (tid, _) = model.kept.remove(iqn.as_str())?;
            let state = TargetState { iqn: iqn.to_string(), tid, ..Default::default() };
            let changed = model.touch();
            model.gone.remove(iqn.as_str());
            model.targets.insert(iqn.to_string(), Known { state: state.clone(), changed });
            state
        };
        self.save_kept();
        Some(state)
    }

    /// Closes every connection of `initiator` on the target and checks that none is left (tgtd
    /// closes a connection from its event loop, so the check is repeated for a while). Answers
    /// how many sessions it found open.
    async fn end_sessions(&self, tid: u32, iqn: &Iqn, initiator: &Iqn) -> Result<u32, Failure> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut ended = BTreeSet::new();
        loop {
            let answer = self.change_read(Request::show_connections(tid), iqn.as_str()).await?;
            let mine: Vec<_> = parse_connections(&answer.text)
                .into_iter()
                .filter(|c| c.initiator == initiator.as_str())
                .collect();
            if mine.is_empty() {
                return Ok(ended.len() as u32);
            }
            ended.extend(mine.iter().map(|c| c.sid));
            if std::time::Instant::now() > deadline {
                return Err(Failure::Other(format!(
                    "{} session(s) of {initiator} on {iqn} are still open after being closed",
                    mine.len()
                )));
            }
            for c in &mine {
                match self.change(Request::delete_connection(tid, c.sid, c.cid), iqn.as_str()).await {
                    Ok(_) | Err(Failure::NotFound(_)) => {}
                    Err(f) => return Err(f),
                }
            }
            tracing::info!(target = %iqn, %initiator, connections = mine.len(), "closed a denied initiator's connections");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the target has iSCSI sessions now (asked of tgtd, not of the model).
    async fn has_sessions(&self, tid: u32, iqn: &Iqn) -> Result<bool, Failure> {
        let answer = self.change_read(Request::show_connections(tid), iqn.as_str()).await?;
        Ok(answer.text.lines().any(|l| l.trim_start().starts_with("Session:")))
    }

    /// A read that must reach the daemon the model describes.
    async fn change_read(&self, request: Request, iqn: &str) -> Result<Answer, Failure> {
        let pid = self.fresh().await?;
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
    async fn destroy(&self, target: &TargetState, iqn: &Iqn) -> Result<(), Failure> {
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

    /// Keeps a target for reuse when it has no session: its ACL entries go first (so that nobody
    /// logs in any more), then, if no session is left, its LUNs and account bindings (each cheap
    /// for tgtd), and the bare target stays, hidden from drivers. A target with sessions is
    /// destroyed, which closes them: a session must never outlive its target's export.
    async fn strip(&self, target: &TargetState, iqn: &Iqn) -> Result<(), Failure> {
        let (tid, name) = (target.tid, iqn.as_str());
        for initiator in &target.initiators {
            match self.change(Request::unbind_initiator(tid, initiator), name).await {
                Ok(_) | Err(Failure::NotFound(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| t.initiators.retain(|i| i != initiator));
        }
        if self.has_sessions(tid, iqn).await? {
            let now = self.known(iqn).unwrap_or_else(|| target.clone());
            return self.destroy(&now, iqn).await;
        }
        for (lun, _) in &target.luns {
            match self.change(Request::delete_lun(tid, *lun), name).await {
                Ok(_) | Err(Failure::NotFound(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| t.luns.retain(|(l, _)| l != lun));
        }
        for user in &target.chap_users {
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
            model.kept.insert(name.to_string(), (tid, std::time::Instant::now()));
        }
        self.save_kept();
        Ok(())
    }

    /// Creates an account (replacing one of that name whose secret this process does not know:
    /// tgtd never shows secrets).
    ///
    /// The account is known to this process before tgtd has it: the sweep deletes unbound
    /// accounts this process does not know, and one that ran between the creation and the bind
    /// would delete the new account under the bind's feet.
    async fn create_account(&self, credentials: &ChapCredentials, iqn: &str) -> Result<(), Failure> {
        let (user, secret) = (credentials.user.as_str(), credentials.secret.expose());
        let created = async {
            match self.change(Request::new_account(user, secret), iqn).await {
                Ok(_) => {
                    crate::failpoint::hit("tgt.account-created");
                    Ok(())
                }
                Err(Failure::AlreadyExists(_)) => {
                    self.account_delete(user, iqn).await?;
                    self.remember(credentials);
                    self.change(Request::new_account(user, secret), iqn).await.map(drop)
                }
                Err(f) => Err(f),
            }
        };
        self.remember(credentials);
        let result = created.await;
        if result.is_err() {
            guard(&self.accounts).remove(user);
        }
        result
    }

    /// An account no target of this service needs any more: kept unbound for reuse, or deleted.
    async fn release_account(&self, user: &str, iqn: &str) -> Result<(), Failure> {
        if self.bound_elsewhere(user, &Iqn::parse(iqn).map_err(|e| Failure::Other(e.to_string()))?) {
            return Ok(());
        }
        if self.cfg.keep_exports.is_zero() || !guard(&self.accounts).contains_key(user) {
            return self.account_delete(user, iqn).await;
        }
        guard(&self.kept).insert(user.to_string(), std::time::Instant::now());
        Ok(())
    }

    /// Deletes a target and accounts kept longer than `keep_exports`, and unbound accounts this
    /// process does not know, a few per call (each deletion costs tgtd O(targets²)). Returns how
    /// many it deleted.
    pub async fn sweep(&self) -> Result<usize, TargetError> {
        const AT_MOST: usize = 4;
        self.fresh().await.map_err(|f| f.into_error("sweep accounts"))?;
        let expired: Vec<String> = guard(&self.kept)
            .iter()
            .filter(|(_, since)| since.elapsed() >= self.cfg.keep_exports)
            .map(|(u, _)| u.clone())
            .collect();
        let bound: BTreeSet<String> =
            guard(&self.model).targets.values().flat_map(|k| k.state.chap_users.clone()).collect();
        let unknown: Vec<String> = self
            .accounts()
            .await?
            .into_iter()
            .filter(|u| !bound.contains(u) && !guard(&self.accounts).contains_key(u))
            .collect();
        let mut deleted = 0;
        // A kept target's deletion is the expensive one: one per sweep.
        let expired_target = guard(&self.model)
            .kept
            .iter()
            .find(|(_, (_, since))| since.elapsed() >= self.cfg.keep_exports)
            .map(|(iqn, (tid, _))| (iqn.clone(), *tid));
        if let Some((iqn, tid)) = expired_target {
            match self.change(Request::delete_target(tid), &iqn).await {
                Ok(_) | Err(Failure::NotFound(_)) => {}
                Err(f) => return Err(f.into_error("delete a kept target")),
            }
            guard(&self.model).kept.remove(&iqn);
            self.save_kept();
            tracing::info!(target_iqn = %iqn, "deleted a target kept unused");
            deleted += 1;
        }
        for user in expired.into_iter().chain(unknown).take(AT_MOST) {
            if bound.contains(&user) {
                guard(&self.kept).remove(&user);
                continue;
            }
            self.account_delete(&user, "").await.map_err(|f| f.into_error("delete account"))?;
            tracing::info!("deleted a CHAP account no target uses any more");
            deleted += 1;
        }
        Ok(deleted)
    }

    fn remember(&self, credentials: &ChapCredentials) {
        let digest: [u8; 32] = Sha256::digest(credentials.secret.expose().as_bytes()).into();
        guard(&self.accounts).insert(credentials.user.as_str().to_string(), digest);
    }

    fn knows(&self, credentials: &ChapCredentials) -> bool {
        let digest: [u8; 32] = Sha256::digest(credentials.secret.expose().as_bytes()).into();
        guard(&self.accounts).get(credentials.user.as_str()).is_some_and(|d| *d == digest)
    }

    /// Whether another known target has this account bound.
    fn bound_elsewhere(&self, user: &str, iqn: &Iqn) -> bool {
        guard(&self.model)
            .targets
            .values()
            .any(|k| k.state.iqn != iqn.as_str() && k.state.chap_users.iter().any(|u| u == user))
    }

    fn check_backing_path(&self, path: &str) -> Result<(), TargetError> {
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

#[async_trait]
impl TargetService for Tgtd {
    async fn show(&self, iqn: &Iqn) -> Result<Option<TargetState>, TargetError> {
        self.fresh().await.map_err(|f| f.into_error("show target"))?;
        Ok(self.known(iqn))
    }

    async fn create_target(&self, iqn: &Iqn) -> Result<TargetState, TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("create target", async {
            for _ in 0..8 {
                self.fresh().await?;
                if let Some(existing) = self.known(iqn) {
                    return Ok(existing);
                }
                if let Some(taken) = self.take_back(iqn) {
                    return Ok(taken);
                }
                // The next id after the highest in use: a target deleted and created again gets
                // its id back, and targets created at the same time get different ones.
                let tid = {
                    let mut model = guard(&self.model);
                    let tid = model.next_tid();
                    model.reserved.insert(tid);
                    tid
                };
                let created = self.change(Request::new_target(tid, iqn.as_str()), iqn.as_str()).await;
                let state = TargetState { iqn: iqn.to_string(), tid, ..Default::default() };
                {
                    let mut model = guard(&self.model);
                    model.reserved.remove(&tid);
                    if created.is_ok() {
                        let changed = model.touch();
                        model.gone.remove(iqn.as_str());
                        model.targets.insert(iqn.to_string(), Known { state: state.clone(), changed });
                    }
                }
                match created {
                    Ok(_) => return Ok(state),
                    // The id or the name is taken by a target the model did not know of.
                    Err(Failure::AlreadyExists(_)) => {
                        self.reload().await?;
                    }
                    Err(f) => return Err(f),
                }
            }
            Err(Failure::Other("no free target id found".into()))
        })
    }

    async fn delete_target(&self, iqn: &Iqn) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("delete target", async {
            self.fresh().await?;
            // Deleting a kept target again (a volume's deletion after its export was kept)
            // deletes it for real.
            let kept = guard(&self.model).kept.get(iqn.as_str()).map(|(tid, _)| *tid);
            if let Some(tid) = kept {
                let bare = TargetState { iqn: iqn.to_string(), tid, ..Default::default() };
                guard(&self.model).kept.remove(iqn.as_str());
                self.save_kept();
                return self.destroy(&bare, iqn).await;
            }
            let Some(target) = self.known(iqn) else { return Ok(()) };
            if self.cfg.keep_exports.is_zero() {
                return self.destroy(&target, iqn).await;
            }
            self.strip(&target, iqn).await
        })
    }

    async fn add_lun(&self, iqn: &Iqn, lun: Lun, path: &str) -> Result<(), TargetError> {
        self.check_backing_path(path)?;
        let _one = self.lock(iqn).await;
        retrying!("add LUN", async {
            self.fresh().await?;
            let target = self.require(iqn)?;
            match target.luns.iter().find(|(l, _)| *l == lun.get()) {
                Some((_, p)) if p == path => return Ok(()),
                Some((_, p)) => {
                    return Err(Failure::Other(format!("LUN {} of {iqn} already exposes {p}", lun.get())));
                }
                None => {}
            }
            match self.change(Request::new_lun(target.tid, lun.get(), path), iqn.as_str()).await {
                Ok(_) => {}
                // A LUN the model did not know of: look again.
                Err(Failure::AlreadyExists(_)) => {
                    self.reload().await?;
                    return match self.require(iqn)?.luns.iter().find(|(l, _)| *l == lun.get()) {
                        Some((_, p)) if p == path => Ok(()),
                        _ => Err(Failure::Other(format!("LUN {} of {iqn} exposes another store", lun.get()))),
                    };
                }
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| {
                if !t.luns.iter().any(|(l, _)| *l == lun.get()) {
                    t.luns.push((lun.get(), path.to_string()));
                }
            });
            Ok(())
        })
    }

    async fn remove_lun(&self, iqn: &Iqn, lun: Lun) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("remove LUN", async {
            self.fresh().await?;
            let Some(target) = self.known(iqn) else { return Ok(()) };
            if !target.luns.iter().any(|(l, _)| *l == lun.get()) {
                return Ok(());
            }
            match self.change(Request::delete_lun(target.tid, lun.get()), iqn.as_str()).await {
                Ok(_) | Err(Failure::NotFound(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| t.luns.retain(|(l, _)| *l != lun.get()));
            Ok(())
        })
    }

    async fn allow_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("allow initiator", async {
            self.fresh().await?;
            let target = self.require(iqn)?;
            if target.initiators.iter().any(|i| i == initiator.as_str()) {
                return Ok(());
            }
            match self.change(Request::bind_initiator(target.tid, initiator.as_str()), iqn.as_str()).await {
                Ok(_) | Err(Failure::AlreadyExists(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| {
                if !t.initiators.iter().any(|i| i == initiator.as_str()) {
                    t.initiators.push(initiator.to_string());
                }
            });
            Ok(())
        })
    }

    async fn deny_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("deny initiator", async {
            self.fresh().await?;
            let Some(target) = self.known(iqn) else { return Ok(()) };
            if !target.initiators.iter().any(|i| i == initiator.as_str()) {
                return Ok(());
            }
            match self.change(Request::unbind_initiator(target.tid, initiator.as_str()), iqn.as_str()).await {
                Ok(_) | Err(Failure::NotFound(_)) => {}
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| t.initiators.retain(|i| i != initiator.as_str()));
            Ok(())
        })
    }

    async fn sessions(&self, iqn: &Iqn) -> Result<Vec<Session>, TargetError> {
        retrying!("list sessions", async {
            self.fresh().await?;
            let Some(target) = self.known(iqn) else { return Ok(Vec::new()) };
            let answer = self.change_read(Request::show_connections(target.tid), iqn.as_str()).await?;
            let mut sessions: BTreeMap<u64, Session> = BTreeMap::new();
            for c in parse_connections(&answer.text) {
                let s = sessions
                    .entry(c.sid)
                    .or_insert_with(|| Session { initiator: c.initiator.clone(), addresses: Vec::new() });
                s.addresses.extend(c.address);
            }
            Ok(sessions.into_values().collect())
        })
    }

    async fn close_sessions(&self, iqn: &Iqn, initiator: &Iqn) -> Result<u32, TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("close the initiator's sessions", async {
            self.fresh().await?;
            let Some(target) = self.known(iqn) else { return Ok(0) };
            self.end_sessions(target.tid, iqn, initiator).await
        })
    }

    /// tgtd 1.0.85 corrupts its account list (and crashes on the next `show`) when an account
    /// that is not the last one bound to a target is unbound or deleted. So a target never has
    /// more than one account bound here: the old one goes before the new one comes, and while none
    /// is bound the ACL is empty, so that nobody logs in without CHAP. Sessions already logged in
    /// are not affected. If a step fails the ACL stays empty (closed) until the call is retried.
    async fn set_chap(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("set CHAP", async {
            self.fresh().await?;
            let target = self.require(iqn)?;
            let user = credentials.user.as_str();
            if target.chap_users == [user] && self.knows(credentials) {
                return Ok(());
            }
            let (tid, name) = (target.tid, iqn.as_str());
            for initiator in &target.initiators {
                match self.change(Request::unbind_initiator(tid, initiator), name).await {
                    Ok(_) | Err(Failure::NotFound(_)) => {}
                    Err(f) => return Err(f),
                }
                self.update(iqn, |t| t.initiators.retain(|i| i != initiator));
            }
            for old in target.chap_users.iter().rev() {
                match self.change(Request::unbind_account(tid, old), name).await {
                    Ok(_) | Err(Failure::NotFound(_)) => {}
                    Err(f) => return Err(f),
                }
                self.update(iqn, |t| t.chap_users.retain(|u| u != old));
                self.release_account(old, name).await?;
            }
            // An account kept from this volume's earlier export (or bound to another target)
            // with these very credentials is bound again; otherwise it is made.
            let reuse = self.knows(credentials);
            if !reuse {
                self.create_account(credentials, name).await?;
            }
            guard(&self.kept).remove(user);
            match self.change(Request::bind_account(tid, user), name).await {
                Ok(_) | Err(Failure::AlreadyExists(_)) => {}
                // The kept account is gone (deleted by someone else): make it again.
                Err(Failure::NotFound(_)) if reuse => {
                    self.create_account(credentials, name).await?;
                    self.change(Request::bind_account(tid, user), name).await?;
                }
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| t.chap_users = vec![user.to_string()]);
            for initiator in &target.initiators {
                match self.change(Request::bind_initiator(tid, initiator), name).await {
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
        })
    }

    async fn sweep(&self) -> Result<usize, TargetError> {
        Tgtd::sweep(self).await
    }

    /// Every target, as tgtd lists them now; the model is reloaded from the same listing.
    async fn list(&self) -> Result<Vec<TargetState>, TargetError> {
        Ok(self.listing().await.map_err(|f| f.into_error("show targets"))?.0)
    }

    /// From the model: no listing per call.
    async fn account_targets(&self, user: &ChapUser) -> Result<Vec<String>, TargetError> {
        self.fresh().await.map_err(|f| f.into_error("show targets"))?;
        Ok(guard(&self.model)
            .targets
            .values()
            .filter(|k| k.state.chap_users.iter().any(|u| u == user.as_str()))
            .map(|k| k.state.iqn.clone())
            .collect())
    }
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

//! The iSCSI target service on Linux's userspace target daemon, `tgtd`, driven through `tgtadm`.
//!
//! Safety rules (reliability-notes section 4; Cinder's tgt helper broke each of them):
//! - `tgtadm` runs from an absolute path with an argument vector and an empty environment, never
//!   through a shell, and never `tgt-admin` (which runs `system()` on interpolated strings and
//!   treats `#` as a comment).
//! - Every argument is a validated newtype (see `iscsi/mod.rs`) and backing paths must lie inside
//!   the configured backing directory.
//! - Every command has a timeout; "already exists" and "can't find" are idempotent outcomes; the
//!   target is shown again after every change to check the result.
//! - Operations act on one target id only: no `--op update` of everything.
//! - CHAP credentials never appear on a command line: `tgtadm --user/--password` would show them
//!   in `/proc/<pid>/cmdline` to every local user, so account operations (create, bind, delete)
//!   send tgtadm's own request messages to tgtd's root-only control socket instead.
//! - Reads (`show`) go through that socket too: a cycle checks tgtd's state after every change,
//!   and a process spawn per check would cost more than all the rest of an attach.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;

use super::{ChapCredentials, Iqn, Lun, Portal, TargetError, TargetService, TargetState};

/// How to reach one tgtd.
#[derive(Debug, Clone)]
pub struct TgtdConfig {
    /// Absolute path of `tgtadm`.
    pub tgtadm: PathBuf,
    /// Absolute path of `tgtd` (used only to start a daemon).
    pub tgtd: PathBuf,
    /// tgtd's control port (`tgtd -C <n>`, `tgtadm -C <n>`); 0 is the system default.
    pub control_port: u16,
    /// Where tgtd puts its control socket (`/var/run/tgtd`).
    pub socket_dir: PathBuf,
    /// Backing files must lie inside this directory.
    pub backing_dir: PathBuf,
    /// Timeout of one command.
    pub timeout: Duration,
}

impl TgtdConfig {
    pub fn new(control_port: u16, backing_dir: impl Into<PathBuf>) -> Self {
        TgtdConfig {
            tgtadm: PathBuf::from("/usr/sbin/tgtadm"),
            tgtd: PathBuf::from("/usr/sbin/tgtd"),
            control_port,
            socket_dir: PathBuf::from("/var/run/tgtd"),
            backing_dir: backing_dir.into(),
            timeout: Duration::from_secs(10),
        }
    }

    fn socket_path(&self) -> PathBuf {
        self.socket_dir.join(format!("socket.{}", self.control_port))
    }
}

/// A failed tgtadm exchange, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    AlreadyExists(String),
    NotFound(String),
    Timeout,
    Other(String),
}

impl Failure {
    fn classify(message: &str) -> Failure {
        let m = message.trim().trim_start_matches("tgtadm: ").to_string();
        const EXISTS: [&str; 5] = [
            "this target already exists",
            "this logical unit number already exists",
            "this access control rule already exists",
            "this account already exists",
            "this binding already exists",
        ];
        const MISSING: [&str; 5] = [
            "can't find the target",
            "can't find the logical unit",
            "this access control rule does not exist",
            "can't find the account",
            "can't find the binding",
        ];
        if EXISTS.iter().any(|e| m.contains(e)) {
            Failure::AlreadyExists(m)
        } else if MISSING.iter().any(|e| m.contains(e)) {
            Failure::NotFound(m)
        } else {
            Failure::Other(m)
        }
    }

    fn into_error(self, what: &str) -> TargetError {
        match self {
            Failure::AlreadyExists(m) | Failure::Other(m) => TargetError::Failed(format!("{what}: {m}")),
            Failure::NotFound(m) => TargetError::NotFound(format!("{what}: {m}")),
            Failure::Timeout => TargetError::Timeout(format!("{what}: tgtd did not answer in time")),
        }
    }
}

/// tgtd, reached through `tgtadm` and its control socket.
pub struct Tgtd {
    cfg: TgtdConfig,
    /// Serialises changes: choosing a free target id and creating the target must not race.
    changes: Mutex<()>,
    /// sha256 of the secret of each CHAP account this process created, so that repeating
    /// `set-chap` with the same credentials changes nothing.
    accounts: std::sync::Mutex<HashMap<String, [u8; 32]>>,
}

impl Tgtd {
    pub fn new(cfg: TgtdConfig) -> Self {
        Tgtd { cfg, changes: Mutex::new(()), accounts: std::sync::Mutex::new(HashMap::new()) }
    }

    pub fn config(&self) -> &TgtdConfig {
        &self.cfg
    }

    /// Whether tgtd answers on the control port.
    pub async fn is_running(&self) -> bool {
        self.tgtadm(&["--op", "show", "--mode", "sys"]).await.is_ok()
    }

    /// Starts tgtd on `portal` (loopback or as configured) if it does not answer, and waits until
    /// it does. Returns whether it had to start one. The daemon outlives this process, as a
    /// system tgtd would; its targets are re-created by Berth's start-up reconciliation anyway.
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
            .args(["-C", &self.cfg.control_port.to_string(), "--iscsi", &portal_arg])
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

    /// Runs tgtadm with `args` for this daemon's control port.
    async fn tgtadm(&self, args: &[&str]) -> Result<String, Failure> {
        let mut cmd = tokio::process::Command::new(&self.cfg.tgtadm);
        cmd.arg("-C")
            .arg(self.cfg.control_port.to_string())
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| Failure::Other(format!("cannot run tgtadm: {e}")))?;
        let output = match tokio::time::timeout(self.cfg.timeout, child.wait_with_output()).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(Failure::Other(format!("tgtadm failed: {e}"))),
            Err(_) => return Err(Failure::Timeout),
        };
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("no message");
            Err(Failure::classify(first))
        }
    }

    async fn lld(&self, args: &[&str]) -> Result<String, Failure> {
        let mut all = vec!["--lld", "iscsi"];
        all.extend_from_slice(args);
        self.tgtadm(&all).await
    }

    async fn show_all(&self) -> Result<Vec<TargetState>, TargetError> {
        let out =
            self.control(MODE_TARGET, OP_SHOW, -1, "").await.map_err(|f| f.into_error("show targets"))?;
        Ok(parse_show(&out))
    }

    async fn find(&self, iqn: &Iqn) -> Result<Option<TargetState>, TargetError> {
        Ok(self.show_all().await?.into_iter().find(|t| t.iqn == iqn.as_str()))
    }

    async fn require(&self, iqn: &Iqn) -> Result<TargetState, TargetError> {
        self.find(iqn).await?.ok_or_else(|| TargetError::NotFound(format!("can't find the target {iqn}")))
    }

    /// Checks the state after a change.
    async fn verify(
        &self,
        iqn: &Iqn,
        what: &str,
        ok: impl Fn(Option<&TargetState>) -> bool,
    ) -> Result<(), TargetError> {
        let state = self.find(iqn).await?;
        if ok(state.as_ref()) {
            Ok(())
        } else {
            Err(TargetError::Failed(format!("{what}: tgtd reported success but the change is not visible")))
        }
    }

    /// Creates a CHAP account. Sends exactly what `tgtadm --lld iscsi --mode account --op new
    /// --user U --password P` would send.
    async fn account_new(&self, credentials: &ChapCredentials) -> Result<(), Failure> {
        let body = format!("user={},password={}", credentials.user.as_str(), credentials.secret.expose());
        self.control(MODE_ACCOUNT, OP_NEW, -1, &body).await.map(drop)
    }

    /// One request on tgtd's control socket, as `tgtadm` would send it (see `request_header`).
    /// Returns the text of the answer (what `tgtadm` would print).
    async fn control(&self, mode: u32, op: u32, tid: i32, params: &str) -> Result<String, Failure> {
        let body = format!("{params}\0");
        let exchange = async {
            let mut stream = tokio::net::UnixStream::connect(self.cfg.socket_path())
                .await
                .map_err(|e| Failure::Other(format!("cannot connect to tgtd's control socket: {e}")))?;
            let request = request_header(mode, op, tid, body.len());
            stream.write_all(&request).await.map_err(|e| Failure::Other(format!("write to tgtd: {e}")))?;
            stream
                .write_all(body.as_bytes())
                .await
                .map_err(|e| Failure::Other(format!("write to tgtd: {e}")))?;
            let mut rsp = [0u8; 8];
            stream.read_exact(&mut rsp).await.map_err(|e| Failure::Other(format!("read from tgtd: {e}")))?;
            let err = u32::from_ne_bytes(rsp[0..4].try_into().expect("4 bytes"));
            let len = u32::from_ne_bytes(rsp[4..8].try_into().expect("4 bytes")) as usize;
            if len > MAX_ANSWER {
                return Err(Failure::Other(format!("tgtd's answer is too long ({len} bytes)")));
            }
            let mut rest = vec![0u8; len.saturating_sub(8)];
            stream.read_exact(&mut rest).await.map_err(|e| Failure::Other(format!("read from tgtd: {e}")))?;
            match err {
                0 => Ok(String::from_utf8_lossy(&rest).trim_end_matches('\0').to_string()),
                code => Err(Failure::classify(tgtadm_strerror(code))),
            }
        };
        match tokio::time::timeout(self.cfg.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Timeout),
        }
    }

    async fn account_delete(&self, user: &str) -> Result<(), TargetError> {
        match self.control(MODE_ACCOUNT, OP_DELETE, -1, &format!("user={user}")).await {
            Ok(_) | Err(Failure::NotFound(_)) => {
                self.accounts.lock().unwrap_or_else(|p| p.into_inner()).remove(user);
                Ok(())
            }
            Err(f) => Err(f.into_error("delete account")),
        }
    }

    async fn account_bind(&self, tid: u32, user: &str) -> Result<(), TargetError> {
        match self.control(MODE_ACCOUNT, OP_BIND, tid as i32, &format!("user={user}")).await {
            Ok(_) | Err(Failure::AlreadyExists(_)) => Ok(()),
            Err(f) => Err(f.into_error("bind account")),
        }
    }

    /// Adds an initiator to a target's ACL (no check, no lock: for callers that hold both).
    async fn bind_initiator(&self, tid: &str, initiator: &Iqn) -> Result<(), TargetError> {
        match self.lld(&["--op", "bind", "--mode", "target", "--tid", tid, "-Q", initiator.as_str()]).await {
            Ok(_) | Err(Failure::AlreadyExists(_)) => Ok(()),
            Err(f) => Err(f.into_error("allow initiator")),
        }
    }

    /// Removes an initiator from a target's ACL (no check, no lock).
    async fn unbind_initiator(&self, tid: &str, initiator: &Iqn) -> Result<(), TargetError> {
        match self.lld(&["--op", "unbind", "--mode", "target", "--tid", tid, "-Q", initiator.as_str()]).await
        {
            Ok(_) | Err(Failure::NotFound(_)) => Ok(()),
            Err(f) => Err(f.into_error("deny initiator")),
        }
    }

    async fn account_unbind(&self, tid: u32, user: &str) -> Result<(), TargetError> {
        match self.control(MODE_ACCOUNT, OP_UNBIND, tid as i32, &format!("user={user}")).await {
            Ok(_) | Err(Failure::NotFound(_)) => Ok(()),
            Err(f) => Err(f.into_error("unbind account")),
        }
    }

    /// The CHAP account names tgtd has.
    pub async fn accounts(&self) -> Result<Vec<String>, TargetError> {
        let out =
            self.control(MODE_ACCOUNT, OP_SHOW, -1, "").await.map_err(|f| f.into_error("show accounts"))?;
        Ok(out
            .lines()
            .skip_while(|l| !l.starts_with("Account list"))
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.ends_with("(outgoing)"))
            .map(str::to_string)
            .collect())
    }

    fn remember(&self, credentials: &ChapCredentials) {
        let digest: [u8; 32] = Sha256::digest(credentials.secret.expose().as_bytes()).into();
        self.accounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(credentials.user.as_str().to_string(), digest);
    }

    fn known(&self, credentials: &ChapCredentials) -> bool {
        let digest: [u8; 32] = Sha256::digest(credentials.secret.expose().as_bytes()).into();
        self.accounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(credentials.user.as_str())
            .is_some_and(|d| *d == digest)
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
        self.find(iqn).await
    }

    async fn create_target(&self, iqn: &Iqn) -> Result<TargetState, TargetError> {
        let _guard = self.changes.lock().await;
        let all = self.show_all().await?;
        if let Some(existing) = all.iter().find(|t| t.iqn == iqn.as_str()) {
            return Ok(existing.clone());
        }
        let tid = (all.iter().map(|t| t.tid).max().unwrap_or(0) + 1).to_string();
        match self.lld(&["--op", "new", "--mode", "target", "--tid", &tid, "-T", iqn.as_str()]).await {
            Ok(_) | Err(Failure::AlreadyExists(_)) => {}
            Err(f) => return Err(f.into_error("create target")),
        }
        self.require(iqn).await
    }

    async fn delete_target(&self, iqn: &Iqn) -> Result<(), TargetError> {
        let _guard = self.changes.lock().await;
        let all = self.show_all().await?;
        let Some(target) = all.iter().find(|t| t.iqn == iqn.as_str()) else {
            return Ok(());
        };
        let tid = target.tid.to_string();
        match self.lld(&["--op", "delete", "--mode", "target", "--tid", &tid, "--force"]).await {
            Ok(_) | Err(Failure::NotFound(_)) => {}
            Err(f) => return Err(f.into_error("delete target")),
        }
        for user in &target.chap_users {
            let bound_elsewhere = all.iter().any(|t| t.iqn != iqn.as_str() && t.chap_users.contains(user));
            if !bound_elsewhere {
                self.account_delete(user).await?;
            }
        }
        self.verify(iqn, "delete target", |t| t.is_none()).await
    }

    async fn add_lun(&self, iqn: &Iqn, lun: Lun, path: &str) -> Result<(), TargetError> {
        self.check_backing_path(path)?;
        let _guard = self.changes.lock().await;
        let target = self.require(iqn).await?;
        match target.luns.iter().find(|(l, _)| *l == lun.get()) {
            Some((_, p)) if p == path => return Ok(()),
            Some((_, p)) => {
                return Err(TargetError::Failed(format!("LUN {} of {iqn} already exposes {p}", lun.get())));
            }
            None => {}
        }
        let (tid, lun_s) = (target.tid.to_string(), lun.get().to_string());
        match self
            .lld(&["--op", "new", "--mode", "logicalunit", "--tid", &tid, "--lun", &lun_s, "-b", path])
            .await
        {
            Ok(_) | Err(Failure::AlreadyExists(_)) => {}
            Err(f) => return Err(f.into_error("add LUN")),
        }
        self.verify(iqn, "add LUN", |t| {
            t.is_some_and(|t| t.luns.iter().any(|(l, p)| *l == lun.get() && p == path))
        })
        .await
    }

    async fn remove_lun(&self, iqn: &Iqn, lun: Lun) -> Result<(), TargetError> {
        let _guard = self.changes.lock().await;
        let Some(target) = self.find(iqn).await? else { return Ok(()) };
        if !target.luns.iter().any(|(l, _)| *l == lun.get()) {
            return Ok(());
        }
        let (tid, lun_s) = (target.tid.to_string(), lun.get().to_string());
        match self.lld(&["--op", "delete", "--mode", "logicalunit", "--tid", &tid, "--lun", &lun_s]).await {
            Ok(_) | Err(Failure::NotFound(_)) => {}
            Err(f) => return Err(f.into_error("remove LUN")),
        }
        self.verify(iqn, "remove LUN", |t| t.is_none_or(|t| !t.luns.iter().any(|(l, _)| *l == lun.get())))
            .await
    }

    async fn allow_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        let _guard = self.changes.lock().await;
        let target = self.require(iqn).await?;
        if target.initiators.iter().any(|i| i == initiator.as_str()) {
            return Ok(());
        }
        self.bind_initiator(&target.tid.to_string(), initiator).await?;
        self.verify(iqn, "allow initiator", |t| {
            t.is_some_and(|t| t.initiators.iter().any(|i| i == initiator.as_str()))
        })
        .await
    }

    async fn deny_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        let _guard = self.changes.lock().await;
        let Some(target) = self.find(iqn).await? else { return Ok(()) };
        if !target.initiators.iter().any(|i| i == initiator.as_str()) {
            return Ok(());
        }
        self.unbind_initiator(&target.tid.to_string(), initiator).await?;
        self.verify(iqn, "deny initiator", |t| {
            t.is_none_or(|t| !t.initiators.iter().any(|i| i == initiator.as_str()))
        })
        .await
    }

    /// tgtd 1.0.85 corrupts its account list (and crashes on the next `show`) when an account
    /// that is not the last one bound to a target is unbound or deleted. So a target never has
    /// more than one account bound here: the old one goes before the new one comes, and while none
    /// is bound the ACL is empty, so that nobody logs in without CHAP. Sessions already logged in
    /// are not affected. If a step fails the ACL stays empty (closed) until the call is retried.
    async fn set_chap(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError> {
        let _guard = self.changes.lock().await;
        let target = self.require(iqn).await?;
        let user = credentials.user.as_str();
        if target.chap_users == [user] && self.known(credentials) {
            return Ok(());
        }
        let acl: Vec<Iqn> = target.initiators.iter().filter_map(|i| Iqn::parse(i).ok()).collect();
        let tid = target.tid.to_string();
        for initiator in &acl {
            self.unbind_initiator(&tid, initiator).await?;
        }
        let all = self.show_all().await?;
        for old in target.chap_users.iter().rev() {
            self.account_unbind(target.tid, old).await?;
            if !all.iter().any(|t| t.iqn != iqn.as_str() && t.chap_users.contains(old)) {
                self.account_delete(old).await?;
            }
        }
        match self.account_new(credentials).await {
            Ok(()) => {}
            // An account of that name, bound to no target of ours, with a secret tgtd never shows.
            Err(Failure::AlreadyExists(_)) => {
                self.account_delete(user).await?;
                self.account_new(credentials).await.map_err(|f| f.into_error("create account"))?;
            }
            Err(f) => return Err(f.into_error("create account")),
        }
        self.remember(credentials);
        self.account_bind(target.tid, user).await?;
        for initiator in &acl {
            self.bind_initiator(&tid, initiator).await?;
        }
        self.verify(iqn, "set CHAP", |t| {
            t.is_some_and(|t| t.chap_users == [user] && t.initiators == target.initiators)
        })
        .await
    }

    async fn list(&self) -> Result<Vec<TargetState>, TargetError> {
        self.show_all().await
    }
}

// tgtadm's request message (tgt `usr/tgtadm.h`, `struct tgtadm_req`, x86-64/aarch64 layout).
const MODE_TARGET: u32 = 1;
const MODE_ACCOUNT: u32 = 7;
const OP_NEW: u32 = 0;
const OP_DELETE: u32 = 1;
const OP_SHOW: u32 = 2;
const OP_BIND: u32 = 3;
const OP_UNBIND: u32 = 4;
/// The longest answer read from tgtd (a `show` of some ten thousand targets).
const MAX_ANSWER: usize = 64 << 20;
const REQ_SIZE: usize = 120;

fn request_header(mode: u32, op: u32, tid: i32, body_len: usize) -> [u8; REQ_SIZE] {
    let mut h = [0u8; REQ_SIZE];
    h[0..4].copy_from_slice(&mode.to_ne_bytes());
    h[4..8].copy_from_slice(&op.to_ne_bytes());
    h[8..13].copy_from_slice(b"iscsi"); // lld[64], NUL-padded
    h[72..76].copy_from_slice(&((REQ_SIZE + body_len) as u32).to_ne_bytes()); // len
    h[76..80].copy_from_slice(&tid.to_ne_bytes()); // -1: no target
    // sid (80..88) = 0
    h[88..96].copy_from_slice(&u64::MAX.to_ne_bytes()); // lun: none
    // cid, host_no, device_type (disk = 0), ac_dir (incoming = 0), pack, force = 0
    h
}

/// tgtadm's messages for `enum tgtadm_errno` (tgt `usr/tgtadm.c`, `tgtadm_strerror`).
fn tgtadm_strerror(code: u32) -> &'static str {
    match code {
        2 => "out of memory",
        3 => "can't find the driver",
        4 => "can't find the target",
        5 => "can't find the logical unit",
        8 => "can't find the binding",
        9 => "this target already exists",
        10 => "this logical unit number already exists",
        11 => "this binding already exists",
        12 => "this access control rule already exists",
        13 => "this access control rule does not exist",
        14 => "this account already exists",
        15 => "can't find the account",
        16 => "too many accounts",
        17 => "invalid request",
        _ => "unknown error",
    }
}

/// Parses `tgtadm --lld iscsi --op show --mode target`.
pub fn parse_show(out: &str) -> Vec<TargetState> {
    #[derive(PartialEq)]
    enum Section {
        Other,
        Nexus,
        Lun,
        Account,
        Acl,
    }
    let mut targets: Vec<TargetState> = Vec::new();
    let mut section = Section::Other;
    let mut lun: Option<u32> = None;
    for line in out.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if indent == 0 {
            if let Some(rest) = text.strip_prefix("Target ")
                && let Some((tid, iqn)) = rest.split_once(": ")
            {
                targets.push(TargetState {
                    iqn: iqn.trim().to_string(),
                    tid: tid.parse().unwrap_or(0),
                    ..Default::default()
                });
            }
            section = Section::Other;
            continue;
        }
        let Some(target) = targets.last_mut() else { continue };
        if indent == 4 {
            section = match text {
                "I_T nexus information:" => Section::Nexus,
                "LUN information:" => Section::Lun,
                "Account information:" => Section::Account,
                "ACL information:" => Section::Acl,
                _ => Section::Other,
            };
            continue;
        }
        match section {
            Section::Nexus if indent == 8 && text.starts_with("I_T nexus:") => target.sessions += 1,
            Section::Lun if indent == 8 => lun = text.strip_prefix("LUN: ").and_then(|n| n.parse().ok()),
            Section::Lun if indent == 12 => {
                if let (Some(l), Some(path)) = (lun, text.strip_prefix("Backing store path: "))
                    && l != 0
                    && path != "None"
                {
                    target.luns.push((l, path.to_string()));
                }
            }
            Section::Account if indent == 8 && !text.ends_with("(outgoing)") => {
                target.chap_users.push(text.to_string())
            }
            Section::Acl if indent == 8 => target.initiators.push(text.to_string()),
            _ => {}
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOW: &str = "Target 1: iqn.2010-10.org.openstack:volume-abc
    System information:
        Driver: iscsi
        State: ready
    I_T nexus information:
        I_T nexus: 3
            Initiator: iqn.1993-08.org.debian:01:aaa alias: host
            Connection: 0
                IP Address: 127.0.0.1
    LUN information:
        LUN: 0
            Type: controller
            Backing store type: null
            Backing store path: None
            Backing store flags: 
        LUN: 1
            Type: disk
            Backing store type: rdwr
            Backing store path: /var/lib/berth/volumes/volume-abc.img
            Backing store flags: 
    Account information:
        userA
        userB (outgoing)
    ACL information:
        iqn.1993-08.org.debian:01:aaa
Target 2: iqn.2010-10.org.openstack:volume-def
    System information:
        Driver: iscsi
        State: ready
    I_T nexus information:
    LUN information:
        LUN: 0
            Backing store path: None
    Account information:
    ACL information:
";

    #[test]
    fn show_output_is_parsed_per_target() {
        let t = parse_show(SHOW);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].iqn, "iqn.2010-10.org.openstack:volume-abc");
        assert_eq!(t[0].tid, 1);
        assert_eq!(t[0].sessions, 1);
        assert_eq!(t[0].luns, vec![(1, "/var/lib/berth/volumes/volume-abc.img".to_string())]);
        assert_eq!(t[0].chap_users, vec!["userA".to_string()]);
        assert_eq!(t[0].initiators, vec!["iqn.1993-08.org.debian:01:aaa".to_string()]);
        assert_eq!(t[1].tid, 2);
        assert!(t[1].luns.is_empty() && t[1].initiators.is_empty() && t[1].sessions == 0);
    }

    #[test]
    fn tgtadm_messages_are_classified() {
        assert!(matches!(Failure::classify("tgtadm: this target already exists"), Failure::AlreadyExists(_)));
        assert!(matches!(Failure::classify("tgtadm: can't find the target"), Failure::NotFound(_)));
        assert!(matches!(
            Failure::classify("tgtadm: this access control rule does not exist"),
            Failure::NotFound(_)
        ));
        assert!(matches!(Failure::classify("tgtadm: out of memory"), Failure::Other(_)));
    }

    #[test]
    fn request_header_matches_tgtadm_layout() {
        let h = request_header(MODE_ACCOUNT, OP_NEW, -1, 30);
        assert_eq!(u32::from_ne_bytes(h[0..4].try_into().unwrap()), 7);
        assert_eq!(&h[8..14], b"iscsi\0");
        assert_eq!(u32::from_ne_bytes(h[72..76].try_into().unwrap()), 150);
        assert_eq!(i32::from_ne_bytes(h[76..80].try_into().unwrap()), -1);
        assert_eq!(u64::from_ne_bytes(h[88..96].try_into().unwrap()), u64::MAX);
    }

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

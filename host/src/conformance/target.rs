//! The iSCSI target service a conformance run gives the driver, and what the suite can observe
//! of it: a snapshot of its objects, a simulated restart, injected errors, and whether an
//! initiator could log in.
//!
//! - `model` (default): an in-memory model of tgtd, fresh for every check.
//! - `tgtd`: a real tgtd the suite starts on loopback (free ports, its own control socket) and
//!   stops at the end; wiped between checks. Logins are tried with libiscsi's `iscsi-inq`.
//!
//! Sessions that stay logged in (to check that a terminate ends them) are held by the model, or
//! by libiscsi's `iscsi-perf` reading the LUN until it is stopped.
//!
//! In both, errors are injected in front of the service (`Faulty`): the failing operation never
//! reaches it.

// This room starts the suite's own tgtd and initiator (host/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::capabilities::iscsi::initiators::is_initiator_account;
use crate::capabilities::iscsi::model::{LoginRefusal, TargetModel};
use crate::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use crate::capabilities::iscsi::{
    ChapCredentials, ChapUser, Iqn, Lun, Portal, Session, TargetError, TargetService, TargetState,
};

/// Which target service to run the suite against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TargetMode {
    /// An in-memory model of tgtd that records every call (fast, needs nothing).
    Model,
    /// A real tgtd on loopback (needs root and the Debian packages tgt and libiscsi-bin).
    Tgtd,
}

/// The objects of the target service, comparable between two points in time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub targets: BTreeMap<String, TargetObjects>,
    pub accounts: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetObjects {
    pub luns: BTreeSet<u32>,
    pub initiators: BTreeSet<String>,
    pub chap_users: BTreeSet<String>,
}

impl Snapshot {
    /// The same state with CHAP user names (random by design) replaced by their count.
    pub fn without_names(&self) -> Snapshot {
        Snapshot {
            targets: self
                .targets
                .iter()
                .map(|(iqn, t)| {
                    let users = (0..t.chap_users.len()).map(|i| format!("chap-user-{i}")).collect();
                    (iqn.clone(), TargetObjects { chap_users: users, ..t.clone() })
                })
                .collect(),
            accounts: (0..self.accounts.len()).map(|i| format!("account-{i}")).collect(),
        }
    }

    /// What changed, one line per difference (empty when nothing did).
    pub fn diff(&self, after: &Snapshot) -> Vec<String> {
        let mut out = Vec::new();
        for (iqn, t) in &after.targets {
            match self.targets.get(iqn) {
                None => out.push(format!("target {iqn} appeared")),
                Some(b) if b != t => out.push(format!("target {iqn} changed: {b:?} -> {t:?}")),
                Some(_) => {}
            }
        }
        for iqn in self.targets.keys().filter(|i| !after.targets.contains_key(*i)) {
            out.push(format!("target {iqn} disappeared"));
        }
        if self.accounts.len() != after.accounts.len() {
            out.push(format!("{} CHAP accounts became {}", self.accounts.len(), after.accounts.len()));
        }
        out
    }
}

/// A real tgtd started for the run.
pub struct Daemon {
    child: tokio::sync::Mutex<Option<tokio::process::Child>>,
    pub control_port: u16,
    pub portal: Portal,
    tgtd: std::path::PathBuf,
    pub service: Arc<Tgtd>,
}

impl Daemon {
    /// Starts tgtd on a free control port and a free loopback portal, with backing files under
    /// `backing_dir`.
    pub async fn start(backing_dir: &Path) -> Result<Daemon, String> {
        let tgtd = std::path::PathBuf::from("/usr/sbin/tgtd");
        if !tgtd.exists() {
            return Err("--target tgtd needs tgtd (Debian package tgt)".into());
        }
        let control_port = free_control_port();
        let portal_port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("cannot find a free port: {e}"))?;
        let mut cfg = TgtdConfig::new(control_port, backing_dir);
        cfg.timeout = Duration::from_secs(10);
        // The suite checks what the driver leaves behind: accounts go with their targets here
        // (keeping them for reuse is the service's optimisation, not the driver's doing).
        cfg.keep_exports = Duration::ZERO;
        let daemon = Daemon {
            child: tokio::sync::Mutex::new(None),
            control_port,
            portal: Portal { address: "127.0.0.1".into(), port: portal_port },
            tgtd,
            service: Arc::new(Tgtd::new(cfg)),
        };
        daemon.spawn().await?;
        Ok(daemon)
    }

    async fn spawn(&self) -> Result<(), String> {
        let socket = format!("/var/run/tgtd/socket.{}", self.control_port);
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(format!("{socket}.lock"));
        let child = tokio::process::Command::new(&self.tgtd)
            .args(["-f", "-C", &self.control_port.to_string(), "--iscsi"])
            .arg(format!(
                "portal=127.0.0.1:{},{}",
                self.portal.port,
                crate::capabilities::iscsi::tgt::ISCSI_NOP_NEVER
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start tgtd: {e}"))?;
        *self.child.lock().await = Some(child);
        for _ in 0..200 {
            if self.service.is_running().await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!("tgtd did not answer on control port {} (is this root?)", self.control_port))
    }

    /// Kills tgtd and starts a fresh, empty one on the same ports, as after a crash.
    pub async fn restart(&self) -> Result<(), String> {
        if let Some(mut child) = self.child.lock().await.take() {
            let _ = child.kill().await;
        }
        self.spawn().await
    }

    /// Deletes every target and account.
    pub async fn clear(&self) -> Result<(), String> {
        let targets = self.service.list().await.map_err(|e| e.to_string())?;
        if targets.is_empty() && self.service.accounts().await.map_err(|e| e.to_string())?.is_empty() {
            return Ok(());
        }
        self.restart().await
    }

    pub async fn stop(&self) {
        if let Some(mut child) = self.child.lock().await.take() {
            let _ = child.kill().await;
        }
        let socket = format!("/var/run/tgtd/socket.{}", self.control_port);
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(format!("{socket}.lock"));
    }
}

/// tgtd's `-C` takes a port below 32768 whose socket file is not in use.
fn free_control_port() -> u16 {
    loop {
        let mut b = [0u8; 2];
        getrandom::fill(&mut b).expect("the OS random number generator");
        let n = 2_000 + u16::from_ne_bytes(b) % 30_000;
        if !Path::new(&format!("/var/run/tgtd/socket.{n}")).exists() {
            return n;
        }
    }
}

/// A target service with one injectable error: the next call of an operation fails with it
/// before reaching the service, as when tgtd does not answer or refuses.
pub struct Faulty {
    inner: Arc<dyn TargetService>,
    inject: Mutex<Option<(&'static str, TargetError)>>,
}

impl Faulty {
    pub fn new(inner: Arc<dyn TargetService>) -> Self {
        Faulty { inner, inject: Mutex::new(None) }
    }

    pub fn inject(&self, op: &'static str, error: TargetError) {
        *self.inject.lock().unwrap_or_else(|p| p.into_inner()) = Some((op, error));
    }

    fn check(&self, op: &'static str) -> Result<(), TargetError> {
        let mut inject = self.inject.lock().unwrap_or_else(|p| p.into_inner());
        match inject.take() {
            Some((o, error)) if o == op => Err(error),
            other => {
                *inject = other;
                Ok(())
            }
        }
    }
}

#[async_trait]
impl TargetService for Faulty {
    async fn show(&self, iqn: &Iqn) -> Result<Option<TargetState>, TargetError> {
        self.check("show-target")?;
        self.inner.show(iqn).await
    }
    async fn create_target(&self, iqn: &Iqn) -> Result<TargetState, TargetError> {
        self.check("create-target")?;
        self.inner.create_target(iqn).await
    }
    async fn delete_target(&self, iqn: &Iqn) -> Result<(), TargetError> {
        self.check("delete-target")?;
        self.inner.delete_target(iqn).await
    }
    async fn add_lun(&self, iqn: &Iqn, lun: Lun, path: &str) -> Result<(), TargetError> {
        self.check("add-lun")?;
        self.inner.add_lun(iqn, lun, path).await
    }
    async fn remove_lun(&self, iqn: &Iqn, lun: Lun) -> Result<(), TargetError> {
        self.check("remove-lun")?;
        self.inner.remove_lun(iqn, lun).await
    }
    async fn reopen_luns(&self, path: &str) -> Result<u32, TargetError> {
        self.check("reopen-luns")?;
        self.inner.reopen_luns(path).await
    }
    async fn allow_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        self.check("allow-initiator")?;
        self.inner.allow_initiator(iqn, initiator).await
    }
    async fn deny_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        self.check("deny-initiator")?;
        self.inner.deny_initiator(iqn, initiator).await
    }
    async fn sessions(&self, iqn: &Iqn) -> Result<Vec<Session>, TargetError> {
        self.check("list-sessions")?;
        self.inner.sessions(iqn).await
    }
    async fn close_sessions(&self, iqn: &Iqn, initiator: &Iqn) -> Result<u32, TargetError> {
        self.check("close-sessions")?;
        self.inner.close_sessions(iqn, initiator).await
    }
    async fn set_chap(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError> {
        self.check("set-chap")?;
        self.inner.set_chap(iqn, credentials).await
    }
    async fn bind_account(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError> {
        self.check("bind-account")?;
        self.inner.bind_account(iqn, credentials).await
    }
    async fn unbind_account(&self, iqn: &Iqn, user: &ChapUser) -> Result<(), TargetError> {
        self.check("unbind-account")?;
        self.inner.unbind_account(iqn, user).await
    }
    async fn list(&self) -> Result<Vec<TargetState>, TargetError> {
        self.inner.list().await
    }
}

/// The target service of one check: the model or a real tgtd, behind an error injector.
#[derive(Clone)]
pub struct Target {
    backend: Backend,
    faults: Arc<Faulty>,
}

#[derive(Clone)]
enum Backend {
    Model(Arc<TargetModel>),
    Tgtd(Arc<Daemon>),
}

impl Target {
    /// A fresh model.
    pub fn model() -> Target {
        let model = Arc::new(TargetModel::new());
        Target { faults: Arc::new(Faulty::new(model.clone())), backend: Backend::Model(model) }
    }

    /// The run's tgtd (the caller clears it).
    pub fn tgtd(daemon: Arc<Daemon>) -> Target {
        Target { faults: Arc::new(Faulty::new(daemon.service.clone())), backend: Backend::Tgtd(daemon) }
    }

    /// What the driver's capability calls reach.
    pub fn service(&self) -> Arc<dyn TargetService> {
        self.faults.clone()
    }

    pub fn portal(&self) -> Portal {
        match &self.backend {
            Backend::Model(_) => Portal { address: "127.0.0.1".into(), port: 3260 },
            Backend::Tgtd(d) => d.portal.clone(),
        }
    }

    pub async fn snapshot(&self) -> Result<Snapshot, String> {
        match &self.backend {
            Backend::Model(m) => {
                let s = m.snapshot();
                Ok(Snapshot {
                    targets: s
                        .targets
                        .into_iter()
                        .map(|(iqn, t)| {
                            let objects = TargetObjects {
                                luns: t.luns.keys().copied().collect(),
                                initiators: t.initiators,
                                chap_users: t.chap_users,
                            };
                            (iqn, objects)
                        })
                        .collect(),
                    accounts: s.accounts,
                })
            }
            Backend::Tgtd(d) => {
                let targets =
                    d.service.list().await.map_err(|e| format!("cannot list tgtd's targets: {e}"))?;
                let accounts =
                    d.service.accounts().await.map_err(|e| format!("cannot list accounts: {e}"))?;
                Ok(Snapshot {
                    targets: targets
                        .into_iter()
                        .map(|t| {
                            let objects = TargetObjects {
                                luns: t.luns.iter().map(|(l, _)| *l).collect(),
                                initiators: t.initiators.into_iter().collect(),
                                chap_users: t.chap_users.into_iter().collect(),
                            };
                            (t.iqn, objects)
                        })
                        .collect(),
                    // Per-initiator accounts are the host's, kept for reuse when unbound.
                    accounts: accounts.into_iter().filter(|a| !is_initiator_account(a)).collect(),
                })
            }
        }
    }

    /// Forgets everything, as a restarted tgtd does.
    pub async fn wipe(&self) -> Result<(), String> {
        match &self.backend {
            Backend::Model(m) => {
                m.wipe();
                Ok(())
            }
            Backend::Tgtd(d) => d.restart().await,
        }
    }

    /// Makes the next call of `op` fail with `error`; the operation never reaches the service.
    pub fn inject(&self, op: &'static str, error: TargetError) {
        self.faults.inject(op, error);
    }

    /// Whether `initiator` can log in to LUN `lun` of `target` with these credentials; the
    /// reason when it cannot.
    pub async fn login(
        &self,
        target: &str,
        lun: u32,
        initiator: &str,
        chap: Option<(&str, &str)>,
    ) -> Result<(), String> {
        match &self.backend {
            Backend::Model(m) => m.login(target, lun, initiator, chap).map_err(|r| match r {
                LoginRefusal::TargetNotFound => {
                    "target not found (or the initiator is not in its ACL)".into()
                }
                LoginRefusal::AuthenticationFailure => "authentication failure".into(),
                LoginRefusal::NoSuchLun => format!("LUN {lun} does not exist"),
            }),
            Backend::Tgtd(d) => {
                let auth = chap.map(|(u, s)| format!("{u}%{s}@")).unwrap_or_default();
                let url = format!("iscsi://{auth}127.0.0.1:{}/{target}/{lun}", d.portal.port);
                let out = tokio::process::Command::new("iscsi-inq")
                    .args(["-i", initiator, &url])
                    .stdin(Stdio::null())
                    .output()
                    .await
                    .map_err(|e| format!("cannot run iscsi-inq (Debian package libiscsi-bin): {e}"))?;
                if out.status.success() {
                    Ok(())
                } else {
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    let reason = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("refused");
                    Err(reason.replace(chap.map(|(_, s)| s).unwrap_or("\u{0}"), "***"))
                }
            }
        }
    }

    /// Logs `initiator` in and keeps the session open until the answer is dropped, as a host
    /// using the volume does; returns once the target service lists the session.
    pub async fn hold_session(
        &self,
        target: &str,
        lun: u32,
        initiator: &str,
        chap: Option<(&str, &str)>,
    ) -> Result<HeldSession, String> {
        let child = match &self.backend {
            Backend::Model(m) => {
                m.hold_session(target, lun, initiator, chap).map_err(|r| format!("cannot log in: {r:?}"))?;
                None
            }
            Backend::Tgtd(d) => {
                let auth = chap.map(|(u, s)| format!("{u}%{s}@")).unwrap_or_default();
                let url = format!("iscsi://{auth}127.0.0.1:{}/{target}/{lun}", d.portal.port);
                let child = tokio::process::Command::new("iscsi-perf")
                    .args(["-i", initiator, &url])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .map_err(|e| format!("cannot run iscsi-perf (Debian package libiscsi-bin): {e}"))?;
                Some(child)
            }
        };
        let held = HeldSession { _child: child };
        for _ in 0..200 {
            if self.sessions_of(target, initiator).await? > 0 {
                return Ok(held);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!("{initiator} did not stay logged in to {target}"))
    }

    /// How many sessions `initiator` has on `target` now, as the service reports them (never
    /// through the error injector).
    pub async fn sessions_of(&self, target: &str, initiator: &str) -> Result<usize, String> {
        let iqn = Iqn::parse(target).map_err(|e| e.to_string())?;
        let sessions = match &self.backend {
            Backend::Model(m) => m.sessions(&iqn).await,
            Backend::Tgtd(d) => d.service.sessions(&iqn).await,
        }
        .map_err(|e| format!("cannot list the sessions of {target}: {e}"))?;
        Ok(sessions.iter().filter(|s| s.initiator == initiator).count())
    }
}

/// A session kept open by [`Target::hold_session`]; dropping it logs out (kills `iscsi-perf`).
pub struct HeldSession {
    _child: Option<tokio::process::Child>,
}

//! An in-memory model of an iSCSI target service with tgtd's semantics (host-assigned target
//! ids, global CHAP accounts bound to targets, initiator ACLs, LUN 0 reserved). It records every
//! call, can simulate a daemon restart (`wipe`), and answers whether an initiator could log in.
//! Used by the conformance suite's default mode and by tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use async_trait::async_trait;

use super::initiators::is_initiator_account;
use super::{ChapCredentials, ChapUser, Iqn, Lun, Session, TargetError, TargetService, TargetState};
use crate::capabilities::secret::Secret;

/// One recorded call. Arguments never include secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCall {
    pub op: &'static str,
    pub args: Vec<String>,
    /// Whether the call changed the model's state.
    pub changed: bool,
}

/// What the model holds, comparable between two points in time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelSnapshot {
    pub targets: BTreeMap<String, ModelTarget>,
    /// CHAP account user names.
    pub accounts: BTreeSet<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelTarget {
    pub tid: u32,
    pub luns: BTreeMap<u32, String>,
    pub initiators: BTreeSet<String>,
    pub chap_users: BTreeSet<String>,
}

impl ModelSnapshot {
    /// Total number of objects (targets, LUNs, ACL entries, accounts): zero for an empty service.
    pub fn object_count(&self) -> usize {
        self.accounts.len()
            + self
                .targets
                .values()
                .map(|t| 1 + t.luns.len() + t.initiators.len() + t.chap_users.len())
                .sum::<usize>()
    }
}

/// Why a login would be refused (as tgtd would refuse it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginRefusal {
    /// No such target, or the initiator is not in its ACL ("Target not found").
    TargetNotFound,
    /// CHAP is required and the credentials do not match ("Authentication failure").
    AuthenticationFailure,
    /// The LUN does not exist.
    NoSuchLun,
}

#[derive(Default)]
struct State {
    snapshot: ModelSnapshot,
    secrets: BTreeMap<String, Secret>,
    /// Per-initiator accounts (`initiators.rs`): the host's, kept when no target binds them, and
    /// so not part of the snapshot a driver's calls are judged by.
    initiator_accounts: BTreeSet<String>,
    next_tid: u32,
    calls: Vec<ModelCall>,
    /// Sessions logged in through [`TargetModel::hold_session`]: target to initiators, one entry
    /// per session. Like tgtd, the model checks the ACL only at login.
    sessions: BTreeMap<String, Vec<String>>,
}

/// The model target service.
#[derive(Default)]
pub struct TargetModel {
    state: Mutex<State>,
}

impl TargetModel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn snapshot(&self) -> ModelSnapshot {
        self.lock().snapshot.clone()
    }

    /// The calls recorded since the last `take_calls`.
    pub fn take_calls(&self) -> Vec<ModelCall> {
        std::mem::take(&mut self.lock().calls)
    }

    /// Forgets every target and account, as a restarted tgtd would.
    pub fn wipe(&self) {
        let mut s = self.lock();
        s.snapshot = ModelSnapshot::default();
        s.secrets.clear();
        s.initiator_accounts.clear();
        s.sessions.clear();
    }

    /// Logs `initiator` in and keeps the session open, as a host using the volume does, if
    /// [`TargetModel::login`] would admit it.
    pub fn hold_session(
        &self,
        target: &str,
        lun: u32,
        initiator: &str,
        chap: Option<(&str, &str)>,
    ) -> Result<(), LoginRefusal> {
        self.login(target, lun, initiator, chap)?;
        self.lock().sessions.entry(target.to_string()).or_default().push(initiator.to_string());
        Ok(())
    }

    /// Whether `initiator` could log in to LUN `lun` of `target` with these CHAP credentials.
    pub fn login(
        &self,
        target: &str,
        lun: u32,
        initiator: &str,
        chap: Option<(&str, &str)>,
    ) -> Result<(), LoginRefusal> {
        let s = self.lock();
        let t = s.snapshot.targets.get(target).ok_or(LoginRefusal::TargetNotFound)?;
        if !t.initiators.contains(initiator) {
            return Err(LoginRefusal::TargetNotFound);
        }
        if !t.chap_users.is_empty() {
            let Some((user, secret)) = chap else {
                return Err(LoginRefusal::AuthenticationFailure);
            };
            let ok = t.chap_users.contains(user) && s.secrets.get(user).is_some_and(|s| s.expose() == secret);
            if !ok {
                return Err(LoginRefusal::AuthenticationFailure);
            }
        }
        if !t.luns.contains_key(&lun) {
            return Err(LoginRefusal::NoSuchLun);
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs one operation: records it and notes whether it changed anything.
    fn op<T>(
        &self,
        op: &'static str,
        args: Vec<String>,
        f: impl FnOnce(&mut State) -> Result<T, TargetError>,
    ) -> Result<T, TargetError> {
        let mut s = self.lock();
        let before = (s.snapshot.clone(), s.secrets.len(), s.sessions.clone());
        let result = f(&mut s);
        let changed = (s.snapshot.clone(), s.secrets.len(), s.sessions.clone()) != before;
        s.calls.push(ModelCall { op, args, changed });
        result
    }
}

fn state_of(iqn: &str, t: &ModelTarget, sessions: &BTreeMap<String, Vec<String>>) -> TargetState {
    TargetState {
        iqn: iqn.to_string(),
        tid: t.tid,
        luns: t.luns.iter().map(|(l, p)| (*l, p.clone())).collect(),
        initiators: t.initiators.iter().cloned().collect(),
        chap_users: t.chap_users.iter().cloned().collect(),
        sessions: sessions.get(iqn).map_or(0, |s| s.len() as u32),
        ..Default::default()
    }
}

fn missing(iqn: &Iqn) -> TargetError {
    TargetError::NotFound(format!("can't find the target {iqn}"))
}

#[async_trait]
impl TargetService for TargetModel {
    async fn show(&self, iqn: &Iqn) -> Result<Option<TargetState>, TargetError> {
        self.op("show-target", vec![iqn.to_string()], |s| {
            Ok(s.snapshot.targets.get(iqn.as_str()).map(|t| state_of(iqn.as_str(), t, &s.sessions)))
        })
    }

    async fn create_target(&self, iqn: &Iqn) -> Result<TargetState, TargetError> {
        self.op("create-target", vec![iqn.to_string()], |s| {
            if !s.snapshot.targets.contains_key(iqn.as_str()) {
                s.next_tid += 1;
                let tid = s.next_tid;
                s.snapshot.targets.insert(iqn.to_string(), ModelTarget { tid, ..Default::default() });
            }
            Ok(state_of(iqn.as_str(), &s.snapshot.targets[iqn.as_str()], &s.sessions))
        })
    }

    async fn delete_target(&self, iqn: &Iqn) -> Result<(), TargetError> {
        self.op("delete-target", vec![iqn.to_string()], |s| {
            s.sessions.remove(iqn.as_str());
            if let Some(t) = s.snapshot.targets.remove(iqn.as_str()) {
                for user in t.chap_users {
                    let bound_elsewhere = s.snapshot.targets.values().any(|o| o.chap_users.contains(&user));
                    if !bound_elsewhere && !s.initiator_accounts.contains(&user) {
                        s.snapshot.accounts.remove(&user);
                        s.secrets.remove(&user);
                    }
                }
            }
            Ok(())
        })
    }

    async fn add_lun(&self, iqn: &Iqn, lun: Lun, path: &str) -> Result<(), TargetError> {
        self.op("add-lun", vec![iqn.to_string(), lun.get().to_string(), path.to_string()], |s| {
            let t = s.snapshot.targets.get_mut(iqn.as_str()).ok_or_else(|| missing(iqn))?;
            match t.luns.get(&lun.get()) {
                Some(existing) if existing == path => Ok(()),
                Some(existing) => {
                    Err(TargetError::Failed(format!("LUN {} of {iqn} already exposes {existing}", lun.get())))
                }
                None => {
                    t.luns.insert(lun.get(), path.to_string());
                    Ok(())
                }
            }
        })
    }

    async fn reopen_luns(&self, path: &str) -> Result<u32, TargetError> {
        self.op("reopen-luns", vec![path.to_string()], |s| {
            let exposing = s.snapshot.targets.values().flat_map(|t| t.luns.values()).filter(|p| *p == path);
            Ok(exposing.count() as u32)
        })
    }

    async fn remove_lun(&self, iqn: &Iqn, lun: Lun) -> Result<(), TargetError> {
        self.op("remove-lun", vec![iqn.to_string(), lun.get().to_string()], |s| {
            if let Some(t) = s.snapshot.targets.get_mut(iqn.as_str()) {
                t.luns.remove(&lun.get());
            }
            Ok(())
        })
    }

    async fn allow_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        self.op("allow-initiator", vec![iqn.to_string(), initiator.to_string()], |s| {
            let t = s.snapshot.targets.get_mut(iqn.as_str()).ok_or_else(|| missing(iqn))?;
            t.initiators.insert(initiator.to_string());
            Ok(())
        })
    }

    async fn deny_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError> {
        self.op("deny-initiator", vec![iqn.to_string(), initiator.to_string()], |s| {
            if let Some(t) = s.snapshot.targets.get_mut(iqn.as_str()) {
                t.initiators.remove(initiator.as_str());
            }
            Ok(())
        })
    }

    async fn sessions(&self, iqn: &Iqn) -> Result<Vec<Session>, TargetError> {
        self.op("list-sessions", vec![iqn.to_string()], |s| {
            Ok(s.sessions
                .get(iqn.as_str())
                .into_iter()
                .flatten()
                .map(|i| Session { initiator: i.clone(), addresses: vec!["127.0.0.1".into()] })
                .collect())
        })
    }

    async fn close_sessions(&self, iqn: &Iqn, initiator: &Iqn) -> Result<u32, TargetError> {
        self.op("close-sessions", vec![iqn.to_string(), initiator.to_string()], |s| {
            let Some(open) = s.sessions.get_mut(iqn.as_str()) else { return Ok(0) };
            let before = open.len();
            open.retain(|i| i != initiator.as_str());
            let ended = (before - open.len()) as u32;
            if open.is_empty() {
                s.sessions.remove(iqn.as_str());
            }
            Ok(ended)
        })
    }

    async fn set_chap(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError> {
        let user = credentials.user.as_str().to_string();
        self.op("set-chap", vec![iqn.to_string(), user.clone()], |s| {
            if !s.snapshot.targets.contains_key(iqn.as_str()) {
                return Err(missing(iqn));
            }
            // An account of that name with another secret is replaced, as on tgtd.
            s.snapshot.accounts.insert(user.clone());
            s.secrets.insert(user.clone(), credentials.secret.clone());
            let t = s.snapshot.targets.get_mut(iqn.as_str()).expect("checked above");
            let others: Vec<String> = t.chap_users.iter().filter(|u| **u != user).cloned().collect();
            t.chap_users = BTreeSet::from([user.clone()]);
            // These become the target's only credentials.
            for other in others {
                if !s.snapshot.targets.values().any(|t| t.chap_users.contains(&other))
                    && !s.initiator_accounts.contains(&other)
                {
                    s.snapshot.accounts.remove(&other);
                    s.secrets.remove(&other);
                }
            }
            Ok(())
        })
    }

    async fn bind_account(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError> {
        let user = credentials.user.as_str().to_string();
        self.op("bind-account", vec![iqn.to_string(), user.clone()], |s| {
            if !s.snapshot.targets.contains_key(iqn.as_str()) {
                return Err(missing(iqn));
            }
            if is_initiator_account(&user) {
                s.initiator_accounts.insert(user.clone());
            } else {
                s.snapshot.accounts.insert(user.clone());
            }
            s.secrets.insert(user.clone(), credentials.secret.clone());
            let t = s.snapshot.targets.get_mut(iqn.as_str()).expect("checked above");
            t.chap_users.insert(user.clone());
            Ok(())
        })
    }

    async fn unbind_account(&self, iqn: &Iqn, user: &ChapUser) -> Result<(), TargetError> {
        self.op("unbind-account", vec![iqn.to_string(), user.as_str().to_string()], |s| {
            if let Some(t) = s.snapshot.targets.get_mut(iqn.as_str()) {
                t.chap_users.remove(user.as_str());
            }
            Ok(())
        })
    }

    async fn list(&self) -> Result<Vec<TargetState>, TargetError> {
        self.op("list-targets", Vec::new(), |s| {
            Ok(s.snapshot.targets.iter().map(|(iqn, t)| state_of(iqn, t, &s.sessions)).collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iqn(s: &str) -> Iqn {
        Iqn::parse(s).unwrap()
    }

    #[tokio::test]
    async fn operations_are_idempotent_and_recorded() {
        let m = TargetModel::new();
        let t = iqn("iqn.2010-10.org.openstack:volume-1");
        let a = m.create_target(&t).await.unwrap();
        let b = m.create_target(&t).await.unwrap();
        assert_eq!(a.tid, b.tid);
        m.add_lun(&t, Lun::new(1).unwrap(), "/data/v.img").await.unwrap();
        m.add_lun(&t, Lun::new(1).unwrap(), "/data/v.img").await.unwrap();
        let calls = m.take_calls();
        assert_eq!(calls.iter().map(|c| c.changed).collect::<Vec<_>>(), [true, false, true, false]);
        m.delete_target(&t).await.unwrap();
        m.delete_target(&t).await.unwrap();
        assert_eq!(m.snapshot().object_count(), 0);
    }

    #[tokio::test]
    async fn login_follows_acl_and_chap() {
        let m = TargetModel::new();
        let t = iqn("iqn.2010-10.org.openstack:volume-1");
        let init = iqn("iqn.1993-08.org.debian:01:aaa");
        m.create_target(&t).await.unwrap();
        m.add_lun(&t, Lun::new(1).unwrap(), "/v").await.unwrap();
        let chap = ChapCredentials::parse("user01", "secretsecret1234").unwrap();
        m.set_chap(&t, &chap).await.unwrap();
        assert_eq!(
            m.login(t.as_str(), 1, init.as_str(), Some(("user01", "secretsecret1234"))),
            Err(LoginRefusal::TargetNotFound)
        );
        m.allow_initiator(&t, &init).await.unwrap();
        assert_eq!(m.login(t.as_str(), 1, init.as_str(), Some(("user01", "secretsecret1234"))), Ok(()));
        assert_eq!(
            m.login(t.as_str(), 1, init.as_str(), Some(("user01", "wrong"))),
            Err(LoginRefusal::AuthenticationFailure)
        );
        m.wipe();
        assert_eq!(
            m.login(t.as_str(), 1, init.as_str(), Some(("user01", "secretsecret1234"))),
            Err(LoginRefusal::TargetNotFound)
        );
    }
}

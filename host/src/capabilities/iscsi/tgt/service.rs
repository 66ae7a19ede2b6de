//! The iSCSI target service (`TargetService`) on tgtd: each operation of the capability, decided
//! on the model of tgtd's targets and sent as the changes it needs (`tgtd.rs`).

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::super::{
    ChapCredentials, ChapUser, Iqn, Lun, LunCapacity, Session, TargetError, TargetService, TargetState,
};
use super::guard;
use super::model::Known;
use super::protocol::{Failure, Request, parse_connections};
use super::tgtd::Tgtd;

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
                if let Some((mut taken, stale)) = self.take_back(iqn) {
                    // A LUN on a store that changed size since is made again by the export.
                    for lun in stale {
                        self.delete_lun(taken.tid, lun, iqn.as_str()).await?;
                        self.update(iqn, |t| t.luns.retain(|(l, _)| *l != lun));
                        taken.luns.retain(|(l, _)| *l != lun);
                    }
                    return Ok(taken);
                }
                // The id below the lowest in use (`Model::next_tid`): a target deleted and created
                // again gets its id back, and targets created at the same time get different ones.
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
                        // A new target takes logins.
                        model.offline.remove(iqn.as_str());
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
            let kept = guard(&self.model).kept.get(iqn.as_str()).map(|k| k.tid);
            if let Some(tid) = kept {
                return self.delete_kept(iqn.as_str(), tid).await;
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
            self.take_logins(target.tid, iqn).await?;
            match target.luns.iter().find(|(l, _)| *l == lun.get()) {
                Some((_, p)) if p == path => return Ok(()),
                Some((_, p)) => {
                    return Err(Failure::Other(format!("LUN {} of {iqn} already exposes {p}", lun.get())));
                }
                None => {}
            }
            // A new LUN: within the machine's ceiling, kept targets' LUNs giving way to it, or
            // refused before tgtd hears of it.
            let room = || self.ceiling.admit(self.luns_held(), super::ceiling::threads_now()).is_ok();
            if !room() {
                self.admit_lun().map_err(Failure::Other)?;
                self.evict_kept(room).await?;
                self.ceiling
                    .admit(self.luns_held(), super::ceiling::threads_now())
                    .map_err(Failure::Other)?;
            }
            let size = super::tgtd::store_size(path);
            match self.change(Request::new_lun(target.tid, lun.get(), path), iqn.as_str()).await {
                Ok(_) => {
                    self.serving(path, size);
                    self.update(iqn, |t| {
                        if !t.luns.iter().any(|(l, _)| *l == lun.get()) {
                            t.luns.push((lun.get(), path.to_string()));
                        }
                    })
                }
                // A LUN the model did not know of (made by an attempt whose answer was lost, say):
                // look again.
                Err(Failure::AlreadyExists(_)) => {
                    self.reload().await?;
                    match self.require(iqn)?.luns.iter().find(|(l, _)| *l == lun.get()) {
                        Some((_, p)) if p == path => {}
                        _ => {
                            return Err(Failure::Other(format!(
                                "LUN {} of {iqn} exposes another store",
                                lun.get()
                            )));
                        }
                    }
                }
                Err(f) => return Err(f),
            }
            crate::failpoint::pause(&format!("tgt.add-lun.made {iqn}")).await;
            if self.cfg.thin_provisioning {
                // Without it the LUN serves as before, only without UNMAP: not worth failing
                // the export for.
                // A restarted tgtd lost the LUN too: the whole step is tried again there.
                let thin = Request::thin_provisioning(target.tid, lun.get());
                match self.change(thin, iqn.as_str()).await {
                    Ok(_) => {}
                    Err(f @ Failure::Restarted { .. }) => return Err(f),
                    Err(f) => {
                        tracing::warn!(target = %iqn, "tgtd did not turn UNMAP on for the LUN; discards will fail: {f:?}")
                    }
                }
            }
            Ok(())
        })
    }

    async fn reopen_luns(&self, path: &str) -> Result<u32, TargetError> {
        self.check_backing_path(path)?;
        self.fresh().await.map_err(|f| f.into_error("show targets"))?;
        let exposing: Vec<String> = guard(&self.model)
            .targets
            .values()
            .filter(|k| k.state.luns.iter().any(|(_, p)| p == path))
            .map(|k| k.state.iqn.clone())
            .collect();
        let mut reopened = 0;
        for iqn in exposing {
            let iqn = Iqn::parse(&iqn)?;
            let _one = self.lock(&iqn).await;
            reopened += retrying!("reopen LUN", async {
                self.fresh().await?;
                // Gone meanwhile, or lost to a tgtd restart: a LUN made again opens the file anew.
                let Some(target) = self.known(&iqn) else { return Ok(0) };
                let (tid, name) = (target.tid, iqn.as_str());
                // tgtd closes the file and opens it again under the commands it runs: one that
                // starts in between fails. So nobody is logged in meanwhile: the target takes no
                // login, its sessions end (their initiators log in again and send anew what was in
                // flight), and it takes logins again after, whatever happened in between.
                self.change(Request::target_state(tid, "offline"), name).await?;
                crate::failpoint::hit("tgt.reopen.offline").await;
                let reopened = async {
                    self.end_sessions(tid, &iqn, None).await?;
                    let mut luns = 0;
                    for (lun, _) in target.luns.iter().filter(|(_, p)| p == path) {
                        let size = super::tgtd::store_size(path);
                        match self.change(Request::reopen(tid, *lun, path), name).await {
                            Ok(_) => {
                                self.serving(path, size);
                                luns += 1
                            }
                            Err(Failure::NotFound(_)) => {}
                            Err(f) => return Err(f),
                        }
                    }
                    Ok(luns)
                }
                .await;
                let ready = self.change(Request::target_state(tid, "ready"), name).await;
                let luns = reopened?;
                ready?;
                guard(&self.model).offline.remove(name);
                Ok(luns)
            })?;
        }
        Ok(reopened)
    }

    async fn remove_lun(&self, iqn: &Iqn, lun: Lun) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("remove LUN", async {
            self.fresh().await?;
            let Some(target) = self.known(iqn) else { return Ok(()) };
            if !target.luns.iter().any(|(l, _)| *l == lun.get()) {
                return Ok(());
            }
            self.delete_lun(target.tid, lun.get(), iqn.as_str()).await?;
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
            self.end_sessions(target.tid, iqn, Some(initiator)).await
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
            if target.chap_users == [user] && self.accounts.knows(credentials) {
                return Ok(());
            }
            let (tid, name) = (target.tid, iqn.as_str());
            self.close_acl(tid, iqn, &target.initiators).await?;
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
            let reuse = self.accounts.knows(credentials);
            if !reuse {
                self.create_account(credentials, name).await?;
            }
            self.accounts.unkeep(user);
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
            self.open_acl(tid, iqn, &target.initiators).await
        })
    }

    /// A per-initiator account (`initiators.rs`) is bound beside the others: binding appends to
    /// tgtd's list of a target's accounts, which is safe (see `unbind_account` for what is not).
    async fn bind_account(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("bind account", async {
            self.fresh().await?;
            let target = self.require(iqn)?;
            let user = credentials.user.as_str();
            // A bound per-initiator account has the secret its name was derived with.
            if target.chap_users.iter().any(|u| u == user) {
                return Ok(());
            }
            let (tid, name) = (target.tid, iqn.as_str());
            if !self.accounts.knows(credentials) {
                self.ensure_account(credentials, name).await?;
            }
            self.accounts.unkeep(user);
            match self.change(Request::bind_account(tid, user), name).await {
                Ok(_) | Err(Failure::AlreadyExists(_)) => {}
                // Deleted by someone else since this process made it: made again.
                Err(Failure::NotFound(_)) => {
                    self.accounts.forget(user);
                    self.ensure_account(credentials, name).await?;
                    self.change(Request::bind_account(tid, user), name).await?;
                }
                Err(f) => return Err(f),
            }
            self.update(iqn, |t| {
                if !t.chap_users.iter().any(|u| u == user) {
                    t.chap_users.push(user.to_string());
                }
            });
            Ok(())
        })
    }

    /// tgtd 1.0.85 keeps a target's accounts in an array and, when one that is not the last is
    /// unbound, leaves a hole below its count: the last account is then hidden from logins and
    /// `show target` dereferences the hole (tgtd crashes). Unbinding the last is safe. So the
    /// accounts after this one are unbound (last first), this one, and the others bound again in
    /// their order; their initiators' new logins fail for those milliseconds, open sessions go on.
    /// A target never has no account while its ACL admits someone (that would admit logins
    /// without CHAP): if the dance passes through none, the ACL is emptied for its duration, and
    /// unbinding a target's last account while its ACL admits someone is refused.
    async fn unbind_account(&self, iqn: &Iqn, user: &ChapUser) -> Result<(), TargetError> {
        let _one = self.lock(iqn).await;
        retrying!("unbind account", async {
            self.fresh().await?;
            let Some(target) = self.known(iqn) else { return Ok(()) };
            let Some(at) = target.chap_users.iter().position(|u| u == user.as_str()) else { return Ok(()) };
            let (tid, name) = (target.tid, iqn.as_str());
            let after = target.chap_users[at + 1..].to_vec();
            if target.chap_users.len() == 1 && !target.initiators.is_empty() {
                return Err(Failure::Other(format!(
                    "{iqn}: its ACL admits {} and this is its only CHAP account: deny the initiators first",
                    target.initiators.join(", ")
                )));
            }
            let closes = at == 0 && !target.initiators.is_empty();
            if closes {
                self.close_acl(tid, iqn, &target.initiators).await?;
            }
            for other in after.iter().rev().map(String::as_str).chain([user.as_str()]) {
                match self.change(Request::unbind_account(tid, other), name).await {
                    Ok(_) | Err(Failure::NotFound(_)) => {}
                    Err(f) => return Err(f),
                }
                self.update(iqn, |t| t.chap_users.retain(|u| u != other));
            }
            for other in &after {
                match self.change(Request::bind_account(tid, other), name).await {
                    Ok(_) | Err(Failure::AlreadyExists(_)) => {}
                    Err(f) => return Err(f),
                }
                self.update(iqn, |t| t.chap_users.push(other.clone()));
            }
            if closes {
                self.open_acl(tid, iqn, &target.initiators).await?;
            }
            self.release_account(user.as_str(), name).await
        })
    }

    async fn sweep(&self) -> Result<usize, TargetError> {
        Tgtd::sweep(self).await
    }

    /// Every target, as tgtd lists them now; the model is reloaded from the same listing.
    fn lun_capacity(&self) -> Option<LunCapacity> {
        Some(LunCapacity { held: self.luns_held(), ceiling: self.ceiling.luns() })
    }

    fn unmaps(&self) -> bool {
        self.cfg.thin_provisioning
    }

    /// Kept targets' LUNs give way to a new LUN (`add_lun`): they count neither as LUNs held
    /// nor with their threads.
    fn admit_lun(&self) -> Result<(), String> {
        let (live, kept) = self.luns_live_and_kept();
        let threads = super::ceiling::threads_now().map(|t| t.saturating_sub(kept * self.ceiling.io_threads));
        self.ceiling.admit(live, threads).inspect_err(|why| {
            tracing::warn!(held = live, ceiling = self.ceiling.luns(), "a new LUN is refused: {why}");
        })
    }

    /// Another control socket than the model's (a stat, no request): tgtd was restarted.
    fn restarted(&self) -> bool {
        let known = guard(&self.model).daemon.map(|d| d.socket);
        matches!((known, self.socket_id()), (Some(known), Some(now)) if known != now)
    }

    fn holds_luns(&self, iqn: &str) -> bool {
        guard(&self.model).targets.get(iqn).is_some_and(|k| !k.state.luns.is_empty())
    }

    async fn list(&self) -> Result<Vec<TargetState>, TargetError> {
        let targets = self.listing().await.map_err(|f| f.into_error("show targets"))?.0;
        // A stat per LUN, off the runtime's threads (10,000 LUNs: some milliseconds).
        tokio::task::spawn_blocking(move || {
            targets.into_iter().map(|t| TargetState { stale_stores: stale_stores(&t), ..t }).collect()
        })
        .await
        .map_err(|e| TargetError::Failed(format!("cannot compare the LUNs with their stores: {e}")))
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

/// The stores (regular files) of `target`'s LUNs whose size now is not the size the LUN serves,
/// as tgtd shows both: a store grown behind its LUN (a reopen that did not happen) or shrunk.
fn stale_stores(target: &TargetState) -> Vec<String> {
    target
        .luns
        .iter()
        .filter_map(|(lun, path)| {
            let (_, shown) = target.lun_sizes.iter().find(|(l, _)| l == lun)?;
            let size = super::tgtd::store_size(path)?;
            (super::protocol::shown_megabytes(size) != *shown).then(|| path.clone())
        })
        .collect()
}

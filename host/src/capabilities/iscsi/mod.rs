//! `berth:driver/iscsi-target`: typed operations on one iSCSI target service.
//!
//! Every argument is a validated newtype ([`Iqn`], [`Lun`], [`ChapUser`], a CHAP [`Secret`])
//! before it reaches a [`TargetService`], so no implementation can be handed a hostile string.
//! Two implementations: [`tgt::Tgtd`] drives Linux's tgtd over its control socket, and
//! [`model::TargetModel`] is an in-memory model that records every call (for the conformance
//! suite and tests).

pub mod initiators;
pub mod model;
pub mod tgt;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use berth_driver_sdk::names::{MAX_CHAP_FIELD, check_chap_secret, check_chap_username, check_iscsi_name};

use super::backing::{BackingStores, StoreError};
use super::namespace::Namespace;
use super::secret::Secret;

/// A validated iSCSI name (RFC 3720; see `berth_driver_sdk::names::check_iscsi_name`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Iqn(String);

impl Iqn {
    pub fn parse(name: &str) -> Result<Self, TargetError> {
        check_iscsi_name(name).map_err(|e| TargetError::InvalidArgument(e.to_string()))?;
        Ok(Iqn(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Iqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A LUN that can carry a backing store: 1 to 255 (LUN 0 is the target's controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lun(u32);

impl Lun {
    pub fn new(lun: u32) -> Result<Self, TargetError> {
        if !(1..=255).contains(&lun) {
            return Err(TargetError::InvalidArgument(format!(
                "LUN {lun} is out of range: use 1 to 255 (LUN 0 is the controller)"
            )));
        }
        Ok(Lun(lun))
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

/// A validated CHAP user name (`[A-Za-z0-9]{1,64}`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChapUser(String);

impl ChapUser {
    pub fn parse(user: &str) -> Result<Self, TargetError> {
        check_chap_username(user).map_err(|e| TargetError::InvalidArgument(e.to_string()))?;
        Ok(ChapUser(user.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Validated incoming CHAP credentials. The secret never prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    pub user: ChapUser,
    pub secret: Secret,
}

impl ChapCredentials {
    pub fn parse(user: &str, secret: &str) -> Result<Self, TargetError> {
        check_chap_secret(secret).map_err(|e| TargetError::InvalidArgument(e.to_string()))?;
        Ok(ChapCredentials { user: ChapUser::parse(user)?, secret: Secret::new(secret) })
    }
}

/// A target as the service reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetState {
    pub iqn: String,
    pub tid: u32,
    /// LUNs with a backing store and the store's host path (LUN 0 excluded).
    pub luns: Vec<(u32, String)>,
    /// Initiator names in the ACL.
    pub initiators: Vec<String>,
    /// Bound incoming CHAP user names.
    pub chap_users: Vec<String>,
    /// Logged-in sessions.
    pub sessions: u32,
    /// Taking no logins (tgtd's `State: offline`). This and the two below are facts of a
    /// listing ([`TargetService::list`]); `show` answers without them.
    pub offline: bool,
    /// Each LUN's size as the service shows it (tgtd: its own "MB", `tgt::shown_megabytes`).
    pub lun_sizes: Vec<(u32, u64)>,
    /// Stores (host paths) whose LUNs serve another size than the store has now (it grew behind
    /// them).
    pub stale_stores: Vec<String>,
}

impl TargetState {
    /// What a service keeps of a listed target between listings: all but the listing's own
    /// facts (state and sizes change without the service's doing: only a listing knows them).
    pub fn known_part(listed: &TargetState) -> TargetState {
        TargetState { offline: false, lun_sizes: Vec::new(), stale_stores: Vec::new(), ..listed.clone() }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Refused before any command ran.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// The service did not answer in time; the operation may or may not have happened.
    #[error("timeout: {0}")]
    Timeout(String),
    #[error("failed: {0}")]
    Failed(String),
    /// The target (or store, or CHAP account) belongs to another backend.
    #[error("{0}")]
    NotPermitted(String),
}

/// Where initiators connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portal {
    pub address: String,
    pub port: u16,
}

/// The LUNs a target service holds, and its ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LunCapacity {
    pub held: u64,
    pub ceiling: u64,
}

/// An iSCSI target service. Every operation is idempotent and touches one target only.
#[async_trait]
pub trait TargetService: Send + Sync {
    async fn show(&self, iqn: &Iqn) -> Result<Option<TargetState>, TargetError>;
    async fn create_target(&self, iqn: &Iqn) -> Result<TargetState, TargetError>;
    /// Deletes the target, closing its sessions, and the export's CHAP accounts bound to it
    /// (per-initiator accounts, `initiators.rs`, stay for their initiators' other targets).
    async fn delete_target(&self, iqn: &Iqn) -> Result<(), TargetError>;
    /// Exposes the file at `path` (a host path the capability resolved) as `lun`.
    async fn add_lun(&self, iqn: &Iqn, lun: Lun, path: &str) -> Result<(), TargetError>;
    async fn remove_lun(&self, iqn: &Iqn, lun: Lun) -> Result<(), TargetError>;
    /// The LUNs that expose the file at `path` open it again, so that they serve the size it has
    /// now (after it grew: an attached volume's extend); answers how many. Their targets'
    /// sessions may be ended for it (tgtd), for their initiators to log in again.
    async fn reopen_luns(&self, path: &str) -> Result<u32, TargetError>;
    async fn allow_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError>;
    /// Removes the initiator from the ACL. Sessions it has established stay (see
    /// [`TargetService::close_sessions`]).
    async fn deny_initiator(&self, iqn: &Iqn, initiator: &Iqn) -> Result<(), TargetError>;
    /// The sessions logged in to the target now (none when the target does not exist).
    async fn sessions(&self, iqn: &Iqn) -> Result<Vec<Session>, TargetError>;
    /// Ends every session of `initiator` on the target and returns once none is left; answers how
    /// many were ended. The ACL is not changed.
    async fn close_sessions(&self, iqn: &Iqn, initiator: &Iqn) -> Result<u32, TargetError>;
    /// Makes these the target's only incoming CHAP credentials: the account is created (or its
    /// secret replaced) and bound; other accounts bound to the target are unbound, and deleted
    /// when no other target uses them.
    async fn set_chap(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError>;
    /// Binds a per-initiator account (`initiators.rs`) to the target beside the accounts bound
    /// already, making it first if the service does not have it. Idempotent.
    async fn bind_account(&self, iqn: &Iqn, credentials: &ChapCredentials) -> Result<(), TargetError>;
    /// Unbinds an account from the target, leaving the others bound and the account in the
    /// service (a per-initiator account is kept for reuse). Idempotent.
    async fn unbind_account(&self, iqn: &Iqn, user: &ChapUser) -> Result<(), TargetError>;
    /// Every target, for the host's own drift report.
    async fn list(&self) -> Result<Vec<TargetState>, TargetError>;
    /// The LUNs the service holds and how many it may hold (none: it has no ceiling).
    fn lun_capacity(&self) -> Option<LunCapacity> {
        None
    }
    /// Whether a new LUN may be made now; the refusal names the limit and the setting.
    fn admit_lun(&self) -> Result<(), String> {
        Ok(())
    }
    /// Whether the target `iqn` exposes a LUN, as far as the service knows without asking.
    fn holds_luns(&self, _iqn: &str) -> bool {
        false
    }
    /// Whether its LUNs take UNMAP (SCSI's discard), giving unmapped blocks back.
    fn unmaps(&self) -> bool {
        false
    }
    /// The targets that have the CHAP account `user` bound.
    async fn account_targets(&self, user: &ChapUser) -> Result<Vec<String>, TargetError> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .filter(|t| t.chap_users.iter().any(|u| u == user.as_str()))
            .map(|t| t.iqn)
            .collect())
    }
    /// Whether the service's daemon is no longer the one it last answered from (a restarted tgtd,
    /// which lost every target), as far as can be seen without asking it.
    fn restarted(&self) -> bool {
        false
    }
    /// Housekeeping the host runs now and then (tgtd: deleting CHAP accounts kept unused);
    /// returns how many objects it removed.
    async fn sweep(&self) -> Result<usize, TargetError> {
        Ok(0)
    }
}

/// One initiator's session on a target.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Session {
    pub initiator: String,
    /// One address per connection of the session.
    pub addresses: Vec<String>,
}

/// How the host generates CHAP credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChapPolicy {
    pub username_length: usize,
    pub secret_length: usize,
}

/// 17 characters of a 62-symbol alphabet carry 101 bits; 16 would carry only 95.
pub const MIN_SECRET_LENGTH: usize = 17;

impl Default for ChapPolicy {
    fn default() -> Self {
        ChapPolicy { username_length: 20, secret_length: 20 }
    }
}

impl ChapPolicy {
    pub fn validate(&self) -> Result<(), String> {
        if !(MIN_SECRET_LENGTH..=MAX_CHAP_FIELD).contains(&self.secret_length) {
            return Err(format!(
                "chap secret length {} is out of range {MIN_SECRET_LENGTH}..={MAX_CHAP_FIELD} \
                 (at least 96 bits of entropy are required)",
                self.secret_length
            ));
        }
        if !(8..=MAX_CHAP_FIELD).contains(&self.username_length) {
            return Err(format!(
                "chap username length {} is out of range 8..={MAX_CHAP_FIELD}",
                self.username_length
            ));
        }
        Ok(())
    }

    /// Fresh credentials from the operating system's CSPRNG.
    pub fn generate(&self) -> ChapCredentials {
        let user = random_alphanumeric(self.username_length);
        let secret = random_alphanumeric(self.secret_length);
        ChapCredentials { user: ChapUser(user), secret: Secret::new(secret) }
    }
}

/// `len` characters drawn uniformly from `[A-Za-z0-9]` with the OS CSPRNG, by rejection
/// sampling (no modulo bias).
pub fn random_alphanumeric(len: usize) -> String {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(len);
    let mut buf = [0u8; 64];
    while out.len() < len {
        getrandom::fill(&mut buf).expect("the operating system's random number generator failed");
        for &b in &buf {
            // 248 = 4 * 62: bytes at or above it would bias the result.
            if b < 248 && out.len() < len {
                out.push(ALPHABET[(b % 62) as usize] as char);
            }
        }
    }
    out
}

/// The iSCSI capability as granted to one driver: the service, the portals it advertises, the
/// CHAP policy, the backend's backing stores that LUNs may expose, and the backend's namespace
/// (which targets it may touch).
#[derive(Clone)]
pub struct IscsiCapability {
    pub service: Arc<dyn TargetService>,
    pub portals: Vec<Portal>,
    pub chap: ChapPolicy,
    pub stores: Arc<BackingStores>,
    pub namespace: Namespace,
    /// The node's key for per-initiator credentials (`initiators.rs`).
    pub initiator_key: initiators::InitiatorKey,
}

impl IscsiCapability {
    /// A target name the calling backend owns (parsed), or `NotPermitted` (logged).
    pub fn own(&self, iqn: &str) -> Result<Iqn, TargetError> {
        let parsed = Iqn::parse(iqn)?;
        self.namespace.target(iqn).map_err(|e| TargetError::NotPermitted(e.to_string()))?;
        Ok(parsed)
    }

    /// The LUNs exposing the backend's store `name` serve the size it has now (after it grew).
    /// Idempotent: a store that grew before and is exposed at its old size still (a call that
    /// ended before its LUNs were reopened) is served at its size by the next call. The reopening
    /// runs to its end even when the call that asked for it is abandoned (its deadline passed):
    /// a target closed to logins meanwhile is always opened again.
    pub async fn store_grew(&self, name: &str) -> Result<(), StoreError> {
        let path = self.stores.path(name)?;
        let path = path
            .to_str()
            .ok_or_else(|| StoreError::Failed(format!("store {name}: path is not UTF-8")))?
            .to_string();
        let service = self.service.clone();
        let reopening = tokio::spawn(async move { service.reopen_luns(&path).await });
        let reopened = reopening.await.unwrap_or_else(|e| Err(TargetError::Failed(e.to_string())));
        match reopened {
            Ok(reopened) => {
                if reopened > 0 {
                    tracing::info!(store = name, luns = reopened, "LUNs opened their grown store again");
                }
                Ok(())
            }
            Err(e) => Err(StoreError::Failed(format!(
                "store {name} grew, but the LUN exposing it still serves its old size: {e}"
            ))),
        }
    }

    /// `Ok` when the CHAP account `user` is bound to none of another backend's targets.
    pub async fn own_account(&self, user: &ChapUser) -> Result<(), TargetError> {
        for iqn in self.service.account_targets(user).await? {
            if self.namespace.target(&iqn).is_err() {
                let refusal =
                    self.namespace.refuse(format!("CHAP account {} (bound to {iqn})", user.as_str()));
                return Err(TargetError::NotPermitted(refusal.to_string()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_credentials_are_valid_distinct_and_sized() {
        let policy = ChapPolicy::default();
        let a = policy.generate();
        let b = policy.generate();
        assert_eq!(a.user.as_str().len(), 20);
        assert_eq!(a.secret.expose().len(), 20);
        assert_ne!(a.secret, b.secret);
        ChapCredentials::parse(a.user.as_str(), a.secret.expose()).unwrap();
    }

    #[test]
    fn short_secrets_are_refused_by_policy() {
        assert!(ChapPolicy { username_length: 20, secret_length: 16 }.validate().is_err());
        assert!(ChapPolicy { username_length: 20, secret_length: 17 }.validate().is_ok());
    }

    #[test]
    fn generated_characters_cover_the_alphabet_evenly() {
        let sample = random_alphanumeric(62 * 200);
        let mut counts = std::collections::HashMap::new();
        for c in sample.chars() {
            *counts.entry(c).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 62);
        assert!(counts.values().all(|&n| (100..=320).contains(&n)), "{counts:?}");
    }

    #[test]
    fn luns_are_bounded() {
        assert!(Lun::new(0).is_err());
        assert!(Lun::new(256).is_err());
        assert_eq!(Lun::new(1).unwrap().get(), 1);
    }
}

//! `berth:iscsi-chap/initiator-accounts` (its own package, `wit/iscsi-chap@0.1.0`): one CHAP
//! account per initiator, volume owner and backend, made by the host, where a driver of the
//! plain contract makes one per export (`set-chap`).
//!
//! Why (docs/security.md, "Per-initiator CHAP"): tgtd's costs grow with the accounts it holds
//! (making one scans its account ids, deleting one walks every target), so an account per export
//! made and deleted with every attach cycle is what kept a tgtd with thousands of exports slow.
//! An account per initiator is made once and bound to each target the initiator attaches, and
//! unbinding it from one target ends that initiator's access there and nobody else's: a
//! multiattach target no longer needs its credentials rotated when one host leaves.
//!
//! Names and secrets are derived, not stored: HMAC-SHA256 under the node's key
//! ([`InitiatorKey`], 32 random bytes in `<data_dir>/tgt-chap.key`, mode 0600), so that the same
//! initiator gets the same credentials for every volume of a project after a restart of Berth or
//! of tgtd (what an attachment's stored connection info holds stays valid), and a driver never
//! sees the key. The owner (the volume's project) is part of the secret: whoever attaches a volume
//! of project P to an initiator learns the credentials bound to P's targets on it, never those
//! of another project's volumes on the same initiator. An account's name starts with a digest of
//! its backend and initiator (not keyed), so that revoking an initiator finds its accounts for
//! every owner, and those made under an earlier key.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::{ChapCredentials, ChapPolicy, ChapUser, Iqn, IscsiCapability, TargetError};
use crate::capabilities::secret::Secret;

/// Per-initiator accounts' names start with this letter (a set-chap account's name is random
/// alphanumerics of the policy's length, so the rest of the name tells them apart).
const MARK: &str = "i";
/// Hex digits of the digest of backend and initiator in a name.
const INITIATOR_DIGITS: usize = 24;
/// Hex digits of the keyed digest of the owner (and of the key) in a name.
const OWNER_DIGITS: usize = 16;

/// The node's key for per-initiator credentials.
#[derive(Clone)]
pub struct InitiatorKey(Arc<[u8; 32]>);

impl std::fmt::Debug for InitiatorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InitiatorKey(***)")
    }
}

impl InitiatorKey {
    /// The key in `path`, made (32 bytes from the OS CSPRNG, mode 0600) when the file does not
    /// exist.
    pub fn load_or_create(path: &Path) -> std::io::Result<InitiatorKey> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let key: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
                    std::io::Error::other(format!("{} does not hold a 32-byte key", path.display()))
                })?;
                Ok(InitiatorKey(Arc::new(key)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::random();
                let tmp = path.with_extension("key.tmp");
                {
                    use std::os::unix::fs::OpenOptionsExt;
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o600)
                        .open(&tmp)?;
                    f.write_all(&key.0[..])?;
                    f.sync_all()?;
                }
                std::fs::rename(&tmp, path)?;
                Ok(key)
            }
            Err(e) => Err(e),
        }
    }

    /// A key for this process only (tests, the conformance suite): credentials change with it.
    pub fn random() -> InitiatorKey {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).expect("the operating system's random number generator failed");
        InitiatorKey(Arc::new(key))
    }

    fn mac(&self, parts: &[&str]) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0[..]).expect("HMAC takes any key length");
        for p in parts {
            mac.update(p.as_bytes());
            mac.update(&[0]);
        }
        mac.finalize().into_bytes().into()
    }

    /// The credentials of `initiator` for volumes of `owner` on `backend`.
    pub fn credentials(
        &self,
        backend: &str,
        initiator: &str,
        owner: &str,
        policy: &ChapPolicy,
    ) -> ChapCredentials {
        let owner_part = hex(&self.mac(&["owner", backend, initiator, owner]))[..OWNER_DIGITS].to_string();
        let user = format!("{}{owner_part}", initiator_prefix(backend, initiator));
        let mut secret = String::with_capacity(policy.secret_length);
        let mut round = 0u32;
        while secret.len() < policy.secret_length {
            let block = self.mac(&["secret", backend, initiator, owner, &round.to_string()]);
            secret.extend(alphanumerics(&block).take(policy.secret_length - secret.len()));
            round += 1;
        }
        ChapCredentials { user: ChapUser(user), secret: Secret::new(secret) }
    }
}

/// The start of the names of `initiator`'s accounts on `backend`, for every owner and key.
pub fn initiator_prefix(backend: &str, initiator: &str) -> String {
    let digest = Sha256::digest(format!("{backend}\0{initiator}").as_bytes());
    format!("{MARK}{}", &hex(&digest)[..INITIATOR_DIGITS])
}

/// Whether `user` is the name of a per-initiator account (of any backend): such an account
/// outlives the targets it is bound to.
pub fn is_initiator_account(user: &str) -> bool {
    user.len() == MARK.len() + INITIATOR_DIGITS + OWNER_DIGITS
        && user.starts_with(MARK)
        && user[MARK.len()..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Characters of `[A-Za-z0-9]` from uniformly random bytes, by rejection (no modulo bias).
fn alphanumerics(bytes: &[u8]) -> impl Iterator<Item = char> + '_ {
    const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    bytes.iter().filter(|b| **b < 248).map(|b| ALPHABET[(b % 62) as usize] as char)
}

impl IscsiCapability {
    /// Binds `initiator`'s account for volumes of `owner` to the target, and answers its
    /// credentials.
    pub async fn grant_initiator(
        &self,
        iqn: &str,
        initiator: &str,
        owner: Option<&str>,
    ) -> Result<ChapCredentials, TargetError> {
        let target = self.own(iqn)?;
        let initiator = Iqn::parse(initiator)?;
        let Some(owner) = owner else {
            return Err(TargetError::Failed(
                "the host did not name the owner of the volume this call is about; per-initiator accounts \
                 are made only for a volume's calls"
                    .into(),
            ));
        };
        let credentials =
            self.initiator_key.credentials(self.namespace.backend(), initiator.as_str(), owner, &self.chap);
        self.service.bind_account(&target, &credentials).await?;
        Ok(credentials)
    }

    /// Unbinds `initiator`'s accounts (every owner's) from the target.
    pub async fn revoke_initiator(&self, iqn: &str, initiator: &str) -> Result<(), TargetError> {
        let target = self.own(iqn)?;
        let initiator = Iqn::parse(initiator)?;
        let prefix = initiator_prefix(self.namespace.backend(), initiator.as_str());
        self.unbind_where(&target, |user| user.starts_with(&prefix) && is_initiator_account(user)).await
    }

    /// Unbinds every per-initiator account from the target.
    pub async fn revoke_every_initiator(&self, iqn: &str) -> Result<(), TargetError> {
        let target = self.own(iqn)?;
        self.unbind_where(&target, is_initiator_account).await
    }

    async fn unbind_where(&self, target: &Iqn, which: impl Fn(&str) -> bool) -> Result<(), TargetError> {
        let Some(state) = self.service.show(target).await? else { return Ok(()) };
        for user in state.chap_users.iter().filter(|u| which(u)) {
            self.service.unbind_account(target, &ChapUser::parse(user)?).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_stable_per_initiator_and_owner_and_differ_between_them() {
        let key = InitiatorKey::random();
        let policy = ChapPolicy::default();
        let a = key.credentials("b1", "iqn.2004-10.com.example:a", "p1", &policy);
        let again = key.credentials("b1", "iqn.2004-10.com.example:a", "p1", &policy);
        assert_eq!(a, again);
        assert_eq!(a.secret.expose().len(), policy.secret_length);
        assert!(ChapCredentials::parse(a.user.as_str(), a.secret.expose()).is_ok(), "valid for tgtd");
        assert!(is_initiator_account(a.user.as_str()));
        for other in [
            key.credentials("b1", "iqn.2004-10.com.example:a", "p2", &policy),
            key.credentials("b1", "iqn.2004-10.com.example:b", "p1", &policy),
            key.credentials("b2", "iqn.2004-10.com.example:a", "p1", &policy),
            InitiatorKey::random().credentials("b1", "iqn.2004-10.com.example:a", "p1", &policy),
        ] {
            assert_ne!(other.user, a.user);
            assert_ne!(other.secret, a.secret);
        }
    }

    #[test]
    fn an_initiators_accounts_share_a_prefix_for_every_owner_and_key() {
        let prefix = initiator_prefix("b1", "iqn.2004-10.com.example:a");
        let policy = ChapPolicy::default();
        for (key, owner) in [(InitiatorKey::random(), "p1"), (InitiatorKey::random(), "p2")] {
            let c = key.credentials("b1", "iqn.2004-10.com.example:a", owner, &policy);
            assert!(c.user.as_str().starts_with(&prefix));
        }
        assert!(!initiator_prefix("b1", "iqn.2004-10.com.example:b").starts_with(&prefix));
        assert!(!is_initiator_account(ChapPolicy::default().generate().user.as_str()), "a set-chap name");
    }

    /// A capability of backend `a` on a model shared with backend `b`'s target.
    fn capability_of_a(dir: &Path) -> (IscsiCapability, Arc<super::super::model::TargetModel>) {
        use super::super::model::TargetModel;
        use crate::capabilities::backing::BackingStores;
        use crate::capabilities::namespace::Namespace;
        let model = Arc::new(TargetModel::new());
        let namespace = Namespace::new("a", &Default::default()).unwrap();
        let stores = BackingStores::new(dir, &namespace, std::time::Duration::from_secs(5)).unwrap();
        let cap = IscsiCapability {
            service: model.clone(),
            portals: Vec::new(),
            chap: ChapPolicy::default(),
            stores: Arc::new(stores),
            namespace,
            initiator_key: InitiatorKey::random(),
        };
        (cap, model)
    }

    #[tokio::test]
    async fn grants_and_revocations_reach_only_the_backends_own_targets_and_need_an_owner() {
        use super::super::TargetService;
        let dir = tempfile::tempdir().unwrap();
        let (cap, model) = capability_of_a(dir.path());
        let alice = "iqn.1993-08.org.debian:01:alice";
        let ours = Iqn::parse("iqn.2010-10.org.openstack:a:volume-1").unwrap();
        let theirs = Iqn::parse("iqn.2010-10.org.openstack:b:volume-2").unwrap();
        model.create_target(&ours).await.unwrap();
        model.create_target(&theirs).await.unwrap();

        let e = cap.grant_initiator(theirs.as_str(), alice, Some("p")).await.unwrap_err();
        assert!(matches!(e, TargetError::NotPermitted(_)), "{e}");
        let e = cap.revoke_initiator(theirs.as_str(), alice).await.unwrap_err();
        assert!(matches!(e, TargetError::NotPermitted(_)), "{e}");
        let e = cap.revoke_every_initiator(theirs.as_str()).await.unwrap_err();
        assert!(matches!(e, TargetError::NotPermitted(_)), "{e}");
        let e = cap.grant_initiator(ours.as_str(), alice, None).await.unwrap_err();
        assert!(matches!(e, TargetError::Failed(_)), "no owner, no account: {e}");
        let e = cap.grant_initiator(ours.as_str(), "alice; rm -rf /", Some("p")).await.unwrap_err();
        assert!(matches!(e, TargetError::InvalidArgument(_)), "{e}");
        assert!(model.show(&theirs).await.unwrap().unwrap().chap_users.is_empty());

        let granted = cap.grant_initiator(ours.as_str(), alice, Some("p")).await.unwrap();
        assert_eq!(
            cap.grant_initiator(ours.as_str(), alice, Some("p")).await.unwrap(),
            granted,
            "idempotent"
        );
        let bob =
            cap.grant_initiator(ours.as_str(), "iqn.1993-08.org.debian:01:bob", Some("p")).await.unwrap();
        assert_eq!(model.show(&ours).await.unwrap().unwrap().chap_users.len(), 2);
        cap.revoke_initiator(ours.as_str(), alice).await.unwrap();
        let bound = model.show(&ours).await.unwrap().unwrap().chap_users;
        assert_eq!(bound, vec![bob.user.as_str().to_string()], "only alice's account went");
        cap.revoke_every_initiator(ours.as_str()).await.unwrap();
        assert!(model.show(&ours).await.unwrap().unwrap().chap_users.is_empty());
    }

    #[test]
    fn the_key_file_is_made_once_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tgt-chap.key");
        let made = InitiatorKey::load_or_create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let read = InitiatorKey::load_or_create(&path).unwrap();
        let policy = ChapPolicy::default();
        assert_eq!(
            made.credentials("b", "iqn.2004-10.com.example:a", "p", &policy),
            read.credentials("b", "iqn.2004-10.com.example:a", "p", &policy)
        );
        std::fs::write(&path, b"short").unwrap();
        assert!(InitiatorKey::load_or_create(&path).is_err(), "a damaged key is refused, not replaced");
    }
}

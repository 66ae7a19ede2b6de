//! The CHAP accounts this process made in one tgtd: which secret each has (as a digest: tgtd never
//! shows secrets, and repeating `set-chap` with the same credentials must change nothing), and
//! which are kept unbound for reuse since their target went.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::super::ChapCredentials;

#[derive(Default)]
pub(super) struct Accounts {
    /// sha256 of the secret of each account this process created.
    made: Mutex<HashMap<String, [u8; 32]>>,
    /// Accounts kept unbound since their target was deleted, and since when.
    kept: Mutex<HashMap<String, Instant>>,
}

fn digest(credentials: &ChapCredentials) -> [u8; 32] {
    Sha256::digest(credentials.secret.expose().as_bytes()).into()
}

impl Accounts {
    /// This process made the account with these credentials.
    pub(super) fn remember(&self, credentials: &ChapCredentials) {
        super::guard(&self.made).insert(credentials.user.as_str().to_string(), digest(credentials));
    }

    /// Whether this process made the account with exactly these credentials.
    pub(super) fn knows(&self, credentials: &ChapCredentials) -> bool {
        super::guard(&self.made).get(credentials.user.as_str()).is_some_and(|d| *d == digest(credentials))
    }

    /// Whether this process made an account of that name.
    pub(super) fn made(&self, user: &str) -> bool {
        super::guard(&self.made).contains_key(user)
    }

    /// The account is gone from tgtd (or never got there).
    pub(super) fn forget(&self, user: &str) {
        super::guard(&self.made).remove(user);
        super::guard(&self.kept).remove(user);
    }

    /// The account stays in tgtd, unbound, for reuse.
    pub(super) fn keep(&self, user: &str) {
        super::guard(&self.kept).insert(user.to_string(), Instant::now());
    }

    /// An unbound per-initiator account this process did not make (an earlier run of it did:
    /// their names and secrets are derived, so this process would make the same): kept from now
    /// on, unless it is kept already.
    pub(super) fn adopt(&self, user: &str) {
        super::guard(&self.kept).entry(user.to_string()).or_insert_with(Instant::now);
    }

    /// The account is bound again: no longer kept.
    pub(super) fn unkeep(&self, user: &str) {
        super::guard(&self.kept).remove(user);
    }

    /// The accounts kept unbound for `at_least`.
    pub(super) fn kept_for(&self, at_least: Duration) -> Vec<String> {
        super::guard(&self.kept)
            .iter()
            .filter(|(_, since)| since.elapsed() >= at_least)
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// A new daemon has none of them.
    pub(super) fn clear(&self) {
        super::guard(&self.made).clear();
        super::guard(&self.kept).clear();
    }
}

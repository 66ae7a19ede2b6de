//! What one backend owns, so that its driver cannot reach another backend's volumes: its own
//! directory of backing stores (`volumes/<backend>/`) and the iSCSI targets whose IQN starts with
//! its target prefix. Every capability call on something outside is refused with
//! [`NotPermitted`] and logged.
//!
//! The prefix is the backend's `target_prefix` setting when the operator sets it, otherwise
//! `iqn.2010-10.org.openstack:<backend>:`; the host hands it to the driver through that same
//! setting (drivers build target names from it), and refuses to start when one backend's prefix
//! is a prefix of another's.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth_driver_sdk::names::check_iscsi_name;

/// The setting through which a driver learns its target prefix.
pub const TARGET_PREFIX: &str = "target_prefix";

/// A refusal: the calling backend does not own what it named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not permitted: {what} does not belong to backend {backend}")]
pub struct NotPermitted {
    pub backend: String,
    pub what: String,
}

/// One backend's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    backend: Arc<str>,
    target_prefix: Arc<str>,
}

impl Namespace {
    /// The namespace of `backend` given its driver settings (`target_prefix`, if set).
    pub fn new(backend: &str, settings: &BTreeMap<String, String>) -> Result<Namespace, String> {
        check_backend_name(backend)?;
        let prefix = match settings.get(TARGET_PREFIX) {
            Some(p) => p.clone(),
            None => default_prefix(backend),
        };
        check_iscsi_name(&format!("{prefix}x"))
            .map_err(|e| format!("backend {backend}: target_prefix {prefix:?} cannot start an IQN: {e}"))?;
        Ok(Namespace { backend: backend.into(), target_prefix: prefix.into() })
    }

    pub fn backend(&self) -> &str {
        &self.backend
    }

    pub fn target_prefix(&self) -> &str {
        &self.target_prefix
    }

    /// The driver's settings with its target prefix in them.
    pub fn settings(&self, settings: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut s = settings.clone();
        s.insert(TARGET_PREFIX.into(), self.target_prefix.to_string());
        s
    }

    /// `Ok` when the target named `iqn` is this backend's.
    pub fn target(&self, iqn: &str) -> Result<(), NotPermitted> {
        if iqn.starts_with(&*self.target_prefix) { Ok(()) } else { Err(self.refuse(format!("target {iqn}"))) }
    }

    /// Logs and returns a refusal.
    pub fn refuse(&self, what: String) -> NotPermitted {
        tracing::warn!(backend = %self.backend, %what, "capability call refused: not the backend's own");
        NotPermitted { backend: self.backend.to_string(), what }
    }

    /// Whether two namespaces could name the same target.
    pub fn overlaps(&self, other: &Namespace) -> bool {
        self.target_prefix.starts_with(&*other.target_prefix)
            || other.target_prefix.starts_with(&*self.target_prefix)
    }
}

/// `iqn.2010-10.org.openstack:<backend>:` with the backend's name in IQN characters.
pub fn default_prefix(backend: &str) -> String {
    let name: String = backend
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    format!("iqn.2010-10.org.openstack:{name}:")
}

/// Backend names are 1 to 64 characters of `[A-Za-z0-9_.-]`, not `.` or `..` (one names a
/// directory).
pub fn check_backend_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!("backend name {name:?} must be 1 to 64 characters of A-Z a-z 0-9 _ - ."))
    }
}

/// Refuses namespaces that overlap (two backends that could name the same target).
pub fn check_disjoint(namespaces: &[Namespace]) -> Result<(), String> {
    for (i, a) in namespaces.iter().enumerate() {
        for b in &namespaces[i + 1..] {
            if a.overlaps(b) {
                return Err(format!(
                    "backends {} and {} have overlapping target prefixes ({:?}, {:?}); give each its own",
                    a.backend, b.backend, a.target_prefix, b.target_prefix
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_gets_its_own_prefix_and_overlaps_are_refused() {
        let none = BTreeMap::new();
        let a = Namespace::new("tgt", &none).unwrap();
        assert_eq!(a.target_prefix(), "iqn.2010-10.org.openstack:tgt:");
        let b = Namespace::new("Fast_SSD", &none).unwrap();
        assert_eq!(b.target_prefix(), "iqn.2010-10.org.openstack:fast-ssd:");
        assert!(a.target("iqn.2010-10.org.openstack:tgt:volume-1").is_ok());
        assert!(a.target("iqn.2010-10.org.openstack:fast-ssd:volume-1").is_err());
        assert!(a.target("iqn.2010-10.org.openstack:tgt").is_err());
        check_disjoint(&[a.clone(), b]).unwrap();
        let wide = Namespace::new(
            "wide",
            &BTreeMap::from([(TARGET_PREFIX.to_string(), "iqn.2010-10.org.openstack:".to_string())]),
        )
        .unwrap();
        assert!(check_disjoint(&[a, wide]).unwrap_err().contains("overlapping"));
        assert!(Namespace::new("../x", &none).is_err());
        assert!(
            Namespace::new("x", &BTreeMap::from([(TARGET_PREFIX.to_string(), "IQN.bad".to_string())]))
                .is_err()
        );
    }
}

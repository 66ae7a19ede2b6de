//! Capabilities: what drivers may ask of the host, and the only room that acts on the outside
//! world for a driver (files under the data directory, tgtd). Nothing here knows wasmtime; the
//! runtime's glue (`runtime/host.rs`) turns WIT calls into calls on these types.
//!
//! A driver gets a capability only when its import is checked at load time against the
//! operator's grants ([`Grant`]); log and config are always granted.

pub mod backing;
pub mod iscsi;
pub mod log;
pub mod namespace;
pub mod secret;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

/// A capability the operator can grant to a driver in its backend configuration.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Grant {
    /// `berth:driver/iscsi-target`: the host's iSCSI target service.
    IscsiTarget,
    /// `berth:driver/backing-store`: sparse image files in the host's data directory.
    BackingStore,
}

impl Grant {
    pub const ALL: [Grant; 2] = [Grant::IscsiTarget, Grant::BackingStore];

    /// The WIT interface (without version) this grant admits.
    pub fn interface(self) -> &'static str {
        match self {
            Grant::IscsiTarget => "berth:driver/iscsi-target",
            Grant::BackingStore => "berth:driver/backing-store",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Grant::IscsiTarget => "iscsi-target",
            Grant::BackingStore => "backing-store",
        }
    }
}

/// What one driver may use: its settings, and the services behind the capabilities it was
/// granted. A capability that was not granted is `None`, and the loader refuses any driver that
/// imports it, so the runtime never reaches a `None` from a guest call.
#[derive(Clone, Default)]
pub struct DriverCapabilities {
    /// The backend's `settings` table, exposed read-only through `berth:driver/config`.
    pub settings: Arc<BTreeMap<String, String>>,
    pub iscsi: Option<iscsi::IscsiCapability>,
    pub backing: Option<Arc<backing::BackingStores>>,
}

impl DriverCapabilities {
    pub fn granted(&self, grant: Grant) -> bool {
        match grant {
            Grant::IscsiTarget => self.iscsi.is_some(),
            Grant::BackingStore => self.backing.is_some(),
        }
    }
}

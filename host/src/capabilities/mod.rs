//! Capabilities: what drivers may ask of the host, and the only room that acts on the outside
//! world for a driver (files under the data directory, tgtd, the array's network).
//!
//! One room per capability: its service, which knows nothing of wasmtime (nothing here imports
//! `runtime/`). The WIT host functions that turn a guest's call into a call on a service, checked,
//! recorded and answered with the typed error the guest sees, are the runtime's, one file per
//! capability in `runtime/glue/`:
//!
//! | room | glue | grant | imports |
//! |---|---|---|---|
//! | `iscsi/` (`tgt/` for tgtd, `model.rs` for tests) | `iscsi.rs` | `iscsi-target` | `berth:driver/iscsi-target` |
//! | `iscsi/initiators.rs` | `iscsi_chap.rs` | `iscsi-target` | `berth:iscsi-chap/initiator-accounts` (its own package, `wit/iscsi-chap@0.1.0`) |
//! | `backing/` | `backing.rs` | `backing-store` | `berth:driver/backing-store` |
//! | `network/` | `network.rs` | `network` | `wasi:http/outgoing-handler`, `wasi:http/types` |
//! | `cephx/` | `cephx.rs` | `cephx` | `berth:cephx/identities` (its own package, `wit/cephx@0.1.0`) |
//! | `log/` | `log.rs` | always | `berth:driver/log` |
//! | (the backend's `settings`) | `settings.rs` | always | `berth:driver/config` |
//!
//! The grants, the interfaces each admits and the first contract that has them are one table,
//! [`CAPABILITIES`], from which the loader's import rules and `berth driver inspect` derive. A new
//! capability is a row there, a room here, and its field in [`DriverCapabilities`]. Older
//! contracts' imports are adapted to the latest glue in `runtime/since_*.rs`.

pub mod backing;
pub mod cephx;
pub mod iscsi;
pub mod log;
pub mod namespace;
pub mod network;
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
    /// `wasi:http/outgoing-handler`: requests to the backend's allowed hosts (contract 0.3.0).
    Network,
    /// `berth:cephx/identities`: cephx identities confined to one RBD image, made by the host
    /// (contract 0.3.0, package `berth:cephx@0.1.0`).
    Cephx,
    /// WASI's filesystem and sockets, as some language runtimes import them (componentize-py),
    /// linked to implementations that grant nothing. Never part of a default.
    InertWasi,
}

/// One capability: its grant, the imports it admits, and the first contract version that has it.
/// The loader's import rules and the grants' names all come from [`CAPABILITIES`]: a new
/// capability is one more row (and its room here, and its glue in `runtime/glue/`).
#[derive(Debug, Clone, Copy)]
pub struct CapabilitySpec {
    pub grant: Grant,
    /// The grant's name in configuration.
    pub name: &'static str,
    /// The interfaces (without version) it admits.
    pub interfaces: &'static [&'static str],
    /// The first contract version (`0.1`, `0.3`, ...) whose drivers may import them.
    pub since: (u32, u32),
    pub what: &'static str,
}

pub const CAPABILITIES: &[CapabilitySpec] = &[
    CapabilitySpec {
        grant: Grant::IscsiTarget,
        name: "iscsi-target",
        // `berth:iscsi-chap/initiator-accounts` (package `berth:iscsi-chap@0.1.0`, 0.3.0 drivers)
        // acts on the same targets and gives less than `set-chap`: the host chooses the names
        // and secrets.
        interfaces: &["berth:driver/iscsi-target", "berth:iscsi-chap/initiator-accounts"],
        since: (0, 1),
        what: "the host's iSCSI target service (tgtd): targets, LUNs, ACLs, CHAP, sessions",
    },
    CapabilitySpec {
        grant: Grant::BackingStore,
        name: "backing-store",
        interfaces: &["berth:driver/backing-store"],
        since: (0, 1),
        what: "sparse image files in the backend's directory of the data directory",
    },
    CapabilitySpec {
        grant: Grant::Network,
        name: "network",
        interfaces: &["wasi:http/outgoing-handler", "wasi:http/types"],
        since: (0, 3),
        what: "HTTPS requests to the backend's allowed_hosts, with the credentials the host keeps",
    },
    CapabilitySpec {
        grant: Grant::Cephx,
        name: "cephx",
        interfaces: &["berth:cephx/identities"],
        since: (0, 3),
        what: "cephx identities that open one RBD image and nothing else, made and removed by the host with the key \
               it keeps",
    },
    CapabilitySpec {
        grant: Grant::InertWasi,
        name: "inert-wasi",
        interfaces: &[
            "wasi:filesystem/types",
            "wasi:filesystem/preopens",
            "wasi:sockets/network",
            "wasi:sockets/instance-network",
            "wasi:sockets/tcp",
            "wasi:sockets/tcp-create-socket",
            "wasi:sockets/udp",
            "wasi:sockets/udp-create-socket",
            "wasi:sockets/ip-name-lookup",
        ],
        since: (0, 1),
        what: "WASI's filesystem and sockets as a language runtime imports them, granting nothing: no directory is \
               preopened, every socket and name lookup is refused",
    },
];

impl Grant {
    /// Every capability (`inert-wasi`, which is none, is never granted unless named).
    pub const ALL: [Grant; 4] = [Grant::IscsiTarget, Grant::BackingStore, Grant::Network, Grant::Cephx];

    /// This grant's row of [`CAPABILITIES`].
    pub fn spec(self) -> &'static CapabilitySpec {
        CAPABILITIES.iter().find(|c| c.grant == self).expect("every grant has a row")
    }

    /// The grant that admits an interface (without version), if one does.
    pub fn admitting(interface: &str) -> Option<Grant> {
        CAPABILITIES.iter().find(|c| c.interfaces.contains(&interface)).map(|c| c.grant)
    }

    /// The first WIT interface this grant admits.
    pub fn interface(self) -> &'static str {
        self.spec().interfaces[0]
    }

    pub fn name(self) -> &'static str {
        self.spec().name
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
    pub network: Option<Arc<network::NetworkCapability>>,
    pub cephx: Option<Arc<cephx::CephxCapability>>,
}

impl DriverCapabilities {
    pub fn granted(&self, grant: Grant) -> bool {
        match grant {
            Grant::IscsiTarget => self.iscsi.is_some(),
            Grant::BackingStore => self.backing.is_some(),
            Grant::Network => self.network.is_some(),
            Grant::Cephx => self.cephx.is_some(),
            // Nothing stands behind it: the call's WASI context preopens no directory and
            // allows no socket.
            Grant::InertWasi => true,
        }
    }
}

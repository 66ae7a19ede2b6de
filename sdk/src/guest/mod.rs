//! The guest side: generated bindings (private), the `Driver` trait and `export_driver!`.

mod connection;
mod connector;
mod error;
mod model;

#[cfg(feature = "network")]
pub mod http;

/// The bindings of one world, with the options every world shares; `http`: a world that imports
/// `wasi:http` (whose types do not take the derives), `every_interface`: bindings for interfaces
/// the driver may not use as well.
macro_rules! bindings {
    ($world:literal in $path:literal) => {
        bindings!(@ $world in $path;);
    };
    ($world:literal in $path:literal, every_interface) => {
        bindings!(@ $world in $path; generate_all,);
    };
    ($world:literal in $path:literal, http) => {
        bindings!(@ $world in $path;
            additional_derives_ignore: ["stream-error", "error-code", "dns-error-payload", "field-size-payload",
                "tls-alert-received-payload", "header-error", "request-options-error", "method", "scheme"],
            generate_all,
        );
    };
    (@ $world:literal in $path:literal; $($extra:tt)*) => {
        #[doc(hidden)]
        pub mod __bindings {
            wit_bindgen::generate!({
                world: $world,
                path: $path,
                pub_export_macro: true,
                export_macro_name: "__export_storage_driver",
                default_bindings_module: "berth_driver_sdk::__bindings",
                runtime_path: "berth_driver_sdk::__wit_bindgen::rt",
                additional_derives: [Clone, PartialEq],
                $($extra)*
            });
        }
    };
}

// Which world a driver is built for follows the SDK's features; one set of bindings at a time.
//
// Without the `network` feature a driver imports nothing of `wasi:http`; with it, it is built
// for the world `network-storage-driver` and needs the operator's `network` grant.
#[cfg(not(any(feature = "network", feature = "iscsi-chap")))]
bindings!("storage-driver" in "../wit/driver@0.3.0");

#[cfg(all(feature = "network", not(feature = "cephx"), not(feature = "iscsi-chap")))]
bindings!("network-storage-driver" in "../wit/driver@0.3.0", http);

// With the `cephx` feature, the driver is built for `berth:cephx/rbd-storage-driver`: the
// network, and cephx identities the host makes (the operator's `cephx` grant).
#[cfg(all(feature = "cephx", not(feature = "iscsi-chap")))]
bindings!("rbd-storage-driver" in "../wit/cephx@0.1.0", http);

// With the `iscsi-chap` feature, the driver is built for `berth:iscsi-chap/tgt-storage-driver`:
// the contract's `storage-driver` and per-initiator CHAP accounts the host makes (admitted with
// the `iscsi-target` grant).
#[cfg(all(feature = "iscsi-chap", not(feature = "network")))]
bindings!("tgt-storage-driver" in "../wit/iscsi-chap@0.1.0", every_interface);

// Both: every capability package's world, for builds that unify features across the workspace
// (clippy and the tests build every driver natively at once; each driver's component is built
// with its own features, `host/build.rs`).
#[cfg(all(feature = "iscsi-chap", feature = "network"))]
bindings!("every-capability" in "../wit/iscsi-chap@0.1.0", http);

#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

pub use __bindings::berth::driver::types::{
    AccessMode, Attachment, Capabilities, Connection, ConnectionInfo, Connector, DriverError, DriverInfo,
    InvalidConnector, ModelUpdate, Protocol, Termination, Value, Volume, VolumeField,
};
pub use __bindings::exports::berth::driver::driver::Guarantee;
pub use connection::ConnectionInfoBuilder;
pub use connector::same_initiator;

/// What every driver call returns.
pub type DriverResult<T> = Result<T, DriverError>;

/// Logging into the host's log, attributed to this driver and the current call.
pub mod log {
    pub use crate::__bindings::berth::driver::log::Level;
    use crate::__bindings::berth::driver::log::log;

    pub fn trace(message: &str) {
        log(Level::Trace, message)
    }
    pub fn debug(message: &str) {
        log(Level::Debug, message)
    }
    pub fn info(message: &str) {
        log(Level::Info, message)
    }
    pub fn warn(message: &str) {
        log(Level::Warn, message)
    }
    pub fn error(message: &str) {
        log(Level::Error, message)
    }
}

/// The operator's settings for this backend. Outside WebAssembly (a driver's logic tested or
/// measured natively) there is no host, and every setting reads as unset.
pub mod config {
    /// A setting.
    pub fn get(key: &str) -> Option<String> {
        if cfg!(target_arch = "wasm32") { crate::__bindings::berth::driver::config::get(key) } else { None }
    }

    /// Every setting.
    pub fn entries() -> Vec<(String, String)> {
        if cfg!(target_arch = "wasm32") {
            crate::__bindings::berth::driver::config::entries()
        } else {
            Vec::new()
        }
    }

    /// A setting, or `default` when the operator did not set it.
    pub fn get_or(key: &str, default: &str) -> String {
        get(key).unwrap_or_else(|| default.to_string())
    }
}

/// Sparse image files kept by the host for volumes (must be granted to the driver).
pub mod backing_store {
    pub use crate::__bindings::berth::driver::backing_store::*;
}

/// The host's iSCSI target service (must be granted to the driver).
pub mod iscsi {
    pub use crate::__bindings::berth::driver::iscsi_target::*;
}

/// Cephx identities confined to one RBD image, made by the host (feature `cephx`; must be
/// granted to the driver).
#[cfg(feature = "cephx")]
pub mod cephx {
    pub use crate::__bindings::berth::cephx::identities::*;
}

/// Per-initiator CHAP accounts, made and kept by the host (feature `iscsi-chap`; admitted with
/// the `iscsi-target` grant).
#[cfg(feature = "iscsi-chap")]
pub mod iscsi_chap {
    pub use crate::__bindings::berth::iscsi_chap::initiator_accounts::*;
}

/// Everything a driver module usually needs.
pub mod prelude {
    pub use crate::{
        AccessMode, Attachment, Capabilities, Connection, ConnectionInfo, ConnectionInfoBuilder, Connector,
        Driver, DriverError, DriverInfo, DriverResult, Guarantee, ModelUpdate, Protocol, Termination, Value,
        Volume, VolumeField, export_driver,
    };
}

/// A storage driver. Implement `info` and `initialize_connection`; every other call has a
/// default.
///
/// Drivers are stateless: each call gets the volume record as the host stores it, and may find
/// what earlier calls of the same operation left in memory, or a fresh instance (never what
/// another operation left; docs/writing-a-driver.md, "Instances"). Keep what must survive in a [`ModelUpdate`]. Every call that changes something
/// must be idempotent (see the WIT contract, `wit/driver@0.3.0/driver.wit`).
pub trait Driver {
    /// Who the driver is and what it supports.
    fn info() -> DriverInfo;

    /// The promises the driver makes beyond the required behaviour; the conformance suite checks
    /// each one. Default: none.
    fn guarantees() -> Vec<Guarantee> {
        Vec::new()
    }

    /// Grants the connector access to the exported volume and returns connection information.
    fn initialize_connection(volume: &Volume, connector: &Connector) -> DriverResult<Connection>;

    /// Checks the connector. Default: every connector is acceptable.
    fn validate_connector(_connector: &Connector) -> DriverResult<()> {
        Ok(())
    }

    /// Allocates storage for a new volume. Default: unsupported.
    fn create_volume(_volume: &Volume) -> DriverResult<ModelUpdate> {
        Err(DriverError::unsupported("create-volume"))
    }

    /// Releases a volume's storage. Default: unsupported.
    fn delete_volume(_volume: &Volume) -> DriverResult<()> {
        Err(DriverError::unsupported("delete-volume"))
    }

    /// Grows the volume's storage to `new_size_gib` (`volume.size_gib` is still the old size).
    /// Idempotent: storage that already has the new size succeeds. Default: unsupported.
    fn extend_volume(_volume: &Volume, _new_size_gib: u64) -> DriverResult<ModelUpdate> {
        Err(DriverError::unsupported("extend-volume"))
    }

    /// Makes the volume exportable. Default: unsupported, which the host treats as "nothing to
    /// export" for drivers whose `initialize_connection` does all the work.
    fn create_export(_volume: &Volume, _connector: Option<&Connector>) -> DriverResult<ModelUpdate> {
        Err(DriverError::unsupported("create-export"))
    }

    /// Removes the volume's export. Default: unsupported (nothing to remove).
    fn remove_export(_volume: &Volume) -> DriverResult<ModelUpdate> {
        Err(DriverError::unsupported("remove-export"))
    }

    /// Revokes a connector's access (all access when `None`). Default: unsupported (nothing to
    /// revoke).
    fn terminate_connection(
        _volume: &Volume,
        _connector: Option<&Connector>,
        _others: &[Attachment],
    ) -> DriverResult<Termination> {
        Err(DriverError::unsupported("terminate-connection"))
    }

    /// Which attachments share `connector`'s connection. Default: all of them, the safe answer
    /// for a driver that cannot tell.
    fn shared_connections(
        _volume: &Volume,
        _connector: &Connector,
        attachments: &[Attachment],
    ) -> DriverResult<Vec<String>> {
        Ok(attachments.iter().map(|a| a.id.clone()).collect())
    }
}

/// Exports a [`Driver`] implementation as the component's `berth:driver/driver` interface.
/// Use it once per driver crate.
#[macro_export]
macro_rules! export_driver {
    ($driver:ty) => {
        // Component exports exist only on wasm32; on other targets the driver crate still
        // compiles (for `cargo clippy`, tests and native benchmarks of its logic).
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __BerthDriverExport;

            impl $crate::__bindings::exports::berth::driver::driver::Guest for __BerthDriverExport {
                fn info() -> $crate::DriverInfo {
                    <$driver as $crate::Driver>::info()
                }
                fn guarantees() -> Vec<$crate::Guarantee> {
                    <$driver as $crate::Driver>::guarantees()
                }
                fn validate_connector(connector: $crate::Connector) -> $crate::DriverResult<()> {
                    <$driver as $crate::Driver>::validate_connector(&connector)
                }
                fn create_volume(volume: $crate::Volume) -> $crate::DriverResult<$crate::ModelUpdate> {
                    <$driver as $crate::Driver>::create_volume(&volume)
                }
                fn delete_volume(volume: $crate::Volume) -> $crate::DriverResult<()> {
                    <$driver as $crate::Driver>::delete_volume(&volume)
                }
                fn extend_volume(
                    volume: $crate::Volume,
                    new_size_gib: u64,
                ) -> $crate::DriverResult<$crate::ModelUpdate> {
                    <$driver as $crate::Driver>::extend_volume(&volume, new_size_gib)
                }
                fn create_export(
                    volume: $crate::Volume,
                    connector: Option<$crate::Connector>,
                ) -> $crate::DriverResult<$crate::ModelUpdate> {
                    <$driver as $crate::Driver>::create_export(&volume, connector.as_ref())
                }
                fn remove_export(volume: $crate::Volume) -> $crate::DriverResult<$crate::ModelUpdate> {
                    <$driver as $crate::Driver>::remove_export(&volume)
                }
                fn initialize_connection(
                    volume: $crate::Volume,
                    connector: $crate::Connector,
                ) -> $crate::DriverResult<$crate::Connection> {
                    <$driver as $crate::Driver>::initialize_connection(&volume, &connector)
                }
                fn terminate_connection(
                    volume: $crate::Volume,
                    connector: Option<$crate::Connector>,
                    others: Vec<$crate::Attachment>,
                ) -> $crate::DriverResult<$crate::Termination> {
                    <$driver as $crate::Driver>::terminate_connection(&volume, connector.as_ref(), &others)
                }
                fn shared_connections(
                    volume: $crate::Volume,
                    connector: $crate::Connector,
                    attachments: Vec<$crate::Attachment>,
                ) -> $crate::DriverResult<Vec<String>> {
                    <$driver as $crate::Driver>::shared_connections(&volume, &connector, &attachments)
                }
            }

    $crate::__bindings::__export_storage_driver!(__BerthDriverExport with_types_in $crate::__bindings);
        };
    };
}

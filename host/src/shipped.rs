//! The drivers shipped inside the `berth` binary, and where the build put every driver component
//! (see `host/build.rs`).

use crate::runtime::WasmSource;

/// Where `build.rs` put every driver component, test fixtures included: `<name>.wasm`.
pub const BUILD_DIR: &str = env!("BERTH_DRIVER_DIR");

/// The embedded drivers: `tgt-iscsi` and `ceph-rbd` (the products) and `fake` (a scriptable test
/// tool).
const SHIPPED: &[(&str, &[u8])] = &[
    ("tgt-iscsi", include_bytes!(concat!(env!("BERTH_DRIVER_DIR"), "/tgt-iscsi.wasm"))),
    ("ceph-rbd", include_bytes!(concat!(env!("BERTH_DRIVER_DIR"), "/ceph-rbd.wasm"))),
    ("fake", include_bytes!(concat!(env!("BERTH_DRIVER_DIR"), "/fake.wasm"))),
];

/// The names of the shipped drivers.
pub fn names() -> impl Iterator<Item = &'static str> {
    SHIPPED.iter().map(|(name, _)| *name)
}

/// A shipped driver by name.
pub fn driver(name: &str) -> Option<WasmSource> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(name, bytes)| WasmSource::Embedded { name, bytes })
}

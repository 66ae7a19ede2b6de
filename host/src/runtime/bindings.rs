//! The generated host bindings, one module per contract version. Private to `runtime/`: the rest
//! of the host sees the curated re-exports in `runtime::contract`, which are the latest
//! version's types.
//!
//! Older versions share the latest `types` interface where it did not change (so their calls
//! take and return the same Rust values); their capability interfaces are adapted to the latest
//! ones in `since_v0_2.rs` and `since_v0_1.rs`. The `network-storage-driver` world of 0.3.0 adds
//! only standard `wasi:http` imports, which `wasmtime-wasi-http` implements (`network.rs`): its
//! drivers are bound to `storage-driver` like every other.

/// `berth:driver@0.3.0`, the version this host is written against.
pub(crate) mod latest {
    wasmtime::component::bindgen!({
        world: "storage-driver",
        path: "../wit/driver@0.3.0",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// `berth:driver@0.2.0`. Its interfaces are 0.3.0's.
pub(crate) mod v0_2 {
    wasmtime::component::bindgen!({
        world: "storage-driver",
        path: "../wit/driver@0.2.0",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "berth:driver/types": super::latest::berth::driver::types },
    });
}

/// `berth:driver@0.1.0`. Its `types` interface is the same as 0.3.0's.
pub(crate) mod v0_1 {
    wasmtime::component::bindgen!({
        world: "storage-driver",
        path: "../wit/driver@0.1.0",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "berth:driver/types": super::latest::berth::driver::types },
    });
}

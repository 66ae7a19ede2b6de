//! The generated host bindings, one module per contract version. Private to `runtime/`: the rest
//! of the host sees the curated re-exports in `runtime::contract`, which are the latest
//! version's types.
//!
//! Older versions share the latest `types` interface where it did not change (so their calls
//! take and return the same Rust values); what did change is adapted in `since_v0_1.rs`.

/// `berth:driver@0.2.0`, the version this host is written against.
pub mod latest {
    wasmtime::component::bindgen!({
        world: "storage-driver",
        path: "../wit/driver@0.2.0",
        imports: { default: async | trappable },
        exports: { default: async },
        additional_derives: [PartialEq],
    });
}

/// `berth:driver@0.1.0`. Its `types` interface is the same as 0.2.0's.
pub mod v0_1 {
    wasmtime::component::bindgen!({
        world: "storage-driver",
        path: "../wit/driver@0.1.0",
        imports: { default: async | trappable },
        exports: { default: async },
        with: { "berth:driver/types": super::latest::berth::driver::types },
    });
}

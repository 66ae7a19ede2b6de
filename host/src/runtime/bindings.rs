//! The generated host bindings for `berth:driver@0.1.0`. Private to `runtime/`: the rest of the
//! host sees the curated re-exports in `runtime::contract`.

wasmtime::component::bindgen!({
    world: "storage-driver",
    path: "../wit/driver@0.1.0",
    imports: { default: async | trappable },
    exports: { default: async },
    additional_derives: [PartialEq],
});

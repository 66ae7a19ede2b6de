//! The `network` capability's glue: the guest's `wasi:http` reaches the call's network
//! (`runtime/network.rs`), kept in the call's state.

use wasmtime_wasi_http::{WasiHttpCtxView, WasiHttpView};

use crate::runtime::state::HostState;

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        let (table, network) = self.table_and_network();
        WasiHttpCtxView { hooks: &mut network.hooks, table, ctx: &mut network.ctx }
    }
}

//! `berth:driver/config`: the backend's `settings` table, read-only, always granted (the host
//! puts the backend's `target_prefix` there). And `berth:driver/types`, which has no functions.

use crate::runtime::bindings::latest::berth::driver::{config, types};
use crate::runtime::state::HostState;

impl types::Host for HostState {}

impl config::Host for HostState {
    async fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        Ok(self.scope.caps.settings.get(&key).cloned())
    }

    async fn entries(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        Ok(self.scope.caps.settings.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

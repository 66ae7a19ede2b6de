//! The adapter for drivers built against `berth:driver@0.1.0`: its imports, answered by the latest
//! version's (`runtime/glue/`). The `types` interface is shared (see `bindings.rs`), so only what 0.2.0
//! changed is adapted here:
//!
//! - `target-error` and `store-error` gained `not-permitted`; a 0.1.0 driver sees
//!   `invalid-argument` with the same message.
//! - `deny-initiator` no longer ends the initiator's sessions in 0.2.0 (drivers call
//!   `close-sessions`, and promise it with `terminate-ends-sessions`). A 0.1.0 driver cannot, so
//!   for it the host ends them as part of `deny-initiator`: a detach ends access whichever
//!   version the driver was built for.
//!
//! 0.1.0 is frozen: this file changes only if the latest version's host side changes shape.

use super::bindings::latest::berth::driver as latest;
use super::bindings::v0_1::berth::driver::{backing_store, config, iscsi_target, log};
use super::state::HostState;

fn target_error(e: latest::iscsi_target::TargetError) -> iscsi_target::TargetError {
    use latest::iscsi_target::TargetError as L;
    match e {
        L::InvalidArgument(m) | L::NotPermitted(m) => iscsi_target::TargetError::InvalidArgument(m),
        L::NotFound(m) => iscsi_target::TargetError::NotFound(m),
        L::Timeout(m) => iscsi_target::TargetError::Timeout(m),
        L::Failed(m) => iscsi_target::TargetError::Failed(m),
    }
}

fn target_result<T, U>(
    r: Result<T, latest::iscsi_target::TargetError>,
    f: impl FnOnce(T) -> U,
) -> Result<U, iscsi_target::TargetError> {
    r.map(f).map_err(target_error)
}

fn store_result<T, U>(
    r: Result<T, latest::backing_store::StoreError>,
    f: impl FnOnce(T) -> U,
) -> Result<U, backing_store::StoreError> {
    use latest::backing_store::StoreError as L;
    r.map(f).map_err(|e| match e {
        L::InvalidArgument(m) | L::NotPermitted(m) => backing_store::StoreError::InvalidArgument(m),
        L::NotFound(m) => backing_store::StoreError::NotFound(m),
        L::Conflict(m) => backing_store::StoreError::Conflict(m),
        L::NoSpace(m) => backing_store::StoreError::NoSpace(m),
        L::Failed(m) => backing_store::StoreError::Failed(m),
    })
}

fn store_info(i: latest::backing_store::StoreInfo) -> backing_store::StoreInfo {
    backing_store::StoreInfo { name: i.name, size_bytes: i.size_bytes, allocated_bytes: i.allocated_bytes }
}

fn target(t: latest::iscsi_target::Target) -> iscsi_target::Target {
    iscsi_target::Target {
        iqn: t.iqn,
        tid: t.tid,
        luns: t.luns,
        initiators: t.initiators,
        chap_users: t.chap_users,
        sessions: t.sessions,
    }
}

impl log::Host for HostState {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        use latest::log::Level as L;
        let level = match level {
            log::Level::Trace => L::Trace,
            log::Level::Debug => L::Debug,
            log::Level::Info => L::Info,
            log::Level::Warn => L::Warn,
            log::Level::Error => L::Error,
        };
        latest::log::Host::log(self, level, message).await
    }
}

impl config::Host for HostState {
    async fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        latest::config::Host::get(self, key).await
    }

    async fn entries(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        latest::config::Host::entries(self).await
    }
}

impl backing_store::Host for HostState {
    async fn create(
        &mut self,
        name: String,
        size_bytes: u64,
    ) -> wasmtime::Result<Result<backing_store::StoreInfo, backing_store::StoreError>> {
        Ok(store_result(latest::backing_store::Host::create(self, name, size_bytes).await?, store_info))
    }

    async fn resize(
        &mut self,
        name: String,
        size_bytes: u64,
    ) -> wasmtime::Result<Result<backing_store::StoreInfo, backing_store::StoreError>> {
        Ok(store_result(latest::backing_store::Host::resize(self, name, size_bytes).await?, store_info))
    }

    async fn delete(&mut self, name: String) -> wasmtime::Result<Result<(), backing_store::StoreError>> {
        Ok(store_result(latest::backing_store::Host::delete(self, name).await?, |()| ()))
    }

    async fn info(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<Option<backing_store::StoreInfo>, backing_store::StoreError>> {
        Ok(store_result(latest::backing_store::Host::info(self, name).await?, |i| i.map(store_info)))
    }
}

impl iscsi_target::Host for HostState {
    async fn portals(&mut self) -> wasmtime::Result<Vec<iscsi_target::Portal>> {
        Ok(latest::iscsi_target::Host::portals(self)
            .await?
            .into_iter()
            .map(|p| iscsi_target::Portal { address: p.address, port: p.port })
            .collect())
    }

    async fn generate_chap_credentials(&mut self) -> wasmtime::Result<iscsi_target::ChapCredentials> {
        let c = latest::iscsi_target::Host::generate_chap_credentials(self).await?;
        Ok(iscsi_target::ChapCredentials { username: c.username, secret: c.secret })
    }

    async fn show_target(
        &mut self,
        iqn: String,
    ) -> wasmtime::Result<Result<Option<iscsi_target::Target>, iscsi_target::TargetError>> {
        Ok(target_result(latest::iscsi_target::Host::show_target(self, iqn).await?, |t| t.map(target)))
    }

    async fn create_target(
        &mut self,
        iqn: String,
    ) -> wasmtime::Result<Result<iscsi_target::Target, iscsi_target::TargetError>> {
        Ok(target_result(latest::iscsi_target::Host::create_target(self, iqn).await?, target))
    }

    async fn delete_target(
        &mut self,
        iqn: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        Ok(target_result(latest::iscsi_target::Host::delete_target(self, iqn).await?, |()| ()))
    }

    async fn add_lun(
        &mut self,
        iqn: String,
        lun: u32,
        store: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        Ok(target_result(latest::iscsi_target::Host::add_lun(self, iqn, lun, store).await?, |()| ()))
    }

    async fn remove_lun(
        &mut self,
        iqn: String,
        lun: u32,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        Ok(target_result(latest::iscsi_target::Host::remove_lun(self, iqn, lun).await?, |()| ()))
    }

    async fn allow_initiator(
        &mut self,
        iqn: String,
        initiator: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        Ok(target_result(latest::iscsi_target::Host::allow_initiator(self, iqn, initiator).await?, |()| ()))
    }

    /// 0.1.0's deny ends the initiator's sessions too: one capability call, as the driver sees it.
    async fn deny_initiator(
        &mut self,
        iqn: String,
        initiator: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        Ok(self.deny(iqn, initiator, true).await?.map_err(target_error))
    }

    async fn set_chap(
        &mut self,
        iqn: String,
        credentials: iscsi_target::ChapCredentials,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        let credentials = latest::iscsi_target::ChapCredentials {
            username: credentials.username,
            secret: credentials.secret,
        };
        Ok(target_result(latest::iscsi_target::Host::set_chap(self, iqn, credentials).await?, |()| ()))
    }
}

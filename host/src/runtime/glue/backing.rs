//! `berth:driver/backing-store`, as the runtime links it: each call checked against the grant,
//! recorded (and, in tests, faulted) by the call's scope, and answered with the typed error the
//! guest sees.

use crate::capabilities::backing::{BackingStores, StoreError, StoreInfo};
use crate::runtime::bindings::latest::berth::driver::backing_store;
use crate::runtime::state::HostState;

pub(crate) fn not_granted(what: &str) -> wasmtime::Error {
    wasmtime::Error::msg(format!("the driver used {what} without a grant"))
}

impl HostState {
    fn stores(&self) -> wasmtime::Result<std::sync::Arc<BackingStores>> {
        self.scope.caps.backing.clone().ok_or_else(|| not_granted("backing-store"))
    }

    fn store_result<T>(&mut self, r: Result<T, StoreError>) -> Result<T, backing_store::StoreError> {
        self.scope.outcome(r.is_ok(), || match &r {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        });
        r.map_err(|e| match e {
            StoreError::InvalidArgument(m) => backing_store::StoreError::InvalidArgument(m),
            StoreError::NotFound(m) => backing_store::StoreError::NotFound(m),
            StoreError::Conflict(m) => backing_store::StoreError::Conflict(m),
            StoreError::NoSpace(m) => backing_store::StoreError::NoSpace(m),
            StoreError::Failed(m) => backing_store::StoreError::Failed(m),
            StoreError::NotPermitted(m) => backing_store::StoreError::NotPermitted(m),
        })
    }
}

fn store_info(i: StoreInfo) -> backing_store::StoreInfo {
    backing_store::StoreInfo { name: i.name, size_bytes: i.size_bytes, allocated_bytes: i.allocated_bytes }
}

impl backing_store::Host for HostState {
    async fn create(
        &mut self,
        name: String,
        size_bytes: u64,
    ) -> wasmtime::Result<Result<backing_store::StoreInfo, backing_store::StoreError>> {
        self.scope.enter("backing-store", "create", &[&name, &size_bytes.to_string()])?;
        let r = self
            .scope
            .lasting(StoreError::Failed, self.stores()?.create(&name, size_bytes))
            .await
            .map(store_info);
        crate::failpoint::hit("capability.backing-store.create").await;
        Ok(self.store_result(r))
    }

    async fn resize(
        &mut self,
        name: String,
        size_bytes: u64,
    ) -> wasmtime::Result<Result<backing_store::StoreInfo, backing_store::StoreError>> {
        self.scope.enter("backing-store", "resize", &[&name, &size_bytes.to_string()])?;
        let r = self.scope.lasting(StoreError::Failed, self.stores()?.resize(&name, size_bytes)).await;
        crate::failpoint::hit("capability.backing-store.resize").await;
        // An exported store (an attached volume's extend) is served at its new size at once.
        let r = match (r, &self.scope.caps.iscsi) {
            (Ok(info), Some(iscsi)) => iscsi.store_grew(&name).await.map(|()| info),
            (r, _) => r,
        };
        Ok(self.store_result(r.map(store_info)))
    }

    async fn delete(&mut self, name: String) -> wasmtime::Result<Result<(), backing_store::StoreError>> {
        self.scope.enter("backing-store", "delete", &[&name])?;
        let r = self.scope.lasting(StoreError::Failed, self.stores()?.delete(&name)).await;
        crate::failpoint::hit("capability.backing-store.delete").await;
        Ok(self.store_result(r))
    }

    async fn info(
        &mut self,
        name: String,
    ) -> wasmtime::Result<Result<Option<backing_store::StoreInfo>, backing_store::StoreError>> {
        self.scope.enter("backing-store", "info", &[&name])?;
        let r = self.stores()?.info(&name).await.map(|i| i.map(store_info));
        Ok(self.store_result(r))
    }
}

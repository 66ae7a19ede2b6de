//! `berth:iscsi-chap/initiator-accounts` (its own package, `wit/iscsi-chap@0.1.0`), as the runtime
//! links it: admitted with the `iscsi-target` grant, each call checked against the backend's
//! namespace (`capabilities/iscsi/initiators.rs`), recorded (and, in tests, faulted) by the call's
//! scope, and answered with `iscsi-target`'s typed error. A granted secret is redacted from the
//! call's record and the driver's log like any CHAP password.

use crate::runtime::bindings::latest::berth::driver::iscsi_target;
use crate::runtime::state::HostState;

/// The host side of `berth:iscsi-chap@0.1.0`, generated alone (world `host`), its `iscsi-target`
/// types those of the 0.3.0 contract's bindings.
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        world: "host",
        path: "../wit/iscsi-chap@0.1.0",
        imports: { default: async | trappable },
        with: { "berth:driver/iscsi-target": crate::runtime::bindings::latest::berth::driver::iscsi_target },
    });
}

use bindings::berth::iscsi_chap::initiator_accounts;

impl initiator_accounts::Host for HostState {
    async fn grant(
        &mut self,
        iqn: String,
        initiator: String,
    ) -> wasmtime::Result<Result<iscsi_target::ChapCredentials, iscsi_target::TargetError>> {
        self.scope.enter("initiator-accounts", "grant", &[&iqn, &initiator])?;
        let cap = self.iscsi()?;
        let owner = self.scope.options.owner.clone();
        let r = cap.grant_initiator(&iqn, &initiator, owner.as_deref()).await;
        if let Ok(credentials) = &r {
            // The secret never reaches a log or a call record.
            self.scope.redactor.add(credentials.secret.expose());
        }
        crate::failpoint::hit("capability.initiator-accounts.grant").await;
        Ok(self.target_result(r).map(|c| iscsi_target::ChapCredentials {
            username: c.user.as_str().to_string(),
            secret: c.secret.expose().to_string(),
        }))
    }

    async fn revoke(
        &mut self,
        iqn: String,
        initiator: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.enter("initiator-accounts", "revoke", &[&iqn, &initiator])?;
        let cap = self.iscsi()?;
        let r = cap.revoke_initiator(&iqn, &initiator).await;
        crate::failpoint::hit("capability.initiator-accounts.revoke").await;
        Ok(self.target_result(r))
    }

    async fn revoke_all(&mut self, iqn: String) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.enter("initiator-accounts", "revoke-all", &[&iqn])?;
        let cap = self.iscsi()?;
        let r = cap.revoke_every_initiator(&iqn).await;
        Ok(self.target_result(r))
    }
}

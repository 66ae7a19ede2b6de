//! `berth:cephx/identities` (its own package, `wit/cephx@0.1.0`), as the runtime links it: each
//! call checked against the grant, recorded (and, in tests, faulted) by the call's scope, and
//! answered with the typed error the guest sees. The key an identity gets is a secret: it is
//! redacted from the call's record and the driver's log like a CHAP password.

use std::sync::Arc;

use crate::capabilities::cephx::{CephxCapability, CephxError};
use crate::runtime::glue::backing::not_granted;
use crate::runtime::state::HostState;

/// The host side of `berth:cephx@0.1.0`, generated alone (world `host`): linked beside every
/// contract version; the loader admits the import only with the grant, for 0.3.0 drivers.
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        world: "host",
        path: "../wit/cephx@0.1.0",
        imports: { default: async | trappable },
    });
}

use bindings::berth::cephx::identities;

impl HostState {
    fn cephx(&self) -> wasmtime::Result<Arc<CephxCapability>> {
        self.scope.caps.cephx.clone().ok_or_else(|| not_granted("cephx"))
    }

    fn cephx_result<T>(&mut self, r: Result<T, CephxError>) -> Result<T, identities::IdentityError> {
        self.scope.outcome(r.is_ok(), || match &r {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        });
        r.map_err(|e| match e {
            CephxError::NotConfigured(m) => identities::IdentityError::NotConfigured(m),
            CephxError::InvalidArgument(m) => identities::IdentityError::InvalidArgument(m),
            CephxError::NotPermitted(m) => identities::IdentityError::NotPermitted(m),
            CephxError::NotFound(m) => identities::IdentityError::NotFound(m),
            CephxError::Unavailable(m) => identities::IdentityError::Unavailable(m),
        })
    }
}

impl identities::Host for HostState {
    async fn grant_image(
        &mut self,
        pool: String,
        image: String,
        host: String,
    ) -> wasmtime::Result<Result<identities::Identity, identities::IdentityError>> {
        self.scope.enter("cephx", "grant-image", &[&pool, &image, &host])?;
        let r = self
            .scope
            .lasting(CephxError::Unavailable, self.cephx()?.grant_image(&pool, &image, &host))
            .await;
        if let Ok(identity) = &r {
            // The key never reaches a log or a call record.
            self.scope.redactor.add(&identity.keyring);
            if let Some(key) = identity.keyring.split("key = ").nth(1) {
                self.scope.redactor.add(key.trim());
            }
        }
        crate::failpoint::hit("capability.cephx.grant-image").await;
        Ok(self.cephx_result(r).map(|i| identities::Identity { user: i.user, keyring: i.keyring }))
    }

    async fn revoke_image(
        &mut self,
        pool: String,
        image: String,
        host: String,
    ) -> wasmtime::Result<Result<(), identities::IdentityError>> {
        self.scope.enter("cephx", "revoke-image", &[&pool, &image, &host])?;
        let r = self
            .scope
            .lasting(CephxError::Unavailable, self.cephx()?.revoke_image(&pool, &image, &host))
            .await;
        crate::failpoint::hit("capability.cephx.revoke-image").await;
        Ok(self.cephx_result(r))
    }

    async fn revoke_all(
        &mut self,
        pool: String,
        image: String,
        keep: Vec<String>,
    ) -> wasmtime::Result<Result<(), identities::IdentityError>> {
        self.scope.enter("cephx", "revoke-all", &[&pool, &image, &keep.join(",")])?;
        let r =
            self.scope.lasting(CephxError::Unavailable, self.cephx()?.revoke_all(&pool, &image, &keep)).await;
        Ok(self.cephx_result(r))
    }
}

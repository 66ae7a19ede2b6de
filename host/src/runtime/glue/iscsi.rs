//! `berth:driver/iscsi-target`, as the runtime links it: each call checked against the grant and
//! the backend's namespace, recorded (and, in tests, faulted) by the call's scope, its effects
//! noted for the host, and answered with the typed error the guest sees (redacted).

use crate::capabilities::backing::StoreError;
use crate::capabilities::iscsi::{
    ChapCredentials, Iqn, IscsiCapability, Lun, Session, TargetError, TargetState,
};
use crate::runtime::Effect;
use crate::runtime::bindings::latest::berth::driver::iscsi_target;
use crate::runtime::glue::backing::not_granted;
use crate::runtime::state::HostState;

impl HostState {
    pub(super) fn iscsi(&self) -> wasmtime::Result<IscsiCapability> {
        self.scope.caps.iscsi.clone().ok_or_else(|| not_granted("iscsi-target"))
    }

    /// `deny-initiator`: removes the initiator from the ACL and, when `end_sessions` (the 0.1.0
    /// adapter), also ends its sessions, as one capability call.
    pub(crate) async fn deny(
        &mut self,
        iqn: String,
        initiator: String,
        end_sessions: bool,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "deny-initiator", &[&iqn, &initiator])?;
        let cap = self.iscsi()?;
        let r = async {
            let (target, initiator) = (cap.own(&iqn)?, Iqn::parse(&initiator)?);
            cap.service.deny_initiator(&target, &initiator).await?;
            if end_sessions {
                cap.service.close_sessions(&target, &initiator).await?;
            }
            Ok(())
        }
        .await;
        crate::failpoint::hit("capability.iscsi-target.deny-initiator").await;
        Ok(self.target_result(r))
    }

    pub(crate) fn target_result<T>(
        &mut self,
        r: Result<T, TargetError>,
    ) -> Result<T, iscsi_target::TargetError> {
        self.scope.outcome(r.is_ok(), || match &r {
            Ok(_) => "ok".into(),
            Err(e) => e.to_string(),
        });
        r.map_err(|e| {
            let redacted = |m: String| self.scope.redactor.redact(&m);
            match e {
                TargetError::InvalidArgument(m) => iscsi_target::TargetError::InvalidArgument(redacted(m)),
                TargetError::NotFound(m) => iscsi_target::TargetError::NotFound(redacted(m)),
                TargetError::Timeout(m) => iscsi_target::TargetError::Timeout(redacted(m)),
                TargetError::Failed(m) => iscsi_target::TargetError::Failed(redacted(m)),
                TargetError::NotPermitted(m) => iscsi_target::TargetError::NotPermitted(redacted(m)),
            }
        })
    }
}

fn target(t: TargetState) -> iscsi_target::Target {
    iscsi_target::Target {
        iqn: t.iqn,
        tid: t.tid,
        luns: t.luns.into_iter().map(|(l, _)| l).collect(),
        initiators: t.initiators,
        chap_users: t.chap_users,
        sessions: t.sessions,
    }
}

impl iscsi_target::Host for HostState {
    async fn portals(&mut self) -> wasmtime::Result<Vec<iscsi_target::Portal>> {
        Ok(self
            .iscsi()?
            .portals
            .into_iter()
            .map(|p| iscsi_target::Portal { address: p.address, port: p.port })
            .collect())
    }

    async fn generate_chap_credentials(&mut self) -> wasmtime::Result<iscsi_target::ChapCredentials> {
        let generated = self.iscsi()?.chap.generate();
        self.scope.redactor.add(generated.secret.expose());
        Ok(iscsi_target::ChapCredentials {
            username: generated.user.as_str().to_string(),
            secret: generated.secret.expose().to_string(),
        })
    }

    async fn show_target(
        &mut self,
        iqn: String,
    ) -> wasmtime::Result<Result<Option<iscsi_target::Target>, iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "show-target", &[&iqn])?;
        let cap = self.iscsi()?;
        let r = match cap.own(&iqn) {
            Ok(iqn) => cap.service.show(&iqn).await.map(|t| t.map(target)),
            Err(e) => Err(e),
        };
        Ok(self.target_result(r))
    }

    async fn create_target(
        &mut self,
        iqn: String,
    ) -> wasmtime::Result<Result<iscsi_target::Target, iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "create-target", &[&iqn])?;
        let cap = self.iscsi()?;
        let r = match cap.own(&iqn) {
            Ok(parsed) => cap.service.create_target(&parsed).await.map(target),
            Err(e) => Err(e),
        };
        if r.is_ok() {
            self.scope.effects.push(Effect::TargetCreated { iqn });
        }
        crate::failpoint::hit("capability.iscsi-target.create-target").await;
        Ok(self.target_result(r))
    }

    async fn delete_target(
        &mut self,
        iqn: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "delete-target", &[&iqn])?;
        let cap = self.iscsi()?;
        let r = match cap.own(&iqn) {
            Ok(parsed) => cap.service.delete_target(&parsed).await,
            Err(e) => Err(e),
        };
        if r.is_ok() {
            self.scope.effects.push(Effect::TargetDeleted { iqn });
        }
        crate::failpoint::hit("capability.iscsi-target.delete-target").await;
        Ok(self.target_result(r))
    }

    async fn add_lun(
        &mut self,
        iqn: String,
        lun: u32,
        store: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "add-lun", &[&iqn, &lun.to_string(), &store])?;
        let cap = self.iscsi()?;
        let r = async {
            let iqn = cap.own(&iqn)?;
            let lun = Lun::new(lun)?;
            let path = cap.stores.path(&store).map_err(|e| match e {
                StoreError::NotPermitted(m) => TargetError::NotPermitted(m),
                e => TargetError::InvalidArgument(e.to_string()),
            })?;
            if !path.exists() {
                return Err(TargetError::NotFound(format!("no backing store named {store}")));
            }
            cap.service.add_lun(&iqn, lun, &path.to_string_lossy()).await
        }
        .await;
        crate::failpoint::hit("capability.iscsi-target.add-lun").await;
        Ok(self.target_result(r))
    }

    async fn remove_lun(
        &mut self,
        iqn: String,
        lun: u32,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "remove-lun", &[&iqn, &lun.to_string()])?;
        let cap = self.iscsi()?;
        let r = async { cap.service.remove_lun(&cap.own(&iqn)?, Lun::new(lun)?).await }.await;
        crate::failpoint::hit("capability.iscsi-target.remove-lun").await;
        Ok(self.target_result(r))
    }

    async fn allow_initiator(
        &mut self,
        iqn: String,
        initiator: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "allow-initiator", &[&iqn, &initiator])?;
        let cap = self.iscsi()?;
        let r = async { cap.service.allow_initiator(&cap.own(&iqn)?, &Iqn::parse(&initiator)?).await }.await;
        crate::failpoint::hit("capability.iscsi-target.allow-initiator").await;
        Ok(self.target_result(r))
    }

    async fn deny_initiator(
        &mut self,
        iqn: String,
        initiator: String,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.deny(iqn, initiator, false).await
    }

    async fn list_sessions(
        &mut self,
        iqn: String,
    ) -> wasmtime::Result<Result<Vec<iscsi_target::Session>, iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "list-sessions", &[&iqn])?;
        let cap = self.iscsi()?;
        let r = async { cap.service.sessions(&cap.own(&iqn)?).await }.await.map(|sessions| {
            sessions
                .into_iter()
                .map(|Session { initiator, addresses }| iscsi_target::Session { initiator, addresses })
                .collect()
        });
        Ok(self.target_result(r))
    }

    async fn close_sessions(
        &mut self,
        iqn: String,
        initiator: String,
    ) -> wasmtime::Result<Result<u32, iscsi_target::TargetError>> {
        self.scope.enter("iscsi-target", "close-sessions", &[&iqn, &initiator])?;
        let cap = self.iscsi()?;
        let r = async { cap.service.close_sessions(&cap.own(&iqn)?, &Iqn::parse(&initiator)?).await }.await;
        crate::failpoint::hit("capability.iscsi-target.close-sessions").await;
        Ok(self.target_result(r))
    }

    async fn set_chap(
        &mut self,
        iqn: String,
        credentials: iscsi_target::ChapCredentials,
    ) -> wasmtime::Result<Result<(), iscsi_target::TargetError>> {
        self.scope.redactor.add(&credentials.secret);
        self.scope.enter("iscsi-target", "set-chap", &[&iqn, &credentials.username])?;
        let cap = self.iscsi()?;
        let r = async {
            let creds = ChapCredentials::parse(&credentials.username, &credentials.secret)?;
            let iqn = cap.own(&iqn)?;
            cap.own_account(&creds.user).await?;
            cap.service.set_chap(&iqn, &creds).await
        }
        .await;
        crate::failpoint::hit("capability.iscsi-target.set-chap").await;
        Ok(self.target_result(r))
    }
}

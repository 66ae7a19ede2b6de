//! The attach room, the floor above `store/`: the only orchestration of the state machine, whose
//! statuses, transition table and records are the domain's (`crate::domain`, re-exported here as
//! `state`, `model` and `list` for the flows). Both the attachments API (`attachments.rs`) and the legacy
//! volume actions (`legacy.rs`) go through here, as do volume create and delete (`volumes.rs`).
//! Nothing here knows HTTP.
//!
//! The flows come in families, each a narrow handle over the one shared core, [`Service`] (the
//! store, the backends' catalog, the volume locks, the operation machinery of `ops.rs` and the
//! history of `history.rs`): [`Service::volumes`] (`volumes.rs`), [`Service::attachments`]
//! (`attachments.rs`), [`Service::legacy`] (`legacy.rs`), [`Service::reconcile`]
//! (`reconcile/`) and [`Service::recovery`] (`recover.rs`). A flow is a method of its family;
//! what more than one family needs is a method of the core.
//!
//! **Adding a flow** (follow `volumes.rs`'s `extend` and `finish_extend`): a method of its family
//! that holds the volume (`hold`), opens its operation (`operation`) and begins it in the same
//! transaction as the transition table's conditional update; then a `finish_` method, which
//! recovery calls too, makes the driver call through the operation (`op.calls`) and writes the
//! outcome's transition with `op.write`; its entry point is one method of
//! [`commands::Commands`], which runs it as an owned operation, and its recovery after a kill is
//! one arm of `recover.rs`'s `drive`.
//!
//! Every flow that changes a backend is an operation the service owns (`ops.rs`), entered only
//! through [`commands::Commands`] (the flows are visible to this room alone): it runs as a
//! task of its own, so a client that goes away changes nothing about how far it goes; its intent
//! is recorded in the transaction that starts it, and its outcome in the transaction that ends
//! it. What a killed process leaves behind is driven to a safe end (`recover.rs`), and the
//! backends are made to match the database both ways (`reconcile/`).

pub mod attachments;
pub mod catalog;
pub mod commands;
mod compute;
mod connect;
pub mod default_types;
mod disconnect;
pub mod error;
pub mod history;
pub mod legacy;
pub mod locks;
pub mod messages;
pub mod nodes;
pub mod ops;
pub mod quotas;
pub mod reconcile;
pub mod recover;
pub mod services;
pub mod transfers;
pub mod volumes;

#[cfg(test)]
mod table_tests;

pub use crate::domain::{list, model, state};

use std::sync::Arc;

pub use catalog::{Backend, Catalog, VolumeType};
pub use error::AttachError;
use list::Scope;
use locks::VolumeLocks;
use model::{Attachment, Volume};
use ops::Owner;
use state::{Transition, VolumeTo, as_seen, settle};

use crate::runtime::Driver;
use crate::store::sql::Tx;
use crate::store::{Store, attachments as rows, volumes as volume_rows};

/// Who is asking, as the API authenticated them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user_id: String,
    pub project_id: String,
    pub roles: Vec<String>,
    /// Service callers (e.g. an orchestrator with a service token) may delete attachments that an
    /// instance still uses.
    pub is_service: bool,
    /// The request that asked, for the attach history.
    pub request: RequestIds,
}

/// A request's ids: this service's (`x-openstack-request-id` of the answer) and the caller's
/// global request id, when it sent one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestIds {
    pub id: Option<String>,
    pub global: Option<String>,
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| r == "admin")
    }

    /// Rows this caller may reach by id: its project's; an admin's, every project's (as in
    /// Cinder, where an admin context is not scoped to its project).
    pub fn scope(&self) -> Scope<'_> {
        if self.is_admin() { Scope::All } else { Scope::Project(&self.project_id) }
    }

    /// The caller's own project: what lists show unless an admin asks for `all_tenants`.
    pub fn own_project(&self) -> Scope<'_> {
        Scope::Project(&self.project_id)
    }

    /// The service itself (the reconciler, recovery).
    pub fn service() -> Caller {
        Caller {
            user_id: "berth".into(),
            project_id: String::new(),
            roles: vec!["admin".into()],
            is_service: true,
            request: RequestIds::default(),
        }
    }
}

/// The attach service.
pub struct Service {
    store: Store,
    catalog: Catalog,
    locks: VolumeLocks,
    /// This process as the owner of operations.
    owner: Owner,
    /// What the reconciler has noticed between passes (`reconcile/`).
    reconciler: reconcile::Memory,
    limits: Limits,
    /// The target service of the backends granted it, to verify an export before a connection
    /// is acknowledged.
    targets: Option<Arc<dyn crate::capabilities::iscsi::TargetService>>,
    /// Nova, told when an attached volume grew (`[nova]`).
    compute: Option<Arc<crate::compute::Nova>>,
}

/// Bounds the service enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Live attachments per volume; one more is refused (`TooManyAttachments`).
    pub max_attachments_per_volume: u32,
    /// Days a user message is kept (`messages.rs`).
    pub keep_messages_days: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_attachments_per_volume: 1024, keep_messages_days: 30 }
    }
}

impl Service {
    pub fn new(store: Store, catalog: Catalog, owner: Owner) -> Self {
        Service {
            store,
            catalog,
            locks: VolumeLocks::default(),
            owner,
            reconciler: Default::default(),
            limits: Limits::default(),
            targets: None,
            compute: None,
        }
    }

    /// The same service, telling this compute service when an attached volume grew.
    pub fn with_compute(mut self, compute: Option<Arc<crate::compute::Nova>>) -> Self {
        self.compute = compute;
        self
    }

    /// The same service, verifying exports on this target service (`berth serve` gives it the
    /// one its iSCSI backends are granted).
    pub fn with_targets(
        mut self,
        targets: Option<Arc<dyn crate::capabilities::iscsi::TargetService>>,
    ) -> Self {
        self.targets = targets;
        self
    }

    /// The same service with other bounds.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The backend that runs the driver calls of a volume. Operations on a volume whose calls run
    /// on another node are refused before they start (`Service::hold`, `Op::begin`), so this is a
    /// last guard. The backend comes with the driver it runs now, which the caller keeps for the
    /// whole operation (a driver switched meanwhile serves the operations after it).
    fn backend(&self, volume: &Volume) -> Result<Backend, AttachError> {
        let backend = self
            .catalog
            .backend(&volume.backend)
            .ok_or_else(|| AttachError::BackendUnavailable(volume.backend.clone()))?;
        match &volume.service_uuid {
            Some(owner) if *owner != backend.service_uuid => Err(AttachError::Unavailable(format!(
                "Volume {} is served by another Berth node (service_uuid {owner}); send the request to \
                 that node.",
                volume.id
            ))),
            _ => Ok(backend),
        }
    }

    /// The driver of a volume for a call that needs no operation (validate-connector): refused,
    /// naming the node, for a volume whose calls run on another node.
    /// Checks a connector with the volume's driver, before anything is reserved (a bad connector
    /// changes nothing), and returns the instance that answered: the operation that follows
    /// makes its calls in it ([`ops::Op::handed`]).
    async fn validated(
        &self,
        volume: &Volume,
        connector: &crate::runtime::contract::Connector,
    ) -> Result<Option<crate::runtime::KeptInstance>, AttachError> {
        let driver = self.driver(volume).await?;
        let mut calls = driver.calls();
        calls.validate_connector(connector).await?;
        Ok(calls.keep_instance())
    }

    async fn driver(&self, volume: &Volume) -> Result<Driver, AttachError> {
        if self.backend(volume).is_err() {
            self.store.read(async |tx| self.check_placement(tx, &volume.id).await).await?;
        }
        Ok(self.backend(volume)?.driver)
    }

    /// A live volume visible to the caller.
    async fn volume(&self, caller: &Caller, id: &str) -> Result<Volume, AttachError> {
        self.store
            .read(async |tx| {
                volume_rows::get(tx, id, caller.scope()).await?.ok_or_else(|| volume_not_found(id))
            })
            .await
    }

    /// The live volume as stored now (after any earlier driver call persisted its update).
    pub(crate) async fn fresh_volume(&self, id: &str) -> Result<Volume, AttachError> {
        self.store
            .read(async |tx| volume_rows::get(tx, id, Scope::All).await?.ok_or_else(|| volume_not_found(id)))
            .await
    }

    /// An attachment visible to the caller.
    pub(crate) async fn attachment(&self, caller: &Caller, id: &str) -> Result<Attachment, AttachError> {
        self.store
            .read(async |tx| rows::get(tx, id, caller.scope()).await?.ok_or_else(|| attachment_not_found(id)))
            .await
    }
}

pub fn volume_not_found(id: &str) -> AttachError {
    AttachError::NotFound(format!("Volume {id} could not be found."))
}

pub fn attachment_not_found(id: &str) -> AttachError {
    AttachError::NotFound(format!("Volume attachment could not be found with filter: attachment_id = {id}."))
}

/// Statuses joined for a message ("a or b").
pub(crate) fn names<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(" or ")
}

/// Applies the volume side of a transition to a volume locked for it: derives its status from its
/// live attachments, or sets the table's status, or deletes it. Returns the volume as written.
pub(crate) async fn conclude(tx: &mut Tx, locked: &Volume, t: &Transition) -> Result<Volume, AttachError> {
    match t.volume_to {
        VolumeTo::Settle { keep_detaching } => {
            let statuses: Vec<_> = rows::statuses(tx, &locked.id)
                .await?
                .into_iter()
                .map(|(s, legacy)| as_seen(s, legacy))
                .collect();
            let detaching = keep_detaching && locked.status == state::VolumeStatus::Detaching;
            let (status, attach) = settle(&statuses, detaching);
            Ok(volume_rows::set_status(tx, &locked.id, status, attach).await?)
        }
        VolumeTo::Set(status, attach) => Ok(volume_rows::set_status(tx, &locked.id, status, attach).await?),
        VolumeTo::Unchanged => Ok(locked.clone()),
        VolumeTo::Removed => {
            volume_rows::soft_delete(tx, &locked.id, state::VolumeStatus::Deleted).await?;
            Ok(locked.clone())
        }
        VolumeTo::Unmanaged => {
            volume_rows::soft_delete(tx, &locked.id, state::VolumeStatus::Unmanaged).await?;
            Ok(locked.clone())
        }
    }
}

/// In a write transaction: writes what a flow changed in a volume's driver fields, from those of
/// `read` (the volume as the flow read it) to `fields`, as a merge onto what is stored, whatever
/// the volume's status.
pub(crate) async fn record_fields(
    tx: &mut Tx,
    read: &Volume,
    fields: &crate::runtime::model::VolumeFields,
) -> Result<(), AttachError> {
    volume_rows::lock(tx, &read.id, state::transition(state::Event::Refresh), Some((&read.fields, fields)))
        .await?;
    Ok(())
}

/// Shared handle to the service, as the API and the background tasks hold it.
pub type SharedService = Arc<Service>;

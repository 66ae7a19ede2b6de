//! Volume flows: create and delete go through the driver (`create-volume`, `delete-volume`) as
//! operations of `ops.rs`; show, list and metadata read and write the store.

use std::collections::BTreeMap;

use super::history::Change;
use super::list::{Page, Scope, VolumeFilter};
use super::model::{Attachment, OpKind, Volume};
use super::state::{Event, VolumeAttachStatus, VolumeStatus, transition};
use super::{AttachError, Caller, Service, conclude, names, volume_not_found};
use crate::domain::history::Access;
use crate::domain::messages::{Action, Detail};
use crate::domain::quotas;
use crate::failpoint;
use crate::runtime::Call;
use crate::runtime::model::VolumeFields;
use crate::store::attachments as rows;
use crate::store::volumes::UserFields;
use crate::store::{now_micros, operations, volumes};

/// The largest volume, in GiB (64 TiB).
pub const MAX_SIZE_GIB: i64 = 65_536;

/// The one set of bounds on what a user writes into a volume, at create and at every update
/// (Cinder's: names and descriptions of 255 characters, metadata keys and values of 255, and the
/// metadata quota's 128 items).
pub mod bounds {
    use std::collections::BTreeMap;

    use super::AttachError;

    pub const MAX_NAME: usize = 255;
    pub const MAX_DESCRIPTION: usize = 255;
    pub const MAX_METADATA_ITEMS: usize = 128;
    pub const MAX_METADATA_KEY: usize = 255;
    pub const MAX_METADATA_VALUE: usize = 255;
    /// The longest image property value (a text column's, as Cinder's `mysql_text`).
    pub const MAX_IMAGE_VALUE: usize = 65_535;

    /// A name or description as it is kept: without the white space around it, as Cinder
    /// keeps them (`clean_name_and_description`).
    pub fn trimmed(text: Option<String>) -> Option<String> {
        text.map(|t| t.trim().to_string())
    }

    /// A name or description: at most `max` characters.
    pub fn text(field: &str, value: Option<&str>, max: usize) -> Result<(), AttachError> {
        match value {
            Some(v) if v.chars().count() > max => Err(AttachError::InvalidInput(format!(
                "{field} has {} characters; at most {max} are allowed",
                v.chars().count()
            ))),
            _ => Ok(()),
        }
    }

    /// Metadata items being written: keys of 1 to 255 characters, values of at most 255.
    pub fn items(items: &BTreeMap<String, String>) -> Result<(), AttachError> {
        checked(items, "metadata key", |_| true, "characters", MAX_METADATA_VALUE)
    }

    /// Image properties, as Cinder's schema takes them: each key 1 to 255 of letters, digits and
    /// `-_:. /`; each value at most 65,535 characters (a text column's).
    pub fn image_items(items: &BTreeMap<String, String>) -> Result<(), AttachError> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "-_:. /".contains(c);
        checked(
            items,
            "image property",
            |k| k.chars().all(allowed),
            "letters, digits and '-_:. /'",
            MAX_IMAGE_VALUE,
        )
    }

    /// Items whose keys are 1 to 255 characters that `key_ok` takes (`key_rule` says which) and
    /// whose values are at most `max_value` characters; `noun` names a key in the refusal.
    fn checked(
        items: &BTreeMap<String, String>,
        noun: &str,
        key_ok: impl Fn(&str) -> bool,
        key_rule: &str,
        max_value: usize,
    ) -> Result<(), AttachError> {
        if let Some(key) =
            items.keys().find(|k| k.is_empty() || k.chars().count() > MAX_METADATA_KEY || !key_ok(k))
        {
            let shown: String = key.chars().take(40).collect();
            return Err(AttachError::InvalidInput(format!(
                "{noun} {shown:?} must be 1 to {MAX_METADATA_KEY} {key_rule}"
            )));
        }
        if let Some((key, _)) = items.iter().find(|(_, v)| v.chars().count() > max_value) {
            return Err(AttachError::InvalidInput(format!(
                "the value of {noun} {key:?} is longer than {max_value} characters"
            )));
        }
        Ok(())
    }

    /// A volume's whole metadata: at most 128 items.
    pub fn count(metadata: &BTreeMap<String, String>) -> Result<(), AttachError> {
        if metadata.len() > MAX_METADATA_ITEMS {
            return Err(AttachError::InvalidInput(format!(
                "a volume may have at most {MAX_METADATA_ITEMS} metadata items ({} given)",
                metadata.len()
            )));
        }
        Ok(())
    }
}

/// A request to create a volume.
#[derive(Debug, Clone, Default)]
pub struct NewVolume {
    pub size_gib: i64,
    pub name: Option<String>,
    pub description: Option<String>,
    /// A volume type name or id; the default type when `None`.
    pub volume_type: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// A change of a volume's own fields (`PUT /volumes/{id}`, `os-set_bootable`): `None` leaves a
/// field as it is; `Some(None)` clears a name or description.
#[derive(Debug, Clone, Default)]
pub struct VolumeChange {
    pub name: Option<Option<String>>,
    pub description: Option<Option<String>>,
    /// The whole new metadata.
    pub metadata: Option<BTreeMap<String, String>>,
    pub bootable: Option<bool>,
}

impl VolumeChange {
    /// Without the white space around its name and description.
    fn cleaned(self) -> Self {
        VolumeChange {
            name: self.name.map(bounds::trimmed),
            description: self.description.map(bounds::trimmed),
            ..self
        }
    }
}

/// What `scope`'s volumes come to (`GET /volumes/summary`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub count: i64,
    pub size_gib: i64,
    /// Each metadata key, with the values it has.
    pub metadata: BTreeMap<String, std::collections::BTreeSet<String>>,
}

/// Cinder's `_driver_shares_targets`: `false` when the driver says it does not share targets;
/// `null` (consumers always lock) for NVMe-oF; `true` for iSCSI and iSER; `false` otherwise.
fn shares_targets(info: &crate::runtime::contract::DriverInfo) -> Option<bool> {
    use crate::runtime::contract::Protocol;
    if !info.capabilities.shared_targets {
        return Some(false);
    }
    if info.protocols.iter().any(|p| matches!(p, Protocol::Nvmeof)) {
        return None;
    }
    Some(info.protocols.iter().any(|p| matches!(p, Protocol::Iscsi | Protocol::Iser)))
}

/// In a write transaction: locks volume `id` for `t` (a delete, an unmanage) when it is in one
/// of `t`'s statuses and has no live attachment; `None` when not.
async fn lock_unattached(
    tx: &mut crate::store::sql::Tx,
    id: &str,
    t: &crate::domain::state::Transition,
) -> Result<Option<Volume>, AttachError> {
    let locked = volumes::lock(tx, id, t, None).await?;
    if locked.is_some() && !rows::statuses(tx, id).await?.is_empty() {
        return Ok(None);
    }
    Ok(locked)
}

/// The refusal of `t` for a volume in `status` or with attachments.
fn not_unattached(t: &crate::domain::state::Transition, id: &str, status: VolumeStatus) -> AttachError {
    AttachError::InvalidVolume(format!(
        "Volume status must be {} and must not be attached, but the volume {id} is {status}.",
        names(t.volume_from(false)),
    ))
}

/// Refuses `more_gib` more of `backend`'s volumes on this node when the filesystem its volumes
/// are files on has no room for them (`domain/capacity.rs`). Runs in the transaction that adds
/// them; the volumes already there are counted in it, or were less than
/// [`super::catalog::RECOUNT`] ago.
async fn within_room(
    tx: &mut crate::store::sql::Tx,
    backend: &super::catalog::Backend,
    more_gib: i64,
) -> Result<(), AttachError> {
    let Some(filesystem) = &backend.filesystem else { return Ok(()) };
    let provisioned = match filesystem.provisioned() {
        Some(gib) => gib,
        None => {
            let gib = volumes::provisioned(tx, &backend.name, &backend.service_uuid).await?;
            filesystem.counted(gib);
            gib
        }
    };
    let room = filesystem.room(provisioned).map_err(|e| {
        AttachError::Unavailable(format!(
            "backend {}: its filesystem's size cannot be read: {e}",
            backend.name
        ))
    })?;
    let refused = |why| AttachError::NoRoom { backend: backend.name.clone(), requested_gib: more_gib, why };
    room.take(more_gib).map_err(refused)?;
    filesystem.let_in(more_gib);
    Ok(())
}

/// The volume flows, over the service's shared core.
pub struct Volumes<'a>(&'a Service);

impl Service {
    /// Volumes: the flows of `volumes.rs`.
    pub fn volumes(&self) -> Volumes<'_> {
        Volumes(self)
    }
}

impl std::ops::Deref for Volumes<'_> {
    type Target = Service;

    fn deref(&self) -> &Service {
        self.0
    }
}

impl Volumes<'_> {
    /// Creates a volume through its backend's driver. When the driver fails, the volume is kept
    /// in `error` (it can be deleted) and the driver's error is returned.
    pub(super) async fn create(&self, caller: &Caller, mut req: NewVolume) -> Result<Volume, AttachError> {
        (req.name, req.description) = (bounds::trimmed(req.name), bounds::trimmed(req.description));
        bounds::text("name", req.name.as_deref(), bounds::MAX_NAME)?;
        bounds::text("description", req.description.as_deref(), bounds::MAX_DESCRIPTION)?;
        bounds::items(&req.metadata)?;
        bounds::count(&req.metadata)?;
        if !(1..=MAX_SIZE_GIB).contains(&req.size_gib) {
            return Err(AttachError::InvalidInput(format!(
                "Volume size '{}' must be an integer and greater than 0 (at most {MAX_SIZE_GIB} GiB)",
                req.size_gib
            )));
        }
        let vtype = self.volume_type_for(&caller.project_id, req.volume_type.as_deref()).await?;
        let backend = self
            .catalog
            .backend(&vtype.backend)
            .ok_or_else(|| AttachError::BackendUnavailable(vtype.backend.clone()))?;
        let now = now_micros();
        let (status, attach_status) = match transition(Event::CreateVolume).volume_to {
            super::state::VolumeTo::Set(s, a) => (s, a),
            other => unreachable!("CreateVolume sets a status, not {other:?}"),
        };
        let row = Volume {
            id: uuid::Uuid::new_v4().to_string(),
            project_id: caller.project_id.clone(),
            user_id: caller.user_id.clone(),
            name: req.name,
            description: req.description,
            size_gib: req.size_gib,
            volume_type: vtype.name.clone(),
            backend: backend.name.clone(),
            multiattach: vtype.multiattach(),
            status,
            attach_status,
            fields: VolumeFields::default(),
            metadata: req.metadata,
            shared_targets: shares_targets(backend.driver.info()),
            service_uuid: Some(backend.service_uuid.clone()),
            created_at: now,
            updated_at: now,
            bootable: false,
            image_metadata: BTreeMap::new(),
        };
        let _lock = self.locks.lock(&row.id).await;
        let op = self.operation(OpKind::CreateVolume, &row.id, None, None);
        self.store
            .write(async |tx| {
                self.check_enabled(tx, &backend, &row.id).await?;
                failpoint::pause(&format!("volume.create.check {}", self.owner.node)).await;
                let change = quotas::Change::volume(&row.volume_type, row.size_gib);
                self.within_quota(tx, &row.project_id, &change).await?;
                within_room(tx, &backend, row.size_gib).await?;
                volumes::insert(tx, &row).await?;
                op.begin(tx).await
            })
            .await?;
        failpoint::hit("volume.create.intent").await;
        self.finish_create(&op, &row).await
    }

    /// Asks the driver to allocate a volume in `creating` and records the outcome (also what
    /// recovery does with an interrupted create: `create-volume` is idempotent).
    pub(super) async fn finish_create(
        &self,
        op: &super::ops::Op<'_>,
        row: &Volume,
    ) -> Result<Volume, AttachError> {
        let backend = self.backend(row)?;
        let mut calls = op.calls(&backend.driver);
        let mut fields = row.fields.clone();
        let created = match calls.create_volume(&row.contract()).await {
            Ok(update) => backend.driver.apply(Call::CreateVolume, &mut fields, &update),
            Err(e) => Err(e),
        };
        failpoint::hit("volume.create.commit").await;
        let t = transition(if created.is_ok() { Event::VolumeCreated } else { Event::CreateFailed });
        let written = op
            .write(async |tx| {
                let locked = volumes::lock(tx, &row.id, t, Some((&row.fields, &fields))).await?;
                let written = match locked {
                    Some(locked) => {
                        let written = conclude(tx, &locked, t).await?;
                        if created.is_err() {
                            let (action, detail) =
                                (Action::CreateVolumeFromBackend, Detail::DriverFailedCreate);
                            self.tell(tx, &written, action, detail).await?;
                        }
                        Some(written)
                    }
                    None => None,
                };
                op.finish_with(tx, &row.backend, &calls).await?;
                Ok::<_, AttachError>(written)
            })
            .await?;
        created?;
        written.ok_or_else(|| volume_not_found(&row.id))
    }

    /// Deletes a volume that has no attachments, through its driver. When the driver fails the
    /// volume is left in `error_deleting`, from which deleting again retries. `force` (an admin's)
    /// also accepts volumes stuck in `creating` or `deleting`.
    pub(super) async fn delete(&self, caller: &Caller, id: &str, force: bool) -> Result<(), AttachError> {
        self.volume(caller, id).await?;
        let _held = self.hold(id).await?;
        let volume = self.volume(caller, id).await?;
        let t = transition(if force { Event::ForceDeleteVolume } else { Event::DeleteVolume });
        let op = self.operation(OpKind::DeleteVolume, id, None, None);
        let locked = self
            .store
            .write(async |tx| {
                let Some(locked) = lock_unattached(tx, id, t).await? else {
                    return Err(not_unattached(t, id, volume.status));
                };
                let deleting = conclude(tx, &locked, t).await?;
                op.begin(tx).await?;
                Ok(deleting)
            })
            .await?;
        failpoint::hit("volume.delete.intent").await;
        self.finish_delete(&op, &locked).await
    }

    /// Asks the driver to release a volume in `deleting` and records the outcome (also what
    /// recovery does with an interrupted delete: `delete-volume` is idempotent).
    pub(super) async fn finish_delete(
        &self,
        op: &super::ops::Op<'_>,
        volume: &Volume,
    ) -> Result<(), AttachError> {
        let backend = self.backend(volume)?;
        let mut calls = op.calls(&backend.driver);
        let deleted = calls.delete_volume(&volume.contract()).await;
        failpoint::hit("volume.delete.commit").await;
        let t = transition(if deleted.is_ok() { Event::VolumeDeleted } else { Event::DeleteFailed });
        op.write(async |tx| {
            if let Some(locked) = volumes::lock(tx, &volume.id, t, None).await? {
                conclude(tx, &locked, t).await?;
            }
            op.finish_with(tx, &volume.backend, &calls).await
        })
        .await?;
        Ok(deleted?)
    }

    /// Stops managing a volume that has no attachments (an admin's `os-unmanage`): its export is
    /// removed through its driver (`remove-export`), then its row is deleted as `unmanaged`, and
    /// its data stays on the backend, where nothing of Berth's removes it (no `delete-volume`; the
    /// reconcilers leave its image alone). When the driver cannot remove the export, nothing
    /// changes and its error is returned. A volume whose backend no node serves any more (taken
    /// out of every configuration: a decommissioned array), or whose node is down, has no driver
    /// to call: its row alone is deleted, and so is an interrupted operation whose node is gone.
    pub(super) async fn unmanage(&self, caller: &Caller, id: &str) -> Result<(), AttachError> {
        let volume = self.volume(caller, id).await?;
        let t = transition(Event::Unmanage);
        let _held = match self.hold(id).await {
            Ok(held) => held,
            // Nothing can run its driver's calls now: the row alone goes. A volume without
            // attachments has at most a bare target kept for reuse on its node (no LUN, no
            // initiator), which that node's sweep deletes in time.
            Err(AttachError::BackendUnavailable(_)) => return self.forget(id, &volume).await,
            Err(AttachError::Elsewhere(remote)) if !remote.up => return self.forget(id, &volume).await,
            Err(e) => return Err(e),
        };
        let op = self.operation(OpKind::RemoveExport, id, None, None);
        let volume = self
            .store
            .write(async |tx| {
                let Some(locked) = lock_unattached(tx, id, t).await? else {
                    return Err(not_unattached(t, id, volume.status));
                };
                op.begin(tx).await?;
                Ok(locked)
            })
            .await?;
        failpoint::hit("volume.unmanage.intent").await;
        let backend = self.backend(&volume)?;
        let mut calls = op.calls(&backend.driver);
        let removed = match calls.remove_export(&volume.contract()).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_unsupported() => Ok(()),
            Err(e) => Err(e),
        };
        failpoint::hit("volume.unmanage.commit").await;
        let exported =
            calls.effects.iter().any(|e| matches!(e, crate::runtime::Effect::TargetDeleted { .. }));
        let unmanaged = op
            .write(async |tx| {
                let mut unmanaged = None;
                let locked = match removed {
                    Ok(()) => lock_unattached(tx, id, t).await?,
                    Err(_) => None,
                };
                if let Some(locked) = locked {
                    let access = if exported { Access::Revoked } else { Access::None };
                    let change = Change {
                        event: t.event,
                        access,
                        attachment: None,
                        connector: None,
                        outcome: Some("unmanaged"),
                    };
                    self.record(tx, &locked, change).await?;
                    unmanaged = Some(conclude(tx, &locked, t).await?);
                }
                op.finish_with(tx, &volume.backend, &calls).await?;
                Ok::<_, AttachError>(unmanaged)
            })
            .await?;
        removed?;
        match unmanaged {
            Some(_) => {
                tracing::info!(volume = %id, backend = %volume.backend, admin = %caller.user_id, "unmanaged");
                Ok(())
            }
            // Attached (or deleted) while its export was being removed: the next attach makes it
            // again.
            None => {
                let now = self.volume(caller, id).await?;
                Err(not_unattached(t, id, now.status))
            }
        }
    }

    /// The part of [`Self::unmanage`] for a volume whose backend no live node serves: its row is
    /// deleted as `unmanaged` in one transaction, with any operation on it whose node is gone.
    async fn forget(&self, id: &str, volume: &Volume) -> Result<(), AttachError> {
        let t = transition(Event::Unmanage);
        let _lock = self.locks.lock(id).await;
        self.store
            .write(async |tx| {
                if let Some(op) = operations::of_volume(tx, id).await? {
                    if !self.owner.is_orphaned(&op) {
                        return Err(AttachError::Unavailable(format!(
                            "an operation on volume {id} is in progress on node {}",
                            op.node
                        )));
                    }
                    operations::finish(tx, &op.id, op.generation).await?;
                }
                let Some(locked) = lock_unattached(tx, id, t).await? else {
                    return Err(not_unattached(t, id, volume.status));
                };
                let change = Change {
                    event: t.event,
                    access: Access::None,
                    attachment: None,
                    connector: None,
                    outcome: Some("unmanaged"),
                };
                self.record(tx, &locked, change).await?;
                conclude(tx, &locked, t).await
            })
            .await?;
        tracing::warn!(
            volume = %id, backend = %volume.backend,
            "unmanaged a volume whose backend no live node serves: its row is deleted, its backend was not asked"
        );
        Ok(())
    }

    /// Gives a volume another volume type of its backend (`os-retype`): its data and exports
    /// stay as they are, so the type must differ and be of the same backend (a retype to another
    /// backend would be a migration, which Berth does not do, whatever `migration_policy` says).
    /// A change of multiattach needs the volume available, as in Cinder: its attachments' slots
    /// follow it; so does a change of the QoS specs the compute host enforces (its connections
    /// carry the old ones).
    pub(super) async fn retype(&self, caller: &Caller, id: &str, new_type: &str) -> Result<(), AttachError> {
        let volume = self.volume(caller, id).await?;
        let to =
            self.catalog.types.iter().find(|t| t.id == new_type || t.name == new_type).ok_or_else(|| {
                AttachError::InvalidInput(format!("Invalid volume_type passed: {new_type}."))
            })?;
        if to.backend != volume.backend {
            return Err(AttachError::InvalidInput(format!(
                "Volume type {} is of backend {}, and volume {id} is on backend {}: the retype would \
                 migrate the volume, which Berth does not do",
                to.name, to.backend, volume.backend
            )));
        }
        let multiattach = to.multiattach();
        let t = transition(Event::Retype);
        let refused = |status: VolumeStatus| {
            AttachError::InvalidVolume(format!(
                "Retype needs volume to be in {} state and the requested type to be different from the \
                 volume's, but volume {id} is {status} and of type {}.",
                names(t.volume_from(false)),
                volume.volume_type
            ))
        };
        let _lock = self.locks.lock(id).await;
        self.store
            .write(async |tx| {
                let locked = volumes::lock(tx, id, t, None).await?.filter(|v| v.volume_type != to.name);
                let Some(locked) = locked else { return Err(refused(volume.status)) };
                if locked.multiattach != multiattach && locked.status != VolumeStatus::Available {
                    return Err(AttachError::InvalidInput(format!(
                        "Invalid volume_type passed, retypes affecting multiattach are only allowed on \
                         available volumes, the specified volume however currently has a status of: {}.",
                        locked.status
                    )));
                }
                // A type no longer configured had no QoS specs that anything still knows of.
                let keeps_qos = match self.catalog.volume_type(Some(&locked.volume_type)) {
                    Some(from) => from.keeps_front_end_qos(to),
                    None => to.front_end_qos().is_none(),
                };
                if locked.status != VolumeStatus::Available && !keeps_qos {
                    return Err(AttachError::InvalidVolume(format!(
                        "Retype cannot change the front-end QoS specs of a volume that is not available: \
                         volume {id} is {} and types {} and {} have different QoS specs for the compute host.",
                        locked.status, locked.volume_type, to.name
                    )));
                }
                self.within_quota(tx, &locked.project_id, &quotas::Change::new_type(&to.name, locked.size_gib)).await?;
                volumes::set_type(tx, id, &to.name, multiattach).await?;
                Ok(())
            })
            .await?;
        tracing::info!(volume = %id, from = %volume.volume_type, to = %to.name, "retyped");
        Ok(())
    }

    /// Grows an available volume, or with `attached` (Cinder's `os-extend` from 3.42) one in use
    /// on a backend that extends attached volumes: its attachments and connections stay, and the
    /// driver serves the new size to the hosts attached. The new size is recorded once the driver
    /// has grown it; when the driver fails, the volume is as it was (available or in use) at its
    /// old size and the driver's error is returned (the extend may be tried again).
    pub(super) async fn extend(
        &self,
        caller: &Caller,
        id: &str,
        new_size_gib: i64,
        attached: bool,
    ) -> Result<Volume, AttachError> {
        let volume = self.volume(caller, id).await?;
        let attached = attached && volume.status == VolumeStatus::InUse;
        if attached && !self.backend(&volume)?.extends_attached {
            return Err(AttachError::InvalidVolume(format!(
                "Volume {id} is attached, and its backend {} does not extend attached volumes \
                 (online_extend in its configuration); detach it first.",
                volume.backend
            )));
        }
        if new_size_gib <= volume.size_gib {
            return Err(AttachError::InvalidInput(format!(
                "New size for extend must be greater than current size. (current: {}, extended: {new_size_gib}).",
                volume.size_gib
            )));
        }
        if new_size_gib > MAX_SIZE_GIB {
            return Err(AttachError::InvalidInput(format!(
                "New size for extend must be at most {MAX_SIZE_GIB} GiB, not {new_size_gib}."
            )));
        }
        let _held = self.hold(id).await?;
        let backend = self.backend(&volume)?;
        let t = transition(if attached { Event::ExtendAttached } else { Event::ExtendVolume });
        let op = self.operation(OpKind::ExtendVolume { new_size_gib }, id, None, None);
        let locked = self
            .store
            .write(async |tx| {
                let Some(locked) = volumes::lock(tx, id, t, None).await? else {
                    let now = volumes::get(tx, id, Scope::All).await?.map(|v| v.status.to_string());
                    return Err(AttachError::InvalidVolume(format!(
                        "Volume status must be {} to extend, but current status is: {}.",
                        if attached { "in-use" } else { "available" },
                        now.as_deref().unwrap_or("deleted")
                    )));
                };
                let growth = quotas::Change::growth(&locked.volume_type, locked.size_gib, new_size_gib);
                self.within_quota(tx, &locked.project_id, &growth).await?;
                within_room(tx, &backend, new_size_gib - locked.size_gib).await?;
                let extending = conclude(tx, &locked, t).await?;
                op.begin(tx).await?;
                Ok(extending)
            })
            .await?;
        failpoint::hit("volume.extend.intent").await;
        self.finish_extend(&op, &locked, new_size_gib).await
    }

    /// Asks the driver to grow a volume in `extending` and records the outcome (also what
    /// recovery does with an interrupted extend: `extend-volume` is idempotent).
    pub(super) async fn finish_extend(
        &self,
        op: &super::ops::Op<'_>,
        volume: &Volume,
        new_size_gib: i64,
    ) -> Result<Volume, AttachError> {
        let backend = self.backend(volume)?;
        let mut calls = op.calls(&backend.driver);
        let mut fields = volume.fields.clone();
        let extended = match calls.extend_volume(&volume.contract(), new_size_gib as u64).await {
            Ok(update) => backend.driver.apply(Call::ExtendVolume, &mut fields, &update),
            Err(e) => Err(e),
        };
        failpoint::hit("volume.extend.commit").await;
        let t = transition(if extended.is_ok() { Event::VolumeExtended } else { Event::ExtendFailed });
        let written = op
            .write(async |tx| {
                let locked = volumes::lock(tx, &volume.id, t, Some((&volume.fields, &fields))).await?;
                let written = match locked {
                    Some(locked) => {
                        let mut owed = None;
                        if extended.is_ok() {
                            volumes::set_size(tx, &volume.id, new_size_gib).await?;
                            if volume.attach_status == VolumeAttachStatus::Attached {
                                owed = self.owe_extended(tx, &volume.id).await?;
                            }
                        } else {
                            self.tell(tx, &locked, Action::ExtendVolume, Detail::DriverFailedExtend).await?;
                        }
                        Some((conclude(tx, &locked, t).await?, owed))
                    }
                    None => None,
                };
                op.finish_with(tx, &volume.backend, &calls).await?;
                Ok::<_, AttachError>(written)
            })
            .await?;
        extended?;
        let (written, owed) = written.ok_or_else(|| volume_not_found(&volume.id))?;
        if let Some(owed) = owed {
            self.send_owed(owed);
        }
        Ok(written)
    }

    /// A volume with its live attachments.
    pub async fn show(&self, caller: &Caller, id: &str) -> Result<(Volume, Vec<Attachment>), AttachError> {
        self.store
            .read(async |tx| {
                let volume =
                    volumes::get(tx, id, caller.scope()).await?.ok_or_else(|| volume_not_found(id))?;
                let attachments = rows::of_volume(tx, id).await?;
                Ok((volume, attachments))
            })
            .await
    }

    /// Volumes with their live attachments.
    pub async fn list(
        &self,
        scope: Scope<'_>,
        filter: &VolumeFilter,
        page: &Page,
    ) -> Result<Vec<(Volume, Vec<Attachment>)>, AttachError> {
        self.store
            .read(async |tx| {
                let marker = match &page.marker {
                    Some(m) => Some(volumes::get(tx, m, scope).await?.ok_or_else(|| {
                        AttachError::NotFound(format!("Marker volume {m} could not be found."))
                    })?),
                    None => None,
                };
                let list = volumes::list(tx, scope, filter, page, marker.as_ref()).await?;
                let ids: Vec<String> = list.iter().map(|v| v.id.clone()).collect();
                let mut attachments = rows::of_volumes(tx, &ids).await?;
                Ok(list
                    .into_iter()
                    .map(|v| {
                        let mine: Vec<Attachment> =
                            attachments.extract_if(.., |a| a.volume_id == v.id).collect();
                        (v, mine)
                    })
                    .collect())
            })
            .await
    }

    /// Changes a volume's user metadata: merges `changes` (or replaces everything with them when
    /// `replace`), then removes `remove`. Returns the metadata afterwards.
    pub(super) async fn update_metadata(
        &self,
        caller: &Caller,
        id: &str,
        changes: BTreeMap<String, String>,
        replace: bool,
        remove: Option<&str>,
    ) -> Result<BTreeMap<String, String>, AttachError> {
        bounds::items(&changes)?;
        let remove = remove.map(str::to_string);
        let updated = self
            .update_user_fields(caller, id, move |fields| {
                if replace {
                    fields.metadata.clear();
                }
                fields.metadata.extend(changes);
                if let Some(key) = remove
                    && fields.metadata.remove(&key).is_none()
                {
                    return Err(AttachError::NotFound(format!("Metadata item was not found: {key}")));
                }
                Ok(())
            })
            .await?;
        Ok(updated.metadata)
    }

    /// Changes a volume's image properties (`os-set_image_metadata`, `os-unset_image_metadata`):
    /// merges `changes`, then removes `remove` (Cinder's 404 when the volume has no such
    /// property). Returns them afterwards.
    pub(super) async fn update_image_metadata(
        &self,
        caller: &Caller,
        id: &str,
        changes: BTreeMap<String, String>,
        remove: Option<&str>,
    ) -> Result<BTreeMap<String, String>, AttachError> {
        bounds::image_items(&changes)?;
        let remove = remove.map(str::to_string);
        let updated = self
            .update_user_fields(caller, id, move |fields| {
                fields.image_metadata.extend(changes);
                if let Some(key) = remove
                    && fields.image_metadata.remove(&key).is_none()
                {
                    return Err(AttachError::NotFound(format!(
                        "Glance metadata for volume {id} cannot be found: it has no image property {key}"
                    )));
                }
                Ok(())
            })
            .await?;
        Ok(updated.image_metadata)
    }

    /// `PUT /volumes/{id}` and `os-set_bootable`: a new name, description, metadata (replaced
    /// whole, as Cinder's update does) or bootable flag. Names and descriptions are [`bounds::trimmed`], as at create. Any
    /// status: nothing a driver or an attachment sees changes.
    pub(super) async fn update(
        &self,
        caller: &Caller,
        id: &str,
        change: VolumeChange,
    ) -> Result<Volume, AttachError> {
        let change = change.cleaned();
        bounds::text("name", change.name.as_ref().and_then(Option::as_deref), bounds::MAX_NAME)?;
        bounds::text(
            "description",
            change.description.as_ref().and_then(Option::as_deref),
            bounds::MAX_DESCRIPTION,
        )?;
        if let Some(metadata) = &change.metadata {
            bounds::items(metadata)?;
        }
        self.update_user_fields(caller, id, move |fields| {
            if let Some(name) = change.name {
                fields.name = name;
            }
            if let Some(description) = change.description {
                fields.description = description;
            }
            if let Some(metadata) = change.metadata {
                fields.metadata = metadata;
            }
            if let Some(bootable) = change.bootable {
                fields.bootable = bootable;
            }
            Ok(())
        })
        .await
    }

    /// The one way the user's fields of a volume change: in one transaction, the volume locked
    /// for [`Event::Update`] (any status), `change` applied to what is stored, the whole
    /// metadata's bound checked, the fields written. Answers the volume as it now is.
    async fn update_user_fields(
        &self,
        caller: &Caller,
        id: &str,
        change: impl FnOnce(&mut UserFields) -> Result<(), AttachError>,
    ) -> Result<Volume, AttachError> {
        self.store
            .write(async move |tx| {
                volumes::get(tx, id, caller.scope()).await?.ok_or_else(|| volume_not_found(id))?;
                let mut volume = volumes::lock(tx, id, transition(Event::Update), None)
                    .await?
                    .ok_or_else(|| volume_not_found(id))?;
                let mut fields = UserFields {
                    name: volume.name.take(),
                    description: volume.description.take(),
                    metadata: std::mem::take(&mut volume.metadata),
                    bootable: volume.bootable,
                    image_metadata: std::mem::take(&mut volume.image_metadata),
                };
                change(&mut fields)?;
                bounds::count(&fields.metadata)?;
                bounds::count(&fields.image_metadata)?;
                volumes::set_user_fields(tx, id, &fields).await?;
                (volume.name, volume.description, volume.metadata, volume.bootable, volume.image_metadata) = (
                    fields.name,
                    fields.description,
                    fields.metadata,
                    fields.bootable,
                    fields.image_metadata,
                );
                Ok(volume)
            })
            .await
    }

    /// `os-reimage` (3.68): Cinder's checks of the volume's status, then a refusal: re-imaging
    /// writes an image from an image service onto the volume, and Berth has none. Nothing changes.
    pub async fn reimage(&self, caller: &Caller, id: &str, reserved_ok: bool) -> Result<(), AttachError> {
        let volume = self.volume(caller, id).await?;
        let mut allowed = vec![VolumeStatus::Available, VolumeStatus::Error];
        if reserved_ok {
            allowed.push(VolumeStatus::Reserved);
        }
        if !allowed.contains(&volume.status) {
            return Err(AttachError::InvalidVolume(format!(
                "Volume {id} status must be {}, but the current status is {}.",
                names(&allowed),
                volume.status
            )));
        }
        Err(AttachError::NotImplemented(format!(
            "Volume {id} cannot be re-imaged: re-imaging copies an image from an image service onto the \
             volume, and this service has none; nothing was changed."
        )))
    }

    /// `os-extend_volume_completion` (3.71): completes an extend that the compute service finished.
    /// Berth's extends finish with the driver's resize, attached or not (Nova is told afterwards,
    /// as Cinder does without 3.71's wait), so no extend ever waits on a compute service, and the
    /// answer is Cinder's for a volume that is not waiting on one.
    pub async fn extend_volume_completion(&self, caller: &Caller, id: &str) -> Result<(), AttachError> {
        let volume = self.volume(caller, id).await?;
        if volume.status == VolumeStatus::Extending {
            return Err(AttachError::InvalidVolume(format!(
                "Volume {id} is being extended by its driver, not waiting on a compute service."
            )));
        }
        Err(AttachError::InvalidVolume(format!(
            "Volume {id} status must be extending, but the current status is {} (this service's \
             extends never wait on a compute service).",
            volume.status
        )))
    }

    pub async fn count(&self, scope: Scope<'_>, filter: &VolumeFilter) -> Result<i64, AttachError> {
        Ok(self.store.read(async |tx| volumes::count(tx, scope, filter).await).await?)
    }

    /// `GET /volumes/summary`: how many volumes `scope` has, their size together, and each
    /// metadata key with the values it has among them.
    pub async fn summary(&self, scope: Scope<'_>) -> Result<Summary, AttachError> {
        let (count, size_gib, metadata) =
            self.store.read(async |tx| volumes::summary(tx, scope).await).await?;
        let mut values: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for (key, value) in metadata.into_iter().flatten() {
            values.entry(key).or_default().insert(value);
        }
        Ok(Summary { count, size_gib, metadata: values })
    }
}

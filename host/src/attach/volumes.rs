//! Volume flows: create and delete go through the driver (`create-volume`, `delete-volume`) as
//! operations of `ops.rs`; show, list and metadata read and write the store.

use std::collections::BTreeMap;

use super::list::{Page, Scope, VolumeFilter};
use super::model::{Attachment, OpKind, Volume};
use super::state::{Event, transition};
use super::{AttachError, Caller, Service, conclude, names, volume_not_found};
use crate::failpoint;
use crate::runtime::Call;
use crate::runtime::model::VolumeFields;
use crate::store::attachments as rows;
use crate::store::{now_micros, targets, volumes};

/// The largest volume, in GiB (64 TiB).
pub const MAX_SIZE_GIB: i64 = 65_536;

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

impl Service {
    /// Creates a volume through its backend's driver. When the driver fails, the volume is kept
    /// in `error` (it can be deleted) and the driver's error is returned.
    pub async fn create_volume(&self, caller: &Caller, req: NewVolume) -> Result<Volume, AttachError> {
        if !(1..=MAX_SIZE_GIB).contains(&req.size_gib) {
            return Err(AttachError::InvalidInput(format!(
                "Volume size '{}' must be an integer and greater than 0 (at most {MAX_SIZE_GIB} GiB)",
                req.size_gib
            )));
        }
        let vtype = self.catalog.volume_type(req.volume_type.as_deref()).ok_or_else(|| {
            AttachError::NotFound(format!(
                "Volume type with name {} could not be found.",
                req.volume_type.as_deref().unwrap_or(&self.catalog.default_type)
            ))
        })?;
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
            shared_targets: Some(backend.driver.info().capabilities.shared_targets),
            service_uuid: Some(backend.service_uuid.clone()),
            created_at: now,
            updated_at: now,
        };
        let _lock = self.locks.lock(&row.id).await;
        let op = self.operation(OpKind::CreateVolume, &row.id, None, None);
        self.store
            .write(async |tx| {
                volumes::insert(tx, &row).await?;
                op.begin(tx).await
            })
            .await?;
        failpoint::hit("volume.create.intent");
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
        failpoint::hit("volume.create.commit");
        let t = transition(if created.is_ok() { Event::VolumeCreated } else { Event::CreateFailed });
        let written = self
            .store
            .write(async |tx| {
                let locked = volumes::lock(tx, &row.id, t, Some((&row.fields, &fields))).await?;
                let written = match locked {
                    Some(locked) => Some(conclude(tx, &locked, t).await?),
                    None => None,
                };
                targets::record(tx, &row.backend, &row.id, &calls.effects).await?;
                op.finish(tx).await?;
                Ok::<_, AttachError>(written)
            })
            .await?;
        created?;
        written.ok_or_else(|| volume_not_found(&row.id))
    }

    /// Deletes a volume that has no attachments, through its driver. When the driver fails the
    /// volume is left in `error_deleting`, from which deleting again retries. `force` (an admin's)
    /// also accepts volumes stuck in `creating` or `deleting`.
    pub async fn delete_volume(&self, caller: &Caller, id: &str, force: bool) -> Result<(), AttachError> {
        self.volume(caller, id).await?;
        let _held = self.hold(id).await?;
        let volume = self.volume(caller, id).await?;
        let t = transition(if force { Event::ForceDeleteVolume } else { Event::DeleteVolume });
        let op = self.operation(OpKind::DeleteVolume, id, None, None);
        let locked = self
            .store
            .write(async |tx| {
                let locked = volumes::lock(tx, id, t, None).await?;
                let attached = !rows::statuses(tx, id).await?.is_empty();
                let Some(locked) = locked.filter(|_| !attached) else {
                    return Err(AttachError::InvalidVolume(format!(
                        "Volume status must be {} and must not be attached, but the volume {id} is {}.",
                        names(t.volume_from(false)),
                        volume.status
                    )));
                };
                let deleting = conclude(tx, &locked, t).await?;
                op.begin(tx).await?;
                Ok(deleting)
            })
            .await?;
        failpoint::hit("volume.delete.intent");
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
        failpoint::hit("volume.delete.commit");
        let t = transition(if deleted.is_ok() { Event::VolumeDeleted } else { Event::DeleteFailed });
        self.store
            .write(async |tx| {
                if let Some(locked) = volumes::lock(tx, &volume.id, t, None).await? {
                    conclude(tx, &locked, t).await?;
                }
                targets::record(tx, &volume.backend, &volume.id, &calls.effects).await?;
                op.finish(tx).await
            })
            .await?;
        Ok(deleted?)
    }

    /// A volume with its live attachments.
    pub async fn show_volume(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(Volume, Vec<Attachment>), AttachError> {
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
    pub async fn list_volumes(
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
    pub async fn update_metadata(
        &self,
        caller: &Caller,
        id: &str,
        changes: BTreeMap<String, String>,
        replace: bool,
        remove: Option<&str>,
    ) -> Result<BTreeMap<String, String>, AttachError> {
        if let Some(key) = changes.keys().find(|k| k.is_empty() || k.len() > 255) {
            return Err(AttachError::InvalidInput(format!(
                "metadata key {key:?} must be 1 to 255 characters"
            )));
        }
        if let Some(value) = changes.values().find(|v| v.len() > 255) {
            return Err(AttachError::InvalidInput(format!(
                "metadata value of {} bytes is longer than 255",
                value.len()
            )));
        }
        self.store
            .write(async |tx| {
                volumes::get(tx, id, caller.scope()).await?.ok_or_else(|| volume_not_found(id))?;
                let locked = volumes::lock(tx, id, transition(Event::UpdateMetadata), None)
                    .await?
                    .ok_or_else(|| volume_not_found(id))?;
                let mut metadata = locked.metadata.clone();
                if replace {
                    metadata.clear();
                }
                metadata.extend(changes);
                if let Some(key) = remove
                    && metadata.remove(key).is_none()
                {
                    return Err(AttachError::NotFound(format!("Metadata item was not found: {key}")));
                }
                if metadata.len() > 128 {
                    return Err(AttachError::InvalidInput(
                        "a volume may have at most 128 metadata items".into(),
                    ));
                }
                volumes::set_metadata(tx, id, &metadata).await?;
                Ok(metadata)
            })
            .await
    }

    pub async fn count_volumes(&self, scope: Scope<'_>, filter: &VolumeFilter) -> Result<i64, AttachError> {
        Ok(self.store.read(async |tx| volumes::count(tx, scope, filter).await).await?)
    }
}

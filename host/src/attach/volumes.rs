//! Volume flows: create and delete go through the driver (`create-volume`, `delete-volume`);
//! show, list and metadata read and write the store.

use std::collections::BTreeMap;

use super::state::{Event, VolumeAttachStatus, VolumeStatus, transition};
use super::{AttachError, Caller, Service, apply_update, contract_volume, volume_not_found};
use crate::runtime::Call;
use crate::store::attachments::{self as rows, AttachmentRow};
use crate::store::volumes::{self, VolumeFilter, VolumeRow};
use crate::store::{Page, Scope, now_micros};

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
    pub async fn create_volume(&self, caller: &Caller, req: NewVolume) -> Result<VolumeRow, AttachError> {
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
        let row = VolumeRow {
            id: uuid::Uuid::new_v4().to_string(),
            project_id: caller.project_id.clone(),
            user_id: caller.user_id.clone(),
            name: req.name,
            description: req.description,
            size_gib: req.size_gib,
            volume_type: vtype.name.clone(),
            backend: backend.name.clone(),
            multiattach: vtype.multiattach(),
            status: VolumeStatus::Creating.as_str().into(),
            attach_status: VolumeAttachStatus::Detached.as_str().into(),
            provider_location: None,
            provider_auth: None,
            provider_id: None,
            driver_data: "{}".into(),
            metadata: serde_json::to_string(&req.metadata).expect("a map of strings serialises"),
            shared_targets: Some(backend.driver.info().capabilities.shared_targets),
            service_uuid: Some(backend.service_uuid.clone()),
            created_at: now,
            updated_at: now,
        };
        self.store().write(async |tx| volumes::insert(tx, &row).await).await?;

        let driver = &backend.driver;
        let mut fields = row.driver_fields();
        let created = match driver.create_volume(&contract_volume(&row)).await {
            Ok(update) => apply_update(driver, Call::CreateVolume, &mut fields, &update),
            Err(e) => Err(e),
        };
        let status = if created.is_ok() { VolumeStatus::Available } else { VolumeStatus::Error };
        let created_row = self
            .store()
            .write(async |tx| {
                volumes::lock(tx, &row.id, &[VolumeStatus::Creating.as_str()], Some(&fields)).await?;
                volumes::set_status(tx, &row.id, status.as_str(), VolumeAttachStatus::Detached.as_str())
                    .await?;
                volumes::get(tx, &row.id, Scope::All).await?.ok_or_else(|| volume_not_found(&row.id))
            })
            .await?;
        created?;
        Ok(created_row)
    }

    /// Deletes a volume that has no attachments, through its driver. When the driver fails the
    /// volume is left in `error_deleting`, from which deleting again retries. `force` (an admin's)
    /// also accepts volumes stuck in `creating` or `deleting`.
    pub async fn delete_volume(&self, caller: &Caller, id: &str, force: bool) -> Result<(), AttachError> {
        let volume = self.volume(caller, id).await?;
        let _guard = self.locks.lock(id).await;
        let t = transition(Event::DeleteVolume);
        let mut from = t.volume_from_text(volume.multiattach);
        if force {
            from.extend([VolumeStatus::Creating.as_str(), VolumeStatus::Deleting.as_str()]);
        }
        let locked = self
            .store()
            .write(async |tx| {
                let locked = volumes::lock(tx, id, &from, None).await?;
                let attached = !rows::statuses(tx, id).await?.is_empty();
                let Some(locked) = locked.filter(|_| !attached) else {
                    return Err(AttachError::InvalidVolume(format!(
                        "Volume status must be {} and must not be attached, but the volume {id} is {}.",
                        t.volume_from(false).iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" or "),
                        volume.status
                    )));
                };
                let detached = VolumeAttachStatus::Detached.as_str();
                volumes::set_status(tx, id, VolumeStatus::Deleting.as_str(), detached).await?;
                Ok(locked)
            })
            .await?;

        let deleted = self.driver(&locked)?.delete_volume(&contract_volume(&locked)).await;
        self.store()
            .write(async |tx| match &deleted {
                Ok(()) => volumes::soft_delete(tx, id).await.map(|_| ()),
                Err(_) => {
                    let error = VolumeStatus::ErrorDeleting.as_str();
                    volumes::set_status(tx, id, error, VolumeAttachStatus::Detached.as_str()).await
                }
            })
            .await?;
        Ok(deleted?)
    }

    /// A volume with its live attachments.
    pub async fn show_volume(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(VolumeRow, Vec<AttachmentRow>), AttachError> {
        self.store()
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
    ) -> Result<Vec<(VolumeRow, Vec<AttachmentRow>)>, AttachError> {
        self.store()
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
                        let mine: Vec<AttachmentRow> =
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
        self.store()
            .write(async |tx| {
                volumes::get(tx, id, caller.scope()).await?.ok_or_else(|| volume_not_found(id))?;
                let locked = volumes::lock(tx, id, &[], None).await?.ok_or_else(|| volume_not_found(id))?;
                let mut metadata: BTreeMap<String, String> =
                    serde_json::from_str(&locked.metadata).unwrap_or_default();
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
                let text = serde_json::to_string(&metadata).expect("a map of strings serialises");
                volumes::set_metadata(tx, id, &text).await?;
                Ok(metadata)
            })
            .await
    }

    pub async fn count_volumes(&self, scope: Scope<'_>, filter: &VolumeFilter) -> Result<i64, AttachError> {
        Ok(self.store().read(async |tx| volumes::count(tx, scope, filter).await).await?)
    }
}

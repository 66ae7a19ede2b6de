//! The service's changing entry points: every flow that changes a volume or an attachment, each
//! run as an operation the service owns (`ops.rs`: it outlives the client that asked, and runs
//! again when another node began an operation at the same moment). This is the only way in from
//! outside the attach room: the flows themselves are visible to this room alone, so no caller can
//! forget the ownership. Reads (`show_*`, `list_*`) are called on the service directly.
//!
//! Arguments are owned values: an operation may run on after its caller is gone.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value as Json;

use super::attachments::NewAttachment;
use super::legacy::LegacyAttach;
use super::model::{Attachment, Connector, Volume};
use super::volumes::{NewVolume, VolumeChange};
use super::{AttachError, Caller, Service};

/// The changing entry points of one service (see the module notes).
#[derive(Clone)]
pub struct Commands(Arc<Service>);

impl Service {
    pub fn commands(self: &Arc<Self>) -> Commands {
        Commands(self.clone())
    }
}

impl Commands {
    /// `POST /volumes`.
    pub async fn create_volume(&self, caller: Caller, req: NewVolume) -> Result<Volume, AttachError> {
        self.0
            .owned(caller.clone(), (caller, req), |s, (c, r)| async move { s.volumes().create(&c, r).await })
            .await
    }

    /// `DELETE /volumes/{id}` (`force`: admins, also a volume stuck in `creating` or `deleting`).
    pub async fn delete_volume(&self, caller: Caller, id: String, force: bool) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, id), move |s, (c, id)| async move {
                s.volumes().delete(&c, &id, force).await
            })
            .await
    }

    /// `os-unmanage` (an admin's).
    pub async fn unmanage_volume(&self, caller: Caller, id: String) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, id), move |s, (c, id)| async move {
                s.volumes().unmanage(&c, &id).await
            })
            .await
    }

    /// `os-retype`.
    pub async fn retype_volume(
        &self,
        caller: Caller,
        id: String,
        new_type: String,
    ) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, id, new_type), move |s, (c, id, new_type)| async move {
                s.volumes().retype(&c, &id, &new_type).await
            })
            .await
    }

    /// `os-extend`; `attached`: an `in-use` volume may be extended too (3.42).
    pub async fn extend_volume(
        &self,
        caller: Caller,
        id: String,
        new_size_gib: i64,
        attached: bool,
    ) -> Result<Volume, AttachError> {
        self.0
            .owned(caller.clone(), (caller, id), move |s, (c, id)| async move {
                s.volumes().extend(&c, &id, new_size_gib, attached).await
            })
            .await
    }

    /// The metadata calls: merge or replace `changes`, or remove one key.
    pub async fn update_metadata(
        &self,
        caller: Caller,
        id: String,
        changes: BTreeMap<String, String>,
        replace: bool,
        remove: Option<String>,
    ) -> Result<BTreeMap<String, String>, AttachError> {
        self.0
            .owned(
                caller.clone(),
                (caller, id, changes, remove),
                move |s, (c, id, changes, remove)| async move {
                    s.volumes().update_metadata(&c, &id, changes, replace, remove.as_deref()).await
                },
            )
            .await
    }

    /// The image properties' calls (`os-set_image_metadata`, `os-unset_image_metadata`): merge
    /// `changes`, or remove one key.
    pub async fn update_image_metadata(
        &self,
        caller: Caller,
        id: String,
        changes: BTreeMap<String, String>,
        remove: Option<String>,
    ) -> Result<BTreeMap<String, String>, AttachError> {
        self.0
            .owned(
                caller.clone(),
                (caller, id, changes, remove),
                move |s, (c, id, changes, remove)| async move {
                    s.volumes().update_image_metadata(&c, &id, changes, remove.as_deref()).await
                },
            )
            .await
    }

    /// `PUT /volumes/{id}`: its name, description or metadata.
    pub async fn update_volume(
        &self,
        caller: Caller,
        id: String,
        change: VolumeChange,
    ) -> Result<Volume, AttachError> {
        self.0
            .owned(caller.clone(), (caller, id, change), |s, (c, id, change)| async move {
                s.volumes().update(&c, &id, change).await
            })
            .await
    }

    /// `POST /attachments`.
    pub async fn create_attachment(
        &self,
        caller: Caller,
        req: NewAttachment,
    ) -> Result<Attachment, AttachError> {
        self.0
            .owned(
                caller.clone(),
                (caller, req),
                |s, (c, r)| async move { s.attachments().create(&c, r).await },
            )
            .await
    }

    /// `PUT /attachments/{id}` with a connector.
    pub async fn update_attachment(
        &self,
        caller: Caller,
        id: String,
        connector: Connector,
    ) -> Result<Attachment, AttachError> {
        self.0
            .owned(caller.clone(), (caller, id, connector), |s, (c, id, conn)| async move {
                s.attachments().update(&c, &id, conn).await
            })
            .await
    }

    /// `os-complete`.
    pub async fn complete_attachment(&self, caller: Caller, id: String) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, id), |s, (c, id)| async move {
                s.attachments().complete(&c, &id).await
            })
            .await
    }

    /// `DELETE /attachments/{id}`: the attachments left on the volume.
    pub async fn delete_attachment(
        &self,
        caller: Caller,
        id: String,
    ) -> Result<Vec<Attachment>, AttachError> {
        self.0
            .owned(
                caller.clone(),
                (caller, id),
                |s, (c, id)| async move { s.attachments().delete(&c, &id).await },
            )
            .await
    }

    /// `os-reserve`.
    pub async fn legacy_reserve(&self, caller: Caller, volume: String) -> Result<(), AttachError> {
        self.0
            .owned(
                caller.clone(),
                (caller, volume),
                |s, (c, v)| async move { s.legacy().reserve(&c, &v).await },
            )
            .await
    }

    /// `os-unreserve`.
    pub async fn legacy_unreserve(&self, caller: Caller, volume: String) -> Result<(), AttachError> {
        self.0
            .owned(
                caller.clone(),
                (caller, volume),
                |s, (c, v)| async move { s.legacy().unreserve(&c, &v).await },
            )
            .await
    }

    /// `os-begin_detaching`.
    pub async fn legacy_begin_detaching(&self, caller: Caller, volume: String) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, volume), |s, (c, v)| async move {
                s.legacy().begin_detaching(&c, &v).await
            })
            .await
    }

    /// `os-roll_detaching`.
    pub async fn legacy_roll_detaching(&self, caller: Caller, volume: String) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, volume), |s, (c, v)| async move {
                s.legacy().roll_detaching(&c, &v).await
            })
            .await
    }

    /// `os-initialize_connection`: Cinder's flattened connection info.
    pub async fn legacy_initialize(
        &self,
        caller: Caller,
        volume: String,
        connector: Connector,
    ) -> Result<Json, AttachError> {
        self.0
            .owned(caller.clone(), (caller, volume, connector), |s, (c, v, conn)| async move {
                s.legacy().initialize(&c, &v, conn).await
            })
            .await
    }

    /// `os-attach`.
    pub async fn legacy_attach(
        &self,
        caller: Caller,
        volume: String,
        req: LegacyAttach,
    ) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, volume, req), |s, (c, v, r)| async move {
                s.legacy().attach(&c, &v, r).await
            })
            .await
    }

    /// `os-terminate_connection`.
    pub async fn legacy_terminate(
        &self,
        caller: Caller,
        volume: String,
        connector: Option<Connector>,
    ) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, volume, connector), |s, (c, v, conn)| async move {
                s.legacy().terminate(&c, &v, conn).await
            })
            .await
    }

    /// `os-detach`.
    pub async fn legacy_detach(
        &self,
        caller: Caller,
        volume: String,
        attachment: Option<String>,
    ) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, volume, attachment), |s, (c, v, a)| async move {
                s.legacy().detach(&c, &v, a.as_deref()).await
            })
            .await
    }

    /// `os-force_detach` (admins).
    pub async fn force_detach(
        &self,
        caller: Caller,
        volume: String,
        connector: Option<Connector>,
        attachment: Option<String>,
    ) -> Result<(), AttachError> {
        self.0
            .owned(caller.clone(), (caller, volume, connector, attachment), |s, (c, v, conn, a)| async move {
                s.legacy().force_detach(&c, &v, conn, a.as_deref()).await
            })
            .await
    }
}

//! A project's own default volume type (Cinder's default types, 3.62: `cinder default-type-set`,
//! `default-type-list`, `default-type-unset`; admins): a volume made in the project without a
//! type gets it, and `GET /types/default` shows it to the project, instead of the configured
//! default. Types are the configuration's; a project's default names one by id
//! (`store/default_types.rs`). A default whose type has left the configuration is refused at the
//! next create that would use it, naming it, rather than silently replaced.

use super::catalog::VolumeType;
use super::{AttachError, Service};
use crate::store::default_types;

impl Service {
    /// The type a volume of `project` gets when it names `named` (none: the project's default,
    /// else the configured default).
    pub async fn volume_type_for(
        &self,
        project: &str,
        named: Option<&str>,
    ) -> Result<VolumeType, AttachError> {
        if let Some(name) = named {
            return self.catalog.volume_type(Some(name)).cloned().ok_or_else(|| {
                AttachError::NotFound(format!("Volume type with name {name} could not be found."))
            });
        }
        let own = self.store.read(async |tx| default_types::get(tx, project).await).await?;
        match own {
            Some(id) => self.catalog.volume_type(Some(&id)).cloned().ok_or_else(|| {
                AttachError::NotFound(format!(
                    "Volume type {id}, the default type of project {project} (default-type-set), could not be \
                     found: it is no longer in the configuration; set another, or name a type"
                ))
            }),
            None => self.catalog.volume_type(None).cloned().ok_or_else(|| {
                let name = &self.catalog.default_type;
                AttachError::NotFound(format!("Volume type with name {name} could not be found."))
            }),
        }
    }

    /// Sets `project`'s default type to `name_or_id`; answers the type's id.
    pub async fn set_default_type(&self, project: &str, name_or_id: &str) -> Result<String, AttachError> {
        let Some(t) = self.catalog.volume_type(Some(name_or_id)) else {
            return Err(AttachError::InvalidInput(format!(
                "Volume type with name {name_or_id} could not be found."
            )));
        };
        let id = t.id.clone();
        self.store.write(async |tx| default_types::set(tx, project, &id).await).await?;
        tracing::info!(project, volume_type = %t.name, "project default type set");
        Ok(id)
    }

    /// `project`'s default type's id, if it has one.
    pub async fn default_type_of(&self, project: &str) -> Result<Option<String>, AttachError> {
        Ok(self.store.read(async |tx| default_types::get(tx, project).await).await?)
    }

    /// Every project's default type: (project, type id).
    pub async fn default_types(&self) -> Result<Vec<(String, String)>, AttachError> {
        Ok(self.store.read(async |tx| default_types::list(tx).await).await?)
    }

    /// Unsets `project`'s default type (none set: nothing to do).
    pub async fn unset_default_type(&self, project: &str) -> Result<(), AttachError> {
        if self.store.write(async |tx| default_types::unset(tx, project).await).await? {
            tracing::info!(project, "project default type unset");
        }
        Ok(())
    }
}

//! The attach room: the state machine (`state.rs`, pure) and the only orchestration of it
//! (`attachments.rs`, `volumes.rs`): conditional update, driver call, persist, final state. Both
//! the attachments API and the legacy volume actions go through here. Nothing here knows HTTP.

pub mod attachments;
pub mod catalog;
pub mod error;
pub mod legacy;
pub mod locks;
pub mod reconcile;
pub mod state;
pub mod volumes;

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

use crate::runtime::contract::{AccessMode, Attachment, Connector, ModelUpdate, Volume, VolumeField};
use crate::runtime::json::connector_from_json;
use crate::runtime::{CallError, CallErrorKind, Driver};
use crate::store::attachments::AttachmentRow;
use crate::store::volumes::{DriverFields, VolumeRow};
use crate::store::{Scope, Store};
pub use catalog::{Backend, Catalog, VolumeType};
pub use error::AttachError;
use locks::VolumeLocks;
use state::{AttachStatus, VolumeStatus};

/// Who is asking, as the API authenticated them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user_id: String,
    pub project_id: String,
    pub roles: Vec<String>,
    /// Service callers (e.g. an orchestrator with a service token) may delete attachments that an
    /// instance still uses.
    pub is_service: bool,
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| r == "admin")
    }

    /// Rows this caller may see: its project's (admins too; they list others' with `all_tenants`).
    pub fn scope(&self) -> Scope<'_> {
        Scope::Project(&self.project_id)
    }
}

/// The attach service.
pub struct Service {
    store: Store,
    catalog: Catalog,
    locks: VolumeLocks,
}

/// The largest value a driver may store in a volume field or a driver-data entry.
const MAX_FIELD: usize = 4096;
/// The most driver-data entries a volume may carry.
const MAX_DATA_KEYS: usize = 256;

impl Service {
    pub fn new(store: Store, catalog: Catalog) -> Self {
        Service { store, catalog, locks: VolumeLocks::default() }
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn backend(&self, volume: &VolumeRow) -> Result<&Backend, AttachError> {
        self.catalog
            .backend(&volume.backend)
            .ok_or_else(|| AttachError::BackendUnavailable(volume.backend.clone()))
    }

    fn driver(&self, volume: &VolumeRow) -> Result<&Driver, AttachError> {
        Ok(&self.backend(volume)?.driver)
    }

    async fn volume(&self, caller: &Caller, id: &str) -> Result<VolumeRow, AttachError> {
        self.store
            .read(async |tx| {
                crate::store::volumes::get(tx, id, caller.scope()).await?.ok_or_else(|| volume_not_found(id))
            })
            .await
    }
}

pub(crate) fn volume_not_found(id: &str) -> AttachError {
    AttachError::NotFound(format!("Volume {id} could not be found."))
}

pub(crate) fn attachment_not_found(id: &str) -> AttachError {
    AttachError::NotFound(format!("Volume attachment could not be found with filter: attachment_id = {id}."))
}

/// A stored status that the state machine does not know means the database was edited by hand.
pub(crate) fn volume_status(row: &VolumeRow) -> Result<VolumeStatus, AttachError> {
    VolumeStatus::parse(&row.status).ok_or_else(|| {
        AttachError::Store(crate::store::StoreError::Corrupt(format!(
            "volume {} has status {:?}",
            row.id, row.status
        )))
    })
}

pub(crate) fn attach_status(row: &AttachmentRow) -> Result<AttachStatus, AttachError> {
    AttachStatus::parse(&row.attach_status).ok_or_else(|| {
        AttachError::Store(crate::store::StoreError::Corrupt(format!(
            "attachment {} has status {:?}",
            row.id, row.attach_status
        )))
    })
}

fn string_map(json: &str) -> Vec<(String, String)> {
    serde_json::from_str::<BTreeMap<String, String>>(json).unwrap_or_default().into_iter().collect()
}

/// The volume record a driver receives.
pub(crate) fn contract_volume(row: &VolumeRow) -> Volume {
    Volume {
        id: row.id.clone(),
        name: format!("volume-{}", row.id),
        size_gib: row.size_gib as u64,
        multiattach: row.multiattach,
        provider_location: row.provider_location.clone(),
        provider_auth: row.provider_auth.clone(),
        provider_id: row.provider_id.clone(),
        driver_data: string_map(&row.driver_data),
        metadata: string_map(&row.metadata),
    }
}

/// The effective access mode of an attachment (Cinder's `attachment_update`: the stored mode
/// wins unless it is the literal `null`, then the connector's `mode`, then `rw`).
pub(crate) fn access_mode(attach_mode: Option<&str>, connector: Option<&Map<String, Json>>) -> AccessMode {
    let chosen = match attach_mode {
        Some("rw") | Some("ro") => attach_mode,
        _ => connector.and_then(|c| c.get("mode")).and_then(Json::as_str),
    };
    if chosen == Some("ro") { AccessMode::Ro } else { AccessMode::Rw }
}

/// An attachment as a driver sees it.
pub(crate) fn contract_attachment(row: &AttachmentRow, connector: Option<&Map<String, Json>>) -> Attachment {
    let mode = access_mode(row.attach_mode.as_deref(), connector);
    Attachment {
        id: row.id.clone(),
        connector: connector.and_then(|c| connector_from_json(c, mode).ok()),
        instance: row.instance_uuid.clone(),
        mode,
    }
}

/// Applies a driver's model update to the stored fields, refusing oversized or malformed ones.
pub(crate) fn apply_update(
    driver: &Driver,
    call: crate::runtime::Call,
    fields: &mut DriverFields,
    update: &ModelUpdate,
) -> Result<(), CallError> {
    let invalid = |message: String| CallError {
        driver: driver.backend().to_string(),
        version: driver.info().version.clone(),
        call,
        kind: CallErrorKind::InvalidOutput(message),
    };
    for (name, value) in [
        ("provider-location", &update.provider_location),
        ("provider-auth", &update.provider_auth),
        ("provider-id", &update.provider_id),
    ] {
        if value.as_ref().is_some_and(|v| v.len() > MAX_FIELD) {
            return Err(invalid(format!("{name} is longer than {MAX_FIELD} bytes")));
        }
    }
    if let Some(v) = &update.provider_location {
        fields.provider_location = Some(v.clone());
    }
    if let Some(v) = &update.provider_auth {
        fields.provider_auth = Some(v.clone());
    }
    if let Some(v) = &update.provider_id {
        fields.provider_id = Some(v.clone());
    }
    for field in &update.clear {
        match field {
            VolumeField::ProviderLocation => fields.provider_location = None,
            VolumeField::ProviderAuth => fields.provider_auth = None,
            VolumeField::ProviderId => fields.provider_id = None,
        }
    }
    if !update.set_data.is_empty() || !update.remove_data.is_empty() {
        let mut data: BTreeMap<String, String> =
            serde_json::from_str(&fields.driver_data).unwrap_or_default();
        for (k, v) in &update.set_data {
            if k.is_empty() || k.len() > 256 || v.len() > MAX_FIELD {
                return Err(invalid(format!("driver data entry {k:?} is too large")));
            }
            data.insert(k.clone(), v.clone());
        }
        for k in &update.remove_data {
            data.remove(k);
        }
        if data.len() > MAX_DATA_KEYS {
            return Err(invalid(format!("more than {MAX_DATA_KEYS} driver data entries")));
        }
        fields.driver_data = serde_json::to_string(&data).expect("a map of strings serialises");
    }
    Ok(())
}

/// A volume record with driver fields replaced.
pub(crate) fn with_fields(row: &VolumeRow, fields: &DriverFields) -> VolumeRow {
    VolumeRow {
        provider_location: fields.provider_location.clone(),
        provider_auth: fields.provider_auth.clone(),
        provider_id: fields.provider_id.clone(),
        driver_data: fields.driver_data.clone(),
        ..row.clone()
    }
}

/// Parses a client's connector for a driver call.
pub(crate) fn connector(json: &Map<String, Json>, mode: AccessMode) -> Result<Connector, AttachError> {
    connector_from_json(json, mode).map_err(AttachError::InvalidInput)
}

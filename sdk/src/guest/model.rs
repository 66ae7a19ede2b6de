//! Building model updates: what the host stores on the volume after a successful call.

use super::{ModelUpdate, Volume, VolumeField};

impl ModelUpdate {
    /// No change.
    pub fn none() -> Self {
        ModelUpdate {
            provider_location: None,
            provider_auth: None,
            provider_id: None,
            clear: Vec::new(),
            set_data: Vec::new(),
            remove_data: Vec::new(),
        }
    }

    /// Sets `provider-location`.
    pub fn location(mut self, location: impl Into<String>) -> Self {
        self.provider_location = Some(location.into());
        self
    }

    /// Sets `provider-auth` (a secret: the host never logs it).
    pub fn auth(mut self, auth: impl Into<String>) -> Self {
        self.provider_auth = Some(auth.into());
        self
    }

    /// Sets `provider-id`.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.provider_id = Some(id.into());
        self
    }

    /// Clears a stored field.
    pub fn clear(mut self, field: VolumeField) -> Self {
        self.clear.push(field);
        self
    }

    /// Sets a driver-private key/value.
    pub fn data(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.set_data.push((key.into(), value.into()));
        self
    }

    /// Removes a driver-private key.
    pub fn remove(mut self, key: impl Into<String>) -> Self {
        self.remove_data.push(key.into());
        self
    }
}

impl Volume {
    /// A driver-private value stored earlier with [`ModelUpdate::data`].
    pub fn data(&self, key: &str) -> Option<&str> {
        self.driver_data.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// A user metadata value.
    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size_gib << 30
    }
}

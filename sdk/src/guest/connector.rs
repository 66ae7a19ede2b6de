//! Helpers for connectors.

use super::{AccessMode, Connector, DriverError, DriverResult, Value};
use crate::names::check_iscsi_name;

impl Connector {
    /// The initiator IQN, checked against RFC 3720's grammar; `invalid-connector` when it is
    /// absent or malformed.
    pub fn iscsi_initiator(&self) -> DriverResult<&str> {
        let initiator = self.initiator.as_deref().ok_or_else(|| DriverError::missing("initiator"))?;
        check_iscsi_name(initiator).map_err(|e| DriverError::invalid_connector(format!("initiator: {e}")))?;
        Ok(initiator)
    }

    /// A key of the connector outside the typed fields.
    pub fn extra(&self, key: &str) -> Option<&Value> {
        self.extra.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether the attachment is read-only.
    pub fn read_only(&self) -> bool {
        self.mode == AccessMode::Ro
    }
}

/// Whether two connectors come from the same iSCSI initiator (Cinder's `are_same_connector` for
/// iSCSI targets): both have an initiator and the names are equal.
pub fn same_initiator(a: &Connector, b: &Connector) -> bool {
    matches!((&a.initiator, &b.initiator), (Some(x), Some(y)) if x == y)
}

impl AccessMode {
    /// `rw` or `ro`, as os-brick spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            AccessMode::Rw => "rw",
            AccessMode::Ro => "ro",
        }
    }
}

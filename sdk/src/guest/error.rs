//! Constructors for the contract's error cases.

use super::{DriverError, InvalidConnector};

impl DriverError {
    /// The call (or an option of it) is not implemented by this driver.
    pub fn unsupported(what: &str) -> Self {
        DriverError::Unsupported(format!("{what} is not supported by this driver"))
    }

    /// The connector lacks `key`.
    pub fn missing(key: &str) -> Self {
        DriverError::InvalidConnector(InvalidConnector {
            missing: vec![key.to_string()],
            reason: format!("Connector doesn't have required information: {key}"),
        })
    }

    /// The connector has a malformed value.
    pub fn invalid_connector(reason: impl Into<String>) -> Self {
        DriverError::InvalidConnector(InvalidConnector { missing: Vec::new(), reason: reason.into() })
    }
}

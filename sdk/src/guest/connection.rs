//! Building connection information with JSON-typed values.

use super::{Connection, ConnectionInfo, ModelUpdate, Value};

/// Builds a [`ConnectionInfo`]: `ConnectionInfoBuilder::new("iscsi").text("target_iqn", iqn)...`.
#[derive(Debug, Clone)]
pub struct ConnectionInfoBuilder {
    info: ConnectionInfo,
}

impl ConnectionInfoBuilder {
    /// Starts connection information of an os-brick connector type (`iscsi`, `nvmeof`, ...).
    pub fn new(driver_volume_type: &str) -> Self {
        ConnectionInfoBuilder {
            info: ConnectionInfo { driver_volume_type: driver_volume_type.to_string(), data: Vec::new() },
        }
    }

    /// Sets `key` to any value, replacing an earlier one.
    pub fn value(mut self, key: &str, value: Value) -> Self {
        self.info.data.retain(|(k, _)| k != key);
        self.info.data.push((key.to_string(), value));
        self
    }

    pub fn text(self, key: &str, value: impl Into<String>) -> Self {
        self.value(key, Value::Text(value.into()))
    }

    pub fn integer(self, key: &str, value: i64) -> Self {
        self.value(key, Value::Integer(value))
    }

    pub fn boolean(self, key: &str, value: bool) -> Self {
        self.value(key, Value::Boolean(value))
    }

    pub fn null(self, key: &str) -> Self {
        self.value(key, Value::Null)
    }

    pub fn text_list(self, key: &str, values: Vec<String>) -> Self {
        self.value(key, Value::TextList(values))
    }

    pub fn integer_list(self, key: &str, values: Vec<i64>) -> Self {
        self.value(key, Value::IntegerList(values))
    }

    /// The connection information.
    pub fn build(self) -> ConnectionInfo {
        self.info
    }

    /// A [`Connection`] with this information and no model update.
    pub fn connection(self) -> Connection {
        Connection { info: self.info, update: ModelUpdate::none() }
    }
}

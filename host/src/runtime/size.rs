//! How big a driver's result is, counted the way it occupies host memory once lifted: the host
//! refuses results above the driver's output limit. (Lifting itself is bounded while it happens by
//! wasmtime's hostcall fuel, `Limits::copy_bytes`.)

use super::call::Response;
use super::contract::{Connection, ConnectionInfo, DriverInfo, ModelUpdate, Protocol, Termination, Value};

pub(crate) trait WireSize {
    fn wire_size(&self) -> usize;
}

/// Per-item overhead of a string or list in host memory.
const ITEM: usize = 24;

impl WireSize for String {
    fn wire_size(&self) -> usize {
        ITEM + self.len()
    }
}

impl<T: WireSize> WireSize for Vec<T> {
    fn wire_size(&self) -> usize {
        ITEM + self.iter().map(WireSize::wire_size).sum::<usize>()
    }
}

impl<T: WireSize> WireSize for Option<T> {
    fn wire_size(&self) -> usize {
        8 + self.as_ref().map_or(0, WireSize::wire_size)
    }
}

impl<A: WireSize, B: WireSize> WireSize for (A, B) {
    fn wire_size(&self) -> usize {
        self.0.wire_size() + self.1.wire_size()
    }
}

impl WireSize for i64 {
    fn wire_size(&self) -> usize {
        8
    }
}

impl WireSize for Value {
    fn wire_size(&self) -> usize {
        16 + match self {
            Value::Null | Value::Boolean(_) | Value::Integer(_) | Value::Number(_) => 0,
            Value::Text(s) | Value::Json(s) => s.wire_size(),
            Value::TextList(l) => l.wire_size(),
            Value::IntegerList(l) => l.wire_size(),
        }
    }
}

impl WireSize for ConnectionInfo {
    fn wire_size(&self) -> usize {
        self.driver_volume_type.wire_size() + self.data.wire_size()
    }
}

impl WireSize for ModelUpdate {
    fn wire_size(&self) -> usize {
        self.provider_location.wire_size()
            + self.provider_auth.wire_size()
            + self.provider_id.wire_size()
            + ITEM
            + self.clear.len()
            + self.set_data.wire_size()
            + self.remove_data.wire_size()
    }
}

impl WireSize for Protocol {
    fn wire_size(&self) -> usize {
        match self {
            Protocol::Other(s) => 8 + s.wire_size(),
            _ => 8,
        }
    }
}

impl WireSize for DriverInfo {
    fn wire_size(&self) -> usize {
        self.name.wire_size()
            + self.version.wire_size()
            + self.vendor.wire_size()
            + self.description.wire_size()
            + self.protocols.wire_size()
            + 2
    }
}

impl WireSize for Response {
    fn wire_size(&self) -> usize {
        match self {
            Response::Info(i) => i.wire_size(),
            Response::Guarantees(g) => ITEM + g.len(),
            Response::Unit => 0,
            Response::ModelUpdate(m) => m.wire_size(),
            Response::Connection(Connection { info, update }) => info.wire_size() + update.wire_size(),
            Response::Termination(Termination { update, .. }) => 1 + update.wire_size(),
            Response::Ids(ids) => ids.wire_size(),
        }
    }
}

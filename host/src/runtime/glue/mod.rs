//! The WIT host functions, one file per capability: each turns a guest's call into a call on the
//! capability's service (`capabilities/`, which knows nothing of wasmtime), checked against the
//! grant, recorded (and, in tests, faulted) by the call's scope, and answered with the typed error
//! the guest sees. Older contracts' imports are adapted to these in `runtime/since_*.rs`.

pub(crate) mod backing;
pub(crate) mod cephx;
pub(crate) mod iscsi;
pub(crate) mod iscsi_chap;
mod log;
pub(crate) mod network;
mod settings;

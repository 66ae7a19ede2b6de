//! `berth` as an attach client, for machines outside any cloud: `get-connector`,
//! `local-attach` and `local-detach` against a Berth (or Cinder) endpoint.
//!
//! - `api.rs`: the endpoint, its credentials, and the few calls the client makes;
//! - `connector.rs`: this machine's connector, as os-brick builds it;
//! - `iscsi.rs`: open-iscsi through `iscsiadm`;
//! - `rbd.rs`: RBD images mapped with rbd-nbd or the kernel's RBD driver;
//! - `local.rs`: the attach and detach flows, with undo;
//! - `error.rs`: what can go wrong, and the exit code of each;
//! - `bench.rs`: `berth bench attach`, the attach cycle against any Cinder-compatible endpoint.

pub mod api;
pub mod bench;
pub mod connector;
pub mod error;
pub mod iscsi;
pub mod local;
pub mod rbd;

pub use error::ClientError;

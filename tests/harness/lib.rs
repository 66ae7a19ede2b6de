//! Shared helpers for Berth's integration tests and benchmarks.

pub mod bench;
pub mod ceph;
pub mod cluster;
pub mod drivers;
pub mod history;
pub mod https;
pub mod initiator;
pub mod invariants;
pub mod iscsi;
pub mod keystone;
pub mod pg;
pub mod process;
pub mod python;
pub mod server;
pub mod stats;
pub mod tgt;

//! Shared helpers for Berth's integration tests and benchmarks.

pub mod drivers;
pub mod pg;
pub mod server;
pub mod stats;

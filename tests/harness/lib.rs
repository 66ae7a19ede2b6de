//! Shared helpers for Berth's integration tests and benchmarks.

pub mod drivers;

//! Berth: a WebAssembly-pluggable storage driver host with a Cinder-compatible attachment API.

pub mod capabilities;
pub mod runtime;
pub mod shipped;

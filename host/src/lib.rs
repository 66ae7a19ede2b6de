//! Berth: a WebAssembly-pluggable storage driver host with a Cinder-compatible attachment API.
//!
//! Rooms: `api` (HTTP), `attach` (state machine and orchestration), `store` (SQL), `runtime`
//! (wasmtime), `capabilities` (what drivers may do to the outside world), `client` (`berth` as an
//! attach client), `keystone` (Identity v3, for the API and the client), `failpoint` (crash
//! points for tests, compiled in only for them).

pub mod api;
pub mod attach;
pub mod capabilities;
pub mod client;
pub mod config;
pub mod conformance;
pub mod domain;
pub mod failpoint;
pub mod keystone;
pub mod metrics;
pub mod runtime;
pub mod serve;
pub mod shipped;
pub mod store;
pub mod upgrade;

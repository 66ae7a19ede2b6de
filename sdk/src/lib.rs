//! The Berth driver SDK: write a storage driver in Rust as one trait and one macro.
//!
//! ```ignore
//! use berth_driver_sdk::prelude::*;
//!
//! struct MyDriver;
//!
//! impl Driver for MyDriver {
//!     fn info() -> DriverInfo { /* ... */ }
//!     fn initialize_connection(volume: &Volume, connector: &Connector) -> DriverResult<Connection> {
//!         /* ... */
//!     }
//! }
//!
//! export_driver!(MyDriver);
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2`; the `.wasm` in
//! `target/wasm32-wasip2/release/` is a component that `berth serve` and `berth conformance` load.
//! See this crate's README for a complete driver.
//!
//! The generated bindings are private (`__bindings`); this crate re-exports the contract's types
//! (`berth:driver@0.1.0`) under their own names, and the host capabilities as the modules
//! [`log`], [`config`], [`backing_store`] and [`iscsi`].

// Lets the generated `export!` macro name this crate by path from the driver's crate.
extern crate self as berth_driver_sdk;

pub mod names;

#[cfg(feature = "guest")]
mod guest;
#[cfg(feature = "guest")]
pub use guest::*;

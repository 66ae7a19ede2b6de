#![doc = include_str!("../README.md")]

// Lets the generated `export!` macro name this crate by path from the driver's crate.
extern crate self as berth_driver_sdk;

pub mod names;

#[cfg(feature = "guest")]
mod guest;
#[cfg(feature = "guest")]
pub use guest::*;

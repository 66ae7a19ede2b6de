//! Builds the driver crates in `drivers/` into wasm32-wasip2 components (profile `driver`), so
//! that the `berth` binary embeds the shipped drivers and tests find the fixtures.
//!
//! The components land in `<target>/drivers/<name>.wasm`; `BERTH_DRIVER_DIR` points there at
//! compile time. It also builds `tgtd-preload` for this machine (the library Berth loads into the
//! tgtd it starts, `capabilities/iscsi/tgt/preload.rs`); `BERTH_TGTD_PRELOAD` names it. Each
//! nested cargo uses its own target directory, so it never waits on the outer build's lock.

// The build script builds the shipped drivers with cargo (host/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (file name, package) of every driver crate that does not use the network.
const DRIVERS: &[(&str, &str)] = &[
    ("fake", "berth-driver-fake"),
    ("misbehaving", "berth-driver-misbehaving"),
    ("sneaky", "berth-driver-sneaky"),
];

/// The same for drivers built with the SDK's `iscsi-chap` feature (per-initiator CHAP accounts),
/// by a cargo of their own for the same reason.
const TGT_DRIVERS: &[(&str, &str)] = &[
    ("tgt-iscsi", "berth-driver-tgt-iscsi"),
    ("flawed", "berth-driver-flawed"),
    ("hostile", "berth-driver-hostile"),
];

/// The same for drivers built with the SDK's `network` feature. They are built by a cargo of
/// their own: features unify across the packages of one build, and the others must not import
/// `wasi:http`.
const NETWORK_DRIVERS: &[(&str, &str)] = &[
    ("netprobe", "berth-driver-netprobe"),
    ("array", "berth-driver-array"),
    ("ceph-rbd", "berth-driver-ceph-rbd"),
    ("flawed-rbd", "berth-driver-flawed-rbd"),
];

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.parent().expect("host/ is inside the workspace").to_path_buf();
    for watched in ["sdk", "wit", "drivers", "tgtd-preload", "Cargo.lock", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    let target = env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let target = if target.is_absolute() { target } else { root.join(target) };
    let wasm_target = target.join("wasm-drivers");
    let out = target.join("drivers");

    for set in [DRIVERS, TGT_DRIVERS, NETWORK_DRIVERS] {
        build(&root, &wasm_target, set);
    }

    std::fs::create_dir_all(&out).expect("cannot create the drivers output directory");
    for (name, package) in DRIVERS.iter().chain(TGT_DRIVERS).chain(NETWORK_DRIVERS) {
        let built =
            wasm_target.join("wasm32-wasip2/driver").join(format!("{}.wasm", package.replace('-', "_")));
        copy_if_changed(&built, &out.join(format!("{name}.wasm")));
    }
    println!("cargo:rustc-env=BERTH_DRIVER_DIR={}", out.display());

    let native_target = target.join("tgtd-preload");
    let mut cmd = cargo(&root, &native_target);
    cmd.args(["-p", "berth-tgtd-preload"]);
    let status = cmd.status().expect("cannot run cargo to build tgtd-preload");
    assert!(status.success(), "building tgtd-preload failed ({status})");
    let preload = out.join("libberth_tgtd_preload.so");
    copy_if_changed(&native_target.join("driver/libberth_tgtd_preload.so"), &preload);
    println!("cargo:rustc-env=BERTH_TGTD_PRELOAD={}", preload.display());
}

/// A cargo build with the `driver` profile into `target_dir`, without the outer build's flags and
/// wrappers (clippy's, a host target-cpu).
fn cargo(root: &Path, target_dir: &Path) -> Command {
    let mut cmd = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root).args(["build", "--profile", "driver", "--target-dir"]).arg(target_dir);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// One cargo build of a set of driver crates.
fn build(root: &Path, wasm_target: &Path, set: &[(&str, &str)]) {
    let mut cmd = cargo(root, wasm_target);
    cmd.args(["--target", "wasm32-wasip2"]);
    for (_, package) in set {
        cmd.args(["-p", package]);
    }
    let status = cmd.status().expect("cannot run cargo to build the drivers");
    if !status.success() {
        panic!(
            "building the drivers for wasm32-wasip2 failed ({status}); if the target is missing, run \
             `rustup target add wasm32-wasip2` (rust-toolchain.toml asks rustup for it)"
        );
    }
}

fn copy_if_changed(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).unwrap_or_else(|e| panic!("cannot read {}: {e}", from.display()));
    if std::fs::read(to).ok().as_deref() != Some(&bytes[..]) {
        std::fs::write(to, &bytes).unwrap_or_else(|e| panic!("cannot write {}: {e}", to.display()));
    }
}

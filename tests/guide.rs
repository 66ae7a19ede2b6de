//! `docs/writing-a-driver.md`, followed to the letter: its `Cargo.toml` and `src/lib.rs` are
//! written into an empty directory outside the workspace and built for wasm32-wasip2 with the
//! command the guide gives; the result passes the conformance suite with the guide's
//! `conformance.toml`, and `berth serve` with the guide's `berth.toml` attaches a volume through
//! it that a real initiator logs in to.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use berth::conformance::checks::CHECKS;
use berth_tests::drivers::shared_cache;
use berth_tests::iscsi::{Session, Target};
use berth_tests::process::berth_binary;
use berth_tests::server::connector;
use berth_tests::tgt::Rig;
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The guide's files: every fenced block whose info string names a file (```` ```rust src/lib.rs ````).
fn guide_files() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("docs/writing-a-driver.md")).unwrap();
    let mut files = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                if let (Some(_lang), Some(file)) = (words.next(), words.next()) {
                    current = Some((file.to_string(), String::new()));
                }
            }
            (Some(_), Some("")) => {
                let (file, body) = current.take().unwrap();
                assert!(files.insert(file.clone(), body).is_none(), "{file} appears twice in the guide");
            }
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(current.is_none(), "an unterminated code block in the guide");
    files
}

/// The guide's build command, run in `dir`. The target directory is shared between runs so that
/// dependencies are built once; the workspace's lock file pins the same versions the SDK is
/// tested with.
fn build(dir: &Path) -> PathBuf {
    std::fs::copy(root().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let target = root().join("target/guide-driver");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(dir)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .env("CARGO_TARGET_DIR", &target);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
    ] {
        cmd.env_remove(var);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "the guide's driver does not build:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join("wasm32-wasip2/release/acme_iscsi.wasm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_rust_driver_builds_from_an_empty_directory_passes_the_suite_and_serves_attachments() {
    let files = guide_files();
    for f in ["Cargo.toml", "src/lib.rs", "conformance.toml", "berth.toml"] {
        assert!(files.contains_key(f), "the guide has no {f}");
    }

    // An empty directory, outside the workspace, with the guide's two files. The guide's
    // dependency path assumes a checkout at ../berth; here it is this repository.
    let dir = tempfile::tempdir().unwrap();
    let manifest = files["Cargo.toml"]
        .replace("path = \"../berth/sdk\"", &format!("path = \"{}\"", root().join("sdk").display()));
    assert_ne!(manifest, files["Cargo.toml"], "the guide's Cargo.toml depends on ../berth/sdk");
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), &files["src/lib.rs"]).unwrap();
    let wasm = build(dir.path());

    // berth conformance --config conformance.toml: every check runs and passes.
    std::fs::write(dir.path().join("conformance.toml"), &files["conformance.toml"]).unwrap();
    let report = dir.path().join("report.json");
    let out = Command::new(berth_binary())
        .arg("conformance")
        .arg("--config")
        .arg(dir.path().join("conformance.toml"))
        .arg("--json")
        .arg(&report)
        .arg("--cache-dir")
        .arg(shared_cache())
        .arg(&wasm)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["driver"], "acme-iscsi 0.1.0");
    assert_eq!(report["passed"], CHECKS.len(), "{stdout}");
    assert_eq!((report["failed"].as_u64(), report["skipped"].as_u64()), (Some(0), Some(0)));

    // berth serve with the guide's backend: a multiattach volume, two initiators, real logins.
    let config = files["berth.toml"].replace("/opt/acme/acme_iscsi.wasm", &wasm.display().to_string());
    assert_ne!(config, files["berth.toml"]);
    let rig = Rig::start_with(&config);
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1, "volume_type": "acme"})).await;
    let (a, b) = ("iqn.1993-08.org.debian:01:guide-a", "iqn.1993-08.org.debian:01:guide-b");
    let ra = c.attach(&volume, Some(connector(a, "guide-a"))).await.expect(200);
    let rb = c.attach(&volume, Some(connector(b, "guide-b"))).await.expect(200);
    let (ta, tb) = (
        Target::from_connection_info(&ra.body["attachment"]["connection_info"]),
        Target::from_connection_info(&rb.body["attachment"]["connection_info"]),
    );
    assert!(
        ta.iqn.starts_with("iqn.2024-01.com.example:"),
        "the backend's settings reach the driver: {}",
        ta.iqn
    );
    let session = Session::login(&ta, a).expect("the first initiator logs in");
    session.write(0, &[0xa5; 4096]).unwrap();
    drop(session);
    let id_a = ra.body["attachment"]["id"].as_str().unwrap();
    c.delete(&format!("/attachments/{id_a}")).await.expect(200);
    assert!(Session::login(&ta, a).is_err(), "the first initiator's access is revoked");
    let session = Session::login(&tb, b).expect("the second keeps its access");
    assert_eq!(session.read(0, 4096).unwrap(), vec![0xa5; 4096]);
    drop(session);
    let id_b = rb.body["attachment"]["id"].as_str().unwrap();
    c.delete(&format!("/attachments/{id_b}")).await.expect(200);
    assert!(!rig.exported(&volume));
    c.delete(&format!("/volumes/{volume}")).await.expect(202);
    assert!(!rig.backing_file(&volume).exists());
}

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
                } else {
                    // An untagged block: kept apart under its position (checked by the test
                    // that every program in the guide is built or quoted from a built file).
                    let lang = if info.is_empty() { "(none)" } else { info };
                    current = Some((format!("(untagged {lang} block {})", files.len()), String::new()));
                }
            }
            (Some(_), Some("")) => {
                let (file, body) = current.take().unwrap();
                if let Some(path) = file.strip_prefix("excerpt=") {
                    // Quoted from a file of the repository: each such block is its own entry.
                    let key = format!("excerpt={path}#{}", files.len());
                    files.insert(key, body);
                    continue;
                }
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

/// Every program in the guide is run: a block in a programming language or a configuration format
/// names the file it is (and a test below builds and runs it), or is an excerpt
/// (`excerpt=<path>`) whose lines appear, in order and together, in that file of the repository
/// (which the project's tests build and run). Untagged blocks are commands and output only.
#[test]
fn every_program_in_the_guide_is_built_or_quoted_from_a_built_file() {
    let files = guide_files();
    for (key, body) in &files {
        if let Some(lang) = key.strip_prefix("(untagged ") {
            let lang = lang.split_whitespace().next().unwrap_or_default();
            assert!(
                matches!(lang, "sh" | "text"),
                "a {lang} block in the guide names no file and is no excerpt:\n{body}"
            );
        }
        if let Some(path) = key.strip_prefix("excerpt=") {
            let path = path.split('#').next().unwrap();
            let source = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(source.contains(body.trim_end()), "an excerpt of {path} is not in it:\n{body}");
        }
    }
    for built in [
        "src/lib.rs",
        "array/src/lib.rs",
        "array-js/src/driver.js",
        "array-py/app.py",
        "array/conformance.toml",
    ] {
        assert!(files.contains_key(built), "the guide has no {built}");
    }
}

/// The guide's build command, run in `dir`. The target directory is shared between runs so that
/// dependencies are built once; the workspace's lock file pins the same versions the SDK is
/// tested with.
fn build(dir: &Path) -> PathBuf {
    build_named(dir, "acme_iscsi")
}

/// The same for a crate whose component is `<name>.wasm`.
fn build_named(dir: &Path, name: &str) -> PathBuf {
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
    target.join(format!("wasm32-wasip2/release/{name}.wasm"))
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
    // Every check runs but the ones for drivers that reach their backend over the network or
    // make cephx identities.
    assert_eq!(report["passed"], CHECKS.len() - 2, "{stdout}");
    assert_eq!((report["failed"].as_u64(), report["skipped"].as_u64()), (Some(0), Some(2)));

    // berth serve with the guide's backend: a multiattach volume, two initiators, real logins.
    // The test's own rig gives the listen address, the data directory and its tgtd.
    let guide = &files["berth.toml"];
    for key in ["listen = ", "data_dir = ", "[tgt]", "name = \"__DEFAULT__\""] {
        assert!(guide.contains(key), "the guide's berth.toml has no {key}");
    }
    let config: String = guide
        .lines()
        .filter(|l| !l.starts_with("listen = ") && !l.starts_with("data_dir = "))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("[tgt]\nportal = \"127.0.0.1:3260\"", "")
        .replace("/opt/acme/acme_iscsi.wasm", &wasm.display().to_string());
    assert!(!config.contains("[tgt]") && config.contains(&wasm.display().to_string()), "{config}");
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

/// "Talking to your array": the guide's `acme-array` crate, from an empty directory, built and
/// served with the guide's configuration (its placeholders pointed at an HTTPS array started by
/// the test, with a CA made by the test): a volume is made, attached, detached and deleted on the
/// array; the password reached the array and nothing else; and the guide's conformance run against
/// that array passes, faults injected in front of it included (a create whose answer is lost after
/// the array applied it converges when it is retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_array_driver_talks_to_an_array_over_https_and_converges_after_a_lost_answer() {
    use berth_tests::https::{ARRAY_PASSWORD, ArrayServer, TestCa};
    let files = guide_files();
    for f in ["array/Cargo.toml", "array/src/lib.rs", "array/berth.toml"] {
        assert!(files.contains_key(f), "the guide has no {f}");
    }
    let dir = tempfile::tempdir().unwrap();
    let manifest = files["array/Cargo.toml"]
        .replace("path = \"../berth/sdk\"", &format!("path = \"{}\"", root().join("sdk").display()));
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), &files["array/src/lib.rs"]).unwrap();
    let wasm = build_named(dir.path(), "acme_array");

    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["array.example"]).await;
    let endpoint = format!("https://array.example:{}", array.port());
    let password = password_file(dir.path());
    let config = files["array/berth.toml"]
        .replace("/opt/acme/acme_array.wasm", &wasm.display().to_string())
        .replace("https://array.example:8443", &endpoint)
        .replace("/etc/berth/acme-ca.pem", &ca.write(dir.path()).display().to_string())
        .replace("/etc/berth/acme-array.password", &password.display().to_string())
        .replace(
            "[backends.network]",
            "[backends.network]\nresolve = { \"array.example\" = \"127.0.0.1\" }\nallowed_hosts_extra = 0",
        );
    // The array is on loopback here: its address is listed too (the host refuses a name that
    // resolves into the host otherwise).
    let config = config.replace("\nallowed_hosts_extra = 0", "").replace(
        &format!("allowed_hosts = [\"{endpoint}\"]"),
        &format!("allowed_hosts = [\"{endpoint}\", \"https://127.0.0.1:{}\"]", array.port()),
    );
    let server = berth_tests::process::BerthProcess::start(&config);
    let c = berth_tests::server::Client::for_base(&server.base, "p1").at("3.54");
    let volume = c.create_volume(json!({"size": 2, "volume_type": "acme-array"})).await;
    let name = format!("volume-{volume}");
    assert_eq!(
        array.state.lock().unwrap().volumes.get(&name).map(|v| v.0),
        Some(2),
        "the array has the volume"
    );
    let initiator = "iqn.1993-08.org.debian:01:guide-array";
    let made = c.attach(&volume, Some(connector(initiator, "guide-array"))).await.expect(200);
    assert_eq!(
        made.body["attachment"]["connection_info"]["target_iqn"],
        format!("iqn.2024-01.com.example.array:{name}")
    );
    assert!(array.state.lock().unwrap().volumes[&name].1.contains(initiator));
    let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/attachments/{id}")).await.expect(200);
    assert!(array.state.lock().unwrap().volumes[&name].1.is_empty(), "the detach reached the array");
    c.delete(&format!("/volumes/{volume}")).await.expect(202);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while array.state.lock().unwrap().volumes.contains_key(&name) {
        assert!(std::time::Instant::now() < deadline, "the volume stayed on the array");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let log = server.log_text();
    assert!(!log.contains(ARRAY_PASSWORD), "the password reached the log");
    assert!(array.requests().iter().any(|r| r.body.contains(ARRAY_PASSWORD)), "the array got the password");

    // The guide's conformance run against the same array.
    array_conformance(&files, &wasm, dir.path(), &array, &password, "grants = [\"network\"]");
}

/// The guide's conformance run of an array driver against `array`: every check that applies
/// passes, the faults injected in front of the array (a lost answer, a timeout, a 503 at each
/// request) among them, no secret is printed, and the suite leaves nothing on the array.
fn array_conformance(
    files: &BTreeMap<String, String>,
    wasm: &Path,
    dir: &Path,
    array: &berth_tests::https::ArrayServer,
    password: &Path,
    grants: &str,
) {
    use berth_tests::https::ARRAY_PASSWORD;
    let endpoint = format!("https://array.example:{}", array.port());
    let conformance = files["array/conformance.toml"]
        .replace("grants = [\"network\"]", grants)
        .replace("https://array.example:8443", &endpoint)
        .replace("/etc/berth/acme-ca.pem", &dir.join("ca.pem").display().to_string())
        .replace("/etc/berth/acme-array.password", &password.display().to_string())
        .replace("[network]\n", "[network]\nresolve = { \"array.example\" = \"127.0.0.1\" }\n")
        .replace(
            &format!("allowed_hosts = [\"{endpoint}\"]"),
            &format!("allowed_hosts = [\"{endpoint}\", \"https://127.0.0.1:{}\"]", array.port()),
        );
    let config = dir.join("conformance.toml");
    std::fs::write(&config, conformance).unwrap();
    let out = Command::new(berth_binary())
        .arg("conformance")
        .arg(wasm)
        .arg("--config")
        .arg(&config)
        .args(["--cache-dir".as_ref(), shared_cache().as_os_str()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("PASS  a request to the backend that is lost, times out or gets a 503"),
        "{stdout}"
    );
    assert!(!stdout.contains(ARRAY_PASSWORD));
    assert!(array.state.lock().unwrap().volumes.is_empty(), "the suite left volumes on the array");
}

/// The array's password in a file only its owner reads, as the guide's configuration names it.
fn password_file(dir: &Path) -> PathBuf {
    let password = dir.join("acme-array.password");
    std::fs::write(&password, format!("{}\n", berth_tests::https::ARRAY_PASSWORD)).unwrap();
    std::fs::set_permissions(&password, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    password
}

/// "Talking to your array" in JavaScript: the guide's `array-js/package.json` and
/// `array-js/src/driver.js`, built with its own command (ComponentizeJS from npm; the
/// `node_modules` of `drivers/js-iscsi`, which `.ci/setup` installs, stand in for `npm install`),
/// pass the suite against an HTTPS array with the guide's conformance configuration; and so do
/// they built with `drivers/js-iscsi/componentize.mjs`, which the guide offers in the command's
/// place (its rewritten bindings, here of a world that imports wasi:http's resources).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_javascript_array_driver_passes_the_suite_against_an_array() {
    use berth_tests::https::{ArrayServer, TestCa};
    let files = guide_files();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    let package =
        files["array-js/package.json"].replace("../berth/wit", &root().join("wit").display().to_string());
    std::fs::write(dir.path().join("package.json"), &package).unwrap();
    std::fs::write(dir.path().join("src/driver.js"), &files["array-js/src/driver.js"]).unwrap();
    let modules = root().join("drivers/js-iscsi/node_modules");
    assert!(modules.exists(), "{} is missing: run .ci/setup", modules.display());
    std::os::unix::fs::symlink(&modules, dir.path().join("node_modules")).unwrap();
    let out =
        Command::new("npm").args(["run", "--silent", "build"]).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "npm run build: {}", String::from_utf8_lossy(&out.stderr));
    let wasm = dir.path().join("acme_array.wasm");

    let ca = TestCa::new();
    ca.write(dir.path());
    let array = ArrayServer::https(&ca, &["array.example"]).await;
    let password = password_file(dir.path());
    tokio::task::block_in_place(|| {
        array_conformance(&files, &wasm, dir.path(), &array, &password, "grants = [\"network\"]")
    });

    let script = package
        .split('"')
        .find(|s| s.starts_with("componentize-js "))
        .expect("the guide's build command")
        .replace("componentize-js ", "")
        .replace("acme_array.wasm", "acme_array_rewritten.wasm");
    let out = Command::new("node")
        .arg(root().join("drivers/js-iscsi/componentize.mjs"))
        .args(script.split_whitespace())
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "componentize.mjs: {}", String::from_utf8_lossy(&out.stderr));
    let rewritten = dir.path().join("acme_array_rewritten.wasm");
    tokio::task::block_in_place(|| {
        array_conformance(&files, &rewritten, dir.path(), &array, &password, "grants = [\"network\"]")
    });
}

/// "Talking to your array" in Python: the guide's `array-py/app.py`, built with the guide's
/// componentize-py command (from PyPI, pinned by `drivers/py-iscsi/requirements.txt`; `.ci/setup`
/// installs it), passes the suite against an HTTPS array, granted `network` and `inert-wasi`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_python_array_driver_passes_the_suite_against_an_array() {
    use berth_tests::https::{ArrayServer, TestCa};
    let files = guide_files();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("app.py"), &files["array-py/app.py"]).unwrap();
    let text = std::fs::read_to_string(root().join("docs/writing-a-driver.md")).unwrap();
    let command = text
        .split("```sh\n")
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("-w remote-storage-driver"))
        .expect("the guide's componentize-py command")
        .replace("\\\n", " ");
    let componentize = root().join("target/venv/bin/componentize-py");
    assert!(componentize.exists(), "{} is missing: run .ci/setup", componentize.display());
    let args: Vec<String> = command
        .split_whitespace()
        .skip(1)
        .map(|a| a.replace("../berth/wit", &root().join("wit").display().to_string()))
        .collect();
    let out = Command::new(&componentize).args(&args).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "componentize-py: {}", String::from_utf8_lossy(&out.stderr));
    let wasm = dir.path().join("acme_array.wasm");

    let ca = TestCa::new();
    ca.write(dir.path());
    let array = ArrayServer::https(&ca, &["array.example"]).await;
    let password = password_file(dir.path());
    tokio::task::block_in_place(|| {
        array_conformance(
            &files,
            &wasm,
            dir.path(),
            &array,
            &password,
            "grants = [\"network\", \"inert-wasi\"]",
        )
    });
}

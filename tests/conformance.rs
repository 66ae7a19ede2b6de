//! The conformance suite, tested: every shipped driver passes it (against the model and against
//! a real tgtd, with valid JUnit); each flaw of the `flawed` fixture and each misbehaving fixture
//! fails exactly the checks it should, and together they fail every check; drivers written in
//! JavaScript and Python from the WIT alone pass it, a driver built for contract 0.1.0 keeps
//! passing, and all of them serve real attachments side by side in `berth serve`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use berth::conformance::checks::{CHECKS, Id, name};
use berth::conformance::report::{CheckReport, Report, Status};
use berth::conformance::{Options, TargetMode, VendorConfig};
use berth_tests::drivers::{component, shared_cache};
use berth_tests::https::{ARRAY_PASSWORD, ArrayServer, TestCa};
use berth_tests::iscsi::{Session, Target};
use berth_tests::process::berth_binary;
use berth_tests::server::connector;
use berth_tests::tgt::Rig;
use serde_json::json;

async fn suite(wasm: PathBuf, settings: &[(&str, &str)]) -> Report {
    suite_on(TargetMode::Model, wasm, settings).await
}

async fn suite_on(target: TargetMode, wasm: PathBuf, settings: &[(&str, &str)]) -> Report {
    // As `berth serve` checks a shipped driver's upgrade: its attached volumes are extended too.
    let config = VendorConfig {
        settings: settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        online_extend: true,
        ..Default::default()
    };
    let options =
        Options { wasm, config, target, focus: None, skip: None, repeat: 1, cache_dir: Some(shared_cache()) };
    berth::conformance::run(options, |_| {}).await.expect("the suite runs")
}

fn failed(report: &Report) -> BTreeSet<&'static str> {
    report.failures().into_iter().collect()
}

/// The checks skipped, but for the ones of drivers that reach their backend over the network or
/// ask the host for cephx identities (`tests/ceph.rs` runs those).
fn skipped(report: &Report) -> Vec<&CheckReport> {
    report
        .checks
        .iter()
        .filter(|c| {
            matches!(c.status, Status::Skipped(_))
                && c.name != name(Id::NetworkFaults)
                && c.name != name(Id::TerminateRemovesIdentity)
        })
        .collect()
}

fn names(ids: &[Id]) -> BTreeSet<&'static str> {
    ids.iter().map(|id| name(*id)).collect()
}

fn js_driver() -> PathBuf {
    let wasm = component("js-iscsi");
    assert!(
        wasm.exists(),
        "{} is missing: build it with `npm ci && npm run build` in drivers/js-iscsi (bash .ci/test does)",
        wasm.display()
    );
    wasm
}

fn py_driver() -> PathBuf {
    let wasm = component("py-iscsi");
    assert!(
        wasm.exists(),
        "{} is missing: build it with drivers/py-iscsi/build.sh (bash .ci/test does)",
        wasm.display()
    );
    wasm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_driver_passes() {
    let tgt = suite(component("tgt-iscsi"), &[]).await;
    assert!(tgt.ok(), "{:#?}", tgt.failures());
    assert!(skipped(&tgt).is_empty(), "tgt-iscsi advertises everything the suite checks but the network");
    assert_eq!(tgt.contract, Some("berth:driver@0.3.0"));
    assert_eq!(tgt.guarantees, ["terminate-ends-sessions"]);
    assert_eq!(tgt.checks.len(), CHECKS.len());
    // And with an account per export, as Cinder's tgt helper makes them.
    let per_export = suite(component("tgt-iscsi"), &[("chap_accounts", "per-export")]).await;
    assert!(per_export.ok(), "{:#?}", per_export.failures());

    let fake = suite(component("fake"), &[]).await;
    assert!(fake.ok(), "{:#?}", fake.failures());
    for c in &fake.checks {
        if let Status::Skipped(why) = &c.status {
            assert!(
                why.contains("does not use the host's iSCSI target service")
                    || why.contains("network")
                    || why.contains("cephx"),
                "{}: {why}",
                c.name
            );
        }
    }
}

/// `tgt-iscsi` as built against contract 0.1.0 (kept as a binary in `drivers/fixtures/binary`)
/// loads through the host's 0.1.0 adapter and passes, on the model and on a real tgtd, but for
/// one check written later: that release kept a volume's CHAP credentials from one export to the
/// next, so a host detached from a single-attach volume could log in again, under the next host's
/// initiator name, once the volume was attached there (fixed before 0.2.0, whose build passes).
/// Only the check of a promise 0.1.0 cannot make is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_built_against_contract_0_1_0_keeps_passing_but_for_the_credentials_it_kept() {
    let wasm =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../drivers/fixtures/binary/tgt-iscsi-0.1.0.wasm");
    for target in [TargetMode::Model, TargetMode::Tgtd] {
        let report = suite_on(target, wasm.clone(), &[]).await;
        assert_eq!(failed(&report), names(&[Id::ExportedAgainCredentialsRefused]), "{target:?}");
        assert_eq!(report.contract, Some("berth:driver@0.1.0"));
        assert!(report.guarantees.is_empty());
        let skipped = skipped(&report);
        assert_eq!(skipped.len(), 1, "{target:?}: {skipped:#?}");
        assert_eq!(skipped[0].name, name(Id::TerminateEndsSessions));
    }
}

/// `tgt-iscsi` as built against contract 0.2.0 (the last release before 0.3.0, kept as a binary)
/// loads through the host's 0.2.0 adapter and passes every check, its promise included, on the
/// model and on a real tgtd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_built_against_contract_0_2_0_keeps_passing() {
    let wasm =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../drivers/fixtures/binary/tgt-iscsi-0.2.0.wasm");
    for target in [TargetMode::Model, TargetMode::Tgtd] {
        let report = suite_on(target, wasm.clone(), &[]).await;
        assert!(report.ok(), "{target:?}: {:#?}", report.failures());
        assert_eq!(report.contract, Some("berth:driver@0.2.0"));
        assert_eq!(report.guarantees, ["terminate-ends-sessions"]);
        assert!(skipped(&report).is_empty(), "{target:?}");
    }
}

#[test]
fn tgt_iscsi_passes_against_a_real_tgtd_and_the_junit_is_valid() {
    let dir = tempfile::tempdir().unwrap();
    let (junit, json) = (dir.path().join("out.xml"), dir.path().join("out.json"));
    // As the shipped driver is served: its attached volumes are extended too.
    let config = dir.path().join("vendor.toml");
    std::fs::write(&config, "online_extend = true\n").unwrap();
    let out = Command::new(berth_binary())
        .arg("conformance")
        .arg(component("tgt-iscsi"))
        .arg("--config")
        .arg(&config)
        .args(["--target", "tgtd", "--junit"])
        .arg(&junit)
        .arg("--json")
        .arg(&json)
        .args(["--cache-dir"])
        .arg(shared_cache())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // One line per check, with fuel and peak memory; then the summary.
    let lines: Vec<&str> =
        stdout.lines().filter(|l| l.starts_with("PASS") || l.starts_with("SKIP")).collect();
    assert_eq!(lines.len(), CHECKS.len(), "{stdout}");
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("PASS") && l.contains("calls"))
            .all(|l| { l.contains("fuel max") && l.contains("peak memory") })
    );
    assert!(
        stdout.contains("0 failed") && stdout.contains("(target: tgtd, its own on control port"),
        "{stdout}"
    );

    // The JUnit file is well-formed and says what the run said.
    let check = r#"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == "testsuites", root.tag
suites = root.findall("testsuite")
assert len(suites) == 1
s = suites[0]
cases = s.findall("testcase")
assert int(s.get("tests")) == len(cases), (s.get("tests"), len(cases))
assert int(s.get("failures")) == 0
assert int(s.get("skipped")) == len([c for c in cases if c.find("skipped") is not None])
for c in cases:
    assert c.get("name") and c.get("classname") and float(c.get("time")) >= 0
    assert c.find("failure") is None
print(len(cases))
"#;
    let py = Command::new("python3").args(["-c", check]).arg(&junit).output().unwrap();
    assert!(py.status.success(), "invalid JUnit: {}", String::from_utf8_lossy(&py.stderr));
    assert_eq!(String::from_utf8_lossy(&py.stdout).trim(), CHECKS.len().to_string());
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // All checks run but the ones for drivers that use the network or make cephx identities.
    assert_eq!((report["failed"].as_u64(), report["skipped"].as_u64()), (Some(0), Some(2)));
    assert!(report["checks"].as_array().unwrap().iter().any(|c| c["fuel_total"].as_u64() > Some(0)));
}

#[test]
fn injected_faults_reach_the_driver_in_front_of_a_real_tgtd_too() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("flaw.toml");
    std::fs::write(&config, "[settings]\nflaw = \"timeout-as-backend\"\n").unwrap();
    let out = Command::new(berth_binary())
        .arg("conformance")
        .arg(component("flawed"))
        .args(["--target", "tgtd", "--focus", "target-service", "--config"])
        .arg(&config)
        .args(["--cache-dir"])
        .arg(shared_cache())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("FAIL  {}", name(Id::TimeoutsRetryable))), "{stdout}");
    assert!(stdout.contains(&format!("PASS  {}", name(Id::FailuresTyped))), "{stdout}");
    assert!(stdout.contains("(target: tgtd, its own on control port"), "{stdout}");
}

/// Each flaw of the `flawed` fixture and the checks it must fail, no more, no fewer.
fn flaws() -> Vec<(&'static str, Vec<Id>)> {
    use Id::*;
    vec![
        ("accept-any-connector", vec![RequiresInitiator, HostileInitiators]),
        ("reject-extra-keys", vec![ExtraKeys]),
        ("impure-validate", vec![HostileInitiators, ValidatePure]),
        ("leak-store", vec![VolumeLifecycle, NoLeak]),
        ("fresh-credentials", vec![ExportIdempotent, ExportAfterWipe, Deterministic]),
        ("strict-remove-export", vec![RemoveUnexported]),
        ("keep-target", vec![RemoveCleans, NoLeak]),
        ("nonce", vec![InitializeIdempotent, Deterministic]),
        ("bad-schema", vec![ConnectionSchema]),
        ("mislabeled", vec![ConnectionSchema]),
        ("no-chap", vec![AclExact, ExportedAgainCredentialsRefused]),
        ("unexported-backend", vec![InitializeUnexported]),
        ("ignore-mode", vec![ConnectionSchema, AccessModeChange]),
        // (Access the next initiator's connect takes away fails what checks a login first.)
        ("replace-acl", vec![SecondInitiator, TerminatedCredentialsRefused]),
        // A retried terminate fails too: it does not converge.
        ("strict-terminate", vec![TerminateUnknown, TerminateIdempotent, Convergence]),
        (
            "no-revoke",
            vec![
                TerminateRevokes,
                TerminateAll,
                TerminateOneKeepsOther,
                TerminatedCredentialsRefused,
                TerminateEndsSessions,
            ],
        ),
        // An account per export whose credentials outlive the access they were given for: kept for
        // the next export, and (`rotate_chap_on_detach = "false"`) for those who stay when one
        // host of a multiattach volume leaves.
        ("keep-credentials", vec![TerminatedCredentialsRefused, ExportedAgainCredentialsRefused]),
        ("revoke-shared", vec![TerminateSameInitiator]),
        ("keep-sessions", vec![TerminateEndsSessions]),
        ("wrong-in-use", vec![ExportInUse]),
        ("shared-none", vec![SharedQuery]),
        ("timeout-as-backend", vec![TimeoutsRetryable]),
        ("swallow-failures", vec![FailuresTyped]),
        ("spin", vec![SharedQuery, CpuBudget]),
        ("hog", vec![SharedQuery, MemoryBudget]),
        ("oversize", vec![SharedQuery, OutputBounds]),
        ("crash-unsafe", vec![Convergence]),
        ("counts-calls", vec![SharedInstance]),
        ("unchecked-deny", vec![ArgumentGrammar]),
        ("extend-does-nothing", vec![Extend, ExtendAttached]),
        // Slow is not wrong: it passes every check (an upgrade's watch catches it instead).
        ("slow-connect", vec![]),
        // Fails only with another target prefix than the suite's: in service.
        ("lab-only", vec![]),
        ("extend-not-idempotent", vec![Extend]),
        // Grows the store and drops the export with it.
        ("extend-unexports", vec![ExtendAttached]),
        // Success with the initiator missing from the ACL: every check that logs in or looks at
        // the ACL after initialize-connection.
        (
            "forget-acl",
            vec![
                ExportAfterWipe,
                AclExact,
                SecondInitiator,
                TerminateUnknown,
                TerminateOneKeepsOther,
                TerminatedCredentialsRefused,
                ExportedAgainCredentialsRefused,
                TerminateSameInitiator,
                TerminateEndsSessions,
                Convergence,
                ExtendAttached,
            ],
        ),
    ]
}

/// Each flaw of the `array` fixture (a driver that reaches its array over HTTPS) and the checks
/// it must fail.
fn network_flaws() -> Vec<(&'static str, Vec<Id>)> {
    vec![
        ("create-not-idempotent", vec![Id::NetworkFaults]),
        ("errors-not-retryable", vec![Id::NetworkFaults]),
    ]
}

/// The suite on the `array` fixture against the tests' HTTPS array, configured as a vendor
/// would: the array's address, its CA, its password in a file only the service reads.
async fn array_suite(array: &ArrayServer, ca: &TestCa, dir: &std::path::Path, flaw: Option<&str>) -> Report {
    let password = dir.join("array.password");
    std::fs::write(&password, format!("{ARRAY_PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&password, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let endpoint = format!("https://127.0.0.1:{}", array.port());
    let toml = format!(
        r#"grants = ["network"]
[settings]
api = "{endpoint}"
{flaw}
[network]
allowed_hosts = ["{endpoint}"]
ca_file = "{ca}"
secret_response_fields = ["/token"]
[network.secrets.array-password]
file = "{password}"
hosts = ["{endpoint}"]
"#,
        flaw = flaw.map(|f| format!("flaw = \"{f}\"")).unwrap_or_default(),
        ca = ca.write(dir).display(),
        password = password.display(),
    );
    let path = dir.join("array.toml");
    std::fs::write(&path, toml).unwrap();
    let config = VendorConfig::load(&path).unwrap();
    let options = Options {
        wasm: component("array"),
        config,
        target: TargetMode::Model,
        focus: None,
        skip: None,
        repeat: 1,
        cache_dir: Some(shared_cache()),
    };
    berth::conformance::run(options, |c| {
        eprintln!("DEBUG {} {:?}", c.name, array.state.lock().unwrap().volumes.keys().collect::<Vec<_>>())
    })
    .await
    .expect("the suite runs")
}

/// A driver that reaches its storage over the network is checked for everything that does not
/// need the host's target service, against its real array (here the tests' HTTPS array), with
/// faults injected in front of the array at every request of every call: a lost answer (the
/// request applied), a timeout and a 503 must fail the call as retryable, and the retry must
/// converge to an uninterrupted call's answer. The suite leaves nothing on the array, and each
/// flaw fails exactly its checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_driver_is_checked_against_its_real_array_with_faults_in_front_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;

    let report = array_suite(&array, &ca, dir.path(), None).await;
    assert!(
        report.ok(),
        "{:#?}",
        report.checks.iter().filter(|c| matches!(c.status, Status::Failed(_))).collect::<Vec<_>>()
    );
    let faults = report.checks.iter().find(|c| c.name == name(Id::NetworkFaults)).unwrap();
    assert_eq!(faults.status, Status::Passed);
    // Every request of a volume's life was faulted three ways: the array saw them.
    assert!(faults.measure.calls > 100, "{:?}", faults.measure);
    for c in &report.checks {
        if let Status::Skipped(why) = &c.status {
            assert!(
                why.contains("does not use the host's iSCSI target service")
                    || why.contains("no cephx identities"),
                "{}: {why}",
                c.name
            );
        }
    }
    assert!(
        array.state.lock().unwrap().volumes.is_empty(),
        "left on the array: {:?}",
        array.state.lock().unwrap().volumes
    );

    for (flaw, expected) in network_flaws() {
        let report = array_suite(&array, &ca, dir.path(), Some(flaw)).await;
        assert_eq!(failed(&report), names(&expected), "flaw {flaw}: {:#?}", report.checks);
    }

    // A driver without the network skips the check, saying why.
    let tgt = suite(component("fake"), &[]).await;
    let skipped = tgt.checks.iter().find(|c| c.name == name(Id::NetworkFaults)).unwrap();
    assert!(matches!(&skipped.status, Status::Skipped(why) if why.contains("network")), "{skipped:?}");
}

async fn flaws_fail_exactly_their_checks(part: usize, of: usize) -> BTreeSet<&'static str> {
    let mut failing = BTreeSet::new();
    for (flaw, expected) in flaws().into_iter().enumerate().filter(|(i, _)| i % of == part).map(|(_, f)| f) {
        // These flaws are about the export's own CHAP account, which the driver makes only with
        // `chap_accounts = per-export` (with per-initiator accounts the host makes them).
        let accounts = match flaw {
            "fresh-credentials" | "no-chap" | "crash-unsafe" | "keep-credentials" => "per-export",
            _ => "per-initiator",
        };
        let mut settings = vec![("flaw", flaw), ("chap_accounts", accounts)];
        if flaw == "keep-credentials" {
            settings.push(("rotate_chap_on_detach", "false"));
        }
        let report = suite(component("flawed"), &settings).await;
        assert_eq!(failed(&report), names(&expected), "flaw {flaw}");
        failing.extend(failed(&report));
    }
    failing
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_flaw_fails_exactly_its_checks_first_half() {
    flaws_fail_exactly_their_checks(0, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_flaw_fails_exactly_its_checks_second_half() {
    flaws_fail_exactly_their_checks(1, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_misbehaving_fixtures_fail_exactly_their_checks_and_every_check_can_fail() {
    // Without a flaw, the fixture is tgt-iscsi and passes.
    assert!(suite(component("flawed"), &[]).await.ok());

    let sneaky = suite(component("sneaky"), &[]).await;
    assert_eq!(failed(&sneaky), names(&[Id::Load]));
    let message = match &sneaky.checks[0].status {
        Status::Failed(m) => m.clone(),
        other => panic!("{other:?}"),
    };
    assert!(message.contains("wasi:filesystem"), "the refused import is named: {message}");
    assert!(
        sneaky.checks[1..]
            .iter()
            .all(|c| matches!(&c.status, Status::Skipped(why) if why.contains("could not be loaded")))
    );

    let misbehaving = suite(component("misbehaving"), &[]).await;
    // (extend-volume's check deletes its volume too.)
    assert_eq!(
        failed(&misbehaving),
        names(&[Id::VolumeLifecycle, Id::Extend, Id::NoLeak]),
        "it cannot delete volumes"
    );

    // Every check is failed by some fixture: none of them can pass whatever the driver does (the
    // network flaws' failures are proven by the array test below).
    let mut failing: BTreeSet<&str> =
        flaws().iter().chain(&network_flaws()).flat_map(|(_, ids)| names(ids)).collect();
    failing.extend(failed(&sneaky));
    // Failed by `flawed-rbd` against a real Ceph (`tests/ceph.rs`).
    failing.insert(name(Id::TerminateRemovesIdentity));
    let never: Vec<&str> = CHECKS.iter().map(|c| c.name).filter(|n| !failing.contains(n)).collect();
    assert!(never.is_empty(), "checks no fixture fails: {never:#?}");
}

/// `drivers/js-iscsi` and `drivers/py-iscsi`, written in JavaScript and Python from the WIT of
/// 0.3.0 and `berth:iscsi-chap` alone and built with ComponentizeJS and componentize-py, pass every
/// check (their promise included, and the per-initiator accounts the host makes for them), on the
/// model and on a real tgtd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_built_from_the_wit_alone_in_javascript_and_python_pass_on_the_model_and_on_tgtd() {
    for (wasm, driver) in [(js_driver(), "js-iscsi"), (py_driver(), "py-iscsi")] {
        for target in [TargetMode::Model, TargetMode::Tgtd] {
            let report = suite_on(target, wasm.clone(), &[]).await;
            assert!(report.ok(), "{driver} on {target:?}: {:#?}", report.failures());
            assert!(skipped(&report).is_empty(), "{driver} on {target:?}: {:#?}", skipped(&report));
            assert!(report.driver.starts_with(driver));
            assert_eq!(report.contract, Some("berth:driver@0.3.0"));
            assert_eq!(report.guarantees, ["terminate-ends-sessions"]);
        }
    }
}

/// A driver in JavaScript built with `drivers/js-iscsi/componentize.mjs` (ComponentizeJS with its
/// bindings rewritten: strings encoded by the engine, a driver's result awaited only when it is a
/// promise) gets and gives back every string as written, multi-byte and astral characters
/// included (a lone surrogate, which UTF-8 cannot carry, arrives as U+FFFD, as ComponentizeJS's own
/// bindings send it), in results and in errors, and large ones too (an argument of 600 KB, a
/// result of 1 MB); an `async` driver function is still awaited, and what it throws after an
/// `await` is still its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_driver_built_with_berths_componentize_gets_and_gives_every_string_as_written() {
    const DRIVER: &str = r#"
const update = (fields) => ({ providerLocation: undefined, providerAuth: undefined, providerId: undefined,
  clear: [], setData: [], removeData: [], ...fields });
const unsupported = () => { throw { tag: 'unsupported', val: 'echo' }; };
export const driver = {
  info: () => ({ name: 'echo', version: '0.1.0', vendor: 'Berth tests', description: 'échos',
    protocols: [{ tag: 'iscsi' }], capabilities: { multiattach: false, sharedTargets: false } }),
  guarantees: () => [],
  validateConnector(connector) {
    if (connector.host !== 'host') {
      throw { tag: 'invalid-connector', val: { missing: [], reason: `${connector.host} ≠ host` } };
    }
  },
  createVolume: unsupported, deleteVolume: unsupported, extendVolume: unsupported,
  terminateConnection: unsupported, sharedConnections: unsupported, initializeConnection: unsupported,
  async removeExport(volume) {
    await null;
    throw { tag: 'not-found', val: `${volume.name} gône` };
  },
  async createExport(volume) {
    await null;
    return update({
      providerLocation: volume.metadata.map(([k, v]) => (k === 'large' ? `${k}=${v.length}:${v.slice(-3)}` : `${k}=${v}`)).join(';'),
      providerId: '\uD800x',
      setData: [[volume.name, '¿dónde? 🦀'], ...Array.from({ length: 255 }, (_, i) => [`kéy-${i}`, `${i}`.padEnd(2000, 'é')])],
    });
  },
};
"#;
    let dir = tempfile::tempdir().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::write(dir.path().join("driver.js"), DRIVER).unwrap();
    let wasm = dir.path().join("echo.wasm");
    let out = Command::new("node")
        .arg(root.join("drivers/js-iscsi/componentize.mjs"))
        .args(["driver.js", "--wit"])
        .arg(root.join("wit/driver@0.3.0"))
        .args([
            "--world-name",
            "storage-driver",
            "--disable",
            "stdio",
            "random",
            "clocks",
            "http",
            "fetch-event",
        ])
        .arg("--out")
        .arg(&wasm)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "componentize.mjs: {}", String::from_utf8_lossy(&out.stderr));

    let mut spec = berth_tests::drivers::granted_spec("echo");
    spec.wasm = berth::runtime::WasmSource::File(wasm);
    let driver = berth_tests::drivers::runtime().load(spec).await.unwrap();
    let large = "ü".repeat(300_000);
    let metadata = [
        ("ascii", "plain"),
        ("latin", "héllo wörld"),
        ("cjk", "日本語のボリューム"),
        ("astral", "🦀 𝔉erris"),
        ("large", large.as_str()),
    ];
    let volume = berth_tests::drivers::volume("11111111-2222-4333-8444-555555555555", &metadata);
    let mut calls = driver.calls();
    let update = calls.create_export(&volume, None).await.unwrap();
    assert_eq!(
        update.provider_location,
        Some(
            "ascii=plain;latin=héllo wörld;cjk=日本語のボリューム;astral=🦀 𝔉erris;large=300000:üüü"
                .to_string()
        )
    );
    assert_eq!(update.provider_id.as_deref(), Some("\u{FFFD}x"));
    assert_eq!(update.set_data.len(), 256);
    assert_eq!(update.set_data[0], (volume.name.clone(), "¿dónde? 🦀".to_string()));
    assert_eq!(update.set_data[255], ("kéy-254".to_string(), format!("254{}", "é".repeat(1997))));

    let gone = calls.remove_export(&volume).await.unwrap_err();
    assert!(gone.to_string().contains(&format!("{} gône", volume.name)), "{gone}");

    let mut connector = berth_tests::drivers::connector("iqn.1993-08.org.debian:01:echo");
    calls.validate_connector(&connector).await.expect_err("bench-host is not host");
    connector.host = Some("hôte".into());
    let refused = calls.validate_connector(&connector).await.unwrap_err();
    assert!(refused.to_string().contains("hôte ≠ host"), "{refused}");
}

/// `berth serve` loads drivers in three languages and three contract versions side by side: Rust
/// (`tgt-iscsi`, 0.3.0, and its builds for 0.2.0 and 0.1.0 kept in `drivers/fixtures/binary`),
/// JavaScript (`js-iscsi`, 0.3.0) and Python (`py-iscsi`, 0.3.0). A real initiator logs in to what
/// each exports and reads back what it wrote. A detach ends the host's open session whichever
/// contract its driver speaks: the 0.2.0 and 0.3.0 drivers end it themselves (close-sessions); for
/// the 0.1.0 build the host's adapter ends it inside deny-initiator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_in_three_languages_serve_real_attachments_side_by_side() {
    let grants = "grants = [\"iscsi-target\", \"backing-store\"]";
    let binary = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../drivers/fixtures/binary");
    let rig = Rig::start_with(&format!(
        "[[backends]]\nname = \"js\"\nwasm = \"{}\"\n{grants}\n\
         [[backends]]\nname = \"py\"\nwasm = \"{}\"\n{grants}\n\
         [[backends]]\nname = \"tgt\"\ndriver = \"tgt-iscsi\"\n{grants}\n\
         [[backends]]\nname = \"old1\"\nwasm = \"{}\"\n{grants}\n\
         [[backends]]\nname = \"old2\"\nwasm = \"{}\"\n{grants}\n\
         [[volume_types]]\nname = \"__DEFAULT__\"\nbackend = \"js\"\n\
         [[volume_types]]\nname = \"python\"\nbackend = \"py\"\n\
         [[volume_types]]\nname = \"rust\"\nbackend = \"tgt\"\n\
         [[volume_types]]\nname = \"rust-0.1.0\"\nbackend = \"old1\"\n\
         [[volume_types]]\nname = \"rust-0.2.0\"\nbackend = \"old2\"\n",
        js_driver().display(),
        py_driver().display(),
        binary.join("tgt-iscsi-0.1.0.wasm").display(),
        binary.join("tgt-iscsi-0.2.0.wasm").display(),
    ));
    let c = rig.client();
    for (volume_type, backend, host) in [
        ("__DEFAULT__", "js", "js-host"),
        ("python", "py", "py-host"),
        ("rust", "tgt", "rust-host"),
        ("rust-0.1.0", "old1", "old1-host"),
        ("rust-0.2.0", "old2", "old2-host"),
    ] {
        let volume = c.create_volume(json!({"size": 1, "volume_type": volume_type})).await;
        assert!(rig.backing_file_of(backend, &volume).exists(), "{volume_type}");
        let initiator = format!("iqn.1993-08.org.debian:01:{host}");
        let r = c.attach(&volume, Some(connector(&initiator, host))).await.expect(200);
        let info = r.body["attachment"]["connection_info"].clone();
        assert_eq!(info["driver_volume_type"], "iscsi");
        let session = Session::login(&Target::from_connection_info(&info), &initiator).expect("log in");
        assert_eq!(session.capacity().unwrap().0 * 512, 1 << 30);
        let data = vec![0x5a; 4096];
        session.write(0, &data).unwrap();
        assert_eq!(session.read(0, data.len()).unwrap(), data);
        let id = r.body["attachment"]["id"].as_str().unwrap();
        c.delete(&format!("/attachments/{id}")).await.expect(200);
        assert!(
            session.read(0, data.len()).is_err(),
            "{volume_type}: the detached host's open session ended with its attachment"
        );
        assert!(!rig.exported(&volume));
        c.delete(&format!("/volumes/{volume}")).await.expect(202);
        assert!(!rig.backing_file_of(backend, &volume).exists(), "{volume_type}");
    }
}

#[test]
fn the_exit_status_tells_a_failed_check_from_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(berth_binary())
            .arg("conformance")
            .args(["--cache-dir".as_ref(), shared_cache().as_os_str()])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let flawed = component("flawed");

    // A driver that fails one check: status 1, and the line says which and why.
    let config = dir.path().join("flaw.toml");
    std::fs::write(&config, "[settings]\nflaw = \"accept-any-connector\"\n").unwrap();
    let (code, stdout, _) = run(&[
        "--config".as_ref(),
        config.as_os_str(),
        "--focus".as_ref(),
        "without an initiator".as_ref(),
        flawed.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("FAIL  validate-connector should refuse a connector without an initiator"),
        "{stdout}"
    );
    assert!(stdout.contains("1 failed"), "{stdout}");

    // The same driver, correctly configured, passes what was selected.
    let (code, stdout, _) = run(&["--focus".as_ref(), "without an initiator".as_ref(), flawed.as_os_str()]);
    assert_eq!(code, Some(0), "{stdout}");

    // Bad flags and configuration: status 2 with a message, before anything runs.
    let (code, _, stderr) = run(&["--focus".as_ref(), "(".as_ref(), flawed.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--focus"), "{stderr}");
    std::fs::write(&config, "[limits]\nmemory_gib = 1\n").unwrap();
    let (code, _, stderr) = run(&["--config".as_ref(), config.as_os_str(), flawed.as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("memory_gib"), "{stderr}");
    let (code, _, stderr) = run(&[dir.path().join("missing.wasm").as_os_str()]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("is not a file"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drivers_of_other_protocols_are_checked_against_their_own_schema() {
    // The fake driver speaks each protocol as Cinder's drivers of that kind do, and passes.
    for protocol in ["iser", "fibre_channel", "nvmeof", "rbd", "nfs"] {
        let report = suite(component("fake"), &[("protocol", protocol)]).await;
        assert!(report.ok(), "{protocol}: {:#?}", report.failures());
        let schema = report.checks.iter().find(|c| c.name == name(Id::ConnectionSchema)).unwrap();
        assert_eq!(schema.status, Status::Passed, "{protocol}: the schema check runs for every protocol");
        // The iSCSI-only checks say why they did not run.
        let requires = report.checks.iter().find(|c| c.name == name(Id::RequiresInitiator)).unwrap();
        if protocol != "iser" {
            assert!(
                matches!(&requires.status, Status::Skipped(why) if why.contains("iscsi")),
                "{protocol}: {:?}",
                requires.status
            );
        }
    }
    // That each schema refuses what os-brick could not use is in the unit tests of
    // `conformance/checks.rs`; answering under another protocol's name is the `mislabeled` flaw.
}

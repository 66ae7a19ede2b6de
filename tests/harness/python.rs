//! The real OpenStack Python clients from PyPI (python-cinderclient,
//! python-brick-cinderclient-ext), installed by `.ci/setup` in a virtualenv under `target/venv`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// The virtualenv: `BERTH_TEST_VENV`, else `target/venv`.
pub fn venv() -> PathBuf {
    std::env::var_os("BERTH_TEST_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(berth::shipped::BUILD_DIR).join("../venv"))
}

/// The `cinder` command, configured for noauth against `endpoint` (`http://host:port`).
pub fn cinder(endpoint: &str, project: &str, version: &str) -> Command {
    let bin = venv().join("bin/cinder");
    assert!(
        bin.exists(),
        "{} is missing: run .ci/setup (it installs python-cinderclient from PyPI into target/venv)",
        bin.display()
    );
    let mut c = Command::new(bin);
    c.env("OS_AUTH_TYPE", "noauth")
        .env("CINDER_ENDPOINT", format!("{endpoint}/v3"))
        .env("OS_PROJECT_ID", project)
        .env("OS_USER_ID", "compat-user")
        .env("OS_VOLUME_API_VERSION", version)
        .env("PYTHONWARNINGS", "ignore");
    c
}

/// Runs a command; panics with its output unless it succeeds; returns stdout.
pub fn run(mut c: Command) -> String {
    let out = c.output().expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{:?} failed with {}:\nstdout:\n{stdout}\nstderr:\n{}",
        c,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The `| key | value |` rows of the first table cinderclient printed.
pub fn table(output: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    let mut tables = 0;
    for line in output.lines() {
        if line.starts_with("+-") {
            tables += 1;
            if tables > 3 {
                break;
            }
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() == 2 && cells[0] != "Property" {
            rows.insert(cells[0].to_string(), cells[1].to_string());
        }
    }
    rows
}

/// The data rows of a list table, each a vector of cells.
pub fn list(output: &str) -> Vec<Vec<String>> {
    output
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect()
}

/// Runs a Python script with the virtualenv's interpreter (the clients importable) and `args`.
pub fn python(script: &str, args: &[&str]) -> Command {
    let bin = venv().join("bin/python");
    assert!(bin.exists(), "{} is missing: run .ci/setup", bin.display());
    let mut c = Command::new(bin);
    c.arg("-c").arg(script).args(args).env("PYTHONWARNINGS", "ignore");
    c
}

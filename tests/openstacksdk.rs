//! openstacksdk (PyPI) against a running `berth serve`: its block-storage proxy creates a volume,
//! then creates an attachment with a connector, gets it, lists it, completes it and deletes it,
//! unchanged, reads the project's quotas, and disables and enables the backend, whose pool goes
//! and comes back (`tests/python/openstacksdk_attachments.py`).

use berth_tests::process::BerthProcess;
use berth_tests::python::{run, venv};

const CONFIG: &str = berth_tests::process::FAKE_BACKEND;

#[test]
fn openstacksdk_walks_the_attachment_lifecycle_unchanged() {
    let server = BerthProcess::start(CONFIG);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/openstacksdk_attachments.py");
    let mut c = std::process::Command::new(venv().join("bin/python"));
    c.arg(script).arg(&server.base).env("PYTHONWARNINGS", "ignore");
    let out = run(c);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("created ") && lines[0].contains(" attaching "), "{out}");
    assert!(lines[0].contains("access_mode"), "the connection info came back: {out}");
    assert!(lines[1].starts_with("got ") && lines[1].ends_with(" attaching True"), "{out}");
    let id = lines[0].split_whitespace().nth(1).unwrap();
    assert_eq!(lines[2], format!("listed ['{id}']"), "{out}");
    assert_eq!(lines[3], "completed attached in-use", "{out}");
    assert_eq!(lines[4], "deleted available []", "{out}");
    assert_eq!(lines[5], "updated sdk-renamed True", "{out}");
    assert_eq!(lines[6], "quotas -1 0 1 1", "no quota, and what the project uses: {out}");
    assert_eq!(lines[7], "snapshots and backups [] []", "none can be made here: {out}");
    assert_eq!(lines[8], "groups [] [] []", "nor groups: {out}");
    assert_eq!(lines[9], "disabled [('disabled', 'sdk drain')] []", "a drained backend is no pool: {out}");
    assert_eq!(lines[10], "enabled ['enabled'] [True]", "{out}");
}

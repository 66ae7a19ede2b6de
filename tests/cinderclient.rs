//! The real python-cinderclient (PyPI) against a running `berth serve` in noauth mode: it creates
//! a volume and runs every attachment command, and we check what it prints.

use berth_tests::process::BerthProcess;
use berth_tests::python::{cinder, list, run, table};

const CONFIG: &str = r#"
[[backends]]
name = "fake"
driver = "fake"
[[volume_types]]
name = "__DEFAULT__"
backend = "fake"
"#;

#[test]
fn python_cinderclient_runs_every_attachment_command() {
    let server = BerthProcess::start(CONFIG);
    let cli = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.54");
        c.args(args);
        run(c)
    };

    let created = table(&cli(&["create", "--name", "compat-vol", "1"]));
    let volume = created["id"].clone();
    assert_eq!(created["status"], "available");
    assert_eq!(created["name"], "compat-vol");

    // attachment-create without --connect: a reservation.
    let reserved = table(&cli(&["attachment-create", &volume]));
    assert_eq!(reserved["status"], "reserved");
    assert_eq!(reserved["attach_mode"], "null");
    assert_eq!(reserved["volume_id"], volume);
    let reserved_id = reserved["id"].clone();
    cli(&["attachment-delete", &reserved_id]);

    // attachment-create --connect: connected at once; the connection info is printed too.
    let out = cli(&[
        "attachment-create",
        "--connect",
        "True",
        "--initiator",
        "iqn.1993-08.org.debian:01:compat",
        "--ip",
        "127.0.0.1",
        "--host",
        "compat-host",
        "--mode",
        "rw",
        &volume,
    ]);
    let attachment = table(&out);
    assert_eq!(attachment["status"], "attaching");
    assert_eq!(attachment["attach_mode"], "rw");
    let id = attachment["id"].clone();
    assert!(out.contains("| driver_volume_type | iscsi"), "{out}");
    assert!(out.contains(&format!("iqn.2010-10.org.openstack:volume-{volume}")), "{out}");

    let shown = cli(&["attachment-show", &id]);
    let rows = table(&shown);
    assert_eq!(rows["status"], "attaching");
    assert_eq!(rows["shared_connections_by_attachment"], "[]");
    assert!(shown.contains("| auth_method        | CHAP"), "{shown}");

    let listed = list(&cli(&["attachment-list", "--volume-id", &volume]));
    assert_eq!(listed, vec![vec![id.clone(), volume.clone(), "attaching".into(), "-".into()]]);

    let updated = cli(&[
        "attachment-update",
        "--initiator",
        "iqn.1993-08.org.debian:01:compat",
        "--host",
        "compat-host",
        &id,
    ]);
    assert_eq!(table(&updated)["status"], "attaching");

    cli(&["attachment-complete", &id]);
    let listed = list(&cli(&["attachment-list"]));
    assert_eq!(listed[0][2], "attached");
    assert_eq!(table(&cli(&["show", &volume]))["status"], "in-use");

    cli(&["attachment-delete", &id]);
    assert!(list(&cli(&["attachment-list"])).is_empty());
    assert_eq!(table(&cli(&["show", &volume]))["status"], "available");
}

//! The real python-cinderclient (PyPI) against a running `berth serve` in noauth mode: it creates
//! a volume and runs every attachment command, and we check what it prints; the library makes
//! every legacy volume action call.

use berth_tests::process::BerthProcess;
use berth_tests::python::{cinder, list, python, run, table};

const CONFIG: &str = berth_tests::process::FAKE_BACKEND;

#[test]
fn python_cinderclient_runs_every_attachment_command() {
    // And a second volume type of the one backend, to retype to.
    let server =
        BerthProcess::start(&format!("{CONFIG}[[volume_types]]\nname = \"gold\"\nbackend = \"fake\"\n"));
    let cli = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.54");
        c.args(args);
        run(c)
    };

    let created = table(&cli(&["create", "--name", "compat-vol", "1"]));
    let volume = created["id"].clone();
    assert_eq!(created["status"], "available");
    assert_eq!(created["name"], "compat-vol");

    // The volume commands around attaching: rename (`PUT /volumes/{id}`), metadata, zones.
    cli(&["rename", &volume, "compat-renamed", "--description", "renamed by cinderclient"]);
    cli(&["metadata", &volume, "set", "purpose=compat"]);
    let shown = table(&cli(&["show", &volume]));
    assert_eq!(
        (shown["name"].as_str(), shown["description"].as_str()),
        ("compat-renamed", "renamed by cinderclient")
    );
    assert!(shown["metadata"].contains("purpose"), "{shown:?}");
    let tagged = list(&cli(&["list", "--metadata", "purpose=compat"]));
    assert_eq!(tagged.len(), 1, "{tagged:?}");
    assert!(list(&cli(&["list", "--metadata", "purpose=other"])).is_empty());
    let theirs = list(&cli(&["list", "--all-tenants", "--tenant", "compat"]));
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert!(list(&cli(&["list", "--all-tenants", "--tenant", "nobody"])).is_empty());
    let sorted = list(&cli(&["list", "--sort", "name:asc"]));
    assert_eq!(sorted[0][2], "compat-renamed", "{sorted:?}");
    cli(&["set-bootable", &volume, "true"]);
    assert_eq!(table(&cli(&["show", &volume]))["bootable"], "true");
    // Its image properties, which Nova reads of a volume it boots from.
    cli(&["image-metadata", &volume, "set", "hw_disk_bus=scsi", "hw_scsi_model=virtio-scsi"]);
    cli(&["image-metadata", &volume, "unset", "hw_scsi_model"]);
    let properties = table(&cli(&["image-metadata-show", &volume]));
    assert_eq!(properties.get("hw_disk_bus").map(String::as_str), Some("scsi"), "{properties:?}");
    assert!(!properties.contains_key("hw_scsi_model"), "{properties:?}");
    assert!(table(&cli(&["show", &volume]))["volume_image_metadata"].contains("hw_disk_bus"));
    let summary = cli(&["summary"]);
    assert!(summary.contains("total_count") && summary.contains("purpose"), "{summary}");
    let limits = cli(&["absolute-limits"]);
    assert!(limits.contains("| totalVolumesUsed         | 1 "), "{limits}");
    assert!(list(&cli(&["cluster-list"])).is_empty(), "one node: no shared backend, no cluster");
    let filters = cli(&["list-filters", "--resource", "volume"]);
    assert!(filters.contains("volume") && filters.contains("metadata"), "{filters}");
    assert!(list(&cli(&["encryption-type-list"])).is_empty(), "no type is encrypted");
    let specs = cli(&["extra-specs-list"]);
    assert!(specs.contains("gold") && specs.contains("{}"), "{specs}");
    let zones = cli(&["availability-zone-list"]);
    assert!(zones.contains("| nova | available |"), "{zones}");
    // No snapshot or backup can be made here: their lists are empty, and a request to make one
    // is refused with the reason.
    assert!(list(&cli(&["snapshot-list"])).is_empty());
    assert!(list(&cli(&["backup-list"])).is_empty());
    let mut snapshot = cinder(&server.base, "compat", "3.54");
    snapshot.args(["snapshot-create", "--force", "True", &volume]);
    let out = snapshot.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("takes no snapshots") && said.contains("HTTP 400"),
        "{said}"
    );
    // Nor any group: their lists are empty too.
    assert!(list(&cli(&["group-list"])).is_empty());
    assert!(list(&cli(&["group-snapshot-list"])).is_empty());
    assert!(list(&cli(&["group-type-list"])).is_empty());
    let mut group = cinder(&server.base, "compat", "3.54");
    group.args(["group-create", "--name", "g", "some-group-type", "gold"]);
    let out = group.output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("makes no groups") && said.contains("HTTP 400"), "{said}");
    let extensions = cli(&["list-extensions"]);
    assert!(
        extensions.contains("| AvailabilityZones ") && extensions.contains("| VolumeTransfer "),
        "{extensions}"
    );
    assert!(!extensions.contains("| Backups "), "{extensions}");
    // Quotas: none set (`python_cinderclient_sets_quotas_and_a_create_past_them_is_refused` sets
    // them), and what the project uses.
    let quotas = table(&cli(&["quota-show", "compat"]));
    assert_eq!((quotas["volumes"].as_str(), quotas["snapshots"].as_str()), ("-1", "0"), "{quotas:?}");
    let usage = cli(&["quota-usage", "compat"]);
    assert!(usage.lines().any(|l| l.replace(' ', "") == "|gigabytes|1|0|-1||"), "{usage}");
    assert_eq!(table(&cli(&["quota-defaults", "compat"]))["gigabytes"], "-1");
    assert_eq!(table(&cli(&["quota-update", "--volumes", "-1", "compat"]))["volumes"], "-1");
    assert_eq!(table(&cli(&["quota-class-show", "default"]))["gigabytes"], "-1");
    assert_eq!(table(&cli(&["quota-update", "--volumes", "10", "compat"]))["volumes"], "10");
    cli(&["quota-delete", "compat"]);
    assert_eq!(table(&cli(&["quota-show", "compat"]))["volumes"], "-1");

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

    // An admin's force-delete (the `os-force_delete` action).
    cli(&["force-delete", &volume]);
    assert!(list(&cli(&["list"])).is_empty());

    // A transfer to another project: offered with a key, taken over by who presents it.
    let gift = table(&cli(&["create", "--name", "gift", "1"]))["id"].clone();
    let offered = table(&cli(&["transfer-create", "--name", "to-other", &gift]));
    assert_eq!(offered["volume_id"], gift);
    assert_eq!(list(&cli(&["transfer-list"])).len(), 1);
    let mut other = cinder(&server.base, "other", "3.54");
    other.args(["transfer-accept", &offered["id"], &offered["auth_key"]]);
    assert_eq!(table(&run(other))["volume_id"], gift);
    assert!(list(&cli(&["transfer-list"])).is_empty());
    let mut theirs = cinder(&server.base, "other", "3.54");
    theirs.args(["show", &gift]);
    assert_eq!(table(&run(theirs))["os-vol-tenant-attr:tenant_id"], "other");

    // Retype (`os-retype`) to another type of its backend, then unmanage (`os-unmanage`): the
    // volume leaves Berth's lists.
    let kept = table(&cli(&["create", "--name", "kept", "1"]))["id"].clone();
    cli(&["retype", &kept, "gold"]);
    assert_eq!(table(&cli(&["show", &kept]))["volume_type"], "gold");
    cli(&["unmanage", &kept]);
    assert!(list(&cli(&["list"])).is_empty());

    // A project's default type (3.62): its volumes made without a type get it.
    let at_3_62 = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.62");
        c.args(args);
        run(c)
    };
    at_3_62(&["default-type-set", "gold", "compat"]);
    let defaults = list(&at_3_62(&["default-type-list"]));
    assert!(defaults.len() == 1 && defaults[0].contains(&"compat".to_string()), "{defaults:?}");
    let golden = table(&cli(&["create", "1"]));
    assert_eq!(golden["volume_type"], "gold");
    at_3_62(&["default-type-unset", "compat"]);
    assert!(list(&at_3_62(&["default-type-list"])).is_empty());
    cli(&["delete", &golden["id"]]);

    // Draining the backend: `service-disable` with a reason, then `service-enable`.
    let services = list(&cli(&["service-list", "--binary", "cinder-volume"]));
    assert_eq!(services.len(), 1, "{services:?}");
    let host = services[0][1].clone();
    assert!(host.ends_with("@fake"), "{services:?}");
    let capabilities = table(&cli(&["get-capabilities", &host]));
    assert_eq!(
        (capabilities["volume_backend_name"].as_str(), capabilities["storage_protocol"].as_str()),
        ("fake", "iSCSI")
    );
    let pools = cli(&["get-pools", "--detail"]);
    assert!(pools.contains(&format!("{host}#fake")) && pools.contains("allocated_capacity_gb"), "{pools}");
    cli(&["service-disable", &host, "cinder-volume", "--reason", "array maintenance"]);
    assert!(!cli(&["get-pools"]).contains(&host), "a disabled backend is no pool");
    let listed = list(&cli(&["service-list", "--host", &host]));
    assert!(
        listed.len() == 1
            && listed[0].iter().any(|c| c == "disabled")
            && listed[0].iter().any(|c| c == "array maintenance"),
        "{listed:?}"
    );
    let mut refused = cinder(&server.base, "compat", "3.54");
    refused.args(["create", "1"]);
    let out = refused.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("takes no new volumes"), "{stderr}");
    assert!(list(&cli(&["list"])).is_empty(), "the refused create left nothing");
    cli(&["service-enable", &host, "cinder-volume"]);
    let listed = list(&cli(&["service-list", "--host", &host]));
    assert!(listed[0].iter().any(|c| c == "enabled"), "{listed:?}");
    let made = table(&cli(&["create", "1"]))["id"].clone();
    cli(&["delete", &made]);
}

/// The library's legacy calls, through a noauth session, exactly as an orchestrator makes them.
const LEGACY: &str = r#"
import json, sys
from keystoneauth1 import session
from cinderclient import client
from cinderclient.contrib import noauth

endpoint, project = sys.argv[1], sys.argv[2]
auth = noauth.CinderNoAuthPlugin("compat-user", project, endpoint=endpoint + "/v3")
c = client.Client("3.0", session=session.Session(auth=auth))
status = lambda v: c.volumes.get(v.id).status
seen = {}
connector = {"initiator": "iqn.1993-08.org.debian:01:legacy", "host": "legacy-host", "ip": "127.0.0.1",
             "platform": "x86_64", "os_type": "linux", "multipath": False}

v = c.volumes.create(1, name="legacy")
c.volumes.reserve(v); seen["reserve"] = status(v)
c.volumes.unreserve(v); seen["unreserve"] = status(v)
c.volumes.reserve(v)
info = c.volumes.initialize_connection(v, connector); seen["initialize_connection"] = status(v)
seen["connection_info"] = info
c.volumes.attach(v, "5f1a7b52-8d2c-4f63-9a0e-3b7c1d2e4f60", "/dev/vdb", mode="rw", host_name="legacy-host")
seen["attach"] = status(v)
seen["attachments"] = c.volumes.get(v.id).attachments
c.volumes.begin_detaching(v); seen["begin_detaching"] = status(v)
c.volumes.roll_detaching(v); seen["roll_detaching"] = status(v)
c.volumes.begin_detaching(v)
c.volumes.terminate_connection(v, connector); seen["terminate_connection"] = status(v)
c.volumes.detach(v, seen["attachments"][0]["attachment_id"]); seen["detach"] = status(v)
seen["attachments_after"] = c.volumes.get(v.id).attachments
print(json.dumps(seen))
"#;

#[test]
fn python_cinderclient_legacy_calls_succeed() {
    let server = BerthProcess::start(CONFIG);
    let out = run(python(LEGACY, &[&server.base, "legacy"]));
    let seen: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {out}"));
    for (call, status) in [
        ("reserve", "attaching"),
        ("unreserve", "available"),
        ("initialize_connection", "attaching"),
        ("attach", "in-use"),
        ("begin_detaching", "detaching"),
        ("roll_detaching", "in-use"),
        ("terminate_connection", "detaching"),
        ("detach", "available"),
    ] {
        assert_eq!(seen[call], status, "after {call}: {seen}");
    }
    let info = &seen["connection_info"];
    assert_eq!(info["driver_volume_type"], "iscsi", "{info}");
    assert_eq!(info["data"]["target_lun"], 1, "{info}");
    assert_eq!(info["data"]["auth_method"], "CHAP", "{info}");
    let attachment = &seen["attachments"][0];
    assert_eq!(attachment["server_id"], "5f1a7b52-8d2c-4f63-9a0e-3b7c1d2e4f60");
    assert_eq!(attachment["device"], "/dev/vdb");
    assert_eq!(seen["attachments_after"], serde_json::json!([]));
}

/// `message-list`, `message-show` and `message-delete` (3.3): a create whose driver failed left
/// a message, in Cinder's words, that the real client lists, filters, shows and deletes.
#[test]
fn python_cinderclient_reads_and_deletes_the_message_a_failed_create_left() {
    let server = BerthProcess::start(CONFIG);
    let cli = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.71");
        c.args(args);
        run(c)
    };
    let mut failing = cinder(&server.base, "compat", "3.71");
    failing.args(["create", "1", "--metadata", "fake.create-volume=backend:the array is on fire"]);
    assert!(!failing.output().unwrap().status.success());
    let volume = list(&cli(&["list"]))[0][0].clone();
    let listed = list(&cli(&["message-list"]));
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0][1..],
        [
            "VOLUME".to_string(),
            volume.clone(),
            "VOLUME_VOLUME_008_012".to_string(),
            "create volume from backend storage:Driver failed to create the volume.".to_string()
        ]
    );
    assert_eq!(list(&cli(&["message-list", "--resource_uuid", &volume, "--level", "error"])).len(), 1);
    assert!(list(&cli(&["message-list", "--event_id", "VOLUME_VOLUME_007_010"])).is_empty());
    let id = listed[0][0].clone();
    let shown = table(&cli(&["message-show", &id]));
    assert_eq!(
        (shown["message_level"].as_str(), shown["resource_uuid"].as_str()),
        ("ERROR", volume.as_str())
    );
    assert!(shown["request_id"].starts_with("req-"), "{shown:?}");
    cli(&["message-delete", &id]);
    assert!(list(&cli(&["message-list"])).is_empty());
}

/// `quota-update`, `quota-show`, `quota-usage`, `quota-defaults`, `quota-class-update`,
/// `quota-delete` and `absolute-limits`: the quotas an admin sets with the real client hold, and
/// a create past them is refused with Cinder's 413 and message, as the client prints it.
#[test]
fn python_cinderclient_sets_quotas_and_a_create_past_them_is_refused() {
    let server =
        BerthProcess::start(&format!("{CONFIG}\n[[volume_types]]\nname = \"fast\"\nbackend = \"fake\"\n"));
    let cli = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.71");
        c.args(args);
        run(c)
    };
    let refused = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.71");
        c.args(args);
        let out = c.output().unwrap();
        assert!(!out.status.success(), "{args:?} passed");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let set = table(&cli(&["quota-update", "--volumes", "2", "--gigabytes", "5", "compat"]));
    assert_eq!((set["volumes"].as_str(), set["gigabytes"].as_str()), ("2", "5"));
    cli(&["quota-update", "--volume-type", "fast", "--gigabytes", "0", "compat"]);
    let shown = table(&cli(&["quota-show", "compat"]));
    assert_eq!((shown["volumes"].as_str(), shown["gigabytes_fast"].as_str()), ("2", "0"));

    assert_eq!(table(&cli(&["create", "2"]))["status"], "available");
    let message = refused(&["create", "1", "--volume-type", "fast"]);
    assert!(
        message.contains(
            "Requested volume or snapshot exceeds allowed gigabytes_fast quota. Requested 1G, quota is 0G and 0G \
             has been consumed. (HTTP 413)"
        ),
        "{message}"
    );
    let message = refused(&["create", "4"]);
    assert!(message.contains("Requested 4G, quota is 5G and 2G has been consumed. (HTTP 413)"), "{message}");
    assert_eq!(table(&cli(&["create", "1"]))["status"], "available");
    let message = refused(&["create", "1"]);
    assert!(
        message.contains("Maximum number of volumes allowed (2) exceeded for quota 'volumes'. (HTTP 413)"),
        "{message}"
    );
    let usage = list(&cli(&["quota-usage", "compat"]));
    let volumes = usage.iter().find(|row| row[0] == "volumes").unwrap();
    assert_eq!(volumes[1..4], ["2".to_string(), "0".to_string(), "2".to_string()], "in use, reserved, limit");
    let limits = list(&cli(&["absolute-limits"]));
    let max = limits.iter().find(|row| row[0] == "maxTotalVolumes").unwrap();
    assert_eq!(max[1], "2");

    // Back to the defaults, which the default class now sets for every project.
    cli(&["quota-class-update", "default", "--volumes", "3"]);
    cli(&["quota-delete", "compat"]);
    assert_eq!(table(&cli(&["quota-defaults", "compat"]))["volumes"], "3");
    assert_eq!(table(&cli(&["create", "1", "--volume-type", "fast"]))["status"], "available");
    let message = refused(&["create", "1"]);
    assert!(message.contains("Maximum number of volumes allowed (3) exceeded"), "{message}");
    let lower = refused(&["quota-update", "--volumes", "1", "compat"]);
    assert!(lower.contains("Current usage is 3 and the requested limit is 1. (HTTP 400)"), "{lower}");
}

/// `qos-list`, `qos-show` and `qos-get-association`: the configured QoS specs and the type they
/// are associated with, as the real client prints them; the library's `initialize_connection` of
/// a volume of that type gets the specs, scaled by its size, in `qos_specs`.
#[test]
fn python_cinderclient_lists_the_qos_specs_and_a_connection_carries_them() {
    let server = BerthProcess::start(&format!(
        "{CONFIG}[[volume_types]]\nname = \"gold\"\nbackend = \"fake\"\nqos_specs = \"gold\"\n\
         [[qos_specs]]\nname = \"gold\"\nconsumer = \"front-end\"\n\
         specs = {{ total_iops_sec_per_gb = \"30\", read_bytes_sec = \"1048576\" }}\n"
    ));
    let cli = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.71");
        c.args(args);
        run(c)
    };
    let listed = list(&cli(&["qos-list"]));
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0][1].as_str(), listed[0][2].as_str()), ("gold", "front-end"), "{listed:?}");
    assert!(listed[0][3].contains("total_iops_sec_per_gb"), "{listed:?}");
    let id = listed[0][0].clone();
    let shown = table(&cli(&["qos-show", &id]));
    assert_eq!((shown["name"].as_str(), shown["consumer"].as_str()), ("gold", "front-end"), "{shown:?}");
    let associated = list(&cli(&["qos-get-association", &id]));
    assert_eq!(associated.len(), 1, "{associated:?}");
    assert_eq!((associated[0][0].as_str(), associated[0][1].as_str()), ("volume_type", "gold"));

    let volume = table(&cli(&["create", "--volume-type", "gold", "4"]))["id"].clone();
    let out = run(python(CONNECT, &[&server.base, "compat", &volume]));
    let info: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        info["data"]["qos_specs"],
        serde_json::json!({"total_iops_sec": 120, "read_bytes_sec": "1048576"}),
        "{info}"
    );
}

/// The library's `reserve` and `initialize_connection` of one volume; prints the connection.
const CONNECT: &str = r#"
import json, sys
from keystoneauth1 import session
from cinderclient import client
from cinderclient.contrib import noauth

endpoint, project, volume = sys.argv[1], sys.argv[2], sys.argv[3]
auth = noauth.CinderNoAuthPlugin("compat-user", project, endpoint=endpoint + "/v3")
c = client.Client("3.0", session=session.Session(auth=auth))
c.volumes.reserve(volume)
connector = {"initiator": "iqn.1993-08.org.debian:01:qos", "host": "qos-host", "ip": "127.0.0.1",
             "multipath": False, "platform": "x86_64", "os_type": "linux"}
print(json.dumps(c.volumes.initialize_connection(volume, connector)))
"#;

/// A shared backend is a cluster (`berth@backend`): `cluster-disable` stops new volumes on it
/// (and its service's backend state is no longer `up`), `cluster-enable` ends that, as the real
/// client sends them.
#[test]
fn python_cinderclient_disables_and_enables_a_cluster() {
    let server =
        BerthProcess::start(&CONFIG.replacen("driver = \"fake\"\n", "driver = \"fake\"\nshared = true\n", 1));
    let cli = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.71");
        c.args(args);
        run(c)
    };
    let clusters = list(&cli(&["cluster-list"]));
    assert!(clusters.len() == 1 && clusters[0][0] == "berth@fake", "{clusters:?}");
    // The backend's state (3.49): up while it takes new volumes.
    let backend_state = || {
        let listed = cli(&["service-list", "--binary", "cinder-volume"]);
        assert!(listed.contains("Backend State"), "{listed}");
        list(&listed)[0].last().cloned().unwrap_or_default()
    };
    assert_eq!(backend_state(), "up");
    cli(&["cluster-disable", "berth@fake", "--reason", "array swap"]);
    assert_ne!(backend_state(), "up", "a disabled cluster's backend is no pool");
    let shown = table(&cli(&["cluster-show", "berth@fake"]));
    assert_eq!((shown["status"].as_str(), shown["disabled_reason"].as_str()), ("disabled", "array swap"));
    let mut refused = cinder(&server.base, "compat", "3.71");
    refused.args(["create", "1"]);
    let out = refused.output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("takes no new volumes"));
    cli(&["cluster-enable", "berth@fake"]);
    assert_eq!(table(&cli(&["create", "1"]))["status"], "available");
}

/// `service-set-log` and `service-get-log` (3.32): an admin turns Berth's debug log on and off
/// while it serves, as with Cinder's services; the debug log holds no secret either.
#[test]
fn python_cinderclient_sets_log_levels_while_serving_and_the_debug_log_holds_no_secret() {
    // The service's own default (the harness starts servers at debug).
    let server = BerthProcess::start_with_env("", CONFIG, &[("BERTH_LOG", "info,sqlx=warn")]);
    let cli = |args: &[&str]| {
        let mut c = cinder(&server.base, "compat", "3.71");
        c.args(args);
        run(c)
    };
    let levels = list(&cli(&["service-get-log"]));
    assert!(levels.iter().any(|r| r[2] == "sqlx" && r[3] == "WARNING"), "{levels:?}");
    let debug_lines = || server.log_text().lines().filter(|l| l.contains(" DEBUG ")).count();
    assert_eq!(debug_lines(), 0, "no debug log by default");

    // Every target at debug (the default, sqlx, Berth), as an admin hunting a problem would.
    cli(&["service-set-log", "DEBUG"]);
    cli(&["service-set-log", "--prefix", "sqlx", "DEBUG"]);
    cli(&["service-set-log", "--prefix", "berth", "DEBUG"]);
    let levels = list(&cli(&["service-get-log", "--prefix", "berth"]));
    assert_eq!(
        levels.iter().map(|r| (r[2].as_str(), r[3].as_str())).collect::<Vec<_>>(),
        [("berth", "DEBUG")]
    );
    let volume = table(&cli(&["create", "1"]))["id"].clone();
    let out = cli(&[
        "attachment-create",
        "--connect",
        "True",
        "--initiator",
        "iqn.1993-08.org.debian:01:debug",
        "--ip",
        "127.0.0.1",
        "--host",
        "debug-host",
        &volume,
    ]);
    let password = out
        .lines()
        .find_map(|l| {
            l.split_once("| auth_password").map(|(_, rest)| rest.trim_matches(|c| c == '|' || c == ' '))
        })
        .unwrap_or_default()
        .to_string();
    assert!(password.len() >= 12, "the connection's CHAP password: {out}");
    let log = server.log_text();
    assert!(debug_lines() > 0, "debug lines once set: {log}");
    assert!(!log.contains(&password), "the CHAP password in the debug log");

    cli(&["service-set-log", "INFO"]);
    cli(&["service-set-log", "--prefix", "sqlx", "WARNING"]);
    cli(&["service-set-log", "--prefix", "berth", "INFO"]);
    let before = debug_lines();
    cli(&["list"]);
    assert_eq!(debug_lines(), before, "no debug line once set back");
    let mut refused = cinder(&server.base, "compat", "3.71");
    refused.args(["service-set-log", "--prefix", "berth,sqlx=trace", "DEBUG"]);
    let out = refused.output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not a module path"));
}

/// `[http] tls_cert_file` and `tls_key_file`: the API over HTTPS. python-cinderclient and the
/// `berth` client verify it with the CA named by `OS_CACERT`, and refuse it without; links say
/// `https://`; plain HTTP gets no answer; a key others can read stops the start.
#[test]
fn python_cinderclient_and_the_berth_client_reach_the_api_over_tls() {
    use std::os::unix::fs::PermissionsExt;
    let certs = tempfile::tempdir().unwrap();
    let files = berth_tests::https::TestCa::new().server_files(certs.path());
    let ca_file = files.ca.clone();
    let http = files.http_table();
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused =
        BerthProcess::try_start(&http, CONFIG, &[]).err().expect("a key others can read is refused");
    assert!(refused.contains("server.key is readable by others (mode 644); chmod 600 it"), "{refused}");
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let server = BerthProcess::start_full(&http, CONFIG);
    let base = format!("https://localhost:{}", server.port);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let ca_cert = reqwest::Certificate::from_pem(&std::fs::read(&ca_file).unwrap()).unwrap();
        let trusting = reqwest::Client::builder().add_root_certificate(ca_cert).build().unwrap();
        let versions = trusting.get(format!("{base}/")).send().await.unwrap();
        assert_eq!(versions.status(), 300);
        let versions: serde_json::Value = versions.json().await.unwrap();
        let links = versions["versions"][0]["links"].as_array().unwrap();
        let href = links.iter().find(|l| l["rel"] == "self").unwrap()["href"].as_str().unwrap().to_string();
        assert!(href.starts_with(&format!("{base}/v3")), "{href}");
        let plain = reqwest::get(format!("http://127.0.0.1:{}/", server.port)).await;
        assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
        let untrusting = reqwest::get(format!("{base}/")).await;
        assert!(untrusting.is_err(), "a client without the CA reached it: {untrusting:?}");
    });

    let cli = |args: &[&str], with_ca: bool| {
        let mut c = cinder(&base, "tls", "3.54");
        if with_ca {
            c.env("OS_CACERT", &ca_file);
        }
        c.args(args);
        c
    };
    let created = table(&run(cli(&["create", "--name", "over-tls", "1"], true)));
    assert_eq!(created["status"], "available");
    let listed = list(&run(cli(&["list"], true)));
    assert_eq!(listed.len(), 1, "{listed:?}");
    let refused = cli(&["list"], false).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("CERTIFICATE_VERIFY_FAILED"), "{refused:?}");

    let berth = |with_ca: bool| {
        let mut c = std::process::Command::new(berth_tests::process::berth_binary());
        c.args(["driver", "list"])
            .env("OS_AUTH_TYPE", "noauth")
            .env("CINDER_ENDPOINT", format!("{base}/v3"))
            .env("OS_PROJECT_ID", "tls")
            .env("OS_USER_ID", "admin");
        if with_ca {
            c.env("OS_CACERT", &ca_file);
        }
        c.output().unwrap()
    };
    let listed = berth(true);
    assert!(listed.status.success(), "{listed:?}");
    assert!(String::from_utf8_lossy(&listed.stdout).contains("fake"), "{listed:?}");
    assert!(!berth(false).status.success(), "the berth client reached it without the CA");
}

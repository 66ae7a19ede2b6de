//! `berth get-connector`, `local-attach` and `local-detach` against a running `berth serve` with
//! the tgt-iscsi driver and a real tgtd. The kernel initiator is replaced by a recording
//! `iscsiadm` stand-in; what it was told is checked for real with libiscsi: the CHAP credentials
//! the CLI gave the node log in while the volume is attached, and no longer after it is detached.
//! The CLI authenticates with noauth, or with a Keystone password (a real Keystone from PyPI),
//! finding Berth in Keystone's catalog.

use std::path::Path;
use std::process::{Command, Output};

use berth_tests::initiator::StandIns;
use berth_tests::iscsi::{Session, Target};
use berth_tests::keystone::keystone;
use berth_tests::process::berth_binary;
use berth_tests::server::{Client, connector};
use berth_tests::tgt::Rig;
use serde_json::{Value, json};

const INITIATOR: &str = "iqn.1993-08.org.debian:01:cli-host";

struct Cli<'a> {
    rig: &'a Rig,
    tools: StandIns,
    initiator_file: tempfile::NamedTempFile,
    /// Keystone password authentication's environment (`OS_AUTH_URL`, ...) instead of noauth.
    keystone: Option<Vec<(&'static str, String)>>,
}

impl<'a> Cli<'a> {
    fn new(rig: &'a Rig) -> Cli<'a> {
        let initiator_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(initiator_file.path(), format!("## open-iscsi\nInitiatorName={INITIATOR}\n")).unwrap();
        Cli { rig, tools: StandIns::for_berth(), initiator_file, keystone: None }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(berth_binary());
        c.args(args).env("PATH", self.tools.path()).env_remove("OS_TOKEN").env_remove("OS_ENDPOINT");
        match &self.keystone {
            None => {
                c.env("CINDER_ENDPOINT", self.rig.endpoint())
                    .env("OS_AUTH_TYPE", "noauth")
                    .env("OS_PROJECT_ID", "e2e")
                    .env("OS_USER_ID", "cli");
            }
            Some(env) => {
                c.envs(env.iter().map(|(k, v)| (k, v)))
                    .env_remove("CINDER_ENDPOINT")
                    .env_remove("OS_AUTH_TYPE")
                    .env_remove("OS_PROJECT_ID")
                    .env_remove("OS_USER_ID");
            }
        }
        c
    }

    fn attach_command(&self, volume: &str, extra: &[&str]) -> Command {
        let mut c = self.command(&["local-attach", volume]);
        c.arg("--initiator-name-file").arg(self.initiator_file.path());
        c.arg("--device-dir").arg(&self.tools.devices);
        c.args(extra);
        c
    }

    fn attach(&self, volume: &str, extra: &[&str]) -> Output {
        self.attach_command(volume, extra).output().unwrap()
    }

    fn detach(&self, volume: &str, extra: &[&str]) -> Output {
        let mut c = self.command(&["local-detach", volume]);
        c.arg("--device-dir").arg(&self.tools.devices);
        c.args(extra);
        c.output().unwrap()
    }

    /// The target and CHAP credentials the CLI gave the node, as the kernel would log in.
    fn node(&self, portal: &str, iqn: &str) -> Target {
        let chap = match (
            self.tools.setting("node.session.auth.username"),
            self.tools.setting("node.session.auth.password"),
        ) {
            (Some(u), Some(p)) => Some((u, p)),
            _ => None,
        };
        Target { portal: portal.into(), iqn: iqn.into(), lun: 1, chap }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "failed with {}:\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn failed(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("berth: ") && !stderr.contains("panicked"), "{stderr}");
    stderr
}

async fn attachments(rig: &Rig, volume: &str) -> Vec<Value> {
    let r = rig.client().get(&format!("/attachments/detail?volume_id={volume}")).await.expect(200);
    r.body["attachments"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_attach_connects_the_target_and_local_detach_disconnects_it() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let cli = Cli::new(&rig);

    let out = cli.attach(&volume, &["--mountpoint", "/mnt/data", "--hostname", "cli-host"]);
    let device = ok(&out).trim().to_string();
    let portal = format!("127.0.0.1:{}", rig.tgtd.portal_port);
    let iqn = format!("iqn.2010-10.org.openstack:tgt:volume-{volume}");
    assert_eq!(
        device,
        cli.tools.devices.join(format!("ip-{portal}-iscsi-{iqn}-lun-1")).display().to_string()
    );
    assert!(Path::new(&device).exists());

    // What the CLI asked of iscsiadm, in order: discovery, the node, its CHAP, login.
    let node = format!("-m node -T {iqn} -p {portal}");
    let target = cli.node(&portal, &iqn);
    let (user, secret) = target.chap.clone().expect("CHAP was configured on the node");
    assert_eq!(
        cli.tools.calls(),
        vec![
            format!("-m discovery -t sendtargets -p {portal}"),
            format!("{node} --interface default --op new"),
            format!("{node} --op update -n node.session.auth.authmethod -v CHAP"),
            format!("{node} --op update -n node.session.auth.username -v {user}"),
            format!("{node} --op update -n node.session.auth.password -v {secret}"),
            format!("{node} --login"),
            format!("{node} --op update -n node.startup -v automatic"),
        ]
    );
    // The kernel would log in with those: a real initiator does, and sees the volume.
    let session = Session::login(&target, INITIATOR).expect("the node's CHAP credentials log in");
    assert_eq!(session.capacity().unwrap().0 * 512, 1 << 30);
    drop(session);

    let listed = attachments(&rig, &volume).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["status"], "attached", "local-attach completes the attachment");
    assert_eq!(c.volume_status(&volume).await, "in-use");
    let shown = c.get(&format!("/volumes/{volume}")).await.expect(200);
    assert_eq!(shown.body["volume"]["attachments"][0]["host_name"], "cli-host");
    assert_eq!(shown.body["volume"]["attachments"][0]["device"], "/mnt/data");
    for output in [text(&out.stdout), text(&out.stderr), rig.berth.log_text()] {
        assert!(!output.contains(&secret), "the CHAP secret was printed or logged");
    }

    let before = cli.tools.calls().len();
    let out = cli.detach(&volume, &[]);
    assert!(ok(&out).contains(&volume));
    assert_eq!(cli.tools.calls()[before..], [format!("{node} --logout"), format!("{node} --op delete")]);
    assert!(!Path::new(&device).exists());
    assert!(attachments(&rig, &volume).await.is_empty());
    assert_eq!(c.volume_status(&volume).await, "available");
    assert!(Session::login(&target, INITIATOR).is_err(), "access ends with the detach");
    assert!(!rig.exported(&volume), "and the export is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_attach_authenticates_with_a_keystone_password_and_finds_berth_in_the_catalog() {
    let ks = keystone();
    let rig = Rig::start_with(&ks.berth_config(""));
    let region = ks.register(&rig.berth.base);
    let token = ks.token("alice", "demo").await;
    let c = Client::for_base(&rig.berth.base, ks.project("demo")).with_token(&token).at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let mut cli = Cli::new(&rig);
    cli.keystone = Some(ks.client_env("alice", "demo", &region));

    let out = cli.attach(&volume, &[]);
    let device = ok(&out).trim().to_string();
    assert!(Path::new(&device).exists(), "{device}");
    let portal = format!("127.0.0.1:{}", rig.tgtd.portal_port);
    let target = cli.node(&portal, &format!("iqn.2010-10.org.openstack:tgt:volume-{volume}"));
    let session = Session::login(&target, INITIATOR).expect("the node's CHAP credentials log in");
    drop(session);
    assert_eq!(c.volume_status(&volume).await, "in-use");
    let listed = c.get(&format!("/attachments/detail?volume_id={volume}")).await.expect(200);
    assert_eq!(listed.body["attachments"][0]["status"], "attached", "as alice, in alice's project");

    let out = cli.detach(&volume, &[]);
    assert!(ok(&out).contains(&volume));
    assert_eq!(c.volume_status(&volume).await, "available");
    assert!(Session::login(&target, INITIATOR).is_err(), "access ends with the detach");
    for output in [text(&out.stdout), text(&out.stderr), rig.berth.log_text()] {
        assert!(!output.contains(ks.password("alice")), "the password was printed or logged");
    }

    // A wrong password: Keystone's refusal, exit 8, nothing attached.
    let mut wrong = cli.keystone.clone().unwrap();
    wrong.retain(|(k, _)| *k != "OS_PASSWORD");
    wrong.push(("OS_PASSWORD", "not-alices".into()));
    cli.keystone = Some(wrong);
    let message = failed(&cli.attach(&volume, &[]), 8);
    assert!(message.contains("401"), "{message}");
    assert_eq!(c.volume_status(&volume).await, "available");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failed_step_is_undone_in_reverse_order() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let cli = Cli::new(&rig);
    let portal = format!("127.0.0.1:{}", rig.tgtd.portal_port);
    let node = format!("-m node -T iqn.2010-10.org.openstack:tgt:volume-{volume} -p {portal}");
    let delete = format!("{node} --op delete");
    let logout = format!("{node} --logout");

    // (the step that fails, what is undone after it)
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("-m discovery", vec![delete.clone()]),
        ("--op new", vec![delete.clone()]),
        ("node.session.auth.password", vec![delete.clone()]),
        ("--login", vec![logout.clone(), delete.clone()]),
        ("node.startup", vec![logout.clone(), delete.clone()]),
        ("(no device)", vec![logout.clone(), delete.clone()]),
    ];
    for (step, undone) in cases {
        let before = cli.tools.calls().len();
        let mut command = cli.attach_command(&volume, &["--timeout", "1"]);
        if step == "(no device)" {
            command.env("ISCSIADM_NO_DEVICE", "1");
        } else {
            command.env("ISCSIADM_FAIL", step);
        }
        let out = command.output().unwrap();
        let message = failed(&out, 7);
        if step == "node.session.auth.password" {
            assert!(message.contains("***"), "{message}");
        }
        let calls = cli.tools.calls()[before..].to_vec();
        let failing =
            calls.iter().position(|c| step == "(no device)" && c.ends_with("automatic") || c.contains(step));
        let failing = failing.unwrap_or_else(|| panic!("{step}: {calls:#?}"));
        assert_eq!(calls[failing + 1..], undone[..], "{step}: {calls:#?}");
        assert!(attachments(&rig, &volume).await.is_empty(), "{step}: the attachment is deleted");
        assert_eq!(c.volume_status(&volume).await, "available", "{step}");
        assert!(!rig.exported(&volume), "{step}: no export is left behind");
    }
    // The last step, completing the attachment, fails: here an admin force-detaches the volume
    // while the host logs in. Everything is undone; the attachment is gone already.
    let before = cli.tools.calls().len();
    let mut command = cli.attach_command(&volume, &[]);
    command.env(
        "ISCSIADM_ON_LOGIN",
        format!(
            "curl -sf -o /dev/null -X POST -H 'X-Auth-Token: admin:e2e' -H 'Content-Type: application/json' \
             -d '{{\"os-force_detach\": {{}}}}' {}/e2e/volumes/{volume}/action",
            rig.endpoint()
        ),
    );
    let message = failed(&command.output().unwrap(), 4);
    assert!(message.contains("/action") && message.contains("could not be found"), "{message}");
    let calls = cli.tools.calls()[before..].to_vec();
    assert_eq!(calls[calls.len() - 2..], [logout.clone(), delete.clone()], "{calls:#?}");
    assert!(attachments(&rig, &volume).await.is_empty());
    assert_eq!(c.volume_status(&volume).await, "available");
    assert!(!rig.exported(&volume));

    // And then it works.
    ok(&cli.attach(&volume, &[]));
    assert_eq!(c.volume_status(&volume).await, "in-use");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_have_clear_messages_and_exit_codes() {
    let rig = Rig::start();
    let c = rig.client();
    let cli = Cli::new(&rig);
    let volume = c.create_volume(json!({"size": 1})).await;

    // Server unreachable: 3.
    let mut command = cli.attach_command(&volume, &[]);
    command.env("CINDER_ENDPOINT", "http://127.0.0.1:9/v3");
    let message = failed(&command.output().unwrap(), 3);
    assert!(message.contains("cannot reach"), "{message}");

    // Volume missing: 4.
    let message = failed(&cli.attach("8d3c1a52-0b8e-4bb2-a2f3-0e4a3f0c9d11", &[]), 4);
    assert!(message.contains("could not be found"), "{message}");
    failed(&cli.detach("8d3c1a52-0b8e-4bb2-a2f3-0e4a3f0c9d11", &[]), 4);
    let message = failed(&cli.detach(&volume, &[]), 4);
    assert!(message.contains("no attachments"), "{message}");

    // Volume busy: attached elsewhere (5); several attachments and no id (5).
    let r = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:other", "other"))).await.expect(200);
    let message = failed(&cli.attach(&volume, &[]), 5);
    assert!(message.contains("in-use") || message.contains("attaching"), "{message}");
    let other = r.body["attachment"]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/attachments/{other}")).await.expect(200);
    let shared = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
    c.attach(&shared, Some(connector("iqn.1993-08.org.debian:01:other", "other"))).await.expect(200);
    ok(&cli.attach(&shared, &[]));
    let message = failed(&cli.detach(&shared, &[]), 5);
    assert!(message.contains("--attachment-id"), "{message}");
    let shown = c.get(&format!("/volumes/{shared}")).await.expect(200);
    let list = shown.body["volume"]["attachments"].as_array().unwrap().clone();
    let mine = list.iter().find(|a| a["host_name"] != "other").unwrap()["attachment_id"]
        .as_str()
        .unwrap()
        .to_string();
    ok(&cli.detach(&shared, &["--attachment-id", &mine]));
    let left = attachments(&rig, &shared).await;
    assert_eq!(left.len(), 1, "the other host's attachment stays");
    assert_ne!(left[0]["id"], json!(mine));

    // No iscsiadm: 6, and nothing was reserved. PATH is an empty directory, so the case does not
    // depend on where a package installs iscsiadm (Debian's open-iscsi puts it in /usr/bin).
    let empty = tempfile::tempdir().unwrap();
    let mut command = cli.attach_command(&volume, &[]);
    command.env("PATH", empty.path());
    let message = failed(&command.output().unwrap(), 6);
    assert!(message.contains("open-iscsi"), "{message}");
    assert!(attachments(&rig, &volume).await.is_empty());

    // No initiator name: 6, nothing reserved.
    let mut command = cli.command(&["local-attach", &volume, "--initiator-name-file", "/nonexistent"]);
    command.arg("--device-dir").arg(&cli.tools.devices);
    let message = failed(&command.output().unwrap(), 6);
    assert!(message.contains("initiator name"), "{message}");
    assert!(attachments(&rig, &volume).await.is_empty());

    // Unsupported authentication: 2.
    let mut command = cli.attach_command(&volume, &[]);
    command.env("OS_AUTH_TYPE", "password");
    failed(&command.output().unwrap(), 2);
}

#[test]
fn get_connector_prints_this_machines_connector_as_os_brick_does() {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("InitiatorName={INITIATOR}\n")).unwrap();
    let out = Command::new(berth_binary())
        .args(["get-connector", "--multipath", "--nic", "lo", "--initiator-name-file"])
        .arg(file.path())
        .output()
        .unwrap();
    let connector: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(connector["initiator"], INITIATOR);
    assert_eq!(connector["ip"], "127.0.0.1");
    assert_eq!(connector["multipath"], true);
    assert_eq!(connector["enforce_multipath"], false);
    assert_eq!(connector["platform"], std::env::consts::ARCH);
    assert_eq!(connector["os_type"], "linux");
    assert!(connector["host"].as_str().is_some_and(|h| !h.is_empty()));

    let out = Command::new(berth_binary())
        .args(["get-connector", "--initiator-name-file", "/nonexistent"])
        .output()
        .unwrap();
    let connector: Value = serde_json::from_str(&ok(&out)).unwrap();
    assert!(connector.get("initiator").is_none(), "no initiator without open-iscsi's file");
    let out = Command::new(berth_binary()).args(["get-connector", "--nic", "no-such-nic0"]).output().unwrap();
    failed(&out, 2);
}

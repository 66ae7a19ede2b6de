//! The real python-brick-cinderclient-ext (PyPI) drives Berth through `cinder local-attach` and
//! `cinder local-detach`, against `berth serve` with the tgt-iscsi driver and a real tgtd.
//!
//! Its connect step needs a kernel initiator, which CI machines lack: os-brick runs `iscsiadm`
//! through stand-ins on PATH that record every command and refuse the login, so the attach stops
//! there (brick-ext then leaves the attachment `attaching`, or unreserves it in the legacy flow).
//! What is checked is the API side: every answer brick-ext and os-brick needed came from Berth,
//! and the credentials os-brick was handed log in for real with libiscsi.

use std::process::Output;

use berth_tests::initiator::StandIns;
use berth_tests::iscsi::{Session, Target};
use berth_tests::python::{cinder, venv};
use berth_tests::tgt::Rig;
use serde_json::{Value, json};

const INITIATOR: &str = "iqn.1993-08.org.debian:01:brick-host";

fn brick(rig: &Rig, tools: &StandIns, locks: &std::path::Path, version: &str, args: &[&str]) -> Output {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "brick-ext's commands require root; run the tests as root");
    let mut c = cinder(&rig.berth.base, "e2e", version);
    c.args(args)
        .env("PATH", format!("{}:{}", tools.path(), venv().join("bin").display()))
        .env("OSLO_LOCK_PATH", locks);
    c.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The node os-brick configured, from the recorded `iscsiadm` command lines.
fn node(tools: &StandIns, portal: &str, iqn: &str) -> Target {
    let chap = tools.setting("node.session.auth.username").zip(tools.setting("node.session.auth.password"));
    Target { portal: portal.into(), iqn: iqn.into(), lun: 1, chap }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brick_ext_local_attach_and_local_detach_get_every_answer_from_berth() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let tools = StandIns::for_os_brick(INITIATOR);
    let locks = tempfile::tempdir().unwrap();

    // cinderclient negotiates 3.54, so brick-ext uses the attachments API.
    let out = brick(&rig, &tools, locks.path(), "3.54", &["local-attach", &volume]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "the stand-in refuses the kernel login, so the attach stops there");
    assert!(stderr.contains("Volume device not found") || stderr.contains("login"), "{stderr}");

    // Berth's answers: an attachment with brick-ext's connector and a complete connection.
    let listed = c.get(&format!("/attachments/detail?volume_id={volume}")).await.expect(200);
    let attachment = listed.body["attachments"][0].clone();
    assert_eq!(attachment["status"], "attaching");
    assert!(attachment["instance"].is_string(), "brick-ext sends a fresh instance uuid");
    let info = &attachment["connection_info"];
    assert_eq!(info["driver_volume_type"], "iscsi");
    let (portal, iqn) = (info["target_portal"].as_str().unwrap(), info["target_iqn"].as_str().unwrap());

    // os-brick used exactly those to configure the node and log in.
    let calls = tools.calls();
    let login = format!("-m node -T {iqn} -p {portal} --login");
    assert!(calls.contains(&login), "os-brick tried to log in to Berth's target: {calls:#?}");
    let target = node(&tools, portal, iqn);
    assert_eq!(
        target.chap,
        Some((
            info["auth_username"].as_str().unwrap().into(),
            info["auth_password"].as_str().unwrap().into()
        ))
    );
    // And they work: the initiator os-brick reported (from open-iscsi's file) logs in for real.
    let session = Session::login(&target, INITIATOR).expect("the credentials os-brick was given log in");
    assert_eq!(session.capacity().unwrap().0 * 512, 1 << 30);
    drop(session);

    assert!(!rig.berth.log_text().contains(&format!("/volumes/{volume}/action")), "no legacy call");

    // local-detach: list, show, disconnect, delete.
    let out = brick(&rig, &tools, locks.path(), "3.54", &["local-detach", &volume]);
    assert!(out.status.success(), "local-detach failed:\n{}\n{}", text(&out.stdout), text(&out.stderr));
    let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    assert_eq!(listed.body["attachments"], json!([]));
    assert_eq!(c.volume_status(&volume).await, "available");
    assert!(!rig.exported(&volume), "the export is removed");
    assert!(Session::login(&target, INITIATOR).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brick_ext_legacy_local_attach_unreserves_and_revokes_access_when_connect_fails() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let tools = StandIns::for_os_brick(INITIATOR);
    let locks = tempfile::tempdir().unwrap();

    // At 3.0 brick-ext uses the legacy calls: os-reserve, os-initialize_connection, connect.
    let out = brick(&rig, &tools, locks.path(), "3.0", &["local-attach", &volume]);
    assert!(!out.status.success(), "the stand-in refuses the kernel login");
    let calls = tools.calls();
    let iqn = format!("iqn.2010-10.org.openstack:tgt:volume-{volume}");
    let portal = format!("127.0.0.1:{}", rig.tgtd.portal_port);
    assert!(calls.iter().any(|c| c.ends_with("--login") && c.contains(&iqn)), "{calls:#?}");
    let target = node(&tools, &portal, &iqn);
    assert!(target.chap.is_some(), "os-initialize_connection gave os-brick CHAP credentials");
    let log = rig.berth.log_text();
    assert!(log.contains(&format!("/volumes/{volume}/action")), "the legacy actions were used");
    assert!(!log.contains("/attachments"), "and not the attachments API");

    // brick-ext's failure path sent os-unreserve: the reservation is gone and, unlike Cinder,
    // so is the access os-initialize_connection granted.
    assert_eq!(c.volume_status(&volume).await, "available");
    let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    assert_eq!(listed.body["attachments"], Value::Array(vec![]));
    assert!(!rig.exported(&volume));
    assert!(Session::login(&target, INITIATOR).is_err());
}

//! End to end with real processes and no mocks: a tgtd on a loopback port, `berth serve` with the
//! tgt-iscsi driver, the REST API, and a real iSCSI initiator (libiscsi) that logs in with exactly
//! the connection information the API returned and reads and writes the volume's bytes.

use std::time::{Duration, Instant};

use berth_tests::iscsi::{BLOCK, Session, Target};
use berth_tests::process::BerthProcess;
use berth_tests::server::{Client, connector};
use berth_tests::tgt::{Rig, TgtdProcess};
use serde_json::{Value, json};

const ALICE: &str = "iqn.1993-08.org.debian:01:alice";
const BOB: &str = "iqn.1993-08.org.debian:01:bob";
const GIB: u64 = 1 << 30;

async fn attach(c: &Client, volume: &str, initiator: &str, host: &str) -> (String, Value) {
    let r = c.attach(volume, Some(connector(initiator, host))).await.expect(200);
    let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
    c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
    (id, r.body["attachment"]["connection_info"].clone())
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Logs in, retrying briefly: tgtd may still be tearing down a session of the same initiator.
fn login(target: &Target, initiator: &str) -> Result<Session, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Session::login(target, initiator) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < deadline && e.contains("Target not found") => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => return Err(e),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_initiator_reads_and_writes_an_attached_volume_and_nobody_else_gets_in() {
    let rig = Rig::start();
    let c = rig.client();

    let volume = c.create_volume(json!({"size": 1, "name": "e2e"})).await;
    let file = rig.backing_file(&volume);
    let meta = std::fs::metadata(&file).expect("the backing file exists");
    assert_eq!(meta.len(), GIB);
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < 1 << 20, "a new volume is sparse");

    let (attachment, info) = attach(&c, &volume, ALICE, "alice-host").await;
    assert_eq!(info["driver_volume_type"], "iscsi");
    assert_eq!(info["target_iqn"], json!(format!("iqn.2010-10.org.openstack:tgt:volume-{volume}")));
    assert_eq!(info["target_lun"], 1);
    assert_eq!(info["target_portal"], json!(format!("127.0.0.1:{}", rig.tgtd.portal_port)));
    assert_eq!(info["auth_method"], "CHAP");
    assert!(info["auth_password"].as_str().unwrap().len() >= 17, "at least 96 bits of secret");
    let target = Target::from_connection_info(&info);

    // The initiator named in the connector logs in with exactly what the API returned.
    let written = pattern(7, 8 * BLOCK);
    {
        let session = login(&target, ALICE).expect("the attached initiator logs in");
        assert_eq!(session.capacity().unwrap(), (GIB / BLOCK as u64, BLOCK as u32));
        session.write(0, &written).unwrap();
        session.write(GIB / BLOCK as u64 - 8, &written).unwrap();
        assert_eq!(session.read(0, written.len()).unwrap(), written);
        assert_eq!(session.read(GIB / BLOCK as u64 - 8, written.len()).unwrap(), written);
    }

    // An initiator outside the ACL, a wrong secret, and no CHAP at all are refused.
    let e = Session::login(&target, BOB).err().expect("an initiator not in the ACL is refused");
    assert!(e.contains("Target not found"), "{e}");
    let e = Session::login(&target.with_secret("wrongWRONGwrong12345"), ALICE)
        .err()
        .expect("a wrong secret is refused");
    assert!(e.contains("Authentication failure"), "{e}");
    let no_chap = Target { chap: None, ..target.clone() };
    assert!(Session::login(&no_chap, ALICE).is_err(), "CHAP is required");

    // Deleting the attachment revokes access; the data stays on the volume.
    c.delete(&format!("/attachments/{attachment}")).await.expect(200);
    Session::login(&target, ALICE).err().expect("access ends with the attachment");
    let exported = rig.tgtd.targets().into_iter().find(|t| t.iqn == target.iqn);
    assert!(exported.is_none_or(|t| t.initiators.is_empty()), "no initiator keeps access");
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let again = Target::from_connection_info(&info);
    assert_eq!(again.chap, target.chap, "credentials stay with the volume");
    assert_eq!(login(&again, ALICE).unwrap().read(0, written.len()).unwrap(), written);
    let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    let id = listed.body["attachments"][0]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/attachments/{id}")).await.expect(200);

    // Deleting the volume removes the target and the backing file.
    c.delete(&format!("/volumes/{volume}")).await.expect(202);
    assert!(!rig.tgtd.targets().iter().any(|t| t.iqn.ends_with(&volume)), "the target is gone");
    assert!(!file.exists(), "the backing file is gone");

    // No CHAP credential ever reached a log; every change went to tgtd over its control socket
    // (Berth runs no tgtadm, so no credential is ever on a command line).
    let (user, secret) = target.chap.clone().unwrap();
    let log = rig.berth.log_text();
    assert!(!log.contains(&secret) && !log.contains(&user), "a CHAP credential is in berth's log");
    assert!(rig.tgtd_changes() > 0, "the changes are logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detaching_one_initiator_of_a_multiattach_volume_ends_its_sessions_and_keeps_the_other_working() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
    let (a, info_a) = attach(&c, &volume, ALICE, "alice-host").await;
    let (b, info_b) = attach(&c, &volume, BOB, "bob-host").await;
    let (ta, tb) = (Target::from_connection_info(&info_a), Target::from_connection_info(&info_b));
    assert_eq!(ta.iqn, tb.iqn, "one target per volume");

    let data = pattern(42, 4 * BLOCK);
    let bob = login(&tb, BOB).expect("bob logs in");
    login(&ta, ALICE).expect("alice logs in").write(100, &data).unwrap();
    assert_eq!(bob.read(100, data.len()).unwrap(), data, "both see the same volume");

    // Alice's session is open when she is detached.
    let alice = login(&ta, ALICE).expect("alice logs in");
    assert_eq!(alice.read(100, data.len()).unwrap(), data);
    c.delete(&format!("/attachments/{a}")).await.expect(200);
    assert!(alice.read(100, data.len()).is_err(), "alice's open session ends with her attachment");
    drop(alice);
    assert!(Session::login(&ta, ALICE).is_err(), "alice's access is revoked");
    assert!(
        Session::login(&ta, BOB).is_err(),
        "what alice was given no longer opens the target, even under bob's initiator name"
    );
    assert_eq!(bob.read(100, data.len()).unwrap(), data, "bob's open session keeps working");
    bob.write(200, &data).unwrap();
    drop(bob);
    // Bob gets the target's new credentials at his next initialize-connection (an update).
    let body = json!({"attachment": {"connector": connector(BOB, "bob-host")}});
    let updated = c.put(&format!("/attachments/{b}"), body).await.expect(200);
    let info = updated.body["attachment"]["connection_info"].clone();
    let tb2 = Target::from_connection_info(&info);
    assert_ne!(tb2.chap, tb.chap, "the credentials changed");
    assert_eq!(login(&tb2, BOB).expect("bob logs in again").read(200, data.len()).unwrap(), data);
    let target = rig.tgtd.targets().into_iter().find(|t| t.iqn == tb.iqn).expect("the target stays");
    assert_eq!(target.initiators, vec![BOB.to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attachments_from_one_initiator_share_its_acl_entry() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
    let (first, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let (second, _) = attach(&c, &volume, ALICE, "alice-host").await;
    let shown = c.get(&format!("/attachments/{first}")).await.expect(200);
    assert_eq!(shown.body["attachment"]["shared_connections_by_attachment"], json!([second]));
    c.delete(&format!("/attachments/{first}")).await.expect(200);
    login(&Target::from_connection_info(&info), ALICE).expect("the other attachment still needs the entry");
    c.delete(&format!("/attachments/{second}")).await.expect(200);
    assert!(Session::login(&Target::from_connection_info(&info), ALICE).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_of_tgtd_and_berth_lose_no_access() {
    let mut rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let target = Target::from_connection_info(&info);
    let data = pattern(9, 2 * BLOCK);
    login(&target, ALICE).unwrap().write(5, &data).unwrap();

    // Both crash; tgtd comes back empty, then berth re-creates the export at start-up.
    rig.berth.kill9();
    rig.tgtd.restart();
    assert!(rig.tgtd.targets().is_empty(), "a restarted tgtd has no targets");
    rig.berth.restart();
    let session = login(&target, ALICE).expect("the initiator logs in again with the same credentials");
    assert_eq!(session.read(5, data.len()).unwrap(), data);
    drop(session);
    assert!(Session::login(&target, BOB).is_err(), "and the ACL is as strict as before");

    // tgtd alone restarts while berth runs: berth notices and re-creates the export.
    rig.tgtd.restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match Session::login(&target, ALICE) {
            Ok(s) => {
                assert_eq!(s.read(5, data.len()).unwrap(), data);
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "access was not restored after tgtd restarted: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_that_belong_to_no_live_attachment_are_reported() {
    let mut rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    attach(&c, &volume, ALICE, "alice-host").await;
    let stray = "iqn.2010-10.org.openstack:volume-stray";
    assert!(
        rig.tgtd.tgtadm(&["--op", "new", "--mode", "target", "--tid", "99", "-T", stray]).status.success()
    );
    rig.berth.restart();
    // The reconciler runs in the background once the API answers: wait for its report.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut log = rig.berth.log_text();
    while !log.lines().any(|l| l.contains("drift") && l.contains(stray)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        log = rig.berth.log_text();
    }
    let drift: Vec<&str> = log.lines().filter(|l| l.contains("drift")).collect();
    assert!(drift.iter().any(|l| l.contains(stray)), "the stray target is reported:\n{log}");
    assert!(!drift.iter().any(|l| l.contains(&volume)), "the live one is not");
    assert!(rig.tgtd.targets().iter().any(|t| t.iqn == stray), "reported, not deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_initiator_names_are_refused_before_any_command_runs() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let before = rig.tgtd_changes();
    for hostile in [
        "iqn.2010-10.org.openstack:x;reboot",
        "iqn.2010-10.org.openstack:$(touch /tmp/pwned)",
        "iqn.2010-10.org.openstack:x#y",
        "iqn.2010-10.org.openstack:x\ny",
        "iqn.2010-10.org.openstack:x y",
        "iqn.2010-10.org.openstack:x,initiator-address=ALL",
        &format!("iqn.2010-10.org.openstack:{}", "a".repeat(300)),
    ] {
        let r = c.attach(&volume, Some(connector(hostile, "h"))).await;
        let message = r.fault(400, "badRequest");
        assert!(message.contains("initiator"), "{message}");
    }
    assert_eq!(rig.tgtd_changes(), before, "tgtd was changed for a hostile request");
    assert_eq!(c.volume_status(&volume).await, "available");
    assert!(rig.tgtd.targets().is_empty());
}

/// Stops, when dropped (even after a failed assertion), a tgtd that berth daemonised: its targets
/// first, then the daemon.
struct StopDaemon(u16);

impl Drop for StopDaemon {
    fn drop(&mut self) {
        let tgtadm = |args: &[&str]| {
            std::process::Command::new("/usr/sbin/tgtadm")
                .args(["-C", &self.0.to_string()])
                .args(args)
                .output()
        };
        let Ok(shown) = tgtadm(&["--lld", "iscsi", "--op", "show", "--mode", "target"]) else { return };
        for t in berth::capabilities::iscsi::tgt::parse_show(&String::from_utf8_lossy(&shown.stdout)) {
            let tid = t.tid.to_string();
            let _ =
                tgtadm(&["--lld", "iscsi", "--op", "delete", "--mode", "target", "--force", "--tid", &tid]);
        }
        let _ = tgtadm(&["--op", "delete", "--mode", "system"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_starts_tgtd_when_none_answers() {
    let probe = TgtdProcess::start();
    let (control, portal) = (probe.control_port, probe.portal_port);
    drop(probe);
    let _stop = StopDaemon(control);
    let config = format!("[tgt]\nportal = \"127.0.0.1:{portal}\"\ncontrol_port = {control}\nstart = true\n");
    let berth = BerthProcess::start(&config);
    assert!(berth.log_text().contains("started tgtd"));
    let c = Client::for_base(&berth.base, "e2e").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    login(&Target::from_connection_info(&info), ALICE).expect("berth's own tgtd serves the volume");
}

async fn act(c: &Client, volume: &str, action: &str, arg: Value) -> berth_tests::server::Resp {
    c.post(&format!("/volumes/{volume}/action"), json!({ action: arg })).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_and_attachments_flows_detach_each_other_without_leaking_an_export() {
    let rig = Rig::start();
    let c = rig.client();

    // Legacy attach, attachments-API detach.
    let volume = c.create_volume(json!({"size": 1})).await;
    act(&c, &volume, "os-reserve", Value::Null).await.expect(202);
    let r =
        act(&c, &volume, "os-initialize_connection", json!({"connector": connector(ALICE, "alice-host")}))
            .await;
    let data = r.expect(200).body["connection_info"]["data"].clone();
    act(&c, &volume, "os-attach", json!({"mountpoint": "/dev/vdb", "host_name": "alice-host"}))
        .await
        .expect(202);
    let target = Target::from_connection_info(&data);
    login(&target, ALICE).expect("the legacy flow's credentials log in");
    let listed = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    let id = listed.body["attachments"][0]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/attachments/{id}")).await.expect(200);
    assert!(!rig.exported(&volume), "the legacy attachment's export is removed");
    assert!(Session::login(&target, ALICE).is_err());

    // Attachments-API attach, legacy detach.
    let (_, info) = attach(&c, &volume, BOB, "bob-host").await;
    let target = Target::from_connection_info(&info);
    login(&target, BOB).expect("bob logs in");
    act(&c, &volume, "os-begin_detaching", Value::Null).await.expect(202);
    act(&c, &volume, "os-terminate_connection", json!({"connector": connector(BOB, "bob-host")}))
        .await
        .expect(202);
    assert!(Session::login(&target, BOB).is_err(), "terminate_connection revokes access");
    act(&c, &volume, "os-detach", Value::Null).await.expect(202);
    assert!(!rig.exported(&volume));
    assert_eq!(c.volume_status(&volume).await, "available");
}

async fn attach_for(
    c: &Client,
    volume: &str,
    instance: &str,
    initiator: &str,
    host: &str,
) -> (String, Value) {
    let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": instance, "connector": connector(initiator, host)}});
    let r = c.post("/attachments", body).await.expect(200);
    (
        r.body["attachment"]["id"].as_str().unwrap().to_string(),
        r.body["attachment"]["connection_info"].clone(),
    )
}

/// Nova's live migration on a real target: the destination host gets its own attachment of the
/// non-multiattach volume, both hosts have access while the instance moves, and deleting the
/// source's attachment ends the source's access only. A failed migration deletes the new
/// attachment instead, and the old one keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_migration_moves_access_from_the_source_host_to_the_destination() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let instance = uuid::Uuid::new_v4().to_string();
    let (source, info) = attach_for(&c, &volume, &instance, ALICE, "alice-host").await;
    c.post(&format!("/attachments/{source}/action"), json!({"os-complete": null})).await.expect(204);
    let target = Target::from_connection_info(&info);
    let data = pattern(77, 4 * BLOCK);
    login(&target, ALICE).expect("the source logs in").write(10, &data).unwrap();

    // A failed migration first: the new attachment is deleted, the source keeps working.
    let (failed, _) = attach_for(&c, &volume, &instance, BOB, "bob-host").await;
    c.delete(&format!("/attachments/{failed}")).await.expect(200);
    assert!(Session::login(&target, BOB).is_err(), "the failed destination has no access");
    assert_eq!(login(&target, ALICE).expect("the source still logs in").read(10, data.len()).unwrap(), data);

    // Nova's sequence: create with the destination connector, complete, delete the source's.
    let (destination, dinfo) = attach_for(&c, &volume, &instance, BOB, "bob-host").await;
    assert_eq!(Target::from_connection_info(&dinfo).iqn, target.iqn, "one target for the volume");
    let shown = rig.tgtd.targets().into_iter().find(|t| t.iqn == target.iqn).unwrap();
    assert_eq!(shown.initiators.len(), 2, "both hosts have access during the migration");
    let bob = login(&Target::from_connection_info(&dinfo), BOB).expect("the destination logs in");
    assert_eq!(bob.read(10, data.len()).unwrap(), data, "and sees the source's data");
    c.post(&format!("/attachments/{destination}/action"), json!({"os-complete": null})).await.expect(204);
    c.delete(&format!("/attachments/{source}")).await.expect(200);
    assert!(Session::login(&target, ALICE).is_err(), "the source's access ended");
    assert_eq!(bob.read(10, data.len()).unwrap(), data, "the destination's session goes on");
    let shown = rig.tgtd.targets().into_iter().find(|t| t.iqn == target.iqn).expect("the export stays");
    assert_eq!(shown.initiators, vec![BOB.to_string()]);
    assert_eq!(c.volume_status(&volume).await, "in-use");
}

//! End to end with real processes and no mocks: a tgtd on a loopback port, `berth serve` with the
//! tgt-iscsi driver, the REST API, and a real iSCSI initiator (libiscsi) that logs in with exactly
//! the connection information the API returned and reads and writes the volume's bytes.

use std::process::Command;
use std::time::{Duration, Instant};

use berth_tests::invariants;
use berth_tests::iscsi::{BLOCK, Session, Target};
use berth_tests::process::{BerthProcess, berth_binary};
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
    // Alice's own account (one per initiator and project) is bound again: the same credentials.
    assert_eq!(again.chap, target.chap, "an initiator keeps its credentials for a project's volumes");
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

/// Thin provisioning that stays thin: a host's discard (UNMAP) of blocks it wrote gives their
/// space back (tgtd punches them out of the sparse backing file) and they read as zeros; the
/// connection says `discard: true`, so Nova passes a guest's discards through. With `[tgt]
/// thin_provisioning = false` the LUN refuses UNMAP and the connection says nothing of discard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hosts_discard_gives_the_space_back_to_the_machine() {
    const MIB: usize = 1 << 20;
    let allocated = |rig: &Rig, volume: &str| {
        let meta = std::fs::metadata(rig.backing_file(volume)).unwrap();
        std::os::unix::fs::MetadataExt::blocks(&meta) * 512
    };
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    assert_eq!(info["discard"], true, "{info}");
    let session = login(&Target::from_connection_info(&info), ALICE).unwrap();
    let written = pattern(3, 4 * MIB);
    let kept = pattern(5, 8 * BLOCK);
    session.write(0, &written).unwrap();
    session.write((8 * MIB / BLOCK) as u64, &kept).unwrap();
    let before = allocated(&rig, &volume);
    assert!(before >= 4 * MIB as u64, "the writes took space: {before} bytes");

    session.unmap(0, (4 * MIB / BLOCK) as u32).expect("the LUN takes UNMAP");
    let after = allocated(&rig, &volume);
    assert!(after + 4 * MIB as u64 <= before, "4 MiB given back: {before} -> {after} bytes");
    assert_eq!(session.read(0, 4 * MIB).unwrap(), vec![0; 4 * MIB], "discarded blocks read as zeros");
    assert_eq!(session.read((8 * MIB / BLOCK) as u64, kept.len()).unwrap(), kept, "the rest is kept");
    drop(session);

    let rig = Rig::start_with_tgt("thin_provisioning = false\n", "");
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    assert!(info.get("discard").is_none(), "{info}");
    let session = login(&Target::from_connection_info(&info), ALICE).unwrap();
    session.write(0, &written).unwrap();
    assert!(session.unmap(0, (4 * MIB / BLOCK) as u32).is_err(), "UNMAP is refused");
    assert_eq!(session.read(0, 4 * MIB).unwrap(), written);
}

/// `os-unmanage`: refused while a host is attached (its access stays); once detached, Berth
/// removes the export from tgtd and forgets the volume, and its backing file stays with the data
/// the host wrote, which no reconcile pass touches afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmanaged_volume_leaves_tgtd_and_keeps_its_data_on_the_backend() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let file = rig.backing_file(&volume);
    let written = pattern(5, 8 * BLOCK);
    let (attachment, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let target = Target::from_connection_info(&info);
    login(&target, ALICE).unwrap().write(0, &written).unwrap();

    let action = format!("/volumes/{volume}/action");
    c.post(&action, json!({"os-unmanage": null})).await.fault(400, "badRequest");
    assert_eq!(login(&target, ALICE).unwrap().read(0, written.len()).unwrap(), written, "access stays");
    c.delete(&format!("/attachments/{attachment}")).await.expect(200);
    assert!(
        rig.tgtd.targets().iter().any(|t| t.iqn == target.iqn),
        "the detached volume's target is kept for reuse"
    );

    c.post(&action, json!({"os-unmanage": null})).await.expect(202);
    c.get(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");
    assert!(!rig.tgtd.targets().iter().any(|t| t.iqn == target.iqn), "the export is removed");
    // Reconcile passes run every 0.25 s here: several go by.
    std::thread::sleep(Duration::from_secs(2));
    let data = std::fs::read(&file).expect("the backing file stays");
    assert_eq!(data.len() as u64, GIB);
    assert_eq!(&data[..written.len()], &written[..], "with the data the host wrote");
    assert!(!rig.tgtd.targets().iter().any(|t| t.iqn == target.iqn));
    let log = rig.berth.log_text();
    assert!(!log.lines().any(|l| l.contains("drift") && l.contains(&volume)), "{log}");
}

/// `os-extend` grows the volume that the initiator sees: written, detached, extended from 1 GiB
/// to 2, attached again: the initiator reads a 2 GiB capacity, the old data, and writes at the new
/// end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extended_volume_has_its_new_size_at_the_next_attach_and_keeps_its_data() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let written = pattern(9, 8 * BLOCK);
    let (attachment, info) = attach(&c, &volume, ALICE, "alice-host").await;
    login(&Target::from_connection_info(&info), ALICE).unwrap().write(0, &written).unwrap();
    c.delete(&format!("/attachments/{attachment}")).await.expect(200);

    c.post(&format!("/volumes/{volume}/action"), json!({"os-extend": {"new_size": 2}})).await.expect(202);
    assert_eq!(c.get(&format!("/volumes/{volume}")).await.body["volume"]["size"], 2);
    assert_eq!(std::fs::metadata(rig.backing_file(&volume)).unwrap().len(), 2 * GIB);

    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let session = login(&Target::from_connection_info(&info), ALICE).unwrap();
    assert_eq!(
        session.capacity().unwrap(),
        (2 * GIB / BLOCK as u64, BLOCK as u32),
        "the initiator sees 2 GiB"
    );
    assert_eq!(session.read(0, written.len()).unwrap(), written, "the data is kept");
    session.write(2 * GIB / BLOCK as u64 - 8, &written).unwrap();
    assert_eq!(session.read(2 * GIB / BLOCK as u64 - 8, written.len()).unwrap(), written);
}

/// A command as a host's SCSI layer sends it: a unit attention (a session logged in again says
/// "reset occurred" to its first command) is answered by sending the command again.
fn as_a_host<T>(command: impl Fn() -> Result<T, String>) -> Result<T, String> {
    let mut attentions = 0;
    loop {
        match command() {
            Err(e) if e.contains("UNIT_ATTENTION") && attentions < 3 => attentions += 1,
            done => return done,
        }
    }
}

/// An attached volume grows under its host (`os-extend` from 3.42): the host's session reads the
/// new capacity at once (tgtd's LUN opened its grown file again, while the target's sessions were
/// ended and logged in again, as a host's initiator does), the data is kept and the new end takes
/// writes, the LUN still takes UNMAP, and a host writing and reading all along saw none of its
/// I/O fail. The volume is in use at its new size, its attachment as it was; tgtd holds the same
/// target and LUN, and takes logins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_volume_grows_under_its_host() {
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let written = pattern(7, 8 * BLOCK);
    let (attachment, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let target = Target::from_connection_info(&info);
    let session = Session::login_reconnecting(&target, ALICE).unwrap();
    session.write(0, &written).unwrap();
    assert_eq!(session.capacity().unwrap(), (GIB / BLOCK as u64, BLOCK as u32));
    let before = rig.tgtd.targets().into_iter().find(|t| t.iqn == target.iqn).expect("exported");

    // Another session of the host keeps writing and reading its own blocks meanwhile.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let s = Session::login_reconnecting(&target, ALICE).unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let data = pattern(rounds as u8, 16 * BLOCK);
                as_a_host(|| s.write(1024, &data)).map_err(|e| format!("write of round {rounds}: {e}"))?;
                let read = as_a_host(|| s.read(1024, data.len()))
                    .map_err(|e| format!("read of round {rounds}: {e}"))?;
                if read != data {
                    return Err(format!("round {rounds} read other bytes than it wrote"));
                }
                rounds += 1;
            }
            Ok(rounds)
        })
    };
    for size in [2, 3] {
        let extend = json!({"os-extend": {"new_size": size}});
        c.at("3.42").post(&format!("/volumes/{volume}/action"), extend).await.expect(202);
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = busy.join().unwrap().expect("no I/O failed while the volume grew");
    assert!(rounds > 0);

    let capacity = as_a_host(|| session.capacity()).unwrap();
    assert_eq!(capacity, (3 * GIB / BLOCK as u64, BLOCK as u32), "the host sees 3 GiB");
    assert_eq!(session.read(0, written.len()).unwrap(), written, "the data is kept");
    let end = 3 * GIB / BLOCK as u64 - 8;
    session.write(end, &written).unwrap();
    assert_eq!(session.read(end, written.len()).unwrap(), written);
    session.unmap(end, 8).expect("the LUN still takes UNMAP");
    assert_eq!(session.read(end, written.len()).unwrap(), vec![0; written.len()]);

    let shown = c.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
    assert_eq!((shown["size"].as_i64(), shown["status"].as_str()), (Some(3), Some("in-use")));
    let shown =
        c.at("3.54").get(&format!("/attachments/{attachment}")).await.expect(200).body["attachment"].clone();
    assert_eq!(
        (shown["status"].as_str(), &shown["connection_info"]["target_iqn"]),
        (Some("attached"), &info["target_iqn"])
    );
    let after = rig.tgtd.targets().into_iter().find(|t| t.iqn == target.iqn).expect("still exported");
    assert_eq!((after.tid, &after.luns), (before.tid, &before.luns), "the same target and LUN");
    login(&target, ALICE).expect("the target takes logins");
}

/// An attached extend whose driver call passes its deadline while tgtd's LUN is being reopened
/// (the target closed to logins, a pause there) fails, the volume in use at its old size; the
/// reopening still runs to its end: the target takes logins again and serves the grown file, and
/// the extend tried again succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_extend_abandoned_at_its_deadline_leaves_the_target_open() {
    let backend = "[[backends]]\nname = \"tgt\"\ndriver = \"tgt-iscsi\"\n\
                   grants = [\"iscsi-target\", \"backing-store\"]\n[backends.limits]\ntimeout_ms = 1000\n";
    let rig = Rig::start_with(backend);
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let target = Target::from_connection_info(&info);
    let failpoints = |what: &str| format!("{}/_failpoints/{what}", rig.berth.base);
    let http = reqwest::Client::new();
    let reset = json!({"trace": true});
    http.post(failpoints("reset")).json(&reset).send().await.unwrap().error_for_status().unwrap();
    let arm = json!({"name": "tgt.reopen.offline", "nth": 1, "action": "sleep", "millis": 3000});
    http.post(failpoints("arm")).json(&arm).send().await.unwrap().error_for_status().unwrap();

    let extend = json!({"os-extend": {"new_size": 2}});
    let answer = c.at("3.42").post(&format!("/volumes/{volume}/action"), extend.clone()).await;
    let hits: Vec<String> = http.get(failpoints("hits")).send().await.unwrap().json().await.unwrap();
    assert!(hits.iter().any(|h| h == "tgt.reopen.offline"), "the reopening was paused: {hits:?}");
    assert!(answer.status >= 500, "the driver call passed its deadline: {answer:?}");
    let shown = c.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
    assert_eq!((shown["size"].as_i64(), shown["status"].as_str()), (Some(1), Some("in-use")));

    let session = Session::login_within(&target, ALICE, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the target stays closed to logins: {e}"));
    let capacity = as_a_host(|| session.capacity()).unwrap();
    assert_eq!(capacity, (2 * GIB / BLOCK as u64, BLOCK as u32), "the grown file is served");
    drop(session);
    c.at("3.42").post(&format!("/volumes/{volume}/action"), extend).await.expect(202);
    assert_eq!(c.get(&format!("/volumes/{volume}")).await.body["volume"]["size"], 2);
}

/// tgtd holds at most the LUNs this machine allows (threads per LUN against the kernel's
/// threads, or `[tgt] max_luns` when lower): with `max_luns = 2`, a third volume's attach is
/// refused with 413 in Cinder's shape, naming the limit and the setting, before tgtd hears of it,
/// and the volume stays available; a second host on an exported volume needs no new LUN and is
/// admitted; once a volume is detached the third attaches. `os-services` and the metrics show the
/// LUNs held and the ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_beyond_the_ceiling_is_refused_before_tgtd_hears_of_it() {
    let port = berth_tests::pg::free_port();
    let rig = Rig::start_with_tgt("max_luns = 2\n", &format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let c = rig.client();
    let mut volumes = Vec::new();
    for _ in 0..3 {
        volumes.push(c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await);
    }
    let (first, _) = attach(&c, &volumes[0], ALICE, "alice-host").await;
    attach(&c, &volumes[1], ALICE, "alice-host").await;

    let before = rig.tgtd.targets();
    let changes = rig.tgtd_changes();
    let refused = c.attach(&volumes[2], Some(connector(ALICE, "alice-host"))).await;
    let message = refused.fault(413, "overLimit");
    assert!(message.contains("holds 2 LUNs") && message.contains("[tgt] max_luns = 2"), "{message}");
    assert_eq!(rig.tgtd.targets(), before, "tgtd is as it was");
    assert_eq!(rig.tgtd_changes(), changes, "no change was sent to tgtd");
    let shown = c.get(&format!("/volumes/{}", volumes[2])).await.expect(200);
    assert_eq!(shown.body["volume"]["status"], "available");
    let listed = c.get(&format!("/attachments?volume_id={}", volumes[2])).await.expect(200);
    assert_eq!(listed.body["attachments"], json!([]), "the reservation was rolled back");

    // Another host on an exported volume: no new LUN.
    let (_, info) = attach(&c, &volumes[0], BOB, "bob-host").await;
    login(&Target::from_connection_info(&info), BOB).expect("bob logs in");

    let services = c.at("3.0").get("/os-services").await.expect(200);
    let backend = services.body["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["binary"] == "cinder-volume" && s["lun_ceiling"].is_number())
        .cloned()
        .expect("a backend with its ceiling");
    assert_eq!((backend["luns"].as_u64(), backend["lun_ceiling"].as_u64()), (Some(2), Some(2)), "{backend}");
    let metrics =
        reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l.starts_with("berth_tgt_luns{") && l.ends_with(" 2")), "{metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with("berth_tgt_lun_ceiling{") && l.ends_with(" 2")),
        "{metrics}"
    );
    // The filesystem tgt-iscsi's sparse files are on.
    let size = metrics
        .lines()
        .find(|l| l.starts_with("berth_backend_filesystem_bytes{") && l.contains("kind=\"size\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(size.is_some_and(|s| s > 0), "{metrics}");

    // A detach frees a LUN: the third volume attaches. (The detached volume's target is kept
    // with its LUN for its next export; kept LUNs give way to a new one at the ceiling.)
    c.delete(&format!("/attachments/{first}")).await.expect(200);
    let listed = c.get(&format!("/attachments?volume_id={}", volumes[0])).await.expect(200);
    let bob = listed.body["attachments"][0]["id"].as_str().unwrap().to_string();
    c.delete(&format!("/attachments/{bob}")).await.expect(200);
    let kept_lun =
        |rig: &Rig| rig.tgtd.targets().iter().any(|t| t.iqn.ends_with(&volumes[0]) && !t.luns.is_empty());
    assert!(kept_lun(&rig), "the detached volume's target is kept with its LUN");
    let (_, info) = attach(&c, &volumes[2], ALICE, "alice-host").await;
    login(&Target::from_connection_info(&info), ALICE).expect("the third volume is reachable");
    assert!(!kept_lun(&rig), "the kept LUN gave way to the new one");
    assert_eq!(rig.tgtd.targets().iter().map(|t| t.luns.len()).sum::<usize>(), 2, "{:?}", rig.tgtd.targets());
}

/// The driver's `chap_accounts = "per-export"`: one account per export, as Cinder's tgt helper
/// makes them (the default gives each initiator its own).
const PER_EXPORT: &str = "[[backends]]\nname = \"tgt\"\ndriver = \"tgt-iscsi\"\ngrants = [\"iscsi-target\", \"backing-store\"]\n\n[backends.settings]\nchap_accounts = \"per-export\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detaching_one_initiator_of_a_multiattach_volume_ends_its_sessions_and_keeps_the_other_working() {
    detaching_one_initiator_of_a_multiattach_volume(Rig::start(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_account_per_export_detaching_one_initiator_rotates_the_others_credentials() {
    detaching_one_initiator_of_a_multiattach_volume(Rig::start_with(PER_EXPORT), true).await;
}

async fn detaching_one_initiator_of_a_multiattach_volume(rig: Rig, per_export: bool) {
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
    // With an account per export, bob gets the target's new credentials at his next
    // initialize-connection (an update); with his own account, nothing of his changed.
    let body = json!({"attachment": {"connector": connector(BOB, "bob-host")}});
    let updated = c.put(&format!("/attachments/{b}"), body).await.expect(200);
    let info = updated.body["attachment"]["connection_info"].clone();
    let tb2 = Target::from_connection_info(&info);
    if per_export {
        assert_ne!(tb2.chap, tb.chap, "the credentials changed");
    } else {
        assert_ne!(ta.chap, tb.chap, "alice and bob have accounts of their own");
        assert_eq!(tb2.chap, tb.chap, "bob's credentials stay");
        login(&tb, BOB).expect("bob logs in with what he had");
    }
    assert_eq!(login(&tb2, BOB).expect("bob logs in again").read(200, data.len()).unwrap(), data);
    let target = rig.tgtd.targets().into_iter().find(|t| t.iqn == tb.iqn).expect("the target stays");
    assert_eq!(target.initiators, vec![BOB.to_string()]);
}

/// The hardening issue's item 13: a single-attach volume kept its CHAP credentials for ever, so
/// a host that was detached could log in with its old secret under the next host's initiator
/// name. The credentials go with the export; the next host's connection gets new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_host_cannot_log_in_to_a_single_attach_volume_under_the_next_hosts_name() {
    a_detached_host_cannot_log_in_under_the_next_hosts_name(Rig::start()).await;
    a_detached_host_cannot_log_in_under_the_next_hosts_name(Rig::start_with(PER_EXPORT)).await;
}

async fn a_detached_host_cannot_log_in_under_the_next_hosts_name(rig: Rig) {
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1})).await;
    let (a, info_a) = attach(&c, &volume, ALICE, "alice-host").await;
    let ta = Target::from_connection_info(&info_a);
    login(&ta, ALICE).expect("alice logs in").write(0, &pattern(1, BLOCK)).unwrap();
    c.delete(&format!("/attachments/{a}")).await.expect(200);

    let (_, info_b) = attach(&c, &volume, BOB, "bob-host").await;
    let tb = Target::from_connection_info(&info_b);
    assert_eq!(ta.iqn, tb.iqn);
    assert_ne!(ta.chap, tb.chap, "bob's connection has credentials of its own");
    let e = Session::login(&ta, BOB).err().expect("alice's old secret under bob's name is refused");
    assert!(e.contains("Authentication failure"), "{e}");
    assert!(Session::login(&ta, ALICE).is_err(), "and under her own name");
    assert_eq!(login(&tb, BOB).expect("bob logs in").read(0, BLOCK).unwrap(), pattern(1, BLOCK));
}

/// The hardening issue's item 11 on a real target: a plain member gives an instance's connected
/// attachment another host's connector; it is refused (409), the instance's host keeps its open
/// session and its place in the ACL, and the other host gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_move_an_instances_access_to_another_host() {
    let rig = Rig::start();
    let admin = rig.client();
    let volume = admin.create_volume(json!({"size": 1})).await;
    let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": "3f7c2a1e-5b6d-4e8f-9a0b-1c2d3e4f5a6b",
        "connector": connector(ALICE, "alice-host")}});
    let made = admin.at("3.54").post("/attachments", body).await.expect(200);
    let id = made.body["attachment"]["id"].as_str().unwrap().to_string();
    admin
        .at("3.54")
        .post(&format!("/attachments/{id}/action"), json!({"os-complete": null}))
        .await
        .expect(204);
    let target = Target::from_connection_info(&made.body["attachment"]["connection_info"]);
    let alice = login(&target, ALICE).expect("the instance's host logs in");
    alice.write(0, &pattern(3, BLOCK)).unwrap();

    let member = admin.with_roles("member").at("3.54");
    let moved = json!({"attachment": {"connector": connector(BOB, "bob-host")}});
    member.put(&format!("/attachments/{id}"), moved).await.fault(409, "conflictingRequest");
    assert_eq!(alice.read(0, BLOCK).unwrap(), pattern(3, BLOCK), "the instance's session goes on");
    let exported = rig.tgtd.targets().into_iter().find(|t| t.iqn == target.iqn).expect("the target stays");
    assert_eq!(exported.initiators, vec![ALICE.to_string()], "nobody else is let in");
    assert!(Session::login(&target, BOB).is_err());
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
    let session = login_once_restored(&target, ALICE)
        .await
        .expect("the initiator logs in again with the same credentials once berth restored the export");
    assert_eq!(session.read(5, data.len()).unwrap(), data);
    drop(session);
    assert!(Session::login(&target, BOB).is_err(), "and the ACL is as strict as before");

    // tgtd alone restarts while berth runs: berth notices and re-creates the export.
    rig.tgtd.restart();
    let session = login_once_restored(&target, ALICE).await.expect("access is restored after tgtd restarted");
    assert_eq!(session.read(5, data.len()).unwrap(), data);
    drop(session);

    // berth alone restarts: alice's account, still in tgtd and bound, serves her next volume as
    // it is (made from the key berth keeps in its data directory, not made again).
    rig.berth.kill9();
    rig.berth.restart();
    let c = rig.client();
    let second = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &second, ALICE, "alice-host").await;
    let next = Target::from_connection_info(&info);
    assert_eq!(next.chap, target.chap, "the same account");
    login(&next, ALICE).expect("alice reaches her second volume");
    login(&target, ALICE).expect("and still her first");
}

/// Logs in once the export is back: berth restores exports in the background (the reconciler's
/// first pass at start-up, or its next pass after tgtd restarted), and until then a login finds
/// no target, or one whose ACL is still empty (closed while its CHAP account is bound).
async fn login_once_restored(target: &Target, initiator: &str) -> Result<Session, String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match Session::login(target, initiator) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
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

/// `berth db restore` puts back what the database knew when its backup was taken, and tgtd is
/// brought back to it, except for what was made since (docs/operations.md, "Backing up the
/// database"): an attachment detached since is exported again (its host logs in with the
/// credentials it had), and a volume attached since keeps its target, which the reconciler
/// reports as drift and leaves alone; every other invariant between the database and tgtd holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_database_and_tgtd_agree_again_but_for_what_was_made_since_the_backup() {
    let mut rig = Rig::start();
    let c = rig.client();
    let kept = c.create_volume(json!({"size": 1})).await;
    let (_, kept_info) = attach(&c, &kept, ALICE, "alice-host").await;
    let detached = c.create_volume(json!({"size": 1})).await;
    let (bobs, bobs_info) = attach(&c, &detached, BOB, "bob-host").await;
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("backup.db");
    let out = Command::new(berth_binary())
        .args(["db", "backup", "--database-url", &rig.db_url()])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Since the backup: bob's volume detached, a volume made and attached.
    c.delete(&format!("/attachments/{bobs}")).await.expect(200);
    assert!(!rig.exported(&detached), "bob's export is gone");
    let late = c.create_volume(json!({"size": 1})).await;
    let (_, late_info) = attach(&c, &late, ALICE, "alice-host").await;
    let late_iqn = late_info["target_iqn"].as_str().unwrap().to_string();

    rig.berth.stop();
    let data_dir = rig.berth.dir.path().join("data");
    let out = Command::new(berth_binary())
        .args(["db", "restore", "--data-dir"])
        .arg(&data_dir)
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    rig.berth.start_again();

    let store = invariants::open(&rig.db_url()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let left = loop {
        let world = invariants::snapshot(&store, &rig.tgtd).await;
        let wrong = invariants::violations(&world);
        let drift_logged = rig.berth.log_text().lines().any(|l| l.contains("drift") && l.contains(&late_iqn));
        if (wrong.len() <= 1 && drift_logged) || Instant::now() > deadline {
            break wrong;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        left,
        vec![format!("target {late_iqn} on tgtd was not recorded by the service")],
        "only the volume made since the backup is unknown:\n{}",
        rig.berth.log_tail(40)
    );
    assert!(
        rig.berth.log_text().lines().any(|l| l.contains("drift") && l.contains(&late_iqn)),
        "reported as drift"
    );
    let listed = c.get("/volumes").await.expect(200).body["volumes"].clone();
    let mut ids: Vec<&str> = listed.as_array().unwrap().iter().map(|v| v["id"].as_str().unwrap()).collect();
    ids.sort();
    let mut known = vec![kept.as_str(), detached.as_str()];
    known.sort();
    assert_eq!(ids, known, "the service knows what the backup holds");
    assert_eq!(c.volume_status(&detached).await, "in-use");

    login(&Target::from_connection_info(&kept_info), ALICE).expect("alice still reaches her volume");
    login_once_restored(&Target::from_connection_info(&bobs_info), BOB)
        .await
        .expect("the attachment the backup holds is exported again, with the credentials it had");
    login(&Target::from_connection_info(&late_info), ALICE).expect("left alone, not removed");
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
    // Started with its futex hash sized for its threads (`capabilities/iscsi/tgt/preload.rs`).
    let pid = berth_tests::tgt::tgtd_pid(control).expect("berth's tgtd is running");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("berth-tgtd-preload-"), "tgtd has the preload library loaded:\n{maps}");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let slots = format!("BERTH_TGTD_FUTEX_SLOTS={}", berth::capabilities::iscsi::tgt::preload::FUTEX_SLOTS);
    assert!(environ.split(|b| *b == 0).any(|v| v == slots.as_bytes()), "tgtd's environment names {slots}");
    let c = Client::for_base(&berth.base, "e2e").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    login(&Target::from_connection_info(&info), ALICE).expect("berth's own tgtd serves the volume");
}

/// A portal another process holds: the tgtd berth starts runs on without it (tgtd only logs
/// that it could not bind it), and every login would reach that other process. `berth serve`
/// stops that tgtd and refuses to start, naming the portal and what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_refuses_a_tgtd_it_started_that_could_not_take_its_portal() {
    let probe = TgtdProcess::start();
    let control = probe.control_port;
    drop(probe);
    let _stop = StopDaemon(control);
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let portal = holder.local_addr().unwrap().port();
    let config = format!("[tgt]\nportal = \"127.0.0.1:{portal}\"\ncontrol_port = {control}\nstart = true\n");
    let refused = BerthProcess::try_start("", &config, &[]).err().expect("berth serve refuses to start");
    assert!(
        refused.contains(&format!(
            "could not listen on its portal 127.0.0.1:{portal}: another process holds the port; set [tgt] portal"
        )),
        "{refused}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while berth_tests::tgt::tgtd_pid(control).is_some() {
        assert!(Instant::now() < deadline, "the tgtd berth started was stopped");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A tgtd the operator runs on another port than the portal Berth is told to
/// give initiators: every connection would name a port tgtd does not listen on. `berth serve`
/// refuses to start and names the portal; the same tgtd with the right portal is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_refuses_a_portal_its_tgtd_does_not_listen_on() {
    let tgtd = TgtdProcess::start();
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = tgtd.config().replace(&format!(":{}\"", tgtd.portal_port), &format!(":{elsewhere}\""));
    assert!(config.contains(&format!("portal = \"127.0.0.1:{elsewhere}\"")), "{config}");
    // Whether berth would start a tgtd when none answered or not: this one answers.
    for config in [config.clone(), config.replace("start = false", "start = true")] {
        let refused = BerthProcess::try_start("", &config, &[]).err().expect("berth serve refuses to start");
        assert!(
            refused.contains(&format!(
                "the tgtd on control port {} does not listen on the portal(s) 127.0.0.1:{elsewhere} that attachments name",
                tgtd.control_port
            )),
            "{refused}"
        );
    }
    BerthProcess::start(&tgtd.config());
}

/// The system's tgtd, started as `packaging/tgt.service.d/berth.conf` starts it: with the
/// environment `berth tgtd-preload` prints (an `EnvironmentFile`), it has the library loaded.
#[test]
fn the_environment_berth_tgtd_preload_prints_loads_the_library_into_tgtd() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(berth_tests::process::berth_binary())
        .arg("tgtd-preload")
        .arg(dir.path().join("tgtd"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    let environment: Vec<(&str, &str)> = printed.lines().map(|l| l.split_once('=').unwrap()).collect();
    assert_eq!(
        environment.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        ["LD_PRELOAD", "BERTH_TGTD_FUTEX_SLOTS"]
    );

    let probe = TgtdProcess::start();
    let (control, portal) = (probe.control_port, probe.portal_port);
    drop(probe);
    let mut tgtd = std::process::Command::new("/usr/sbin/tgtd")
        .args(["-f", "-C", &control.to_string(), "--iscsi", &format!("portal=127.0.0.1:{portal}")])
        .env_clear()
        .envs(environment.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let maps = loop {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", tgtd.id())).unwrap_or_default();
        if maps.contains("berth-tgtd-preload-") || Instant::now() > deadline {
            break maps;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = tgtd.kill();
    let _ = tgtd.wait();
    let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{control}"));
    let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{control}.lock"));
    assert!(maps.contains("berth-tgtd-preload-"), "tgtd has the library loaded:\n{maps}");
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

/// The hardening issue's item 9: `berth serve --data-dir perf/d2` answered every attach with 502
/// ("backing store path is not inside perf/d2/volumes"). A relative data directory is resolved
/// once, at start, against the directory the service was started in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_data_dir_serves_attachments() {
    let tgtd = TgtdProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let port = berth_tests::pg::free_port();
    let config = dir.path().join("berth.toml");
    let cache = berth_tests::drivers::shared_cache();
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\n[runtime]\ncache_dir = \"{}\"\n{}",
            cache.display(),
            tgtd.config()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("berth.log")).unwrap();
    let mut child = std::process::Command::new(berth_tests::process::berth_binary())
        .args(["serve", "--config", "berth.toml", "--data-dir", "perf/d2"])
        .current_dir(dir.path())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline && child.try_wait().unwrap().is_none(),
            "berth serve did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = Client::for_base(&format!("http://127.0.0.1:{port}"), "p1");
    let volume = c.create_volume(json!({"size": 1})).await;
    let r = c.attach(&volume, Some(connector(ALICE, "alice-host"))).await;
    let _ = child.kill();
    let _ = child.wait();
    let r = r.expect(200);
    let target = Target::from_connection_info(&r.body["attachment"]["connection_info"]);
    assert!(target.iqn.ends_with(&volume));
    let file = dir.path().join(format!("perf/d2/volumes/tgt/volume-{volume}.img"));
    assert!(file.exists(), "the backing file is under the relative data directory: {}", file.display());
}

/// Three hosts on a multiattach volume, each logging in with the account of its own initiator.
/// The first one detached: its sessions end, its credentials open the target under no name, and
/// the other two log in with what they had (no new credentials, nothing to refresh); then the
/// last one detached, and the middle one still logs in. tgtd answers throughout (it crashes on a
/// careless unbinding of any but a target's last account).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_of_a_multiattach_volume_has_its_own_account_and_losing_one_leaves_the_others() {
    const CAROL: &str = "iqn.1993-08.org.debian:01:carol";
    let rig = Rig::start();
    let c = rig.client();
    let volume = c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await;
    let hosts = [(ALICE, "alice-host"), (BOB, "bob-host"), (CAROL, "carol-host")];
    let mut attached = Vec::new();
    for (initiator, host) in hosts {
        let (id, info) = attach(&c, &volume, initiator, host).await;
        attached.push((id, Target::from_connection_info(&info)));
    }
    let chaps: Vec<_> = attached.iter().map(|(_, t)| t.chap.clone()).collect();
    assert!(chaps[0] != chaps[1] && chaps[1] != chaps[2] && chaps[0] != chaps[2], "one account per host");
    let data = pattern(9, 2 * BLOCK);
    login(&attached[0].1, ALICE).expect("alice logs in").write(10, &data).unwrap();
    let alice = login(&attached[0].1, ALICE).expect("alice logs in");

    c.delete(&format!("/attachments/{}", attached[0].0)).await.expect(200);
    assert!(alice.read(10, data.len()).is_err(), "alice's open session ends with her attachment");
    drop(alice);
    for name in [ALICE, BOB, CAROL] {
        assert!(Session::login(&attached[0].1, name).is_err(), "alice's credentials under {name}'s name");
    }
    for ((initiator, _), (_, target)) in hosts.iter().zip(&attached).skip(1) {
        let s = login(target, initiator).expect("the other hosts log in with what they were given");
        assert_eq!(s.read(10, data.len()).unwrap(), data);
    }
    let state =
        rig.tgtd.targets().into_iter().find(|t| t.iqn == attached[1].1.iqn).expect("the target stays");
    assert_eq!(state.initiators, vec![BOB.to_string(), CAROL.to_string()]);
    assert_eq!(state.chap_users.len(), 2, "alice's account is no longer bound: {:?}", state.chap_users);

    c.delete(&format!("/attachments/{}", attached[2].0)).await.expect(200);
    assert!(Session::login(&attached[2].1, CAROL).is_err(), "carol's access is revoked");
    login(&attached[1].1, BOB).expect("bob still logs in");
    c.delete(&format!("/attachments/{}", attached[1].0)).await.expect(200);
    assert!(Session::login(&attached[1].1, BOB).is_err(), "bob's access is revoked");
}

/// An initiator's account is per project: whoever attaches a volume of one project to an
/// initiator learns the credentials that open that project's volumes on it, never those of
/// another project's volume attached to the same initiator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_projects_volume_on_the_same_initiator_is_reached_with_other_credentials() {
    let rig = Rig::start();
    let ours = rig.client();
    let theirs = Client::for_base(&rig.berth.base, "other-project").at("3.54");
    let v1 = ours.create_volume(json!({"size": 1})).await;
    let v2 = ours.create_volume(json!({"size": 1})).await;
    let v3 = theirs.create_volume(json!({"size": 1})).await;
    let (_, i1) = attach(&ours, &v1, ALICE, "alice-host").await;
    let (_, i2) = attach(&ours, &v2, ALICE, "alice-host").await;
    let (_, i3) = attach(&theirs, &v3, ALICE, "alice-host").await;
    let (t1, t2, t3) = (
        Target::from_connection_info(&i1),
        Target::from_connection_info(&i2),
        Target::from_connection_info(&i3),
    );
    assert_eq!(t1.chap, t2.chap, "one account for alice and this project's volumes");
    assert_ne!(t1.chap, t3.chap, "another for the other project's");
    login(&t1, ALICE).expect("alice reaches v1");
    login(&t2, ALICE).expect("alice reaches v2");
    login(&t3, ALICE).expect("alice reaches v3");
    let ours_on_theirs = Target { chap: t1.chap.clone(), ..t3.clone() };
    let e = Session::login(&ours_on_theirs, ALICE)
        .err()
        .expect("this project's credentials on the other's target");
    assert!(e.contains("Authentication failure"), "{e}");
    let theirs_on_ours = Target { chap: t3.chap.clone(), ..t1.clone() };
    assert!(Session::login(&theirs_on_ours, ALICE).is_err(), "and the other way round");
}

/// Attach cycles of one host make no CHAP account after the first: tgtd holds one account for
/// the initiator, not one per export (each account made and deleted costs tgtd walks of all its
/// accounts and targets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_cycles_of_one_host_make_one_account() {
    let rig = Rig::start();
    let c = rig.client();
    let volumes = [c.create_volume(json!({"size": 1})).await, c.create_volume(json!({"size": 1})).await];
    let before = rig.tgtd.accounts().len();
    let mut seen = std::collections::BTreeSet::new();
    for round in 0..5 {
        let volume = &volumes[round % 2];
        let (id, info) = attach(&c, volume, ALICE, "alice-host").await;
        let target = Target::from_connection_info(&info);
        seen.insert(target.chap.clone());
        login(&target, ALICE).expect("alice logs in");
        c.delete(&format!("/attachments/{id}")).await.expect(200);
        assert!(Session::login(&target, ALICE).is_err(), "access ends with the attachment");
    }
    assert_eq!(seen.len(), 1, "the same credentials every time");
    assert_eq!(rig.tgtd.accounts().len(), before + 1, "one account in tgtd: {:?}", rig.tgtd.accounts());
}

/// A restarted tgtd has lost every export; the reconciler notices the restart between its passes
/// (tgtd's control socket is another) and restores them within seconds, not at the end of its
/// interval (here an hour).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_tgtd_is_restored_without_waiting_for_the_next_reconcile_interval() {
    let mut tgtd = TgtdProcess::start();
    let config = tgtd.config().replace("interval_seconds = 0.25", "interval_seconds = 3600");
    assert!(config.contains("interval_seconds = 3600"), "{config}");
    let berth = BerthProcess::start(&config);
    let c = Client::for_base(&berth.base, "e2e").at("3.54");
    let volume = c.create_volume(json!({"size": 1})).await;
    let (_, info) = attach(&c, &volume, ALICE, "alice-host").await;
    let target = Target::from_connection_info(&info);
    login(&target, ALICE).expect("alice logs in");

    let restarted = Instant::now();
    tgtd.restart();
    let session =
        login_once_restored(&target, ALICE).await.expect("the export is back without a pass being due");
    drop(session);
    assert!(restarted.elapsed() < Duration::from_secs(15), "{:?}", restarted.elapsed());
    assert!(berth.log_text().contains("the target service was restarted"), "the restart was noticed");
}

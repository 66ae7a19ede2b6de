//! The iSCSI target capability on a real tgtd: every operation is idempotent, touches one target
//! only, checks its result, and times out; CHAP works with a real initiator.

use std::path::Path;
use std::time::{Duration, Instant};

use berth::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use berth::capabilities::iscsi::{ChapCredentials, ChapPolicy, Iqn, Lun, TargetError, TargetService};
use berth_tests::iscsi::{Session, Target};
use berth_tests::tgt::TgtdProcess;

const ALICE: &str = "iqn.1993-08.org.debian:01:alice";
const BOB: &str = "iqn.1993-08.org.debian:01:bob";

struct Rig {
    tgtd: TgtdProcess,
    dir: tempfile::TempDir,
}

impl Rig {
    fn start() -> Rig {
        Rig { tgtd: TgtdProcess::start(), dir: tempfile::tempdir().unwrap() }
    }

    fn config(&self) -> TgtdConfig {
        TgtdConfig::new(self.tgtd.control_port, self.dir.path())
    }

    fn service(&self) -> Tgtd {
        Tgtd::new(self.config())
    }

    /// A sparse backing file inside the backing directory.
    fn image(&self, name: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::File::create(&path).unwrap().set_len(64 << 20).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn target(&self, iqn: &Iqn, chap: &ChapCredentials) -> Target {
        Target {
            portal: format!("127.0.0.1:{}", self.tgtd.portal_port),
            iqn: iqn.to_string(),
            lun: 1,
            chap: Some((chap.user.as_str().to_string(), chap.secret.expose().to_string())),
        }
    }
}

fn iqn(s: &str) -> Iqn {
    Iqn::parse(s).unwrap()
}

/// A target with LUN 1, `initiator` in its ACL and fresh CHAP credentials.
async fn export(rig: &Rig, t: &dyn TargetService, name: &str, initiator: &str) -> (Iqn, ChapCredentials) {
    let target = iqn(&format!("iqn.2010-10.org.openstack:volume-{name}"));
    let chap = ChapPolicy::default().generate();
    t.create_target(&target).await.unwrap();
    t.add_lun(&target, Lun::new(1).unwrap(), &rig.image(&format!("{name}.img"))).await.unwrap();
    t.set_chap(&target, &chap).await.unwrap();
    t.allow_initiator(&target, &iqn(initiator)).await.unwrap();
    (target, chap)
}

#[tokio::test]
async fn every_operation_repeated_changes_nothing() {
    let rig = Rig::start();
    let t = rig.service();
    let target = iqn("iqn.2010-10.org.openstack:volume-a");
    let chap = ChapPolicy::default().generate();
    let path = rig.image("a.img");
    let lun = Lun::new(1).unwrap();
    let mut seen = Vec::new();
    for _ in 0..3 {
        t.create_target(&target).await.unwrap();
        t.add_lun(&target, lun, &path).await.unwrap();
        t.set_chap(&target, &chap).await.unwrap();
        t.allow_initiator(&target, &iqn(ALICE)).await.unwrap();
        seen.push(rig.tgtd.targets());
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[1], seen[2]);
    let state = &seen[0][0];
    assert_eq!(state.luns, vec![(1, path.clone())]);
    assert_eq!(state.initiators, vec![ALICE.to_string()]);
    assert_eq!(state.chap_users, vec![chap.user.as_str().to_string()]);
    Session::login(&rig.target(&target, &chap), ALICE).expect("the exported LUN accepts the initiator");

    for _ in 0..2 {
        t.deny_initiator(&target, &iqn(ALICE)).await.unwrap();
        t.remove_lun(&target, lun).await.unwrap();
        t.delete_target(&target).await.unwrap();
    }
    assert!(rig.tgtd.targets().is_empty());
    let accounts = rig.tgtd.tgtadm(&["--op", "show", "--mode", "account"]);
    assert!(
        !String::from_utf8_lossy(&accounts.stdout).contains(chap.user.as_str()),
        "the account is deleted"
    );
}

#[tokio::test]
async fn removing_what_is_not_there_is_not_an_error() {
    let rig = Rig::start();
    let t = rig.service();
    let ghost = iqn("iqn.2010-10.org.openstack:volume-ghost");
    t.delete_target(&ghost).await.unwrap();
    t.remove_lun(&ghost, Lun::new(1).unwrap()).await.unwrap();
    t.deny_initiator(&ghost, &iqn(ALICE)).await.unwrap();
    let (target, _) = export(&rig, &t, "b", ALICE).await;
    t.deny_initiator(&target, &iqn(BOB)).await.unwrap();
    t.remove_lun(&target, Lun::new(2).unwrap()).await.unwrap();
    assert!(matches!(
        t.add_lun(&ghost, Lun::new(1).unwrap(), &rig.image("g.img")).await,
        Err(TargetError::NotFound(_))
    ));
}

#[tokio::test]
async fn changing_one_target_never_disturbs_another() {
    let rig = Rig::start();
    let t = rig.service();
    let (a, chap_a) = export(&rig, &t, "a", ALICE).await;
    let (b, chap_b) = export(&rig, &t, "b", BOB).await;
    let bob = Session::login(&rig.target(&b, &chap_b), BOB).expect("bob logs in to b");
    let b_before = rig.tgtd.targets().into_iter().find(|s| s.iqn == b.as_str()).unwrap();
    assert_eq!(b_before.sessions, 1);

    t.allow_initiator(&a, &iqn(BOB)).await.unwrap();
    t.deny_initiator(&a, &iqn(ALICE)).await.unwrap();
    t.remove_lun(&a, Lun::new(1).unwrap()).await.unwrap();
    t.delete_target(&a).await.unwrap();

    let b_after = rig.tgtd.targets().into_iter().find(|s| s.iqn == b.as_str()).unwrap();
    assert_eq!(b_after, b_before, "b is exactly as it was");
    assert_eq!(bob.capacity().unwrap().0 * 512, 64 << 20, "bob's open session keeps working");
    drop(bob);
    Session::login(&rig.target(&b, &chap_b), BOB).expect("and bob logs in again");
    assert!(Session::login(&rig.target(&a, &chap_a), ALICE).is_err());
}

#[tokio::test]
async fn chap_is_enforced_and_can_be_replaced_after_a_restart_of_the_host() {
    let rig = Rig::start();
    let (target, old) = export(&rig, &rig.service(), "c", ALICE).await;
    let login = |chap: &ChapCredentials| Session::login(&rig.target(&target, chap), ALICE).map(drop);
    login(&old).expect("the right secret logs in");
    let wrong = ChapCredentials::parse(old.user.as_str(), "wrongwrongwrongwrong").unwrap();
    assert!(login(&wrong).unwrap_err().contains("Authentication failure"));

    // A new host process does not know the account's secret (tgtd never shows it), so setting the
    // same user with another secret replaces the account without leaving the target open.
    let fresh = rig.service();
    let new =
        ChapCredentials::parse(old.user.as_str(), ChapPolicy::default().generate().secret.expose()).unwrap();
    fresh.set_chap(&target, &new).await.unwrap();
    login(&new).expect("the new secret logs in");
    assert!(login(&old).is_err(), "the old secret no longer does");
    let state = rig.tgtd.targets().into_iter().next().unwrap();
    assert_eq!(state.chap_users, vec![old.user.as_str().to_string()], "no temporary account is left bound");
}

#[tokio::test]
async fn a_backing_store_outside_the_data_directory_is_refused_before_any_command() {
    let rig = Rig::start();
    let dir = tempfile::tempdir().unwrap();
    let (wrapper, log) = berth_tests::tgt::recording_tgtadm(dir.path());
    let t = Tgtd::new(TgtdConfig { tgtadm: wrapper, ..rig.config() });
    let target = iqn("iqn.2010-10.org.openstack:volume-d");
    t.create_target(&target).await.unwrap();
    let calls = std::fs::read_to_string(&log).unwrap().lines().count();
    for path in ["/etc/shadow", &format!("{}/../x.img", rig.dir.path().display()), "volume.img"] {
        let e = t.add_lun(&target, Lun::new(1).unwrap(), path).await.unwrap_err();
        assert!(matches!(e, TargetError::InvalidArgument(_)), "{path}: {e}");
    }
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), calls, "no tgtadm command ran");
}

/// A stand-in `tgtadm` with the given shell body.
fn fake_tgtadm(dir: &Path, body: &str) -> std::path::PathBuf {
    let path = dir.join("tgtadm");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

#[tokio::test]
async fn a_command_that_hangs_times_out() {
    let rig = Rig::start();
    let dir = tempfile::tempdir().unwrap();
    let t = Tgtd::new(TgtdConfig {
        tgtadm: fake_tgtadm(dir.path(), "exec sleep 30"),
        timeout: Duration::from_millis(300),
        ..rig.config()
    });
    let started = Instant::now();
    let e = t.create_target(&iqn("iqn.2010-10.org.openstack:volume-e")).await.unwrap_err();
    assert!(matches!(e, TargetError::Timeout(_)), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10), "the command was not cut off");
}

#[tokio::test]
async fn a_success_that_did_not_happen_is_an_error() {
    let rig = Rig::start();
    let dir = tempfile::tempdir().unwrap();
    let t = Tgtd::new(TgtdConfig { tgtadm: fake_tgtadm(dir.path(), "exit 0"), ..rig.config() });
    let e = t.create_target(&iqn("iqn.2010-10.org.openstack:volume-f")).await.unwrap_err();
    assert!(matches!(e, TargetError::NotFound(_) | TargetError::Failed(_)), "{e}");
    let (target, _) = export(&rig, &rig.service(), "f2", ALICE).await;
    let e = t.allow_initiator(&target, &iqn(BOB)).await.unwrap_err();
    assert!(e.to_string().contains("not visible"), "{e}");
}

#[tokio::test]
async fn new_chap_credentials_replace_the_old_ones() {
    let rig = Rig::start();
    let t = rig.service();
    let (target, old) = export(&rig, &t, "g", ALICE).await;
    let new = ChapPolicy::default().generate();
    t.set_chap(&target, &new).await.unwrap();
    let state = rig.tgtd.targets().into_iter().next().unwrap();
    assert_eq!(state.chap_users, vec![new.user.as_str().to_string()], "only the new account is bound");
    assert!(
        !t.accounts().await.unwrap().contains(&old.user.as_str().to_string()),
        "the old account is deleted"
    );
    assert!(Session::login(&rig.target(&target, &old), ALICE).is_err());
    Session::login(&rig.target(&target, &new), ALICE).expect("the new credentials log in");
}

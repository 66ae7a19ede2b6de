//! The iSCSI target capability on a real tgtd: every operation is idempotent, touches one target
//! only, costs one exchange on tgtd's control socket, never reaches a restarted tgtd's other
//! targets, and times out; CHAP works with a real initiator.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use berth::capabilities::iscsi::{
    ChapCredentials, ChapPolicy, Iqn, Lun, TargetError, TargetService, TargetState,
};
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

    /// Accounts are deleted with their target (see `kept_accounts_...` for the default).
    fn config(&self) -> TgtdConfig {
        TgtdConfig {
            keep_exports: Duration::ZERO,
            ..TgtdConfig::new(self.tgtd.control_port, self.dir.path())
        }
    }

    fn service(&self) -> Tgtd {
        Tgtd::new(self.config())
    }

    /// A service keeping deleted targets bare for `keep`, remembering them in `state` (as a
    /// restarted service reads them back).
    fn keeping(&self, keep: Duration, state: &std::path::Path) -> Tgtd {
        Tgtd::new(TgtdConfig { keep_exports: keep, state_file: Some(state.to_path_buf()), ..self.config() })
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

/// The tests' tgtd is started as Berth starts its own: with the preload library loaded into tgtd
/// (and only into tgtd: the shell that starts it does not load it).
#[test]
fn the_tests_tgtd_has_the_preload_library_and_its_shell_has_not() {
    let tgtd = TgtdProcess::start();
    let pid = tgtd.pid().expect("tgtd is running");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(maps.contains("berth-tgtd-preload-"), "tgtd has the library loaded");
    let parent = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let ppid = parent.rsplit(')').next().unwrap().split_whitespace().nth(1).unwrap();
    let shell = std::fs::read_to_string(format!("/proc/{ppid}/maps")).unwrap();
    assert!(!shell.contains("berth-tgtd-preload-"), "the shell that started tgtd has not");
}

/// The tgtd processes with control port `control`.
fn tgtds_on(control: u16) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid: &i32| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"tgtd"))
                && args.windows(2).any(|w| w[0] == b"-C" && w[1] == control.to_string().as_bytes())
        })
        .collect()
}

/// A tgtd Berth starts itself (and the tests' tgtd, started the same way) gives every target a
/// NOP-In interval that never comes: with one, tgtd's full listing finds each target's NOP
/// settings without walking the list of every target (`ISCSI_NOP_NEVER`; half a listing's time
/// at 10,000 targets, BENCHMARKS.md). tgtd's own listing shows the interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tgtd_berth_starts_gives_each_target_a_nop_interval_that_never_comes() {
    let nop = |control: u16| {
        let out = std::process::Command::new("tgtadm")
            .args(["-C", &control.to_string(), "--lld", "iscsi", "--mode", "target", "--op", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains("Nop interval:")).count()
    };
    let rig = Rig::start();
    let t = rig.service();
    export(&rig, &t, "nop", ALICE).await;
    assert_eq!(nop(rig.tgtd.control_port), 1, "the tests' tgtd");

    // Ports nobody uses, for a tgtd of Berth's own (once the probe's tgtd is gone).
    let probe = TgtdProcess::start();
    let (control, portal) = (probe.control_port, probe.portal_port);
    drop(probe);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !tgtds_on(control).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = tempfile::tempdir().unwrap();
    let own = Tgtd::new(TgtdConfig::new(control, dir.path()));
    let portal = berth::capabilities::iscsi::Portal { address: "127.0.0.1".into(), port: portal };
    let started = own.ensure_running(&portal).await;
    // tgtd daemonises itself (in two processes): found by its control port, and stopped whatever
    // happened.
    let pids = tgtds_on(control);
    let listed = match started {
        Ok(true) => {
            own.create_target(&iqn("iqn.2010-10.org.openstack:volume-own")).await.unwrap();
            Ok(nop(control))
        }
        other => Err(other),
    };
    for pid in &pids {
        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{control}"));
    let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{control}.lock"));
    assert!(!pids.is_empty(), "a tgtd on control port {control}");
    assert_eq!(listed, Ok(1), "Berth's own tgtd");
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
async fn a_backing_store_outside_the_data_directory_is_refused_before_any_request() {
    let rig = Rig::start();
    let t = rig.service();
    let target = iqn("iqn.2010-10.org.openstack:volume-d");
    t.create_target(&target).await.unwrap();
    let changes = t.changes();
    for path in ["/etc/shadow", &format!("{}/../x.img", rig.dir.path().display()), "volume.img"] {
        let e = t.add_lun(&target, Lun::new(1).unwrap(), path).await.unwrap_err();
        assert!(matches!(e, TargetError::InvalidArgument(_)), "{path}: {e}");
    }
    assert_eq!(t.changes(), changes, "no request reached tgtd");
}

#[tokio::test]
async fn a_daemon_that_does_not_answer_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::UnixListener::bind(dir.path().join("socket.4242")).unwrap();
    // Accepts and holds every connection without a word.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let t = Tgtd::new(TgtdConfig {
        socket_dir: dir.path().to_path_buf(),
        timeout: Duration::from_millis(300),
        ..TgtdConfig::new(4242, dir.path())
    });
    let started = Instant::now();
    let e = t.create_target(&iqn("iqn.2010-10.org.openstack:volume-e")).await.unwrap_err();
    assert!(matches!(e, TargetError::Timeout(_)), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5), "the request was not cut off");
    silent.abort();
}

/// tgtd restarted between a LUN's creation and its UNMAP update: the new daemon has neither the
/// LUN nor its target, and adding the LUN says so (the export fails and is made again), where the
/// failed update was only logged and the LUN reported as there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lun_lost_to_a_tgtd_restart_before_its_unmap_update_is_not_reported_made() {
    use berth::failpoint;
    let mut rig = Rig::start();
    let t = Arc::new(rig.service());
    let target = iqn("iqn.2010-10.org.openstack:volume-thin");
    t.create_target(&target).await.unwrap();
    // Named for this target: the other tests of this process add LUNs too.
    let point = format!("tgt.add-lun.made {target}");
    failpoint::arm(&point, 1, failpoint::Action::Sleep, 5000);
    // On a thread and runtime of its own: the pause holds that thread, and the test goes on.
    let adding = {
        let (t, target, image) = (t.clone(), target.clone(), rig.image("thin.img"));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move { t.add_lun(&target, Lun::new(1).unwrap(), &image).await })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while failpoint::seen(&point) == 0 {
        assert!(Instant::now() < deadline, "the LUN was never made");
        std::thread::sleep(Duration::from_millis(10));
    }
    rig.tgtd.restart();
    let e = adding.join().unwrap().expect_err("the LUN is gone with the old tgtd");
    assert!(matches!(e, TargetError::NotFound(_)), "{e}");
    assert!(rig.tgtd.targets().is_empty(), "the new tgtd holds nothing");
}

/// The service keeps a model of tgtd's targets for one daemon. After tgtd restarts, target ids
/// may name other targets: a change meant for the old daemon must never reach a target of the
/// new one.
#[tokio::test]
async fn a_restarted_tgtd_is_noticed_before_any_change_reaches_the_wrong_target() {
    let mut rig = Rig::start();
    let t = rig.service();
    let (a, _) = export(&rig, &t, "a", ALICE).await;
    let tid = rig.tgtd.targets()[0].tid.to_string();

    rig.tgtd.restart();
    let other = "iqn.2010-10.org.openstack:volume-other";
    assert!(
        rig.tgtd.tgtadm(&["--op", "new", "--mode", "target", "--tid", &tid, "-T", other]).status.success()
    );

    let e = t.allow_initiator(&a, &iqn(BOB)).await.unwrap_err();
    assert!(matches!(e, TargetError::NotFound(_)), "{e}");
    let created = t.create_target(&a).await.unwrap();
    assert_ne!(created.tid.to_string(), tid, "the new daemon's target id is not reused");
    t.allow_initiator(&a, &iqn(BOB)).await.unwrap();
    let shown = rig.tgtd.targets();
    let foreign = shown.iter().find(|x| x.iqn == other).expect("the other target is there");
    assert!(foreign.initiators.is_empty(), "the other target's ACL was not touched: {foreign:?}");
    let ours = shown.iter().find(|x| x.iqn == a.as_str()).expect("ours was re-created");
    assert_eq!(ours.initiators, vec![BOB.to_string()]);
}

/// A target removed behind the service's back (same tgtd) is noticed at the next change to it:
/// tgtd answers "can't find the target", the model is reloaded, and the operation is decided
/// again on what tgtd has.
#[tokio::test]
async fn a_target_removed_behind_the_services_back_is_noticed_at_the_next_change() {
    let rig = Rig::start();
    let t = rig.service();
    let (a, _) = export(&rig, &t, "a", ALICE).await;
    let tid = rig.tgtd.targets()[0].tid.to_string();
    assert!(
        rig.tgtd.tgtadm(&["--op", "delete", "--mode", "target", "--force", "--tid", &tid]).status.success()
    );
    let e = t.allow_initiator(&a, &iqn(BOB)).await.unwrap_err();
    assert!(matches!(e, TargetError::NotFound(_)), "{e}");
    assert!(t.show(&a).await.unwrap().is_none(), "the model knows the target is gone");
    t.deny_initiator(&a, &iqn(ALICE)).await.expect("revoking on a missing target is not an error");
    export(&rig, &t, "a", ALICE).await;
    assert_eq!(rig.tgtd.targets()[0].initiators, vec![ALICE.to_string()]);
}

/// A listing (the reconciler's) taken while other targets change must not make the service forget
/// those changes: here listings run in a loop while eight targets are exported and half of them
/// removed again, concurrently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_while_targets_change_lose_no_change() {
    let rig = Rig::start();
    let t = Arc::new(rig.service());
    let images: Vec<String> = (0..8).map(|i| rig.image(&format!("r{i}.img"))).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lister = {
        let (t, stop) = (t.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                t.list().await.unwrap();
            }
        })
    };
    let mut tasks = Vec::new();
    for (i, image) in images.into_iter().enumerate() {
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..5 {
                let target = iqn(&format!("iqn.2010-10.org.openstack:volume-r{i}"));
                t.create_target(&target).await.unwrap();
                t.add_lun(&target, Lun::new(1).unwrap(), &image).await.unwrap();
                t.set_chap(&target, &ChapPolicy::default().generate()).await.unwrap();
                t.allow_initiator(&target, &iqn(ALICE)).await.unwrap();
                if i % 2 == 0 || round < 4 {
                    t.deny_initiator(&target, &iqn(ALICE)).await.unwrap();
                    t.delete_target(&target).await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("every change succeeds");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    lister.await.unwrap();
    let left = rig.tgtd.targets();
    assert_eq!(left.len(), 4, "{left:?}");
    for target in &left {
        assert_eq!(target.initiators, vec![ALICE.to_string()]);
        assert_eq!(target.chap_users.len(), 1);
        assert_eq!(
            t.show(&iqn(&target.iqn)).await.unwrap(),
            Some(TargetState::known_part(target)),
            "the model agrees with tgtd"
        );
    }
}

/// Listings may overlap (the reconciler's, and the reload of an operation that found tgtd
/// other than the model said), and the one answered first may be installed last. An older
/// listing installed after a newer one must change nothing: here it shows a target deleted since,
/// whose id a new target took, and if it brought the deleted target back into the model, the
/// next export of that name would be made on the other volume's target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_older_than_the_last_one_installed_does_not_bring_back_what_was_deleted() {
    let rig = Rig::start();
    let t = Arc::new(rig.service());
    let a = iqn("iqn.2010-10.org.openstack:volume-older-a");
    let b = iqn("iqn.2010-10.org.openstack:volume-older-b");
    let first = t.create_target(&a).await.unwrap();
    // The older listing: answered with `a` there, then held before it is installed.
    let older = listing_held(&rig, &t, Duration::from_millis(1500));
    t.delete_target(&a).await.unwrap();
    t.list().await.unwrap(); // a newer listing, installed first
    let other = t.create_target(&b).await.unwrap();
    assert_eq!(other.tid, first.tid, "the new target takes the deleted one's id");
    let listed = older.join().unwrap().unwrap();
    assert!(listed.iter().any(|x| x.iqn == a.as_str()), "the older listing did show `a`");

    assert_eq!(t.show(&a).await.unwrap(), None, "the deleted target stays deleted in the model");
    let again = t.create_target(&a).await.unwrap();
    assert_ne!(again.tid, other.tid, "`a` made again is not `b`'s target");
    t.add_lun(&a, Lun::new(1).unwrap(), &rig.image("older-a.img")).await.unwrap();
    let shown = rig.tgtd.targets();
    let b_shown = shown.iter().find(|x| x.iqn == b.as_str()).expect("b is there");
    assert!(b_shown.luns.is_empty(), "`a`'s store was exported on `b`'s target: {b_shown:?}");
    let a_shown = shown.iter().find(|x| x.iqn == a.as_str()).expect("a is there again");
    assert_eq!(a_shown.luns.len(), 1, "{a_shown:?}");
}

/// The same for a target kept after its deletion (`keep_exports_seconds`): a listing requested
/// before the target was stripped and installed after it shows the target with its LUN, not
/// bare, and must not make the service forget that the target is kept, or no sweep would ever
/// delete it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_requested_before_a_target_was_kept_does_not_make_the_service_forget_it() {
    let rig = Rig::start();
    let state = rig.dir.path().join("kept.json");
    let t = Arc::new(rig.keeping(Duration::from_millis(200), &state));
    let a = iqn("iqn.2010-10.org.openstack:volume-kept-late");
    t.create_target(&a).await.unwrap();
    t.add_lun(&a, Lun::new(1).unwrap(), &rig.image("kept-late.img")).await.unwrap();
    let older = listing_held(&rig, &t, Duration::from_millis(1000));
    // Answered (with the LUN) before the target is stripped, installed after.
    t.delete_target(&a).await.unwrap();
    let listed = older.join().unwrap().unwrap();
    assert!(listed.iter().all(|x| x.iqn != a.as_str()), "a kept target is hidden: {listed:?}");
    assert_eq!(t.show(&a).await.unwrap(), None, "a kept target is hidden");
    tokio::time::sleep(Duration::from_millis(300)).await;
    t.sweep().await.unwrap();
    let left = rig.tgtd.targets();
    assert!(left.iter().all(|x| x.iqn != a.as_str()), "the kept target outlived its time: {left:?}");
}

/// A listing of `t`'s (`TargetService::list`) on a thread of its own, held for `hold` between
/// tgtd's answer and its installation in the model; returns once tgtd has answered it.
fn listing_held(
    rig: &Rig,
    t: &Arc<Tgtd>,
    hold: Duration,
) -> std::thread::JoinHandle<Result<Vec<TargetState>, TargetError>> {
    use berth::failpoint;
    // Named for this rig's tgtd: the other tests of this process list targets too.
    let point = format!("tgt.listing.answered {}", rig.tgtd.control_port);
    failpoint::arm(&point, 1, failpoint::Action::Sleep, hold.as_millis() as u64);
    let listing = {
        let t = t.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move { t.list().await })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while failpoint::seen(&point) == 0 {
        assert!(Instant::now() < deadline, "the listing was never answered");
        std::thread::sleep(Duration::from_millis(10));
    }
    listing
}

/// A volume's CHAP account outlives its export (tgtd's account table is quadratic, so accounts
/// are not made and deleted with every export): deleting the target unbinds it, the next export
/// with the same credentials binds it again without making one, and the sweep deletes it once it
/// has been kept long enough.
#[tokio::test]
async fn kept_accounts_are_bound_again_and_swept_when_unused() {
    let rig = Rig::start();
    let t = Tgtd::new(TgtdConfig {
        keep_exports: Duration::from_millis(300),
        keep_accounts: Duration::from_millis(300),
        ..rig.config()
    });
    let (target, chap) = export(&rig, &t, "k", ALICE).await;
    let user = chap.user.as_str().to_string();
    t.deny_initiator(&target, &iqn(ALICE)).await.unwrap();
    t.delete_target(&target).await.unwrap();
    assert!(rig.tgtd.targets().iter().all(|t| t.chap_users.is_empty()), "no account is bound");
    assert!(t.accounts().await.unwrap().contains(&user), "the account is kept");

    // The next export with the volume's credentials binds the kept account (and takes the kept
    // target back with its LUN): neither an account, nor a target, nor a LUN is made.
    let before = t.changes();
    t.create_target(&target).await.unwrap();
    t.add_lun(&target, Lun::new(1).unwrap(), &rig.dir.path().join("k.img").display().to_string())
        .await
        .unwrap();
    t.set_chap(&target, &chap).await.unwrap();
    t.allow_initiator(&target, &iqn(ALICE)).await.unwrap();
    assert_eq!(t.changes() - before, 2, "bind account, allow initiator");
    Session::login(&rig.target(&target, &chap), ALICE).expect("the kept account logs in");
    assert_eq!(t.sweep().await.unwrap(), 0, "a bound account is not swept");

    t.deny_initiator(&target, &iqn(ALICE)).await.unwrap();
    t.delete_target(&target).await.unwrap();
    assert_eq!(t.sweep().await.unwrap(), 0, "not kept long enough yet");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(t.sweep().await.unwrap(), 2, "the kept target and its account");
    assert!(!t.accounts().await.unwrap().contains(&user), "swept");
    assert!(rig.tgtd.targets().is_empty());

    // An unbound account this process does not know (an earlier run kept it) is swept at once.
    let made_elsewhere = |user: &str, password: &str| {
        let made =
            rig.tgtd.tgtadm(&["--op", "new", "--mode", "account", "--user", user, "--password", password]);
        assert!(made.status.success(), "{user}");
    };
    made_elsewhere("stray", "straysecret12345678");
    assert_eq!(t.sweep().await.unwrap(), 1);
    assert!(t.accounts().await.unwrap().is_empty());

    // A per-initiator account an earlier run made is kept, as one released now: the same
    // initiator's next grant names it again, and each deletion costs tgtd a walk of every target.
    let earlier = format!("i{}", "0123456789abcdef".repeat(5).get(..40).unwrap());
    assert!(berth::capabilities::iscsi::initiators::is_initiator_account(&earlier));
    made_elsewhere(&earlier, "earliersecret1234");
    assert_eq!(t.sweep().await.unwrap(), 0, "an earlier run's per-initiator account is kept");
    assert_eq!(t.sweep().await.unwrap(), 0, "nor by the next");
    assert_eq!(t.accounts().await.unwrap(), [earlier]);
}

/// A driver that gives every export new credentials (the shipped `tgt-iscsi` does, so that a
/// detached host cannot log in again) never reuses an account: with the default
/// `keep_accounts`, an export's account is deleted when its target goes, while the target stays
/// kept; tgtd holds no more accounts than exports, also under an attach cycle faster than the
/// reconciler's sweeps.
#[tokio::test]
async fn accounts_left_by_exports_with_new_credentials_do_not_pile_up_in_tgtd() {
    let rig = Rig::start();
    let t = Tgtd::new(TgtdConfig { keep_exports: Duration::from_secs(3600), ..rig.config() });
    assert!(t.accounts().await.unwrap().is_empty());
    for round in 0..3 {
        for name in ["pa", "pb", "pc", "pd", "pe", "pf", "pg", "ph"] {
            let (target, _) = export(&rig, &t, name, ALICE).await;
            t.deny_initiator(&target, &iqn(ALICE)).await.unwrap();
            t.delete_target(&target).await.unwrap();
        }
        assert!(t.accounts().await.unwrap().is_empty(), "round {round}: none left by the exports");
        assert_eq!(t.sweep().await.unwrap(), 0, "round {round}: nothing for the sweep");
        assert_eq!(rig.tgtd.targets().len(), 8, "the targets are kept for reuse");
    }
    // A live export's account is never swept.
    let (live, chap) = export(&rig, &t, "live", ALICE).await;
    assert_eq!(t.sweep().await.unwrap(), 0);
    Session::login(&rig.target(&live, &chap), ALICE).expect("its account logs in");
}

/// An export whose target goes is kept inert for reuse (tgtd deletes targets in quadratic time):
/// its LUN stays, no ACL entry and no account, so nobody logs in; drivers no longer see it, the
/// next export of the volume takes it back with its id, a target with a session is deleted for
/// real (which closes the session), deleting it again deletes it, a restarted service still
/// knows it (state file), and the sweep deletes it once kept too long.
#[tokio::test]
async fn a_deleted_target_is_kept_inert_and_taken_back() {
    let rig = Rig::start();
    let state = rig.dir.path().join("kept.json");
    let keeping = || rig.keeping(Duration::from_millis(400), &state);
    let t = keeping();
    let (a, chap) = export(&rig, &t, "ka", ALICE).await;
    let tid = rig.tgtd.targets()[0].tid;
    t.deny_initiator(&a, &iqn(ALICE)).await.unwrap();
    t.delete_target(&a).await.unwrap();
    assert!(t.show(&a).await.unwrap().is_none(), "drivers see it deleted");
    assert!(t.list().await.unwrap().is_empty());
    let inert = rig.tgtd.targets();
    assert_eq!(inert.len(), 1, "tgtd keeps it");
    assert!(
        inert[0].luns.len() == 1 && inert[0].initiators.is_empty() && inert[0].chap_users.is_empty(),
        "kept with its LUN, no ACL entry, no account: {inert:?}"
    );
    assert!(Session::login(&rig.target(&a, &chap), ALICE).is_err(), "nobody logs in to a kept target");

    // A restarted service still knows it; the next export takes it back.
    let t = keeping();
    assert!(t.list().await.unwrap().is_empty(), "still hidden after a restart");
    let again = t.create_target(&a).await.unwrap();
    assert_eq!(again.tid, tid, "taken back with its id");
    t.add_lun(&a, Lun::new(1).unwrap(), &rig.image("ka.img")).await.unwrap();
    t.set_chap(&a, &chap).await.unwrap();
    t.allow_initiator(&a, &iqn(ALICE)).await.unwrap();
    let session = Session::login(&rig.target(&a, &chap), ALICE).expect("the export taken back works");

    // With a session, deleting deletes for real (and closes it).
    t.delete_target(&a).await.unwrap();
    assert!(rig.tgtd.targets().is_empty(), "a target with a session is deleted");
    assert!(session.capacity().is_err(), "its session is closed");
    drop(session);

    // Kept, then deleted again: gone. Kept, then left: swept.
    let (b, _) = export(&rig, &t, "kb", BOB).await;
    t.delete_target(&b).await.unwrap();
    assert_eq!(rig.tgtd.targets().len(), 1);
    t.delete_target(&b).await.unwrap();
    assert!(rig.tgtd.targets().is_empty(), "deleting a kept target deletes it");
    let (c, _) = export(&rig, &t, "kc", BOB).await;
    t.delete_target(&c).await.unwrap();
    t.sweep().await.unwrap();
    assert_eq!(rig.tgtd.targets().len(), 1, "the target is not kept long enough yet (its account goes)");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(t.sweep().await.unwrap() >= 1);
    assert!(rig.tgtd.targets().is_empty(), "swept");
}

/// A kept target's LUN is taken back as it is (tgtd hears of no LUN change), unless its store
/// changed size meanwhile (a volume extended while detached): then it is made again, and the
/// host that logs in sees the new size.
#[tokio::test]
async fn a_kept_targets_lun_is_taken_back_as_it_is_unless_its_store_grew() {
    let rig = Rig::start();
    let t = rig.keeping(Duration::from_secs(600), &rig.dir.path().join("kept.json"));
    let (a, chap) = export(&rig, &t, "la", ALICE).await;
    let store = rig.dir.path().join("la.img").display().to_string();
    let one = Lun::new(1).unwrap();
    let cycle = async |t: &Tgtd| {
        t.deny_initiator(&a, &iqn(ALICE)).await.unwrap();
        t.delete_target(&a).await.unwrap();
        let before = t.changes();
        t.create_target(&a).await.unwrap();
        t.add_lun(&a, one, &store).await.unwrap();
        let lun_changes = t.changes() - before;
        t.set_chap(&a, &chap).await.unwrap();
        t.allow_initiator(&a, &iqn(ALICE)).await.unwrap();
        let session = Session::login(&rig.target(&a, &chap), ALICE).expect("the export taken back works");
        let bytes = session.capacity().unwrap().0 * 512;
        drop(session);
        tokio::time::sleep(Duration::from_millis(200)).await;
        (lun_changes, bytes)
    };
    assert_eq!(cycle(&t).await, (0, 64 << 20), "taken back with its LUN: no change for tgtd");
    std::fs::OpenOptions::new().write(true).open(&store).unwrap().set_len(128 << 20).unwrap();
    let (changes, bytes) = cycle(&t).await;
    assert_eq!(bytes, 128 << 20, "the LUN of a store grown meanwhile is made again");
    assert!(changes >= 2, "its LUN deleted and added again: {changes} changes");
}

/// A reopening of a target's LUNs (an attached extend) turns the target's logins off while it
/// runs; one cut short (its process killed) leaves the target taking none. A LUN added to such a
/// target after a restart of the service, kept or not, is for a host about to log in: the target
/// takes logins again, then and there, not at the reconciler's next look.
#[tokio::test]
async fn a_target_left_taking_no_logins_takes_them_again_when_a_lun_is_added() {
    let rig = Rig::start();
    let state = rig.dir.path().join("kept.json");
    let keeping = || rig.keeping(Duration::from_secs(600), &state);
    let offline = |t: &Iqn| {
        let tid = rig.tgtd.targets().iter().find(|s| s.iqn == t.as_str()).unwrap().tid.to_string();
        let out = rig.tgtd.tgtadm(&[
            "--op", "update", "--mode", "target", "--tid", &tid, "--name", "state", "--value", "offline",
        ]);
        assert!(out.status.success(), "{out:?}");
    };
    let taking = |t: &Iqn| rig.tgtd.targets().iter().any(|s| s.iqn == t.as_str() && !s.offline);

    // Kept bare, taking no logins, then taken back by a restarted service.
    let t = keeping();
    let (a, chap) = export(&rig, &t, "oa", ALICE).await;
    offline(&a);
    assert!(Session::login(&rig.target(&a, &chap), ALICE).is_err(), "an offline target takes no login");
    t.deny_initiator(&a, &iqn(ALICE)).await.unwrap();
    t.delete_target(&a).await.unwrap();
    let t = keeping();
    t.create_target(&a).await.unwrap();
    t.add_lun(&a, Lun::new(1).unwrap(), &rig.image("oa.img")).await.unwrap();
    t.set_chap(&a, &chap).await.unwrap();
    t.allow_initiator(&a, &iqn(ALICE)).await.unwrap();
    assert!(taking(&a), "the target takes logins again");
    Session::login(&rig.target(&a, &chap), ALICE).expect("the export taken back takes the host's login");

    // Still exporting its LUN (the export made again, as recovery does): the same.
    let (b, chap) = export(&rig, &t, "ob", BOB).await;
    offline(&b);
    let t = keeping();
    t.add_lun(&b, Lun::new(1).unwrap(), &rig.image("ob.img")).await.unwrap();
    assert!(taking(&b));
    Session::login(&rig.target(&b, &chap), BOB).expect("the export made again takes the host's login");
}

/// Operations cost one exchange each, whatever the number of targets: after the model is
/// loaded once, nothing lists tgtd's targets again.
#[tokio::test]
async fn operations_do_not_list_every_target() {
    let rig = Rig::start();
    let t = rig.service();
    for i in 0..20 {
        export(&rig, &t, &format!("n{i}"), ALICE).await;
    }
    let listings = t.listings();
    assert_eq!(listings, 1, "only the first operation loaded the model");
    let (x, _) = export(&rig, &t, "x", BOB).await;
    t.show(&x).await.unwrap().expect("shown");
    t.deny_initiator(&x, &iqn(BOB)).await.unwrap();
    t.delete_target(&x).await.unwrap();
    assert_eq!(t.listings(), listings, "no operation listed tgtd's targets");
    assert_eq!(rig.tgtd.targets().len(), 20);
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

/// Kept targets' LUNs count against the ceiling, and give way to a new LUN there: the longest
/// kept loses its LUN (the target stays kept, bare: deleting a target costs tgtd a walk of every
/// target), and the new LUN is admitted.
#[tokio::test]
async fn a_kept_targets_lun_makes_room_for_a_new_one_at_the_ceiling() {
    let rig = Rig::start();
    let t = Tgtd::new(TgtdConfig {
        max_luns: Some(1),
        keep_exports: Duration::from_secs(600),
        state_file: Some(rig.dir.path().join("kept.json")),
        ..rig.config()
    });
    let (first, _) = export(&rig, &t, "e1", ALICE).await;
    t.deny_initiator(&first, &iqn(ALICE)).await.unwrap();
    t.delete_target(&first).await.unwrap();
    assert_eq!(rig.tgtd.targets().len(), 1, "kept");
    assert_eq!(t.lun_capacity().map(|c| c.held), Some(1), "a kept LUN is held");
    let (second, chap) = export(&rig, &t, "e2", ALICE).await;
    let targets = rig.tgtd.targets();
    let luns_of = |iqn: &Iqn| targets.iter().find(|t| t.iqn == iqn.as_str()).map(|t| t.luns.len());
    assert_eq!(
        (luns_of(&first), luns_of(&second)),
        (Some(0), Some(1)),
        "the kept LUN made room: {targets:?}"
    );
    assert_eq!(t.lun_capacity().map(|c| c.held), Some(1));
    Session::login(&rig.target(&second, &chap), ALICE).expect("the new export works");
    // The first volume's next export takes its kept target back, bare, and finds no room for its
    // LUN: refused, as before.
    let before = t.changes();
    assert_eq!(t.create_target(&first).await.unwrap().luns, vec![]);
    assert_eq!(t.changes(), before, "taken back, not made");
    let e = t.add_lun(&first, Lun::new(1).unwrap(), &rig.image("e1.img")).await.unwrap_err();
    assert!(matches!(&e, TargetError::Failed(m) if m.contains("[tgt] max_luns = 1")), "{e}");
}

/// The service refuses a LUN beyond its ceiling itself (whatever a driver does), before tgtd
/// hears of it, naming the limit; the LUN it already has stays admissible (idempotent), and a
/// removed LUN makes room.
#[tokio::test]
async fn a_lun_beyond_the_ceiling_is_refused_before_tgtd_hears_of_it() {
    let rig = Rig::start();
    let t = Tgtd::new(TgtdConfig { max_luns: Some(1), ..rig.config() });
    assert_eq!(t.lun_capacity().map(|c| (c.held, c.ceiling)), Some((0, 1)));
    let (first, _) = export(&rig, &t, "c1", ALICE).await;
    let second = iqn("iqn.2010-10.org.openstack:volume-c2");
    t.create_target(&second).await.unwrap();
    let (before, changes) = (rig.tgtd.targets(), t.changes());
    let e = t.add_lun(&second, Lun::new(1).unwrap(), &rig.image("c2.img")).await.unwrap_err();
    assert!(matches!(&e, TargetError::Failed(m) if m.contains("[tgt] max_luns = 1")), "{e}");
    assert_eq!((rig.tgtd.targets(), t.changes()), (before, changes), "tgtd heard nothing");
    assert!(t.admit_lun().is_err() && t.holds_luns(first.as_str()) && !t.holds_luns(second.as_str()));
    // The LUN the first target has is admitted again (idempotent); removing it makes room.
    t.add_lun(&first, Lun::new(1).unwrap(), &rig.dir.path().join("c1.img").display().to_string())
        .await
        .unwrap();
    t.remove_lun(&first, Lun::new(1).unwrap()).await.unwrap();
    t.add_lun(&second, Lun::new(1).unwrap(), &rig.image("c2.img")).await.unwrap();
    assert_eq!(t.lun_capacity().map(|c| c.held), Some(1));
}

/// Per-initiator accounts (`capabilities/iscsi/initiators.rs`) on one target, each bound beside
/// the others. tgtd 1.0.85 mishandles unbinding any but a target's last account (a hole that hides
/// the last one from logins and crashes `show target`): unbinding the first and the middle one
/// must leave the others logging in, tgtd answering, and no moment in which the ACL admits a
/// login without CHAP.
#[tokio::test]
async fn an_initiators_account_unbound_from_a_target_leaves_the_others_logging_in() {
    use berth::capabilities::iscsi::initiators::InitiatorKey;
    const CAROL: &str = "iqn.1993-08.org.debian:01:carol";
    let rig = Rig::start();
    let t = rig.service();
    let target = iqn("iqn.2010-10.org.openstack:volume-m");
    t.create_target(&target).await.unwrap();
    t.add_lun(&target, Lun::new(1).unwrap(), &rig.image("m.img")).await.unwrap();
    let key = InitiatorKey::random();
    let policy = ChapPolicy::default();
    let creds: Vec<ChapCredentials> =
        [ALICE, BOB, CAROL].iter().map(|i| key.credentials("tgt", i, "p1", &policy)).collect();
    for (initiator, c) in [ALICE, BOB, CAROL].iter().zip(&creds) {
        t.bind_account(&target, c).await.unwrap();
        t.bind_account(&target, c).await.unwrap();
        t.allow_initiator(&target, &iqn(initiator)).await.unwrap();
    }
    let bound = |rig: &Rig| rig.tgtd.targets().into_iter().next().unwrap().chap_users;
    let users: Vec<String> = creds.iter().map(|c| c.user.as_str().to_string()).collect();
    assert_eq!(bound(&rig), users);
    for (initiator, c) in [ALICE, BOB, CAROL].iter().zip(&creds) {
        Session::login(&rig.target(&target, c), initiator)
            .expect("each initiator logs in with its own account");
    }

    // Alice's, the first: the ACL closes while no account is bound, and opens again.
    t.deny_initiator(&target, &iqn(ALICE)).await.unwrap();
    t.unbind_account(&target, &creds[0].user).await.unwrap();
    assert_eq!(bound(&rig), users[1..].to_vec(), "tgtd lists the others (and did not crash)");
    let state = rig.tgtd.targets().into_iter().next().unwrap();
    assert_eq!(state.initiators, vec![BOB.to_string(), CAROL.to_string()]);
    let e = Session::login(&rig.target(&target, &creds[0]), BOB).err().expect("alice's account is unbound");
    assert!(e.contains("Authentication failure"), "{e}");
    for (initiator, c) in [BOB, CAROL].iter().zip(&creds[1..]) {
        Session::login(&rig.target(&target, c), initiator).expect("the others still log in");
    }
    // Its account stays in tgtd for alice's other targets and her next attach.
    assert!(rig.tgtd.accounts().contains(&users[0]));

    // Bob's, now the first of two; then carol's, the last, with nobody left in the ACL.
    t.deny_initiator(&target, &iqn(BOB)).await.unwrap();
    t.unbind_account(&target, &creds[1].user).await.unwrap();
    Session::login(&rig.target(&target, &creds[2]), CAROL).expect("carol still logs in");
    let e = t.unbind_account(&target, &creds[2].user).await.unwrap_err();
    assert!(
        e.to_string().contains("deny the initiators first"),
        "the target would admit carol without CHAP: {e}"
    );
    t.deny_initiator(&target, &iqn(CAROL)).await.unwrap();
    t.unbind_account(&target, &creds[2].user).await.unwrap();
    t.unbind_account(&target, &creds[2].user).await.unwrap();
    assert!(bound(&rig).is_empty());

    // Deleting the target keeps the per-initiator accounts (they are the hosts', not the export's).
    t.bind_account(&target, &creds[0]).await.unwrap();
    t.delete_target(&target).await.unwrap();
    let accounts = rig.tgtd.accounts();
    assert!(users.iter().all(|u| accounts.contains(u)), "{accounts:?}");
}

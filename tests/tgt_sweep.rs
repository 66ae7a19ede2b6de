//! The account sweep runs beside exports: a sweep that lists tgtd's accounts between an export's
//! account creation and its bind must not take the new account for an unknown one and delete it
//! (which made fills of thousands of attachments fail with "can't find the account"). Alone in
//! its binary: it arms a process-wide failpoint.

use std::sync::Arc;
use std::time::Duration;

use berth::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use berth::capabilities::iscsi::{ChapPolicy, Iqn, TargetService};
use berth::failpoint::{Action, arm, reset};
use berth_tests::tgt::TgtdProcess;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_between_an_accounts_creation_and_its_bind_leaves_it_alone() {
    let tgtd = TgtdProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let t = Arc::new(Tgtd::new(TgtdConfig::new(tgtd.control_port, dir.path())));
    let iqn = Iqn::parse("iqn.2010-10.org.openstack:sweep:volume-1").unwrap();
    t.create_target(&iqn).await.unwrap();
    reset(false);
    // The export stops for a while right after tgtd made its account.
    arm("tgt.account-created", 1, Action::Sleep, 2000);
    let credentials = ChapPolicy::default().generate();
    let export = {
        let (t, iqn, credentials) = (t.clone(), iqn.clone(), credentials.clone());
        tokio::spawn(async move { t.set_chap(&iqn, &credentials).await })
    };
    // Wait until tgtd has the account (the export is then held at the failpoint, before its bind).
    let user = credentials.user.as_str().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !tgtd.accounts().contains(&user) {
        assert!(std::time::Instant::now() < deadline, "the export never created its account");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t.sweep().await.unwrap();
    export.await.unwrap().expect("the bind finds its account");
    reset(false);
    let shown = t.show(&iqn).await.unwrap().unwrap();
    assert_eq!(shown.chap_users, vec![credentials.user.as_str().to_string()]);
}

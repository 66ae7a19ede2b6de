//! Drivers are confined to their backend: a hostile driver granted `iscsi-target` and
//! `backing-store` attempts every cross-backend action against another backend's exported volume
//! on a real tgtd (the per-initiator accounts of `berth:iscsi-chap` included), and each is refused
//! while nothing of the victim's changes (tgtd's target, its ACL and CHAP account, the backing
//! file). The two backends share one node key, as under `berth serve`, and the hostile calls are
//! made for the victim's own project: the backend alone keeps their accounts apart. And what a
//! driver changes that outlives the machine's power waits for its operation's intent to be on
//! disk, where tgtd's targets, lost with the power, do not.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use berth::capabilities::backing::BackingStores;
use berth::capabilities::iscsi::initiators::{InitiatorKey, initiator_prefix};
use berth::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use berth::capabilities::iscsi::{IscsiCapability, Portal, TargetService};
use berth::capabilities::namespace::Namespace;
use berth::capabilities::{DriverCapabilities, Grant};
use berth::runtime::model::VolumeFields;
use berth::runtime::{Driver, DriverSpec, Limits, WasmSource};
use berth_tests::drivers::{
    component, connector, counting_before_lasting, refusing_before_lasting, runtime, volume,
};
use berth_tests::tgt::TgtdProcess;

const ALICE: &str = "iqn.1993-08.org.debian:01:alice";

struct Rig {
    tgtd: TgtdProcess,
    dir: tempfile::TempDir,
    service: Arc<dyn TargetService>,
    key: InitiatorKey,
}

impl Rig {
    fn start() -> Rig {
        let tgtd = TgtdProcess::start();
        let dir = tempfile::tempdir().unwrap();
        let config = TgtdConfig {
            keep_exports: Duration::ZERO,
            ..TgtdConfig::new(tgtd.control_port, dir.path().join("volumes"))
        };
        let service: Arc<dyn TargetService> = Arc::new(Tgtd::new(config));
        Rig { tgtd, dir, service, key: InitiatorKey::random() }
    }

    /// Loads `component` as backend `backend`, confined as `berth serve` confines it.
    async fn load(&self, backend: &str, component_name: &str) -> Driver {
        let namespace = Namespace::new(backend, &BTreeMap::new()).unwrap();
        let stores = Arc::new(
            BackingStores::new(self.dir.path().join("volumes"), &namespace, Duration::from_secs(10)).unwrap(),
        );
        let capabilities = DriverCapabilities {
            settings: Arc::new(namespace.settings(&BTreeMap::new())),
            iscsi: Some(IscsiCapability {
                service: self.service.clone(),
                portals: vec![Portal { address: "127.0.0.1".into(), port: self.tgtd.portal_port }],
                chap: Default::default(),
                stores: stores.clone(),
                namespace,
                initiator_key: self.key.clone(),
            }),
            backing: Some(stores),
            network: None,
            cephx: None,
        };
        let spec = DriverSpec {
            backend: backend.into(),
            wasm: WasmSource::File(component(component_name)),
            grants: Grant::ALL.into_iter().collect(),
            limits: Limits::default(),
            capabilities,
        };
        runtime().load(spec).await.expect("the driver loads")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_driver_cannot_reach_another_backends_stores_or_targets() {
    let rig = Rig::start();
    let victim = rig.load("victim", "tgt-iscsi").await;
    let hostile = rig.load("hostile", "hostile").await;

    // The victim backend exports a volume to alice, with CHAP.
    let mut v = volume("aaaaaaaa-0000-4000-8000-000000000001", &[]);
    let mut fields = VolumeFields::of(&v);
    let mut calls = victim.calls().for_owner("victims-project");
    fields.apply(&calls.create_volume(&v).await.unwrap()).unwrap();
    fields.write_to(&mut v);
    fields.apply(&calls.create_export(&v, Some(&connector(ALICE))).await.unwrap()).unwrap();
    fields.write_to(&mut v);
    let connection = calls.initialize_connection(&v, &connector(ALICE)).await.unwrap();
    fields.apply(&connection.update).unwrap();
    fields.write_to(&mut v);
    let before = rig.tgtd.targets();
    let accounts_before = rig.tgtd.accounts();
    assert_eq!(before.len(), 1, "{before:?}");
    let target = before[0].clone();
    assert!(target.iqn.starts_with("iqn.2010-10.org.openstack:victim:"), "{}", target.iqn);
    let chap_user = target.chap_users.first().cloned().expect("the victim's target has CHAP");
    let store = v.name.clone();
    let image = rig.dir.path().join(format!("volumes/victim/{store}.img"));
    let image_before = std::fs::metadata(&image).expect("the victim's store exists").len();

    // The hostile backend attacks.
    let attack = volume(
        "bbbbbbbb-0000-4000-8000-000000000002",
        &[
            ("victim.target", &target.iqn),
            ("victim.store", &store),
            ("victim.chap-user", &chap_user),
            ("victim.initiator", ALICE),
        ],
    );
    let update = hostile
        .calls()
        .for_owner("victims-project")
        .create_volume(&attack)
        .await
        .expect("the hostile call returns its report");
    let report: BTreeMap<String, String> = update.set_data.into_iter().collect();
    let expected = [
        "show-target",
        "create-target",
        "add-lun",
        "remove-lun",
        "allow-initiator",
        "deny-initiator",
        "set-chap",
        "list-sessions",
        "close-sessions",
        "grant-account",
        "revoke-account",
        "revoke-every-account",
        "delete-target",
        "store-info",
        "store-resize",
        "store-delete",
        "store-create",
        "export-foreign-store",
        "steal-chap-account",
    ];
    for name in expected {
        let outcome = report
            .get(&format!("attack.{name}"))
            .unwrap_or_else(|| panic!("no report of {name}: {report:?}"));
        assert!(
            outcome.starts_with("refused: ")
                && outcome.contains("NotPermitted(")
                && outcome.contains("does not belong to backend hostile"),
            "{name}: a typed refusal: {outcome}"
        );
    }
    for own in ["own-target", "own-grant", "own-revoke", "own-revoke-every"] {
        assert_eq!(report[&format!("attack.{own}")], "ALLOWED", "{own}: its own namespace is its own");
    }
    // Alice's account on its own target is another than the victim's, for the same project and
    // node key: the name is in the hostile backend's namespace.
    let grant_user = &report["own.grant-user"];
    assert!(
        chap_user.starts_with(&initiator_prefix("victim", ALICE)),
        "the victim's account is alice's: {chap_user}"
    );
    assert!(grant_user.starts_with(&initiator_prefix("hostile", ALICE)), "{grant_user}");
    assert_ne!(grant_user, &chap_user);

    // Nothing of the victim's changed: its target still binds alice's account, which still exists;
    // the only account added is the hostile backend's own (kept unbound for reuse).
    let after = rig.tgtd.targets();
    assert_eq!(after, before, "tgtd's targets changed");
    let mut accounts_expected = accounts_before.clone();
    accounts_expected.push(grant_user.clone());
    accounts_expected.sort();
    let mut accounts_after = rig.tgtd.accounts();
    accounts_after.sort();
    assert_eq!(accounts_after, accounts_expected, "tgtd's CHAP accounts changed");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), image_before, "the victim's store changed");
    assert!(!rig.dir.path().join(format!("volumes/hostile/{store}.img")).exists(), "no copy was made");
}

/// Before a capability call whose change outlives the machine's power (here a backing store), a
/// driver call awaits what its operation must make durable first (`DriverCalls::before_lasting`:
/// the operation's intent, written but not yet synced); refused there, the change is not made.
/// The target service's changes, which tgtd loses with the power, await nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_outlives_the_power_waits_for_the_operations_intent_and_tgtds_do_not() {
    let rig = Rig::start();
    let driver = rig.load("lasting", "tgt-iscsi").await;
    let mut v = volume("cccccccc-0000-4000-8000-000000000003", &[]);
    let image = rig.dir.path().join(format!("volumes/lasting/{}.img", v.name));

    let refusing = refusing_before_lasting("the log could not be synced");
    let error = driver.calls().before_lasting(refusing).create_volume(&v).await.unwrap_err();
    assert!(error.to_string().contains("the log could not be synced"), "{error}");
    assert!(!image.exists(), "the refused change was not made");

    let (counting, waits) = counting_before_lasting();
    let mut fields = VolumeFields::of(&v);
    let mut calls = driver.calls().for_owner("a-project").before_lasting(counting);
    fields.apply(&calls.create_volume(&v).await.unwrap()).unwrap();
    fields.write_to(&mut v);
    assert_eq!(waits.load(Ordering::SeqCst), 1, "the store's creation waited");
    assert!(image.exists(), "and was made");

    fields.apply(&calls.create_export(&v, Some(&connector(ALICE))).await.unwrap()).unwrap();
    fields.write_to(&mut v);
    calls.initialize_connection(&v, &connector(ALICE)).await.unwrap();
    assert_eq!(waits.load(Ordering::SeqCst), 1, "an export on tgtd waits for nothing");
    let targets = rig.tgtd.targets();
    assert!(targets.iter().any(|t| t.initiators == [ALICE.to_string()] && !t.luns.is_empty()), "{targets:?}");
}

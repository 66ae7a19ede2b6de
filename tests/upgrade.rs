//! Driver upgrades while serving (`upgrade/`, `berth driver upgrade|rollback`), on a real tgtd
//! under load: clients cycle attachments while the backend's driver is upgraded (from the
//! tgt-iscsi release built for contract 0.2.0 to this build's) and rolled back, by hand and on
//! its own after a new driver does worse than the old one. No request fails because of a
//! switch, every event of the attach history names a driver that was running when it was
//! recorded, and tgtd equals the database afterwards.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth_tests::cluster::Cluster;
use berth_tests::drivers::component;
use berth_tests::invariants;
use berth_tests::server::{Client, connector};
use berth_tests::tgt::Rig;
use serde_json::{Value, json};

/// tgt-iscsi as released for contract 0.2.0: the driver a backend runs before its upgrade.
fn released() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../drivers/fixtures/binary/tgt-iscsi-0.2.0.wasm")
}

fn sha256(path: &std::path::Path) -> String {
    berth::runtime::inspect::Inspection::of(&std::fs::read(path).unwrap()).unwrap().sha256
}

/// A rig whose backend `tgt` runs the released driver, with `settings` and `[upgrades]` keys.
fn rig(settings: &str, upgrades: &str) -> Rig {
    Rig::start_with(&format!(
        r#"
[[backends]]
name = "tgt"
wasm = "{}"
grants = ["iscsi-target", "backing-store"]
settings = {{ {settings} }}
[[volume_types]]
name = "__DEFAULT__"
backend = "tgt"
[upgrades]
{upgrades}
"#,
        released().display()
    ))
}

async fn upgrade(c: &Client, backend: &str, wasm: &std::path::Path) -> berth_tests::server::Resp {
    c.post(
        &format!("/os-drivers/{backend}/action"),
        json!({"os-upgrade": {"wasm": wasm.display().to_string()}}),
    )
    .await
}

async fn running(c: &Client) -> Value {
    let drivers = c.get("/os-drivers").await.expect(200).body;
    drivers["drivers"].as_array().unwrap().iter().find(|d| d["backend"] == "tgt").unwrap().clone()
}

/// Waits until the running driver has made `calls` calls (the baseline a watch compares with).
async fn baseline(c: &Client, calls: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while running(c).await["driver"]["counts"]["calls"].as_u64().unwrap() < calls {
        assert!(Instant::now() < deadline, "the driver got no calls");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the backend runs the driver of `digest` again; what `GET /os-drivers` says then.
async fn rolled_back_to(c: &Client, digest: &str, what: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = running(c).await;
        if now["driver"]["sha256"] == json!(digest) {
            return now;
        }
        assert!(Instant::now() < deadline, "{what}: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clients cycling attachments (create with a connector, complete, delete), each on a volume of
/// its own, until stopped; what failed, by call.
struct Load {
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<(u32, Vec<String>)>>,
}

impl Load {
    async fn start(c: &Client, clients: usize) -> Load {
        Load::start_on(&vec![c.clone(); clients], json!({"size": 1})).await
    }

    /// One client per entry of `clients` (each may talk to another node), each on a volume made
    /// with `volume`.
    async fn start_on(clients: &[Client], volume: Value) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (i, c) in clients.iter().enumerate() {
            let volume = c.create_volume(volume.clone()).await;
            let (c, stop) = (c.fresh_connection(), stop.clone());
            handles.push(tokio::spawn(async move {
                let initiator = format!("iqn.1993-08.org.debian:01:load-{i}");
                let (mut cycles, mut failures) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let r = c.attach(&volume, Some(connector(&initiator, &format!("host-{i}")))).await;
                    if r.status != 200 {
                        failures.push(format!("create: {} {}", r.status, r.body));
                        continue;
                    }
                    let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
                    let done =
                        c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await;
                    if done.status != 204 {
                        failures.push(format!("complete: {} {}", done.status, done.body));
                    }
                    let gone = c.delete(&format!("/attachments/{id}")).await;
                    if gone.status != 200 {
                        failures.push(format!("delete: {} {}", gone.status, gone.body));
                    }
                    cycles += 1;
                }
                (cycles, failures)
            }));
        }
        Load { stop, clients: handles }
    }

    async fn stop(self) -> (u32, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let (mut cycles, mut failures) = (0, Vec::new());
        for h in self.clients {
            let (n, f) = h.await.unwrap();
            cycles += n;
            failures.extend(f);
        }
        (cycles, failures)
    }
}

/// Every event of the attach history: (time in microseconds, event, driver digest).
async fn history(rig: &Rig) -> Vec<(i64, String, Option<String>)> {
    let store = invariants::open(&rig.db_url()).await;
    store
        .read(async |tx| {
            let rows =
                tx.query("SELECT at, event, driver_digest FROM attach_events ORDER BY at", &[]).await?;
            rows.iter()
                .map(|r| Ok::<_, berth::store::StoreError>((r.int(0)?, r.text(1)?, r.opt_text(2)?)))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_is_upgraded_and_rolled_back_under_load_and_no_request_fails() {
    let rig = rig("", "watch_seconds = 0");
    let c = rig.client();
    let (old, new) = (sha256(&released()), sha256(&component("tgt-iscsi")));
    let before = running(&c).await;
    assert_eq!((&before["driver"]["sha256"], &before["driver"]["how"]), (&json!(old), &json!("configured")));
    assert_eq!(before["driver"]["contract"], "berth:driver@0.2.0");

    let load = Load::start(&c, 3).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // With the live check: a scratch volume's life on this tgtd through the new driver first.
    let body = json!({"os-upgrade": {"wasm": component("tgt-iscsi").display().to_string(), "live": true}});
    let up = c.post("/os-drivers/tgt/action", body).await.expect(200).body["upgrade"].clone();
    assert_eq!((&up["driver"]["sha256"], &up["previous"]["sha256"]), (&json!(new), &json!(old)));
    assert_eq!(up["live"]["driver_volume_type"], "iscsi", "{}", up["live"]);
    assert_eq!(up["live"]["steps"].as_array().map(Vec::len), Some(6), "{}", up["live"]);
    let scratch = up["live"]["volume"].as_str().unwrap().trim_start_matches("volume-").to_string();
    assert!(!rig.exported(&scratch) && !rig.backing_file(&scratch).exists(), "the scratch volume is gone");
    assert_eq!(up["conformance"]["failed"], 0, "{}", up["conformance"]);
    assert!(up["conformance"]["passed"].as_u64().unwrap() > 20, "{}", up["conformance"]);
    let upgraded_at = up["driver"]["since_us"].as_i64().unwrap();
    // The new driver serves: its calls are counted, and os-services shows what this node runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(&c).await["driver"]["counts"]["calls"].as_u64().unwrap() < 10 {
        assert!(Instant::now() < deadline, "the new driver got no calls");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let services = c.get("/os-services").await.expect(200).body;
    let tgt =
        services["services"].as_array().unwrap().iter().find(|s| s["binary"] == "cinder-volume").unwrap();
    assert_eq!((&tgt["driver_digest"], &tgt["driver_how"]), (&json!(new), &json!("upgraded")), "{tgt}");
    // `berth driver list`, as an operator runs it.
    let listed = std::process::Command::new(berth_tests::process::berth_binary())
        .args(["driver", "list", "--os-endpoint", &rig.endpoint(), "--os-auth-type", "noauth"])
        .args(["--os-project-id", "e2e", "--os-user-id", "operator"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains(&new) && listed.contains("\"upgraded\""), "{listed}");

    let back =
        c.post("/os-drivers/tgt/action", json!({"os-rollback": {}})).await.expect(200).body["rollback"]
            .clone();
    assert_eq!((&back["driver"]["sha256"], &back["previous"]["sha256"]), (&json!(old), &json!(new)));
    let rolled_back_at = back["driver"]["since_us"].as_i64().unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (cycles, failures) = load.stop().await;
    assert!(failures.is_empty(), "requests failed across the switches: {failures:#?}");
    assert!(cycles > 30, "only {cycles} cycles");

    // Each event names a driver that ran then: the old one before the upgrade, either one
    // between (an operation keeps the driver it started with), and the old one once the
    // operations begun before the rollback are over.
    let events = history(&rig).await;
    let by_new: Vec<_> = events.iter().filter(|(_, _, d)| d.as_deref() == Some(new.as_str())).collect();
    assert!(by_new.len() > 10, "few events by the new driver: {}", by_new.len());
    for (at, event, digest) in &events {
        let digest = digest.as_deref().unwrap_or("none");
        assert!(digest == old || digest == new, "{event} at {at} names driver {digest}");
        if *at < upgraded_at || *at > rolled_back_at + 500_000 {
            assert_eq!(
                digest, old,
                "{event} at {at} (upgrade at {upgraded_at}, rollback at {rolled_back_at})"
            );
        }
    }
    let store = invariants::open(&rig.db_url()).await;
    invariants::settled(&store, &rig.tgtd, Duration::from_secs(10)).await.expect("tgtd equals the database");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_is_refused_with_its_reason_and_changes_nothing() {
    // The released driver ignores these settings; the flawed fixture, posing as a new
    // tgt-iscsi, leaks a backing store, which the conformance suite (run with the backend's own
    // settings) catches.
    let port = berth_tests::pg::free_port();
    let rig = rig(
        r#"flaw = "leak-store", pose = "tgt-iscsi""#,
        &format!("watch_seconds = 0\n[metrics]\nlisten = \"127.0.0.1:{port}\""),
    );
    let c = rig.client();
    let old = sha256(&released());
    let dir = tempfile::tempdir().unwrap();

    // Not a component.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").unwrap();
    let m = upgrade(&c, "tgt", &junk).await.fault(400, "badRequest");
    assert_eq!(
        m,
        "not a WebAssembly component: the file begins with \"not \", not with WebAssembly's magic \"\\0asm\""
    );
    // Another driver, not a new version of this one.
    let m = upgrade(&c, "tgt", &component("fake")).await.fault(409, "conflictingRequest");
    assert!(m.contains("it is driver fake, not tgt-iscsi"), "{m}");
    // A driver that needs a grant the operator did not give.
    let m = upgrade(&c, "tgt", &component("netprobe")).await.fault(409, "conflictingRequest");
    assert!(m.contains("needs the network grant"), "{m}");
    // One that fails the conformance suite: the answer names the checks and why.
    let m = upgrade(&c, "tgt", &component("flawed")).await.fault(409, "conflictingRequest");
    assert!(m.contains("it failed conformance checks") && m.contains("as they were"), "{m}");
    // The one already running.
    let m = upgrade(&c, "tgt", &released()).await.fault(409, "conflictingRequest");
    assert!(m.contains("already runs this driver"), "{m}");
    // No such backend; a relative path; nothing to roll back to; not an admin.
    upgrade(&c, "nope", &component("tgt-iscsi")).await.fault(404, "itemNotFound");
    c.post("/os-drivers/tgt/action", json!({"os-upgrade": {"wasm": "tgt-iscsi.wasm"}}))
        .await
        .fault(400, "badRequest");
    let m =
        c.post("/os-drivers/tgt/action", json!({"os-rollback": {}})).await.fault(409, "conflictingRequest");
    assert_eq!(m, "backend tgt has no previous driver to go back to");
    let member = c.with_roles("member");
    upgrade(&member, "tgt", &component("tgt-iscsi")).await.fault(403, "forbidden");
    member.get("/os-drivers").await.fault(403, "forbidden");
    // Both URL forms (with the project, and without it as from 3.67).
    c.at("3.67").without_project_in_url().get("/os-drivers").await.expect(200);

    let now = running(&c).await;
    assert_eq!((&now["driver"]["sha256"], &now["previous"]), (&json!(old), &Value::Null));
    // Each refusal is counted for the operator (the file that is not a component too).
    let metrics =
        reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap();
    let refused = metrics
        .lines()
        .find(|l| l.contains("driver_switches_total{backend=\"tgt\",how=\"refused\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert_eq!(refused, Some(4), "{metrics}");
    // A volume still attaches on the driver it had.
    let volume = c.create_volume(json!({"size": 1})).await;
    c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:x", "x"))).await.expect(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_driver_that_does_worse_is_rolled_back_on_its_own_and_a_restart_keeps_the_choice() {
    // The released driver ignores the `flaw` setting; the new one (the flawed fixture posing as
    // a new tgt-iscsi) takes 150 ms more per connect: slow, not wrong, so the conformance
    // suite lets it through and the watch must catch it.
    let rig = rig(
        r#"flaw = "slow-connect", pose = "tgt-iscsi""#,
        "watch_seconds = 60\nmin_calls = 10\nmax_latency_factor = 3.0",
    );
    let c = rig.client();
    let old = sha256(&released());
    let slow = sha256(&component("flawed"));
    let load = Load::start(&c, 2).await;
    // The old driver's calls are the baseline.
    baseline(&c, 20).await;
    let up = upgrade(&c, "tgt", &component("flawed")).await.expect(200).body["upgrade"].clone();
    assert_eq!(up["driver"]["sha256"], json!(slow));
    assert!(up["watched_until_us"].as_i64().is_some());

    let decided = rolled_back_to(&c, &old, "the slow driver was not rolled back").await;
    let (_, failures) = load.stop().await;
    assert!(failures.is_empty(), "requests failed: {failures:#?}");
    assert_eq!(decided["driver"]["how"], "rolled back");
    let why = decided["last_change"]["what"].as_str().unwrap();
    assert!(why.contains("automatically") && why.contains("times the previous driver"), "{why}");
    assert!(rig.berth.log_text().contains("rolled back from tgt-iscsi"), "the operator is told");

    // Upgraded again by hand, the choice outlives a restart; a rollback after it returns to the
    // configured driver.
    let mut rig = rig;
    upgrade(&c, "tgt", &component("tgt-iscsi")).await.expect(200);
    rig.berth.restart();
    let c = rig.client();
    let now = running(&c).await;
    assert_eq!(
        (&now["driver"]["sha256"], &now["driver"]["how"]),
        (&json!(sha256(&component("tgt-iscsi"))), &json!("upgraded"))
    );
    c.post("/os-drivers/tgt/action", json!({"os-rollback": {}})).await.expect(200);
    rig.berth.restart();
    let now = rig.client();
    let now = running(&now).await;
    assert_eq!((&now["driver"]["sha256"], &now["driver"]["how"]), (&json!(old), &json!("configured")));
    let store = invariants::open(&rig.db_url()).await;
    invariants::settled(&store, &rig.tgtd, Duration::from_secs(10)).await.expect("tgtd equals the database");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_driver_that_fails_where_it_is_deployed_is_rolled_back_on_its_own() {
    // It passes the conformance suite (it only ever met the suite's target prefix) and fails
    // every connect in service: the watch compares its failures with the old driver's none.
    let rig = rig(
        r#"flaw = "lab-only", pose = "tgt-iscsi""#,
        "watch_seconds = 60\nmin_calls = 10\nmax_failure_increase = 0.1",
    );
    let c = rig.client();
    let old = sha256(&released());
    let load = Load::start(&c, 2).await;
    baseline(&c, 20).await;
    upgrade(&c, "tgt", &component("flawed")).await.expect(200);
    let decided = rolled_back_to(&c, &old, "the failing driver was not rolled back").await;
    let why = decided["last_change"]["what"].as_str().unwrap().to_string();
    assert!(why.contains("automatically") && why.contains("calls failed"), "{why}");
    // Back on the old driver, connects succeed again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, failures) = load.stop().await;
    assert!(!failures.is_empty(), "the failing driver failed nothing");
    assert!(
        failures.iter().all(|f| f.starts_with("create: 502") && f.contains("fails where it is deployed")),
        "only the new driver's own failures: {failures:#?}"
    );
    let volume = c.create_volume(json!({"size": 1})).await;
    c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:after", "after"))).await.expect(200);
    let store = invariants::open(&rig.db_url()).await;
    invariants::settled(&store, &rig.tgtd, Duration::from_secs(10)).await.expect("tgtd equals the database");
}

/// What each node runs for `backend`: (node, sha256, how).
async fn everywhere(cluster: &Cluster, backend: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for n in &cluster.nodes {
        let drivers = n.client().get("/os-drivers").await.expect(200).body;
        let d =
            drivers["drivers"].as_array().unwrap().iter().find(|d| d["backend"] == backend).unwrap().clone();
        out.push((
            n.name.clone(),
            d["driver"]["sha256"].as_str().unwrap().to_string(),
            d["driver"]["how"].as_str().unwrap().to_string(),
        ));
    }
    out
}

/// Waits until every node runs `digest` for `backend`.
async fn all_run(cluster: &Cluster, backend: &str, digest: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = everywhere(cluster, backend).await;
        if now.iter().all(|(_, d, _)| d == digest) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_backends_driver_is_upgraded_and_rolled_back_on_every_node_under_load() {
    let mut cluster = Cluster::start(3, 30).await;
    // Another build of the fake driver (one more custom section): a new version of the same
    // driver, at the same path on every node.
    let dir = tempfile::tempdir().unwrap();
    let rebuilt = dir.path().join("fake-next.wasm");
    let mut bytes = std::fs::read(component("fake")).unwrap();
    bytes.extend_from_slice(&[0, 6, 5, b'b', b'e', b'r', b't', b'h']);
    std::fs::write(&rebuilt, bytes).unwrap();
    let (old, new) = (sha256(&component("fake")), sha256(&rebuilt));
    let clients = cluster.clients();
    let load = Load::start_on(&clients, json!({"size": 1, "volume_type": "shared"})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // One node was upgraded alone (an upgrade sent again after it reached some nodes): it takes
    // part as a node that has nothing to do.
    let alone = clients[1].with_header("x-berth-forwarded-by", "operator");
    upgrade(&alone, "array", &rebuilt).await.expect(200);
    // Upgraded through one node: every node runs it when the answer comes.
    let up = upgrade(&clients[0], "array", &rebuilt).await.expect(200).body;
    assert_eq!(up["upgrade"]["driver"]["sha256"], json!(new));
    let now = everywhere(&cluster, "array").await;
    assert!(now.iter().all(|(_, d, how)| *d == new && how == "upgraded"), "{now:?}");
    let services = clients[2].get("/os-services").await.expect(200).body;
    let array: Vec<&Value> = services["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["host"].as_str().unwrap().ends_with("@array"))
        .collect();
    assert!(array.len() == 3 && array.iter().all(|s| s["driver_digest"] == json!(new)), "{array:?}");
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Rolled back through another: every node goes back.
    clients[1].post("/os-drivers/array/action", json!({"os-rollback": {}})).await.expect(200);
    all_run(&cluster, "array", &old, "not every node rolled back").await;

    // A rollback on one node alone (as a node's watch does it, told nobody) is followed by the
    // others on their own.
    upgrade(&clients[0], "array", &rebuilt).await.expect(200);
    all_run(&cluster, "array", &new, "not every node upgraded").await;
    let alone = clients[2].with_header("x-berth-forwarded-by", "operator");
    alone.post("/os-drivers/array/action", json!({"os-rollback": {}})).await.expect(200);
    all_run(&cluster, "array", &old, "the other nodes did not follow a node's rollback").await;
    let now = everywhere(&cluster, "array").await;
    assert!(now.iter().all(|(_, _, how)| how == "rolled back"), "{now:?}");

    // A fourth node whose configuration of the backend makes the new driver fail its checks
    // there: the upgrade is refused, naming that node, and every node runs the old driver again.
    let d = cluster
        .try_add("node-d", 30, |c| {
            c.replacen(
                "driver = \"fake\"\nshared = true\n",
                "driver = \"fake\"\nshared = true\nsettings = { \"fake.extend-volume\" = \"backend\" }\n",
                1,
            )
        })
        .expect("node-d starts");
    cluster.nodes.push(d);
    let m = upgrade(&clients[0], "array", &rebuilt).await.fault(409, "conflictingRequest");
    assert!(m.contains("node node-d answered 409") && m.contains("failed conformance checks"), "{m}");
    assert!(m.contains("every node runs the previous driver again"), "{m}");
    all_run(&cluster, "array", &old, "a refused upgrade left a node on the new driver").await;

    let (cycles, failures) = load.stop().await;
    assert!(failures.is_empty(), "requests failed across the switches: {failures:#?}");
    assert!(cycles > 20, "only {cycles} cycles");
    let store = invariants::open(&cluster.url).await;
    let digests: Vec<Option<String>> = store
        .read(async |tx| {
            let rows = tx.query("SELECT DISTINCT driver_digest FROM attach_events", &[]).await?;
            rows.iter().map(|r| r.opt_text(0)).collect::<Result<Vec<_>, _>>()
        })
        .await
        .unwrap();
    for d in &digests {
        assert!(d.as_deref() == Some(old.as_str()) || d.as_deref() == Some(new.as_str()), "{d:?}");
    }
    assert!(digests.contains(&Some(new.clone())), "no event names the new driver: {digests:?}");
}

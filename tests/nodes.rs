//! Several Berth nodes on one PostgreSQL database (README, "Several nodes"), as real processes:
//! three `berth serve`, each with its own tgtd, every one answering every call
//! (`harness/cluster.rs` has the set-up). A node-local volume's changes run on its node (the others
//! forward them); a shared backend's run on whichever node took the call, one at a time per
//! volume across nodes; a node that lost its lease can no longer act.
//!
//! Short here; `BERTH_NODES_TRIALS`, `BERTH_WORKLOAD_SECONDS` and `BERTH_WORKLOAD_CLIENTS` make
//! the long mode (see BENCHMARKS.md).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use berth_tests::cluster::Cluster;
use berth_tests::history::{self, Workload};
use berth_tests::server::{Client, Resp, connector};
use reqwest::Method;
use serde_json::{Value, json};

fn env(key: &str, default: u64) -> u64 {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Attachment creates of one volume, each with its own host, spread over the nodes, all at once.
async fn creates_at_once(clients: &[Client], volume: &str, n: usize) -> Vec<Resp> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (c, volume) = (clients[i % clients.len()].clone(), volume.to_string());
            tokio::spawn(async move {
                let host = format!("h{i}");
                c.attach(&volume, Some(connector(&format!("iqn.1993-08.org.debian:01:{host}"), &host))).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a create"));
    }
    out
}

fn statuses(answers: &[Resp]) -> Vec<u16> {
    answers.iter().map(|r| r.status).collect()
}

/// The acceptance of the nodes issue: 64 concurrent attachment creates on one non-multiattach
/// volume, spread over the three nodes, attach it exactly once and none is a 5xx, on every trial.
/// Trials alternate between a node-local volume (its owner runs every change; the two others
/// forward theirs) and a shared one (every node runs its own calls, one volume at a time across
/// nodes), and between owners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_creates_over_three_nodes_attach_a_volume_exactly_once() {
    let cluster = Cluster::start(3, 30).await;
    let clients = cluster.clients();
    let trials = env("BERTH_NODES_TRIALS", 100) as usize;
    let started = Instant::now();
    for trial in 0..trials {
        let shared = trial % 2 == 1;
        let body = if shared { json!({"size": 1, "volume_type": "shared"}) } else { json!({"size": 1}) };
        let volume = clients[trial % 3].create_volume(body).await;
        let answers = creates_at_once(&clients, &volume, 64).await;
        let codes = statuses(&answers);
        assert!(codes.iter().all(|s| *s < 500), "trial {trial} (shared: {shared}): a 5xx among {codes:?}");
        let won: Vec<&Resp> = answers.iter().filter(|r| r.status == 200).collect();
        assert_eq!(won.len(), 1, "trial {trial} (shared: {shared}): {codes:?}");
        let id = won[0].body["attachment"]["id"].as_str().unwrap().to_string();
        clients[(trial + 1) % 3].delete(&format!("/attachments/{id}")).await.expect(200);
        clients[(trial + 2) % 3].delete(&format!("/volumes/{volume}")).await.expect(202);
    }
    eprintln!("{trials} trials of 64 creates over 3 nodes in {:.1} s", started.elapsed().as_secs_f64());
    let store = cluster.store().await;
    if let Err(wrong) = cluster.settled(&store, Duration::from_secs(30)).await {
        panic!("after the trials:\n  {}", wrong.join("\n  "));
    }
}

/// Concurrent attaches of one multiattach volume through every node all succeed: a node-local
/// volume's run one after another on its node, a shared volume's on the node that took each, one
/// at a time across the nodes; each host ends up with its access, on the right tgtd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_attaches_of_a_multiattach_volume_through_every_node_all_succeed() {
    let cluster = Cluster::start(3, 30).await;
    let clients = cluster.clients();
    let store = cluster.store().await;
    for volume_type in ["shared-multiattach", "multiattach"] {
        let volume = clients[1].create_volume(json!({"size": 1, "volume_type": volume_type})).await;
        let answers = creates_at_once(&clients, &volume, 24).await;
        assert!(
            answers.iter().all(|r| r.status == 200),
            "{volume_type}: {:?}",
            answers.iter().map(|r| (r.status, r.body.to_string())).collect::<Vec<_>>()
        );
        let listed = clients[2].get(&format!("/attachments?volume_id={volume}")).await.expect(200);
        assert_eq!(listed.body["attachments"].as_array().unwrap().len(), 24, "{volume_type}");
    }
    // The node-local volume is exported by its own node's tgtd only, with every host in its ACL.
    if let Err(wrong) = cluster.settled(&store, Duration::from_secs(30)).await {
        panic!("{}", wrong.join("\n  "));
    }
    let acl: BTreeSet<String> =
        cluster.nodes[1].tgtd.targets().iter().flat_map(|t| t.initiators.clone()).collect();
    assert_eq!(acl.len(), 24, "{acl:?}");
    assert!(cluster.nodes[0].tgtd.targets().is_empty() && cluster.nodes[2].tgtd.targets().is_empty());
}

/// The pool of a cluster workload: on each node a volume of its own and a multiattach one, and two
/// shared volumes (one multiattach).
async fn pool(cluster: &Cluster) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for (i, node) in cluster.nodes.iter().enumerate() {
        let c = node.client();
        out.push((c.create_volume(json!({"size": 1})).await, false));
        out.push((c.create_volume(json!({"size": 1, "volume_type": "multiattach"})).await, true));
        if i < 2 {
            let (volume_type, multi) = if i == 0 { ("shared", false) } else { ("shared-multiattach", true) };
            out.push((c.create_volume(json!({"size": 1, "volume_type": volume_type})).await, multi));
        }
    }
    out
}

/// The history-checked workload of the crash-safety issue with its clients spread over three
/// nodes; with `kill`, node b is killed with SIGKILL a third of the way in and started again at
/// two thirds. Afterwards: no anomaly in the history, no operation left unfinished, and every
/// node's tgtd matches the attachments of the volumes it owns (and exports nothing else).
async fn workload_over_three_nodes(kill: bool) {
    // A short lease: node b's operations on shared volumes are taken over soon after it dies.
    let mut cluster = Cluster::start(3, 2).await;
    let clients = cluster.clients();
    let volumes = pool(&cluster).await;
    let store = cluster.store().await;
    let w = Workload {
        clients: env("BERTH_WORKLOAD_CLIENTS", 8) as usize,
        duration: Duration::from_secs(env("BERTH_WORKLOAD_SECONDS", 12)),
        volumes: volumes.len(),
        multiattach: volumes.iter().filter(|(_, m)| *m).count(),
        abandon: 0.0,
    };
    let third = w.duration / 3;
    let node_b = &mut cluster.nodes[1].berth;
    let chaos = async {
        if kill {
            tokio::time::sleep(third).await;
            node_b.kill9();
            tokio::time::sleep(third).await;
            tokio::task::block_in_place(|| node_b.start_again());
        }
    };
    let (outcome, ()) = tokio::join!(history::run(&clients, &store, &volumes, &w), chaos);

    if let Err(wrong) = cluster.settled(&store, Duration::from_secs(60)).await {
        panic!("after the workload (kill: {kill}):\n  {}", wrong.join("\n  "));
    }
    let live: BTreeSet<String> = store
        .read(async |tx| {
            let rows = tx.query("SELECT id FROM volume_attachment WHERE deleted = 0", &[]).await?;
            rows.iter().map(|r| r.text(0)).collect::<Result<BTreeSet<_>, _>>()
        })
        .await
        .unwrap();
    let mut anomalies = outcome.anomalies;
    anomalies.extend(history::check_acknowledged(&outcome.calls, &live));
    let calls = outcome.calls.iter().filter(|c| c.op != "idle").count();
    let ok = outcome.calls.iter().filter(|c| c.op != "idle" && c.ok()).count();
    let unavailable = outcome.calls.iter().filter(|c| c.status == Some(503)).count();
    let unanswered = outcome.calls.iter().filter(|c| c.status.is_none()).count();
    eprintln!(
        "workload over 3 nodes (kill: {kill}): {calls} calls, {ok} acknowledged, {unavailable} unavailable, \
         {unanswered} unanswered, {} snapshots, {} anomalies",
        outcome.snapshots,
        anomalies.len()
    );
    assert!(anomalies.is_empty(), "{} anomalies:\n  {}", anomalies.len(), anomalies.join("\n  "));
    assert!(ok > calls / 10, "too few calls succeeded to mean anything: {ok} of {calls}");
    if kill {
        assert!(unavailable + unanswered > 0, "the kill went unnoticed");
    } else {
        // Every node is up: nothing may be unavailable (a lease wrongly lost, a wait run out).
        assert_eq!(unavailable + unanswered, 0, "with every node up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_workload_over_three_nodes_keeps_a_consistent_history() {
    workload_over_three_nodes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_and_started_again_under_load_leaves_a_consistent_history() {
    workload_over_three_nodes(true).await;
}

async fn arm_sleep(c: &Client, name: &str, millis: u64) {
    let body = json!({"name": name, "nth": 1, "action": "sleep", "millis": millis});
    reqwest::Client::new().post(format!("{}/_failpoints/arm", c.base)).json(&body).send().await.unwrap();
}

/// Fencing: node a stops (SIGSTOP) in the middle of an attach of a shared volume, past its lease;
/// node b takes the operation over and undoes it; when node a goes on, it can no longer act: its
/// next driver call is not made and it records nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_lease_can_no_longer_act() {
    let cluster = Cluster::start(2, 2).await;
    let (on_a, on_b) = (cluster.nodes[0].client(), cluster.nodes[1].client());
    let volume = on_a.create_volume(json!({"size": 1, "volume_type": "shared-multiattach"})).await;
    let store = cluster.store().await;

    // Node a stalls after the export, is stopped there, and stays stopped past its lease.
    arm_sleep(&on_a, "attach.connect.create-export", 1000).await;
    let body = json!({"attachment": {"volume_uuid": volume, "connector": connector("iqn.1993-08.org.debian:01:alice", "alice")}});
    let stalled = {
        let on_a = on_a.clone();
        tokio::spawn(async move { on_a.try_send(Method::POST, "/attachments", Some(body), None).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = cluster.nodes[0].berth.pid().expect("node a runs");
    let generation = async || {
        store
            .read(async |tx| berth::store::operations::of_volume(tx, &volume).await)
            .await
            .unwrap()
            .map(|op| (op.node, op.generation))
    };
    assert_eq!(generation().await, Some(("node-a".into(), 1)), "node a's attach is under way");
    signal(pid, libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(3000)).await;

    // Node b, asked about the volume, finds the operation orphaned, takes it over and undoes it.
    let made =
        on_b.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:bob", "bob"))).await.expect(200);
    let bob = made.body["attachment"]["id"].as_str().unwrap().to_string();
    assert_eq!(generation().await, None, "node b ended the operation");
    let listed = on_b.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    let ids: Vec<&str> =
        listed.body["attachments"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [bob.as_str()], "alice's unacknowledged attach was undone");

    // Node a goes on: fenced, it answers with an error and changes nothing.
    signal(pid, libc::SIGCONT);
    let answer = stalled.await.unwrap().expect("node a answers");
    assert_eq!(answer.status, 503, "{}", answer.body);
    let after = on_b.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    assert_eq!(after.body, listed.body, "node a recorded nothing");
    assert_eq!(generation().await, None);
    let log = cluster.nodes[0].berth.log_text();
    assert!(log.contains("the call was not made") || log.contains("taken over"), "{log}");
}

/// The field report of the hardening issue (item 4): node a attaches a shared multiattach volume
/// and stalls after its driver calls, holding the driver fields they returned (new CHAP
/// credentials); it is paused past its lease; node b attaches the same volume (its export gets
/// credentials of its own). When node a goes on, it must write nothing: not its attachment and
/// not its credentials over node b's (two hosts of one export with different secrets), and it
/// answers 503 as docs/operations.md promises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_past_its_lease_writes_no_driver_fields_and_answers_503() {
    let cluster = Cluster::start(3, 3).await;
    let (on_a, on_b) = (cluster.nodes[0].client(), cluster.nodes[1].client());
    let volume = on_a.create_volume(json!({"size": 1, "volume_type": "shared-multiattach"})).await;
    let store = cluster.store().await;
    let stored_auth = async || {
        store
            .read(async |tx| berth::store::volumes::get(tx, &volume, berth::domain::list::Scope::All).await)
            .await
            .unwrap()
            .unwrap()
            .fields
            .provider_auth
    };

    arm_sleep(&on_a, "attach.connect.initialize-connection", 1500).await;
    let body = json!({"attachment": {"volume_uuid": volume, "connector": connector("iqn.1993-08.org.debian:01:alice", "alice")}});
    let stalled = {
        let on_a = on_a.clone();
        tokio::spawn(async move { on_a.try_send(Method::POST, "/attachments", Some(body), None).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = cluster.nodes[0].berth.pid().expect("node a runs");
    signal(pid, libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(4500)).await;

    let made =
        on_b.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:bob", "bob"))).await.expect(200);
    let bob_secret =
        made.body["attachment"]["connection_info"]["auth_password"].as_str().unwrap().to_string();
    let auth_b = stored_auth().await.expect("node b's export has credentials");
    assert!(auth_b.ends_with(&bob_secret), "the stored credentials are those node b handed out");

    signal(pid, libc::SIGCONT);
    let answer = stalled.await.unwrap().expect("node a answers");
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(stored_auth().await, Some(auth_b), "node a wrote its credentials over node b's");
    let listed = on_b.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    assert_eq!(listed.body["attachments"].as_array().unwrap().len(), 1, "{}", listed.body);
    // Node c, which took no part, sees the same.
    let shown = cluster.nodes[2]
        .client()
        .at("3.54")
        .get(&format!("/attachments/{}", made.body["attachment"]["id"].as_str().unwrap()))
        .await
        .expect(200);
    assert_eq!(shown.body["attachment"]["connection_info"]["auth_password"], bob_secret.as_str());
}

/// The hardening issue's item 5: a second `berth serve` started with a live node's name started
/// silently and took over its registered URL; once it stopped, the real node's volumes answered
/// 503 through the other nodes while it was up. Now it refuses to start, naming the other's URL,
/// and changes nothing. Item 7's clean stop: a node that stops marks itself down at once, and its
/// name is free for a new process straight away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_a_live_nodes_name_refuses_to_start() {
    let mut cluster = Cluster::start(3, 30).await;
    let store = cluster.store().await;
    let volume = cluster.nodes[0].client().create_volume(json!({"size": 1})).await;
    let before = store.read(async |tx| berth::store::nodes::list(tx).await).await.unwrap();

    let refused = cluster.try_add("node-a", 30, |c| c).err().expect("a second node-a must not start");
    assert!(refused.contains("another process runs as node node-a"), "{refused}");
    assert!(
        refused.contains(&cluster.nodes[0].berth.base),
        "the message names the live node's URL: {refused}"
    );
    let after = store.read(async |tx| berth::store::nodes::list(tx).await).await.unwrap();
    let url = |nodes: &[berth::store::nodes::Node]| {
        nodes.iter().find(|n| n.name == "node-a").map(|n| (n.url.clone(), n.incarnation.clone()))
    };
    assert_eq!(url(&after), url(&before), "the refused process changed node-a's registration");
    // Node a's volume is still reached through the others.
    let via_b = cluster.nodes[1].client();
    via_b.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:x", "x"))).await.expect(200);

    // A clean stop: down at once (the lease is 30 s), and the others answer 503 for its volume.
    let stopped = std::time::Instant::now();
    cluster.nodes[0].berth.stop();
    let services = via_b.get("/os-services").await.expect(200);
    let a =
        services.body["services"].as_array().unwrap().iter().find(|s| s["host"] == "node-a").unwrap().clone();
    assert_eq!(a["state"], "down", "{services:?}", services = services.body);
    via_b
        .attach(&volume, Some(connector("iqn.1993-08.org.debian:01:y", "y")))
        .await
        .fault(503, "serviceUnavailable");
    assert!(stopped.elapsed() < Duration::from_secs(30), "no lease was waited for");
    // The name is free for another process now.
    let again =
        cluster.try_add("node-a", 30, |c| c).expect("node-a starts again elsewhere once the first stopped");
    drop(again);
}

/// The hardening issue's item 6: a node whose backend of a shared name is not marked `shared`,
/// runs another driver, or has another lease started without a word. It refuses to start,
/// naming the key, the nodes and both values; `os-services` shows what each node runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_disagrees_with_the_cluster_refuses_to_start_naming_what() {
    let cluster = Cluster::start(3, 30).await;
    let not_shared =
        cluster.try_add("node-d", 30, |c| c.replacen("shared = true\n", "", 1)).err().expect("refused");
    assert!(not_shared.contains("backend array: shared = true on node node-"), "{not_shared}");
    assert!(not_shared.contains("shared = false on this node (node-d)"), "{not_shared}");
    let other_lease = cluster.try_add("node-d", 7, |c| c).err().expect("refused");
    assert!(
        other_lease.contains("[operations] lease_seconds: node node-")
            && other_lease.contains("has 30, this node (node-d) has 7"),
        "{other_lease}"
    );
    // The fake driver with one more custom section: the same code, another build (digest).
    let dir = tempfile::tempdir().unwrap();
    let rebuilt = dir.path().join("fake-rebuilt.wasm");
    let mut bytes = std::fs::read(berth_tests::drivers::component("fake")).unwrap();
    bytes.extend_from_slice(&[0, 6, 5, b'b', b'e', b'r', b't', b'h']);
    std::fs::write(&rebuilt, bytes).unwrap();
    let other_driver = cluster
        .try_add("node-d", 30, |c| {
            c.replacen(
                "name = \"array\"\ndriver = \"fake\"",
                &format!("name = \"array\"\nwasm = \"{}\"", rebuilt.display()),
                1,
            )
        })
        .err()
        .expect("refused");
    assert!(
        other_driver.contains("backend array (shared): node node-")
            && other_driver.contains("this node (node-d) runs fake"),
        "{other_driver}"
    );
    // A volume type of one name that would place volumes elsewhere, or attach them otherwise.
    let other_type = cluster
        .try_add("node-d", 30, |c| {
            c.replacen("name = \"shared\"\nbackend = \"array\"", "name = \"shared\"\nbackend = \"tgt\"", 1)
        })
        .err()
        .expect("refused");
    assert!(
        other_type.contains("volume type shared: node node-")
            && other_type.contains(
                r#"has {"backend":"array","extra_specs":{}}, this node (node-d) has {"backend":"tgt""#
            ),
        "{other_type}"
    );
    // A node that agrees joins, with a type of its own the others do not have yet.
    let d = cluster
        .try_add("node-d", 30, |c| format!("{c}\n[[volume_types]]\nname = \"new\"\nbackend = \"tgt\"\n"))
        .expect("an agreeing node starts");

    let services = cluster.nodes[0].client().get("/os-services").await.expect(200);
    let rows = services.body["services"].as_array().unwrap().clone();
    let array: Vec<&Value> =
        rows.iter().filter(|s| s["host"].as_str().unwrap().ends_with("@array")).collect();
    assert_eq!(array.len(), 4, "{rows:?}");
    let digests: BTreeSet<&str> = array.iter().map(|s| s["driver_digest"].as_str().unwrap()).collect();
    assert_eq!(digests.len(), 1, "every node runs the same driver for array");
    assert!(array.iter().all(|s| s["shared"] == true && s["driver"].as_str().unwrap().starts_with("fake ")));
    assert!(rows.iter().filter(|s| s["binary"] == "berth-api").all(|s| s["lease_seconds"] == 30));
    drop(d);
}

/// The hardening issue's item 7: a request forwarded to a stalled owner waited 300 s, even after
/// the owner showed down. The forward now ends once the owner is down (503 with `Retry-After`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_forwarded_to_a_stalled_owner_fails_once_the_owner_is_down() {
    let cluster = Cluster::start(3, 3).await;
    let volume = cluster.nodes[0].client().create_volume(json!({"size": 1})).await;
    let pid = cluster.nodes[0].berth.pid().expect("node a runs");
    signal(pid, libc::SIGSTOP);
    // Node a still looks up for up to a lease: node b forwards, and node a never answers.
    let body = json!({"attachment": {"volume_uuid": volume, "connector": connector("iqn.1993-08.org.debian:01:z", "z")}});
    let asked = std::time::Instant::now();
    let answer = cluster.nodes[1]
        .client()
        .try_send(Method::POST, "/attachments", Some(body), Some(Duration::from_secs(60)))
        .await;
    let waited = asked.elapsed();
    signal(pid, libc::SIGCONT);
    let answer = answer.expect("node b answers (within a minute, not after the 300 s forward timeout)");
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert!(answer.body.to_string().contains("node-a"), "{}", answer.body);
    eprintln!("node b answered 503 after {waited:?} (lease 3 s)");
}

/// `cinder service-set-log` and `service-get-log` (3.32) reach every node, as Cinder's reach
/// every service: without `server`, the node that takes the call sets its own level and sends the
/// request on to each other node up, and lists every node's levels; with `server`, the node it
/// names is sent the request through any node; a node that is down is refused by name, and the
/// others are set without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_levels_are_set_and_read_on_every_node_through_any_node() {
    let cluster = Cluster::start(2, 3).await;
    let (a, b) = (cluster.nodes[0].client().at("3.32"), cluster.nodes[1].client().at("3.32"));
    let (name_a, name_b) = (cluster.nodes[0].name.clone(), cluster.nodes[1].name.clone());
    let levels = |answer: &Value| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = answer["log_levels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                let level = l["levels"]["berth::attach"].as_str().unwrap_or("unset");
                (l["host"].as_str().unwrap().to_string(), level.to_string())
            })
            .collect();
        out.sort();
        out
    };
    let of = |c: &Client, server: Option<&str>| {
        let (c, body) = (c.clone(), json!({"server": server, "prefix": "berth::attach"}));
        async move { c.put("/os-services/get-log", body).await.expect(200).body }
    };

    // Set through a, on both: b shows it, asked for itself.
    a.put("/os-services/set-log", json!({"prefix": "berth::attach", "level": "DEBUG"})).await.expect(202);
    assert_eq!(levels(&of(&b, Some(&name_b)).await), vec![(name_b.clone(), "DEBUG".to_string())]);
    // Any node lists every node's.
    let both = vec![(name_a.clone(), "DEBUG".to_string()), (name_b.clone(), "DEBUG".to_string())];
    assert_eq!(levels(&of(&b, None).await), both);
    assert_eq!(levels(&of(&a, None).await), both);

    // Named (a backend of it names it too): that node alone, through the other.
    let body = json!({"server": format!("{name_b}@tgt"), "prefix": "berth::attach", "level": "WARNING"});
    a.put("/os-services/set-log", body).await.expect(202);
    assert_eq!(levels(&of(&b, Some(&name_b)).await), vec![(name_b.clone(), "WARNING".to_string())]);
    assert_eq!(levels(&of(&b, Some(&name_a)).await), vec![(name_a.clone(), "DEBUG".to_string())]);
    let message = a
        .put("/os-services/set-log", json!({"server": "node-z", "level": "DEBUG"}))
        .await
        .fault(400, "badRequest");
    assert!(message.contains("\"node-z\" is no Berth node"), "{message}");

    // b stopped, past its lease: named, it is refused by name; unnamed, a is set without it.
    let pid = cluster.nodes[1].berth.pid().expect("node b runs");
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let body = json!({"server": name_b, "prefix": "berth::attach", "level": "ERROR"});
        let r = a.put("/os-services/set-log", body).await;
        if r.status == 503 {
            break r;
        }
        assert!(Instant::now() < deadline, "node b never showed down: {} {}", r.status, r.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let message = refused.fault(503, "serviceUnavailable");
    assert!(message.contains(&name_b) && message.contains("down"), "{message}");
    a.put("/os-services/set-log", json!({"prefix": "berth::attach", "level": "INFO"})).await.expect(202);
    assert_eq!(levels(&of(&a, None).await), vec![(name_a.clone(), "INFO".to_string())]);
    signal(pid, libc::SIGCONT);
    assert_eq!(levels(&of(&b, Some(&name_b)).await), vec![(name_b.clone(), "WARNING".to_string())]);
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process of this test.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// A node that is down cannot run its volumes' driver calls, and an admin can still make Berth
/// forget one of them (`os-unmanage`, through another node): its row goes at once. What the
/// node's tgtd still holds of it is the target kept for reuse after its last detach (its LUN, but
/// no ACL entry and no account: nobody logs in), which the node's sweep deletes after
/// `[tgt] keep_exports_seconds`; the backing file (the volume's data) stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_of_a_node_that_is_down_is_unmanaged_and_nothing_of_it_stays_exported() {
    let mut cluster = Cluster::start(2, 3).await;
    let a = cluster.nodes[0].client();
    let volume = a.create_volume(json!({"size": 1})).await;
    let made = a.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h", "h"))).await.expect(200);
    let iqn = made.body["attachment"]["connection_info"]["target_iqn"].as_str().unwrap().to_string();
    a.delete(&format!("/attachments/{}", made.body["attachment"]["id"].as_str().unwrap())).await.expect(200);
    let inert = |cluster: &Cluster| {
        cluster.nodes[0]
            .tgtd
            .targets()
            .iter()
            .filter(|t| t.iqn == iqn)
            .all(|t| t.initiators.is_empty() && t.chap_users.is_empty())
    };
    assert!(inert(&cluster));

    cluster.nodes[0].berth.kill9();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let b = cluster.nodes[1].client();
    let message = b
        .post(&format!("/volumes/{volume}/action"), json!({"os-extend": {"new_size": 2}}))
        .await
        .fault(503, "serviceUnavailable");
    assert!(message.contains("node-a (down"), "{message}");
    b.post(&format!("/volumes/{volume}/action"), json!({"os-unmanage": null})).await.expect(202);
    b.get(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");

    cluster.nodes[0].berth.start_again();
    // Node a serves again, and reconcile passes go by (every 0.25 s here).
    cluster.nodes[0].client().get("/volumes").await.expect(200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(inert(&cluster), "{:?}", cluster.nodes[0].tgtd.targets());
    let file = cluster.nodes[0].berth.dir.path().join(format!("data/volumes/tgt/volume-{volume}.img"));
    assert!(file.exists(), "the unmanaged volume's data stays: {}", file.display());
    assert!(!cluster.nodes[0].berth.log_text().lines().any(|l| l.contains("drift") && l.contains(&volume)));
}

/// Nodes that serve the API over HTTPS (`[http] tls_cert_file`) forward to one another over it,
/// verifying each other's certificate with `[http] ca_file`; a node that does not trust the CA
/// cannot forward (503), and nothing is done on the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_over_https_forward_to_one_another_with_their_ca_file() {
    let url = berth_tests::pg::fresh_database().await;
    let certs = tempfile::tempdir().unwrap();
    let files = berth_tests::https::TestCa::new().server_files(certs.path());
    let ca_file = files.ca.clone();
    let node = |name: &str, trusts: bool| {
        let ca = if trusts { format!("ca_file = \"{}\"\n", ca_file.display()) } else { String::new() };
        let top = format!("node = \"{name}\"\ndatabase_url = \"{url}\"\n{}{ca}", files.http_table());
        berth_tests::process::BerthProcess::start_full(&top, berth_tests::process::FAKE_BACKEND)
    };
    let (a, b, c) = (node("tls-a", true), node("tls-b", true), node("tls-c", false));
    let ca_cert = reqwest::Certificate::from_pem(&std::fs::read(&ca_file).unwrap()).unwrap();
    let http = reqwest::Client::builder().add_root_certificate(ca_cert).build().unwrap();
    let call =
        async |node: &berth_tests::process::BerthProcess, method: Method, path: &str, body: Option<Value>| {
            let mut r = http
                .request(method, format!("https://127.0.0.1:{}/v3/e2e{path}", node.port))
                .header("X-Auth-Token", "admin:e2e")
                .header("X-Roles", "admin,member,reader")
                .header("OpenStack-API-Version", "volume 3.54");
            if let Some(body) = body {
                r = r.json(&body);
            }
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        };
    let (status, created) = call(&a, Method::POST, "/volumes", Some(json!({"volume": {"size": 1}}))).await;
    assert_eq!(status, 202, "{created}");
    let volume = created["volume"]["id"].as_str().unwrap().to_string();
    let extend = |size: u64| Some(json!({"os-extend": {"new_size": size}}));
    let action = format!("/volumes/{volume}/action");

    // Node b forwards the extend of node a's volume to a, over HTTPS.
    let (status, body) = call(&b, Method::POST, &action, extend(2)).await;
    assert_eq!(status, 202, "{body}");
    assert!(b.log_text().contains("forwarding the request to the node that serves its volume"));
    let (_, shown) = call(&a, Method::GET, &format!("/volumes/{volume}"), None).await;
    assert_eq!(shown["volume"]["size"], 2);

    // Node c does not trust the CA: 503, and the volume is as it was.
    let (status, body) = call(&c, Method::POST, &action, extend(3)).await;
    assert_eq!(status, 503, "{body}");
    assert!(c.log_text().contains("a forwarded request got no answer"), "{}", c.log_text());
    let (_, shown) = call(&a, Method::GET, &format!("/volumes/{volume}"), None).await;
    assert_eq!((&shown["volume"]["size"], &shown["volume"]["status"]), (&json!(2), &json!("available")));
}

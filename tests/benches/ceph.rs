//! `ceph-rbd` on a real one-node Ceph (`harness/ceph.rs`), release builds:
//!
//! 1. an attachment create through Berth, side by side with the Ceph REST calls it makes
//!    (`GET /api/block/image/<pool>%2F<image>` and `GET /api/monitor`) made directly by a plain
//!    Rust client with a warm connection and a token: the target is Berth's create within 3x
//!    their sum;
//! 2. 64 volume creates at once through the API: errors, and the time until all are available;
//! 3. attach cycles per second with 1, 2 and 3 nodes on one PostgreSQL (`fsync=on`), sharing the
//!    backend, 16 clients spread over the nodes.
//!
//! Run: `cargo bench -p berth-tests --bench ceph` (`BERTH_BENCH_SECONDS` per node run, default 5).
//! Figures go to BENCHMARKS.md.

use std::time::{Duration, Instant};

use berth_tests::bench::closed_loop;
use berth_tests::ceph::{Ceph, cluster};
use berth_tests::process::BerthProcess;
use berth_tests::server::{Client, connector};
use berth_tests::stats::{Summary, human};
use serde_json::json;

const N: usize = 200;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
    berth_tests::pg::stop_private_clusters();
    berth_tests::ceph::stop();
}

async fn available(c: &Client, volume: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while c.get(&format!("/volumes/{volume}")).await.body["volume"]["status"] != "available" {
        assert!(Instant::now() < deadline, "{volume} did not become available");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config(ceph: &Ceph) -> String {
    format!(
        "[operations]\nlease_seconds = 30\n\n{}\n[[volume_types]]\nname = \"__DEFAULT__\"\nbackend = \"ceph\"\n",
        ceph.backend_toml("ceph", true)
    )
}

async fn run() {
    let started = Instant::now();
    let ceph = cluster();
    println!(
        "berth ceph benchmark ({} build): one-node Ceph 16 on loopback (cluster started in {:.1} s)",
        if cfg!(debug_assertions) { "debug" } else { "release" },
        started.elapsed().as_secs_f64()
    );
    let server = BerthProcess::start(&config(ceph));
    let c = Client::for_base(&server.base, "bench").at("3.54");

    // 1. One attachment create, and the calls it makes to Ceph, made directly: with per-host
    //    identities (the default) and with one shared identity, as Cinder.
    attach_against_direct(ceph, &c, true, N).await;
    let shared = BerthProcess::start(
        &config(ceph).replace("rbd_user = \"cinder\"", "rbd_user = \"cinder\", identities = \"shared\""),
    );
    attach_against_direct(ceph, &Client::for_base(&shared.base, "bench").at("3.54"), false, N).await;
    drop(shared);

    // 2. 64 creates at once.
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let c = c.fresh_connection();
        tasks.spawn(async move { c.post("/volumes", json!({"volume": {"size": 1}})).await });
    }
    let answers = tasks.join_all().await;
    let errors = answers.iter().filter(|r| r.status != 202).count();
    let ids: Vec<String> =
        answers.iter().filter_map(|r| r.body["volume"]["id"].as_str().map(str::to_string)).collect();
    let accepted = t.elapsed();
    let mut failed = 0;
    for id in &ids {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let s = c.get(&format!("/volumes/{id}")).await.body["volume"]["status"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if s == "available" {
                break;
            }
            if s == "error" || Instant::now() > deadline {
                failed += 1;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let images = ceph.images().iter().filter(|i| ids.iter().any(|id| **i == format!("volume-{id}"))).count();
    println!(
        "64 volume creates at once: {errors} errors, {failed} not available, {images} images; all accepted in {}, \
         all available in {}",
        human(accepted),
        human(t.elapsed())
    );
    for id in &ids {
        c.delete(&format!("/volumes/{id}")).await;
    }
    drop(server);

    // 3. Nodes.
    let clients = 16;
    for n in 1..=3 {
        let url = berth_tests::pg::fresh_database_on(berth_tests::pg::durable_server()).await;
        let nodes: Vec<BerthProcess> = (0..n)
            .map(|i| {
                BerthProcess::start_full(
                    &format!("node = \"node-{i}\"\ndatabase_url = \"{url}\""),
                    &config(ceph),
                )
            })
            .collect();
        let endpoints: Vec<Client> =
            nodes.iter().map(|p| Client::for_base(&p.base, "bench").at("3.54")).collect();
        let mut workers = Vec::new();
        for i in 0..clients {
            let client = endpoints[i % n].fresh_connection();
            let volume = client.create_volume(json!({"size": 1})).await;
            available(&client, &volume).await;
            workers.push((client, volume, format!("iqn.1993-08.org.debian:01:bench{i}")));
        }
        let workers = berth_tests::bench::workers_from(workers).await;
        let (mut latencies, wall) = closed_loop(workers).await;
        let cycles = latencies.len();
        let s = Summary::of(&mut latencies);
        println!(
            "{n} node(s): {:>6.1} attach cycles/s, cycle p50 {} p99 {} (n={cycles})",
            cycles as f64 / wall.as_secs_f64(),
            human(s.p50),
            human(s.p99)
        );
    }
}

/// Attachment creates and deletes through Berth against the calls to Ceph a create makes, made
/// directly: the dashboard's `GET` of the image and of the monitors, and with per-host identities
/// the host's read of the image's id and its `auth get-or-create` (through librados, as
/// `client.berth-host`: the host's own capability called without driver, API or database),
/// whose delete is an `auth del`.
async fn attach_against_direct(ceph: &Ceph, c: &Client, per_host: bool, n: usize) {
    let volume = c.create_volume(json!({"size": 1})).await;
    available(c, &volume).await;
    let http = reqwest::Client::new();
    let accept = "application/vnd.ceph.api.v1.0+json";
    let password = std::fs::read_to_string(&ceph.password_file).unwrap();
    let login: serde_json::Value = http
        .post(format!("{}/api/auth", ceph.dashboard))
        .header("accept", accept)
        .json(&json!({"username": ceph.dashboard_user, "password": password.trim()}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = login["token"].as_str().unwrap().to_string();
    let get = |path: String| {
        let (http, token) = (http.clone(), token.clone());
        async move {
            let r = http.get(path).header("accept", accept).bearer_auth(token).send().await.unwrap();
            assert!(r.status().is_success(), "{}", r.status());
            r.bytes().await.unwrap();
        }
    };
    // The host's own Ceph calls, made directly: its capability, without a driver, an API or a
    // database (its own backend name, so its identities are not the service's).
    let cephx = berth::capabilities::cephx::CephxCapability::new(
        "bench-direct",
        Some(&berth::capabilities::cephx::CephxConfig {
            conf: ceph.conf.clone(),
            name: "client.berth-host".into(),
            keyring: None,
            pools: vec![ceph.pool.clone()],
            timeout_seconds: 20.0,
        }),
        &ceph.pool,
    )
    .unwrap();
    let image = format!("{}/api/block/image/{}%2Fvolume-{volume}", ceph.dashboard, ceph.pool);
    let monitor = format!("{}/api/monitor", ceph.dashboard);
    let name = format!("volume-{volume}");
    let (mut direct, mut creates, mut deletes) = (Vec::new(), Vec::new(), Vec::new());
    let warm = (n / 10).max(2);
    for i in 0..n + warm {
        let t = Instant::now();
        get(image.clone()).await;
        get(monitor.clone()).await;
        if per_host {
            cephx.grant_image(&ceph.pool, &name, "direct").await.unwrap();
        }
        let d = t.elapsed();
        if per_host {
            cephx.revoke_image(&ceph.pool, &name, "direct").await.unwrap();
        }
        let t = Instant::now();
        let r =
            c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:bench", "bench"))).await.expect(200);
        let create = t.elapsed();
        let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
        let t = Instant::now();
        c.delete(&format!("/attachments/{id}")).await.expect(200);
        let delete = t.elapsed();
        if i >= warm {
            direct.push(d);
            creates.push(create);
            deletes.push(delete);
        }
    }
    let direct = Summary::of(&mut direct);
    let creates = Summary::of(&mut creates);
    let (mode, calls) = match per_host {
        true => ("per-host identities", "GET image + GET monitor + the image's rbd_id + auth get-or-create"),
        false => ("identities = shared", "GET image + GET monitor"),
    };
    println!("{mode}: the calls of an attachment create, made directly ({calls}): {direct}");
    println!("{mode}: attachment create through Berth (ceph-rbd): {creates}");
    println!("{mode}: attachment delete through Berth (ceph-rbd): {}", Summary::of(&mut deletes));
    println!(
        "{mode}: ratio (p50): {:.2}x the Ceph calls it makes (target: 3x or less)",
        creates.p50.as_secs_f64() / direct.p50.as_secs_f64()
    );
    c.delete(&format!("/volumes/{volume}")).await;
}

//! A backend whose volumes are sparse files in its node's data directory: the filesystem they
//! are on bounds them (`max_over_subscription_ratio`, `reserved_percentage`), creates and extends
//! past it are refused before the driver is asked, and the pools show that filesystem.

use berth::capabilities::Grant;
use berth_tests::server::{Db, TestServer, fake_config};
use serde_json::json;

const GIB: f64 = (1u64 << 30) as f64;

/// The fake backend, granted backing stores (so its volumes count as files in the data
/// directory), with this ratio and reserve.
fn config(ratio: f64, reserved: Option<u32>) -> berth::config::Config {
    let mut config = fake_config();
    config.backends[0].grants = [Grant::BackingStore].into();
    config.backends[0].max_over_subscription_ratio = Some(ratio);
    config.backends[0].reserved_percentage = reserved;
    config
}

/// The size of the filesystem `dir` is on, in GiB (`df`, not Berth's own reading).
fn filesystem_gib(dir: &std::path::Path) -> f64 {
    let out = std::process::Command::new("df").args(["-B1", "--output=size"]).arg(dir).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().nth(1).unwrap().trim().parse::<f64>().unwrap() / GIB
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_and_extends_past_the_filesystem_are_refused_and_the_pool_shows_it() {
    let s = TestServer::start_with(Db::Sqlite, config(1.0, None)).await;
    let c = s.client("p1");
    let total = filesystem_gib(&s.config.data_dir());
    let past = total.floor() as i64 + 1;

    let r = c.post("/volumes", json!({"volume": {"size": past}})).await;
    let message = r.fault(413, "overLimit");
    assert_eq!(
        message,
        format!(
            "No valid backend was found: backend fake has no room for {past} GiB more: its volumes would add up \
             to {past} GiB, more than 1 times its filesystem's {total:.1} GiB (max_over_subscription_ratio)"
        )
    );
    assert_eq!(c.get("/volumes").await.expect(200).body["volumes"], json!([]), "nothing was made");

    let volume = c.create_volume(json!({"size": 1})).await;
    let extend = json!({"os-extend": {"new_size": past}});
    let message = c.post(&format!("/volumes/{volume}/action"), extend).await.fault(413, "overLimit");
    assert!(message.contains(&format!("has no room for {} GiB more", past - 1)), "{message}");
    let shown = c.get(&format!("/volumes/{volume}")).await.expect(200).body;
    assert_eq!(
        (shown["volume"]["size"].as_i64(), shown["volume"]["status"].as_str()),
        (Some(1), Some("available"))
    );

    let pools = c.get("/scheduler-stats/get_pools?detail=true").await.expect(200).body;
    let pool = &pools["pools"][0]["capabilities"];
    let shown_total = pool["total_capacity_gb"].as_f64().unwrap();
    assert!((shown_total - total).abs() < 0.01, "{pool}");
    assert!(pool["free_capacity_gb"].as_f64().unwrap() <= shown_total, "{pool}");
    assert_eq!(
        (
            &pool["thin_provisioning_support"],
            &pool["max_over_subscription_ratio"],
            &pool["provisioned_capacity_gb"]
        ),
        (&json!(true), &json!("1.0"), &json!(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserved_share_of_the_filesystem_takes_no_volume() {
    let s = TestServer::start_with(Db::Sqlite, config(20.0, Some(100))).await;
    let c = s.client("p1");
    let message = c.post("/volumes", json!({"volume": {"size": 1}})).await.fault(413, "overLimit");
    assert!(message.contains("free (beyond reserved_percentage 100)"), "{message}");
    let pools = c.get("/scheduler-stats/get_pools?detail=true").await.expect(200).body;
    assert_eq!(pools["pools"][0]["capabilities"]["reserved_percentage"], 100);
}

/// A backend without files of its own (its driver keeps its volumes elsewhere) has no
/// filesystem to be bounded by: its capacity is `unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_files_has_unknown_capacity_and_no_bound() {
    let s = TestServer::start_with(Db::Sqlite, fake_config()).await;
    let c = s.client("p1");
    c.create_volume(json!({"size": 60000})).await;
    let pools = c.get("/scheduler-stats/get_pools?detail=true").await.expect(200).body;
    let pool = &pools["pools"][0]["capabilities"];
    assert_eq!(
        (&pool["total_capacity_gb"], &pool["thin_provisioning_support"]),
        (&json!("unknown"), &json!(false))
    );
    assert!(pool.get("max_over_subscription_ratio").is_none(), "{pool}");
}

/// Two nodes on one database: each node's pool shows its own filesystem, as that node
/// published it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_nodes_pool_shows_its_filesystem() {
    let url = berth_tests::pg::fresh_database().await;
    let one = TestServer::start_on(Db::Postgres, Some(url.clone()), config(3.0, None)).await;
    let two = TestServer::start_on(Db::Postgres, Some(url), config(5.0, None)).await;
    let pools = one.client("p1").get("/scheduler-stats/get_pools?detail=true").await.expect(200).body;
    let mut ratios: Vec<String> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert!(p["capabilities"]["total_capacity_gb"].as_f64().unwrap() > 0.0, "{p}");
            p["capabilities"]["max_over_subscription_ratio"].as_str().unwrap().to_string()
        })
        .collect();
    ratios.sort();
    assert_eq!(ratios, ["3.0", "5.0"]);
    drop(two);
}

/// A node publishes its filesystem again when its free space has moved by a GiB: another node's
/// pools see the space a file took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_publishes_its_filesystem_again_when_its_free_space_moves() {
    let url = berth_tests::pg::fresh_database().await;
    let one = TestServer::start_on(Db::Postgres, Some(url.clone()), config(20.0, None)).await;
    let two = TestServer::start_on(Db::Postgres, Some(url), config(7.0, None)).await;
    let free_of_two = async || {
        let pools = one.client("p1").get("/scheduler-stats/get_pools?detail=true").await.expect(200).body;
        let pool = pools["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["capabilities"]["max_over_subscription_ratio"] == "7.0")
            .cloned();
        pool.unwrap()["capabilities"]["free_capacity_gb"].as_f64().unwrap()
    };
    let before = free_of_two().await;
    let taken = two.config.data_dir().join("taken");
    let status = std::process::Command::new("fallocate").args(["-l", "3G"]).arg(&taken).status().unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let mut now = before;
    while now > before - 2.5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        now = free_of_two().await;
    }
    std::fs::remove_file(&taken).unwrap();
    assert!(
        now <= before - 2.5,
        "node two's free space was {before} GiB, then {now} GiB after 3 GiB were taken"
    );
}

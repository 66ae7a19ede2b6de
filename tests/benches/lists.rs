//! The list endpoints at scale: 100,000 live attachments (on 10,000 multiattach volumes) and as
//! many deleted ones (the history a busy service piles up), in one project, on SQLite and on
//! PostgreSQL, through HTTP: a default page, paging through everything with markers, one volume's
//! attachments, and a page of volume details.
//!
//! Run: `cargo bench -p berth-tests --bench lists` (`BERTH_LIST_ATTACHMENTS`, default 100000).
//! Figures go to BENCHMARKS.md.

use std::time::{Duration, Instant};

use berth::store::sql::Param;
use berth_tests::server::{Db, TestServer};
use berth_tests::stats::{Summary, human, timed};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

const PER_VOLUME: usize = 10;

/// Inserts `n` live attachments (and `n` deleted ones) on `n / PER_VOLUME` multiattach volumes.
async fn fill(s: &TestServer, n: usize) -> Vec<String> {
    let volumes: Vec<String> = (0..n / PER_VOLUME).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let store = s.service.store();
    let t0: i64 = 1_700_000_000_000_000;
    for (c, chunk) in volumes.chunks(500).enumerate() {
        store
            .write(async |tx| {
                let mut rows = Vec::new();
                let mut params: Vec<Param> = Vec::new();
                for (i, v) in chunk.iter().enumerate() {
                    let at = t0 + ((c * 500 + i) as i64);
                    let base = params.len();
                    rows.push(format!(
                        "(${}, 'bench', 'bench', 1, 'multiattach', 'fake', 1, 'in-use', 'attached', '{{}}', '{{}}', ${}, ${})",
                        base + 1,
                        base + 2,
                        base + 2
                    ));
                    params.push(Param::from(v.as_str()));
                    params.push(Param::from(at));
                }
                let sql = format!(
                    "INSERT INTO volumes (id, project_id, user_id, size_gib, volume_type, backend, multiattach, status, \
                     attach_status, driver_data, metadata, created_at, updated_at) VALUES {}",
                    rows.join(", ")
                );
                tx.execute(&sql, &params).await?;
                for (deleted, status) in [(0, "attached"), (1, "detached")] {
                    let mut rows = Vec::new();
                    let mut params: Vec<Param> = Vec::new();
                    for (i, v) in chunk.iter().enumerate() {
                        for k in 0..PER_VOLUME {
                            let at = t0 + ((((c * 500 + i) * PER_VOLUME) + k) as i64) * 10 + deleted;
                            let base = params.len();
                            rows.push(format!(
                                "(${}, ${}, 'bench', '{status}', 0, 'rw', ${}, ${}, {deleted})",
                                base + 1,
                                base + 2,
                                base + 3,
                                base + 3
                            ));
                            params.push(Param::from(uuid::Uuid::new_v4().to_string()));
                            params.push(Param::from(v.as_str()));
                            params.push(Param::from(at));
                        }
                    }
                    let sql = format!(
                        "INSERT INTO volume_attachment (id, volume_id, project_id, attach_status, exclusive, attach_mode, \
                         created_at, updated_at, deleted) VALUES {}",
                        rows.join(", ")
                    );
                    tx.execute(&sql, &params).await?;
                }
                Ok::<_, berth::store::StoreError>(())
            })
            .await
            .unwrap();
    }
    volumes
}

async fn run() {
    let n: usize =
        std::env::var("BERTH_LIST_ATTACHMENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    println!(
        "berth list benchmark: {n} live and {n} deleted attachments on {} volumes, one project, over HTTP",
        n / PER_VOLUME
    );
    for db in [Db::Sqlite, Db::Postgres] {
        let s = TestServer::start(db).await;
        let t = Instant::now();
        let volumes = fill(&s, n).await;
        let filled = t.elapsed();
        let c = s.client("bench").at("3.54");
        let first = timed(20, async |_| {
            let r = c.get("/attachments").await.expect(200);
            assert_eq!(r.body["attachments"].as_array().unwrap().len(), 1000);
        })
        .await;
        let detail = timed(20, async |_| {
            c.get("/attachments/detail?limit=100").await.expect(200);
        })
        .await;
        let one = timed(50, async |_| {
            let r =
                c.get(&format!("/attachments?volume_id={}", volumes[volumes.len() / 2])).await.expect(200);
            assert_eq!(r.body["attachments"].as_array().unwrap().len(), PER_VOLUME);
        })
        .await;
        let vols = timed(20, async |_| {
            c.get("/volumes/detail?limit=100").await.expect(200);
        })
        .await;
        // Every live attachment, a page of 1,000 at a time, with markers.
        let t = Instant::now();
        let (mut seen, mut marker, mut pages) = (0, None::<String>, Vec::<Duration>::new());
        loop {
            let path = match &marker {
                Some(m) => format!("/attachments?limit=1000&marker={m}"),
                None => "/attachments?limit=1000".to_string(),
            };
            let p = Instant::now();
            let r = c.get(&path).await.expect(200);
            pages.push(p.elapsed());
            let list = r.body["attachments"].as_array().unwrap();
            if list.is_empty() {
                break;
            }
            seen += list.len();
            marker = list.last().unwrap()["id"].as_str().map(str::to_string);
        }
        assert_eq!(seen, n, "paging saw every live attachment once");
        let all = t.elapsed();
        let pages = Summary::of(&mut pages);
        println!("{db:?}: filled in {:.1} s", filled.as_secs_f64());
        println!("  GET /attachments (a page of 1,000): p50 {} p99 {}", human(first.p50), human(first.p99));
        println!("  GET /attachments/detail?limit=100: p50 {} p99 {}", human(detail.p50), human(detail.p99));
        println!("  GET /attachments?volume_id=...: p50 {} p99 {}", human(one.p50), human(one.p99));
        println!(
            "  GET /volumes/detail?limit=100 (with their attachments): p50 {} p99 {}",
            human(vols.p50),
            human(vols.p99)
        );
        println!(
            "  every attachment by markers, 1,000 a page: {:.2} s for {} pages (page p50 {} p99 {})",
            all.as_secs_f64(),
            pages.n,
            human(pages.p50),
            human(pages.p99)
        );
        drop(s);
    }
}

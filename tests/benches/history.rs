//! The attach history at scale: 1,000,000 events (10 on each of 100,000 volumes, in one
//! project), on SQLite and on PostgreSQL, through HTTP: one volume's history (the target: 10 ms),
//! a host's events (one host in three; and a host with none, which no index serves), a time
//! window, the first page of everything, `verify` of every chain, and the retention of the older
//! half while a writer waits its turns.
//!
//! Run: `cargo bench -p berth-tests --bench history` (`BERTH_HISTORY_EVENTS`, default 1000000).
//! The events are inserted in bulk with chained hashes (as `store/events.rs` writes them, without
//! the flows that record them). Figures go to BENCHMARKS.md.

use std::time::Instant;

use berth::domain::history::{AttachEvent, GENESIS};
use berth::store::sql::Param;
use berth_tests::bench::bench_event;
use berth_tests::server::{Db, TestServer};
use berth_tests::stats::{human, timed};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

const PER_VOLUME: usize = 10;

/// An event id as the service makes it: a UUIDv7 of the event's millisecond.
fn event_id(at: i64) -> String {
    let at = at as u64;
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, at / 1_000_000, (at % 1_000_000) as u32 * 1000);
    uuid::Uuid::new_v7(ts).to_string()
}

/// The retention of the older half of the events (`berth::attach::history::prune`, as the
/// service's pruner and `berth history prune` make it), while a writer changes a volume's row once
/// a millisecond: how long the prune takes, how long a write waits for the writer meanwhile, and
/// whether what is left still verifies.
async fn retention(s: &TestServer, volumes: &[String], n: usize) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let store = s.service.store().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let (store, stop, v) = (store.clone(), stop.clone(), volumes[volumes.len() - 1].clone());
        tokio::spawn(async move {
            let mut waits = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                store
                    .write(async |tx| {
                        tx.execute(
                            "UPDATE volumes SET updated_at = updated_at + 1 WHERE id = $1",
                            &berth::params![v.as_str()],
                        )
                        .await
                    })
                    .await
                    .unwrap();
                waits.push(t.elapsed());
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            waits
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let half = (n / 2) as i64;
    let t = Instant::now();
    let pruned = berth::attach::history::prune(&store, T0 + half * 7).await.unwrap();
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut waits = probe.await.unwrap();
    assert_eq!(pruned, half as u64);
    let longest = waits.iter().max().copied().unwrap_or_default();
    let waited = berth_tests::stats::Summary::of(&mut waits);
    let verified = berth::attach::history::verify(&store).await.unwrap();
    assert_eq!((verified.events, verified.breaks.len()), (n - half as usize, 0));
    println!(
        "  retention: the older {pruned} events pruned in {:.2} s; a write meanwhile: p50 {} p99 {} longest {} (n={})",
        took.as_secs_f64(),
        human(waited.p50),
        human(waited.p99),
        human(longest),
        waited.n
    );
}

/// The first event's time; the others follow 7 µs apart.
const T0: i64 = 1_700_000_000_000_000;

/// Inserts `PER_VOLUME` chained events on each of `n / PER_VOLUME` volumes.
async fn fill(s: &TestServer, n: usize) -> Vec<String> {
    let volumes: Vec<String> = (0..n / PER_VOLUME).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    let store = s.service.store();
    for (c, chunk) in volumes.chunks(100).enumerate() {
        store
            .write(async |tx| {
                let (mut rows, mut params, mut heads, mut head_params) =
                    (Vec::new(), Vec::<Param>::new(), Vec::new(), Vec::<Param>::new());
                for (i, v) in chunk.iter().enumerate() {
                    let mut prev = GENESIS.to_string();
                    for k in 0..PER_VOLUME {
                        let at = T0 + (((c * 100 + i) * PER_VOLUME + k) as i64) * 7;
                        let e = AttachEvent::link(event_id(at), k as i64 + 1, prev, bench_event(v, at, k));
                        prev = e.hash.clone();
                        let f = &e.fields;
                        let values: Vec<Param> = vec![
                            e.id.clone().into(),
                            e.seq.into(),
                            f.volume_id.clone().into(),
                            f.at.into(),
                            f.event.clone().into(),
                            f.access.as_str().into(),
                            f.outcome.clone().into(),
                            f.project_id.clone().into(),
                            f.attachment_id.clone().into(),
                            f.instance_uuid.clone().into(),
                            f.host.clone().into(),
                            f.initiator.clone().into(),
                            f.user_id.clone().into(),
                            f.caller_project_id.clone().into(),
                            serde_json::to_string(&f.roles).unwrap().into(),
                            f.service_token.into(),
                            f.request_id.clone().into(),
                            f.global_request_id.clone().into(),
                            f.node.clone().into(),
                            f.driver_digest.clone().into(),
                            e.prev_hash.clone().into(),
                            e.hash.clone().into(),
                        ];
                        let base = params.len();
                        rows.push(format!(
                            "({})",
                            (1..=values.len()).map(|j| format!("${}", base + j)).collect::<Vec<_>>().join(", ")
                        ));
                        params.extend(values);
                    }
                    let base = head_params.len();
                    heads.push(format!(
                        "(${}, 'bench', 'bench', 1, 'default', 'fake', 0, 'available', 'detached', '{{}}', \
                         '{{}}', 0, 0, {PER_VOLUME}, ${})",
                        base + 1,
                        base + 2
                    ));
                    head_params.extend([Param::from(v.as_str()), Param::from(prev)]);
                }
                tx.execute(
                    &format!(
                        "INSERT INTO attach_events (id, seq, volume_id, at, event, access, outcome, project_id, \
                         attachment_id, instance_uuid, host, initiator, user_id, caller_project_id, roles, \
                         service_token, request_id, global_request_id, node, driver_digest, prev_hash, hash) VALUES {}",
                        rows.join(", ")
                    ),
                    &params,
                )
                .await?;
                tx.execute(
                    &format!(
                        "INSERT INTO volumes (id, project_id, user_id, size_gib, volume_type, backend, \
                         multiattach, status, attach_status, driver_data, metadata, created_at, updated_at, \
                         history_seq, history_hash) VALUES {}",
                        heads.join(", ")
                    ),
                    &head_params,
                )
                .await?;
                Ok::<_, berth::store::StoreError>(())
            })
            .await
            .unwrap();
    }
    volumes
}

async fn run() {
    let n: usize =
        std::env::var("BERTH_HISTORY_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    println!("berth history benchmark: {n} events on {} volumes, one project, over HTTP", n / PER_VOLUME);
    for db in [Db::Sqlite, Db::Postgres] {
        let s = TestServer::start(db).await;
        let t = Instant::now();
        let volumes = fill(&s, n).await;
        let filled = t.elapsed();
        if db == Db::Postgres {
            // The statistics a table in service has: autovacuum analyzes it once a tenth of it
            // changed, which the bulk fill gives it no time to do (unanalyzed, the planner takes
            // the project's million events for a few thousand and sorts them all).
            let store = s.service.store();
            store.write(async |tx| tx.execute("ANALYZE attach_events", &[]).await).await.unwrap();
        }
        let c = s.client("bench").at("3.54");
        let one = timed(200, async |i| {
            let v = &volumes[(i * 7919) % volumes.len()];
            let r = c.get(&format!("/os-attachment-events?volume_id={v}")).await.expect(200);
            assert_eq!(r.body["attachment_events"].as_array().unwrap().len(), PER_VOLUME);
        })
        .await;
        let host = timed(20, async |_| {
            c.get("/os-attachment-events?host=host-1&limit=100").await.expect(200);
        })
        .await;
        let rare = timed(20, async |_| {
            let r = c.get("/os-attachment-events?host=host-9&limit=100").await.expect(200);
            assert!(r.body["attachment_events"].as_array().unwrap().is_empty());
        })
        .await;
        let window = timed(20, async |i| {
            let from = 1_700_000_000_000_000 + (i as i64) * 1_000_000;
            let q = format!(
                "/os-attachment-events?since={}&until={}&limit=100",
                berth::api::views::timestamp(from),
                berth::api::views::timestamp(from + 700)
            );
            c.get(&q).await.expect(200);
        })
        .await;
        let page = timed(20, async |_| {
            let r = c.get("/os-attachment-events").await.expect(200);
            assert_eq!(r.body["attachment_events"].as_array().unwrap().len(), 1000);
        })
        .await;
        let first = c.get("/os-attachment-events?limit=100").await.expect(200);
        let marker = first.body["attachment_events"][99]["id"].as_str().unwrap().to_string();
        let next = timed(20, async |_| {
            let r = c.get(&format!("/os-attachment-events?limit=100&marker={marker}")).await.expect(200);
            assert_eq!(r.body["attachment_events"].as_array().unwrap().len(), 100);
        })
        .await;
        let t = Instant::now();
        let verified = berth::attach::history::verify(s.service.store()).await.unwrap();
        let verify = t.elapsed();
        assert_eq!((verified.events, verified.breaks.len()), (n, 0));
        println!("{db:?}: filled in {:.1} s", filled.as_secs_f64());
        println!("  one volume's history (GET ?volume_id=): p50 {} p99 {}", human(one.p50), human(one.p99));
        println!(
            "  a host's events, a page of 100 (GET ?host=): p50 {} p99 {}",
            human(host.p50),
            human(host.p99)
        );
        println!(
            "  a host with no event (GET ?host=, every event read): p50 {} p99 {}",
            human(rare.p50),
            human(rare.p99)
        );
        println!(
            "  a time window, a page of 100 (GET ?since=&until=): p50 {} p99 {}",
            human(window.p50),
            human(window.p99)
        );
        println!("  the first page of 1,000: p50 {} p99 {}", human(page.p50), human(page.p99));
        println!("  the next page of 100 after a marker: p50 {} p99 {}", human(next.p50), human(next.p99));
        println!("  verify every chain: {:.1} s ({} chains)", verify.as_secs_f64(), verified.chains);
        retention(&s, &volumes, n).await;
        drop(s);
    }
}

//! Upgrading a store with a long attach history to this build's schema. Migration 0010 (events by
//! their chain's place) copies `attach_events` into a table without an index on its id and writes
//! `attach_event_earlier_ids` once; `berth serve` runs it before it listens. This measures how
//! long opening a store left at migration 0009 with N events takes (10 on each of N/10 volumes,
//! with their hash chains and random ids, as 0009 wrote them), on SQLite and on PostgreSQL (a
//! durable cluster, `fsync=on`), and checks that afterwards every chain still verifies and an
//! event is found by the id it had.
//!
//! Run: `cargo bench -p berth-tests --bench migration` (`BERTH_MIGRATION_EVENTS`, default
//! 1000000). Figures go to BENCHMARKS.md.

use std::path::Path;
use std::str::FromStr;
use std::time::Instant;

use berth::domain::history::{AttachEvent, GENESIS};
use berth::domain::list::Scope;
use berth::store::events;
use berth::store::{Store, StoreOptions};
use berth_tests::bench::bench_event;

const PER_VOLUME: usize = 10;
/// Volumes per filling transaction.
const BATCH: usize = 200;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

/// A database as an earlier release of Berth left it.
enum Earlier {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Earlier {
    /// Connects to `url` and applies migrations 1 to 9 (copied to `dir`) only.
    async fn at_0009(url: &str, dir: &Path) -> Earlier {
        let migrations = dir.join("migrations-0009");
        std::fs::create_dir_all(&migrations).unwrap();
        for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            if name.as_str() < "0010" {
                std::fs::copy(&path, migrations.join(name)).unwrap();
            }
        }
        let migrator = sqlx::migrate::Migrator::new(migrations.as_path()).await.unwrap();
        if url.starts_with("sqlite:") {
            let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).unwrap().create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            migrator.run(&pool).await.unwrap();
            Earlier::Sqlite(pool)
        } else {
            let pool = sqlx::PgPool::connect(url).await.unwrap();
            migrator.run(&pool).await.unwrap();
            Earlier::Postgres(pool)
        }
    }

    async fn run(&self, sql: &str) {
        match self {
            Earlier::Sqlite(pool) => drop(sqlx::raw_sql(sql).execute(pool).await.unwrap()),
            Earlier::Postgres(pool) => drop(sqlx::raw_sql(sql).execute(pool).await.unwrap()),
        }
    }

    async fn close(self) {
        match self {
            Earlier::Sqlite(pool) => pool.close().await,
            Earlier::Postgres(pool) => pool.close().await,
        }
    }
}

/// A SQL literal (none of the values written here has a quote).
fn lit(value: Option<&str>) -> String {
    value.map_or_else(|| "NULL".to_string(), |v| format!("'{v}'"))
}

/// Writes `n` events, `PER_VOLUME` chained ones on each of `n / PER_VOLUME` volumes, with the
/// chains' heads, as migration 0009's schema holds them; returns one event.
async fn fill(db: &Earlier, n: usize) -> AttachEvent {
    let t0: i64 = 1_700_000_000_000_000;
    let mut sample = None;
    for batch in 0..(n / PER_VOLUME).div_ceil(BATCH) {
        let (mut volumes, mut rows, mut heads) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..BATCH.min(n / PER_VOLUME - batch * BATCH) {
            let v = uuid::Uuid::new_v4().to_string();
            let mut prev = GENESIS.to_string();
            for k in 0..PER_VOLUME {
                let at = t0 + (((batch * BATCH + i) * PER_VOLUME + k) as i64) * 7;
                let id = uuid::Uuid::new_v4().to_string();
                let e = AttachEvent::link(id, k as i64 + 1, prev, bench_event(&v, at, k));
                prev = e.hash.clone();
                let f = &e.fields;
                rows.push(format!(
                    "('{}', {}, '{}', {}, '{}', '{}', '{}', '{}', {}, {}, {}, {}, '{}', '{}', '{}', {}, {}, {}, \
                     '{}', {}, '{}', '{}')",
                    e.id,
                    e.seq,
                    f.volume_id,
                    f.at,
                    f.event,
                    f.access.as_str(),
                    f.outcome,
                    f.project_id,
                    lit(f.attachment_id.as_deref()),
                    lit(f.instance_uuid.as_deref()),
                    lit(f.host.as_deref()),
                    lit(f.initiator.as_deref()),
                    f.user_id,
                    f.caller_project_id,
                    serde_json::to_string(&f.roles).unwrap(),
                    i64::from(f.service_token),
                    lit(f.request_id.as_deref()),
                    lit(f.global_request_id.as_deref()),
                    f.node,
                    lit(f.driver_digest.as_deref()),
                    e.prev_hash,
                    e.hash
                ));
                if sample.is_none() {
                    sample = Some(e.clone());
                }
            }
            volumes.push(format!(
                "('{v}', 'bench', 'bench', 1, 'default', 'fake', 0, 'available', 'detached', '{{}}', '{{}}', 0, 0)"
            ));
            heads.push(format!("('{v}', {PER_VOLUME}, '{prev}', 1, '{GENESIS}')"));
        }
        db.run(&format!(
            "BEGIN; \
             INSERT INTO volumes (id, project_id, user_id, size_gib, volume_type, backend, multiattach, \
             status, attach_status, driver_data, metadata, created_at, updated_at) VALUES {}; \
             INSERT INTO attach_events (id, seq, volume_id, at, event, access, outcome, project_id, \
             attachment_id, instance_uuid, host, initiator, user_id, caller_project_id, roles, \
             service_token, request_id, global_request_id, node, driver_digest, prev_hash, hash) VALUES {}; \
             INSERT INTO attach_event_heads (volume_id, seq, hash, first_seq, first_prev) VALUES {}; \
             COMMIT;",
            volumes.join(", "),
            rows.join(", "),
            heads.join(", ")
        ))
        .await;
    }
    sample.expect("at least one event")
}

async fn run() {
    let n: usize =
        std::env::var("BERTH_MIGRATION_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    println!(
        "berth migration benchmark: a store at migration 0009 with {n} events on {} volumes, opened by this build",
        n / PER_VOLUME
    );
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("berth.db").display());
    let postgres = berth_tests::pg::fresh_database_on(berth_tests::pg::durable_server()).await;
    for (name, url) in [("Sqlite", sqlite), ("Postgres", postgres)] {
        let earlier = Earlier::at_0009(&url, dir.path()).await;
        let t = Instant::now();
        let sample = fill(&earlier, n).await;
        let filled = t.elapsed();
        earlier.close().await;

        let t = Instant::now();
        let store = Store::open(&url, &StoreOptions::default()).await.unwrap();
        let migrated = t.elapsed();

        let t = Instant::now();
        let verified = berth::attach::history::verify(&store).await.unwrap();
        let verify = t.elapsed();
        assert_eq!(
            (verified.events, verified.breaks.len()),
            (n, 0),
            "every chain verifies after the migration"
        );
        let t = Instant::now();
        let found = store.read(async |tx| events::get(tx, &sample.id, Scope::All).await).await.unwrap();
        let lookup = t.elapsed();
        assert_eq!(found.map(|e| e.hash), Some(sample.hash.clone()), "an earlier event is found by its id");

        println!("{name}: filled at 0009 in {:.1} s", filled.as_secs_f64());
        println!("  opened by this build (migration 0010 and after): {:.1} s", migrated.as_secs_f64());
        println!(
            "  then: every chain verifies ({} chains, {} events, {:.1} s); an earlier event found by its id in {} µs",
            verified.chains,
            verified.events,
            verify.as_secs_f64(),
            lookup.as_micros()
        );
    }
}

//! The store: all SQL, one file per table. SQLite (the embedded default) and PostgreSQL run the
//! same statements, but for two on PostgreSQL alone: the row lock that holds a volume
//! (`volumes::hold_row`) and an event appended in one round trip (`events::append`). Rows are
//! read into the domain's records (`domain/model.rs`, statuses from `domain/state.rs`, parsed
//! when read) and written from them. Every state change is a conditional update whose `WHERE`
//! comes from a row of the state machine's transition table, and returns what it wrote; partial
//! unique indexes back them up. Nothing here knows HTTP or decides which transitions are legal.
//!
//! A transaction is a closure over [`sql::Sql`] ([`Store::write`], [`Store::read`]) that runs in
//! one go (see `sql.rs` for why). A write transaction first updates the volume row it concerns,
//! which locks it in PostgreSQL: statements after that see every change committed by earlier
//! writers of the same volume, so a status derived from the attachments inside the transaction is
//! never stale. SQLite has one writer connection, so writers queue instead of failing with
//! `SQLITE_BUSY`, and those that queue together share one commit (`batch.rs`); it runs in WAL
//! mode with `synchronous=FULL` by default: a write returns once its commit is on disk, by a sync
//! of the write-ahead log that the commits waiting at the same time share and that runs outside
//! the writer's lock (group commit, [`WalSync`]). A write may ask for less
//! ([`Durability::Written`]: an operation's intent, made durable only before an effect that would
//! outlive a power failure, [`Store::sync`]).

// This room owns the SQL (host/clippy.toml).
#![allow(clippy::disallowed_methods)]

pub mod attachments;
pub mod backup;
mod batch;
pub mod compute_events;
pub mod default_types;
pub mod events;
pub mod messages;
pub mod nodes;
pub mod operations;
pub mod quotas;
pub mod services;
pub mod sql;
pub mod targets;
pub mod transfers;
pub mod volumes;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tokio::sync::Mutex;

use sql::{SqliteConn, Tx};

/// The page size of a new SQLite database. A commit writes each page it changed whole to the
/// write-ahead log, and a write changes a handful of pages in as many tables and indexes (an
/// attachment's row and its indexes, the operation's intent, the history's event and its
/// indexes: about 11 pages a commit of the attach cycle): with pages of 2 KiB instead of
/// SQLite's 4 KiB, a commit writes, checksums and syncs about half the bytes (BENCHMARKS.md, "The
/// attach history", "pages of 2 KiB"). Smaller still (1 KiB) measured slower than either. A
/// database keeps the page size it was created with (docs/operations.md says how to change it).
const SQLITE_PAGE_SIZE: u32 = 2048;

/// Which database the store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Sqlite,
    Postgres,
}

/// SQLite's durability setting. `Full` (the default) makes every commit durable across a power
/// loss; `Normal` survives process crashes but may lose the last commits on power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    Full,
    Normal,
}

/// How durable a write is once [`Store::write_with`] returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// On disk: the write survives a power failure (SQLite with `synchronous=FULL`: a sync of the
    /// log; PostgreSQL: its commit).
    Disk,
    /// In the operating system's hands: it survives this process's end (a kill, a crash), not
    /// the machine's; it is on disk once the next [`Durability::Disk`] write or [`Store::sync`]
    /// returns. For a record whose loss in a power failure loses nothing: an operation's intent
    /// before the operation has made any change that outlives the power (the local tgtd's
    /// targets do not). PostgreSQL, which may run on another machine, commits it as `Disk`.
    Written,
}

#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub synchronous: Synchronous,
    /// Connections to PostgreSQL, or SQLite readers.
    pub max_connections: u32,
    /// What opening may do to the database.
    pub opening: Opening,
}

/// What [`Store::open`] may do to a database that is not yet what this build serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// `berth serve`: a SQLite database that does not exist is made, and pending migrations are
    /// applied.
    Serve,
    /// The tools that read or prune what a service recorded (`berth history`): the database must
    /// exist ([`StoreError::Missing`]) and be at this build's schema ([`StoreError::SchemaBehind`],
    /// [`StoreError::SchemaAhead`]); it is never made or migrated. A newer berth's tool would
    /// otherwise upgrade the database of an older service running on it, which then refuses
    /// every change.
    Existing,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { synchronous: Synchronous::Full, max_connections: 16, opening: Opening::Serve }
    }
}

/// A condition of the database that passes: see [`StoreError::unavailable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// Unreachable, busy, out of connections, or an I/O error.
    Busy,
    /// Its disk (SQLite's file system, PostgreSQL's data directory) has no room for the change.
    DiskFull,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A named constraint refused the change (a race lost against the backstop).
    #[error("constraint {0} refused the change")]
    Constraint(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database error: {0}")]
    Sqlite(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// No SQLite database at this path, and none was to be made.
    #[error("no database at {0}")]
    Missing(String),
    /// The SQLite file could not be made.
    #[error("cannot create the database {path}: {why}")]
    Create { path: String, why: String },
    /// A statement on a transaction that was already committed (a bug).
    #[error("the transaction is finished")]
    Finished,
    /// What a tool (`berth db`) refuses to do, and why.
    #[error("{0}")]
    Refused(String),
    /// The database's schema has a migration this build does not know: a newer berth upgraded it.
    #[error(
        "the database's schema is at migration {applied}, newer than this build of berth knows (up to \
         {known}): a newer berth has upgraded it; run that version or a later one"
    )]
    SchemaAhead { applied: i64, known: i64 },
    /// The database's schema lacks migrations this build has, and was not to be migrated
    /// ([`Opening::Existing`]).
    #[error(
        "the database's schema is at migration {applied}, older than this build of berth (at {known}): \
         read it with the berth that serves it, or upgrade that service first"
    )]
    SchemaBehind { applied: i64, known: i64 },
}

/// This build's migrations (`migrations/`), applied by [`Store::open`].
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The last migration this build knows.
pub fn schema_known() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// The last migration applied to the database: past [`schema_known`] when a newer berth has
/// upgraded it since this process opened it.
pub async fn schema_applied(tx: &mut Tx) -> Result<i64, StoreError> {
    let rows = tx.query("SELECT MAX(version) FROM _sqlx_migrations WHERE success", &[]).await?;
    Ok(rows.first().map(|r| r.opt_int(0)).transpose()?.flatten().unwrap_or(0))
}

/// What applying the migrations came to: a migration this build does not know is a newer berth's.
fn migrated(outcome: Result<(), sqlx::migrate::MigrateError>) -> Result<(), StoreError> {
    match outcome {
        Ok(()) => Ok(()),
        Err(sqlx::migrate::MigrateError::VersionMissing(applied)) => {
            Err(StoreError::SchemaAhead { applied, known: schema_known() })
        }
        Err(e) => Err(StoreError::Db(e.into())),
    }
}

/// Group commit for SQLite with `synchronous=FULL`. A commit writes its pages to the write-ahead
/// log under the writer's lock; its caller then waits here until a sync of the log that began
/// after its commit has finished. One sync at a time runs, covering every commit made before it
/// began, so commits that wait together share one, and no commit holds the writer's lock while
/// the disk syncs. A write alone syncs on its own thread, as SQLite would; while others write,
/// the sync runs on the blocking pool and the runtime thread serves them. What a writer is told
/// it wrote is on disk, as with SQLite's own FULL; a reader may see a change a moment before it
/// is, never after its writer was answered.
struct WalSync {
    /// `<database>-wal`, opened at the first sync (SQLite makes it with the first write).
    path: PathBuf,
    file: std::sync::OnceLock<Arc<std::fs::File>>,
    /// Tickets taken by commits, each after its commit returned.
    tickets: AtomicU64,
    /// The highest ticket a finished sync covers; held while a sync runs.
    synced: Mutex<u64>,
    /// Syncs made, and of them those made on the spot by a write alone.
    syncs: AtomicU64,
    on_the_spot: AtomicU64,
    /// Writes under way (from waiting for the writer to being covered): a write alone syncs on
    /// the spot.
    writers: AtomicUsize,
    /// Why a sync failed, once one has. Commits made before it are visible but may not be on
    /// disk (the kernel may drop the pages it could not write), and any later change could build
    /// on them: from then on every write is refused, as SQLite's own FULL would have failed the
    /// commit, until the process is restarted (PostgreSQL stops for the same reason).
    failed: std::sync::OnceLock<String>,
}

/// Counts a write as under way until dropped (also when its caller is cancelled).
struct Writing<'a>(&'a AtomicUsize);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl WalSync {
    fn new(database: &std::path::Path) -> WalSync {
        let mut path = database.as_os_str().to_owned();
        path.push("-wal");
        WalSync {
            path: PathBuf::from(path),
            file: std::sync::OnceLock::new(),
            tickets: AtomicU64::new(0),
            synced: Mutex::new(0),
            syncs: AtomicU64::new(0),
            on_the_spot: AtomicU64::new(0),
            writers: AtomicUsize::new(0),
            failed: std::sync::OnceLock::new(),
        }
    }

    /// Refuses a write once a sync has failed.
    fn refusal(&self) -> Result<(), StoreError> {
        match self.failed.get() {
            None => Ok(()),
            Some(why) => Err(StoreError::Sqlite(format!(
                "disk I/O error: a sync of the write-ahead log failed ({why}); this process makes no \
                 more change, since what it committed before may not be on disk: restart berth once \
                 the disk is sound"
            ))),
        }
    }

    /// A failing disk, in tests: the failpoint `store.wal.sync <path of the log>`.
    fn injected(&self) -> std::io::Result<()> {
        #[cfg(feature = "failpoints")]
        if crate::failpoint::fails(&format!("store.wal.sync {}", self.path.display())) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    fn writing(&self) -> Writing<'_> {
        self.writers.fetch_add(1, Ordering::AcqRel);
        Writing(&self.writers)
    }

    /// Returns once the commits made before this call are on disk.
    async fn covered(&self) -> Result<(), StoreError> {
        let ticket = self.tickets.fetch_add(1, Ordering::AcqRel) + 1;
        let mut synced = self.synced.lock().await;
        if *synced >= ticket {
            return Ok(());
        }
        self.refusal()?;
        // Every ticket taken so far belongs to a commit that returned before it: all are in the
        // log this sync flushes.
        let covering = self.tickets.load(Ordering::Acquire);
        let file = match self.file.get() {
            Some(file) => file.clone(),
            None => {
                let opened = Arc::new(std::fs::File::open(&self.path).map_err(|e| {
                    StoreError::Sqlite(format!("disk I/O error: opening {}: {e}", self.path.display()))
                })?);
                self.file.get_or_init(|| opened).clone()
            }
        };
        let synced_now = match self.injected() {
            Err(e) => Err(e),
            // No other write is under way: sync on the spot, as SQLite's own FULL does; a hand-off
            // to the blocking pool and back would only add to this write's latency.
            Ok(()) if self.writers.load(Ordering::Acquire) <= 1 => {
                self.on_the_spot.fetch_add(1, Ordering::Relaxed);
                file.sync_data()
            }
            // Others are writing: the sync runs off this runtime thread, which serves them
            // meanwhile; their commits are covered by the next sync.
            Ok(()) => tokio::task::spawn_blocking(move || file.sync_data())
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e))),
        };
        if let Err(e) = synced_now {
            if self.failed.set(e.to_string()).is_ok() {
                tracing::error!(
                    log = %self.path.display(),
                    "a sync of the write-ahead log failed: {e}; every change is refused until berth is restarted"
                );
            }
            self.refusal()?;
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        *synced = covering;
        Ok(())
    }
}

/// The named constraints that refuse a change a race lost: a second live attachment in a slot of
/// a non-multiattach volume, a second operation on a volume.
pub const ONE_ATTACHMENT_PER_SLOT: &str = "one_live_attachment_per_exclusive_slot";
pub const ONE_OPERATION_PER_VOLUME: &str = "one_operation_per_volume";
const CONSTRAINTS: &[&str] = &[ONE_ATTACHMENT_PER_SLOT, ONE_OPERATION_PER_VOLUME];

impl StoreError {
    /// Maps a unique-constraint violation to [`StoreError::Constraint`].
    pub(crate) fn from_db(e: sqlx::Error) -> StoreError {
        if let sqlx::Error::Database(db) = &e
            && let Some(c) =
                CONSTRAINTS.iter().find(|c| db.constraint() == Some(**c) || db.message().contains(**c))
        {
            return StoreError::Constraint(c.to_string());
        }
        StoreError::Db(e)
    }

    /// The same for SQLite's messages, which name the columns, not the index.
    pub(crate) fn from_message(message: String) -> StoreError {
        if message.contains("UNIQUE constraint failed: volume_attachment.volume_id") {
            return StoreError::Constraint(ONE_ATTACHMENT_PER_SLOT.to_string());
        }
        if message.contains("UNIQUE constraint failed: operations.volume_id") {
            return StoreError::Constraint(ONE_OPERATION_PER_VOLUME.to_string());
        }
        StoreError::Sqlite(message)
    }

    /// Whether this is the named constraint refusing a change.
    pub fn is_constraint(&self, name: &str) -> bool {
        matches!(self, StoreError::Constraint(c) if c == name)
    }

    /// Why the database cannot take the request now, when that passes (a 503, not a bug): it is
    /// unreachable or busy, or its disk is full. Either way the transaction was rolled back.
    pub fn unavailable(&self) -> Option<Unavailable> {
        match self {
            StoreError::Db(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)) => {
                Some(Unavailable::Busy)
            }
            // PostgreSQL's class 53, insufficient resources: disk_full, then out of memory or
            // connections; 57P03, cannot_connect_now (starting or stopping).
            StoreError::Db(sqlx::Error::Database(db)) => match db.code().as_deref() {
                Some("53100") => Some(Unavailable::DiskFull),
                Some("53200" | "53300" | "57P03") => Some(Unavailable::Busy),
                _ => None,
            },
            StoreError::Sqlite(m) if m.contains("database or disk is full") => Some(Unavailable::DiskFull),
            StoreError::Sqlite(m) if m.contains("database is locked") || m.contains("disk I/O error") => {
                Some(Unavailable::Busy)
            }
            _ => None,
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::from_message(e.to_string())
    }
}

enum Db {
    Sqlite {
        writer: Arc<Mutex<SqliteConn>>,
        /// Writers waiting for `writer` (`batch.rs`).
        waiting: Arc<AtomicUsize>,
        readers: Vec<Arc<Mutex<SqliteConn>>>,
        next: AtomicUsize,
        /// With `synchronous=FULL`: the write-ahead log's syncs, shared by the commits waiting.
        durable: Option<WalSync>,
    },
    Postgres(PgPool),
}

/// The database.
#[derive(Clone)]
pub struct Store {
    db: Arc<Db>,
    commits: Arc<AtomicU64>,
    /// Commits of the database: on SQLite a batch of writes commits once (`batch.rs`).
    transactions: Arc<AtomicU64>,
    /// PostgreSQL: the last transaction could not begin (no connection within the wait): until
    /// one begins again, a transaction waits [`PG_WAIT_WHILE_DOWN`] for its connection, not
    /// [`PG_ACQUIRE_TIMEOUT`], so that while the server is down each request is answered 503
    /// in seconds, not after the whole wait, with every request before it waiting too.
    pg_down: Arc<AtomicBool>,
}

/// How long a PostgreSQL transaction waits for a connection (the pool's own wait: a free
/// connection under load, or a new one while the server starts).
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The same while the server was last seen down.
const PG_WAIT_WHILE_DOWN: Duration = Duration::from_secs(2);

impl Store {
    /// Opens the database at `url` (`sqlite://path` or `postgres://...`) as `options.opening`
    /// allows: for `berth serve`, a SQLite one that does not exist is made and pending migrations
    /// are applied; for the tools, it must exist at this build's schema.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Store, StoreError> {
        let transactions = Arc::new(AtomicU64::new(0));
        let db = if url.starts_with("sqlite:") {
            // sqlx creates the file and runs the migrations (`berth serve`); the store's own
            // connections follow.
            let serve = options.opening == Opening::Serve;
            let connect = SqliteConnectOptions::from_str(url)?
                .create_if_missing(serve)
                .page_size(SQLITE_PAGE_SIZE)
                .journal_mode(SqliteJournalMode::Wal);
            let path = PathBuf::from(connect.get_filename());
            if !serve && !path.exists() {
                return Err(StoreError::Missing(path.display().to_string()));
            }
            // The database holds every CHAP secret: it, its WAL and its shm are the service's
            // alone (0600), whatever the umask.
            create_private(&path)?;
            let pool = SqlitePoolOptions::new().max_connections(1).connect_with(connect).await?;
            let migrations = if serve { migrated(MIGRATOR.run(&pool).await) } else { Ok(()) };
            pool.close().await;
            migrations?;
            // FULL is kept by syncing the write-ahead log after the commit, outside the writer's
            // lock and shared by every commit waiting (`WalSync`); SQLite itself then commits as
            // with NORMAL (the log written, not synced).
            let synchronous = "NORMAL";
            let open = |group: Option<batch::Group>| -> Result<Arc<Mutex<SqliteConn>>, StoreError> {
                let conn = rusqlite::Connection::open(&path)?;
                conn.execute_batch(&format!(
                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; PRAGMA foreign_keys = ON;"
                ))?;
                conn.busy_timeout(Duration::from_secs(10))?;
                conn.set_prepared_statement_cache_capacity(128);
                Ok(Arc::new(Mutex::new(SqliteConn(conn, group))))
            };
            let waiting = Arc::new(AtomicUsize::new(0));
            let writer = open(Some(batch::Group::new(waiting.clone(), transactions.clone())))?;
            let readers =
                (0..options.max_connections.clamp(1, 8)).map(|_| open(None)).collect::<Result<_, _>>()?;
            make_private(&path)?;
            let durable = (options.synchronous == Synchronous::Full).then(|| WalSync::new(&path));
            Db::Sqlite { writer, waiting, readers, next: AtomicUsize::new(0), durable }
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            let pool = PgPoolOptions::new()
                .max_connections(options.max_connections.max(2))
                .acquire_timeout(PG_ACQUIRE_TIMEOUT)
                .connect(url)
                .await?;
            if options.opening == Opening::Serve {
                migrated(MIGRATOR.run(&pool).await)?;
            }
            Db::Postgres(pool)
        } else {
            return Err(StoreError::Db(sqlx::Error::Configuration(
                format!("unsupported database URL (use sqlite:// or postgres://): {}", redact_url(url))
                    .into(),
            )));
        };
        let store =
            Store { db: Arc::new(db), commits: Arc::default(), transactions, pg_down: Arc::default() };
        if options.opening == Opening::Existing {
            store.at_this_schema().await?;
        }
        Ok(store)
    }

    /// Refuses a database whose schema is not this build's, for a tool that may not migrate it.
    async fn at_this_schema(&self) -> Result<(), StoreError> {
        let applied = self.read(async |tx| schema_applied(tx).await).await.map_err(|e| {
            StoreError::Corrupt(format!("not a Berth database (no record of its migrations: {e})"))
        })?;
        let known = schema_known();
        match applied.cmp(&known) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Less => Err(StoreError::SchemaBehind { applied, known }),
            std::cmp::Ordering::Greater => Err(StoreError::SchemaAhead { applied, known }),
        }
    }

    pub fn kind(&self) -> DbKind {
        match *self.db {
            Db::Sqlite { .. } => DbKind::Sqlite,
            Db::Postgres(_) => DbKind::Postgres,
        }
    }

    /// Runs `f` as one write transaction: committed when it returns `Ok`, rolled back otherwise.
    /// SQLite writers queue for the one writer connection, and those that queue together share
    /// its commit (`batch.rs`).
    pub async fn write<T, E>(&self, f: impl AsyncFnOnce(&mut Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        self.write_with(Durability::Disk, f).await
    }

    /// [`Store::write`], as durable as `durability` says once it returns.
    pub async fn write_with<T, E>(
        &self,
        durability: Durability,
        f: impl AsyncFnOnce(&mut Tx) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let started = std::time::Instant::now();
        let _writing = match &*self.db {
            Db::Sqlite { durable: Some(wal), .. } => {
                wal.refusal().map_err(E::from)?;
                Some(wal.writing())
            }
            _ => None,
        };
        let value = match &*self.db {
            Db::Sqlite { writer, waiting, .. } => {
                let mut tx = Tx::sqlite(sql::take_writer(writer, waiting).await, true).map_err(E::from)?;
                let value = f(&mut tx).await?;
                let finished = tx.finish_write();
                drop(tx);
                if let batch::Finished::Open(batch) = finished.map_err(E::from)? {
                    batch.outcome().await.map_err(E::from)?;
                }
                value
            }
            Db::Postgres(_) => {
                let mut tx = self.begin(true).await.map_err(E::from)?;
                let value = f(&mut tx).await?;
                tx.commit().await.map_err(E::from)?;
                self.transactions.fetch_add(1, Ordering::Relaxed);
                value
            }
        };
        match &*self.db {
            Db::Sqlite { .. } if durability == Durability::Written => {}
            Db::Sqlite { durable: Some(wal), .. } => {
                wal.covered().await.map_err(E::from)?;
                self.commits.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                self.commits.fetch_add(1, Ordering::Relaxed);
            }
        }
        crate::metrics::transaction("write", started.elapsed());
        Ok(value)
    }

    /// Returns once every write that returned before this call is on disk (the
    /// [`Durability::Written`] ones: the others are already).
    pub async fn sync(&self) -> Result<(), StoreError> {
        match &*self.db {
            Db::Sqlite { durable: Some(wal), .. } => {
                wal.refusal()?;
                let _writing = wal.writing();
                wal.covered().await
            }
            _ => Ok(()),
        }
    }

    /// Runs `f` as one read-only transaction: every statement sees the same snapshot (on
    /// PostgreSQL `REPEATABLE READ`, since `READ COMMITTED` takes a new snapshot per statement;
    /// a read-only transaction at that level never fails to serialize).
    pub async fn read<T, E>(&self, f: impl AsyncFnOnce(&mut Tx) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let started = std::time::Instant::now();
        let mut tx = self.begin(false).await.map_err(E::from)?;
        let value = f(&mut tx).await?;
        tx.commit().await.map_err(E::from)?;
        crate::metrics::transaction("read", started.elapsed());
        Ok(value)
    }

    async fn begin(&self, write: bool) -> Result<Tx, StoreError> {
        match &*self.db {
            Db::Sqlite { readers, next, .. } => {
                debug_assert!(!write, "SQLite's writes take the writer in `write_with`");
                let conn = {
                    // A free reader if there is one, else wait for the next in turn.
                    let start = next.fetch_add(1, Ordering::Relaxed);
                    let free = (0..readers.len())
                        .find_map(|i| readers[(start + i) % readers.len()].clone().try_lock_owned().ok());
                    match free {
                        Some(conn) => conn,
                        None => readers[start % readers.len()].clone().lock_owned().await,
                    }
                };
                Tx::sqlite(conn, false)
            }
            Db::Postgres(pool) => {
                // `BEGIN` runs in a task of its own, so that a caller that is dropped while it
                // runs (a client that went away, a `select!` that finished otherwise) cannot cancel
                // it half-way: sqlx 0.8 then returns the connection to the pool inside a
                // transaction it does not know about, and the next transaction on it runs inside
                // that one (a write in a read-only transaction: a 500). A finished `BEGIN` whose
                // caller is gone is rolled back when its transaction is dropped.
                let pool = pool.clone();
                let begin = tokio::spawn(async move {
                    if write {
                        pool.begin().await
                    } else {
                        pool.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await
                    }
                });
                // While the server was last seen down, wait less (the task goes on, and what it
                // begins late is rolled back as it is dropped).
                let joined = if self.pg_down.load(Ordering::Acquire) {
                    tokio::time::timeout(PG_WAIT_WHILE_DOWN, begin)
                        .await
                        .unwrap_or(Ok(Err(sqlx::Error::PoolTimedOut)))
                } else {
                    begin.await
                };
                let begun = joined.map_err(|_| StoreError::Db(sqlx::Error::WorkerCrashed))?;
                let unreachable = matches!(begun, Err(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_)));
                self.pg_down.store(unreachable, Ordering::Release);
                Ok(Tx::postgres(begun.map_err(StoreError::from_db)?))
            }
        }
    }

    /// Syncs of SQLite's write-ahead log made since the store was opened, and of them those made
    /// on the spot by a write alone ([`WalSync`]; none with `synchronous=NORMAL` or PostgreSQL).
    pub fn syncs(&self) -> (u64, u64) {
        match &*self.db {
            Db::Sqlite { durable: Some(wal), .. } => {
                (wal.syncs.load(Ordering::Relaxed), wal.on_the_spot.load(Ordering::Relaxed))
            }
            _ => (0, 0),
        }
    }

    /// Commits of the database since the store was opened: on SQLite, writes that waited for the
    /// writer together share one (`batch.rs`).
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// Durable write transactions ([`Durability::Disk`]) committed since the store was opened.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    pub async fn close(&self) {
        if let Db::Postgres(pool) = &*self.db {
            pool.close().await;
        }
    }
}

/// A database URL without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// Microseconds since the Unix epoch.
pub fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// `$first, $first+1, ...` placeholders for an `IN (...)` list of `n` values.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// The rows among `ids` of `table` (called `alias`) that still meet `purgeable` (about the
/// alias; `$1`: the time before which they were deleted), as a subquery with its parameters:
/// what a purge deletes, checked again inside its own write.
pub(crate) fn still_purgeable(
    table: &str,
    alias: &str,
    purgeable: &str,
    ids: &[String],
    before: i64,
) -> (String, Vec<sql::Param>) {
    let list = placeholders(2, ids.len());
    let mut params = vec![sql::Param::from(before)];
    params.extend(ids.iter().map(sql::Param::from));
    (format!("SELECT {alias}.id FROM {table} {alias} WHERE {alias}.id IN ({list}) AND {purgeable}"), params)
}

/// Creates the SQLite file 0600 if it does not exist (SQLite gives its WAL and shm files the
/// database file's mode).
fn create_private(path: &std::path::Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    if path.as_os_str().is_empty() || path.to_str() == Some(":memory:") {
        return Ok(());
    }
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Create { path: path.display().to_string(), why: e.to_string() }),
    }
}

/// Sets the database, WAL and shm files to 0600 (files made by an older version, or by SQLite
/// under another umask).
fn make_private(path: &std::path::Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = PathBuf::from(name);
        if file.exists() {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| StoreError::Corrupt(format!("cannot make {} private: {e}", file.display())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params;

    /// A PostgreSQL error with a SQLSTATE, as sqlx hands one over.
    #[derive(Debug)]
    struct PgState(&'static str);

    impl std::fmt::Display for PgState {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for PgState {}

    impl sqlx::error::DatabaseError for PgState {
        fn message(&self) -> &str {
            "could not extend file"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn a_full_disk_and_a_busy_database_are_conditions_that_pass_and_other_errors_are_not() {
        let pg = |code| StoreError::Db(sqlx::Error::Database(Box::new(PgState(code))));
        assert_eq!(pg("53100").unavailable(), Some(Unavailable::DiskFull), "disk_full");
        assert_eq!(pg("53300").unavailable(), Some(Unavailable::Busy), "too_many_connections");
        assert_eq!(pg("57P03").unavailable(), Some(Unavailable::Busy), "cannot_connect_now");
        assert_eq!(pg("42P01").unavailable(), None, "undefined_table is a bug");
        let sqlite = |m: &str| StoreError::Sqlite(m.into());
        assert_eq!(sqlite("database or disk is full").unavailable(), Some(Unavailable::DiskFull));
        assert_eq!(sqlite("database is locked").unavailable(), Some(Unavailable::Busy));
        assert_eq!(sqlite("no such table: volumes").unavailable(), None);
        assert_eq!(StoreError::Corrupt("x".into()).unavailable(), None);
    }

    fn wal_sync(store: &Store) -> &WalSync {
        match &*store.db {
            Db::Sqlite { durable: Some(wal), .. } => wal,
            _ => panic!("a SQLite store with synchronous=FULL"),
        }
    }

    async fn full_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("t.db").display());
        (dir, Store::open(&url, &StoreOptions::default()).await.unwrap())
    }

    async fn write_one(store: &Store) {
        store
            .write(async |tx| {
                tx.execute("INSERT INTO nodes (name, backends, version, started_at, heartbeat_at) VALUES ($1, '', '0', 0, 0)", &params![uuid::Uuid::new_v4().to_string()])
                    .await
            })
            .await
            .unwrap();
    }

    fn page_size(path: &std::path::Path) -> i64 {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.query_row("PRAGMA page_size", [], |r| r.get(0)).unwrap()
    }

    #[tokio::test]
    async fn a_new_sqlite_database_has_pages_of_2_kib() {
        let (dir, store) = full_store().await;
        write_one(&store).await;
        assert_eq!(page_size(&dir.path().join("t.db")), i64::from(SQLITE_PAGE_SIZE));
        assert_eq!(SQLITE_PAGE_SIZE, 2048);
    }

    #[tokio::test]
    async fn a_database_made_with_other_pages_keeps_them_and_works() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA page_size = 4096; CREATE TABLE made_before (x INTEGER);").unwrap();
        drop(conn);
        let store =
            Store::open(&format!("sqlite://{}", path.display()), &StoreOptions::default()).await.unwrap();
        write_one(&store).await;
        let nodes = store.read(async |tx| tx.query("SELECT name FROM nodes", &[]).await).await.unwrap();
        assert_eq!(nodes.len(), 1, "migrated and written");
        assert_eq!(page_size(&path), 4096, "a database keeps the page size it was made with");
    }

    #[tokio::test]
    async fn with_synchronous_full_a_write_returns_after_a_sync_of_the_log_begun_after_its_commit() {
        let (_dir, store) = full_store().await;
        let wal = wal_sync(&store);
        for n in 1..=3 {
            write_one(&store).await;
            assert_eq!(wal.syncs.load(Ordering::Relaxed), n, "one sync per write made alone");
            assert_eq!(wal.on_the_spot.load(Ordering::Relaxed), n, "made on the spot, no hand-off");
            assert_eq!(*wal.synced.lock().await, wal.tickets.load(Ordering::Relaxed), "every commit covered");
        }
    }

    #[tokio::test]
    async fn a_write_asked_only_to_be_written_returns_unsynced_and_the_next_sync_covers_it() {
        let (_dir, store) = full_store().await;
        let wal = wal_sync(&store);
        store
            .write_with(Durability::Written, async |tx| {
                tx.execute("INSERT INTO nodes (name, backends, version, started_at, heartbeat_at) VALUES ('w', '', '0', 0, 0)", &[])
                    .await
            })
            .await
            .unwrap();
        assert_eq!(wal.syncs.load(Ordering::Relaxed), 0, "no sync for a written write");
        assert_eq!(store.commits(), 0, "not a durable commit");
        let seen = store
            .read(async |tx| tx.query("SELECT name FROM nodes WHERE name = 'w'", &[]).await)
            .await
            .unwrap();
        assert_eq!(seen.len(), 1, "readers see it at once");
        store.sync().await.unwrap();
        assert_eq!(wal.syncs.load(Ordering::Relaxed), 1, "Store::sync syncs the log");
        assert_eq!(*wal.synced.lock().await, wal.tickets.load(Ordering::Relaxed), "and covers it");
        write_one(&store).await;
        assert_eq!((wal.syncs.load(Ordering::Relaxed), store.commits()), (2, 1), "a disk write syncs");
    }

    #[tokio::test]
    async fn commits_that_wait_while_a_sync_runs_share_the_next_one() {
        let (_dir, store) = full_store().await;
        let store = Arc::new(store);
        // A sync in progress: the lock it holds.
        let running = wal_sync(&store).synced.lock().await;
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move { write_one(&store).await })
            })
            .collect();
        while wal_sync(&store).tickets.load(Ordering::Acquire) < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(wal_sync(&store).syncs.load(Ordering::Relaxed), 0, "the three commits wait");
        drop(running);
        for w in writers {
            w.await.unwrap();
        }
        assert_eq!(wal_sync(&store).syncs.load(Ordering::Relaxed), 1, "one sync covered the three");
        assert_eq!(wal_sync(&store).on_the_spot.load(Ordering::Relaxed), 0, "off the runtime's threads");
        assert_eq!(wal_sync(&store).writers.load(Ordering::Relaxed), 0, "no write left counted");
    }

    #[tokio::test]
    async fn the_database_its_wal_and_shm_are_private_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        // An older file, world-readable.
        std::fs::write(&db, b"").unwrap();
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
        let store =
            Store::open(&format!("sqlite://{}", db.display()), &StoreOptions::default()).await.unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let file = dir.path().join(format!("t.db{suffix}"));
            let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", file.display());
        }
        store.close().await;
        let fresh = dir.path().join("fresh.db");
        let store =
            Store::open(&format!("sqlite://{}", fresh.display()), &StoreOptions::default()).await.unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().permissions().mode() & 0o777, 0o600);
        store.close().await;
    }

    #[test]
    fn urls_lose_their_password_in_messages() {
        assert_eq!(redact_url("postgres://berth:s3cret@127.0.0.1/db"), "postgres://berth:***@127.0.0.1/db");
        assert_eq!(redact_url("sqlite:///var/lib/berth/berth.db"), "sqlite:///var/lib/berth/berth.db");
    }

    #[test]
    fn placeholders_count_from_the_first() {
        assert_eq!(placeholders(3, 3), "$3, $4, $5");
    }

    /// The writer connection, to hold it as a long write would.
    fn writer(store: &Store) -> Arc<Mutex<SqliteConn>> {
        match &*store.db {
            Db::Sqlite { writer, .. } => writer.clone(),
            Db::Postgres(_) => panic!("a SQLite store"),
        }
    }

    fn waiting(store: &Store) -> usize {
        match &*store.db {
            Db::Sqlite { waiting, .. } => waiting.load(Ordering::Acquire),
            Db::Postgres(_) => panic!("a SQLite store"),
        }
    }

    /// A write of one node named `name`, failing after its insert when `fail`.
    async fn write_node(store: &Store, name: &str, fail: bool) -> Result<(), StoreError> {
        store
            .write(async |tx| {
                tx.execute(
                    "INSERT INTO nodes (name, backends, version, started_at, heartbeat_at) VALUES ($1, '', '0', 0, 0)",
                    &params![name],
                )
                .await?;
                if fail { Err(StoreError::Corrupt("given up".into())) } else { Ok(()) }
            })
            .await
    }

    async fn node_names(store: &Store) -> Vec<String> {
        let rows =
            store.read(async |tx| tx.query("SELECT name FROM nodes ORDER BY name", &[]).await).await.unwrap();
        rows.iter().map(|r| r.text(0).unwrap()).collect()
    }

    /// Starts `writes` (name, fails) while the writer is held, and lets it go once all wait.
    async fn queued_behind_a_held_writer(
        store: &Arc<Store>,
        writes: &[(&str, bool)],
    ) -> Vec<tokio::task::JoinHandle<Result<(), StoreError>>> {
        let held = writer(store).lock_owned().await;
        let mut handles = Vec::new();
        for (name, fail) in writes {
            let (writing, name, fail) = (store.clone(), name.to_string(), *fail);
            handles.push(tokio::spawn(async move { write_node(&writing, &name, fail).await }));
            // In the order started: the writer is handed on first come, first served.
            while waiting(store) < handles.len() {
                tokio::task::yield_now().await;
            }
        }
        drop(held);
        handles
    }

    #[tokio::test]
    async fn writers_that_waited_for_the_writer_together_share_one_commit() {
        let (_dir, store) = full_store().await;
        let store = Arc::new(store);
        let before = store.transactions();
        let writes = queued_behind_a_held_writer(&store, &[("a", false), ("b", false), ("c", false)]).await;
        for w in writes {
            w.await.unwrap().unwrap();
        }
        assert_eq!(store.transactions() - before, 1, "one commit for the three");
        assert_eq!(node_names(&store).await, ["a", "b", "c"]);
        assert_eq!(store.commits(), 3, "each a durable write");
        write_node(&store, "d", false).await.unwrap();
        assert_eq!(store.transactions() - before, 2, "a write alone commits at once");
    }

    #[tokio::test]
    async fn a_write_that_fails_in_a_shared_commit_takes_only_its_own_work_back() {
        let (_dir, store) = full_store().await;
        let store = Arc::new(store);
        let before = store.transactions();
        let writes =
            queued_behind_a_held_writer(&store, &[("a", false), ("b", true), ("c", false), ("d", true)])
                .await;
        let outcomes: Vec<bool> =
            futures_util::future::join_all(writes).await.into_iter().map(|w| w.unwrap().is_ok()).collect();
        assert_eq!(outcomes, [true, false, true, false]);
        assert_eq!(node_names(&store).await, ["a", "c"], "the failed writes' rows are gone, the others kept");
        assert_eq!(store.transactions() - before, 1);
    }

    #[tokio::test]
    async fn a_commit_left_open_for_a_writer_that_stopped_waiting_is_made_without_it() {
        let (_dir, store) = full_store().await;
        let store = Arc::new(store);
        let held = writer(&store).lock_owned().await;
        // The second writer's request goes away while the first writes (its task is aborted):
        // the first, finding it waiting, leaves the commit to it.
        let second: Arc<std::sync::OnceLock<tokio::task::AbortHandle>> = Arc::default();
        let first = {
            let (store, second) = (store.clone(), second.clone());
            tokio::spawn(async move {
                store
                    .write(async |tx| {
                        tx.execute("INSERT INTO nodes (name, backends, version, started_at, heartbeat_at) VALUES ('first', '', '0', 0, 0)", &[]).await?;
                        second.get().expect("the second writer started").abort();
                        Ok::<_, StoreError>(())
                    })
                    .await
            })
        };
        while waiting(&store) < 1 {
            tokio::task::yield_now().await;
        }
        let gone = {
            let store = store.clone();
            tokio::spawn(async move { write_node(&store, "gone", false).await })
        };
        second.set(gone.abort_handle()).unwrap();
        while waiting(&store) < 2 {
            tokio::task::yield_now().await;
        }
        drop(held);
        let first = tokio::time::timeout(Duration::from_secs(10), first).await;
        first.expect("the open commit is made in the stopped writer's place").unwrap().unwrap();
        assert!(gone.await.unwrap_err().is_cancelled());
        assert_eq!(node_names(&store).await, ["first"]);
        assert_eq!(waiting(&store), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_write_is_lost_when_many_share_commits() {
        let (_dir, store) = full_store().await;
        let store = Arc::new(store);
        let writes: Vec<_> = (0..200)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { write_node(&store, &format!("n{i:03}"), i % 7 == 0).await })
            })
            .collect();
        let outcomes: Vec<bool> =
            futures_util::future::join_all(writes).await.into_iter().map(|w| w.unwrap().is_ok()).collect();
        let expected: Vec<String> = (0..200).filter(|i| i % 7 != 0).map(|i| format!("n{i:03}")).collect();
        assert_eq!(outcomes.iter().filter(|ok| **ok).count(), expected.len());
        assert_eq!(node_names(&store).await, expected);
        assert!(store.transactions() <= expected.len() as u64);
    }

    #[tokio::test]
    async fn a_failed_transaction_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/t.db", dir.path().display()), &StoreOptions::default())
            .await
            .unwrap();
        let insert = "INSERT INTO volumes (id, project_id, user_id, size_gib, volume_type, backend, multiattach, \
                      status, attach_status, driver_data, metadata, created_at, updated_at) \
                      VALUES ('v', 'p', 'u', 1, 't', 'b', 0, 'available', 'detached', '{}', '{}', 0, 0)";
        let failed: Result<(), StoreError> = store
            .write(async |tx| {
                assert_eq!(tx.execute(insert, &[]).await?, 1);
                Err(StoreError::Corrupt("abandon".into()))
            })
            .await;
        assert!(failed.is_err());
        let count: i64 = store
            .read(async |tx| tx.query("SELECT COUNT(*) FROM volumes", &[]).await?[0].int(0))
            .await
            .unwrap();
        assert_eq!(count, 0);
        assert_eq!(store.commits(), 0);
    }

    #[tokio::test]
    async fn parameters_bind_by_number_whatever_their_order_in_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/t.db", dir.path().display()), &StoreOptions::default())
            .await
            .unwrap();
        let row = store
            .read(async |tx| tx.query("SELECT $2, $1, $2", &crate::params!["one", 2i64]).await)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(
            (row.int(0).unwrap(), row.text(1).unwrap(), row.int(2).unwrap()),
            (2, "one".to_string(), 2)
        );
    }

    /// The plans SQLite chooses for the lists that must stay fast at 100,000 attachments and
    /// more: no full scan of a table (soft-deleted rows pile up: one per finished attach cycle),
    /// and no sort of every row before a page is taken (`USE TEMP B-TREE FOR ORDER BY`).
    #[tokio::test]
    async fn lists_at_scale_use_indexes() {
        use crate::domain::list::{AttachmentFilter, Page, Scope, VolumeFilter};
        use crate::domain::model::{AttachMode, Attachment};
        use crate::domain::state::{AttachStatus, Slot};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/t.db", dir.path().display()), &StoreOptions::default())
            .await
            .unwrap();
        let marker = Attachment {
            id: "m".into(),
            volume_id: "v".into(),
            project_id: "p".into(),
            instance_uuid: None,
            attached_host: None,
            mountpoint: None,
            attach_mode: AttachMode::Null,
            status: AttachStatus::Attached,
            slot: Slot::Exclusive,
            connection_info: None,
            attach_time: None,
            detach_time: None,
            created_at: 1,
            updated_at: 1,
            legacy: false,
        };
        let page = Page::default();
        let (all, project) = (Scope::All, Scope::Project("p"));
        let none = AttachmentFilter::default();
        let by_volume = AttachmentFilter { volume_id: Some("v".into()), ..Default::default() };
        // (what, the statement, the index it must use)
        let mut queries = vec![
            (
                "attachments of a project",
                attachments::list_query(project, &none, &page, None),
                "volume_attachment_by_project",
            ),
            (
                "attachments of a project after a marker",
                attachments::list_query(project, &none, &page, Some(&marker)),
                "volume_attachment_by_project",
            ),
            (
                "attachments of every project",
                attachments::list_query(all, &none, &page, None),
                "volume_attachment_live",
            ),
            (
                "attachments of every project after a marker",
                attachments::list_query(all, &none, &page, Some(&marker)),
                "volume_attachment_live",
            ),
            (
                "attachments of a volume",
                attachments::list_query(project, &by_volume, &page, None),
                "volume_attachment_by_volume",
            ),
            (
                "volumes of a project",
                volumes::list_query(project, &VolumeFilter::default(), &page, None),
                "volumes_by_project",
            ),
            (
                "volumes of every project",
                volumes::list_query(all, &VolumeFilter::default(), &page, None),
                "volumes_live",
            ),
        ]
        .into_iter()
        .map(|(what, q, index)| (what, q.sql, q.params, index))
        .collect::<Vec<_>>();
        queries.push((
            "connected attachments",
            attachments::connected_query(),
            crate::params!["a", "b"].to_vec(),
            "volume_attachment_by_volume",
        ));
        {
            use crate::domain::history::EventFilter;
            let volume = EventFilter { volume_id: Some("v".into()), ..Default::default() };
            let attachment = EventFilter { attachment_id: Some("a".into()), ..Default::default() };
            let since = EventFilter { since: Some(1), ..volume.clone() };
            for (what, scope, filter, index) in [
                ("a volume's events", project, &volume, "attach_events_chain"),
                ("a volume's events, every project", all, &volume, "attach_events_chain"),
                ("a volume's events since a time", project, &since, "attach_events_chain"),
                ("an attachment's events", project, &attachment, "attach_events_chain"),
                ("a project's events", project, &EventFilter::default(), "attach_events_by_project"),
                ("every project's events", all, &EventFilter::default(), "attach_events_by_time"),
            ] {
                let (sql, params) = events::list_query(scope, filter, None, 100);
                // A volume's few events are sorted; the lists of many are read in order.
                let sorted_ok = filter.volume_id.is_some() || filter.attachment_id.is_some();
                let plan: Vec<String> = store
                    .read(async |tx| {
                        let rows = tx.query(&format!("EXPLAIN QUERY PLAN {sql}"), &params).await?;
                        rows.iter().map(|r| r.text(3)).collect::<Result<Vec<_>, StoreError>>()
                    })
                    .await
                    .unwrap();
                for step in &plan {
                    let full_scan = step.starts_with("SCAN ") && !step.contains("USING");
                    assert!(!full_scan, "{what}: a full scan: {plan:?}\n{sql}");
                    assert!(
                        sorted_ok || !step.contains("TEMP B-TREE FOR ORDER BY"),
                        "{what}: sorts every row: {plan:?}\n{sql}"
                    );
                }
                assert!(
                    plan.iter().any(|s| s.contains(index)),
                    "{what}: does not use {index}: {plan:?}\n{sql}"
                );
            }
        }
        for (what, sql, params, index) in queries {
            let plan: Vec<String> = store
                .read(async |tx| {
                    let rows = tx.query(&format!("EXPLAIN QUERY PLAN {sql}"), &params).await?;
                    rows.iter().map(|r| r.text(3)).collect::<Result<Vec<_>, StoreError>>()
                })
                .await
                .unwrap();
            for step in &plan {
                let full_scan = step.starts_with("SCAN ") && !step.contains("USING");
                assert!(!full_scan, "{what}: a full scan: {plan:?}\n{sql}");
                assert!(
                    !step.contains("TEMP B-TREE FOR ORDER BY"),
                    "{what}: sorts every row: {plan:?}\n{sql}"
                );
            }
            assert!(plan.iter().any(|s| s.contains(index)), "{what}: does not use {index}: {plan:?}\n{sql}");
        }
    }
}

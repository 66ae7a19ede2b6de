//! The store: all SQL, one file per table. SQLite (embedded default) and PostgreSQL run the same
//! statements through sqlx's `Any` driver. Every state change is a conditional update whose
//! `WHERE` comes from the state machine's transition table; a partial unique index backs it up.
//! Nothing here knows HTTP or which transitions are legal.
//!
//! Concurrency: a write transaction first updates the volume row it concerns (which locks it in
//! PostgreSQL); statements after that see every change committed by earlier writers of the same
//! volume, so a status derived from the attachments inside the transaction is never stale. On
//! SQLite all writes go through one connection, so writers never see `SQLITE_BUSY`.

pub mod attachments;
pub mod volumes;

use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{Any, AnyPool, Executor};

/// A write transaction.
pub type Tx = sqlx::Transaction<'static, Any>;

/// Which database the store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Sqlite,
    Postgres,
}

/// SQLite's durability setting. `Full` (the default) makes every commit durable across a power
/// loss; `Normal` survives process crashes but may lose the last commits on power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    Full,
    Normal,
}

#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub synchronous: Synchronous,
    /// Connections to PostgreSQL, or SQLite readers.
    pub max_connections: u32,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { synchronous: Synchronous::Full, max_connections: 16 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A named constraint refused the change (a race lost against the backstop).
    #[error("constraint {0} refused the change")]
    Constraint(String),
    #[error("database error: {0}")]
    Db(#[from] sqlx::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Maps a unique/foreign-key violation to [`StoreError::Constraint`].
    pub(crate) fn from_db(e: sqlx::Error) -> StoreError {
        if let sqlx::Error::Database(db) = &e {
            let message = db.message();
            for name in ["one_live_attachment_per_exclusive_volume"] {
                if db.constraint() == Some(name) || message.contains(name) {
                    return StoreError::Constraint(name.to_string());
                }
            }
            // SQLite names the columns, not the index.
            if message.contains("UNIQUE constraint failed: volume_attachment.volume_id") {
                return StoreError::Constraint("one_live_attachment_per_exclusive_volume".into());
            }
        }
        StoreError::Db(e)
    }
}

/// The database.
#[derive(Clone)]
pub struct Store {
    write: AnyPool,
    read: AnyPool,
    kind: DbKind,
}

impl Store {
    /// Opens (creating if needed) the database at `url` (`sqlite://path` or `postgres://...`)
    /// and applies pending migrations.
    pub async fn open(url: &str, options: &StoreOptions) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let kind = if url.starts_with("sqlite:") {
            DbKind::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            DbKind::Postgres
        } else {
            return Err(StoreError::Db(sqlx::Error::Configuration(
                format!("unsupported database URL (use sqlite:// or postgres://): {}", redact_url(url))
                    .into(),
            )));
        };
        let store = match kind {
            DbKind::Sqlite => {
                let url = if url.contains('?') { url.to_string() } else { format!("{url}?mode=rwc") };
                let connect = AnyConnectOptions::from_str(&url)?;
                let synchronous = match options.synchronous {
                    Synchronous::Full => "FULL",
                    Synchronous::Normal => "NORMAL",
                };
                let pragmas = format!(
                    "PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; \
                     PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000;"
                );
                let pool = |max: u32, pragmas: String| {
                    AnyPoolOptions::new()
                        .max_connections(max)
                        .min_connections(1)
                        .acquire_timeout(Duration::from_secs(30))
                        .after_connect(move |conn, _meta| {
                            let pragmas = pragmas.clone();
                            Box::pin(async move {
                                conn.execute(pragmas.as_str()).await?;
                                Ok(())
                            })
                        })
                        .connect_with(connect.clone())
                };
                let write = pool(1, pragmas.clone()).await?;
                let read = pool(options.max_connections.max(1), pragmas).await?;
                Store { write, read, kind }
            }
            DbKind::Postgres => {
                let pool = AnyPoolOptions::new()
                    .max_connections(options.max_connections.max(2))
                    .acquire_timeout(Duration::from_secs(30))
                    .connect(url)
                    .await?;
                Store { write: pool.clone(), read: pool, kind }
            }
        };
        sqlx::migrate!("../migrations").run(&store.write).await.map_err(|e| StoreError::Db(e.into()))?;
        Ok(store)
    }

    pub fn kind(&self) -> DbKind {
        self.kind
    }

    /// Starts a write transaction.
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        let statement = match self.kind {
            DbKind::Sqlite => "BEGIN IMMEDIATE",
            DbKind::Postgres => "BEGIN",
        };
        Ok(self.write.begin_with(statement).await?)
    }

    /// The pool for reads outside transactions.
    pub fn reader(&self) -> &AnyPool {
        &self.read
    }

    pub async fn close(&self) {
        self.write.close().await;
        self.read.close().await;
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

/// Who may see a row.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    Project(&'a str),
    All,
}

/// Paging of a list: `limit`, `offset`, and the id of the last row of the previous page.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub limit: Option<i64>,
    pub offset: Option<i64>,
    pub marker: Option<String>,
    /// (column, ascending) pairs, already validated by the caller.
    pub sort: Vec<(String, bool)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_password_in_messages() {
        assert_eq!(redact_url("postgres://berth:s3cret@127.0.0.1/db"), "postgres://berth:***@127.0.0.1/db");
        assert_eq!(redact_url("sqlite:///var/lib/berth/berth.db"), "sqlite:///var/lib/berth/berth.db");
    }

    #[test]
    fn placeholders_count_from_the_first() {
        assert_eq!(placeholders(3, 3), "$3, $4, $5");
    }
}

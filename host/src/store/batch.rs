//! Writers that queue for SQLite's one writer connection share its transaction.
//!
//! A commit writes every page its transaction changed to the write-ahead log, and most of a
//! transaction's pages are the same as the next one's (the last leaf of each table and index that
//! grows at its end, the pages above them): with sixteen clients the writer was held about 80 % of
//! the time, half of it committing. So a writer that finishes while others wait for the
//! connection does not commit: it leaves the transaction open (a *batch*) and waits; the next
//! writer runs inside it, in a savepoint of its own, and so on, until one finishes with nobody
//! waiting (or the batch is `MEMBERS` long) and commits for all. Nobody is answered before that
//! commit, so a kill leaves each write of a batch as it leaves a write alone: committed, or not
//! (and with `synchronous=FULL` each then waits for a sync of the log that began after the
//! commit, `WalSync`). A writer that fails rolls back its savepoint only; a failure that ends the
//! whole transaction (SQLite ends it itself on I/O errors and a full disk) or of its commit fails
//! every write of the batch. A write alone (nobody waiting) commits at once, as before.
//!
//! Who commits an open batch: whoever holds the connection when nobody waits for it. A writer
//! leaves a batch open only while another is waiting, so there is always a next holder; one that
//! stops waiting (its request was dropped) before it got the connection hands the batch to a
//! task that takes the connection and commits it (`sql::take_writer`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rusqlite::Connection;
use tokio::sync::watch;

use super::StoreError;

/// The most writes one commit carries.
const MEMBERS: usize = 16;

/// The writer connection's sharing: who waits for it, and the batch it holds open.
pub(crate) struct Group {
    /// Writers waiting for the connection (not yet holding it).
    waiting: Arc<AtomicUsize>,
    /// The open batch, if the connection's transaction is one.
    open: Option<(Arc<Batch>, usize)>,
    /// Commits of the database (a batch's counts once).
    commits: Arc<AtomicU64>,
}

/// An open batch's outcome, told to every write in it once it committed or failed.
pub(crate) struct Batch {
    outcome: watch::Sender<Option<Result<(), String>>>,
}

/// What a writer holding the connection came to.
pub(crate) enum Finished {
    /// Committed, its own or its batch's.
    Committed,
    /// Left in the open batch: wait for its outcome.
    Open(Arc<Batch>),
}

impl Group {
    pub(crate) fn new(waiting: Arc<AtomicUsize>, commits: Arc<AtomicU64>) -> Group {
        Group { waiting, open: None, commits }
    }

    /// Whether a batch is open (the writer holding the connection joins it with a savepoint).
    pub(crate) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Counts a writer as waiting for the connection until the returned guard is dropped.
    pub(crate) fn waiting(waiting: &Arc<AtomicUsize>) -> Waiting {
        waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(waiting.clone())
    }

    /// After a writer's work succeeded (its savepoint released): commits, or leaves the
    /// transaction open for the writer waiting.
    pub(crate) fn finish(&mut self, conn: &Connection) -> Result<Finished, StoreError> {
        if conn.is_autocommit() {
            return Err(self.ended());
        }
        let members = self.open.as_ref().map_or(0, |(_, n)| *n) + 1;
        if self.waiting.load(Ordering::Acquire) > 0 && members < MEMBERS {
            let batch = match self.open.take() {
                Some((batch, _)) => batch,
                None => Arc::new(Batch { outcome: watch::channel(None).0 }),
            };
            self.open = Some((batch.clone(), members));
            return Ok(Finished::Open(batch));
        }
        self.commit(conn)?;
        Ok(Finished::Committed)
    }

    /// Settles an open batch that the writer holding the connection leaves without finishing
    /// (its work rolled back, or it only took the connection to commit): fails it if SQLite ended
    /// its transaction, commits it if nobody waits to join it.
    pub(crate) fn settle(&mut self, conn: &Connection) {
        if conn.is_autocommit() {
            self.ended();
        } else if self.open.is_some() && self.waiting.load(Ordering::Acquire) == 0 {
            let _ = self.commit(conn);
        }
    }

    /// SQLite ended the transaction itself (an I/O error, a full disk): the batch's writes are
    /// lost.
    fn ended(&mut self) -> StoreError {
        // Worded as the I/O error it comes from, so that it is answered as one (503).
        let why = "disk I/O error or full disk: SQLite rolled back the transaction".to_string();
        self.fail(why.clone());
        StoreError::Sqlite(why)
    }

    /// Commits the connection's transaction and tells the batch's writers.
    fn commit(&mut self, conn: &Connection) -> Result<(), StoreError> {
        if let Err(e) = run(conn, "COMMIT") {
            let _ = run(conn, "ROLLBACK");
            let e = StoreError::from(e);
            self.fail(e.to_string());
            return Err(e);
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        if let Some((batch, _)) = self.open.take() {
            batch.outcome.send_replace(Some(Ok(())));
        }
        Ok(())
    }

    fn fail(&mut self, why: String) {
        if let Some((batch, _)) = self.open.take() {
            batch.outcome.send_replace(Some(Err(why)));
        }
    }
}

/// A writer counted as waiting for the connection ([`Group::waiting`]).
pub(crate) struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `COMMIT` or `ROLLBACK`, parsed once per connection.
fn run(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.raw_execute().map(drop)
}

impl Batch {
    /// Waits until the batch committed or failed.
    pub(crate) async fn outcome(&self) -> Result<(), StoreError> {
        let mut seen = self.outcome.subscribe();
        let outcome = seen.wait_for(Option::is_some).await.map_err(|_| StoreError::Finished)?;
        match outcome.as_ref() {
            Some(Ok(())) => Ok(()),
            Some(Err(why)) => Err(StoreError::Sqlite(format!("a write of the same commit failed: {why}"))),
            None => unreachable!("waited for an outcome"),
        }
    }
}

//! A transaction ([`Tx`]) and the values that go in and out of it. The same SQL text runs on both
//! databases; parameters are `$1..$n` and values are integers, text or NULL.
//!
//! On SQLite, statements run directly on a rusqlite connection owned by the store, in the task
//! that asks: sqlx's SQLite driver runs every statement on a worker thread of its own, and on a
//! small VM each of those hand-offs costs 40 to 120 µs, which made a short transaction hold the only
//! writer for most of a millisecond. On PostgreSQL, statements go through sqlx as usual.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use sqlx::postgres::PgRow;
use sqlx::{Column, Postgres, Row as _, TypeInfo, ValueRef as _};
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::StoreError;
use super::batch::{Finished, Group, Waiting};

/// A statement parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Param {
    fn from(v: i64) -> Self {
        Param::Int(Some(v))
    }
}
impl From<Option<i64>> for Param {
    fn from(v: Option<i64>) -> Self {
        Param::Int(v)
    }
}
impl From<bool> for Param {
    fn from(v: bool) -> Self {
        Param::Int(Some(v as i64))
    }
}
impl From<&str> for Param {
    fn from(v: &str) -> Self {
        Param::Text(Some(v.to_string()))
    }
}
impl From<String> for Param {
    fn from(v: String) -> Self {
        Param::Text(Some(v))
    }
}
impl From<&String> for Param {
    fn from(v: &String) -> Self {
        Param::Text(Some(v.clone()))
    }
}
impl From<Option<String>> for Param {
    fn from(v: Option<String>) -> Self {
        Param::Text(v)
    }
}
impl From<Option<&str>> for Param {
    fn from(v: Option<&str>) -> Self {
        Param::Text(v.map(str::to_string))
    }
}
impl From<&Option<String>> for Param {
    fn from(v: &Option<String>) -> Self {
        Param::Text(v.clone())
    }
}

/// Builds a parameter list: `params![a, b, c]` (an array; `Vec::from` it to extend it).
#[macro_export]
macro_rules! params {
    ($($p:expr),* $(,)?) => { [$($crate::store::sql::Param::from($p)),*] };
}

/// One value of a result row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Text(String),
}

/// A result row, cells in `SELECT` order.
#[derive(Debug, Clone)]
pub struct Row(pub Vec<Cell>);

impl Row {
    fn cell(&self, i: usize) -> Result<&Cell, StoreError> {
        self.0.get(i).ok_or_else(|| StoreError::Corrupt(format!("row has no column {i}")))
    }

    pub fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.opt_int(i)?.ok_or_else(|| StoreError::Corrupt(format!("column {i} is NULL")))
    }

    pub fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Int(v) => Ok(Some(*v)),
            Cell::Text(t) => Err(StoreError::Corrupt(format!("column {i} is text {t:?}, not an integer"))),
        }
    }

    pub fn text(&self, i: usize) -> Result<String, StoreError> {
        self.opt_text(i)?.ok_or_else(|| StoreError::Corrupt(format!("column {i} is NULL")))
    }

    pub fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Text(t) => Ok(Some(t.clone())),
            Cell::Int(v) => Err(StoreError::Corrupt(format!("column {i} is integer {v}, not text"))),
        }
    }

    pub fn flag(&self, i: usize) -> Result<bool, StoreError> {
        Ok(self.int(i)? != 0)
    }
}

/// A SQLite connection owned by the store; the writer's with the writers sharing it
/// (`batch.rs`).
pub(crate) struct SqliteConn(pub(crate) rusqlite::Connection, pub(crate) Option<Group>);

impl SqliteConn {
    fn group_mut(&mut self) -> &mut Group {
        self.1.as_mut().expect("only the writer connection is written through")
    }

    /// Settles an open batch this writer leaves (`Group::settle`).
    fn settle(&mut self) {
        if let SqliteConn(conn, Some(group)) = self {
            group.settle(conn);
        }
    }
}

/// Takes the writer connection, counted as waiting for it meanwhile; if the caller stops waiting
/// first, a task takes it in its place to settle a batch that may have been left open for it
/// (`batch.rs`).
pub(crate) async fn take_writer(
    writer: &Arc<Mutex<SqliteConn>>,
    waiting: &Arc<AtomicUsize>,
) -> OwnedMutexGuard<SqliteConn> {
    struct Queued<'a> {
        writer: &'a Arc<Mutex<SqliteConn>>,
        _waiting: Waiting,
        got: bool,
    }
    impl Drop for Queued<'_> {
        fn drop(&mut self) {
            if !self.got
                && let Ok(runtime) = tokio::runtime::Handle::try_current()
            {
                let writer = self.writer.clone();
                runtime.spawn(async move { writer.lock_owned().await.settle() });
            }
        }
    }
    let mut queued = Queued { writer, _waiting: Group::waiting(waiting), got: false };
    let conn = writer.clone().lock_owned().await;
    queued.got = true;
    conn
}

// SAFETY: rusqlite's `Connection` is not `Sync` because of interior caches; the store only ever
// reaches one through a `tokio::sync::Mutex`, so it is never used from two threads at once.
unsafe impl Sync for SqliteConn {}

/// An open transaction. Committed by [`super::Store::write`] when its closure succeeds; rolled
/// back otherwise, and also when it is dropped unfinished (a cancelled request).
pub struct Tx {
    inner: Inner,
}

enum Inner {
    Sqlite {
        conn: OwnedMutexGuard<SqliteConn>,
        open: bool,
        /// A write that joined an open batch: its work is a savepoint of the batch's transaction.
        member: bool,
    },
    /// `None` once committed.
    Postgres(Option<sqlx::Transaction<'static, Postgres>>),
}

impl Tx {
    pub(crate) fn sqlite(mut conn: OwnedMutexGuard<SqliteConn>, write: bool) -> Result<Tx, StoreError> {
        let member = write && conn.group_mut().is_open();
        let begin = match (write, member) {
            (false, _) => "BEGIN",
            (true, false) => "BEGIN IMMEDIATE",
            (true, true) => "SAVEPOINT member",
        };
        if let Err(e) = control(&conn.0, begin) {
            if write {
                // An open batch is left to whoever holds the writer next, or committed now.
                conn.settle();
            }
            return Err(sqlite_error(e));
        }
        Ok(Tx { inner: Inner::Sqlite { conn, open: true, member } })
    }

    /// Ends a SQLite write whose work succeeded: committed, or left in the open batch for the
    /// writer waiting (`batch.rs`).
    pub(crate) fn finish_write(&mut self) -> Result<Finished, StoreError> {
        let Inner::Sqlite { conn, open, member } = &mut self.inner else {
            return Err(StoreError::Finished);
        };
        if *member && let Err(e) = control(&conn.0, "RELEASE member") {
            return Err(sqlite_error(e));
        }
        *open = false;
        let SqliteConn(db, group) = &mut **conn;
        group.as_mut().ok_or(StoreError::Finished)?.finish(db)
    }

    pub(crate) fn postgres(tx: sqlx::Transaction<'static, Postgres>) -> Tx {
        Tx { inner: Inner::Postgres(Some(tx)) }
    }

    pub fn kind(&self) -> super::DbKind {
        match self.inner {
            Inner::Sqlite { .. } => super::DbKind::Sqlite,
            Inner::Postgres(_) => super::DbKind::Postgres,
        }
    }

    /// Runs a statement; returns the number of rows it changed.
    pub async fn execute(&mut self, sql: &str, params: &[Param]) -> Result<u64, StoreError> {
        match &mut self.inner {
            Inner::Sqlite { conn, .. } => {
                let mut stmt = conn.0.prepare_cached(sql).map_err(sqlite_error)?;
                bind(&mut stmt, params)?;
                Ok(stmt.raw_execute().map_err(sqlite_error)? as u64)
            }
            Inner::Postgres(tx) => {
                let tx = tx.as_mut().ok_or(StoreError::Finished)?;
                Ok(pg_query(sql, params)
                    .execute(&mut **tx)
                    .await
                    .map_err(StoreError::from_db)?
                    .rows_affected())
            }
        }
    }

    /// Runs a query; returns its rows.
    pub async fn query(&mut self, sql: &str, params: &[Param]) -> Result<Vec<Row>, StoreError> {
        match &mut self.inner {
            Inner::Sqlite { conn, .. } => sqlite_query(&conn.0, sql, params),
            Inner::Postgres(tx) => {
                let tx = tx.as_mut().ok_or(StoreError::Finished)?;
                let rows = pg_query(sql, params).fetch_all(&mut **tx).await.map_err(StoreError::from_db)?;
                rows.iter().map(pg_row).collect()
            }
        }
    }

    pub(crate) async fn commit(mut self) -> Result<(), StoreError> {
        match &mut self.inner {
            Inner::Sqlite { conn, open, .. } => {
                *open = false;
                if let Err(e) = control(&conn.0, "COMMIT") {
                    let _ = control(&conn.0, "ROLLBACK");
                    return Err(sqlite_error(e));
                }
                Ok(())
            }
            Inner::Postgres(tx) => {
                tx.take().ok_or(StoreError::Finished)?.commit().await.map_err(StoreError::from_db)
            }
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if let Inner::Sqlite { conn, open: true, member } = &mut self.inner {
            if *member {
                let _ = control(&conn.0, "ROLLBACK TO member");
                let _ = control(&conn.0, "RELEASE member");
            } else {
                let _ = control(&conn.0, "ROLLBACK");
            }
            conn.settle();
        }
    }
}

/// Runs `BEGIN`, `COMMIT` or `ROLLBACK` through the connection's statement cache: parsed once per
/// connection, not at every transaction (`execute_batch` parses its text each time).
fn control(conn: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.raw_execute().map(drop)
}

fn sqlite_error(e: rusqlite::Error) -> StoreError {
    StoreError::from_message(e.to_string())
}

/// Binds `$1..$n` by name: SQLite numbers parameters in order of first appearance, so `$2`
/// before `$1` in the text would otherwise swap them.
fn bind(stmt: &mut rusqlite::CachedStatement<'_>, params: &[Param]) -> Result<(), StoreError> {
    for (i, p) in params.iter().enumerate() {
        let Some(index) = stmt.parameter_index(&format!("${}", i + 1)).map_err(sqlite_error)? else {
            continue;
        };
        let r = match p {
            Param::Int(v) => stmt.raw_bind_parameter(index, v),
            Param::Text(v) => stmt.raw_bind_parameter(index, v),
        };
        r.map_err(sqlite_error)?;
    }
    Ok(())
}

fn sqlite_query(conn: &rusqlite::Connection, sql: &str, params: &[Param]) -> Result<Vec<Row>, StoreError> {
    use rusqlite::types::ValueRef;
    let mut stmt = conn.prepare_cached(sql).map_err(sqlite_error)?;
    bind(&mut stmt, params)?;
    let width = stmt.column_count();
    let mut rows = stmt.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite_error)? {
        let mut cells = Vec::with_capacity(width);
        for i in 0..width {
            cells.push(match row.get_ref(i).map_err(sqlite_error)? {
                ValueRef::Null => Cell::Null,
                ValueRef::Integer(v) => Cell::Int(v),
                ValueRef::Real(v) => Cell::Int(v as i64),
                ValueRef::Text(t) | ValueRef::Blob(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
            });
        }
        out.push(Row(cells));
    }
    Ok(out)
}

fn pg_query<'q>(
    sql: &'q str,
    params: &'q [Param],
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let mut q = sqlx::query(sql);
    for p in params {
        q = match p {
            Param::Int(v) => q.bind(*v),
            Param::Text(v) => q.bind(v.clone()),
        };
    }
    q
}

fn pg_row(row: &PgRow) -> Result<Row, StoreError> {
    let mut cells = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        if row.try_get_raw(i)?.is_null() {
            cells.push(Cell::Null);
            continue;
        }
        cells.push(match column.type_info().name() {
            "INT8" => Cell::Int(row.try_get::<i64, _>(i)?),
            "INT4" => Cell::Int(row.try_get::<i32, _>(i)?.into()),
            "INT2" => Cell::Int(row.try_get::<i16, _>(i)?.into()),
            "BOOL" => Cell::Int(row.try_get::<bool, _>(i)? as i64),
            _ => Cell::Text(row.try_get::<String, _>(i)?),
        });
    }
    Ok(Row(cells))
}

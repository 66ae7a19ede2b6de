//! Backups of the embedded SQLite database (`berth db backup`, `berth db restore`): a consistent
//! copy taken while the service writes, and a copy put back while no service runs on it. On
//! PostgreSQL both are refused, naming `pg_dump` and `pg_restore`.

use std::path::{Path, PathBuf};

use super::{Db, Store, StoreError, schema_known};

impl Store {
    /// Writes a consistent copy of a SQLite database to `to`, a file that must not exist yet,
    /// while a service may go on writing the database (SQLite's `VACUUM INTO`: one read
    /// transaction's snapshot, every committed change before it and none after, compacted).
    /// The copy is private (0600), as the database is: it holds every CHAP secret. It is written
    /// as `<to>.partial-<pid>`, synced, and only then given its name (a link, which never
    /// replaces a file made meanwhile), the directory synced too: a file named `to` is always a
    /// whole copy, and one cut short (a kill, a full disk) keeps the name that says so. Returns
    /// its size in bytes. PostgreSQL is refused: its backups are `pg_dump`'s.
    pub async fn copy_to(&self, to: &std::path::Path) -> Result<u64, StoreError> {
        use std::os::unix::fs::OpenOptionsExt;
        let Db::Sqlite { readers, .. } = &*self.db else {
            return Err(StoreError::Refused(
                "the database is PostgreSQL: back it up with pg_dump (docs/operations.md, \"Backing up the database\")"
                    .into(),
            ));
        };
        let refused = |path: &Path, e: std::io::Error| StoreError::Create {
            path: path.display().to_string(),
            why: e.to_string(),
        };
        if std::fs::symlink_metadata(to).is_ok() {
            return Err(refused(to, std::io::Error::from_raw_os_error(libc::EEXIST)));
        }
        let mut partial = to.as_os_str().to_owned();
        partial.push(format!(".partial-{}", std::process::id()));
        let partial = PathBuf::from(partial);
        // SQLite writes into an empty file that exists: made here, private from the start.
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)
            .map_err(|e| refused(&partial, e))?;
        let conn = readers[0].clone().lock_owned().await;
        let target = partial.display().to_string();
        let copied = tokio::task::spawn_blocking(move || conn.0.execute("VACUUM INTO ?1", [&target]))
            .await
            .map_err(|e| StoreError::Corrupt(format!("the copy stopped: {e}")));
        let written = match copied {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(e),
        };
        crate::failpoint::hit("db.backup.written").await;
        let placed = written.and_then(|()| {
            std::fs::File::open(&partial).and_then(|f| f.sync_all()).map_err(|e| refused(&partial, e))?;
            std::fs::hard_link(&partial, to).map_err(|e| refused(to, e))?;
            let dir = to.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| refused(dir, e))
        });
        let _ = std::fs::remove_file(&partial);
        placed?;
        Ok(std::fs::metadata(to).map(|m| m.len()).unwrap_or(0))
    }
}

/// The file of a SQLite database URL (`sqlite://PATH`, `sqlite:PATH`); none for another database.
pub fn sqlite_file(url: &str) -> Option<PathBuf> {
    use std::str::FromStr;
    if !url.starts_with("sqlite:") {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    Some(PathBuf::from(options.get_filename()))
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The last migration the copy had (at most this build's).
    pub schema: i64,
    /// Where the database it replaced was kept (none: there was none).
    pub replaced: Option<PathBuf>,
}

/// Puts the copy `from` (a `berth db backup`) in place of the SQLite database `db`, while no
/// service runs on it (the caller holds the data directory's lock). The copy is checked first
/// (SQLite's integrity check, and a schema this build knows: a newer berth's is refused, an
/// older one is migrated when the service starts); the database it replaces, its write-ahead
/// log folded in, is kept next to it as `<db>.replaced-<unix time>`; the new file is private
/// (0600) and synced before it takes the database's name in one rename: cut short at any step,
/// the restore leaves the database as it was (with a second name, or an unused `.restoring`).
pub fn restore(db: &Path, from: &Path) -> Result<Restored, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let refused = |why: String| StoreError::Refused(format!("{} cannot be restored: {why}", from.display()));
    let schema: i64 = {
        let copy = rusqlite::Connection::open_with_flags(from, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| refused(e.to_string()))?;
        let check: String = copy
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| refused(format!("not a SQLite database ({e})")))?;
        if check != "ok" {
            return Err(refused(format!("SQLite's integrity check says {check}")));
        }
        let schema: i64 = copy
            .query_row("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations", [], |r| r.get(0))
            .map_err(|e| refused(format!("not a Berth database (no record of its migrations: {e})")))?;
        if schema > schema_known() {
            return Err(refused(format!(
                "its schema (migration {schema}) is newer than this berth's ({}): restore it with the berth that made it",
                schema_known()
            )));
        }
        schema
    };
    let named = |suffix: &str| {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    // The new file first, whole and synced, under a name of its own.
    let incoming = named(".restoring");
    let _ = std::fs::remove_file(&incoming);
    {
        let mut out =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&incoming).map_err(
                |e| StoreError::Create { path: incoming.display().to_string(), why: e.to_string() },
            )?;
        let mut input = std::fs::File::open(from).map_err(|e| refused(e.to_string()))?;
        std::io::copy(&mut input, &mut out).map_err(|e| refused(e.to_string()))?;
        out.sync_all().map_err(|e| refused(e.to_string()))?;
    }
    // The database it replaces, with what its log holds folded in, kept aside.
    let replaced = if db.exists() {
        let current = rusqlite::Connection::open(db)?;
        current.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        drop(current);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // A second name, not a move: until the copy takes its place the database keeps its own
        // name, so a restore cut short leaves the service the database it had, never none.
        // Never over another kept database (a restore in the same second).
        let kept = keep(db, &named(&format!(".replaced-{now}")))
            .map_err(|e| refused(format!("cannot keep {}: {e}", db.display())))?;
        crate::failpoint::hit_sync("db.restore.kept");
        Some(kept)
    } else {
        None
    };
    // The log was folded in and is empty: the copy must not meet the old database's log.
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(named(suffix));
    }
    std::fs::rename(&incoming, db).map_err(|e| refused(e.to_string()))?;
    if let Some(dir) = db.parent().and_then(|d| std::fs::File::open(d).ok()) {
        let _ = dir.sync_all();
    }
    Ok(Restored { schema, replaced })
}

/// Gives `db` the second name `name`, or `name.1`, `name.2`, ... when taken by another file. A
/// second name `db` has already (`<db>.replaced-*`, left by a restore cut short) is answered
/// instead: the database is kept once, under the name it was first given.
fn keep(db: &Path, name: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata(db)?;
    let same =
        |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| (m.dev(), m.ino()) == (own.dev(), own.ino()));
    let dir = db.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let prefix = format!("{}.replaced-", db.file_name().unwrap_or_default().to_string_lossy());
    let mut earlier: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .filter(|p| same(p))
        .collect();
    earlier.sort();
    if let Some(kept) = earlier.into_iter().next() {
        return Ok(kept);
    }
    for n in 0..1000 {
        let candidate = match n {
            0 => name.to_path_buf(),
            n => PathBuf::from(format!("{}.{n}", name.display())),
        };
        match std::fs::hard_link(db, &candidate) {
            Ok(()) => return Ok(candidate),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EEXIST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sqlite_url_names_its_file_and_another_database_none() {
        assert_eq!(
            sqlite_file("sqlite:///var/lib/berth/berth.db"),
            Some(PathBuf::from("/var/lib/berth/berth.db"))
        );
        assert_eq!(sqlite_file("sqlite://berth.db"), Some(PathBuf::from("berth.db")));
        assert_eq!(sqlite_file("sqlite:berth.db?mode=rwc"), Some(PathBuf::from("berth.db")));
        assert_eq!(sqlite_file("postgres://u@127.0.0.1/berth"), None);
    }
}

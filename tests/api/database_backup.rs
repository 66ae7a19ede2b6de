//! `berth db backup FILE`: a consistent copy of the service's SQLite database, taken while the
//! service serves and writes it. The copy holds every change committed before it began and is
//! whole (SQLite's integrity check, every hash chain of the attach history verifies); `berth db
//! restore FILE` puts it back while the service is stopped (refused while it runs, and for a
//! file that is not a whole database), keeping the database it replaces, and the service serves
//! what the copy holds. Copies are private, as the database is (it holds the CHAP secrets); an
//! existing file is never overwritten.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use berth_tests::process::{BerthProcess, FAKE_BACKEND, berth_binary};
use berth_tests::server::{Client, connector};
use serde_json::json;

fn backup(db: &std::path::Path, to: &std::path::Path) -> (Option<i32>, String) {
    backup_with(db, to, &[])
}

fn backup_with(db: &std::path::Path, to: &std::path::Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(berth_binary())
        .envs(env.iter().copied())
        .args(["db", "backup", "--database-url", &format!("sqlite://{}", db.display())])
        .arg(to)
        .output()
        .expect("run berth db backup");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code(), said)
}

fn volumes_in(db: &std::path::Path) -> usize {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("SELECT COUNT(*) FROM volumes WHERE deleted = 0", [], |r| r.get::<_, i64>(0)).unwrap()
        as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_under_load_is_whole_and_a_service_restored_from_it_serves_what_it_holds() {
    let mut server = BerthProcess::start(FAKE_BACKEND);
    let c = Client::for_base(&server.base, "p1").at("3.54");
    let db = server.dir.path().join("data/berth.db");

    // Two clients make volumes and attach them while the backup is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for n in 0..2 {
        let (c, stop, made) = (c.clone(), stop.clone(), made.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let volume = c.create_volume(json!({"size": 1})).await;
                let host = format!("h{n}");
                let body = json!({"attachment": {"volume_uuid": volume, "connector": connector(&format!("iqn.1993-08.org.debian:01:{host}"), &host)}});
                c.post("/attachments", body).await.expect(200);
                made.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    while made.load(Ordering::Relaxed) < 10 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("berth-backup.db");
    let before = made.load(Ordering::Relaxed);
    let (code, said) = tokio::task::block_in_place(|| backup(&db, &copy));
    let after = made.load(Ordering::Relaxed);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.starts_with(&format!("berth: the database copied to {}", copy.display())), "{said}");
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }

    // Every volume acknowledged before the backup began is in it; none made after it ended.
    let held = volumes_in(&copy);
    assert!((before..=after + 2).contains(&held), "{before} made before, {after} after, {held} in the copy");
    assert!(volumes_in(&db) > held || after > before, "the load went on during the copy");
    let conn = rusqlite::Connection::open(&copy).unwrap();
    let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(check, "ok");
    drop(conn);
    let verified = Command::new(berth_binary())
        .args(["history", "verify", "--database-url", &format!("sqlite://{}", copy.display())])
        .output()
        .unwrap();
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stdout));
    assert_eq!(std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777, 0o600, "private");

    // An existing file is never overwritten; PostgreSQL is told to use pg_dump.
    let (code, said) = backup(&db, &copy);
    assert_ne!(code, Some(0));
    assert!(said.contains("File exists"), "{said}");
    assert_eq!(volumes_in(&copy), held, "the earlier backup is untouched");

    // `berth db restore` refuses while the service runs on the data directory, and a file that
    // is not a whole Berth database; then, the service stopped, it puts the copy in place and
    // keeps the database it replaced.
    let data_dir = server.dir.path().join("data");
    let restore = |from: &std::path::Path| {
        let out = Command::new(berth_binary())
            .args(["db", "restore", "--data-dir"])
            .arg(&data_dir)
            .arg(from)
            .output()
            .expect("run berth db restore");
        (
            out.status.code(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let (code, said) = tokio::task::block_in_place(|| restore(&copy));
    assert_ne!(code, Some(0));
    assert!(said.contains("berth serve is running on the data directory"), "{said}");
    c.create_volume(json!({"size": 1})).await;
    let live = volumes_in(&db);
    // Killed, so that its last commits are still in the write-ahead log.
    server.kill9();
    let wal = format!("{}-wal", db.display());
    assert!(std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0), "a log to fold in");
    // (Not opened from here on: closing the last connection would fold the log in itself.)
    let untouched = || (std::fs::read(&db).unwrap(), std::fs::read(&wal).unwrap());
    let before_restore = untouched();
    let torn = dir.path().join("torn.db");
    let bytes = std::fs::read(&copy).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() / 2]).unwrap();
    let (code, said) = restore(&torn);
    assert_ne!(code, Some(0), "{said}");
    assert!(said.contains("cannot be restored"), "{said}");
    assert!(untouched() == before_restore, "a refused restore changes nothing");
    let (code, said) = restore(&copy);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("restored to") && said.contains("kept as"), "{said}");
    let kept = std::fs::read_dir(&data_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("berth.db.replaced-"))
        .expect("the replaced database is kept");
    assert_eq!(volumes_in(&kept), live, "with every change it held, its log folded in");
    assert_eq!(std::fs::metadata(&db).unwrap().permissions().mode() & 0o777, 0o600, "private");
    server.start_again();
    let listed =
        c.get("/volumes/detail?limit=1000").await.expect(200).body["volumes"].as_array().unwrap().len();
    assert_eq!(listed, held, "the restored service lists what the backup holds");
    let volume = c.create_volume(json!({"size": 1})).await;
    assert_eq!(c.volume_status(&volume).await, "available", "and serves");
}

/// A backup cut short (killed once SQLite wrote the copy, before it was synced and named) leaves
/// no file under the backup's name, only one whose name says it is partial; the next backup to
/// that name is made whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_cut_short_never_has_the_backups_name() {
    let server = BerthProcess::start(FAKE_BACKEND);
    let c = Client::for_base(&server.base, "p1").at("3.54");
    c.create_volume(json!({"size": 1})).await;
    let db = server.dir.path().join("data/berth.db");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("berth-backup.db");

    let (code, said) = tokio::task::block_in_place(|| {
        backup_with(&db, &copy, &[("BERTH_FAILPOINTS", "db.backup.written=kill")])
    });
    assert_eq!(code, None, "killed: {said}");
    assert!(!copy.exists(), "a copy cut short has the backup's name");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.len() == 1 && left[0].starts_with("berth-backup.db.partial-"),
        "what is left says it is partial: {left:?}"
    );

    let (code, said) = tokio::task::block_in_place(|| backup(&db, &copy));
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(volumes_in(&copy), 1);
    assert_eq!(std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777, 0o600, "private");
}

/// A restore cut short (killed once the database it replaces has its second name, before the
/// copy takes its place) leaves the service the database it had, never none: started again, it
/// serves every volume it knew; the restore tried again puts the copy in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cut_short_leaves_the_database_it_would_have_replaced() {
    let mut server = BerthProcess::start(FAKE_BACKEND);
    let c = Client::for_base(&server.base, "p1").at("3.54");
    c.create_volume(json!({"size": 1})).await;
    let db = server.dir.path().join("data/berth.db");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("berth-backup.db");
    let (code, said) = tokio::task::block_in_place(|| backup(&db, &copy));
    assert_eq!(code, Some(0), "{said}");
    for _ in 0..3 {
        c.create_volume(json!({"size": 1})).await;
    }
    server.stop();
    let data_dir = server.dir.path().join("data");
    let restore = |env: &[(&str, &str)]| {
        Command::new(berth_binary())
            .envs(env.iter().copied())
            .args(["db", "restore", "--data-dir"])
            .arg(&data_dir)
            .arg(&copy)
            .output()
            .expect("run berth db restore")
    };
    let out = restore(&[("BERTH_FAILPOINTS", "db.restore.kept=kill")]);
    assert_eq!(out.status.code(), None, "killed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(volumes_in(&db), 4, "the database keeps its name and everything it held");

    server.start_again();
    let listed = c.get("/volumes").await.expect(200).body["volumes"].as_array().unwrap().len();
    assert_eq!(listed, 4, "the service serves the database it had");
    server.stop();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let out = restore(&[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    server.start_again();
    let listed = c.get("/volumes").await.expect(200).body["volumes"].as_array().unwrap().len();
    assert_eq!(listed, 1, "the copy is in place");
    // The database replaced is kept once, under the name the restore cut short gave it.
    let kept: Vec<_> = std::fs::read_dir(&data_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("berth.db.replaced-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(volumes_in(&kept[0]), 4);
}

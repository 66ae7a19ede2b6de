//! A real PostgreSQL server for tests. `.ci/test` starts one and names it in
//! `BERTH_TEST_POSTGRES` (a URL to an administrative database); without it, the first test that
//! needs PostgreSQL starts a private cluster on loopback for this test process. Either way every
//! test gets a fresh database of its own.
//!
//! The private cluster stops by itself: it runs under a shell that waits on a pipe held by this
//! process, and kills the server when the pipe closes (when the test process exits, however it
//! exits).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The administrative URL of the server.
pub fn server() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| match std::env::var("BERTH_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => url,
        _ => start_private_cluster(false),
    })
}

/// A private cluster with full durability (`fsync=on`), for benchmarks: the test cluster runs
/// with `fsync=off`.
pub fn durable_server() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| start_private_cluster(true))
}

/// A fresh, empty database on the server; returns its URL.
pub async fn fresh_database() -> String {
    fresh_database_on(server()).await
}

/// A fresh, empty database on the server at `admin`; returns its URL.
pub async fn fresh_database_on(admin: &str) -> String {
    use sqlx::Connection;
    let name = format!("berth_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {admin}: {e}"));
    sqlx::Executor::execute(&mut conn, format!("CREATE DATABASE {name}").as_str())
        .await
        .expect("CREATE DATABASE");
    conn.close().await.ok();
    match admin.rfind('/') {
        Some(slash) if admin[..slash].contains("://") && !admin[..slash].ends_with('/') => {
            let (base, rest) = admin.split_at(slash);
            let query = rest.find('?').map(|q| &rest[q..]).unwrap_or("");
            format!("{base}/{name}{query}")
        }
        _ => format!("{}/{name}", admin.trim_end_matches('/')),
    }
}

static GUARDS: Mutex<Vec<(Child, tempfile::TempDir)>> = Mutex::new(Vec::new());

fn bin_dir() -> PathBuf {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return dir;
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    versions.sort();
    versions.pop().expect("PostgreSQL is not installed (Debian package postgresql); run .ci/setup")
}

fn start_private_cluster(fsync: bool) -> String {
    let bin = bin_dir();
    let dir = tempfile::Builder::new().prefix("berth-pg").tempdir().expect("tempdir");
    let data = dir.path().join("data");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        // PostgreSQL refuses to run as root: run it as the postgres user.
        let status =
            Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status().expect("chown");
        assert!(status.success(), "cannot hand the cluster directory to the postgres user");
    }
    let port = free_port();
    let as_owner = |program: &Path| -> Command {
        if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    };
    let out = as_owner(&bin.join("initdb"))
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
        .arg(&data)
        .output()
        .expect("initdb");
    assert!(out.status.success(), "initdb failed: {}", String::from_utf8_lossy(&out.stderr));
    let postgres = format!(
        "{} -D {} -p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync={} -c max_connections=300",
        bin.join("postgres").display(),
        data.display(),
        dir.path().display(),
        if fsync { "on" } else { "off" }
    );
    // The shell keeps the server only as long as our end of its stdin is open, then removes its
    // files (the guard below is a static, never dropped: without this every test binary left a
    // cluster of up to a gigabyte and more in the temporary directory).
    let script = format!(
        "{postgres} & pid=$!; cat >/dev/null; kill -INT $pid; wait $pid; rm -rf '{}'",
        dir.path().display()
    );
    let mut shell = if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", "sh", "-c", &script]);
        c
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", &script]);
        c
    };
    let child =
        shell.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("postgres");
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "PostgreSQL did not start on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    GUARDS.lock().unwrap().push((child, dir));
    url
}

/// Stops the private clusters now (they also stop when the process exits).
pub fn stop_private_clusters() {
    for (mut child, _dir) in GUARDS.lock().unwrap().drain(..) {
        drop(child.stdin.take().map(|mut s| s.flush()));
        let _ = child.wait();
    }
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

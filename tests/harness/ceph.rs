//! A real Ceph cluster for tests: one monitor, one manager with the dashboard's REST API, one OSD
//! (`tests/ceph/cluster.sh`), started by the first test that needs it and shared by the tests of
//! that process (a cold start takes 12 to 20 s). It stops by itself: a shell that waits on a pipe
//! held by this process purges the cluster when the pipe closes, however the process exits.
//!
//! The tests reach the data path as a compute host would: `/usr/bin/python3` with python3-rbd,
//! as the identity the connection info names, with that identity's keyring provisioned on the
//! "host" (the cluster's directory), as Cinder's deployments provision `client.cinder`'s.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use serde_json::Value as Json;

/// The running cluster.
#[derive(Debug, Clone)]
pub struct Ceph {
    pub dir: PathBuf,
    pub conf: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub dashboard: String,
    pub dashboard_user: String,
    /// Mode 0600, as Berth wants a secret file.
    pub password_file: PathBuf,
    /// `127.0.0.1:<port>` (the monitor's v1 address, what Cinder's driver reports).
    pub monitors: String,
    pub pool: String,
}

static GUARD: Mutex<Option<Child>> = Mutex::new(None);

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ceph/cluster.sh")
}

/// A base port whose neighbours (`cluster.sh`'s layout: base..base+2, base+10..base+49) are free.
fn free_base() -> u16 {
    let start = 20_000 + (std::process::id() % 200) as u16 * 50;
    (0..40)
        .map(|i| 20_000 + (start - 20_000 + i * 50) % 10_000)
        .find(|&base| {
            (0..50u16)
                .filter(|o| *o < 3 || *o >= 10)
                .all(|o| std::net::TcpListener::bind(("127.0.0.1", base + o)).is_ok())
        })
        .expect("no free block of 50 ports for Ceph")
}

/// The cluster of this test process (started now if it is not).
pub fn cluster() -> &'static Ceph {
    static CEPH: OnceLock<Ceph> = OnceLock::new();
    CEPH.get_or_init(start)
}

fn start() -> Ceph {
    let dir = std::env::temp_dir().join(format!("berth-ceph-{}", std::process::id()));
    let base = free_base();
    let out = Command::new("bash")
        .arg(script())
        .args(["start"])
        .arg(&dir)
        .args(["--ports", &base.to_string()])
        .output()
        .expect("bash tests/ceph/cluster.sh");
    // The purge is armed even when the start failed half-way.
    let purge =
        format!("cat >/dev/null; bash '{}' purge '{}' >/dev/null 2>&1", script().display(), dir.display());
    let guard = Command::new("sh")
        .args(["-c", &purge])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("sh");
    *GUARD.lock().unwrap() = Some(guard);
    assert!(
        out.status.success(),
        "Ceph did not start (Debian 12's ceph-mon ceph-osd ceph-mgr ceph-mgr-dashboard ceph-common \
         python3-rbd; .ci/setup installs them):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("cluster.sh printed no {key}"))
            .to_string()
    };
    Ceph {
        dir: dir.clone(),
        conf: get("CEPH_CONF").into(),
        dashboard: get("CEPH_DASHBOARD"),
        dashboard_user: get("CEPH_DASHBOARD_USER"),
        password_file: get("CEPH_DASHBOARD_PASSWORD_FILE").into(),
        monitors: get("CEPH_MONITORS"),
        pool: get("CEPH_POOL"),
    }
}

/// Stops the cluster now (it also stops when the process exits).
pub fn stop() {
    if let Some(mut child) = GUARD.lock().unwrap().take() {
        drop(child.stdin.take().map(|mut s| s.flush()));
        let _ = child.wait();
    }
}

impl Ceph {
    /// The `[backends.network]` table (allow-list, the dashboard's password and the session the
    /// host keeps) of a `ceph-rbd` backend on this cluster, under `prefix` (`backends.` in a
    /// service's configuration, nothing in the conformance suite's).
    pub fn network_toml(&self, prefix: &str) -> String {
        let d = &self.dashboard;
        format!(
            r#"[{prefix}network]
allowed_hosts = ["{d}"]

[{prefix}network.secrets.dashboard-password]
file = "{password}"
hosts = ["{d}"]

[{prefix}network.sessions.dashboard]
login_url = "{d}/api/auth"
login_body = '{{"username": "{user}", "password": "{{{{secret:dashboard-password}}}}"}}'
login_headers = {{ Accept = "application/vnd.ceph.api.v1.0+json", Content-Type = "application/json" }}
token_field = "/token"
header = "Authorization"
value = "Bearer {{{{session}}}}"
hosts = ["{d}"]
"#,
            password = self.password_file.display(),
            user = self.dashboard_user,
        )
    }

    /// The `[backends.cephx]` table: the host makes per-host identities as `client.berth-host`.
    pub fn cephx_toml(&self, prefix: &str) -> String {
        format!("[{prefix}cephx]\nconf = \"{}\"\nname = \"client.berth-host\"\n", self.conf.display())
    }

    /// The settings of a `ceph-rbd` backend on this cluster.
    pub fn settings_toml(&self) -> String {
        format!(
            r#"settings = {{ dashboard = "{}", pool = "{}", rbd_user = "cinder", secret_uuid = "457eb676-33da-42ec-9a8c-9293d545c337" }}"#,
            self.dashboard, self.pool
        )
    }

    /// A `[[backends]]` entry named `name` (with its volume type of the same name).
    pub fn backend_toml(&self, name: &str, shared: bool) -> String {
        format!(
            "[[backends]]\nname = \"{name}\"\ndriver = \"ceph-rbd\"\ngrants = [\"network\", \"cephx\"]\nshared = {shared}\n{}\n\n{}\n{}\n\
             [[volume_types]]\nname = \"{name}\"\nbackend = \"{name}\"\n",
            self.settings_toml(),
            self.network_toml("backends."),
            self.cephx_toml("backends."),
        )
    }

    /// The conformance suite's `--config` for `ceph-rbd` on this cluster.
    pub fn conformance_toml(&self) -> String {
        format!(
            "grants = [\"network\", \"cephx\"]\n{}\n\n{}\n{}",
            self.settings_toml(),
            self.network_toml(""),
            self.cephx_toml("")
        )
    }

    /// The same cluster seen through a pool of its own (created now, with `rbd pool init`, if it
    /// is not there): for a test that counts what is in its pool while other tests of the
    /// process create and delete images in theirs.
    pub fn in_pool(&self, pool: &str) -> Ceph {
        let run = |mut c: Command| {
            let out = c.output().expect("ceph");
            assert!(out.status.success(), "{c:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let mut create = self.admin("ceph");
        create.args(["osd", "pool", "create", pool, "8", "8", "replicated"]);
        run(create);
        let mut init = self.admin("rbd");
        init.args(["pool", "init", pool]);
        run(init);
        Ceph { pool: pool.to_string(), ..self.clone() }
    }

    fn admin(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.arg("-c").arg(&self.conf).args(["-n", "client.admin"]);
        c
    }

    /// The images of the pool.
    pub fn images(&self) -> Vec<String> {
        let out = self.admin("rbd").args(["ls", "--format", "json", &self.pool]).output().expect("rbd ls");
        assert!(out.status.success(), "rbd ls: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("rbd ls --format json")
    }

    /// An image's size in bytes, if it exists.
    pub fn image_size(&self, image: &str) -> Option<u64> {
        let out = self
            .admin("rbd")
            .args(["info", "--format", "json", &format!("{}/{image}", self.pool)])
            .output()
            .expect("rbd info");
        if !out.status.success() {
            return None;
        }
        let info: Json = serde_json::from_slice(&out.stdout).expect("rbd info --format json");
        info["size"].as_u64()
    }

    /// Writes `data` at `offset` into the image the connection info names and reads it back, as
    /// the identity it names, reaching the monitors it names: what librbd on a compute host
    /// does. Returns what was read, or the client's error.
    pub fn write_and_read(&self, info: &Json, offset: u64, data: &[u8]) -> Result<Vec<u8>, String> {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), data).unwrap();
        let out = self.client(info, &format!("write_read {offset} {}", file.path().display()))?;
        Ok(out)
    }

    /// Runs the small librbd client in `client.py` against the connection info.
    fn client(&self, info: &Json, action: &str) -> Result<Vec<u8>, String> {
        let data = &info["data"];
        let hosts: Vec<&str> =
            data["hosts"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
        let ports: Vec<String> = data["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().map(str::to_string).unwrap_or(p.to_string()))
            .collect();
        let mon_host: Vec<String> = hosts.iter().zip(&ports).map(|(h, p)| format!("v1:{h}:{p}")).collect();
        let user = data["auth_username"].as_str().unwrap_or("admin");
        // The identity's key as the connection info carries it (os-brick writes it to a file), or
        // the shared identity's keyring of the cluster's directory.
        let given = tempfile::NamedTempFile::new().unwrap();
        let keyring = match data["keyring"].as_str() {
            Some(text) => {
                std::fs::write(given.path(), text).unwrap();
                given.path().to_path_buf()
            }
            None => self.dir.join(format!("ceph.client.{user}.keyring")),
        };
        let out = Command::new("/usr/bin/python3")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ceph/client.py"))
            .args([&mon_host.join(","), user])
            .arg(&keyring)
            .arg(data["name"].as_str().unwrap())
            .args(action.split(' '))
            .output()
            .expect("/usr/bin/python3 (python3-rbd)");
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The cephx identities Berth's `cephx` capability made (`client.berth.*`).
    pub fn identities(&self) -> Vec<String> {
        let out = self.admin("ceph").args(["auth", "ls", "-f", "json"]).output().expect("ceph auth ls");
        assert!(out.status.success(), "ceph auth ls: {}", String::from_utf8_lossy(&out.stderr));
        let dump: Json = serde_json::from_slice(&out.stdout).expect("ceph auth ls -f json");
        dump["auth_dump"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["entity"].as_str())
            .filter(|e| e.starts_with("client.berth."))
            .map(str::to_string)
            .collect()
    }

    /// The monitor's audit lines (which client asked for which command on `entity`, and when it
    /// was dispatched and finished), from its log.
    pub fn audit_of(&self, entity: &str) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.join("log/mon.a.log")).unwrap_or_default();
        let named = format!("\"{entity}\"");
        log.lines()
            .filter(|l| l.contains("log_channel(audit)") && l.contains(&named))
            .map(str::to_string)
            .collect()
    }

    /// Runs `ceph auth ARGS...` as the cluster's admin (an operator's hand, or a crash's leftover).
    pub fn auth(&self, args: &[&str]) {
        let out = self.admin("ceph").arg("auth").args(args).output().expect("ceph auth");
        assert!(out.status.success(), "ceph auth {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Runs `rbd ARGS...` as the cluster's admin, in the pool's name where the arguments say.
    pub fn rbd(&self, args: &[&str]) {
        let out = self.admin("rbd").args(args).output().expect("rbd");
        assert!(out.status.success(), "rbd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The first 16 hex digits of the SHA-256 of a compute host's name, as identities carry it.
    pub fn host_digest(&self, host: &str) -> String {
        use sha2::Digest;
        hex::encode(&sha2::Sha256::digest(host.as_bytes())[..8])
    }

    /// The directory of the cluster, for its logs.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

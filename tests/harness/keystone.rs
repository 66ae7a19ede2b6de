//! A real Keystone from PyPI (installed by `.ci/setup` in `target/keystone-venv`), started once
//! per test process on loopback with a SQLite database (`keystone-manage db_sync`, fernet keys,
//! `bootstrap`), populated with the tests' projects, users and roles
//! (`tests/python/keystone_server.py`). It stops with the test process: it exits when its stdin, held
//! by this process, closes.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::pg::free_port;

const ADMIN_PASSWORD: &str = "keystone-admin-pw";

/// The virtualenv Keystone runs from: `BERTH_TEST_KEYSTONE_VENV`, else `target/keystone-venv`.
pub fn venv() -> PathBuf {
    std::env::var_os("BERTH_TEST_KEYSTONE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(berth::shipped::BUILD_DIR).join("../keystone-venv"))
}

pub struct Keystone {
    /// `http://127.0.0.1:PORT` (the v3 API is under `/v3`).
    pub url: String,
    /// Project ids by name (`service`, `demo`, `other`).
    pub projects: Json,
    /// User ids by name (`berth`, `nova`, `alice`, `rita`, `mallory`, `root`).
    pub users: Json,
    passwords: Json,
    http: reqwest::Client,
}

static GUARD: Mutex<Option<(Child, tempfile::TempDir)>> = Mutex::new(None);

/// The test process's Keystone, started on first use.
pub fn keystone() -> &'static Keystone {
    static KEYSTONE: OnceLock<Keystone> = OnceLock::new();
    KEYSTONE.get_or_init(start)
}

fn script() -> Command {
    let python = venv().join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run .ci/setup (it installs Keystone from PyPI into target/keystone-venv)",
        python.display()
    );
    let mut c = Command::new(python);
    c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/python/keystone_server.py")).env("PYTHONWARNINGS", "ignore");
    c
}

fn run(mut c: Command) -> String {
    let out = c.output().expect("run keystone_server.py");
    assert!(
        out.status.success(),
        "{c:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn start() -> Keystone {
    let dir = tempfile::Builder::new().prefix("berth-keystone").tempdir().expect("tempdir");
    let port = free_port();
    let d = dir.path().to_str().expect("utf-8 path").to_string();
    let mut init = script();
    init.args(["init", &d, ADMIN_PASSWORD, &port.to_string()]);
    run(init);
    let mut serve = script();
    serve.args(["serve", &d, &port.to_string()]);
    let mut child = serve
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("serve.err")).expect("serve.err"))
        .spawn()
        .expect("start Keystone");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).ok();
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "Keystone did not listen on {port}: {}",
            std::fs::read_to_string(dir.path().join("serve.err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut populate = script();
    populate.args(["populate", &url, ADMIN_PASSWORD]);
    let ids: Json = serde_json::from_str(run(populate).trim()).expect("populate prints JSON");
    *GUARD.lock().unwrap() = Some((child, dir));
    Keystone {
        url,
        projects: ids["projects"].clone(),
        users: ids["users"].clone(),
        passwords: ids["passwords"].clone(),
        http: reqwest::Client::new(),
    }
}

impl Keystone {
    /// The `[auth]` and `[keystone]` tables that make a Berth validate tokens here, as the
    /// `berth` service user; `extra` goes into `[keystone]`.
    pub fn berth_config(&self, extra: &str) -> String {
        format!(
            "[auth]\nstrategy = \"keystone\"\n[keystone]\nauth_url = \"{}/v3\"\nusername = \"berth\"\n\
             password = \"{}\"\n{extra}\n",
            self.url,
            self.password("berth")
        )
    }

    pub fn password(&self, user: &str) -> &str {
        self.passwords[user].as_str().expect("a test user")
    }

    pub fn project(&self, name: &str) -> &str {
        self.projects[name].as_str().expect("a test project")
    }

    /// Registers a Berth at `volume_url` (`http://127.0.0.1:PORT`) in a catalog region of its own
    /// (so that tests sharing this Keystone do not see each other's endpoints); returns the region.
    pub fn register(&self, volume_url: &str) -> String {
        let region = format!("berth-{}", uuid::Uuid::new_v4().simple());
        let mut c = script();
        c.args(["register", &self.url, ADMIN_PASSWORD, &region, volume_url]);
        run(c);
        region
    }

    /// Registers a compute service (Nova) at `compute_url` in `region`'s catalog (the region is
    /// made when it is new).
    pub fn register_compute(&self, region: &str, compute_url: &str) {
        let mut c = script();
        c.args(["register-compute", &self.url, ADMIN_PASSWORD, region, compute_url]);
        run(c);
    }

    /// Who a token speaks for, as a service validating it sees it (Keystone's token body).
    pub async fn validate(&self, token: &str) -> Option<Json> {
        let service = self.token("nova", "service").await;
        let r = self
            .http
            .get(format!("{}/v3/auth/tokens", self.url))
            .header("X-Auth-Token", &service)
            .header("X-Subject-Token", token)
            .send()
            .await
            .unwrap();
        if !r.status().is_success() {
            return None;
        }
        Some(r.json::<Json>().await.unwrap()["token"].clone())
    }

    /// A token for `user` (its password) scoped to its project.
    pub async fn token(&self, user: &str, project: &str) -> String {
        let body = json!({ "auth": {
            "identity": { "methods": ["password"], "password": { "user": {
                "name": user, "domain": { "id": "default" }, "password": self.password(user) } } },
            "scope": { "project": { "name": project, "domain": { "id": "default" } } },
        }});
        let r = self.http.post(format!("{}/v3/auth/tokens", self.url)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 201, "token for {user}: {}", r.text().await.unwrap_or_default());
        r.headers()["x-subject-token"].to_str().unwrap().to_string()
    }

    /// Revokes a token (`DELETE /v3/auth/tokens`, as its own holder).
    pub async fn revoke(&self, token: &str) {
        let r = self
            .http
            .delete(format!("{}/v3/auth/tokens", self.url))
            .header("X-Auth-Token", token)
            .header("X-Subject-Token", token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "revoke: {}", r.text().await.unwrap_or_default());
    }

    /// The environment of an OpenStack client authenticating as `user` with its password, in
    /// `region`'s catalog.
    pub fn client_env(&self, user: &str, project: &str, region: &str) -> Vec<(&'static str, String)> {
        vec![
            ("OS_AUTH_URL", format!("{}/v3", self.url)),
            ("OS_USERNAME", user.to_string()),
            ("OS_PASSWORD", self.password(user).to_string()),
            ("OS_PROJECT_NAME", project.to_string()),
            ("OS_USER_DOMAIN_NAME", "Default".into()),
            ("OS_PROJECT_DOMAIN_NAME", "Default".into()),
            ("OS_REGION_NAME", region.to_string()),
            ("OS_INTERFACE", "public".into()),
            ("OS_IDENTITY_API_VERSION", "3".into()),
        ]
    }
}

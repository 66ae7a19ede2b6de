//! A real Berth service for API tests: assembled in-process from a configuration, on a real
//! database, listening on a loopback port, with an HTTP client that speaks to it like
//! cinderclient does.

use std::sync::Arc;

use berth::attach::Service;
use berth::config::{BackendConfig, Config, VolumeTypeConfig};
use reqwest::Method;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

pub struct TestServer {
    pub base: String,
    pub db: Db,
    pub service: Arc<Service>,
    pub config: Config,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
        self.heartbeat.abort();
    }
}

/// The configuration of an API test: the fake driver behind `__DEFAULT__` and `multiattach`.
pub fn fake_config() -> Config {
    Config {
        backends: vec![BackendConfig {
            name: "fake".into(),
            driver: Some("fake".into()),
            wasm: None,
            grants: Default::default(),
            settings: Default::default(),
            limits: Default::default(),
            shared: false,
            network: None,
            cephx: None,
            online_extend: None,
            max_over_subscription_ratio: None,
            reserved_percentage: None,
        }],
        volume_types: vec![
            VolumeTypeConfig {
                name: "__DEFAULT__".into(),
                backend: "fake".into(),
                description: None,
                extra_specs: Default::default(),
                qos_specs: None,
            },
            VolumeTypeConfig {
                name: "multiattach".into(),
                backend: "fake".into(),
                description: None,
                extra_specs: [("multiattach".to_string(), "<is> True".to_string())].into(),
                qos_specs: None,
            },
        ],
        ..Config::default()
    }
}

/// [`fake_config`] with a second backend of the fake driver, `name`, and a volume type of the same
/// name on it.
pub fn fake_config_with_backend(name: &str) -> Config {
    let mut config = fake_config();
    let mut second = config.backends[0].clone();
    second.name = name.into();
    config.backends.push(second);
    config.volume_types.push(VolumeTypeConfig {
        name: name.into(),
        backend: name.into(),
        description: None,
        extra_specs: Default::default(),
        qos_specs: None,
    });
    config
}

impl TestServer {
    pub async fn start(db: Db) -> TestServer {
        Self::start_with(db, fake_config()).await
    }

    pub async fn start_with(db: Db, config: Config) -> TestServer {
        let url = match db {
            Db::Sqlite => None,
            Db::Postgres => Some(crate::pg::fresh_database().await),
        };
        Self::start_on(db, url, config).await
    }

    /// Starts on a given database URL (PostgreSQL) or a new SQLite file (`None`).
    pub async fn start_on(db: Db, url: Option<String>, mut config: Config) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        config.data_dir = Some(dir.path().join("data"));
        config.runtime.cache_dir = Some(crate::drivers::shared_cache());
        config.database_url =
            Some(url.unwrap_or_else(|| format!("sqlite://{}", dir.path().join("berth.db").display())));
        let assembled = berth::serve::assemble(config).await.expect("assemble the service");
        let service = assembled.state.service.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let holder = berth::serve::holder(&assembled.config.data_dir());
        service.register_node(Some(&base), &holder).await.expect("register the node");
        let heartbeat = tokio::spawn(service.clone().keep_alive());
        let app = berth::api::app(assembled.state);
        // The server `berth serve` runs (header-read timeout, load shedding), until the test ends.
        let limits = berth::api::server::ServerLimits {
            header_read_timeout: std::time::Duration::from_secs_f64(
                assembled.config.http.header_read_timeout_seconds,
            ),
            shutdown_wait: std::time::Duration::ZERO,
        };
        let task = tokio::spawn(async move {
            berth::api::server::serve(listener, app, limits, None, std::future::pending()).await.unwrap();
        });
        TestServer { base, db, service, config: assembled.config, _dir: dir, task, heartbeat }
    }

    /// A client authenticated as `user:project` (noauth), admin unless roles are given.
    pub fn client(&self, project: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: self.base.clone(),
            token: Some(format!("user-{project}:{project}")),
            project: project.to_string(),
            version: None,
            roles: None,
            service_roles: None,
            project_in_url: true,
            extra: Vec::new(),
        }
    }
}

/// An HTTP client for the API.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    pub base: String,
    pub token: Option<String>,
    /// The project named in URLs.
    pub project: String,
    pub version: Option<String>,
    pub roles: Option<String>,
    /// `X-Service-Roles`: the roles of a service token sent along (noauth).
    pub service_roles: Option<String>,
    /// Use `/v3/{project}/...` (true) or `/v3/...` (false).
    pub project_in_url: bool,
    /// More request headers (e.g. a Keystone `X-Service-Token`).
    pub extra: Vec<(&'static str, String)>,
}

/// A response: status, headers and the JSON body (`Null` when empty).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts the status; prints the body when it differs.
    #[track_caller]
    pub fn expect(self, status: u16) -> Resp {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.body);
        self
    }

    /// Asserts a Cinder fault: `{"<fault>": {"code": status, "message": ...}}`; returns the message.
    #[track_caller]
    pub fn fault(&self, status: u16, fault: &str) -> String {
        assert_eq!(self.status, status, "unexpected status; body: {}", self.body);
        let f = &self.body[fault];
        assert_eq!(f["code"], json!(status), "expected a {fault} fault, got {}", self.body);
        f["message"].as_str().expect("a fault message").to_string()
    }
}

impl Client {
    /// A noauth client for a service at `base` (`http://host:port`), as admin of `project`.
    pub fn for_base(base: &str, project: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: base.to_string(),
            token: Some(format!("user-{project}:{project}")),
            project: project.to_string(),
            version: None,
            roles: None,
            service_roles: None,
            project_in_url: true,
            extra: Vec::new(),
        }
    }

    /// The same client at a microversion (`3.44`, `latest`).
    pub fn at(&self, version: &str) -> Client {
        Client { version: Some(version.to_string()), ..self.clone() }
    }

    /// The same client with `X-Roles` (non-admin when `admin` is absent).
    pub fn with_roles(&self, roles: &str) -> Client {
        Client { roles: Some(roles.to_string()), ..self.clone() }
    }

    /// The same client sending a service token's roles (`X-Service-Roles: service`), as Nova does.
    pub fn with_service_token(&self) -> Client {
        Client { service_roles: Some("service".into()), ..self.clone() }
    }

    /// The same client on its own connection pool (as a separate client process would be).
    pub fn fresh_connection(&self) -> Client {
        Client { http: reqwest::Client::new(), ..self.clone() }
    }

    /// The same client with another `X-Auth-Token`.
    pub fn with_token(&self, token: &str) -> Client {
        Client { token: Some(token.to_string()), ..self.clone() }
    }

    /// The same client sending one more header.
    pub fn with_header(&self, name: &'static str, value: &str) -> Client {
        let mut c = self.clone();
        c.extra.push((name, value.to_string()));
        c
    }

    pub fn without_project_in_url(&self) -> Client {
        Client { project_in_url: false, ..self.clone() }
    }

    /// The URL of an API path like `/volumes`.
    pub fn url(&self, path: &str) -> String {
        if self.project_in_url {
            format!("{}/v3/{}{path}", self.base, self.project)
        } else {
            format!("{}/v3{path}", self.base)
        }
    }

    /// The service's own revocations of `volume` with `outcome` in the history (`user_id`
    /// "berth"), once there is one (or none after 30 s). The reconciler writes its event in the transaction that ends its
    /// operation, just after the backend changed: a test that saw the change may read the history
    /// a moment before the event is there.
    pub async fn service_revocations(&self, volume: &str, outcome: &str) -> Vec<Value> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let history = self
                .get(&format!("/os-attachment-events?volume_id={volume}&access=revoked"))
                .await
                .expect(200);
            let events: Vec<Value> = history.body["attachment_events"]
                .as_array()
                .expect("a list of events")
                .iter()
                .filter(|e| e["user_id"] == "berth" && e["outcome"] == outcome)
                .cloned()
                .collect();
            if !events.is_empty() || std::time::Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send(Method::GET, &self.url(path), None).await
    }
    pub async fn post(&self, path: &str, body: Value) -> Resp {
        self.send(Method::POST, &self.url(path), Some(body)).await
    }
    pub async fn put(&self, path: &str, body: Value) -> Resp {
        self.send(Method::PUT, &self.url(path), Some(body)).await
    }
    pub async fn delete(&self, path: &str) -> Resp {
        self.send(Method::DELETE, &self.url(path), None).await
    }

    pub async fn send(&self, method: Method, url: &str, body: Option<Value>) -> Resp {
        let mut req = self.http.request(method, url);
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body.to_string());
        }
        self.finish(req).await
    }

    /// A request with a raw body and content type.
    pub async fn raw(&self, method: Method, path: &str, content_type: Option<&str>, body: Vec<u8>) -> Resp {
        let mut req = self.http.request(method, self.url(path)).body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        self.finish(req).await
    }

    /// A request that may get no answer (the server died, or the client gave up after
    /// `timeout`): the transport error instead of a panic.
    pub async fn try_send(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        timeout: Option<std::time::Duration>,
    ) -> Result<Resp, String> {
        let mut req = self.http.request(method, self.url(path));
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body.to_string());
        }
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        req = self.headers(req);
        let resp = req.send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| e.to_string())?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Ok(Resp { status, headers, body })
    }

    fn headers(&self, mut req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(t) = &self.token {
            req = req.header("x-auth-token", t);
        }
        if let Some(v) = &self.version {
            req = req.header("openstack-api-version", format!("volume {v}"));
        }
        if let Some(r) = &self.roles {
            req = req.header("x-roles", r);
        }
        if let Some(r) = &self.service_roles {
            req = req.header("x-service-roles", r);
        }
        for (name, value) in &self.extra {
            req = req.header(*name, value);
        }
        req
    }

    async fn finish(&self, req: reqwest::RequestBuilder) -> Resp {
        let req = self.headers(req);
        let resp = req.send().await.expect("the server answers");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Resp { status, headers, body }
    }

    // Shortcuts for the common steps of a test.

    /// Creates a volume and returns its id.
    pub async fn create_volume(&self, body: Value) -> String {
        let r = self.post("/volumes", json!({ "volume": body })).await.expect(202);
        r.body["volume"]["id"].as_str().unwrap().to_string()
    }

    /// Creates an attachment (at 3.54 unless the client has a version) and returns the response.
    pub async fn attach(&self, volume: &str, connector: Option<Value>) -> Resp {
        let mut attachment = json!({ "volume_uuid": volume });
        if let Some(c) = connector {
            attachment["connector"] = c;
        }
        let client = if self.version.is_some() { self.clone() } else { self.at("3.54") };
        client.post("/attachments", json!({ "attachment": attachment })).await
    }

    pub async fn volume_status(&self, volume: &str) -> String {
        self.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"]["status"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

/// An os-brick-like connector for an initiator.
pub fn connector(initiator: &str, host: &str) -> Value {
    json!({
        "initiator": initiator, "host": host, "ip": "127.0.0.1", "platform": "x86_64", "os_type": "linux",
        "multipath": false, "do_local_attach": false
    })
}

/// Runs each test once on SQLite and once on PostgreSQL.
#[macro_export]
macro_rules! both_databases {
    ($($(#[$meta:meta])* async fn $name:ident($server:ident) $body:block)*) => {
        mod sqlite {
            #[allow(unused_imports)]
            use super::*;
            $(
                $(#[$meta])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let $server = &$crate::server::TestServer::start($crate::server::Db::Sqlite).await;
                    $body
                }
            )*
        }
        mod postgres {
            #[allow(unused_imports)]
            use super::*;
            $(
                $(#[$meta])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let $server = &$crate::server::TestServer::start($crate::server::Db::Postgres).await;
                    $body
                }
            )*
        }
    };
}

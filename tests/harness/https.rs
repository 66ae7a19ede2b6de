//! A storage array's management API as the tests need one: a real HTTPS server (or plain HTTP)
//! on loopback, with a certificate from a CA made by the test (`rcgen`), that records every
//! request and answers a few routes meant to exercise a driver's network:
//!
//! - `/ok`: 200; `/status/<n>`: that status; `/echo`: the request's headers and body, as JSON;
//! - `/login`: `{"token": "..."}` and the same in `x-auth-token`;
//! - `/redirect?to=<url>`: 302 to `url`;
//! - `/slow-headers`: answers after 10 s; `/slow-body`: headers and a byte, then 10 s of nothing;
//! - `/big`: 12 MiB;
//! - a small array's API (`/api/...`), as the guide's example driver uses it: `POST /api/auth`
//!   (`{"username", "password"}` to a token; the password must be [`ARRAY_PASSWORD`]), and, with
//!   `Authorization: Bearer <token>`, volumes (`GET`/`DELETE /api/volumes/<name>`,
//!   `POST /api/volumes` with `{"name", "size_gib"}`: 201, or 409 when it exists) and their hosts
//!   (`POST /api/volumes/<name>/hosts` with `{"initiator"}`, `DELETE .../hosts/<initiator>`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;

/// A server's TLS files ([`TestCa::server_files`]).
pub struct ServerFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerFiles {
    /// The `[http]` table that serves Berth's API with them.
    pub fn http_table(&self) -> String {
        format!(
            "[http]\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n",
            self.cert.display(),
            self.key.display()
        )
    }
}

/// A certificate authority made for one test.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    pub fn new() -> TestCa {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "Berth test CA");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa { cert, key }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA's certificate to `dir/ca.pem`.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let path = dir.join("ca.pem");
        std::fs::write(&path, self.pem()).unwrap();
        path
    }

    /// A client certificate (for `CN=<name>`): (certificate PEM, key PEM).
    pub fn issue_client(&self, name: &str) -> (String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Writes into `dir` what a server of this CA for `localhost` and `127.0.0.1` needs: the CA's
    /// certificate (`ca.pem`, for its clients), the server's (`server.pem`) and its key
    /// (`server.key`, mode 0600).
    pub fn server_files(&self, dir: &Path) -> ServerFiles {
        use std::os::unix::fs::PermissionsExt;
        let (cert, key) = self.issue(&["localhost", "127.0.0.1"]);
        let files =
            ServerFiles { ca: self.write(dir), cert: dir.join("server.pem"), key: dir.join("server.key") };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).unwrap();
        files
    }

    /// A TLS front on loopback for a plain server on `to_port` (Keystone, a stand-in Nova): it
    /// takes TLS with a certificate of this CA for `localhost` and relays the bytes; its port.
    /// It lives as long as the test's runtime.
    pub async fn front(&self, to_port: u16) -> u16 {
        let (cert, key) = self.issue(&["localhost", "127.0.0.1"]);
        use rustls::pki_types::pem::PemObject;
        let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else { return };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(("127.0.0.1", to_port)).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        port
    }

    /// A server certificate for `names` (DNS names or IP addresses): (certificate PEM, key PEM).
    pub fn issue(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = rcgen::CertificateParams::new(names).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// The password the array's API accepts.
pub const ARRAY_PASSWORD: &str = "array-admin-Passw0rd";

/// What the array holds: volumes (name to size and hosts) and the tokens it issued.
#[derive(Debug, Default)]
pub struct ArrayState {
    pub volumes: std::collections::BTreeMap<String, (u64, std::collections::BTreeSet<String>)>,
    tokens: std::collections::BTreeSet<String>,
    /// Answers given, in order, to the next requests for a path, before any route.
    scripted: std::collections::BTreeMap<String, std::collections::VecDeque<(u16, serde_json::Value)>>,
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// The server.
pub struct ArrayServer {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// The array's volumes and tokens (`/api/...`).
    pub state: Arc<Mutex<ArrayState>>,
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ArrayServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn full(status: u16, body: impl Into<Bytes>) -> http::Response<Body> {
    http::Response::builder().status(status).body(Full::new(body.into()).boxed()).unwrap()
}

fn json(status: u16, value: serde_json::Value) -> http::Response<Body> {
    let mut r = full(status, value.to_string());
    r.headers_mut().insert("content-type", "application/json".parse().unwrap());
    r
}

/// The array's API (`/api/...`).
fn api(
    method: &http::Method,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
    state: &Mutex<ArrayState>,
) -> http::Response<Body> {
    let mut state = state.lock().unwrap();
    let input: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if path == "/api/auth" {
        return if input["password"] == ARRAY_PASSWORD {
            let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
            state.tokens.insert(token.clone());
            json(200, serde_json::json!({ "token": token }))
        } else {
            json(401, serde_json::json!({"error": "wrong password"}))
        };
    }
    let token = headers
        .iter()
        .find(|(k, _)| k == "authorization")
        .and_then(|(_, v)| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !state.tokens.contains(token) {
        return json(401, serde_json::json!({"error": "log in first"}));
    }
    let parts: Vec<&str> =
        path.trim_start_matches("/api/volumes").split('/').filter(|p| !p.is_empty()).collect();
    match (method.as_str(), parts.as_slice()) {
        ("POST", []) => {
            let name = input["name"].as_str().unwrap_or_default().to_string();
            if state.volumes.contains_key(&name) {
                return json(409, serde_json::json!({"error": "exists"}));
            }
            state.volumes.insert(name.clone(), (input["size_gib"].as_u64().unwrap_or(0), Default::default()));
            json(201, serde_json::json!({"name": name}))
        }
        ("GET", [name]) => match state.volumes.get(*name) {
            Some((size, hosts)) => {
                json(200, serde_json::json!({"name": name, "size_gib": size, "hosts": hosts}))
            }
            None => json(404, serde_json::json!({"error": "no such volume"})),
        },
        ("DELETE", [name]) => match state.volumes.remove(*name) {
            Some(_) => full(204, ""),
            None => json(404, serde_json::json!({"error": "no such volume"})),
        },
        ("POST", [name, "hosts"]) => match state.volumes.get_mut(*name) {
            Some((_, hosts)) => {
                hosts.insert(input["initiator"].as_str().unwrap_or_default().to_string());
                json(
                    200,
                    serde_json::json!({
                        "target_iqn": format!("iqn.2024-01.com.example.array:{name}"),
                        "target_portal": "192.0.2.10:3260",
                        "target_lun": 0,
                    }),
                )
            }
            None => json(404, serde_json::json!({"error": "no such volume"})),
        },
        ("DELETE", [name, "hosts", initiator]) => match state.volumes.get_mut(*name) {
            Some((_, hosts)) => {
                hosts.remove(*initiator);
                full(204, "")
            }
            None => json(404, serde_json::json!({"error": "no such volume"})),
        },
        _ => json(404, serde_json::json!({"error": "no such route"})),
    }
}

async fn answer(
    request: http::Request<hyper::body::Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    state: Arc<Mutex<ArrayState>>,
) -> http::Response<Body> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let headers: Vec<(String, String)> = parts
        .headers
        .iter()
        .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let path = parts.uri.path().to_string();
    seen.lock().unwrap().push(Seen {
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default(),
        headers: headers.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let scripted = state.lock().unwrap().scripted.get_mut(&path).and_then(|q| q.pop_front());
    if let Some((status, value)) = scripted {
        return json(status, value);
    }
    if path.starts_with("/api/") {
        return api(&parts.method, &path, &headers, &body, &state);
    }
    match path.as_str() {
        "/ok" => full(200, "ok"),
        "/echo" => {
            let json = serde_json::json!({
                "headers": headers.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                "body": String::from_utf8_lossy(&body),
            });
            let mut r = full(200, json.to_string());
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        }
        "/login" => {
            let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
            let mut r = full(200, serde_json::json!({ "token": token }).to_string());
            r.headers_mut().insert("x-auth-token", token.parse().unwrap());
            r
        }
        "/redirect" => {
            let to = parts.uri.query().and_then(|q| q.strip_prefix("to=")).unwrap_or("/ok").to_string();
            let mut r = full(302, "");
            r.headers_mut().insert("location", to.parse().unwrap());
            r
        }
        "/slow-headers" => {
            tokio::time::sleep(Duration::from_secs(10)).await;
            full(200, "late")
        }
        "/slow-body" => {
            let stream = futures_util::stream::unfold(0u8, |n| async move {
                match n {
                    0 => Some((Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"x"))), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        Some((Ok(Frame::data(Bytes::from_static(b"y"))), 2))
                    }
                    _ => None,
                }
            });
            http::Response::builder().status(200).body(StreamBody::new(stream).boxed()).unwrap()
        }
        "/big" => full(200, vec![b'z'; 12 << 20]),
        p if p.starts_with("/status/") => full(p[8..].parse().unwrap_or(500), "status"),
        _ => full(404, "no such route"),
    }
}

impl ArrayServer {
    /// HTTPS with a certificate from `ca` for `names`, on 127.0.0.1.
    pub async fn https(ca: &TestCa, names: &[&str]) -> ArrayServer {
        Self::https_with(ca, names, false).await
    }

    /// The same, asking every client for a certificate issued by `ca` (mutual TLS): a client
    /// without one does not get through the handshake.
    pub async fn https_with_client_certificates(ca: &TestCa, names: &[&str]) -> ArrayServer {
        Self::https_with(ca, names, true).await
    }

    async fn https_with(ca: &TestCa, names: &[&str], clients: bool) -> ArrayServer {
        let (cert, key) = ca.issue(names);
        use rustls::pki_types::pem::PemObject;
        let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if clients {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(chain, key).unwrap();
        Self::start(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    /// Plain HTTP on 127.0.0.1.
    pub async fn http() -> ArrayServer {
        Self::start(None).await
    }

    async fn start(tls: Option<tokio_rustls::TlsAcceptor>) -> ArrayServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let state: Arc<Mutex<ArrayState>> = Arc::default();
        let connections: Arc<AtomicUsize> = Arc::default();
        let (s, c, st) = (seen.clone(), connections.clone(), state.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                c.fetch_add(1, Ordering::SeqCst);
                let (seen, tls, state) = (s.clone(), tls.clone(), st.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |r| {
                        let (seen, state) = (seen.clone(), state.clone());
                        async move { Ok::<_, Infallible>(answer(r, seen, state).await) }
                    });
                    let builder = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                        None => {
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                });
            }
        });
        ArrayServer { addr, seen, state, connections, task }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Forgets every token it gave out (as an array that restarted): the next request with one
    /// gets 401.
    pub fn forget_tokens(&self) {
        self.state.lock().unwrap().tokens.clear();
    }

    /// The next requests for `path` (whatever their method) get `answers`, in order, as JSON;
    /// after them the routes answer as usual.
    pub fn script(&self, path: &str, answers: &[(u16, serde_json::Value)]) {
        self.state
            .lock()
            .unwrap()
            .scripted
            .entry(path.to_string())
            .or_default()
            .extend(answers.iter().cloned());
    }
}

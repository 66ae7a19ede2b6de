//! The `network` capability against real servers: HTTPS (and HTTP) servers started by the test on
//! loopback, with certificates from a CA the test makes, driven by the `netprobe` fixture (a
//! 0.3.0 driver that makes the requests its volume's metadata describes), as a well-behaved
//! driver and as a hostile one. Every refusal is a request that never reached a server.

use std::collections::BTreeMap;
use std::sync::Arc;

use berth::capabilities::Grant;
use berth::capabilities::network::{NetFault, NetworkCapability, NetworkConfig, SecretSource};
use berth::runtime::contract::DriverError;
use berth::runtime::{CallErrorKind, CallOptions, Driver, Request, Response};
use berth_tests::drivers::{load, spec, volume, with_grants};
use berth_tests::https::{ArrayServer, TestCa};

/// `netprobe` with the network granted under `config`.
async fn probe(config: &NetworkConfig) -> Driver {
    let mut spec = with_grants(spec("netprobe"), &[Grant::Network]);
    spec.capabilities.network =
        Some(Arc::new(NetworkCapability::new("probe", config).expect("a valid network")));
    load(spec).await.expect("netprobe loads with the network granted")
}

/// One create-volume call whose requests `metadata` describes.
async fn run(driver: &Driver, metadata: &[(&str, &str)]) -> Result<Response, CallErrorKind> {
    run_with(driver, metadata, CallOptions::default()).await
}

async fn run_with(
    driver: &Driver,
    metadata: &[(&str, &str)],
    options: CallOptions,
) -> Result<Response, CallErrorKind> {
    let v = volume(&uuid::Uuid::new_v4().to_string(), metadata);
    driver.invoke(&Request::CreateVolume(v), &options).await.result.map_err(|e| e.kind)
}

fn status(r: &Result<Response, CallErrorKind>) -> String {
    match r {
        Ok(Response::ModelUpdate(u)) => u.provider_id.clone().unwrap_or_default(),
        other => panic!("no answer: {other:?}"),
    }
}

fn driver_error(r: &Result<Response, CallErrorKind>) -> DriverError {
    match r {
        Err(CallErrorKind::Driver(e)) => e.clone(),
        other => panic!("expected a driver error, got {other:?}"),
    }
}

fn refused(r: &Result<Response, CallErrorKind>) -> String {
    match driver_error(r) {
        DriverError::Backend(m) if m.contains("refused by the host") => m,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn retryable(r: &Result<Response, CallErrorKind>) -> String {
    match driver_error(r) {
        DriverError::Retryable(m) => m,
        other => panic!("expected a retryable error, got {other:?}"),
    }
}

/// A network allowing `entries`, trusting `ca`.
fn config(entries: &[String], ca: Option<&std::path::Path>) -> NetworkConfig {
    NetworkConfig {
        allowed_hosts: entries.to_vec(),
        ca_file: ca.map(|p| p.to_path_buf()),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_host_is_reached_over_tls_and_anything_else_is_refused_before_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let other = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let plain = ArrayServer::http().await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let driver = probe(&config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())))).await;

    assert_eq!(status(&run(&driver, &[("probe.url", &format!("{allowed}/ok"))]).await), "200");
    assert_eq!(status(&run(&driver, &[("probe.url", &format!("{allowed}/status/404"))]).await), "404");
    // Another port, plain HTTP to a listed address, another scheme: refused, and never sent.
    let m = refused(&run(&driver, &[("probe.url", &format!("https://127.0.0.1:{}/ok", other.port()))]).await);
    assert!(m.contains("HttpRequestDenied"), "{m}");
    refused(&run(&driver, &[("probe.url", &format!("http://127.0.0.1:{}/ok", array.port()))]).await);
    refused(&run(&driver, &[("probe.url", &format!("http://127.0.0.1:{}/ok", plain.port()))]).await);
    assert!(other.requests().is_empty() && plain.requests().is_empty(), "a refused request reached a server");
    assert_eq!(array.requests().len(), 2);
    // Plain HTTP goes where it is listed as such.
    let driver = probe(&config(&[format!("http://127.0.0.1:{}", plain.port())], None)).await;
    assert_eq!(
        status(&run(&driver, &[("probe.url", &format!("http://127.0.0.1:{}/ok", plain.port()))]).await),
        "200"
    );
}

/// What a request changes on the array outlives the machine's power: the call first awaits what
/// its operation must make durable (`CallOptions::before_lasting`), and a refusal there sends
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_the_operations_intent_and_is_not_sent_when_it_cannot_be_synced() {
    use berth_tests::drivers::{counting_before_lasting, refusing_before_lasting};
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let driver = probe(&config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())))).await;
    let url = [("probe.url", format!("{allowed}/ok"))];
    let url: Vec<(&str, &str)> = url.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let refusing = refusing_before_lasting("the log could not be synced");
    let options = CallOptions { before_lasting: Some(refusing), ..Default::default() };
    let r = run_with(&driver, &url, options).await;
    let DriverError::Backend(m) = driver_error(&r) else { panic!("{r:?}") };
    assert!(m.contains("the log could not be synced"), "{m}");
    assert!(array.requests().is_empty(), "a request went out before its intent was on disk");

    let (counting, waits) = counting_before_lasting();
    let options = CallOptions { before_lasting: Some(counting), ..Default::default() };
    assert_eq!(status(&run_with(&driver, &url, options).await), "200");
    assert_eq!((waits.load(Ordering::SeqCst), array.requests().len()), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_followed_only_onto_the_list() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let elsewhere = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let driver = probe(&config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())))).await;
    let on = format!("{allowed}/redirect?to={allowed}/ok");
    assert_eq!(status(&run(&driver, &[("probe.url", &on), ("probe.follow", "true")]).await), "200");
    let off = format!("{allowed}/redirect?to=https://127.0.0.1:{}/ok", elsewhere.port());
    refused(&run(&driver, &[("probe.url", &off), ("probe.follow", "true")]).await);
    assert!(elsewhere.requests().is_empty());
}

/// A name that resolves to this machine (or the metadata service) is refused unless that address
/// is itself listed: no DNS rebinding into the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_resolve_into_the_host_are_refused_unless_the_address_is_listed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["array.test", "localhost"]).await;
    let port = array.port();
    let ca_file = ca.write(dir.path());
    let mut c =
        config(&[format!("https://array.test:{port}"), format!("https://localhost:{port}")], Some(&ca_file));
    c.resolve.insert("array.test".into(), "127.0.0.1".parse().unwrap());
    let driver = probe(&c).await;
    for url in [format!("https://array.test:{port}/ok"), format!("https://localhost:{port}/ok")] {
        let m = refused(&run(&driver, &[("probe.url", &url)]).await);
        assert!(m.contains("DestinationIpProhibited"), "{url}: {m}");
    }
    assert!(array.requests().is_empty());
    // Listing the address itself allows it (the name still has to match the certificate).
    c.allowed_hosts.push(format!("https://127.0.0.1:{port}"));
    let driver = probe(&c).await;
    assert_eq!(
        status(&run(&driver, &[("probe.url", &format!("https://array.test:{port}/ok"))]).await),
        "200"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_needs_the_right_ca_unless_verification_is_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, wrong) = (TestCa::new(), TestCa::new());
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let url = format!("{allowed}/ok");
    let wrong_dir = tempfile::tempdir().unwrap();
    let driver = probe(&config(std::slice::from_ref(&allowed), Some(&wrong.write(wrong_dir.path())))).await;
    let e = driver_error(&run(&driver, &[("probe.url", &url)]).await);
    assert!(format!("{e:?}").contains("Tls"), "{e:?}");
    // No CA at all: the system's roots do not know the test CA either.
    let driver = probe(&config(std::slice::from_ref(&allowed), None)).await;
    driver_error(&run(&driver, &[("probe.url", &url)]).await);
    let driver = probe(&config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())))).await;
    assert_eq!(status(&run(&driver, &[("probe.url", &url)]).await), "200");
    let mut insecure = config(std::slice::from_ref(&allowed), None);
    insecure.insecure_skip_verify = true;
    let driver = probe(&insecure).await;
    assert_eq!(status(&run(&driver, &[("probe.url", &url)]).await), "200");
}

/// An array that asks for a client certificate: the backend's `client_cert_file` and
/// `client_key_file` get the driver through; without them the handshake fails, a TLS error the
/// driver sees as a backend failure; a key others can read refuses the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_where_the_array_asks_for_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https_with_client_certificates(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let url = format!("{allowed}/ok");
    let without = probe(&config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())))).await;
    let r = run(&without, &[("probe.url", &url)]).await;
    assert!(
        matches!(driver_error(&r), DriverError::Backend(m) if m.contains("Tls") || m.contains("TLS")),
        "{r:?}"
    );

    let (cert, key) = ca.issue_client("berth");
    std::fs::write(dir.path().join("client.pem"), cert).unwrap();
    let key_file = secret_file(dir.path(), "client.key", key.trim_end());
    let mut c = config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())));
    c.client_cert_file = Some(dir.path().join("client.pem"));
    c.client_key_file = Some(key_file.clone());
    let with = probe(&c).await;
    assert_eq!(status(&run(&with, &[("probe.url", &url)]).await), "200");

    std::fs::set_permissions(&key_file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let refused = NetworkCapability::new("x", &c).unwrap_err();
    assert!(refused.contains("client_key_file"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_body_bounds_end_a_request_within_the_call() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let mut c = config(&[allowed.clone(), "https://192.0.2.1:8443".into()], Some(&ca.write(dir.path())));
    c.first_byte_timeout_ms = 300;
    c.idle_timeout_ms = 300;
    c.connect_timeout_ms = 300;
    c.max_response_kib = 1024;
    c.max_request_kib = 4;
    let driver = probe(&c).await;
    let started = std::time::Instant::now();
    let m = retryable(&run(&driver, &[("probe.url", &format!("{allowed}/slow-headers"))]).await);
    assert!(m.contains("ConnectionReadTimeout"), "{m}");
    let m = retryable(&run(&driver, &[("probe.url", &format!("{allowed}/slow-body"))]).await);
    assert!(m.contains("HttpResponseTimeout"), "{m}");
    // TEST-NET-1: nothing answers there.
    let e = driver_error(&run(&driver, &[("probe.url", "https://192.0.2.1:8443/ok")]).await);
    assert!(matches!(e, DriverError::Retryable(_)), "{e:?}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(8),
        "a bound was not kept: {:?}",
        started.elapsed()
    );
    let e = driver_error(&run(&driver, &[("probe.url", &format!("{allowed}/big"))]).await);
    assert!(format!("{e:?}").contains("HttpResponseBodySize"), "{e:?}");
    let big = "x".repeat(8 * 1024);
    let e = driver_error(
        &run(
            &driver,
            &[("probe.url", &format!("{allowed}/echo")), ("probe.method", "POST"), ("probe.body", &big)],
        )
        .await,
    );
    assert!(format!("{e:?}").contains("HttpRequestBodySize"), "{e:?}");
    assert!(!array.requests().iter().any(|r| r.body.len() > 4096), "an oversized body went out");
}

/// A private secret file for one test.
fn secret_file(dir: &std::path::Path, name: &str, value: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("{value}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A session kept by the host: it logs in once for every call of the backend, adds the token to
/// the driver's requests, logs in again when the array answers 401 (and sends the request once
/// more); the driver holds neither the password nor the token, and a token the array echoes is
/// refused in the driver's model update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_logged_in_and_kept_by_the_host() {
    use berth::capabilities::network::SessionConfig;
    use berth_tests::https::ARRAY_PASSWORD;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let mut c = config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())));
    c.secrets.insert(
        "array-password".into(),
        SecretSource {
            file: Some(secret_file(dir.path(), "array.password", ARRAY_PASSWORD)),
            env: None,
            hosts: vec![allowed.clone()],
        },
    );
    c.sessions.insert(
        "api".into(),
        SessionConfig {
            login_url: format!("{allowed}/api/auth"),
            login_method: "POST".into(),
            login_body: r#"{"username": "berth", "password": "{{secret:array-password}}"}"#.into(),
            login_headers: BTreeMap::from([("content-type".to_string(), "application/json".to_string())]),
            token_field: Some("/token".into()),
            token_header: None,
            header: "authorization".into(),
            value: "Bearer {{session}}".into(),
            hosts: vec![allowed.clone()],
            lifetime_seconds: 0,
        },
    );
    let driver = probe(&c).await;
    let logins = || array.requests().iter().filter(|r| r.path == "/api/auth").count();
    let volume_url = format!("{allowed}/api/volumes/volume-none");
    // Without the token the array would answer 401; with it, 404 (no such volume).
    for _ in 0..3 {
        assert_eq!(status(&run(&driver, &[("probe.url", &volume_url)]).await), "404");
    }
    assert_eq!(logins(), 1, "one login for every call");
    let login = array.requests().into_iter().find(|r| r.path == "/api/auth").unwrap();
    assert!(login.body.contains(ARRAY_PASSWORD), "the host filled in the password");

    // The array forgets its tokens: the next request gets 401, the host logs in again and sends
    // it once more; the driver sees only the answer.
    array.forget_tokens();
    assert_eq!(status(&run(&driver, &[("probe.url", &volume_url)]).await), "404");
    assert_eq!(logins(), 2);

    // The token the host added, echoed back to the driver, is refused in its model update.
    let echoed = run(&driver, &[("probe.url", &format!("{allowed}/echo")), ("probe.store", "true")]).await;
    assert!(
        matches!(&echoed, Err(e) if e.to_string().contains("credentials")),
        "the echoed token was stored: {echoed:?}"
    );

    // A wrong password: the driver sees the login's refusal, not a token.
    let mut wrong = c.clone();
    wrong.secrets.get_mut("array-password").unwrap().file =
        Some(secret_file(dir.path(), "wrong.password", "not-the-password"));
    let driver = probe(&wrong).await;
    assert_eq!(status(&run(&driver, &[("probe.url", &volume_url)]).await), "401");

    // A session must name a login on an allowed host and a token, and carry its token only to
    // allowed hosts.
    let mut bad = c.clone();
    bad.sessions.get_mut("api").unwrap().login_url = "https://elsewhere.example/api/auth".into();
    assert!(NetworkCapability::new("x", &bad).unwrap_err().contains("login_url is not on an allowed host"));
    let mut bad = c.clone();
    bad.sessions.get_mut("api").unwrap().hosts = vec!["https://elsewhere.example".into()];
    assert!(
        NetworkCapability::new("x", &bad).unwrap_err().contains("not one of the backend's allowed_hosts")
    );
    let mut bad = c.clone();
    bad.sessions.get_mut("api").unwrap().token_field = None;
    assert!(NetworkCapability::new("x", &bad).unwrap_err().contains("token_field or token_header"));
}

/// The array's credentials stay with the host: the driver names them, the host puts them in the
/// request for the hosts they may go to, and refuses every other way out; what the driver sees of
/// a secret (an echo, a login's token) is redacted from its log and refused in its model update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_added_by_the_host_and_go_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let thief = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let stolen = format!("https://127.0.0.1:{}", thief.port());
    let secret = "S3cret-Passw0rd-for-the-array";
    let mut c = config(&[allowed.clone(), stolen.clone()], Some(&ca.write(dir.path())));
    c.secrets.insert(
        "array".into(),
        SecretSource {
            file: Some(secret_file(dir.path(), "array.secret", secret)),
            env: None,
            hosts: vec![allowed.clone()],
        },
    );
    c.headers.insert(
        allowed.clone(),
        BTreeMap::from([("x-array-key".to_string(), "{{secret:array}}".to_string())]),
    );
    c.secret_response_fields = vec!["/token".into()];
    let driver = probe(&c).await;

    // Login with a POST whose body names the secret: the array gets it, in the body and in the
    // configured header; the driver's request never held it.
    let login = run(
        &driver,
        &[
            ("probe.url", &format!("{allowed}/login")),
            ("probe.method", "POST"),
            ("probe.body", r#"{"user": "admin", "password": "{{secret:array}}"}"#),
        ],
    )
    .await;
    assert_eq!(status(&login), "200");
    let seen = array.requests().pop().unwrap();
    assert_eq!(seen.body, format!(r#"{{"user": "admin", "password": "{secret}"}}"#));
    assert!(seen.headers.iter().any(|(k, v)| k == "x-array-key" && v == secret));

    // The secret to a host it is not for: refused, by name or by value.
    let m = refused(
        &run(
            &driver,
            &[
                ("probe.url", &format!("{stolen}/echo")),
                ("probe.method", "POST"),
                ("probe.body", "{{secret:array}}"),
            ],
        )
        .await,
    );
    assert!(m.contains("HttpRequestDenied"), "{m}");
    let m = refused(
        &run(
            &driver,
            &[
                ("probe.url", &format!("{allowed}/echo")),
                ("probe.method", "POST"),
                ("probe.body", "{{secret:array}}"),
                ("probe.then.url", &format!("{stolen}/echo")),
                ("probe.then.method", "POST"),
                ("probe.then.body", "{answer}"),
            ],
        )
        .await,
    );
    assert!(m.contains("HttpRequestDenied"), "{m}");
    refused(
        &run(
            &driver,
            &[("probe.url", &format!("{allowed}/echo")), ("probe.header.authorization", "{{secret:nope}}")],
        )
        .await,
    );
    assert!(thief.requests().is_empty(), "the secret reached another host: {:?}", thief.requests());

    // Seen in an echo, or a login's token: never stored.
    let stored = run(
        &driver,
        &[
            ("probe.url", &format!("{allowed}/echo")),
            ("probe.method", "POST"),
            ("probe.body", "{{secret:array}}"),
            ("probe.store", "true"),
        ],
    )
    .await;
    assert!(
        matches!(&stored, Err(CallErrorKind::InvalidOutput(m)) if m.contains("credentials")),
        "{stored:?}"
    );
    let token = run(
        &driver,
        &[("probe.url", &format!("{allowed}/login")), ("probe.method", "POST"), ("probe.store", "true")],
    )
    .await;
    assert!(matches!(&token, Err(CallErrorKind::InvalidOutput(_))), "a login token was stored: {token:?}");
    // The recorded requests (what the conformance suite reports) name no secret.
    let outcome = driver
        .invoke(
            &Request::CreateVolume(volume(
                "r",
                &[
                    ("probe.url", &format!("{allowed}/echo")),
                    ("probe.method", "POST"),
                    ("probe.body", "{{secret:array}}"),
                ],
            )),
            &CallOptions { record: true, ..Default::default() },
        )
        .await;
    let calls = format!("{:?}", outcome.stats.capability_calls);
    assert!(calls.contains("network") && !calls.contains(secret), "{calls}");
}

/// The conformance suite's faults in front of the real endpoint: a lost answer (the request was
/// applied), a timeout and a 5xx (neither sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_injected_in_front_of_the_real_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let driver = probe(&config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())))).await;
    let meta = [("probe.url", format!("{allowed}/ok"))];
    let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let with = |fault| CallOptions { network_fault: Some((1, fault)), ..Default::default() };
    let lost = run_with(&driver, &meta, with(NetFault::LostAnswer)).await;
    assert!(retryable(&lost).contains("ConnectionTerminated"));
    assert_eq!(array.requests().len(), 1, "a lost answer's request was applied");
    retryable(&run_with(&driver, &meta, with(NetFault::Timeout)).await);
    assert_eq!(status(&run_with(&driver, &meta, with(NetFault::ServerError)).await), "503");
    assert_eq!(array.requests().len(), 1, "a timeout or a 5xx injected sends nothing");
}

/// Connections and TLS sessions belong to the host: the calls of a driver (each in a fresh
/// instance) reuse one warm connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_reuse_the_hosts_warm_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let driver = probe(&config(std::slice::from_ref(&allowed), Some(&ca.write(dir.path())))).await;
    for _ in 0..10 {
        assert_eq!(status(&run(&driver, &[("probe.url", &format!("{allowed}/ok"))]).await), "200");
    }
    assert_eq!(array.requests().len(), 10);
    assert_eq!(
        array.connections.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one connection for ten calls"
    );
}

/// Only a 0.3.0 driver may import `wasi:http`, and only with the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_needs_its_grant() {
    let e = load(spec("netprobe")).await.err().expect("refused without the grant");
    assert!(e.to_string().contains("network"), "{e}");
    // Granted in name but without a network: refused as well.
    let e = load(with_grants(spec("netprobe"), &[Grant::Network])).await.err().expect("refused");
    assert!(e.to_string().contains("network"), "{e}");
}

/// The configuration of `berth serve` with a `probe` backend (netprobe) granted the network.
fn serve_config(allowed: &str, ca: &std::path::Path, secret: &std::path::Path, port: u16) -> String {
    format!(
        r#"[metrics]
listen = "127.0.0.1:{port}"

[[backends]]
name = "probe"
wasm = "{wasm}"
grants = ["network"]

[backends.network]
allowed_hosts = ["{allowed}"]
ca_file = "{ca}"
secret_response_fields = ["/token"]

[backends.network.secrets.array]
file = "{secret}"
hosts = ["{allowed}"]

[[volume_types]]
name = "__DEFAULT__"
backend = "probe"
"#,
        wasm = berth_tests::drivers::component("netprobe").display(),
        ca = ca.display(),
        secret = secret.display(),
    )
}

/// Through `berth serve`: each request is one log line (method, allowed host, path, status,
/// duration) and counted by backend, host, method and status class; a refusal is logged and
/// counted as such; no secret reaches the log, even when the driver logs an answer that holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_logged_and_counted_and_no_secret_reaches_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let value = "the-arrays-Secret-0f-17-chars";
    let secret = secret_file(dir.path(), "array.secret", value);
    let metrics = berth_tests::pg::free_port();
    let server = berth_tests::process::BerthProcess::start(&serve_config(
        &allowed,
        &ca.write(dir.path()),
        &secret,
        metrics,
    ));
    let c = berth_tests::server::Client::for_base(&server.base, "p1");
    let made = c
        .create_volume(serde_json::json!({"size": 1, "metadata": {
            "probe.url": format!("{allowed}/echo"), "probe.method": "POST",
            "probe.body": "{\"password\": \"{{secret:array}}\"}", "probe.log": "true"}}))
        .await;
    assert_eq!(c.volume_status(&made).await, "available");
    assert!(array.requests().iter().any(|r| r.body.contains(value)), "the array got the secret");
    let refused = c
        .post("/volumes", serde_json::json!({"volume": {"size": 1, "metadata": {"probe.url": "https://203.0.113.9/steal"}}}))
        .await;
    let message = refused.fault(502, "computeFault");
    assert!(message.contains("refused by the host"), "{message}");

    let log = server.log_text();
    assert!(!log.contains(value), "a secret reached the log");
    assert!(log.contains("probe answer") && log.contains("***"), "the driver's line is there, redacted");
    let line = log
        .lines()
        .find(|l| l.contains("outbound request") && l.contains("/echo"))
        .expect("a line per request");
    for part in ["POST", &allowed, "status=200", "micros="] {
        assert!(line.contains(part), "{part} missing from {line}");
    }
    assert!(
        log.lines().any(|l| l.contains("outbound request refused") && l.contains("203.0.113.9")),
        "{log}"
    );
    let text =
        reqwest::get(format!("http://127.0.0.1:{metrics}/metrics")).await.unwrap().text().await.unwrap();
    let counted = |class: &str, host: &str| {
        text.lines().any(|l| {
            l.starts_with("berth_outbound_requests_total")
                && l.contains("backend=\"probe\"")
                && l.contains(&format!("host=\"{host}\""))
                && l.contains(&format!("class=\"{class}\""))
        })
    };
    assert!(counted("2xx", &allowed) && counted("refused", "unlisted"), "{text}");
}

/// A secret file that others can read, or a network table without its grant, is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_serve_refuses_a_secret_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let secret = secret_file(dir.path(), "array.secret", "hunter2hunter2");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config =
        serve_config("https://array.example", &ca.write(dir.path()), &secret, berth_tests::pg::free_port());
    let log = berth_tests::process::BerthProcess::try_start("", &config, &[]).err().expect("refused");
    assert!(log.contains("readable by others"), "{log}");
    let ungranted = config.replace("grants = [\"network\"]", "grants = []");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let log = berth_tests::process::BerthProcess::try_start("", &ungranted, &[]).err().expect("refused");
    assert!(log.contains("not granted \"network\""), "{log}");
}

//! The network capability's costs, against a real HTTPS server on loopback (the tests' array
//! server, with a test CA):
//!
//! - a plain Rust client (hyper with rustls, the same TLS settings) on a warm connection: the
//!   floor;
//! - the same request through the host's side of the capability (`NetworkCapability::send`:
//!   allow-list, credentials, bounds, the pool, metrics and its log line) on a warm connection:
//!   the host's overhead is the difference (target: under 100 us);
//! - a cold request (a new TCP connection and TLS handshake);
//! - a whole driver call that makes the request (`netprobe` in a fresh instance).
//!
//! Run: `cargo bench -p berth-tests --bench network`. Figures go to BENCHMARKS.md.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth::capabilities::Grant;
use berth::capabilities::network::{NetworkCapability, NetworkConfig};
use berth::runtime::{CallOptions, Request};
use berth_tests::drivers::{spec, volume, with_grants};
use berth_tests::https::{ArrayServer, TestCa};
use berth_tests::stats::Summary;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};

const N: usize = 3_000;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

fn request(url: &str) -> http::Request<Bytes> {
    http::Request::get(url).body(Bytes::new()).unwrap()
}

async fn run() {
    println!("berth network benchmark ({} build)", if cfg!(debug_assertions) { "debug" } else { "release" });
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let array = ArrayServer::https(&ca, &["127.0.0.1"]).await;
    let allowed = format!("https://127.0.0.1:{}", array.port());
    let url = format!("{allowed}/ok");
    let config = NetworkConfig {
        allowed_hosts: vec![allowed.clone()],
        ca_file: Some(ca.write(dir.path())),
        ..Default::default()
    };

    // The floor: hyper + rustls, one warm connection.
    let mut roots = rustls::RootCertStore::empty();
    {
        use rustls::pki_types::pem::PemObject;
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
            roots.add(cert.unwrap()).unwrap();
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https =
        hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_only().enable_http1().build();
    let plain: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let send_plain = async |url: &str| {
        let r = plain.request(http::Request::get(url).body(Full::new(Bytes::new())).unwrap()).await.unwrap();
        r.into_body().collect().await.unwrap();
    };
    let network = NetworkCapability::new("bench", &config).unwrap();
    let deadline = || Instant::now() + Duration::from_secs(30);
    for _ in 0..200 {
        send_plain(&url).await;
        network.send(request(&url), deadline(), None).await.unwrap();
    }
    // Interleaved, so that the machine's drift weighs on both alike.
    let (mut floor, mut host) = (Vec::with_capacity(N), Vec::with_capacity(N));
    for _ in 0..N {
        let t = Instant::now();
        send_plain(&url).await;
        floor.push(t.elapsed());
        let t = Instant::now();
        network.send(request(&url), deadline(), None).await.unwrap();
        host.push(t.elapsed());
    }
    let floor = Summary::of(&mut floor);
    println!("plain hyper+rustls, warm connection: {floor}");
    let host = Summary::of(&mut host);
    println!("through the network capability, warm connection: {host}");
    println!(
        "host overhead per request (p50 difference): {:.1} us (target: under 100 us)",
        (host.p50.as_secs_f64() - floor.p50.as_secs_f64()) * 1e6
    );

    let mut cold = Vec::new();
    for _ in 0..50 {
        let fresh = NetworkCapability::new("bench-cold", &config).unwrap();
        let t = Instant::now();
        fresh.send(request(&url), deadline(), None).await.unwrap();
        cold.push(t.elapsed());
    }
    println!(
        "cold (new TCP connection and TLS handshake, through the capability): {}",
        Summary::of(&mut cold)
    );

    let mut s = with_grants(spec("netprobe"), &[Grant::Network]);
    s.capabilities.network = Some(Arc::new(NetworkCapability::new("probe", &config).unwrap()));
    let driver = berth_tests::drivers::runtime().load(s).await.unwrap();
    let call = Request::CreateVolume(volume("bench", &[("probe.url", &url)]));
    for _ in 0..100 {
        driver.invoke(&call, &CallOptions::default()).await.result.unwrap();
    }
    let mut calls = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let t = Instant::now();
        driver.invoke(&call, &CallOptions::default()).await.result.unwrap();
        calls.push(t.elapsed());
    }
    println!("a driver call making the request (netprobe, fresh instance): {}", Summary::of(&mut calls));
}

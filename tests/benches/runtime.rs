//! Runtime costs: cold compile of a driver, load from the artifact cache, one call in a fresh
//! instance, and the same logic called natively.
//!
//! Run: `cargo bench -p berth-tests --bench runtime` (release build). Figures go to BENCHMARKS.md.

use std::time::Instant;

use berth::runtime::{CallOptions, Request, Runtime, RuntimeOptions};
use berth_driver_sdk::Driver as _; // brings Fake::info() into scope
use berth_tests::drivers::{connector, spec};
use berth_tests::stats::Summary;

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(run());
}

async fn run() {
    println!("berth runtime benchmark ({} build)", if cfg!(debug_assertions) { "debug" } else { "release" });

    for name in ["fake", "tgt-iscsi"] {
        let mut cold = Vec::new();
        for _ in 0..5 {
            let cache = tempfile::tempdir().unwrap();
            let runtime =
                Runtime::new(RuntimeOptions { cache_dir: Some(cache.path().into()), ..Default::default() })
                    .unwrap();
            let started = Instant::now();
            let _ = runtime.load(spec_for(name)).await.unwrap();
            cold.push(started.elapsed());
        }
        println!("cold load (compile + link + info) of {name}.wasm: {}", Summary::of(&mut cold));

        let cache = tempfile::tempdir().unwrap();
        let options = RuntimeOptions { cache_dir: Some(cache.path().into()), ..Default::default() };
        Runtime::new(options.clone()).unwrap().load(spec_for(name)).await.unwrap();
        let mut warm = Vec::new();
        for _ in 0..50 {
            let runtime = Runtime::new(options.clone()).unwrap();
            let started = Instant::now();
            let driver = runtime.load(spec_for(name)).await.unwrap();
            warm.push(started.elapsed());
            assert_eq!(driver.provenance(), berth::runtime::Provenance::Cached);
        }
        println!("load from cache (deserialize + link + info) of {name}.wasm: {}", Summary::of(&mut warm));
    }

    let runtime = Runtime::new(RuntimeOptions::default()).unwrap();
    let driver = runtime.load(spec("fake")).await.unwrap();
    let options = CallOptions::default();
    let c = connector("iqn.1993-08.org.debian:01:bench");
    for (label, request) in
        [("info()", Request::Info), ("validate-connector(connector)", Request::ValidateConnector(c.clone()))]
    {
        for _ in 0..1_000 {
            driver.invoke(&request, &options).await.result.unwrap();
        }
        let mut samples = Vec::with_capacity(20_000);
        for _ in 0..20_000 {
            let started = Instant::now();
            driver.invoke(&request, &options).await.result.unwrap();
            samples.push(started.elapsed());
        }
        println!("call in a fresh instance, fake {label}: {}", Summary::of(&mut samples));
    }

    let mut native = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let started = Instant::now();
        std::hint::black_box(berth_driver_fake::Fake::info());
        native.push(started.elapsed());
    }
    println!("the same info() called natively in Rust: {}", Summary::of(&mut native));
}

fn spec_for(name: &str) -> berth::runtime::DriverSpec {
    berth_tests::drivers::granted_spec(name)
}

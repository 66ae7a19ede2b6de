//! What a driver costs by the language it is written in: the Rust `tgt-iscsi`, the JavaScript
//! `js-iscsi` (ComponentizeJS) and the Python `py-iscsi` (componentize-py), which do the same work.
//! For each: the component's size and footprint, the first compile, a load from the artifact
//! cache, one call in a fresh instance (instantiation, memory initialisation and the call) with
//! its fuel, the next call of an operation in the instance the first left, each call of an attach
//! and a detach on the in-memory target model (time, and fuel: instructions, which do not move
//! from run to run), and an attachment create over HTTP with all three served by one `berth serve`
//! (release build) on a real tgtd, the drivers in turn (`BERTH_BENCH_CREATES` measured each, 200 by
//! default, after 10 not measured), the hosts of its connectors four in turn.
//!
//! Run after `bash .ci/test` (or the two driver builds it runs):
//! `cargo bench -p berth-tests --bench languages` (`BERTH_BENCH_KEEP_RESIDENT_MIB` sets
//! `[runtime] keep_resident_mib`; `BERTH_BENCH_ONLY=py-iscsi`, say, measures the drivers it names
//! on the in-memory model only, without the server). Figures go to BENCHMARKS.md.

use std::time::{Duration, Instant};

use berth::runtime::{CallOptions, Footprint, Request, Runtime, RuntimeOptions};
use berth_tests::drivers::{component, connector, granted_spec};
use berth_tests::process::BerthProcess;
use berth_tests::server::{Client, connector as api_connector};
use berth_tests::stats::{Summary, human, own_cpu_time, own_minor_faults};
use berth_tests::tgt::TgtdProcess;
use serde_json::json;

const DRIVERS: [(&str, &str, &str); 3] =
    [("Rust", "tgt-iscsi", "tgt"), ("JavaScript", "js-iscsi", "js"), ("Python", "py-iscsi", "py")];

/// A model update applied as the host applies it (the fields the iSCSI drivers use).
fn apply(volume: &mut berth::runtime::contract::Volume, update: &berth::runtime::contract::ModelUpdate) {
    let mut fields = berth::runtime::model::VolumeFields::of(volume);
    fields.apply(update).unwrap();
    fields.write_to(volume);
}

/// `BERTH_BENCH_KEEP_RESIDENT_MIB`: `[runtime] keep_resident_mib` for the runtime and the server
/// (default: the configuration's), to compare memory kept resident between instances with none.
fn keep_resident_mib() -> Option<usize> {
    std::env::var("BERTH_BENCH_KEEP_RESIDENT_MIB").ok().and_then(|v| v.parse().ok())
}

/// Attachment creates over HTTP not measured, per driver, before those measured.
const WARM_UP: usize = 10;

/// The hosts the attachment creates over HTTP come from, in turn: each is known to tgtd (its
/// accounts made) in the rounds not measured.
const HOSTS: usize = 4;
const _: () = assert!(HOSTS <= WARM_UP);

/// `BERTH_BENCH_CREATES`: attachment creates measured per driver over HTTP (default 200).
fn creates_measured() -> usize {
    std::env::var("BERTH_BENCH_CREATES").ok().and_then(|v| v.parse().ok()).unwrap_or(200)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(run());
}

async fn run() {
    println!(
        "berth languages benchmark ({} build)",
        if cfg!(debug_assertions) { "debug" } else { "release" }
    );
    for (language, name, _) in DRIVERS {
        if std::env::var("BERTH_BENCH_ONLY").is_ok_and(|o| !o.contains(name)) {
            continue;
        }
        let wasm =
            std::fs::read(component(name)).unwrap_or_else(|e| panic!("{name}.wasm: {e} (build it first)"));
        let footprint = Footprint::of(&wasm).unwrap();
        let slot = footprint.max(Footprint::BASELINE);
        let load_spec = || granted_spec(name);

        let cache = tempfile::tempdir().unwrap();
        let mut options =
            RuntimeOptions { cache_dir: Some(cache.path().into()), slot, fuel: true, ..Default::default() };
        if let Some(mib) = keep_resident_mib() {
            options.keep_resident = mib << 20;
        }
        let started = Instant::now();
        Runtime::new(options.clone()).unwrap().load(load_spec()).await.unwrap();
        let first = started.elapsed();
        let mut cached = Vec::new();
        for _ in 0..5 {
            let runtime = Runtime::new(options.clone()).unwrap();
            let started = Instant::now();
            runtime.load(load_spec()).await.unwrap();
            cached.push(started.elapsed());
        }

        let runtime = Runtime::new(options.clone()).unwrap();
        let driver = runtime.load(load_spec()).await.unwrap();
        let request = Request::ValidateConnector(connector("iqn.1993-08.org.debian:01:bench"));
        let fuel = driver
            .invoke(&request, &CallOptions { fuel: Some(u64::MAX / 4), ..Default::default() })
            .await
            .stats
            .fuel
            .unwrap_or_default();
        let plain = CallOptions::default();
        for _ in 0..20 {
            driver.invoke(&request, &plain).await.result.unwrap();
        }
        let (mut calls, mut instantiations) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            let started = Instant::now();
            let outcome = driver.invoke(&request, &plain).await;
            calls.push(started.elapsed());
            outcome.result.unwrap();
            instantiations.push(outcome.stats.instantiation);
        }
        // The same call again in the instance an earlier call of its operation left.
        let mut again = Vec::new();
        for _ in 0..200 {
            let mut operation = driver.calls();
            operation.validate_connector(&connector("iqn.1993-08.org.debian:01:bench")).await.unwrap();
            let started = Instant::now();
            operation.validate_connector(&connector("iqn.1993-08.org.debian:01:bench")).await.unwrap();
            again.push(started.elapsed());
        }
        let again_fuel = {
            let mut operation = driver.calls().metered(u64::MAX / 4);
            operation.validate_connector(&connector("iqn.1993-08.org.debian:01:bench")).await.unwrap();
            operation.validate_connector(&connector("iqn.1993-08.org.debian:01:bench")).await.unwrap();
            operation.last_fuel().expect("the runtime meters fuel")
        };
        // An attach's and a detach's calls as `berth serve` makes them (each operation's calls in
        // one instance), on the in-memory target model: where an operation's time goes.
        let names = [
            "validate-connector",
            "create-export",
            "initialize-connection",
            "terminate-connection",
            "remove-export",
        ];
        let mut steps: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
        // Each call's fuel (its WebAssembly instructions), which unlike its time does not move
        // from run to run: the last round's.
        let mut call_fuel = vec![0u64; names.len()];
        let metered = u64::MAX / 4;
        // A volume of each driver's own (the stores' directory is shared, each store its backend's).
        let mut volume =
            berth_tests::drivers::volume(&format!("11111111-2222-4333-8444-{:012}", wasm.len()), &[]);
        driver.calls().create_volume(&volume).await.unwrap();
        for i in 0..60 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            let initiator = connector(&format!("iqn.1993-08.org.debian:01:step{i}"));
            let mut timed = Vec::new();
            let mut used = Vec::new();
            let mut attach = driver.calls().for_owner("bench").metered(metered);
            let t = Instant::now();
            attach.validate_connector(&initiator).await.unwrap();
            timed.push(t.elapsed());
            used.push(attach.last_fuel());
            let t = Instant::now();
            let update = attach.create_export(&volume, Some(&initiator)).await.unwrap();
            timed.push(t.elapsed());
            used.push(attach.last_fuel());
            apply(&mut volume, &update);
            let t = Instant::now();
            let connection = attach.initialize_connection(&volume, &initiator).await.unwrap();
            timed.push(t.elapsed());
            used.push(attach.last_fuel());
            apply(&mut volume, &connection.update);
            drop(attach);
            tokio::time::sleep(Duration::from_millis(2)).await;
            let mut detach = driver.calls().for_owner("bench").metered(metered);
            let t = Instant::now();
            let ended = detach.terminate_connection(&volume, Some(&initiator), &[]).await.unwrap();
            timed.push(t.elapsed());
            used.push(detach.last_fuel());
            apply(&mut volume, &ended.update);
            let t = Instant::now();
            let update = detach.remove_export(&volume).await.unwrap();
            timed.push(t.elapsed());
            used.push(detach.last_fuel());
            apply(&mut volume, &update);
            for (slot, used) in call_fuel.iter_mut().zip(used) {
                *slot = used.expect("the runtime meters fuel");
            }
            if i >= 10 {
                for (step, took) in steps.iter_mut().zip(timed) {
                    step.push(took);
                }
            }
        }
        // The same attach and detach unmetered, many in a row, with the CPU of the whole
        // process (the instances' drops, which `DriverCalls` leaves to blocking threads, included).
        const PAIRS: u32 = 100;
        let cpu_before = own_cpu_time();
        let faults_before = own_minor_faults();
        let started = Instant::now();
        for i in 0..PAIRS {
            let initiator = connector(&format!("iqn.1993-08.org.debian:01:cpu{i}"));
            let mut attach = driver.calls().for_owner("bench");
            attach.validate_connector(&initiator).await.unwrap();
            let update = attach.create_export(&volume, Some(&initiator)).await.unwrap();
            apply(&mut volume, &update);
            let connection = attach.initialize_connection(&volume, &initiator).await.unwrap();
            apply(&mut volume, &connection.update);
            drop(attach);
            let mut detach = driver.calls().for_owner("bench");
            let ended = detach.terminate_connection(&volume, Some(&initiator), &[]).await.unwrap();
            apply(&mut volume, &ended.update);
            let update = detach.remove_export(&volume).await.unwrap();
            apply(&mut volume, &update);
        }
        let wall = started.elapsed();
        tokio::time::sleep(Duration::from_millis(50)).await; // the last drops
        let cpu = own_cpu_time() - cpu_before;
        let faults = own_minor_faults() - faults_before;

        let breakdown: Vec<String> = names
            .iter()
            .zip(&mut steps)
            .map(|(name, took)| format!("{name} {}", human(Summary::of(took).p50)))
            .collect();

        let call = Summary::of(&mut calls);
        let instantiation = Summary::of(&mut instantiations);
        println!(
            "{language:<10} {name:<9} {:>6.1} MB, {footprint}; first compile {}, cached load p50 {}; \
             one call (validate-connector, fresh instance) p50 {} p99 {} (instantiation p50 {}), {:.1}M fuel; \
             the next call in the operation's instance p50 {}, {:.2}M fuel",
            wasm.len() as f64 / 1e6,
            human(first),
            human(Summary::of(&mut cached).p50),
            human(call.p50),
            human(call.p99),
            human(instantiation.p50),
            fuel as f64 / 1e6,
            human(Summary::of(&mut again).p50),
            again_fuel as f64 / 1e6,
        );
        println!("{language:<10} {name:<9} an attach's and a detach's calls (p50): {}", breakdown.join(", "));
        let call_fuel: Vec<String> = names
            .iter()
            .zip(&call_fuel)
            .map(|(name, used)| format!("{name} {:.3}M", *used as f64 / 1e6))
            .collect();
        println!("{language:<10} {name:<9} the same calls' fuel (instructions): {}", call_fuel.join(", "));
        println!(
            "{language:<10} {name:<9} {PAIRS} attaches and detaches in a row, unmetered: {} each, CPU {} each, {} page faults each (the process's, instances' drops included)",
            human(wall / PAIRS),
            human(cpu / PAIRS),
            faults / u64::from(PAIRS),
        );
    }

    if std::env::var("BERTH_BENCH_ONLY").is_ok() {
        return; // the drivers it names, on the in-memory model only
    }
    // The three in one server: an attachment create with a connector (validate-connector,
    // create-export, initialize-connection) and its delete (terminate-connection, remove-export).
    // SAFETY: set before any thread that reads the environment is started by this benchmark.
    unsafe { std::env::set_var("BERTH_TEST_SERVER_LOG", "info") };
    let tgtd = TgtdProcess::start();
    let mut config = tgtd.config();
    for (_, name, backend) in DRIVERS {
        config.push_str(&format!(
            "[[backends]]\nname = \"{backend}\"\nwasm = \"{}\"\ngrants = [\"iscsi-target\", \"backing-store\"]\n\
             [[volume_types]]\nname = \"{backend}\"\nbackend = \"{backend}\"\n",
            component(name).display()
        ));
    }
    if let Some(mib) = keep_resident_mib() {
        // The body follows the `[runtime]` table `BerthProcess` opens.
        config.insert_str(0, &format!("keep_resident_mib = {mib}\n"));
    }
    let berth = BerthProcess::start(&config);
    let c = Client::for_base(&berth.base, "bench").at("3.54");
    let mut rust_p50 = Duration::ZERO;
    // All three do the same work: an account per initiator, made by the host, bound at each
    // initialize-connection.
    let servers = DRIVERS;
    let mut volumes = Vec::new();
    for (_, _, backend) in &servers {
        volumes.push(c.create_volume(json!({"size": 1, "volume_type": backend})).await);
    }
    // The drivers in turn, one create and delete each per round, so that what the machine does
    // meanwhile (its disk, the other tenants of a VM) weighs on all of them alike.
    let measured = creates_measured();
    let mut times = vec![(Vec::new(), Vec::new()); servers.len()];
    for i in 0..WARM_UP + measured {
        // A few hosts, known to tgtd from the rounds not measured: each create binds the host's
        // account for its backend (as a host that has attached before does). A new host each
        // round made three accounts a round (one per backend), and tgtd finds a new account's id
        // by a walk quadratic in the accounts it holds: a cost in every driver's create that grew
        // through the run (about 10 ms at 2,400 accounts) and pulled every ratio towards 1.
        let initiator = format!("iqn.1993-08.org.debian:01:bench{}", i % HOSTS);
        for (volume, (creates, deletes)) in volumes.iter().zip(&mut times) {
            let started = Instant::now();
            let r = c.attach(volume, Some(api_connector(&initiator, "bench"))).await.expect(200);
            let created = started.elapsed();
            let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
            let started = Instant::now();
            c.delete(&format!("/attachments/{id}")).await.expect(200);
            if i >= WARM_UP {
                creates.push(created);
                deletes.push(started.elapsed());
            }
        }
    }
    for ((language, name, backend), (mut creates, mut deletes)) in servers.into_iter().zip(times) {
        let create = Summary::of(&mut creates);
        if backend == "tgt" {
            rust_p50 = create.p50;
        }
        println!(
            "{language:<10} {name:<9} attachment create p50 {} p99 {} ({:.2}x Rust, delete p50 {}, n={})",
            human(create.p50),
            human(create.p99),
            create.p50.as_secs_f64() / rust_p50.as_secs_f64(),
            human(Summary::of(&mut deletes).p50),
            create.n
        );
    }
}

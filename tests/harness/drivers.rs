//! Loading driver components (shipped drivers and test fixtures) into a runtime.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use berth::capabilities::{DriverCapabilities, Grant};
use berth::runtime::contract::Volume;
use berth::runtime::{Driver, DriverSpec, Limits, LoadError, Runtime, RuntimeOptions, WasmSource};

/// A component built by `host/build.rs`: `tgt-iscsi`, `fake`, `misbehaving`, `sneaky`, ...
pub fn component(name: &str) -> PathBuf {
    PathBuf::from(berth::shipped::BUILD_DIR).join(format!("{name}.wasm"))
}

/// A runtime whose compiled artifacts are cached under `target/`, shared by every test.
pub fn runtime() -> Runtime {
    Runtime::new(RuntimeOptions { cache_dir: Some(shared_cache()), ..Default::default() }).expect("runtime")
}

pub fn shared_cache() -> PathBuf {
    PathBuf::from(berth::shipped::BUILD_DIR).join("../test-artifact-cache")
}

/// A spec for a component with no grants and default limits.
pub fn spec(name: &str) -> DriverSpec {
    DriverSpec {
        backend: name.to_string(),
        wasm: WasmSource::File(component(name)),
        grants: BTreeSet::new(),
        limits: Limits::default(),
        capabilities: DriverCapabilities::default(),
    }
}

pub fn with_settings(mut spec: DriverSpec, settings: &[(&str, &str)]) -> DriverSpec {
    let map: BTreeMap<String, String> =
        settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    spec.capabilities.settings = Arc::new(map);
    spec
}

pub fn with_grants(mut spec: DriverSpec, grants: &[Grant]) -> DriverSpec {
    spec.grants = grants.iter().copied().collect();
    spec
}

pub async fn load(spec: DriverSpec) -> Result<Driver, LoadError> {
    runtime().load(spec).await
}

/// What a call awaits before a change that outlives the power (`DriverCalls::before_lasting`), as
/// the tests give it: one that counts how often it was awaited, and one that refuses.
pub fn counting_before_lasting()
-> (berth::runtime::BeforeLasting, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let waits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = waits.clone();
    let before = berth::runtime::BeforeLasting::new(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    });
    (before, waits)
}

pub fn refusing_before_lasting(why: &'static str) -> berth::runtime::BeforeLasting {
    berth::runtime::BeforeLasting::new(move || Box::pin(async move { Err(why.to_string()) }))
}

/// A volume record as the host would pass it.
pub fn volume(id: &str, metadata: &[(&str, &str)]) -> Volume {
    Volume {
        id: id.to_string(),
        name: format!("volume-{id}"),
        size_gib: 1,
        multiattach: false,
        provider_location: None,
        provider_auth: None,
        provider_id: None,
        driver_data: Vec::new(),
        metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    }
}

/// A connector with just an initiator.
pub fn connector(initiator: &str) -> berth::runtime::contract::Connector {
    let json = serde_json::json!({ "initiator": initiator, "host": "bench-host" });
    berth::runtime::json::connector_from_json(
        json.as_object().unwrap(),
        berth::runtime::contract::AccessMode::Rw,
    )
    .unwrap()
}

/// A spec for a component with every grant, backed by an in-memory target model and backing
/// stores in a temporary directory (kept for the life of the process).
pub fn granted_spec(name: &str) -> DriverSpec {
    use berth::capabilities::backing::BackingStores;
    use berth::capabilities::iscsi::model::TargetModel;
    use berth::capabilities::iscsi::{IscsiCapability, Portal};
    use berth::capabilities::namespace::Namespace;
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    let namespace = Namespace::new(name, &Default::default()).unwrap();
    let stores = Arc::new(
        BackingStores::new(dir.path().join("volumes"), &namespace, std::time::Duration::from_secs(10))
            .unwrap(),
    );
    let mut spec = with_grants(spec(name), &Grant::ALL);
    spec.capabilities.settings = Arc::new(namespace.settings(&spec.capabilities.settings));
    spec.capabilities.backing = Some(stores.clone());
    spec.capabilities.iscsi = Some(IscsiCapability {
        service: Arc::new(TargetModel::new()),
        portals: vec![Portal { address: "127.0.0.1".into(), port: 3260 }],
        chap: Default::default(),
        stores,
        namespace,
        initiator_key: berth::capabilities::iscsi::initiators::InitiatorKey::random(),
    });
    spec
}

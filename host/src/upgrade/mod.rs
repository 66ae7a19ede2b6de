//! Driver upgrades while serving (`berth driver upgrade <backend> <new.wasm>`): a new driver is
//! inspected, checked by the conformance suite against the backend's configuration, and only
//! then switched in, between operations: an operation keeps the driver it started with
//! (`runtime/slot.rs`), so no request fails or waits because of the switch. For a window after
//! the switch the new driver's outcomes are compared with the old one's ([`Watch`]); past the
//! configured margins it is switched back on its own, and says so. `berth driver rollback`
//! does it by hand.
//!
//! An upgrade outlives a restart: the component is kept in the data directory
//! (`drivers/<backend>/<sha256>.wasm`) with a record of which configured driver it replaced
//! (`drivers/<backend>/running.json`); at start the node runs it again as long as the
//! configuration still names that driver. A configuration that names another driver wins (the
//! operator upgraded by hand).

mod check;
mod error;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value as Json, json};

use crate::attach::Service;
use crate::conformance::VendorConfig;
use crate::runtime::inspect::Inspection;
use crate::runtime::slot::{DriverSlot, Running, Watch};
use crate::runtime::{Driver, DriverSpec, Runtime, WasmSource};
pub use error::UpgradeError;

/// How a backend's driver is loaded again: everything but the component.
#[derive(Clone)]
pub struct Loadable {
    pub spec: DriverSpec,
    /// The backend's configuration as the conformance suite takes it.
    pub vendor: VendorConfig,
    pub shared: bool,
    /// Volume types of this backend are multiattach: its driver must keep supporting it.
    pub multiattach: bool,
}

/// What was last decided for a backend's driver, for the listing.
#[derive(Debug, Clone, Serialize)]
struct LastChange {
    #[serde(rename = "at_us")]
    at: i64,
    what: String,
}

/// The upgrades of this node's backends.
pub struct Upgrades {
    runtime: Runtime,
    /// `<data>/drivers`.
    dir: PathBuf,
    cache_dir: Option<PathBuf>,
    backends: BTreeMap<String, Loadable>,
    watch: Watch,
    /// One upgrade or rollback at a time.
    busy: tokio::sync::Mutex<()>,
    last: Mutex<BTreeMap<String, LastChange>>,
    /// The watch under way, per backend: the digest it watches and until when (Unix
    /// microseconds).
    watching: Mutex<BTreeMap<String, (String, i64)>>,
}

/// What the data directory says a backend runs instead of its configured driver.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct RunningRecord {
    /// The digest of the configured driver this one replaced.
    configured: String,
    /// The digest of the driver the backend runs.
    running: String,
}

/// What an upgrade did.
#[derive(Debug, Clone, Serialize)]
pub struct Upgraded {
    pub backend: String,
    pub driver: Json,
    pub previous: Json,
    pub inspection: Json,
    pub conformance: Json,
    /// What the live check did on the real backend (`--live`), if asked.
    pub live: Option<Json>,
    /// Until when the new driver is watched (Unix microseconds), if it is.
    #[serde(rename = "watched_until_us")]
    pub watched_until: Option<i64>,
}

impl Upgrades {
    pub fn new(
        runtime: Runtime,
        data_dir: &Path,
        cache_dir: Option<PathBuf>,
        backends: BTreeMap<String, Loadable>,
        watch: Watch,
    ) -> Upgrades {
        Upgrades {
            runtime,
            dir: data_dir.join("drivers"),
            cache_dir,
            backends,
            watch,
            busy: Default::default(),
            last: Default::default(),
            watching: Default::default(),
        }
    }

    /// At start: switches each backend to the driver an upgrade left it running, if the
    /// configuration still names the driver that upgrade replaced.
    pub async fn resume(&self, service: &Service) {
        for name in self.backends.keys() {
            let Some(slot) = service.catalog().slot(name) else { continue };
            let path = self.dir.join(name).join("running.json");
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let Ok(record) = serde_json::from_str::<RunningRecord>(&text) else {
                tracing::warn!(backend = %name, "{} is not readable; running the configured driver", path.display());
                continue;
            };
            let configured = slot.current();
            if record.configured != configured.digest() {
                tracing::warn!(
                    backend = %name,
                    "the configuration names another driver ({}) than the one upgraded to {} replaced ({}): \
                     running the configured one",
                    configured.digest(), record.running, record.configured
                );
                let _ = std::fs::remove_file(&path);
                continue;
            }
            match self.load(name, &self.kept(name, &record.running)).await {
                Ok(driver) => {
                    slot.switch(driver, "upgraded");
                    tracing::info!(backend = %name, "running the driver it was upgraded to, sha256 {}", record.running);
                }
                Err(e) => tracing::error!(
                    backend = %name,
                    "cannot load the driver it was upgraded to (sha256 {}): {e}; running the configured one",
                    record.running
                ),
            }
        }
    }

    /// Every backend's driver, the one before it, the watch and the last decision.
    pub fn list(&self, service: &Service) -> Json {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let watching = self.watching.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let backends: Vec<Json> = self
            .backends
            .keys()
            .filter_map(|name| {
                let slot = service.catalog().slot(name)?;
                let (running, previous) = slot.running();
                let watch = watching
                    .get(name)
                    .filter(|(digest, _)| *digest == running.driver.digest())
                    .map(|(_, until)| json!({"until_us": until, "counts": counts(&running)}));
                Some(json!({
                    "backend": name,
                    "shared": self.backends[name].shared,
                    "driver": view(&running),
                    "previous": previous.as_ref().map(view),
                    "watch": watch,
                    "last_change": last.get(name),
                }))
            })
            .collect();
        json!({ "drivers": backends })
    }

    /// Inspects, checks and switches to the component at `wasm` for `backend`.
    pub async fn upgrade(
        self: &Arc<Self>,
        service: &Arc<Service>,
        backend: &str,
        wasm: &Path,
        live: bool,
    ) -> Result<Upgraded, UpgradeError> {
        let loadable = self.loadable(backend)?;
        let _busy = self.busy.try_lock().map_err(|_| UpgradeError::Busy(backend.to_string()))?;
        let slot =
            service.catalog().slot(backend).ok_or_else(|| UpgradeError::NotFound(backend.to_string()))?;
        let bytes = tokio::fs::read(wasm)
            .await
            .map_err(|e| UpgradeError::Invalid(format!("cannot read {}: {e}", wasm.display())))?;
        let current = slot.current();
        let checked = async {
            // 1. Inspect.
            let inspection = Inspection::of(&bytes).map_err(UpgradeError::Invalid)?;
            check::inspect(&inspection, &current, loadable, self.runtime.slot())?;
            // 2. Load it as the backend would, and check it with the conformance suite.
            let kept = self.keep(backend, &inspection.sha256, &bytes)?;
            let new = self.load(backend, &kept).await.map_err(UpgradeError::refused)?;
            check::compare(&new, &current, loadable)?;
            let report = check::conformance(&kept, &loadable.vendor, self.cache_dir.clone()).await?;
            let live = if live { Some(check::live(&new).await?) } else { None };
            Ok((inspection, new, report, live))
        };
        let (inspection, new, report, live) = match checked.await {
            Ok(checked) => checked,
            Err(e) => {
                if matches!(e, UpgradeError::Refused { .. } | UpgradeError::Invalid(_)) {
                    crate::metrics::driver_switch(backend, "refused");
                    tracing::warn!(backend = %backend, wasm = %wasm.display(), "driver upgrade refused: {e}");
                }
                return Err(e);
            }
        };

        // 3. Switch: new operations get the new driver; those in flight keep the old one.
        let replaced = slot.switch(new, "upgraded");
        let (running, _) = slot.running();
        self.switched(service, backend, slot, "upgraded", &replaced.driver, &running.driver, None).await;

        // 4. Watch it.
        let watched_until = self.watch_new(service, backend, &replaced, &running);
        Ok(Upgraded {
            backend: backend.to_string(),
            driver: view(&running),
            previous: view(&replaced),
            inspection: inspection.json(),
            conformance: report,
            live,
            watched_until,
        })
    }

    /// Whether `backend` is shared between nodes (an upgrade or rollback of it is every node's).
    pub fn is_shared(&self, backend: &str) -> bool {
        self.backends.get(backend).is_some_and(|b| b.shared)
    }

    /// Switches `backend` back to the driver it ran before; `why` is logged and listed. With
    /// `from`, only if it runs the driver of that digest now (`Ok(None)` when it does not: a
    /// rollback sent on by another node of a shared backend may find it done already).
    pub async fn rollback(
        &self,
        service: &Service,
        backend: &str,
        why: &str,
        from: Option<&str>,
    ) -> Result<Option<Json>, UpgradeError> {
        self.loadable(backend)?;
        let _busy = self.busy.lock().await;
        let slot =
            service.catalog().slot(backend).ok_or_else(|| UpgradeError::NotFound(backend.to_string()))?;
        if from.is_some_and(|d| d != slot.current().digest()) {
            return Ok(None);
        }
        let done = self
            .roll_back(service, backend, slot, from, why)
            .await
            .ok_or_else(|| UpgradeError::NothingToRollBackTo(backend.to_string()))?;
        Ok(Some(done))
    }

    async fn roll_back(
        &self,
        service: &Service,
        backend: &str,
        slot: &DriverSlot,
        only_if: Option<&str>,
        why: &str,
    ) -> Option<Json> {
        let (replaced, running) = slot.roll_back(only_if)?;
        self.switched(service, backend, slot, "rolled back", &replaced.driver, &running.driver, Some(why))
            .await;
        Some(json!({"backend": backend, "driver": view(&running), "previous": view(&replaced), "why": why}))
    }

    /// For each shared backend, as long as the service runs: when another node that serves it
    /// rolled back to the driver this node ran before, after this node switched, this node rolls
    /// back too (by hand or on its own, a rollback on one node is the cluster's), so the nodes of
    /// a shared backend run one driver.
    pub async fn follow(self: Arc<Self>, service: Arc<Service>) {
        let shared: Vec<String> =
            self.backends.iter().filter(|(_, b)| b.shared).map(|(n, _)| n.clone()).collect();
        if shared.is_empty() {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for backend in &shared {
                let Some(slot) = service.catalog().slot(backend) else { continue };
                let (running, Some(previous)) = slot.running() else { continue };
                let Ok(peers) = service.peers_serving(backend).await else { continue };
                let rolled_back = peers.iter().find(|p| {
                    p.runs.as_ref().is_some_and(|r| {
                        r.digest == previous.driver.digest()
                            && r.how.as_deref() == Some("rolled back")
                            && r.since.unwrap_or(0) > running.since
                    })
                });
                if let Some(peer) = rolled_back {
                    let _busy = self.busy.lock().await;
                    let why = format!("node {} of the shared backend rolled back", peer.node);
                    self.roll_back(&service, backend, slot, Some(running.driver.digest()), &why).await;
                }
            }
        }
    }

    /// After a switch from `replaced` to `running` (`how`: upgraded, rolled back, and why):
    /// counted, kept for a restart, logged (a rollback as an error), listed, and published to
    /// the other nodes.
    #[allow(clippy::too_many_arguments)]
    async fn switched(
        &self,
        service: &Service,
        backend: &str,
        slot: &DriverSlot,
        how: &str,
        replaced: &Driver,
        running: &Driver,
        why: Option<&str>,
    ) {
        crate::metrics::driver_switch(backend, how);
        self.remember(backend, slot, replaced);
        let what = format!(
            "{how} from {} (sha256 {}) to {} (sha256 {}){}",
            describe(replaced),
            replaced.digest(),
            describe(running),
            running.digest(),
            why.map(|w| format!(": {w}")).unwrap_or_default()
        );
        if why.is_some() {
            tracing::error!(backend = %backend, "driver {what}");
        } else {
            tracing::warn!(backend = %backend, "driver {what}");
        }
        self.note(backend, what);
        if let Err(e) = service.publish_drivers().await {
            tracing::warn!(backend = %backend, "could not record the switch in the nodes table: {e}");
        }
    }

    /// Starts the watch of `running`, which replaced `replaced`; returns until when it runs.
    fn watch_new(
        self: &Arc<Self>,
        service: &Arc<Service>,
        backend: &str,
        replaced: &Running,
        running: &Running,
    ) -> Option<i64> {
        if self.watch.window.is_zero() {
            return None;
        }
        let until = running.since + self.watch.window.as_micros() as i64;
        let digest = running.driver.digest().to_string();
        self.watching
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(backend.to_string(), (digest.clone(), until));
        let old = replaced.counts();
        let (me, service, backend, running) =
            (self.clone(), service.clone(), backend.to_string(), running.clone());
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + me.watch.window;
            while tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let Some(slot) = service.catalog().slot(&backend) else { return };
                if slot.current().digest() != digest {
                    return; // switched since, by hand
                }
                if let Some(why) = me.watch.verdict(old, running.counts()) {
                    let _busy = me.busy.lock().await;
                    me.roll_back(&service, &backend, slot, Some(&digest), &format!("automatically: {why}"))
                        .await;
                    return;
                }
            }
            me.note(&backend, format!("{} (sha256 {digest}) passed its watch", describe(&running.driver)));
        });
        Some(until)
    }

    fn loadable(&self, backend: &str) -> Result<&Loadable, UpgradeError> {
        self.backends.get(backend).ok_or_else(|| UpgradeError::NotFound(backend.to_string()))
    }

    async fn load(&self, backend: &str, path: &Path) -> Result<Driver, String> {
        let mut spec = self.loadable(backend).map_err(|e| e.to_string())?.spec.clone();
        spec.wasm = WasmSource::File(path.to_path_buf());
        self.runtime.load(spec).await.map_err(|e| e.to_string())
    }

    /// Where a backend's upgraded component with `digest` is kept.
    fn kept(&self, backend: &str, digest: &str) -> PathBuf {
        self.dir.join(backend).join(format!("{digest}.wasm"))
    }

    /// Keeps a component in the data directory (readable by Berth only).
    fn keep(&self, backend: &str, digest: &str, bytes: &[u8]) -> Result<PathBuf, UpgradeError> {
        let path = self.kept(backend, digest);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(path.parent().expect("a file in a directory"))?;
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, bytes)?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
            }
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            UpgradeError::Internal(format!("cannot keep the component at {}: {e}", path.display()))
        })?;
        Ok(path)
    }

    /// Records in the data directory what the backend runs now, so a restart runs it again.
    fn remember(&self, backend: &str, slot: &DriverSlot, replaced: &Driver) {
        let path = self.dir.join(backend).join("running.json");
        let record_path = |configured: &str, running: &Driver| -> std::io::Result<()> {
            if running.digest() == configured {
                return match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                };
            }
            let record =
                RunningRecord { configured: configured.to_string(), running: running.digest().to_string() };
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(&record).expect("serialises"))?;
            std::fs::rename(&tmp, &path)
        };
        // The configured driver: the one the record already names, or the replaced one when the
        // backend ran its configured driver until now.
        let configured = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<RunningRecord>(&t).ok())
            .map_or_else(|| replaced.digest().to_string(), |r| r.configured);
        if let Err(e) = record_path(&configured, &slot.current()) {
            tracing::warn!(backend = %backend, "cannot record the running driver at {}: {e}", path.display());
        }
    }

    fn note(&self, backend: &str, what: String) {
        let at = crate::store::now_micros();
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(backend.to_string(), LastChange { at, what });
    }
}

fn describe(driver: &Driver) -> String {
    format!("{} {}", driver.info().name, driver.info().version)
}

fn counts(running: &Running) -> Json {
    let c = running.counts();
    json!({"calls": c.calls, "failures": c.failures, "mean_ms": if c.calls == 0 { 0.0 } else { c.wall_micros as f64 / c.calls as f64 / 1000.0 }})
}

/// A running driver, as the API shows it.
fn view(running: &Running) -> Json {
    let d = &running.driver;
    json!({
        "name": d.info().name,
        "version": d.info().version,
        "sha256": d.digest(),
        "contract": d.contract().name(),
        "since_us": running.since,
        "how": running.how,
        "counts": counts(running),
    })
}

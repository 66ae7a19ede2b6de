//! Loading a driver: read the `.wasm`, check every import against the operator's grants (before
//! anything is instantiated), compile or load from the cache, check the contract version, and
//! ask the driver who it is.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::bindings::{latest, v0_1, v0_2};
use super::cache::{Provenance, digest};
use super::driver::{Driver, Parts, Pre};
use super::error::LoadError;
use super::limits::Limits;
use super::version::{CONTRACTS, ContractVersion};
use super::{Footprint, LoadedComponent, Runtime};
use crate::capabilities::{DriverCapabilities, Grant};

/// Where a driver's component comes from.
#[derive(Debug, Clone)]
pub enum WasmSource {
    File(PathBuf),
    /// A shipped driver embedded in the `berth` binary.
    Embedded {
        name: &'static str,
        bytes: &'static [u8],
    },
}

impl WasmSource {
    /// The pool resources one instance of this component needs (reads the file).
    pub fn footprint(&self) -> Result<Footprint, String> {
        match self {
            WasmSource::File(path) => {
                let bytes =
                    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                Footprint::of(&bytes).map_err(|e| format!("{}: {e}", path.display()))
            }
            WasmSource::Embedded { name, bytes } => Footprint::of(bytes).map_err(|e| format!("{name}: {e}")),
        }
    }
}

/// Everything needed to load one driver for one backend.
#[derive(Clone)]
pub struct DriverSpec {
    /// The backend name (used in errors and logs).
    pub backend: String,
    pub wasm: WasmSource,
    pub grants: BTreeSet<Grant>,
    pub limits: Limits,
    pub capabilities: DriverCapabilities,
}

/// WASI interfaces a language runtime needs to start; the context behind them is empty (no
/// environment, no arguments, empty stdin, captured stdout/stderr).
const WASI_BASELINE: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:clocks/monotonic-clock",
    "wasi:clocks/wall-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
];

/// Why one import is or is not admitted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ImportVerdict {
    Allowed,
    /// Admitted with this grant, for drivers of contract `since` or later.
    NeedsGrant(Grant),
    Forbidden(String),
}

/// The import policy, as a pure function of the import's name. The capabilities' interfaces come
/// from their one table (`capabilities::CAPABILITIES`).
pub(crate) fn judge_import(name: &str) -> ImportVerdict {
    let (interface, version) = name.split_once('@').unwrap_or((name, ""));
    if interface.starts_with("berth:driver/") {
        let Some(contract) = ContractVersion::of(version) else {
            return ImportVerdict::Forbidden(format!(
                "this host implements {}; the driver was built for version {version}",
                ContractVersion::supported()
            ));
        };
        if let Some(grant) = Grant::admitting(interface) {
            return ImportVerdict::NeedsGrant(grant);
        }
        return match interface {
            "berth:driver/types" | "berth:driver/log" | "berth:driver/config" => ImportVerdict::Allowed,
            _ => ImportVerdict::Forbidden(format!("{interface} is not part of {contract}")),
        };
    }
    // Capabilities in packages of their own beside the contract, each at its version.
    for package in ["berth:cephx", "berth:iscsi-chap"] {
        if interface.starts_with(&format!("{package}/")) {
            return match Grant::admitting(interface) {
                Some(grant) if version.starts_with("0.1.") => ImportVerdict::NeedsGrant(grant),
                Some(_) => {
                    ImportVerdict::Forbidden(format!("this host implements {package}@0.1, not {version}"))
                }
                None => ImportVerdict::Forbidden(format!("{interface} is not part of {package}@0.1.0")),
            };
        }
    }
    if let Some(grant) = Grant::admitting(interface) {
        return if version.starts_with("0.2.") {
            ImportVerdict::NeedsGrant(grant)
        } else {
            ImportVerdict::Forbidden(format!("only WASI 0.2 is supported, not {version}"))
        };
    }
    if WASI_BASELINE.contains(&interface) {
        return if version.starts_with("0.2.") {
            ImportVerdict::Allowed
        } else {
            ImportVerdict::Forbidden(format!("only WASI 0.2 is supported, not {version}"))
        };
    }
    if interface.starts_with("wasi:filesystem/") {
        return ImportVerdict::Forbidden(
            "drivers never get filesystem access (the backing-store capability provides volume storage)"
                .into(),
        );
    }
    if interface.starts_with("wasi:sockets/") {
        return ImportVerdict::Forbidden(
            "drivers never get sockets (the network capability sends HTTP requests, through wasi:http, to the \
             backend's allowed hosts)"
                .into(),
        );
    }
    if interface.starts_with("wasi:http/") {
        return ImportVerdict::Forbidden(
            "a driver may import only wasi:http's outgoing-handler and types (with the network grant)".into(),
        );
    }
    ImportVerdict::Forbidden("the host does not provide it to drivers".into())
}

impl Runtime {
    /// Reads, hashes and compiles (or loads from the artifact cache) a driver's component.
    async fn compile(&self, spec: &DriverSpec, backend: &str) -> Result<LoadedComponent, LoadError> {
        let bytes: std::borrow::Cow<'static, [u8]> = match &spec.wasm {
            WasmSource::File(path) => tokio::fs::read(path)
                .await
                .map_err(|e| LoadError::Read {
                    driver: backend.to_string(),
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?
                .into(),
            WasmSource::Embedded { bytes, .. } => (*bytes).into(),
        };
        let digest = digest(&bytes);
        let footprint = Footprint::of(&bytes)
            .map_err(|message| LoadError::Compile { driver: backend.to_string(), message })?;
        if !footprint.fits(self.slot) {
            return Err(LoadError::TooLarge {
                driver: backend.to_string(),
                needs: footprint,
                slot: self.slot,
            });
        }
        let engine = self.engine.clone();
        let cache = self.cache.clone();
        let key = digest.clone();
        let (component, provenance) = tokio::task::spawn_blocking(move || match cache {
            Some(cache) => cache.load(&engine, &bytes, &key),
            None => wasmtime::component::Component::new(&engine, &bytes).map(|c| (c, Provenance::Compiled)),
        })
        .await
        .map_err(|e| LoadError::Engine(e.to_string()))?
        .map_err(|e| LoadError::Compile {
            driver: backend.to_string(),
            message: format!("not a valid WebAssembly component: {e:#}"),
        })?;
        Ok((digest, component, provenance, footprint))
    }

    /// Loads a driver. Refuses it, naming the import, if it imports anything not granted.
    pub async fn load(&self, spec: DriverSpec) -> Result<Driver, LoadError> {
        let backend = spec.backend.clone();
        spec.limits.validate().map_err(|message| LoadError::Contract { driver: backend.clone(), message })?;
        let (label, key) = match &spec.wasm {
            WasmSource::File(path) => {
                let meta = tokio::fs::metadata(path).await.map_err(|e| LoadError::Read {
                    driver: backend.clone(),
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?;
                let key = format!("{}:{}:{:?}", path.display(), meta.len(), meta.modified().ok());
                (path.display().to_string(), key)
            }
            WasmSource::Embedded { name, .. } => (format!("(embedded {name})"), format!("(embedded {name})")),
        };
        // A component loaded before (same file, same size and time) is not read, hashed or
        // deserialised again: the conformance suite loads its driver once per check.
        let known = self.loaded.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let (digest, component, provenance, _footprint) = match known {
            Some(hit) => hit,
            None => {
                let hit = self.compile(&spec, &backend).await?;
                self.loaded.lock().unwrap_or_else(|p| p.into_inner()).insert(key, hit.clone());
                hit
            }
        };
        let engine = self.engine.clone();
        tracing::debug!(driver = %backend, source = %label, ?provenance, "component ready");

        for (name, _) in component.component_type().imports(&engine) {
            match judge_import(name) {
                ImportVerdict::Allowed => {}
                ImportVerdict::NeedsGrant(grant)
                    if spec.grants.contains(&grant) && spec.capabilities.granted(grant) => {}
                ImportVerdict::NeedsGrant(grant) => {
                    return Err(LoadError::NotGranted {
                        driver: backend,
                        import: name.to_string(),
                        grant: grant.name().to_string(),
                    });
                }
                ImportVerdict::Forbidden(reason) => {
                    return Err(LoadError::Forbidden { driver: backend, import: name.to_string(), reason });
                }
            }
        }
        let contract = CONTRACTS
            .iter()
            .copied()
            .find(|c| component.get_export_index(None, c.export()).is_some())
            .ok_or_else(|| {
                let exports: Vec<String> =
                    component.component_type().exports(&engine).map(|(n, _)| n.to_string()).collect();
                LoadError::Contract {
                    driver: backend.clone(),
                    message: format!(
                        "it exports none of {} (it exports {exports:?}); this host implements {}",
                        CONTRACTS.iter().map(|c| c.export()).collect::<Vec<_>>().join(", "),
                        ContractVersion::supported()
                    ),
                }
            })?;
        // One driver, one contract version: its imports must be of the version it exports.
        for (name, _) in component.component_type().imports(&engine) {
            if let Some(("berth:driver", rest)) = name.split_once('/')
                && let Some((_, version)) = rest.split_once('@')
                && ContractVersion::of(version) != Some(contract)
            {
                return Err(LoadError::Contract {
                    driver: backend,
                    message: format!(
                        "it exports {} but imports {name}: a driver is built for one contract version",
                        contract.export()
                    ),
                });
            }
        }
        // A capability exists from a contract version on: an older driver that imports it anyway
        // (by hand) is refused.
        for (name, _) in component.component_type().imports(&engine) {
            let interface = name.split_once('@').map_or(name, |(i, _)| i);
            if let Some(grant) = Grant::admitting(interface)
                && contract.minor() < grant.spec().since
            {
                return Err(LoadError::Contract {
                    driver: backend,
                    message: format!(
                        "it imports {name}, which the {} grant gives only to drivers built for berth:driver@{}.{}.0 \
                         or later; it was built for {contract}",
                        grant.name(),
                        grant.spec().since.0,
                        grant.spec().since.1
                    ),
                });
            }
        }
        let instantiate =
            |e: wasmtime::Error| LoadError::Contract { driver: backend.clone(), message: format!("{e:#}") };
        let pre = match contract {
            ContractVersion::V0_3 => Pre::Latest(
                self.linker
                    .instantiate_pre(&component)
                    .and_then(latest::StorageDriverPre::new)
                    .map_err(instantiate)?,
            ),
            ContractVersion::V0_2 => Pre::V0_2(
                self.linker
                    .instantiate_pre(&component)
                    .and_then(v0_2::StorageDriverPre::new)
                    .map_err(instantiate)?,
            ),
            ContractVersion::V0_1 => Pre::V0_1(
                self.linker
                    .instantiate_pre(&component)
                    .and_then(v0_1::StorageDriverPre::new)
                    .map_err(instantiate)?,
            ),
        };
        let capabilities = DriverCapabilities {
            iscsi: spec.capabilities.iscsi.filter(|_| spec.grants.contains(&Grant::IscsiTarget)),
            backing: spec.capabilities.backing.filter(|_| spec.grants.contains(&Grant::BackingStore)),
            network: spec.capabilities.network.filter(|_| spec.grants.contains(&Grant::Network)),
            cephx: spec.capabilities.cephx.filter(|_| spec.grants.contains(&Grant::Cephx)),
            settings: spec.capabilities.settings,
        };
        let driver = Driver::prepare(Parts {
            backend: backend.clone(),
            digest,
            provenance,
            engine,
            component,
            pre,
            limits: spec.limits,
            caps: capabilities,
            fuel_enabled: self.fuel,
            slots: self.slots.clone(),
            keeping: self.keeping.clone(),
        })
        .await
        .map_err(|error| LoadError::Info { driver: backend.clone(), error: Box::new(error) })?;
        check_info(&driver).map_err(|message| LoadError::Contract { driver: backend.clone(), message })?;
        tracing::info!(
            backend = %backend, driver = %driver.info().name, version = %driver.info().version,
            source = %label, ?provenance, "driver loaded"
        );
        Ok(driver)
    }
}

fn check_info(driver: &Driver) -> Result<(), String> {
    let info = driver.info();
    for (field, value, max) in [
        ("name", &info.name, 64),
        ("version", &info.version, 64),
        ("vendor", &info.vendor, 128),
        ("description", &info.description, 1024),
    ] {
        if value.len() > max || value.chars().any(char::is_control) {
            return Err(format!("info().{field} must be at most {max} bytes without control characters"));
        }
    }
    if info.name.is_empty() || info.version.is_empty() {
        return Err("info().name and info().version must not be empty".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_import_policy_admits_the_baseline_and_grants_only() {
        assert_eq!(judge_import("wasi:cli/stdout@0.2.6"), ImportVerdict::Allowed);
        assert_eq!(judge_import("berth:driver/log@0.1.0"), ImportVerdict::Allowed);
        assert_eq!(judge_import("berth:driver/log@0.2.0"), ImportVerdict::Allowed);
        assert_eq!(
            judge_import("berth:driver/iscsi-target@0.2.0"),
            ImportVerdict::NeedsGrant(Grant::IscsiTarget)
        );
        assert_eq!(
            judge_import("berth:driver/iscsi-target@0.1.3"),
            ImportVerdict::NeedsGrant(Grant::IscsiTarget)
        );
        assert_eq!(
            judge_import("berth:driver/backing-store@0.1.0"),
            ImportVerdict::NeedsGrant(Grant::BackingStore)
        );
        assert_eq!(judge_import("berth:driver/log@0.3.0"), ImportVerdict::Allowed);
        for http in ["wasi:http/outgoing-handler@0.2.12", "wasi:http/types@0.2.6"] {
            assert_eq!(judge_import(http), ImportVerdict::NeedsGrant(Grant::Network), "{http}");
        }
        assert_eq!(judge_import("berth:cephx/identities@0.1.0"), ImportVerdict::NeedsGrant(Grant::Cephx));
        // A language runtime's filesystem and sockets: only with the grant that gives nothing.
        for inert in [
            "wasi:filesystem/types@0.2.6",
            "wasi:filesystem/preopens@0.2.6",
            "wasi:sockets/tcp@0.2.6",
            "wasi:sockets/ip-name-lookup@0.2.6",
        ] {
            assert_eq!(judge_import(inert), ImportVerdict::NeedsGrant(Grant::InertWasi), "{inert}");
        }
        for refused in [
            "wasi:filesystem/types@0.3.0",
            "wasi:http/incoming-handler@0.2.6",
            "wasi:http/outgoing-handler@0.3.0",
            "berth:driver/log@0.4.0",
            "berth:driver/secret-stuff@0.1.0",
            "berth:cephx/identities@0.2.0",
            "berth:cephx/keys@0.1.0",
            "berth:driver/identities@0.3.0",
            "acme:evil/backdoor@1.0.0",
        ] {
            assert!(matches!(judge_import(refused), ImportVerdict::Forbidden(_)), "{refused}");
        }
    }
}

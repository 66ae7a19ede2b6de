//! The driver conformance suite: `berth conformance <driver.wasm>`. A library inside the host, so
//! the suite and the service share one runtime: what passes here runs the same way in
//! `berth serve`.
//!
//! - `checks/`: the checks, named like the specification, one file per topic and one table of
//!   them (`checks/mod.rs`);
//! - `env.rs`: each check's fresh environment (the driver, a target service, backing stores), and
//!   metering (fuel, peak memory, capability calls);
//! - `target.rs`: the target service: an in-memory model of tgtd, or a real tgtd on loopback;
//! - `report.rs`: console lines, JUnit XML and JSON.

pub mod checks;
pub mod env;
pub mod report;
pub mod target;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;

use crate::capabilities::Grant;
use crate::runtime::contract::ContractVersion;
use crate::runtime::{Footprint, Limits, Runtime, RuntimeOptions, WasmSource};
use checks::{CHECKS, Id, Need};
use env::{Env, Measure, Shared};
use report::{CheckReport, Report, Status};
pub use target::TargetMode;

/// The vendor's configuration of the driver under test (`--config FILE`, TOML).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VendorConfig {
    /// The driver's settings, as a backend's `settings` table.
    pub settings: BTreeMap<String, String>,
    /// The capabilities granted (default: all).
    pub grants: BTreeSet<Grant>,
    /// Per-call limits (as a backend's `limits`).
    pub limits: Limits,
    /// Fuel (roughly, WebAssembly instructions) one call may use.
    pub fuel_per_call: u64,
    /// For a driver granted the network: its allowed hosts, TLS, bounds and credentials, as a
    /// backend's `[backends.network]` table.
    pub network: Option<crate::capabilities::network::NetworkConfig>,
    /// For a driver granted `cephx`: how the host reaches the cluster to make identities, as a
    /// backend's `[backends.cephx]` table.
    pub cephx: Option<crate::capabilities::cephx::CephxConfig>,
    /// The backend extends attached volumes (a backend's `online_extend`): `extend-volume` is
    /// also checked on a volume that is exported and connected.
    pub online_extend: bool,
}

impl Default for VendorConfig {
    fn default() -> Self {
        VendorConfig {
            settings: BTreeMap::new(),
            grants: Grant::ALL.into_iter().collect(),
            limits: Limits::default(),
            fuel_per_call: 2_000_000_000,
            network: None,
            cephx: None,
            online_extend: false,
        }
    }
}

impl VendorConfig {
    pub fn load(path: &Path) -> Result<VendorConfig, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let config: VendorConfig = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        config.limits.validate()?;
        Ok(config)
    }
}

/// The backend name a driver under test runs as (its log lines and metrics say so).
const BACKEND_NAME: &str = "conformance";

/// A run's options.
#[derive(Debug, Clone)]
pub struct Options {
    pub wasm: PathBuf,
    pub config: VendorConfig,
    pub target: TargetMode,
    /// Only checks whose name matches.
    pub focus: Option<regex::Regex>,
    /// Not the checks whose name matches.
    pub skip: Option<regex::Regex>,
    /// Run every check this many times; it passes only if every run does.
    pub repeat: u32,
    /// The compiled-driver cache.
    pub cache_dir: Option<PathBuf>,
}

/// The names of every check, in order.
pub fn check_names() -> Vec<&'static str> {
    CHECKS.iter().map(|c| c.name).collect()
}

/// Runs the suite; `on_check` sees each check's report as soon as it is done.
pub async fn run(options: Options, mut on_check: impl FnMut(&CheckReport)) -> Result<Report, String> {
    let started = Instant::now();
    // Slots sized by the driver under test (an unreadable or invalid file is reported by the
    // load check).
    let slot = WasmSource::File(options.wasm.clone()).footprint().unwrap_or(Footprint::BASELINE);
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: options.cache_dir.clone(),
        fuel: true,
        max_concurrent_calls: 4,
        slot,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let work = tempfile::Builder::new().prefix("berth-conformance-").tempdir().map_err(|e| e.to_string())?;
    let daemon = match options.target {
        TargetMode::Model => None,
        TargetMode::Tgtd => Some(Arc::new(target::Daemon::start(work.path()).await?)),
    };
    let selected: Vec<_> = CHECKS
        .iter()
        .filter(|c| options.focus.as_ref().is_none_or(|re| re.is_match(c.name)))
        .filter(|c| options.skip.as_ref().is_none_or(|re| !re.is_match(c.name)))
        .collect();
    let network = match &options.config.network {
        Some(n) if options.config.grants.contains(&Grant::Network) => {
            Some(Arc::new(crate::capabilities::network::NetworkCapability::new(BACKEND_NAME, n)?))
        }
        _ => None,
    };
    let cephx = match options.config.grants.contains(&Grant::Cephx) {
        true => {
            let pool = options.config.settings.get("pool").map_or("volumes", String::as_str);
            Some(Arc::new(crate::capabilities::cephx::CephxCapability::new(
                BACKEND_NAME,
                options.config.cephx.as_ref(),
                pool,
            )?))
        }
        false => None,
    };
    let mut shared = Shared {
        runtime,
        network,
        cephx,
        wasm: options.wasm.clone(),
        settings: Arc::new(options.config.settings.clone()),
        online_extend: options.config.online_extend,
        grants: options.config.grants.clone(),
        limits: options.config.limits,
        fuel_per_call: options.config.fuel_per_call,
        mode: options.target,
        daemon: daemon.clone(),
        work: work.path().to_path_buf(),
        info: placeholder_info(),
        guarantees: Vec::new(),
        contract: None,
        imports: Vec::new(),
        created: Default::default(),
        initiator_key: crate::capabilities::iscsi::initiators::InitiatorKey::random(),
    };
    let target_name = match options.target {
        TargetMode::Model => "model",
        TargetMode::Tgtd => "tgtd",
    };

    // Loading is the first check; nothing else can run without it.
    let load_started = Instant::now();
    let loaded = Env::new(&shared).await.map(|env| {
        let d = &env.driver;
        (d.info().clone(), d.imports(), d.guarantees().to_vec(), d.contract())
    });
    let mut reports = Vec::new();
    let driver_name = match &loaded {
        Ok((info, ..)) => format!("{} {}", info.name, info.version),
        Err(_) => options.wasm.display().to_string(),
    };
    for check in &selected {
        if check.id != Id::Load {
            continue;
        }
        let status = match &loaded {
            Ok(_) => Status::Passed,
            Err(e) => Status::Failed(e.clone()),
        };
        let r = CheckReport {
            name: check.name,
            status,
            duration: load_started.elapsed(),
            runs: 1,
            measure: Measure::default(),
        };
        on_check(&r);
        reports.push(r);
    }
    match loaded {
        Ok((info, imports, guarantees, contract)) => {
            shared.info = info;
            shared.imports = imports;
            shared.guarantees = guarantees;
            shared.contract = Some(contract);
            for check in selected.iter().filter(|c| c.id != Id::Load) {
                let r = run_check(&shared, check, options.repeat.max(1)).await;
                on_check(&r);
                reports.push(r);
            }
        }
        Err(_) => {
            for check in selected.iter().filter(|c| c.id != Id::Load) {
                let r = CheckReport {
                    name: check.name,
                    status: Status::Skipped("not run: the driver could not be loaded".into()),
                    duration: Default::default(),
                    runs: 0,
                    measure: Measure::default(),
                };
                on_check(&r);
                reports.push(r);
            }
        }
    }
    if let Some(d) = &daemon {
        d.stop().await;
    }
    Ok(Report {
        tgtd: daemon.as_ref().map(|d| (d.control_port, format!("{}:{}", d.portal.address, d.portal.port))),
        driver: driver_name,
        contract: shared.contract.map(ContractVersion::name),
        guarantees: shared.guarantees.iter().map(|g| g.as_str()).collect(),
        wasm: options.wasm.display().to_string(),
        target: target_name,
        checks: reports,
        duration: started.elapsed(),
    })
}

/// Why a check does not apply to this driver (or this run), if it does not.
fn skip_reason(shared: &Shared, needs: &[Need]) -> Option<String> {
    needs.iter().find_map(|need| match need {
        Need::Iscsi if !shared.speaks_iscsi() => {
            Some("the driver does not advertise the iscsi protocol".into())
        }
        Need::TargetService if !shared.uses_target_service() => {
            Some("the driver does not use the host's iSCSI target service".into())
        }
        Need::Network if !shared.uses_network() => {
            Some("the driver does not talk to its backend over the network".into())
        }
        Need::Cephx if !shared.uses_cephx() => Some(
            "the driver makes no cephx identities (it does not import berth:cephx/identities, or the \
             configuration has no [cephx] table)"
                .into(),
        ),
        Need::OnlineExtend if !shared.online_extend => Some(
            "the configuration does not say online_extend = true: the host extends only available volumes"
                .into(),
        ),
        Need::Multiattach if !shared.multiattach() => {
            Some("the driver does not advertise multiattach".into())
        }
        Need::Promise(g) if !shared.promises(*g) => Some(match shared.contract {
            Some(ContractVersion::V0_1) => {
                format!("the driver is built for berth:driver@0.1.0, which cannot promise {}", g.as_str())
            }
            _ => format!("the driver does not promise {}", g.as_str()),
        }),
        _ => None,
    })
}

async fn run_check(shared: &Shared, check: &checks::Check, repeat: u32) -> CheckReport {
    let started = Instant::now();
    let mut measure = Measure::default();
    if let Some(reason) = skip_reason(shared, check.needs) {
        return CheckReport {
            name: check.name,
            status: Status::Skipped(reason),
            duration: started.elapsed(),
            runs: 0,
            measure,
        };
    }
    let mut status = Status::Passed;
    let mut runs = 0;
    for i in 1..=repeat {
        runs = i;
        let outcome = match Env::new(shared).await {
            Ok(mut env) => {
                let r = (check.run)(&mut env).await;
                measure.merge(&env.measure);
                // What the check left on a real backend goes, whatever the check's verdict.
                let cleaned = env.cleanup().await;
                r.and(cleaned.map_err(|e| format!("after the check: {e}")))
            }
            Err(e) => Err(format!("cannot prepare the environment: {e}")),
        };
        if let Err(why) = outcome {
            let why = if repeat > 1 { format!("run {i} of {repeat}: {why}") } else { why };
            status = Status::Failed(why);
            break;
        }
    }
    CheckReport { name: check.name, status, duration: started.elapsed(), runs, measure }
}

fn placeholder_info() -> crate::runtime::contract::DriverInfo {
    crate::runtime::contract::DriverInfo {
        name: String::new(),
        version: String::new(),
        vendor: String::new(),
        description: String::new(),
        protocols: Vec::new(),
        capabilities: crate::runtime::contract::Capabilities { multiattach: false, shared_targets: true },
    }
}

//! What a new driver must pass before it replaces a running one: its inspection (contract,
//! imports and grants, footprint), a comparison with the running driver (what volumes and types
//! already depend on), and the conformance suite against the backend's own configuration.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::{Loadable, UpgradeError};
use crate::conformance::{Options, TargetMode, VendorConfig};
use crate::runtime::inspect::Inspection;
use crate::runtime::{Driver, Footprint};

/// Refuses a component this backend cannot run in its place, naming why.
pub(super) fn inspect(
    inspection: &Inspection,
    current: &Driver,
    loadable: &Loadable,
    slot: Footprint,
) -> Result<(), UpgradeError> {
    if inspection.sha256 == current.digest() {
        return Err(UpgradeError::AlreadyRunning(inspection.sha256.clone()));
    }
    match (&inspection.contract, inspection.supported) {
        (None, _) => {
            return Err(UpgradeError::refused("the component exports no berth:driver contract".to_string()));
        }
        (Some(c), false) => {
            return Err(UpgradeError::refused(format!(
                "the component targets {c}, which this host does not implement ({})",
                crate::runtime::contract::ContractVersion::supported()
            )));
        }
        _ => {}
    }
    let mut why = Vec::new();
    for i in &inspection.imports {
        if let Some(reason) = i.verdict.strip_prefix("refused: ") {
            why.push(format!("it imports {}, which no driver may: {reason}", i.name));
        }
    }
    for grant in inspection.grants() {
        if !loadable.spec.grants.contains(&grant.grant) {
            why.push(format!(
                "it needs the {} grant ({}), which the backend's configuration does not give; a new grant is \
                 the operator's decision: add \"{}\" to the backend's grants and restart",
                grant.name, grant.what, grant.name
            ));
        }
    }
    if !inspection.footprint.fits(slot) {
        why.push(format!(
            "one instance of it needs {}, more than a call slot of this node holds ({}); restart with it \
             configured to size the slots for it",
            inspection.footprint, slot
        ));
    }
    if why.is_empty() { Ok(()) } else { Err(UpgradeError::refused(why.join("; "))) }
}

/// Refuses a loaded driver that would break what the backend's volumes and types rely on.
pub(super) fn compare(new: &Driver, current: &Driver, loadable: &Loadable) -> Result<(), UpgradeError> {
    let (n, c) = (new.info(), current.info());
    let mut why = Vec::new();
    if n.name != c.name {
        why.push(format!(
            "it is driver {}, not {}: an upgrade replaces a driver with another version of itself",
            n.name, c.name
        ));
    }
    let names = |p: &[crate::runtime::contract::Protocol]| {
        let mut v: Vec<String> = p.iter().map(|p| format!("{p:?}")).collect();
        v.sort();
        v
    };
    if names(&n.protocols) != names(&c.protocols) {
        why.push(format!(
            "it speaks {:?}, the running driver {:?}: attached volumes would change protocol",
            names(&n.protocols),
            names(&c.protocols)
        ));
    }
    if loadable.multiattach && !n.capabilities.multiattach {
        why.push("a multiattach volume type uses this backend, and it does not support multiattach".into());
    }
    if why.is_empty() { Ok(()) } else { Err(UpgradeError::refused(why.join("; "))) }
}

/// Runs the conformance suite on the component at `wasm` with the backend's configuration, on
/// the suite's target model, in a thread of its own (the suite runs its own engine, and its
/// CPU-bound checks must not hold the service's workers). Refused on any failed check, with
/// the report.
pub(super) async fn conformance(
    wasm: &Path,
    vendor: &VendorConfig,
    cache_dir: Option<PathBuf>,
) -> Result<Json, UpgradeError> {
    let options = Options {
        wasm: wasm.to_path_buf(),
        config: vendor.clone(),
        target: TargetMode::Model,
        focus: None,
        skip: None,
        repeat: 1,
        cache_dir,
    };
    let run = tokio::task::spawn_blocking(move || {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(crate::conformance::run(options, |_| {}))
    });
    let report = run
        .await
        .map_err(|e| UpgradeError::Internal(format!("the conformance run ended abnormally: {e}")))?
        .map_err(|e| UpgradeError::Internal(format!("the conformance suite could not run: {e}")))?;
    if report.ok() {
        Ok(report.json())
    } else {
        Err(UpgradeError::Refused {
            why: format!(
                "it failed conformance checks: {}",
                report
                    .checks
                    .iter()
                    .filter_map(|c| match &c.status {
                        crate::conformance::report::Status::Failed(why) =>
                            Some(format!("{} ({why})", c.name)),
                        _ => None,
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            report: Some(report.json()),
        })
    }
}

/// `--live`: one volume's life on the real backend, through the new driver as the backend would
/// run it (its real capabilities: the node's tgtd, its data directory, its array): create,
/// export, connect a scratch host, disconnect, unexport, delete; then the target service must no
/// longer show the volume. Anything left by a failed step is removed before the refusal. The
/// volume is a scratch one no row names, which the reconciler leaves alone.
pub(super) async fn live(driver: &Driver) -> Result<Json, UpgradeError> {
    use crate::runtime::contract::{AccessMode, Volume};
    use crate::runtime::model::VolumeFields;

    let mut volume = crate::conformance::env::new_volume(false);
    let id = volume.id.clone();
    let connector = crate::conformance::env::connector(
        "iqn.2010-10.org.openstack:berth-upgrade-check",
        "berth-upgrade-check",
        AccessMode::Rw,
    );
    let apply = |v: &mut Volume, u: &crate::runtime::contract::ModelUpdate| {
        let mut fields = VolumeFields::of(v);
        fields.apply(u).map(|()| fields.write_to(v))
    };
    let started = std::time::Instant::now();
    let mut steps: Vec<&str> = Vec::new();
    let outcome: Result<String, String> = async {
        let mut calls = driver.calls().for_owner("berth-upgrade-check");
        match calls.create_volume(&volume).await {
            Ok(u) => apply(&mut volume, &u)?,
            Err(e) if e.is_unsupported() => {}
            Err(e) => return Err(format!("create-volume: {e}")),
        }
        steps.push("create-volume");
        let u = calls
            .create_export(&volume, Some(&connector))
            .await
            .map_err(|e| format!("create-export: {e}"))?;
        apply(&mut volume, &u)?;
        steps.push("create-export");
        let c = calls
            .initialize_connection(&volume, &connector)
            .await
            .map_err(|e| format!("initialize-connection: {e}"))?;
        apply(&mut volume, &c.update)?;
        steps.push("initialize-connection");
        let kind = c.info.driver_volume_type.clone();
        calls
            .terminate_connection(&volume, Some(&connector), &[])
            .await
            .map_err(|e| format!("terminate-connection: {e}"))?;
        steps.push("terminate-connection");
        let u = calls.remove_export(&volume).await.map_err(|e| format!("remove-export: {e}"))?;
        apply(&mut volume, &u)?;
        steps.push("remove-export");
        match calls.delete_volume(&volume).await {
            Ok(()) => {}
            Err(e) if e.is_unsupported() => {}
            Err(e) => return Err(format!("delete-volume: {e}")),
        }
        steps.push("delete-volume");
        if let Some(service) = driver.target_service() {
            let left = service.list().await.map_err(|e| format!("cannot list the target service: {e}"))?;
            if let Some(t) = left.iter().find(|t| t.iqn.ends_with(&id)) {
                return Err(format!("target {} is still there after remove-export and delete-volume", t.iqn));
            }
        }
        Ok(kind)
    }
    .await;
    match outcome {
        Ok(kind) => Ok(serde_json::json!({
            "volume": volume.name,
            "driver_volume_type": kind,
            "steps": steps,
            "seconds": started.elapsed().as_secs_f64(),
        })),
        Err(why) => {
            // Best effort: leave the backend as it was.
            let mut calls = driver.calls();
            let _ = calls.terminate_connection(&volume, Some(&connector), &[]).await;
            let _ = calls.remove_export(&volume).await;
            let _ = calls.delete_volume(&volume).await;
            Err(UpgradeError::refused(format!(
                "the live check on scratch volume {} failed after {}: {why}",
                volume.name,
                if steps.is_empty() { "no step".to_string() } else { steps.join(", ") }
            )))
        }
    }
}

//! The driver's logic (see the crate documentation). Kept in its own file so that the
//! conformance fixture `drivers/fixtures/flawed` can build the same logic with one flaw.

use berth_driver_sdk::backing_store::{self, StoreError};
use berth_driver_sdk::iscsi::{self, ChapCredentials, TargetError};
use berth_driver_sdk::names::check_iscsi_name;
use berth_driver_sdk::prelude::*;
use berth_driver_sdk::{config, iscsi_chap, log, same_initiator};

pub struct TgtIscsi;

const DEFAULT_PREFIX: &str = "iqn.2010-10.org.openstack:";

pub(crate) fn target_iqn(volume: &Volume) -> DriverResult<String> {
    let iqn = format!("{}{}", config::get_or("target_prefix", DEFAULT_PREFIX), volume.name);
    check_iscsi_name(&iqn).map_err(|e| DriverError::Backend(format!("target name: {e}")))?;
    Ok(iqn)
}

/// Who a CHAP account is for (the `chap_accounts` setting).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChapAccounts {
    /// Each initiator its own account, made and kept by the host (`berth:iscsi-chap`), bound to
    /// each target the initiator is connected to. The default.
    PerInitiator,
    /// One account per export, from fresh credentials, shared by the export's initiators (what
    /// Cinder's tgt helper does).
    PerExport,
}

pub(crate) fn chap_accounts() -> DriverResult<ChapAccounts> {
    match config::get("chap_accounts").as_deref() {
        None | Some("per-initiator") => Ok(ChapAccounts::PerInitiator),
        Some("per-export") => Ok(ChapAccounts::PerExport),
        Some(other) => Err(DriverError::Backend(format!(
            "setting chap_accounts = {other:?}: use \"per-initiator\" or \"per-export\""
        ))),
    }
}

pub(crate) fn lun() -> u32 {
    config::get("target_lun").and_then(|l| l.parse().ok()).unwrap_or(1)
}

pub(crate) fn target_error(what: &str, e: TargetError) -> DriverError {
    match e {
        TargetError::InvalidArgument(m) => DriverError::Backend(format!("{what}: invalid argument: {m}")),
        TargetError::NotPermitted(m) => DriverError::Backend(format!("{what}: not permitted: {m}")),
        TargetError::NotFound(m) => DriverError::NotFound(format!("{what}: {m}")),
        TargetError::Timeout(m) => DriverError::Retryable(format!("{what}: {m}")),
        TargetError::Failed(m) => DriverError::Backend(format!("{what}: {m}")),
    }
}

pub(crate) fn store_error(what: &str, e: StoreError) -> DriverError {
    match e {
        StoreError::NotFound(m) => DriverError::NotFound(format!("{what}: {m}")),
        StoreError::Conflict(m) => DriverError::Incompatible(format!("{what}: {m}")),
        StoreError::NoSpace(m) => DriverError::Retryable(format!("{what}: {m}")),
        StoreError::NotPermitted(m) => DriverError::Backend(format!("{what}: not permitted: {m}")),
        StoreError::InvalidArgument(m) | StoreError::Failed(m) => {
            DriverError::Backend(format!("{what}: {m}"))
        }
    }
}

/// The CHAP credentials stored with the volume (`CHAP <user> <secret>`).
pub(crate) fn stored_credentials(volume: &Volume) -> Option<ChapCredentials> {
    let mut words = volume.provider_auth.as_deref()?.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("CHAP"), Some(user), Some(secret)) => {
            Some(ChapCredentials { username: user.to_string(), secret: secret.to_string() })
        }
        _ => None,
    }
}

/// Where the volume is exported, parsed from `provider_location`.
pub(crate) struct Location {
    pub(crate) portals: Vec<String>,
    pub(crate) iqn: String,
    pub(crate) lun: i64,
}

pub(crate) fn location(volume: &Volume) -> DriverResult<Location> {
    let not_exported = || DriverError::NotFound(format!("volume {} is not exported", volume.id));
    let text = volume.provider_location.as_deref().ok_or_else(not_exported)?;
    let (portals, rest) = text.split_once(',').ok_or_else(not_exported)?;
    let mut words = rest.split_whitespace();
    let (_tid, iqn, lun) = (words.next(), words.next(), words.next());
    Ok(Location {
        portals: portals.split(';').map(str::to_string).collect(),
        iqn: iqn.ok_or_else(not_exported)?.to_string(),
        lun: lun.and_then(|l| l.parse().ok()).unwrap_or(1),
    })
}

pub(crate) fn portal_text(p: &iscsi::Portal) -> String {
    if p.address.contains(':') {
        format!("[{}]:{}", p.address, p.port)
    } else {
        format!("{}:{}", p.address, p.port)
    }
}

pub(crate) fn mode_key(initiator: &str) -> String {
    format!("mode.{initiator}")
}

impl Driver for TgtIscsi {
    fn info() -> DriverInfo {
        DriverInfo {
            name: "tgt-iscsi".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            vendor: "Berth".into(),
            description:
                "Sparse image files exported by Linux tgt over iSCSI with CHAP and per-initiator ACLs".into(),
            protocols: vec![Protocol::Iscsi],
            capabilities: Capabilities { multiattach: true, shared_targets: false },
        }
    }

    fn guarantees() -> Vec<Guarantee> {
        vec![Guarantee::TerminateEndsSessions]
    }

    fn validate_connector(connector: &Connector) -> DriverResult<()> {
        connector.iscsi_initiator().map(|_| ())
    }

    fn create_volume(volume: &Volume) -> DriverResult<ModelUpdate> {
        backing_store::create(&volume.name, volume.size_bytes())
            .map_err(|e| store_error("create backing store", e))?;
        Ok(ModelUpdate::none())
    }

    /// Grows the backing store (sparse: no data is written). An available volume has no LUN in
    /// tgtd (its export goes with its last attachment), so the next export sees the new size; an
    /// attached one's LUN is opened again by the host as the store grows, so its hosts see the new
    /// size at once (the backing store's `resize`).
    fn extend_volume(volume: &Volume, new_size_gib: u64) -> DriverResult<ModelUpdate> {
        backing_store::resize(&volume.name, new_size_gib << 30)
            .map_err(|e| store_error("grow backing store", e))?;
        Ok(ModelUpdate::none())
    }

    fn delete_volume(volume: &Volume) -> DriverResult<()> {
        let iqn = target_iqn(volume)?;
        iscsi::delete_target(&iqn).map_err(|e| target_error("delete target", e))?;
        backing_store::delete(&volume.name).map_err(|e| store_error("delete backing store", e))
    }

    fn create_export(volume: &Volume, _connector: Option<&Connector>) -> DriverResult<ModelUpdate> {
        let iqn = target_iqn(volume)?;
        let lun = lun();
        let accounts = chap_accounts()?;
        let credentials = match accounts {
            ChapAccounts::PerExport => {
                Some(stored_credentials(volume).unwrap_or_else(iscsi::generate_chap_credentials))
            }
            // Each initiator's account is bound at its initialize-connection, before its ACL
            // entry: until then the target admits nobody.
            ChapAccounts::PerInitiator => None,
        };
        let existing = iscsi::show_target(&iqn).map_err(|e| target_error("show target", e))?;
        let target = match existing {
            Some(t) => t,
            None => iscsi::create_target(&iqn).map_err(|e| target_error("create target", e))?,
        };
        if !target.luns.contains(&lun) {
            iscsi::add_lun(&iqn, lun, &volume.name).map_err(|e| target_error("add LUN", e))?;
        }
        if let Some(credentials) = &credentials
            && !target.chap_users.contains(&credentials.username)
        {
            iscsi::set_chap(&iqn, credentials).map_err(|e| target_error("set CHAP", e))?;
        }
        let portals: Vec<String> = iscsi::portals().iter().map(portal_text).collect();
        if portals.is_empty() {
            return Err(DriverError::Backend("the host has no iSCSI portal configured".into()));
        }
        log::debug(&format!("exported {} as {iqn} (tid {})", volume.id, target.tid));
        let update =
            ModelUpdate::none().location(format!("{},{} {iqn} {lun}", portals.join(";"), target.tid));
        Ok(match credentials {
            Some(c) => update.auth(format!("CHAP {} {}", c.username, c.secret)),
            None if volume.provider_auth.is_some() => update.clear(VolumeField::ProviderAuth),
            None => update,
        })
    }

    fn remove_export(volume: &Volume) -> DriverResult<ModelUpdate> {
        let iqn = target_iqn(volume)?;
        iscsi::delete_target(&iqn).map_err(|e| target_error("delete target", e))?;
        // The credentials go with the export: the next one gets new ones, so that a host that
        // was detached cannot log in with what it was given, under any initiator name, once the
        // volume is attached elsewhere (a single-attach volume included).
        let mut update = ModelUpdate::none().clear(VolumeField::ProviderAuth);
        for (key, _) in volume.driver_data.iter().filter(|(k, _)| k.starts_with("mode.")) {
            update = update.remove(key.clone());
        }
        Ok(update)
    }

    fn initialize_connection(volume: &Volume, connector: &Connector) -> DriverResult<Connection> {
        let initiator = connector.iscsi_initiator()?;
        let loc = location(volume)?;
        let accounts = chap_accounts()?;
        let stored = match accounts {
            ChapAccounts::PerExport => Some(stored_credentials(volume).ok_or_else(|| {
                DriverError::NotFound(format!("volume {} has no CHAP credentials", volume.id))
            })?),
            ChapAccounts::PerInitiator => None,
        };
        let mode = connector.mode.as_str();
        if let Some(previous) = volume.data(&mode_key(initiator))
            && previous != mode
        {
            return Err(DriverError::Incompatible(format!(
                "initiator {initiator} is already connected {previous}; tgt cannot give it {mode} access as well"
            )));
        }
        // The initiator's own account is bound before its ACL entry exists, so that the target
        // never admits it without CHAP.
        let credentials = match stored {
            Some(c) => c,
            None => {
                iscsi_chap::grant(&loc.iqn, initiator).map_err(|e| target_error("grant CHAP account", e))?
            }
        };
        iscsi::allow_initiator(&loc.iqn, initiator).map_err(|e| target_error("allow initiator", e))?;
        let mut info = ConnectionInfoBuilder::new("iscsi")
            .boolean("target_discovered", false)
            .text("target_portal", loc.portals[0].clone())
            .text("target_iqn", loc.iqn.clone())
            .integer("target_lun", loc.lun)
            .text("volume_id", volume.id.clone())
            .text("auth_method", "CHAP")
            .text("auth_username", credentials.username)
            .text("auth_password", credentials.secret)
            .text("access_mode", mode)
            .boolean("encrypted", false);
        if loc.portals.len() > 1 || connector.multipath {
            let n = loc.portals.len();
            info = info
                .text_list("target_portals", loc.portals.clone())
                .text_list("target_iqns", vec![loc.iqn.clone(); n])
                .integer_list("target_luns", vec![loc.lun; n]);
        }
        Ok(Connection { info: info.build(), update: ModelUpdate::none().data(mode_key(initiator), mode) })
    }

    fn terminate_connection(
        volume: &Volume,
        connector: Option<&Connector>,
        others: &[Attachment],
    ) -> DriverResult<Termination> {
        terminate(volume, connector, others, Sessions::End)
    }

    fn shared_connections(
        _volume: &Volume,
        connector: &Connector,
        attachments: &[Attachment],
    ) -> DriverResult<Vec<String>> {
        Ok(attachments
            .iter()
            .filter(|a| a.connector.as_ref().is_some_and(|c| same_initiator(c, connector)))
            .map(|a| a.id.clone())
            .collect())
    }
}

/// What `terminate-connection` does with the sessions of the initiators whose access it revokes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sessions {
    /// Ends them (the `terminate-ends-sessions` promise).
    End,
    /// Leaves them (only the `flawed` fixture does, to prove the conformance check can fail).
    #[allow(dead_code, reason = "constructed by drivers/fixtures/flawed, which builds this file")]
    Keep,
}

/// `terminate-connection`: revokes access, ends the revoked initiators' sessions, and rotates a
/// multiattach target's credentials when a host leaves.
pub(crate) fn terminate(
    volume: &Volume,
    connector: Option<&Connector>,
    others: &[Attachment],
    sessions: Sessions,
) -> DriverResult<Termination> {
    let iqn = target_iqn(volume)?;
    let accounts = chap_accounts()?;
    let mut update = ModelUpdate::none();
    let revoke: Vec<String> = match connector {
        // Force detach: everyone goes, whether in the ACL or still logged in.
        None => match iscsi::show_target(&iqn).map_err(|e| target_error("show target", e))? {
            Some(target) => {
                let mut all = target.initiators;
                let open = iscsi::list_sessions(&iqn).map_err(|e| target_error("list sessions", e))?;
                all.extend(open.into_iter().map(|s| s.initiator).filter(|i| check_iscsi_name(i).is_ok()));
                all.sort();
                all.dedup();
                all
            }
            None => Vec::new(),
        },
        Some(connector) => match connector.initiator.as_deref() {
            // Another live attachment from the same initiator still needs the ACL entry.
            Some(_)
                if others
                    .iter()
                    .any(|a| a.connector.as_ref().is_some_and(|c| same_initiator(c, connector))) =>
            {
                Vec::new()
            }
            Some(initiator) if check_iscsi_name(initiator).is_ok() => vec![initiator.to_string()],
            _ => Vec::new(),
        },
    };
    // Whether a host that had access (its mode is recorded) loses it.
    let revoked_access = revoke.iter().any(|i| volume.data(&mode_key(i)).is_some());
    for initiator in &revoke {
        iscsi::deny_initiator(&iqn, initiator).map_err(|e| target_error("deny initiator", e))?;
        // The target checks its ACL only at login: a session already open would go on reading
        // and writing.
        if sessions == Sessions::End {
            iscsi::close_sessions(&iqn, initiator).map_err(|e| target_error("close sessions", e))?;
        }
        // Its own account goes last: the target keeps requiring CHAP of those still admitted.
        if accounts == ChapAccounts::PerInitiator {
            iscsi_chap::revoke(&iqn, initiator).map_err(|e| target_error("revoke CHAP account", e))?;
        }
        update = update.remove(mode_key(initiator));
    }
    if connector.is_none() && accounts == ChapAccounts::PerInitiator {
        iscsi_chap::revoke_all(&iqn).map_err(|e| target_error("revoke CHAP accounts", e))?;
    }
    if connector.is_none() {
        for (key, _) in volume.driver_data.iter().filter(|(k, _)| k.starts_with("mode.")) {
            update = update.remove(key.clone());
        }
    }
    let export_in_use = connector.is_some() && others.iter().any(|a| a.connector.is_some());
    // A per-export account is shared by every initiator of a multiattach volume: a detached host
    // that knew it could log in again under another attached host's initiator name. So it
    // changes (the remaining hosts' sessions go on; they get the new credentials at their next
    // initialize-connection). Per-initiator accounts need none of it: the detached host's own
    // account is no longer bound.
    if accounts == ChapAccounts::PerExport
        && volume.multiattach
        && export_in_use
        && revoked_access
        && config::get_or("rotate_chap_on_detach", "true") != "false"
    {
        let fresh = iscsi::generate_chap_credentials();
        iscsi::set_chap(&iqn, &fresh).map_err(|e| target_error("set CHAP", e))?;
        update = update.auth(format!("CHAP {} {}", fresh.username, fresh.secret));
    }
    Ok(Termination { export_in_use, update })
}

//! The driver itself (`lib.rs` exports it): every call of the contract, on the dashboard's REST API
//! and the host's cephx capability.

// A path of its own, so that a fixture that includes this file finds it too.
#[path = "dashboard.rs"]
mod dashboard;

use berth_driver_sdk::prelude::*;
use berth_driver_sdk::{ConnectionInfoBuilder, InvalidConnector, cephx, config};
use dashboard::Done;

pub struct CephRbd;

const GIB: u64 = 1 << 30;

fn pool() -> DriverResult<String> {
    let pool = config::get_or("pool", "volumes");
    let valid = !pool.is_empty()
        && pool.len() <= 128
        && pool.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !pool.starts_with('.');
    if valid { Ok(pool) } else { Err(DriverError::Backend(format!("pool {pool:?} is not a pool name"))) }
}

/// The image of a volume: its name as the host gave it (`volume-<id>`), checked.
fn image(volume: &Volume) -> DriverResult<&str> {
    let name = volume.name.as_str();
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !name.starts_with('.');
    if valid {
        Ok(name)
    } else {
        Err(DriverError::Backend(format!("volume name {name:?} is not an image name")))
    }
}

fn failed(what: &str, status: u16, code: Option<String>, detail: String) -> DriverError {
    let code = code.map(|c| format!(" (code {c})")).unwrap_or_default();
    DriverError::Backend(format!("{what}: the dashboard answered {status}{code}: {detail}"))
}

/// The monitors clients connect to: the `monitors` setting, or the cluster's monitor map.
fn monitors() -> DriverResult<(Vec<String>, Vec<String>)> {
    let list = match config::get("monitors").filter(|m| !m.trim().is_empty()) {
        Some(m) => m
            .split(',')
            .map(|a| {
                let a = a.trim();
                a.rsplit_once(':')
                    .map(|(h, p)| {
                        (h.trim_start_matches('[').trim_end_matches(']').to_string(), p.to_string())
                    })
                    .ok_or_else(|| DriverError::Backend(format!("monitor {a:?} is not host:port")))
            })
            .collect::<DriverResult<Vec<_>>>()?,
        None => dashboard::monitors()?,
    };
    Ok(list.into_iter().unzip())
}

/// Whether each compute host gets its own identity (`identities = per-host`, the default).
fn per_host() -> DriverResult<bool> {
    match config::get_or("identities", "per-host").as_str() {
        "per-host" => Ok(true),
        "shared" => Ok(false),
        other => Err(DriverError::Backend(format!("identities = {other:?}: per-host or shared"))),
    }
}

/// The compute host an identity is for: the connector's `host`, which os-brick always sends.
fn holder(connector: &Connector) -> DriverResult<&str> {
    connector.host.as_deref().filter(|h| !h.is_empty()).ok_or_else(|| {
        DriverError::InvalidConnector(InvalidConnector {
            missing: vec!["host".into()],
            reason: "per-host cephx identities are made for the connector's host".into(),
        })
    })
}

fn refused(error: cephx::IdentityError) -> DriverError {
    use cephx::IdentityError as E;
    match error {
        E::NotFound(m) => DriverError::NotFound(m),
        E::Unavailable(m) => DriverError::Retryable(m),
        E::NotConfigured(m) => {
            DriverError::Backend(format!("{m} (or set identities = shared to use rbd_user, as Cinder does)"))
        }
        E::InvalidArgument(m) | E::NotPermitted(m) => DriverError::Backend(m),
    }
}

impl Driver for CephRbd {
    fn info() -> DriverInfo {
        DriverInfo {
            name: "ceph-rbd".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            vendor: "Berth".into(),
            description: "Ceph RBD images through the Ceph manager's dashboard REST API".into(),
            protocols: vec![Protocol::Rbd],
            capabilities: Capabilities { multiattach: true, shared_targets: false },
        }
    }

    /// RBD clients reach the monitors themselves; a per-host identity needs the connector's host.
    fn validate_connector(connector: &Connector) -> DriverResult<()> {
        if per_host()? {
            holder(connector)?;
        }
        Ok(())
    }

    fn create_volume(volume: &Volume) -> DriverResult<ModelUpdate> {
        let (pool, image) = (pool()?, image(volume)?);
        let size = volume.size_gib * GIB;
        match dashboard::create_image(&pool, image, size)? {
            Done::Ok => {}
            // It exists: made by this call's earlier try, whose answer was lost, if its size is
            // the one asked for.
            Done::Failed { code: Some(code), .. } if code == "17" => {
                match dashboard::image_size(&pool, image)? {
                    Some(s) if s == size => {}
                    Some(s) => {
                        return Err(DriverError::Incompatible(format!(
                            "{pool}/{image} exists with {s} bytes, not {size}"
                        )));
                    }
                    None => {
                        return Err(DriverError::Retryable(format!(
                            "{pool}/{image} exists and then did not"
                        )));
                    }
                }
            }
            Done::Failed { status, code, detail } => {
                return Err(failed(&format!("creating {pool}/{image}"), status, code, detail));
            }
        }
        Ok(ModelUpdate::none())
    }

    /// Grows the image. The dashboard would shrink it too, without asking: a larger image is
    /// refused as incompatible, the size asked for is success (a retry after a lost answer).
    fn extend_volume(volume: &Volume, new_size_gib: u64) -> DriverResult<ModelUpdate> {
        let (pool, image) = (pool()?, image(volume)?);
        let size = new_size_gib * GIB;
        match dashboard::image_size(&pool, image)? {
            None => return Err(DriverError::NotFound(format!("{pool}/{image} does not exist"))),
            Some(now) if now == size => return Ok(ModelUpdate::none()),
            Some(now) if now > size => {
                return Err(DriverError::Incompatible(format!(
                    "{pool}/{image} has {now} bytes; shrinking it to {size} is refused"
                )));
            }
            Some(_) => {}
        }
        match dashboard::resize_image(&pool, image, size)? {
            Done::Ok => Ok(ModelUpdate::none()),
            Done::Failed { status, code, detail } => {
                Err(failed(&format!("resizing {pool}/{image}"), status, code, detail))
            }
        }
    }

    fn delete_volume(volume: &Volume) -> DriverResult<()> {
        let (pool, image) = (pool()?, image(volume)?);
        if per_host()? {
            cephx::revoke_all(&pool, image, &[]).map_err(refused)?;
        }
        match dashboard::delete_image(&pool, image)? {
            Done::Ok => Ok(()),
            // Gone already: deleted by an earlier try whose answer was lost, or never made.
            Done::Failed { status: 404, .. } => Ok(()),
            Done::Failed { code: Some(code), .. } if code == "404" || code == "2" => Ok(()),
            // Still opened by a client (a crashed one's watch lasts 30 s): try again later.
            Done::Failed { detail, .. } if detail.contains("watchers") => {
                Err(DriverError::Retryable(format!("{pool}/{image} is still open somewhere: {detail}")))
            }
            Done::Failed { status, code, detail } => {
                Err(failed(&format!("deleting {pool}/{image}"), status, code, detail))
            }
        }
    }

    /// Nothing to export: clients open the image through the monitors.
    fn create_export(_volume: &Volume, _connector: Option<&Connector>) -> DriverResult<ModelUpdate> {
        Err(DriverError::unsupported("create-export"))
    }

    fn remove_export(_volume: &Volume) -> DriverResult<ModelUpdate> {
        Err(DriverError::unsupported("remove-export"))
    }

    /// Cinder's RBD connection info, after checking that the image is there.
    fn initialize_connection(volume: &Volume, connector: &Connector) -> DriverResult<Connection> {
        let (pool, image) = (pool()?, image(volume)?);
        if dashboard::image_size(&pool, image)?.is_none() {
            return Err(DriverError::NotFound(format!("{pool}/{image} does not exist")));
        }
        let (hosts, ports) = monitors()?;
        let identity = match per_host()? {
            true => Some(cephx::grant_image(&pool, image, holder(connector)?).map_err(refused)?),
            false => None,
        };
        let user = match &identity {
            Some(identity) => identity.user.clone(),
            None => config::get_or("rbd_user", "cinder"),
        };
        let info = ConnectionInfoBuilder::new("rbd")
            .text("name", format!("{pool}/{image}"))
            .text_list("hosts", hosts)
            .text_list("ports", ports)
            .text("cluster_name", config::get_or("cluster_name", "ceph"))
            .boolean("auth_enabled", !user.is_empty());
        let info =
            if user.is_empty() { info.null("auth_username") } else { info.text("auth_username", user) };
        let info = info.text("secret_type", "ceph");
        let info = match config::get("secret_uuid").filter(|s| !s.is_empty()) {
            Some(uuid) => info.text("secret_uuid", uuid),
            None => info.null("secret_uuid"),
        };
        let info = match identity {
            Some(identity) => info.text("keyring", identity.keyring),
            None => info,
        };
        Ok(info
            .text("volume_id", volume.id.clone())
            .boolean("discard", true)
            .text("access_mode", connector.mode.as_str())
            .connection())
    }

    /// With per-host identities, removes the host's identity for this volume unless another of
    /// the volume's attachments is on the same host (a multiattach volume attached twice there);
    /// without a connector, every host's identity but those of the other attachments' hosts.
    /// With `identities = shared` there is nothing to revoke, as with Cinder.
    fn terminate_connection(
        volume: &Volume,
        connector: Option<&Connector>,
        others: &[Attachment],
    ) -> DriverResult<Termination> {
        if per_host()? {
            let (pool, image) = (pool()?, image(volume)?);
            let staying: Vec<String> = others
                .iter()
                .filter_map(|a| a.connector.as_ref()?.host.clone())
                .filter(|h| !h.is_empty())
                .collect();
            match connector.map(|c| c.host.as_deref().filter(|h| !h.is_empty())) {
                Some(Some(host)) if !staying.iter().any(|h| h == host) => {
                    cephx::revoke_image(&pool, image, host).map_err(refused)?;
                }
                Some(_) => {}
                // Without a connector, every access ends but the other attachments'.
                None => cephx::revoke_all(&pool, image, &staying).map_err(refused)?,
            }
        }
        Ok(Termination {
            export_in_use: others.iter().any(|a| a.connector.is_some()),
            update: ModelUpdate::none(),
        })
    }

    /// Each attachment opens the image itself; a host's attachments share nothing but the host.
    fn shared_connections(
        _volume: &Volume,
        connector: &Connector,
        attachments: &[Attachment],
    ) -> DriverResult<Vec<String>> {
        let same = |a: &&Attachment| {
            a.connector.as_ref().is_some_and(|c| c.host.is_some() && c.host == connector.host)
        };
        Ok(attachments.iter().filter(same).map(|a| a.id.clone()).collect())
    }
}

//! `fake`: a scriptable driver for API and state-machine tests. It is a test tool, not the
//! product: it answers like an iSCSI backend without touching anything.
//!
//! What each call does is scripted by a directive, looked up first in the volume's metadata
//! (`fake.<call>`, e.g. `fake.initialize-connection`) and then in the backend's settings (same
//! key). Directives:
//!
//! - `ok` (the default)
//! - an error case: `invalid-connector`, `not-found`, `incompatible`, `retryable`,
//!   `unsupported`, `backend`, optionally followed by `:<message>`
//! - `delay:<ms>`: sleep that long (in a host call, as a slow backend would), then succeed
//! - `panic`: crash
//!
//! `validate-connector`, which has no volume, reads only the settings.
//!
//! The setting `shared_targets = "true"` makes it advertise targets shared between volumes.
//!
//! The setting `protocol` (`iscsi` by default, or `iser`, `fibre_channel`, `nvmeof`, `rbd`,
//! `nfs`) chooses what it advertises, what it requires of a connector and the connection data it
//! answers with, shaped as Cinder's drivers of that kind shape it; the conformance suite's tests
//! check every protocol's schema with it.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use berth_driver_sdk::prelude::*;
use berth_driver_sdk::{config, log, same_initiator};

pub struct Fake;

const PREFIX: &str = "iqn.2010-10.org.openstack:";

/// Applies the directive for `call`, if any.
fn script(call: &str, volume: Option<&Volume>) -> DriverResult<()> {
    let key = format!("fake.{call}");
    let directive = volume.and_then(|v| v.metadata(&key).map(str::to_string)).or_else(|| config::get(&key));
    let Some(directive) = directive else { return Ok(()) };
    let (word, message) = directive.split_once(':').unwrap_or((directive.as_str(), ""));
    let message = if message.is_empty() { format!("{call} failed as scripted") } else { message.to_string() };
    match word {
        "ok" => Ok(()),
        "invalid-connector" => Err(DriverError::invalid_connector(message)),
        "not-found" => Err(DriverError::NotFound(message)),
        "incompatible" => Err(DriverError::Incompatible(message)),
        "retryable" => Err(DriverError::Retryable(message)),
        "unsupported" => Err(DriverError::Unsupported(message)),
        "backend" => Err(DriverError::Backend(message)),
        "delay" => {
            let ms: u64 = message.parse().unwrap_or(0);
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        }
        "panic" => panic!("{call} panicked as scripted"),
        other => Err(DriverError::Backend(format!("unknown fake directive {other:?}"))),
    }
}

/// Random alphanumeric characters (std's hasher seeds come from the host's CSPRNG).
fn random_word(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    (0..len)
        .map(|i| ALPHABET[(RandomState::new().hash_one(i) % ALPHABET.len() as u64) as usize] as char)
        .collect()
}

fn iqn(volume: &Volume) -> String {
    format!("{PREFIX}{}", volume.name)
}

fn protocol_name() -> String {
    config::get_or("protocol", "iscsi")
}

fn protocol() -> Protocol {
    match protocol_name().as_str() {
        "iscsi" => Protocol::Iscsi,
        "iser" => Protocol::Iser,
        "fibre_channel" => Protocol::FibreChannel,
        "nvmeof" => Protocol::Nvmeof,
        "rbd" => Protocol::Rbd,
        "nfs" => Protocol::Nfs,
        other => Protocol::Other(other.to_string()),
    }
}

/// What the protocol needs from a connector.
fn check_connector(connector: &Connector) -> DriverResult<()> {
    match protocol() {
        Protocol::Iscsi | Protocol::Iser => connector.iscsi_initiator().map(|_| ()),
        Protocol::Nvmeof if connector.nqn.is_none() => Err(DriverError::missing("nqn")),
        Protocol::FibreChannel if connector.wwpns.is_empty() => Err(DriverError::missing("wwpns")),
        _ => Ok(()),
    }
}

/// The connection data of a protocol other than iSCSI.
fn other_connection(volume: &Volume, connector: &Connector) -> Connection {
    let mode = connector.mode.as_str();
    let info = ConnectionInfoBuilder::new(&protocol_name());
    let info = match protocol() {
        Protocol::FibreChannel => {
            let map = connector.wwpns.iter().map(|w| format!("\"{w}\": [\"500a0981891b8dc5\"]"));
            info.text_list("target_wwn", vec!["500a0981891b8dc5".into()])
                .integer("target_lun", 1)
                .boolean("target_discovered", false)
                .value(
                    "initiator_target_map",
                    Value::Json(format!("{{{}}}", map.collect::<Vec<_>>().join(","))),
                )
        }
        Protocol::Nvmeof => info
            .text("target_nqn", format!("nqn.2014-08.org.openstack:{}", volume.name))
            .value("portals", Value::Json(r#"[["127.0.0.1", "4420", "tcp"]]"#.into()))
            .text("vol_uuid", volume.id.clone())
            .text("host_nqn", connector.nqn.clone().unwrap_or_default()),
        Protocol::Rbd => info
            .text("name", format!("volumes/{}", volume.name))
            .text_list("hosts", vec!["127.0.0.1".into()])
            .text_list("ports", vec!["6789".into()])
            .boolean("auth_enabled", true)
            .text("auth_username", "cinder")
            .text("secret_type", "ceph")
            .text("cluster_name", "ceph"),
        Protocol::Nfs => info.text("export", "127.0.0.1:/srv/cinder").text("name", volume.name.clone()),
        _ => info,
    };
    info.text("access_mode", mode).boolean("encrypted", false).connection()
}

impl Driver for Fake {
    fn info() -> DriverInfo {
        DriverInfo {
            name: "fake".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            vendor: "Berth".into(),
            description: "Scriptable test driver; answers like an iSCSI backend without touching anything"
                .into(),
            protocols: vec![protocol()],
            capabilities: Capabilities {
                multiattach: true,
                shared_targets: config::get_or("shared_targets", "false") == "true",
            },
        }
    }

    fn validate_connector(connector: &Connector) -> DriverResult<()> {
        script("validate-connector", None)?;
        check_connector(connector)
    }

    fn create_volume(volume: &Volume) -> DriverResult<ModelUpdate> {
        script("create-volume", Some(volume))?;
        log::debug(&format!("fake: created volume {}", volume.id));
        Ok(ModelUpdate::none().id(format!("fake-{}", volume.id)))
    }

    fn delete_volume(volume: &Volume) -> DriverResult<()> {
        script("delete-volume", Some(volume))
    }

    fn extend_volume(volume: &Volume, new_size_gib: u64) -> DriverResult<ModelUpdate> {
        script("extend-volume", Some(volume))?;
        log::debug(&format!("fake: extended volume {} to {new_size_gib} GiB", volume.id));
        Ok(ModelUpdate::none())
    }

    fn create_export(volume: &Volume, _connector: Option<&Connector>) -> DriverResult<ModelUpdate> {
        script("create-export", Some(volume))?;
        let auth = volume
            .provider_auth
            .clone()
            .unwrap_or_else(|| format!("CHAP {} {}", random_word(20), random_word(20)));
        Ok(ModelUpdate::none().location(format!("127.0.0.1:3260,1 {} 1", iqn(volume))).auth(auth))
    }

    fn remove_export(volume: &Volume) -> DriverResult<ModelUpdate> {
        script("remove-export", Some(volume))?;
        Ok(ModelUpdate::none())
    }

    fn initialize_connection(volume: &Volume, connector: &Connector) -> DriverResult<Connection> {
        script("initialize-connection", Some(volume))?;
        check_connector(connector)?;
        let Some(auth) = volume.provider_auth.as_deref() else {
            return Err(DriverError::NotFound(format!("volume {} is not exported", volume.id)));
        };
        if !matches!(protocol(), Protocol::Iscsi | Protocol::Iser) {
            return Ok(other_connection(volume, connector));
        }
        let mut words = auth.split_whitespace().skip(1);
        let (user, secret) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
        let mut info = ConnectionInfoBuilder::new(&protocol_name())
            .boolean("target_discovered", false)
            .text("target_portal", "127.0.0.1:3260")
            .text("target_iqn", iqn(volume))
            .integer("target_lun", 1)
            .text("volume_id", volume.id.clone())
            .text("auth_method", "CHAP")
            .text("auth_username", user)
            .text("auth_password", secret)
            .text("access_mode", connector.mode.as_str())
            .boolean("encrypted", false);
        if connector.multipath {
            info = info
                .text_list("target_portals", vec!["127.0.0.1:3260".into()])
                .text_list("target_iqns", vec![iqn(volume)])
                .integer_list("target_luns", vec![1]);
        }
        Ok(info.connection())
    }

    fn terminate_connection(
        volume: &Volume,
        _connector: Option<&Connector>,
        others: &[Attachment],
    ) -> DriverResult<Termination> {
        script("terminate-connection", Some(volume))?;
        Ok(Termination { export_in_use: !others.is_empty(), update: ModelUpdate::none() })
    }

    fn shared_connections(
        volume: &Volume,
        connector: &Connector,
        attachments: &[Attachment],
    ) -> DriverResult<Vec<String>> {
        script("shared-connections", Some(volume))?;
        Ok(attachments
            .iter()
            .filter(|a| a.connector.as_ref().is_some_and(|c| same_initiator(c, connector)))
            .map(|a| a.id.clone())
            .collect())
    }
}

export_driver!(Fake);

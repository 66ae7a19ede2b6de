//! The checks, named like the specification they enforce. Each runs in a fresh environment
//! (`env.rs`) and either passes or says what went wrong. A check that needs something the
//! driver does not advertise is skipped with that reason (see [`Need`]).
//!
//! The anchors of each check (csi-sanity, the CSI spec, Cinder's driver contract, os-brick) are
//! in `../shared/reliability-notes.md` section 1.4; the C-numbers below refer to it.

use std::collections::BTreeSet;

use serde_json::{Value as Json, json};

use super::env::{Env, Shared, attachment, connector, connector_json, driver_error, failed};
use crate::capabilities::iscsi::TargetError;
use crate::runtime::contract::{AccessMode, Attachment, Connector, DriverError, Guarantee, Protocol, Volume};
use crate::runtime::{CallError, CallErrorKind, Request, Response};
use berth_driver_sdk::names::check_iscsi_name;

/// What a check needs from the driver (or the run) to be meaningful.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The driver advertises the iSCSI protocol.
    Iscsi,
    /// The driver uses the host's iSCSI target service, so access can be observed.
    TargetService,
    /// The driver advertises multiattach.
    Multiattach,
    /// The driver makes this promise (`guarantees()`).
    Promise(Guarantee),
}

/// One check.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub name: &'static str,
    pub needs: &'static [Need],
    pub id: Id,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Id {
    Load,
    RequiresInitiator,
    HostileInitiators,
    ExtraKeys,
    ValidatePure,
    VolumeLifecycle,
    ExportIdempotent,
    ExportAfterWipe,
    RemoveUnexported,
    RemoveCleans,
    InitializeIdempotent,
    ConnectionSchema,
    AclExact,
    InitializeUnexported,
    AccessModeChange,
    SecondInitiator,
    TerminateUnknown,
    TerminateIdempotent,
    TerminateRevokes,
    TerminateAll,
    TerminateOneKeepsOther,
    TerminateSameInitiator,
    TerminateEndsSessions,
    ExportInUse,
    SharedQuery,
    TimeoutsRetryable,
    FailuresTyped,
    CpuBudget,
    MemoryBudget,
    OutputBounds,
    NoLeak,
    Deterministic,
    Convergence,
    ArgumentGrammar,
}

use Need::*;

/// Every check, in the order they run.
pub const CHECKS: &[Check] = &[
    Check {
        name: "the driver should load with only the imports the contract allows and the operator granted",
        needs: &[],
        id: Id::Load,
    },
    Check {
        name: "validate-connector should refuse a connector without an initiator",
        needs: &[Iscsi],
        id: Id::RequiresInitiator,
    },
    Check {
        name: "validate-connector should refuse hostile initiator names before any capability call",
        needs: &[Iscsi],
        id: Id::HostileInitiators,
    },
    Check {
        name: "validate-connector should accept os-brick's connector with its extra keys",
        needs: &[Iscsi],
        id: Id::ExtraKeys,
    },
    Check { name: "validate-connector should be pure", needs: &[Iscsi], id: Id::ValidatePure },
    Check {
        name: "delete-volume should remove what create-volume made, and succeed again",
        needs: &[],
        id: Id::VolumeLifecycle,
    },
    Check { name: "create-export should be idempotent", needs: &[], id: Id::ExportIdempotent },
    Check {
        name: "create-export should re-create a lost export with the same name and credentials",
        needs: &[Iscsi, TargetService],
        id: Id::ExportAfterWipe,
    },
    Check {
        name: "remove-export should succeed when nothing is exported, and twice",
        needs: &[],
        id: Id::RemoveUnexported,
    },
    Check {
        name: "remove-export should remove everything create-export made",
        needs: &[TargetService],
        id: Id::RemoveCleans,
    },
    Check {
        name: "initialize-connection should be idempotent",
        needs: &[Iscsi],
        id: Id::InitializeIdempotent,
    },
    Check {
        name: "initialize-connection should return what os-brick needs for its driver_volume_type",
        needs: &[],
        id: Id::ConnectionSchema,
    },
    Check {
        name: "initialize-connection should admit the connector's initiator with its credentials, and nobody else",
        needs: &[Iscsi, TargetService],
        id: Id::AclExact,
    },
    Check {
        name: "initialize-connection on a volume that is not exported should fail with not-found",
        needs: &[Iscsi],
        id: Id::InitializeUnexported,
    },
    Check {
        name: "initialize-connection with another access mode should be refused as incompatible or honoured",
        needs: &[Iscsi],
        id: Id::AccessModeChange,
    },
    Check {
        name: "a second initiator should get its own access and leave the first's untouched",
        needs: &[Iscsi, TargetService, Multiattach],
        id: Id::SecondInitiator,
    },
    Check {
        name: "terminate-connection of a connector that was never connected should succeed and change nothing",
        needs: &[Iscsi],
        id: Id::TerminateUnknown,
    },
    Check { name: "terminate-connection should be idempotent", needs: &[Iscsi], id: Id::TerminateIdempotent },
    Check {
        name: "terminate-connection should revoke the connector's access",
        needs: &[Iscsi, TargetService],
        id: Id::TerminateRevokes,
    },
    Check {
        name: "terminate-connection without a connector should revoke all access",
        needs: &[Iscsi, TargetService],
        id: Id::TerminateAll,
    },
    Check {
        name: "terminating one initiator should keep the other's access",
        needs: &[Iscsi, TargetService, Multiattach],
        id: Id::TerminateOneKeepsOther,
    },
    Check {
        name: "terminate-connection should keep access that another attachment of the same initiator needs",
        needs: &[Iscsi, TargetService, Multiattach],
        id: Id::TerminateSameInitiator,
    },
    Check {
        name: "terminate-connection should end the initiator's sessions",
        needs: &[Iscsi, TargetService, Promise(Guarantee::TerminateEndsSessions)],
        id: Id::TerminateEndsSessions,
    },
    Check {
        name: "terminate-connection should say whether the export is still in use",
        needs: &[Iscsi],
        id: Id::ExportInUse,
    },
    Check {
        name: "the shared-connection query should name exactly the attachments of the same host, consistently",
        needs: &[Iscsi],
        id: Id::SharedQuery,
    },
    Check {
        name: "target-service timeouts should surface as retryable errors",
        needs: &[TargetService],
        id: Id::TimeoutsRetryable,
    },
    Check {
        name: "target-service failures should surface as typed errors, never as success",
        needs: &[TargetService],
        id: Id::FailuresTyped,
    },
    Check { name: "every call should stay within its CPU budget", needs: &[], id: Id::CpuBudget },
    Check { name: "every call should stay within its memory limit", needs: &[], id: Id::MemoryBudget },
    Check { name: "every result should stay within the size limit", needs: &[], id: Id::OutputBounds },
    Check {
        name: "100 attach lifecycles should leave the target service and the stores as they were",
        needs: &[],
        id: Id::NoLeak,
    },
    Check { name: "the same inputs should get the same answers", needs: &[], id: Id::Deterministic },
    Check {
        name: "a call interrupted at any capability call should converge when retried",
        needs: &[],
        id: Id::Convergence,
    },
    Check {
        name: "capability calls should carry only arguments the contract allows",
        needs: &[Iscsi],
        id: Id::ArgumentGrammar,
    },
];

const A: &str = "iqn.1993-08.org.debian:01:conformance-a";
const B: &str = "iqn.1993-08.org.debian:01:conformance-b";
/// How many times idempotency is tested by repetition (csi-sanity's `IdempotentCount`).
const REPEAT: usize = 10;
const LIFECYCLES: usize = 100;

fn a() -> Connector {
    connector(A, "host-a", AccessMode::Rw)
}

fn b() -> Connector {
    connector(B, "host-b", AccessMode::Rw)
}

/// Connection data for a message, with credentials masked: secrets never reach a report.
fn redacted(data: &serde_json::Map<String, Json>) -> String {
    let masked: serde_json::Map<String, Json> = data
        .iter()
        .map(|(k, v)| {
            let secret = k.contains("password") || k.contains("secret");
            (k.clone(), if secret { Json::String("***".into()) } else { v.clone() })
        })
        .collect();
    Json::Object(masked).to_string()
}

/// A volume record for a message, with its credentials (`provider_auth`) masked.
fn redacted_volume(v: &Volume) -> String {
    let masked = Volume { provider_auth: v.provider_auth.as_ref().map(|_| "***".to_string()), ..v.clone() };
    format!("{masked:?}")
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// The name of a check.
pub fn name(id: Id) -> &'static str {
    CHECKS.iter().find(|c| c.id == id).expect("every id has a check").name
}

/// Runs one check in its environment.
pub async fn run(id: Id, env: &mut Env<'_>) -> Result<(), String> {
    match id {
        Id::Load => Ok(()),
        Id::RequiresInitiator => requires_initiator(env).await,
        Id::HostileInitiators => hostile_initiators(env).await,
        Id::ExtraKeys => extra_keys(env).await,
        Id::ValidatePure => validate_pure(env).await,
        Id::VolumeLifecycle => volume_lifecycle(env).await,
        Id::ExportIdempotent => export_idempotent(env).await,
        Id::ExportAfterWipe => export_after_wipe(env).await,
        Id::RemoveUnexported => remove_unexported(env).await,
        Id::RemoveCleans => remove_cleans(env).await,
        Id::InitializeIdempotent => initialize_idempotent(env).await,
        Id::ConnectionSchema => connection_schema(env).await,
        Id::AclExact => acl_exact(env).await,
        Id::InitializeUnexported => initialize_unexported(env).await,
        Id::AccessModeChange => access_mode_change(env).await,
        Id::SecondInitiator => second_initiator(env).await,
        Id::TerminateUnknown => terminate_unknown(env).await,
        Id::TerminateIdempotent => terminate_idempotent(env).await,
        Id::TerminateRevokes => terminate_revokes(env).await,
        Id::TerminateAll => terminate_all(env).await,
        Id::TerminateOneKeepsOther => terminate_one_keeps_other(env).await,
        Id::TerminateSameInitiator => terminate_same_initiator(env).await,
        Id::TerminateEndsSessions => terminate_ends_sessions(env).await,
        Id::ExportInUse => export_in_use(env).await,
        Id::SharedQuery => shared_query(env).await,
        Id::TimeoutsRetryable => injected_errors(env, Injection::Timeout).await,
        Id::FailuresTyped => injected_errors(env, Injection::Failure).await,
        Id::CpuBudget => budget(env, Budget::Cpu).await,
        Id::MemoryBudget => budget(env, Budget::Memory).await,
        Id::OutputBounds => budget(env, Budget::Output).await,
        Id::NoLeak => no_leak(env).await,
        Id::Deterministic => deterministic(env).await,
        Id::Convergence => convergence(env).await,
        Id::ArgumentGrammar => argument_grammar(env).await,
    }
}

/// A volume created and exported.
async fn exported(env: &mut Env<'_>, multiattach: bool) -> Result<Volume, String> {
    let mut v = env.create_volume(multiattach).await?;
    env.export(&mut v).await?;
    Ok(v)
}

fn is_invalid_connector(e: &CallError) -> bool {
    matches!(driver_error(e), Some(DriverError::InvalidConnector(_)))
}

// C01
async fn requires_initiator(env: &mut Env<'_>) -> Result<(), String> {
    let mut c = a();
    c.initiator = None;
    match env.call(Request::ValidateConnector(c)).await {
        Ok(_) => Err("a connector without an initiator was accepted".into()),
        Err(e) => match driver_error(&e) {
            Some(DriverError::InvalidConnector(ic)) if ic.missing.iter().any(|m| m == "initiator") => Ok(()),
            _ => {
                Err(format!("expected invalid-connector with missing = [\"initiator\"], got: {}", failed(&e)))
            }
        },
    }
}

/// Initiator names that must never reach a command (RFC 3720's grammar, shell and tgt syntax).
fn hostile_names() -> Vec<String> {
    let base = "iqn.2010-10.org.openstack:x";
    vec![
        format!("{base};reboot"),
        format!("{base}$(touch /tmp/pwned)"),
        format!("{base}`id`"),
        format!("{base}#comment"),
        format!("{base}\nsecond-line"),
        format!("{base} -T other"),
        format!("{base}\0nul"),
        format!("{base},initiator-address=ALL"),
        "ALL".into(),
        "../../etc/passwd".into(),
        "iqn.bad".into(),
        format!("iqn.2010-10.org.openstack:{}", "a".repeat(300)),
        "IQN.2010-10.ORG.OPENSTACK:UPPER".into(),
    ]
}

// C02, C33
async fn hostile_initiators(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let before = env.snapshot().await?;
    for name in hostile_names() {
        let c = connector(&name, "host-a", AccessMode::Rw);
        let shown = format!("{name:?}");
        match env.call(Request::ValidateConnector(c.clone())).await {
            Ok(_) => return Err(format!("validate-connector accepted the initiator {shown}")),
            Err(e) if is_invalid_connector(&e) => {}
            Err(e) => {
                return Err(format!("the initiator {shown} got {} instead of invalid-connector", failed(&e)));
            }
        }
        ensure!(env.last_calls.is_empty(), "validate-connector made capability calls for {shown}");
        if let Ok(conn) = env.try_connect(&mut v, &c).await {
            return Err(format!(
                "initialize-connection accepted the initiator {shown}: {}",
                redacted(&conn.data)
            ));
        }
        let reached: Vec<String> = env
            .last_calls
            .iter()
            .filter(|call| {
                call.args
                    .iter()
                    .any(|arg| arg.contains(&name) || name.contains(arg.as_str()) && arg.len() > 8)
            })
            .map(|call| format!("{}({})", call.op, call.args.join(", ")))
            .collect();
        ensure!(reached.is_empty(), "the initiator {shown} reached capability calls: {reached:?}");
    }
    env.unchanged_since(&before, "hostile connectors changed the target service").await?;
    Ok(())
}

// C04
async fn extra_keys(env: &mut Env<'_>) -> Result<(), String> {
    let c = connector_json(json!({
        "initiator": A, "host": "host-a", "ip": "192.0.2.10", "platform": "x86_64", "os_type": "linux",
        "multipath": false, "enforce_multipath": false, "do_local_attach": false,
        "uuid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "system uuid": "4c4c4544-0000-1010-8000-c7c04f333533",
        "nvme_hostid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "found_dsc": "", "host_ips": ["192.0.2.10"],
        "mountpoint": "/dev/vdb", "nqn": "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427",
    }));
    env.call(Request::ValidateConnector(c)).await.map(drop).map_err(|e| format!("refused: {}", failed(&e)))
}

// C03
async fn validate_pure(env: &mut Env<'_>) -> Result<(), String> {
    let mut missing = a();
    missing.initiator = None;
    for c in [a(), missing] {
        let first = env.call(Request::ValidateConnector(c.clone())).await;
        for _ in 0..REPEAT {
            let again = env.call(Request::ValidateConnector(c.clone())).await;
            ensure!(
                again.as_ref().ok() == first.as_ref().ok()
                    && again.as_ref().err().map(|e| e.kind.to_string())
                        == first.as_ref().err().map(|e| e.kind.to_string()),
                "the same connector got different answers"
            );
            ensure!(
                env.last_calls.is_empty(),
                "validate-connector made capability calls: {:?}",
                env.last_calls
            );
        }
    }
    Ok(())
}

async fn volume_lifecycle(env: &mut Env<'_>) -> Result<(), String> {
    let (stores, snapshot) = (env.stores(), env.snapshot().await?);
    let v = env.create_volume(false).await?;
    env.delete_volume(&v).await?;
    ensure!(env.stores() == stores, "backing stores left behind: {:?}", env.stores());
    env.unchanged_since(&snapshot, "the target service changed").await?;
    env.delete_volume(&v).await.map_err(|e| format!("deleting a deleted volume failed: {e}"))
}

// C05
async fn export_idempotent(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let (record, snapshot) = (v.clone(), env.snapshot().await?);
    for _ in 0..REPEAT {
        env.export(&mut v).await?;
        ensure!(
            v == record,
            "a repeated create-export changed the volume record: {} -> {}",
            redacted_volume(&record),
            redacted_volume(&v)
        );
        env.unchanged_since(&snapshot, "a repeated create-export changed the target service").await?;
    }
    Ok(())
}

// C06
async fn export_after_wipe(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let first = env.connect(&mut v, &a()).await?;
    env.login(&first, A).await.map_err(|e| format!("cannot log in after the first export: {e}"))?;
    let before = env.snapshot().await?;
    env.target.wipe().await?;
    env.export(&mut v).await?;
    let again = env.connect(&mut v, &a()).await?;
    ensure!(again.chap() == first.chap(), "the credentials changed after the export was re-created");
    ensure!(again.data.get("target_iqn") == first.data.get("target_iqn"), "the target name changed");
    env.login(&again, A).await.map_err(|e| format!("cannot log in to the re-created export: {e}"))?;
    env.unchanged_since(&before, "the re-created export differs").await?;
    Ok(())
}

// C08
async fn remove_unexported(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = env.create_volume(false).await?;
    let snapshot = env.snapshot().await?;
    env.remove_export(&mut v).await.map_err(|e| format!("on a volume never exported: {e}"))?;
    env.remove_export(&mut v).await.map_err(|e| format!("the second time: {e}"))?;
    env.unchanged_since(&snapshot, "the target service changed").await?;
    Ok(())
}

async fn remove_cleans(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = env.create_volume(false).await?;
    let base = env.snapshot().await?;
    env.export(&mut v).await?;
    env.remove_export(&mut v).await?;
    env.unchanged_since(&base, "left behind").await?;
    Ok(())
}

// C09
async fn initialize_idempotent(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let first = env.connect(&mut v, &a()).await?;
    let (record, snapshot) = (v.clone(), env.snapshot().await?);
    for i in 2..=REPEAT {
        let again = env.connect(&mut v, &a()).await?;
        ensure!(
            again == first,
            "call {i} answered differently: {} then {}",
            redacted(&first.data),
            redacted(&again.data)
        );
        ensure!(v == record, "call {i} changed the volume record");
        env.unchanged_since(&snapshot, &format!("call {i} changed the target service")).await?;
    }
    Ok(())
}

fn check_portal(p: &str) -> Result<(), String> {
    let (host, port) = p.rsplit_once(':').ok_or_else(|| format!("portal {p:?} is not host:port"))?;
    ensure!(port.parse::<u16>().is_ok_and(|p| p > 0), "portal {p:?} has no valid port");
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    ensure!(
        host.parse::<std::net::IpAddr>().is_ok() || !host.is_empty() && !host.contains(' '),
        "portal {p:?}"
    );
    Ok(())
}

/// os-brick's ISCSIConnector's view of `connection_info.data`.
fn check_iscsi_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let text = |k: &str| d.get(k).and_then(Json::as_str);
    let iqn = text("target_iqn").ok_or("target_iqn is missing or not a string")?;
    check_iscsi_name(iqn).map_err(|e| format!("target_iqn: {e}"))?;
    check_portal(text("target_portal").ok_or("target_portal is missing or not a string")?)?;
    let lun = d.get("target_lun").and_then(Json::as_i64).ok_or("target_lun is missing or not an integer")?;
    ensure!((0..16384).contains(&lun), "target_lun {lun} is out of range");
    match text("auth_method") {
        None => {}
        Some(m) if m.eq_ignore_ascii_case("chap") => {
            ensure!(text("auth_username").is_some_and(|u| !u.is_empty()), "CHAP without auth_username");
            ensure!(text("auth_password").is_some_and(|p| !p.is_empty()), "CHAP without auth_password");
        }
        Some(m) => ensure!(m.eq_ignore_ascii_case("none"), "auth_method {m:?} is neither CHAP nor None"),
    }
    if d.contains_key("target_portals") || d.contains_key("target_iqns") || d.contains_key("target_luns") {
        let list = |k: &str| d.get(k).and_then(Json::as_array).ok_or(format!("{k} is missing or not a list"));
        let (portals, iqns, luns) = (list("target_portals")?, list("target_iqns")?, list("target_luns")?);
        ensure!(
            portals.len() == iqns.len() && iqns.len() == luns.len() && !portals.is_empty(),
            "target_portals, target_iqns and target_luns differ in length"
        );
        for p in portals {
            check_portal(p.as_str().ok_or("a portal is not a string")?)?;
        }
        ensure!(luns.iter().all(Json::is_i64), "target_luns holds a non-integer");
        ensure!(iqns.iter().all(|i| i.as_str().is_some_and(|i| check_iscsi_name(i).is_ok())), "target_iqns");
    }
    Ok(())
}

// C10
async fn connection_schema(env: &mut Env<'_>) -> Result<(), String> {
    let advertised: Vec<String> = env.shared.info.protocols.iter().map(volume_type).collect();
    for (mode, name) in [(AccessMode::Rw, "rw"), (AccessMode::Ro, "ro")] {
        for multipath in [false, true] {
            let mut v = exported(env, false).await?;
            let mut c = connector(A, "host-a", mode);
            c.multipath = multipath;
            let conn = env.connect(&mut v, &c).await?;
            let kind = conn.driver_volume_type.to_ascii_lowercase();
            ensure!(
                advertised.contains(&kind),
                "driver_volume_type is {:?}; the driver advertises {}",
                conn.driver_volume_type,
                advertised.join(", ")
            );
            check_connection_data(&kind, &conn.data, name)
                .map_err(|e| format!("{kind} ({name}, multipath={multipath}): {e}"))?;
        }
    }
    Ok(())
}

/// os-brick's connector name for a protocol (`driver_volume_type`).
fn volume_type(p: &Protocol) -> String {
    match p {
        Protocol::Iscsi => "iscsi".into(),
        Protocol::Iser => "iser".into(),
        Protocol::Nvmeof => "nvmeof".into(),
        Protocol::FibreChannel => "fibre_channel".into(),
        Protocol::Rbd => "rbd".into(),
        Protocol::Nfs => "nfs".into(),
        Protocol::Other(name) => name.to_ascii_lowercase(),
    }
}

/// What os-brick's connector for `kind` reads from the connection data. Types os-brick does not
/// have (a protocol's `other` case) are checked only for the common keys.
pub(crate) fn check_connection_data(
    kind: &str,
    d: &serde_json::Map<String, Json>,
    mode: &str,
) -> Result<(), String> {
    if let Some(am) = d.get("access_mode") {
        ensure!(am.as_str() == Some(mode), "access_mode is {am}, the connector asked for {mode}");
    }
    for key in ["encrypted", "discard", "cacheable", "target_discovered"] {
        if let Some(v) = d.get(key) {
            ensure!(v.is_boolean(), "{key} is not a boolean");
        }
    }
    match kind {
        "iscsi" | "iser" => check_iscsi_data(d),
        "fibre_channel" => check_fc_data(d),
        "nvmeof" => check_nvmeof_data(d),
        "rbd" => check_rbd_data(d),
        "nfs" => check_nfs_data(d),
        _ => Ok(()),
    }
}

fn is_wwn(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn check_lun(v: Option<&Json>, key: &str) -> Result<(), String> {
    let lun = v.and_then(Json::as_i64).ok_or(format!("{key} is missing or not an integer"))?;
    ensure!((0..16384).contains(&lun), "{key} {lun} is out of range");
    Ok(())
}

// os-brick FibreChannelConnector: target_wwn (one WWN or a list), target_lun, and optionally
// initiator_target_map (initiator WWPN -> target WWNs).
fn check_fc_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    match d.get("target_wwn") {
        Some(Json::String(w)) => ensure!(is_wwn(w), "target_wwn {w:?} is not 16 hex digits"),
        Some(Json::Array(ws)) => ensure!(
            !ws.is_empty() && ws.iter().all(|w| w.as_str().is_some_and(is_wwn)),
            "target_wwn is not a non-empty list of 16-hex-digit WWNs"
        ),
        _ => return Err("target_wwn is missing or neither a WWN nor a list of WWNs".into()),
    }
    check_lun(d.get("target_lun"), "target_lun")?;
    if let Some(map) = d.get("initiator_target_map") {
        let map = map.as_object().ok_or("initiator_target_map is not an object")?;
        for (initiator, targets) in map {
            ensure!(is_wwn(initiator), "initiator_target_map key {initiator:?} is not a WWPN");
            ensure!(
                targets.as_array().is_some_and(|t| t.iter().all(|w| w.as_str().is_some_and(is_wwn))),
                "initiator_target_map[{initiator}] is not a list of WWNs"
            );
        }
    }
    Ok(())
}

// os-brick NVMeOFConnProps: a target (target_nqn, portals of [address, port, transport], optional
// vol_uuid / volume_nguid / ns_id / host_nqn), replicas of such targets, or the original format
// (nqn, transport_type, target_portal, target_port).
fn check_nvmeof_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let nqn = |v: Option<&Json>, key: &str| -> Result<(), String> {
        let n = v.and_then(Json::as_str).ok_or(format!("{key} is missing or not a string"))?;
        ensure!(n.starts_with("nqn.") && n.len() <= 223, "{key} {n:?} is not an NVMe qualified name");
        Ok(())
    };
    let port = |v: Option<&Json>| match v {
        Some(Json::String(s)) => s.parse::<u16>().is_ok(),
        Some(Json::Number(n)) => n.as_u64().is_some_and(|n| (1..=65535).contains(&n)),
        _ => false,
    };
    let uuid = |v: Option<&Json>, key: &str| -> Result<(), String> {
        match v {
            None | Some(Json::Null) => Ok(()),
            Some(Json::String(s)) if uuid::Uuid::parse_str(s).is_ok() => Ok(()),
            Some(other) => Err(format!("{key} {other} is not a UUID")),
        }
    };
    let target = |t: &serde_json::Map<String, Json>| -> Result<(), String> {
        nqn(t.get("target_nqn"), "target_nqn")?;
        let portals = t.get("portals").and_then(Json::as_array).ok_or("portals is missing or not a list")?;
        ensure!(!portals.is_empty(), "portals is empty");
        for p in portals {
            let p = p
                .as_array()
                .filter(|p| p.len() == 3)
                .ok_or(format!("portal {p} is not [address, port, transport]"))?;
            ensure!(p[0].as_str().is_some_and(|a| !a.is_empty()), "portal address {} is not a string", p[0]);
            ensure!(port(Some(&p[1])), "portal port {} is not a port number", p[1]);
            ensure!(p[2].is_string(), "portal transport {} is not a string", p[2]);
        }
        uuid(t.get("vol_uuid"), "vol_uuid")?;
        uuid(t.get("volume_nguid"), "volume_nguid")?;
        if let Some(h) = t.get("host_nqn") {
            nqn(Some(h), "host_nqn")?;
        }
        Ok(())
    };
    if let Some(replicas) = d.get("volume_replicas") {
        let replicas = replicas.as_array().ok_or("volume_replicas is not a list")?;
        ensure!(!replicas.is_empty(), "volume_replicas is empty");
        for r in replicas {
            target(r.as_object().ok_or("a replica is not an object")?)?;
        }
        if replicas.len() > 1 {
            ensure!(d.get("alias").is_some_and(Json::is_string), "replicated without an alias");
        }
        return uuid(d.get("vol_uuid"), "vol_uuid");
    }
    if d.contains_key("target_nqn") {
        return target(d);
    }
    nqn(d.get("nqn"), "nqn")?;
    ensure!(
        d.get("transport_type").is_some_and(Json::is_string),
        "transport_type is missing or not a string"
    );
    ensure!(
        d.get("target_portal").and_then(Json::as_str).is_some_and(|a| !a.is_empty()),
        "target_portal is missing or not a string"
    );
    ensure!(port(d.get("target_port")), "target_port is missing or not a port number");
    Ok(())
}

// os-brick RBDConnector: name = "<pool>/<image>", hosts and ports of the monitors, and the
// cephx settings when auth_enabled.
fn check_rbd_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let name = d.get("name").and_then(Json::as_str).ok_or("name is missing or not a string")?;
    let (pool, image) = name.split_once('/').ok_or(format!("name {name:?} is not <pool>/<image>"))?;
    ensure!(!pool.is_empty() && !image.is_empty(), "name {name:?} is not <pool>/<image>");
    let hosts = d.get("hosts").and_then(Json::as_array).ok_or("hosts is missing or not a list")?;
    let ports = d.get("ports").and_then(Json::as_array).ok_or("ports is missing or not a list")?;
    ensure!(hosts.len() == ports.len(), "hosts and ports differ in length");
    ensure!(hosts.iter().all(Json::is_string), "hosts holds a non-string");
    ensure!(ports.iter().all(|p| p.is_string() || p.is_u64()), "ports holds a non-port");
    match d.get("auth_enabled") {
        None => {}
        Some(Json::Bool(true)) => ensure!(
            d.get("auth_username").and_then(Json::as_str).is_some_and(|u| !u.is_empty()),
            "auth_enabled without auth_username"
        ),
        Some(Json::Bool(false)) => {}
        Some(other) => return Err(format!("auth_enabled {other} is not a boolean")),
    }
    Ok(())
}

// os-brick RemoteFsConnector (NFS): export = "<server>:/<path>", name = the file in it, and
// optional mount options.
fn check_nfs_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let export = d.get("export").and_then(Json::as_str).ok_or("export is missing or not a string")?;
    let (server, path) =
        export.rsplit_once(":/").ok_or(format!("export {export:?} is not <server>:/<path>"))?;
    ensure!(!server.is_empty(), "export {export:?} has no server");
    let _ = path;
    let name = d.get("name").and_then(Json::as_str).ok_or("name is missing or not a string")?;
    ensure!(!name.is_empty() && !name.contains('/') && name != "..", "name {name:?} is not a file name");
    if let Some(o) = d.get("options") {
        ensure!(o.is_string() || o.is_null(), "options is not a string");
    }
    Ok(())
}

// C18 (in the model: the same rules tgtd applies at login)
async fn acl_exact(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let conn = env.connect(&mut v, &a()).await?;
    env.login(&conn, A).await.map_err(|e| format!("the connector's initiator cannot log in: {e}"))?;
    ensure!(env.login(&conn, B).await.is_err(), "another initiator can log in");
    if let Some((user, _)) = conn.chap() {
        ensure!(
            env.login_as(&conn, A, Some((&user, "wrongsecretwrong1"))).await.is_err(),
            "a wrong CHAP secret is accepted"
        );
        ensure!(env.login_as(&conn, A, None).await.is_err(), "a login without CHAP is accepted");
    }
    Ok(())
}

// C12
async fn initialize_unexported(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = env.create_volume(false).await?;
    match env.try_connect(&mut v, &a()).await {
        Err(e) if matches!(driver_error(&e), Some(DriverError::NotFound(_))) => Ok(()),
        Err(e) => Err(format!("expected not-found, got: {}", failed(&e))),
        Ok(_) => {
            // Fine for a driver that has no exports at all.
            let mut probe = env.create_volume(false).await?;
            match env.call(Request::CreateExport(probe.clone(), None)).await {
                Err(e) if e.is_unsupported() => Ok(()),
                _ => {
                    env.remove_export(&mut probe).await.ok();
                    Err("initialize-connection succeeded on a volume that create-export was never called for"
                        .into())
                }
            }
        }
    }
}

// C13
async fn access_mode_change(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    env.connect(&mut v, &a()).await?;
    let (record, snapshot) = (v.clone(), env.snapshot().await?);
    let ro = connector(A, "host-a", AccessMode::Ro);
    match env.try_connect(&mut v, &ro).await {
        Ok(conn) => {
            let mode = conn.data.get("access_mode").and_then(Json::as_str);
            ensure!(mode == Some("ro"), "read-only was asked for, the answer says access_mode {mode:?}");
            Ok(())
        }
        Err(e) => {
            ensure!(
                matches!(driver_error(&e), Some(DriverError::Incompatible(_))),
                "expected incompatible, got: {}",
                failed(&e)
            );
            ensure!(v == record, "the refused call changed the volume record");
            env.unchanged_since(&snapshot, "the refused call changed the target service").await?;
            Ok(())
        }
    }
}

// C11
async fn second_initiator(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, true).await?;
    let ca = env.connect(&mut v, &a()).await?;
    let cb = env.connect(&mut v, &b()).await?;
    env.login(&cb, B).await.map_err(|e| format!("the second initiator cannot log in: {e}"))?;
    env.login(&ca, A).await.map_err(|e| format!("the first initiator lost access: {e}"))?;
    Ok(())
}

// C14
async fn terminate_unknown(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let conn = env.connect(&mut v, &a()).await?;
    let snapshot = env.snapshot().await?;
    let others = [attachment(&a())];
    env.terminate(&mut v, Some(&b()), &others).await.map_err(|e| format!("refused: {e}"))?;
    env.unchanged_since(&snapshot, "it changed the target service").await?;
    if env.shared.uses_target_service() {
        env.login(&conn, A).await.map_err(|e| format!("the connected initiator lost access: {e}"))?;
    }
    Ok(())
}

// C15
async fn terminate_idempotent(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    env.connect(&mut v, &a()).await?;
    env.terminate(&mut v, Some(&a()), &[]).await?;
    let (record, snapshot) = (v.clone(), env.snapshot().await?);
    for i in 2..=REPEAT {
        env.terminate(&mut v, Some(&a()), &[]).await.map_err(|e| format!("call {i}: {e}"))?;
        ensure!(v == record, "call {i} changed the volume record");
        env.unchanged_since(&snapshot, &format!("call {i} changed the target service")).await?;
    }
    Ok(())
}

async fn terminate_revokes(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let conn = env.connect(&mut v, &a()).await?;
    env.terminate(&mut v, Some(&a()), &[]).await?;
    ensure!(env.login(&conn, A).await.is_err(), "the initiator can still log in");
    Ok(())
}

// C16
async fn terminate_all(env: &mut Env<'_>) -> Result<(), String> {
    let multi = env.shared.multiattach();
    let mut v = exported(env, multi).await?;
    let mut conns = vec![(A, env.connect(&mut v, &a()).await?)];
    if multi {
        conns.push((B, env.connect(&mut v, &b()).await?));
    }
    env.terminate(&mut v, None, &[]).await?;
    for (initiator, conn) in &conns {
        ensure!(env.login(conn, initiator).await.is_err(), "{initiator} can still log in");
    }
    Ok(())
}

// C17
async fn terminate_one_keeps_other(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, true).await?;
    let ca = env.connect(&mut v, &a()).await?;
    let cb = env.connect(&mut v, &b()).await?;
    env.terminate(&mut v, Some(&a()), &[attachment(&b())]).await?;
    // A driver may change the target's shared credentials when a host leaves (tgt-iscsi does, so
    // that the leaving host cannot come back under another name): the other host then logs in
    // with what its next initialize-connection returns.
    if env.login(&cb, B).await.is_err() {
        let again = env.connect(&mut v, &b()).await?;
        env.login(&again, B).await.map_err(|e| format!("the other initiator lost access: {e}"))?;
    }
    ensure!(env.login(&ca, A).await.is_err(), "the terminated initiator can still log in");
    Ok(())
}

async fn terminate_same_initiator(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, true).await?;
    let conn = env.connect(&mut v, &a()).await?;
    env.terminate(&mut v, Some(&a()), &[attachment(&a())]).await?;
    env.login(&conn, A)
        .await
        .map_err(|e| format!("access was revoked although another attachment needs it: {e}"))
}

/// A host that stays logged in while it is detached keeps reading and writing unless its session
/// is ended: the target checks its ACL only at login. With multiattach, the other host's session
/// must survive (even when the driver rotates the target's credentials), and a terminate without
/// a connector ends every session.
async fn terminate_ends_sessions(env: &mut Env<'_>) -> Result<(), String> {
    let multi = env.shared.multiattach();
    let mut v = exported(env, multi).await?;
    let ca = env.connect(&mut v, &a()).await?;
    let _held_a = env.hold_session(&ca, A).await?;
    let cb = if multi { Some(env.connect(&mut v, &b()).await?) } else { None };
    let _held_b = match &cb {
        Some(cb) => Some(env.hold_session(cb, B).await?),
        None => None,
    };
    let others: Vec<Attachment> = cb.iter().map(|_| attachment(&b())).collect();
    env.terminate(&mut v, Some(&a()), &others).await?;
    let left = env.sessions_of(&ca, A).await?;
    ensure!(
        left == 0,
        "{left} session(s) of the terminated initiator are still open after terminate-connection returned"
    );
    if let Some(cb) = &cb {
        let kept = env.sessions_of(cb, B).await?;
        ensure!(kept == 1, "terminating one initiator ended the other's session");
        env.terminate(&mut v, None, &[]).await?;
        let left = env.sessions_of(cb, B).await?;
        ensure!(left == 0, "{left} session(s) are still open after terminate-connection without a connector");
    }
    Ok(())
}

async fn export_in_use(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, env.shared.multiattach()).await?;
    env.connect(&mut v, &a()).await?;
    let t = env.terminate(&mut v, Some(&a()), &[attachment(&b())]).await?;
    ensure!(t.export_in_use, "another live attachment has a connector, but the export is reported unused");
    env.connect(&mut v, &a()).await?;
    let t = env.terminate(&mut v, Some(&a()), &[]).await?;
    ensure!(!t.export_in_use, "no other attachment is left, but the export is reported in use");
    Ok(())
}

// C20
async fn shared_query(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, env.shared.multiattach()).await?;
    env.connect(&mut v, &a()).await?;
    let same = attachment(&a());
    let other = attachment(&b());
    let list = vec![same.clone(), other.clone()];
    let snapshot = env.snapshot().await?;
    let mut first: Option<Vec<String>> = None;
    for _ in 0..REPEAT {
        let ids = match env.call(Request::SharedConnections(v.clone(), a(), list.clone())).await {
            Ok(Response::Ids(ids)) => ids,
            Ok(other) => return Err(format!("answered {other:?}")),
            Err(e) => return Err(failed(&e)),
        };
        let ids: BTreeSet<String> = ids.into_iter().collect();
        ensure!(ids.contains(&same.id), "the attachment with the same connector is not named");
        ensure!(!ids.contains(&other.id), "an attachment of another host is named");
        ensure!(ids.iter().all(|i| i == &same.id), "unknown attachment ids were named: {ids:?}");
        let ids: Vec<String> = ids.into_iter().collect();
        match &first {
            Some(f) => ensure!(f == &ids, "the answer changed between calls"),
            None => first = Some(ids),
        }
    }
    env.unchanged_since(&snapshot, "the query changed the target service").await?;
    Ok(())
}

/// A call of the attach lifecycle, from a fresh volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    CreateExport,
    Initialize,
    Terminate,
    RemoveExport,
}

const STEPS: [Step; 4] = [Step::CreateExport, Step::Initialize, Step::Terminate, Step::RemoveExport];

impl Step {
    fn name(self) -> &'static str {
        match self {
            Step::CreateExport => "create-export",
            Step::Initialize => "initialize-connection",
            Step::Terminate => "terminate-connection",
            Step::RemoveExport => "remove-export",
        }
    }

    /// Brings a fresh volume (the same one every time) to the point where this step runs.
    async fn prepare(self, env: &mut Env<'_>) -> Result<Volume, String> {
        let mut v = env.create(Volume { provider_auth: None, ..fixed_volume() }).await?;
        if self != Step::CreateExport {
            env.export(&mut v).await?;
        }
        let iscsi = env.shared.speaks_iscsi();
        if matches!(self, Step::Terminate) || self == Step::RemoveExport && iscsi {
            env.connect(&mut v, &a()).await?;
        }
        if self == Step::RemoveExport && iscsi {
            env.terminate(&mut v, Some(&a()), &[]).await?;
        }
        Ok(v)
    }

    fn request(self, v: &Volume) -> Request {
        match self {
            Step::CreateExport => Request::CreateExport(v.clone(), None),
            Step::Initialize => Request::InitializeConnection(v.clone(), a()),
            Step::Terminate => Request::TerminateConnection(v.clone(), Some(a()), Vec::new()),
            Step::RemoveExport => Request::RemoveExport(v.clone()),
        }
    }
}

/// Applies what a step's successful answer updates.
fn apply_response(v: &mut Volume, r: &Response) {
    match r {
        Response::ModelUpdate(u) => super::env::apply(v, u),
        Response::Connection(c) => super::env::apply(v, &c.update),
        Response::Termination(t) => super::env::apply(v, &t.update),
        _ => {}
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Injection {
    Timeout,
    Failure,
}

/// The target-service operations the model can fail.
const TARGET_OPS: [&str; 8] = [
    "show-target",
    "create-target",
    "delete-target",
    "add-lun",
    "remove-lun",
    "allow-initiator",
    "deny-initiator",
    "set-chap",
];

/// A fresh environment in which `step` ran without a fault; `None` when the driver does not
/// support the step.
async fn uninterrupted<'a>(shared: &'a Shared, step: Step) -> Result<Option<Env<'a>>, String> {
    let mut clean = Env::new(shared).await?;
    let v = step.prepare(&mut clean).await?;
    match clean.call(step.request(&v)).await {
        Ok(_) => Ok(Some(clean)),
        Err(e) if e.is_unsupported() => Ok(None),
        Err(e) => Err(format!("{} (no fault): {}", step.name(), failed(&e))),
    }
}

// C23, C24
async fn injected_errors(env: &mut Env<'_>, kind: Injection) -> Result<(), String> {
    let shared = env.shared;
    let mut problems = Vec::new();
    for step in STEPS {
        // Which operations does the step use?
        let Some(clean) = uninterrupted(shared, step).await? else { continue };
        let ops: BTreeSet<&'static str> = clean
            .last_calls
            .iter()
            .filter(|c| c.interface == "iscsi-target")
            .filter_map(|c| TARGET_OPS.iter().copied().find(|op| *op == c.op))
            .collect();
        env.measure.merge(&clean.measure);
        for op in ops {
            let mut e = Env::new(shared).await?;
            let v = step.prepare(&mut e).await?;
            let error = match kind {
                Injection::Timeout => TargetError::Timeout("injected: tgtd did not answer in time".into()),
                Injection::Failure => TargetError::Failed("injected: tgtd refused".into()),
            };
            e.target.inject(op, error);
            let result = e.call(step.request(&v)).await;
            env.measure.merge(&e.measure);
            let verdict = match (kind, &result) {
                (Injection::Timeout, Ok(_)) => None,
                (Injection::Timeout, Err(err)) => match driver_error(err) {
                    Some(DriverError::Retryable(_)) => None,
                    _ => Some(format!("got {} instead of retryable", failed(err))),
                },
                (Injection::Failure, Ok(_)) => Some("reported success".to_string()),
                (Injection::Failure, Err(err)) => match &err.kind {
                    CallErrorKind::Driver(_) => None,
                    _ => Some(format!("got {} instead of a typed error", failed(err))),
                },
            };
            if let Some(v) = verdict {
                problems.push(format!("{} when {op} fails: {v}", step.name()));
            }
        }
    }
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    Cpu,
    Memory,
    Output,
}

/// Every call of the contract once, on reference inputs.
async fn reference_calls(env: &mut Env<'_>) -> Vec<(&'static str, Result<Response, CallError>)> {
    let mut out = Vec::new();
    let mut v = env.volume(false);
    out.push(("info", env.call(Request::Info).await));
    out.push(("validate-connector", env.call(Request::ValidateConnector(a())).await));
    let r = env.call(Request::CreateVolume(v.clone())).await;
    if let Ok(r) = &r {
        apply_response(&mut v, r);
    }
    out.push(("create-volume", r));
    for name in ["create-export", "initialize-connection"] {
        let request = match name {
            "create-export" => Request::CreateExport(v.clone(), None),
            _ => Request::InitializeConnection(v.clone(), a()),
        };
        let r = env.call(request).await;
        if let Ok(r) = &r {
            apply_response(&mut v, r);
        }
        out.push((name, r));
    }
    let list = vec![attachment(&a())];
    out.push(("shared-connections", env.call(Request::SharedConnections(v.clone(), a(), list)).await));
    let r = env.call(Request::TerminateConnection(v.clone(), Some(a()), Vec::new())).await;
    if let Ok(r) = &r {
        apply_response(&mut v, r);
    }
    out.push(("terminate-connection", r));
    let r = env.call(Request::RemoveExport(v.clone())).await;
    if let Ok(r) = &r {
        apply_response(&mut v, r);
    }
    out.push(("remove-export", r));
    out.push(("delete-volume", env.call(Request::DeleteVolume(v.clone())).await));
    out
}

// C27, C28, C30
async fn budget(env: &mut Env<'_>, budget: Budget) -> Result<(), String> {
    let mut problems = Vec::new();
    for (call, result) in reference_calls(env).await {
        let Err(e) = result else { continue };
        let over = matches!(
            (budget, &e.kind),
            (Budget::Cpu, CallErrorKind::Fuel(_) | CallErrorKind::CpuTime(_) | CallErrorKind::Timeout(_))
                | (Budget::Memory, CallErrorKind::Memory { .. })
                | (Budget::Output, CallErrorKind::OutputTooLarge { .. } | CallErrorKind::CopyTooLarge { .. })
        );
        if over {
            problems.push(format!("{call}: {}", failed(&e)));
        }
    }
    if budget == Budget::Memory && env.measure.peak_memory > env.shared.limits.memory_bytes() {
        problems.push(format!("peak memory {} over the limit", env.measure.peak_memory));
    }
    ensure!(problems.is_empty(), "{}", problems.join("; "));
    Ok(())
}

// C19
async fn no_leak(env: &mut Env<'_>) -> Result<(), String> {
    let (stores, base) = (env.stores(), env.snapshot().await?);
    let mut v = env.create_volume(env.shared.multiattach()).await?;
    let iscsi = env.shared.speaks_iscsi();
    for i in 1..=LIFECYCLES {
        env.export(&mut v).await.map_err(|e| format!("cycle {i}: {e}"))?;
        if iscsi {
            env.connect(&mut v, &a()).await.map_err(|e| format!("cycle {i}: {e}"))?;
            env.terminate(&mut v, Some(&a()), &[]).await.map_err(|e| format!("cycle {i}: {e}"))?;
        }
        env.remove_export(&mut v).await.map_err(|e| format!("cycle {i}: {e}"))?;
        if i == 1 || i == LIFECYCLES {
            env.unchanged_since(&base, &format!("after {i} cycle(s) the target service holds")).await?;
        }
    }
    env.delete_volume(&v).await?;
    ensure!(env.stores() == stores, "backing stores left behind: {:?}", env.stores());
    Ok(())
}

/// A volume record whose host-generated parts (id, credentials) are fixed.
fn fixed_volume() -> Volume {
    Volume {
        id: "00000000-0000-4000-8000-00000000c0fe".into(),
        name: "volume-00000000-0000-4000-8000-00000000c0fe".into(),
        size_gib: 1,
        multiattach: false,
        provider_location: None,
        provider_auth: Some("CHAP conformanceuser01 conformancesecret01".into()),
        provider_id: None,
        driver_data: Vec::new(),
        metadata: Vec::new(),
    }
}

/// A transcript of the reference calls on a fixed volume: each answer and its capability calls.
async fn transcript(env: &mut Env<'_>) -> Vec<String> {
    let mut v = fixed_volume();
    let mut out = Vec::new();
    let steps: [fn(&Volume) -> Request; 8] = [
        |_| Request::ValidateConnector(a()),
        |v| Request::CreateVolume(v.clone()),
        |v| Request::CreateExport(v.clone(), None),
        |v| Request::InitializeConnection(v.clone(), a()),
        |v| Request::SharedConnections(v.clone(), a(), vec![fixed_attachment(&a())]),
        |v| Request::TerminateConnection(v.clone(), Some(a()), Vec::new()),
        |v| Request::RemoveExport(v.clone()),
        |v| Request::DeleteVolume(v.clone()),
    ];
    for step in steps {
        let r = env.call(step(&v)).await;
        if let Ok(r) = &r {
            apply_response(&mut v, r);
        }
        let answer = match &r {
            Ok(r) => format!("{r:?}"),
            Err(e) => format!("error: {}", e.kind),
        };
        let calls: Vec<String> = env
            .last_calls
            .iter()
            .map(|c| format!("{}({}) -> {}", c.op, c.args.join(","), c.outcome))
            .collect();
        out.push(format!("{answer} with [{}]", calls.join("; ")));
    }
    out
}

fn fixed_attachment(c: &Connector) -> Attachment {
    Attachment {
        id: "00000000-0000-4000-8000-0000000a77ac".into(),
        connector: Some(c.clone()),
        instance: None,
        mode: c.mode,
    }
}

// C29
async fn deterministic(env: &mut Env<'_>) -> Result<(), String> {
    let first = transcript(env).await;
    let mut other = Env::new(env.shared).await?;
    let second = transcript(&mut other).await;
    env.measure.merge(&other.measure);
    for (i, (x, y)) in first.iter().zip(&second).enumerate() {
        ensure!(x == y, "call {} differs between two runs:\n  {x}\n  {y}", i + 1);
    }
    Ok(())
}

// C31, C32
async fn convergence(env: &mut Env<'_>) -> Result<(), String> {
    let shared = env.shared;
    let steps: &[Step] =
        if shared.speaks_iscsi() { &STEPS } else { &[Step::CreateExport, Step::RemoveExport] };
    for &step in steps {
        let Some(clean) = uninterrupted(shared, step).await? else { continue };
        let calls = clean.last_calls.len() as u32;
        let expected = clean.snapshot().await?.without_names();
        env.measure.merge(&clean.measure);
        // k = calls + 1: the call finished but its answer was lost (the host crashed before it
        // persisted the model update), so the retry starts from the old volume record.
        for k in 1..=calls + 1 {
            let mut e = Env::new(shared).await?;
            let mut v = step.prepare(&mut e).await?;
            let at = if k <= calls {
                format!("{} interrupted at capability call {k} of {calls}", step.name())
            } else {
                format!("{} whose answer was lost", step.name())
            };
            match e.call_with(step.request(&v), Some(k).filter(|k| *k <= calls)).await {
                Err(err) if matches!(err.kind, CallErrorKind::Injected(_)) => {}
                Err(err) => return Err(format!("{at}: expected the injected trap, got {}", failed(&err))),
                Ok(_) => {} // fewer calls this time, or the answer is dropped
            }
            let retried = e
                .call(step.request(&v))
                .await
                .map_err(|err| format!("{at}, then retried: {}", failed(&err)))?;
            apply_response(&mut v, &retried);
            let now = e.snapshot().await?.without_names();
            ensure!(
                now == expected,
                "{at}, then retried, differs from an uninterrupted call: {:?}",
                expected.diff(&now)
            );
            if matches!(step, Step::CreateExport | Step::Initialize)
                && shared.speaks_iscsi()
                && shared.uses_target_service()
            {
                let conn =
                    e.connect(&mut v, &a()).await.map_err(|err| format!("{at}, then retried: {err}"))?;
                e.login(&conn, A).await.map_err(|err| {
                    format!("{at}, then retried: the credentials returned do not log in: {err}")
                })?;
            }
            env.measure.merge(&e.measure);
        }
    }
    Ok(())
}

// C33
async fn argument_grammar(env: &mut Env<'_>) -> Result<(), String> {
    let multi = env.shared.multiattach();
    let mut v = exported(env, multi).await?;
    let long =
        format!("iqn.2005-03.org.open-iscsi:{}", "x".repeat(223 - "iqn.2005-03.org.open-iscsi:".len()));
    for initiator in
        ["iqn.1993-08.org.debian:01:a1b2c3", "eui.02004567a425678d", "naa.52004567ba64678d", long.as_str()]
    {
        let c = connector(initiator, "host-g", AccessMode::Rw);
        env.connect(&mut v, &c).await.map_err(|e| format!("{initiator}: {e}"))?;
        env.terminate(&mut v, Some(&c), &[]).await.map_err(|e| format!("{initiator}: {e}"))?;
    }
    for bad in ["not-an-iqn", "", "iqn.2010-10.org.openstack:x y"] {
        let c = connector(bad, "host-g", AccessMode::Rw);
        let _ = env.try_terminate(&mut v, Some(&c), &[]).await;
    }
    env.remove_export(&mut v).await?;
    let refused = &env.measure.invalid_arguments;
    ensure!(refused.is_empty(), "the host refused capability calls as invalid: {refused:?}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_connection_data;
    use serde_json::{Value as Json, json};

    fn check(kind: &str, data: Json) -> Result<(), String> {
        check_connection_data(kind, data.as_object().unwrap(), "rw")
    }

    /// Each type's schema accepts what Cinder's drivers send and refuses it with one key broken.
    fn accepts_and_refuses(kind: &str, good: Json, broken: &[(&str, Json)]) {
        check(kind, good.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"));
        for (key, value) in broken {
            let mut bad = good.clone();
            match value {
                Json::Null if *key != "vol_uuid" => drop(bad.as_object_mut().unwrap().remove(*key)),
                v => bad[*key] = v.clone(),
            }
            assert!(check(kind, bad).is_err(), "{kind} accepted a broken {key}: {value}");
        }
    }

    #[test]
    fn iscsi_needs_a_portal_an_iqn_a_lun_and_complete_chap() {
        accepts_and_refuses(
            "iscsi",
            json!({"target_portal": "192.0.2.1:3260", "target_iqn": "iqn.2010-10.org.openstack:volume-1",
                   "target_lun": 1, "auth_method": "CHAP", "auth_username": "u", "auth_password": "p",
                   "access_mode": "rw", "target_discovered": false}),
            &[
                ("target_portal", json!("192.0.2.1")),
                ("target_iqn", json!("volume-1")),
                ("target_lun", json!("1")),
                ("auth_password", Json::Null),
                ("access_mode", json!("ro")),
                ("target_discovered", json!("no")),
            ],
        );
    }

    #[test]
    fn fibre_channel_needs_target_wwns_and_a_lun() {
        accepts_and_refuses(
            "fibre_channel",
            json!({"target_wwn": ["500a0981891b8dc5"], "target_lun": 2, "target_discovered": false,
                   "initiator_target_map": {"10000090fa534cd0": ["500a0981891b8dc5"]}}),
            &[
                ("target_wwn", Json::Null),
                ("target_wwn", json!(["50:0a:09:81:89:1b:8d:c5"])),
                ("target_lun", json!(-1)),
                ("initiator_target_map", json!({"10000090fa534cd0": "500a0981891b8dc5"})),
            ],
        );
        check("fibre_channel", json!({"target_wwn": "500a0981891b8dc5", "target_lun": 0})).unwrap();
    }

    #[test]
    fn nvmeof_needs_an_nqn_and_portals_in_any_of_os_bricks_formats() {
        accepts_and_refuses(
            "nvmeof",
            json!({"target_nqn": "nqn.2014-08.org.openstack:volume-1",
                   "portals": [["192.0.2.1", "4420", "tcp"]],
                   "vol_uuid": "6c2f6a1e-2f4b-4c1d-9d3e-2b6f8a0c1d2e", "access_mode": "rw"}),
            &[
                ("target_nqn", json!("volume-1")),
                ("portals", json!([])),
                ("portals", json!([["192.0.2.1", "4420"]])),
                ("portals", json!([["192.0.2.1", "port", "tcp"]])),
                ("vol_uuid", json!("not-a-uuid")),
            ],
        );
        // The original format.
        accepts_and_refuses(
            "nvmeof",
            json!({"nqn": "nqn.2014-08.org.openstack:volume-1", "transport_type": "tcp",
                   "target_portal": "192.0.2.1", "target_port": 4420}),
            &[("target_port", json!(0)), ("transport_type", Json::Null)],
        );
        // Replicas.
        let replica =
            json!({"target_nqn": "nqn.2014-08.org.openstack:r1", "portals": [["192.0.2.1", 4420, "tcp"]]});
        check(
            "nvmeof",
            json!({"volume_replicas": [replica.clone(), replica.clone()], "replica_count": 2,
                               "alias": "raid1"}),
        )
        .unwrap();
        assert!(check("nvmeof", json!({"volume_replicas": [replica.clone(), replica]})).is_err(), "no alias");
    }

    #[test]
    fn rbd_needs_pool_and_image_and_matching_monitors() {
        accepts_and_refuses(
            "rbd",
            json!({"name": "volumes/volume-1", "hosts": ["192.0.2.1", "192.0.2.2"], "ports": ["6789", "6789"],
                   "auth_enabled": true, "auth_username": "cinder", "secret_type": "ceph",
                   "secret_uuid": "6c2f6a1e-2f4b-4c1d-9d3e-2b6f8a0c1d2e", "cluster_name": "ceph"}),
            &[
                ("name", json!("volume-1")),
                ("ports", json!(["6789"])),
                ("auth_username", Json::Null),
                ("auth_enabled", json!("yes")),
            ],
        );
    }

    #[test]
    fn nfs_needs_an_export_and_a_file_name() {
        accepts_and_refuses(
            "nfs",
            json!({"export": "192.0.2.1:/srv/cinder", "name": "volume-1", "options": null, "format": "raw"}),
            &[("export", json!("/srv/cinder")), ("name", json!("../etc/passwd")), ("name", Json::Null)],
        );
    }

    #[test]
    fn messages_never_carry_credentials() {
        let data = json!({"auth_username": "user", "auth_password": "s3cretvalue", "secret_uuid": "x"});
        let shown = super::redacted(data.as_object().unwrap());
        assert!(!shown.contains("s3cretvalue") && shown.contains("user"), "{shown}");
        let mut v = super::fixed_volume();
        v.provider_auth = Some("CHAP user s3cretvalue".into());
        assert!(!super::redacted_volume(&v).contains("s3cretvalue"));
    }

    #[test]
    fn other_types_are_checked_only_for_the_common_keys() {
        check("vendor_x", json!({"anything": [1, 2]})).unwrap();
        assert!(check("vendor_x", json!({"access_mode": "ro"})).is_err());
    }
}

//! The checks, named like the specification they enforce. Each runs in a fresh environment
//! (`env.rs`) and either passes or says what went wrong. A check that needs something the
//! driver does not advertise is skipped with that reason (see [`Need`]).
//!
//! The anchors of each check (csi-sanity, the CSI spec, Cinder's driver contract, os-brick) are
//! in `../shared/reliability-notes.md` section 1.4; the C-numbers below refer to it.

//!
//! One table ([`CHECKS`]) names each check, what it needs and the function that runs it; the
//! functions live by topic in this folder.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

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
    /// The driver talks to its backend over the network (`wasi:http`).
    Network,
    /// The driver asks the host for cephx identities (`berth:cephx/identities`), and the
    /// configuration lets the host make them (`[cephx]`).
    Cephx,
    /// The configuration says the backend extends attached volumes (`online_extend`).
    OnlineExtend,
}

/// One check.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub name: &'static str,
    pub needs: &'static [Need],
    pub id: Id,
    /// Runs the check in its environment.
    pub run: Run,
}

/// A running check.
pub type Outcome<'a> = Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
/// How a check is run.
pub type Run = for<'a, 'b> fn(&'a mut Env<'b>) -> Outcome<'a>;

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
    TerminatedCredentialsRefused,
    ExportedAgainCredentialsRefused,
    TerminateSameInitiator,
    TerminateEndsSessions,
    TerminateRemovesIdentity,
    ExportInUse,
    SharedQuery,
    TimeoutsRetryable,
    FailuresTyped,
    CpuBudget,
    MemoryBudget,
    OutputBounds,
    NoLeak,
    Deterministic,
    SharedInstance,
    Convergence,
    NetworkFaults,
    ArgumentGrammar,
    Extend,
    ExtendAttached,
}

use Need::*;

/// Every check, in the order they run.
pub const CHECKS: &[Check] = &[
    Check {
        name: "the driver should load with only the imports the contract allows and the operator granted",
        needs: &[],
        id: Id::Load,
        run: |_| Box::pin(async { Ok(()) }),
    },
    Check {
        name: "validate-connector should refuse a connector without an initiator",
        needs: &[Iscsi],
        id: Id::RequiresInitiator,
        run: |env| Box::pin(validate::requires_initiator(env)),
    },
    Check {
        name: "validate-connector should refuse hostile initiator names before any capability call",
        needs: &[Iscsi],
        id: Id::HostileInitiators,
        run: |env| Box::pin(validate::hostile_initiators(env)),
    },
    Check {
        name: "validate-connector should accept os-brick's connector with its extra keys",
        needs: &[],
        id: Id::ExtraKeys,
        run: |env| Box::pin(validate::extra_keys(env)),
    },
    Check {
        name: "validate-connector should be pure",
        needs: &[],
        id: Id::ValidatePure,
        run: |env| Box::pin(validate::validate_pure(env)),
    },
    Check {
        name: "delete-volume should remove what create-volume made, and succeed again",
        needs: &[],
        id: Id::VolumeLifecycle,
        run: |env| Box::pin(export::volume_lifecycle(env)),
    },
    Check {
        name: "extend-volume should grow the volume's storage and succeed again when retried, or answer unsupported",
        needs: &[],
        id: Id::Extend,
        run: |env| Box::pin(export::extend(env)),
    },
    Check {
        name: "extend-volume of an attached volume should grow it and keep its connection",
        needs: &[Need::TargetService, Need::OnlineExtend],
        id: Id::ExtendAttached,
        run: |env| Box::pin(export::extend_attached(env)),
    },
    Check {
        name: "create-export should be idempotent",
        needs: &[],
        id: Id::ExportIdempotent,
        run: |env| Box::pin(export::export_idempotent(env)),
    },
    Check {
        name: "create-export should re-create a lost export with the same name and credentials",
        needs: &[Iscsi, TargetService],
        id: Id::ExportAfterWipe,
        run: |env| Box::pin(export::export_after_wipe(env)),
    },
    Check {
        name: "remove-export should succeed when nothing is exported, and twice",
        needs: &[],
        id: Id::RemoveUnexported,
        run: |env| Box::pin(export::remove_unexported(env)),
    },
    Check {
        name: "remove-export should remove everything create-export made",
        needs: &[TargetService],
        id: Id::RemoveCleans,
        run: |env| Box::pin(export::remove_cleans(env)),
    },
    Check {
        name: "initialize-connection should be idempotent",
        needs: &[],
        id: Id::InitializeIdempotent,
        run: |env| Box::pin(connection::initialize_idempotent(env)),
    },
    Check {
        name: "initialize-connection should return what os-brick needs for its driver_volume_type",
        needs: &[],
        id: Id::ConnectionSchema,
        run: |env| Box::pin(connection::connection_schema(env)),
    },
    Check {
        name: "initialize-connection should admit the connector's initiator with its credentials, and nobody else",
        needs: &[Iscsi, TargetService],
        id: Id::AclExact,
        run: |env| Box::pin(connection::acl_exact(env)),
    },
    Check {
        name: "initialize-connection on a volume that is not exported should fail with not-found",
        needs: &[],
        id: Id::InitializeUnexported,
        run: |env| Box::pin(connection::initialize_unexported(env)),
    },
    Check {
        name: "initialize-connection with another access mode should be refused as incompatible or honoured",
        needs: &[],
        id: Id::AccessModeChange,
        run: |env| Box::pin(connection::access_mode_change(env)),
    },
    Check {
        name: "a second initiator should get its own access and leave the first's untouched",
        needs: &[Iscsi, TargetService, Multiattach],
        id: Id::SecondInitiator,
        run: |env| Box::pin(connection::second_initiator(env)),
    },
    Check {
        name: "terminate-connection of a connector that was never connected should succeed and change nothing",
        needs: &[],
        id: Id::TerminateUnknown,
        run: |env| Box::pin(terminate::terminate_unknown(env)),
    },
    Check {
        name: "terminate-connection should be idempotent",
        needs: &[],
        id: Id::TerminateIdempotent,
        run: |env| Box::pin(terminate::terminate_idempotent(env)),
    },
    Check {
        name: "terminate-connection should revoke the connector's access",
        needs: &[Iscsi, TargetService],
        id: Id::TerminateRevokes,
        run: |env| Box::pin(terminate::terminate_revokes(env)),
    },
    Check {
        name: "terminate-connection without a connector should revoke all access",
        needs: &[Iscsi, TargetService],
        id: Id::TerminateAll,
        run: |env| Box::pin(terminate::terminate_all(env)),
    },
    Check {
        name: "terminating one initiator should keep the other's access",
        needs: &[Iscsi, TargetService, Multiattach],
        id: Id::TerminateOneKeepsOther,
        run: |env| Box::pin(terminate::terminate_one_keeps_other(env)),
    },
    Check {
        name: "a terminated host's credentials should not admit it under another attached host's initiator name",
        needs: &[Iscsi, TargetService, Multiattach],
        id: Id::TerminatedCredentialsRefused,
        run: |env| Box::pin(terminate::terminated_credentials_refused(env)),
    },
    Check {
        name: "credentials given before remove-export should not admit a detached host after the next create-export",
        needs: &[Iscsi, TargetService],
        id: Id::ExportedAgainCredentialsRefused,
        run: |env| Box::pin(terminate::exported_again_credentials_refused(env)),
    },
    Check {
        name: "terminate-connection should keep access that another attachment of the same initiator needs",
        needs: &[Iscsi, TargetService, Multiattach],
        id: Id::TerminateSameInitiator,
        run: |env| Box::pin(terminate::terminate_same_initiator(env)),
    },
    Check {
        name: "terminate-connection should end the initiator's sessions",
        needs: &[Iscsi, TargetService, Promise(Guarantee::TerminateEndsSessions)],
        id: Id::TerminateEndsSessions,
        run: |env| Box::pin(terminate::terminate_ends_sessions(env)),
    },
    Check {
        name: "terminate-connection should remove the host's cephx identity, and only after the host's last attachment",
        needs: &[Cephx],
        id: Id::TerminateRemovesIdentity,
        run: |env| Box::pin(terminate::terminate_removes_identity(env)),
    },
    Check {
        name: "terminate-connection should say whether the export is still in use",
        needs: &[],
        id: Id::ExportInUse,
        run: |env| Box::pin(export::export_in_use(env)),
    },
    Check {
        name: "the shared-connection query should name exactly the attachments of the same host, consistently",
        needs: &[],
        id: Id::SharedQuery,
        run: |env| Box::pin(terminate::shared_query(env)),
    },
    Check {
        name: "target-service timeouts should surface as retryable errors",
        needs: &[TargetService],
        id: Id::TimeoutsRetryable,
        run: |env| Box::pin(faults::injected_errors(env, faults::Injection::Timeout)),
    },
    Check {
        name: "target-service failures should surface as typed errors, never as success",
        needs: &[TargetService],
        id: Id::FailuresTyped,
        run: |env| Box::pin(faults::injected_errors(env, faults::Injection::Failure)),
    },
    Check {
        name: "every call should stay within its CPU budget",
        needs: &[],
        id: Id::CpuBudget,
        run: |env| Box::pin(faults::budget(env, faults::Budget::Cpu)),
    },
    Check {
        name: "every call should stay within its memory limit",
        needs: &[],
        id: Id::MemoryBudget,
        run: |env| Box::pin(faults::budget(env, faults::Budget::Memory)),
    },
    Check {
        name: "every result should stay within the size limit",
        needs: &[],
        id: Id::OutputBounds,
        run: |env| Box::pin(faults::budget(env, faults::Budget::Output)),
    },
    Check {
        name: "100 attach lifecycles should leave the target service and the stores as they were",
        needs: &[],
        id: Id::NoLeak,
        run: |env| Box::pin(repeatability::no_leak(env)),
    },
    Check {
        name: "the same inputs should get the same answers",
        needs: &[],
        id: Id::Deterministic,
        run: |env| Box::pin(repeatability::deterministic(env)),
    },
    Check {
        name: "calls made in an instance earlier calls used should answer as in a fresh one",
        needs: &[],
        id: Id::SharedInstance,
        run: |env| Box::pin(repeatability::shared_instance(env)),
    },
    Check {
        name: "a call interrupted at any capability call should converge when retried",
        needs: &[],
        id: Id::Convergence,
        run: |env| Box::pin(faults::convergence(env)),
    },
    Check {
        name: "a request to the backend that is lost, times out or gets a 503 should fail the call as retryable, and the retried call should converge",
        needs: &[Network],
        id: Id::NetworkFaults,
        run: |env| Box::pin(faults::network_faults(env)),
    },
    Check {
        name: "capability calls should carry only arguments the contract allows",
        needs: &[Iscsi],
        id: Id::ArgumentGrammar,
        run: |env| Box::pin(validate::argument_grammar(env)),
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

/// A volume created and exported.
async fn exported(env: &mut Env<'_>, multiattach: bool) -> Result<Volume, String> {
    let mut v = env.create_volume(multiattach).await?;
    env.export(&mut v).await?;
    Ok(v)
}

fn is_invalid_connector(e: &CallError) -> bool {
    matches!(driver_error(e), Some(DriverError::InvalidConnector(_)))
}

mod connection;
mod export;
mod faults;
mod repeatability;
mod terminate;
mod validate;

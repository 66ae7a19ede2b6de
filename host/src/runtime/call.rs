//! The calls of the contract as the host makes them: what a call asks ([`Request`]), what it
//! answers ([`Response`]), what it cost ([`CallStats`]) and what its capability calls did to the
//! world ([`Effect`]). Plain data: no wasmtime here.

use std::fmt;
use std::time::Duration;

use super::contract::{
    Attachment, Connection, Connector, DriverInfo, Guarantee, ModelUpdate, Termination, Volume,
};

/// The calls of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    Info,
    Guarantees,
    ValidateConnector,
    CreateVolume,
    DeleteVolume,
    ExtendVolume,
    CreateExport,
    RemoveExport,
    InitializeConnection,
    TerminateConnection,
    SharedConnections,
}

impl Call {
    /// Every call, in the contract's order.
    pub const ALL: [Call; 11] = [
        Call::Info,
        Call::Guarantees,
        Call::ValidateConnector,
        Call::CreateVolume,
        Call::DeleteVolume,
        Call::ExtendVolume,
        Call::CreateExport,
        Call::RemoveExport,
        Call::InitializeConnection,
        Call::TerminateConnection,
        Call::SharedConnections,
    ];

    /// The WIT name of the call.
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Info => "info",
            Call::Guarantees => "guarantees",
            Call::ValidateConnector => "validate-connector",
            Call::CreateVolume => "create-volume",
            Call::DeleteVolume => "delete-volume",
            Call::ExtendVolume => "extend-volume",
            Call::CreateExport => "create-export",
            Call::RemoveExport => "remove-export",
            Call::InitializeConnection => "initialize-connection",
            Call::TerminateConnection => "terminate-connection",
            Call::SharedConnections => "shared-connections",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A call with its arguments.
#[derive(Debug, Clone)]
pub enum Request {
    Info,
    /// Answered by drivers of contract 0.2.0 and later; the host answers "none" for older ones.
    Guarantees,
    ValidateConnector(Connector),
    CreateVolume(Volume),
    DeleteVolume(Volume),
    /// New in 0.3.0 (the host answers `unsupported` for older drivers): the new size in GiB.
    ExtendVolume(Volume, u64),
    CreateExport(Volume, Option<Connector>),
    RemoveExport(Volume),
    InitializeConnection(Volume, Connector),
    TerminateConnection(Volume, Option<Connector>, Vec<Attachment>),
    SharedConnections(Volume, Connector, Vec<Attachment>),
}

impl Request {
    pub fn call(&self) -> Call {
        match self {
            Request::Info => Call::Info,
            Request::Guarantees => Call::Guarantees,
            Request::ValidateConnector(_) => Call::ValidateConnector,
            Request::CreateVolume(_) => Call::CreateVolume,
            Request::DeleteVolume(_) => Call::DeleteVolume,
            Request::ExtendVolume(..) => Call::ExtendVolume,
            Request::CreateExport(..) => Call::CreateExport,
            Request::RemoveExport(_) => Call::RemoveExport,
            Request::InitializeConnection(..) => Call::InitializeConnection,
            Request::TerminateConnection(..) => Call::TerminateConnection,
            Request::SharedConnections(..) => Call::SharedConnections,
        }
    }

    pub fn volume(&self) -> Option<&Volume> {
        match self {
            Request::Info | Request::Guarantees | Request::ValidateConnector(_) => None,
            Request::CreateVolume(v)
            | Request::DeleteVolume(v)
            | Request::ExtendVolume(v, _)
            | Request::CreateExport(v, _)
            | Request::RemoveExport(v)
            | Request::InitializeConnection(v, _)
            | Request::TerminateConnection(v, ..)
            | Request::SharedConnections(v, ..) => Some(v),
        }
    }
}

/// What a successful call returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Info(DriverInfo),
    Guarantees(Vec<Guarantee>),
    Unit,
    ModelUpdate(ModelUpdate),
    Connection(Connection),
    Termination(Termination),
    Ids(Vec<String>),
}

impl Response {
    /// The model update in the answer, if it carries one.
    pub fn model_update(&self) -> Option<&ModelUpdate> {
        match self {
            Response::ModelUpdate(u) => Some(u),
            Response::Connection(c) => Some(&c.update),
            Response::Termination(t) => Some(&t.update),
            _ => None,
        }
    }

    pub fn into_model_update(self) -> Option<ModelUpdate> {
        match self {
            Response::ModelUpdate(u) => Some(u),
            _ => None,
        }
    }
}

/// Extra behaviour for a call, used by the conformance suite.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    /// Record every capability call (arguments with secrets redacted).
    pub record: bool,
    /// Trap at the n-th capability call (1-based), as if the driver had crashed there.
    pub trap_at_capability_call: Option<u32>,
    /// Meter the call with this much fuel (the runtime must have been built with fuel).
    pub fuel: Option<u64>,
    /// Inject a network fault at the n-th request of the call (1-based), in front of the real
    /// endpoint.
    pub network_fault: Option<(u32, crate::capabilities::network::NetFault)>,
    /// The owner (project) of the volume the call is about: per-initiator CHAP accounts are made
    /// per owner (`capabilities/iscsi/initiators.rs`), and refused without one.
    pub owner: Option<std::sync::Arc<str>>,
    /// Awaited before each capability call whose change outlives the machine's power.
    pub before_lasting: Option<BeforeLasting>,
}

/// What a call awaits before a capability call whose change outlives the machine's power: a
/// backing store created, resized or deleted, a request on the network, a Ceph identity granted
/// or revoked. An operation whose intent was written but not yet synced makes it durable there
/// (`store::Durability::Written`), so that whatever outlives a power failure is found by the
/// recovery that follows it. The host's iSCSI target service awaits nothing: tgtd keeps its
/// targets in memory, and loses them with the power as the intent would be lost. An error says
/// why the intent could not be made durable; the capability call is then not made.
#[derive(Clone)]
pub struct BeforeLasting(std::sync::Arc<dyn Fn() -> LastingFuture + Send + Sync>);

type LastingFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

impl BeforeLasting {
    pub fn new(f: impl Fn() -> LastingFuture + Send + Sync + 'static) -> Self {
        BeforeLasting(std::sync::Arc::new(f))
    }

    pub(crate) async fn wait(&self) -> Result<(), String> {
        (self.0)().await
    }
}

impl fmt::Debug for BeforeLasting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BeforeLasting")
    }
}

/// One capability call made by a driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityCall {
    pub interface: &'static str,
    pub op: &'static str,
    pub args: Vec<String>,
    /// `ok`, or the error.
    pub outcome: String,
}

/// What a call cost.
#[derive(Debug, Clone, Default)]
pub struct CallStats {
    pub wall: Duration,
    /// Of which creating the fresh instance (linking, memory and tables set up).
    pub instantiation: Duration,
    /// The call ran in the instance an earlier call of its operation left (no instantiation).
    pub reused: bool,
    pub guest_time: Duration,
    /// Fuel consumed, when the call was metered.
    pub fuel: Option<u64>,
    /// Peak linear memory in bytes.
    pub peak_memory: usize,
    pub capability_calls: Vec<CapabilityCall>,
    /// What the capability calls changed (always collected).
    pub effects: Vec<Effect>,
    /// The guest's captured stdout/stderr.
    pub output: String,
}

/// A lasting change a capability call made for a driver, reported whether or not the call
/// succeeded in the end, so that the host can record what exists because of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The target service has (or already had) this target.
    TargetCreated { iqn: String },
    /// The target is gone.
    TargetDeleted { iqn: String },
}

//! Errors of the runtime: loading a driver, and calling one. A call error always names the
//! driver, its version and the call, and keeps three things apart (STYLE habit 4): a typed error
//! the driver returned, a crash (trap, limit), and a timeout. The last two are *uncertain*: the
//! call may have partly happened.

use std::time::Duration;

use super::call::Call;
use super::contract::DriverError;

/// Why one driver call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("driver {driver} {version}, call {call}: {kind}")]
pub struct CallError {
    pub driver: String,
    pub version: String,
    pub call: Call,
    pub kind: CallErrorKind,
}

/// The one classification of a failed driver call, for every flow and for recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The driver refused the call as the contract's final errors say (`invalid-connector`,
    /// `not-found`, `incompatible`, `unsupported`): nothing happened, and retrying changes
    /// nothing.
    Refused,
    /// It may pass if tried again later (`retryable`, the wall-time limit, a call not made because
    /// the operation lost its lease): recovery leaves the operation for the next pass.
    Transient,
    /// It failed for good and may have partly happened (`backend`, a crash, a limit, an invalid
    /// result): the flow records its error status.
    Final,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CallErrorKind {
    /// The driver returned one of the contract's error cases.
    #[error("{}", describe(.0))]
    Driver(DriverError),
    /// The guest trapped (a panic, `unreachable`, a stack overflow, ...).
    #[error("the driver crashed: {0}")]
    Trap(String),
    /// The guest used more CPU time than its limit.
    #[error("the driver exceeded its CPU time limit of {0:?}")]
    CpuTime(Duration),
    /// The call took longer than its wall-time limit.
    #[error("the call exceeded its time limit of {0:?}")]
    Timeout(Duration),
    /// The guest tried to grow its memory beyond the limit.
    #[error("the driver exceeded its memory limit of {limit} bytes (it asked for {asked})")]
    Memory { limit: usize, asked: usize },
    /// The guest used up the fuel the caller gave it (conformance runs only).
    #[error("the driver used up its fuel budget of {0}")]
    Fuel(u64),
    /// The result was larger than the output limit.
    #[error("the driver returned {size} bytes, more than the limit of {limit}")]
    OutputTooLarge { size: usize, limit: usize },
    /// The guest tried to pass more data to the host in one crossing than [`Limits::copy_bytes`]
    /// allows; refused during the copy.
    #[error("the driver tried to pass more than {limit} bytes to the host at once")]
    CopyTooLarge { limit: usize },
    /// The result broke the contract (e.g. invalid JSON in a `json` value).
    #[error("the driver returned an invalid result: {0}")]
    InvalidOutput(String),
    /// A fault injected by the conformance suite.
    #[error("fault injected at capability call {0}")]
    Injected(u32),
    /// The instance could not be created.
    #[error("the driver could not be instantiated: {0}")]
    Instantiate(String),
    /// The host did not make the call (an operation that lost its lease to another node):
    /// nothing happened.
    #[error("the call was not made: {0}")]
    NotMade(String),
}

impl CallErrorKind {
    /// A short name of the kind, for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            CallErrorKind::Driver(_) => "driver-error",
            CallErrorKind::Trap(_) => "trap",
            CallErrorKind::CpuTime(_) => "cpu-limit",
            CallErrorKind::Timeout(_) => "timeout",
            CallErrorKind::Memory { .. } => "memory-limit",
            CallErrorKind::Fuel(_) => "fuel",
            CallErrorKind::OutputTooLarge { .. } | CallErrorKind::CopyTooLarge { .. } => "output-limit",
            CallErrorKind::InvalidOutput(_) => "invalid-output",
            CallErrorKind::Injected(_) => "injected",
            CallErrorKind::Instantiate(_) => "instantiate",
            CallErrorKind::NotMade(_) => "not-made",
        }
    }
}

fn describe(e: &DriverError) -> String {
    match e {
        DriverError::InvalidConnector(c) => format!("invalid connector: {}", c.reason),
        DriverError::NotFound(m) => format!("not found: {m}"),
        DriverError::Incompatible(m) => format!("incompatible: {m}"),
        DriverError::Retryable(m) => format!("retryable failure: {m}"),
        DriverError::Unsupported(m) => format!("unsupported: {m}"),
        DriverError::Backend(m) => format!("backend failure: {m}"),
    }
}

impl CallError {
    /// The typed driver error, if the driver returned one.
    pub fn driver_error(&self) -> Option<&DriverError> {
        match &self.kind {
            CallErrorKind::Driver(e) => Some(e),
            _ => None,
        }
    }

    /// What kind of failure it is (the one classifier; see [`Failure`]).
    pub fn failure(&self) -> Failure {
        match &self.kind {
            CallErrorKind::Driver(
                DriverError::InvalidConnector(_)
                | DriverError::NotFound(_)
                | DriverError::Incompatible(_)
                | DriverError::Unsupported(_),
            ) => Failure::Refused,
            CallErrorKind::Driver(DriverError::Retryable(_))
            | CallErrorKind::Timeout(_)
            | CallErrorKind::NotMade(_) => Failure::Transient,
            _ => Failure::Final,
        }
    }

    pub fn is_unsupported(&self) -> bool {
        matches!(&self.kind, CallErrorKind::Driver(DriverError::Unsupported(_)))
    }
}

/// Why a driver could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("driver {driver}: cannot read {path}: {message}")]
    Read { driver: String, path: String, message: String },
    /// Not a component (`message` says why, from its own start), or one wasmtime cannot compile.
    #[error("driver {driver}: {message}")]
    Compile { driver: String, message: String },
    #[error(
        "driver {driver}: imports `{import}`, which is not granted to this driver \
         (the operator can add \"{grant}\" to the backend's grants)"
    )]
    NotGranted { driver: String, import: String, grant: String },
    #[error("driver {driver}: imports `{import}`, which is refused: {reason}")]
    Forbidden { driver: String, import: String, reason: String },
    #[error("driver {driver}: {message}")]
    Contract { driver: String, message: String },
    #[error("driver {driver}: its info() call failed: {error}")]
    Info { driver: String, error: Box<CallError> },
    #[error("runtime: {0}")]
    Engine(String),
    #[error(
        "driver {driver}: one instance needs {needs}, more than a call slot of this runtime holds \
         ({slot}); `berth serve` sizes its slots from the configured drivers, a runtime built \
         directly takes RuntimeOptions::slot (Footprint::of the component)"
    )]
    TooLarge { driver: String, needs: super::Footprint, slot: super::Footprint },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(kind: CallErrorKind) -> Failure {
        let e = CallError {
            driver: "d".into(),
            version: "1".into(),
            call: super::super::Call::CreateExport,
            kind,
        };
        e.failure()
    }

    #[test]
    fn every_failure_is_refused_transient_or_final() {
        let t = Duration::from_secs(1);
        assert_eq!(failure(CallErrorKind::Driver(DriverError::NotFound("x".into()))), Failure::Refused);
        assert_eq!(failure(CallErrorKind::Driver(DriverError::Unsupported("x".into()))), Failure::Refused);
        assert_eq!(failure(CallErrorKind::Driver(DriverError::Retryable("x".into()))), Failure::Transient);
        assert_eq!(failure(CallErrorKind::Timeout(t)), Failure::Transient);
        assert_eq!(failure(CallErrorKind::NotMade("lease".into())), Failure::Transient);
        assert_eq!(failure(CallErrorKind::Driver(DriverError::Backend("x".into()))), Failure::Final);
        assert_eq!(failure(CallErrorKind::Trap("x".into())), Failure::Final);
        assert_eq!(failure(CallErrorKind::CpuTime(t)), Failure::Final);
    }
}

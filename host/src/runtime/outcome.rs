//! What a call's raw result means: a timeout, a trap sorted into the runtime's error kinds, a
//! typed driver error (bounded and redacted), or a response checked against the output limit and
//! the model update's rules.

use wasmtime::Trap;

use super::call::{CallStats, Response};
use super::contract::DriverError;
use super::error::{CallError, CallErrorKind};
use super::limits::{CpuTimeExceeded, Limits};
use super::model::validate;
use super::size::WireSize;
use super::state::{HostState, InjectedFault};
use crate::capabilities::log::sanitize;
use crate::capabilities::secret::Redactor;

/// The result of a call together with what it cost.
#[derive(Debug)]
pub struct Outcome<T> {
    pub result: Result<T, CallError>,
    pub stats: CallStats,
}

/// What ran: `Err` when the deadline passed; `Ok(Err((instantiating, trap)))` when the guest
/// trapped; otherwise the driver's own answer.
pub(crate) type Raw =
    Result<Result<Result<Response, DriverError>, (bool, wasmtime::Error)>, tokio::time::error::Elapsed>;

/// The call's outcome, from what ran and the store's state afterwards.
pub(crate) fn judge(
    raw: Raw,
    state: &HostState,
    limits: &Limits,
    fuel: Option<u64>,
    output: &str,
) -> Result<Response, CallErrorKind> {
    match raw {
        Err(_elapsed) => Err(CallErrorKind::Timeout(limits.timeout())),
        Ok(Err((instantiating, e))) => Err(classify(&e, instantiating, state, limits, fuel, output)),
        Ok(Ok(Err(driver_error))) => Err(CallErrorKind::Driver(clean(driver_error, &state.scope.redactor))),
        Ok(Ok(Ok(response))) => {
            let size = response.wire_size();
            if size > limits.output_bytes() {
                Err(CallErrorKind::OutputTooLarge { size, limit: limits.output_bytes() })
            } else {
                match response.model_update().map(validate).transpose() {
                    Ok(_) if response.model_update().is_some_and(|u| holds_secret(u, &state.scope.redactor)) => {
                        Err(CallErrorKind::InvalidOutput(
                            "the model update holds one of the array's credentials (or a token from its answers); \
                             the host stores no such thing"
                                .into(),
                        ))
                    }
                    Ok(_) => Ok(response),
                    Err(message) => Err(CallErrorKind::InvalidOutput(message)),
                }
            }
        }
    }
}

/// Sorts a trap into the runtime's error kinds.
pub(crate) fn classify(
    e: &wasmtime::Error,
    instantiating: bool,
    state: &HostState,
    limits: &Limits,
    fuel: Option<u64>,
    output: &str,
) -> CallErrorKind {
    if let Some(asked) = state.memory.refused {
        return CallErrorKind::Memory { limit: limits.memory_bytes(), asked };
    }
    if e.downcast_ref::<CpuTimeExceeded>().is_some() {
        return CallErrorKind::CpuTime(limits.cpu());
    }
    if let Some(InjectedFault(n)) = e.downcast_ref::<InjectedFault>() {
        return CallErrorKind::Injected(*n);
    }
    // wasmtime's `HostcallFuelExhausted` is private; its message is stable.
    if format!("{e:#}").contains("fuel allocated for hostcalls has been exhausted") {
        return CallErrorKind::CopyTooLarge { limit: limits.copy_bytes() };
    }
    if let (Some(Trap::OutOfFuel), Some(fuel)) = (e.downcast_ref::<Trap>(), fuel) {
        return CallErrorKind::Fuel(fuel);
    }
    let mut message = match e.downcast_ref::<Trap>() {
        Some(trap) => trap.to_string(),
        None => format!("{e}"),
    };
    // A Rust guest's panic message is on its stderr.
    if let Some(panic) = output.lines().find(|l| l.contains("panicked at")) {
        let next = output.lines().skip_while(|l| !l.contains("panicked at")).nth(1).unwrap_or("");
        message = format!("{message} ({} {})", panic.trim(), next.trim());
    }
    let message = sanitize(&message, 1024, &state.scope.redactor);
    if instantiating { CallErrorKind::Instantiate(message) } else { CallErrorKind::Trap(message) }
}

/// Bounds and redacts the messages of a typed driver error.
pub(crate) fn clean(e: DriverError, redactor: &Redactor) -> DriverError {
    let s = |m: String| sanitize(&m, 1024, redactor);
    match e {
        DriverError::InvalidConnector(mut c) => {
            c.reason = s(c.reason);
            c.missing.truncate(16);
            c.missing = c.missing.into_iter().map(|k| sanitize(&k, 64, redactor)).collect();
            DriverError::InvalidConnector(c)
        }
        DriverError::NotFound(m) => DriverError::NotFound(s(m)),
        DriverError::Incompatible(m) => DriverError::Incompatible(s(m)),
        DriverError::Retryable(m) => DriverError::Retryable(s(m)),
        DriverError::Unsupported(m) => DriverError::Unsupported(s(m)),
        DriverError::Backend(m) => DriverError::Backend(s(m)),
    }
}

/// Whether a model update holds a network secret (the array's credentials, or a token an answer
/// carried): stored on the volume it would outlive the call and reach the database.
fn holds_secret(update: &super::contract::ModelUpdate, redactor: &Redactor) -> bool {
    [&update.provider_location, &update.provider_auth, &update.provider_id]
        .into_iter()
        .flatten()
        .chain(update.set_data.iter().flat_map(|(k, v)| [k, v]))
        .any(|text| redactor.holds_network_secret(text))
}

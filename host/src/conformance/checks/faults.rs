//! Failures and limits: capability calls that time out or fail surface as typed errors, each
//! call stays within its CPU, memory and size budgets, and a call interrupted at any capability
//! call converges when retried.

use super::fixed_volume;
use super::*;
use crate::capabilities::network::NetFault;

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
        if matches!(self, Step::Terminate | Step::RemoveExport) {
            env.connect(&mut v, &a()).await?;
        }
        if self == Step::RemoveExport {
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
pub(super) fn apply_response(v: &mut Volume, r: &Response) {
    match r {
        Response::ModelUpdate(u) => crate::conformance::env::apply(v, u),
        Response::Connection(c) => crate::conformance::env::apply(v, &c.update),
        Response::Termination(t) => crate::conformance::env::apply(v, &t.update),
        _ => {}
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Injection {
    Timeout,
    Failure,
}

/// The target-service operations the model can fail, as the capability calls that reach them are
/// recorded (interface, operation) and as the service names them.
const PER_INITIATOR_OPS: [(&str, &str); 3] =
    [("grant", "bind-account"), ("revoke", "unbind-account"), ("revoke-all", "unbind-account")];

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
        Err(e) if e.is_unsupported() => {
            clean.cleanup().await?;
            Ok(None)
        }
        Err(e) => Err(format!("{} (no fault): {}", step.name(), failed(&e))),
    }
}

// C23, C24
pub(super) async fn injected_errors(env: &mut Env<'_>, kind: Injection) -> Result<(), String> {
    let shared = env.shared;
    let mut problems = Vec::new();
    for step in STEPS {
        // Which operations does the step use?
        let Some(clean) = uninterrupted(shared, step).await? else { continue };
        let ops: BTreeSet<&'static str> = clean
            .last_calls
            .iter()
            .filter_map(|c| match c.interface {
                "iscsi-target" => TARGET_OPS.iter().copied().find(|op| *op == c.op),
                "initiator-accounts" => PER_INITIATOR_OPS.iter().find(|(op, _)| *op == c.op).map(|(_, o)| *o),
                _ => None,
            })
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
pub(super) enum Budget {
    Cpu,
    Memory,
    Output,
}

/// Every call of the contract once, on reference inputs.
pub(super) async fn reference_calls(env: &mut Env<'_>) -> Vec<(&'static str, Result<Response, CallError>)> {
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
pub(super) async fn budget(env: &mut Env<'_>, budget: Budget) -> Result<(), String> {
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

// C31, C32
pub(super) async fn convergence(env: &mut Env<'_>) -> Result<(), String> {
    let shared = env.shared;
    for step in STEPS {
        let Some(mut clean) = uninterrupted(shared, step).await? else { continue };
        // Requests to the network are not capability calls one can trap at (their faults are
        // the next check's); a call that makes only requests is checked for a lost answer.
        let calls = clean.last_calls.iter().filter(|c| c.interface != "network").count() as u32;
        let expected = clean.snapshot().await?.without_names();
        env.measure.merge(&clean.measure);
        // On a real backend the volume outlives the environment: the next one starts afresh.
        clean.cleanup().await?;
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
            e.cleanup().await?;
        }
    }
    Ok(())
}

/// A call of a volume's whole life on a network backend, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    CreateVolume,
    /// From 1 GiB to 2 (the volume is 2 GiB for the calls after it, as the host records).
    Extend,
    CreateExport,
    Initialize,
    Terminate,
    RemoveExport,
    DeleteVolume,
}

const LIFE: [Life; 7] = [
    Life::CreateVolume,
    Life::Extend,
    Life::CreateExport,
    Life::Initialize,
    Life::Terminate,
    Life::RemoveExport,
    Life::DeleteVolume,
];

impl Life {
    fn name(self) -> &'static str {
        match self {
            Life::CreateVolume => "create-volume",
            Life::Extend => "extend-volume",
            Life::CreateExport => "create-export",
            Life::Initialize => "initialize-connection",
            Life::Terminate => "terminate-connection",
            Life::RemoveExport => "remove-export",
            Life::DeleteVolume => "delete-volume",
        }
    }

    fn request(self, v: &Volume) -> Request {
        match self {
            Life::CreateVolume => Request::CreateVolume(v.clone()),
            Life::Extend => Request::ExtendVolume(v.clone(), 2),
            Life::CreateExport => Request::CreateExport(v.clone(), None),
            Life::Initialize => Request::InitializeConnection(v.clone(), a()),
            Life::Terminate => Request::TerminateConnection(v.clone(), Some(a()), Vec::new()),
            Life::RemoveExport => Request::RemoveExport(v.clone()),
            Life::DeleteVolume => Request::DeleteVolume(v.clone()),
        }
    }

    /// Runs the call; `unsupported` is a driver's way of having nothing to do here.
    async fn run(
        self,
        env: &mut Env<'_>,
        v: &mut Volume,
        fault: Option<(u32, NetFault)>,
    ) -> Result<Answer, CallError> {
        let r = match fault {
            Some(f) => env.call_with_network_fault(self.request(v), f).await,
            None => env.call(self.request(v)).await,
        };
        match r {
            Ok(r) => {
                apply_response(v, &r);
                if self == Life::Extend {
                    v.size_gib = 2;
                }
                Ok(Answer::of(&r))
            }
            Err(e) if e.is_unsupported() => Ok(Answer::Unsupported),
            Err(e) => Err(e),
        }
    }
}

/// What a call answered, comparable between two runs: a connection's data with the keys a
/// backend generates (a keyring) reduced to their presence.
#[derive(Debug, PartialEq)]
pub(super) enum Answer {
    Unsupported,
    Other(String),
}

impl Answer {
    pub(super) fn of(r: &Response) -> Answer {
        match r {
            Response::Connection(c) => {
                let data = crate::runtime::json::connection_data_to_json(&c.info).unwrap_or_default();
                let shown: serde_json::Map<String, Json> = data
                    .into_iter()
                    .map(|(k, v)| if k == "keyring" { (k, Json::String("<present>".into())) } else { (k, v) })
                    .collect();
                Answer::Other(format!("{} {} {:?}", c.info.driver_volume_type, Json::Object(shown), c.update))
            }
            other => Answer::Other(format!("{other:?}")),
        }
    }
}

/// The network requests of the last call.
fn requests(env: &Env<'_>) -> u32 {
    env.last_calls.iter().filter(|c| c.interface == "network").count() as u32
}

// C34: a lost answer (the request applied), a timeout, a 503, at each request of each call.
pub(super) async fn network_faults(env: &mut Env<'_>) -> Result<(), String> {
    let shared = env.shared;
    let faults = [
        (NetFault::LostAnswer, "whose answer was lost (the request applied)"),
        (NetFault::Timeout, "that timed out"),
        (NetFault::ServerError, "answered 503"),
    ];
    for (i, call) in LIFE.into_iter().enumerate() {
        // The uninterrupted call: its answer and how many requests it makes.
        let mut clean = Env::new(shared).await?;
        let mut v = fixed_volume();
        for before in &LIFE[..i] {
            before
                .run(&mut clean, &mut v, None)
                .await
                .map_err(|e| format!("{} (no fault): {}", before.name(), failed(&e)))?;
        }
        let expected = call
            .run(&mut clean, &mut v, None)
            .await
            .map_err(|e| format!("{} (no fault): {}", call.name(), failed(&e)))?;
        let n = requests(&clean);
        for after in &LIFE[i + 1..] {
            after
                .run(&mut clean, &mut v, None)
                .await
                .map_err(|e| format!("{} (no fault): {}", after.name(), failed(&e)))?;
        }
        env.measure.merge(&clean.measure);
        for k in 1..=n {
            for (fault, how) in faults {
                let at = format!("{} with request {k} of {n} {how}", call.name());
                let mut e = Env::new(shared).await?;
                let mut v = fixed_volume();
                for before in &LIFE[..i] {
                    before.run(&mut e, &mut v, None).await.map_err(|err| {
                        format!("{at}: {} before it failed: {}", before.name(), failed(&err))
                    })?;
                }
                let record = v.clone();
                let answer = match call.run(&mut e, &mut v, Some((k, fault))).await {
                    Ok(answer) => answer,
                    Err(err) => {
                        ensure!(
                            matches!(driver_error(&err), Some(DriverError::Retryable(_))),
                            "{at}: got {} instead of retryable",
                            failed(&err)
                        );
                        ensure!(v == record, "{at}: the failed call changed the volume record");
                        call.run(&mut e, &mut v, None)
                            .await
                            .map_err(|err| format!("{at}, then retried: {}", failed(&err)))?
                    }
                };
                ensure!(
                    answer == expected,
                    "{at}: answered differently from an uninterrupted call: {:?} instead of {:?}",
                    answer,
                    expected
                );
                for after in &LIFE[i + 1..] {
                    after
                        .run(&mut e, &mut v, None)
                        .await
                        .map_err(|err| format!("{at}: {} after it failed: {}", after.name(), failed(&err)))?;
                }
                env.measure.merge(&e.measure);
            }
        }
    }
    Ok(())
}

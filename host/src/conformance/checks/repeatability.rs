//! Repeatability: 100 lifecycles leave nothing behind, and the same inputs get the same answers.

use super::faults::apply_response;
use super::*;

// C19
pub(super) async fn no_leak(env: &mut Env<'_>) -> Result<(), String> {
    let (stores, base) = (env.stores(), env.snapshot().await?);
    let mut v = env.create_volume(env.shared.multiattach()).await?;
    for i in 1..=LIFECYCLES {
        env.export(&mut v).await.map_err(|e| format!("cycle {i}: {e}"))?;
        env.connect(&mut v, &a()).await.map_err(|e| format!("cycle {i}: {e}"))?;
        env.terminate(&mut v, Some(&a()), &[]).await.map_err(|e| format!("cycle {i}: {e}"))?;
        env.remove_export(&mut v).await.map_err(|e| format!("cycle {i}: {e}"))?;
        if i == 1 || i == LIFECYCLES {
            env.unchanged_since(&base, &format!("after {i} cycle(s) the target service holds")).await?;
        }
    }
    env.delete_volume(&v).await?;
    ensure!(env.stores() == stores, "backing stores left behind: {:?}", env.stores());
    Ok(())
}

/// In service the calls of one operation run in one instance: a driver may find what an earlier
/// call left in its memory, and must answer as it would in a fresh instance. The reference calls
/// made one after another in one instance are compared with the same calls each in a fresh
/// instance, where those agree between two runs (what differs between two fresh runs is the
/// `Deterministic` check's to judge).
pub(super) async fn shared_instance(env: &mut Env<'_>) -> Result<(), String> {
    let fresh = transcript(env).await;
    let mut again = Env::new(env.shared).await?;
    let fresh_again = transcript(&mut again).await;
    let mut sharing = Env::new(env.shared).await?.sharing_instances();
    let in_one = transcript(&mut sharing).await;
    env.measure.merge(&again.measure);
    env.measure.merge(&sharing.measure);
    for (i, ((x, y), z)) in fresh.iter().zip(&fresh_again).zip(&in_one).enumerate() {
        ensure!(
            x != y || x == z,
            "call {} answers otherwise in the instance the earlier calls used than in a fresh one:\n  fresh: {x}\n  after earlier calls: {z}",
            i + 1
        );
    }
    Ok(())
}

/// A transcript of the reference calls on a fixed volume: each answer and its capability calls.
pub(super) async fn transcript(env: &mut Env<'_>) -> Vec<String> {
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
            Ok(r) => format!("{:?}", super::faults::Answer::of(r)),
            Err(e) => format!("error: {}", e.kind),
        };
        // Requests to a network backend may differ in number (a task polled until it ends).
        let calls: Vec<String> = env
            .last_calls
            .iter()
            .filter(|c| c.interface != "network")
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
pub(super) async fn deterministic(env: &mut Env<'_>) -> Result<(), String> {
    let first = transcript(env).await;
    let mut other = Env::new(env.shared).await?;
    let second = transcript(&mut other).await;
    env.measure.merge(&other.measure);
    for (i, (x, y)) in first.iter().zip(&second).enumerate() {
        ensure!(x == y, "call {} differs between two runs:\n  {x}\n  {y}", i + 1);
    }
    Ok(())
}

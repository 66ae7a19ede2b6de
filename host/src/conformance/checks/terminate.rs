//! terminate-connection: revoking one initiator, all of them, unknown ones, twice, with the
//! sessions it ends; and the shared-connection query.

use super::*;

// C14
pub(super) async fn terminate_unknown(env: &mut Env<'_>) -> Result<(), String> {
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
pub(super) async fn terminate_idempotent(env: &mut Env<'_>) -> Result<(), String> {
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

pub(super) async fn terminate_revokes(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let conn = env.connect(&mut v, &a()).await?;
    env.terminate(&mut v, Some(&a()), &[]).await?;
    ensure!(env.login(&conn, A).await.is_err(), "the initiator can still log in");
    Ok(())
}

// C16
pub(super) async fn terminate_all(env: &mut Env<'_>) -> Result<(), String> {
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
pub(super) async fn terminate_one_keeps_other(env: &mut Env<'_>) -> Result<(), String> {
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

/// A multiattach volume's hosts may share one set of CHAP credentials (an account per export):
/// the ACL admits an initiator by its name, which a host chooses itself, so a detached host that
/// kept the shared secret could log in again under an attached host's name. Credentials of its
/// own (per-initiator accounts), or new ones for those who stay, make what it kept worthless.
pub(super) async fn terminated_credentials_refused(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, true).await?;
    let ca = env.connect(&mut v, &a()).await?;
    env.connect(&mut v, &b()).await?;
    env.login(&ca, A).await.map_err(|e| format!("the first initiator cannot log in: {e}"))?;
    env.terminate(&mut v, Some(&a()), &[attachment(&b())]).await?;
    ensure!(
        env.login(&ca, B).await.is_err(),
        "the terminated host's credentials still admit it under the other host's initiator name"
    );
    Ok(())
}

/// The same hole after an export ends: a detached host that kept its credentials must not reach the
/// volume once it is exported again for another host (a single-attach volume moving between
/// hosts), under that host's name.
pub(super) async fn exported_again_credentials_refused(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let ca = env.connect(&mut v, &a()).await?;
    env.login(&ca, A).await.map_err(|e| format!("the first initiator cannot log in: {e}"))?;
    env.terminate(&mut v, Some(&a()), &[]).await?;
    env.remove_export(&mut v).await?;
    env.export(&mut v).await?;
    let cb = env.connect(&mut v, &b()).await?;
    env.login(&cb, B).await.map_err(|e| format!("the next initiator cannot log in: {e}"))?;
    ensure!(
        env.login(&ca, B).await.is_err(),
        "credentials given before remove-export admit the detached host under the next host's initiator name"
    );
    Ok(())
}

pub(super) async fn terminate_same_initiator(env: &mut Env<'_>) -> Result<(), String> {
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
pub(super) async fn terminate_ends_sessions(env: &mut Env<'_>) -> Result<(), String> {
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

// C20
pub(super) async fn shared_query(env: &mut Env<'_>) -> Result<(), String> {
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

/// With per-host cephx identities: the connection names an identity the host made for this
/// image and host (its key in `keyring`); a terminate while another attachment of the volume is
/// on the same host keeps it; the host's last terminate removes it, and so does a terminate
/// without a connector.
pub(super) async fn terminate_removes_identity(env: &mut Env<'_>) -> Result<(), String> {
    let cephx = env.shared.cephx.clone().ok_or("the configuration gives the host no cephx capability")?;
    let mut v = env.create_volume(false).await?;
    let conn = env.connect(&mut v, &a()).await?;
    let user = conn
        .data
        .get("auth_username")
        .and_then(Json::as_str)
        .ok_or("the connection info names no identity (auth_username)")?
        .to_string();
    let entity = format!("client.{user}");
    ensure!(
        conn.data.get("keyring").and_then(Json::as_str).is_some_and(|k| k.contains(&format!("[{entity}]"))),
        "the connection info carries no keyring of {entity}"
    );
    let held = async || {
        cephx
            .held()
            .await
            .map(|h| h.iter().any(|i| i.entity == entity))
            .map_err(|e| format!("cannot list the cluster's identities: {e}"))
    };
    ensure!(held().await?, "the connection names {entity}, which the host did not make for this backend");
    env.terminate(&mut v, Some(&a()), &[attachment(&a())]).await?;
    ensure!(held().await?, "{entity} was removed while another attachment of its host needs it");
    env.terminate(&mut v, Some(&a()), &[]).await?;
    ensure!(
        !held().await?,
        "{entity} outlived its host's last terminate-connection: a detached host keeps its key"
    );
    // Without a connector (an admin's force-detach of every access): every host's identity goes.
    env.connect(&mut v, &a()).await?;
    ensure!(held().await?, "{entity} was not made again by the next connection");
    env.terminate(&mut v, None, &[]).await?;
    ensure!(!held().await?, "{entity} outlived a terminate-connection without a connector");
    Ok(())
}

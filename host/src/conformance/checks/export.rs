//! Volumes and exports: create/delete-volume, create-export and remove-export, idempotent and
//! complete, and an export that stays while a connection uses it.

use super::*;
use std::collections::BTreeMap;

pub(super) async fn volume_lifecycle(env: &mut Env<'_>) -> Result<(), String> {
    let (stores, snapshot) = (env.stores(), env.snapshot().await?);
    let v = env.create_volume(false).await?;
    env.delete_volume(&v).await?;
    ensure!(env.stores() == stores, "backing stores left behind: {:?}", env.stores());
    env.unchanged_since(&snapshot, "the target service changed").await?;
    env.delete_volume(&v).await.map_err(|e| format!("deleting a deleted volume failed: {e}"))
}

// C36: extend-volume grows every store the volume has, succeeds again when retried with the same
// record (a lost answer, or recovery after a crash), or answers `unsupported` and changes nothing.
pub(super) async fn extend(env: &mut Env<'_>) -> Result<(), String> {
    let before = env.store_sizes();
    let mut v = env.create_volume(false).await?;
    let made: Vec<String> = env.store_sizes().into_keys().filter(|k| !before.contains_key(k)).collect();
    let (record, sizes) = (v.clone(), env.store_sizes());
    let grown = env.extend(&mut v, 2).await.map_err(|e| format!("extending from 1 GiB to 2: {e}"))?;
    if !grown {
        ensure!(env.store_sizes() == sizes, "an unsupported extend-volume changed the stores");
        return env.delete_volume(&v).await;
    }
    let sizes = grown_to_2_gib(env, &made, "extend-volume")?;
    let mut again = record;
    env.extend(&mut again, 2)
        .await
        .map_err(|e| format!("extend-volume retried with the same record (a lost answer) failed: {e}"))?;
    ensure!(env.store_sizes() == sizes, "a retried extend-volume changed the stores again");
    env.delete_volume(&v).await
}

// With `online_extend`, the host calls extend-volume for a volume in use: its storage grows, the
// connection it has keeps working (the same credentials log in), and its export is what it was.
// A driver that cannot grow volumes answers `unsupported` (the host answers 501) and passes.
pub(super) async fn extend_attached(env: &mut Env<'_>) -> Result<(), String> {
    let before = env.store_sizes();
    let mut v = exported(env, false).await?;
    let made: Vec<String> = env.store_sizes().into_keys().filter(|k| !before.contains_key(k)).collect();
    let connected = env.connect(&mut v, &a()).await?;
    env.login(&connected, A).await.map_err(|e| format!("cannot log in before the extend: {e}"))?;
    let snapshot = env.snapshot().await?;
    if !env
        .extend(&mut v, 2)
        .await
        .map_err(|e| format!("extending an attached volume from 1 GiB to 2: {e}"))?
    {
        return Ok(());
    }
    grown_to_2_gib(env, &made, "extend-volume of an attached volume")?;
    env.unchanged_since(&snapshot, "extending an attached volume changed its export").await?;
    env.login(&connected, A)
        .await
        .map_err(|e| format!("the connection made before the extend no longer logs in: {e}"))
}

/// The stores `made` for a volume after `what` answered success: every one has 2 GiB.
fn grown_to_2_gib(env: &Env<'_>, made: &[String], what: &str) -> Result<BTreeMap<String, u64>, String> {
    let sizes = env.store_sizes();
    for name in made {
        ensure!(
            sizes.get(name) == Some(&(2 << 30)),
            "{what} answered success, but store {name} has {:?} bytes, not 2 GiB",
            sizes.get(name)
        );
    }
    Ok(sizes)
}

// C05
pub(super) async fn export_idempotent(env: &mut Env<'_>) -> Result<(), String> {
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
pub(super) async fn export_after_wipe(env: &mut Env<'_>) -> Result<(), String> {
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
pub(super) async fn remove_unexported(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = env.create_volume(false).await?;
    let snapshot = env.snapshot().await?;
    env.remove_export(&mut v).await.map_err(|e| format!("on a volume never exported: {e}"))?;
    env.remove_export(&mut v).await.map_err(|e| format!("the second time: {e}"))?;
    env.unchanged_since(&snapshot, "the target service changed").await?;
    Ok(())
}

pub(super) async fn remove_cleans(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = env.create_volume(false).await?;
    let base = env.snapshot().await?;
    env.export(&mut v).await?;
    env.remove_export(&mut v).await?;
    env.unchanged_since(&base, "left behind").await?;
    Ok(())
}

pub(super) async fn export_in_use(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, env.shared.multiattach()).await?;
    env.connect(&mut v, &a()).await?;
    let t = env.terminate(&mut v, Some(&a()), &[attachment(&b())]).await?;
    ensure!(t.export_in_use, "another live attachment has a connector, but the export is reported unused");
    env.connect(&mut v, &a()).await?;
    let t = env.terminate(&mut v, Some(&a()), &[]).await?;
    ensure!(!t.export_in_use, "no other attachment is left, but the export is reported in use");
    Ok(())
}

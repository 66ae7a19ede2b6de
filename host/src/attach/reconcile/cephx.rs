//! The cephx half of a pass: the identities and images of backends granted `cephx` against the
//! connected attachments and the volumes (the module notes, 3).

use std::collections::HashSet;

use super::{Options, Reconcile, Reconciled};
use crate::attach::AttachError;
use crate::attach::model::{Connector, Live, OpKind};
use crate::attach::ops::{ChangesBy, Subject};
use crate::attach::state::VolumeStatus;
use crate::failpoint;
use crate::store::attachments as rows;
use crate::store::{operations, volumes};

impl Reconcile<'_> {
    /// Removes the cephx identities that no connected attachment holds (see the module notes).
    pub(super) async fn compare_identities(
        &self,
        options: &Options,
        report: &mut Reconciled,
    ) -> Result<(), AttachError> {
        let mut still_seen = HashSet::new();
        for backend in self.catalog.backends() {
            let Some(cephx) = backend.driver.cephx().filter(|c| c.configured()).cloned() else { continue };
            let held = match cephx.held().await {
                Ok(held) => held,
                Err(e) => {
                    report.failed.push((String::new(), format!("cephx identities of {}: {e}", backend.name)));
                    continue;
                }
            };
            let ids: Vec<String> =
                held.iter().filter_map(|h| h.image.strip_prefix("volume-").map(str::to_string)).collect();
            let (connected, busy, known) = self
                .store
                .read(async |tx| {
                    let connected = rows::connected(tx).await?;
                    let busy: HashSet<String> =
                        operations::all(tx).await?.into_iter().map(|o| o.volume_id).collect();
                    let known = volumes::backends(tx, &ids).await?;
                    Ok::<_, AttachError>((connected, busy, known))
                })
                .await?;
            let wanted: HashSet<(String, String)> = connected.iter().filter_map(holder).collect();
            let present: HashSet<String> = held.iter().map(|h| h.entity.clone()).collect();
            self.restore_identities(&backend.name, &cephx, &connected, &busy, &present, report).await?;
            self.compare_images(&backend.name, &cephx, options, report, &mut still_seen).await?;
            for identity in held {
                let Some(volume_id) = identity.image.strip_prefix("volume-") else { continue };
                // A volume this database does not know (another deployment's backend of the same
                // name on the same cluster) is not this service's to judge: drift, left alone.
                if known.get(volume_id).is_none_or(|s| s.backend != backend.name) {
                    if self.reconciler.seen().reported.insert(identity.entity.clone()) {
                        tracing::warn!(identity = %identity.entity, "drift: a cephx identity of this backend for a volume this service does not know; left alone");
                    }
                    report.drift.push(identity.entity.clone());
                    continue;
                }
                if busy.contains(volume_id)
                    || wanted.contains(&(volume_id.to_string(), identity.host_digest.clone()))
                {
                    continue;
                }
                still_seen.insert(identity.entity.clone());
                if !self.due(|s| &mut s.cephx, &identity.entity, options, report, &identity.entity) {
                    continue;
                }
                match self.remove_identity(volume_id, &identity, &cephx).await {
                    Ok(true) => report.identities_removed.push(identity.entity.clone()),
                    Ok(false) => {}
                    Err(e) => report
                        .failed
                        .push((volume_id.to_string(), format!("remove {}: {e}", identity.entity))),
                }
            }
        }
        self.reconciler.seen().cephx.retain(|k, _| still_seen.contains(k));
        Ok(())
    }

    /// The images of the backend's pools named after a volume (`volume-<id>`): one whose volume
    /// was deleted (an image made again behind the service's back, or left by a delete whose
    /// success was wrong) is deleted through the driver, under an operation on the volume, once it
    /// has been seen for the grace period; one of a volume this database does not know is drift,
    /// left alone (another deployment's pool, or an operator's image).
    async fn compare_images(
        &self,
        backend: &str,
        cephx: &crate::capabilities::cephx::CephxCapability,
        options: &Options,
        report: &mut Reconciled,
        still_seen: &mut HashSet<String>,
    ) -> Result<(), AttachError> {
        // Read before the listing: a volume made after it is not taken for one without its image.
        let settled = self
            .store
            .read(async |tx| {
                let settled = [VolumeStatus::Available, VolumeStatus::InUse, VolumeStatus::AwaitingTransfer];
                volumes::settled_of_backend(tx, backend, &settled).await
            })
            .await?;
        let mut images = Vec::new();
        for pool in cephx.pools() {
            match cephx.images(pool).await {
                Ok(names) => images.extend(names.into_iter().map(|i| (pool.clone(), i))),
                Err(e) => {
                    report
                        .failed
                        .push((String::new(), format!("the images of {backend}'s pool {pool}: {e}")));
                    return Ok(());
                }
            }
        }
        let ids: Vec<String> =
            images.iter().filter_map(|(_, i)| i.strip_prefix("volume-").map(str::to_string)).collect();
        let (known, busy) = self
            .store
            .read(async |tx| {
                let known = volumes::backends(tx, &ids).await?;
                let busy: HashSet<String> =
                    operations::all(tx).await?.into_iter().map(|o| o.volume_id).collect();
                Ok::<_, AttachError>((known, busy))
            })
            .await?;
        let listed: HashSet<String> = images.iter().map(|(_, i)| i.clone()).collect();
        for (pool, image) in images {
            let Some(volume_id) = image.strip_prefix("volume-") else { continue };
            let what = format!("image {pool}/{image}");
            match known.get(volume_id) {
                None => {
                    if self.reconciler.seen().reported.insert(what.clone()) {
                        tracing::warn!(image = %what, "drift: an image named after a volume this service does not know; left alone");
                    }
                    report.drift.push(what);
                }
                // An unmanaged volume's image is its data, left to the operator on purpose.
                Some(s) if s.unmanaged => {}
                Some(s) if s.backend == backend && s.deleted && !busy.contains(volume_id) => {
                    still_seen.insert(what.clone());
                    if !self.due(|s| &mut s.cephx, &what, options, report, &what) {
                        continue;
                    }
                    match self.remove_orphan_image(volume_id, &what).await {
                        Ok(true) => report.images_removed.push(format!("{pool}/{image}")),
                        Ok(false) => {}
                        Err(e) => report.failed.push((volume_id.to_string(), format!("remove {what}: {e}"))),
                    }
                }
                Some(_) => {}
            }
        }
        // The other way: a settled volume whose image is in none of the pools. Nothing can make
        // its data again: reported (once per process), after a second look at the image and the
        // row.
        for volume_id in settled.iter().filter(|v| !listed.contains(&format!("volume-{v}"))) {
            let name = format!("volume-{volume_id}");
            let mut found = false;
            for pool in cephx.pools() {
                match cephx.image_exists(pool, &name).await {
                    Ok(false) => {}
                    Ok(true) | Err(_) => found = true,
                }
            }
            let still = self.store.read(async |tx| volumes::get_even_deleted(tx, volume_id).await).await?;
            let settled_now =
                still.is_some_and(|v| matches!(v.status, VolumeStatus::Available | VolumeStatus::InUse));
            if found || !settled_now {
                continue;
            }
            let what = format!("volume {volume_id}: its image {name} is in none of the pools of {backend}");
            if self.reconciler.seen().reported.insert(what.clone()) {
                tracing::error!(volume = %volume_id, image = %name, "reconcile: a volume's image is missing from the backend; nothing can make its data again");
            }
            report.drift.push(what);
        }
        Ok(())
    }

    /// Deletes the image of a deleted volume through the driver's idempotent `delete-volume`,
    /// after checking again under the volume's lock; false when the volume is not deleted after
    /// all.
    async fn remove_orphan_image(&self, volume_id: &str, what: &str) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let volume = self.store.read(async |tx| volumes::get_even_deleted(tx, volume_id).await).await?;
        let Some(volume) = volume.filter(|v| v.status == crate::attach::state::VolumeStatus::Deleted) else {
            return Ok(false);
        };
        let backend = self.backend(&volume)?;
        let op = self
            .begin_operation(OpKind::DeleteVolume, Subject::AsRead(&volume), None, None, ChangesBy::Host)
            .await?;
        tracing::warn!(volume = %volume_id, image = %what, "reconcile: deleting the image of a deleted volume");
        let mut calls = op.calls(&backend.driver);
        let deleted = calls.delete_volume(&volume.contract()).await;
        op.write(async |tx| {
            if deleted.is_ok() {
                self.record_revoked(tx, &volume, None, "image of the deleted volume deleted").await?;
            }
            op.finish(tx).await
        })
        .await?;
        deleted.map_err(AttachError::Driver)?;
        Ok(true)
    }

    /// Makes again, with the key its attachment was given, the identity of each connected
    /// attachment of the backend whose identity is missing (removed behind the service's back),
    /// under an operation on the volume; the attachment's host can then open the image again.
    async fn restore_identities(
        &self,
        backend: &str,
        cephx: &crate::capabilities::cephx::CephxCapability,
        connected: &[Live],
        busy: &HashSet<String>,
        present: &HashSet<String>,
        report: &mut Reconciled,
    ) -> Result<(), AttachError> {
        let missing: Vec<&Live> = connected
            .iter()
            .filter(|l| l.is_connected() && !busy.contains(&l.attachment.volume_id))
            .filter(|l| {
                let Some((_, image, host, _)) = identity_of(l) else { return false };
                !present.contains(&cephx.entity(&image, &host))
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = missing.iter().map(|l| l.attachment.volume_id.clone()).collect();
        let served = self.store.read(async |tx| volumes::backends(tx, &ids).await).await?;
        for live in missing {
            let volume_id = &live.attachment.volume_id;
            if served.get(volume_id).is_none_or(|s| s.backend != backend) {
                continue;
            }
            match self.restore_identity(live, cephx).await {
                Ok(true) => report.repaired.push(volume_id.clone()),
                Ok(false) => {}
                Err(e) => report.failed.push((volume_id.clone(), format!("restore its cephx identity: {e}"))),
            }
        }
        Ok(())
    }

    /// One restore, after checking again under the volume's lock that the attachment is still
    /// connected with the same connection.
    async fn restore_identity(
        &self,
        live: &Live,
        cephx: &crate::capabilities::cephx::CephxCapability,
    ) -> Result<bool, AttachError> {
        let volume_id = &live.attachment.volume_id;
        let _held = self.hold(volume_id).await?;
        let (volume, now) = self.volume_and_live(volume_id).await?;
        let Some(current) = now.iter().find(|l| l.attachment.id == live.attachment.id && l.is_connected())
        else {
            return Ok(false);
        };
        let Some((pool, image, host, keyring)) = identity_of(current) else { return Ok(false) };
        let Some(volume) = volume else { return Ok(false) };
        // Begun only on the volume as read: on the backend the nodes share, another node may have
        // detached the attachment meanwhile, and its identity would be made again for nobody.
        let op = self
            .begin_operation(OpKind::Repair, Subject::AsRead(&volume), None, None, ChangesBy::Host)
            .await?;
        tracing::warn!(
            volume = %volume_id, attachment = %live.attachment.id, identity = %cephx.entity(&image, &host),
            "reconcile: the cephx identity of a connected attachment may be missing; making it again with its key"
        );
        let restored = cephx.restore(&pool, &image, &host, &keyring).await;
        op.write(async |tx| op.finish(tx).await).await?;
        restored.map_err(|e| AttachError::Unavailable(e.to_string()))
    }

    /// Removes an identity no connected attachment holds, after checking again under the
    /// volume's lock, inside an operation on the volume (no flow of any node runs on it
    /// meanwhile); false when an attachment holds it after all.
    async fn remove_identity(
        &self,
        volume_id: &str,
        identity: &crate::capabilities::cephx::Held,
        cephx: &crate::capabilities::cephx::CephxCapability,
    ) -> Result<bool, AttachError> {
        let _held = self.hold(volume_id).await?;
        let (volume, live) = self.volume_and_live(volume_id).await?;
        if live.iter().filter_map(holder).any(|(_, digest)| digest == identity.host_digest) {
            return Ok(false);
        }
        // Begun only on the volume as read: on the backend the nodes share, another node may have
        // connected a host meanwhile.
        let subject = volume.as_ref().map_or(Subject::Id(volume_id), Subject::AsRead);
        let op = self.begin_operation(OpKind::Revoke, subject, None, None, ChangesBy::Host).await?;
        failpoint::hit("reconcile.cephx.intent").await;
        tracing::warn!(volume = %volume_id, identity = %identity.entity, "reconcile: removing a cephx identity that no connected attachment holds");
        let removed = cephx.remove(identity).await;
        op.write(async |tx| {
            if removed.is_ok()
                && let Some(volume) = &volume
            {
                let host = self.host_of_digest(tx, volume_id, &identity.host_digest).await?;
                let connector = host.as_deref().map(Connector::of_host);
                self.record_revoked(tx, volume, connector.as_ref(), "cephx identity removed").await?;
            }
            op.finish(tx).await
        })
        .await?;
        removed.map_err(|e| AttachError::Unavailable(format!("cannot remove {}: {e}", identity.entity)))?;
        Ok(true)
    }
}

/// The identity a connected attachment was given, from its connection info: (pool, image,
/// connector's host, keyring); none for an attachment without one (`identities = shared`,
/// another protocol).
fn identity_of(live: &Live) -> Option<(String, String, String, String)> {
    let host = live.connector.as_ref()?.host()?.to_string();
    let info = live.attachment.connection_info.as_ref()?;
    let info = info.get("data").unwrap_or(info);
    let keyring = info.get("keyring")?.as_str()?.to_string();
    let (pool, image) = info.get("name")?.as_str()?.split_once('/')?;
    Some((pool.to_string(), image.to_string(), host, keyring))
}

/// The (volume, digest of the connector's host) a connected attachment holds an identity for.
fn holder(live: &Live) -> Option<(String, String)> {
    let host = live.connector.as_ref().filter(|_| live.is_connected())?.host()?;
    Some((live.attachment.volume_id.clone(), crate::capabilities::cephx::host_digest(host)))
}

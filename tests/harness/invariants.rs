//! The invariants every fault test checks after the dust settles, read from the database file
//! and from tgtd (`tgtadm --op show`), independently of the service's API:
//!
//! - no operation is left unfinished, and no volume is `creating`, `deleting` or `extending`;
//! - every volume's status is what its live attachments make it;
//! - every connected attachment (`attaching`/`attached` with a connector) has its export: the
//!   volume's target, a LUN, one CHAP account, and the initiator in the ACL;
//! - the attach history agrees with the attachments: every chain verifies, a connected
//!   attachment's last access event is `granted`, and an attachment whose last one is `granted`
//!   is connected (or in an error status, whose access is unknown: the conservative answer);
//! - nothing on tgtd that no connected attachment needs: every target was created by the
//!   service for a volume with a connected attachment, every ACL entry is a connected
//!   attachment's initiator. (By design an export may be kept inert for a while after its
//!   volume's last attachment goes, for reuse: a target with no ACL entry and no account bound,
//!   its LUNs only on its own volume's store, and an unbound CHAP account; inert, they admit
//!   nobody. See `[tgt] keep_exports_seconds`.)

use berth::capabilities::iscsi::initiators::{initiator_prefix, is_initiator_account};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use berth::capabilities::iscsi::TargetState;
use berth::domain::state::{AttachStatus, VolumeStatus, as_seen, settle};
use berth::store::{Store, StoreOptions};
use serde_json::Value;

use crate::tgt::TgtdProcess;

/// A volume as stored.
#[derive(Debug, Clone)]
pub struct StoredVolume {
    pub id: String,
    pub status: String,
    pub multiattach: bool,
    pub size_gib: i64,
    /// The backend (and node) that serves it.
    pub service_uuid: Option<String>,
}

/// A live attachment as stored, with its connector's initiator.
#[derive(Debug, Clone)]
pub struct StoredAttachment {
    pub id: String,
    pub volume_id: String,
    pub status: String,
    pub legacy: bool,
    pub initiator: Option<String>,
    pub has_connector: bool,
}

impl StoredAttachment {
    pub fn is_connected(&self) -> bool {
        self.has_connector && (self.status == "attaching" || self.status == "attached")
    }
}

/// The database and tgtd, read at one moment.
#[derive(Debug, Clone, Default)]
pub struct World {
    pub volumes: BTreeMap<String, StoredVolume>,
    pub attachments: Vec<StoredAttachment>,
    /// Recorded targets: iqn -> volume.
    pub recorded: BTreeMap<String, String>,
    /// Unfinished operations: (kind, volume).
    pub operations: Vec<(String, String)>,
    pub targets: Vec<TargetState>,
    pub accounts: Vec<String>,
    /// The attach history: each attachment's last access event (`granted` or `revoked`).
    pub last_access: BTreeMap<String, String>,
    /// What `berth history verify` finds wrong.
    pub history_breaks: Vec<String>,
    /// `revoke` events (access ended where no connected attachment held it): (volume, initiator).
    pub revokes: BTreeSet<(String, String)>,
}

impl World {
    pub fn live_of(&self, volume: &str) -> impl Iterator<Item = &StoredAttachment> {
        self.attachments.iter().filter(move |a| a.volume_id == volume)
    }

    pub fn attachment(&self, id: &str) -> Option<&StoredAttachment> {
        self.attachments.iter().find(|a| a.id == id)
    }

    /// The target of a volume on tgtd, if any.
    pub fn target_of(&self, volume: &str) -> Option<&TargetState> {
        self.targets.iter().find(|t| self.recorded.get(&t.iqn).is_some_and(|v| v == volume))
    }
}

/// Opens the service's database (read side).
pub async fn open(url: &str) -> Store {
    Store::open(url, &StoreOptions::default()).await.expect("open the service's database")
}

/// Reads the world.
pub async fn snapshot(store: &Store, tgtd: &TgtdProcess) -> World {
    let mut world = snapshot_database(store).await;
    world.targets = tgtd.targets();
    world.accounts = tgtd.accounts();
    world
}

/// Reads the database's side of the world (for backends without a tgtd).
pub async fn snapshot_database(store: &Store) -> World {
    let mut world = store
        .read(async |tx| {
            let mut w = World::default();
            for r in tx
                .query(
                    "SELECT id, status, multiattach, service_uuid, size_gib FROM volumes WHERE deleted = 0",
                    &[],
                )
                .await?
            {
                let v = StoredVolume {
                    id: r.text(0)?,
                    status: r.text(1)?,
                    multiattach: r.flag(2)?,
                    service_uuid: r.opt_text(3)?,
                    size_gib: r.int(4)?,
                };
                w.volumes.insert(v.id.clone(), v);
            }
            let mut specs: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
            for r in tx.query("SELECT attachment_id, key, value FROM attachment_specs", &[]).await? {
                specs.entry(r.text(0)?).or_default().insert(r.text(1)?, r.text(2)?);
            }
            for r in tx
                .query(
                    "SELECT id, volume_id, attach_status, legacy FROM volume_attachment WHERE deleted = 0",
                    &[],
                )
                .await?
            {
                let id = r.text(0)?;
                let spec = specs.get(&id);
                let initiator = spec
                    .and_then(|s| s.get("initiator"))
                    .and_then(|v| serde_json::from_str::<Value>(v).ok())
                    .and_then(|v| v.as_str().map(str::to_string));
                w.attachments.push(StoredAttachment {
                    volume_id: r.text(1)?,
                    status: r.text(2)?,
                    legacy: r.flag(3)?,
                    initiator,
                    has_connector: spec.is_some_and(|s| !s.is_empty()),
                    id,
                });
            }
            for r in tx.query("SELECT iqn, volume_id FROM targets", &[]).await? {
                w.recorded.insert(r.text(0)?, r.text(1)?);
            }
            for r in tx.query("SELECT kind, volume_id FROM operations", &[]).await? {
                w.operations.push((r.text(0)?, r.text(1)?));
            }
            for r in tx
                .query(
                    "SELECT attachment_id, access FROM attach_events WHERE access <> 'none' \
                     AND attachment_id IS NOT NULL ORDER BY volume_id, seq",
                    &[],
                )
                .await?
            {
                w.last_access.insert(r.text(0)?, r.text(1)?);
            }
            for r in
                tx.query("SELECT volume_id, initiator FROM attach_events WHERE event = 'revoke'", &[]).await?
            {
                w.revokes.insert((r.text(0)?, r.opt_text(1)?.unwrap_or_default()));
            }
            Ok::<_, berth::store::StoreError>(w)
        })
        .await
        .expect("read the service's database");
    let verified = berth::attach::history::verify(store).await.expect("verify the attach history");
    world.history_breaks = verified.breaks.iter().map(|b| b.to_string()).collect();
    world
}

/// What is wrong with a world (empty when every invariant holds).
pub fn violations(w: &World) -> Vec<String> {
    violations_with(w, |_| true)
}

/// The same, where the tgtd read is the one that exports the volumes `exported` picks (a node's
/// tgtd: the volumes it owns); it must export none of the others.
pub fn violations_with(w: &World, exported: impl Fn(&StoredVolume) -> bool) -> Vec<String> {
    let exported = |id: &str| w.volumes.get(id).is_some_and(&exported);
    let mut out = Vec::new();
    for (kind, volume) in &w.operations {
        out.push(format!("operation {kind} on volume {volume} is unfinished"));
    }
    out.extend(w.history_breaks.iter().map(|b| format!("attach history: {b}")));
    for a in &w.attachments {
        let last = w.last_access.get(&a.id).map(String::as_str);
        if a.is_connected() && last != Some("granted") {
            out.push(format!(
                "attachment {} is connected but its history's last access event is {last:?}",
                a.id
            ));
        }
        if last == Some("granted")
            && !a.is_connected()
            && !["error_attaching", "error_detaching"].contains(&a.status.as_str())
        {
            out.push(format!(
                "attachment {} is {} without connection but its history says granted",
                a.id, a.status
            ));
        }
    }
    for (id, last) in &w.last_access {
        if last == "granted" && w.attachment(id).is_none() {
            out.push(format!("attachment {id} is gone but its history's last access event is granted"));
        }
    }
    for v in w.volumes.values() {
        let live: Vec<&StoredAttachment> = w.live_of(&v.id).collect();
        if ["creating", "deleting", "extending"].contains(&v.status.as_str()) {
            out.push(format!("volume {} is stuck in {}", v.id, v.status));
        }
        if live.is_empty() {
            if !["available", "error", "error_deleting"].contains(&v.status.as_str()) {
                out.push(format!("volume {} has no attachment but is {}", v.id, v.status));
            }
        } else {
            let statuses: Vec<AttachStatus> = live
                .iter()
                .map(|a| as_seen(AttachStatus::parse(&a.status).expect("a known status"), a.legacy))
                .collect();
            let (want, _) = settle(&statuses, v.status == "detaching");
            if VolumeStatus::parse(&v.status) != Some(want) {
                out.push(format!(
                    "volume {} is {} but its attachments {:?} make it {want}",
                    v.id,
                    v.status,
                    live.iter().map(|a| &a.status).collect::<Vec<_>>()
                ));
            }
            if !v.multiattach && live.len() > 1 {
                out.push(format!("non-multiattach volume {} has {} live attachments", v.id, live.len()));
            }
        }
    }
    // Connected attachments have their export.
    for a in w.attachments.iter().filter(|a| a.is_connected() && exported(&a.volume_id)) {
        let Some(initiator) = &a.initiator else { continue };
        match w.target_of(&a.volume_id) {
            None => {
                out.push(format!("connected attachment {} of volume {} has no target", a.id, a.volume_id))
            }
            Some(t) => {
                if t.luns.is_empty() {
                    out.push(format!("target {} of connected attachment {} has no LUN", t.iqn, a.id));
                }
                // CHAP for everyone admitted: the initiator's own account (per-initiator
                // accounts), or the export's one account (per-export).
                let own = |u: &String| {
                    backend_of(&t.iqn).is_some_and(|b| u.starts_with(&initiator_prefix(b, initiator)))
                };
                let per_export = t.chap_users.iter().filter(|u| !is_initiator_account(u)).count();
                if per_export > 1 || (per_export == 0 && !t.chap_users.iter().any(own)) {
                    out.push(format!(
                        "target {} has CHAP accounts {:?} bound: neither one export's account nor {initiator}'s own",
                        t.iqn, t.chap_users
                    ));
                }
                if !t.initiators.contains(initiator) {
                    out.push(format!(
                        "connected attachment {} ({initiator}) is not in the ACL of {}",
                        a.id, t.iqn
                    ));
                }
            }
        }
    }
    // Nothing nobody needs.
    for t in &w.targets {
        let Some(volume) = w.recorded.get(&t.iqn) else {
            // An inert target is an export kept for reuse after its volume's last attachment
            // went: it admits nobody, it must belong to a live volume, and its LUNs expose only
            // that volume's store.
            let of = w.volumes.keys().find(|v| exported(v) && t.iqn.ends_with(&format!("volume-{v}")));
            let inert = t.initiators.is_empty()
                && t.chap_users.is_empty()
                && of.is_some_and(|v| t.luns.iter().all(|(_, p)| p.ends_with(&format!("/volume-{v}.img"))));
            if !inert {
                out.push(format!("target {} on tgtd was not recorded by the service", t.iqn));
            }
            continue;
        };
        if !exported(volume) && w.volumes.contains_key(volume) {
            out.push(format!(
                "target {} on this tgtd exports volume {volume}, which another node serves",
                t.iqn
            ));
            continue;
        }
        let wanted: BTreeSet<&String> =
            w.live_of(volume).filter(|a| a.is_connected()).filter_map(|a| a.initiator.as_ref()).collect();
        if wanted.is_empty() {
            out.push(format!(
                "target {} of volume {volume} exists but no attachment of it is connected",
                t.iqn
            ));
        }
        for i in &t.initiators {
            if !wanted.contains(i) {
                out.push(format!("ACL entry {i} on {} belongs to no connected attachment", t.iqn));
            }
        }
        // A per-initiator account stays bound only while its initiator is connected.
        for u in t.chap_users.iter().filter(|u| is_initiator_account(u)) {
            let whose = backend_of(&t.iqn)
                .is_some_and(|b| wanted.iter().any(|i| u.starts_with(&initiator_prefix(b, i))));
            if !whose {
                out.push(format!("CHAP account {u} on {} belongs to no connected initiator", t.iqn));
            }
        }
    }
    for account in w.targets.iter().flat_map(|t| &t.chap_users) {
        if !w.accounts.contains(account) {
            out.push(format!("CHAP account {account} is bound but tgtd does not list it"));
        }
    }
    out
}

/// The backend of a target named with the default prefix, `iqn.2010-10.org.openstack:<backend>:`.
fn backend_of(iqn: &str) -> Option<&str> {
    iqn.strip_prefix("iqn.2010-10.org.openstack:")?.split_once(':').map(|(b, _)| b)
}

/// Waits until every invariant holds (the reconciler may still be at work), up to `timeout`;
/// returns the world, or the violations that remained.
pub async fn settled(
    store: &Store,
    tgtd: &TgtdProcess,
    timeout: Duration,
) -> Result<World, (World, Vec<String>)> {
    let deadline = Instant::now() + timeout;
    loop {
        let world = snapshot(store, tgtd).await;
        let wrong = violations(&world);
        if wrong.is_empty() {
            return Ok(world);
        }
        if Instant::now() > deadline {
            return Err((world, wrong));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

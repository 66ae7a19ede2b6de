//! The attach history, as the flows record it: every change to a volume's or an attachment's
//! access appends an event to the volume's chain in the transaction that makes the change
//! ([`Service::record`]), so the history holds exactly what was committed, on every node.
//!
//! Who asked travels with the operation: [`Service::owned`] runs each flow in the scope of its
//! caller ([`AUDIT`], a task-local, as a tracing span carries a request id), so no flow passes it
//! along by hand. Work nobody asked for (the reconciler, a recovery found by a background pass)
//! is recorded as the service's own.

use std::future::Future;

use super::list::Scope;
use super::model::{Attachment, Connector, Volume};
use super::state::Event;
use super::{AttachError, Caller, Service};
use std::collections::{HashMap, HashSet};

use crate::domain::history::{Access, AttachEvent, Break, ChainCheck, EventFilter, Head, NewEvent};
use crate::store::sql::Tx;
use crate::store::{Store, StoreError, attachments, events, now_micros, volumes};

tokio::task_local! {
    /// The caller of the operation this task runs.
    static AUDIT: Caller;
    /// The digest of the driver whose calls the operation writing now made.
    static RAN_BY: Option<String>;
}

/// Runs `write`, an operation's transaction, as made by the driver whose digest is `digest`:
/// what it records names that driver, even if the backend's driver was switched since
/// (`runtime/slot.rs`).
pub(super) fn ran_by<F: Future>(digest: Option<String>, write: F) -> impl Future<Output = F::Output> {
    RAN_BY.scope(digest, write)
}

/// Runs `flow` on behalf of `caller`: what it records names them.
pub(super) fn on_behalf_of<F: Future>(caller: Caller, flow: F) -> impl Future<Output = F::Output> {
    AUDIT.scope(caller, flow)
}

/// The caller of the running operation (the service itself outside any).
pub(super) fn current_caller() -> Caller {
    AUDIT.try_with(Caller::clone).unwrap_or_else(|_| Caller::service())
}

/// An event's name: the state machine's, in kebab case (`ForceDetach` is `force-detach`).
pub(crate) fn event_name(event: Event) -> String {
    let debug = format!("{event:?}");
    let mut out = String::with_capacity(debug.len() + 4);
    for (i, c) in debug.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// One change to record.
pub(crate) struct Change<'a> {
    pub event: Event,
    pub access: Access,
    /// The attachment as written by the change (or as it was, when the change removed it).
    pub attachment: Option<&'a Attachment>,
    /// The connector whose access changed, or the attachment's.
    pub connector: Option<&'a Connector>,
    /// The outcome, when it is not the attachment's status (`failed`, `detached`).
    pub outcome: Option<&'a str>,
}

impl Change<'_> {
    pub(crate) fn of(event: Event, access: Access, attachment: &Attachment) -> Change<'_> {
        Change { event, access, attachment: Some(attachment), connector: None, outcome: None }
    }
}

impl Service {
    /// Appends `change` to `volume`'s history, in the caller's transaction (which holds the
    /// volume's row).
    pub(crate) async fn record(
        &self,
        tx: &mut Tx,
        volume: &Volume,
        change: Change<'_>,
    ) -> Result<(), AttachError> {
        let caller = current_caller();
        let a = change.attachment;
        let outcome = match (change.outcome, a) {
            (Some(o), _) => o.to_string(),
            (None, Some(a)) => a.status.to_string(),
            (None, None) => volume.status.to_string(),
        };
        let event = NewEvent {
            volume_id: volume.id.clone(),
            at: now_micros(),
            event: event_name(change.event),
            access: change.access,
            outcome,
            project_id: volume.project_id.clone(),
            attachment_id: a.map(|a| a.id.clone()),
            instance_uuid: a.and_then(|a| a.instance_uuid.clone()),
            host: change
                .connector
                .and_then(|c| c.host().map(str::to_string))
                .or_else(|| a.and_then(|a| a.attached_host.clone())),
            initiator: change.connector.and_then(|c| c.initiator().map(str::to_string)),
            user_id: caller.user_id,
            caller_project_id: caller.project_id,
            roles: caller.roles,
            service_token: caller.is_service,
            request_id: caller.request.id,
            global_request_id: caller.request.global,
            node: self.owner.node.clone(),
            driver_digest: RAN_BY
                .try_with(Option::clone)
                .ok()
                .flatten()
                .or_else(|| self.catalog.backend(&volume.backend).map(|b| b.driver.digest().to_string())),
        };
        events::append(tx, event).await?;
        Ok(())
    }

    /// The compute host whose name has the digest `digest` (`capabilities::cephx::host_digest`:
    /// a cephx identity names its host only so), among the hosts `volume_id`'s history gave
    /// access; none if the history names no such host (a pruned chain).
    pub(crate) async fn host_of_digest(
        &self,
        tx: &mut Tx,
        volume_id: &str,
        digest: &str,
    ) -> Result<Option<String>, AttachError> {
        let filter = EventFilter {
            volume_id: Some(volume_id.to_string()),
            access: Some(Access::Granted),
            ..EventFilter::default()
        };
        let granted = events::list(tx, Scope::All, &filter, None, HOSTS_LOOKED_AT).await?;
        Ok(granted
            .into_iter()
            .filter_map(|e| e.fields.host)
            .find(|host| crate::capabilities::cephx::host_digest(host) == digest))
    }

    /// The attach history the caller may read (admins: every project's; `all`: ask for them),
    /// in time order.
    pub async fn list_events(
        &self,
        caller: &Caller,
        all: bool,
        filter: &EventFilter,
        marker: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AttachEvent>, AttachError> {
        let scope = if all && caller.is_admin() { Scope::All } else { caller.own_project() };
        list(&self.store, scope, filter, marker, limit).await
    }
}

/// The events in `scope` that `filter` selects, oldest first, after the event `marker` names (by
/// its id), at most `limit`: the API's list and `berth history list`.
pub async fn list(
    store: &Store,
    scope: Scope<'_>,
    filter: &EventFilter,
    marker: Option<&str>,
    limit: i64,
) -> Result<Vec<AttachEvent>, AttachError> {
    store
        .read(async |tx| {
            let marker =
                match marker {
                    Some(m) => Some(events::get(tx, m, scope).await?.ok_or_else(|| {
                        AttachError::NotFound(format!("Marker event {m} could not be found."))
                    })?),
                    None => None,
                };
            Ok(events::list(tx, scope, filter, marker.as_ref(), limit).await?)
        })
        .await
}

/// How many of a volume's grants [`Service::host_of_digest`] looks at.
const HOSTS_LOOKED_AT: i64 = 1000;

/// What `berth history verify` found.
#[derive(Debug, Default)]
pub struct Verified {
    pub chains: usize,
    pub events: usize,
    /// The first break of each broken chain.
    pub breaks: Vec<Break>,
}

/// Checks every volume's chain against its recorded head (`domain::history::ChainCheck`), in
/// one snapshot of the database (events recorded meanwhile are not half-seen), reading the
/// events in pages of [`PAGE`] in chain order: one query per page, not per volume, and
/// never more than a page in memory.
pub async fn verify(store: &Store) -> Result<Verified, AttachError> {
    verify_in_pages(store, PAGE).await
}

/// Events read per query by [`verify`] and [`export`].
const PAGE: i64 = 500;

async fn verify_in_pages(store: &Store, page: i64) -> Result<Verified, AttachError> {
    store
        .read(async |tx| {
            let heads = events::heads(tx).await?;
            let by_volume: HashMap<&str, &Head> = heads.iter().map(|h| (h.volume_id.as_str(), h)).collect();
            let mut out = Verified { chains: heads.len(), ..Verified::default() };
            let mut seen: HashSet<&str> = HashSet::new();
            // The chain being read: its check, or `None` once it broke.
            let mut current: Option<(&str, Option<ChainCheck<'_>>)> = None;
            in_chain_order(tx, None, page, |e| {
                out.events += 1;
                if current.as_ref().is_none_or(|(v, _)| *v != e.fields.volume_id) {
                    if let Some((_, Some(check))) = current.take()
                        && let Err(b) = check.finish()
                    {
                        out.breaks.push(b);
                    }
                    let Some((volume, head)) = by_volume.get_key_value(e.fields.volume_id.as_str()) else {
                        // Recorded after the heads were read: not in this snapshot's chains.
                        return Ok::<_, AttachError>(());
                    };
                    seen.insert(volume);
                    current = Some((volume, Some(ChainCheck::new(head))));
                }
                if let Some((_, slot)) = &mut current
                    && let Some(check) = slot
                    && let Err(b) = check.next(e)
                {
                    out.breaks.push(b);
                    *slot = None;
                }
                Ok(())
            })
            .await?;
            if let Some((_, Some(check))) = current.take()
                && let Err(b) = check.finish()
            {
                out.breaks.push(b);
            }
            // Heads whose chains have no event left.
            for head in heads.iter().filter(|h| !seen.contains(h.volume_id.as_str())) {
                if let Err(b) = ChainCheck::new(head).finish() {
                    out.breaks.push(b);
                }
            }
            out.breaks.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
            Ok(out)
        })
        .await
}

/// The events recorded before `until` (all: `None`), chain by chain, each handed to `sink`: a
/// segment to archive before [`prune`] (which takes the same bound). Read in one snapshot of the
/// database, in pages of [`PAGE`]: never more than a page in memory, however long the history.
/// Returns how many events were handed over; stops at the first error of `sink`.
pub async fn export<E: From<StoreError>>(
    store: &Store,
    until: Option<i64>,
    sink: impl FnMut(&AttachEvent) -> Result<(), E>,
) -> Result<usize, E> {
    export_in_pages(store, until, PAGE, sink).await
}

async fn export_in_pages<E: From<StoreError>>(
    store: &Store,
    until: Option<i64>,
    page: i64,
    sink: impl FnMut(&AttachEvent) -> Result<(), E>,
) -> Result<usize, E> {
    store.read(async |tx| in_chain_order(tx, until, page, sink).await).await
}

/// Hands every event recorded before `until` (all: `None`) to `each`, volume by volume and in
/// each chain's order, reading them in pages of `page` in the caller's transaction; returns how
/// many. Stops at the first error of `each`.
async fn in_chain_order<E: From<StoreError>>(
    tx: &mut Tx,
    until: Option<i64>,
    page: i64,
    mut each: impl FnMut(&AttachEvent) -> Result<(), E>,
) -> Result<usize, E> {
    let mut after: Option<(String, i64)> = None;
    let mut handed = 0;
    loop {
        let batch =
            events::chains_after(tx, after.as_ref().map(|(v, s)| (v.as_str(), *s)), until, page).await?;
        for e in &batch {
            each(e)?;
        }
        handed += batch.len();
        match batch.last() {
            Some(last) if batch.len() as i64 == page => {
                after = Some((last.fields.volume_id.clone(), last.seq))
            }
            _ => return Ok(handed),
        }
    }
}

/// Events deleted in each of [`prune`]'s writes.
const PRUNE_BATCH: i64 = 1000;

/// Deletes the events recorded before `before`, oldest first, in writes of [`PRUNE_BATCH`]: each
/// holds the writer for milliseconds, so the service's own writes go on between them (all at once,
/// 500,000 of 1,000,000 events held SQLite's writer for 3 s). After each write it waits as long as
/// the write took, so that a long retention takes at most half of the writer's time. After each
/// write the rest of every chain verifies.
pub async fn prune(store: &Store, before: i64) -> Result<u64, AttachError> {
    let (mut pruned, mut since) = (0, i64::MIN);
    loop {
        let began = std::time::Instant::now();
        let Some(step) = store.write(async |tx| events::prune(tx, since, before, PRUNE_BATCH).await).await?
        else {
            return Ok(pruned);
        };
        pruned += step.events;
        since = step.through;
        tokio::time::sleep(began.elapsed()).await;
    }
}

/// What the history's retention deleted ([`retain_since`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retained {
    pub events: u64,
    /// Rows of deleted attachments.
    pub attachments: u64,
    /// Rows of deleted volumes.
    pub volumes: u64,
}

/// The history's retention (`[history] keep_days`, `berth history prune`): the events recorded
/// before `before` ([`prune`]), then the rows of attachments deleted before then of which no event
/// is left, then those of volumes deleted before then of which nothing is left (no attachment
/// row, no event, no operation, no recorded target).
pub async fn retain_since(store: &Store, before: i64) -> Result<Retained, AttachError> {
    let events = prune(store, before).await?;
    let attachments = purge_rows(store, before, Rows::Attachments).await?;
    let volumes = purge_rows(store, before, Rows::Volumes).await?;
    Ok(Retained { events, attachments, volumes })
}

/// Rows the retention deletes for good once their history is gone.
#[derive(Clone, Copy)]
enum Rows {
    Attachments,
    Volumes,
}

/// Deletes for good the rows of attachments or volumes deleted before `before` of which nothing
/// is left (after [`prune`]): without it, every attachment and volume ever made would keep its
/// row. In batches: each found by a read, which does not hold the writer (the last one reads the
/// whole table: 0.13 to 0.15 s for 1,000,000 deleted attachment rows kept, in a table of this shape
/// on this machine), and deleted by a short write. Returns how many went.
async fn purge_rows(store: &Store, before: i64, rows: Rows) -> Result<u64, AttachError> {
    const BATCH: i64 = 1000;
    let mut purged = 0;
    loop {
        let ids = store
            .read(async |tx| match rows {
                Rows::Attachments => attachments::purgeable(tx, before, BATCH).await,
                Rows::Volumes => volumes::purgeable(tx, before, BATCH).await,
            })
            .await?;
        if ids.is_empty() {
            return Ok(purged);
        }
        let n = store
            .write(async |tx| match rows {
                Rows::Attachments => attachments::purge(tx, &ids, before).await,
                Rows::Volumes => volumes::purge(tx, &ids, before).await,
            })
            .await?;
        purged += n;
        if (ids.len() as i64) < BATCH || n == 0 {
            return Ok(purged);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_kebab_case() {
        assert_eq!(event_name(Event::ForceDetach), "force-detach");
        assert_eq!(event_name(Event::Connect), "connect");
        assert_eq!(event_name(Event::ReserveForMigration), "reserve-for-migration");
    }
}

// The test writes and tampers with the stored history as someone with the database would: SQL
// outside store/ on purpose.
#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod verify_tests {
    use super::*;
    use crate::params;
    use crate::store::StoreError;
    use crate::store::events::testing::{event, temp_store, volume_row};

    /// Volumes with chains of these lengths.
    async fn store_with_chains(lengths: &[usize]) -> (tempfile::TempDir, Store, Vec<Vec<AttachEvent>>) {
        let (dir, store) = temp_store().await;
        let mut chains = Vec::new();
        for (i, n) in lengths.iter().enumerate() {
            let v = format!("volume-{i}");
            let chain = store
                .write(async |tx| {
                    volume_row(tx, &v).await?;
                    let mut chain = Vec::new();
                    for k in 0..*n {
                        chain.push(events::append(tx, event(&v, 1_000_000 + k as i64)).await?);
                    }
                    Ok::<_, StoreError>(chain)
                })
                .await
                .unwrap();
            chains.push(chain);
        }
        (dir, store, chains)
    }

    #[tokio::test]
    async fn export_hands_over_the_segment_before_its_bound_in_pages_and_stops_at_a_sink_error() {
        // Events at 1_000_000 + k: before 1_000_002, each chain's first two.
        let (_dir, store, chains) = store_with_chains(&[3, 1, 5, 0, 4]).await;
        let ids = |lengths: &[(usize, usize)]| -> Vec<String> {
            lengths.iter().flat_map(|&(c, n)| chains[c][..n].iter().map(|e| e.id.clone())).collect()
        };
        for page in [1, 2, 3, 1000] {
            let mut all = Vec::new();
            let n = export_in_pages(&store, None, page, |e| {
                all.push(e.id.clone());
                Ok::<_, StoreError>(())
            })
            .await
            .unwrap();
            assert_eq!((n, &all), (13, &ids(&[(0, 3), (1, 1), (2, 5), (4, 4)])), "page {page}");
            let mut before: Vec<AttachEvent> = Vec::new();
            export_in_pages(&store, Some(1_000_002), page, |e| {
                before.push(e.clone());
                Ok::<_, StoreError>(())
            })
            .await
            .unwrap();
            let got: Vec<String> = before.iter().map(|e| e.id.clone()).collect();
            assert_eq!(got, ids(&[(0, 2), (1, 1), (2, 2), (4, 2)]), "page {page}");
            // What was handed over is a segment that verifies on its own, chain by chain.
            assert_eq!(crate::domain::history::verify_segment(&before), Ok(4), "page {page}");
        }
        let mut seen = 0;
        let stopped = export_in_pages(&store, None, 2, |_| {
            seen += 1;
            if seen == 3 { Err(StoreError::Finished) } else { Ok(()) }
        })
        .await;
        assert!(matches!(stopped, Err(StoreError::Finished)) && seen == 3, "{stopped:?}");
    }

    #[tokio::test]
    async fn verify_reads_the_history_in_pages_and_finds_each_break_across_their_edges() {
        let (_dir, store, chains) = store_with_chains(&[3, 1, 5, 0, 4]).await;
        for page in [1, 2, 3, 1000] {
            let v = verify_in_pages(&store, page).await.unwrap();
            assert_eq!((v.chains, v.events, v.breaks.len()), (4, 13, 0), "page {page}: {:?}", v.breaks);
        }
        let plan = store
            .read(async |tx| {
                let rows = tx
                    .query(
                        "EXPLAIN QUERY PLAN SELECT id FROM attach_events WHERE (volume_id, seq) > ($1, $2) \
                         AND at < $3 ORDER BY volume_id, seq LIMIT 5",
                        &params!["volume-1", 1, i64::MAX],
                    )
                    .await?;
                rows.iter().map(|r| r.text(3)).collect::<Result<Vec<_>, _>>()
            })
            .await
            .unwrap()
            .join("; ");
        assert!(plan.contains("SEARCH") && plan.contains("attach_events_chain"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");

        // The first chain loses its last event, the third has its middle one edited, the last
        // loses every event.
        store
            .write(async |tx| {
                tx.execute("DELETE FROM attach_events WHERE id = $1", &params![&chains[0][2].id]).await?;
                tx.execute(
                    "UPDATE attach_events SET host = 'elsewhere' WHERE id = $1",
                    &params![&chains[2][2].id],
                )
                .await?;
                tx.execute("DELETE FROM attach_events WHERE volume_id = 'volume-4'", &[]).await
            })
            .await
            .unwrap();
        for page in [1, 2, 3, 1000] {
            let v = verify_in_pages(&store, page).await.unwrap();
            let found: Vec<_> =
                v.breaks.iter().map(|b| (b.volume_id.as_str(), b.event_id.clone(), b.seq)).collect();
            assert_eq!(
                found,
                [
                    ("volume-0", None, 2),
                    ("volume-2", Some(chains[2][2].id.clone()), 3),
                    ("volume-4", None, 0)
                ],
                "page {page}"
            );
            assert_eq!(v.events, 8, "page {page}");
        }
    }
}

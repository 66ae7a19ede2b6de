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
use crate::domain::history::{Access, AttachEvent, Break, EventFilter, NewEvent, verify_chain};
use crate::store::sql::Tx;
use crate::store::{Store, events, now_micros};

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
fn current_caller() -> Caller {
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
        self.store
            .read(async |tx| {
                let marker = match marker {
                    Some(m) => Some(events::get(tx, m, scope).await?.ok_or_else(|| {
                        AttachError::NotFound(format!("Marker event {m} could not be found."))
                    })?),
                    None => None,
                };
                Ok(events::list(tx, scope, filter, marker.as_ref(), limit).await?)
            })
            .await
    }
}

/// What `berth history verify` found.
#[derive(Debug, Default)]
pub struct Verified {
    pub chains: usize,
    pub events: usize,
    /// The first break of each broken chain.
    pub breaks: Vec<Break>,
}

/// Checks every volume's chain against its recorded head (`domain::history::verify_chain`).
pub async fn verify(store: &Store) -> Result<Verified, AttachError> {
    let heads = store.read(async |tx| events::heads(tx).await).await?;
    let mut out = Verified { chains: heads.len(), ..Verified::default() };
    for head in heads {
        let chain = store.read(async |tx| events::chain(tx, &head.volume_id, 0, i64::MAX).await).await?;
        out.events += chain.len();
        if let Err(b) = verify_chain(&head, &chain) {
            out.breaks.push(b);
        }
    }
    Ok(out)
}

/// The events recorded before `until` (all: `None`), chain by chain: a segment to archive.
pub async fn export(store: &Store, until: Option<i64>) -> Result<Vec<AttachEvent>, AttachError> {
    Ok(store.read(async |tx| events::segment(tx, until).await).await?)
}

/// Deletes the events recorded before `before`; the rest of each chain still verifies.
pub async fn prune(store: &Store, before: i64) -> Result<u64, AttachError> {
    Ok(store.write(async |tx| events::prune(tx, before).await).await?)
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

//! User messages (Cinder's `/messages`, 3.3; `cinder message-list`): why an operation on a
//! project's volume failed, for its users to read afterwards, as Cinder records them. A caller
//! that waited has the error already; a message is for the others: a user who finds a volume in
//! `error` or an attachment in `error_attaching` later, and the operations that nobody waited for
//! (an interrupted create or extend that recovery finished). Recorded for a driver that failed
//! to make a volume, to grow it, to attach it or to detach it, in the transaction that records
//! the failure, so a message exists exactly when its failure does; and for Nova when it did not
//! take the news that an attached volume grew (`compute.rs`). Worded by Cinder's action and
//! detail ids (`domain/messages.rs`), never by the driver's own words. A message belongs to the
//! volume's project, names the request that failed (none for the service's own work) and expires
//! after `[messages] keep_days`; a member of the project may delete it.

use super::list::Scope;
use super::model::Volume;
use super::{AttachError, Caller, Service};
use crate::domain::list::{MessageFilter, Page};
use crate::domain::messages::{Action, Detail, RESOURCE_VOLUME, event_id};
use crate::store::messages::{self, Message};
use crate::store::now_micros;
use crate::store::sql::Tx;

fn message_not_found(id: &str) -> AttachError {
    AttachError::NotFound(format!("Message {id} could not be found."))
}

/// Records that `action` on `volume`, asked by the request `request_id`, failed with `detail`;
/// the message is kept `keep_days`.
pub(super) async fn tell(
    tx: &mut Tx,
    volume: &Volume,
    request_id: Option<String>,
    keep_days: u32,
    action: Action,
    detail: Detail,
) -> Result<(), AttachError> {
    let now = now_micros();
    let message = Message {
        id: uuid::Uuid::new_v4().to_string(),
        project_id: volume.project_id.clone(),
        request_id,
        resource_type: RESOURCE_VOLUME.into(),
        resource_uuid: Some(volume.id.clone()),
        event_id: event_id(RESOURCE_VOLUME, action.id(), detail.id()),
        action_id: action.id().into(),
        detail_id: detail.id().into(),
        message_level: "ERROR".into(),
        created_at: now,
        expires_at: now + i64::from(keep_days) * 86_400_000_000,
    };
    messages::insert(tx, &message).await?;
    Ok(())
}

impl Service {
    /// Records, in the caller's transaction (the failure's), that `action` on `volume` failed
    /// with `detail`.
    pub(super) async fn tell(
        &self,
        tx: &mut Tx,
        volume: &Volume,
        action: Action,
        detail: Detail,
    ) -> Result<(), AttachError> {
        let request_id = super::history::current_caller().request.id;
        tell(tx, volume, request_id, self.limits.keep_messages_days, action, detail).await
    }

    /// A message the caller may read.
    pub async fn message(&self, caller: &Caller, id: &str) -> Result<Message, AttachError> {
        self.store
            .read(async |tx| messages::get(tx, id, caller.scope()).await)
            .await?
            .ok_or_else(|| message_not_found(id))
    }

    /// The messages of `scope`, filtered and paged.
    pub async fn messages(
        &self,
        scope: Scope<'_>,
        filter: &MessageFilter,
        page: &Page,
    ) -> Result<Vec<Message>, AttachError> {
        self.store
            .read(async |tx| {
                let marker = match &page.marker {
                    Some(m) => Some(messages::get(tx, m, scope).await?.ok_or_else(|| {
                        AttachError::NotFound(format!("Marker message {m} could not be found."))
                    })?),
                    None => None,
                };
                Ok(messages::list(tx, scope, filter, page, marker.as_ref()).await?)
            })
            .await
    }

    /// Deletes a message the caller may reach.
    pub async fn delete_message(&self, caller: &Caller, id: &str) -> Result<(), AttachError> {
        let deleted = self
            .store
            .write(async |tx| match messages::get(tx, id, caller.scope()).await? {
                Some(_) => Ok::<_, AttachError>(messages::delete(tx, id).await?),
                None => Ok(false),
            })
            .await?;
        if deleted { Ok(()) } else { Err(message_not_found(id)) }
    }

    /// Deletes the messages that have expired, a thousand at a time with a pause as long as each
    /// write took (other writers go between); how many.
    pub async fn purge_messages(&self) -> Result<u64, AttachError> {
        const AT_ONCE: i64 = 1000;
        let now = now_micros();
        let mut deleted = 0;
        loop {
            let started = std::time::Instant::now();
            let n = self.store.write(async |tx| messages::purge_expired(tx, now, AT_ONCE).await).await?;
            deleted += n;
            if n < AT_ONCE as u64 {
                return Ok(deleted);
            }
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

//! What Nova is owed (`[nova]`, `compute.rs`): when an attached volume grows, a `volume-extended`
//! event for the instances attached to it is written in the transaction that records the new size
//! (`compute_events`), sent after the commit, and deleted once Nova took it. So a kill between the
//! commit and the event, or Nova unreachable for a while, does not lose it: a task of every node
//! sends what is due every few seconds, including what a node that died owed (a sender claims an
//! event for a minute before it sends it, and a node that starts again frees its own claims at
//! once; Nova takes a repeated `volume-extended` as one more rescan).
//! An event Nova refused (4xx after a fresh token: its instances gone, Berth's user not allowed)
//! or could not be sent in `TRIES` is given up with a user message on the volume, in Cinder's
//! words ("extend volume:Compute service failed to extend volume.").

use std::sync::Arc;
use std::time::Duration;

use super::{AttachError, Service};
use crate::compute::Nova;
use crate::domain::messages::{Action, Detail};
use crate::metrics::{METRICS, OutcomeLabels};
use crate::store::compute_events::{self, ComputeEvent};
use crate::store::sql::Tx;
use crate::store::{Store, StoreError, now_micros, volumes};

/// Sends of one event at most; then it is given up.
const TRIES: i64 = 5;
/// How long a sender holds an event it claimed (longer than a send may take).
const CLAIM: Duration = Duration::from_secs(60);
/// How often every node looks for events due.
const EVERY: Duration = Duration::from_secs(5);

/// The wait before try `n + 1` after `n` failed: 5 s, 15 s, 1 min, 2 min.
fn backoff(tries: i64) -> Duration {
    Duration::from_secs(match tries {
        ..=1 => 5,
        2 => 15,
        3 => 60,
        _ => 120,
    })
}

fn micros(d: Duration) -> i64 {
    d.as_micros() as i64
}

impl Service {
    /// In the transaction that records an attached volume's new size: owes Nova the event for the
    /// instances attached to it (none without `[nova]` or without an instance).
    pub(super) async fn owe_extended(
        &self,
        tx: &mut Tx,
        volume_id: &str,
    ) -> Result<Option<ComputeEvent>, AttachError> {
        if self.compute.is_none() {
            return Ok(None);
        }
        let mut servers: Vec<String> = crate::store::attachments::of_volume(tx, volume_id)
            .await?
            .into_iter()
            .filter_map(|a| a.instance_uuid)
            .collect();
        servers.sort();
        servers.dedup();
        if servers.is_empty() {
            return Ok(None);
        }
        let request = super::history::current_caller().request;
        let event = ComputeEvent {
            id: uuid::Uuid::new_v4().to_string(),
            volume_id: volume_id.to_string(),
            servers,
            global_id: request.global.or_else(|| request.id.clone()),
            request_id: request.id,
            attempts: 0,
            created_at: now_micros(),
        };
        compute_events::insert(tx, &event).await?;
        Ok(Some(event))
    }

    /// Sends an event just owed, in a task of its own (the answer to the extend does not wait on
    /// Nova).
    pub(super) fn send_owed(&self, event: ComputeEvent) {
        let Some(courier) = self.courier() else { return };
        tokio::spawn(async move { courier.send(&event.id).await });
    }

    /// Sends what is owed to Nova and due, every [`EVERY`], for as long as the service lives.
    pub async fn send_owed_events(self: Arc<Self>) {
        let Some(courier) = self.courier() else { return };
        let node = self.owner().node.clone();
        match courier.store.write(async |tx| compute_events::release(tx, &node, now_micros()).await).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                events = n,
                "sending again the events to Nova this node was sending when it stopped"
            ),
            Err(e) => tracing::warn!("cannot free this node's claims on events owed to Nova: {e}"),
        }
        loop {
            if self.owner().schema_refusal().is_none() {
                let look = async |tx: &mut Tx| {
                    let owed = compute_events::count(tx).await?;
                    Ok::<_, StoreError>((owed, compute_events::due(tx, now_micros(), 100).await?))
                };
                match courier.store.read(look).await {
                    Ok((owed, due)) => {
                        METRICS.compute_events_owed.set(owed);
                        for id in due {
                            courier.send(&id).await;
                        }
                    }
                    Err(e) => tracing::warn!("cannot read the events owed to Nova: {e}"),
                }
            }
            tokio::time::sleep(EVERY).await;
        }
    }

    fn courier(&self) -> Option<Courier> {
        Some(Courier {
            nova: self.compute.clone()?,
            node: self.owner().node.clone(),
            store: self.store.clone(),
            keep_days: self.limits.keep_messages_days,
        })
    }
}

/// What became of one send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// Nova answered for every instance: the event is no longer owed.
    Taken,
    /// Nova or Keystone could not be reached: sent again later.
    Retried,
    /// Nova refused it, or it was tried [`TRIES`] times: given up, with a user message.
    GivenUp,
}

impl Sent {
    /// The metric's label.
    fn label(self) -> &'static str {
        match self {
            Sent::Taken => "sent",
            Sent::Retried => "retried",
            Sent::GivenUp => "failed",
        }
    }
}

/// What sending an event needs, apart from the service.
struct Courier {
    nova: Arc<Nova>,
    node: String,
    store: Store,
    keep_days: u32,
}

impl Courier {
    /// Claims event `id` and sends it: deleted when Nova took it, tried again later when Nova
    /// could not be reached, given up with a message when Nova refused it or after [`TRIES`].
    async fn send(&self, id: &str) {
        let now = now_micros();
        let until = now + micros(CLAIM);
        let claimed =
            self.store.write(async |tx| compute_events::claim(tx, id, &self.node, now, until).await).await;
        let event = match claimed {
            Ok(Some(event)) => event,
            Ok(None) => return,
            Err(e) => return tracing::warn!(event = id, "cannot claim an event owed to Nova: {e}"),
        };
        crate::failpoint::hit("compute.send").await;
        let v = &event.volume_id;
        let sent = self.nova.volume_extended(v, &event.servers, event.global_id.as_deref()).await;
        let outcome = match &sent {
            Ok(delivered) => {
                for d in delivered {
                    if d.code == 200 {
                        tracing::info!(volume = %v, server = %d.server_uuid, "Nova took the volume-extended event");
                    } else {
                        tracing::warn!(volume = %v, server = %d.server_uuid, code = d.code, "Nova could not apply the volume-extended event");
                    }
                }
                Sent::Taken
            }
            Err(e) if e.is_transient() && event.attempts < TRIES => {
                tracing::warn!(volume = %v, tries = event.attempts, "Nova was not told that the volume grew, trying again: {e}");
                Sent::Retried
            }
            Err(e) => {
                tracing::warn!(volume = %v, servers = ?event.servers, tries = event.attempts, "Nova was not told that the volume grew; given up: {e}");
                Sent::GivenUp
            }
        };
        METRICS.compute_events.get_or_create(&OutcomeLabels { outcome: outcome.label().into() }).inc();
        let settled = self
            .store
            .write(async |tx| {
                if outcome == Sent::Retried {
                    return Ok(compute_events::postpone(
                        tx,
                        id,
                        now_micros() + micros(backoff(event.attempts)),
                    )
                    .await?);
                }
                compute_events::delete(tx, id).await?;
                if outcome == Sent::GivenUp
                    && let Some(volume) = volumes::get(tx, v, crate::domain::list::Scope::All).await?
                {
                    let (action, detail) = (Action::ExtendVolume, Detail::NotifyComputeServiceFailed);
                    super::messages::tell(
                        tx,
                        &volume,
                        event.request_id.clone(),
                        self.keep_days,
                        action,
                        detail,
                    )
                    .await?;
                }
                Ok::<_, AttachError>(())
            })
            .await;
        if let Err(e) = settled {
            tracing::warn!(volume = %v, "cannot record what Nova answered to an event (sent again when due): {e}");
        }
    }
}

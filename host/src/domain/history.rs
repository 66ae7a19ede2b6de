//! The attach history's records: one [`AttachEvent`] per change to a volume's or an
//! attachment's access, chained per volume by hashes, and the questions an auditor asks of them
//! ([`reachable`]). No I/O: `store/events.rs` writes and reads them, `attach/history.rs` records
//! them as the flows change state.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a change did to a host's access to the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// The host was given a connection (export and credentials).
    Granted,
    /// The host's connection was ended on the backend.
    Revoked,
    /// Neither: a reservation, a completion, a lock, a failure that granted nothing.
    None,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Granted => "granted",
            Access::Revoked => "revoked",
            Access::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Access> {
        match s {
            "granted" => Some(Access::Granted),
            "revoked" => Some(Access::Revoked),
            "none" => Some(Access::None),
            _ => None,
        }
    }
}

/// An event as the flows describe it; the store gives it its place in the volume's chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewEvent {
    pub volume_id: String,
    /// Microseconds since the epoch.
    pub at: i64,
    /// The state machine's event, in kebab case (`connect`, `force-detach`, ...).
    pub event: String,
    pub access: Access,
    /// The attachment's status after the change, or `failed` for a change that was undone.
    pub outcome: String,
    /// The volume's project.
    pub project_id: String,
    pub attachment_id: Option<String>,
    pub instance_uuid: Option<String>,
    pub host: Option<String>,
    pub initiator: Option<String>,
    pub user_id: String,
    pub caller_project_id: String,
    pub roles: Vec<String>,
    /// Whether the caller presented a service token (or is the service itself).
    pub service_token: bool,
    pub request_id: Option<String>,
    pub global_request_id: Option<String>,
    pub node: String,
    pub driver_digest: Option<String>,
}

/// A recorded event: its id, its place in its volume's chain, and the chain's hashes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachEvent {
    pub id: String,
    pub seq: i64,
    #[serde(flatten)]
    pub fields: NewEvent,
    pub prev_hash: String,
    pub hash: String,
}

/// Filters of a history list (`GET /os-attachment-events`); every one that is set must match.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    pub volume_id: Option<String>,
    pub attachment_id: Option<String>,
    pub instance_uuid: Option<String>,
    /// The connector's host or its initiator.
    pub host: Option<String>,
    pub outcome: Option<String>,
    pub access: Option<Access>,
    /// `at` from this time on (microseconds, inclusive).
    pub since: Option<i64>,
    /// `at` up to this time (microseconds, inclusive).
    pub until: Option<i64>,
}

/// The link a volume's first event follows.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The hash of an event: sha256 over the previous link and every other field, in a fixed
/// order (the JSON of `(prev_hash, id, seq, fields)`; `serde_json` writes struct fields in
/// declaration order, so the text is the same wherever it is computed).
pub fn chain_hash(prev_hash: &str, id: &str, seq: i64, fields: &NewEvent) -> String {
    let text = serde_json::to_string(&(prev_hash, id, seq, fields)).expect("an event serialises");
    hex::encode(Sha256::digest(text.as_bytes()))
}

impl AttachEvent {
    /// The event as the next link after `prev_hash`, at `seq`.
    pub fn link(id: String, seq: i64, prev_hash: String, fields: NewEvent) -> AttachEvent {
        let hash = chain_hash(&prev_hash, &id, seq, &fields);
        AttachEvent { id, seq, fields, prev_hash, hash }
    }

    /// Whether the stored hash is the hash of what is stored.
    pub fn is_intact(&self) -> bool {
        chain_hash(&self.prev_hash, &self.id, self.seq, &self.fields) == self.hash
    }
}

/// What `berth history verify` found wrong with one volume's chain, at the first place it
/// broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Break {
    pub volume_id: String,
    /// The event where the chain broke (`None`: the chain's recorded head).
    pub event_id: Option<String>,
    pub seq: i64,
    pub why: String,
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.event_id {
            Some(id) => write!(f, "volume {}: event {} (seq {}): {}", self.volume_id, id, self.seq, self.why),
            None => write!(f, "volume {}: after seq {}: {}", self.volume_id, self.seq, self.why),
        }
    }
}

/// The recorded head of a volume's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub volume_id: String,
    pub seq: i64,
    pub hash: String,
    /// The first event still stored, and the link it follows (older ones pruned).
    pub first_seq: i64,
    pub first_prev: String,
}

/// Checks one volume's chain, `events` in `seq` order, against its head: each event's hash is
/// its content's, each follows the one before, none is missing, and the last is the head.
pub fn verify_chain(head: &Head, events: &[AttachEvent]) -> Result<(), Break> {
    let mut check = ChainCheck::new(head);
    for e in events {
        check.next(e)?;
    }
    check.finish()
}

/// [`verify_chain`] one event at a time, for chains read in pages: holds the last link, never
/// the chain.
pub struct ChainCheck<'a> {
    head: &'a Head,
    seq: i64,
    prev: String,
}

impl<'a> ChainCheck<'a> {
    pub fn new(head: &'a Head) -> ChainCheck<'a> {
        ChainCheck { head, seq: head.first_seq - 1, prev: head.first_prev.clone() }
    }

    /// The chain's next event, in `seq` order.
    pub fn next(&mut self, e: &AttachEvent) -> Result<(), Break> {
        let broke = |why: String| Break {
            volume_id: self.head.volume_id.clone(),
            event_id: Some(e.id.clone()),
            seq: e.seq,
            why,
        };
        if e.fields.volume_id != self.head.volume_id {
            return Err(broke(format!("it names volume {}", e.fields.volume_id)));
        }
        if e.seq != self.seq + 1 {
            return Err(broke(format!("events {} to {} are missing", self.seq + 1, e.seq - 1)));
        }
        if e.prev_hash != self.prev {
            return Err(broke("it does not follow the event before it (its prev_hash differs)".into()));
        }
        if !e.is_intact() {
            return Err(broke("its content does not match its hash (edited)".into()));
        }
        (self.seq, self.prev) = (e.seq, e.hash.clone());
        Ok(())
    }

    /// After the chain's last event: it is the head.
    pub fn finish(self) -> Result<(), Break> {
        let (head, seq) = (self.head, self.seq);
        if seq != head.seq || self.prev != head.hash {
            return Err(Break {
                volume_id: head.volume_id.clone(),
                event_id: None,
                seq,
                why: format!("the chain's head is event {} but the last stored is {seq} (deleted)", head.seq),
            });
        }
        Ok(())
    }
}

/// Checks the chains of a segment on its own (an archived export): within each volume's run of
/// events, each is intact and follows the one before. Returns the number of chains.
pub fn verify_segment(events: &[AttachEvent]) -> Result<usize, Break> {
    let mut by_volume: BTreeMap<&str, Vec<AttachEvent>> = BTreeMap::new();
    for e in events {
        by_volume.entry(&e.fields.volume_id).or_default().push(e.clone());
    }
    for (volume, mut chain) in by_volume.iter_mut().map(|(v, c)| (*v, std::mem::take(c))) {
        chain.sort_by_key(|e| e.seq);
        let (first, last) = (&chain[0], &chain[chain.len() - 1]);
        let head = Head {
            volume_id: volume.to_string(),
            seq: last.seq,
            hash: last.hash.clone(),
            first_seq: first.seq,
            first_prev: first.prev_hash.clone(),
        };
        verify_chain(&head, &chain)?;
    }
    Ok(by_volume.len())
}

/// The hosts that could reach the volume at some moment between `from` and `to` (microseconds,
/// inclusive), by its events in chain order: a host can reach it from the event that granted
/// its attachment access until the event that revoked it.
pub fn reachable(events: &[AttachEvent], from: i64, to: i64) -> BTreeSet<String> {
    // attachment -> (host, granted at)
    let mut open: BTreeMap<String, (String, i64)> = BTreeMap::new();
    let mut hosts = BTreeSet::new();
    for e in events {
        let f = &e.fields;
        let key = f.attachment_id.clone().unwrap_or_default();
        match f.access {
            Access::Granted => {
                if let Some((host, since)) = open.remove(&key)
                    && since <= to
                    && f.at >= from
                {
                    hosts.insert(host);
                }
                let host = f.host.clone().or_else(|| f.initiator.clone()).unwrap_or_default();
                open.insert(key, (host, f.at));
            }
            Access::Revoked => {
                if let Some((host, since)) = open.remove(&key)
                    && since <= to
                    && f.at >= from
                {
                    hosts.insert(host);
                }
            }
            Access::None => {}
        }
    }
    hosts.extend(open.into_values().filter(|(_, since)| *since <= to).map(|(host, _)| host));
    hosts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(at: i64, attachment: &str, host: &str, access: Access) -> NewEvent {
        NewEvent {
            volume_id: "v".into(),
            at,
            event: "connect".into(),
            access,
            outcome: "attaching".into(),
            project_id: "p".into(),
            attachment_id: Some(attachment.into()),
            instance_uuid: None,
            host: Some(host.into()),
            initiator: None,
            user_id: "u".into(),
            caller_project_id: "p".into(),
            roles: vec!["member".into()],
            service_token: false,
            request_id: None,
            global_request_id: None,
            node: "n".into(),
            driver_digest: None,
        }
    }

    fn chain(fields: Vec<NewEvent>) -> (Head, Vec<AttachEvent>) {
        let mut prev = GENESIS.to_string();
        let mut out = Vec::new();
        for (i, f) in fields.into_iter().enumerate() {
            let e = AttachEvent::link(format!("e{i}"), i as i64 + 1, prev, f);
            prev = e.hash.clone();
            out.push(e);
        }
        let head = Head {
            volume_id: "v".into(),
            seq: out.len() as i64,
            hash: prev,
            first_seq: 1,
            first_prev: GENESIS.into(),
        };
        (head, out)
    }

    #[test]
    fn an_intact_chain_verifies_and_each_kind_of_tampering_is_named() {
        let (head, events) = chain(vec![
            event(10, "a", "h1", Access::Granted),
            event(20, "a", "h1", Access::Revoked),
            event(30, "b", "h2", Access::Granted),
        ]);
        assert_eq!(verify_chain(&head, &events), Ok(()));

        let mut edited = events.clone();
        edited[1].fields.host = Some("elsewhere".into());
        let e = verify_chain(&head, &edited).unwrap_err();
        assert_eq!((e.seq, e.why.contains("edited")), (2, true));

        let mut deleted = events.clone();
        deleted.remove(1);
        let e = verify_chain(&head, &deleted).unwrap_err();
        assert_eq!((e.seq, e.why.contains("missing")), (3, true));

        let mut last_gone = events.clone();
        last_gone.pop();
        let e = verify_chain(&head, &last_gone).unwrap_err();
        assert!(e.event_id.is_none() && e.why.contains("deleted"), "{e}");

        // Re-hashing an edited event still breaks the link to the next one.
        let mut rehashed = events.clone();
        rehashed[0].fields.host = Some("elsewhere".into());
        rehashed[0].hash = chain_hash(GENESIS, "e0", 1, &rehashed[0].fields);
        let e = verify_chain(&head, &rehashed).unwrap_err();
        assert_eq!(e.seq, 2, "{e}");
    }

    #[test]
    fn reachable_hosts_are_those_whose_access_overlaps_the_window() {
        let (_, events) = chain(vec![
            event(10, "a", "h1", Access::Granted),
            event(20, "a", "h1", Access::Revoked),
            event(30, "b", "h2", Access::Granted),
            event(40, "c", "h3", Access::None),
        ]);
        let hosts = |from, to| reachable(&events, from, to).into_iter().collect::<Vec<_>>();
        assert_eq!(hosts(0, 5), Vec::<String>::new());
        assert_eq!(hosts(0, 15), ["h1"]);
        assert_eq!(hosts(21, 29), Vec::<String>::new());
        assert_eq!(hosts(15, 35), ["h1", "h2"]);
        assert_eq!(hosts(100, 200), ["h2"], "still attached: reachable until revoked");
    }
}

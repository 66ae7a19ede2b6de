//! A random workload over a pool of volumes, recorded as a history and checked.
//!
//! Clients pick a volume and a call at random: attachment create (with or without connector),
//! update, complete, delete, and the legacy reserve / initialize_connection / attach /
//! begin_detaching / roll_detaching / terminate_connection / detach / unreserve, and an admin's
//! force_detach. Each call is recorded with its invocation and completion times and its outcome
//! (a status, or "no answer" when the client gave up or the connection broke). Clients may give
//! up on a call after a random few milliseconds (`abandon`), which drops the connection at a
//! random point of the flow.
//!
//! A monitor reads the database in one transaction every few milliseconds while the clients
//! work. The checker then verifies:
//! - **exclusivity**: no snapshot shows a non-multiattach volume with two live attachments, and
//!   no two acknowledged reservations of one non-multiattach volume were live for sure at the
//!   same time (from the acknowledgement of one until a call that could remove it was invoked);
//! - **status**: in every snapshot, every volume's status is what its live attachments make it;
//! - **no lost acknowledgement**: an acknowledged create that nothing could have removed since is
//!   still there at the end, an acknowledged delete's attachment is gone;
//! - after quiescence, the invariants of `invariants.rs` (the backend equals the database).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth::domain::state::{AttachStatus, VolumeStatus, as_seen, settle};
use berth::store::Store;
use reqwest::Method;
use serde_json::{Value, json};

use crate::server::{Client, connector};

/// How the workload runs.
#[derive(Debug, Clone)]
pub struct Workload {
    pub clients: usize,
    pub duration: Duration,
    pub volumes: usize,
    /// Of which multiattach.
    pub multiattach: usize,
    /// Probability that a call is given up after 1 to 40 ms.
    pub abandon: f64,
}

/// One call as a client saw it.
#[derive(Debug, Clone)]
pub struct Call {
    pub client: usize,
    pub op: &'static str,
    pub volume: String,
    /// The attachment the call names or created.
    pub attachment: Option<String>,
    /// The host whose connector the call sends, if any.
    pub host: Option<&'static str>,
    pub invoked: Instant,
    pub completed: Instant,
    /// The HTTP status, or `None`: no answer.
    pub status: Option<u16>,
}

impl Call {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s < 300)
    }

    /// Whether the call may remove attachments of its volume (which ones is not always known).
    fn may_remove(&self) -> bool {
        matches!(self.op, "delete" | "unreserve" | "terminate" | "detach" | "force-detach")
    }

    /// Whether an acknowledged call made a reservation of its volume.
    fn reserves(&self) -> bool {
        matches!(self.op, "create" | "create-reserve" | "reserve" | "initialize")
    }
}

/// A live attachment in a monitor reading: (status, legacy, slot).
type Seen = (String, bool, i64);

/// One monitor reading.
#[derive(Debug, Clone)]
struct Snapshot {
    /// volume -> (status, multiattach, live attachments)
    volumes: BTreeMap<String, (String, bool, Vec<Seen>)>,
}

/// The outcome of a run.
#[derive(Debug, Default)]
pub struct Outcome {
    pub calls: Vec<Call>,
    pub snapshots: usize,
    pub anomalies: Vec<String>,
}

fn random() -> u64 {
    let mut b = [0u8; 8];
    getrandom_fill(&mut b);
    u64::from_ne_bytes(b)
}

fn getrandom_fill(b: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(b)).expect("/dev/urandom");
}

fn pick<T: Clone>(items: &[T]) -> Option<T> {
    if items.is_empty() { None } else { Some(items[(random() % items.len() as u64) as usize].clone()) }
}

const HOSTS: [(&str, &str); 4] = [
    ("iqn.1993-08.org.debian:01:h0", "h0"),
    ("iqn.1993-08.org.debian:01:h1", "h1"),
    ("iqn.1993-08.org.debian:01:h2", "h2"),
    ("iqn.1993-08.org.debian:01:h3", "h3"),
];

/// Creates the pool of volumes.
pub async fn pool(c: &Client, w: &Workload) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for i in 0..w.volumes {
        let multi = i < w.multiattach;
        let body = if multi { json!({"size": 1, "volume_type": "multiattach"}) } else { json!({"size": 1}) };
        out.push((c.create_volume(body).await, multi));
    }
    out
}

/// Runs the workload and the monitor; returns the history and the monitor's findings. Each call
/// goes to one of `endpoints` (admins of one project; several nodes of one service), at random.
pub async fn run(endpoints: &[Client], store: &Store, volumes: &[(String, bool)], w: &Workload) -> Outcome {
    let calls = Arc::new(Mutex::new(Vec::<Call>::new()));
    let deadline = Instant::now() + w.duration;
    let mut tasks = Vec::new();
    for client in 0..w.clients {
        let (endpoints, calls, volumes, w) = (endpoints.to_vec(), calls.clone(), volumes.to_vec(), w.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let (volume, _) = pick(&volumes).unwrap();
                let c = pick(&endpoints).unwrap();
                let call = one_call(client, &c, &c, &volume, &w).await;
                calls.lock().unwrap().push(call);
            }
        }));
    }
    let monitor = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut snapshots = Vec::new();
            while Instant::now() < deadline {
                snapshots.push(watched("the monitor's read of the database", read(&store)).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            snapshots
        })
    };
    for t in tasks {
        t.await.expect("a client task");
    }
    let snapshots = monitor.await.expect("the monitor");
    let mut outcome =
        Outcome { calls: calls.lock().unwrap().clone(), snapshots: snapshots.len(), ..Default::default() };
    for s in &snapshots {
        outcome.anomalies.extend(check_snapshot(s));
    }
    outcome.anomalies.extend(check_exclusivity(&outcome.calls, volumes));
    outcome
}

async fn one_call(client: usize, c: &Client, admin: &Client, volume: &str, w: &Workload) -> Call {
    let (initiator, host) = pick(&HOSTS).unwrap();
    let timeout =
        (random() % 1000 < (w.abandon * 1000.0) as u64).then(|| Duration::from_millis(1 + random() % 40));
    let known = known_attachments(c, volume).await;
    let some_attachment = pick(&known);
    let action = |name: &str, arg: Value| {
        (Method::POST, format!("/volumes/{volume}/action"), Some(json!({ name: arg })))
    };
    let (op, attachment, (method, path, body), who): (&'static str, Option<String>, _, &Client) = match random(
    ) % 14
    {
        0..=2 => (
            "create",
            None,
            (
                Method::POST,
                "/attachments".into(),
                Some(json!({"attachment": {"volume_uuid": volume, "connector": connector(initiator, host)}})),
            ),
            c,
        ),
        3 => (
            "create-reserve",
            None,
            (Method::POST, "/attachments".into(), Some(json!({"attachment": {"volume_uuid": volume}}))),
            c,
        ),
        4 => {
            let Some(a) = some_attachment.clone() else { return idle(client, volume) };
            let body = json!({"attachment": {"connector": connector(initiator, host)}});
            ("update", Some(a.clone()), (Method::PUT, format!("/attachments/{a}"), Some(body)), c)
        }
        5 => {
            let Some(a) = some_attachment.clone() else { return idle(client, volume) };
            (
                "complete",
                Some(a.clone()),
                (Method::POST, format!("/attachments/{a}/action"), Some(json!({"os-complete": null}))),
                c,
            )
        }
        6..=7 => {
            let Some(a) = some_attachment.clone() else { return idle(client, volume) };
            ("delete", Some(a.clone()), (Method::DELETE, format!("/attachments/{a}"), None), c)
        }
        8 => ("reserve", None, action("os-reserve", Value::Null), c),
        9 => (
            "initialize",
            None,
            action("os-initialize_connection", json!({"connector": connector(initiator, host)})),
            c,
        ),
        10 => ("attach", None, action("os-attach", json!({"mountpoint": "/dev/vdb", "host_name": host})), c),
        11 => match random() % 4 {
            0 => ("begin-detaching", None, action("os-begin_detaching", Value::Null), c),
            1 => ("roll-detaching", None, action("os-roll_detaching", Value::Null), c),
            2 => ("unreserve", None, action("os-unreserve", Value::Null), c),
            _ => (
                "terminate",
                None,
                action("os-terminate_connection", json!({"connector": connector(initiator, host)})),
                c,
            ),
        },
        12 => (
            "detach",
            some_attachment.clone(),
            action("os-detach", json!({"attachment_id": some_attachment})),
            c,
        ),
        _ => (
            "force-detach",
            some_attachment.clone(),
            action("os-force_detach", json!({"attachment_id": some_attachment})),
            admin,
        ),
    };
    let client_at = if path.starts_with("/attachments") { who.at("3.54") } else { who.clone() };
    let invoked = Instant::now();
    let what = format!("{op} on {volume} ({method} {} at {})", path, client_at.base);
    let answer = watched(&what, client_at.try_send(method.clone(), &path, body, timeout)).await.ok();
    let completed = Instant::now();
    if let Some(r) = &answer {
        assert!(r.status < 500 || r.status == 503, "{op} on {volume} answered {}: {}", r.status, r.body);
    }
    let created = answer.as_ref().and_then(|r| r.body["attachment"]["id"].as_str().map(str::to_string));
    let host = matches!(op, "create" | "update" | "initialize" | "terminate" | "attach").then_some(host);
    Call {
        client,
        op,
        volume: volume.to_string(),
        attachment: created.or(attachment),
        host,
        invoked,
        completed,
        status: answer.map(|r| r.status),
    }
}

/// How long a call of the workload may go unanswered before the test fails naming it: longer than
/// any bound of the server's own (a driver call's 60 s), so only a call that would never end
/// reaches it; without it such a call hangs the test with nothing to say why.
const WATCHDOG: Duration = Duration::from_secs(120);

async fn watched<T>(what: &str, call: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WATCHDOG, call).await {
        Ok(out) => out,
        Err(_) => panic!("no answer within {WATCHDOG:?}: {what}"),
    }
}

fn idle(client: usize, volume: &str) -> Call {
    let now = Instant::now();
    Call {
        client,
        op: "idle",
        volume: volume.into(),
        attachment: None,
        host: None,
        invoked: now,
        completed: now,
        status: Some(200),
    }
}

async fn known_attachments(c: &Client, volume: &str) -> Vec<String> {
    let path = format!("/attachments?volume_id={volume}");
    let at = c.at("3.27");
    match watched(&format!("GET {path} at {}", c.base), at.try_send(Method::GET, &path, None, None)).await {
        Ok(r) if r.status == 200 => r.body["attachments"]
            .as_array()
            .map(|l| l.iter().filter_map(|a| a["id"].as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

async fn read(store: &Store) -> Snapshot {
    store
        .read(async |tx| {
            let mut volumes = BTreeMap::new();
            for r in tx.query("SELECT id, status, multiattach FROM volumes WHERE deleted = 0", &[]).await? {
                volumes.insert(r.text(0)?, (r.text(1)?, r.flag(2)?, Vec::new()));
            }
            for r in tx
                .query("SELECT volume_id, attach_status, legacy, exclusive FROM volume_attachment WHERE deleted = 0", &[])
                .await?
            {
                if let Some(v) = volumes.get_mut(&r.text(0)?) {
                    v.2.push((r.text(1)?, r.flag(2)?, r.int(3)?));
                }
            }
            Ok::<_, berth::store::StoreError>(Snapshot { volumes })
        })
        .await
        .expect("the monitor reads the database")
}

fn check_snapshot(s: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    for (id, (status, multi, live)) in &s.volumes {
        if !multi && live.iter().filter(|(_, _, slot)| *slot == 1).count() > 1 {
            out.push(format!("volume {id} had two live attachments at once: {live:?}"));
        }
        if live.is_empty() {
            continue;
        }
        let statuses: Vec<AttachStatus> = live
            .iter()
            .map(|(s, legacy, _)| as_seen(AttachStatus::parse(s).expect("a status"), *legacy))
            .collect();
        let (want, _) = settle(&statuses, status == "detaching");
        if VolumeStatus::parse(status) != Some(want) {
            out.push(format!("volume {id} was {status} while its attachments {live:?} make it {want}"));
        }
    }
    out
}

/// Acknowledged reservations of one non-multiattach volume that were live for sure at the same
/// time.
fn check_exclusivity(calls: &[Call], volumes: &[(String, bool)]) -> Vec<String> {
    let mut out = Vec::new();
    let Some(start) = calls.iter().map(|c| c.invoked).min() else { return out };
    for (volume, _) in volumes.iter().filter(|(_, multi)| !multi) {
        let mine: Vec<&Call> = calls.iter().filter(|c| &c.volume == volume).collect();
        // For sure live from the acknowledgement until a call that may remove it may take effect:
        // one that ended after the reservation was asked for (its effect may come after the
        // reservation's commit, even when its answer arrives before the reservation's: it may
        // have listed the new row and removed it while that answer was on its way), or one never
        // answered (it may still be going on).
        // An initialize for a host that some attachment of the volume may be connected for
        // (created, updated or initialized for it before) replays that connection.
        let may_replay = |i: &Call| {
            i.op == "initialize"
                && mine.iter().any(|x| {
                    !std::ptr::eq(*x, i)
                        && matches!(x.op, "create" | "update" | "initialize")
                        && x.host == i.host
                        && x.invoked < i.completed
                })
        };
        let intervals: Vec<(Instant, Instant, &Call)> = mine
            .iter()
            .filter(|c| c.ok() && c.reserves() && !may_replay(c))
            .map(|r| {
                let end = mine
                    .iter()
                    .filter(|x| x.may_remove() && (x.status.is_none() || x.completed > r.invoked))
                    .map(|x| x.invoked.max(r.completed))
                    .min()
                    .unwrap_or_else(Instant::now);
                (r.completed, end, *r)
            })
            .collect();
        for (i, a) in intervals.iter().enumerate() {
            for b in &intervals[i + 1..] {
                let overlap = a.0 < b.1 && b.0 < a.1;
                // The same attachment acknowledged twice (initialize replays, reserve after
                // create of the same row) is not two attachments.
                let same = a.2.attachment.is_some() && a.2.attachment == b.2.attachment;
                // A legacy initialize after a reserve uses that reservation.
                let legacy_pair =
                    matches!((a.2.op, b.2.op), ("reserve", "initialize") | ("initialize", "reserve"));
                if overlap && !same && !legacy_pair {
                    out.push(format!(
                        "volume {volume}: {} and {} were both acknowledged and live",
                        described(a.2, start),
                        described(b.2, start)
                    ));
                }
            }
        }
    }
    out
}

/// A call as an anomaly names it: what, by whom, on which attachment, and when (ms from the
/// first call).
fn described(c: &Call, start: Instant) -> String {
    let ms = |t: Instant| t.duration_since(start).as_secs_f64() * 1e3;
    format!(
        "{} by client {} (attachment {}, {:.1} to {:.1} ms)",
        c.op,
        c.client,
        c.attachment.as_deref().unwrap_or("-"),
        ms(c.invoked),
        ms(c.completed)
    )
}

/// What the end state must show of the acknowledged calls: created attachments that nothing could
/// have removed since are there; deleted ones are gone.
pub fn check_acknowledged(calls: &[Call], live: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for c in calls.iter().filter(|c| c.ok()) {
        let Some(id) = &c.attachment else { continue };
        match c.op {
            "create" | "create-reserve" => {
                let removable = calls.iter().any(|x| {
                    x.volume == c.volume && x.may_remove() && (x.status.is_none() || x.completed > c.invoked)
                });
                if !removable && !live.contains(id) {
                    out.push(format!("acknowledged attachment {id} of volume {} is gone", c.volume));
                }
            }
            "delete" => {
                let recreated = calls
                    .iter()
                    .any(|x| x.attachment.as_ref() == Some(id) && x.reserves() && x.invoked > c.completed);
                if !recreated && live.contains(id) {
                    out.push(format!("attachment {id} is still there after an acknowledged delete"));
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(
        client: usize,
        op: &'static str,
        attachment: &str,
        from_ms: u64,
        to_ms: u64,
        at: Instant,
    ) -> Call {
        Call {
            client,
            op,
            volume: "v".into(),
            attachment: Some(attachment.into()),
            host: None,
            invoked: at + Duration::from_millis(from_ms),
            completed: at + Duration::from_millis(to_ms),
            status: Some(200),
        }
    }

    #[test]
    fn two_reservations_live_together_are_an_anomaly() {
        let at = Instant::now() - Duration::from_secs(1);
        let calls = [call(1, "create", "a", 0, 10, at), call(2, "create", "b", 20, 30, at)];
        let found = check_exclusivity(&calls, &[("v".into(), false)]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("attachment a") && found[0].contains("attachment b"), "{found:?}");
        assert!(check_exclusivity(&calls, &[("v".into(), true)]).is_empty(), "multiattach allows both");
    }

    #[test]
    fn a_removal_answered_before_the_reservation_may_still_have_removed_it() {
        // The delete listed `a` once committed and removed it while `a`'s answer was on its way.
        let at = Instant::now() - Duration::from_secs(1);
        let calls = [
            call(1, "create", "a", 0, 10, at),
            call(3, "delete", "a", 4, 8, at),
            call(2, "create", "b", 20, 30, at),
        ];
        assert!(check_exclusivity(&calls, &[("v".into(), false)]).is_empty());
        // One that ended before the reservation was asked for removed something else.
        let calls = [
            call(3, "delete", "z", 0, 2, at),
            call(1, "create", "a", 4, 10, at),
            call(2, "create", "b", 20, 30, at),
        ];
        assert_eq!(check_exclusivity(&calls, &[("v".into(), false)]).len(), 1);
    }
}

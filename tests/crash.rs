//! Interruptions with real processes: `berth serve` (tgt-iscsi, SQLite) on a real tgtd, at every
//! failpoint of every changing flow,
//!
//! - **killed** with SIGKILL there, started again, and checked once the reconciler has run: no
//!   operation unfinished, no volume stuck, the database and tgtd agree both ways
//!   (`harness/invariants.rs`), every acknowledged change is present, and the interrupted request
//!   ended where `docs/operations.md` says a killed one ends;
//! - **left** by its client there (the flow stalls at the failpoint, the client gives up): the
//!   flow goes on to its normal end, as if the client had stayed.
//!
//! For each flow, a first run with tracing lists the failpoints the flow passes, in order
//! (`/_failpoints/hits`); then, for each of them, a fresh set-up is made, the failpoint is armed,
//! the flow's request is sent (and gets no answer), and the checks run. `BERTH_CRASH_REPEAT=N`
//! repeats the kills N times at each failpoint (the long mode; see BENCHMARKS.md).

use std::collections::BTreeSet;
use std::time::Duration;

use berth_tests::invariants::{self, World};
use berth_tests::server::{Client, connector};
use berth_tests::tgt::Rig;
use reqwest::Method;
use serde_json::{Value, json};

const ALICE: &str = "iqn.1993-08.org.debian:01:alice";
const BOB: &str = "iqn.1993-08.org.debian:01:bob";
const CAROL: &str = "iqn.1993-08.org.debian:01:carol";
const INSTANCE: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

/// A changing flow: how to set it up, the request that is interrupted, and where it must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    CreateVolume,
    DeleteVolume,
    CreateAttachment,
    CreateSecondOfMultiattach,
    UpdateAttachment,
    /// Nova's unshelve: an update gives a connector to an attachment completed without one.
    Unshelve,
    ReplaceConnector,
    DeleteAttachment,
    DeleteOneOfTwo,
    LegacyInitialize,
    LegacyInitializeAgain,
    LegacyTerminate,
    LegacyDetach,
    LegacyUnreserve,
    LegacyTerminateUnknown,
    ForceDetach,
    /// `os-extend` of an available volume, from 1 GiB to 2.
    ExtendVolume,
    /// `os-extend` (3.42) of a volume attached to alice, from 1 GiB to 2: its LUN opens the grown
    /// file again while the target's sessions are ended and no login is taken.
    ExtendAttached,
    /// An admin's `os-unmanage` of a detached volume (its target kept by tgtd for reuse).
    Unmanage,
}

/// What a set-up made (all acknowledged).
#[derive(Debug, Default)]
struct Made {
    volume: String,
    /// Attachments by name (`alice`, `bob`, `reserved`).
    attachments: Vec<(&'static str, String)>,
    volumes_before: BTreeSet<String>,
}

impl Made {
    fn id(&self, name: &str) -> &str {
        &self.attachments.iter().find(|(n, _)| *n == name).expect("made in set-up").1
    }
}

async fn attach(c: &Client, volume: &str, initiator: &str, host: &str, complete: bool) -> String {
    let r = c.attach(volume, Some(connector(initiator, host))).await.expect(200);
    let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
    if complete {
        c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
    }
    id
}

async fn action(c: &Client, volume: &str, name: &str, arg: Value) -> berth_tests::server::Resp {
    c.post(&format!("/volumes/{volume}/action"), json!({ name: arg })).await
}

/// A legacy attach done to the end: reserve, initialize, attach.
async fn legacy_attached(c: &Client, volume: &str) {
    action(c, volume, "os-reserve", Value::Null).await.expect(202);
    action(c, volume, "os-initialize_connection", json!({"connector": connector(ALICE, "alice-host")}))
        .await
        .expect(200);
    action(c, volume, "os-attach", json!({"mountpoint": "/dev/vdb", "host_name": "alice-host"}))
        .await
        .expect(202);
}

async fn live_ids(c: &Client, volume: &str) -> Vec<String> {
    let r = c.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
    r.body["attachments"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_string()).collect()
}

impl Flow {
    const ALL: [Flow; 19] = [
        Flow::CreateVolume,
        Flow::DeleteVolume,
        Flow::CreateAttachment,
        Flow::CreateSecondOfMultiattach,
        Flow::UpdateAttachment,
        Flow::Unshelve,
        Flow::ReplaceConnector,
        Flow::DeleteAttachment,
        Flow::DeleteOneOfTwo,
        Flow::LegacyInitialize,
        Flow::LegacyInitializeAgain,
        Flow::LegacyTerminate,
        Flow::LegacyDetach,
        Flow::LegacyUnreserve,
        Flow::LegacyTerminateUnknown,
        Flow::ForceDetach,
        Flow::ExtendVolume,
        Flow::ExtendAttached,
        Flow::Unmanage,
    ];

    async fn set_up(self, c: &Client) -> Made {
        let mut made = Made::default();
        let multiattach = matches!(
            self,
            Flow::CreateSecondOfMultiattach | Flow::DeleteOneOfTwo | Flow::LegacyTerminateUnknown
        );
        if self != Flow::CreateVolume {
            let body = if multiattach {
                json!({"size": 1, "volume_type": "multiattach"})
            } else {
                json!({"size": 1})
            };
            made.volume = c.create_volume(body).await;
        }
        let v = made.volume.clone();
        match self {
            Flow::CreateVolume => {
                let r = c.get("/volumes").await.expect(200);
                made.volumes_before = r.body["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x["id"].as_str().unwrap().to_string())
                    .collect();
            }
            Flow::DeleteVolume | Flow::CreateAttachment | Flow::ExtendVolume => {}
            Flow::CreateSecondOfMultiattach | Flow::LegacyTerminateUnknown => {
                made.attachments.push(("alice", attach(c, &v, ALICE, "alice-host", true).await));
            }
            Flow::UpdateAttachment => {
                let r = c.attach(&v, None).await.expect(200);
                made.attachments.push(("reserved", r.body["attachment"]["id"].as_str().unwrap().to_string()));
            }
            Flow::Unshelve => {
                let body = json!({"attachment": {"volume_uuid": v, "instance_uuid": INSTANCE}});
                let r = c.post("/attachments", body).await.expect(200);
                let id = r.body["attachment"]["id"].as_str().unwrap().to_string();
                c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
                made.attachments.push(("shelved", id));
            }
            Flow::ReplaceConnector => {
                made.attachments.push(("alice", attach(c, &v, ALICE, "alice-host", false).await));
            }
            Flow::DeleteAttachment | Flow::ForceDetach | Flow::ExtendAttached => {
                made.attachments.push(("alice", attach(c, &v, ALICE, "alice-host", true).await));
            }
            Flow::Unmanage => {
                let id = attach(c, &v, ALICE, "alice-host", true).await;
                c.delete(&format!("/attachments/{id}")).await.expect(200);
            }
            Flow::DeleteOneOfTwo => {
                made.attachments.push(("alice", attach(c, &v, ALICE, "alice-host", true).await));
                made.attachments.push(("bob", attach(c, &v, BOB, "bob-host", true).await));
            }
            Flow::LegacyInitialize => {
                action(c, &v, "os-reserve", Value::Null).await.expect(202);
                made.attachments.push(("reserved", live_ids(c, &v).await.remove(0)));
            }
            Flow::LegacyInitializeAgain => {
                legacy_attached(c, &v).await;
                made.attachments.push(("alice", live_ids(c, &v).await.remove(0)));
            }
            Flow::LegacyTerminate | Flow::LegacyDetach => {
                legacy_attached(c, &v).await;
                made.attachments.push(("alice", live_ids(c, &v).await.remove(0)));
                action(c, &v, "os-begin_detaching", Value::Null).await.expect(202);
            }
            Flow::LegacyUnreserve => {
                action(c, &v, "os-reserve", Value::Null).await.expect(202);
                action(
                    c,
                    &v,
                    "os-initialize_connection",
                    json!({"connector": connector(ALICE, "alice-host")}),
                )
                .await
                .expect(200);
            }
        }
        made
    }

    /// The interrupted request: its answer (or the transport error when the process died).
    async fn act(self, c: &Client, made: &Made) -> Result<u16, String> {
        self.act_with_timeout(c, made, Duration::from_secs(60)).await
    }

    /// The same, given up after `timeout`.
    async fn act_with_timeout(self, c: &Client, made: &Made, timeout: Duration) -> Result<u16, String> {
        let v = &made.volume;
        let (method, path, body) = match self {
            Flow::CreateVolume => {
                (Method::POST, "/volumes".to_string(), Some(json!({"volume": {"size": 1}})))
            }
            Flow::DeleteVolume => (Method::DELETE, format!("/volumes/{v}"), None),
            Flow::CreateAttachment => (
                Method::POST,
                "/attachments".into(),
                Some(json!({"attachment": {"volume_uuid": v, "connector": connector(ALICE, "alice-host")}})),
            ),
            Flow::CreateSecondOfMultiattach => (
                Method::POST,
                "/attachments".into(),
                Some(json!({"attachment": {"volume_uuid": v, "connector": connector(BOB, "bob-host")}})),
            ),
            Flow::UpdateAttachment => (
                Method::PUT,
                format!("/attachments/{}", made.id("reserved")),
                Some(json!({"attachment": {"connector": connector(ALICE, "alice-host")}})),
            ),
            Flow::Unshelve => (
                Method::PUT,
                format!("/attachments/{}", made.id("shelved")),
                Some(json!({"attachment": {"connector": connector(ALICE, "alice-host")}})),
            ),
            Flow::ReplaceConnector => (
                Method::PUT,
                format!("/attachments/{}", made.id("alice")),
                Some(json!({"attachment": {"connector": connector(BOB, "bob-host")}})),
            ),
            Flow::DeleteAttachment | Flow::DeleteOneOfTwo => {
                (Method::DELETE, format!("/attachments/{}", made.id("alice")), None)
            }
            Flow::LegacyInitialize | Flow::LegacyInitializeAgain => (
                Method::POST,
                format!("/volumes/{v}/action"),
                Some(json!({"os-initialize_connection": {"connector": connector(ALICE, "alice-host")}})),
            ),
            Flow::LegacyTerminate => (
                Method::POST,
                format!("/volumes/{v}/action"),
                Some(json!({"os-terminate_connection": {"connector": connector(ALICE, "alice-host")}})),
            ),
            Flow::LegacyTerminateUnknown => (
                Method::POST,
                format!("/volumes/{v}/action"),
                Some(json!({"os-terminate_connection": {"connector": connector(CAROL, "carol-host")}})),
            ),
            Flow::LegacyDetach => {
                (Method::POST, format!("/volumes/{v}/action"), Some(json!({"os-detach": null})))
            }
            Flow::LegacyUnreserve => {
                (Method::POST, format!("/volumes/{v}/action"), Some(json!({"os-unreserve": null})))
            }
            Flow::ForceDetach => {
                (Method::POST, format!("/volumes/{v}/action"), Some(json!({"os-force_detach": null})))
            }
            Flow::ExtendVolume | Flow::ExtendAttached => {
                (Method::POST, format!("/volumes/{v}/action"), Some(json!({"os-extend": {"new_size": 2}})))
            }
            Flow::Unmanage => {
                (Method::POST, format!("/volumes/{v}/action"), Some(json!({"os-unmanage": null})))
            }
        };
        c.try_send(method, &path, body, Some(timeout)).await.map(|r| r.status)
    }

    /// Where the interrupted request must have ended (docs/operations.md, "the process dies"),
    /// and that every acknowledged change of the set-up is still there.
    fn check(self, made: &Made, w: &World, rig: &Rig) -> Vec<String> {
        let mut wrong = Vec::new();
        let v = &made.volume;
        let live: Vec<_> = w.live_of(v).collect();
        let status = w.volumes.get(v).map(|x| x.status.as_str());
        let mut expect = |ok: bool, what: String| {
            if !ok {
                wrong.push(what);
            }
        };
        match self {
            Flow::CreateVolume => {
                let new: Vec<_> = w.volumes.keys().filter(|id| !made.volumes_before.contains(*id)).collect();
                expect(new.len() == 1, format!("the interrupted create left {} new volumes", new.len()));
                for id in new {
                    let s = &w.volumes[id].status;
                    expect(s == "available", format!("the interrupted create ended {s}, not available"));
                    expect(rig.backing_file(id).exists(), format!("volume {id} has no backing file"));
                }
            }
            Flow::DeleteVolume => {
                expect(status.is_none(), format!("the interrupted delete left the volume {status:?}"));
                expect(!rig.backing_file(v).exists(), "the deleted volume's backing file remains".into());
            }
            Flow::CreateAttachment => {
                expect(live.is_empty(), format!("the interrupted create left {} attachments", live.len()));
                expect(status == Some("available"), format!("the volume is {status:?}, not available"));
            }
            Flow::CreateSecondOfMultiattach | Flow::LegacyTerminateUnknown => {
                let alice = w.attachment(made.id("alice"));
                expect(
                    alice.is_some_and(|a| a.status == "attached" && a.is_connected()),
                    format!("alice's acknowledged attachment is {alice:?}"),
                );
                expect(live.len() == 1, format!("{} attachments remain, not alice's alone", live.len()));
                if self == Flow::LegacyTerminateUnknown {
                    // Recovery finished the revocation: the access it ended is in the history.
                    expect(
                        w.revokes.contains(&(v.clone(), CAROL.to_string())),
                        format!("no revoke event for {CAROL}: {:?}", w.revokes),
                    );
                }
            }
            Flow::UpdateAttachment | Flow::ReplaceConnector => {
                let id = if self == Flow::UpdateAttachment { made.id("reserved") } else { made.id("alice") };
                let a = w.attachment(id);
                expect(
                    a.is_some_and(|a| a.status == "reserved" && !a.has_connector),
                    format!("the updated attachment is {a:?}, not reserved without connector"),
                );
            }
            Flow::Unshelve => {
                let a = w.attachment(made.id("shelved"));
                expect(
                    a.is_some_and(|a| a.status == "attached" && !a.has_connector),
                    format!("the unshelved attachment is {a:?}, not attached without connector as before"),
                );
                expect(status == Some("in-use"), format!("the volume is {status:?}, not in-use"));
            }
            Flow::DeleteAttachment | Flow::ForceDetach | Flow::LegacyDetach | Flow::LegacyUnreserve => {
                expect(live.is_empty(), format!("the interrupted removal left {} attachments", live.len()));
                expect(status == Some("available"), format!("the volume is {status:?}, not available"));
            }
            Flow::DeleteOneOfTwo => {
                expect(w.attachment(made.id("alice")).is_none(), "alice's attachment was not removed".into());
                let bob = w.attachment(made.id("bob"));
                expect(
                    bob.is_some_and(|a| a.status == "attached" && a.is_connected()),
                    format!("bob's acknowledged attachment is {bob:?}"),
                );
            }
            Flow::LegacyInitialize => {
                let a = w.attachment(made.id("reserved"));
                expect(
                    a.is_some_and(|a| a.status == "reserved" && !a.has_connector && a.legacy),
                    format!("the acknowledged reservation is {a:?}"),
                );
            }
            Flow::LegacyInitializeAgain => {
                let a = w.attachment(made.id("alice"));
                expect(
                    a.is_some_and(|a| a.status == "attached" && a.is_connected()),
                    format!("the attached volume's attachment is {a:?}"),
                );
            }
            Flow::LegacyTerminate => {
                let a = w.attachment(made.id("alice"));
                expect(
                    a.is_some_and(|a| a.status == "attached" && !a.has_connector),
                    format!("the terminated attachment is {a:?}, not attached without connector"),
                );
                expect(status == Some("detaching"), format!("the volume is {status:?}, not detaching"));
            }
            Flow::Unmanage => {
                // Not finished (the admin asks again): the export's removal was, or the volume
                // is unmanaged after all. Either way its data is still there.
                expect(
                    matches!(status, Some("available") | None),
                    format!("the interrupted unmanage left the volume {status:?}"),
                );
                expect(rig.backing_file(v).exists(), "the unmanaged volume's backing file is gone".into());
            }
            Flow::ExtendVolume | Flow::ExtendAttached => {
                // Finished: the driver grows the backing file again (idempotent), then the size
                // is recorded; the database and the backing file agree.
                let size = w.volumes.get(v).map(|x| x.size_gib);
                let file = std::fs::metadata(rig.backing_file(v)).map(|m| m.len()).ok();
                let end = if self == Flow::ExtendVolume { "available" } else { "in-use" };
                expect(status == Some(end), format!("the volume is {status:?}, not {end}"));
                expect(
                    size == Some(2) && file == Some(2 << 30),
                    format!(
                        "the volume is {size:?} GiB in the database and {file:?} bytes on disk, not 2 GiB"
                    ),
                );
                if self == Flow::ExtendVolume {
                    return wrong;
                }
                // Attached: alice's attachment as it was; and tgtd serves the new size and takes
                // logins again.
                let alice = w.attachment(made.id("alice"));
                expect(
                    alice.is_some_and(|a| a.status == "attached" && a.is_connected()),
                    format!("alice's attachment is {alice:?}"),
                );
                let served = rig.tgtd.served(&format!("volume-{v}"));
                expect(
                    served == Some((true, berth_tests::tgt::tgtd_megabytes(2 << 30))),
                    format!("tgtd serves the volume as (takes logins, bytes) {served:?}, not (true, 2 GiB)"),
                );
            }
        }
        wrong
    }
}

impl Flow {
    /// The flow's normal end (what a client that stayed would have been told).
    fn check_done(self, made: &Made, w: &World) -> Vec<String> {
        let v = &made.volume;
        let live: Vec<_> = w.live_of(v).collect();
        let status = w.volumes.get(v).map(|x| x.status.clone());
        let connected =
            |id: &str, s: &str| w.attachment(id).is_some_and(|a| a.status == s && a.is_connected());
        let ok = match self {
            Flow::CreateVolume => {
                let new: Vec<_> = w.volumes.keys().filter(|id| !made.volumes_before.contains(*id)).collect();
                new.len() == 1 && w.volumes[new[0]].status == "available"
            }
            Flow::DeleteVolume | Flow::Unmanage => status.is_none(),
            Flow::CreateAttachment => {
                live.len() == 1 && live[0].is_connected() && live[0].status == "attaching"
            }
            Flow::CreateSecondOfMultiattach => {
                live.len() == 2
                    && connected(made.id("alice"), "attached")
                    && live.iter().all(|a| a.is_connected())
            }
            Flow::UpdateAttachment => connected(made.id("reserved"), "attaching"),
            Flow::Unshelve => connected(made.id("shelved"), "attaching"),
            Flow::ReplaceConnector => w
                .attachment(made.id("alice"))
                .is_some_and(|a| a.initiator.as_deref() == Some(BOB) && a.is_connected()),
            Flow::DeleteAttachment | Flow::LegacyDetach | Flow::LegacyUnreserve | Flow::ForceDetach => {
                live.is_empty() && status.as_deref() == Some("available")
            }
            Flow::DeleteOneOfTwo => live.len() == 1 && connected(made.id("bob"), "attached"),
            Flow::LegacyInitialize => connected(made.id("reserved"), "attaching"),
            Flow::LegacyInitializeAgain => connected(made.id("alice"), "attached"),
            // And the access it ended is in the history, however the flow ended.
            Flow::LegacyTerminateUnknown => {
                connected(made.id("alice"), "attached") && w.revokes.contains(&(v.clone(), CAROL.to_string()))
            }
            Flow::LegacyTerminate => {
                w.attachment(made.id("alice")).is_some_and(|a| a.status == "attached" && !a.has_connector)
            }
            Flow::ExtendVolume => {
                w.volumes.get(v).is_some_and(|x| x.status == "available" && x.size_gib == 2)
            }
            Flow::ExtendAttached => {
                w.volumes.get(v).is_some_and(|x| x.status == "in-use" && x.size_gib == 2)
                    && connected(made.id("alice"), "attached")
            }
        };
        if ok {
            Vec::new()
        } else {
            vec![format!("{self:?} did not reach its end: volume {status:?}, attachments {live:?}")]
        }
    }
}

async fn reset(c: &Client, trace: bool) {
    let url = format!("{}/_failpoints/reset", c.base);
    reqwest::Client::new().post(url).json(&json!({"trace": trace})).send().await.unwrap();
}

async fn arm(c: &Client, name: &str, nth: usize, action: &str) {
    let url = format!("{}/_failpoints/arm", c.base);
    let body = json!({"name": name, "nth": nth, "action": action, "millis": 300});
    reqwest::Client::new().post(url).json(&body).send().await.unwrap();
}

async fn hits(c: &Client) -> Vec<String> {
    let url = format!("{}/_failpoints/hits", c.base);
    reqwest::Client::new().get(url).send().await.unwrap().json().await.unwrap()
}

/// The failpoints a flow passes, in order, from a run with tracing.
async fn discover(flow: Flow, c: &Client) -> Vec<String> {
    let made = flow.set_up(c).await;
    reset(c, true).await;
    let answered = flow.act(c, &made).await.expect("the flow answers when nothing fails");
    assert!(answered < 300, "{flow:?} answered {answered} when nothing failed");
    let trace: Vec<String> = hits(c).await.into_iter().filter(|h| !h.starts_with("reconcile.")).collect();
    assert!(trace.len() >= 3, "{flow:?} passed only {trace:?}");
    assert!(trace[0].ends_with(".intent"), "{flow:?}: the first failpoint comes after the intent: {trace:?}");
    trace
}

/// Discovers a flow's failpoints, then kills the process at each (`BERTH_CRASH_REPEAT` times);
/// returns how many kills were checked.
async fn kill_at_every_failpoint(flow: Flow) -> usize {
    let mut rig = Rig::start();
    let c = rig.client();
    let repeat: usize = std::env::var("BERTH_CRASH_REPEAT").ok().and_then(|r| r.parse().ok()).unwrap_or(1);
    let trace = discover(flow, &c).await;
    let store = invariants::open(&rig.db_url()).await;
    let mut kills = 0;
    for round in 0..repeat {
        for (k, name) in trace.iter().enumerate() {
            let nth = trace[..=k].iter().filter(|n| *n == name).count();
            let made = flow.set_up(&c).await;
            reset(&c, false).await;
            arm(&c, name, nth, "kill").await;
            let answer = flow.act(&c, &made).await;
            let status = rig.berth.wait_exit(Duration::from_secs(10));
            assert!(
                status.is_some(),
                "{flow:?}: the process survived failpoint {name} #{nth} (round {round}); the request answered {answer:?}"
            );
            assert!(
                answer.is_err(),
                "{flow:?}: a request answered {answer:?} although the process died at {name}"
            );
            rig.berth.start_again();
            let world = match invariants::settled(&store, &rig.tgtd, Duration::from_secs(20)).await {
                Ok(world) => world,
                Err((_, wrong)) => panic!(
                    "{flow:?} killed at {name} #{nth}: invariants do not hold after restart:\n  {}\n{}",
                    wrong.join("\n  "),
                    tail(&rig.berth.log_text())
                ),
            };
            let wrong = flow.check(&made, &world, &rig);
            assert!(
                wrong.is_empty(),
                "{flow:?} killed at {name} #{nth}: {}\n{}",
                wrong.join("; "),
                tail(&rig.berth.log_text())
            );
            kills += 1;
        }
    }
    let log = rig.berth.log_text();
    assert!(log.contains("recovering an interrupted operation"), "no recovery was logged");
    eprintln!("{flow:?}: {kills} kills at {} failpoints {trace:?}, 0 violations", trace.len());
    kills
}

/// Discovers a flow's failpoints, then, at each, stalls the flow there while its client gives up:
/// the flow must still reach its normal end.
async fn leave_at_every_failpoint(flow: Flow) {
    let rig = Rig::start();
    let c = rig.client();
    let trace = discover(flow, &c).await;
    let store = invariants::open(&rig.db_url()).await;
    for (k, name) in trace.iter().enumerate() {
        let nth = trace[..=k].iter().filter(|n| *n == name).count();
        let made = flow.set_up(&c).await;
        reset(&c, false).await;
        arm(&c, name, nth, "sleep").await;
        let gave_up = flow.act_with_timeout(&c, &made, Duration::from_millis(100)).await;
        assert!(gave_up.is_err(), "{flow:?}: the client was to give up at {name}, but got {gave_up:?}");
        // The flow goes on after its client left (it sleeps at the failpoint first): consistent
        // at every moment, and at its normal end once it is through.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let world = match invariants::settled(&store, &rig.tgtd, Duration::from_secs(20)).await {
                Ok(world) => world,
                Err((_, wrong)) => panic!("{flow:?} left at {name} #{nth}: {}", wrong.join("\n  ")),
            };
            let wrong = flow.check_done(&made, &world);
            if wrong.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{flow:?} left at {name} #{nth}: {}\n{}",
                wrong.join("; "),
                tail(&rig.berth.log_text())
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "{flow:?}: the client left at each of {} failpoints; the flow always reached its end",
        trace.len()
    );
}

/// What a power failure may leave of the database: every commit up to the last sync, and perhaps
/// some after it (the kernel writes pages back when it likes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PowerLoss {
    /// The commits since the request began are lost: its intent, written and not synced
    /// (`store::Durability::Written`), is gone.
    IntentLost,
    /// The kernel had written the intent back: it survived.
    IntentKept,
}

/// A power failure at each failpoint of a flow between its intent and its outcome's commit (the
/// only window in which its intent is not on disk): the process dies there, tgtd comes back
/// empty (it keeps its targets in memory), and the database keeps what `loss` says. Once the
/// service is up again: the database and tgtd agree both ways, and the request either never
/// happened (its intent lost: the live attachments are those the set-up made, with their
/// access restored) or ended as a killed one ends (its intent kept).
async fn power_off_at_every_failpoint(flow: Flow, loss: PowerLoss) -> usize {
    let mut rig = Rig::start();
    let c = rig.client();
    let trace = discover(flow, &c).await;
    // Up to the outcome's commit: the first `*.commit` failpoint is hit just before it.
    let end = trace.iter().position(|n| n.ends_with(".commit")).expect("the flow commits its outcome");
    let db = rig.berth.dir.path().join("data/berth.db");
    let snapshot = rig.berth.dir.path().join("as-synced.db");
    let mut power_failures = 0;
    for (k, name) in trace[..=end].iter().enumerate() {
        let nth = trace[..=k].iter().filter(|n| *n == name).count();
        let made = flow.set_up(&c).await;
        // Everything the set-up wrote was synced before it was answered: the database as a power
        // failure must leave it at least.
        let _ = std::fs::remove_file(&snapshot);
        rusqlite::Connection::open(&db)
            .and_then(|conn| conn.execute("VACUUM INTO ?1", [snapshot.to_str().unwrap()]))
            .expect("a snapshot of the database");
        let before = {
            let store = invariants::open(&rig.db_url()).await;
            invariants::snapshot(&store, &rig.tgtd).await
        };
        reset(&c, false).await;
        arm(&c, name, nth, "kill").await;
        let answer = flow.act(&c, &made).await;
        assert!(rig.berth.wait_exit(Duration::from_secs(10)).is_some(), "{flow:?}: alive after {name}");
        assert!(answer.is_err(), "{flow:?}: answered {answer:?} although the process died at {name}");
        rig.tgtd.restart();
        if loss == PowerLoss::IntentLost {
            for suffix in ["-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
            }
            std::fs::copy(&snapshot, &db).expect("the database as synced");
        }
        rig.berth.start_again();
        let store = invariants::open(&rig.db_url()).await;
        let world = match invariants::settled(&store, &rig.tgtd, Duration::from_secs(20)).await {
            Ok(world) => world,
            Err((_, wrong)) => panic!(
                "{flow:?}, power lost at {name} #{nth} ({loss:?}): invariants do not hold after restart:\n  {}\n{}",
                wrong.join("\n  "),
                tail(&rig.berth.log_text())
            ),
        };
        let wrong = match loss {
            PowerLoss::IntentKept => flow.check(&made, &world, &rig),
            PowerLoss::IntentLost => as_before(&made.volume, &before, &world),
        };
        assert!(
            wrong.is_empty(),
            "{flow:?}, power lost at {name} #{nth} ({loss:?}): {}\n{}",
            wrong.join("; "),
            tail(&rig.berth.log_text())
        );
        power_failures += 1;
    }
    eprintln!("{flow:?}: power lost ({loss:?}) at each of {power_failures} failpoints {:?}", &trace[..=end]);
    power_failures
}

/// What differs between a volume's live attachments (status, and access on tgtd) before a request
/// and now.
fn as_before(volume: &str, before: &World, now: &World) -> Vec<String> {
    let seen = |w: &World| -> Vec<(String, String, Option<String>)> {
        w.live_of(volume).map(|a| (a.id.clone(), a.status.clone(), a.initiator.clone())).collect()
    };
    let access = |w: &World| w.target_of(volume).map(|t| t.initiators.clone()).unwrap_or_default();
    let mut wrong = Vec::new();
    if seen(before) != seen(now) {
        wrong.push(format!("attachments {:?} became {:?}", seen(before), seen(now)));
    }
    if access(before) != access(now) {
        wrong.push(format!("access {:?} became {:?}", access(before), access(now)));
    }
    let status = |w: &World| w.volumes.get(volume).map(|v| v.status.clone());
    if status(before) != status(now) {
        wrong.push(format!("the volume was {:?}, is {:?}", status(before), status(now)));
    }
    wrong
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Each flow's interruption tests; a flow marked `power_failure` (its intent is written and not
/// synced: it changes its backend only through driver calls, `ChangesBy::Driver`) also loses the
/// power at every failpoint up to its outcome's commit, with its intent lost and kept.
macro_rules! interruption_tests {
    ($($name:ident => $flow:ident $(, $power:ident)?;)*) => {
        $(
            mod $name {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_kill_at_every_failpoint_ends_safely() {
                    kill_at_every_failpoint(Flow::$flow).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn a_client_leaving_at_every_failpoint_changes_nothing() {
                    leave_at_every_failpoint(Flow::$flow).await;
                }

                $(
                    mod $power {
                        use super::super::*;

                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn with_its_intent_lost_the_request_never_happened() {
                            power_off_at_every_failpoint(Flow::$flow, PowerLoss::IntentLost).await;
                        }

                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn with_its_intent_kept_it_ends_as_a_killed_one_does() {
                            power_off_at_every_failpoint(Flow::$flow, PowerLoss::IntentKept).await;
                        }
                    }
                )?
            }
        )*

        #[test]
        fn every_flow_is_interrupted() {
            let tested = [$(Flow::$flow),*];
            for flow in Flow::ALL {
                assert!(tested.contains(&flow), "{flow:?} has no interruption tests");
            }
        }
    };
}

interruption_tests! {
    volume_create => CreateVolume;
    volume_delete => DeleteVolume;
    attachment_create => CreateAttachment, power_failure;
    second_attachment_of_a_multiattach_volume => CreateSecondOfMultiattach, power_failure;
    attachment_update => UpdateAttachment, power_failure;
    unshelve => Unshelve, power_failure;
    connector_replacement => ReplaceConnector, power_failure;
    attachment_delete => DeleteAttachment, power_failure;
    delete_of_one_of_two_attachments => DeleteOneOfTwo, power_failure;
    legacy_initialize => LegacyInitialize, power_failure;
    legacy_initialize_replay => LegacyInitializeAgain, power_failure;
    legacy_terminate => LegacyTerminate, power_failure;
    legacy_detach => LegacyDetach, power_failure;
    legacy_unreserve => LegacyUnreserve, power_failure;
    legacy_terminate_of_an_unknown_connector => LegacyTerminateUnknown, power_failure;
    force_detach => ForceDetach, power_failure;
    volume_extend => ExtendVolume;
    attached_volume_extend => ExtendAttached;
    volume_unmanage => Unmanage;
}

/// A create killed after its intent, whose driver then fails when recovery finishes it: nobody
/// waits for that failure, so the user message is where its project learns of it (without a
/// request: the service's own work), next to the volume in `error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_fails_in_recovery_leaves_a_message_for_its_project() {
    use berth_tests::process::{BerthProcess, FAKE_BACKEND};
    let mut server =
        BerthProcess::start_with_env("", FAKE_BACKEND, &[("BERTH_FAILPOINTS", "volume.create.intent=kill")]);
    let c = Client::for_base(&server.base, "p1").at("3.54");
    let body = json!({"volume": {"size": 1, "metadata": {"fake.create-volume": "backend:no room"}}});
    let answer = c.try_send(Method::POST, "/volumes", Some(body), Some(Duration::from_secs(10))).await;
    assert!(answer.is_err(), "the process died at the intent: {answer:?}");
    assert!(server.wait_exit(Duration::from_secs(10)).is_some());
    server.start_again();
    let volumes = c.get("/volumes/detail").await.expect(200).body["volumes"].clone();
    let volume = volumes[0]["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while c.volume_status(&volume).await != "error" {
        assert!(std::time::Instant::now() < deadline, "recovery never finished the create");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = c.get("/messages").await.expect(200).body["messages"].clone();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(
        (&listed[0]["resource_uuid"], &listed[0]["event_id"], &listed[0]["request_id"]),
        (&json!(volume), &json!("VOLUME_VOLUME_008_012"), &Value::Null)
    );
}

/// An extend killed after its intent counts at its new size against its project's quota until
/// recovery finishes it; recovery's end (here the driver failing it) frees what it held: nothing
/// of a quota leaks through a kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_killed_in_flight_holds_its_quota_only_until_recovery_ends_it() {
    use berth_tests::process::{BerthProcess, FAKE_BACKEND};
    let mut server =
        BerthProcess::start_with_env("", FAKE_BACKEND, &[("BERTH_FAILPOINTS", "volume.extend.intent=kill")]);
    let c = Client::for_base(&server.base, "p1").at("3.54");
    c.put("/os-quota-sets/p1", json!({"quota_set": {"gigabytes": 10}})).await.expect(200);
    let volume =
        c.create_volume(json!({"size": 2, "metadata": {"fake.extend-volume": "backend:no room"}})).await;
    let extend = json!({"os-extend": {"new_size": 9}});
    let answer = c
        .try_send(
            Method::POST,
            &format!("/volumes/{volume}/action"),
            Some(extend),
            Some(Duration::from_secs(10)),
        )
        .await;
    assert!(answer.is_err(), "the process died at the intent: {answer:?}");
    assert!(server.wait_exit(Duration::from_secs(10)).is_some());
    server.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while c.volume_status(&volume).await != "available" {
        assert!(std::time::Instant::now() < deadline, "recovery never finished the extend");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let usage = c.get("/os-quota-sets/p1?usage=true").await.expect(200).body;
    assert_eq!(usage["quota_set"]["gigabytes"]["in_use"], 2, "{usage}");
    c.create_volume(json!({"size": 8})).await;
    c.post("/volumes", json!({"volume": {"size": 1}})).await.fault(413, "overLimit");
}

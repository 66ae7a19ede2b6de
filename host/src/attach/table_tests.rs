//! The orchestration, tested as Kubernetes' external-attacher tests its controller: each row is
//! stored state, one command and the driver's scripted replies, and says what is stored after
//! the command and which driver calls it made. No HTTP, no tgtd: the service in-process on a
//! SQLite file, with the fake driver, which the volume's metadata scripts (`fake.<call>`).
//! docs/operations.md, "The outcomes", is the specification these rows check.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::attachments::NewAttachment;
use super::model::Connector;
use super::ops::Owner;
use super::volumes::NewVolume;
use super::{AttachError, Backend, Caller, Catalog, Service, VolumeType};
use crate::capabilities::DriverCapabilities;
use crate::domain::list::Scope;
use crate::runtime::slot::Counts;
use crate::runtime::{Call, DriverSpec, Limits, Runtime, RuntimeOptions};
use crate::store::{Store, StoreOptions};

/// What is stored before the command.
#[derive(Debug, Clone, Copy)]
enum Given {
    /// An available volume.
    Available,
    /// A volume with an attachment reserved without connector.
    Reserved,
    /// A volume attached to `alice` (created with her connector, completed).
    Attached,
}

/// The command.
#[derive(Debug, Clone, Copy)]
enum When {
    /// `POST /attachments` with `alice`'s connector.
    AttachAlice,
    /// `POST /attachments` without connector.
    Reserve,
    /// `PUT /attachments/{id}` of the given attachment with `alice`'s connector.
    UpdateWithAlice,
    /// `os-complete` of the given attachment.
    Complete,
    /// `DELETE /attachments/{id}` of the given attachment.
    Delete,
    /// Legacy `os-terminate_connection` of `mallory`, whom no attachment has.
    TerminateMallory,
}

/// What is stored after it, and what the driver was asked.
struct Then {
    /// `Ok`, or the error's kind (`driver`, ...).
    outcome: &'static str,
    volume: &'static str,
    /// The volume's attachments' statuses, sorted.
    attachments: &'static [&'static str],
    calls: &'static [(Call, u64)],
}

struct Row {
    name: &'static str,
    given: Given,
    /// The fake driver's directives, set on the volume before the command.
    script: &'static [(&'static str, &'static str)],
    when: When,
    then: Then,
}

use Call::*;

const ROWS: &[Row] = &[
    Row {
        name: "a connector attaches an available volume: export, then connection",
        given: Given::Available,
        script: &[],
        when: When::AttachAlice,
        then: Then {
            outcome: "ok",
            volume: "attaching",
            attachments: &["attaching"],
            calls: &[(ValidateConnector, 1), (CreateExport, 1), (InitializeConnection, 1)],
        },
    },
    Row {
        name: "a failed connection rolls the reservation back and revokes what it may have granted",
        given: Given::Available,
        script: &[("fake.initialize-connection", "backend")],
        when: When::AttachAlice,
        then: Then {
            outcome: "driver",
            volume: "available",
            attachments: &[],
            calls: &[
                (ValidateConnector, 1),
                (CreateExport, 1),
                (InitializeConnection, 1),
                (TerminateConnection, 1),
                (RemoveExport, 1),
            ],
        },
    },
    Row {
        name: "a failed connection whose revoke fails too is left error_attaching",
        given: Given::Available,
        script: &[("fake.initialize-connection", "backend"), ("fake.terminate-connection", "backend")],
        when: When::AttachAlice,
        then: Then {
            outcome: "driver",
            // Access may remain: the volume is not free until the attachment is deleted.
            volume: "in-use",
            attachments: &["error_attaching"],
            calls: &[
                (ValidateConnector, 1),
                (CreateExport, 1),
                (InitializeConnection, 1),
                (TerminateConnection, 1),
            ],
        },
    },
    Row {
        name: "a reservation makes no driver call",
        given: Given::Available,
        script: &[],
        when: When::Reserve,
        then: Then { outcome: "ok", volume: "reserved", attachments: &["reserved"], calls: &[] },
    },
    Row {
        name: "a failed update leaves the attachment reserved",
        given: Given::Reserved,
        script: &[("fake.create-export", "backend")],
        when: When::UpdateWithAlice,
        then: Then {
            outcome: "driver",
            volume: "reserved",
            attachments: &["reserved"],
            calls: &[(ValidateConnector, 1), (CreateExport, 1), (TerminateConnection, 1), (RemoveExport, 1)],
        },
    },
    Row {
        name: "a reservation completed without connector is attached with no driver call (Nova's shelved server)",
        given: Given::Reserved,
        script: &[],
        when: When::Complete,
        then: Then { outcome: "ok", volume: "in-use", attachments: &["attached"], calls: &[] },
    },
    Row {
        name: "a delete revokes the connector, then removes the unused export",
        given: Given::Attached,
        script: &[],
        when: When::Delete,
        then: Then {
            outcome: "ok",
            volume: "available",
            attachments: &[],
            calls: &[(TerminateConnection, 1), (RemoveExport, 1)],
        },
    },
    Row {
        name: "a failed detach leaves error_detaching",
        given: Given::Attached,
        script: &[("fake.terminate-connection", "backend")],
        when: When::Delete,
        then: Then {
            outcome: "driver",
            volume: "in-use",
            attachments: &["error_detaching"],
            calls: &[(TerminateConnection, 1)],
        },
    },
    Row {
        name: "a terminate of a connector no attachment has revokes it and changes nothing stored",
        given: Given::Attached,
        script: &[],
        when: When::TerminateMallory,
        then: Then {
            outcome: "ok",
            volume: "in-use",
            attachments: &["attached"],
            calls: &[(TerminateConnection, 1)],
        },
    },
    Row {
        name: "a failed terminate of a connector no attachment has changes nothing",
        given: Given::Attached,
        script: &[("fake.terminate-connection", "backend")],
        when: When::TerminateMallory,
        then: Then {
            outcome: "driver",
            volume: "in-use",
            attachments: &["attached"],
            calls: &[(TerminateConnection, 1)],
        },
    },
];

const ALICE: &str = "iqn.1993-08.org.debian:01:alice";
const MALLORY: &str = "iqn.1993-08.org.debian:01:mallory";

fn caller() -> Caller {
    Caller {
        user_id: "u".into(),
        project_id: "p".into(),
        roles: vec!["member".into()],
        is_service: false,
        request: Default::default(),
    }
}

fn connector(initiator: &str) -> Connector {
    let json = json!({"initiator": initiator, "host": "h", "ip": "127.0.0.1", "platform": "x86_64",
        "os_type": "linux", "multipath": false});
    Connector::parse(json.as_object().cloned().expect("an object")).expect("a connector")
}

async fn service(dir: &std::path::Path) -> Arc<Service> {
    let url = format!("sqlite://{}", dir.join("t.db").display());
    let store = Store::open(&url, &StoreOptions::default()).await.expect("a store");
    let runtime = Runtime::new(RuntimeOptions::default()).expect("a runtime");
    let spec = DriverSpec {
        backend: "fake".into(),
        wasm: crate::shipped::driver("fake").expect("the fake driver is shipped"),
        grants: Default::default(),
        limits: Limits::default(),
        capabilities: DriverCapabilities::default(),
    };
    let driver = runtime.load(spec).await.expect("the fake driver loads");
    let backend = Backend::new("node", "fake", driver, false, false);
    let types = vec![VolumeType::new("__DEFAULT__", "fake", None, BTreeMap::new())];
    let catalog = Catalog::new(types, "__DEFAULT__".into(), vec![backend]).expect("a catalog");
    Arc::new(Service::new(store, catalog, Owner::new("node", Duration::from_secs(30))))
}

fn kind(e: &AttachError) -> &'static str {
    match e {
        AttachError::Driver(_) => "driver",
        AttachError::NotFound(_) => "not-found",
        AttachError::InvalidInput(_) => "invalid-input",
        _ => "other",
    }
}

/// The calls made, as (call, count) for those made at least once.
fn calls(counts: &Counts) -> Vec<(Call, u64)> {
    Call::ALL.iter().map(|c| (*c, counts.of(*c))).filter(|(_, n)| *n > 0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_row_ends_in_its_stored_state_with_its_driver_calls() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path()).await;
    let commands = service.commands();
    let driver = service.catalog().backend("fake").unwrap().driver;
    let mut wrong = Vec::new();
    for row in ROWS {
        // Given.
        let volume = commands
            .create_volume(
                caller(),
                NewVolume {
                    size_gib: 1,
                    name: None,
                    description: None,
                    volume_type: None,
                    metadata: BTreeMap::new(),
                },
            )
            .await
            .unwrap()
            .id;
        let new = |connector: Option<Connector>| NewAttachment {
            volume_id: volume.clone(),
            instance_uuid: None,
            connector,
            mode: None,
            legacy: false,
        };
        let attachment = match row.given {
            Given::Available => None,
            Given::Reserved => Some(commands.create_attachment(caller(), new(None)).await.unwrap().id),
            Given::Attached => {
                let a = commands.create_attachment(caller(), new(Some(connector(ALICE)))).await.unwrap();
                commands.complete_attachment(caller(), a.id.clone()).await.unwrap();
                Some(a.id)
            }
        };
        if !row.script.is_empty() {
            let script = row.script.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            commands.update_metadata(caller(), volume.clone(), script, false, None).await.unwrap();
        }

        // When.
        let before = driver.tally();
        let id = || attachment.clone().expect("the row gives an attachment");
        let outcome = match row.when {
            When::AttachAlice => {
                commands.create_attachment(caller(), new(Some(connector(ALICE)))).await.map(drop)
            }
            When::Reserve => commands.create_attachment(caller(), new(None)).await.map(drop),
            When::UpdateWithAlice => {
                commands.update_attachment(caller(), id(), connector(ALICE)).await.map(drop)
            }
            When::Complete => commands.complete_attachment(caller(), id()).await,
            When::Delete => commands.delete_attachment(caller(), id()).await.map(drop),
            When::TerminateMallory => {
                commands.legacy_terminate(caller(), volume.clone(), Some(connector(MALLORY))).await
            }
        };
        let made = calls(&driver.tally().since(before));

        // Then.
        let (status, mut statuses) = service
            .store()
            .read(async |tx| {
                let v = crate::store::volumes::get(tx, &volume, Scope::All).await?.expect("the volume");
                let rows = crate::store::attachments::live(tx, &volume).await?;
                Ok::<_, AttachError>((
                    v.status.to_string(),
                    rows.iter().map(|l| l.attachment.status.to_string()).collect::<Vec<_>>(),
                ))
            })
            .await
            .unwrap();
        statuses.sort();
        let got_outcome = match &outcome {
            Ok(()) => "ok",
            Err(e) => kind(e),
        };
        // Compared as counts by call (in the contract's order).
        let expected: Vec<(Call, u64)> =
            Call::ALL.iter().filter_map(|c| row.then.calls.iter().find(|(k, _)| k == c).copied()).collect();
        if (got_outcome, status.as_str(), &statuses, &made)
            != (
                row.then.outcome,
                row.then.volume,
                &row.then.attachments.iter().map(|s| s.to_string()).collect(),
                &expected,
            )
        {
            wrong.push(format!(
                "{}:\n    got      {got_outcome} ({outcome:?}), volume {status}, attachments {statuses:?}, calls {made:?}\n    expected {}, volume {}, attachments {:?}, calls {:?}",
                row.name, row.then.outcome, row.then.volume, row.then.attachments, row.then.calls
            ));
        }
    }
    assert!(wrong.is_empty(), "rows that do not hold:\n  {}", wrong.join("\n  "));
}

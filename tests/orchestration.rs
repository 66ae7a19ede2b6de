//! The orchestration as a table, in the shape Kubernetes' external-attacher tests its controller:
//! each row is (stored rows made first, a command, the driver's scripted replies) → (the rows
//! stored afterwards, the command's answer). The commands are `attach::commands::Commands`, the
//! service's only changing entry points, called without HTTP on a real database (SQLite) with the
//! scriptable `fake` driver; every row also checks the invariants of `harness/invariants.rs`
//! (no operation unfinished, no volume stuck, statuses consistent with the attachments).

use std::collections::BTreeMap;

use berth::attach::attachments::NewAttachment;
use berth::attach::legacy::LegacyAttach;
use berth::attach::volumes::NewVolume;
use berth::attach::{AttachError, Caller};
use berth::domain::model::{AttachMode, Connector};
use berth_tests::invariants::{self, World};
use berth_tests::server::{Db, TestServer, connector};

/// What a row starts from.
#[derive(Debug, Clone, Copy)]
enum Given {
    Available,
    /// Reserved without a connector (attachment create without one).
    Reserved,
    /// Connected and completed.
    Attached,
    /// Reserved by the legacy `os-reserve`.
    LegacyReserved,
}

/// The command a row runs.
#[derive(Debug, Clone, Copy)]
enum Command {
    CreateWithConnector,
    UpdateWithConnector,
    Complete,
    Delete,
    Extend,
    LegacyInitialize,
    LegacyAttach,
    ForceDetach,
    DeleteVolume,
}

/// A row: given, the driver's scripted replies (`fake.<call>` directives), the command; then the
/// volume's status, its live attachments' statuses, and the kind of answer.
struct Row {
    given: Given,
    script: &'static [(&'static str, &'static str)],
    command: Command,
    volume: Option<&'static str>,
    attachments: &'static [&'static str],
    answer: Result<(), &'static str>,
}

/// The table (one line a row, as a table reads).
#[rustfmt::skip]
const ROWS: &[Row] = &[
    // Attachment create with a connector.
    row(Given::Available, &[], Command::CreateWithConnector, Some("attaching"), &["attaching"], Ok(())),
    row(Given::Available, &[("initialize-connection", "backend")], Command::CreateWithConnector, Some("available"), &[], Err("driver")),
    row(Given::Available, &[("create-export", "retryable")], Command::CreateWithConnector, Some("available"), &[], Err("driver")),
    row(Given::Available, &[("initialize-connection", "backend"), ("terminate-connection", "backend")], Command::CreateWithConnector, Some("in-use"), &["error_attaching"], Err("driver")),
    // Update of a reservation with a connector.
    row(Given::Reserved, &[], Command::UpdateWithConnector, Some("attaching"), &["attaching"], Ok(())),
    row(Given::Reserved, &[("initialize-connection", "incompatible")], Command::UpdateWithConnector, Some("reserved"), &["reserved"], Err("driver")),
    // Complete needs no driver.
    row(Given::Reserved, &[("initialize-connection", "panic")], Command::Complete, Some("in-use"), &["attached"], Ok(())),
    // Delete of a connected attachment, and of a reservation (nothing to revoke).
    row(Given::Attached, &[], Command::Delete, Some("available"), &[], Ok(())),
    row(Given::Attached, &[("terminate-connection", "backend")], Command::Delete, Some("in-use"), &["error_detaching"], Err("driver")),
    row(Given::Reserved, &[("terminate-connection", "panic")], Command::Delete, Some("available"), &[], Ok(())),
    // Extend: available volumes only; a failure leaves it available at its old size.
    row(Given::Available, &[], Command::Extend, Some("available"), &[], Ok(())),
    row(Given::Available, &[("extend-volume", "backend")], Command::Extend, Some("available"), &[], Err("driver")),
    row(Given::Attached, &[], Command::Extend, Some("in-use"), &["attached"], Err("invalid volume")),
    // The legacy flow (`os-reserve` makes the volume `attaching`, as Cinder's reserve does).
    row(Given::LegacyReserved, &[], Command::LegacyInitialize, Some("attaching"), &["attaching"], Ok(())),
    row(Given::LegacyReserved, &[("initialize-connection", "backend")], Command::LegacyInitialize, Some("attaching"), &["reserved"], Err("driver")),
    row(Given::LegacyReserved, &[], Command::LegacyAttach, Some("attaching"), &["reserved"], Err("invalid volume")),
    // Force-detach revokes before it changes the database.
    row(Given::Attached, &[], Command::ForceDetach, Some("available"), &[], Ok(())),
    row(Given::Attached, &[("terminate-connection", "backend")], Command::ForceDetach, Some("in-use"), &["attached"], Err("driver")),
    // A volume with attachments is never deleted; a failed delete is error_deleting.
    row(Given::Attached, &[], Command::DeleteVolume, Some("in-use"), &["attached"], Err("invalid volume")),
    row(Given::Available, &[], Command::DeleteVolume, None, &[], Ok(())),
    row(Given::Available, &[("delete-volume", "backend")], Command::DeleteVolume, Some("error_deleting"), &[], Err("driver")),
];

const fn row(
    given: Given,
    script: &'static [(&'static str, &'static str)],
    command: Command,
    volume: Option<&'static str>,
    attachments: &'static [&'static str],
    answer: Result<(), &'static str>,
) -> Row {
    Row { given, script, command, volume, attachments, answer }
}

fn caller() -> Caller {
    Caller {
        user_id: "u".into(),
        project_id: "p1".into(),
        roles: vec!["admin".into()],
        is_service: true,
        request: Default::default(),
    }
}

fn host_connector() -> Connector {
    let json = connector("iqn.1993-08.org.debian:01:table", "table-host");
    Connector::parse(json.as_object().unwrap().clone()).unwrap()
}

fn kind(e: &AttachError) -> &'static str {
    match e {
        AttachError::Driver(_) => "driver",
        AttachError::InvalidVolume(_) => "invalid volume",
        AttachError::InvalidAttachment(_) => "invalid attachment",
        AttachError::InvalidInput(_) => "invalid input",
        _ => "other",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_row_of_the_table_ends_in_its_rows_and_its_answer() {
    let server = TestServer::start(Db::Sqlite).await;
    let store = invariants::open(server.config.database_url.as_deref().unwrap()).await;
    let commands = server.service.commands();
    let mut wrong = Vec::new();
    for (n, r) in ROWS.iter().enumerate() {
        let volume = commands
            .create_volume(caller(), NewVolume { size_gib: 1, ..Default::default() })
            .await
            .unwrap()
            .id;
        // Given.
        let attachment = match r.given {
            Given::Available => None,
            Given::Reserved | Given::Attached => {
                let connector = matches!(r.given, Given::Attached).then(host_connector);
                let req = NewAttachment { volume_id: volume.clone(), connector, ..Default::default() };
                let a = commands.create_attachment(caller(), req).await.unwrap();
                if matches!(r.given, Given::Attached) {
                    commands.complete_attachment(caller(), a.id.clone()).await.unwrap();
                }
                Some(a.id)
            }
            Given::LegacyReserved => {
                commands.legacy_reserve(caller(), volume.clone()).await.unwrap();
                None
            }
        };
        // The driver's scripted replies.
        let script: BTreeMap<String, String> = r
            .script
            .iter()
            .map(|(call, directive)| (format!("fake.{call}"), directive.to_string()))
            .collect();
        commands.update_metadata(caller(), volume.clone(), script, false, None).await.unwrap();
        // The command.
        let v = volume.clone();
        let answer = match r.command {
            Command::CreateWithConnector => {
                let req =
                    NewAttachment { volume_id: v, connector: Some(host_connector()), ..Default::default() };
                commands.create_attachment(caller(), req).await.map(drop)
            }
            Command::UpdateWithConnector => commands
                .update_attachment(caller(), attachment.clone().unwrap(), host_connector())
                .await
                .map(drop),
            Command::Complete => commands.complete_attachment(caller(), attachment.clone().unwrap()).await,
            Command::Delete => {
                commands.delete_attachment(caller(), attachment.clone().unwrap()).await.map(drop)
            }
            Command::Extend => commands.extend_volume(caller(), v, 2, false).await.map(drop),
            Command::LegacyInitialize => {
                commands.legacy_initialize(caller(), v, host_connector()).await.map(drop)
            }
            Command::LegacyAttach => {
                let req = LegacyAttach {
                    instance_uuid: None,
                    host_name: Some("table-host".into()),
                    mountpoint: "/dev/vdb".into(),
                    mode: AttachMode::Rw,
                };
                commands.legacy_attach(caller(), v, req).await
            }
            Command::ForceDetach => commands.force_detach(caller(), v, None, None).await,
            Command::DeleteVolume => commands.delete_volume(caller(), v, false).await,
        };
        // Then.
        let world: World = invariants::snapshot_database(&store).await;
        let status = world.volumes.get(&volume).map(|v| v.status.as_str());
        let mut live: Vec<&str> = world.live_of(&volume).map(|a| a.status.as_str()).collect();
        live.sort();
        let answered = answer.as_ref().map(drop).map_err(kind);
        let problems = invariants::violations_with(&world, |_| false);
        if status != r.volume || live != r.attachments || answered != r.answer || !problems.is_empty() {
            wrong.push(format!(
                "row {n} ({:?}, {:?}, {:?}): volume {status:?}, attachments {live:?}, answer {answer:?}, invariants {problems:?}",
                r.given, r.script, r.command
            ));
        }
    }
    assert!(wrong.is_empty(), "{} of {} rows wrong:\n{}", wrong.len(), ROWS.len(), wrong.join("\n"));
}

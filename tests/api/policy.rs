//! The authorisation matrix: every route x {reader, member, admin, service} x {own project, other
//! project}, generated from one table, with the expected status of each cell. Roles follow
//! Cinder's secure defaults (reader reads, member changes its project's resources, admin does
//! everything); another project's resources are 404 to non-admins; an instance's connected
//! attachment is ended only with a service token or by an admin (OSSA-2023-003, 409 otherwise).

use berth_tests::server::{Client, Db, TestServer, connector};
use reqwest::Method;
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Reader,
    Member,
    Admin,
    /// A member sending a service token (`X-Service-Roles: service`), as Nova does.
    Service,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Whose {
    Own,
    Other,
}

/// The least role a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Least {
    Reader,
    Member,
    Admin,
}

/// What exists before the call, in project `p1`.
#[derive(Debug, Clone, Copy)]
enum Fixture {
    Nothing,
    /// An available volume with metadata `k = v`.
    Volume,
    /// The same with the image property `hw_disk_bus = scsi`.
    ImageProperties,
    /// A volume with an attachment without connector (`reserved`).
    Reserved,
    /// A volume with a connected attachment (no instance).
    Connected,
    /// A volume with a connected, completed attachment of an instance.
    InstanceAttached,
    /// A volume with an instance's attachment without connector.
    InstanceReserved,
    /// Legacy: `os-reserve`.
    LegacyReserved,
    /// Legacy: `os-reserve` + `os-initialize_connection`.
    LegacyConnected,
    /// Legacy: reserve + initialize + `os-attach` with an instance.
    LegacyAttached,
    /// Legacy: attached, then `os-begin_detaching`.
    LegacyDetaching,
}

/// How a route answers a caller in another project who passes its rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// A resource by id: 404 to non-admins of other projects.
    ById,
    /// A list: 200, and only the caller's own project's rows (none here).
    List,
    /// Not tied to the fixture's project (creating a volume, volume types).
    Global,
}

struct Route {
    name: &'static str,
    method: Method,
    /// `{v}` is the fixture's volume, `{a}` its attachment.
    path: &'static str,
    body: Option<Value>,
    fixture: Fixture,
    least: Least,
    reach: Reach,
    /// The instance's connected attachment would be ended (OSSA-2023-003).
    ends_instance_access: bool,
    ok: u16,
    /// The microversion its requests are sent at (3.54, or the route's own where it came later).
    version: &'static str,
}

const INSTANCE: &str = "c0ffee00-0000-4000-8000-000000000001";

fn routes() -> Vec<Route> {
    use Fixture::*;
    use Least::*;
    use Reach::*;
    let c = connector("iqn.1993-08.org.debian:01:policy", "policy-host");
    let action = |name: &'static str, body: Value, fixture, least, ends, ok| Route {
        name,
        method: Method::POST,
        path: "/volumes/{v}/action",
        body: Some(body),
        fixture,
        least,
        reach: ById,
        ends_instance_access: ends,
        ok,
        version: "3.54",
    };
    let route = |name, method, path, body: Option<Value>, fixture, least, reach, ok| Route {
        name,
        method,
        path,
        body,
        fixture,
        least,
        reach,
        ends_instance_access: false,
        ok,
        version: "3.54",
    };
    vec![
        route("list volumes", Method::GET, "/volumes", None, Volume, Reader, List, 200),
        route("list volumes in detail", Method::GET, "/volumes/detail", None, Volume, Reader, List, 200),
        route("show a volume", Method::GET, "/volumes/{v}", None, Volume, Reader, ById, 200),
        route(
            "create a volume",
            Method::POST,
            "/volumes",
            Some(json!({"volume": {"size": 1}})),
            Nothing,
            Member,
            Global,
            202,
        ),
        route("delete a volume", Method::DELETE, "/volumes/{v}", None, Volume, Member, ById, 202),
        route(
            "force-delete a volume",
            Method::DELETE,
            "/volumes/{v}?force=true",
            None,
            Volume,
            Admin,
            ById,
            202,
        ),
        route("show metadata", Method::GET, "/volumes/{v}/metadata", None, Volume, Reader, ById, 200),
        route(
            "show a metadata item",
            Method::GET,
            "/volumes/{v}/metadata/k",
            None,
            Volume,
            Reader,
            ById,
            200,
        ),
        route(
            "merge metadata",
            Method::POST,
            "/volumes/{v}/metadata",
            Some(json!({"metadata": {"x": "y"}})),
            Volume,
            Member,
            ById,
            200,
        ),
        route(
            "replace metadata",
            Method::PUT,
            "/volumes/{v}/metadata",
            Some(json!({"metadata": {"x": "y"}})),
            Volume,
            Member,
            ById,
            200,
        ),
        route(
            "delete a metadata item",
            Method::DELETE,
            "/volumes/{v}/metadata/k",
            None,
            Volume,
            Member,
            ById,
            200,
        ),
        route("list volume types", Method::GET, "/types", None, Nothing, Reader, Global, 200),
        route("show a volume type", Method::GET, "/types/default", None, Nothing, Reader, Global, 200),
        route(
            "list a volume type's extra specs",
            Method::GET,
            "/types/multiattach/extra_specs",
            None,
            Nothing,
            Reader,
            Global,
            200,
        ),
        route(
            "show an extra spec",
            Method::GET,
            "/types/multiattach/extra_specs/multiattach",
            None,
            Nothing,
            Reader,
            Global,
            200,
        ),
        route("list services", Method::GET, "/os-services", None, Nothing, Admin, Global, 200),
        route("list pools", Method::GET, "/scheduler-stats/get_pools", None, Nothing, Admin, Global, 200),
        route("list resource filters", Method::GET, "/resource_filters", None, Nothing, Reader, Global, 200),
        route("list clusters", Method::GET, "/clusters", None, Nothing, Admin, Global, 200),
        route("list QoS specs", Method::GET, "/qos-specs", None, Nothing, Admin, Global, 200),
        route("show capabilities", Method::GET, "/capabilities/{n}@fake", None, Nothing, Admin, Global, 200),
        route(
            "show a type's encryption",
            Method::GET,
            "/types/multiattach/encryption",
            None,
            Nothing,
            Admin,
            Global,
            200,
        ),
        route(
            "show a volume's encryption metadata",
            Method::GET,
            "/volumes/{v}/encryption",
            None,
            Volume,
            Reader,
            ById,
            200,
        ),
        route(
            "read log levels",
            Method::PUT,
            "/os-services/get-log",
            Some(json!({"binary": "cinder-backup"})),
            Nothing,
            Admin,
            Global,
            200,
        ),
        route(
            "show a quota class",
            Method::GET,
            "/os-quota-class-sets/default",
            None,
            Nothing,
            Admin,
            Global,
            200,
        ),
        route(
            "enable a service",
            Method::PUT,
            "/os-services/enable",
            Some(json!({"host": "{n}@fake", "binary": "cinder-volume"})),
            Nothing,
            Admin,
            Global,
            200,
        ),
        route("list attachments", Method::GET, "/attachments", None, Reserved, Reader, List, 200),
        route(
            "list attachments in detail",
            Method::GET,
            "/attachments/detail",
            None,
            Reserved,
            Reader,
            List,
            200,
        ),
        route("show an attachment", Method::GET, "/attachments/{a}", None, Reserved, Reader, ById, 200),
        route(
            "create an attachment",
            Method::POST,
            "/attachments",
            Some(json!({"attachment": {"volume_uuid": "{v}"}})),
            Volume,
            Member,
            ById,
            200,
        ),
        route(
            "update an attachment",
            Method::PUT,
            "/attachments/{a}",
            Some(json!({"attachment": {"connector": c.clone()}})),
            Reserved,
            Member,
            ById,
            200,
        ),
        route(
            "complete an attachment",
            Method::POST,
            "/attachments/{a}/action",
            Some(json!({"os-complete": null})),
            Connected,
            Member,
            ById,
            204,
        ),
        route("delete an attachment", Method::DELETE, "/attachments/{a}", None, Connected, Member, ById, 200),
        Route {
            ends_instance_access: true,
            ..route(
                "delete an instance's attached attachment",
                Method::DELETE,
                "/attachments/{a}",
                None,
                InstanceAttached,
                Member,
                ById,
                200,
            )
        },
        // Moving an instance's access to another host ends it on the instance's host.
        Route {
            ends_instance_access: true,
            ..route(
                "update an instance's attached attachment with another host's connector",
                Method::PUT,
                "/attachments/{a}",
                Some(
                    json!({"attachment": {"connector": connector("iqn.1993-08.org.debian:01:elsewhere", "elsewhere")}}),
                ),
                InstanceAttached,
                Member,
                ById,
                200,
            )
        },
        route(
            "update an instance's attached attachment with its own connector again",
            Method::PUT,
            "/attachments/{a}",
            Some(json!({"attachment": {"connector": c.clone()}})),
            InstanceAttached,
            Member,
            ById,
            200,
        ),
        route(
            "complete an instance's reservation without connector (shelved-offloaded)",
            Method::POST,
            "/attachments/{a}/action",
            Some(json!({"os-complete": null})),
            InstanceReserved,
            Member,
            ById,
            204,
        ),
        action(
            "os-terminate_connection of an instance's new-style attachment",
            json!({"os-terminate_connection": {"connector": c.clone()}}),
            InstanceAttached,
            Member,
            true,
            202,
        ),
        action("os-reserve", json!({"os-reserve": null}), Volume, Member, false, 202),
        action("os-unreserve", json!({"os-unreserve": null}), LegacyReserved, Member, false, 202),
        action(
            "os-initialize_connection",
            json!({"os-initialize_connection": {"connector": c.clone()}}),
            LegacyReserved,
            Member,
            false,
            200,
        ),
        action(
            "os-attach",
            json!({"os-attach": {"instance_uuid": INSTANCE, "mountpoint": "/dev/vdb"}}),
            LegacyConnected,
            Member,
            false,
            202,
        ),
        action("os-begin_detaching", json!({"os-begin_detaching": null}), LegacyAttached, Member, false, 202),
        action("os-roll_detaching", json!({"os-roll_detaching": null}), LegacyDetaching, Member, false, 202),
        action(
            "os-terminate_connection of a reservation",
            json!({"os-terminate_connection": {"connector": c.clone()}}),
            LegacyConnected,
            Member,
            false,
            202,
        ),
        action(
            "os-terminate_connection of an instance's attachment",
            json!({"os-terminate_connection": {"connector": c.clone()}}),
            LegacyAttached,
            Member,
            true,
            202,
        ),
        action(
            "os-detach of an instance's attachment",
            json!({"os-detach": {"attachment_id": "{a}"}}),
            LegacyAttached,
            Member,
            true,
            202,
        ),
        action(
            "os-force_detach",
            json!({"os-force_detach": {"attachment_id": "{a}"}}),
            LegacyAttached,
            Admin,
            false,
            202,
        ),
        action("os-unmanage", json!({"os-unmanage": null}), Volume, Admin, false, 202),
        action("os-retype", json!({"os-retype": {"new_type": "multiattach"}}), Volume, Member, false, 202),
        action(
            "os-set_image_metadata",
            json!({"os-set_image_metadata": {"metadata": {"hw_disk_bus": "scsi"}}}),
            Volume,
            Member,
            false,
            200,
        ),
        action(
            "os-unset_image_metadata",
            json!({"os-unset_image_metadata": {"key": "hw_disk_bus"}}),
            ImageProperties,
            Member,
            false,
            200,
        ),
        action("os-show_image_metadata", json!({"os-show_image_metadata": null}), Volume, Reader, false, 200),
        route(
            "offer a volume for transfer",
            Method::POST,
            "/os-volume-transfer",
            Some(json!({"transfer": {"volume_id": "{v}"}})),
            Volume,
            Member,
            ById,
            202,
        ),
        route("list transfers", Method::GET, "/os-volume-transfer", None, Volume, Reader, List, 200),
        Route {
            version: "3.3",
            ..route("list messages", Method::GET, "/messages", None, Nothing, Reader, List, 200)
        },
        // Snapshots and backups: none can be made here; the lists are a reader's, and a request
        // to make one is a member's, refused with 400 once it passes its rule.
        route("list snapshots", Method::GET, "/snapshots/detail", None, Nothing, Reader, List, 200),
        route("list backups", Method::GET, "/backups/detail", None, Nothing, Reader, List, 200),
        route(
            "create a snapshot",
            Method::POST,
            "/snapshots",
            Some(json!({"snapshot": {"volume_id": "{v}", "force": true}})),
            Volume,
            Member,
            Global,
            400,
        ),
        route(
            "create a backup",
            Method::POST,
            "/backups",
            Some(json!({"backup": {"volume_id": "{v}"}})),
            Volume,
            Member,
            Global,
            400,
        ),
        // Groups (3.13), group snapshots (3.14) and group types (3.11): none here either; a
        // group type is an admin's to make.
        Route {
            version: "3.14",
            ..route("list groups", Method::GET, "/groups/detail", None, Nothing, Reader, List, 200)
        },
        Route {
            version: "3.14",
            ..route("list group snapshots", Method::GET, "/group_snapshots", None, Nothing, Reader, List, 200)
        },
        Route {
            version: "3.14",
            ..route(
                "create a group",
                Method::POST,
                "/groups",
                Some(json!({"group": {"group_type": "gt", "volume_types": ["t"]}})),
                Nothing,
                Member,
                Global,
                400,
            )
        },
        Route {
            version: "3.14",
            ..route(
                "create a group type",
                Method::POST,
                "/group_types",
                Some(json!({"group_type": {"name": "gt"}})),
                Nothing,
                Admin,
                Global,
                400,
            )
        },
        route("list extensions", Method::GET, "/extensions", None, Nothing, Reader, Global, 200),
        // A project's default type (3.62), of a project of its own (`pd`): set, then read, then
        // unset, so that each read finds one.
        Route {
            version: "3.62",
            ..route(
                "set a project's default type",
                Method::PUT,
                "/default-types/pd",
                Some(json!({"default_type": {"volume_type": "__DEFAULT__"}})),
                Nothing,
                Admin,
                Global,
                200,
            )
        },
        Route {
            version: "3.62",
            ..route("list default types", Method::GET, "/default-types", None, Nothing, Admin, Global, 200)
        },
        Route {
            version: "3.62",
            ..route(
                "show a project's default type",
                Method::GET,
                "/default-types/pd",
                None,
                Nothing,
                Admin,
                Global,
                200,
            )
        },
        Route {
            version: "3.62",
            ..route(
                "unset a project's default type",
                Method::DELETE,
                "/default-types/pd",
                None,
                Nothing,
                Admin,
                Global,
                204,
            )
        },
    ]
}

/// The status a cell must answer.
fn expected(route: &Route, who: Who, whose: Whose) -> u16 {
    let passes = match route.least {
        Least::Reader => true,
        Least::Member => who != Who::Reader,
        Least::Admin => who == Who::Admin,
    };
    if !passes {
        return 403;
    }
    if whose == Whose::Other && route.reach == Reach::ById && who != Who::Admin {
        return 404;
    }
    if route.ends_instance_access && !matches!(who, Who::Admin | Who::Service) {
        return 409;
    }
    route.ok
}

/// Builds the fixture in project p1 as its admin; returns (volume, attachment).
async fn build(owner: &Client, fixture: Fixture) -> (String, String) {
    let c = connector("iqn.1993-08.org.debian:01:policy", "policy-host");
    if let Fixture::Nothing = fixture {
        return (String::new(), String::new());
    }
    let volume = owner.create_volume(json!({"size": 1, "metadata": {"k": "v"}})).await;
    let action = |body: Value| {
        let path = format!("/volumes/{volume}/action");
        async move { owner.post(&path, body).await }
    };
    let attachment_of = || async {
        let list = owner.get(&format!("/attachments?volume_id={volume}")).await.expect(200);
        list.body["attachments"][0]["id"].as_str().unwrap_or_default().to_string()
    };
    let attachment = match fixture {
        Fixture::Nothing | Fixture::Volume => String::new(),
        Fixture::ImageProperties => {
            action(json!({"os-set_image_metadata": {"metadata": {"hw_disk_bus": "scsi"}}})).await.expect(200);
            String::new()
        }
        Fixture::Reserved => owner.attach(&volume, None).await.expect(200).body["attachment"]["id"]
            .as_str()
            .unwrap()
            .to_string(),
        Fixture::Connected => owner.attach(&volume, Some(c)).await.expect(200).body["attachment"]["id"]
            .as_str()
            .unwrap()
            .to_string(),
        Fixture::InstanceAttached => {
            let body =
                json!({"attachment": {"volume_uuid": volume, "instance_uuid": INSTANCE, "connector": c}});
            let a = owner.post("/attachments", body).await.expect(200).body["attachment"]["id"]
                .as_str()
                .unwrap()
                .to_string();
            owner.post(&format!("/attachments/{a}/action"), json!({"os-complete": null})).await.expect(204);
            a
        }
        Fixture::InstanceReserved => {
            let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": INSTANCE}});
            owner.post("/attachments", body).await.expect(200).body["attachment"]["id"]
                .as_str()
                .unwrap()
                .to_string()
        }
        Fixture::LegacyReserved
        | Fixture::LegacyConnected
        | Fixture::LegacyAttached
        | Fixture::LegacyDetaching => {
            action(json!({"os-reserve": null})).await.expect(202);
            if !matches!(fixture, Fixture::LegacyReserved) {
                action(json!({"os-initialize_connection": {"connector": c}})).await.expect(200);
            }
            if matches!(fixture, Fixture::LegacyAttached | Fixture::LegacyDetaching) {
                action(json!({"os-attach": {"instance_uuid": INSTANCE, "mountpoint": "/dev/vdb"}}))
                    .await
                    .expect(202);
            }
            if matches!(fixture, Fixture::LegacyDetaching) {
                action(json!({"os-begin_detaching": null})).await.expect(202);
            }
            attachment_of().await
        }
    };
    (volume, attachment)
}

/// A caller in p1 (`Own`) or in a project of its own that holds nothing (`Other`).
fn caller(s: &TestServer, who: Who, whose: Whose) -> Client {
    static OTHERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let project = match whose {
        Whose::Own => "p1".to_string(),
        Whose::Other => format!("p{}", 1000 + OTHERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
    };
    let c = s.client(&project).at("3.54");
    match who {
        Who::Reader => c.with_roles("reader"),
        Who::Member => c.with_roles("member"),
        Who::Admin => c.with_roles("admin"),
        Who::Service => c.with_roles("member").with_service_token(),
    }
}

/// `{v}` the volume, `{a}` the attachment, `{n}` the node.
fn fill(template: &str, volume: &str, attachment: &str, node: &str) -> String {
    template.replace("{v}", volume).replace("{a}", attachment).replace("{n}", node)
}

#[tokio::test]
async fn every_route_answers_each_role_in_each_project_as_the_policy_says() {
    let s = TestServer::start(Db::Sqlite).await;
    let owner = s.client("p1").at("3.54");
    let node = &s.service.owner().node;
    let mut failures = Vec::new();
    let mut cells = 0;
    for route in routes() {
        for who in [Who::Reader, Who::Member, Who::Admin, Who::Service] {
            for whose in [Whose::Own, Whose::Other] {
                cells += 1;
                let (volume, attachment) = build(&owner, route.fixture).await;
                let c = caller(&s, who, whose).at(route.version);
                let body = route.body.as_ref().map(|b| {
                    serde_json::from_str(&fill(&b.to_string(), &volume, &attachment, node)).unwrap()
                });
                let r = c
                    .send(route.method.clone(), &c.url(&fill(route.path, &volume, &attachment, node)), body)
                    .await;
                let want = expected(&route, who, whose);
                let mut wrong = r.status != want;
                if route.reach == Reach::List && r.status == 200 && whose == Whose::Other {
                    let rows = r.body.as_object().and_then(|o| o.values().next()).cloned();
                    wrong |= rows != Some(json!([]));
                }
                if r.status >= 400 && r.body.as_object().is_none_or(|o| o.len() != 1) {
                    wrong = true;
                }
                if wrong {
                    failures.push(format!(
                        "{} as {who:?} of the {whose:?} project: expected {want}, got {} {}",
                        route.name, r.status, r.body
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {cells} cells differ:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test]
async fn a_refused_detach_of_an_instances_attachment_changes_nothing() {
    let s = TestServer::start(Db::Sqlite).await;
    let owner = s.client("p1").at("3.54");
    let (volume, attachment) = build(&owner, Fixture::InstanceAttached).await;
    let member = caller(&s, Who::Member, Whose::Own);
    let message = member.delete(&format!("/attachments/{attachment}")).await.fault(409, "conflictingRequest");
    assert_eq!(
        message,
        format!("ConflictNovaUsingAttachment: Detach volume from instance {INSTANCE} using the Compute API")
    );
    let shown = owner.get(&format!("/attachments/{attachment}")).await.expect(200);
    assert_eq!(shown.body["attachment"]["status"], "attached");
    assert!(shown.body["attachment"]["connection_info"].is_object());
    assert_eq!(owner.volume_status(&volume).await, "in-use");
    // Nova, with its service token, may.
    caller(&s, Who::Service, Whose::Own).delete(&format!("/attachments/{attachment}")).await.expect(200);
    assert_eq!(owner.volume_status(&volume).await, "available");
}

/// The hardening issue's item 11: a plain member gave an instance's connected attachment another
/// host's connector and got 200: the instance's host lost access, another host got it. Now it is
/// the 409 of a delete, with a message that says why, and nothing changes (the stored connector
/// and connection stay the instance host's).
#[tokio::test]
async fn a_refused_move_of_an_instances_attachment_changes_nothing() {
    let s = TestServer::start(Db::Sqlite).await;
    let owner = s.client("p1").at("3.54");
    let (volume, attachment) = build(&owner, Fixture::InstanceAttached).await;
    let before = owner.get(&format!("/attachments/{attachment}")).await.expect(200).body;
    let member = caller(&s, Who::Member, Whose::Own);
    let other = json!({"attachment": {"connector": connector("iqn.1993-08.org.debian:01:thief", "thief")}});
    let message = member
        .put(&format!("/attachments/{attachment}"), other.clone())
        .await
        .fault(409, "conflictingRequest");
    assert!(message.contains(INSTANCE) && message.contains("service token"), "{message}");
    let after = owner.get(&format!("/attachments/{attachment}")).await.expect(200).body;
    assert_eq!(after, before, "the refused move changed the attachment");
    assert_eq!(owner.volume_status(&volume).await, "in-use");
    // Nova (live migration of the host's connector, for example) may.
    caller(&s, Who::Service, Whose::Own).put(&format!("/attachments/{attachment}"), other).await.expect(200);
}

#[tokio::test]
async fn a_policy_file_overrides_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, "\"volume:create\" = [\"admin\"]\n\"volume:get_all\" = [\"auditor\"]\n").unwrap();
    let mut config = berth_tests::server::fake_config();
    config.auth.policy_file = Some(path);
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let member = s.client("p1").with_roles("member");
    let message = member.post("/volumes", json!({"volume": {"size": 1}})).await.fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume:create to be performed.");
    s.client("p1").with_roles("admin").post("/volumes", json!({"volume": {"size": 1}})).await.expect(202);
    s.client("p1").with_roles("auditor").get("/volumes").await.expect(200);
    member.get("/volumes").await.fault(403, "forbidden");
}

/// `volume:extend_attached_volume` (Cinder's) decides who may extend an attached volume; an
/// available one is `volume:extend`'s, as in Cinder, which picks the rule by the volume's status.
#[tokio::test]
async fn a_policy_file_can_keep_extending_attached_volumes_to_admins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, "\"volume:extend_attached_volume\" = [\"admin\"]\n").unwrap();
    let mut config = berth_tests::server::fake_config();
    config.auth.policy_file = Some(path);
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let member = s.client("p1").with_roles("member").at("3.42");
    let extend = |size: i64| json!({"os-extend": {"new_size": size}});
    let volume = member.create_volume(json!({"size": 1})).await;
    member.post(&format!("/volumes/{volume}/action"), extend(2)).await.expect(202);
    let created =
        member.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:p", "p"))).await.expect(200);
    let attachment = created.body["attachment"]["id"].as_str().unwrap().to_string();
    let complete = json!({"os-complete": null});
    member.at("3.44").post(&format!("/attachments/{attachment}/action"), complete).await.expect(204);
    let message = member.post(&format!("/volumes/{volume}/action"), extend(3)).await.fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume:extend_attached_volume to be performed.");
    assert_eq!(member.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"]["size"], 2);
    s.client("p1")
        .with_roles("admin")
        .at("3.42")
        .post(&format!("/volumes/{volume}/action"), extend(3))
        .await
        .expect(202);
    assert_eq!(member.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"]["size"], 3);
}

/// `volume_extension:volume_image_metadata:show` decides who sees a volume's image properties in
/// its details, as in Cinder: kept to admins, a member's show and list leave them out.
#[tokio::test]
async fn a_policy_file_can_keep_image_properties_to_admins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, "\"volume_extension:volume_image_metadata:show\" = [\"admin\"]\n").unwrap();
    let mut config = berth_tests::server::fake_config();
    config.auth.policy_file = Some(path);
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let member = s.client("p1").with_roles("member");
    let volume = member.create_volume(json!({"size": 1})).await;
    let set = json!({"os-set_image_metadata": {"metadata": {"hw_disk_bus": "scsi"}}});
    member.post(&format!("/volumes/{volume}/action"), set).await.expect(200);
    let seen = |c: Client| {
        let path = format!("/volumes/{volume}");
        async move {
            let shown = c.get(&path).await.expect(200).body["volume"].get("volume_image_metadata").cloned();
            let listed = c.get("/volumes/detail").await.expect(200).body["volumes"][0]
                .get("volume_image_metadata")
                .cloned();
            (shown, listed)
        }
    };
    assert_eq!(seen(member.clone()).await, (None, None));
    let admin = s.client("p1").with_roles("admin");
    let properties = Some(json!({"hw_disk_bus": "scsi"}));
    assert_eq!(seen(admin).await, (properties.clone(), properties));
}

/// `volume:multiattach` (Cinder's): who may have a volume of a multiattach type, made so or
/// retyped to one. As in Cinder, a retype between two multiattach types changes nothing it guards.
#[tokio::test]
async fn a_policy_file_can_keep_multiattach_volumes_to_admins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, "\"volume:multiattach\" = [\"admin\"]\n").unwrap();
    let mut config = berth_tests::server::fake_config();
    let mut shared = config.volume_types[1].clone();
    shared.name = "shared".into();
    config.volume_types.push(shared);
    config.auth.policy_file = Some(path);
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let member = s.client("p1").with_roles("member");
    let message = member
        .post("/volumes", json!({"volume": {"size": 1, "volume_type": "multiattach"}}))
        .await
        .fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume:multiattach to be performed.");
    let volume = member.create_volume(json!({"size": 1})).await;
    let retype = json!({"os-retype": {"new_type": "multiattach"}});
    member.post(&format!("/volumes/{volume}/action"), retype.clone()).await.fault(403, "forbidden");
    assert_eq!(
        member.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"]["multiattach"],
        false
    );
    s.client("p1").with_roles("admin").post(&format!("/volumes/{volume}/action"), retype).await.expect(202);
    // Nor is such a volume made as the project's default type (3.62).
    let admin = s.client("p1").with_roles("admin").at("3.62");
    admin.put("/default-types/p1", json!({"default_type": {"volume_type": "multiattach"}})).await.expect(200);
    member.post("/volumes", json!({"volume": {"size": 1}})).await.fault(403, "forbidden");
    admin.delete("/default-types/p1").await.expect(204);
    let between = json!({"os-retype": {"new_type": "shared"}});
    member.post(&format!("/volumes/{volume}/action"), between).await.expect(202);
    let shown = member.get(&format!("/volumes/{volume}")).await.expect(200).body;
    assert_eq!(
        (&shown["volume"]["volume_type"], &shown["volume"]["multiattach"]),
        (&json!("shared"), &json!(true))
    );
}

/// The hardening issue's item 14: Cinder shows an attachment's connection info, CHAP password
/// included, to anyone who can read it. Here only who may use the attachment (its project's
/// members, services, admins) sees the secrets; a reader sees the rest of the connection.
#[tokio::test]
async fn readers_see_connection_info_without_its_secrets() {
    let s = TestServer::start(Db::Sqlite).await;
    let owner = s.client("p1").at("3.54");
    let (volume, attachment) = build(&owner, Fixture::InstanceAttached).await;
    let shown = |who: Who| {
        let c = caller(&s, who, Whose::Own);
        let path = format!("/attachments/{attachment}");
        async move { c.get(&path).await.expect(200).body["attachment"]["connection_info"].clone() }
    };
    let full = shown(Who::Member).await;
    assert!(full["auth_password"].as_str().is_some_and(|p| p.len() >= 12), "{full}");
    assert_eq!(shown(Who::Admin).await, full);
    assert_eq!(shown(Who::Service).await, full);
    let read = shown(Who::Reader).await;
    assert!(read.get("auth_password").is_none(), "a reader sees the CHAP password: {read}");
    assert_eq!(read["target_iqn"], full["target_iqn"]);
    assert_eq!(read["auth_username"], full["auth_username"]);
    let mut without = full.as_object().unwrap().clone();
    without.remove("auth_password");
    assert_eq!(read.as_object().unwrap(), &without, "only the secret is removed");
    // The same in the detail list.
    let reader = caller(&s, Who::Reader, Whose::Own);
    let listed = reader.get(&format!("/attachments/detail?volume_id={volume}")).await.expect(200);
    let text = listed.body.to_string();
    assert!(!text.contains(full["auth_password"].as_str().unwrap()), "{text}");
    assert!(text.contains(full["target_iqn"].as_str().unwrap()));
}

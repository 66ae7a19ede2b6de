//! `[auth] strategy = "keystone"` against a real Keystone from PyPI (SQLite, `keystone-manage
//! bootstrap`): tokens validated as keystonemiddleware does, the caller's project and roles taken
//! from them, service tokens for OSSA-2023-003, a validation cache that expires, Keystone down as
//! a 503; the real OpenStack clients (python-cinderclient, openstacksdk) authenticating with a
//! password and finding Berth in Keystone's catalog as `block-storage` / `volumev3`; and Berth
//! finding Nova in its own token's catalog to tell it of attached volumes that grew (a stand-in
//! Nova on loopback that validates Berth's token with this Keystone: there is no Nova here).

use berth_tests::keystone::{Keystone, keystone};
use berth_tests::pg::free_port;
use berth_tests::process::BerthProcess;
use berth_tests::python::{self, list, run, table};
use berth_tests::server::{Client, connector};
use serde_json::{Value as Json, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const FAKE: &str = berth_tests::process::FAKE_BACKEND;

fn berth(ks: &Keystone, keystone_extra: &str, top: &str) -> BerthProcess {
    BerthProcess::start_full(top, &format!("{}{FAKE}", ks.berth_config(keystone_extra)))
}

/// A client of `berth` with `user`'s Keystone token, in `project`.
async fn as_user(ks: &Keystone, berth: &BerthProcess, user: &str, project: &str) -> (Client, String) {
    let token = ks.token(user, project).await;
    (Client::for_base(&berth.base, ks.project(project)).with_token(&token).at("3.54"), token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keystone_token_gives_the_caller_its_project_and_roles() {
    let ks = keystone();
    let server = berth(ks, "", "");
    let (alice, alice_token) = as_user(ks, &server, "alice", "demo").await;

    // No token, or one Keystone does not know: 401 in Cinder's shape, pointing at Keystone.
    for token in [None, Some("gAAAAABnot-a-real-token")] {
        let mut c = alice.clone();
        c.token = token.map(str::to_string);
        let r = c.get("/volumes").await;
        assert_eq!(r.fault(401, "unauthorized"), "The request you have made requires authentication.");
        assert_eq!(r.header("www-authenticate"), Some(format!("Keystone uri=\"{}/v3\"", ks.url).as_str()));
    }

    // A member creates in its own project; the volume is the project's.
    let volume = alice.create_volume(json!({"size": 1, "name": "ks"})).await;
    let (root, _) = as_user(ks, &server, "root", "demo").await;
    let shown = root.get(&format!("/volumes/{volume}")).await.expect(200);
    assert_eq!(shown.body["volume"]["os-vol-tenant-attr:tenant_id"], ks.project("demo"));
    assert_eq!(shown.body["volume"]["user_id"], ks.users["alice"]);

    // The URL must name the token's project.
    let mut elsewhere = alice.clone();
    elsewhere.project = ks.project("other").to_string();
    elsewhere.get("/volumes").await.fault(400, "badRequest");

    // A reader reads but does not create (the roles come from the token).
    let (rita, _) = as_user(ks, &server, "rita", "demo").await;
    rita.get(&format!("/volumes/{volume}")).await.expect(200);
    let message = rita.post("/volumes", json!({"volume": {"size": 1}})).await.fault(403, "forbidden");
    assert_eq!(message, "Policy doesn't allow volume:create to be performed.");

    // Another project's member does not see it.
    let (mallory, _) = as_user(ks, &server, "mallory", "other").await;
    mallory.get(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");
    assert!(mallory.get("/volumes").await.expect(200).body["volumes"].as_array().unwrap().is_empty());

    let log = server.log_text();
    assert!(log.contains("authenticated with Keystone"), "{log}");
    assert!(!log.contains(&alice_token), "a caller's token was logged");
    assert!(!log.contains(ks.password("berth")), "Berth's own password was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_service_token_may_end_an_attachment_an_instance_uses() {
    let ks = keystone();
    let server = berth(ks, "", "");
    let (alice, _) = as_user(ks, &server, "alice", "demo").await;
    let volume = alice.create_volume(json!({"size": 1})).await;
    let instance = "5e2b6a6c-1c2b-4c1f-9d2e-0b3c4d5e6f70";
    let created = alice
        .post(
            "/attachments",
            json!({"attachment": {"volume_uuid": volume, "instance_uuid": instance,
                   "connector": connector("iqn.1993-08.org.debian:01:nova", "compute-1")}}),
        )
        .await
        .expect(200);
    let id = created.body["attachment"]["id"].as_str().unwrap().to_string();
    alice.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);

    // The user alone may not: Nova still uses it (OSSA-2023-003).
    alice.delete(&format!("/attachments/{id}")).await.fault(409, "conflictingRequest");
    // A service token of a user without the service role is refused outright.
    let (_, mallory_token) = as_user(ks, &server, "mallory", "other").await;
    alice
        .with_header("x-service-token", &mallory_token)
        .delete(&format!("/attachments/{id}"))
        .await
        .fault(401, "unauthorized");
    alice
        .with_header("x-service-token", "gAAAAABnot-a-real-token")
        .delete(&format!("/attachments/{id}"))
        .await
        .fault(401, "unauthorized");
    assert_eq!(alice.volume_status(&volume).await, "in-use");

    // With Nova's service token (the service role), it may.
    let nova_token = ks.token("nova", "service").await;
    alice.with_header("x-service-token", &nova_token).delete(&format!("/attachments/{id}")).await.expect(200);
    assert_eq!(alice.volume_status(&volume).await, "available");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validations_are_cached_and_a_revoked_token_ends_with_the_cache() {
    let ks = keystone();
    let metrics_port = free_port();
    let server = berth(ks, "cache_seconds = 3", &format!("[metrics]\nlisten = \"127.0.0.1:{metrics_port}\""));
    let validations = |outcome: &'static str| async move {
        let text = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let line = format!("berth_keystone_validations_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap_or(0)
    };
    let (alice, token) = as_user(ks, &server, "alice", "demo").await;
    for _ in 0..5 {
        alice.get("/volumes").await.expect(200);
    }
    assert_eq!(validations("valid").await, 1, "Keystone was asked once");
    assert_eq!(validations("cached").await, 4, "and the cache answered the rest");

    // Revoked in Keystone: still accepted from the cache, refused once the cache entry expires.
    ks.revoke(&token).await;
    alice.get("/volumes").await.expect(200);
    tokio::time::sleep(std::time::Duration::from_millis(3200)).await;
    alice.get("/volumes").await.fault(401, "unauthorized");
    assert_eq!(validations("invalid").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_unreachable_is_a_503_never_a_500() {
    let closed = free_port();
    let config = format!(
        "[auth]\nstrategy = \"keystone\"\n[keystone]\nauth_url = \"http://127.0.0.1:{closed}/v3\"\n\
         username = \"berth\"\npassword = \"pw\"\ntimeout_seconds = 2\n{FAKE}"
    );
    let server = BerthProcess::start(&config);
    let c = Client::for_base(&server.base, "p1").with_token("gAAAAABsome-token");
    let r = c.get("/volumes").await;
    let message = r.fault(503, "serviceUnavailable");
    assert!(message.contains("Keystone"), "{message}");
    assert_eq!(r.header("retry-after"), Some("1"));
    // The version document needs no token.
    assert_eq!(reqwest::get(format!("{}/", server.base)).await.unwrap().status(), 300);
}

#[test]
fn python_cinderclient_authenticates_with_a_password_and_finds_berth_in_the_catalog() {
    let ks = keystone();
    let server = berth(ks, "", "");
    let region = ks.register(&server.base);
    let cli = |args: &[&str]| {
        let bin = python::venv().join("bin/cinder");
        let mut c = std::process::Command::new(bin);
        c.envs(ks.client_env("alice", "demo", &region))
            .env("OS_VOLUME_API_VERSION", "3.54")
            .env("PYTHONWARNINGS", "ignore")
            .env_remove("CINDER_ENDPOINT")
            .env_remove("OS_AUTH_TYPE")
            .args(args);
        run(c)
    };
    let created = table(&cli(&["create", "--name", "through-keystone", "1"]));
    let volume = created["id"].clone();
    assert_eq!(created["status"], "available");
    let listed = list(&cli(&["list"]));
    assert!(listed.iter().any(|row| row.contains(&volume)), "{listed:?}");
    let attachment = table(&cli(&[
        "attachment-create",
        "--connect",
        "True",
        "--initiator",
        "iqn.1993-08.org.debian:01:ks",
        "--ip",
        "127.0.0.1",
        "--host",
        "ks-host",
        &volume,
    ]));
    assert_eq!(attachment["status"], "attaching");
    cli(&["attachment-complete", &attachment["id"]]);
    assert_eq!(table(&cli(&["show", &volume]))["status"], "in-use");
    cli(&["attachment-delete", &attachment["id"]]);
    cli(&["delete", &volume]);
    // A wrong password is Keystone's refusal; Berth is never reached.
    let mut c = std::process::Command::new(python::venv().join("bin/cinder"));
    c.envs(ks.client_env("alice", "demo", &region)).env("OS_PASSWORD", "wrong").arg("list");
    let out = c.output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn openstacksdk_authenticates_with_a_password_and_finds_berth_in_the_catalog() {
    let ks = keystone();
    let server = berth(ks, "", "");
    let region = ks.register(&server.base);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/openstacksdk_attachments.py");
    let mut c = std::process::Command::new(python::venv().join("bin/python"));
    c.arg(script)
        .arg("keystone")
        .envs(ks.client_env("alice", "demo", &region))
        .env("PYTHONWARNINGS", "ignore");
    let out = run(c);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("created ") && lines[0].contains(" attaching "), "{out}");
    assert!(lines[1].ends_with(" attaching True"), "{out}");
    assert_eq!(lines[3], "completed attached in-use", "{out}");
    assert_eq!(lines[4], "deleted available []", "{out}");
}

/// A Berth that tells the Nova of `region`'s catalog, with `env` (e.g. `BERTH_FAILPOINTS`).
fn berth_telling_nova(ks: &Keystone, region: &str, env: &[(&str, &str)]) -> BerthProcess {
    BerthProcess::start_with_env(
        &format!("[nova]\nregion_name = \"{region}\"\n"),
        &format!("{}{FAKE}", ks.berth_config("")),
        env,
    )
}

/// A new volume of `c`'s attached to `instance` (its attachment completed, as Nova leaves it).
async fn attached_to(c: &Client, instance: &str) -> String {
    let volume = c.create_volume(json!({"size": 1})).await;
    let body = json!({"attachment": {"volume_uuid": volume, "instance_uuid": instance,
                      "connector": connector("iqn.1993-08.org.debian:01:c1", "compute-1")}});
    let id =
        c.post("/attachments", body).await.expect(200).body["attachment"]["id"].as_str().unwrap().to_string();
    c.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
    volume
}

/// What the metrics listener on `port` answers.
async fn scrape(port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await.unwrap()
}

/// The events a Berth owes Nova (its SQLite database's `compute_events`).
fn owed_events(server: &BerthProcess) -> i64 {
    let db = rusqlite::Connection::open(server.dir.path().join("data/berth.db")).unwrap();
    db.query_row("SELECT COUNT(*) FROM compute_events", [], |r| r.get(0)).unwrap()
}

/// What the stand-in Nova saw of one `POST /os-server-external-events`.
#[derive(Debug, Clone)]
struct NovaCall {
    path: String,
    microversion: Option<String>,
    request_id: Option<String>,
    token: String,
    body: Json,
    status: u16,
    /// The volume as Nova reads it from Berth while it handles the event: (status, size).
    volume_seen: Option<(String, i64)>,
}

/// A stand-in for Nova's server external events API on loopback: it answers each call with the
/// next of `answers` (200 when none is left: every event taken, as Nova answers), and, as Nova
/// does when it handles `volume-extended`, reads the volume from Berth as `reader`.
struct FakeNova {
    url: String,
    port: u16,
    calls: Arc<Mutex<Vec<NovaCall>>>,
    answers: Arc<Mutex<Vec<u16>>>,
}

impl FakeNova {
    async fn start(reader: Client) -> FakeNova {
        let calls: Arc<Mutex<Vec<NovaCall>>> = Arc::default();
        let answers: Arc<Mutex<Vec<u16>>> = Arc::default();
        let (c, a) = (calls.clone(), answers.clone());
        let handler = move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::Json<Json>| {
            let (calls, answers, reader) = (c.clone(), a.clone(), reader.clone());
            async move {
                let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
                let status = { answers.lock().unwrap().pop() }.unwrap_or(200);
                let volume = body.0["events"][0]["tag"].as_str().unwrap_or_default().to_string();
                let volume_seen = if status == 200 {
                    let v =
                        reader.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
                    Some((v["status"].as_str().unwrap().to_string(), v["size"].as_i64().unwrap()))
                } else {
                    None
                };
                calls.lock().unwrap().push(NovaCall {
                    path: uri.path().to_string(),
                    microversion: header("x-openstack-nova-api-version"),
                    request_id: header("x-openstack-request-id"),
                    token: header("x-auth-token").unwrap_or_default(),
                    body: body.0.clone(),
                    status,
                    volume_seen,
                });
                let answer = match status {
                    200 => {
                        let mut events = body.0["events"].clone();
                        for e in events.as_array_mut().unwrap() {
                            e["status"] = json!("completed");
                            e["code"] = json!(200);
                        }
                        json!({ "events": events })
                    }
                    404 => {
                        json!({"itemNotFound": {"code": 404, "message": "No instances found for any event"}})
                    }
                    s => json!({"error": {"code": s, "message": "refused"}}),
                };
                (axum::http::StatusCode::from_u16(status).unwrap(), axum::Json(answer))
            }
        };
        let app = axum::Router::new().route("/v2.1/os-server-external-events", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/v2.1");
        tokio::spawn(async move { axum::serve(listener, app).await });
        FakeNova { url, port, calls, answers }
    }

    /// Waits until Nova has had `n` calls, and returns them.
    async fn calls(&self, n: usize) -> Vec<NovaCall> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let calls = self.calls.lock().unwrap().clone();
            if calls.len() >= n || Instant::now() > deadline {
                assert_eq!(calls.len(), n, "Nova's calls: {calls:#?}");
                return calls;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nova_hears_of_an_attached_volume_that_grew_and_a_refused_event_is_a_message() {
    let ks = keystone();
    let region = format!("nova-{}", uuid::Uuid::new_v4().simple());
    let metrics_port = free_port();
    let server = berth(
        ks,
        "",
        &format!("[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n[nova]\nregion_name = \"{region}\"\n"),
    );
    let (alice, _) = as_user(ks, &server, "alice", "demo").await;
    let nova = FakeNova::start(alice.clone()).await;
    ks.register_compute(&region, &nova.url);

    // Not told: an available volume, and one attached to a host without an instance (bare metal).
    let spare = alice.create_volume(json!({"size": 1})).await;
    let bare = alice.create_volume(json!({"size": 1})).await;
    let attach = async |volume: &str, instance: Option<&str>| {
        let mut body = json!({"volume_uuid": volume, "connector": connector("iqn.1993-08.org.debian:01:c1", "compute-1")});
        if let Some(i) = instance {
            body["instance_uuid"] = json!(i);
        }
        let id = alice.post("/attachments", json!({ "attachment": body })).await.expect(200).body["attachment"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        alice.post(&format!("/attachments/{id}/action"), json!({"os-complete": null})).await.expect(204);
    };
    attach(&bare, None).await;
    let extend = async |volume: &str, size: i64| {
        let global = format!("req-{}", uuid::Uuid::new_v4());
        let r = alice
            .with_header("x-openstack-request-id", &global)
            .post(&format!("/volumes/{volume}/action"), json!({"os-extend": {"new_size": size}}))
            .await
            .expect(202);
        (global, r.header("x-openstack-request-id").unwrap().to_string())
    };
    extend(&spare, 2).await;
    extend(&bare, 2).await;

    // An instance's volume grows: Nova is told once, by Berth's own user, with the request's
    // global id, and reads the volume in use at its new size.
    let volume = alice.create_volume(json!({"size": 1})).await;
    let instance = "0b6f1e0c-55a5-4b8e-9a63-6f4f1f0e2a11";
    attach(&volume, Some(instance)).await;
    let (global, _) = extend(&volume, 2).await;
    let call = nova.calls(1).await.remove(0);
    assert_eq!(call.path, "/v2.1/os-server-external-events");
    assert_eq!(call.microversion.as_deref(), Some("2.51"));
    assert_eq!(call.request_id.as_deref(), Some(global.as_str()));
    assert_eq!(
        call.body,
        json!({"events": [{"name": "volume-extended", "server_uuid": instance, "tag": volume}]})
    );
    assert_eq!(call.volume_seen, Some(("in-use".to_string(), 2)));
    let who = ks.validate(&call.token).await.expect("Berth's token is valid in Keystone");
    assert_eq!(who["user"]["id"], ks.users["berth"]);
    assert!(who["roles"].as_array().unwrap().iter().any(|r| r["name"] == "service"), "{who}");

    // Nova refuses Berth's token once (revoked, expired early): Berth authenticates again and
    // the event gets through; nothing for the user to read.
    nova.answers.lock().unwrap().push(401);
    extend(&volume, 3).await;
    let calls = nova.calls(3).await;
    assert_eq!((calls[1].status, calls[2].status), (401, 200));
    assert_ne!(calls[1].token, calls[2].token, "a new token after the refusal");
    assert_eq!(calls[2].volume_seen, Some(("in-use".to_string(), 3)));

    // Nova is down for a moment (503): the event is owed still, and sent again a few seconds
    // later; nothing for the user to read.
    nova.answers.lock().unwrap().push(503);
    extend(&volume, 4).await;
    let calls = nova.calls(5).await;
    assert_eq!((calls[3].status, calls[4].status), (503, 200));
    assert_eq!(calls[3].body, calls[4].body);
    assert_eq!(calls[4].volume_seen, Some(("in-use".to_string(), 4)));
    // The sender counted it owed when it looked before sending it again (every 5 s).
    let owed = scrape(metrics_port).await;
    assert!(owed.lines().any(|l| l == "berth_compute_events_owed 1"), "{owed}");

    // Nova does not take the event (its instance is gone): the extend stands, and the volume's
    // users read why their guest did not grow, as Cinder words it.
    nova.answers.lock().unwrap().push(404);
    let (_, request) = extend(&volume, 5).await;
    nova.calls(6).await;
    let messages = async || {
        let r = alice.at("3.3").get(&format!("/messages?resource_uuid={volume}")).await.expect(200);
        r.body["messages"].as_array().unwrap().clone()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while messages().await.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let messages = messages().await;
    assert_eq!(messages.len(), 1, "{messages:#?}");
    assert_eq!(messages[0]["user_message"], "extend volume:Compute service failed to extend volume.");
    assert_eq!(messages[0]["event_id"], "VOLUME_VOLUME_007_009");
    assert_eq!(messages[0]["request_id"], request);
    let shown = alice.get(&format!("/volumes/{volume}")).await.expect(200).body["volume"].clone();
    assert_eq!((shown["status"].as_str(), shown["size"].as_i64()), (Some("in-use"), Some(5)));

    // Nothing more was sent (the available and bare-metal volumes' extends told nobody; the
    // refused event is not sent again), and nothing is owed.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert_eq!(nova.calls.lock().unwrap().len(), 6);
    assert_eq!(owed_events(&server), 0);
    let metrics = scrape(metrics_port).await;
    assert!(metrics.lines().any(|l| l == "berth_compute_events_owed 0"), "{metrics}");
    for line in ["sent\"} 3", "retried\"} 1", "failed\"} 1"]
        .map(|o| format!("berth_compute_events_total{{outcome=\"{o}"))
    {
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
    let log = server.log_text();
    for call in nova.calls.lock().unwrap().iter() {
        assert!(!log.contains(&call.token), "a token Berth sent Nova was logged");
    }
    assert!(!log.contains(ks.password("berth")), "Berth's own password was logged");
}

/// An attached extend killed after its intent: recovery finishes it when the service starts
/// again, and Nova hears of it then (without a request id: the service's own work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nova_hears_of_an_attached_extend_that_recovery_finished() {
    let ks = keystone();
    let region = format!("nova-{}", uuid::Uuid::new_v4().simple());
    let mut server = berth_telling_nova(ks, &region, &[("BERTH_FAILPOINTS", "volume.extend.intent=kill")]);
    let (alice, _) = as_user(ks, &server, "alice", "demo").await;
    let nova = FakeNova::start(alice.clone()).await;
    ks.register_compute(&region, &nova.url);
    let instance = "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f";
    let volume = attached_to(&alice, instance).await;

    let path = format!("/volumes/{volume}/action");
    let answer = alice
        .try_send(
            http::Method::POST,
            &path,
            Some(json!({"os-extend": {"new_size": 2}})),
            Some(Duration::from_secs(10)),
        )
        .await;
    assert!(answer.is_err(), "the process died after the extend's intent: {answer:?}");
    assert!(server.wait_exit(Duration::from_secs(10)).is_some());
    assert!(nova.calls.lock().unwrap().is_empty(), "nothing was sent before the extend finished");
    server.start_again();

    let call = nova.calls(1).await.remove(0);
    assert_eq!(
        call.body,
        json!({"events": [{"name": "volume-extended", "server_uuid": instance, "tag": volume}]})
    );
    assert_eq!(call.volume_seen, Some(("in-use".to_string(), 2)));
    assert_eq!(call.request_id, None);
}

/// Keystone and Nova behind HTTPS with a private CA: trusted through `[http] ca_file`, and, without
/// it, not reached at all (a caller's token cannot be validated: 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keystone_and_nova_over_https_are_trusted_through_the_ca_file() {
    let ks = keystone();
    let ca = berth_tests::https::TestCa::new();
    let certs = tempfile::tempdir().unwrap();
    let ca_file = ca.write(certs.path());
    let keystone_port: u16 = ks.url.rsplit(':').next().unwrap().parse().unwrap();
    let keystone_https = format!("https://localhost:{}/v3", ca.front(keystone_port).await);
    let region = format!("nova-{}", uuid::Uuid::new_v4().simple());
    let start = |trusted: bool| {
        let ca =
            if trusted { format!("[http]\nca_file = \"{}\"\n", ca_file.display()) } else { String::new() };
        let top = format!("[nova]\nregion_name = \"{region}\"\n{ca}");
        let body = format!(
            "[auth]\nstrategy = \"keystone\"\n[keystone]\nauth_url = \"{keystone_https}\"\nusername = \"berth\"\n\
             password = \"{}\"\ntimeout_seconds = 5\n{FAKE}",
            ks.password("berth")
        );
        BerthProcess::start_full(&top, &body)
    };
    let untrusting = start(false);
    let (c, _) = as_user(ks, &untrusting, "alice", "demo").await;
    let message = c.get("/volumes").await.fault(503, "serviceUnavailable");
    assert!(message.contains("Keystone"), "{message}");
    assert!(untrusting.log_text().contains("cannot validate a token"), "{}", untrusting.log_text());

    let server = start(true);
    let (alice, _) = as_user(ks, &server, "alice", "demo").await;
    let nova = FakeNova::start(alice.clone()).await;
    ks.register_compute(&region, &format!("https://localhost:{}/v2.1", ca.front(nova.port).await));
    let instance = "3d2c1b0a-9f8e-4d7c-b6a5-940312f7e6d5";
    let volume = attached_to(&alice, instance).await;
    alice.post(&format!("/volumes/{volume}/action"), json!({"os-extend": {"new_size": 2}})).await.expect(202);
    let call = nova.calls(1).await.remove(0);
    assert_eq!(
        call.body,
        json!({"events": [{"name": "volume-extended", "server_uuid": instance, "tag": volume}]})
    );
    assert_eq!(call.volume_seen, Some(("in-use".to_string(), 2)));
}

/// An attached extend killed after its commit, as its event to Nova is about to be sent: the
/// event was owed in that commit, and the service sends it when it starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_owed_to_nova_outlives_a_kill() {
    let ks = keystone();
    let region = format!("nova-{}", uuid::Uuid::new_v4().simple());
    let mut server = berth_telling_nova(ks, &region, &[("BERTH_FAILPOINTS", "compute.send=kill")]);
    let (alice, _) = as_user(ks, &server, "alice", "demo").await;
    let nova = FakeNova::start(alice.clone()).await;
    ks.register_compute(&region, &nova.url);
    let instance = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d";
    let volume = attached_to(&alice, instance).await;
    let _ = alice
        .try_send(
            http::Method::POST,
            &format!("/volumes/{volume}/action"),
            Some(json!({"os-extend": {"new_size": 2}})),
            Some(Duration::from_secs(10)),
        )
        .await;
    assert!(server.wait_exit(Duration::from_secs(10)).is_some(), "killed as the event was about to be sent");
    assert_eq!(owed_events(&server), 1, "the event was owed in the extend's commit");
    assert!(nova.calls.lock().unwrap().is_empty());
    server.env.clear();
    server.start_again();

    let call = nova.calls(1).await.remove(0);
    assert_eq!(
        call.body,
        json!({"events": [{"name": "volume-extended", "server_uuid": instance, "tag": volume}]})
    );
    assert_eq!(call.volume_seen, Some(("in-use".to_string(), 2)));
    let deadline = Instant::now() + Duration::from_secs(5);
    while owed_events(&server) > 0 {
        assert!(Instant::now() < deadline, "the event sent is still owed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn nova_events_without_keystone_are_refused_at_start() {
    let log = BerthProcess::try_start("[nova]\nenabled = true\n", FAKE, &[]).err().expect("refused");
    assert!(log.contains("[nova] enabled = true needs [auth] strategy = \"keystone\""), "{log}");
    let log = BerthProcess::try_start("[nova]\nusername = \"nova\"\npassword = \"p\"\n", FAKE, &[])
        .err()
        .expect("refused");
    assert!(log.contains("[nova] username needs [auth] strategy = \"keystone\""), "{log}");
}

/// `[nova]` credentials of its own (Cinder's): Berth tells Nova as that user, scoped to its
/// project, not as its own `[keystone]` user; half of them is refused at start, naming the other
/// half; and the password is never logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nova_is_told_as_the_user_of_novas_own_credentials() {
    let ks = keystone();
    for (half, names) in [
        ("username = \"nova\"\n", "[nova] username needs [nova] password"),
        ("password = \"p\"\n", "[nova] password needs [nova] username"),
    ] {
        let log = BerthProcess::try_start(
            &format!("[nova]\n{half}"),
            &format!("{}{FAKE}", ks.berth_config("")),
            &[],
        )
        .err()
        .expect("refused");
        assert!(log.contains(names), "{log}");
    }
    let region = format!("nova-{}", uuid::Uuid::new_v4().simple());
    let server = berth(
        ks,
        "",
        &format!(
            "[nova]\nregion_name = \"{region}\"\nusername = \"nova\"\npassword = \"{}\"\nproject_name = \"service\"\n",
            ks.password("nova")
        ),
    );
    let (alice, _) = as_user(ks, &server, "alice", "demo").await;
    let nova = FakeNova::start(alice.clone()).await;
    ks.register_compute(&region, &nova.url);
    let instance = "7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f";
    let volume = attached_to(&alice, instance).await;
    alice.post(&format!("/volumes/{volume}/action"), json!({"os-extend": {"new_size": 2}})).await.expect(202);
    let call = nova.calls(1).await.remove(0);
    assert_eq!(call.body["events"][0]["tag"], json!(volume));
    let who = ks.validate(&call.token).await.expect("the token is valid in Keystone");
    assert_eq!(who["user"]["id"], ks.users["nova"], "told as [nova]'s user: {who}");
    assert_eq!(who["project"]["name"], "service", "{who}");
    assert!(!server.log_text().contains(ks.password("nova")), "[nova]'s password was logged");
}

//! `[auth] strategy = "keystone"` against a real Keystone from PyPI (SQLite, `keystone-manage
//! bootstrap`): tokens validated as keystonemiddleware does, the caller's project and roles taken
//! from them, service tokens for OSSA-2023-003, a validation cache that expires, Keystone down as
//! a 503; and the real OpenStack clients (python-cinderclient, openstacksdk) authenticating with a
//! password and finding Berth in Keystone's catalog as `block-storage` / `volumev3`.

use berth_tests::keystone::{Keystone, keystone};
use berth_tests::pg::free_port;
use berth_tests::process::BerthProcess;
use berth_tests::python::{self, list, run, table};
use berth_tests::server::{Client, connector};
use serde_json::json;

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

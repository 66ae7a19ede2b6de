//! Identity and isolation: noauth as cinderclient speaks it, static tokens, per-project scoping,
//! admin-only actions.

use berth_tests::both_databases;
use berth_tests::server::{Db, TestServer, connector, fake_config};
use serde_json::json;

#[tokio::test]
async fn requests_without_a_token_are_401() {
    let s = TestServer::start(Db::Sqlite).await;
    let mut c = s.client("p1");
    c.token = None;
    c.get("/volumes").await.fault(401, "unauthorized");
    // Version discovery needs no token.
    c.send(reqwest::Method::GET, &format!("{}/", s.base), None).await.expect(300);
}

#[tokio::test]
async fn a_url_naming_another_project_is_a_400() {
    let s = TestServer::start(Db::Sqlite).await;
    let c = s.client("p1");
    let url = format!("{}/v3/p2/volumes", s.base);
    let message = c.send(reqwest::Method::GET, &url, None).await.fault(400, "badRequest");
    assert_eq!(message, "Malformed request url");
    // A Cinder resource Berth does not serve, named without a project (as clients from 3.67
    // do), is not mistaken for a project: a 404, as with the project.
    for path in ["/v3/groups/detail", "/v3/group_snapshots/detail", "/v3/p1/groups/detail"] {
        c.send(reqwest::Method::GET, &format!("{}{path}", s.base), None).await.fault(404, "itemNotFound");
    }
    // And ones it serves, with a segment that is not a project either.
    c.send(reqwest::Method::GET, &format!("{}/v3/scheduler-stats/get_pools", s.base), None).await.expect(200);
    c.send(reqwest::Method::GET, &format!("{}/v3/snapshots/detail", s.base), None).await.expect(200);
}

#[tokio::test]
async fn noauth_refuses_to_listen_beyond_loopback() {
    let mut config = fake_config();
    config.listen = "0.0.0.0:0".parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    config.data_dir = Some(dir.path().into());
    let error = berth::serve::assemble(config).await.err().expect("must refuse");
    assert!(error.to_string().contains("loopback"), "{error}");
}

#[tokio::test]
async fn static_tokens_map_to_projects_and_roles_and_are_stored_hashed() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, a) = berth::api::auth::new_token("alice", "pa", &["member".into()]).unwrap();
    let (root, r) = berth::api::auth::new_token("root", "pr", &["admin".into()]).unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, format!("{a}\n{r}")).unwrap();
    let mut config = fake_config();
    config.auth.strategy = berth::config::AuthStrategy::Token;
    config.auth.tokens_file = Some(tokens);
    let s = TestServer::start_with(Db::Sqlite, config).await;
    let as_token = |token: &str, project: &str| s.client(project).with_token(token);
    let alice_c = as_token(&alice, "pa");
    let volume = alice_c.create_volume(json!({"size": 1})).await;
    alice_c.get(&format!("/volumes/{volume}")).await.expect(200);
    as_token("alice:pa", "pa").get("/volumes").await.fault(401, "unauthorized");
    as_token(&alice, "pr").get("/volumes").await.fault(400, "badRequest");
    // Admins reach every project's resources by id, as in Cinder; lists stay per project.
    as_token(&root, "pr").get(&format!("/volumes/{volume}")).await.expect(200);
    assert_eq!(as_token(&root, "pr").get("/volumes").await.expect(200).body["volumes"], json!([]));
    let all = as_token(&root, "pr").get("/volumes?all_tenants=1").await.expect(200);
    assert_eq!(all.body["volumes"].as_array().unwrap().len(), 1);
    let mine = alice_c.get("/volumes?all_tenants=1").await.expect(200);
    assert_eq!(mine.body["volumes"].as_array().unwrap().len(), 1, "non-admins see only their project");
}

both_databases! {
    async fn another_projects_volumes_and_attachments_are_404(s) {
        let owner = s.client("p1");
        let other = s.client("p2").with_roles("member");
        let volume = owner.create_volume(json!({"size": 1})).await;
        let a = owner.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:aa", "h1"))).await.expect(200);
        let att = a.body["attachment"]["id"].as_str().unwrap().to_string();
        other.get(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");
        other.delete(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");
        other.attach(&volume, None).await.fault(404, "itemNotFound");
        let other = other.at("3.54");
        other.get(&format!("/attachments/{att}")).await.fault(404, "itemNotFound");
        other.put(&format!("/attachments/{att}"), json!({"attachment": {"connector": {"initiator": "iqn.2000-01.x:y"}}})).await.fault(404, "itemNotFound");
        other.post(&format!("/attachments/{att}/action"), json!({"os-complete": null})).await.fault(404, "itemNotFound");
        other.delete(&format!("/attachments/{att}")).await.fault(404, "itemNotFound");
        assert_eq!(other.get("/attachments").await.expect(200).body["attachments"], json!([]));
        assert_eq!(other.get("/volumes").await.expect(200).body["volumes"], json!([]));
        // Nothing changed for the owner.
        let shown = owner.at("3.54").get(&format!("/attachments/{att}")).await.expect(200);
        assert_eq!(shown.body["attachment"]["status"], "attaching");
    }

    async fn admins_list_every_project_only_when_they_ask(s) {
        s.client("p1").create_volume(json!({"size": 1})).await;
        s.client("p2").create_volume(json!({"size": 1})).await;
        let admin = s.client("p3");
        assert_eq!(admin.get("/volumes").await.expect(200).body["volumes"], json!([]));
        assert_eq!(admin.get("/volumes?all_tenants=1").await.expect(200).body["volumes"].as_array().unwrap().len(), 2);
        let member = s.client("p1").with_roles("member");
        assert_eq!(member.get("/volumes?all_tenants=1").await.expect(200).body["volumes"].as_array().unwrap().len(), 1);
    }

    async fn force_delete_is_admin_only(s) {
        let member = s.client("p1").with_roles("member");
        let volume = member.create_volume(json!({"size": 1})).await;
        let message = member.delete(&format!("/volumes/{volume}?force=true")).await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume:force_delete to be performed.");
        assert_eq!(member.volume_status(&volume).await, "available");
        s.client("p1").delete(&format!("/volumes/{volume}?force=true")).await.expect(202);
        member.get(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");

        // The same as an action (`cinder force-delete`), under the same rule.
        let volume = member.create_volume(json!({"size": 1})).await;
        let action = format!("/volumes/{volume}/action");
        let message = member.post(&action, json!({"os-force_delete": {}})).await.fault(403, "forbidden");
        assert_eq!(message, "Policy doesn't allow volume:force_delete to be performed.");
        s.client("p1").post(&action, json!({"os-force_delete": null})).await.expect(202);
        member.get(&format!("/volumes/{volume}")).await.fault(404, "itemNotFound");
    }
}

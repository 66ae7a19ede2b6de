//! QoS specs (`[[qos_specs]]`, `cinder qos-list`): what a volume type's specs give its volumes'
//! connections, as Cinder's volume manager does: front-end specs travel in `qos_specs` with every
//! connection, their limits per GiB scaled by the volume's size; back-end specs never do. Admins
//! read the specs and the types associated with them; an attached volume cannot be retyped to
//! other front-end specs than those its connections carry.

use berth::config::{QosSpecsConfig, VolumeTypeConfig};
use berth::domain::qos::QosConsumer;
use berth_tests::server::{Client, Db, TestServer, connector, fake_config};
use reqwest::Method;
use serde_json::{Value, json};

/// `gold`: front-end specs, 30 IOPS per GiB (at least 100) and a fixed read rate; `silver`:
/// back-end specs; `cached`: no specs, `cacheable`; `plain`: none of it. All on the fake backend.
fn config() -> berth::config::Config {
    let mut config = fake_config();
    let specs = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    config.qos_specs = vec![
        QosSpecsConfig {
            name: "gold".into(),
            consumer: QosConsumer::FrontEnd,
            specs: specs(&[
                ("total_iops_sec_per_gb", "30"),
                ("total_iops_sec_per_gb_min", "100"),
                ("read_bytes_sec", "1048576"),
            ]),
        },
        QosSpecsConfig {
            name: "silver".into(),
            consumer: QosConsumer::BackEnd,
            specs: specs(&[("minIOPS", "50")]),
        },
    ];
    let vtype = |name: &str, qos: Option<&str>, extra: &[(&str, &str)]| VolumeTypeConfig {
        name: name.into(),
        backend: "fake".into(),
        description: None,
        extra_specs: specs(extra),
        qos_specs: qos.map(str::to_string),
    };
    config.volume_types.extend([
        vtype("gold", Some("gold"), &[]),
        vtype("silver", Some("silver"), &[]),
        vtype("cached", None, &[("cacheable", "<is> True")]),
        vtype("plain", None, &[]),
    ]);
    config
}

/// The `connection_info` of a new attachment of `volume` with a connector.
async fn connect(c: &Client, volume: &str, host: &str) -> Value {
    let made = c.attach(volume, Some(connector(&format!("iqn.1993-08.org.debian:01:{host}"), host))).await;
    made.expect(200).body["attachment"]["connection_info"].clone()
}

async fn qos_id(c: &Client, name: &str) -> String {
    let listed = c.get("/qos-specs").await.expect(200).body["qos_specs"].as_array().unwrap().clone();
    let found = listed.iter().find(|q| q["name"] == name).unwrap_or_else(|| panic!("{name} in {listed:?}"));
    found["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn front_end_specs_travel_with_every_connection_scaled_by_the_volumes_size() {
    let s = TestServer::start_with(Db::Sqlite, config()).await;
    let c = s.client("p1").with_roles("member").at("3.54");

    // 10 GiB of gold: 300 IOPS, the fixed rate as configured (Cinder's string), no per-GiB keys.
    let big = c.create_volume(json!({"size": 10, "volume_type": "gold"})).await;
    let info = connect(&c, &big, "h1").await;
    assert_eq!(info["qos_specs"], json!({"total_iops_sec": 300, "read_bytes_sec": "1048576"}));
    assert_eq!(info["cacheable"], false);
    // 2 GiB: 60 IOPS by size, raised to the minimum.
    let small = c.create_volume(json!({"size": 2, "volume_type": "gold"})).await;
    assert_eq!(connect(&c, &small, "h1").await["qos_specs"]["total_iops_sec"], 100);
    // The legacy flow's connection carries the same.
    let legacy = c.create_volume(json!({"size": 10, "volume_type": "gold"})).await;
    let action = |name: &str, body: Value| (format!("/volumes/{legacy}/action"), json!({ name: body }));
    let (path, body) = action("os-reserve", Value::Null);
    c.post(&path, body).await.expect(202);
    let (path, body) = action(
        "os-initialize_connection",
        json!({"connector": connector("iqn.1993-08.org.debian:01:h2", "h2")}),
    );
    let info = c.post(&path, body).await.expect(200).body["connection_info"].clone();
    assert_eq!(info["data"]["qos_specs"], json!({"total_iops_sec": 300, "read_bytes_sec": "1048576"}));

    // Back-end specs are the storage's business: the connection carries none, as without specs.
    for t in ["silver", "plain"] {
        let v = c.create_volume(json!({"size": 10, "volume_type": t})).await;
        let info = connect(&c, &v, "h1").await;
        assert_eq!(info["qos_specs"], Value::Null, "{t}");
        assert_eq!(info["cacheable"], false, "{t}");
    }
    // The type's `cacheable` extra spec lets the host cache.
    let cached = c.create_volume(json!({"size": 1, "volume_type": "cached"})).await;
    assert_eq!(connect(&c, &cached, "h1").await["cacheable"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_read_the_specs_and_the_types_associated_with_them() {
    let s = TestServer::start_with(Db::Sqlite, config()).await;
    let admin = s.client("p1");
    let member = s.client("p1").with_roles("member");

    let listed = admin.get("/qos-specs").await.expect(200).body["qos_specs"].clone();
    let gold = qos_id(&admin, "gold").await;
    let silver = qos_id(&admin, "silver").await;
    assert_eq!(
        listed,
        json!([
            {"id": gold, "name": "gold", "consumer": "front-end",
             "specs": {"total_iops_sec_per_gb": "30", "total_iops_sec_per_gb_min": "100", "read_bytes_sec": "1048576"}},
            {"id": silver, "name": "silver", "consumer": "back-end", "specs": {"minIOPS": "50"}},
        ])
    );
    let shown = admin.get(&format!("/qos-specs/{gold}")).await.expect(200).body;
    assert_eq!(shown["qos_specs"], listed[0]);
    assert_eq!(shown["links"][0]["href"], json!(format!("{}/v3/p1/qos-specs/{gold}", s.base)));
    let gold_type = admin.get("/types/gold").await.expect(200).body["volume_type"]["id"].clone();
    let associated = admin.get(&format!("/qos-specs/{gold}/associations")).await.expect(200).body;
    assert_eq!(
        associated,
        json!({"qos_associations": [{"association_type": "volume_type", "name": "gold", "id": gold_type}]})
    );

    // A type's `qos_specs_id` is an admin's to see (`null` for a type without specs).
    assert_eq!(admin.get("/types/gold").await.body["volume_type"]["qos_specs_id"], json!(gold));
    assert_eq!(admin.get("/types/plain").await.body["volume_type"]["qos_specs_id"], Value::Null);
    let types = member.get("/types").await.expect(200).body["volume_types"].as_array().unwrap().clone();
    assert!(types.iter().all(|t| t.get("qos_specs_id").is_none()), "{types:?}");

    // Specs are admins' only, and an unknown id is Cinder's 404.
    member.get("/qos-specs").await.fault(403, "forbidden");
    member.get(&format!("/qos-specs/{gold}")).await.fault(403, "forbidden");
    member.get(&format!("/qos-specs/{gold}/associations")).await.fault(403, "forbidden");
    let unknown = uuid::Uuid::new_v4();
    let message = admin.get(&format!("/qos-specs/{unknown}")).await.fault(404, "itemNotFound");
    assert_eq!(message, format!("QoS Specs {unknown} could not be found."));
    admin.get(&format!("/qos-specs/{unknown}/associations")).await.fault(404, "itemNotFound");

    // Types and specs are configuration: a call that would change them (`openstack volume type
    // create`, `cinder type-key`, `qos-create`) is told where they are changed.
    let before = admin.get("/types").await.expect(200).body;
    for (method, path, body) in [
        (Method::POST, "/types".to_string(), Some(json!({"volume_type": {"name": "new"}}))),
        (Method::PUT, "/types/gold".to_string(), Some(json!({"volume_type": {"description": "d"}}))),
        (Method::DELETE, "/types/gold".to_string(), None),
        (Method::POST, "/types/gold/extra_specs".to_string(), Some(json!({"extra_specs": {"k": "v"}}))),
        (Method::DELETE, "/types/gold/extra_specs/multiattach".to_string(), None),
        (Method::POST, "/qos-specs".to_string(), Some(json!({"qos_specs": {"name": "q"}}))),
        (Method::DELETE, format!("/qos-specs/{gold}"), None),
    ] {
        let message = admin.send(method.clone(), &admin.url(&path), body).await.fault(405, "badMethod");
        assert!(message.contains("`[[volume_types]]` and `[[qos_specs]]`"), "{method} {path}: {message}");
    }
    // Cinder's calls that do it by a path of their own (`type-access-add`, `qos-associate`,
    // `qos-unset-key`) say the same; a type's access list is Cinder's 404 for a public type.
    let gold_type_id = gold_type.as_str().unwrap();
    for (method, path, body) in [
        (
            Method::POST,
            format!("/types/{gold_type_id}/action"),
            Some(json!({"addProjectAccess": {"project": "p2"}})),
        ),
        (Method::GET, format!("/qos-specs/{gold}/associate?vol_type_id={gold_type_id}"), None),
        (Method::GET, format!("/qos-specs/{gold}/disassociate_all"), None),
        (Method::PUT, format!("/qos-specs/{gold}/delete_keys"), Some(json!({"keys": ["read_bytes_sec"]}))),
    ] {
        let message = admin.send(method.clone(), &admin.url(&path), body).await.fault(405, "badMethod");
        assert!(message.contains("`[[volume_types]]` and `[[qos_specs]]`"), "{method} {path}: {message}");
    }
    let access =
        admin.get(&format!("/types/{gold_type_id}/os-volume-type-access")).await.fault(404, "itemNotFound");
    assert_eq!(access, "Access list not available for public volume types.");
    admin.get("/no-such-thing").await.fault(404, "itemNotFound");
    let other = admin.send(Method::PATCH, &admin.url("/volumes"), None).await.fault(405, "badMethod");
    assert_eq!(other, "The method is not allowed for this resource.");
    assert_eq!(admin.get("/types").await.expect(200).body, before, "unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_volume_keeps_the_front_end_specs_its_connections_carry() {
    for db in [Db::Sqlite, Db::Postgres] {
        let s = TestServer::start_with(db, config()).await;
        let c = s.client("p1").with_roles("member").at("3.54");
        let retype = |volume: &str, to: &str| {
            let c = c.clone();
            let (path, body) = (format!("/volumes/{volume}/action"), json!({"os-retype": {"new_type": to}}));
            async move { c.post(&path, body).await }
        };
        let volume = c.create_volume(json!({"size": 1, "volume_type": "gold"})).await;
        let attachment = c.attach(&volume, Some(connector("iqn.1993-08.org.debian:01:h1", "h1"))).await;
        let attachment = attachment.expect(200).body["attachment"]["id"].as_str().unwrap().to_string();
        c.post(&format!("/attachments/{attachment}/action"), json!({"os-complete": null})).await.expect(204);

        // In use: the host enforces gold's limits, and nothing would tell it of others.
        let refused = retype(&volume, "plain").await.fault(400, "badRequest");
        assert!(refused.contains("front-end QoS specs") && refused.contains("in-use"), "{refused}");
        assert_eq!(
            c.get(&format!("/volumes/{volume}")).await.body["volume"]["volume_type"],
            "gold",
            "{db:?}"
        );
        // Between types whose specs the host does not enforce, an attached volume may move.
        let other = c.create_volume(json!({"size": 1, "volume_type": "silver"})).await;
        let made = c.attach(&other, Some(connector("iqn.1993-08.org.debian:01:h1", "h1"))).await.expect(200);
        let made = made.body["attachment"]["id"].as_str().unwrap().to_string();
        c.post(&format!("/attachments/{made}/action"), json!({"os-complete": null})).await.expect(204);
        retype(&other, "plain").await.expect(202);
        retype(&other, "silver").await.expect(202);

        // Detached, it may take other specs; its next connection carries them.
        c.delete(&format!("/attachments/{attachment}")).await.expect(200);
        retype(&volume, "plain").await.expect(202);
        assert_eq!(connect(&c, &volume, "h1").await["qos_specs"], Value::Null, "{db:?}");
    }
}

//! initialize-connection: idempotent, in os-brick's connection-info shape for each protocol, an
//! ACL naming exactly the connected initiators, access modes, a second initiator.

use super::*;

// C09
pub(super) async fn initialize_idempotent(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let first = env.connect(&mut v, &a()).await?;
    let (record, snapshot) = (v.clone(), env.snapshot().await?);
    for i in 2..=REPEAT {
        let again = env.connect(&mut v, &a()).await?;
        ensure!(
            again == first,
            "call {i} answered differently: {} then {}",
            redacted(&first.data),
            redacted(&again.data)
        );
        ensure!(v == record, "call {i} changed the volume record");
        env.unchanged_since(&snapshot, &format!("call {i} changed the target service")).await?;
    }
    Ok(())
}

fn check_portal(p: &str) -> Result<(), String> {
    let (host, port) = p.rsplit_once(':').ok_or_else(|| format!("portal {p:?} is not host:port"))?;
    ensure!(port.parse::<u16>().is_ok_and(|p| p > 0), "portal {p:?} has no valid port");
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    ensure!(
        host.parse::<std::net::IpAddr>().is_ok() || !host.is_empty() && !host.contains(' '),
        "portal {p:?}"
    );
    Ok(())
}

/// os-brick's ISCSIConnector's view of `connection_info.data`.
fn check_iscsi_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let text = |k: &str| d.get(k).and_then(Json::as_str);
    let iqn = text("target_iqn").ok_or("target_iqn is missing or not a string")?;
    check_iscsi_name(iqn).map_err(|e| format!("target_iqn: {e}"))?;
    check_portal(text("target_portal").ok_or("target_portal is missing or not a string")?)?;
    let lun = d.get("target_lun").and_then(Json::as_i64).ok_or("target_lun is missing or not an integer")?;
    ensure!((0..16384).contains(&lun), "target_lun {lun} is out of range");
    match text("auth_method") {
        None => {}
        Some(m) if m.eq_ignore_ascii_case("chap") => {
            ensure!(text("auth_username").is_some_and(|u| !u.is_empty()), "CHAP without auth_username");
            ensure!(text("auth_password").is_some_and(|p| !p.is_empty()), "CHAP without auth_password");
        }
        Some(m) => ensure!(m.eq_ignore_ascii_case("none"), "auth_method {m:?} is neither CHAP nor None"),
    }
    if d.contains_key("target_portals") || d.contains_key("target_iqns") || d.contains_key("target_luns") {
        let list = |k: &str| d.get(k).and_then(Json::as_array).ok_or(format!("{k} is missing or not a list"));
        let (portals, iqns, luns) = (list("target_portals")?, list("target_iqns")?, list("target_luns")?);
        ensure!(
            portals.len() == iqns.len() && iqns.len() == luns.len() && !portals.is_empty(),
            "target_portals, target_iqns and target_luns differ in length"
        );
        for p in portals {
            check_portal(p.as_str().ok_or("a portal is not a string")?)?;
        }
        ensure!(luns.iter().all(Json::is_i64), "target_luns holds a non-integer");
        ensure!(iqns.iter().all(|i| i.as_str().is_some_and(|i| check_iscsi_name(i).is_ok())), "target_iqns");
    }
    Ok(())
}

// C10
pub(super) async fn connection_schema(env: &mut Env<'_>) -> Result<(), String> {
    let advertised: Vec<String> = env.shared.info.protocols.iter().map(volume_type).collect();
    for (mode, name) in [(AccessMode::Rw, "rw"), (AccessMode::Ro, "ro")] {
        for multipath in [false, true] {
            let mut v = exported(env, false).await?;
            let mut c = connector(A, "host-a", mode);
            c.multipath = multipath;
            let conn = env.connect(&mut v, &c).await?;
            let kind = conn.driver_volume_type.to_ascii_lowercase();
            ensure!(
                advertised.contains(&kind),
                "driver_volume_type is {:?}; the driver advertises {}",
                conn.driver_volume_type,
                advertised.join(", ")
            );
            check_connection_data(&kind, &conn.data, name)
                .map_err(|e| format!("{kind} ({name}, multipath={multipath}): {e}"))?;
        }
    }
    Ok(())
}

/// os-brick's connector name for a protocol (`driver_volume_type`).
fn volume_type(p: &Protocol) -> String {
    match p {
        Protocol::Iscsi => "iscsi".into(),
        Protocol::Iser => "iser".into(),
        Protocol::Nvmeof => "nvmeof".into(),
        Protocol::FibreChannel => "fibre_channel".into(),
        Protocol::Rbd => "rbd".into(),
        Protocol::Nfs => "nfs".into(),
        Protocol::Other(name) => name.to_ascii_lowercase(),
    }
}

/// What os-brick's connector for `kind` reads from the connection data. Types os-brick does not
/// have (a protocol's `other` case) are checked only for the common keys.
fn check_connection_data(kind: &str, d: &serde_json::Map<String, Json>, mode: &str) -> Result<(), String> {
    if let Some(am) = d.get("access_mode") {
        ensure!(am.as_str() == Some(mode), "access_mode is {am}, the connector asked for {mode}");
    }
    for key in ["encrypted", "discard", "cacheable", "target_discovered"] {
        if let Some(v) = d.get(key) {
            ensure!(v.is_boolean(), "{key} is not a boolean");
        }
    }
    match kind {
        "iscsi" | "iser" => check_iscsi_data(d),
        "fibre_channel" => check_fc_data(d),
        "nvmeof" => check_nvmeof_data(d),
        "rbd" => check_rbd_data(d),
        "nfs" => check_nfs_data(d),
        _ => Ok(()),
    }
}

fn is_wwn(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn check_lun(v: Option<&Json>, key: &str) -> Result<(), String> {
    let lun = v.and_then(Json::as_i64).ok_or(format!("{key} is missing or not an integer"))?;
    ensure!((0..16384).contains(&lun), "{key} {lun} is out of range");
    Ok(())
}

// os-brick FibreChannelConnector: target_wwn (one WWN or a list), target_lun, and optionally
// initiator_target_map (initiator WWPN -> target WWNs).
fn check_fc_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    match d.get("target_wwn") {
        Some(Json::String(w)) => ensure!(is_wwn(w), "target_wwn {w:?} is not 16 hex digits"),
        Some(Json::Array(ws)) => ensure!(
            !ws.is_empty() && ws.iter().all(|w| w.as_str().is_some_and(is_wwn)),
            "target_wwn is not a non-empty list of 16-hex-digit WWNs"
        ),
        _ => return Err("target_wwn is missing or neither a WWN nor a list of WWNs".into()),
    }
    check_lun(d.get("target_lun"), "target_lun")?;
    if let Some(map) = d.get("initiator_target_map") {
        let map = map.as_object().ok_or("initiator_target_map is not an object")?;
        for (initiator, targets) in map {
            ensure!(is_wwn(initiator), "initiator_target_map key {initiator:?} is not a WWPN");
            ensure!(
                targets.as_array().is_some_and(|t| t.iter().all(|w| w.as_str().is_some_and(is_wwn))),
                "initiator_target_map[{initiator}] is not a list of WWNs"
            );
        }
    }
    Ok(())
}

// os-brick NVMeOFConnProps: a target (target_nqn, portals of [address, port, transport], optional
// vol_uuid / volume_nguid / ns_id / host_nqn), replicas of such targets, or the original format
// (nqn, transport_type, target_portal, target_port).
fn check_nvmeof_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let nqn = |v: Option<&Json>, key: &str| -> Result<(), String> {
        let n = v.and_then(Json::as_str).ok_or(format!("{key} is missing or not a string"))?;
        ensure!(n.starts_with("nqn.") && n.len() <= 223, "{key} {n:?} is not an NVMe qualified name");
        Ok(())
    };
    let port = |v: Option<&Json>| match v {
        Some(Json::String(s)) => s.parse::<u16>().is_ok(),
        Some(Json::Number(n)) => n.as_u64().is_some_and(|n| (1..=65535).contains(&n)),
        _ => false,
    };
    let uuid = |v: Option<&Json>, key: &str| -> Result<(), String> {
        match v {
            None | Some(Json::Null) => Ok(()),
            Some(Json::String(s)) if uuid::Uuid::parse_str(s).is_ok() => Ok(()),
            Some(other) => Err(format!("{key} {other} is not a UUID")),
        }
    };
    let target = |t: &serde_json::Map<String, Json>| -> Result<(), String> {
        nqn(t.get("target_nqn"), "target_nqn")?;
        let portals = t.get("portals").and_then(Json::as_array).ok_or("portals is missing or not a list")?;
        ensure!(!portals.is_empty(), "portals is empty");
        for p in portals {
            let p = p
                .as_array()
                .filter(|p| p.len() == 3)
                .ok_or(format!("portal {p} is not [address, port, transport]"))?;
            ensure!(p[0].as_str().is_some_and(|a| !a.is_empty()), "portal address {} is not a string", p[0]);
            ensure!(port(Some(&p[1])), "portal port {} is not a port number", p[1]);
            ensure!(p[2].is_string(), "portal transport {} is not a string", p[2]);
        }
        uuid(t.get("vol_uuid"), "vol_uuid")?;
        uuid(t.get("volume_nguid"), "volume_nguid")?;
        if let Some(h) = t.get("host_nqn") {
            nqn(Some(h), "host_nqn")?;
        }
        Ok(())
    };
    if let Some(replicas) = d.get("volume_replicas") {
        let replicas = replicas.as_array().ok_or("volume_replicas is not a list")?;
        ensure!(!replicas.is_empty(), "volume_replicas is empty");
        for r in replicas {
            target(r.as_object().ok_or("a replica is not an object")?)?;
        }
        if replicas.len() > 1 {
            ensure!(d.get("alias").is_some_and(Json::is_string), "replicated without an alias");
        }
        return uuid(d.get("vol_uuid"), "vol_uuid");
    }
    if d.contains_key("target_nqn") {
        return target(d);
    }
    nqn(d.get("nqn"), "nqn")?;
    ensure!(
        d.get("transport_type").is_some_and(Json::is_string),
        "transport_type is missing or not a string"
    );
    ensure!(
        d.get("target_portal").and_then(Json::as_str).is_some_and(|a| !a.is_empty()),
        "target_portal is missing or not a string"
    );
    ensure!(port(d.get("target_port")), "target_port is missing or not a port number");
    Ok(())
}

// os-brick RBDConnector: name = "<pool>/<image>", hosts and ports of the monitors, and the
// cephx settings when auth_enabled.
fn check_rbd_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let name = d.get("name").and_then(Json::as_str).ok_or("name is missing or not a string")?;
    let (pool, image) = name.split_once('/').ok_or(format!("name {name:?} is not <pool>/<image>"))?;
    ensure!(!pool.is_empty() && !image.is_empty(), "name {name:?} is not <pool>/<image>");
    let hosts = d.get("hosts").and_then(Json::as_array).ok_or("hosts is missing or not a list")?;
    let ports = d.get("ports").and_then(Json::as_array).ok_or("ports is missing or not a list")?;
    ensure!(hosts.len() == ports.len(), "hosts and ports differ in length");
    ensure!(hosts.iter().all(Json::is_string), "hosts holds a non-string");
    ensure!(ports.iter().all(|p| p.is_string() || p.is_u64()), "ports holds a non-port");
    match d.get("auth_enabled") {
        None => {}
        Some(Json::Bool(true)) => ensure!(
            d.get("auth_username").and_then(Json::as_str).is_some_and(|u| !u.is_empty()),
            "auth_enabled without auth_username"
        ),
        Some(Json::Bool(false)) => {}
        Some(other) => return Err(format!("auth_enabled {other} is not a boolean")),
    }
    Ok(())
}

// os-brick RemoteFsConnector (NFS): export = "<server>:/<path>", name = the file in it, and
// optional mount options.
fn check_nfs_data(d: &serde_json::Map<String, Json>) -> Result<(), String> {
    let export = d.get("export").and_then(Json::as_str).ok_or("export is missing or not a string")?;
    let (server, path) =
        export.rsplit_once(":/").ok_or(format!("export {export:?} is not <server>:/<path>"))?;
    ensure!(!server.is_empty(), "export {export:?} has no server");
    let _ = path;
    let name = d.get("name").and_then(Json::as_str).ok_or("name is missing or not a string")?;
    ensure!(!name.is_empty() && !name.contains('/') && name != "..", "name {name:?} is not a file name");
    if let Some(o) = d.get("options") {
        ensure!(o.is_string() || o.is_null(), "options is not a string");
    }
    Ok(())
}

// C18 (in the model: the same rules tgtd applies at login)
pub(super) async fn acl_exact(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let conn = env.connect(&mut v, &a()).await?;
    env.login(&conn, A).await.map_err(|e| format!("the connector's initiator cannot log in: {e}"))?;
    ensure!(env.login(&conn, B).await.is_err(), "another initiator can log in");
    if let Some((user, _)) = conn.chap() {
        ensure!(
            env.login_as(&conn, A, Some((&user, "wrongsecretwrong1"))).await.is_err(),
            "a wrong CHAP secret is accepted"
        );
        ensure!(env.login_as(&conn, A, None).await.is_err(), "a login without CHAP is accepted");
    }
    Ok(())
}

// C12
pub(super) async fn initialize_unexported(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = env.create_volume(false).await?;
    match env.try_connect(&mut v, &a()).await {
        Err(e) if matches!(driver_error(&e), Some(DriverError::NotFound(_))) => Ok(()),
        Err(e) => Err(format!("expected not-found, got: {}", failed(&e))),
        Ok(_) => {
            // Fine for a driver that has no exports at all.
            let mut probe = env.create_volume(false).await?;
            match env.call(Request::CreateExport(probe.clone(), None)).await {
                Err(e) if e.is_unsupported() => Ok(()),
                _ => {
                    env.remove_export(&mut probe).await.ok();
                    Err("initialize-connection succeeded on a volume that create-export was never called for"
                        .into())
                }
            }
        }
    }
}

// C13
pub(super) async fn access_mode_change(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    env.connect(&mut v, &a()).await?;
    let (record, snapshot) = (v.clone(), env.snapshot().await?);
    let ro = connector(A, "host-a", AccessMode::Ro);
    match env.try_connect(&mut v, &ro).await {
        Ok(conn) => {
            let mode = conn.data.get("access_mode").and_then(Json::as_str);
            ensure!(mode == Some("ro"), "read-only was asked for, the answer says access_mode {mode:?}");
            Ok(())
        }
        Err(e) => {
            ensure!(
                matches!(driver_error(&e), Some(DriverError::Incompatible(_))),
                "expected incompatible, got: {}",
                failed(&e)
            );
            ensure!(v == record, "the refused call changed the volume record");
            env.unchanged_since(&snapshot, "the refused call changed the target service").await?;
            Ok(())
        }
    }
}

// C11
pub(super) async fn second_initiator(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, true).await?;
    let ca = env.connect(&mut v, &a()).await?;
    let cb = env.connect(&mut v, &b()).await?;
    env.login(&cb, B).await.map_err(|e| format!("the second initiator cannot log in: {e}"))?;
    env.login(&ca, A).await.map_err(|e| format!("the first initiator lost access: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_connection_data;
    use serde_json::{Value as Json, json};

    fn check(kind: &str, data: Json) -> Result<(), String> {
        check_connection_data(kind, data.as_object().unwrap(), "rw")
    }

    /// Each type's schema accepts what Cinder's drivers send and refuses it with one key broken.
    fn accepts_and_refuses(kind: &str, good: Json, broken: &[(&str, Json)]) {
        check(kind, good.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"));
        for (key, value) in broken {
            let mut bad = good.clone();
            match value {
                Json::Null if *key != "vol_uuid" => drop(bad.as_object_mut().unwrap().remove(*key)),
                v => bad[*key] = v.clone(),
            }
            assert!(check(kind, bad).is_err(), "{kind} accepted a broken {key}: {value}");
        }
    }

    #[test]
    fn iscsi_needs_a_portal_an_iqn_a_lun_and_complete_chap() {
        accepts_and_refuses(
            "iscsi",
            json!({"target_portal": "192.0.2.1:3260", "target_iqn": "iqn.2010-10.org.openstack:volume-1",
                   "target_lun": 1, "auth_method": "CHAP", "auth_username": "u", "auth_password": "p",
                   "access_mode": "rw", "target_discovered": false}),
            &[
                ("target_portal", json!("192.0.2.1")),
                ("target_iqn", json!("volume-1")),
                ("target_lun", json!("1")),
                ("auth_password", Json::Null),
                ("access_mode", json!("ro")),
                ("target_discovered", json!("no")),
            ],
        );
    }

    #[test]
    fn fibre_channel_needs_target_wwns_and_a_lun() {
        accepts_and_refuses(
            "fibre_channel",
            json!({"target_wwn": ["500a0981891b8dc5"], "target_lun": 2, "target_discovered": false,
                   "initiator_target_map": {"10000090fa534cd0": ["500a0981891b8dc5"]}}),
            &[
                ("target_wwn", Json::Null),
                ("target_wwn", json!(["50:0a:09:81:89:1b:8d:c5"])),
                ("target_lun", json!(-1)),
                ("initiator_target_map", json!({"10000090fa534cd0": "500a0981891b8dc5"})),
            ],
        );
        check("fibre_channel", json!({"target_wwn": "500a0981891b8dc5", "target_lun": 0})).unwrap();
    }

    #[test]
    fn nvmeof_needs_an_nqn_and_portals_in_any_of_os_bricks_formats() {
        accepts_and_refuses(
            "nvmeof",
            json!({"target_nqn": "nqn.2014-08.org.openstack:volume-1",
                   "portals": [["192.0.2.1", "4420", "tcp"]],
                   "vol_uuid": "6c2f6a1e-2f4b-4c1d-9d3e-2b6f8a0c1d2e", "access_mode": "rw"}),
            &[
                ("target_nqn", json!("volume-1")),
                ("portals", json!([])),
                ("portals", json!([["192.0.2.1", "4420"]])),
                ("portals", json!([["192.0.2.1", "port", "tcp"]])),
                ("vol_uuid", json!("not-a-uuid")),
            ],
        );
        // The original format.
        accepts_and_refuses(
            "nvmeof",
            json!({"nqn": "nqn.2014-08.org.openstack:volume-1", "transport_type": "tcp",
                   "target_portal": "192.0.2.1", "target_port": 4420}),
            &[("target_port", json!(0)), ("transport_type", Json::Null)],
        );
        // Replicas.
        let replica =
            json!({"target_nqn": "nqn.2014-08.org.openstack:r1", "portals": [["192.0.2.1", 4420, "tcp"]]});
        check(
            "nvmeof",
            json!({"volume_replicas": [replica.clone(), replica.clone()], "replica_count": 2,
                               "alias": "raid1"}),
        )
        .unwrap();
        assert!(check("nvmeof", json!({"volume_replicas": [replica.clone(), replica]})).is_err(), "no alias");
    }

    #[test]
    fn rbd_needs_pool_and_image_and_matching_monitors() {
        accepts_and_refuses(
            "rbd",
            json!({"name": "volumes/volume-1", "hosts": ["192.0.2.1", "192.0.2.2"], "ports": ["6789", "6789"],
                   "auth_enabled": true, "auth_username": "cinder", "secret_type": "ceph",
                   "secret_uuid": "6c2f6a1e-2f4b-4c1d-9d3e-2b6f8a0c1d2e", "cluster_name": "ceph"}),
            &[
                ("name", json!("volume-1")),
                ("ports", json!(["6789"])),
                ("auth_username", Json::Null),
                ("auth_enabled", json!("yes")),
            ],
        );
    }

    #[test]
    fn nfs_needs_an_export_and_a_file_name() {
        accepts_and_refuses(
            "nfs",
            json!({"export": "192.0.2.1:/srv/cinder", "name": "volume-1", "options": null, "format": "raw"}),
            &[("export", json!("/srv/cinder")), ("name", json!("../etc/passwd")), ("name", Json::Null)],
        );
    }

    #[test]
    fn messages_never_carry_credentials() {
        let data = json!({"auth_username": "user", "auth_password": "s3cretvalue", "secret_uuid": "x"});
        let shown = super::redacted(data.as_object().unwrap());
        assert!(!shown.contains("s3cretvalue") && shown.contains("user"), "{shown}");
        let mut v = super::fixed_volume();
        v.provider_auth = Some("CHAP user s3cretvalue".into());
        assert!(!super::redacted_volume(&v).contains("s3cretvalue"));
    }

    #[test]
    fn other_types_are_checked_only_for_the_common_keys() {
        check("vendor_x", json!({"anything": [1, 2]})).unwrap();
        assert!(check("vendor_x", json!({"access_mode": "ro"})).is_err());
    }
}

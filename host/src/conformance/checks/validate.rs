//! validate-connector: what a connector must carry, hostile initiator names refused before any
//! capability call, os-brick's extra keys accepted, no side effects; and the capability calls
//! carrying only arguments the contract allows.

use super::*;

// C01
pub(super) async fn requires_initiator(env: &mut Env<'_>) -> Result<(), String> {
    let mut c = a();
    c.initiator = None;
    match env.call(Request::ValidateConnector(c)).await {
        Ok(_) => Err("a connector without an initiator was accepted".into()),
        Err(e) => match driver_error(&e) {
            Some(DriverError::InvalidConnector(ic)) if ic.missing.iter().any(|m| m == "initiator") => Ok(()),
            _ => {
                Err(format!("expected invalid-connector with missing = [\"initiator\"], got: {}", failed(&e)))
            }
        },
    }
}

/// Initiator names that must never reach a command (RFC 3720's grammar, shell and tgt syntax).
fn hostile_names() -> Vec<String> {
    let base = "iqn.2010-10.org.openstack:x";
    vec![
        format!("{base};reboot"),
        format!("{base}$(touch /tmp/pwned)"),
        format!("{base}`id`"),
        format!("{base}#comment"),
        format!("{base}\nsecond-line"),
        format!("{base} -T other"),
        format!("{base}\0nul"),
        format!("{base},initiator-address=ALL"),
        "ALL".into(),
        "../../etc/passwd".into(),
        "iqn.bad".into(),
        format!("iqn.2010-10.org.openstack:{}", "a".repeat(300)),
        "IQN.2010-10.ORG.OPENSTACK:UPPER".into(),
    ]
}

// C02, C33
pub(super) async fn hostile_initiators(env: &mut Env<'_>) -> Result<(), String> {
    let mut v = exported(env, false).await?;
    let before = env.snapshot().await?;
    for name in hostile_names() {
        let c = connector(&name, "host-a", AccessMode::Rw);
        let shown = format!("{name:?}");
        match env.call(Request::ValidateConnector(c.clone())).await {
            Ok(_) => return Err(format!("validate-connector accepted the initiator {shown}")),
            Err(e) if is_invalid_connector(&e) => {}
            Err(e) => {
                return Err(format!("the initiator {shown} got {} instead of invalid-connector", failed(&e)));
            }
        }
        ensure!(env.last_calls.is_empty(), "validate-connector made capability calls for {shown}");
        if let Ok(conn) = env.try_connect(&mut v, &c).await {
            return Err(format!(
                "initialize-connection accepted the initiator {shown}: {}",
                redacted(&conn.data)
            ));
        }
        let reached: Vec<String> = env
            .last_calls
            .iter()
            .filter(|call| {
                call.args
                    .iter()
                    .any(|arg| arg.contains(&name) || name.contains(arg.as_str()) && arg.len() > 8)
            })
            .map(|call| format!("{}({})", call.op, call.args.join(", ")))
            .collect();
        ensure!(reached.is_empty(), "the initiator {shown} reached capability calls: {reached:?}");
    }
    env.unchanged_since(&before, "hostile connectors changed the target service").await?;
    Ok(())
}

// C04
pub(super) async fn extra_keys(env: &mut Env<'_>) -> Result<(), String> {
    let c = connector_json(json!({
        "initiator": A, "host": "host-a", "ip": "192.0.2.10", "platform": "x86_64", "os_type": "linux",
        "multipath": false, "enforce_multipath": false, "do_local_attach": false,
        "uuid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "system uuid": "4c4c4544-0000-1010-8000-c7c04f333533",
        "nvme_hostid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "found_dsc": "", "host_ips": ["192.0.2.10"],
        "mountpoint": "/dev/vdb", "nqn": "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        "wwpns": ["10000090fa53c0fe"], "wwnns": ["20000090fa53c0fe"],
    }));
    env.call(Request::ValidateConnector(c)).await.map(drop).map_err(|e| format!("refused: {}", failed(&e)))
}

// C03
pub(super) async fn validate_pure(env: &mut Env<'_>) -> Result<(), String> {
    let mut missing = a();
    missing.initiator = None;
    for c in [a(), missing] {
        let first = env.call(Request::ValidateConnector(c.clone())).await;
        for _ in 0..REPEAT {
            let again = env.call(Request::ValidateConnector(c.clone())).await;
            ensure!(
                again.as_ref().ok() == first.as_ref().ok()
                    && again.as_ref().err().map(|e| e.kind.to_string())
                        == first.as_ref().err().map(|e| e.kind.to_string()),
                "the same connector got different answers"
            );
            ensure!(
                env.last_calls.is_empty(),
                "validate-connector made capability calls: {:?}",
                env.last_calls
            );
        }
    }
    Ok(())
}

// C33
pub(super) async fn argument_grammar(env: &mut Env<'_>) -> Result<(), String> {
    let multi = env.shared.multiattach();
    let mut v = exported(env, multi).await?;
    let long =
        format!("iqn.2005-03.org.open-iscsi:{}", "x".repeat(223 - "iqn.2005-03.org.open-iscsi:".len()));
    for initiator in
        ["iqn.1993-08.org.debian:01:a1b2c3", "eui.02004567a425678d", "naa.52004567ba64678d", long.as_str()]
    {
        let c = connector(initiator, "host-g", AccessMode::Rw);
        env.connect(&mut v, &c).await.map_err(|e| format!("{initiator}: {e}"))?;
        env.terminate(&mut v, Some(&c), &[]).await.map_err(|e| format!("{initiator}: {e}"))?;
    }
    for bad in ["not-an-iqn", "", "iqn.2010-10.org.openstack:x y"] {
        let c = connector(bad, "host-g", AccessMode::Rw);
        let _ = env.try_terminate(&mut v, Some(&c), &[]).await;
    }
    env.remove_export(&mut v).await?;
    let refused = &env.measure.invalid_arguments;
    ensure!(refused.is_empty(), "the host refused capability calls as invalid: {refused:?}");
    Ok(())
}

//! JSON <-> contract values: connectors as clients send them (os-brick's dict), and connection
//! information as clients expect it, with every value keeping its JSON type.

use serde_json::{Map, Number, Value as Json};

use super::contract::{AccessMode, ConnectionInfo, Connector, Value};

/// The most keys a connector may have.
pub const MAX_CONNECTOR_KEYS: usize = 64;

/// Builds a connector from the JSON object a client sent. `mode` is the attachment's access mode
/// (the host decides it; a `mode` key in the object is not passed on as an extra).
pub fn connector_from_json(obj: &Map<String, Json>, mode: AccessMode) -> Result<Connector, String> {
    if obj.len() > MAX_CONNECTOR_KEYS {
        return Err(format!("connector has {} keys, at most {MAX_CONNECTOR_KEYS} are accepted", obj.len()));
    }
    let text = |key: &str| -> Result<Option<String>, String> {
        match obj.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!("connector.{key} must be a string, not {}", kind(other))),
        }
    };
    let flag = |key: &str| -> Result<bool, String> {
        match obj.get(key) {
            None | Some(Json::Null) => Ok(false),
            Some(Json::Bool(b)) => Ok(*b),
            // python-brick-cinderclient-ext passes its CLI strings through ("True").
            Some(Json::String(s)) => match s.to_ascii_lowercase().as_str() {
                "true" | "yes" | "1" | "on" => Ok(true),
                "false" | "no" | "0" | "off" | "" => Ok(false),
                _ => Err(format!("connector.{key} must be a boolean, not {s:?}")),
            },
            Some(other) => Err(format!("connector.{key} must be a boolean, not {}", kind(other))),
        }
    };
    let names = |key: &str| -> Result<Vec<String>, String> {
        match obj.get(key) {
            None | Some(Json::Null) => Ok(Vec::new()),
            Some(Json::String(s)) => Ok(vec![s.clone()]),
            Some(Json::Array(items)) => items
                .iter()
                .map(|i| match i {
                    Json::String(s) => Ok(s.clone()),
                    other => Err(format!("connector.{key} must hold strings, not {}", kind(other))),
                })
                .collect(),
            Some(other) => Err(format!("connector.{key} must be a list of strings, not {}", kind(other))),
        }
    };
    const TYPED: [&str; 13] = [
        "initiator",
        "host",
        "ip",
        "multipath",
        "enforce_multipath",
        "platform",
        "os_type",
        "nqn",
        "wwpns",
        "wwnns",
        "mountpoint",
        "mode",
        "attachment_id",
    ];
    let extra = obj
        .iter()
        .filter(|(k, _)| !TYPED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), value_from_json(v)))
        .collect();
    Ok(Connector {
        initiator: text("initiator")?,
        host: text("host")?,
        ip: text("ip")?,
        multipath: flag("multipath")?,
        enforce_multipath: flag("enforce_multipath")?,
        platform: text("platform")?,
        os_type: text("os_type")?,
        nqn: text("nqn")?,
        wwpns: names("wwpns")?,
        wwnns: names("wwnns")?,
        mountpoint: text("mountpoint")?,
        mode,
        extra,
    })
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "an object",
    }
}

/// A JSON value as a contract value (nested values travel as JSON text).
pub fn value_from_json(v: &Json) -> Value {
    match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Integer(i),
            None => Value::Number(n.as_f64().unwrap_or(0.0)),
        },
        Json::String(s) => Value::Text(s.clone()),
        Json::Array(items) if items.iter().all(Json::is_string) => {
            Value::TextList(items.iter().filter_map(|i| i.as_str().map(str::to_string)).collect())
        }
        Json::Array(items) if !items.is_empty() && items.iter().all(Json::is_i64) => {
            Value::IntegerList(items.iter().filter_map(Json::as_i64).collect())
        }
        other => Value::Json(other.to_string()),
    }
}

/// A contract value as JSON; refuses invalid JSON text and non-finite numbers.
pub fn value_to_json(v: &Value) -> Result<Json, String> {
    Ok(match v {
        Value::Null => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Integer(i) => Json::Number((*i).into()),
        Value::Number(f) => {
            Json::Number(Number::from_f64(*f).ok_or_else(|| format!("{f} is not a JSON number"))?)
        }
        Value::Text(s) => Json::String(s.clone()),
        Value::TextList(l) => Json::Array(l.iter().cloned().map(Json::String).collect()),
        Value::IntegerList(l) => Json::Array(l.iter().map(|i| Json::Number((*i).into())).collect()),
        Value::Json(text) => serde_json::from_str(text).map_err(|e| format!("invalid JSON value: {e}"))?,
    })
}

/// The `data` of connection information as a JSON object. Keys must be 1 to 128 printable
/// characters and unique.
pub fn connection_data_to_json(info: &ConnectionInfo) -> Result<Map<String, Json>, String> {
    let mut map = Map::new();
    for (key, value) in &info.data {
        if key.is_empty() || key.len() > 128 || key.chars().any(char::is_control) {
            return Err(format!("connection info key {key:?} is not a valid key"));
        }
        if map.insert(key.clone(), value_to_json(value).map_err(|e| format!("{key}: {e}"))?).is_some() {
            return Err(format!("connection info key {key:?} appears twice"));
        }
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn os_brick_connectors_are_typed_and_extras_keep_their_types() {
        let obj = json!({
            "initiator": "iqn.1993-08.org.debian:01:abc", "host": "h1", "ip": "10.0.0.1",
            "platform": "x86_64", "os_type": "linux", "multipath": "True", "enforce_multipath": false,
            "do_local_attach": false, "uuid": "x", "mode": "ro", "wwpns": "5001", "system uuid": null
        });
        let c = connector_from_json(obj.as_object().unwrap(), AccessMode::Rw).unwrap();
        assert_eq!(c.initiator.as_deref(), Some("iqn.1993-08.org.debian:01:abc"));
        assert!(c.multipath && !c.enforce_multipath);
        assert_eq!(c.wwpns, vec!["5001".to_string()]);
        assert_eq!(c.mode, AccessMode::Rw);
        let extra: std::collections::BTreeMap<_, _> = c.extra.into_iter().collect();
        assert_eq!(extra["do_local_attach"], Value::Boolean(false));
        assert_eq!(extra["system uuid"], Value::Null);
        assert!(!extra.contains_key("mode"));
    }

    #[test]
    fn wrong_types_are_named() {
        let obj = json!({"initiator": 5});
        let e = connector_from_json(obj.as_object().unwrap(), AccessMode::Rw).unwrap_err();
        assert_eq!(e, "connector.initiator must be a string, not a number");
        let obj = json!({"multipath": "maybe"});
        assert!(connector_from_json(obj.as_object().unwrap(), AccessMode::Rw).is_err());
    }

    #[test]
    fn values_round_trip_with_their_json_types() {
        for v in [
            json!(null),
            json!(true),
            json!(-3),
            json!(1.5),
            json!("x"),
            json!(["a", "b"]),
            json!([1, 2]),
            json!({"a": [1, "b", {"c": null}]}),
        ] {
            assert_eq!(value_to_json(&value_from_json(&v)).unwrap(), v);
        }
        assert!(value_to_json(&Value::Json("{nope".into())).is_err());
        assert!(value_to_json(&Value::Number(f64::NAN)).is_err());
    }
}

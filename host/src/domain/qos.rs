//! Quality of service as Cinder's QoS specs: who enforces them, and what a connection of a volume
//! carries of them (Cinder's volume manager, `_parse_connection_options`): the compute host
//! enforces `front-end` specs, with limits per GiB scaled by the volume's size.

use std::collections::BTreeMap;

/// Who enforces a set of QoS specs (Cinder's `consumer`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize, schemars::JsonSchema,
)]
pub enum QosConsumer {
    /// The compute host, from the connection's `qos_specs`.
    #[serde(rename = "front-end")]
    FrontEnd,
    /// The storage (Cinder's default): shown, never sent with a connection.
    #[default]
    #[serde(rename = "back-end")]
    BackEnd,
    /// Both.
    #[serde(rename = "both")]
    Both,
}

/// A set of QoS specs, as configured (`[[qos_specs]]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosSpecs {
    /// Stable across restarts and nodes: a UUID derived from the name (`catalog::qos_specs_id`).
    pub id: String,
    pub name: String,
    pub consumer: QosConsumer,
    pub specs: BTreeMap<String, String>,
}

/// The limits a `<limit>_per_gb` spec may scale (Cinder's `tune_opts`).
const PER_GB_LIMITS: [&str; 6] = [
    "read_iops_sec",
    "read_bytes_sec",
    "write_iops_sec",
    "write_bytes_sec",
    "total_iops_sec",
    "total_bytes_sec",
];

impl QosSpecs {
    pub fn new(id: String, name: &str, consumer: QosConsumer, specs: BTreeMap<String, String>) -> Self {
        QosSpecs { id, name: name.to_string(), consumer, specs }
    }

    /// Refuses specs whose per-GB arithmetic cannot be done: a `<limit>_per_gb`, `_per_gb_min`
    /// or `_max` that is not a whole number (Cinder's `int()` would fail at every attach).
    pub fn check(specs: &BTreeMap<String, String>) -> Result<(), String> {
        for limit in PER_GB_LIMITS {
            for key in [format!("{limit}_per_gb"), format!("{limit}_per_gb_min"), format!("{limit}_max")] {
                if let Some(value) = specs.get(&key)
                    && value.trim().parse::<u64>().is_err()
                {
                    return Err(format!("{key} = {value:?} is not a whole number of at least 0"));
                }
            }
        }
        Ok(())
    }

    /// What a connection of a volume of `size_gib` carries (Cinder's `_parse_connection_options`):
    /// the specs, each `<limit>_per_gb` replaced by `<limit>` = the value times the size, at
    /// least `<limit>_per_gb_min` and at most `<limit>_max` (both then dropped). Values stay
    /// Cinder's strings; the computed ones are numbers, as Cinder's.
    pub fn for_connection(&self, size_gib: i64) -> serde_json::Map<String, serde_json::Value> {
        let mut specs: BTreeMap<String, serde_json::Value> =
            self.specs.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
        // `check` made sure these are whole numbers.
        let mut take = |key: String| {
            specs.remove(&key).and_then(|v| v.as_str().and_then(|s| s.trim().parse::<u64>().ok()))
        };
        let size = u64::try_from(size_gib).unwrap_or(0);
        let mut computed = Vec::new();
        for limit in PER_GB_LIMITS {
            let Some(per_gb) = take(format!("{limit}_per_gb")) else { continue };
            let value = per_gb.saturating_mul(size).max(take(format!("{limit}_per_gb_min")).unwrap_or(0));
            let max = take(format!("{limit}_max")).unwrap_or(value);
            computed.push((limit.to_string(), value.min(max)));
        }
        specs.extend(computed.into_iter().map(|(k, v)| (k, v.into())));
        specs.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn specs(pairs: &[(&str, &str)]) -> QosSpecs {
        let specs = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        QosSpecs::new("id".into(), "gold", QosConsumer::FrontEnd, specs)
    }

    #[test]
    fn a_connection_carries_the_specs_with_limits_per_gib_scaled_by_the_volumes_size() {
        let q = specs(&[("total_iops_sec_per_gb", "30"), ("read_bytes_sec", "1048576"), ("other", "x")]);
        let got = serde_json::Value::Object(q.for_connection(10));
        assert_eq!(got, json!({"total_iops_sec": 300, "read_bytes_sec": "1048576", "other": "x"}));
    }

    #[test]
    fn a_scaled_limit_is_at_least_its_minimum_and_at_most_its_maximum() {
        let q = specs(&[
            ("read_iops_sec_per_gb", "30"),
            ("read_iops_sec_per_gb_min", "500"),
            ("write_bytes_sec_per_gb", "1000"),
            ("write_bytes_sec_max", "4000"),
            // A maximum with no per-GiB limit is left as it is, as Cinder leaves it.
            ("total_iops_sec_max", "9"),
        ]);
        let got = serde_json::Value::Object(q.for_connection(10));
        assert_eq!(got, json!({"read_iops_sec": 500, "write_bytes_sec": 4000, "total_iops_sec_max": "9"}));
        let got = serde_json::Value::Object(q.for_connection(100));
        assert_eq!(got, json!({"read_iops_sec": 3000, "write_bytes_sec": 4000, "total_iops_sec_max": "9"}));
    }

    #[test]
    fn specs_whose_per_gib_arithmetic_cannot_be_done_are_refused() {
        let with = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        assert_eq!(QosSpecs::check(&with("total_iops_sec_per_gb", "30")), Ok(()));
        assert_eq!(QosSpecs::check(&with("total_iops_sec", "fast")), Ok(()), "not scaled: any value");
        for key in ["total_iops_sec_per_gb", "read_bytes_sec_per_gb_min", "write_iops_sec_max"] {
            let refused = QosSpecs::check(&with(key, "fast")).unwrap_err();
            assert_eq!(refused, format!("{key} = \"fast\" is not a whole number of at least 0"));
        }
        assert!(QosSpecs::check(&with("read_iops_sec_per_gb", "-1")).is_err());
    }
}

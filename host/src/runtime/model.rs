//! The driver-owned part of a volume record, and how a driver's `model-update` changes it. The
//! one place that validates a model update: [`super::Driver::invoke`] refuses a malformed one as
//! an invalid result, and the service and the conformance suite both apply updates with
//! [`VolumeFields::apply`].

use std::collections::BTreeMap;

use super::contract::{ModelUpdate, Volume, VolumeField};

/// The largest value a driver may store in a volume field or a driver-data entry.
pub const MAX_FIELD: usize = 4096;
/// The longest driver-data key.
pub const MAX_DATA_KEY: usize = 256;
/// The most driver-data entries a volume may carry.
pub const MAX_DATA_KEYS: usize = 256;

/// What a driver keeps with a volume between calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeFields {
    pub provider_location: Option<String>,
    pub provider_auth: Option<String>,
    pub provider_id: Option<String>,
    pub driver_data: BTreeMap<String, String>,
}

/// Checks a model update on its own: the size of every field and entry.
pub fn validate(update: &ModelUpdate) -> Result<(), String> {
    for (name, value) in [
        ("provider-location", &update.provider_location),
        ("provider-auth", &update.provider_auth),
        ("provider-id", &update.provider_id),
    ] {
        if value.as_ref().is_some_and(|v| v.len() > MAX_FIELD) {
            return Err(format!("{name} is longer than {MAX_FIELD} bytes"));
        }
    }
    if update.set_data.len() > MAX_DATA_KEYS || update.remove_data.len() > MAX_DATA_KEYS * 4 {
        return Err(format!("a model update may change at most {MAX_DATA_KEYS} driver data entries"));
    }
    for (k, v) in &update.set_data {
        if k.is_empty() || k.len() > MAX_DATA_KEY || v.len() > MAX_FIELD {
            return Err(format!("driver data entry {:?} is too large or has an empty key", truncate(k)));
        }
    }
    Ok(())
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl VolumeFields {
    /// The fields of a volume record as drivers receive it.
    pub fn of(volume: &Volume) -> VolumeFields {
        VolumeFields {
            provider_location: volume.provider_location.clone(),
            provider_auth: volume.provider_auth.clone(),
            provider_id: volume.provider_id.clone(),
            driver_data: volume.driver_data.iter().cloned().collect(),
        }
    }

    /// Writes onto these fields (as stored now) what a flow changed from `from` to `to`: a field
    /// it changed takes its value, a data entry it set, changed or removed follows it, and
    /// everything else keeps what is stored, so a change another writer made meanwhile is kept.
    pub fn merge(&mut self, from: &VolumeFields, to: &VolumeFields) {
        for (stored, before, after) in [
            (&mut self.provider_location, &from.provider_location, &to.provider_location),
            (&mut self.provider_auth, &from.provider_auth, &to.provider_auth),
            (&mut self.provider_id, &from.provider_id, &to.provider_id),
        ] {
            if before != after {
                stored.clone_from(after);
            }
        }
        for (key, value) in &to.driver_data {
            if from.driver_data.get(key) != Some(value) {
                self.driver_data.insert(key.clone(), value.clone());
            }
        }
        for key in from.driver_data.keys().filter(|k| !to.driver_data.contains_key(*k)) {
            self.driver_data.remove(key);
        }
    }

    /// Writes the fields into a volume record.
    pub fn write_to(&self, volume: &mut Volume) {
        volume.provider_location = self.provider_location.clone();
        volume.provider_auth = self.provider_auth.clone();
        volume.provider_id = self.provider_id.clone();
        volume.driver_data = self.driver_data.clone().into_iter().collect();
    }

    /// Applies an update (already [`validate`]d): fields set, then fields cleared, then data set
    /// and removed. Refuses one that would leave more than [`MAX_DATA_KEYS`] data entries, and
    /// then changes nothing.
    pub fn apply(&mut self, update: &ModelUpdate) -> Result<(), String> {
        validate(update)?;
        let mut next = self.clone();
        if let Some(v) = &update.provider_location {
            next.provider_location = Some(v.clone());
        }
        if let Some(v) = &update.provider_auth {
            next.provider_auth = Some(v.clone());
        }
        if let Some(v) = &update.provider_id {
            next.provider_id = Some(v.clone());
        }
        for field in &update.clear {
            match field {
                VolumeField::ProviderLocation => next.provider_location = None,
                VolumeField::ProviderAuth => next.provider_auth = None,
                VolumeField::ProviderId => next.provider_id = None,
            }
        }
        for (k, v) in &update.set_data {
            next.driver_data.insert(k.clone(), v.clone());
        }
        for k in &update.remove_data {
            next.driver_data.remove(k);
        }
        if next.driver_data.len() > MAX_DATA_KEYS {
            return Err(format!("more than {MAX_DATA_KEYS} driver data entries"));
        }
        *self = next;
        Ok(())
    }
}

/// An update that changes nothing.
pub fn no_update() -> ModelUpdate {
    ModelUpdate {
        provider_location: None,
        provider_auth: None,
        provider_id: None,
        clear: Vec::new(),
        set_data: Vec::new(),
        remove_data: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_set_then_cleared_then_data_changes() {
        let mut f = VolumeFields::default();
        let update = ModelUpdate {
            provider_location: Some("loc".into()),
            provider_auth: Some("CHAP u s".into()),
            clear: vec![VolumeField::ProviderAuth],
            set_data: vec![("a".into(), "1".into()), ("b".into(), "2".into())],
            remove_data: vec!["b".into()],
            ..no_update()
        };
        f.apply(&update).unwrap();
        assert_eq!(f.provider_location.as_deref(), Some("loc"));
        assert_eq!(f.provider_auth, None);
        assert_eq!(f.driver_data, BTreeMap::from([("a".to_string(), "1".to_string())]));
    }

    #[test]
    fn a_merge_writes_what_the_flow_changed_and_keeps_what_another_writer_changed() {
        let data = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let read = VolumeFields {
            provider_location: Some("loc".into()),
            provider_auth: Some("CHAP u s".into()),
            provider_id: None,
            driver_data: data(&[("a", "1"), ("b", "2"), ("c", "3")]),
        };
        // The flow sets an initiator's entry, removes another, and rotates the credentials.
        let mut mine = read.clone();
        mine.provider_auth = Some("CHAP u t".into());
        mine.driver_data.insert("mine".into(), "x".into());
        mine.driver_data.remove("b");
        // Meanwhile another writer changed the location and other entries.
        let mut stored = read.clone();
        stored.provider_location = Some("moved".into());
        stored.driver_data.insert("theirs".into(), "y".into());
        stored.driver_data.insert("c".into(), "4".into());

        stored.merge(&read, &mine);
        assert_eq!(stored.provider_location.as_deref(), Some("moved"), "not changed by the flow: kept");
        assert_eq!(stored.provider_auth.as_deref(), Some("CHAP u t"), "changed by the flow: written");
        assert_eq!(stored.driver_data, data(&[("a", "1"), ("c", "4"), ("mine", "x"), ("theirs", "y")]));

        // A flow that changed nothing changes nothing.
        let before = stored.clone();
        stored.merge(&read, &read);
        assert_eq!(stored, before);
    }

    #[test]
    fn oversized_or_overfull_updates_are_refused_and_change_nothing() {
        let mut f = VolumeFields::default();
        let long = ModelUpdate { provider_location: Some("x".repeat(MAX_FIELD + 1)), ..no_update() };
        assert!(validate(&long).is_err());
        assert!(f.apply(&long).is_err());
        let empty_key = ModelUpdate { set_data: vec![(String::new(), "v".into())], ..no_update() };
        assert!(validate(&empty_key).is_err());
        for i in 0..MAX_DATA_KEYS {
            f.driver_data.insert(format!("k{i}"), String::new());
        }
        let before = f.clone();
        let one_more = ModelUpdate { set_data: vec![("extra".into(), "v".into())], ..no_update() };
        assert!(f.apply(&one_more).is_err());
        assert_eq!(f, before);
    }
}

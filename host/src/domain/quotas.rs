//! Volume quotas: what a project's volumes use, the limits on it, and the check of a change
//! against both, with Cinder's refusals (`VolumeLimitExceeded`,
//! `VolumeSizeExceedsAvailableQuota`, `VolumeSizeExceedsLimit`: 413 `overLimit`). Pure: the
//! store reads the limits and the use, and `attach/quotas.rs` runs the check in the transaction
//! that makes the change.
//!
//! The resources are Cinder's for volumes: `volumes` and `gigabytes` of the project,
//! `volumes_<type>` and `gigabytes_<type>` of each volume type, and `per_volume_gigabytes`, the
//! largest size of one volume. A resource without a limit, or with `-1`, is unlimited.

use std::collections::BTreeMap;

/// A limit that is none.
pub const UNLIMITED: i64 = -1;

/// The largest limit Cinder takes (its database's integer).
pub const MAX_LIMIT: i64 = i32::MAX as i64;

/// The limit on the size of one volume, which no use counts towards.
pub const PER_VOLUME: &str = "per_volume_gigabytes";

/// `volumes_<type>`: the number of volumes of a type.
pub fn volumes_of(volume_type: &str) -> String {
    format!("volumes_{volume_type}")
}

/// `gigabytes_<type>`: the GiB of the volumes of a type.
pub fn gigabytes_of(volume_type: &str) -> String {
    format!("gigabytes_{volume_type}")
}

/// What a project's volumes use, by volume type: how many and their GiB, and what the
/// operations in flight hold besides (the growth of a volume being extended: Cinder's
/// `reserved`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Usage {
    pub by_type: BTreeMap<String, (i64, i64)>,
    pub reserved_by_type: BTreeMap<String, (i64, i64)>,
}

/// What of `by_type` counts towards `resource` (0 for `per_volume_gigabytes` and unknown
/// resources).
fn counted(by_type: &BTreeMap<String, (i64, i64)>, resource: &str) -> i64 {
    let sum = |pick: fn(&(i64, i64)) -> i64| by_type.values().map(pick).sum();
    match resource {
        "volumes" => sum(|u| u.0),
        "gigabytes" => sum(|u| u.1),
        _ => by_type
            .iter()
            .find_map(|(t, u)| {
                if resource == volumes_of(t) {
                    Some(u.0)
                } else if resource == gigabytes_of(t) {
                    Some(u.1)
                } else {
                    None
                }
            })
            .unwrap_or(0),
    }
}

impl Usage {
    /// Adds `volumes` volumes and `gigabytes` GiB of `volume_type`.
    pub fn add(&mut self, volume_type: &str, volumes: i64, gigabytes: i64) {
        let entry = self.by_type.entry(volume_type.to_string()).or_default();
        entry.0 += volumes;
        entry.1 += gigabytes;
    }

    /// Adds `gigabytes` GiB of `volume_type` held by an operation in flight.
    pub fn reserve(&mut self, volume_type: &str, gigabytes: i64) {
        self.reserved_by_type.entry(volume_type.to_string()).or_default().1 += gigabytes;
    }

    /// What is in use of `resource`.
    pub fn in_use(&self, resource: &str) -> i64 {
        counted(&self.by_type, resource)
    }

    /// What operations in flight hold of `resource`.
    pub fn reserved(&self, resource: &str) -> i64 {
        counted(&self.reserved_by_type, resource)
    }

    /// What counts towards `resource`'s limit: in use and reserved.
    pub fn of(&self, resource: &str) -> i64 {
        self.in_use(resource) + self.reserved(resource)
    }
}

/// The limits that apply: a resource's hard limit, none (or `-1`) being unlimited.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Limits(pub BTreeMap<String, i64>);

impl Limits {
    /// `resource`'s limit, `-1` when it has none.
    pub fn get(&self, resource: &str) -> i64 {
        self.0.get(resource).copied().unwrap_or(UNLIMITED)
    }

    /// Whether any resource is limited.
    pub fn any(&self) -> bool {
        self.0.values().any(|&l| l != UNLIMITED)
    }

    /// These limits with `over`'s on top (a project's own over its class's).
    pub fn overlaid(mut self, over: BTreeMap<String, i64>) -> Limits {
        self.0.extend(over);
        self
    }
}

/// What a change adds to a project's use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<'a> {
    pub volume_type: &'a str,
    /// Volumes and GiB added to the project's totals.
    pub volumes: i64,
    pub gigabytes: i64,
    /// Volumes and GiB added to the type's.
    pub type_volumes: i64,
    pub type_gigabytes: i64,
    /// The size of the volume after the change, for `per_volume_gigabytes`.
    pub size_gib: Option<i64>,
}

impl<'a> Change<'a> {
    /// A volume of `size_gib` more (a create, or a volume transferred in).
    pub fn volume(volume_type: &'a str, size_gib: i64) -> Self {
        Change {
            volume_type,
            volumes: 1,
            gigabytes: size_gib,
            type_volumes: 1,
            type_gigabytes: size_gib,
            size_gib: Some(size_gib),
        }
    }

    /// A volume grown from `from_gib` to `to_gib` (an extend).
    pub fn growth(volume_type: &'a str, from_gib: i64, to_gib: i64) -> Self {
        let more = to_gib - from_gib;
        Change {
            volume_type,
            volumes: 0,
            gigabytes: more,
            type_volumes: 0,
            type_gigabytes: more,
            size_gib: Some(to_gib),
        }
    }

    /// A volume of `size_gib` given type `volume_type` (a retype: the totals stay, the old type's
    /// use goes down).
    pub fn new_type(volume_type: &'a str, size_gib: i64) -> Self {
        Change {
            volume_type,
            volumes: 0,
            gigabytes: 0,
            type_volumes: 1,
            type_gigabytes: size_gib,
            size_gib: None,
        }
    }
}

/// A change refused: it would pass a limit (Cinder's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverQuota {
    #[error("Maximum number of volumes allowed ({allowed}) exceeded for quota '{name}'.")]
    Volumes { name: String, allowed: i64 },
    #[error(
        "Requested volume or snapshot exceeds allowed {name} quota. \
         Requested {requested}G, quota is {quota}G and {consumed}G has been consumed."
    )]
    Gigabytes { name: String, requested: i64, quota: i64, consumed: i64 },
    #[error("Requested volume size {size}G is larger than maximum allowed limit {limit}G.")]
    VolumeSize { size: i64, limit: i64 },
}

/// Refuses `change` when, added to `usage`, it would pass one of `limits`: the size of one volume
/// first, then the number of volumes (the project's, the type's), then their GiB.
pub fn check(limits: &Limits, usage: &Usage, change: &Change) -> Result<(), OverQuota> {
    let per_volume = limits.get(PER_VOLUME);
    if let Some(size) = change.size_gib
        && per_volume != UNLIMITED
        && size > per_volume
    {
        return Err(OverQuota::VolumeSize { size, limit: per_volume });
    }
    let over = |name: &str, more: i64| {
        let limit = limits.get(name);
        (more > 0 && limit != UNLIMITED && usage.of(name) + more > limit).then_some(limit)
    };
    let volumes =
        [("volumes".to_string(), change.volumes), (volumes_of(change.volume_type), change.type_volumes)];
    for (name, more) in volumes {
        if let Some(allowed) = over(&name, more) {
            return Err(OverQuota::Volumes { name, allowed });
        }
    }
    let gigabytes = [
        ("gigabytes".to_string(), change.gigabytes),
        (gigabytes_of(change.volume_type), change.type_gigabytes),
    ];
    for (name, more) in gigabytes {
        if let Some(quota) = over(&name, more) {
            let consumed = usage.of(&name);
            return Err(OverQuota::Gigabytes { name, requested: more, quota, consumed });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(items: &[(&str, i64)]) -> Limits {
        Limits(items.iter().map(|(k, v)| (k.to_string(), *v)).collect())
    }

    fn usage(items: &[(&str, i64, i64)]) -> Usage {
        let mut u = Usage::default();
        for (t, v, g) in items {
            u.add(t, *v, *g);
        }
        u
    }

    #[test]
    fn usage_counts_the_project_and_each_type() {
        let mut u = usage(&[("fast", 2, 10), ("slow", 1, 5), ("fast", 1, 1)]);
        assert_eq!((u.of("volumes"), u.of("gigabytes")), (4, 16));
        assert_eq!((u.of("volumes_fast"), u.of("gigabytes_fast")), (3, 11));
        assert_eq!((u.of("volumes_slow"), u.of("gigabytes_none"), u.of(PER_VOLUME)), (1, 0, 0));
        u.reserve("slow", 4);
        assert_eq!((u.in_use("gigabytes"), u.reserved("gigabytes"), u.of("gigabytes")), (16, 4, 20));
        assert_eq!(
            (u.reserved("gigabytes_slow"), u.reserved("gigabytes_fast"), u.reserved("volumes")),
            (4, 0, 0)
        );
    }

    #[test]
    fn a_change_within_every_limit_passes_and_unlimited_is_no_limit() {
        let u = usage(&[("fast", 2, 10)]);
        assert_eq!(check(&Limits::default(), &u, &Change::volume("fast", 1000)), Ok(()));
        let l = limits(&[("volumes", 3), ("gigabytes", 20), ("volumes_fast", -1), (PER_VOLUME, 10)]);
        assert_eq!(check(&l, &u, &Change::volume("fast", 10)), Ok(()), "exactly at the limits");
        assert!(l.any());
        assert!(!limits(&[("volumes", -1)]).any());
    }

    #[test]
    fn each_limit_refuses_with_cinders_message() {
        let u = usage(&[("fast", 2, 10), ("slow", 1, 1)]);
        let refused = |l: &[(&str, i64)], c: Change| check(&limits(l), &u, &c).unwrap_err().to_string();
        assert_eq!(
            refused(&[("volumes", 3)], Change::volume("fast", 1)),
            "Maximum number of volumes allowed (3) exceeded for quota 'volumes'."
        );
        assert_eq!(
            refused(&[("volumes_fast", 2)], Change::volume("fast", 1)),
            "Maximum number of volumes allowed (2) exceeded for quota 'volumes_fast'."
        );
        assert_eq!(
            refused(&[("gigabytes", 15)], Change::volume("slow", 5)),
            "Requested volume or snapshot exceeds allowed gigabytes quota. \
             Requested 5G, quota is 15G and 11G has been consumed."
        );
        assert_eq!(
            refused(&[("gigabytes_fast", 12)], Change::growth("fast", 4, 7)),
            "Requested volume or snapshot exceeds allowed gigabytes_fast \
             quota. Requested 3G, quota is 12G and 10G has been consumed."
        );
        assert_eq!(
            refused(&[(PER_VOLUME, 5), ("volumes", 0)], Change::growth("fast", 4, 7)),
            "Requested volume size 7G is larger than maximum allowed limit 5G."
        );
    }

    #[test]
    fn a_retype_counts_against_the_new_type_only_and_a_growth_adds_no_volume() {
        let u = usage(&[("fast", 2, 10), ("slow", 1, 4)]);
        let l = limits(&[("volumes", 3), ("gigabytes", 14), ("volumes_fast", 3), ("gigabytes_fast", 13)]);
        assert_eq!(check(&l, &u, &Change::new_type("fast", 3)), Ok(()));
        let over = check(&l, &u, &Change::new_type("fast", 4)).unwrap_err();
        assert!(
            matches!(over, OverQuota::Gigabytes { ref name, requested: 4, quota: 13, consumed: 10 } if name == "gigabytes_fast")
        );
        assert_eq!(
            check(&limits(&[("volumes", 3), (PER_VOLUME, 1)]), &u, &Change::new_type("slow", 9)),
            Ok(())
        );
        assert_eq!(
            check(&limits(&[("volumes", 3), ("gigabytes", 20)]), &u, &Change::growth("fast", 1, 7)),
            Ok(())
        );
    }
}

//! Room on a thinly provisioned backend: whether its filesystem can take `n` GiB more of volumes,
//! as Cinder's scheduler decides it for thin provisioning (`CapacityFilter`): the volumes' sizes
//! may add up to `max_over_subscription_ratio` times the filesystem's size, and what is asked
//! must fit in the free space beyond `reserved_percentage` times that ratio. Pure: the host reads
//! the filesystem (`capabilities/backing`) and the volumes (`store::volumes::provisioned`).

/// A backend's filesystem and what its volumes take of it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Room {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// The sizes of its live volumes, added up.
    pub provisioned_gib: i64,
    pub max_over_subscription_ratio: f64,
    pub reserved_percentage: u32,
}

/// `bytes` in GiB.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

impl Room {
    /// The filesystem's size in GiB.
    pub fn total_gib(&self) -> f64 {
        gib(self.total_bytes)
    }

    /// Its free space in GiB, less the reserved share of its size.
    pub fn free_gib(&self) -> f64 {
        let reserved = (self.total_gib() * f64::from(self.reserved_percentage) / 100.0).floor();
        gib(self.free_bytes) - reserved
    }

    /// Refuses `requested_gib` more, saying why.
    pub fn take(&self, requested_gib: i64) -> Result<(), String> {
        let (total, free, ratio) = (self.total_gib(), self.free_gib(), self.max_over_subscription_ratio);
        if total <= 0.0 {
            return Err("its filesystem reports no size".to_string());
        }
        let provisioned = (self.provisioned_gib + requested_gib) as f64;
        if provisioned / total > ratio {
            return Err(format!(
                "its volumes would add up to {provisioned} GiB, more than {ratio} times its filesystem's {total:.1} GiB \
                 (max_over_subscription_ratio)"
            ));
        }
        if free * ratio < requested_gib as f64 {
            return Err(format!(
                "{free:.1} GiB of its filesystem are free (beyond reserved_percentage {}), which {ratio} times \
                 (max_over_subscription_ratio) is less than {requested_gib} GiB",
                self.reserved_percentage
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn room(total_gib: u64, free_gib: u64, provisioned_gib: i64, ratio: f64, reserved: u32) -> Room {
        Room {
            total_bytes: total_gib * G,
            free_bytes: free_gib * G,
            provisioned_gib,
            max_over_subscription_ratio: ratio,
            reserved_percentage: reserved,
        }
    }

    #[test]
    fn volumes_may_add_up_to_the_ratio_times_the_filesystem() {
        assert_eq!(room(100, 90, 1990, 20.0, 0).take(10), Ok(()), "exactly 20 times");
        let why = room(100, 90, 1991, 20.0, 0).take(10).unwrap_err();
        assert_eq!(
            why,
            "its volumes would add up to 2001 GiB, more than 20 times its filesystem's 100.0 GiB \
             (max_over_subscription_ratio)"
        );
        assert!(room(100, 90, 0, 1.0, 0).take(101).is_err(), "thick: no more than the filesystem");
    }

    #[test]
    fn what_is_asked_must_fit_the_free_space_beyond_the_reserve_times_the_ratio() {
        assert_eq!(room(100, 1, 0, 20.0, 0).take(20), Ok(()));
        assert!(room(100, 1, 0, 20.0, 0).take(21).is_err());
        let why = room(100, 10, 0, 20.0, 10).take(1).unwrap_err();
        assert!(
            why.starts_with("0.0 GiB of its filesystem are free (beyond reserved_percentage 10)"),
            "{why}"
        );
        assert_eq!(room(100, 11, 0, 1.0, 10).take(1), Ok(()));
        assert_eq!(room(0, 0, 0, 20.0, 0).take(1).unwrap_err(), "its filesystem reports no size");
    }
}

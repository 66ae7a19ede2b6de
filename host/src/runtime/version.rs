//! The versions of the driver contract this host implements (`wit/driver@<version>/`).

/// The contract versions this host implements, newest first. A driver built for any `0.2.x` or
/// `0.1.x` is accepted and bound to its own version's adapter.
pub(super) const CONTRACTS: &[ContractVersion] =
    &[ContractVersion::V0_3, ContractVersion::V0_2, ContractVersion::V0_1];

/// The newest contract version, the one new drivers should be built for.
pub const CONTRACT: &str = ContractVersion::LATEST.name();

/// A version of the driver contract (`wit/driver@<version>/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContractVersion {
    V0_1,
    V0_2,
    V0_3,
}

impl ContractVersion {
    pub const LATEST: ContractVersion = ContractVersion::V0_3;

    /// `berth:driver@0.3.0`.
    pub const fn name(self) -> &'static str {
        match self {
            ContractVersion::V0_1 => "berth:driver@0.1.0",
            ContractVersion::V0_2 => "berth:driver@0.2.0",
            ContractVersion::V0_3 => "berth:driver@0.3.0",
        }
    }

    /// `(0, 3)`.
    pub const fn minor(self) -> (u32, u32) {
        match self {
            ContractVersion::V0_1 => (0, 1),
            ContractVersion::V0_2 => (0, 2),
            ContractVersion::V0_3 => (0, 3),
        }
    }

    /// `0.2.0`.
    pub fn version(self) -> &'static str {
        self.name().trim_start_matches("berth:driver@")
    }

    /// The versions an interface version belongs to: `0.2.x` is 0.2, `0.1.x` is 0.1.
    pub fn of(version: &str) -> Option<ContractVersion> {
        if version.starts_with("0.3.") {
            Some(ContractVersion::V0_3)
        } else if version.starts_with("0.2.") {
            Some(ContractVersion::V0_2)
        } else if version.starts_with("0.1.") {
            Some(ContractVersion::V0_1)
        } else {
            None
        }
    }

    /// The export a driver built for this version has.
    pub(super) fn export(self) -> &'static str {
        match self {
            ContractVersion::V0_1 => "berth:driver/driver@0.1.0",
            ContractVersion::V0_2 => "berth:driver/driver@0.2.0",
            ContractVersion::V0_3 => "berth:driver/driver@0.3.0",
        }
    }

    /// Every version this host implements, for messages.
    pub fn supported() -> String {
        CONTRACTS.iter().map(|c| c.name()).collect::<Vec<_>>().join(" and ")
    }
}

impl std::fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

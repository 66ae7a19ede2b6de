//! User messages as Cinder words them (`cinder/message/message_field.py`): an action (what was
//! being done) and a detail (what went wrong), each with Cinder's id, so that a message reads the
//! same in any client, and its event id (`VOLUME_<resource>_<action>_<detail>`) is Cinder's. The
//! driver's own words are never in a message: as in Cinder, they may say more of the backend than
//! a project's users may read.

/// The resource a message is about (Berth's are all volumes).
pub const RESOURCE_VOLUME: &str = "VOLUME";

/// What was being done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    UpdateAttachment,
    ExtendVolume,
    CreateVolumeFromBackend,
}

/// Cinder's actions: id and words (those Berth records, and the others, which a message written
/// by Cinder into a database Berth took over may name).
const ACTIONS: &[(&str, &str)] = &[
    ("001", "schedule allocate volume"),
    ("002", "attach volume"),
    ("003", "copy volume to image"),
    ("004", "update attachment"),
    ("005", "copy image to volume"),
    ("006", "unmanage volume"),
    ("007", "extend volume"),
    ("008", "create volume from backend storage"),
    ("009", "create snapshot"),
    ("010", "delete snapshot"),
    ("011", "update snapshot"),
    ("012", "update snapshot metadata"),
    ("013", "create backup"),
    ("014", "delete backup"),
    ("015", "restore backup"),
    ("016", "reimage volume"),
];

impl Action {
    pub fn id(self) -> &'static str {
        match self {
            Action::UpdateAttachment => "004",
            Action::ExtendVolume => "007",
            Action::CreateVolumeFromBackend => "008",
        }
    }
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    NotifyComputeServiceFailed,
    DriverFailedExtend,
    DriverFailedCreate,
    AttachError,
    DetachError,
}

/// Cinder's details that Berth records, and the unknown error's: id and words.
const DETAILS: &[(&str, &str)] = &[
    ("001", "An unknown error occurred."),
    ("009", "Compute service failed to extend volume."),
    ("010", "Volume Driver failed to extend volume."),
    ("012", "Driver failed to create the volume."),
    ("021", "Failed to attach volume."),
    ("022", "Failed to detach volume."),
];

impl Detail {
    pub fn id(self) -> &'static str {
        match self {
            Detail::NotifyComputeServiceFailed => "009",
            Detail::DriverFailedExtend => "010",
            Detail::DriverFailedCreate => "012",
            Detail::AttachError => "021",
            Detail::DetachError => "022",
        }
    }
}

/// Cinder's event id of a message.
pub fn event_id(resource_type: &str, action_id: &str, detail_id: &str) -> String {
    format!("VOLUME_{resource_type}_{action_id}_{detail_id}")
}

/// What a user reads (`user_message`), as Cinder builds it: `<action>:<detail>`, an unknown action
/// as `unknown action` and an unknown detail as the unknown error.
pub fn user_message(action_id: &str, detail_id: &str) -> String {
    let action = ACTIONS.iter().find(|(id, _)| *id == action_id).map_or("unknown action", |(_, a)| a);
    let detail = DETAILS.iter().find(|(id, _)| *id == detail_id).map_or(DETAILS[0].1, |(_, d)| d);
    format!("{action}:{detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_reads_as_cinders() {
        let (a, d) = (Action::CreateVolumeFromBackend, Detail::DriverFailedCreate);
        assert_eq!(
            user_message(a.id(), d.id()),
            "create volume from backend storage:Driver failed to create the volume."
        );
        assert_eq!(event_id(RESOURCE_VOLUME, a.id(), d.id()), "VOLUME_VOLUME_008_012");
        assert_eq!(user_message("099", "099"), "unknown action:An unknown error occurred.");
        for action in [Action::UpdateAttachment, Action::ExtendVolume, a] {
            assert!(ACTIONS.iter().any(|(id, _)| *id == action.id()), "{action:?}");
        }
        for detail in [
            Detail::NotifyComputeServiceFailed,
            Detail::DriverFailedExtend,
            d,
            Detail::AttachError,
            Detail::DetachError,
        ] {
            assert!(DETAILS.iter().any(|(id, _)| *id == detail.id()), "{detail:?}");
        }
    }
}

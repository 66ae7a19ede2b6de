//! The state machine of volumes and attachments: status enums, one transition table, and the
//! function that derives a volume's status from its live attachments. Pure: no I/O, no HTTP, no
//! SQL. Every conditional update in the store takes its `WHERE status IN (...)` from here.
//!
//! Differences from Cinder 29 (cinder-compat.md 2.2, 11), on purpose:
//! - A multiattach volume may be reserved while it is `reserved` or `attaching` too, so that
//!   concurrent attaches to it all succeed (Cinder refuses all but one with a 400).
//! - The volume's status is always derived from its live attachments in the same transaction
//!   (the least advanced attachment wins: attaching > reserved > in-use), at create time and at
//!   delete time alike (Cinder uses one rule at create and the opposite at delete).
//! - Attachments in `error_attaching`/`error_detaching` keep the volume `in-use`: access may still
//!   exist, so the volume is not offered for a new attach or a delete until they are cleaned up
//!   (Cinder ignores them and can show `available` with access still granted, LP 1935057).
//! - `os-complete` needs a connected attachment (`attaching` or `attached`).

use std::fmt;

macro_rules! status_enum {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            pub fn parse(text: &str) -> Option<$name> {
                match text {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

status_enum!(
    /// A volume's `status` (Cinder's `VolumeStatus`, the subset Berth uses).
    VolumeStatus {
        Creating => "creating",
        Available => "available",
        Reserved => "reserved",
        Attaching => "attaching",
        InUse => "in-use",
        Detaching => "detaching",
        Deleting => "deleting",
        Error => "error",
        ErrorDeleting => "error_deleting",
    }
);

status_enum!(
    /// A volume's `attach_status` column (not shown in the API).
    VolumeAttachStatus {
        Detached => "detached",
        Reserved => "reserved",
        Attaching => "attaching",
        Attached => "attached",
    }
);

status_enum!(
    /// An attachment's `attach_status` (Cinder's `VolumeAttachStatus`).
    AttachStatus {
        Reserved => "reserved",
        Attaching => "attaching",
        Attached => "attached",
        ErrorAttaching => "error_attaching",
        ErrorDetaching => "error_detaching",
        Detached => "detached",
    }
);

/// Something that happens to a volume or one of its attachments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A new attachment is reserved (attachment create; legacy `os-reserve`).
    Reserve,
    /// An attachment gets a connector and a connection (attachment update or a create with a
    /// connector; legacy `os-initialize_connection` on a reserved attachment).
    Connect,
    /// The consumer says it is using the connection (`os-complete`; legacy `os-attach`).
    Complete,
    /// Connecting failed and could not be undone.
    FailAttach,
    /// Disconnecting failed.
    FailDetach,
    /// An attachment is removed (attachment delete; legacy `os-detach`, `os-unreserve`).
    Remove,
    /// Legacy `os-begin_detaching`: the volume is locked for a detach.
    BeginDetaching,
    /// Legacy `os-roll_detaching`: the detach is abandoned.
    RollDetaching,
    /// A volume is deleted.
    DeleteVolume,
}

/// One row of the transition table.
#[derive(Debug, Clone, Copy)]
pub struct Transition {
    pub event: Event,
    /// Volume statuses the event may start from, for a volume that is not multiattach.
    pub volume_from: &'static [VolumeStatus],
    /// Volume statuses the event may start from, for a multiattach volume.
    pub volume_from_multiattach: &'static [VolumeStatus],
    /// Attachment statuses the event may start from (empty: the event creates the attachment or
    /// concerns only the volume).
    pub attachment_from: &'static [AttachStatus],
    /// The attachment's status afterwards (`None`: unchanged, or removed).
    pub attachment_to: Option<AttachStatus>,
}

use AttachStatus as A;
use VolumeStatus as V;

/// Statuses in which a volume has, or is getting, attachments.
const ATTACHED: &[VolumeStatus] = &[V::Reserved, V::Attaching, V::InUse];
const LIVE: &[AttachStatus] = &[A::Reserved, A::Attaching, A::Attached, A::ErrorAttaching, A::ErrorDetaching];

/// The transition table.
pub const TRANSITIONS: &[Transition] = &[
    Transition {
        event: Event::Reserve,
        volume_from: &[V::Available],
        volume_from_multiattach: &[V::Available, V::Reserved, V::Attaching, V::InUse],
        attachment_from: &[],
        attachment_to: Some(A::Reserved),
    },
    Transition {
        event: Event::Connect,
        volume_from: ATTACHED,
        volume_from_multiattach: ATTACHED,
        attachment_from: &[A::Reserved, A::Attaching, A::Attached, A::ErrorAttaching],
        attachment_to: Some(A::Attaching),
    },
    Transition {
        event: Event::Complete,
        volume_from: &[V::Attaching, V::InUse, V::Reserved],
        volume_from_multiattach: &[V::Attaching, V::InUse, V::Reserved],
        attachment_from: &[A::Attaching, A::Attached],
        attachment_to: Some(A::Attached),
    },
    Transition {
        event: Event::FailAttach,
        volume_from: ATTACHED,
        volume_from_multiattach: ATTACHED,
        attachment_from: &[A::Reserved, A::Attaching, A::Attached, A::ErrorAttaching],
        attachment_to: Some(A::ErrorAttaching),
    },
    Transition {
        event: Event::FailDetach,
        volume_from: &[V::Reserved, V::Attaching, V::InUse, V::Detaching],
        volume_from_multiattach: &[V::Reserved, V::Attaching, V::InUse, V::Detaching],
        attachment_from: LIVE,
        attachment_to: Some(A::ErrorDetaching),
    },
    Transition {
        event: Event::Remove,
        volume_from: &[V::Reserved, V::Attaching, V::InUse, V::Detaching],
        volume_from_multiattach: &[V::Reserved, V::Attaching, V::InUse, V::Detaching],
        attachment_from: LIVE,
        attachment_to: None,
    },
    Transition {
        event: Event::BeginDetaching,
        volume_from: &[V::InUse],
        volume_from_multiattach: &[V::InUse],
        attachment_from: &[],
        attachment_to: None,
    },
    Transition {
        event: Event::RollDetaching,
        volume_from: &[V::Detaching],
        volume_from_multiattach: &[V::Detaching],
        attachment_from: &[],
        attachment_to: None,
    },
    Transition {
        event: Event::DeleteVolume,
        volume_from: &[V::Available, V::Error, V::ErrorDeleting],
        volume_from_multiattach: &[V::Available, V::Error, V::ErrorDeleting],
        attachment_from: &[],
        attachment_to: None,
    },
];

/// The table's row for an event.
pub fn transition(event: Event) -> &'static Transition {
    TRANSITIONS.iter().find(|t| t.event == event).expect("every event has a row in the table")
}

impl Transition {
    /// The volume statuses this event may start from.
    pub fn volume_from(&self, multiattach: bool) -> &'static [VolumeStatus] {
        if multiattach { self.volume_from_multiattach } else { self.volume_from }
    }

    /// The same, as text for a conditional update.
    pub fn volume_from_text(&self, multiattach: bool) -> Vec<&'static str> {
        self.volume_from(multiattach).iter().map(|s| s.as_str()).collect()
    }

    pub fn attachment_from_text(&self) -> Vec<&'static str> {
        self.attachment_from.iter().map(|s| s.as_str()).collect()
    }

    pub fn allows(&self, volume: VolumeStatus, multiattach: bool) -> bool {
        self.volume_from(multiattach).contains(&volume)
    }
}

/// How an attachment counts towards its volume's status. A legacy reservation (`os-reserve`)
/// counts as `attaching`, as in Cinder, where `os-reserve` sets the volume `attaching`; a
/// reservation by the attachments API makes it `reserved`.
pub fn as_seen(status: AttachStatus, legacy: bool) -> AttachStatus {
    if legacy && status == A::Reserved { A::Attaching } else { status }
}

/// A volume's status and attach status, derived from the statuses of its live attachments.
/// `detaching` keeps a legacy detach lock (`os-begin_detaching`) while attachments remain.
pub fn settle(attachments: &[AttachStatus], detaching: bool) -> (VolumeStatus, VolumeAttachStatus) {
    let any = |s: AttachStatus| attachments.contains(&s);
    if attachments.is_empty() {
        (V::Available, VolumeAttachStatus::Detached)
    } else if detaching {
        (V::Detaching, VolumeAttachStatus::Attached)
    } else if any(A::Attaching) {
        (V::Attaching, VolumeAttachStatus::Attaching)
    } else if any(A::Reserved) {
        (V::Reserved, VolumeAttachStatus::Reserved)
    } else {
        (V::InUse, VolumeAttachStatus::Attached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_round_trips_through_text() {
        for s in VolumeStatus::ALL {
            assert_eq!(VolumeStatus::parse(s.as_str()), Some(*s));
        }
        for s in AttachStatus::ALL {
            assert_eq!(AttachStatus::parse(s.as_str()), Some(*s));
        }
        assert_eq!(VolumeStatus::parse("in-use"), Some(V::InUse));
        assert_eq!(VolumeStatus::parse("bogus"), None);
    }

    #[test]
    fn every_event_has_exactly_one_row() {
        use Event::*;
        for e in [
            Reserve,
            Connect,
            Complete,
            FailAttach,
            FailDetach,
            Remove,
            BeginDetaching,
            RollDetaching,
            DeleteVolume,
        ] {
            assert_eq!(TRANSITIONS.iter().filter(|t| t.event == e).count(), 1, "{e:?}");
        }
    }

    /// (volume status, multiattach, may a new attachment be reserved?)
    #[test]
    fn reserve_follows_the_table() {
        let cases = [
            (V::Available, false, true),
            (V::Available, true, true),
            (V::Reserved, false, false),
            (V::Reserved, true, true),
            (V::Attaching, false, false),
            (V::Attaching, true, true),
            (V::InUse, false, false),
            (V::InUse, true, true),
            (V::Detaching, true, false),
            (V::Creating, false, false),
            (V::Error, true, false),
            (V::Deleting, true, false),
        ];
        for (status, multi, allowed) in cases {
            assert_eq!(
                transition(Event::Reserve).allows(status, multi),
                allowed,
                "{status} multiattach={multi}"
            );
        }
    }

    /// (attachment statuses, detaching lock) -> (volume status, volume attach status)
    #[test]
    fn volume_status_is_derived_from_live_attachments() {
        use VolumeAttachStatus as VA;
        let cases: &[(&[AttachStatus], bool, VolumeStatus, VA)] = &[
            (&[], false, V::Available, VA::Detached),
            (&[], true, V::Available, VA::Detached),
            (&[A::Reserved], false, V::Reserved, VA::Reserved),
            (&[A::Attaching], false, V::Attaching, VA::Attaching),
            (&[A::Attached], false, V::InUse, VA::Attached),
            (&[A::Attached, A::Reserved], false, V::Reserved, VA::Reserved),
            (&[A::Attached, A::Attaching], false, V::Attaching, VA::Attaching),
            (&[A::Attached, A::Reserved, A::Attaching], false, V::Attaching, VA::Attaching),
            (&[A::ErrorAttaching], false, V::InUse, VA::Attached),
            (&[A::ErrorDetaching, A::Attached], false, V::InUse, VA::Attached),
            (&[A::Attached], true, V::Detaching, VA::Attached),
        ];
        for (rows, detaching, status, attach) in cases {
            assert_eq!(settle(rows, *detaching), (*status, *attach), "{rows:?} detaching={detaching}");
        }
    }

    #[test]
    fn a_legacy_reservation_shows_the_volume_attaching() {
        assert_eq!(settle(&[as_seen(A::Reserved, true)], false).0, V::Attaching);
        assert_eq!(settle(&[as_seen(A::Reserved, false)], false).0, V::Reserved);
        for s in [A::Attaching, A::Attached, A::ErrorAttaching, A::ErrorDetaching] {
            assert_eq!(as_seen(s, true), s);
        }
    }

    #[test]
    fn only_connected_attachments_complete() {
        let t = transition(Event::Complete);
        assert!(t.attachment_from.contains(&A::Attaching));
        assert!(t.attachment_from.contains(&A::Attached));
        assert!(!t.attachment_from.contains(&A::Reserved));
        assert_eq!(t.attachment_to, Some(A::Attached));
    }

    #[test]
    fn a_volume_with_attachments_or_in_transition_cannot_be_deleted() {
        let t = transition(Event::DeleteVolume);
        for s in [V::Reserved, V::Attaching, V::InUse, V::Detaching, V::Creating, V::Deleting] {
            assert!(!t.allows(s, false) && !t.allows(s, true), "{s}");
        }
    }
}

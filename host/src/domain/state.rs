//! The state machine of volumes and attachments: status enums, one transition table, and the
//! function that derives a volume's status from its live attachments. Pure: no I/O, no HTTP, no
//! SQL. Every conditional update in the store takes its `WHERE status IN (...)` from a row of
//! this table, and every status it writes is the row's target or [`settle`]'s answer.
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
//! - `os-complete` needs a connected attachment (`attaching` or `attached`), or a reservation
//!   that has no connector at all (Nova's shelved-offloaded servers: the connector comes later,
//!   with an update); a reservation whose connect is under way cannot be completed.
//! - Nova's live migration (`ReserveForMigration`) is a row of its own, and the database bounds
//!   it: a non-multiattach volume has at most one attachment per [`Slot`].

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
    /// A volume's `status` (Cinder's `VolumeStatus`, the subset Berth uses). `deleted` is a
    /// deleted row's (kept, as in Cinder), `unmanaged` that of a row whose volume Berth stopped
    /// managing (`os-unmanage`: its data is left on the backend); no event starts from either.
    VolumeStatus {
        Creating => "creating",
        Available => "available",
        Reserved => "reserved",
        Attaching => "attaching",
        InUse => "in-use",
        Detaching => "detaching",
        Deleting => "deleting",
        Extending => "extending",
        Error => "error",
        ErrorDeleting => "error_deleting",
        AwaitingTransfer => "awaiting-transfer",
        Deleted => "deleted",
        Unmanaged => "unmanaged",
    }
);

impl VolumeStatus {
    /// A deleted row's status: the volume is gone from the API (deleted or unmanaged).
    pub fn is_gone(self) -> bool {
        matches!(self, VolumeStatus::Deleted | VolumeStatus::Unmanaged)
    }
}

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

/// Which slot of a non-multiattach volume an attachment holds (the `exclusive` column): the
/// database allows one live attachment per slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// An attachment of a multiattach volume: no limit.
    Shared,
    /// The one attachment of a non-multiattach volume.
    Exclusive,
    /// The destination of a Nova live migration: a second attachment for the same instance.
    Migration,
}

impl Slot {
    pub fn code(self) -> i64 {
        match self {
            Slot::Shared => 0,
            Slot::Exclusive => 1,
            Slot::Migration => 2,
        }
    }

    pub fn from_code(code: i64) -> Option<Slot> {
        match code {
            0 => Some(Slot::Shared),
            1 => Some(Slot::Exclusive),
            2 => Some(Slot::Migration),
            _ => None,
        }
    }
}

/// Something that happens to a volume or one of its attachments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A volume row is created (`POST /volumes`), before the driver allocates it.
    CreateVolume,
    /// The driver allocated the volume.
    VolumeCreated,
    /// The driver could not allocate the volume.
    CreateFailed,
    /// A volume without attachments starts being deleted.
    DeleteVolume,
    /// An admin's forced delete, which also takes volumes stuck in `creating` or `deleting`.
    ForceDeleteVolume,
    /// The driver released the volume: the row is deleted.
    VolumeDeleted,
    /// The driver could not release the volume.
    DeleteFailed,
    /// An admin's `os-unmanage`: Berth forgets a volume without attachments and leaves its data
    /// on the backend (its export is removed first, where a node can run its driver).
    Unmanage,
    /// An available volume is offered to another project (a transfer is created).
    OfferTransfer,
    /// The offer is withdrawn (the transfer deleted): available to its project again.
    CancelTransfer,
    /// Another project presented the transfer's key: the volume is available, and its.
    AcceptTransfer,
    /// The volume gets another volume type of its backend (`os-retype`); nothing else changes.
    Retype,
    /// An available volume starts growing (`os-extend`).
    ExtendVolume,
    /// A volume in use starts growing (`os-extend` from 3.42, on a backend that extends attached
    /// volumes); its attachments stay as they are.
    ExtendAttached,
    /// The driver grew the volume: it is available, or in use, at its new size.
    VolumeExtended,
    /// The driver could not grow it: it is available, or in use, at its old size (the extend may
    /// be tried again; Cinder's `error_extending` would need an admin's reset).
    ExtendFailed,
    /// A new attachment is reserved (attachment create; legacy `os-reserve`).
    Reserve,
    /// Nova's live migration: a non-multiattach volume in use gets a second attachment for the
    /// same instance (the destination host's). Both stay live until Nova deletes one.
    ReserveForMigration,
    /// An attachment gets a connector and a connection (attachment update or a create with a
    /// connector; legacy `os-initialize_connection` on a reserved attachment).
    Connect,
    /// A connect that failed (or was interrupted) after its reservation was acknowledged is
    /// undone: the attachment is reserved again, without connector.
    UndoConnect,
    /// The same for an attachment that was completed without a connection
    /// ([`Event::CompleteUnconnected`]): it is `attached` again, without connector.
    UndoConnectUnconnected,
    /// The consumer says it is using the connection (`os-complete`; legacy `os-attach`).
    Complete,
    /// `os-complete` of a reservation that has no connector: Nova attaches a volume to a
    /// shelved-offloaded server this way, and gives the connector later, at unshelve, with an
    /// update. The attachment is `attached` with no connection, owed no access, until then.
    CompleteUnconnected,
    /// Connecting failed and could not be undone.
    FailAttach,
    /// Disconnecting failed.
    FailDetach,
    /// An attachment is removed (attachment delete; legacy `os-unreserve`, a reservation's
    /// `os-terminate_connection`). A legacy detach lock stays.
    Remove,
    /// Legacy `os-detach`, and attachment delete: the attachment is removed and the detach lock
    /// released (Nova detaches with `os-begin_detaching` and then `DELETE /attachments/{id}`;
    /// Cinder's `attachment_delete` puts a volume that other attachments keep back to `in-use`).
    Detach,
    /// Legacy `os-terminate_connection` of a completed attachment: its access is revoked and its
    /// connector cleared; the row stays for `os-detach`.
    Terminate,
    /// An admin's `os-force_detach`: access is revoked and the attachments removed.
    ForceDetach,
    /// Legacy `os-begin_detaching`: the volume is locked for a detach.
    BeginDetaching,
    /// Legacy `os-roll_detaching`: the detach is abandoned.
    RollDetaching,
    /// A connector that no connected attachment holds loses the access the backend may still give
    /// it (legacy `os-terminate_connection` of a connector no attachment has; the reconciler's
    /// revocation of an ACL entry nobody needs). Only the volume's driver fields change.
    Revoke,
    /// The driver's fields of a volume are written back after calls that change nothing else
    /// (a replayed connection, a repair).
    Refresh,
    /// The user's fields of a volume change: its name, description or metadata
    /// (`PUT /volumes/{id}`, the metadata calls). Nothing a driver or an attachment sees.
    Update,
}

/// Which rows an event starts from.
#[derive(Debug, Clone, Copy)]
pub enum Rows<S: 'static> {
    /// The event creates the row.
    New,
    /// Rows in one of these statuses.
    In(&'static [S]),
}

/// What an event makes of the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeTo {
    /// Derived from its live attachments ([`settle`]). `keep_detaching`: a legacy detach lock
    /// (`detaching`) stays while attachments remain.
    Settle {
        keep_detaching: bool,
    },
    Set(VolumeStatus, VolumeAttachStatus),
    Unchanged,
    /// The volume row is deleted.
    Removed,
    /// The volume row is deleted and its data is left on the backend: nothing may remove it.
    Unmanaged,
}

/// What an event makes of an attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachTo {
    Set(AttachStatus),
    Unchanged,
    /// The attachment is deleted.
    Removed,
}

/// One row of the transition table.
#[derive(Debug, Clone, Copy)]
pub struct Transition {
    pub event: Event,
    /// Volume statuses the event may start from, for a volume that is not multiattach.
    pub volume_from: Rows<VolumeStatus>,
    /// The same for a multiattach volume.
    pub volume_from_multiattach: Rows<VolumeStatus>,
    pub volume_to: VolumeTo,
    /// The attachment the event concerns: from which statuses, to what. `None`: the event
    /// concerns only the volume.
    pub attachment: Option<(Rows<AttachStatus>, AttachTo)>,
}

use AttachStatus as A;
use VolumeAttachStatus as VA;
use VolumeStatus as V;

/// Statuses in which a volume has, or is getting, attachments.
const ATTACHED: &[VolumeStatus] = &[V::Reserved, V::Attaching, V::InUse];
/// The same, and a legacy detach lock.
const ATTACHED_OR_DETACHING: &[VolumeStatus] = &[V::Reserved, V::Attaching, V::InUse, V::Detaching];
/// Attachments that are not deleted.
pub const LIVE: &[AttachStatus] =
    &[A::Reserved, A::Attaching, A::Attached, A::ErrorAttaching, A::ErrorDetaching];
/// Attachments a connect may start from.
const CONNECTABLE: &[AttachStatus] = &[A::Reserved, A::Attaching, A::Attached, A::ErrorAttaching];
const DELETABLE: &[VolumeStatus] = &[V::Available, V::Error, V::ErrorDeleting];
const SETTLE: VolumeTo = VolumeTo::Settle { keep_detaching: true };

const fn both(from: &'static [VolumeStatus]) -> (Rows<VolumeStatus>, Rows<VolumeStatus>) {
    (Rows::In(from), Rows::In(from))
}

macro_rules! row {
    ($event:ident, $volume:expr, $to:expr, $attachment:expr) => {
        Transition {
            event: Event::$event,
            volume_from: $volume.0,
            volume_from_multiattach: $volume.1,
            volume_to: $to,
            attachment: $attachment,
        }
    };
}

/// The transition table.
pub const TRANSITIONS: &[Transition] = &[
    row!(
        CreateVolume,
        (Rows::<VolumeStatus>::New, Rows::<VolumeStatus>::New),
        VolumeTo::Set(V::Creating, VA::Detached),
        None
    ),
    row!(VolumeCreated, both(&[V::Creating]), VolumeTo::Set(V::Available, VA::Detached), None),
    row!(CreateFailed, both(&[V::Creating]), VolumeTo::Set(V::Error, VA::Detached), None),
    row!(DeleteVolume, both(DELETABLE), VolumeTo::Set(V::Deleting, VA::Detached), None),
    row!(
        ForceDeleteVolume,
        both(&[V::Available, V::Error, V::ErrorDeleting, V::Creating, V::Deleting]),
        VolumeTo::Set(V::Deleting, VA::Detached),
        None
    ),
    row!(VolumeDeleted, both(&[V::Deleting]), VolumeTo::Removed, None),
    row!(DeleteFailed, both(&[V::Deleting]), VolumeTo::Set(V::ErrorDeleting, VA::Detached), None),
    // Cinder unmanages from `available` and `error` (and its own `error_*` states); a volume in
    // `error_deleting` too here, where no `os-reset_status` would take it out of that first.
    row!(Unmanage, both(DELETABLE), VolumeTo::Unmanaged, None),
    row!(OfferTransfer, both(&[V::Available]), VolumeTo::Set(V::AwaitingTransfer, VA::Detached), None),
    row!(CancelTransfer, both(&[V::AwaitingTransfer]), VolumeTo::Set(V::Available, VA::Detached), None),
    row!(AcceptTransfer, both(&[V::AwaitingTransfer]), VolumeTo::Set(V::Available, VA::Detached), None),
    row!(Retype, both(&[V::Available, V::InUse]), VolumeTo::Unchanged, None),
    row!(ExtendVolume, both(&[V::Available]), VolumeTo::Set(V::Extending, VA::Detached), None),
    row!(ExtendAttached, both(&[V::InUse]), VolumeTo::Set(V::Extending, VA::Attached), None),
    // Back to what its attachments make it: no flow changes them while the volume grows.
    row!(VolumeExtended, both(&[V::Extending]), VolumeTo::Settle { keep_detaching: false }, None),
    row!(ExtendFailed, both(&[V::Extending]), VolumeTo::Settle { keep_detaching: false }, None),
    row!(
        Reserve,
        (Rows::In(&[V::Available]), Rows::In(&[V::Available, V::Reserved, V::Attaching, V::InUse])),
        SETTLE,
        Some((Rows::New, AttachTo::Set(A::Reserved)))
    ),
    row!(
        ReserveForMigration,
        (Rows::In(ATTACHED), Rows::<VolumeStatus>::In(&[])),
        SETTLE,
        Some((Rows::New, AttachTo::Set(A::Reserved)))
    ),
    row!(Connect, both(ATTACHED), SETTLE, Some((Rows::In(CONNECTABLE), AttachTo::Set(A::Attaching)))),
    // Undoing a connect must be possible whatever happened to the volume meanwhile (a legacy
    // `os-begin_detaching`): its operation has to end.
    row!(
        UndoConnect,
        both(ATTACHED_OR_DETACHING),
        SETTLE,
        Some((Rows::In(CONNECTABLE), AttachTo::Set(A::Reserved)))
    ),
    row!(
        UndoConnectUnconnected,
        both(ATTACHED_OR_DETACHING),
        SETTLE,
        Some((Rows::In(CONNECTABLE), AttachTo::Set(A::Attached)))
    ),
    row!(
        Complete,
        both(ATTACHED),
        SETTLE,
        Some((Rows::In(&[A::Attaching, A::Attached]), AttachTo::Set(A::Attached)))
    ),
    row!(
        CompleteUnconnected,
        both(ATTACHED),
        SETTLE,
        Some((Rows::In(&[A::Reserved]), AttachTo::Set(A::Attached)))
    ),
    row!(
        FailAttach,
        both(ATTACHED_OR_DETACHING),
        SETTLE,
        Some((Rows::In(CONNECTABLE), AttachTo::Set(A::ErrorAttaching)))
    ),
    row!(
        FailDetach,
        both(ATTACHED_OR_DETACHING),
        SETTLE,
        Some((Rows::In(LIVE), AttachTo::Set(A::ErrorDetaching)))
    ),
    row!(Remove, both(ATTACHED_OR_DETACHING), SETTLE, Some((Rows::In(LIVE), AttachTo::Removed))),
    row!(
        Detach,
        both(ATTACHED_OR_DETACHING),
        VolumeTo::Settle { keep_detaching: false },
        Some((Rows::In(LIVE), AttachTo::Removed))
    ),
    row!(
        Terminate,
        both(ATTACHED_OR_DETACHING),
        VolumeTo::Unchanged,
        Some((Rows::In(LIVE), AttachTo::Unchanged))
    ),
    row!(
        ForceDetach,
        both(&[V::Available, V::Reserved, V::Attaching, V::InUse, V::Detaching, V::Error]),
        VolumeTo::Settle { keep_detaching: false },
        Some((Rows::In(LIVE), AttachTo::Removed))
    ),
    row!(BeginDetaching, both(&[V::InUse]), VolumeTo::Set(V::Detaching, VA::Attached), None),
    row!(RollDetaching, both(&[V::Detaching]), VolumeTo::Settle { keep_detaching: false }, None),
    row!(Revoke, both(VolumeStatus::ALL), VolumeTo::Unchanged, None),
    row!(Refresh, both(VolumeStatus::ALL), VolumeTo::Unchanged, None),
    row!(Update, both(VolumeStatus::ALL), VolumeTo::Unchanged, None),
];

/// The table's row for an event.
pub fn transition(event: Event) -> &'static Transition {
    TRANSITIONS.iter().find(|t| t.event == event).expect("every event has a row in the table")
}

impl Transition {
    /// The volume statuses this event may start from (empty for an event that creates the volume).
    pub fn volume_from(&self, multiattach: bool) -> &'static [VolumeStatus] {
        match if multiattach { self.volume_from_multiattach } else { self.volume_from } {
            Rows::New => &[],
            Rows::In(list) => list,
        }
    }

    pub fn allows(&self, volume: VolumeStatus, multiattach: bool) -> bool {
        self.volume_from(multiattach).contains(&volume)
    }

    /// The attachment statuses this event may start from (empty when it creates the attachment
    /// or concerns only the volume).
    pub fn attachment_from(&self) -> &'static [AttachStatus] {
        match self.attachment {
            Some((Rows::In(list), _)) => list,
            _ => &[],
        }
    }

    /// The attachment's status afterwards, when the event sets one.
    pub fn attachment_to(&self) -> Option<AttachStatus> {
        match self.attachment {
            Some((_, AttachTo::Set(s))) => Some(s),
            _ => None,
        }
    }

    pub fn allows_attachment(&self, status: AttachStatus) -> bool {
        self.attachment_from().contains(&status)
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
        (V::Available, VA::Detached)
    } else if detaching {
        (V::Detaching, VA::Attached)
    } else if any(A::Attaching) {
        (V::Attaching, VA::Attaching)
    } else if any(A::Reserved) {
        (V::Reserved, VA::Reserved)
    } else {
        (V::InUse, VA::Attached)
    }
}

/// Whether an attachment in this status holds a connection that the backend should grant: it is
/// connected (`attaching`, `attached`). Error statuses may still have access, but nobody is owed
/// it: the reconciler revokes it.
pub fn is_connected(status: AttachStatus) -> bool {
    matches!(status, A::Attaching | A::Attached)
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
        for slot in [Slot::Shared, Slot::Exclusive, Slot::Migration] {
            assert_eq!(Slot::from_code(slot.code()), Some(slot));
        }
    }

    #[test]
    fn every_event_has_exactly_one_row() {
        use Event::*;
        for e in [
            CreateVolume,
            VolumeCreated,
            CreateFailed,
            DeleteVolume,
            ForceDeleteVolume,
            VolumeDeleted,
            DeleteFailed,
            Unmanage,
            OfferTransfer,
            CancelTransfer,
            AcceptTransfer,
            Retype,
            ExtendVolume,
            VolumeExtended,
            ExtendFailed,
            Reserve,
            ReserveForMigration,
            Connect,
            UndoConnect,
            UndoConnectUnconnected,
            Complete,
            CompleteUnconnected,
            FailAttach,
            FailDetach,
            Remove,
            Detach,
            Terminate,
            ForceDetach,
            BeginDetaching,
            RollDetaching,
            Revoke,
            Refresh,
            Update,
        ] {
            assert_eq!(TRANSITIONS.iter().filter(|t| t.event == e).count(), 1, "{e:?}");
        }
    }

    #[test]
    fn only_volume_creation_starts_from_no_volume() {
        for t in TRANSITIONS {
            let creates = matches!(t.volume_from, Rows::New);
            assert_eq!(creates, t.event == Event::CreateVolume, "{:?}", t.event);
            if !creates && t.event != Event::ReserveForMigration {
                assert!(!t.volume_from(true).is_empty() && !t.volume_from(false).is_empty(), "{:?}", t.event);
            }
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

    /// A live migration's second attachment is for a non-multiattach volume in use (a
    /// multiattach volume takes any number of attachments anyway).
    #[test]
    fn a_live_migration_reserves_only_on_a_used_non_multiattach_volume() {
        let t = transition(Event::ReserveForMigration);
        for s in [V::Reserved, V::Attaching, V::InUse] {
            assert!(t.allows(s, false), "{s}");
            assert!(!t.allows(s, true), "{s}");
        }
        for s in [V::Available, V::Detaching, V::Creating, V::Error, V::Deleting] {
            assert!(!t.allows(s, false), "{s}");
        }
    }

    /// (attachment statuses, detaching lock) -> (volume status, volume attach status)
    #[test]
    fn volume_status_is_derived_from_live_attachments() {
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
        assert!(t.allows_attachment(A::Attaching));
        assert!(t.allows_attachment(A::Attached));
        assert!(!t.allows_attachment(A::Reserved));
        assert_eq!(t.attachment_to(), Some(A::Attached));
    }

    /// Nova's shelved-offloaded server: a reservation without connector is completed, attached
    /// without a connection; a connect that fails later leaves it as it was, attached.
    #[test]
    fn a_reservation_without_connector_completes_and_an_undone_connect_leaves_it_attached() {
        let t = transition(Event::CompleteUnconnected);
        assert_eq!(t.attachment_from(), &[A::Reserved]);
        assert_eq!(t.attachment_to(), Some(A::Attached));
        assert!(transition(Event::Connect).allows_attachment(A::Attached));
        let undo = transition(Event::UndoConnectUnconnected);
        assert!(undo.allows_attachment(A::Attaching));
        assert_eq!(undo.attachment_to(), Some(A::Attached));
        assert_eq!(settle(&[A::Attached], false).0, V::InUse);
    }

    #[test]
    fn only_connected_attachments_are_owed_access() {
        for s in AttachStatus::ALL {
            assert_eq!(is_connected(*s), matches!(s, A::Attaching | A::Attached), "{s}");
        }
    }

    #[test]
    fn a_volume_with_attachments_or_in_transition_cannot_be_deleted() {
        let t = transition(Event::DeleteVolume);
        for s in [V::Reserved, V::Attaching, V::InUse, V::Detaching, V::Creating, V::Deleting] {
            assert!(!t.allows(s, false) && !t.allows(s, true), "{s}");
        }
        let forced = transition(Event::ForceDeleteVolume);
        for s in [V::Creating, V::Deleting, V::Error] {
            assert!(forced.allows(s, false), "{s}");
        }
        for s in [V::Reserved, V::Attaching, V::InUse, V::Detaching] {
            assert!(!forced.allows(s, false), "{s}");
        }
    }
}

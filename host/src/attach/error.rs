//! The attach service's errors. Mapped to HTTP in one place: `api/error.rs`.

use crate::runtime::CallError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The volume, attachment or volume type does not exist for the caller.
    #[error("{0}")]
    NotFound(String),
    /// The volume is not in a state that allows the request (Cinder's `InvalidVolume`).
    #[error("Invalid volume: {0}")]
    InvalidVolume(String),
    /// The attachment is not in a state that allows the request.
    #[error("Invalid attachment: {0}")]
    InvalidAttachment(String),
    /// The request is malformed in a way only the service can see (Cinder's `InvalidInput`).
    #[error("Invalid input received: {0}")]
    InvalidInput(String),
    /// The request conflicts with the resource's state (Cinder's `ResourceConflict`).
    #[error("Resource conflict: {0}")]
    Conflict(String),
    #[error("{0}")]
    Forbidden(String),
    /// An instance's connected attachment, to be ended only with a service token or by an admin
    /// (OSSA-2023-003; Cinder's `ConflictNovaUsingAttachment`).
    #[error("ConflictNovaUsingAttachment: Detach volume from instance {0} using the Compute API")]
    InstanceUsing(String),
    /// A plain user gave a new connector to an instance's connected attachment: that moves the
    /// instance's access to another host, which only the compute service (with a service token)
    /// or an admin may do (the same attack OSSA-2023-003 closed for delete).
    #[error(
        "ConflictNovaUsingAttachment: The attachment of instance {0} is connected; its connector can be \
         changed only through the Compute API (a request with a service token) or by an admin"
    )]
    InstanceMoving(String),
    /// The volume has as many live attachments as `[attachments] max_per_volume` allows.
    #[error("Maximum number of attachments ({max}) reached for volume {volume}")]
    TooManyAttachments { volume: String, max: u32 },
    /// The change would pass one of the project's volume quotas (`attach/quotas.rs`).
    #[error(transparent)]
    OverQuota(#[from] crate::domain::quotas::OverQuota),
    /// The backend's filesystem has no room for the volume or the extend
    /// (`max_over_subscription_ratio`, `reserved_percentage`; `domain/capacity.rs`).
    #[error("No valid backend was found: backend {backend} has no room for {requested_gib} GiB more: {why}")]
    NoRoom { backend: String, requested_gib: i64, why: String },
    /// The volume needs a new export and the backend's target service holds as many LUNs as this
    /// machine allows (`[tgt] io_threads`, `reserve_threads`, `max_luns`).
    #[error("Backend {backend} cannot export another volume: {why}")]
    ExportCeiling { backend: String, why: String },
    /// No driver serves the volume's backend: no node has it in its configuration (a
    /// configuration change removed it), or a volume type names a backend that failed to load.
    #[error(
        "Backend {0} is not served by any Berth node: none has a backend named {0} in its configuration; \
         add it back (or start the node that serves it) and retry"
    )]
    BackendUnavailable(String),
    /// This node's backend for a new volume, `node@backend`, is disabled (`attach/services.rs`).
    #[error(
        "No valid backend was found: backend {0} takes no new volumes now (an admin disabled it); retry \
         later, or choose a volume type of another backend"
    )]
    ServiceDisabled(String),
    /// The volume cannot be changed right now (another node's operation holds it, or an
    /// interrupted operation could not be finished yet); retrying later may succeed.
    #[error("{0}")]
    Unavailable(String),
    /// The volume's driver calls run on another node (the node that owns it, or one that serves
    /// its shared backend): the API forwards the request there when it can (`api/forward.rs`).
    #[error("{0}")]
    Elsewhere(super::nodes::Remote),
    /// Another node began an operation on the volume at the same moment; nothing was recorded and
    /// the flow may run again (`Service::owned` does, for a while).
    #[error("Resource conflict: another operation on volume {0} is in progress; retry")]
    Busy(String),
    /// Something Berth does not do (re-imaging a volume: it has no image service).
    #[error("{0}")]
    NotImplemented(String),
    /// A bug: an operation's task stopped without an answer.
    #[error("internal error: {0}")]
    Internal(String),
    /// A driver call failed. `api/error.rs` documents the status for each kind.
    #[error(transparent)]
    Driver(#[from] CallError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for AttachError {
    fn from(e: sqlx::Error) -> Self {
        AttachError::Store(StoreError::from_db(e))
    }
}

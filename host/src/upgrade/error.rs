//! Why an upgrade or rollback did not happen (mapped to HTTP in `api/error.rs`).

use serde_json::Value as Json;

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// No backend of that name on this node.
    #[error("no backend named {0} on this node")]
    NotFound(String),
    /// The file is not a component, or cannot be read.
    #[error("{0}")]
    Invalid(String),
    /// The component is not fit to replace the running driver (the report of the conformance
    /// suite, when that is why).
    #[error("the new driver was refused: {why}")]
    Refused { why: String, report: Option<Json> },
    /// A rollback of a backend that has run no other driver since this process started.
    #[error("backend {0} has no previous driver to go back to")]
    NothingToRollBackTo(String),
    /// The backend runs this very component already.
    #[error("the backend already runs this driver (sha256 {0})")]
    AlreadyRunning(String),
    /// Another upgrade or rollback of this node is under way.
    #[error("an upgrade or rollback is under way on this node (backend {0}); try again when it ends")]
    Busy(String),
    /// The host could not do its part (keep the file, run the suite).
    #[error("{0}")]
    Internal(String),
}

impl UpgradeError {
    pub(crate) fn refused(why: impl Into<String>) -> UpgradeError {
        UpgradeError::Refused { why: why.into(), report: None }
    }
}

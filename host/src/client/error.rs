//! What can go wrong in the attach client, each with the exit code scripts can rely on
//! (documented in README.md, "Attaching a volume to this machine").

/// A failure of `get-connector`, `local-attach` or `local-detach`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Bad flags or environment (exit 2, as for clap's own usage errors).
    #[error("{0}")]
    Usage(String),
    /// The endpoint did not answer (exit 3).
    #[error("{0}")]
    Unreachable(String),
    /// The volume or attachment does not exist (exit 4).
    #[error("{0}")]
    NotFound(String),
    /// The volume is not in a state that allows the request: attached elsewhere, several
    /// attachments and no id (exit 5).
    #[error("{0}")]
    Busy(String),
    /// The initiator tools are missing, or the client is not root, or this machine has no
    /// initiator name (exit 6). Nothing was changed.
    #[error("{0}")]
    Tools(String),
    /// Connecting or disconnecting the target failed (exit 7).
    #[error("{0}")]
    Connect(String),
    /// The endpoint refused the request for another reason, or failed (exit 8).
    #[error("{0}")]
    Api(String),
}

impl ClientError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Usage(_) => 2,
            ClientError::Unreachable(_) => 3,
            ClientError::NotFound(_) => 4,
            ClientError::Busy(_) => 5,
            ClientError::Tools(_) => 6,
            ClientError::Connect(_) => 7,
            ClientError::Api(_) => 8,
        }
    }

    /// The same kind of error with more context in front.
    pub fn context(self, what: &str) -> ClientError {
        let wrap = |m: String| format!("{what}: {m}");
        match self {
            ClientError::Usage(m) => ClientError::Usage(wrap(m)),
            ClientError::Unreachable(m) => ClientError::Unreachable(wrap(m)),
            ClientError::NotFound(m) => ClientError::NotFound(wrap(m)),
            ClientError::Busy(m) => ClientError::Busy(wrap(m)),
            ClientError::Tools(m) => ClientError::Tools(wrap(m)),
            ClientError::Connect(m) => ClientError::Connect(wrap(m)),
            ClientError::Api(m) => ClientError::Api(wrap(m)),
        }
    }
}

//! Linux's userspace iSCSI target daemon, tgtd: its control protocol (`protocol.rs`), and the
//! target service built on it (`service.rs`).

mod protocol;
mod service;

pub use protocol::{Request, parse_accounts, parse_connections, parse_show};
pub use service::{Tgtd, TgtdConfig};

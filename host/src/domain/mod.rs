//! The domain, the house's ground floor: what a volume and an attachment are and may become,
//! with no I/O. The statuses and the one transition table (`state.rs`), the records the store
//! reads and writes (`model.rs`), list queries (`list.rs`), and what QoS specs give a
//! connection (`qos.rs`). `store/` builds on it to write
//! rows; `attach/` (the flows) builds on both; nothing here imports either.

pub mod capacity;
pub mod history;
pub mod list;
pub mod messages;
pub mod model;
pub mod qos;
pub mod quotas;
pub mod state;

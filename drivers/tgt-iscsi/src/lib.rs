//! `tgt-iscsi`: volumes as sparse image files exported through the host's iSCSI target service
//! (Linux tgt), one target per volume, LUN 1, incoming CHAP, an ACL entry per initiator. What
//! Cinder's LVM driver with the tgt helper does, without LVM, shell or config files.
//!
//! Settings (the backend's `settings` table):
//! - `target_prefix`: IQN prefix of the targets, set by the host to the backend's namespace
//!   (`iqn.2010-10.org.openstack:<backend>:` unless the operator sets it), so a volume's target is
//!   `<prefix>volume-<uuid>`.
//! - `target_lun`: the LUN that carries the volume (default 1; LUN 0 is the controller).
//! - `chap_accounts`: `per-initiator` (default): each initiator logs in with its own account for
//!   the volume owner's volumes, which the host makes from a key it keeps
//!   (`berth:iscsi-chap/initiator-accounts`), binds at initialize-connection before the ACL entry
//!   and unbinds at terminate-connection after it; nothing is stored on the volume. `per-export`:
//!   one account per export from fresh credentials, stored on the volume and shared by its
//!   initiators (Cinder's tgt helper).
//! - `rotate_chap_on_detach` (`per-export` only): when one initiator of a multiattach volume is detached while others
//!   stay, the target gets fresh CHAP credentials (default `true`), so that the detached host
//!   cannot log in again under another host's initiator name; the remaining hosts' sessions go on
//!   and they receive the new credentials at their next initialize-connection (Nova: its
//!   connection-info refresh, an attachment update). `false` keeps the credentials. The two
//!   attachments of a live migration (a non-multiattach volume) keep theirs, so that a failed
//!   migration never leaves the source host unable to log in again.
//!
//! Stored on the volume: `provider_location` = `<ip>:<port>[;<ip>:<port>...],<tid> <iqn> <lun>`,
//! with `per-export` accounts `provider_auth` = `CHAP <user> <secret>` (Cinder's formats), and one driver-data key
//! `mode.<initiator>` per connected initiator recording its access mode.

mod driver;

pub use driver::TgtIscsi;

berth_driver_sdk::export_driver!(TgtIscsi);

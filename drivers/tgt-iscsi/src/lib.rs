//! `tgt-iscsi`: volumes as sparse image files exported through the host's iSCSI target service
//! (Linux tgt), one target per volume, LUN 1, incoming CHAP, an ACL entry per initiator. What
//! Cinder's LVM driver with the tgt helper does, without LVM, shell or config files.
//!
//! Settings (the backend's `settings` table):
//! - `target_prefix`: IQN prefix of the targets (default `iqn.2010-10.org.openstack:`), so a
//!   volume's target is `<prefix>volume-<uuid>` as in Cinder.
//! - `target_lun`: the LUN that carries the volume (default 1; LUN 0 is the controller).
//!
//! Stored on the volume: `provider_location` = `<ip>:<port>[;<ip>:<port>...],<tid> <iqn> <lun>`
//! and `provider_auth` = `CHAP <user> <secret>` (Cinder's formats), and one driver-data key
//! `mode.<initiator>` per connected initiator recording its access mode.

mod driver;

pub use driver::TgtIscsi;

berth_driver_sdk::export_driver!(TgtIscsi);

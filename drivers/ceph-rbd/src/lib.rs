//! `ceph-rbd`: volumes as RBD images in a Ceph pool, managed through the Ceph manager's dashboard
//! REST API over the host's network capability, and attached as Cinder's RBD driver attaches
//! them (the client, qemu/librbd or os-brick's RBD connector, talks to the monitors itself).
//!
//! Settings (the backend's `settings` table):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `dashboard` | (required) | the dashboard's URL, `https://mgr.example:8443` (an allowed host) |
//! | `pool` | `volumes` | the pool of the volumes' images |
//! | `monitors` | from the dashboard | `host:port,host:port`, the monitors clients connect to |
//! | `cluster_name` | `ceph` | as Cinder's `rbd_cluster_name` |
//! | `identities` | `per-host` | `per-host`: each compute host gets its own cephx identity for each volume it attaches, made by the host's `cephx` capability at `initialize-connection` and removed at `terminate-connection`; `shared`: every host uses `rbd_user`, as Cinder does |
//! | `rbd_user` | `cinder` | with `identities = shared`, the cephx identity clients use (`auth_username`), as Cinder's `rbd_user`; empty: no cephx |
//! | `secret_uuid` | none | the libvirt secret holding that identity's key, as Cinder's `rbd_secret_uuid` |
//! | `task_wait_seconds` | `30` | how long a call follows a task the dashboard answered 202 for |
//!
//! With per-host identities, the connection info names the host's identity and carries its key as
//! a `keyring` (os-brick writes it to a temporary keyring file); a detached host's identity is
//! gone, so its key opens nothing (docs/security.md, "Ceph RBD").
//!
//! Every call is idempotent against a dashboard whose answer may have been lost: an image that
//! exists with the size asked for is a created one, a missing image is a deleted one, and names
//! come only from the volume record (`volume-<id>`, as Cinder names them).

mod driver;

pub use driver::CephRbd;

berth_driver_sdk::export_driver!(CephRbd);

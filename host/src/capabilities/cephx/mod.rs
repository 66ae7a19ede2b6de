//! `cephx`: cephx identities that open one RBD image and nothing else, made and removed by the
//! host for a driver (`berth:cephx/identities`, wit/cephx@0.1.0).
//!
//! The host holds the key that may make identities (`[backends.cephx]`: a `ceph.conf`, the
//! identity and its keyring); the driver names a pool, an image and a compute host, never an
//! identity or a capability. The host builds the name, `client.berth.<backend>.<image>.<16 hex
//! digits of the host's SHA-256>`, reads the image's id itself, and gives the identity
//! `mon 'profile rbd'` and, on the OSDs of that pool, the image's own objects (data, header,
//! object map) read-write and the pool's directory objects read-only ([`osd_caps`]): as that
//! identity a client opens that image and is refused every other (docs/security.md, "Ceph RBD").
//!
//! Ceph is reached through librados (`rados.rs`, loaded at run time), one connection per
//! backend kept between calls: a monitor command costs a round trip, not a process (Ceph's `ceph`
//! tool starts a Python interpreter, about 0.25 s of CPU per command; BENCHMARKS.md).

mod rados;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rados::{Connection, RadosError};
use serde_json::json;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// With the `cephx` grant: how the host reaches the cluster to make identities.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CephxConfig {
    /// The cluster's `ceph.conf` (monitors, and the keyring's path unless `keyring` is set).
    pub conf: PathBuf,
    /// The identity the host acts as. It needs no more than `mon 'allow r, allow command "auth
    /// get-or-create" with entity prefix client.berth., allow command "auth caps" with entity
    /// prefix client.berth., allow command "auth get" with entity prefix client.berth., allow
    /// command "auth add" with entity prefix client.berth., allow command "auth del" with entity
    /// prefix client.berth., allow command "auth ls"'` and `osd 'allow r object_prefix rbd_id.,
    /// allow rx object_prefix rbd_directory'` (to read an image's id, and to list the images for
    /// the reconciler).
    #[serde(default = "default_name")]
    pub name: String,
    /// Its keyring (not readable by group or others); default: what `conf` says.
    #[serde(default)]
    pub keyring: Option<PathBuf>,
    /// The pools whose images identities may open; default: the backend's `pool` setting, or
    /// `volumes`.
    #[serde(default)]
    pub pools: Vec<String>,
    /// How long one Ceph command may take.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: f64,
}

fn default_name() -> String {
    "client.admin".into()
}

fn default_timeout() -> f64 {
    20.0
}

/// Why a request was refused or failed; the driver sees the same variants.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CephxError {
    #[error("{0}")]
    NotConfigured(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotPermitted(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unavailable(String),
}

/// An identity and its key, as a keyring file holds it.
#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    /// Without `client.`.
    pub user: String,
    pub keyring: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("user", &self.user).finish_non_exhaustive()
    }
}

/// One identity the host made, read back from its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// `client.berth.<backend>.<image>.<digest>`.
    pub entity: String,
    pub image: String,
    /// The first 16 hex digits of the SHA-256 of the compute host's name.
    pub host_digest: String,
}

/// One backend's cephx capability.
#[derive(Debug, Clone)]
pub struct CephxCapability {
    backend: String,
    /// `None`: granted, but without a `[backends.cephx]` table: every request is refused.
    config: Option<CephxConfig>,
    cluster: Option<Arc<Connection>>,
}

impl CephxCapability {
    /// The capability of `backend`; `default_pool` is its `pool` setting (or `volumes`).
    pub fn new(backend: &str, config: Option<&CephxConfig>, default_pool: &str) -> Result<Self, String> {
        let config = match config {
            None => None,
            Some(c) => {
                let mut c = c.clone();
                if c.pools.is_empty() {
                    c.pools = vec![default_pool.to_string()];
                }
                for pool in &c.pools {
                    check_name("pool", pool, false)
                        .map_err(|e| format!("backend {backend}: [backends.cephx] {e}"))?;
                }
                if !c.name.starts_with("client.") || c.name.len() <= "client.".len() {
                    return Err(format!(
                        "backend {backend}: [backends.cephx] name {:?} is not client.<id>",
                        c.name
                    ));
                }
                if !(c.timeout_seconds > 0.0 && c.timeout_seconds <= 600.0) {
                    return Err(format!(
                        "backend {backend}: [backends.cephx] timeout_seconds must be in (0, 600]"
                    ));
                }
                Some(c)
            }
        };
        let cluster = config.as_ref().map(|c| {
            Arc::new(Connection::new(
                &c.conf,
                &c.name,
                c.keyring.as_deref(),
                Duration::from_secs_f64(c.timeout_seconds),
            ))
        });
        Ok(CephxCapability { backend: backend.to_string(), config, cluster })
    }

    pub fn configured(&self) -> bool {
        self.config.is_some()
    }

    fn config(&self) -> Result<&CephxConfig, CephxError> {
        self.config.as_ref().ok_or_else(|| {
            CephxError::NotConfigured(format!(
                "backend {} has no [backends.cephx] table: the host makes no cephx identities for it",
                self.backend
            ))
        })
    }

    fn pool<'a>(&self, pool: &'a str) -> Result<&'a str, CephxError> {
        check_name("pool", pool, false).map_err(CephxError::InvalidArgument)?;
        if self.config()?.pools.iter().any(|p| p == pool) {
            Ok(pool)
        } else {
            Err(CephxError::NotPermitted(format!(
                "pool {pool} is not one of backend {}'s pools",
                self.backend
            )))
        }
    }

    /// The name of `host`'s identity for `image`.
    pub fn entity(&self, image: &str, host: &str) -> String {
        format!("client.berth.{}.{image}.{}", self.backend, host_digest(host))
    }

    /// The identity through which `host` opens `image` of `pool`: made, or found and its
    /// capabilities brought up to date (an image re-created under the same name has a new id).
    pub async fn grant_image(&self, pool: &str, image: &str, host: &str) -> Result<Identity, CephxError> {
        let pool = self.pool(pool)?;
        check_name("image", image, true).map_err(CephxError::InvalidArgument)?;
        check_host(host)?;
        let id = self.image_id(pool, image).await?;
        let entity = self.entity(image, host);
        let caps = json!(["mon", "profile rbd", "osd", osd_caps(pool, image, &id)]);
        let made = self
            .mon(json!({"prefix": "auth get-or-create", "entity": entity, "caps": caps, "format": "json"}))
            .await;
        let out = match made {
            Ok(out) => out,
            // It exists with other capabilities (its image was re-created): set them.
            Err(e) if e.errno == libc::EINVAL => {
                self.mon(json!({"prefix": "auth caps", "entity": entity, "caps": caps}))
                    .await
                    .map_err(|e| refused(&entity, e))?;
                self.mon(json!({"prefix": "auth get", "entity": entity, "format": "json"}))
                    .await
                    .map_err(|e| refused(&entity, e))?
            }
            Err(e) => return Err(refused(&entity, e)),
        };
        let key = parse_key(&out, &entity)?;
        let user = entity.trim_start_matches("client.").to_string();
        Ok(Identity { keyring: format!("[{entity}]\n\tkey = {key}\n"), user })
    }

    /// Makes `host`'s identity for `image` again with the key it had (from the connection info of
    /// the attachment that holds it), so that the key the host was given opens the image again:
    /// the reconciler's repair of an identity removed behind the service's back. An identity that
    /// exists is left as it is (false).
    pub async fn restore(
        &self,
        pool: &str,
        image: &str,
        host: &str,
        keyring: &str,
    ) -> Result<bool, CephxError> {
        let pool = self.pool(pool)?;
        check_name("image", image, true).map_err(CephxError::InvalidArgument)?;
        check_host(host)?;
        let entity = self.entity(image, host);
        let key = keyring
            .split_once(&format!("[{entity}]"))
            .and_then(|(_, rest)| rest.split("key = ").nth(1))
            .map(|k| k.lines().next().unwrap_or("").trim())
            .filter(|k| {
                !k.is_empty()
                    && k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
            })
            .ok_or_else(|| CephxError::InvalidArgument(format!("the keyring holds no key of {entity}")))?;
        let id = self.image_id(pool, image).await?;
        let caps = json!(["mon", "profile rbd", "osd", osd_caps(pool, image, &id)]);
        let keyring = format!("[{entity}]\n\tkey = {key}\n");
        match self
            .mon_with(json!({"prefix": "auth add", "entity": entity, "caps": caps}), keyring.into_bytes())
            .await
        {
            Ok(_) => Ok(true),
            // Made meanwhile (by the connection that holds it): not this repair's to change.
            Err(e) if e.errno == libc::EEXIST || e.errno == libc::EINVAL => Ok(false),
            Err(e) => Err(refused(&entity, e)),
        }
    }

    /// Removes `host`'s identity for `image`; a missing one is a removed one.
    pub async fn revoke_image(&self, pool: &str, image: &str, host: &str) -> Result<(), CephxError> {
        self.pool(pool)?;
        check_name("image", image, true).map_err(CephxError::InvalidArgument)?;
        check_host(host)?;
        self.delete(&self.entity(image, host)).await
    }

    /// Removes every identity of `image` but those of the hosts in `keep`.
    pub async fn revoke_all(&self, pool: &str, image: &str, keep: &[String]) -> Result<(), CephxError> {
        self.pool(pool)?;
        check_name("image", image, true).map_err(CephxError::InvalidArgument)?;
        for host in keep {
            check_host(host)?;
        }
        let kept: Vec<String> = keep.iter().map(|h| host_digest(h)).collect();
        for held in self.held().await? {
            if held.image == image && !kept.contains(&held.host_digest) {
                self.delete(&held.entity).await?;
            }
        }
        Ok(())
    }

    /// Whether `image` exists in `pool` (its `rbd_id` object does).
    pub async fn image_exists(&self, pool: &str, image: &str) -> Result<bool, CephxError> {
        check_name("image", image, true).map_err(CephxError::InvalidArgument)?;
        match self.image_id(self.pool(pool)?, image).await {
            Ok(_) => Ok(true),
            Err(CephxError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The pools whose images identities may open (where the reconciler looks for images).
    pub fn pools(&self) -> &[String] {
        self.config.as_ref().map_or(&[], |c| &c.pools)
    }

    /// The names of the images of a pool (`rbd.dir_list` on `rbd_directory`, what `rbd ls`
    /// reads), for the reconciler.
    pub async fn images(&self, pool: &str) -> Result<Vec<String>, CephxError> {
        let pool = self.pool(pool)?;
        const PAGE: u64 = 1024;
        let mut names: Vec<String> = Vec::new();
        loop {
            let after = names.last().cloned().unwrap_or_default();
            let mut input = encode_string(&after);
            input.extend_from_slice(&PAGE.to_le_bytes());
            let out = match self
                .cluster()?
                .exec(pool, "rbd_directory", ("rbd", "dir_list"), input, 4 << 20)
                .await
            {
                Ok(out) => out,
                // No image was ever made in the pool.
                Err(e) if e.errno == libc::ENOENT => return Ok(names),
                Err(e) => return Err(refused(&format!("the images of {pool}"), e)),
            };
            let page = decode_name_map(&out).ok_or_else(|| {
                CephxError::Unavailable(format!("the images of {pool}: an answer that does not decode"))
            })?;
            let full = page.len() as u64 == PAGE;
            names.extend(page);
            if !full {
                return Ok(names);
            }
        }
    }

    /// Every identity the host made for this backend (for the reconciler).
    pub async fn held(&self) -> Result<Vec<Held>, CephxError> {
        let out = self
            .mon(json!({"prefix": "auth ls", "format": "json"}))
            .await
            .map_err(|e| refused("auth ls", e))?;
        let dump: serde_json::Value = serde_json::from_slice(&out)
            .map_err(|e| CephxError::Unavailable(format!("ceph auth ls answered no JSON: {e}")))?;
        let entries = dump["auth_dump"].as_array().cloned().unwrap_or_default();
        Ok(entries
            .iter()
            .filter_map(|e| e["entity"].as_str())
            .filter_map(|entity| self.parse(entity))
            .collect())
    }

    /// Removes one identity the host made (the reconciler's repair); a missing one is removed.
    pub async fn remove(&self, held: &Held) -> Result<(), CephxError> {
        match self.parse(&held.entity) {
            Some(_) => self.delete(&held.entity).await,
            None => Err(CephxError::NotPermitted(format!(
                "{} is not one of backend {}'s identities",
                held.entity, self.backend
            ))),
        }
    }

    /// `client.berth.<backend>.<image>.<digest>` of this backend, read back.
    fn parse(&self, entity: &str) -> Option<Held> {
        let rest = entity.strip_prefix("client.berth.")?;
        let (rest, digest) = rest.rsplit_once('.')?;
        let (backend, image) = rest.rsplit_once('.')?;
        (backend == self.backend && digest.len() == 16 && digest.bytes().all(|b| b.is_ascii_hexdigit())).then(
            || Held { entity: entity.to_string(), image: image.to_string(), host_digest: digest.to_string() },
        )
    }

    async fn delete(&self, entity: &str) -> Result<(), CephxError> {
        match self.mon(json!({"prefix": "auth del", "entity": entity})).await {
            Ok(_) => Ok(()),
            Err(e) if e.errno == libc::ENOENT => Ok(()),
            Err(e) => Err(refused(entity, e)),
        }
    }

    /// The image's id (what its objects are named after), read by the host from the image's
    /// `rbd_id.<image>` object, never taken from the driver.
    async fn image_id(&self, pool: &str, image: &str) -> Result<String, CephxError> {
        let spec = format!("{pool}/{image}");
        let object = format!("rbd_id.{image}");
        let out = match self.cluster()?.read(pool, &object, 4 + 64).await {
            Ok(out) => out,
            Err(e) if e.errno == libc::ENOENT => {
                return Err(CephxError::NotFound(format!("{spec} does not exist")));
            }
            Err(e) => return Err(refused(&spec, e)),
        };
        parse_image_id(&out)
            .ok_or_else(|| CephxError::Unavailable(format!("{spec}: its rbd_id object holds no id")))
    }

    fn cluster(&self) -> Result<&Arc<Connection>, CephxError> {
        self.config()?;
        Ok(self.cluster.as_ref().expect("a configured capability has its connection"))
    }

    async fn mon(&self, command: serde_json::Value) -> Result<Vec<u8>, RadosError> {
        self.mon_with(command, Vec::new()).await
    }

    async fn mon_with(&self, command: serde_json::Value, input: Vec<u8>) -> Result<Vec<u8>, RadosError> {
        match self.cluster() {
            Ok(c) => c.mon_command(command, input).await,
            Err(e) => Err(RadosError { errno: 0, message: e.to_string() }),
        }
    }
}

/// What a failed request says to the driver.
fn refused(what: &str, e: RadosError) -> CephxError {
    match e.errno {
        libc::EACCES | libc::EPERM => {
            CephxError::NotPermitted(format!("{what}: the host's identity may not: {}", e.message))
        }
        libc::ENOENT => CephxError::NotFound(format!("{what}: {}", e.message)),
        0 if e.message.contains("[backends.cephx]") => CephxError::NotConfigured(e.message),
        errno => CephxError::Unavailable(format!("{what}: {} (errno {errno})", e.message)),
    }
}

/// What the identity may do on the OSDs: the image's own objects, and reading the pool's
/// directory objects librbd opens an image through (verified on Ceph 16.2.15: docs/security.md).
pub fn osd_caps(pool: &str, image: &str, id: &str) -> String {
    [
        format!("allow rwx pool={pool} object_prefix rbd_data.{id}"),
        format!("allow rwx pool={pool} object_prefix rbd_header.{id}"),
        format!("allow rwx pool={pool} object_prefix rbd_object_map.{id}"),
        format!("allow rx pool={pool} object_prefix rbd_id.{image}"),
        format!("allow rx pool={pool} object_prefix rbd_directory"),
        format!("allow rx pool={pool} object_prefix rbd_info"),
        format!("allow rx pool={pool} object_prefix rbd_children"),
        format!("allow rx pool={pool} object_prefix rbd_mirroring"),
    ]
    .join(", ")
}

/// A string as Ceph encodes it: a little-endian u32 length, then the bytes.
fn encode_string(text: &str) -> Vec<u8> {
    let mut out = (text.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(text.as_bytes());
    out
}

/// A Ceph-encoded `map<string, string>` (name -> id), its keys in order.
fn decode_name_map(mut bytes: &[u8]) -> Option<Vec<String>> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (bytes.get(..n)?, bytes.get(n..)?);
        *bytes = rest;
        Some(head)
    }
    fn string(bytes: &mut &[u8]) -> Option<String> {
        let len = u32::from_le_bytes(take(bytes, 4)?.try_into().ok()?) as usize;
        String::from_utf8(take(bytes, len)?.to_vec()).ok()
    }
    let count = u32::from_le_bytes(take(&mut bytes, 4)?.try_into().ok()?);
    let mut names = Vec::new();
    for _ in 0..count {
        names.push(string(&mut bytes)?);
        string(&mut bytes)?;
    }
    bytes.is_empty().then_some(names)
}

/// An `rbd_id.<image>` object: the id as a Ceph-encoded string (a little-endian u32 length, then
/// the bytes).
fn parse_image_id(object: &[u8]) -> Option<String> {
    let len = u32::from_le_bytes(object.get(..4)?.try_into().ok()?) as usize;
    let id = std::str::from_utf8(object.get(4..4 + len)?).ok()?;
    (!id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| id.to_string())
}

/// The first 16 hex digits of the SHA-256 of a compute host's name.
pub fn host_digest(host: &str) -> String {
    hex::encode(&Sha256::digest(host.as_bytes())[..8])
}

/// A pool or image name: 1 to 128 of A-Z a-z 0-9 _ - (and `.` in a pool's, not first).
fn check_name(what: &str, name: &str, image: bool) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_') || (!image && b == b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!("{what} name {name:?} must be 1 to 128 characters of A-Z a-z 0-9 _ -"))
    }
}

fn check_host(host: &str) -> Result<(), CephxError> {
    if host.is_empty() || host.len() > 255 || host.chars().any(char::is_control) {
        return Err(CephxError::InvalidArgument(
            "a host name is 1 to 255 characters without control characters".into(),
        ));
    }
    Ok(())
}

fn parse_key(out: &[u8], entity: &str) -> Result<String, CephxError> {
    let answer: serde_json::Value = serde_json::from_slice(out)
        .map_err(|e| CephxError::Unavailable(format!("ceph auth answered no JSON for {entity}: {e}")))?;
    let key = answer.as_array().and_then(|a| a.first()).and_then(|e| e["key"].as_str()).unwrap_or_default();
    let valid =
        !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
    if valid {
        Ok(key.to_string())
    } else {
        Err(CephxError::Unavailable(format!("ceph auth gave no key for {entity}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capability(backend: &str) -> CephxCapability {
        let config = CephxConfig {
            conf: "/nonexistent/ceph.conf".into(),
            name: default_name(),
            keyring: None,
            pools: vec![],
            timeout_seconds: 5.0,
        };
        CephxCapability::new(backend, Some(&config), "volumes").unwrap()
    }

    #[test]
    fn an_identity_is_named_by_the_host_from_backend_image_and_a_digest_of_the_compute_host() {
        let c = capability("rbd.a");
        let entity = c.entity("volume-1", "compute-1");
        assert_eq!(entity, format!("client.berth.rbd.a.volume-1.{}", host_digest("compute-1")));
        assert_ne!(host_digest("compute-1"), host_digest("compute-2"));
        let held = c.parse(&entity).expect("its own identity");
        assert_eq!((held.image.as_str(), held.host_digest.len()), ("volume-1", 16));
        // Another backend's, even one whose name starts the same, is not this one's.
        assert_eq!(capability("rbd").parse(&entity), None);
        assert_eq!(c.parse("client.cinder"), None);
        assert_eq!(c.parse("client.berth.rbd.a.volume-1.nothex0000000000"), None);
    }

    #[tokio::test]
    async fn names_the_driver_gives_are_checked_before_anything_runs() {
        let c = capability("rbd");
        let refused = [
            c.grant_image("other", "volume-1", "h").await,
            c.grant_image("volumes", "volume-1.x", "h").await,
            c.grant_image("volumes", "../x", "h").await,
            c.grant_image("volumes", "volume-1", "").await,
            c.grant_image("volumes", "volume-1", "a\nb").await,
        ];
        assert!(matches!(refused[0], Err(CephxError::NotPermitted(_))), "{:?}", refused[0]);
        for r in &refused[1..] {
            assert!(matches!(r, Err(CephxError::InvalidArgument(_))), "{r:?}");
        }
        let unconfigured = CephxCapability::new("rbd", None, "volumes").unwrap();
        assert!(matches!(
            unconfigured.grant_image("volumes", "volume-1", "h").await,
            Err(CephxError::NotConfigured(_))
        ));
    }

    #[test]
    fn a_pools_directory_answers_a_map_of_names_to_ids() {
        let mut answer = 2u32.to_le_bytes().to_vec();
        for (name, id) in [("volume-a", "10ab"), ("volume-b", "10cd")] {
            answer.extend(encode_string(name));
            answer.extend(encode_string(id));
        }
        assert_eq!(decode_name_map(&answer), Some(vec!["volume-a".to_string(), "volume-b".to_string()]));
        assert_eq!(decode_name_map(&answer[..answer.len() - 1]), None, "cut short");
        assert_eq!(decode_name_map(&0u32.to_le_bytes()), Some(vec![]));
        assert_eq!(encode_string("ab"), [2, 0, 0, 0, b'a', b'b']);
    }

    #[test]
    fn an_images_id_is_read_from_its_rbd_id_object() {
        assert_eq!(parse_image_id(b"\x0c\x00\x00\x0010352264342c").as_deref(), Some("10352264342c"));
        assert_eq!(parse_image_id(b"\x0c\x00\x00\x00103522"), None, "shorter than it says");
        assert_eq!(parse_image_id(b"\x02\0\0\0a/"), None, "not an id");
        assert_eq!(parse_image_id(b""), None);
    }

    #[test]
    fn the_capabilities_reach_the_images_objects_and_only_read_the_pools_directory() {
        let caps = osd_caps("volumes", "volume-1", "10ab");
        assert!(caps.contains("allow rwx pool=volumes object_prefix rbd_data.10ab"));
        assert!(caps.contains("allow rx pool=volumes object_prefix rbd_id.volume-1"));
        assert!(!caps.contains("allow rwx pool=volumes,") && !caps.contains("profile"));
        for grant in caps.split(", ") {
            assert!(grant.contains("object_prefix"), "{grant} reaches more than named objects");
        }
    }
}

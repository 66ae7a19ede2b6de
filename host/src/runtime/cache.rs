//! The compiled-artifact cache: a driver is compiled once per (wasm digest, engine
//! compatibility) and loaded from disk afterwards, so a restart does not recompile.
//!
//! A cached artifact is native code, so only what this host compiled is ever deserialised. Each
//! file carries an HMAC-SHA256, keyed by a random host key (`host.key`, 0600, in the cache
//! directory), over the wasm digest it was compiled from, the engine's compatibility key and the
//! artifact itself. Before a file is deserialised it is opened without following symlinks, must
//! be a regular file owned by this process's user and not writable by group or others, and its
//! MAC must match the component being loaded: a swapped artifact (another driver's code under this
//! name), a flipped byte or a symlink is refused, logged, and the driver is compiled again. The
//! bytes that were verified are the bytes deserialised (read once, into memory), so the file cannot
//! change between the check and the load.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// sha256 of `bytes`, hex.
pub(crate) fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A stable hex digest of the engine's compatibility hash (wasmtime version, `Config`, cargo
/// features).
pub(crate) fn engine_key(engine: &Engine) -> String {
    struct ShaHasher(Sha256);
    impl Hasher for ShaHasher {
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
        fn finish(&self) -> u64 {
            0
        }
    }
    let mut h = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    hex::encode(&h.0.finalize()[..16])
}

/// The first bytes of every artifact file this host writes; the MAC follows, then the artifact.
const MAGIC: &[u8; 8] = b"BERTHC1\n";
const MAC_LEN: usize = 32;
const KEY_FILE: &str = "host.key";

/// Where compiled drivers are kept, and the key that proves this host wrote them.
#[derive(Clone)]
pub(crate) struct ArtifactCache {
    dir: PathBuf,
    key: [u8; 32],
}

impl std::fmt::Debug for ArtifactCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactCache").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    Compiled,
    Cached,
}

/// Why a cached artifact was not used (logged; the driver is compiled again).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Rejected {
    #[error("it is a symlink or not a regular file")]
    NotRegular,
    #[error("it is owned by uid {0}, not by this service's user")]
    Owner(u32),
    #[error("it is writable by group or others (mode {0:o})")]
    Writable(u32),
    #[error("it was not written by this host or was changed since (MAC mismatch)")]
    Mac,
    #[error("cannot read it: {0}")]
    Io(String),
}

impl ArtifactCache {
    pub(crate) fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o700))?;
        let key = host_key(&dir.join(KEY_FILE))?;
        Ok(ArtifactCache { dir, key })
    }

    fn path(&self, digest: &str, engine: &Engine) -> PathBuf {
        self.dir.join(format!("{}-{}.cwasm", &digest[..32], engine_key(engine)))
    }

    fn mac(&self, digest: &str, engine: &Engine, artifact: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes any key length");
        mac.update(digest.as_bytes());
        mac.update(b"\0");
        mac.update(engine_key(engine).as_bytes());
        mac.update(b"\0");
        mac.update(artifact);
        mac
    }

    /// Loads the compiled form of `wasm` from the cache, or compiles and stores it.
    pub(crate) fn load(
        &self,
        engine: &Engine,
        wasm: &[u8],
        digest: &str,
    ) -> Result<(Component, Provenance), wasmtime::Error> {
        let path = self.path(digest, engine);
        match self.read_verified(&path, digest, engine) {
            Ok(Some(artifact)) => {
                // SAFETY: these bytes carry a MAC made with this host's key over this component's
                // digest and this engine's compatibility key, i.e. they are exactly what
                // `precompile_component` returned on this host for this wasm; they were read once
                // into memory, so what was verified is what is loaded.
                match unsafe { Component::deserialize(engine, &artifact) } {
                    Ok(component) => return Ok((component, Provenance::Cached)),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), "discarding unusable cached driver artifact: {e}")
                    }
                }
            }
            Ok(None) => {}
            Err(why) => {
                tracing::warn!(path = %path.display(), "refusing cached driver artifact, compiling again: {why}");
            }
        }
        let bytes = engine.precompile_component(wasm)?;
        let mac = self.mac(digest, engine, &bytes).finalize().into_bytes();
        if let Err(e) = write_atomically(&path, &[MAGIC.as_slice(), mac.as_slice(), &bytes]) {
            tracing::warn!(path = %path.display(), "cannot cache compiled driver: {e}");
        }
        // SAFETY: `bytes` was produced just now by this engine.
        let component = unsafe { Component::deserialize(engine, &bytes)? };
        Ok((component, Provenance::Compiled))
    }

    /// The artifact in `path` if there is one and it passes every check; `Ok(None)` if there is
    /// no file.
    fn read_verified(&self, path: &Path, digest: &str, engine: &Engine) -> Result<Option<Vec<u8>>, Rejected> {
        let mut file = match open_nofollow(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Rejected::NotRegular),
            Err(e) => return Err(Rejected::Io(e.to_string())),
        };
        check_private_file(&file)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| Rejected::Io(e.to_string()))?;
        let Some(rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
            return Err(Rejected::Mac);
        };
        if rest.len() < MAC_LEN {
            return Err(Rejected::Mac);
        }
        let (tag, artifact) = rest.split_at(MAC_LEN);
        self.mac(digest, engine, artifact).verify_slice(tag).map_err(|_| Rejected::Mac)?;
        Ok(Some(artifact.to_vec()))
    }
}

fn open_nofollow(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)
}

/// A file this service may trust: regular, owned by the effective user, not group/world-writable.
fn check_private_file(file: &File) -> Result<(), Rejected> {
    let meta = file.metadata().map_err(|e| Rejected::Io(e.to_string()))?;
    if !meta.file_type().is_file() {
        return Err(Rejected::NotRegular);
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(Rejected::Owner(meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Rejected::Writable(meta.mode() & 0o7777));
    }
    Ok(())
}

/// The host key in `path`, created (32 random bytes, 0600) if missing. A key that is not a private
/// regular file of this user is replaced: artifacts made with the old one are then recompiled.
/// Runtimes that start at once (tests, or several processes) agree on one key: a new key is linked
/// into place only if none is there yet.
fn host_key(path: &Path) -> std::io::Result<[u8; 32]> {
    let read = || -> Option<[u8; 32]> {
        let mut file = open_nofollow(path).ok()?;
        let mut key = [0u8; 32];
        (check_private_file(&file).is_ok()
            && file.read_exact(&mut key).is_ok()
            && file.metadata().ok()?.len() == 32)
            .then_some(key)
    };
    if let Some(key) = read() {
        return Ok(key);
    }
    if std::fs::symlink_metadata(path).is_ok() {
        // Another runtime starting at the same moment may have made it since `read` looked.
        if let Some(key) = read() {
            return Ok(key);
        }
        tracing::warn!(path = %path.display(), "replacing an unusable artifact cache key; cached drivers will be compiled again");
        let _ = std::fs::remove_file(path);
    }
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| std::io::Error::other(e.to_string()))?;
    let tmp = write_temporary(path, &[&key])?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key),
        // Another runtime made one first: use it.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read().ok_or_else(|| std::io::Error::other("the artifact cache key is unusable"))
        }
        Err(e) => Err(e),
    }
}

/// Writes `parts` to a 0600 temporary file next to `path` and renames it over `path`.
fn write_atomically(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let tmp = write_temporary(path, parts)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Writes `parts`, synced, to a new 0600 file next to `path` with a name no other writer uses.
fn write_temporary(path: &Path, parts: &[&[u8]]) -> std::io::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    for part in parts {
        file.write_all(part)?;
    }
    file.sync_all()?;
    Ok(tmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    /// The smallest component there is.
    const EMPTY: &[u8] = b"\0asm\x0d\0\x01\0";

    #[test]
    fn runtimes_starting_at_once_agree_on_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
            let handles: Vec<_> =
                (0..8).map(|_| s.spawn(|| ArtifactCache::new(dir.path()).unwrap().key)).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]));
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(KEY_FILE)], "no temporary file is left");
    }

    #[test]
    fn the_host_key_is_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = ArtifactCache::new(dir.path()).unwrap();
        let meta = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let b = ArtifactCache::new(dir.path()).unwrap();
        assert_eq!(a.key, b.key);
    }

    #[test]
    fn an_artifact_is_cached_then_verified() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path()).unwrap();
        let engine = engine();
        let d = digest(EMPTY);
        assert_eq!(cache.load(&engine, EMPTY, &d).unwrap().1, Provenance::Compiled);
        let path = cache.path(&d, &engine);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(cache.load(&engine, EMPTY, &d).unwrap().1, Provenance::Cached);
    }

    #[test]
    fn a_flipped_byte_is_refused_and_recompiled() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path()).unwrap();
        let engine = engine();
        let d = digest(EMPTY);
        cache.load(&engine, EMPTY, &d).unwrap();
        let path = cache.path(&d, &engine);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.read_verified(&path, &d, &engine), Err(Rejected::Mac));
        assert_eq!(cache.load(&engine, EMPTY, &d).unwrap().1, Provenance::Compiled);
        assert_eq!(cache.load(&engine, EMPTY, &d).unwrap().1, Provenance::Cached);
    }

    #[test]
    fn an_artifact_made_with_another_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let d = digest(EMPTY);
        ArtifactCache::new(dir.path()).unwrap().load(&engine, EMPTY, &d).unwrap();
        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let other = ArtifactCache::new(dir.path()).unwrap();
        let path = other.path(&d, &engine);
        assert_eq!(other.read_verified(&path, &d, &engine), Err(Rejected::Mac));
    }

    #[test]
    fn a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path()).unwrap();
        let engine = engine();
        let d = digest(EMPTY);
        cache.load(&engine, EMPTY, &d).unwrap();
        let path = cache.path(&d, &engine);
        let real = dir.path().join("elsewhere.cwasm");
        std::fs::rename(&path, &real).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        assert_eq!(cache.read_verified(&path, &d, &engine), Err(Rejected::NotRegular));
        assert_eq!(cache.load(&engine, EMPTY, &d).unwrap().1, Provenance::Compiled);
        assert!(!std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    }

    #[test]
    fn a_group_writable_artifact_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ArtifactCache::new(dir.path()).unwrap();
        let engine = engine();
        let d = digest(EMPTY);
        cache.load(&engine, EMPTY, &d).unwrap();
        let path = cache.path(&d, &engine);
        std::fs::set_permissions(&path, PermissionsExt::from_mode(0o620)).unwrap();
        assert_eq!(cache.read_verified(&path, &d, &engine), Err(Rejected::Writable(0o620)));
    }
}

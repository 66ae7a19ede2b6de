//! The compiled-artifact cache: a driver is compiled once per (wasm digest, engine
//! compatibility) and loaded from disk afterwards, so a restart does not recompile.
//!
//! Only artifacts this host wrote are ever deserialised: the directory is the host's own (0700),
//! files are written to a temporary name and renamed, and a file that fails to load is replaced.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

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

/// Where compiled drivers are kept.
#[derive(Debug, Clone)]
pub(crate) struct ArtifactCache {
    dir: PathBuf,
}

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    Compiled,
    Cached,
}

impl ArtifactCache {
    pub(crate) fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        Ok(ArtifactCache { dir })
    }

    fn path(&self, digest: &str, engine: &Engine) -> PathBuf {
        self.dir.join(format!("{}-{}.cwasm", &digest[..32], engine_key(engine)))
    }

    /// Loads the compiled form of `wasm` from the cache, or compiles and stores it.
    pub(crate) fn load(
        &self,
        engine: &Engine,
        wasm: &[u8],
        digest: &str,
    ) -> Result<(Component, Provenance), wasmtime::Error> {
        let path = self.path(digest, engine);
        if path.exists() {
            // SAFETY: the file was produced by `Engine::precompile_component` of an engine with
            // the same compatibility key (it is in the name) and written by this host into its
            // own 0700 directory; wasmtime still checks the header and compatibility on load.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok((component, Provenance::Cached)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "discarding unusable cached driver artifact: {e}")
                }
            }
        }
        let bytes = engine.precompile_component(wasm)?;
        if let Err(e) = write_atomically(&path, &bytes) {
            tracing::warn!(path = %path.display(), "cannot cache compiled driver: {e}");
        }
        // SAFETY: `bytes` was produced just now by this engine.
        let component = unsafe { Component::deserialize(engine, &bytes)? };
        Ok((component, Provenance::Compiled))
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

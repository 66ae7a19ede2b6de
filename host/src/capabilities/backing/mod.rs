//! `berth:driver/backing-store`: sparse image files for volumes, kept by the host inside its data
//! directory, one directory per backend (`volumes/<backend>/`). A driver names a store; only this
//! module turns a name into a path, a valid name (see `berth_driver_sdk::names::check_store_name`)
//! can never leave the backend's directory, and a name that another backend's directory holds is
//! refused (`NotPermitted`) rather than silently made anew.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_driver_sdk::names::check_store_name;

use super::namespace::Namespace;

/// The largest store the host creates (64 TiB).
pub const MAX_SIZE: u64 = 64 << 40;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreInfo {
    pub name: String,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
}

/// A filesystem's size and free space, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub total_bytes: u64,
    pub free_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("no space: {0}")]
    NoSpace(String),
    #[error("failed: {0}")]
    Failed(String),
    /// The store belongs to another backend.
    #[error("{0}")]
    NotPermitted(String),
}

/// One backend's backing stores.
#[derive(Debug)]
pub struct BackingStores {
    /// `volumes/`: every backend's directory is in it.
    root: PathBuf,
    /// `volumes/<backend>/`.
    dir: PathBuf,
    namespace: Namespace,
    timeout: Duration,
}

impl BackingStores {
    /// The stores of the backend of `namespace` live in `root/<backend>/` (both created if
    /// needed, mode 0700); each operation times out after `timeout`.
    pub fn new(root: impl Into<PathBuf>, namespace: &Namespace, timeout: Duration) -> io::Result<Self> {
        let root = root.into();
        let dir = root.join(namespace.backend());
        for d in [&root, &dir] {
            std::fs::create_dir_all(d)?;
            std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        }
        Ok(BackingStores { root, dir, namespace: namespace.clone(), timeout })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The size of the filesystem that holds this backend's stores, and what of it is free to
    /// an unprivileged writer (`statvfs`'s `f_bavail`), in bytes.
    pub fn space(&self) -> io::Result<Space> {
        let path = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: `path` is a NUL-terminated string and `st` is written by statvfs before it is
        // read (only when it answers 0).
        let st = unsafe {
            if libc::statvfs(path.as_ptr(), st.as_mut_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
            st.assume_init()
        };
        let unit = st.f_frsize as u64;
        Ok(Space { total_bytes: st.f_blocks as u64 * unit, free_bytes: st.f_bavail as u64 * unit })
    }

    /// The host path of one of this backend's stores. Host-internal: drivers never see it. A name
    /// that this backend does not have but another backend does is refused.
    pub fn path(&self, name: &str) -> Result<PathBuf, StoreError> {
        check_store_name(name).map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
        let file = format!("{name}.img");
        let path = self.dir.join(&file);
        if !path.exists() && self.foreign(&file) {
            return Err(StoreError::NotPermitted(self.namespace.refuse(format!("store {name}")).to_string()));
        }
        Ok(path)
    }

    /// Whether another backend's directory holds `file`.
    fn foreign(&self, file: &str) -> bool {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return false };
        entries.flatten().any(|e| {
            e.path() != self.dir
                && e.file_type().is_ok_and(|t| t.is_dir())
                && std::fs::symlink_metadata(e.path().join(file)).is_ok()
        })
    }

    pub async fn create(&self, name: &str, size: u64) -> Result<StoreInfo, StoreError> {
        check_size(size)?;
        let path = self.path(name)?;
        let name = name.to_string();
        self.blocking(move || match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => {
                let sized = file.set_len(size).and_then(|()| file.sync_all());
                if let Err(e) = sized {
                    let _ = std::fs::remove_file(&path);
                    return Err(io_error(&name, e));
                }
                sync_dir(&path);
                info(&name, &path)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let existing = info(&name, &path)?;
                if existing.size_bytes == size {
                    Ok(existing)
                } else {
                    Err(StoreError::Conflict(format!(
                        "store {name} exists with {} bytes, not {size}",
                        existing.size_bytes
                    )))
                }
            }
            Err(e) => Err(io_error(&name, e)),
        })
        .await
    }

    pub async fn resize(&self, name: &str, size: u64) -> Result<StoreInfo, StoreError> {
        check_size(size)?;
        let path = self.path(name)?;
        let name = name.to_string();
        self.blocking(move || {
            let current = info(&name, &path)?;
            if size < current.size_bytes {
                return Err(StoreError::Conflict(format!(
                    "store {name} has {} bytes; shrinking to {size} is refused",
                    current.size_bytes
                )));
            }
            let file = std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| io_error(&name, e))?;
            file.set_len(size).and_then(|()| file.sync_all()).map_err(|e| io_error(&name, e))?;
            info(&name, &path)
        })
        .await
    }

    pub async fn delete(&self, name: &str) -> Result<(), StoreError> {
        let path = self.path(name)?;
        let name = name.to_string();
        self.blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(&path);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error(&name, e)),
        })
        .await
    }

    pub async fn info(&self, name: &str) -> Result<Option<StoreInfo>, StoreError> {
        let path = self.path(name)?;
        let name = name.to_string();
        self.blocking(move || match info(&name, &path) {
            Ok(info) => Ok(Some(info)),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        })
        .await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, tokio::task::spawn_blocking(f)).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(StoreError::Failed(format!("backing-store task failed: {join}"))),
            Err(_) => {
                Err(StoreError::Failed(format!("backing-store operation timed out after {:?}", self.timeout)))
            }
        }
    }
}

fn check_size(size: u64) -> Result<(), StoreError> {
    if size == 0 || !size.is_multiple_of(512) || size > MAX_SIZE {
        return Err(StoreError::InvalidArgument(format!(
            "size {size} must be a positive multiple of 512 bytes, at most {MAX_SIZE}"
        )));
    }
    Ok(())
}

fn info(name: &str, path: &Path) -> Result<StoreInfo, StoreError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| io_error(name, e))?;
    if !meta.file_type().is_file() {
        return Err(StoreError::Failed(format!("store {name} is not a regular file")));
    }
    Ok(StoreInfo { name: name.to_string(), size_bytes: meta.len(), allocated_bytes: meta.blocks() * 512 })
}

fn io_error(name: &str, e: io::Error) -> StoreError {
    match e.kind() {
        io::ErrorKind::NotFound => StoreError::NotFound(format!("no store named {name}")),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
            StoreError::NoSpace(format!("store {name}: {e}"))
        }
        _ => StoreError::Failed(format!("store {name}: {}", e.kind())),
    }
}

/// Makes a create or delete durable. Best effort: a failure here does not undo the operation.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespace(backend: &str) -> Namespace {
        Namespace::new(backend, &Default::default()).unwrap()
    }

    fn stores() -> (tempfile::TempDir, BackingStores) {
        let dir = tempfile::tempdir().unwrap();
        let stores =
            BackingStores::new(dir.path().join("volumes"), &namespace("b"), Duration::from_secs(5)).unwrap();
        (dir, stores)
    }

    #[tokio::test]
    async fn another_backends_stores_are_out_of_reach() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("volumes");
        let a = BackingStores::new(&root, &namespace("a"), Duration::from_secs(5)).unwrap();
        let b = BackingStores::new(&root, &namespace("b"), Duration::from_secs(5)).unwrap();
        a.create("volume-1", 4096).await.unwrap();
        for refused in [
            b.info("volume-1").await.map(drop),
            b.delete("volume-1").await,
            b.resize("volume-1", 8192).await.map(drop),
            b.create("volume-1", 4096).await.map(drop),
        ] {
            assert!(matches!(refused, Err(StoreError::NotPermitted(_))), "{refused:?}");
        }
        assert_eq!(a.info("volume-1").await.unwrap().unwrap().size_bytes, 4096);
        assert!(root.join("a/volume-1.img").exists());
        // Its own names are its own.
        b.create("volume-2", 4096).await.unwrap();
        assert!(root.join("b/volume-2.img").exists());
    }

    #[tokio::test]
    async fn create_is_sparse_and_idempotent() {
        let (_d, s) = stores();
        let a = s.create("volume-1", 1 << 30).await.unwrap();
        assert_eq!(a.size_bytes, 1 << 30);
        assert!(a.allocated_bytes < 1 << 20, "a new store must be sparse");
        assert_eq!(s.create("volume-1", 1 << 30).await.unwrap().size_bytes, 1 << 30);
        assert!(matches!(s.create("volume-1", 2 << 30).await, Err(StoreError::Conflict(_))));
    }

    #[tokio::test]
    async fn resize_grows_and_refuses_to_shrink() {
        let (_d, s) = stores();
        s.create("v", 1 << 20).await.unwrap();
        assert_eq!(s.resize("v", 2 << 20).await.unwrap().size_bytes, 2 << 20);
        assert!(matches!(s.resize("v", 1 << 20).await, Err(StoreError::Conflict(_))));
        assert!(matches!(s.resize("missing", 1 << 20).await, Err(StoreError::NotFound(_))));
    }

    #[tokio::test]
    async fn delete_is_idempotent_and_names_cannot_escape() {
        let (_d, s) = stores();
        s.create("v", 4096).await.unwrap();
        s.delete("v").await.unwrap();
        s.delete("v").await.unwrap();
        assert_eq!(s.info("v").await.unwrap(), None);
        for bad in ["../x", "/etc/passwd", "a/b", ".."] {
            assert!(matches!(s.create(bad, 4096).await, Err(StoreError::InvalidArgument(_))), "{bad}");
        }
        assert!(matches!(s.create("v", 1000).await, Err(StoreError::InvalidArgument(_))));
    }
}

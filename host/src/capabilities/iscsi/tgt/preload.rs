//! What a tgtd this service starts is started with: `tgtd-preload`, a library loaded into it
//! before its own code runs, which sizes tgtd's futex hash for its threads.
//!
//! Since Linux 6.16 each process hashes its futexes into a table of its own, of four buckets per
//! thread up to the number of online CPUs and at least 16: 16 on a two-CPU machine, whatever the
//! number of threads. tgtd runs `io_threads` threads per LUN, each waiting on a condition variable
//! of its own; with 10,000 LUNs and two threads each, 20,000 waiters shared 16 buckets, and every
//! wake-up walked a bucket of some 1,250 (each LUN's removal stops its threads, each I/O wakes
//! one). Measured at 10,000 live attachments: tgtd spent 2.2 to 3.6 ms of CPU per LUN added and
//! removed, against 0.4 ms with 32,768 buckets, and the detach took 6.0 to 7.0 ms against 2.5 ms on
//! an empty tgtd (BENCHMARKS.md, "tgtd's futex hash"). The size can only be set from inside the
//! process (`prctl(PR_FUTEX_HASH)`; `exec` starts a new address space), hence the library. On an
//! older kernel its `prctl` fails and tgtd runs as before.
//!
//! The library is embedded in this binary and written, when tgtd is started, into the data
//! directory (by a rename, named by its content), which only the user that runs Berth (root, to
//! start tgtd) may write.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The futex hash buckets tgtd gets: a power of two, two per thread of 8,192 LUNs at the default
/// two threads, fewer per thread beyond (some 64 bytes of kernel memory each: 2 MiB).
pub const FUTEX_SLOTS: u32 = 1 << 15;

/// The library (built by `build.rs` from `tgtd-preload/`).
const LIBRARY: &[u8] = include_bytes!(env!("BERTH_TGTD_PRELOAD"));

/// Writes the library into `dir` (if it is not there yet) and returns the environment to start
/// tgtd with.
pub fn environment(dir: &Path) -> std::io::Result<Vec<(&'static str, OsString)>> {
    let path = install(dir)?;
    Ok(vec![
        ("LD_PRELOAD", path.into_os_string()),
        ("BERTH_TGTD_FUTEX_SLOTS", FUTEX_SLOTS.to_string().into()),
    ])
}

/// The library's path in `dir`, written there first if needed: named by a digest of its bytes,
/// written whole under another name and renamed. A file already there is used only if it is a
/// regular file (not a symlink) of this user's, writable by nobody else, with the library's bytes;
/// anything else is replaced.
fn install(dir: &Path) -> std::io::Result<PathBuf> {
    use sha2::Digest;
    use std::os::unix::fs::MetadataExt;
    let name = hex::encode(&sha2::Sha256::digest(LIBRARY)[..8]);
    let path = dir.join(format!("berth-tgtd-preload-{name}.so"));
    // SAFETY: `geteuid` has no preconditions.
    let me = unsafe { libc::geteuid() };
    let trusted = std::fs::symlink_metadata(&path)
        .is_ok_and(|m| m.file_type().is_file() && m.uid() == me && m.mode() & 0o022 == 0);
    if trusted && std::fs::read(&path).is_ok_and(|bytes| bytes == LIBRARY) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(LIBRARY)?;
    file.as_file().sync_all()?;
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file().set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    file.persist(&path).map_err(|e| e.error)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The current process's futex hash buckets (`PR_FUTEX_HASH_GET_SLOTS`), as a program started
    /// with `env` sees them; `None` where the kernel has no `PR_FUTEX_HASH`. (A test's probe: the
    /// only process this room starts besides tgtd.)
    #[allow(clippy::disallowed_methods)]
    fn slots_seen_by_a_program_started_with(env: &[(&'static str, OsString)]) -> Option<i64> {
        let out = std::process::Command::new("python3")
            .args(["-c", "import ctypes; print(ctypes.CDLL(None).prctl(78, 2, 0, 0, 0))"])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .expect("python3 runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let slots: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        (slots >= 0).then_some(slots)
    }

    #[test]
    fn a_program_started_with_the_environment_has_the_futex_hash_of_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let env = environment(dir.path()).unwrap();
        match slots_seen_by_a_program_started_with(&[]) {
            Some(without) => {
                assert_ne!(i64::from(FUTEX_SLOTS), without);
                assert_eq!(slots_seen_by_a_program_started_with(&env), Some(i64::from(FUTEX_SLOTS)));
            }
            // A kernel before 6.16: the library loads and changes nothing.
            None => assert_eq!(slots_seen_by_a_program_started_with(&env), None),
        }
    }

    #[test]
    fn the_library_is_written_once_and_kept_whole() {
        let dir = tempfile::tempdir().unwrap();
        let first = install(dir.path()).unwrap();
        assert_eq!(std::fs::read(&first).unwrap(), LIBRARY);
        std::fs::write(&first, b"damaged").unwrap();
        let second = install(dir.path()).unwrap();
        assert_eq!(first, second);
        assert_eq!(std::fs::read(&second).unwrap(), LIBRARY, "a damaged copy is written again");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&second, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        install(dir.path()).unwrap();
        let mode = std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(&second).unwrap());
        assert_eq!(mode & 0o777, 0o644, "a copy others may write is replaced");
        let elsewhere = dir.path().join("elsewhere.so");
        std::fs::rename(&second, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &second).unwrap();
        install(dir.path()).unwrap();
        assert!(std::fs::symlink_metadata(&second).unwrap().file_type().is_file(), "a symlink is replaced");
        std::fs::remove_file(&elsewhere).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file is left");
    }
}

//! Loaded into tgtd (`LD_PRELOAD`) by the Berth that starts it, before tgtd's own code runs: sets
//! the size of tgtd's private futex hash to `BERTH_TGTD_FUTEX_SLOTS` buckets.
//!
//! Why: since Linux 6.16 a process's futexes hash into a table of its own, of
//! `4 x min(threads, online CPUs)` buckets and at least 16, whatever its number of threads. tgtd
//! runs `io_threads` threads per LUN, each waiting on a condition variable of its own, so with
//! 10,000 LUNs on a two-CPU machine 20,000 waiters share 16 buckets, and every wake-up (a LUN's
//! threads stopped when it is removed, an I/O handed to a thread) walks a bucket of some 1,250.
//! The size must be set from inside the process (`prctl(PR_FUTEX_HASH)` acts on the caller's
//! memory, and `exec` starts a new one), hence a library run at load. On an older kernel the
//! `prctl` fails and nothing changes. See `host/src/capabilities/iscsi/tgt/preload.rs`.

/// `PR_FUTEX_HASH` and its `PR_FUTEX_HASH_SET_SLOTS` (Linux 6.16, `include/uapi/linux/prctl.h`).
const PR_FUTEX_HASH: libc::c_int = 78;
const PR_FUTEX_HASH_SET_SLOTS: libc::c_ulong = 1;

/// Run by the dynamic loader when the library is loaded, before tgtd's `main`.
#[used]
#[unsafe(link_section = ".init_array")]
static AT_LOAD: extern "C" fn() = set_futex_slots;

extern "C" fn set_futex_slots() {
    // SAFETY: `getenv` with a NUL-terminated name; the loader runs this before any other thread.
    let value = unsafe { libc::getenv(c"BERTH_TGTD_FUTEX_SLOTS".as_ptr()) };
    if value.is_null() {
        return;
    }
    // SAFETY: `getenv` returned a NUL-terminated string that lives as long as the environment.
    let Some(slots) = unsafe { std::ffi::CStr::from_ptr(value) }.to_str().ok().and_then(|s| s.parse().ok())
    else {
        return;
    };
    let slots: libc::c_ulong = slots;
    // SAFETY: a `prctl` with integer arguments only; a kernel without it answers EINVAL.
    unsafe {
        libc::prctl(PR_FUTEX_HASH, PR_FUTEX_HASH_SET_SLOTS, slots, 0 as libc::c_ulong, 0 as libc::c_ulong)
    };
}

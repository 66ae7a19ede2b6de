//! A client of the Ceph cluster through librados (`librados.so.2`, Debian's `librados2`, which
//! `ceph-common` brings), loaded when a backend first needs it: `berth` itself does not link
//! Ceph, and a machine without it fails only the `cephx` capability's requests, saying what to
//! install. One connection per backend, kept between calls and made again after a failure;
//! every call is blocking and runs on tokio's blocking pool.

use std::ffi::{CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

type Handle = *mut c_void;

/// The librados functions the capability uses.
struct Api {
    _library: libloading::Library,
    create2: unsafe extern "C" fn(*mut Handle, *const c_char, *const c_char, u64) -> c_int,
    conf_read_file: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    conf_set: unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int,
    connect: unsafe extern "C" fn(Handle) -> c_int,
    shutdown: unsafe extern "C" fn(Handle),
    #[allow(clippy::type_complexity)]
    mon_command: unsafe extern "C" fn(
        Handle,
        *mut *const c_char,
        usize,
        *const c_char,
        usize,
        *mut *mut c_char,
        *mut usize,
        *mut *mut c_char,
        *mut usize,
    ) -> c_int,
    buffer_free: unsafe extern "C" fn(*mut c_char),
    ioctx_create: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int,
    ioctx_destroy: unsafe extern "C" fn(Handle),
    read: unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize, u64) -> c_int,
    #[allow(clippy::type_complexity)]
    exec: unsafe extern "C" fn(
        Handle,
        *const c_char,
        *const c_char,
        *const c_char,
        *const c_char,
        usize,
        *mut c_char,
        usize,
    ) -> c_int,
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        // SAFETY: librados' initialisers only set up its own state; the symbols below are read
        // with the signatures of librados.h (Ceph 14 to 19 keep them).
        unsafe {
            let library = libloading::Library::new("librados.so.2").map_err(|e| {
                format!("librados.so.2 cannot be loaded ({e}): install librados2 (ceph-common)")
            })?;
            macro_rules! sym {
                ($name:literal) => {
                    *library
                        .get(concat!($name, "\0").as_bytes())
                        .map_err(|e| format!("librados.so.2 has no {}: {e}", $name))?
                };
            }
            Ok(Api {
                create2: sym!("rados_create2"),
                conf_read_file: sym!("rados_conf_read_file"),
                conf_set: sym!("rados_conf_set"),
                connect: sym!("rados_connect"),
                shutdown: sym!("rados_shutdown"),
                mon_command: sym!("rados_mon_command"),
                buffer_free: sym!("rados_buffer_free"),
                ioctx_create: sym!("rados_ioctx_create"),
                ioctx_destroy: sym!("rados_ioctx_destroy"),
                read: sym!("rados_read"),
                exec: sym!("rados_exec"),
                _library: library,
            })
        }
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A failed librados call: its (positive) errno and what Ceph said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RadosError {
    pub(super) errno: i32,
    pub(super) message: String,
}

impl RadosError {
    fn new(errno: c_int, message: impl Into<String>) -> Self {
        RadosError { errno: errno.abs(), message: message.into() }
    }

    fn local(message: String) -> Self {
        RadosError { errno: 0, message }
    }
}

fn c(text: &str) -> Result<CString, RadosError> {
    CString::new(text).map_err(|_| RadosError::local(format!("{text:?} holds a NUL")))
}

/// One connected cluster handle.
struct Cluster {
    api: &'static Api,
    handle: Handle,
}

// SAFETY: a librados cluster handle may be used from several threads at once (librados.h:
// "the rados_t ... is thread-safe").
unsafe impl Send for Cluster {}
// SAFETY: as above.
unsafe impl Sync for Cluster {}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create2 and is shut down once, here.
        unsafe { (self.api.shutdown)(self.handle) }
    }
}

impl Cluster {
    fn connect(
        conf: &Path,
        name: &str,
        keyring: Option<&Path>,
        timeout: Duration,
    ) -> Result<Cluster, RadosError> {
        let api = api().map_err(RadosError::local)?;
        let (cluster, name) = (c("ceph")?, c(name)?);
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings and an out-pointer, as rados_create2 wants.
        let rc = unsafe { (api.create2)(&mut handle, cluster.as_ptr(), name.as_ptr(), 0) };
        if rc < 0 {
            return Err(RadosError::new(rc, "rados_create2"));
        }
        let this = Cluster { api, handle };
        let conf = c(&conf.display().to_string())?;
        // SAFETY: the handle is live and not yet connected; the path is NUL-terminated.
        let rc = unsafe { (api.conf_read_file)(handle, conf.as_ptr()) };
        if rc < 0 {
            return Err(RadosError::new(rc, "cannot read the ceph.conf"));
        }
        let seconds = timeout.as_secs().max(1).to_string();
        let mut settings = vec![
            ("client_mount_timeout", seconds.clone()),
            ("rados_mon_op_timeout", seconds.clone()),
            ("rados_osd_op_timeout", seconds),
            ("log_to_stderr", "false".into()),
            ("err_to_stderr", "false".into()),
            ("log_file", "".into()),
        ];
        if let Some(k) = keyring {
            settings.push(("keyring", k.display().to_string()));
        }
        for (key, value) in settings {
            let (k, v) = (c(key)?, c(&value)?);
            // SAFETY: the handle is live; both strings are NUL-terminated.
            let rc = unsafe { (api.conf_set)(handle, k.as_ptr(), v.as_ptr()) };
            if rc < 0 {
                return Err(RadosError::new(rc, format!("cannot set {key}")));
            }
        }
        // SAFETY: the handle is live and configured.
        let rc = unsafe { (api.connect)(handle) };
        if rc < 0 {
            return Err(RadosError::new(rc, "cannot connect to the cluster"));
        }
        Ok(this)
    }

    /// A monitor command (JSON) with its input, answering its output.
    fn mon_command(&self, command: &serde_json::Value, input: &[u8]) -> Result<Vec<u8>, RadosError> {
        let text = c(&command.to_string())?;
        let mut commands = [text.as_ptr()];
        let (mut out, mut out_len, mut status, mut status_len) =
            (std::ptr::null_mut(), 0usize, std::ptr::null_mut(), 0usize);
        // SAFETY: one NUL-terminated command, an input buffer of its length, out-pointers for the
        // answers.
        let rc = unsafe {
            (self.api.mon_command)(
                self.handle,
                commands.as_mut_ptr(),
                1,
                input.as_ptr().cast(),
                input.len(),
                &mut out,
                &mut out_len,
                &mut status,
                &mut status_len,
            )
        };
        let take = |buffer: *mut c_char, len: usize| -> Vec<u8> {
            if buffer.is_null() {
                return Vec::new();
            }
            // SAFETY: librados allocated `len` bytes at `buffer`; they are copied, then freed once.
            let bytes = unsafe { std::slice::from_raw_parts(buffer.cast::<u8>(), len).to_vec() };
            // SAFETY: a buffer librados returned, freed with its own function.
            unsafe { (self.api.buffer_free)(buffer) };
            bytes
        };
        let (out, status) = (take(out, out_len), take(status, status_len));
        if rc < 0 {
            return Err(RadosError::new(rc, String::from_utf8_lossy(&status).into_owned()));
        }
        Ok(out)
    }

    /// Runs `f` with an I/O context on `pool`.
    fn in_pool<T>(
        &self,
        pool: &str,
        f: impl FnOnce(Handle) -> Result<T, RadosError>,
    ) -> Result<T, RadosError> {
        let pool = c(pool)?;
        let mut io: Handle = std::ptr::null_mut();
        // SAFETY: the handle is connected; out-pointer for the I/O context.
        let rc = unsafe { (self.api.ioctx_create)(self.handle, pool.as_ptr(), &mut io) };
        if rc < 0 {
            return Err(RadosError::new(rc, "cannot open the pool"));
        }
        let r = f(io);
        // SAFETY: `io` came from rados_ioctx_create and is destroyed once.
        unsafe { (self.api.ioctx_destroy)(io) };
        r
    }

    /// The first `max` bytes of an object.
    fn read(&self, pool: &str, object: &str, max: usize) -> Result<Vec<u8>, RadosError> {
        let object = c(object)?;
        self.in_pool(pool, |io| {
            let mut buffer = vec![0u8; max];
            // SAFETY: `io` is live; the buffer has `max` writable bytes.
            let rc = unsafe { (self.api.read)(io, object.as_ptr(), buffer.as_mut_ptr().cast(), max, 0) };
            if rc < 0 {
                return Err(RadosError::new(rc, "cannot read the object"));
            }
            buffer.truncate(rc as usize);
            Ok(buffer)
        })
    }

    /// A method of an object class on an object (`rbd.dir_list` on `rbd_directory`), with an
    /// answer of at most `max` bytes.
    fn exec(
        &self,
        pool: &str,
        object: &str,
        class: &str,
        method: &str,
        input: &[u8],
        max: usize,
    ) -> Result<Vec<u8>, RadosError> {
        let (object, class, method) = (c(object)?, c(class)?, c(method)?);
        self.in_pool(pool, |io| {
            let mut buffer = vec![0u8; max];
            // SAFETY: `io` is live; NUL-terminated names; an input of its length; an output
            // buffer of `max` writable bytes.
            let rc = unsafe {
                (self.api.exec)(
                    io,
                    object.as_ptr(),
                    class.as_ptr(),
                    method.as_ptr(),
                    input.as_ptr().cast(),
                    input.len(),
                    buffer.as_mut_ptr().cast(),
                    max,
                )
            };
            if rc < 0 {
                return Err(RadosError::new(
                    rc,
                    format!("{}.{} failed", class.to_string_lossy(), method.to_string_lossy()),
                ));
            }
            buffer.truncate(rc as usize);
            Ok(buffer)
        })
    }
}

/// A backend's connection to its cluster: made at the first request, kept, and made again
/// after a request failed for a reason other than Ceph's answer.
pub(super) struct Connection {
    conf: std::path::PathBuf,
    name: String,
    keyring: Option<std::path::PathBuf>,
    timeout: Duration,
    cluster: Mutex<Option<Arc<Cluster>>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("conf", &self.conf)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Answers that say something about the request, not the connection.
const ANSWERS: [i32; 5] = [libc::ENOENT, libc::EACCES, libc::EPERM, libc::EINVAL, libc::EEXIST];

impl Connection {
    pub(super) fn new(conf: &Path, name: &str, keyring: Option<&Path>, timeout: Duration) -> Self {
        Connection {
            conf: conf.to_path_buf(),
            name: name.to_string(),
            keyring: keyring.map(Path::to_path_buf),
            timeout,
            cluster: Mutex::new(None),
        }
    }

    async fn with<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Cluster) -> Result<T, RadosError> + Send + 'static,
    ) -> Result<T, RadosError> {
        let this = self.clone();
        let limit = self.timeout * 2 + Duration::from_secs(1);
        let work = tokio::task::spawn_blocking(move || {
            let cluster = {
                let mut slot = this.cluster.lock().unwrap_or_else(|p| p.into_inner());
                match slot.as_ref() {
                    Some(c) => c.clone(),
                    None => {
                        let made = Arc::new(Cluster::connect(
                            &this.conf,
                            &this.name,
                            this.keyring.as_deref(),
                            this.timeout,
                        )?);
                        *slot = Some(made.clone());
                        made
                    }
                }
            };
            let r = f(&cluster);
            if let Err(e) = &r
                && !ANSWERS.contains(&e.errno)
            {
                this.cluster.lock().unwrap_or_else(|p| p.into_inner()).take();
            }
            r
        });
        match tokio::time::timeout(limit, work).await {
            Ok(joined) => joined.map_err(|e| RadosError::local(format!("the librados call failed: {e}")))?,
            Err(_) => {
                Err(RadosError::new(libc::ETIMEDOUT, format!("no answer from the cluster in {limit:?}")))
            }
        }
    }

    pub(super) async fn mon_command(
        self: &Arc<Self>,
        command: serde_json::Value,
        input: Vec<u8>,
    ) -> Result<Vec<u8>, RadosError> {
        self.with(move |c| c.mon_command(&command, &input)).await
    }

    pub(super) async fn read(
        self: &Arc<Self>,
        pool: &str,
        object: &str,
        max: usize,
    ) -> Result<Vec<u8>, RadosError> {
        let (pool, object) = (pool.to_string(), object.to_string());
        self.with(move |c| c.read(&pool, &object, max)).await
    }

    pub(super) async fn exec(
        self: &Arc<Self>,
        pool: &str,
        object: &str,
        (class, method): (&'static str, &'static str),
        input: Vec<u8>,
        max: usize,
    ) -> Result<Vec<u8>, RadosError> {
        let (pool, object) = (pool.to_string(), object.to_string());
        self.with(move |c| c.exec(&pool, &object, class, method, &input, max)).await
    }
}

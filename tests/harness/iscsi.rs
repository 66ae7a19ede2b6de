//! A real iSCSI initiator for tests: libiscsi (Debian `libiscsi-dev`), in userspace, logging in
//! with the connection information the API returned, and reading and writing blocks.

use std::ffi::{CStr, CString, c_char, c_int, c_void};

#[repr(C)]
struct ScsiIovec {
    base: *mut c_void,
    len: usize,
}

/// libiscsi's `struct unmap_list`: one range of blocks.
#[repr(C)]
struct UnmapList {
    lba: u64,
    num: u32,
}

#[link(name = "iscsi")]
unsafe extern "C" {
    fn iscsi_create_context(initiator_name: *const c_char) -> *mut c_void;
    fn iscsi_destroy_context(iscsi: *mut c_void) -> c_int;
    fn iscsi_set_targetname(iscsi: *mut c_void, targetname: *const c_char) -> c_int;
    fn iscsi_set_session_type(iscsi: *mut c_void, session_type: c_int) -> c_int;
    fn iscsi_set_header_digest(iscsi: *mut c_void, digest: c_int) -> c_int;
    fn iscsi_set_timeout(iscsi: *mut c_void, timeout: c_int) -> c_int;
    fn iscsi_set_noautoreconnect(iscsi: *mut c_void, state: c_int);
    fn iscsi_set_initiator_username_pwd(
        iscsi: *mut c_void,
        user: *const c_char,
        passwd: *const c_char,
    ) -> c_int;
    fn iscsi_full_connect_sync(iscsi: *mut c_void, portal: *const c_char, lun: c_int) -> c_int;
    fn iscsi_logout_sync(iscsi: *mut c_void) -> c_int;
    fn iscsi_get_error(iscsi: *mut c_void) -> *const c_char;
    fn iscsi_readcapacity16_sync(iscsi: *mut c_void, lun: c_int) -> *mut c_void;
    fn scsi_datain_unmarshall(task: *mut c_void) -> *mut c_void;
    fn scsi_task_get_status(task: *mut c_void, sense: *mut c_void) -> c_int;
    fn scsi_free_scsi_task(task: *mut c_void);
    fn iscsi_unmap_sync(
        iscsi: *mut c_void,
        lun: c_int,
        anchor: c_int,
        group: c_int,
        list: *mut UnmapList,
        list_len: c_int,
    ) -> *mut c_void;
    #[allow(clippy::too_many_arguments)]
    fn iscsi_write16_sync(
        iscsi: *mut c_void,
        lun: c_int,
        lba: u64,
        data: *mut u8,
        datalen: u32,
        blocksize: c_int,
        wrprotect: c_int,
        dpo: c_int,
        fua: c_int,
        fua_nv: c_int,
        group_number: c_int,
    ) -> *mut c_void;
    #[allow(clippy::too_many_arguments)]
    fn iscsi_read16_iov_sync(
        iscsi: *mut c_void,
        lun: c_int,
        lba: u64,
        datalen: u32,
        blocksize: c_int,
        rdprotect: c_int,
        dpo: c_int,
        fua: c_int,
        fua_nv: c_int,
        group_number: c_int,
        iov: *mut ScsiIovec,
        niov: c_int,
    ) -> *mut c_void;
}

const ISCSI_SESSION_NORMAL: c_int = 2;
const ISCSI_HEADER_DIGEST_NONE: c_int = 0;
pub const BLOCK: usize = 512;

/// A logged-in iSCSI session to one LUN.
pub struct Session {
    ctx: *mut c_void,
    lun: c_int,
}

// SAFETY: a libiscsi context is used by one thread at a time; `Session` is only moved.
unsafe impl Send for Session {}

/// What the API returned, as os-brick would use it.
#[derive(Debug, Clone)]
pub struct Target {
    pub portal: String,
    pub iqn: String,
    pub lun: i32,
    pub chap: Option<(String, String)>,
}

impl Target {
    /// From a flattened Cinder `connection_info`.
    pub fn from_connection_info(info: &serde_json::Value) -> Target {
        let chap = match info["auth_method"].as_str() {
            Some("CHAP") => Some((
                info["auth_username"].as_str().unwrap().to_string(),
                info["auth_password"].as_str().unwrap().to_string(),
            )),
            _ => None,
        };
        Target {
            portal: info["target_portal"].as_str().expect("target_portal").to_string(),
            iqn: info["target_iqn"].as_str().expect("target_iqn").to_string(),
            lun: info["target_lun"].as_i64().expect("target_lun") as i32,
            chap,
        }
    }

    pub fn with_secret(&self, secret: &str) -> Target {
        let chap = self.chap.as_ref().map(|(u, _)| (u.clone(), secret.to_string()));
        Target { chap, ..self.clone() }
    }
}

fn error(ctx: *mut c_void) -> String {
    // SAFETY: libiscsi returns a NUL-terminated string owned by the context.
    unsafe { CStr::from_ptr(iscsi_get_error(ctx)).to_string_lossy().into_owned() }
}

impl Session {
    /// Logs in as `initiator`. The error is libiscsi's message (e.g. "Authentication
    /// failure(513)", "Target not found(515)").
    pub fn login(target: &Target, initiator: &str) -> Result<Session, String> {
        Session::login_with(target, initiator, false)
    }

    /// Logs in as `initiator`, trying again every 100 ms for up to `wait` (a target being opened
    /// to logins again); the last error when it never gets in.
    pub fn login_within(
        target: &Target,
        initiator: &str,
        wait: std::time::Duration,
    ) -> Result<Session, String> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match Session::login(target, initiator) {
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(100))
                }
                outcome => return outcome,
            }
        }
    }

    /// Logs in as a host's initiator does: a session the target ends is logged in again, and the
    /// commands that were in flight are sent again (open-iscsi, QEMU's libiscsi).
    pub fn login_reconnecting(target: &Target, initiator: &str) -> Result<Session, String> {
        Session::login_with(target, initiator, true)
    }

    fn login_with(target: &Target, initiator: &str, reconnect: bool) -> Result<Session, String> {
        let initiator = CString::new(initiator).unwrap();
        let iqn = CString::new(target.iqn.clone()).unwrap();
        let portal = CString::new(target.portal.clone()).unwrap();
        // SAFETY: FFI with valid NUL-terminated strings; the context is destroyed on every path.
        unsafe {
            let ctx = iscsi_create_context(initiator.as_ptr());
            assert!(!ctx.is_null(), "iscsi_create_context failed");
            let session = Session { ctx, lun: target.lun };
            iscsi_set_targetname(ctx, iqn.as_ptr());
            iscsi_set_session_type(ctx, ISCSI_SESSION_NORMAL);
            iscsi_set_header_digest(ctx, ISCSI_HEADER_DIGEST_NONE);
            // A test's initiator gives up instead of reconnecting forever to a target that is
            // gone or that closed its session: the next I/O fails, within seconds.
            iscsi_set_timeout(ctx, 5);
            iscsi_set_noautoreconnect(ctx, i32::from(!reconnect));
            if let Some((user, secret)) = &target.chap {
                let (u, s) = (CString::new(user.clone()).unwrap(), CString::new(secret.clone()).unwrap());
                iscsi_set_initiator_username_pwd(ctx, u.as_ptr(), s.as_ptr());
            }
            if iscsi_full_connect_sync(ctx, portal.as_ptr(), target.lun) != 0 {
                return Err(error(ctx));
            }
            Ok(session)
        }
    }

    /// (blocks, block size) from READ CAPACITY (16).
    pub fn capacity(&self) -> Result<(u64, u32), String> {
        // SAFETY: the task is checked, unmarshalled, read and freed here; the struct's first two
        // fields are `uint64_t returned_lba; uint32_t block_length`.
        unsafe {
            let task = iscsi_readcapacity16_sync(self.ctx, self.lun);
            if task.is_null() || scsi_task_get_status(task, std::ptr::null_mut()) != 0 {
                let e = error(self.ctx);
                if !task.is_null() {
                    scsi_free_scsi_task(task);
                }
                return Err(e);
            }
            let rc = scsi_datain_unmarshall(task) as *const u64;
            let last_lba = *rc;
            let block = *(rc.add(1) as *const u32);
            scsi_free_scsi_task(task);
            Ok((last_lba + 1, block))
        }
    }

    pub fn write(&self, lba: u64, data: &[u8]) -> Result<(), String> {
        assert_eq!(data.len() % BLOCK, 0);
        let mut buf = data.to_vec();
        // SAFETY: the buffer outlives the synchronous call; the task is freed here.
        unsafe {
            let task = iscsi_write16_sync(
                self.ctx,
                self.lun,
                lba,
                buf.as_mut_ptr(),
                buf.len() as u32,
                BLOCK as c_int,
                0,
                0,
                0,
                0,
                0,
            );
            let ok = !task.is_null() && scsi_task_get_status(task, std::ptr::null_mut()) == 0;
            let e = if ok { None } else { Some(error(self.ctx)) };
            if !task.is_null() {
                scsi_free_scsi_task(task);
            }
            e.map_or(Ok(()), Err)
        }
    }

    /// UNMAP (SCSI's discard) of `blocks` blocks from `lba`.
    pub fn unmap(&self, lba: u64, blocks: u32) -> Result<(), String> {
        let mut list = UnmapList { lba, num: blocks };
        // SAFETY: the list outlives the synchronous call; the task is freed here.
        unsafe {
            let task = iscsi_unmap_sync(self.ctx, self.lun, 0, 0, &mut list, 1);
            let ok = !task.is_null() && scsi_task_get_status(task, std::ptr::null_mut()) == 0;
            let e = if ok { None } else { Some(error(self.ctx)) };
            if !task.is_null() {
                scsi_free_scsi_task(task);
            }
            e.map_or(Ok(()), Err)
        }
    }

    pub fn read(&self, lba: u64, len: usize) -> Result<Vec<u8>, String> {
        assert_eq!(len % BLOCK, 0);
        let mut buf = vec![0u8; len];
        let mut iov = ScsiIovec { base: buf.as_mut_ptr() as *mut c_void, len };
        // SAFETY: the buffer and iovec outlive the synchronous call; the task is freed here.
        unsafe {
            let task = iscsi_read16_iov_sync(
                self.ctx,
                self.lun,
                lba,
                len as u32,
                BLOCK as c_int,
                0,
                0,
                0,
                0,
                0,
                &mut iov,
                1,
            );
            let ok = !task.is_null() && scsi_task_get_status(task, std::ptr::null_mut()) == 0;
            let e = if ok { None } else { Some(error(self.ctx)) };
            if !task.is_null() {
                scsi_free_scsi_task(task);
            }
            e.map_or(Ok(buf), Err)
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the context was created by `login` and is destroyed once.
        unsafe {
            iscsi_logout_sync(self.ctx);
            iscsi_destroy_context(self.ctx);
        }
    }
}

//! tgtd's control protocol: the request `tgtadm` sends on tgtd's root-only Unix socket
//! (`/var/run/tgtd/socket.<port>`), and tgtd's answer (tgt `usr/tgtadm.h`, `struct tgtadm_req`
//! in its x86-64/aarch64 layout; `usr/mgmt.c` for how tgtd reads it). Every operation Berth needs
//! is one exchange on a fresh connection, so no `tgtadm` process is ever spawned and no CHAP
//! secret ever appears on a command line.
//!
//! The connection tells who answers: the peer's pid (`SO_PEERCRED`). A request can name the tgtd
//! it is meant for; when another daemon answers (tgtd was restarted, and its target ids may now
//! name other targets), the request is not sent ([`Failure::Restarted`]).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::Interest;

use super::super::TargetState;

/// `enum tgtadm_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    System = 0,
    Target = 1,
    Device = 2,
    Connection = 6,
    Account = 7,
}

/// `enum tgtadm_op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    New = 0,
    Delete = 1,
    Show = 2,
    Bind = 3,
    Unbind = 4,
    Update = 5,
    Stats = 6,
}

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub mode: Mode,
    pub op: Op,
    /// The target id; -1 for none.
    pub tid: i32,
    pub lun: Option<u64>,
    /// Session and connection ids (`--sid`, `--cid`), for connections.
    pub sid: u64,
    pub cid: u32,
    pub force: bool,
    /// `key=value` parameters, comma-separated, as `tgtadm` builds them.
    pub params: String,
}

impl Request {
    fn of(mode: Mode, op: Op, tid: i32, params: String) -> Request {
        Request { mode, op, tid, lun: None, sid: 0, cid: 0, force: false, params }
    }

    /// `tgtadm --op show --mode sys`.
    pub fn show_system() -> Request {
        Request::of(Mode::System, Op::Show, -1, String::new())
    }

    /// `tgtadm --lld iscsi --op show --mode target`: every target with its LUNs, ACL, accounts
    /// and sessions (tgtd has no such view of one target).
    pub fn show_targets() -> Request {
        Request::of(Mode::Target, Op::Show, -1, String::new())
    }

    pub fn new_target(tid: u32, iqn: &str) -> Request {
        Request::of(Mode::Target, Op::New, tid as i32, format!("targetname={iqn}"))
    }

    /// Deletes a target with its LUNs, closing its sessions (`--force`).
    pub fn delete_target(tid: u32) -> Request {
        Request { force: true, ..Request::of(Mode::Target, Op::Delete, tid as i32, String::new()) }
    }

    /// A LUN backed by the file at `path` (tgtd's default `rdwr` backing store).
    pub fn new_lun(tid: u32, lun: u32, path: &str) -> Request {
        Request {
            lun: Some(lun.into()),
            ..Request::of(Mode::Device, Op::New, tid as i32, format!("path={path}"))
        }
    }

    /// `tgtadm --op update --mode logicalunit --params thin_provisioning=1`: the LUN takes UNMAP,
    /// which tgtd's `rdwr` store turns into holes punched in the file (tgtd takes the parameter
    /// only as an update, not with the LUN's creation).
    pub fn thin_provisioning(tid: u32, lun: u32) -> Request {
        Request {
            lun: Some(lun.into()),
            ..Request::of(Mode::Device, Op::Update, tid as i32, "thin_provisioning=1".into())
        }
    }

    /// `tgtadm --op update --mode logicalunit --params online=0,path=<path>`: the LUN opens its
    /// file again and serves the file's size now (tgtd reads it only when it opens the file). tgtd
    /// takes a new path only from a LUN that is offline and puts it online again once the file is
    /// open; the LUN keeps its other settings (its serial, UNMAP) and its sessions stay.
    pub fn reopen(tid: u32, lun: u32, path: &str) -> Request {
        Request {
            lun: Some(lun.into()),
            ..Request::of(Mode::Device, Op::Update, tid as i32, format!("online=0,path={path}"))
        }
    }

    /// `tgtadm --op update --mode target --name state --value <state>`: `offline` refuses logins
    /// (sessions logged in stay), `ready` takes them again.
    pub fn target_state(tid: u32, state: &str) -> Request {
        Request::of(Mode::Target, Op::Update, tid as i32, format!("state={state}"))
    }

    pub fn delete_lun(tid: u32, lun: u32) -> Request {
        Request { lun: Some(lun.into()), ..Request::of(Mode::Device, Op::Delete, tid as i32, String::new()) }
    }

    pub fn bind_initiator(tid: u32, initiator: &str) -> Request {
        Request::of(Mode::Target, Op::Bind, tid as i32, format!("initiator-name={initiator}"))
    }

    pub fn unbind_initiator(tid: u32, initiator: &str) -> Request {
        Request::of(Mode::Target, Op::Unbind, tid as i32, format!("initiator-name={initiator}"))
    }

    /// A CHAP account. The secret travels only on the socket.
    pub fn new_account(user: &str, secret: &str) -> Request {
        Request::of(Mode::Account, Op::New, -1, format!("user={user},password={secret}"))
    }

    pub fn delete_account(user: &str) -> Request {
        Request::of(Mode::Account, Op::Delete, -1, format!("user={user}"))
    }

    /// Binds an incoming account to a target.
    pub fn bind_account(tid: u32, user: &str) -> Request {
        Request::of(Mode::Account, Op::Bind, tid as i32, format!("user={user}"))
    }

    pub fn unbind_account(tid: u32, user: &str) -> Request {
        Request::of(Mode::Account, Op::Unbind, tid as i32, format!("user={user}"))
    }

    /// The iSCSI connections of one target ("Session: N / Connection: M / Initiator: ...").
    pub fn show_connections(tid: u32) -> Request {
        Request::of(Mode::Connection, Op::Show, tid as i32, String::new())
    }

    /// `tgtadm --op stat --mode target --tid T`: a line per LUN and IT nexus (iSCSI session). tgtd
    /// finds the target in its list sorted by id, where the connections' listing walks its iSCSI
    /// targets in the order they were made: for a new target among 10,000, 1 ms less.
    pub fn target_stats(tid: u32) -> Request {
        Request::of(Mode::Target, Op::Stats, tid as i32, String::new())
    }

    /// `tgtadm --op delete --mode conn --tid T --sid S --cid C`: closes one connection.
    pub fn delete_connection(tid: u32, sid: u64, cid: u32) -> Request {
        Request { sid, cid, ..Request::of(Mode::Connection, Op::Delete, tid as i32, String::new()) }
    }

    pub fn show_accounts() -> Request {
        Request::of(Mode::Account, Op::Show, -1, String::new())
    }

    /// The request's bytes: the header, then the parameters NUL-terminated.
    pub fn encode(&self) -> Vec<u8> {
        let body_len = self.params.len() + 1;
        let mut h = vec![0u8; REQ_SIZE];
        h[0..4].copy_from_slice(&(self.mode as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&(self.op as u32).to_ne_bytes());
        h[8..13].copy_from_slice(b"iscsi"); // lld[64], NUL-padded
        h[72..76].copy_from_slice(&((REQ_SIZE + body_len) as u32).to_ne_bytes()); // len
        h[76..80].copy_from_slice(&self.tid.to_ne_bytes());
        h[80..88].copy_from_slice(&self.sid.to_ne_bytes());
        h[88..96].copy_from_slice(&self.lun.unwrap_or(u64::MAX).to_ne_bytes());
        h[96..100].copy_from_slice(&self.cid.to_ne_bytes());
        // host_no, device_type (disk = 0), ac_dir (incoming = 0), pack = 0
        h[116..120].copy_from_slice(&u32::from(self.force).to_ne_bytes());
        h.extend_from_slice(self.params.as_bytes());
        h.push(0);
        h
    }
}

/// One iSCSI connection of a target, from `show --mode conn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    pub sid: u64,
    pub cid: u32,
    pub initiator: String,
    /// The initiator's address, when tgtd names it.
    pub address: Option<String>,
}

/// Parses `show --mode conn --tid T`: `Session: S` / `Connection: C` / `Initiator: I` / address.
pub fn parse_connections(text: &str) -> Vec<Connection> {
    let mut out = Vec::new();
    let (mut sid, mut cid) = (None, None);
    for line in text.lines().map(str::trim) {
        if let Some(s) = line.strip_prefix("Session: ") {
            sid = s.trim().parse().ok();
        } else if let Some(c) = line.strip_prefix("Connection: ") {
            cid = c.trim().parse().ok();
        } else if let Some(i) = line.strip_prefix("Initiator: ")
            && let (Some(sid), Some(cid)) = (sid, cid)
        {
            let initiator = i.split_whitespace().next().unwrap_or_default().to_string();
            out.push(Connection { sid, cid, initiator, address: None });
        } else if let Some(a) = line.strip_prefix("IP Address: ")
            && let Some(last) = out.last_mut()
            && last.address.is_none()
        {
            last.address = Some(a.trim().to_string());
        }
    }
    out
}

/// The sessions (IT nexus ids) a target's statistics list ([`Request::target_stats`]): tgtd makes
/// an IT nexus with each iSCSI session and removes it with the session, and lists it under every
/// LUN, LUN 0 (the controller, never removed) included.
pub(super) fn parse_nexuses(text: &str) -> BTreeSet<u64> {
    text.lines()
        .filter(|l| !l.starts_with("tgt "))
        .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .collect()
}

/// `sizeof(struct tgtadm_req)`.
const REQ_SIZE: usize = 120;
/// The longest answer read from tgtd (a `show` of some tens of thousands of targets).
const MAX_ANSWER: usize = 256 << 20;

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answer {
    /// What `tgtadm` would print.
    pub text: String,
    /// The pid of the tgtd that answered.
    pub daemon: i32,
}

/// A failed exchange, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    AlreadyExists(String),
    NotFound(String),
    Timeout,
    /// The request was meant for tgtd with this pid, but another daemon answers now: tgtd was
    /// restarted. Nothing was sent.
    Restarted {
        expected: i32,
        found: i32,
    },
    Other(String),
}

impl Failure {
    /// Sorts tgtadm's messages (`tgtadm_strerror`) into the outcomes that matter.
    pub(super) fn classify(message: &str) -> Failure {
        let m = message.trim().trim_start_matches("tgtadm: ").to_string();
        const EXISTS: [&str; 5] = [
            "this target already exists",
            "this logical unit number already exists",
            "this access control rule already exists",
            "this account already exists",
            "this binding already exists",
        ];
        const MISSING: [&str; 5] = [
            "can't find the target",
            "can't find the logical unit",
            "this access control rule does not exist",
            "can't find the account",
            "can't find the binding",
        ];
        if EXISTS.iter().any(|e| m.contains(e)) {
            Failure::AlreadyExists(m)
        } else if MISSING.iter().any(|e| m.contains(e)) {
            Failure::NotFound(m)
        } else {
            Failure::Other(m)
        }
    }
}

/// tgtadm's messages for `enum tgtadm_errno` (tgt `usr/tgtadm_error.h`, `usr/tgtadm.c`,
/// `tgtadm_strerror`).
fn strerror(code: u32) -> &'static str {
    const MESSAGES: [&str; 26] = [
        "success",
        "unknown error",
        "out of memory",
        "can't find the driver",
        "can't find the target",
        "can't find the logical unit",
        "can't find the session",
        "can't find the connection",
        "can't find the binding",
        "this target already exists",
        "this logical unit number already exists",
        "this binding already exists",
        "this access control rule already exists",
        "this access control rule does not exist",
        "this account already exists",
        "can't find the account",
        "too many accounts",
        "invalid request",
        "this target already has an outgoing account",
        "this target is still active",
        "this logical unit is still active",
        "this driver is busy",
        "this operation isn't supported",
        "unknown parameter",
        "this device has Prevent Removal set",
        "(unknown tgtadm_errno)",
    ];
    MESSAGES.get(code as usize).copied().unwrap_or("(unknown tgtadm_errno)")
}

/// A client of one tgtd's control socket.
#[derive(Debug, Clone)]
pub(super) struct Control {
    pub socket: PathBuf,
    pub timeout: Duration,
}

impl Control {
    /// One exchange. With `daemon`, the request is sent only if that tgtd (by pid) answers.
    pub(super) async fn send(&self, request: &Request, daemon: Option<i32>) -> Result<Answer, Failure> {
        match tokio::time::timeout(self.timeout, self.exchange(&request.encode(), daemon)).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Timeout),
        }
    }

    /// The exchange is done at once, without the event loop, as far as the socket allows: the
    /// connection is made and the request written without waiting, and tgtd has often answered
    /// by the time it is read (woken by the request, it runs before its sender goes on). Only
    /// where a step would wait is the socket handed to the event loop (a registration and a
    /// wakeup of the task: two system calls and a switch more), which says when to go on.
    async fn exchange(&self, request: &[u8], daemon: Option<i32>) -> Result<Answer, Failure> {
        let mut exchange = Exchange { written: 0, got: Vec::new(), pid: 0 };
        let plain = match connect_at_once(&self.socket)? {
            Some(plain) => plain,
            // tgtd's queue of connections is full: wait for room.
            None => tokio::net::UnixStream::connect(&self.socket)
                .await
                .and_then(tokio::net::UnixStream::into_std)
                .map_err(cannot_connect)?,
        };
        exchange.pid = answering(peer_pid(&plain), daemon)?;
        if exchange.advance_on(&plain, request)? {
            return exchange.answer();
        }
        let waiting = tokio::net::UnixStream::from_std(plain)
            .map_err(|e| Failure::Other(format!("cannot wait for tgtd: {e}")))?;
        loop {
            let interest =
                if exchange.written < request.len() { Interest::WRITABLE } else { Interest::READABLE };
            waiting
                .ready(interest)
                .await
                .map_err(|e| Failure::Other(format!("cannot wait for tgtd: {e}")))?;
            if exchange.advance(request, |b| waiting.try_write(b), |b| waiting.try_read(b))? {
                return exchange.answer();
            }
        }
    }
}

/// How far an exchange with tgtd got: the request's bytes written, the answer's read.
struct Exchange {
    written: usize,
    got: Vec<u8>,
    /// The daemon that answers.
    pid: i32,
}

impl Exchange {
    /// Writes and reads what the socket takes and has now; whether the answer is complete
    /// (`false`: the socket would wait).
    fn advance(
        &mut self,
        request: &[u8],
        mut write: impl FnMut(&[u8]) -> std::io::Result<usize>,
        mut read: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
    ) -> Result<bool, Failure> {
        use std::io::ErrorKind;
        while self.written < request.len() {
            match write(&request[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::Other(format!("write to tgtd: {e}"))),
            }
        }
        let mut chunk = [0u8; 4096];
        while !self.complete()? {
            match read(&mut chunk) {
                Ok(0) => return Err(closed_early()),
                Ok(n) => self.got.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::Other(format!("read from tgtd: {e}"))),
            }
        }
        Ok(true)
    }

    /// [`Exchange::advance`] on a socket outside the event loop (nonblocking).
    fn advance_on(
        &mut self,
        stream: &std::os::unix::net::UnixStream,
        request: &[u8],
    ) -> Result<bool, Failure> {
        use std::io::{Read, Write};
        self.advance(request, |b| (&*stream).write(b), |b| (&*stream).read(b))
    }

    /// The answer's length (its header included), once its header is read.
    fn length(&self) -> Result<Option<usize>, Failure> {
        let Some(header) = self.got.get(..8) else { return Ok(None) };
        let len = u32::from_ne_bytes(header[4..8].try_into().expect("4 bytes")) as usize;
        if len > MAX_ANSWER {
            return Err(Failure::Other(format!("tgtd's answer is too long ({len} bytes)")));
        }
        Ok(Some(len.max(8)))
    }

    fn complete(&self) -> Result<bool, Failure> {
        Ok(self.length()?.is_some_and(|len| self.got.len() >= len))
    }

    fn answer(self) -> Result<Answer, Failure> {
        let len = self.length()?.expect("a complete answer has its header");
        let err = u32::from_ne_bytes(self.got[0..4].try_into().expect("4 bytes"));
        match err {
            0 => Ok(Answer {
                text: String::from_utf8_lossy(&self.got[8..len]).trim_end_matches('\0').to_string(),
                daemon: self.pid,
            }),
            code => Err(Failure::classify(strerror(code))),
        }
    }
}

/// A connection to the socket at `path`, made without waiting; `None` when tgtd's queue of
/// connections is full (the caller waits for room).
fn connect_at_once(path: &std::path::Path) -> Result<Option<std::os::unix::net::UnixStream>, Failure> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let socket = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None).map_err(cannot_connect)?;
    match socket.connect(&SockAddr::unix(path).map_err(cannot_connect)?) {
        Ok(()) => Ok(Some(socket.into())),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(cannot_connect(e)),
    }
}

/// The pid of the process at the other end of a Unix socket (`SO_PEERCRED`).
fn peer_pid(stream: &std::os::unix::net::UnixStream) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and the descriptor is
    // open for the duration of the call (`stream` is borrowed).
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(cred.pid)
}

/// The daemon that answers, if it is the one the request is meant for.
fn answering(pid: Option<i32>, daemon: Option<i32>) -> Result<i32, Failure> {
    let pid =
        pid.ok_or_else(|| Failure::Other("cannot tell which process answers on tgtd's socket".into()))?;
    match daemon {
        Some(expected) if expected != pid => Err(Failure::Restarted { expected, found: pid }),
        _ => Ok(pid),
    }
}

fn cannot_connect(e: std::io::Error) -> Failure {
    Failure::Other(format!("cannot connect to tgtd's control socket: {e}"))
}

fn closed_early() -> Failure {
    Failure::Other("read from tgtd: the connection was closed before the whole answer".into())
}

/// A LUN's size as tgtd shows it (`Size: N MB`, `print_disksize` in tgt's `usr/target.c`: its
/// own rounding of 512-byte sectors to about 10^6 bytes).
pub fn shown_megabytes(bytes: u64) -> u64 {
    let sectors = bytes / 512;
    // tgtd computes `(s - (s / 625 - 974)) / 1950` in wrapping 64-bit arithmetic: the same.
    (sectors - sectors / 625 + 974) / 1950
}

/// Parses `tgtadm --lld iscsi --op show --mode target`.
pub fn parse_show(out: &str) -> Vec<TargetState> {
    #[derive(PartialEq)]
    enum Section {
        Other,
        System,
        Nexus,
        Lun,
        Account,
        Acl,
    }
    let mut targets: Vec<TargetState> = Vec::new();
    let mut section = Section::Other;
    let mut lun: Option<u32> = None;
    let mut size: Option<u64> = None;
    for line in out.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if indent == 0 {
            if let Some(rest) = text.strip_prefix("Target ")
                && let Some((tid, iqn)) = rest.split_once(": ")
            {
                targets.push(TargetState {
                    iqn: iqn.trim().to_string(),
                    tid: tid.parse().unwrap_or(0),
                    ..Default::default()
                });
            }
            section = Section::Other;
            continue;
        }
        let Some(target) = targets.last_mut() else { continue };
        if indent == 4 {
            section = match text {
                "System information:" => Section::System,
                "I_T nexus information:" => Section::Nexus,
                "LUN information:" => Section::Lun,
                "Account information:" => Section::Account,
                "ACL information:" => Section::Acl,
                _ => Section::Other,
            };
            continue;
        }
        match section {
            Section::System if indent == 8 => {
                if let Some(state) = text.strip_prefix("State: ") {
                    target.offline = state == "offline";
                }
            }
            Section::Nexus if indent == 8 && text.starts_with("I_T nexus:") => target.sessions += 1,
            Section::Lun if indent == 8 => {
                lun = text.strip_prefix("LUN: ").and_then(|n| n.parse().ok());
                size = None;
            }
            Section::Lun if indent == 12 => {
                if let Some(shown) = text.strip_prefix("Size: ") {
                    size = shown.split_once(" MB").and_then(|(mb, _)| mb.parse().ok());
                }
                if let (Some(l), Some(path)) = (lun, text.strip_prefix("Backing store path: "))
                    && l != 0
                    && path != "None"
                {
                    target.luns.push((l, path.to_string()));
                    if let Some(mb) = size {
                        target.lun_sizes.push((l, mb));
                    }
                }
            }
            Section::Account if indent == 8 && !text.ends_with("(outgoing)") => {
                target.chap_users.push(text.to_string())
            }
            Section::Acl if indent == 8 => target.initiators.push(text.to_string()),
            _ => {}
        }
    }
    targets
}

/// Parses `tgtadm --op show --mode account` (incoming accounts).
pub fn parse_accounts(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.starts_with("Account list"))
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.ends_with("(outgoing)"))
        .map(str::to_string)
        .collect()
}

impl Failure {
    /// The capability's error for a failed operation `what`.
    pub(super) fn into_error(self, what: &str) -> super::super::TargetError {
        use super::super::TargetError;
        match self {
            Failure::AlreadyExists(m) | Failure::Other(m) => TargetError::Failed(format!("{what}: {m}")),
            Failure::NotFound(m) => TargetError::NotFound(format!("{what}: {m}")),
            Failure::Timeout => TargetError::Timeout(format!("{what}: tgtd did not answer in time")),
            Failure::Restarted { .. } => {
                TargetError::Failed(format!("{what}: tgtd restarted during the change"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn connections_are_read_from_tgtds_listing() {
        let text = "Session: 3\n    Connection: 0\n        Initiator: iqn.1993-08.org.debian:01:alice\n        IP Address: 127.0.0.1\nSession: 4\n    Connection: 1\n        Initiator: iqn.1993-08.org.debian:01:bob\n        IP Address: 127.0.0.1\n";
        let c = parse_connections(text);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].sid, c[0].cid, c[0].initiator.as_str()), (3, 0, "iqn.1993-08.org.debian:01:alice"));
        assert_eq!((c[1].sid, c[1].cid, c[1].initiator.as_str()), (4, 1, "iqn.1993-08.org.debian:01:bob"));
        assert_eq!(c[0].address.as_deref(), Some("127.0.0.1"));
    }

    #[test]
    fn a_connection_delete_carries_sid_and_cid_where_tgtd_reads_them() {
        let bytes = Request::delete_connection(7, 0x0102, 3).encode();
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()), Mode::Connection as u32);
        assert_eq!(u32::from_ne_bytes(bytes[4..8].try_into().unwrap()), Op::Delete as u32);
        assert_eq!(i32::from_ne_bytes(bytes[76..80].try_into().unwrap()), 7);
        assert_eq!(u64::from_ne_bytes(bytes[80..88].try_into().unwrap()), 0x0102);
        assert_eq!(u32::from_ne_bytes(bytes[96..100].try_into().unwrap()), 3);
    }

    use super::*;

    #[test]
    fn a_targets_sessions_are_read_from_its_statistics() {
        // tgtadm --op stat --mode target, a session of sid 3 on a target with LUNs 0 and 1.
        let text = "tgt lun sid rd_subm(bytes,cmds) rd_done(bytes,cmds) wr_subm(bytes,cmds) wr_done(bytes,cmds) errs\n\
                      7   0   3            0      0            0      0            0      0            0      0    0\n\
                      7   1   3        36864      9        36864      9         4096      1         4096      1    0\n";
        assert_eq!(parse_nexuses(text), BTreeSet::from([3]));
        let none = "tgt lun sid rd_subm(bytes,cmds) rd_done(bytes,cmds) wr_subm(bytes,cmds) wr_done(bytes,cmds) errs\n";
        assert!(parse_nexuses(none).is_empty());
        assert_eq!(Request::target_stats(7).encode()[4..8], 6u32.to_ne_bytes(), "OP_STATS");
    }

    const SHOW: &str = "Target 1: iqn.2010-10.org.openstack:volume-abc
    System information:
        Driver: iscsi
        State: ready
        Nop interval: 2147483647
        Nop count: 0
    I_T nexus information:
        I_T nexus: 3
            Initiator: iqn.1993-08.org.debian:01:aaa alias: host
            Connection: 0
                IP Address: 127.0.0.1
    LUN information:
        LUN: 0
            Type: controller
            Backing store type: null
            Backing store path: None
            Backing store flags: 
        LUN: 1
            Type: disk
            Size: 1074 MB, Block size: 512
            Backing store type: rdwr
            Backing store path: /var/lib/berth/volumes/volume-abc.img
            Backing store flags: 
    Account information:
        userA
        userB (outgoing)
    ACL information:
        iqn.1993-08.org.debian:01:aaa
Target 2: iqn.2010-10.org.openstack:volume-def
    System information:
        Driver: iscsi
        State: offline
    I_T nexus information:
    LUN information:
        LUN: 0
            Backing store path: None
    Account information:
    ACL information:
";

    /// (Target 1 as tgtd shows it when started with [`super::super::ISCSI_NOP_NEVER`].)
    #[test]
    fn show_output_is_parsed_per_target() {
        let t = parse_show(SHOW);
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].iqn, "iqn.2010-10.org.openstack:volume-abc");
        assert_eq!(t[0].tid, 1);
        assert_eq!(t[0].sessions, 1);
        assert_eq!(t[0].luns, vec![(1, "/var/lib/berth/volumes/volume-abc.img".to_string())]);
        assert_eq!(t[0].chap_users, vec!["userA".to_string()]);
        assert_eq!(t[0].initiators, vec!["iqn.1993-08.org.debian:01:aaa".to_string()]);
        assert_eq!(t[0].lun_sizes, vec![(1, 1074)]);
        assert_eq!(t[1].tid, 2);
        assert!(t[1].luns.is_empty() && t[1].initiators.is_empty() && t[1].sessions == 0);
        assert_eq!((t[0].offline, t[1].offline), (false, true));
    }

    #[test]
    fn sizes_are_rounded_as_tgtd_shows_them() {
        // Read off a real tgtd (tgt-notes.md, tests/tgt.rs): 1 GiB, 2 GiB, 3 GiB, 10 MiB.
        for (bytes, shown) in [(1u64 << 30, 1074), (2 << 30, 2147), (3 << 30, 3221), (10 << 20, 10)] {
            assert_eq!(shown_megabytes(bytes), shown, "{bytes}");
        }
        assert_eq!(shown_megabytes(0), 0);
    }

    #[test]
    fn accounts_are_parsed_without_outgoing_ones() {
        assert_eq!(
            parse_accounts("Account list:\n    alice\n    bob (outgoing)\n"),
            vec!["alice".to_string()]
        );
    }

    #[test]
    fn tgtadm_messages_are_classified() {
        assert!(matches!(Failure::classify("tgtadm: this target already exists"), Failure::AlreadyExists(_)));
        assert!(matches!(Failure::classify("tgtadm: can't find the target"), Failure::NotFound(_)));
        assert!(matches!(
            Failure::classify("tgtadm: this access control rule does not exist"),
            Failure::NotFound(_)
        ));
        assert!(matches!(Failure::classify("tgtadm: out of memory"), Failure::Other(_)));
    }

    /// The bytes `tgtadm --lld iscsi --mode logicalunit --op new --tid 3 --lun 1 -b <path>` sends.
    #[test]
    fn requests_match_tgtadms_layout() {
        let r = Request::new_lun(3, 1, "/x.img").encode();
        let u32_at = |i: usize| u32::from_ne_bytes(r[i..i + 4].try_into().unwrap());
        assert_eq!(u32_at(0), Mode::Device as u32);
        assert_eq!(u32_at(4), Op::New as u32);
        assert_eq!(&r[8..14], b"iscsi\0");
        assert_eq!(u32_at(72) as usize, r.len());
        assert_eq!(i32::from_ne_bytes(r[76..80].try_into().unwrap()), 3);
        assert_eq!(u64::from_ne_bytes(r[88..96].try_into().unwrap()), 1);
        assert_eq!(u32_at(116), 0, "no force");
        assert_eq!(&r[120..], b"path=/x.img\0");
        // `tgtadm --mode logicalunit --op update --tid 3 --lun 1 --params thin_provisioning=1`.
        let t = Request::thin_provisioning(3, 1).encode();
        assert_eq!(
            (
                u32::from_ne_bytes(t[0..4].try_into().unwrap()),
                u32::from_ne_bytes(t[4..8].try_into().unwrap())
            ),
            (Mode::Device as u32, 5)
        );
        assert_eq!(u64::from_ne_bytes(t[88..96].try_into().unwrap()), 1);
        assert_eq!(&t[120..], b"thin_provisioning=1\0");
        let d = Request::delete_target(7).encode();
        assert_eq!(u32::from_ne_bytes(d[116..120].try_into().unwrap()), 1, "force");
        assert_eq!(u64::from_ne_bytes(d[88..96].try_into().unwrap()), u64::MAX, "no LUN");
        let a = Request::new_account("u", "s").encode();
        assert_eq!(i32::from_ne_bytes(a[76..80].try_into().unwrap()), -1);
    }

    /// A stand-in for tgtd's control socket, framed as tgtd frames its answers (a header of the
    /// error code and the answer's whole length, then the text), answering each connection as
    /// `answer` says: with a pause before answering, or between its header and its text, to
    /// reach both the exchange done at once and the one handed to the event loop.
    mod control_socket {
        use std::io::{Read, Write};
        use std::os::unix::net::UnixListener;
        use std::time::Duration;

        pub(super) struct Answer {
            pub(super) err: u32,
            pub(super) text: &'static str,
            pub(super) before: Duration,
            pub(super) between: Option<Duration>,
            /// Close after the header, the text never sent.
            pub(super) truncated: bool,
        }

        pub(super) fn serve(dir: &tempfile::TempDir, answers: Vec<Answer>) -> std::path::PathBuf {
            let path = dir.path().join("socket.0");
            let listener = UnixListener::bind(&path).unwrap();
            std::thread::spawn(move || {
                for answer in answers {
                    let (mut conn, _) = listener.accept().unwrap();
                    let mut header = [0u8; super::super::REQ_SIZE];
                    conn.read_exact(&mut header).unwrap();
                    let len = u32::from_ne_bytes(header[72..76].try_into().unwrap()) as usize;
                    let mut params = vec![0u8; len - super::super::REQ_SIZE];
                    conn.read_exact(&mut params).unwrap();
                    std::thread::sleep(answer.before);
                    let mut body = answer.text.as_bytes().to_vec();
                    body.push(0);
                    let mut rsp = answer.err.to_ne_bytes().to_vec();
                    rsp.extend_from_slice(&((8 + body.len()) as u32).to_ne_bytes());
                    conn.write_all(&rsp).unwrap();
                    if answer.truncated {
                        continue;
                    }
                    if let Some(pause) = answer.between {
                        std::thread::sleep(pause);
                    }
                    conn.write_all(&body).unwrap();
                }
            });
            path
        }
    }

    #[tokio::test]
    async fn an_exchange_reads_tgtds_answer_whether_it_is_there_at_once_or_comes_later() {
        use control_socket::{Answer, serve};
        let at_once = Duration::ZERO;
        let later = Duration::from_millis(50);
        let dir = tempfile::tempdir().unwrap();
        let long = "x".repeat(300_000).leak();
        let answers = vec![
            Answer { err: 0, text: "at once", before: at_once, between: None, truncated: false },
            Answer { err: 0, text: "later", before: later, between: None, truncated: false },
            Answer { err: 0, text: "in two parts", before: at_once, between: Some(later), truncated: false },
            Answer { err: 0, text: long, before: at_once, between: None, truncated: false },
            Answer { err: 9, text: "", before: at_once, between: None, truncated: false },
            Answer { err: 9, text: "", before: later, between: None, truncated: false },
            Answer { err: 0, text: "never whole", before: at_once, between: None, truncated: true },
        ];
        let control = Control { socket: serve(&dir, answers), timeout: Duration::from_secs(10) };
        let me = std::process::id() as i32;
        let show = Request::show_targets();
        for expected in ["at once", "later", "in two parts", long] {
            let answer = control.send(&show, Some(me)).await.unwrap();
            assert_eq!((answer.text.as_str(), answer.daemon), (expected, me));
        }
        for _ in 0..2 {
            assert_eq!(
                control.send(&show, None).await,
                Err(Failure::AlreadyExists("this target already exists".into())),
                "tgtd's error code, read at once and later"
            );
        }
        let Err(Failure::Other(m)) = control.send(&show, None).await else { panic!("a truncated answer") };
        assert!(m.contains("closed before the whole answer"), "{m}");
    }

    #[test]
    fn an_answer_already_there_is_read_without_waiting() {
        use std::io::Write;
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let request = Request::show_targets().encode();
        let mut exchange = Exchange { written: 0, got: Vec::new(), pid: 7 };
        assert!(!exchange.advance_on(&ours, &request).unwrap(), "no answer yet: the exchange waits");
        assert_eq!(exchange.written, request.len(), "the request is written at once");
        let mut rsp = 0u32.to_ne_bytes().to_vec();
        rsp.extend_from_slice(&(8u32 + 6).to_ne_bytes());
        theirs.write_all(&rsp).unwrap();
        assert!(!exchange.advance_on(&ours, &request).unwrap(), "a header alone is not an answer");
        theirs.write_all(b"tid 1\0").unwrap();
        assert!(exchange.advance_on(&ours, &request).unwrap(), "the whole answer is there");
        assert_eq!(exchange.answer(), Ok(Answer { text: "tid 1".into(), daemon: 7 }));
    }

    #[tokio::test]
    async fn a_request_meant_for_another_tgtd_is_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("socket.0");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let control = Control { socket: path, timeout: Duration::from_secs(10) };
        let me = std::process::id() as i32;
        let sent = control.send(&Request::delete_target(1), Some(me + 1)).await;
        assert_eq!(sent, Err(Failure::Restarted { expected: me + 1, found: me }));
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut conn, &mut got).unwrap();
        assert!(got.is_empty(), "nothing was written to the other daemon: {} bytes", got.len());
    }

    #[tokio::test]
    async fn no_daemon_on_the_socket_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control { socket: dir.path().join("socket.0"), timeout: Duration::from_secs(10) };
        let Err(Failure::Other(m)) = control.send(&Request::show_targets(), None).await else {
            panic!("no socket")
        };
        assert!(m.starts_with("cannot connect to tgtd's control socket"), "{m}");
    }
}

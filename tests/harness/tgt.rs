//! A real tgtd for tests: its own control port and loopback portal, stopped (and its state lost,
//! as in a crash) when dropped or when the test process exits: it runs under a shell that kills
//! it when a pipe held by this process closes, and it dies with that shell if the shell is killed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth::capabilities::iscsi::TargetState;
use berth::capabilities::iscsi::tgt::{listens_on, parse_show};

use crate::process::BerthProcess;
use crate::server::Client;

/// What tgtd is started with, as `berth serve` starts it (`[tgt] start = true`): its futex hash
/// sized by the preloaded library (`capabilities/iscsi/tgt/preload.rs`). The shell that starts
/// tgtd gets the library's path as `TGTD_PRELOAD` and hands it to tgtd alone as `LD_PRELOAD`.
/// `BERTH_BENCH_TGTD_PRELOAD=0` starts tgtd without it, to measure what the library changes.
fn preload() -> Vec<(&'static str, std::ffi::OsString)> {
    if std::env::var("BERTH_BENCH_TGTD_PRELOAD").as_deref() == Ok("0") {
        return Vec::new();
    }
    let dir = std::env::temp_dir().join("berth-tests-tgtd-preload");
    let environment =
        berth::capabilities::iscsi::tgt::preload::environment(&dir).expect("write tgtd's preload library");
    environment
        .into_iter()
        .map(|(name, value)| (if name == "LD_PRELOAD" { "TGTD_PRELOAD" } else { name }, value))
        .collect()
}

/// The id of the tgtd process on `control_port`, whoever started it.
pub fn tgtd_pid(control_port: u16) -> Option<u32> {
    let wanted = format!("-C\0{control_port}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        (cmdline.starts_with("/usr/sbin/tgtd\0") && cmdline.contains(&wanted)).then_some(pid)
    })
}

pub struct TgtdProcess {
    child: Option<Child>,
    pub control_port: u16,
    pub portal_port: u16,
    /// I/O threads per LUN (`tgtd -t`): thousands of LUNs need few (see `[tgt] io_threads`).
    pub io_threads: u32,
}

impl TgtdProcess {
    /// With Berth's default I/O threads per LUN (`[tgt] io_threads`).
    pub fn start() -> TgtdProcess {
        Self::start_with_threads(2)
    }

    pub fn start_with_threads(io_threads: u32) -> TgtdProcess {
        let control_port = loop {
            let n = 1_000 + (rand_u32() % 31_000) as u16; // tgtd -C takes a short
            if !Path::new(&format!("/var/run/tgtd/socket.{n}")).exists() {
                break n;
            }
        };
        let mut t = TgtdProcess { child: None, control_port, portal_port: portal_port(), io_threads };
        // Another process may take the portal's port between the choice and tgtd's bind.
        for _ in 0..5 {
            if t.spawn() {
                return t;
            }
            t.kill();
            t.portal_port = portal_port();
        }
        panic!("tgtd could not bind a portal in five tries");
    }

    /// Starts tgtd and waits until it answers; whether it holds its portal (a tgtd that cannot
    /// bind it runs on without it).
    fn spawn(&mut self) -> bool {
        assert!(
            Path::new("/usr/sbin/tgtd").exists(),
            "tgtd is not installed (Debian package tgt); run .ci/setup"
        );
        let (c, p, t) = (self.control_port, self.portal_port, self.io_threads);
        // As a tgtd Berth starts: its listing stops at each target's NOP settings.
        let nop = berth::capabilities::iscsi::tgt::ISCSI_NOP_NEVER;
        let script = format!(
            "rm -f /var/run/tgtd/socket.{c} /var/run/tgtd/socket.{c}.lock; \
             LD_PRELOAD=\"$TGTD_PRELOAD\" setpriv --pdeathsig KILL /usr/sbin/tgtd -f -C {c} -t {t} --iscsi portal=127.0.0.1:{p},{nop} >/dev/null 2>&1 & pid=$!; \
             cat >/dev/null; kill -KILL $pid; wait $pid; rm -f /var/run/tgtd/socket.{c} /var/run/tgtd/socket.{c}.lock"
        );
        let child = Command::new("sh")
            .args(["-c", &script])
            .envs(preload())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start tgtd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.tgtadm(&["--op", "show", "--mode", "sys"]).status.success() {
            assert!(Instant::now() < deadline, "tgtd did not answer on control port {c}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            if self.pid().is_some_and(|pid| i32::try_from(pid).is_ok_and(|pid| listens_on(pid, p))) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The tgtd process's id (it runs under a shell that stops it with the test).
    pub fn pid(&self) -> Option<u32> {
        tgtd_pid(self.control_port)
    }

    /// Kills tgtd at once: its targets, LUNs, ACLs and accounts are gone, as after a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take().map(|mut s| s.flush()));
            let _ = child.wait();
        }
    }

    /// Kills tgtd and starts a fresh, empty one on the same ports.
    pub fn restart(&mut self) {
        self.kill();
        assert!(self.spawn(), "the restarted tgtd could not bind its portal 127.0.0.1:{}", self.portal_port);
    }

    pub fn tgtadm(&self, args: &[&str]) -> std::process::Output {
        Command::new("/usr/sbin/tgtadm")
            .arg("-C")
            .arg(self.control_port.to_string())
            .args(["--lld", "iscsi"])
            .args(args)
            .output()
            .expect("run tgtadm")
    }

    pub fn targets(&self) -> Vec<TargetState> {
        let out = self.tgtadm(&["--op", "show", "--mode", "target"]);
        parse_show(&String::from_utf8_lossy(&out.stdout))
    }

    /// How tgtd serves the LUN whose backing file is `<store>.img`: whether its target takes
    /// logins (`State: ready`) and the LUN's size as tgtd shows it (see [`tgtd_megabytes`]).
    pub fn served(&self, store: &str) -> Option<(bool, u64)> {
        let file = format!("/{store}.img");
        self.targets().into_iter().find_map(|t| {
            let (lun, _) = t.luns.iter().find(|(_, path)| path.ends_with(&file))?;
            let (_, size) = t.lun_sizes.iter().find(|(l, _)| l == lun)?;
            Some((!t.offline, *size))
        })
    }

    /// The CHAP account names tgtd has (incoming ones).
    pub fn accounts(&self) -> Vec<String> {
        let out = self.tgtadm(&["--op", "show", "--mode", "account"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip_while(|l| !l.starts_with("Account list"))
            .skip(1)
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.ends_with("(outgoing)"))
            .map(str::to_string)
            .collect()
    }

    /// The `[tgt]` section of a Berth configuration for this tgtd (and a quick reconciler).
    pub fn config(&self) -> String {
        format!(
            "[tgt]\nportal = \"127.0.0.1:{}\"\ncontrol_port = {}\nstart = false\n\n[reconcile]\ninterval_seconds = 0.25\ngrace_seconds = 0\n",
            self.portal_port, self.control_port,
        )
    }
}

impl Drop for TgtdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port for a tgtd's portal, free now, below the kernel's ephemeral range (32768 and up), where
/// `free_port()` finds the ports of the test's other servers: a port found there is free only
/// until the test's next server takes it, and a tgtd that cannot bind its portal goes on without
/// it, its initiators' logins then reaching whatever took the port (a `berth serve` of another
/// test, which closes the connection: libiscsi's "Can not reconnect right now").
fn portal_port() -> u16 {
    loop {
        let n = 10_000 + (rand_u32() % 22_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", n)).is_ok() {
            return n;
        }
    }
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).unwrap();
    u32::from_ne_bytes(b)
}

/// A tgtd of its own and `berth serve` (tgt-iscsi, SQLite) configured for it: the product as a
/// user runs it.
pub struct Rig {
    pub tgtd: TgtdProcess,
    pub berth: BerthProcess,
    /// The database, when it is not the SQLite file in the data directory.
    pub database_url: Option<String>,
    _dir: tempfile::TempDir,
}

impl Rig {
    pub fn start() -> Rig {
        Rig::start_with("")
    }

    /// With more configuration (e.g. `[[backends]]` and `[[volume_types]]`) after the `[tgt]`
    /// section.
    pub fn start_with(more: &str) -> Rig {
        Self::start_on(None, more)
    }

    /// On a database of its own: a fresh PostgreSQL database (`postgres`), or SQLite.
    pub async fn start_on_db(postgres: bool) -> Rig {
        let url = if postgres { Some(crate::pg::fresh_database().await) } else { None };
        Self::start_on(url, "")
    }

    /// On a given PostgreSQL database, which several rigs (nodes, each with its own tgtd) may
    /// share.
    pub fn start_on_url(url: &str) -> Rig {
        Self::start_on(Some(url.to_string()), "")
    }

    /// With more keys in the `[tgt]` section (e.g. `max_luns = 2`), and more configuration after
    /// it.
    pub fn start_with_tgt(tgt_keys: &str, more: &str) -> Rig {
        Self::start_full(None, tgt_keys, more)
    }

    fn start_on(database_url: Option<String>, more: &str) -> Rig {
        Self::start_full(database_url, "", more)
    }

    fn start_full(database_url: Option<String>, tgt_keys: &str, more: &str) -> Rig {
        let tgtd = TgtdProcess::start();
        let dir = tempfile::tempdir().unwrap();
        let top = database_url.as_ref().map(|u| format!("database_url = \"{u}\"")).unwrap_or_default();
        let tgt = tgtd.config().replacen("[tgt]\n", &format!("[tgt]\n{tgt_keys}"), 1);
        let berth = BerthProcess::start_full(&top, &format!("{tgt}{more}"));
        Rig { tgtd, berth, database_url, _dir: dir }
    }

    /// An admin of project `e2e` at microversion 3.54.
    pub fn client(&self) -> Client {
        Client::for_base(&self.berth.base, "e2e").at("3.54")
    }

    /// The volume endpoint as clients name it (`CINDER_ENDPOINT`).
    pub fn endpoint(&self) -> String {
        format!("{}/v3", self.berth.base)
    }

    /// The service's database.
    pub fn db_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.berth.dir.path().join("data/berth.db").display()))
    }

    pub fn backing_file(&self, volume: &str) -> PathBuf {
        self.backing_file_of("tgt", volume)
    }

    /// The backing file of a volume of another backend (each backend has its own directory).
    pub fn backing_file_of(&self, backend: &str, volume: &str) -> PathBuf {
        self.berth.dir.path().join(format!("data/volumes/{backend}/volume-{volume}.img"))
    }

    /// How many changes berth sent to tgtd so far (its log records each, at debug level).
    pub fn tgtd_changes(&self) -> usize {
        self.berth.log_text().matches("tgtd change").count()
    }

    /// Whether tgtd exports the volume: a target with a LUN that admits someone (an ACL entry or
    /// an account bound). A target kept inert for reuse after the volume's last attachment went
    /// (its LUN, no ACL entry, no account: tgtd lets nobody log in) does not count.
    pub fn exported(&self, volume: &str) -> bool {
        self.tgtd.targets().iter().any(|t| {
            t.iqn.ends_with(volume)
                && !t.luns.is_empty()
                && (!t.initiators.is_empty() || !t.chap_users.is_empty())
        })
    }
}

/// A LUN's size as tgtd shows it ("Size: N MB", tgtd's own arithmetic).
pub fn tgtd_megabytes(bytes: u64) -> u64 {
    berth::capabilities::iscsi::tgt::shown_megabytes(bytes)
}

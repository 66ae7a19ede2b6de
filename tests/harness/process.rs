//! `berth serve` as a real process: started from a configuration file on a free loopback port,
//! its log captured to a file, stopped (SIGTERM, then SIGKILL) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pg::free_port;

/// What `berth serve` logs once it is registered and about to serve.
const SERVING: &str = "berth is serving";

/// The `berth` binary of this build: `berth-under-test`, which this package builds from the
/// binary's own source (see Cargo.toml), next to the test executable's directory.
pub fn berth_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
    let bin = profile_dir.join("berth-under-test");
    assert!(bin.exists(), "{} is missing: run the tests with cargo", bin.display());
    bin
}

/// The smallest configuration of a served API: the fake driver behind the default volume type.
pub const FAKE_BACKEND: &str = r#"
[[backends]]
name = "fake"
driver = "fake"
[[volume_types]]
name = "__DEFAULT__"
backend = "fake"
"#;

pub struct BerthProcess {
    child: Option<Child>,
    pub base: String,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Extra environment of the process.
    pub env: Vec<(String, String)>,
}

impl BerthProcess {
    /// Starts `berth serve --config <file>` with `config_body` (TOML) plus `listen` and
    /// `data_dir` lines the harness adds.
    pub fn start(config_body: &str) -> BerthProcess {
        Self::start_full("", config_body)
    }

    /// The same with top-level keys (e.g. `database_url`), which TOML wants before any table.
    pub fn start_full(top: &str, config_body: &str) -> BerthProcess {
        Self::start_with_env(top, config_body, &[])
    }

    /// The same with environment variables for the process (e.g. `BERTH_FAILPOINTS`).
    pub fn start_with_env(top: &str, config_body: &str, env: &[(&str, &str)]) -> BerthProcess {
        match Self::try_start(top, config_body, env) {
            Ok(p) => p,
            Err(log) => panic!("berth serve exited:\n{log}"),
        }
    }

    /// The same, for a start that may be refused: the log of a process that exited instead of
    /// listening.
    pub fn try_start(top: &str, config_body: &str, env: &[(&str, &str)]) -> Result<BerthProcess, String> {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("berth.toml");
        let cache = crate::drivers::shared_cache();
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n{top}\n[runtime]\ncache_dir = \"{}\"\n{config_body}",
                dir.path().join("data").display(),
                cache.display()
            ),
        )
        .unwrap();
        let log = dir.path().join("berth.log");
        let mut p = BerthProcess {
            child: None,
            base: format!("http://127.0.0.1:{port}"),
            port,
            dir,
            config,
            log,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        p.try_spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("berth serve exited:\n{log}");
        }
    }

    fn try_spawn(&mut self) -> Result<(), String> {
        // Only what this run writes is read for its readiness: the log of a process restarted
        // thousands of times (the crash tests' long mode) grows to many megabytes.
        let this_run = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(berth_binary())
            .args(["serve", "--config"])
            .arg(&self.config)
            .env(
                "BERTH_LOG",
                std::env::var("BERTH_TEST_SERVER_LOG")
                    // Cranelift and wasmtime at debug write lines per compiled function: a cold
                    // compile of the JavaScript driver then took minutes on a loaded machine.
                    .unwrap_or_else(|_| {
                        "debug,sqlx=warn,hyper=info,reqwest=info,cranelift_codegen=info,wasmtime=info".into()
                    }),
            )
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn berth serve");
        self.child = Some(child);
        self.wait_ready(this_run)
    }

    /// Ready: this run logged that it serves (it registered as a node: a refused node never
    /// does) and its port answers. The port alone is not enough: a port found free may be taken
    /// by another test's process before this one binds it, and then a refused start would look
    /// ready. (With `BERTH_TEST_SERVER_LOG` set, the log may not say it: the port decides.)
    fn wait_ready(&mut self, this_run: u64) -> Result<(), String> {
        let log_says = std::env::var_os("BERTH_TEST_SERVER_LOG").is_none();
        // A cold start compiles every driver (the JavaScript one is 13 MB).
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("berth serve exited with {status}:\n{}", self.log_text()));
            }
            let serving = !log_says || self.log_since(this_run).contains(SERVING);
            if serving && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            assert!(
                Instant::now() < deadline,
                "berth serve did not listen within 120 s:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log from byte `offset` on.
    fn log_since(&self, offset: u64) -> String {
        use std::io::{Read, Seek};
        let mut text = Vec::new();
        if let Ok(mut file) = std::fs::File::open(&self.log)
            && file.seek(std::io::SeekFrom::Start(offset)).is_ok()
        {
            let _ = file.read_to_end(&mut text);
        }
        String::from_utf8_lossy(&text).into_owned()
    }

    /// The last `lines` lines of the log, for a failing test's message.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL (no shutdown at all), as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to `timeout` for the process to exit by itself (a failpoint killed it); returns
    /// its status, or `None` when it is still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the process again on the same configuration and data (after it died).
    pub fn start_again(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Starts the process again on the same configuration and data.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Stops the process gracefully (SIGTERM) and returns its exit status.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        child.wait().ok()
    }
}

impl Drop for BerthProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

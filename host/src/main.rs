//! `berth`: one binary for the service, the conformance suite and the attach client.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use berth::client::ClientError;
use berth::client::api::{Credentials, Endpoint};
use berth::client::connector::{ConnectorOptions, connector};
use berth::client::local::{AttachArgs, DetachArgs, Tools, local_attach, local_detach, require_root};
use berth::config::Config;
use berth::conformance::{Options, TargetMode, VendorConfig};

// The service allocates many small, short-lived objects per request (JSON, a store per driver
// call); glibc's malloc spent a tenth of the CPU of a loaded server consolidating them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "A WebAssembly-pluggable storage driver host with a Cinder-compatible attachment API"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Cinder-compatible API (embedded default: SQLite and the tgt-iscsi driver).
    Serve {
        /// Listen address (default 127.0.0.1:8776).
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Data directory (default $XDG_STATE_HOME/berth or ~/.local/state/berth).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Database URL: sqlite://PATH or postgres://... (default: SQLite in the data directory).
        #[arg(long, env = "BERTH_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
        /// Log format.
        #[arg(long, value_enum, env = "BERTH_LOG_FORMAT", default_value = "text")]
        log_format: LogFormat,
        /// Configuration file (TOML).
        #[arg(long, env = "BERTH_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Run the driver conformance suite on a component. Exit status: 0 every check passed (or was
    /// skipped), 1 a check failed, 2 bad flags or configuration, 3 the suite could not run (e.g.
    /// tgtd did not start) or its report could not be written.
    Conformance {
        /// The driver component (`.wasm`).
        wasm: PathBuf,
        /// The driver's settings, grants, limits and fuel budget (TOML).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Write the results as JUnit XML.
        #[arg(long)]
        junit: Option<PathBuf>,
        /// Write the results, with fuel and memory per check, as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Run only the checks whose name matches this regular expression.
        #[arg(long)]
        focus: Option<String>,
        /// Leave out the checks whose name matches this regular expression.
        #[arg(long)]
        skip: Option<String>,
        /// Run each check this many times.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// The iSCSI target to run against.
        #[arg(long, value_enum, default_value = "model")]
        target: TargetMode,
        /// Compiled-driver cache (default: $XDG_CACHE_HOME/berth or ~/.cache/berth).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// List the checks and exit.
        #[arg(long)]
        list: bool,
    },
    /// Print this machine's connector (as os-brick builds it) as JSON.
    GetConnector {
        #[command(flatten)]
        connector: ConnectorOptions,
    },
    /// Attach a volume to this machine over iSCSI and print its device path.
    LocalAttach {
        #[command(flatten)]
        args: AttachArgs,
        #[command(flatten)]
        credentials: Credentials,
    },
    /// Disconnect a volume from this machine and delete its attachment.
    LocalDetach {
        #[command(flatten)]
        args: DetachArgs,
        #[command(flatten)]
        credentials: Credentials,
    },
    /// Manage API tokens for `[auth] strategy = "token"`.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Look at a driver component before running it; upgrade or roll back a running service's
    /// driver.
    Driver {
        #[command(subcommand)]
        command: DriverCommand,
    },
    /// The service's database: back it up while the service runs, restore a backup while it is
    /// stopped.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
    /// The attach history, read from the service's database: list it, verify its hash chains,
    /// export a segment to archive, prune what was archived.
    History {
        #[command(subcommand)]
        command: HistoryCommand,
    },
    /// Write the library a tgtd should be started with (its futex hash sized for thousands of
    /// LUNs; see README, "iSCSI with tgt") into DIR, and print the environment that loads it, one
    /// `NAME=value` per line (a systemd `EnvironmentFile`). For a tgtd Berth does not start.
    TgtdPreload {
        /// A directory only root can write (the library is loaded into tgtd, which runs as root).
        dir: PathBuf,
    },
    /// Measure a Cinder-compatible endpoint (Berth or Cinder) with the same client.
    Bench {
        #[command(subcommand)]
        command: BenchCommand,
    },
}

/// Where the service's database is, as `berth serve` finds it.
#[derive(clap::Args)]
struct DatabaseArgs {
    /// Data directory (default $XDG_STATE_HOME/berth or ~/.local/state/berth).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Database URL: sqlite://PATH or postgres://... (default: SQLite in the data directory).
    #[arg(long, env = "BERTH_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// The service's configuration file (TOML), for its database.
    #[arg(long, env = "BERTH_CONFIG")]
    config: Option<PathBuf>,
}

impl DatabaseArgs {
    /// The service's configuration, with these flags over it.
    fn config(&self) -> Result<Config, String> {
        let mut cfg = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if self.data_dir.is_some() {
            cfg.data_dir = self.data_dir.clone();
        }
        if self.database_url.is_some() {
            cfg.database_url = self.database_url.clone();
        }
        Ok(cfg)
    }

    async fn open(&self) -> Result<berth::store::Store, String> {
        let cfg = self.config()?;
        // What a service recorded is read where it is and as it is: never in a database made for
        // the purpose, and never migrated under the service.
        let options = berth::store::StoreOptions {
            max_connections: 2,
            opening: berth::store::Opening::Existing,
            ..Default::default()
        };
        berth::store::Store::open(&cfg.database_url(), &options).await.map_err(|e| match e {
            berth::store::StoreError::Missing(path) => format!(
                "no Berth database at {path}: name the service's with --data-dir, --database-url or \
                 --config (`berth serve` makes it in its data directory)"
            ),
            e => e.to_string(),
        })
    }
}

#[derive(Subcommand)]
enum DbCommand {
    /// Write a consistent copy of the service's SQLite database to FILE (which must not exist),
    /// while the service runs: every change committed before the copy began and none after,
    /// private (0600: it holds the CHAP secrets). For PostgreSQL, use pg_dump.
    Backup {
        #[command(flatten)]
        db: DatabaseArgs,
        file: PathBuf,
    },
    /// Put a backup (FILE) in place of the service's SQLite database, with `berth serve` stopped
    /// (refused while it runs on the data directory). The backup is checked first; the database
    /// it replaces is kept next to it (`berth.db.replaced-<time>`). For PostgreSQL, use
    /// pg_restore.
    Restore {
        #[command(flatten)]
        db: DatabaseArgs,
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum HistoryCommand {
    /// Print events, oldest first, as a table (or JSON lines).
    List(Box<HistoryList>),
    /// Check every volume's hash chain (or, with --file, an exported segment). Exit status 1 and
    /// the first broken event of each chain when one does not verify.
    Verify {
        #[command(flatten)]
        db: DatabaseArgs,
        /// An exported segment (JSON lines) instead of the database.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Print the events recorded before a time (all without --until) as JSON lines, chain by
    /// chain: a segment to verify and archive before pruning.
    Export {
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long)]
        until: Option<String>,
    },
    /// Delete the events recorded before a time (export and archive them first), and the rows of
    /// attachments deleted before then.
    Prune {
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long)]
        before: String,
    },
}

/// `berth history list`'s filters and paging: the API's.
#[derive(clap::Args)]
struct HistoryList {
    #[command(flatten)]
    db: DatabaseArgs,
    /// A volume's events (its hash chain).
    #[arg(long)]
    volume: Option<String>,
    /// An attachment's events.
    #[arg(long)]
    attachment: Option<String>,
    /// The events of attachments to this instance (server) UUID.
    #[arg(long)]
    instance: Option<String>,
    /// The connector's host name or initiator.
    #[arg(long)]
    host: Option<String>,
    /// The status the change left (reserved, attaching, attached, detached, ...) or what befell
    /// the connection (replaced, revoked, failed).
    #[arg(long)]
    outcome: Option<String>,
    /// What it did to a host's access.
    #[arg(long, value_parser = ["granted", "revoked", "none"])]
    access: Option<String>,
    /// From this ISO 8601 time (UTC without an offset).
    #[arg(long)]
    since: Option<String>,
    /// Up to this ISO 8601 time.
    #[arg(long)]
    until: Option<String>,
    /// The events after this one (its id: the last one a list showed).
    #[arg(long)]
    marker: Option<String>,
    /// At most this many events (1 or more).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
    limit: i64,
    /// One JSON object per line, with every field.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The attach cycle (attachments API, or the legacy actions with --legacy): cycles/s and
    /// p50/p99 of every call, optionally after filling the backend with live attachments.
    Attach {
        #[command(flatten)]
        args: berth::client::bench::AttachBench,
        #[command(flatten)]
        credentials: Credentials,
    },
}

#[derive(Subcommand)]
enum DriverCommand {
    /// The contract it targets, its exports, its imports and the grant each needs, its size,
    /// digest and footprint in the instance pool, and whether the compiled cache holds it.
    Inspect {
        wasm: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// A driver configuration (as `berth conformance --config`): its `[network]` table's
        /// allowed hosts are shown.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The compiled-driver cache to look in (default: the serve data directory's `cache/`).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// Upgrade a backend's driver on a running service, through its API with an admin's
    /// credentials: the service inspects the component, runs the conformance suite on it with the
    /// backend's configuration, switches to it between operations, then watches it and switches
    /// back on its own if it does worse. The file must be on the service's node (its path is
    /// sent, not its bytes).
    Upgrade {
        backend: String,
        wasm: PathBuf,
        /// Also run one volume's life on the real backend through the new driver (a scratch
        /// volume, removed afterwards) before switching.
        #[arg(long)]
        live: bool,
        #[command(flatten)]
        credentials: Credentials,
    },
    /// Switch a backend back to the driver it ran before the last upgrade.
    Rollback {
        backend: String,
        #[command(flatten)]
        credentials: Credentials,
    },
    /// The driver each backend of a running service runs, the one before it and its watch.
    List {
        #[command(flatten)]
        credentials: Credentials,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a new random token, and the entry to append to the tokens file (which stores only
    /// its sha256).
    New {
        #[arg(long)]
        user: String,
        #[arg(long)]
        project: String,
        /// A role (repeat for several); `admin` may do admin-only actions.
        #[arg(long = "role")]
        roles: Vec<String>,
    },
}

/// How `berth serve` writes its log.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Lines for people: `time level span{request_id=...}: message`.
    Text,
    /// One JSON object per line, with the request's span (request ids) in `span`.
    Json,
}

fn init_logging(format: LogFormat) {
    berth::logging::init(match format {
        LogFormat::Text => berth::logging::Format::Text,
        LogFormat::Json => berth::logging::Format::Json,
    });
}

fn main() -> ExitCode {
    // Output piped into `head` ends quietly, as for any Unix tool.
    // SAFETY: setting a signal's disposition to the default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { listen, data_dir, database_url, config, log_format } => {
            init_logging(log_format);
            // Everything the service creates (database, volume images, keys, state) is its own.
            // SAFETY: umask has no preconditions.
            unsafe { libc::umask(0o077) };
            let mut cfg = match config {
                Some(path) => match Config::load(&path) {
                    Ok(c) => c,
                    Err(e) => return fail(&e),
                },
                None => Config::default(),
            };
            if let Some(listen) = listen {
                cfg.listen = listen;
            }
            if data_dir.is_some() {
                cfg.data_dir = data_dir;
            }
            if database_url.is_some() {
                cfg.database_url = database_url;
            }
            let runtime =
                tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
            match runtime.block_on(berth::serve::serve(cfg)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&format!("{e:#}")),
            }
        }
        Command::Conformance { wasm, config, junit, json, focus, skip, repeat, target, cache_dir, list } => {
            if list {
                berth::conformance::check_names().iter().for_each(|n| println!("{n}"));
                return ExitCode::SUCCESS;
            }
            conformance(wasm, config, junit, json, focus, skip, repeat, target, cache_dir)
        }
        Command::GetConnector { connector: options } => client(async {
            let c = connector(&options, None)?;
            println!("{}", serde_json::to_string_pretty(&c).expect("a JSON map serialises"));
            Ok(())
        }),
        Command::LocalAttach { args, credentials } => client(async {
            require_root("local-attach")?;
            let api = Endpoint::resolve(&credentials).await?;
            let device = local_attach(&api, &Tools::find(), &args).await?;
            if args.json {
                println!("{device}");
            } else {
                println!("{}", device["path"].as_str().unwrap_or_default());
            }
            Ok(())
        }),
        Command::LocalDetach { args, credentials } => client(async {
            require_root("local-detach")?;
            let api = Endpoint::resolve(&credentials).await?;
            let id = local_detach(&api, &Tools::find(), &args).await?;
            println!("detached volume {} (attachment {id})", args.volume_id);
            Ok(())
        }),
        Command::Bench { command: BenchCommand::Attach { args, credentials } } => {
            let runtime =
                tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
            let outcome = runtime.block_on(async {
                let api = Endpoint::resolve(&credentials).await?;
                berth::client::bench::run(&api, &args).await
            });
            match outcome {
                Ok(report) if args.json => {
                    println!("{}", report.json());
                    ExitCode::SUCCESS
                }
                Ok(report) => {
                    print!("{}", report.text());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("berth: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Command::Driver { command: DriverCommand::Upgrade { backend, wasm, live, credentials } } => {
            let wasm = match std::path::absolute(&wasm) {
                Ok(p) => p,
                Err(e) => return fail(&format!("{}: {e}", wasm.display())),
            };
            let body = serde_json::json!({"os-upgrade": {"wasm": wasm.display().to_string(), "live": live}});
            driver_call(
                &credentials,
                reqwest::Method::POST,
                &format!("/os-drivers/{backend}/action"),
                Some(body),
            )
        }
        Command::Driver { command: DriverCommand::Rollback { backend, credentials } } => {
            let body = serde_json::json!({"os-rollback": {}});
            driver_call(
                &credentials,
                reqwest::Method::POST,
                &format!("/os-drivers/{backend}/action"),
                Some(body),
            )
        }
        Command::Driver { command: DriverCommand::List { credentials } } => {
            driver_call(&credentials, reqwest::Method::GET, "/os-drivers", None)
        }
        Command::Driver { command: DriverCommand::Inspect { wasm, json, config, cache_dir } } => {
            let bytes = match std::fs::read(&wasm) {
                Ok(b) => b,
                Err(e) => return fail(&format!("cannot read {}: {e}", wasm.display())),
            };
            let mut inspection = match berth::runtime::inspect::Inspection::of(&bytes) {
                Ok(i) => i,
                Err(e) => return fail(&format!("{}: {e}", wasm.display())),
            };
            let cache = cache_dir.unwrap_or_else(|| Config::default().data_dir().join("cache"));
            inspection.look_in_cache(&cache);
            if let Some(path) = config {
                match berth::conformance::VendorConfig::load(&path) {
                    Ok(c) => inspection.allowed_hosts = c.network.map(|n| n.allowed_hosts),
                    Err(e) => return fail(&e),
                }
            }
            if json {
                println!("{}", inspection.json());
            } else {
                print!("{}", inspection.text());
            }
            ExitCode::SUCCESS
        }
        Command::History { command } => history(command),
        Command::Db { command: DbCommand::Restore { db, file } } => match restore(&db, &file) {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Db { command: DbCommand::Backup { db, file } } => {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
            let copied: Result<u64, String> = runtime.block_on(async {
                let store = db.open().await?;
                store.copy_to(&file).await.map_err(|e| e.to_string())
            });
            match copied {
                Ok(bytes) => {
                    println!("berth: the database copied to {} ({bytes} bytes)", file.display());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
        Command::TgtdPreload { dir } => match berth::capabilities::iscsi::tgt::preload::environment(&dir) {
            Ok(environment) => {
                for (name, value) in environment {
                    println!("{name}={}", value.to_string_lossy());
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("cannot write tgtd's preload library into {}: {e}", dir.display())),
        },
        Command::Token { command: TokenCommand::New { user, project, roles } } => {
            match berth::api::auth::new_token(&user, &project, &roles) {
                Ok((token, entry)) => {
                    println!("token: {token}\n\n# append to the tokens file:\n{entry}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }
    }
}

/// One call of the drivers API (`api/drivers.rs`); prints its answer as JSON.
fn driver_call(
    credentials: &Credentials,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let outcome = runtime.block_on(async {
        let api = Endpoint::resolve(credentials).await?;
        api.call(method, path, "3.0", body).await
    });
    match outcome {
        Ok(answer) => {
            println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("berth: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `berth db restore`: the service's SQLite database replaced by a backup, under the data
/// directory's lock (so no `berth serve` runs on it meanwhile).
fn restore(db: &DatabaseArgs, file: &std::path::Path) -> Result<String, String> {
    let cfg = db.config()?;
    let url = cfg.database_url();
    let Some(path) = berth::store::backup::sqlite_file(&url) else {
        return Err("the database is PostgreSQL: restore it with pg_restore (docs/operations.md, \"Backing up the database\")".into());
    };
    let data_dir = cfg.data_dir();
    let _lock = berth::serve::lock_data_dir(&data_dir).map_err(|_| {
        format!("berth serve is running on the data directory {}: stop it first", data_dir.display())
    })?;
    let restored = berth::store::backup::restore(&path, file).map_err(|e| e.to_string())?;
    let kept = match &restored.replaced {
        Some(p) => format!("; the database it replaced is kept as {}", p.display()),
        None => String::new(),
    };
    Ok(format!(
        "berth: {} restored to {} (schema at migration {}){kept}; start berth serve",
        file.display(),
        path.display(),
        restored.schema
    ))
}

/// An ISO 8601 time of a `berth history` flag, in microseconds.
fn history_time(flag: &str, value: &str) -> Result<i64, String> {
    berth::api::volumes::parse_time(value)
        .ok_or_else(|| format!("--{flag} {value:?} is not an ISO 8601 time"))
}

fn history(command: HistoryCommand) -> ExitCode {
    use berth::attach::history;
    use berth::domain::history::{AttachEvent, EventFilter, verify_segment};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let outcome: Result<ExitCode, String> = runtime.block_on(async {
        match command {
            HistoryCommand::List(list) => {
                let HistoryList {
                    db,
                    volume,
                    attachment,
                    instance,
                    host,
                    outcome,
                    access,
                    since,
                    until,
                    marker,
                    limit,
                    json,
                } = *list;
                let filter = EventFilter {
                    volume_id: volume,
                    attachment_id: attachment,
                    instance_uuid: instance,
                    host,
                    outcome,
                    access: access.as_deref().and_then(berth::domain::history::Access::parse),
                    since: since.map(|t| history_time("since", &t)).transpose()?,
                    until: until.map(|t| history_time("until", &t)).transpose()?,
                };
                let store = db.open().await?;
                let events =
                    history::list(&store, berth::domain::list::Scope::All, &filter, marker.as_deref(), limit)
                        .await
                        .map_err(|e| e.to_string())?;
                if json {
                    for e in &events {
                        println!("{}", serde_json::to_string(e).expect("an event serialises"));
                    }
                } else {
                    print!("{}", history_table(&events));
                }
                if let Some(last) = events.last().filter(|_| events.len() as i64 == limit) {
                    eprintln!(
                        "berth: {limit} events shown, the --limit; more may follow: --marker {}",
                        last.id
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            HistoryCommand::Verify { file: Some(path), .. } => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let events: Vec<AttachEvent> = text
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .enumerate()
                    .map(|(i, l)| {
                        serde_json::from_str(l).map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))
                    })
                    .collect::<Result<_, _>>()?;
                match verify_segment(&events) {
                    Ok(chains) => {
                        println!("verified {} events in {chains} chains", events.len());
                        Ok(ExitCode::SUCCESS)
                    }
                    Err(b) => {
                        println!("BROKEN {b}");
                        Ok(ExitCode::from(1))
                    }
                }
            }
            HistoryCommand::Verify { db, file: None } => {
                let store = db.open().await?;
                let found = history::verify(&store).await.map_err(|e| e.to_string())?;
                for b in &found.breaks {
                    println!("BROKEN {b}");
                }
                println!(
                    "verified {} events in {} chains: {} broken",
                    found.events,
                    found.chains,
                    found.breaks.len()
                );
                Ok(if found.breaks.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
            }
            HistoryCommand::Export { db, until } => {
                let until = until.map(|t| history_time("until", &t)).transpose()?;
                let store = db.open().await?;
                use std::io::Write;
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                let exported = history::export(
                    &store,
                    until,
                    |e| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
                        serde_json::to_writer(&mut out, e)?;
                        Ok(out.write_all(b"\n")?)
                    },
                )
                .await
                .map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
                // On stderr, to compare with what `prune` says it deleted.
                eprintln!("berth: exported {exported} events");
                Ok(ExitCode::SUCCESS)
            }
            HistoryCommand::Prune { db, before } => {
                let before = history_time("before", &before)?;
                let store = db.open().await?;
                let r = history::retain_since(&store, before).await.map_err(|e| e.to_string())?;
                println!(
                    "pruned {} events and the rows of {} attachments and {} volumes deleted before then",
                    r.events, r.attachments, r.volumes
                );
                Ok(ExitCode::SUCCESS)
            }
        }
    });
    outcome.unwrap_or_else(|e| fail(&e))
}

/// Events as a table for people: time, volume, event, access, outcome, host, caller, request.
fn history_table(events: &[berth::domain::history::AttachEvent]) -> String {
    let mut out = format!(
        "{:<26} {:<36} {:<4} {:<22} {:<8} {:<16} {:<20} {:<16} {}\n",
        "TIME", "VOLUME", "SEQ", "EVENT", "ACCESS", "OUTCOME", "HOST", "USER", "REQUEST"
    );
    for e in events {
        let f = &e.fields;
        out.push_str(&format!(
            "{:<26} {:<36} {:<4} {:<22} {:<8} {:<16} {:<20} {:<16} {}\n",
            berth::api::views::timestamp(f.at),
            f.volume_id,
            e.seq,
            f.event,
            f.access.as_str(),
            f.outcome,
            f.host.as_deref().or(f.initiator.as_deref()).unwrap_or("-"),
            f.user_id,
            f.request_id.as_deref().unwrap_or("-"),
        ));
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn conformance(
    wasm: PathBuf,
    config: Option<PathBuf>,
    junit: Option<PathBuf>,
    json: Option<PathBuf>,
    focus: Option<String>,
    skip: Option<String>,
    repeat: u32,
    target: TargetMode,
    cache_dir: Option<PathBuf>,
) -> ExitCode {
    let usage = |m: String| {
        eprintln!("berth: {m}");
        ExitCode::from(2)
    };
    let regex = |flag: &str, re: Option<String>| {
        re.map(|r| regex::Regex::new(&r).map_err(|e| format!("--{flag}: {e}"))).transpose()
    };
    let (focus, skip) = match (regex("focus", focus), regex("skip", skip)) {
        (Ok(f), Ok(s)) => (f, s),
        (Err(e), _) | (_, Err(e)) => return usage(e),
    };
    let config = match config.map(|p| VendorConfig::load(&p)).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => return usage(e),
    };
    if !wasm.is_file() {
        return usage(format!("{} is not a file", wasm.display()));
    }
    let cache_dir = cache_dir.or_else(|| {
        // An empty XDG_CACHE_HOME counts as unset (the XDG base directory specification).
        std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|d| d.join("berth"))
    });
    let options = Options { wasm, config, target, focus, skip, repeat, cache_dir };
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    let report = match runtime.block_on(berth::conformance::run(options, |c| println!("{}", c.line()))) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("berth: conformance: {e}");
            return ExitCode::from(3);
        }
    };
    println!("\n{}", report.summary());
    let write = |path: &PathBuf, text: String| {
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    if let Some(p) = &junit
        && let Err(e) = write(p, report.junit())
    {
        eprintln!("berth: {e}");
        return ExitCode::from(3);
    }
    if let Some(p) = &json
        && let Err(e) = write(p, format!("{:#}\n", report.json()))
    {
        eprintln!("berth: {e}");
        return ExitCode::from(3);
    }
    if report.ok() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Runs a client command: a clear message and a documented exit code on failure, never a
/// stack trace.
fn client(command: impl std::future::Future<Output = Result<(), ClientError>>) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("berth: {message}");
    ExitCode::FAILURE
}

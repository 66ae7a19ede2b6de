//! `berth`: one binary for the service, the conformance suite and the attach client.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use berth::config::Config;

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
        /// Configuration file (TOML).
        #[arg(long, env = "BERTH_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Manage API tokens for `[auth] strategy = "token"`.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
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

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve { listen, data_dir, database_url, config } => {
            init_logging();
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

fn fail(message: &str) -> ExitCode {
    eprintln!("berth: {message}");
    ExitCode::FAILURE
}

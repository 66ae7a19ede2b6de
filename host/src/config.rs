//! The host's configuration: a TOML file (`--config`), overridden by command-line flags. With no
//! file at all, Berth runs its embedded default: SQLite in the data directory, the shipped
//! `tgt-iscsi` driver on a local tgtd, and two volume types (`__DEFAULT__` and `multiattach`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::capabilities::Grant;
use crate::runtime::Limits;
use crate::store::Synchronous;

#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the API listens (default `127.0.0.1:8776`).
    pub listen: SocketAddr,
    /// Where Berth keeps its database, compiled drivers and volume images.
    pub data_dir: Option<PathBuf>,
    /// `sqlite://...` or `postgres://...`; default: `berth.db` in the data directory.
    pub database_url: Option<String>,
    /// SQLite durability (`full` or `normal`).
    pub sqlite_synchronous: Synchronous,
    /// Database connections (PostgreSQL) or SQLite readers.
    pub max_connections: u32,
    /// The URL clients use to reach this service, for links in responses.
    pub public_endpoint: Option<String>,
    /// The volume type used when a request names none (default: the first configured type).
    pub default_volume_type: Option<String>,
    /// This node's name, which owns its operations (default: generated once and kept in the data
    /// directory, `node-id`). Not `berth` (the clusters' name), and without `@`, `#` or spaces.
    pub node: Option<String>,
    /// The URL other nodes on the same database forward requests for this node's volumes to
    /// (`http://host:port`; default: the listen address, or this machine's host name and the
    /// listen port when it listens on every address).
    pub advertise_url: Option<String>,
    pub auth: AuthConfig,
    pub keystone: KeystoneConfig,
    pub nova: NovaConfig,
    pub http: HttpConfig,
    pub metrics: MetricsConfig,
    pub attachments: AttachmentsConfig,
    pub history: HistoryConfig,
    pub messages: MessagesConfig,
    pub upgrades: UpgradesConfig,
    pub operations: OperationsConfig,
    pub reconcile: ReconcileConfig,
    pub runtime: RuntimeConfig,
    pub tgt: TgtConfig,
    pub backends: Vec<BackendConfig>,
    pub volume_types: Vec<VolumeTypeConfig>,
    pub qos_specs: Vec<QosSpecsConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8776".parse().expect("static address"),
            data_dir: None,
            database_url: None,
            sqlite_synchronous: Synchronous::Full,
            max_connections: 16,
            public_endpoint: None,
            default_volume_type: None,
            node: None,
            advertise_url: None,
            auth: AuthConfig::default(),
            keystone: KeystoneConfig::default(),
            nova: NovaConfig::default(),
            http: HttpConfig::default(),
            metrics: MetricsConfig::default(),
            attachments: AttachmentsConfig::default(),
            operations: OperationsConfig::default(),
            reconcile: ReconcileConfig::default(),
            history: HistoryConfig::default(),
            messages: MessagesConfig::default(),
            upgrades: UpgradesConfig::default(),
            runtime: RuntimeConfig::default(),
            tgt: TgtConfig::default(),
            backends: Vec::new(),
            volume_types: Vec::new(),
            qos_specs: Vec::new(),
        }
    }
}

/// How the API's HTTP server protects itself (`api/server.rs`).
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// How long a client may take to send a request's headers, counted from the moment the
    /// connection is ready for a request: on a new connection from accept, on a kept-alive one
    /// from the end of the previous response (so it is also the idle timeout). The connection is
    /// closed when it expires.
    pub header_read_timeout_seconds: f64,
    /// How long a request's body may take to arrive once its headers are in; 408 beyond it. The
    /// body is read only after the caller is authenticated, and before the request takes one of
    /// `max_requests_in_flight`.
    pub body_read_timeout_seconds: f64,
    /// Requests handled at once; beyond it, 503 with `Retry-After` (load shedding).
    pub max_requests_in_flight: usize,
    /// How long a request forwarded to the node that serves its volume may take before this node
    /// answers 503 (the operation itself goes on there).
    pub forward_timeout_seconds: f64,
    /// Serve the API over HTTPS with this certificate chain (PEM, the server's own certificate
    /// first); with `tls_key_file`. Plain HTTP on the same port is then refused. Links in answers
    /// say `https://`.
    pub tls_cert_file: Option<PathBuf>,
    /// The certificate's private key (PEM, readable by its owner only: `chmod 600`).
    pub tls_key_file: Option<PathBuf>,
    /// More roots (PEM), besides the system's, for every HTTPS service Berth calls: other nodes'
    /// `advertise_url`, Keystone (`[keystone] auth_url`) and Nova (`[nova]`): the private CA
    /// that signed their certificates (keystonemiddleware's and Cinder's `[nova]` `cafile`).
    pub ca_file: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_read_timeout_seconds: 60.0,
            body_read_timeout_seconds: 30.0,
            max_requests_in_flight: 512,
            forward_timeout_seconds: 300.0,
            tls_cert_file: None,
            tls_key_file: None,
            ca_file: None,
        }
    }
}

/// The Prometheus endpoint (`metrics.rs`).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Where `GET /metrics` answers (OpenMetrics text); unset: no endpoint.
    pub listen: Option<SocketAddr>,
    /// Serve it over TLS, with the API's certificate and key (`[http] tls_cert_file`,
    /// `tls_key_file`, which must be set); plain HTTP on its port is then refused.
    pub tls: bool,
}

/// Bounds on attachments.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AttachmentsConfig {
    /// Live attachments one volume may have (a multiattach volume); one more is a 413 overLimit.
    pub max_per_volume: u32,
}

impl Default for AttachmentsConfig {
    fn default() -> Self {
        AttachmentsConfig { max_per_volume: 1024 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuthStrategy {
    /// cinderclient's noauth (`X-Auth-Token: user:project`); loopback listeners only.
    #[default]
    Noauth,
    /// Static tokens from `tokens_file`.
    Token,
    /// Tokens validated by a Keystone v3 server (`[keystone]`), as keystonemiddleware does.
    Keystone,
}

#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `noauth` (the caller names itself; loopback listeners only), `token` (static tokens) or
    /// `keystone` (tokens validated by Keystone, configured in `[keystone]`).
    pub strategy: AuthStrategy,
    /// The tokens file of `strategy = "token"` (TOML, sha256 of each token; `berth token new`).
    pub tokens_file: Option<PathBuf>,
    /// Overrides of the default policy (TOML: Cinder rule name to the roles that pass it; see
    /// `api/policy.rs`).
    pub policy_file: Option<PathBuf>,
}

/// The Keystone server of `[auth] strategy = "keystone"` (`api/auth/keystone.rs`): what
/// keystonemiddleware's `[keystone_authtoken]` holds in Cinder. Berth validates each caller's
/// `X-Auth-Token` with its own token (password authentication as `username` in `project_name`; the
/// user needs a role that may validate tokens, such as `service`), and reads the caller's project
/// and roles from the answer. An `X-Service-Token` with one of `service_token_roles` marks the
/// request as a service's (OSSA-2023-003).
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KeystoneConfig {
    /// Keystone's URL (`http://host:5000` or `.../v3`).
    pub auth_url: Option<String>,
    /// The URL a refused client is told to authenticate at (`WWW-Authenticate`); default
    /// `auth_url`.
    pub www_authenticate_uri: Option<String>,
    /// Berth's own user.
    pub username: Option<String>,
    /// Berth's own password (keep this file private: `chmod 600`). Never logged.
    #[schemars(with = "Option<String>")]
    pub password: Option<Secret>,
    /// The domain of `username`.
    pub user_domain_name: String,
    /// The project Berth's own token is scoped to.
    pub project_name: String,
    /// The domain of `project_name`.
    pub project_domain_name: String,
    /// How long a validation (valid or not) is remembered, at most until the token expires. A
    /// token revoked in Keystone stays accepted for up to this long; 0 validates every request.
    pub cache_seconds: u64,
    /// Roles that make an `X-Service-Token` a service's.
    pub service_token_roles: Vec<String>,
    /// Refuse (401) a valid `X-Service-Token` without one of `service_token_roles`, instead of
    /// ignoring it (keystonemiddleware's `service_token_roles_required`; Cinder recommends true).
    pub service_token_roles_required: bool,
    /// How long one call to Keystone may take.
    pub timeout_seconds: f64,
}

impl Default for KeystoneConfig {
    fn default() -> Self {
        KeystoneConfig {
            auth_url: None,
            www_authenticate_uri: None,
            username: None,
            password: None,
            user_domain_name: "Default".into(),
            project_name: "service".into(),
            project_domain_name: "Default".into(),
            cache_seconds: 300,
            service_token_roles: vec!["service".into()],
            service_token_roles_required: true,
            timeout_seconds: 10.0,
        }
    }
}

/// The compute service (Nova, `compute.rs`): what Cinder's `[nova]` holds. When an attached
/// volume grows (`os-extend`, 3.42), Berth tells Nova with a `volume-extended` server external
/// event for each instance attached, as Cinder does, so that Nova grows the disk its guest sees.
/// Berth authenticates as its `[keystone]` user (which Nova's policy must let create server
/// external events: the `service` role, or `admin` before Nova 2023.2) and finds Nova in that
/// token's catalog (type `compute`).
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NovaConfig {
    /// Send the events; default: when `[auth] strategy = "keystone"` (Nova takes only Keystone
    /// tokens). `true` without Keystone is refused at start; `false` for a cloud without Nova.
    pub enabled: Option<bool>,
    /// Nova's URL (`http://host:8774/v2.1`), instead of the catalog's.
    pub endpoint_override: Option<String>,
    /// The catalog's interface: `public`, `internal` or `admin`.
    pub interface: String,
    /// The catalog's region (default: the first `compute` endpoint at `interface`).
    pub region_name: Option<String>,
    /// How long one call to Nova may take.
    pub timeout_seconds: f64,
    /// The Keystone user Berth tells Nova as (Cinder's `[nova]` credentials), when it is not
    /// Berth's own `[keystone]` user: Nova's policy lets admins and services send server
    /// events, which Berth's own user, whose token validates callers, need not be. With
    /// `password`; the domains and the project default to `[keystone]`'s.
    pub username: Option<String>,
    /// That user's password (keep this file private). Never logged.
    #[schemars(with = "Option<String>")]
    pub password: Option<Secret>,
    pub user_domain_name: Option<String>,
    pub project_name: Option<String>,
    pub project_domain_name: Option<String>,
}

impl Default for NovaConfig {
    fn default() -> Self {
        NovaConfig {
            enabled: None,
            endpoint_override: None,
            interface: "public".into(),
            region_name: None,
            timeout_seconds: 30.0,
            username: None,
            password: None,
            user_domain_name: None,
            project_name: None,
            project_domain_name: None,
        }
    }
}

/// A secret in the configuration: read like a string, never printed (`Debug` and serialisation
/// show `<redacted>`).
#[derive(Clone, Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl serde::Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

/// Operations the service owns (`attach/ops.rs`).
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OperationsConfig {
    /// How long an operation stays its node's without renewal; another node may take it over
    /// after that.
    pub lease_seconds: u64,
    /// At shutdown, how long to wait for operations in flight before exiting (what is left is
    /// recovered at the next start).
    pub shutdown_wait_seconds: u64,
}

impl Default for OperationsConfig {
    fn default() -> Self {
        OperationsConfig { lease_seconds: 30, shutdown_wait_seconds: 30 }
    }
}

/// What the reconciler does (`attach/reconcile/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReconcileMode {
    /// Re-create what is missing and remove what nobody needs.
    #[default]
    Repair,
    /// Re-create what is missing; only report what nobody needs.
    Report,
}

/// The attach history (`GET /os-attachment-events`, `berth history`).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Days an event is kept; older ones are pruned every hour (each volume's chain then starts
    /// at its first event left, and still verifies), and so are the rows of attachments deleted
    /// before then (a deleted attachment's row is kept only for its history), and then those of
    /// volumes deleted before then of which nothing is left. Export and archive them first
    /// (`berth history export --until`). Default: kept for ever.
    pub keep_days: Option<u32>,
}

/// User messages (`GET /messages`, `cinder message-list`): why an operation on a volume failed,
/// for the volume's users to read afterwards.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MessagesConfig {
    /// Days a message is kept (its `guaranteed_until`); expired ones are no longer shown and are
    /// deleted every hour (Cinder's `message_ttl`, 30 days).
    pub keep_days: u32,
}

impl Default for MessagesConfig {
    fn default() -> Self {
        MessagesConfig { keep_days: 30 }
    }
}

/// Driver upgrades while serving (`berth driver upgrade`, `upgrade/`): how long a new driver is
/// watched after the switch, and how much worse than its predecessor it may be before it is
/// switched back on its own.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradesConfig {
    /// Seconds after a switch during which the new driver's calls are compared with the old
    /// one's (0: not watched).
    pub watch_seconds: u64,
    /// Calls the new driver must have made before it is judged.
    pub min_calls: u64,
    /// Switched back when the share of its calls that fail (traps, limits, backend and retryable
    /// errors) exceeds the old driver's by more than this (0.1: ten points).
    pub max_failure_increase: f64,
    /// Switched back when its mean call time exceeds the old driver's this many times over.
    pub max_latency_factor: f64,
}

impl Default for UpgradesConfig {
    fn default() -> Self {
        let w = crate::runtime::slot::Watch::default();
        UpgradesConfig {
            watch_seconds: w.window.as_secs(),
            min_calls: w.min_calls,
            max_failure_increase: w.max_failure_increase,
            max_latency_factor: w.max_latency_factor,
        }
    }
}

impl UpgradesConfig {
    pub fn watch(&self) -> crate::runtime::slot::Watch {
        crate::runtime::slot::Watch {
            window: std::time::Duration::from_secs(self.watch_seconds),
            min_calls: self.min_calls,
            max_failure_increase: self.max_failure_increase.max(0.0),
            max_latency_factor: self.max_latency_factor.max(1.0),
        }
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileConfig {
    /// Seconds between passes (the first runs at start-up, in the background); fractions allowed.
    /// A pass whose listing of tgtd's targets took long is followed by a longer wait, so that
    /// listings take at most a tenth of tgtd's time (the listing costs tgtd time quadratic in its
    /// targets: about 2 s at 10,000, during which it serves no attach); a restarted tgtd is
    /// reconciled within a second whatever the wait.
    pub interval_seconds: f64,
    /// How long a target or ACL entry that no connected attachment needs must have been seen
    /// before it is removed.
    pub grace_seconds: u64,
    pub mode: ReconcileMode,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig { interval_seconds: 15.0, grace_seconds: 60, mode: ReconcileMode::Repair }
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// Compiled-driver cache; default: `cache/` in the data directory.
    pub cache_dir: Option<PathBuf>,
    /// The epoch tick in milliseconds: the granularity of CPU limits.
    pub tick_ms: u64,
    /// Driver calls that may run at once (each holds a preallocated instance slot; as many
    /// slots again hold the instances operations keep between their calls).
    pub max_concurrent_calls: u32,
    /// MiB of each instance slot's linear memory kept resident when its instance is dropped:
    /// the pages the instance wrote are put back as the driver's image has them (found with
    /// Linux's `PAGEMAP_SCAN`, 6.7 and later; elsewhere this setting does nothing) instead of
    /// being returned to the kernel, so the next instance of the driver in that slot starts
    /// without page faults on them (all of them within this budget: Berth's wasmtime carries a
    /// patch for it, `vendor/README.md`). Costs memory: what drivers wrote, up to this much per
    /// slot used. 0: every page is returned.
    /// Ignored, with a warning, where the kernel may swap berth's pages out (`/proc/swaps` lists
    /// a swap area when `berth serve` starts, and no cgroup v2 of the process has
    /// `memory.swap.max` 0, as systemd's `MemorySwapMax=0` in `packaging/berth.service` sets):
    /// wasmtime 48 would leave a swapped-out page an instance wrote for the next instance to read
    /// (docs/security.md).
    pub keep_resident_mib: u32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig { cache_dir: None, tick_ms: 10, max_concurrent_calls: 128, keep_resident_mib: 32 }
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TgtConfig {
    /// The portal initiators connect to, `address:port`.
    pub portal: String,
    /// More portals to advertise (multipath).
    pub extra_portals: Vec<String>,
    /// tgtd's control port (`tgtd -C`).
    pub control_port: u16,
    /// Start tgtd on the portal when it does not answer.
    pub start: bool,
    /// tgtd's program, to start it. (Berth never runs `tgtadm`: it speaks tgtd's control
    /// protocol on its socket.)
    pub tgtd: PathBuf,
    /// Timeout of one request to tgtd.
    pub command_timeout_ms: u64,
    /// I/O threads tgtd gives each LUN (`tgtd -t`), when Berth starts tgtd; set it to the running
    /// tgtd's `-t` otherwise. Every exported volume costs tgtd that many threads for as long as it
    /// is exported, and the machine's threads are what runs out first: with the kernel's default
    /// `pid_max` of 32,768 and the default reserve, 2 allow 14,336 exported volumes, 4 allow 7,168
    /// (tgtd's own default, 16, about 1,800). One or two threads per LUN measured as fast as four
    /// on a 2-core machine (BENCHMARKS.md, "tgtd's I/O threads").
    pub io_threads: u32,
    /// Threads always left to the rest of the machine: a new export is refused (413, naming this
    /// setting) when tgtd's LUNs would leave fewer, counting every thread running on the machine.
    /// The ceiling of exports is `(min(kernel.pid_max, kernel.threads-max) - reserve_threads) /
    /// io_threads`, shown in `os-services` and the metrics (`berth_tgt_lun_ceiling`).
    pub reserve_threads: u64,
    /// The most LUNs tgtd may hold (all backends of this node together), when lower than the
    /// ceiling the machine allows. Unset: that ceiling.
    pub max_luns: Option<u64>,
    /// How long a volume's target stays in tgtd, inert (no ACL entry, no account bound: tgtd admits
    /// nobody to it; its LUN stays open on the volume's store), after its last attachment goes, so
    /// that attaching the volume again reuses it, LUN and all: tgtd deletes targets in time
    /// quadratic in their number, and a LUN's creation and deletion are the dearest changes of an
    /// attach cycle (see `capabilities/iscsi/tgt/tgtd.rs`). Kept LUNs give way to a new LUN at the
    /// ceiling of LUNs. 0: deleted at once.
    pub keep_exports_seconds: u64,
    /// How long an export's CHAP account (a driver's `set-chap`; `tgt-iscsi` with
    /// `chap_accounts = "per-export"`) no target uses any more stays in tgtd for reuse before the
    /// reconciler's sweep deletes it (0: deleted at once, when its target goes). Such a driver
    /// gives every export new credentials and never reuses an account; each account tgtd holds
    /// makes creating the next one slower. Per-initiator accounts (the default) are kept an hour
    /// after their last target lets them go.
    pub keep_accounts_seconds: u64,
    /// Whether exported volumes take UNMAP (SCSI's discard): tgtd punches the unmapped blocks
    /// out of the sparse backing file, so space a host frees is given back to the machine, and
    /// connections say `discard: true` (Nova then passes a guest's discards through). Off: a
    /// backing file only grows.
    pub thin_provisioning: bool,
    /// Length of generated CHAP user names (8 to 255).
    pub chap_username_length: usize,
    /// Length of generated CHAP secrets (17 to 255; at least 96 bits).
    pub chap_secret_length: usize,
}

impl Default for TgtConfig {
    fn default() -> Self {
        TgtConfig {
            portal: "127.0.0.1:3260".into(),
            extra_portals: Vec::new(),
            control_port: 0,
            start: true,
            tgtd: "/usr/sbin/tgtd".into(),
            command_timeout_ms: 10_000,
            io_threads: 2,
            reserve_threads: 4096,
            max_luns: None,
            keep_exports_seconds: 3600,
            keep_accounts_seconds: 0,
            thin_provisioning: true,
            chap_username_length: 20,
            chap_secret_length: 20,
        }
    }
}

/// One backend: a driver and its settings.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// The backend's name: volume types name it, and it names the backend's namespace (store
    /// directory, default target prefix; `[A-Za-z0-9_.-]`, at most 64).
    pub name: String,
    /// A shipped driver (`tgt-iscsi`, `fake`)...
    #[serde(default)]
    pub driver: Option<String>,
    /// ...or a component file.
    #[serde(default)]
    pub wasm: Option<PathBuf>,
    /// The capabilities granted to the driver.
    #[serde(default)]
    pub grants: BTreeSet<Grant>,
    /// The driver's settings (read through `berth:driver/config`).
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: Limits,
    /// Served by every node that configures a backend of this name with `shared = true`: the
    /// driver reaches its storage over the network, so any of them may run its volumes' calls
    /// (false: the backend and its volumes belong to this node, e.g. its own tgtd). A backend
    /// granted the host's iSCSI target service cannot be shared.
    #[serde(default)]
    pub shared: bool,
    /// With the `network` grant: where the driver may send requests, and how
    /// (`capabilities/network`).
    #[serde(default)]
    pub network: Option<crate::capabilities::network::NetworkConfig>,
    /// With the `cephx` grant: how the host reaches the Ceph cluster to make the cephx identities
    /// the driver asks for (`capabilities/cephx`). Granted without it, the driver's requests are
    /// refused as not configured.
    #[serde(default)]
    pub cephx: Option<crate::capabilities::cephx::CephxConfig>,
    /// Whether `os-extend` (from microversion 3.42) grows this backend's volumes while they are
    /// attached (Cinder's `online_extend_support`). Default: true for a shipped driver, which
    /// serves the new size to the attached hosts at once; false for a component file, whose
    /// contract (0.3.0) promises `extend-volume` only for available volumes: set it for a driver
    /// whose array grows exported volumes.
    #[serde(default)]
    pub online_extend: Option<bool>,
    /// For a backend whose volumes are sparse files in this node's data directory (granted
    /// `backing-store` or `iscsi-target`): how many times its filesystem's size the sizes of its
    /// volumes may add up to (Cinder's `max_over_subscription_ratio`; thin provisioning), default
    /// 20.0, at least 1.0. A create or an extend past it, or one the free space times this ratio
    /// cannot hold, is refused with 413 before the driver is asked.
    #[serde(default)]
    pub max_over_subscription_ratio: Option<f64>,
    /// The share of that filesystem kept free of volumes, in percent (Cinder's
    /// `reserved_percentage`), default 0: the free space such a check counts is what is free
    /// beyond it.
    #[serde(default)]
    pub reserved_percentage: Option<u32>,
}

/// Cinder's default `max_over_subscription_ratio`.
pub const DEFAULT_OVER_SUBSCRIPTION: f64 = 20.0;

impl BackendConfig {
    /// Whether attached volumes may be extended (`online_extend`, or its default).
    pub fn extends_attached(&self) -> bool {
        self.online_extend.unwrap_or(self.driver.is_some())
    }

    /// The over-subscription ratio of its sparse files (`max_over_subscription_ratio`, or 20).
    pub fn over_subscription(&self) -> f64 {
        self.max_over_subscription_ratio.unwrap_or(DEFAULT_OVER_SUBSCRIPTION)
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeTypeConfig {
    /// The type's name, as clients give it (`volume_type`).
    pub name: String,
    /// The backend that serves volumes of this type.
    pub backend: String,
    /// Shown in the type's description.
    #[serde(default)]
    pub description: Option<String>,
    /// Cinder extra specs; `multiattach = "<is> True"` makes volumes of this type multiattach,
    /// `cacheable = "<is> True"` lets the compute host cache its connections (`cacheable` in
    /// their `connection_info`, unless the driver says false).
    #[serde(default)]
    pub extra_specs: BTreeMap<String, String>,
    /// The name of the `[[qos_specs]]` that volumes of this type get (Cinder's type-QoS
    /// association).
    #[serde(default)]
    pub qos_specs: Option<String>,
}

/// Quality of service that volume types name (Cinder's QoS specs, `cinder qos-list`). With
/// `consumer = "front-end"` or `"both"`, every connection of a volume of such a type carries the
/// specs (`qos_specs` in its `connection_info`) for the compute host to enforce: Nova sets
/// `total_bytes_sec`, `read_iops_sec`, ... as the disk's I/O limits. As in Cinder, a
/// `<limit>_per_gb` value is multiplied by the volume's size (at least `<limit>_per_gb_min`, at
/// most `<limit>_max`) where `<limit>` is one of `total`, `read` or `write`, then `_bytes_sec` or
/// `_iops_sec`; those values must be whole numbers. `back-end` specs are shown, never sent.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QosSpecsConfig {
    /// The specs' name, which volume types give as `qos_specs`.
    pub name: String,
    /// Who enforces them: `front-end` (the compute host), `back-end` (the storage) or `both`.
    #[serde(default)]
    pub consumer: crate::domain::qos::QosConsumer,
    /// The specs, as Cinder's (`total_iops_sec = "500"`, `read_bytes_sec_per_gb = "1048576"`).
    #[serde(default)]
    pub specs: BTreeMap<String, String>,
}

impl Config {
    /// Reads a configuration file.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Refuses names that mean two things: two backends, two volume types or two sets of QoS
    /// specs of one name (the second was silently one with the first, or both were listed under
    /// one id); and names that mean nothing: a type's QoS specs that are not configured, or
    /// specs whose per-GiB values are not numbers.
    pub fn check_names(&self) -> Result<(), String> {
        fn twice<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
            let mut seen = std::collections::BTreeSet::new();
            names.into_iter().find(|n| !seen.insert(*n))
        }
        if let Some(name) = twice(self.backends.iter().map(|b| b.name.as_str())) {
            return Err(format!("backend {name} is configured twice: give each [[backends]] its own name"));
        }
        if let Some(name) = twice(self.volume_types.iter().map(|t| t.name.as_str())) {
            return Err(format!(
                "volume type {name} is configured twice: give each [[volume_types]] its own name"
            ));
        }
        if let Some(name) = twice(self.qos_specs.iter().map(|q| q.name.as_str())) {
            return Err(format!(
                "qos specs {name} are configured twice: give each [[qos_specs]] its own name"
            ));
        }
        for b in &self.backends {
            if !(b.over_subscription() >= 1.0 && b.over_subscription().is_finite()) {
                return Err(format!(
                    "backend {}: max_over_subscription_ratio = {} must be a number of at least 1.0",
                    b.name,
                    b.over_subscription()
                ));
            }
            if b.reserved_percentage.is_some_and(|r| r > 100) {
                return Err(format!("backend {}: reserved_percentage must be from 0 to 100", b.name));
            }
        }
        for q in &self.qos_specs {
            crate::domain::qos::QosSpecs::check(&q.specs)
                .map_err(|e| format!("qos specs {}: {e}", q.name))?;
        }
        for t in &self.volume_types {
            if let Some(name) = &t.qos_specs
                && !self.qos_specs.iter().any(|q| q.name == *name)
            {
                return Err(format!(
                    "volume type {} names qos specs {name}, which are not configured ([[qos_specs]])",
                    t.name
                ));
            }
        }
        Ok(())
    }

    /// Fills in the embedded default backend and types when none are configured, and makes every
    /// configured path absolute, once, against the directory `berth serve` was started in: a
    /// relative `--data-dir` or file named in the configuration means the same for the whole run,
    /// whatever later compares or opens it.
    pub fn with_defaults(mut self) -> Config {
        let absolute = |p: &mut PathBuf| {
            if p.is_relative()
                && let Ok(abs) = std::path::absolute(&*p)
            {
                *p = abs;
            }
        };
        if let Some(dir) = self.data_dir.as_mut() {
            absolute(dir);
        }
        if let Some(dir) = self.runtime.cache_dir.as_mut() {
            absolute(dir);
        }
        for file in [self.auth.tokens_file.as_mut(), self.auth.policy_file.as_mut()].into_iter().flatten() {
            absolute(file);
        }
        for wasm in self.backends.iter_mut().filter_map(|b| b.wasm.as_mut()) {
            absolute(wasm);
        }
        if self.backends.is_empty() {
            self.backends.push(BackendConfig {
                name: "tgt".into(),
                driver: Some("tgt-iscsi".into()),
                wasm: None,
                grants: [Grant::IscsiTarget, Grant::BackingStore].into_iter().collect(),
                settings: BTreeMap::new(),
                limits: Limits::default(),
                shared: false,
                network: None,
                cephx: None,
                online_extend: None,
                max_over_subscription_ratio: None,
                reserved_percentage: None,
            });
        }
        if self.volume_types.is_empty() {
            let backend = self.backends[0].name.clone();
            self.volume_types.push(VolumeTypeConfig {
                name: "__DEFAULT__".into(),
                backend: backend.clone(),
                description: Some("Default Volume Type".into()),
                extra_specs: BTreeMap::new(),
                qos_specs: None,
            });
            self.volume_types.push(VolumeTypeConfig {
                name: "multiattach".into(),
                backend,
                description: Some("Volumes that several hosts may attach at once".into()),
                extra_specs: BTreeMap::from([("multiattach".into(), "<is> True".into())]),
                qos_specs: None,
            });
        }
        self
    }

    /// The data directory: as configured, else `$XDG_STATE_HOME/berth` or `~/.local/state/berth`.
    pub fn data_dir(&self) -> PathBuf {
        if let Some(dir) = &self.data_dir {
            return dir.clone();
        }
        if let Some(state) = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()) {
            return PathBuf::from(state).join("berth");
        }
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/lib"));
        home.join(".local/state/berth")
    }

    /// The URL other nodes forward requests to, for a listener bound to `bound`.
    pub fn advertise_url(&self, bound: SocketAddr) -> String {
        if let Some(url) = self.advertise_url.as_deref().filter(|u| !u.trim().is_empty()) {
            return url.trim().trim_end_matches('/').to_string();
        }
        let scheme = self.scheme();
        if !bound.ip().is_unspecified() {
            return format!("{scheme}://{bound}");
        }
        format!("{scheme}://{}:{}", hostname(), bound.port())
    }

    /// `https` when the API is served over TLS (`[http] tls_cert_file`), else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.http.tls_cert_file.is_some() { "https" } else { "http" }
    }

    pub fn database_url(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.data_dir().join("berth.db").display()))
    }
}

/// This machine's host name (`localhost` when it has none).
pub fn hostname() -> String {
    let mut name = [0u8; 256];
    // SAFETY: gethostname(2) writes at most `len` bytes into the buffer this function owns.
    let named = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0;
    named
        .then(|| std::ffi::CStr::from_bytes_until_nul(&name).ok()?.to_str().ok().map(str::to_string))
        .flatten()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The configuration reference (`docs/configuration.md`), generated from the `Config` type and
/// its doc comments, so it cannot drift: a test compares the file with this text.
pub fn reference() -> String {
    let schema = serde_json::to_value(schemars::schema_for!(Config)).expect("a schema is JSON");
    let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the configuration type (`host/src/config.rs`) by \
         `BERTH_UPDATE_DOCS=1 cargo test -p berth --lib configuration_reference`; a test fails when \
         this file and the type differ. `berth serve --config FILE` reads TOML; every key is \
         optional, and unknown keys are refused.\n\n",
    );
    let mut tables = Vec::new();
    out.push_str("## Top-level keys\n\n| key | type | default | meaning |\n|---|---|---|---|\n");
    for (key, prop) in schema["properties"].as_object().into_iter().flatten() {
        let target = prop.get("$ref").and_then(|r| r.as_str()).and_then(|r| r.rsplit('/').next());
        let item = prop["items"].get("$ref").and_then(|r| r.as_str()).and_then(|r| r.rsplit('/').next());
        match (target, item) {
            (Some(def), _) if defs[def].get("properties").is_some() => {
                tables.push((format!("[{key}]"), def.to_string()))
            }
            (_, Some(def)) => tables.push((format!("[[{key}]]"), def.to_string())),
            _ => out.push_str(&row(key, prop, &defs)),
        }
    }
    let mut queue: std::collections::VecDeque<_> = tables.into();
    while let Some((title, def)) = queue.pop_front() {
        let d = &defs[&def];
        out.push_str(&format!("\n## `{title}`\n\n"));
        if let Some(text) = d["description"].as_str() {
            out.push_str(&format!("{}\n\n", text.replace('\n', " ")));
        }
        out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
        // Tables inside this one (`[backends.network]`) and tables by name
        // (`[backends.network.secrets.<name>]`) follow it.
        let inner = title.trim_matches(|c| c == '[' || c == ']');
        let mut nested = Vec::new();
        for (key, prop) in d["properties"].as_object().into_iter().flatten() {
            out.push_str(&row(key, prop, &defs));
            if let Some(sub) = table_def(prop, &defs) {
                nested.push((format!("[{inner}.{key}]"), sub));
            } else if let Some(sub) = prop.get("additionalProperties").and_then(|p| table_def(p, &defs)) {
                nested.push((format!("[{inner}.{key}.<name>]"), sub));
            }
        }
        for n in nested.into_iter().rev() {
            queue.push_front(n);
        }
    }
    out
}

/// The definition a property refers to, if it is a table (possibly optional).
fn table_def(prop: &serde_json::Value, defs: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    let refs = std::iter::once(prop).chain(prop["anyOf"].as_array().into_iter().flatten());
    refs.filter_map(|p| p.get("$ref")?.as_str()?.rsplit('/').next())
        .find(|def| defs.get(*def).is_some_and(|d| d.get("properties").is_some()))
        .map(str::to_string)
}

/// One table row: key, type (or allowed values), default, description.
fn row(key: &str, prop: &serde_json::Value, defs: &serde_json::Map<String, serde_json::Value>) -> String {
    let resolved = match prop.get("$ref").and_then(|r| r.as_str()).and_then(|r| r.rsplit('/').next()) {
        Some(def) => defs.get(def).cloned().unwrap_or_default(),
        None => prop.clone(),
    };
    let values: Vec<String> = resolved["enum"]
        .as_array()
        .cloned()
        .or_else(|| {
            resolved["oneOf"].as_array().map(|v| v.iter().filter_map(|o| o.get("const").cloned()).collect())
        })
        .unwrap_or_default()
        .iter()
        .map(|v| format!("`{}`", v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string())))
        .collect();
    let kind = if !values.is_empty() {
        values.join(" \\| ")
    } else {
        match &resolved["type"] {
            serde_json::Value::String(t) => t.clone(),
            serde_json::Value::Array(ts) => {
                ts.iter().filter_map(|t| t.as_str()).filter(|t| *t != "null").collect::<Vec<_>>().join(", ")
            }
            _ => "table".into(),
        }
    };
    let default = match &prop["default"] {
        serde_json::Value::Null => "none".to_string(),
        v => format!("`{v}`"),
    };
    let meaning = prop["description"]
        .as_str()
        .or_else(|| resolved["description"].as_str())
        .unwrap_or("")
        .replace('\n', " ")
        .replace('|', "\\|");
    format!("| `{key}` | {kind} | {default} | {meaning} |\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn configuration_reference_is_generated_from_the_type() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md");
        let text = super::reference();
        if std::env::var_os("BERTH_UPDATE_DOCS").is_some() {
            std::fs::write(path, &text).unwrap();
        }
        let file = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            file == text,
            "docs/configuration.md differs from the configuration type; run \
             BERTH_UPDATE_DOCS=1 cargo test -p berth --lib configuration_reference"
        );
        for key in ["[tgt]", "keep_exports_seconds", "[[backends]]", "max_per_volume", "policy_file"] {
            assert!(text.contains(key), "{key}");
        }
    }
    use super::*;

    #[test]
    fn a_backend_or_a_volume_type_of_one_name_twice_is_refused() {
        let config = |toml: &str| -> Config { toml::from_str(toml).unwrap() };
        let backend = |name: &str| format!("[[backends]]\nname = \"{name}\"\ndriver = \"fake\"\n");
        let vtype = |name: &str| format!("[[volume_types]]\nname = \"{name}\"\nbackend = \"a\"\n");
        let ok = config(&format!("{}{}{}{}", backend("a"), backend("b"), vtype("t"), vtype("u")));
        assert_eq!(ok.check_names(), Ok(()));
        let twice = config(&format!("{}{}{}", backend("a"), backend("a"), vtype("t")));
        assert_eq!(
            twice.check_names().unwrap_err(),
            "backend a is configured twice: give each [[backends]] its own name"
        );
        let twice = config(&format!("{}{}{}", backend("a"), vtype("t"), vtype("t")));
        assert_eq!(
            twice.check_names().unwrap_err(),
            "volume type t is configured twice: give each [[volume_types]] its own name"
        );
    }

    #[test]
    fn qos_specs_twice_unknown_to_a_type_or_unscalable_are_refused() {
        let config = |toml: &str| -> Config { toml::from_str(toml).unwrap() };
        let base = "[[backends]]\nname = \"a\"\ndriver = \"fake\"\n\
                    [[volume_types]]\nname = \"t\"\nbackend = \"a\"\nqos_specs = \"gold\"\n";
        let gold = "[[qos_specs]]\nname = \"gold\"\nconsumer = \"front-end\"\n\
                    specs = { total_iops_sec_per_gb = \"30\" }\n";
        let ok = config(&format!("{base}{gold}"));
        assert_eq!(ok.check_names(), Ok(()));
        assert_eq!(ok.qos_specs[0].consumer, crate::domain::qos::QosConsumer::FrontEnd);
        assert_eq!(
            config(&format!("{base}{gold}{gold}")).check_names().unwrap_err(),
            "qos specs gold are configured twice: give each [[qos_specs]] its own name"
        );
        assert_eq!(
            config(base).check_names().unwrap_err(),
            "volume type t names qos specs gold, which are not configured ([[qos_specs]])"
        );
        let unscalable = gold.replace("\"30\"", "\"lots\"");
        assert_eq!(
            config(&format!("{base}{unscalable}")).check_names().unwrap_err(),
            "qos specs gold: total_iops_sec_per_gb = \"lots\" is not a whole number of at least 0"
        );
        let consumer: Result<Config, _> =
            toml::from_str("[[qos_specs]]\nname = \"x\"\nconsumer = \"frontend\"\n");
        assert!(consumer.unwrap_err().to_string().contains("front-end"), "the allowed consumers are named");
    }

    #[test]
    fn an_empty_configuration_gets_the_embedded_default() {
        let c: Config = toml::from_str("").unwrap();
        let c = c.with_defaults();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8776");
        assert_eq!(c.backends[0].driver.as_deref(), Some("tgt-iscsi"));
        assert_eq!(
            c.volume_types.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
            ["__DEFAULT__", "multiattach"]
        );
    }

    #[test]
    fn a_full_configuration_parses_and_unknown_keys_are_refused() {
        let c: Config = toml::from_str(
            r#"
            listen = "127.0.0.1:9000"
            database_url = "postgres://berth@127.0.0.1/berth"
            [auth]
            strategy = "token"
            tokens_file = "/etc/berth/tokens.toml"
            [[backends]]
            name = "fake"
            driver = "fake"
            grants = ["backing-store"]
            settings = { "fake.create-volume" = "ok" }
            limits = { memory_mib = 32 }
            [[volume_types]]
            name = "shared"
            backend = "fake"
            extra_specs = { multiattach = "<is> True" }
            "#,
        )
        .unwrap();
        assert_eq!(c.auth.strategy, AuthStrategy::Token);
        assert_eq!(c.backends[0].limits.memory_mib, 32);
        assert!(c.backends[0].grants.contains(&Grant::BackingStore));
        assert!(toml::from_str::<Config>("lisen = \"x\"").is_err());
    }

    #[test]
    fn the_packaged_configuration_parses() {
        let c: Config = toml::from_str(include_str!("../../packaging/berth.toml")).unwrap();
        assert_eq!(c.auth.strategy, AuthStrategy::Token);
        assert!(!c.tgt.start);
    }

    #[test]
    fn the_keystone_password_is_never_printed() {
        let c: Config = toml::from_str(
            r#"
            [auth]
            strategy = "keystone"
            [keystone]
            auth_url = "http://127.0.0.1:5000"
            username = "berth"
            password = "s3cret-pw"
            "#,
        )
        .unwrap();
        assert_eq!(c.auth.strategy, AuthStrategy::Keystone);
        assert_eq!(c.keystone.password.as_ref().map(|p| p.0.as_str()), Some("s3cret-pw"));
        assert_eq!(c.keystone.project_name, "service");
        assert!(!format!("{c:?}").contains("s3cret-pw"));
        assert!(!serde_json::to_string(&c).unwrap().contains("s3cret-pw"));
    }
}

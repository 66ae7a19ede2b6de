//! `berth serve`: assembles the service from its configuration (store, runtime, capabilities,
//! drivers, catalog) and serves the API until SIGINT or SIGTERM. The API answers as soon as the
//! listener is bound; reconciliation (`attach/reconcile/`) runs in the background, first at
//! start-up and then periodically, and operations left by a killed process are finished before
//! anything else happens to their volumes.

use crate::capabilities::iscsi::initiators::InitiatorKey;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::api::auth::Auth;
use crate::api::auth::keystone::KeystoneAuth;
use crate::api::forward::Forwarder;
use crate::api::policy::Policy;
use crate::api::server::{InFlight, ServerLimits};
use crate::api::{AppState, app};
use crate::attach::catalog::qos_specs_id;
use crate::attach::ops::Owner;
use crate::attach::reconcile::{Options as ReconcileOptions, Reconciled};
use crate::attach::{Backend, Catalog, Limits, Service, VolumeType};
use crate::capabilities::backing::BackingStores;
use crate::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use crate::capabilities::iscsi::{ChapPolicy, IscsiCapability, Portal, TargetService};
use crate::capabilities::namespace::{Namespace, check_disjoint};
use crate::capabilities::{DriverCapabilities, Grant};
use crate::config::{AuthStrategy, Config, ReconcileMode};
use crate::domain::qos::QosSpecs;
use crate::runtime::{DriverSpec, Footprint, Runtime, RuntimeOptions, WasmSource};
use crate::store::{Store, StoreOptions};
use crate::upgrade::{Loadable, Upgrades};

/// A running service's parts, for tests and benchmarks that embed it.
pub struct Assembled {
    pub state: AppState,
    pub config: Config,
    /// The target service drivers were granted, if any.
    pub targets: Option<Arc<dyn TargetService>>,
    /// The API's TLS configuration (`[http] tls_cert_file`, `tls_key_file`).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// The data directory's lock, held for as long as the service lives.
    _lock: std::fs::File,
}

/// Builds everything `serve` needs, without listening.
pub async fn assemble(config: Config) -> anyhow::Result<Assembled> {
    let config = config.with_defaults();
    config.check_names().map_err(anyhow::Error::msg)?;
    let data_dir = config.data_dir();
    std::fs::create_dir_all(&data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    set_private(&data_dir)?;
    let lock = lock_data_dir(&data_dir)?;
    let node = node_name(&config, &data_dir)?;

    let auth = match config.auth.strategy {
        AuthStrategy::Noauth => {
            if !config.listen.ip().is_loopback() {
                bail!(
                    "noauth is allowed only on a loopback listener, not {}; configure [auth] strategy = \"token\"",
                    config.listen
                );
            }
            tracing::warn!(
                "[auth] strategy = \"noauth\": every local user is trusted; a caller names its own user, \
                 project and roles (X-Auth-Token, X-Roles, X-Service-Roles)"
            );
            Auth::NoAuth
        }
        AuthStrategy::Token => {
            let file =
                config.auth.tokens_file.as_ref().context("[auth] strategy = \"token\" needs tokens_file")?;
            Auth::from_tokens_file(file).map_err(anyhow::Error::msg)?
        }
        AuthStrategy::Keystone => {
            let ca_file = config.http.ca_file.as_deref();
            Auth::Keystone(Box::new(
                KeystoneAuth::new(&config.keystone, ca_file).map_err(anyhow::Error::msg)?,
            ))
        }
    };
    let compute = compute(&config, &auth)?;
    let tls = match (&config.http.tls_cert_file, &config.http.tls_key_file) {
        (Some(cert), Some(key)) => {
            Some(crate::tls::server_config(cert, key).map_err(|e| anyhow::anyhow!("[http] TLS: {e}"))?)
        }
        (None, None) => None,
        _ => bail!("[http] needs both tls_cert_file and tls_key_file, or neither"),
    };
    if config.metrics.tls && tls.is_none() {
        bail!(
            "[metrics] tls = true needs [http] tls_cert_file and tls_key_file: the metrics are served with the API's certificate"
        );
    }

    let policy = match &config.auth.policy_file {
        Some(path) => Policy::from_file(path).map_err(anyhow::Error::msg)?,
        None => Policy::default(),
    };

    let store = Store::open(
        &config.database_url(),
        &StoreOptions {
            synchronous: config.sqlite_synchronous,
            max_connections: config.max_connections,
            opening: crate::store::Opening::Serve,
        },
    )
    .await
    .with_context(|| {
        format!("cannot open the database {}", crate::store::redact_url(&config.database_url()))
    })?;

    let sources = config.backends.iter().map(source).collect::<anyhow::Result<Vec<_>>>()?;
    // The pool's call slots are sized by the largest driver configured.
    let mut slot = Footprint::BASELINE;
    for (b, source) in config.backends.iter().zip(&sources) {
        let f = source.footprint().map_err(|e| anyhow::anyhow!("backend {}: {e}", b.name))?;
        slot = slot.max(f);
    }
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(config.runtime.cache_dir.clone().unwrap_or_else(|| data_dir.join("cache"))),
        tick: Duration::from_millis(config.runtime.tick_ms.max(1)),
        fuel: false,
        max_concurrent_calls: config.runtime.max_concurrent_calls,
        slot,
        keep_resident: (config.runtime.keep_resident_mib as usize) << 20,
    })?;
    crate::metrics::METRICS
        .kept_resident_bytes
        .set(i64::try_from(runtime.kept_resident()).unwrap_or(i64::MAX));

    // Each backend owns a directory of stores and a target prefix (`capabilities/namespace.rs`).
    let volumes = data_dir.join("volumes");
    let namespaces = config
        .backends
        .iter()
        .map(|b| Namespace::new(&b.name, &b.settings))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    check_disjoint(&namespaces).map_err(anyhow::Error::msg)?;
    let wants_iscsi = config.backends.iter().any(|b| b.grants.contains(&Grant::IscsiTarget));
    let iscsi = if wants_iscsi { Some(iscsi_service(&config, &volumes).await?) } else { None };

    let mut backends = Vec::new();
    let mut loadables = BTreeMap::new();
    for ((b, namespace), wasm) in config.backends.iter().zip(&namespaces).zip(sources) {
        let stores = Arc::new(BackingStores::new(&volumes, namespace, Duration::from_secs(60))?);
        let capabilities = DriverCapabilities {
            settings: Arc::new(namespace.settings(&b.settings)),
            iscsi: iscsi.clone().filter(|_| b.grants.contains(&Grant::IscsiTarget)).map(
                |(service, portals, chap, initiator_key)| IscsiCapability {
                    service,
                    portals,
                    chap,
                    stores: stores.clone(),
                    namespace: namespace.clone(),
                    initiator_key,
                },
            ),
            backing: Some(stores.clone()).filter(|_| b.grants.contains(&Grant::BackingStore)),
            network: network_of(b)?,
            cephx: cephx_of(b)?,
        };
        let spec = DriverSpec {
            backend: b.name.clone(),
            wasm,
            grants: b.grants.clone(),
            limits: b.limits,
            capabilities,
        };
        let uses_targets = b.grants.contains(&Grant::IscsiTarget);
        if b.shared && uses_targets {
            bail!(
                "backend {}: shared = true, but it is granted the iSCSI target service of this node, whose \
                 targets no other node can reach; a shared backend's driver reaches its storage over the network",
                b.name
            );
        }
        let multiattach = config.volume_types.iter().any(|t| {
            t.backend == b.name
                && VolumeType::new(&t.name, &t.backend, None, t.extra_specs.clone()).multiattach()
        });
        let vendor = crate::conformance::VendorConfig {
            settings: b.settings.clone(),
            grants: b.grants.clone(),
            limits: b.limits,
            network: b.network.clone(),
            cephx: b.cephx.clone(),
            online_extend: b.extends_attached(),
            ..Default::default()
        };
        loadables
            .insert(b.name.clone(), Loadable { spec: spec.clone(), vendor, shared: b.shared, multiattach });
        let driver = runtime.load(spec).await?;
        if let Some(service) = driver.target_service().filter(|_| uses_targets).cloned() {
            crate::metrics::watch_luns(&b.name, move || service.lun_capacity().map(|c| (c.held, c.ceiling)));
        }
        let backend = Backend::new(&node, &b.name, driver, uses_targets, b.shared);
        // Its volumes are sparse files in this node's data directory when it may make them.
        let files = [Grant::BackingStore, Grant::IscsiTarget].iter().any(|g| b.grants.contains(g));
        let filesystem = files.then(|| {
            let reserved = b.reserved_percentage.unwrap_or(0);
            crate::attach::catalog::Filesystem::new(stores.clone(), b.over_subscription(), reserved)
        });
        if let Some(f) = &filesystem {
            let stores = f.stores.clone();
            crate::metrics::watch_filesystem(&b.name, move || {
                stores.space().ok().map(|s| (s.total_bytes, s.free_bytes))
            });
        }
        backends.push(Backend { extends_attached: b.extends_attached(), filesystem, ..backend });
    }
    let qos_specs: Vec<QosSpecs> = config
        .qos_specs
        .iter()
        .map(|q| QosSpecs::new(qos_specs_id(&q.name), &q.name, q.consumer, q.specs.clone()))
        .collect();
    let types: Vec<VolumeType> = config
        .volume_types
        .iter()
        .map(|t| {
            let qos = t.qos_specs.as_ref().and_then(|name| qos_specs.iter().find(|q| q.name == *name));
            VolumeType::new(&t.name, &t.backend, t.description.clone(), t.extra_specs.clone())
                .with_qos_specs(qos.cloned())
        })
        .collect();
    let default_type = config.default_volume_type.clone().unwrap_or_else(|| types[0].name.clone());
    let catalog =
        Catalog::new(types, default_type, backends).map_err(anyhow::Error::msg)?.with_qos_specs(qos_specs);
    let owner = Owner::new(&node, Duration::from_secs(config.operations.lease_seconds.max(1)));
    let limits = Limits {
        max_attachments_per_volume: config.attachments.max_per_volume.max(1),
        keep_messages_days: config.messages.keep_days,
    };
    let targets = iscsi.as_ref().map(|(service, _, _, _)| service.clone());
    let service = Arc::new(
        Service::new(store, catalog, owner).with_limits(limits).with_targets(targets).with_compute(compute),
    );
    let cache_dir = Some(config.runtime.cache_dir.clone().unwrap_or_else(|| data_dir.join("cache")));
    let upgrades = Arc::new(Upgrades::new(runtime, &data_dir, cache_dir, loadables, config.upgrades.watch()));
    upgrades.resume(&service).await;
    let state = AppState {
        service,
        upgrades: Some(upgrades),
        auth: Arc::new(auth),
        policy: Arc::new(policy),
        in_flight: InFlight::new(config.http.max_requests_in_flight),
        public_endpoint: config.public_endpoint.clone(),
        scheme: config.scheme(),
        body_read_timeout: Duration::from_secs_f64(
            config.http.body_read_timeout_seconds.clamp(0.01, 86_400.0),
        ),
        forwarder: Forwarder::new(
            &node,
            Duration::from_secs_f64(config.http.forward_timeout_seconds.clamp(0.1, 86_400.0)),
            config.http.ca_file.as_deref(),
        )
        .map_err(anyhow::Error::msg)?,
    };
    Ok(Assembled { state, targets: iscsi.map(|(service, _, _, _)| service), config, tls, _lock: lock })
}

/// The compute service Berth tells of attached volumes that grew (`[nova]`): by default when
/// Berth authenticates callers with Keystone (it then has a token Nova takes).
fn compute(config: &Config, auth: &Auth) -> anyhow::Result<Option<Arc<crate::compute::Nova>>> {
    let keystone = match auth {
        Auth::Keystone(k) => Some(k.session()),
        _ => None,
    };
    if config.nova.username.is_some() && keystone.is_none() && config.nova.enabled != Some(false) {
        bail!("[nova] username needs [auth] strategy = \"keystone\": Nova takes only Keystone tokens");
    }
    match (config.nova.enabled, keystone) {
        (Some(false), _) | (None, None) => Ok(None),
        (Some(true), None) => bail!(
            "[nova] enabled = true needs [auth] strategy = \"keystone\": Nova takes only Keystone tokens"
        ),
        (_, Some(session)) => {
            let session = nova_session(session, config)?;
            let nova = crate::compute::Nova::new(session, &config.nova, config.http.ca_file.as_deref())
                .map_err(anyhow::Error::msg)?;
            Ok(Some(Arc::new(nova)))
        }
    }
}

/// The Keystone session Berth tells Nova with: `[nova]`'s own user when one is named, else Berth's
/// own (`keystone`, the session that validates callers).
fn nova_session(
    keystone: Arc<crate::keystone::Session>,
    config: &Config,
) -> anyhow::Result<Arc<crate::keystone::Session>> {
    use crate::keystone::{Named, Password, Session};
    let (n, k) = (&config.nova, &config.keystone);
    match (&n.username, &n.password) {
        (None, None) => Ok(keystone),
        (Some(_), None) => bail!("[nova] username needs [nova] password"),
        (None, Some(_)) => bail!("[nova] password needs [nova] username"),
        (Some(user), Some(password)) => {
            let name = |own: &Option<String>, theirs: &str| {
                Named::Name(own.clone().unwrap_or_else(|| theirs.to_string()))
            };
            let password = Password {
                auth_url: keystone.auth_url().to_string(),
                user: Named::Name(user.clone()),
                user_domain: name(&n.user_domain_name, &k.user_domain_name),
                password: password.0.clone(),
                project: name(&n.project_name, &k.project_name),
                project_domain: name(&n.project_domain_name, &k.project_domain_name),
            };
            Ok(Arc::new(Session::new(keystone.http().clone(), password)))
        }
    }
}

/// A backend's network capability: with the `network` grant, its `[backends.network]` table
/// (the allow-list is required); a table without the grant is refused, as a likely mistake.
pub fn network_of(
    b: &crate::config::BackendConfig,
) -> anyhow::Result<Option<Arc<crate::capabilities::network::NetworkCapability>>> {
    match (b.grants.contains(&Grant::Network), &b.network) {
        (true, Some(config)) => Ok(Some(Arc::new(
            crate::capabilities::network::NetworkCapability::new(&b.name, config)
                .map_err(anyhow::Error::msg)?,
        ))),
        (true, None) => bail!(
            "backend {}: the network grant needs a [backends.network] table naming its allowed_hosts",
            b.name
        ),
        (false, Some(_)) => bail!(
            "backend {}: [backends.network] is set but the backend is not granted \"network\" (add it to grants)",
            b.name
        ),
        (false, None) => Ok(None),
    }
}

/// A backend's cephx capability: with the `cephx` grant, its `[backends.cephx]` table (without
/// one the driver's requests are refused as not configured); a table without the grant is
/// refused, as a likely mistake.
pub fn cephx_of(
    b: &crate::config::BackendConfig,
) -> anyhow::Result<Option<Arc<crate::capabilities::cephx::CephxCapability>>> {
    let pool = b.settings.get("pool").map_or("volumes", String::as_str);
    match (b.grants.contains(&Grant::Cephx), &b.cephx) {
        (true, config) => Ok(Some(Arc::new(
            crate::capabilities::cephx::CephxCapability::new(&b.name, config.as_ref(), pool)
                .map_err(anyhow::Error::msg)?,
        ))),
        (false, Some(_)) => bail!(
            "backend {}: [backends.cephx] is set but the backend is not granted \"cephx\" (add it to grants)",
            b.name
        ),
        (false, None) => Ok(None),
    }
}

/// The target service every iSCSI backend shares, with its portals, CHAP policy and the node's key
/// for per-initiator credentials.
type IscsiService = (Arc<dyn TargetService>, Vec<Portal>, ChapPolicy, InitiatorKey);

async fn iscsi_service(config: &Config, volumes: &std::path::Path) -> anyhow::Result<IscsiService> {
    let chap = ChapPolicy {
        username_length: config.tgt.chap_username_length,
        secret_length: config.tgt.chap_secret_length,
    };
    chap.validate().map_err(anyhow::Error::msg)?;
    let mut portals = Vec::new();
    for text in std::iter::once(&config.tgt.portal).chain(&config.tgt.extra_portals) {
        let addr: SocketAddr =
            text.parse().with_context(|| format!("tgt portal {text:?} is not address:port"))?;
        portals.push(Portal { address: addr.ip().to_string(), port: addr.port() });
    }
    let tgtd = Tgtd::new(TgtdConfig {
        tgtd: config.tgt.tgtd.clone(),
        control_port: config.tgt.control_port,
        socket_dir: PathBuf::from("/var/run/tgtd"),
        backing_dir: volumes.to_path_buf(),
        timeout: Duration::from_millis(config.tgt.command_timeout_ms),
        io_threads: config.tgt.io_threads,
        reserve_threads: config.tgt.reserve_threads,
        max_luns: config.tgt.max_luns,
        keep_exports: Duration::from_secs(config.tgt.keep_exports_seconds),
        keep_accounts: Duration::from_secs(config.tgt.keep_accounts_seconds),
        thin_provisioning: config.tgt.thin_provisioning,
        state_file: Some(config.data_dir().join(format!("tgt-kept-{}.json", config.tgt.control_port))),
        preload_dir: Some(config.data_dir()),
    });
    let started = config.tgt.start
        && tgtd.ensure_running(&portals[0]).await.map_err(|e| anyhow::anyhow!("tgtd: {e}"))?;
    if started {
        tracing::info!(portal = %config.tgt.portal, control_port = config.tgt.control_port, "started tgtd");
    }
    if !started && !tgtd.is_running().await {
        tracing::warn!(
            control_port = config.tgt.control_port,
            "tgtd does not answer; attaches will fail until it does"
        );
    } else if let Some(missing) = tgtd.portals_not_served(&portals).await
        && !missing.is_empty()
    {
        // Every connection names these portals: an initiator would find nothing there, or
        // another process.
        let missing: Vec<String> = missing.iter().map(|p| format!("{}:{}", p.address, p.port)).collect();
        anyhow::bail!(
            "tgt: the tgtd on control port {} does not listen on the portal(s) {} that attachments name; \
             set [tgt] portal (and extra_portals) to where it listens, or start it with those portals",
            config.tgt.control_port,
            missing.join(", ")
        );
    }
    let key_file = config.data_dir().join("tgt-chap.key");
    let key = InitiatorKey::load_or_create(&key_file)
        .with_context(|| format!("the key for per-initiator CHAP credentials, {}", key_file.display()))?;
    Ok((Arc::new(tgtd), portals, chap, key))
}

fn set_private(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot restrict {}", dir.display()))
}

/// Only one `berth serve` per data directory: its database, volumes and operations are this
/// process's alone (a second would take over its operations as if it had died).
pub fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let path = dir.join("berth.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: flock(2) on a file descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!("another berth serve is using the data directory {}", dir.display());
    }
    Ok(file)
}

/// The node's name: configured, or generated once and kept in the data directory. A configured
/// name is refused where it would mean something else in a host name (`node@backend#pool`): a
/// name with `@`, `#`, a space or a control character, or the clusters' name (`berth@backend` is
/// a shared backend, `attach/catalog.rs`).
fn node_name(config: &Config, dir: &std::path::Path) -> anyhow::Result<String> {
    if let Some(node) = config.node.as_deref().map(str::trim).filter(|n| !n.is_empty()) {
        if node == crate::attach::catalog::CLUSTER {
            bail!(
                "node = \"{node}\" is the name of the clusters (a shared backend is {node}@backend): give the \
                 node another name"
            );
        }
        if node.chars().any(|c| c == '@' || c == '#' || c.is_whitespace() || c.is_control()) {
            bail!(
                "node = {node:?}: a node's name is part of its volumes' host (node@backend#pool) and cannot \
                 hold '@', '#', a space or a control character"
            );
        }
        return Ok(node.to_string());
    }
    let path = dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
        _ => {
            let id = uuid::Uuid::new_v4().to_string();
            std::fs::write(&path, format!("{id}\n"))
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(id)
        }
    }
}

impl Assembled {
    /// The reconciler's options from the configuration.
    pub fn reconcile_options(&self) -> ReconcileOptions {
        ReconcileOptions {
            grace: Duration::from_secs(self.config.reconcile.grace_seconds),
            remove: self.config.reconcile.mode == ReconcileMode::Repair,
        }
    }

    /// One reconciliation pass (see `attach/reconcile/`).
    pub async fn reconcile(&self) -> anyhow::Result<Reconciled> {
        Ok(self.state.service.reconcile().pass(self.targets.as_deref(), &self.reconcile_options()).await?)
    }
}

/// What is kept only for a while, deleted at start and every hour: with `[history] keep_days`
/// (`history_days`), the attach history's events older than that and the rows of attachments and
/// volumes deleted before then; and the user messages that have expired (`[messages]
/// keep_days`). Nothing while this node is refused by a newer schema.
pub async fn housekeeping(service: Arc<crate::attach::Service>, history_days: Option<u32>) {
    use crate::attach::history::Retained;
    loop {
        if let Some(refused) = service.owner().schema_refusal() {
            tracing::warn!(
                "could not prune the attach history nor delete the expired user messages: {refused}"
            );
        } else {
            if let Some(days) = history_days {
                let before = crate::store::now_micros() - i64::from(days) * 86_400_000_000;
                match crate::attach::history::retain_since(service.store(), before).await {
                    Ok(retained) if retained == Retained::default() => {}
                    Ok(Retained { events, attachments, volumes }) => tracing::info!(
                        events,
                        deleted_attachments = attachments,
                        deleted_volumes = volumes,
                        keep_days = days,
                        "pruned the attach history"
                    ),
                    Err(e) => tracing::warn!("could not prune the attach history: {e}"),
                }
            }
            match service.purge_messages().await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "deleted the expired user messages"),
                Err(e) => tracing::warn!("could not delete the expired user messages: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
    }
}

/// Where a backend's driver comes from: a shipped driver named by `driver`, or a component file
/// named by `wasm`.
fn source(b: &crate::config::BackendConfig) -> anyhow::Result<WasmSource> {
    Ok(match (&b.driver, &b.wasm) {
        (Some(name), None) => crate::shipped::driver(name).with_context(|| {
            let file = if name.contains('/') || name.ends_with(".wasm") {
                format!("; a component file is named by `wasm = \"{name}\"`")
            } else {
                String::new()
            };
            format!(
                "backend {}: no shipped driver named {name} (shipped: {}){file}",
                b.name,
                crate::shipped::names().collect::<Vec<_>>().join(", ")
            )
        })?,
        (None, Some(path)) => WasmSource::File(path.clone()),
        _ => bail!("backend {}: set exactly one of driver or wasm", b.name),
    })
}

/// Reconciles at start-up and then every `interval`, in the background.
async fn reconcile_loop(assembled: Arc<Assembled>, interval: Duration) {
    let mut pass = 0u64;
    loop {
        pass += 1;
        crate::failpoint::hit("reconcile.pass").await;
        let started = std::time::Instant::now();
        let outcome = assembled.reconcile().await;
        let outcome_listing = outcome.as_ref().ok().map(|r| r.listing);
        if pass == 1 {
            assembled.state.service.reconcile().first_pass_finished();
        }
        crate::metrics::METRICS.reconcile_passes.inc();
        match outcome {
            Ok(r) => {
                let m = &crate::metrics::METRICS;
                m.operations_past_lease.set(r.recovered as i64);
                for (change, n) in [
                    ("recovered", r.recovered),
                    ("repaired", r.repaired.len()),
                    ("refreshed", r.refreshed.len()),
                    ("revoked", r.revoked.len()),
                    ("removed", r.removed.len()),
                    ("identity_removed", r.identities_removed.len()),
                    ("image_removed", r.images_removed.len()),
                ] {
                    m.reconcile_changes
                        .get_or_create(&crate::metrics::ChangeLabels { change: change.into() })
                        .inc_by(n as u64);
                }
                let millis = started.elapsed().as_millis() as u64;
                // Of which the target services' listings (tgtd's share of the pass).
                let listing_millis = r.listing.as_millis() as u64;
                if pass == 1 || r.changed() || !r.failed.is_empty() {
                    tracing::info!(
                        pass,
                        millis,
                        listing_millis,
                        recovered = r.recovered,
                        repaired = r.repaired.len(),
                        refreshed = r.refreshed.len(),
                        revoked = r.revoked.len(),
                        removed = r.removed.len(),
                        identities_removed = r.identities_removed.len(),
                        images_removed = r.images_removed.len(),
                        waiting = r.waiting,
                        drift = r.drift.len(),
                        failed = r.failed.len(),
                        "reconcile pass finished"
                    );
                } else {
                    tracing::debug!(
                        pass,
                        millis,
                        listing_millis,
                        waiting = r.waiting,
                        drift = r.drift.len(),
                        "reconcile pass finished"
                    );
                }
                for (volume, why) in &r.failed {
                    tracing::warn!(volume = %volume, "reconcile could not fix this volume yet: {why}");
                }
            }
            Err(e) => tracing::warn!(pass, "reconcile pass failed: {e:#}"),
        }
        let listing = outcome_listing.unwrap_or_default();
        wait_for_next_pass(&assembled, spacing(interval, listing)).await;
    }
}

/// A pass's listing of tgtd may take at most this share of tgtd's time (one in ten): it costs
/// tgtd time quadratic in its targets (about 2 s at 10,000), during which tgtd serves no attach.
const LISTING_SHARE: u32 = 10;

/// The wait after a pass whose listing of the target service took `listing`: the interval, or
/// longer when listings are long, so that they take at most [`LISTING_SHARE`] of tgtd's time. A
/// restarted tgtd is still reconciled at once (`wait_for_next_pass`).
fn spacing(interval: Duration, listing: Duration) -> Duration {
    interval.max(listing * (LISTING_SHARE - 1))
}

/// How often the reconciler looks whether tgtd was restarted between its passes.
const RESTART_WATCH: Duration = Duration::from_secs(1);

/// Waits `interval`, or less when the target service was restarted meanwhile: a restarted tgtd
/// has lost every export, and the next pass puts them back, so it starts within a second rather
/// than at the end of the interval.
async fn wait_for_next_pass(assembled: &Assembled, interval: Duration) {
    let deadline = tokio::time::Instant::now() + interval;
    loop {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return;
        }
        tokio::time::sleep(RESTART_WATCH.min(deadline - now)).await;
        if assembled.targets.as_ref().is_some_and(|t| t.restarted()) {
            tracing::warn!("the target service was restarted: reconciling now to restore its exports");
            return;
        }
    }
}

/// Serves until SIGINT or SIGTERM.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let assembled = Arc::new(assemble(config).await?);
    let listen = assembled.config.listen;
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let types: BTreeMap<&str, &str> =
        assembled.config.volume_types.iter().map(|t| (t.name.as_str(), t.backend.as_str())).collect();
    let service = assembled.state.service.clone();
    let url = assembled.config.advertise_url(listener.local_addr()?);
    let holder = holder(&assembled.config.data_dir());
    service.register_node(Some(&url), &holder).await.context("cannot register this node")?;
    tracing::info!(
        listen = %listener.local_addr()?, data_dir = %assembled.config.data_dir().display(),
        database = %crate::store::redact_url(&assembled.config.database_url()), node = %service.owner().node,
        advertise_url = %url, tls = assembled.tls.is_some(), ?types, "berth is serving"
    );
    let interval = Duration::from_secs_f64(assembled.config.reconcile.interval_seconds.clamp(0.05, 86_400.0));
    service.reconcile().awaiting_first_pass();
    let reconciler = tokio::spawn(reconcile_loop(assembled.clone(), interval));
    let leases = tokio::spawn(service.clone().renew_leases());
    let housekeeper = tokio::spawn(housekeeping(service.clone(), assembled.config.history.keep_days));
    let heartbeat = tokio::spawn(service.clone().keep_alive());
    let owed = tokio::spawn(service.clone().send_owed_events());
    let follower = assembled.state.upgrades.clone().map(|u| tokio::spawn(u.follow(service.clone())));
    let app = app(assembled.state.clone());
    let limits = ServerLimits {
        header_read_timeout: Duration::from_secs_f64(
            assembled.config.http.header_read_timeout_seconds.clamp(0.01, 86_400.0),
        ),
        shutdown_wait: Duration::from_secs(assembled.config.operations.shutdown_wait_seconds),
    };
    let metrics = match assembled.config.metrics.listen {
        Some(addr) => {
            // With the API's certificate (`assemble` refused `tls` without one).
            let tls = assembled.tls.clone().filter(|_| assembled.config.metrics.tls);
            Some(serve_metrics(addr, limits, tls).await?)
        }
        None => None,
    };
    crate::api::server::serve(listener, app, limits, assembled.tls.clone(), async {
        shutdown().await;
        // Down at once, for the other nodes: they answer for this node's volumes with 503 now,
        // rather than forwarding to a node that is going away.
        heartbeat.abort();
        if let Some(f) = &follower {
            f.abort();
        }
        if let Err(e) = service.mark_down().await {
            tracing::warn!("could not mark this node down: {e}");
        }
    })
    .await?;
    reconciler.abort();
    housekeeper.abort();
    owed.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    let wait = Duration::from_secs(assembled.config.operations.shutdown_wait_seconds);
    let left = service.owner().drain(wait).await;
    if left > 0 {
        tracing::warn!(
            operations = left,
            "stopping with operations in flight; they are recovered at the next start"
        );
    }
    leases.abort();
    service.store().close().await;
    tracing::info!("berth stopped");
    Ok(())
}

/// Where this process runs, as the nodes table records who holds a node's name: the host and the
/// data directory (whose lock this process holds).
pub fn holder(data_dir: &std::path::Path) -> String {
    let dir = data_dir.canonicalize().unwrap_or_else(|_| data_dir.to_path_buf());
    format!("{}:{}", crate::config::hostname(), dir.display())
}

/// `GET /metrics` on its own listener, with the API's bounds: the same header-read and idle
/// timeout, and a few scrapes in flight at most; over TLS with the API's certificate when
/// `[metrics] tls` is set.
async fn serve_metrics(
    addr: SocketAddr,
    limits: ServerLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for metrics"))?;
    tracing::info!(listen = %listener.local_addr()?, tls = tls.is_some(), "metrics at /metrics");
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(|| async {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    crate::metrics::METRICS.render(),
                )
            }),
        )
        .layer(axum::middleware::from_fn_with_state(InFlight::new(8), crate::api::server::shed));
    Ok(tokio::spawn(async move {
        if let Err(e) = crate::api::server::serve(listener, app, limits, tls, std::future::pending()).await {
            tracing::warn!("metrics endpoint stopped: {e}");
        }
    }))
}

async fn shutdown() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_is_a_shipped_one_by_name_or_a_component_file() {
        let backend = |toml: &str| -> crate::config::BackendConfig {
            toml::from_str(&format!("name = \"b\"\n{toml}")).unwrap()
        };
        assert!(matches!(source(&backend("wasm = \"/opt/d.wasm\"")).unwrap(), WasmSource::File(_)));
        assert!(source(&backend("driver = \"tgt-iscsi\"")).is_ok());
        let e = source(&backend("driver = \"nope\"")).unwrap_err().to_string();
        assert!(
            e.starts_with("backend b: no shipped driver named nope (shipped: tgt-iscsi")
                && !e.contains("wasm ="),
            "{e}"
        );
        let e = source(&backend("driver = \"/opt/d.wasm\"")).unwrap_err().to_string();
        assert!(e.ends_with("; a component file is named by `wasm = \"/opt/d.wasm\"`"), "{e}");
        let e = source(&backend("driver = \"fake\"\nwasm = \"/opt/d.wasm\"")).unwrap_err().to_string();
        assert_eq!(e, "backend b: set exactly one of driver or wasm");
    }

    #[test]
    fn a_node_name_that_would_mean_something_else_in_a_host_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let named = |name: &str| {
            let config = Config { node: Some(name.into()), ..Config::default() };
            node_name(&config, dir.path()).map_err(|e| e.to_string())
        };
        assert_eq!(named(" node-1 "), Ok("node-1".into()));
        let e = named("berth").unwrap_err();
        assert!(e.contains("the name of the clusters"), "{e}");
        for bad in ["a@b", "a#b", "a b", "a\tb"] {
            let e = named(bad).unwrap_err();
            assert!(e.contains("cannot hold '@', '#'"), "{bad}: {e}");
        }
        // Unset: generated once, then the same.
        let generated = node_name(&Config::default(), dir.path()).unwrap();
        assert_eq!(node_name(&Config::default(), dir.path()).unwrap(), generated);
    }

    #[test]
    fn long_listings_are_spaced_so_that_they_take_a_tenth_of_tgtds_time() {
        let interval = Duration::from_secs(15);
        assert_eq!(spacing(interval, Duration::from_millis(2)), interval);
        assert_eq!(spacing(interval, Duration::from_secs(8)), Duration::from_secs(72));
    }
}

//! `berth serve`: assembles the service from its configuration (store, runtime, capabilities,
//! drivers, catalog) and serves the API until SIGINT or SIGTERM.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::api::auth::Auth;
use crate::api::{AppState, app};
use crate::attach::{Backend, Catalog, Service, VolumeType};
use crate::capabilities::backing::BackingStores;
use crate::capabilities::iscsi::tgt::{Tgtd, TgtdConfig};
use crate::capabilities::iscsi::{ChapPolicy, IscsiCapability, Portal, TargetService};
use crate::capabilities::{DriverCapabilities, Grant};
use crate::config::{AuthStrategy, Config};
use crate::runtime::{DriverSpec, Runtime, RuntimeOptions, WasmSource};
use crate::store::{Store, StoreOptions};

/// A running service's parts, for tests and benchmarks that embed it.
pub struct Assembled {
    pub state: AppState,
    pub config: Config,
    /// The target service drivers were granted, if any.
    pub targets: Option<Arc<dyn TargetService>>,
}

/// Builds everything `serve` needs, without listening.
pub async fn assemble(config: Config) -> anyhow::Result<Assembled> {
    let config = config.with_defaults();
    let data_dir = config.data_dir();
    std::fs::create_dir_all(&data_dir).with_context(|| format!("cannot create {}", data_dir.display()))?;
    set_private(&data_dir)?;

    let auth = match config.auth.strategy {
        AuthStrategy::Noauth => {
            if !config.listen.ip().is_loopback() {
                bail!(
                    "noauth is allowed only on a loopback listener, not {}; configure [auth] strategy = \"token\"",
                    config.listen
                );
            }
            Auth::NoAuth
        }
        AuthStrategy::Token => {
            let file =
                config.auth.tokens_file.as_ref().context("[auth] strategy = \"token\" needs tokens_file")?;
            Auth::from_tokens_file(file).map_err(anyhow::Error::msg)?
        }
    };

    let store = Store::open(
        &config.database_url(),
        &StoreOptions { synchronous: config.sqlite_synchronous, max_connections: config.max_connections },
    )
    .await
    .with_context(|| {
        format!("cannot open the database {}", crate::store::redact_url(&config.database_url()))
    })?;

    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(config.runtime.cache_dir.clone().unwrap_or_else(|| data_dir.join("cache"))),
        tick: Duration::from_millis(config.runtime.tick_ms.max(1)),
        fuel: false,
        max_concurrent_calls: config.runtime.max_concurrent_calls,
    })?;

    let stores = Arc::new(BackingStores::new(data_dir.join("volumes"), Duration::from_secs(60))?);
    let wants_iscsi = config.backends.iter().any(|b| b.grants.contains(&Grant::IscsiTarget));
    let iscsi = if wants_iscsi { Some(iscsi_capability(&config, stores.clone()).await?) } else { None };

    let mut backends = Vec::new();
    for b in &config.backends {
        let wasm = match (&b.driver, &b.wasm) {
            (Some(name), None) => crate::shipped::driver(name).with_context(|| {
                format!(
                    "backend {}: no shipped driver named {name} (shipped: {})",
                    b.name,
                    crate::shipped::names().collect::<Vec<_>>().join(", ")
                )
            })?,
            (None, Some(path)) => WasmSource::File(path.clone()),
            _ => bail!("backend {}: set exactly one of driver or wasm", b.name),
        };
        let capabilities = DriverCapabilities {
            settings: Arc::new(b.settings.clone()),
            iscsi: iscsi.clone().filter(|_| b.grants.contains(&Grant::IscsiTarget)),
            backing: Some(stores.clone()).filter(|_| b.grants.contains(&Grant::BackingStore)),
        };
        let spec = DriverSpec {
            backend: b.name.clone(),
            wasm,
            grants: b.grants.clone(),
            limits: b.limits,
            capabilities,
        };
        let driver = runtime.load(spec).await?;
        backends.push(Backend::new(&b.name, driver));
    }
    let types: Vec<VolumeType> = config
        .volume_types
        .iter()
        .map(|t| VolumeType::new(&t.name, &t.backend, t.description.clone(), t.extra_specs.clone()))
        .collect();
    let default_type = config.default_volume_type.clone().unwrap_or_else(|| types[0].name.clone());
    let catalog = Catalog::new(types, default_type, backends).map_err(anyhow::Error::msg)?;
    let service = Arc::new(Service::new(store, catalog));
    let state = AppState { service, auth: Arc::new(auth), public_endpoint: config.public_endpoint.clone() };
    Ok(Assembled { state, targets: iscsi.map(|i| i.service), config })
}

async fn iscsi_capability(config: &Config, stores: Arc<BackingStores>) -> anyhow::Result<IscsiCapability> {
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
        tgtadm: config.tgt.tgtadm.clone(),
        tgtd: config.tgt.tgtd.clone(),
        control_port: config.tgt.control_port,
        socket_dir: PathBuf::from("/var/run/tgtd"),
        backing_dir: stores.dir().to_path_buf(),
        timeout: Duration::from_millis(config.tgt.command_timeout_ms),
    });
    if config.tgt.start {
        if tgtd.ensure_running(&portals[0]).await.map_err(|e| anyhow::anyhow!("tgtd: {e}"))? {
            tracing::info!(portal = %config.tgt.portal, control_port = config.tgt.control_port, "started tgtd");
        }
    } else if !tgtd.is_running().await {
        tracing::warn!(
            control_port = config.tgt.control_port,
            "tgtd does not answer; attaches will fail until it does"
        );
    }
    Ok(IscsiCapability { service: Arc::new(tgtd), portals, chap, stores })
}

fn set_private(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot restrict {}", dir.display()))
}

/// Re-creates the exports of live attachments (see `attach/reconcile.rs`) and reports targets
/// that belong to none of them. Returns the targets of live attachments.
pub async fn reconcile(assembled: &Assembled) -> anyhow::Result<BTreeSet<String>> {
    let report = assembled.state.service.reconcile().await?;
    tracing::info!(
        volumes = report.volumes,
        attachments = report.attachments,
        failed = report.failed.len(),
        "re-created the exports of live attachments"
    );
    if let Some(targets) = &assembled.targets {
        match targets.list().await {
            Ok(present) => {
                for t in present.iter().filter(|t| !report.targets.contains(&t.iqn)) {
                    tracing::warn!(
                        target_iqn = %t.iqn, tid = t.tid, sessions = t.sessions,
                        "drift: this target exists in tgtd but belongs to no live attachment"
                    );
                }
            }
            Err(e) => tracing::warn!("cannot list tgtd's targets to check for drift: {e}"),
        }
    }
    Ok(report.targets)
}

/// Watches tgtd: when it has lost targets of live attachments (it was restarted), reconciles.
async fn watch_targets(assembled: Arc<Assembled>, mut expected: BTreeSet<String>, every: Duration) {
    let Some(targets) = assembled.targets.clone() else { return };
    loop {
        tokio::time::sleep(every).await;
        let Ok(present) = targets.list().await else { continue };
        let present: BTreeSet<String> = present.into_iter().map(|t| t.iqn).collect();
        let lost = expected.iter().any(|iqn| !present.contains(iqn));
        let empty_but_live = present.is_empty() && has_connected_attachments(&assembled).await;
        if lost || empty_but_live {
            tracing::warn!("tgtd lost targets of live attachments (was it restarted?); re-creating them");
            match reconcile(&assembled).await {
                Ok(now) => expected = now,
                Err(e) => tracing::error!("reconciliation failed: {e:#}"),
            }
        }
    }
}

async fn has_connected_attachments(assembled: &Assembled) -> bool {
    assembled
        .state
        .service
        .store()
        .read(async |tx| {
            let rows = tx.query("SELECT 1 FROM attachment_specs LIMIT 1", &[]).await?;
            Ok::<_, crate::store::StoreError>(!rows.is_empty())
        })
        .await
        .unwrap_or(false)
}

/// Serves until SIGINT or SIGTERM.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let assembled = Arc::new(assemble(config).await?);
    let expected = reconcile(&assembled).await?;
    let every = Duration::from_secs(assembled.config.tgt.watch_seconds.max(1));
    tokio::spawn(watch_targets(assembled.clone(), expected, every));
    let listen = assembled.config.listen;
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    let types: BTreeMap<&str, &str> =
        assembled.config.volume_types.iter().map(|t| (t.name.as_str(), t.backend.as_str())).collect();
    tracing::info!(
        listen = %listener.local_addr()?, data_dir = %assembled.config.data_dir().display(),
        database = %crate::store::redact_url(&assembled.config.database_url()), ?types, "berth is serving"
    );
    let store = assembled.state.service.store().clone();
    let app = app(assembled.state.clone());
    axum::serve(listener, axum::ServiceExt::<axum::extract::Request>::into_make_service(app))
        .with_graceful_shutdown(shutdown())
        .await?;
    store.close().await;
    tracing::info!("berth stopped");
    Ok(())
}

async fn shutdown() {
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

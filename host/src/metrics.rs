//! Prometheus metrics (the `prometheus-client` crate, OpenMetrics text), served by `berth serve`
//! on `[metrics] listen` when it is set. One process-wide set: every room records into it where
//! the thing happens (HTTP in `api/`, driver calls in `runtime/`, capability calls in
//! each capability's glue (`runtime/glue/`), transactions in `store/`, operations and reconcile passes in `attach/`,
//! token validations in `api/auth/`).
//! Labels are bounded: routes are templates (`/volumes/{id}`), never raw paths.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriverCallLabels {
    pub backend: String,
    pub call: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub backend: String,
    pub call: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapabilityLabels {
    pub interface: String,
    pub operation: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapabilityOpLabels {
    pub interface: String,
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TxLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub backend: String,
}

/// Reads a backend's LUNs held and its ceiling, when the metrics are rendered.
type LunSource = Arc<dyn Fn() -> Option<(u64, u64)> + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FilesystemLabels {
    pub backend: String,
    /// `size` or `free`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChangeLabels {
    pub change: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutboundLabels {
    pub backend: String,
    pub host: String,
    pub method: String,
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SwitchLabels {
    pub backend: String,
    /// `upgraded`, `rolled back` or `refused`.
    pub how: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardLabels {
    pub node: String,
    pub outcome: String,
}

fn seconds() -> Histogram {
    // 100 µs to about 6.5 s.
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

fn fuel() -> Histogram {
    Histogram::new(exponential_buckets(1000.0, 4.0, 14))
}

/// Every metric Berth keeps.
pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
    pub driver_calls: Family<DriverCallLabels, Counter>,
    pub driver_seconds: Family<CallLabels, Histogram, fn() -> Histogram>,
    pub driver_fuel: Family<CallLabels, Histogram, fn() -> Histogram>,
    pub driver_instances: Family<BackendLabels, Counter>,
    pub capability_calls: Family<CapabilityLabels, Counter>,
    pub capability_seconds: Family<CapabilityOpLabels, Histogram, fn() -> Histogram>,
    pub tx_seconds: Family<TxLabels, Histogram, fn() -> Histogram>,
    pub operations_in_flight: Gauge,
    pub operations_past_lease: Gauge,
    pub reconcile_passes: Counter,
    pub reconcile_changes: Family<ChangeLabels, Counter>,
    pub keystone_validations: Family<OutcomeLabels, Counter>,
    pub compute_events: Family<OutcomeLabels, Counter>,
    pub compute_events_owed: Gauge,
    pub forwarded: Family<ForwardLabels, Counter>,
    pub driver_switches: Family<SwitchLabels, Counter>,
    pub outbound_requests: Family<OutboundLabels, Counter>,
    pub outbound_seconds: Family<CallLabels, Histogram, fn() -> Histogram>,
    pub tgt_luns: Family<BackendLabels, Gauge>,
    pub tgt_lun_ceiling: Family<BackendLabels, Gauge>,
    pub kept_resident_bytes: Gauge,
    pub filesystem_bytes: Family<FilesystemLabels, Gauge>,
    lun_sources: Mutex<Vec<(String, LunSource)>>,
    filesystem_sources: Mutex<Vec<(String, LunSource)>>,
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("berth");
        let m = Metrics {
            http_requests: Family::default(),
            http_seconds: Family::new_with_constructor(seconds),
            driver_calls: Family::default(),
            driver_seconds: Family::new_with_constructor(seconds),
            driver_fuel: Family::new_with_constructor(fuel),
            driver_instances: Family::default(),
            capability_calls: Family::default(),
            capability_seconds: Family::new_with_constructor(seconds),
            tx_seconds: Family::new_with_constructor(seconds),
            operations_in_flight: Gauge::default(),
            operations_past_lease: Gauge::default(),
            reconcile_passes: Counter::default(),
            reconcile_changes: Family::default(),
            keystone_validations: Family::default(),
            compute_events: Family::default(),
            compute_events_owed: Gauge::default(),
            forwarded: Family::default(),
            driver_switches: Family::default(),
            outbound_requests: Family::default(),
            outbound_seconds: Family::new_with_constructor(seconds),
            tgt_luns: Family::default(),
            tgt_lun_ceiling: Family::default(),
            kept_resident_bytes: Gauge::default(),
            lun_sources: Mutex::default(),
            filesystem_bytes: Family::default(),
            filesystem_sources: Mutex::default(),
            registry: Registry::default(),
        };
        registry.register(
            "http_requests",
            "API requests by route, method and status",
            m.http_requests.clone(),
        );
        registry.register("http_request_seconds", "API request latency", m.http_seconds.clone());
        registry.register(
            "driver_calls",
            "Driver calls by backend, call and outcome",
            m.driver_calls.clone(),
        );
        registry.register("driver_call_seconds", "Driver call latency (wall time)", m.driver_seconds.clone());
        registry.register("driver_call_fuel", "Fuel a metered driver call used", m.driver_fuel.clone());
        registry.register(
            "driver_instances",
            "Driver instances made (one per operation: its calls share it)",
            m.driver_instances.clone(),
        );
        registry.register(
            "capability_calls",
            "Capability calls (iscsi-target, backing-store) by operation and outcome",
            m.capability_calls.clone(),
        );
        registry.register("capability_call_seconds", "Capability call latency", m.capability_seconds.clone());
        registry.register("db_transaction_seconds", "Database transaction latency", m.tx_seconds.clone());
        registry.register(
            "operations_in_flight",
            "Operations this process is running",
            m.operations_in_flight.clone(),
        );
        registry.register(
            "operations_past_lease",
            "Unfinished operations whose lease has expired, at the last reconcile pass",
            m.operations_past_lease.clone(),
        );
        registry.register("reconcile_passes", "Reconcile passes run", m.reconcile_passes.clone());
        registry.register(
            "reconcile_changes",
            "Changes reconcile passes made, by kind",
            m.reconcile_changes.clone(),
        );
        registry.register(
            "keystone_validations",
            "Token validations ([auth] strategy = \"keystone\") by outcome: valid, invalid, cached, unavailable",
            m.keystone_validations.clone(),
        );
        registry.register(
            "compute_events",
            "Events sent to Nova ([nova]) by outcome: sent, retried (Nova unreachable: sent again later), failed (given up, with a user message)",
            m.compute_events.clone(),
        );
        registry.register(
            "compute_events_owed",
            "Events owed to Nova and not yet taken (every node's: they share the table), at the sender's last look (every 5 s)",
            m.compute_events_owed.clone(),
        );
        registry.register(
            "driver_switches",
            "Driver upgrades while serving, by backend and outcome: upgraded, rolled back (by hand, by the \
             watch, or following another node), refused",
            m.driver_switches.clone(),
        );
        registry.register(
            "forwarded_requests",
            "Requests forwarded to the node that serves their volume, by node and outcome: answered, unanswered",
            m.forwarded.clone(),
        );
        registry.register(
            "outbound_requests",
            "Drivers' requests to their storage, by backend, allowed host, method and status class (2xx.., refused, error)",
            m.outbound_requests.clone(),
        );
        registry.register(
            "outbound_request_seconds",
            "Drivers' requests to their storage: latency, by backend and allowed host (label `call`)",
            m.outbound_seconds.clone(),
        );
        registry.register(
            "tgt_luns",
            "LUNs the backend's tgtd holds (every backend of a node shares one tgtd)",
            m.tgt_luns.clone(),
        );
        registry.register(
            "tgt_lun_ceiling",
            "LUNs the backend's tgtd may hold on this machine: a new export beyond is refused (413)",
            m.tgt_lun_ceiling.clone(),
        );
        registry.register(
            "backend_filesystem_bytes",
            "The filesystem a backend's volumes are sparse files on: its size and what is free (label `kind`); \
             creates and extends past its max_over_subscription_ratio are refused (413)",
            m.filesystem_bytes.clone(),
        );
        registry.register(
            "runtime_kept_resident_bytes",
            "Memory of an instance slot kept resident between driver instances ([runtime] \
             keep_resident_mib); 0: every page goes back to the kernel (the setting 0, no PAGEMAP_SCAN, \
             or swap that may take berth's pages)",
            m.kept_resident_bytes.clone(),
        );
        Metrics { registry, ..m }
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let sources = self.lun_sources.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (backend, read) in sources {
            if let Some((held, ceiling)) = read() {
                let labels = BackendLabels { backend };
                self.tgt_luns.get_or_create(&labels).set(held as i64);
                self.tgt_lun_ceiling.get_or_create(&labels).set(ceiling as i64);
            }
        }
        let sources = self.filesystem_sources.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (backend, read) in sources {
            if let Some((size, free)) = read() {
                for (kind, bytes) in [("size", size), ("free", free)] {
                    let labels = FilesystemLabels { backend: backend.clone(), kind };
                    self.filesystem_bytes
                        .get_or_create(&labels)
                        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
                }
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

/// Shows a backend's LUNs and their ceiling (read at each rendering).
pub fn watch_luns(backend: &str, read: impl Fn() -> Option<(u64, u64)> + Send + Sync + 'static) {
    let mut sources = METRICS.lun_sources.lock().unwrap_or_else(|p| p.into_inner());
    sources.retain(|(b, _)| b != backend);
    sources.push((backend.to_string(), Arc::new(read)));
}

/// Shows the size and free space of the filesystem a backend's volumes are files on (read at
/// each rendering).
pub fn watch_filesystem(backend: &str, read: impl Fn() -> Option<(u64, u64)> + Send + Sync + 'static) {
    let mut sources = METRICS.filesystem_sources.lock().unwrap_or_else(|p| p.into_inner());
    sources.retain(|(b, _)| b != backend);
    sources.push((backend.to_string(), Arc::new(read)));
}

/// Records an HTTP request.
pub fn http(method: &str, path: &str, status: u16, took: Duration) {
    let route = route(path);
    let method = http_method(method);
    METRICS
        .http_requests
        .get_or_create(&HttpLabels { method: method.into(), route: route.clone(), status })
        .inc();
    METRICS
        .http_seconds
        .get_or_create(&RouteLabels { method: method.into(), route })
        .observe(took.as_secs_f64());
}

/// An HTTP method as a label: the methods the API knows, and `other` for anything a client made
/// up (each new value would be a series kept for ever).
pub fn http_method(method: &str) -> &'static str {
    const KNOWN: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
    KNOWN.iter().find(|m| **m == method).copied().unwrap_or("other")
}

/// Records a driver's outbound request: by backend, allowed host (the allow-list's entry, or
/// `unlisted`: a bounded set), method and status class (`2xx`.., `refused`, `error`).
pub fn outbound(backend: &str, host: &str, method: &str, class: &str, took: Duration) {
    let method = http_method(method);
    METRICS
        .outbound_requests
        .get_or_create(&OutboundLabels {
            backend: backend.into(),
            host: host.into(),
            method: method.into(),
            class: class.into(),
        })
        .inc();
    METRICS
        .outbound_seconds
        .get_or_create(&CallLabels { backend: backend.into(), call: host.into() })
        .observe(took.as_secs_f64());
}

/// Records a driver upgrade's outcome on a backend (`upgrade/`).
pub fn driver_switch(backend: &str, how: &str) {
    METRICS.driver_switches.get_or_create(&SwitchLabels { backend: backend.into(), how: how.into() }).inc();
}

/// Records a request forwarded to another node.
pub fn forwarded(node: &str, outcome: &str) {
    METRICS.forwarded.get_or_create(&ForwardLabels { node: node.into(), outcome: outcome.into() }).inc();
}

/// Records a driver call.
pub fn driver_call(backend: &str, call: &str, outcome: &str, took: Duration, fuel: Option<u64>) {
    let labels = CallLabels { backend: backend.into(), call: call.into() };
    METRICS
        .driver_calls
        .get_or_create(&DriverCallLabels {
            backend: backend.into(),
            call: call.into(),
            outcome: outcome.into(),
        })
        .inc();
    METRICS.driver_seconds.get_or_create(&labels).observe(took.as_secs_f64());
    if let Some(fuel) = fuel {
        METRICS.driver_fuel.get_or_create(&labels).observe(fuel as f64);
    }
}

/// Records a fresh instance of a backend's driver.
pub fn driver_instance(backend: &str) {
    METRICS.driver_instances.get_or_create(&BackendLabels { backend: backend.into() }).inc();
}

/// Records a capability call.
pub fn capability(interface: &str, operation: &str, ok: bool, took: Duration) {
    let outcome = if ok { "ok" } else { "error" };
    METRICS
        .capability_calls
        .get_or_create(&CapabilityLabels {
            interface: interface.into(),
            operation: operation.into(),
            outcome: outcome.into(),
        })
        .inc();
    METRICS
        .capability_seconds
        .get_or_create(&CapabilityOpLabels { interface: interface.into(), operation: operation.into() })
        .observe(took.as_secs_f64());
}

/// Records a database transaction.
pub fn transaction(kind: &'static str, took: Duration) {
    METRICS.tx_seconds.get_or_create(&TxLabels { kind: kind.into() }).observe(took.as_secs_f64());
}

/// A request path as its route template: ids become `{id}`, metadata keys `{key}`; an unknown
/// shape is `other`, so that clients cannot make labels without bound.
pub fn route(path: &str) -> String {
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let mut out = Vec::with_capacity(segments.len());
    for (i, s) in segments.iter().enumerate() {
        let templated = if uuid::Uuid::parse_str(s).is_ok() {
            "{id}"
        } else if i > 0 && segments[i - 1] == "metadata" {
            "{key}"
        } else if i > 0 && segments[i - 1] == "types" {
            "{id}"
        } else {
            s
        };
        out.push(templated);
    }
    let route = out.join("/");
    const KNOWN: &[&str] = &[
        "",
        "/healthcheck",
        "/openapi.json",
        "/v3",
        "/v3/volumes",
        "/v3/volumes/detail",
        "/v3/volumes/{id}",
        "/v3/volumes/{id}/action",
        "/v3/volumes/{id}/metadata",
        "/v3/volumes/{id}/metadata/{key}",
        "/v3/attachments",
        "/v3/attachments/detail",
        "/v3/attachments/{id}",
        "/v3/attachments/{id}/action",
        "/v3/types",
        "/v3/types/{id}",
        "/v3/os-services",
    ];
    if KNOWN.contains(&route.as_str()) {
        if route.is_empty() { "/".into() } else { route }
    } else {
        "other".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_templates_with_a_bounded_set_of_values() {
        assert_eq!(route("/v3/volumes/0b8e1c2a-8d3f-4a8e-9a55-3f0d2c3b1a00"), "/v3/volumes/{id}");
        assert_eq!(
            route("/v3/volumes/0b8e1c2a-8d3f-4a8e-9a55-3f0d2c3b1a00/metadata/color"),
            "/v3/volumes/{id}/metadata/{key}"
        );
        assert_eq!(route("/v3/attachments/detail"), "/v3/attachments/detail");
        assert_eq!(route("/"), "/");
        assert_eq!(route("/v3/whatever/you/like"), "other");
    }

    #[test]
    fn a_made_up_method_is_counted_as_other() {
        http("FROBNICATE", "/v3/volumes", 405, Duration::from_millis(1));
        let text = METRICS.render();
        assert!(!text.contains("FROBNICATE"), "{text}");
        assert!(text.contains("method=\"other\",route=\"/v3/volumes\",status=\"405\""), "{text}");
        assert_eq!(http_method("DELETE"), "DELETE");
    }

    #[test]
    fn the_text_is_openmetrics() {
        http("GET", "/v3/volumes", 200, Duration::from_millis(3));
        let text = METRICS.render();
        assert!(
            text.contains("berth_http_requests_total{method=\"GET\",route=\"/v3/volumes\",status=\"200\"}"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}

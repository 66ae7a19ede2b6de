//! `berth bench attach`: the attach cycle against any Cinder-compatible endpoint, Berth or
//! Cinder, so that both are measured with the same client. Each client works on a volume of its
//! own, in a closed loop, for the given time:
//!
//! - attachments API (3.44): create with a connector, `os-complete`, delete;
//! - `--legacy`: `os-reserve`, `os-initialize_connection`, `os-attach`, `os-begin_detaching`,
//!   `os-terminate_connection`, `os-detach`, as Nova drove Cinder before the attachments API:
//!   `os-detach` names the attachment, found in the volume's `attachments` (Cinder 29 answers a
//!   `null` argument with a 500 and leaves the volume `detaching`).
//!
//! With `--service-token`, the benchmark calls as Nova's compute service does: each attachment
//! names an instance, and the caller's token goes as a service token too, which ending an
//! instance's access needs (OSSA-2023-003). Without it, attachments name a host only.
//!
//! `--fill N` first gives the backend N live attachments (N volumes, each attached and completed
//! with a connector of its own), as many at a time as `--fill-clients`, and reports how long that
//! took. Everything the benchmark made is deleted at the end, unless `--keep`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use reqwest::Method;
use serde_json::{Map, Value as Json, json};

use super::api::Endpoint;
use super::error::ClientError;

/// `berth bench attach`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AttachBench {
    /// Clients running the cycle at once, each on its own volume.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Seconds of measured cycles.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of cycles run first and not measured.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// The legacy six-call flow instead of the attachments API.
    #[arg(long)]
    pub legacy: bool,
    /// Call as Nova's compute service: name an instance in each attachment and send the token as
    /// a service token too (`X-Service-Token`; with noauth, `X-Service-Roles: service`). The user
    /// needs the `service` role.
    #[arg(long)]
    pub service_token: bool,
    /// Live attachments to make first (and keep during the measurement).
    #[arg(long, default_value_t = 0)]
    pub fill: usize,
    /// How many of those to make at a time.
    #[arg(long, default_value_t = 8)]
    pub fill_clients: usize,
    /// The hosts (initiators) the fill's attachments are spread over, in turn (0: a host of its
    /// own for each attachment).
    #[arg(long, default_value_t = 0)]
    pub fill_hosts: usize,
    /// The volume type of the volumes made (default: the endpoint's default type).
    #[arg(long)]
    pub volume_type: Option<String>,
    /// Leave everything made in place (the fill stays attached).
    #[arg(long)]
    pub keep: bool,
    /// Print the results as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Latency percentiles of one call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub n: usize,
    pub p50: Duration,
    pub p99: Duration,
}

impl Percentiles {
    pub fn of(samples: &mut [Duration]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
        Percentiles { n: samples.len(), p50: at(0.50), p99: at(0.99) }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub endpoint: String,
    pub clients: usize,
    pub legacy: bool,
    /// Live attachments made first, and how long that took.
    pub fill: Option<(usize, Duration)>,
    pub cycles: usize,
    pub elapsed: Duration,
    pub cycle: Percentiles,
    /// Per call, in the order of the cycle.
    pub calls: Vec<(&'static str, Percentiles)>,
    /// Calls that failed, by call.
    pub errors: BTreeMap<&'static str, usize>,
}

impl Report {
    pub fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn text(&self) -> String {
        let flow = if self.legacy { "legacy volume actions" } else { "attachments API" };
        let mut out = format!("berth bench attach: {}, {flow}, {} client(s)\n", self.endpoint, self.clients);
        if let Some((n, took)) = self.fill {
            out += &format!(
                "fill: {n} live attachments in {:.1} s ({:.1} per s)\n",
                took.as_secs_f64(),
                n as f64 / took.as_secs_f64().max(1e-9)
            );
        }
        out += &format!(
            "{} cycles in {:.1} s: {:.1} cycles/s; cycle p50 {} p99 {}\n",
            self.cycles,
            self.elapsed.as_secs_f64(),
            self.rate(),
            human(self.cycle.p50),
            human(self.cycle.p99)
        );
        for (call, p) in &self.calls {
            out += &format!("  {call:<24} p50 {:>10} p99 {:>10}\n", human(p.p50), human(p.p99));
        }
        for (call, n) in &self.errors {
            out += &format!("  {call}: {n} failed\n");
        }
        out
    }

    pub fn json(&self) -> Json {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        json!({
            "endpoint": self.endpoint,
            "flow": if self.legacy { "legacy" } else { "attachments" },
            "clients": self.clients,
            "fill": self.fill.map(|(n, d)| json!({"attachments": n, "seconds": d.as_secs_f64()})),
            "cycles": self.cycles,
            "seconds": self.elapsed.as_secs_f64(),
            "cycles_per_second": self.rate(),
            "cycle_ms": {"p50": ms(self.cycle.p50), "p99": ms(self.cycle.p99)},
            "calls_ms": self.calls.iter().map(|(c, p)| (c.to_string(), json!({"p50": ms(p.p50), "p99": ms(p.p99)}))).collect::<Map<_, _>>(),
            "errors": self.errors,
        })
    }
}

/// `1.23 ms`, `456.7 µs`.
pub fn human(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 { format!("{:.2} ms", us / 1000.0) } else { format!("{us:.1} µs") }
}

/// An os-brick-like connector for a client's own initiator.
fn connector(name: &str) -> Json {
    json!({
        "initiator": format!("iqn.2026-11.dev.berth.bench:{name}"), "host": format!("bench-{name}"),
        "ip": "127.0.0.1", "platform": "x86_64", "os_type": "linux", "multipath": false,
        "do_local_attach": false
    })
}

/// The calls of one cycle, with their durations.
type Cycle = Vec<(&'static str, Duration)>;

/// Who a cycle attaches to: a host, or (as Nova's compute service) an instance on it.
#[derive(Debug, Clone)]
struct Consumer {
    /// The initiator's unique part and the host's name.
    name: String,
    instance: Option<String>,
}

/// One attach cycle on `volume` for `who`.
async fn cycle(
    api: &Endpoint,
    volume: &str,
    who: &Consumer,
    legacy: bool,
) -> Result<Cycle, (&'static str, ClientError)> {
    let name = who.name.as_str();
    let mut calls = Vec::with_capacity(6);
    macro_rules! timed {
        ($name:expr, $call:expr) => {{
            let t = Instant::now();
            let r = $call.await.map_err(|e| ($name, e))?;
            calls.push(($name, t.elapsed()));
            r
        }};
    }
    if legacy {
        let c = connector(name);
        let host = format!("bench-{name}");
        timed!("os-reserve", api.volume_action(volume, "os-reserve", Json::Null));
        timed!(
            "os-initialize_connection",
            api.volume_action(volume, "os-initialize_connection", json!({"connector": c}))
        );
        let attach = match &who.instance {
            Some(instance) => json!({"mountpoint": "/dev/vdb", "instance_uuid": instance}),
            None => json!({"mountpoint": "/dev/vdb", "host_name": host}),
        };
        timed!("os-attach", api.volume_action(volume, "os-attach", attach));
        // Nova knows its attachment from the volume's `attachments`, and names it to detach.
        let shown = timed!("show volume", api.volume(volume));
        let attachment = shown["attachments"]
            .as_array()
            .and_then(|list| list.first())
            .and_then(|a| a["attachment_id"].as_str())
            .map(str::to_string)
            .ok_or_else(|| {
                (
                    "show volume",
                    ClientError::Api(format!("volume {volume} lists no attachment after os-attach")),
                )
            })?;
        timed!("os-begin_detaching", api.volume_action(volume, "os-begin_detaching", Json::Null));
        timed!(
            "os-terminate_connection",
            api.volume_action(volume, "os-terminate_connection", json!({"connector": c}))
        );
        timed!("os-detach", api.volume_action(volume, "os-detach", json!({"attachment_id": attachment})));
    } else {
        let c = connector(name);
        let mut attachment = json!({"volume_uuid": volume, "connector": c});
        if let Some(instance) = &who.instance {
            attachment["instance_uuid"] = json!(instance);
        }
        let created = timed!(
            "create (with connector)",
            api.call(Method::POST, "/attachments", "3.44", Some(json!({"attachment": attachment})))
        );
        let id = created["attachment"]["id"].as_str().unwrap_or_default().to_string();
        timed!("complete", api.complete(&id));
        timed!("delete", api.delete_attachment(&id));
    }
    Ok(calls)
}

/// Makes a volume and waits until it is available.
async fn volume(api: &Endpoint, volume_type: Option<&str>) -> Result<String, ClientError> {
    let id = api.create_volume(1, volume_type).await.map_err(|e| e.context("create a volume"))?;
    api.wait_available(&id, Duration::from_secs(300)).await?;
    Ok(id)
}

/// Runs `count` jobs, `width` at a time; the first failure ends the run.
async fn in_parallel<F, Fut, T>(count: usize, width: usize, job: F) -> Result<Vec<T>, ClientError>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    futures_util::stream::iter(0..count).map(job).buffer_unordered(width.max(1)).try_collect().await
}

/// The fill: `n` volumes, each attached and completed for an initiator of its own, or for one
/// of `--fill-hosts` in turn.
async fn fill(api: &Endpoint, args: &AttachBench) -> Result<Vec<(String, String)>, ClientError> {
    in_parallel(args.fill, args.fill_clients, |i| async move {
        let v = volume(api, args.volume_type.as_deref()).await?;
        let host = if args.fill_hosts > 0 { i % args.fill_hosts } else { i };
        let c = connector(&format!("fill-{host}"));
        // A retryable refusal (503: the backend was slow; the reservation was rolled back) is
        // retried, as a real client would, a few times.
        let mut attempt = 0;
        let a = loop {
            attempt += 1;
            match api.create_attachment(&v, c.as_object().expect("an object"), None).await {
                Err(ClientError::Api(m)) if attempt < 5 && m.contains(": 503 ") => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                other => break other?,
            }
        };
        let id = a["id"].as_str().unwrap_or_default().to_string();
        api.complete(&id).await?;
        Ok((v, id))
    })
    .await
}

/// Runs the benchmark.
pub async fn run(api: &Endpoint, args: &AttachBench) -> Result<Report, ClientError> {
    if args.clients == 0 || args.duration <= 0.0 {
        return Err(ClientError::Usage("--clients and --duration must be positive".into()));
    }
    let mut report = Report {
        endpoint: api.base().to_string(),
        clients: args.clients,
        legacy: args.legacy,
        ..Default::default()
    };
    let filled = if args.fill > 0 {
        let t = Instant::now();
        let made = fill(api, args).await?;
        report.fill = Some((made.len(), t.elapsed()));
        made
    } else {
        Vec::new()
    };

    let volumes =
        in_parallel(args.clients, args.clients, |_| volume(api, args.volume_type.as_deref())).await?;
    let start = Instant::now() + Duration::from_secs_f64(args.warmup.max(0.0));
    let end = start + Duration::from_secs_f64(args.duration);
    let api = Arc::new(if args.service_token { api.as_service() } else { api.clone() });
    let mut tasks = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        let (api, v, legacy) = (api.clone(), v.clone(), args.legacy);
        let who = Consumer {
            name: format!("client-{i}"),
            instance: args.service_token.then(|| uuid::Uuid::new_v4().to_string()),
        };
        tasks.push(tokio::spawn(async move {
            let (mut cycles, mut errors): (Vec<(Duration, Cycle)>, BTreeMap<&'static str, usize>) =
                (Vec::new(), BTreeMap::new());
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                match cycle(&api, &v, &who, legacy).await {
                    Ok(calls) if t >= start => cycles.push((t.elapsed(), calls)),
                    Ok(_) => {}
                    Err((call, e)) => {
                        *errors.entry(call).or_default() += 1;
                        if errors.values().sum::<usize>() > 100 {
                            return Err(e.context(&format!("{call} keeps failing")));
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            Ok((cycles, errors))
        }));
    }
    let mut all: Vec<(Duration, Cycle)> = Vec::new();
    for t in tasks {
        let (cycles, errors) = t.await.map_err(|e| ClientError::Api(format!("a client stopped: {e}")))??;
        all.extend(cycles);
        for (call, n) in errors {
            *report.errors.entry(call).or_default() += n;
        }
    }
    report.elapsed = Duration::from_secs_f64(args.duration);
    report.cycles = all.len();
    let mut totals: Vec<Duration> = all.iter().map(|(d, _)| *d).collect();
    report.cycle = Percentiles::of(&mut totals);
    let names: Vec<&'static str> =
        all.first().map(|(_, c)| c.iter().map(|(n, _)| *n).collect()).unwrap_or_default();
    for name in names {
        let mut samples: Vec<Duration> =
            all.iter().flat_map(|(_, c)| c.iter().filter(|(n, _)| *n == name).map(|(_, d)| *d)).collect();
        report.calls.push((name, Percentiles::of(&mut samples)));
    }

    if !args.keep {
        for v in &volumes {
            api.delete_volume(v).await.map_err(|e| e.context("clean up"))?;
        }
        let filled = &filled;
        in_parallel(filled.len(), args.fill_clients, |i| {
            let api = api.clone();
            async move {
                let (v, a) = &filled[i];
                api.delete_attachment(a).await?;
                api.wait_available(v, Duration::from_secs(300)).await?;
                api.delete_volume(v).await
            }
        })
        .await
        .map_err(|e| e.context("clean up the fill"))?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(&mut s);
        assert_eq!((p.n, p.p50, p.p99), (100, Duration::from_millis(50), Duration::from_millis(99)));
        assert_eq!(Percentiles::of(&mut []).n, 0);
    }
}

//! The outcome of a run: one line per check on the console, a summary, and the same as JUnit XML
//! (for CI) and JSON (with fuel, peak memory and capability calls per check, to track
//! regressions).

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value as Json, json};

use super::env::Measure;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed(String),
    Skipped(String),
}

#[derive(Debug, Clone)]
pub struct CheckReport {
    pub name: &'static str,
    pub status: Status,
    pub duration: Duration,
    /// How many times the check ran (`--repeat`).
    pub runs: u32,
    pub measure: Measure,
}

impl CheckReport {
    /// The console line.
    pub fn line(&self) -> String {
        let (tag, detail) = match &self.status {
            Status::Passed => ("PASS", String::new()),
            Status::Failed(why) => ("FAIL", format!("\n      {}", why.replace('\n', "\n      "))),
            Status::Skipped(why) => ("SKIP", format!("  ({why})")),
        };
        let cost = if self.measure.calls > 0 {
            format!(
                "  [{} calls, fuel max {} total {}, peak memory {}, {} capability calls, {}]",
                self.measure.calls,
                count(self.measure.fuel_max),
                count(self.measure.fuel_total),
                bytes(self.measure.peak_memory),
                self.measure.capability_calls,
                time(self.duration)
            )
        } else {
            String::new()
        };
        format!("{tag}  {}{cost}{detail}", self.name)
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Report {
    /// `name version` of the driver, or the file when it did not load.
    pub driver: String,
    /// The contract version the driver was built for, when it loaded.
    pub contract: Option<&'static str>,
    /// What the driver promised (`guarantees()`); each promise has its check.
    pub guarantees: Vec<&'static str>,
    pub wasm: String,
    pub target: &'static str,
    /// The tgtd the suite ran (`--target tgtd`): its control port and portal.
    pub tgtd: Option<(u16, String)>,
    pub checks: Vec<CheckReport>,
    pub duration: Duration,
}

impl Report {
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| matches!(c.status, Status::Failed(_))).count()
    }

    pub fn skipped(&self) -> usize {
        self.checks.iter().filter(|c| matches!(c.status, Status::Skipped(_))).count()
    }

    pub fn passed(&self) -> usize {
        self.checks.iter().filter(|c| c.status == Status::Passed).count()
    }

    pub fn ok(&self) -> bool {
        self.failed() == 0
    }

    /// The names of the failed checks.
    pub fn failures(&self) -> Vec<&'static str> {
        self.checks.iter().filter(|c| matches!(c.status, Status::Failed(_))).map(|c| c.name).collect()
    }

    pub fn summary(&self) -> String {
        let target = match &self.tgtd {
            Some((control, portal)) => {
                format!("{}, its own on control port {control} and portal {portal}", self.target)
            }
            None => self.target.to_string(),
        };
        format!(
            "{}: {} checks, {} passed, {} failed, {} skipped in {} (target: {target})",
            self.driver,
            self.checks.len(),
            self.passed(),
            self.failed(),
            self.skipped(),
            time(self.duration),
        )
    }

    /// JUnit XML, as CI systems read it (one testsuite, one testcase per check).
    pub fn junit(&self) -> String {
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            x,
            "<testsuites name=\"berth-conformance\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{:.3}\">",
            self.checks.len(),
            self.failed(),
            self.skipped(),
            self.duration.as_secs_f64()
        );
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{:.3}\">",
            escape(&format!("berth conformance: {}", self.driver)),
            self.checks.len(),
            self.failed(),
            self.skipped(),
            self.duration.as_secs_f64()
        );
        let _ = writeln!(x, "    <properties>");
        for (k, v) in [("driver", &self.driver), ("wasm", &self.wasm), ("target", &self.target.to_string())] {
            let _ = writeln!(x, "      <property name=\"{k}\" value=\"{}\"/>", escape(v));
        }
        let _ = writeln!(x, "    </properties>");
        for c in &self.checks {
            let _ = write!(
                x,
                "    <testcase classname=\"berth.conformance\" name=\"{}\" time=\"{:.3}\"",
                escape(c.name),
                c.duration.as_secs_f64()
            );
            match &c.status {
                Status::Passed => {
                    let _ = writeln!(x, ">");
                }
                Status::Failed(why) => {
                    let first = why.lines().next().unwrap_or_default();
                    let _ = writeln!(
                        x,
                        ">\n      <failure message=\"{}\">{}</failure>",
                        escape(first),
                        escape(why)
                    );
                }
                Status::Skipped(why) => {
                    let _ = writeln!(x, ">\n      <skipped message=\"{}\"/>", escape(why));
                }
            }
            let m = &c.measure;
            let _ = writeln!(
                x,
                "      <system-out>calls={} fuel_max={} fuel_total={} peak_memory_bytes={} capability_calls={}</system-out>",
                m.calls, m.fuel_max, m.fuel_total, m.peak_memory, m.capability_calls
            );
            let _ = writeln!(x, "    </testcase>");
        }
        x.push_str("  </testsuite>\n</testsuites>\n");
        x
    }

    pub fn json(&self) -> Json {
        json!({
            "driver": self.driver,
            "contract": self.contract,
            "guarantees": self.guarantees,
            "wasm": self.wasm,
            "target": self.target,
            "duration_seconds": self.duration.as_secs_f64(),
            "passed": self.passed(),
            "failed": self.failed(),
            "skipped": self.skipped(),
            "checks": self.checks.iter().map(|c| {
                let (status, reason) = match &c.status {
                    Status::Passed => ("passed", None),
                    Status::Failed(r) => ("failed", Some(r.clone())),
                    Status::Skipped(r) => ("skipped", Some(r.clone())),
                };
                json!({
                    "name": c.name,
                    "status": status,
                    "reason": reason,
                    "runs": c.runs,
                    "duration_seconds": c.duration.as_secs_f64(),
                    "calls": c.measure.calls,
                    "fuel_max": c.measure.fuel_max,
                    "fuel_total": c.measure.fuel_total,
                    "peak_memory_bytes": c.measure.peak_memory,
                    "capability_calls": c.measure.capability_calls,
                })
            }).collect::<Vec<_>>(),
        })
    }
}

/// XML text and attribute escaping; characters XML 1.0 cannot carry at all become U+FFFD.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(ch),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.2}G", n as f64 / 1e9),
    }
}

fn bytes(n: usize) -> String {
    if n >= 1 << 20 { format!("{:.1} MiB", n as f64 / (1 << 20) as f64) } else { format!("{} KiB", n >> 10) }
}

fn time(d: Duration) -> String {
    if d.as_millis() >= 1000 {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escaping_keeps_the_document_well_formed() {
        assert_eq!(escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(escape("nul\0esc\u{1b}"), "nul\u{FFFD}esc\u{FFFD}");
    }
}

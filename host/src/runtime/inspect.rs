//! `berth driver inspect`: what a `.wasm` is before anyone runs it. The contract it targets, its
//! exports, its imports and the grant each needs (or why it is refused), its size, digest and
//! footprint in the instance pool, and whether the compiled cache holds it. Read from the bytes
//! (no compilation), so it answers at once even for an 18 MB component.

use std::path::Path;

use serde_json::{Value as Json, json};
use wasmtime::wasmparser::{Parser, Payload};

use super::Footprint;
use super::cache::digest;
use super::loader::{ImportVerdict, judge_import};
use super::version::{CONTRACT, CONTRACTS, ContractVersion};

/// Why bytes that did not parse are not a component, in one line. A file that is not WebAssembly at
/// all is said to be so by its first bytes (wasmparser's own message lists the expected and the
/// actual bytes over a dozen lines).
pub(crate) fn malformed(error: impl std::fmt::Display, wasm: &[u8]) -> String {
    const MAGIC: &[u8] = b"\0asm";
    if wasm.is_empty() {
        return "not a WebAssembly component: the file is empty".into();
    }
    if !wasm.starts_with(MAGIC) {
        let start = wasm.get(..MAGIC.len()).unwrap_or(wasm);
        return format!(
            "not a WebAssembly component: the file begins with {:?}, not with WebAssembly's magic \"\\0asm\"",
            String::from_utf8_lossy(start)
        );
    }
    let error = error.to_string();
    format!("not a valid WebAssembly component: {}", error.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// One import and what the host makes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub name: String,
    /// `allowed`, `needs grant <name>` or `refused: <reason>`.
    pub verdict: String,
}

/// What a component is.
#[derive(Debug, Clone)]
pub struct Inspection {
    pub size: usize,
    pub sha256: String,
    /// The driver contract its export targets (`berth:driver@0.1.0`), if any.
    pub contract: Option<String>,
    /// Whether this host implements that contract.
    pub supported: bool,
    pub exports: Vec<String>,
    pub imports: Vec<Import>,
    pub footprint: Footprint,
    /// Whether a compiled artifact for this component is in the given cache directory.
    pub cached: Option<bool>,
    /// Where the network grant lets it send requests, from a configuration (`--config`).
    pub allowed_hosts: Option<Vec<String>>,
}

impl Inspection {
    /// Inspects a component's bytes.
    pub fn of(wasm: &[u8]) -> Result<Inspection, String> {
        let (mut imports, mut exports) = (Vec::new(), Vec::new());
        let mut depth = 0usize;
        for payload in Parser::new(0).parse_all(wasm) {
            match payload.map_err(|e| malformed(e, wasm))? {
                Payload::Version { encoding: wasmtime::wasmparser::Encoding::Module, .. } if depth == 0 => {
                    return Err("a core WebAssembly module, not a component: build for wasm32-wasip2 \
                                (or run `wasm-tools component new`)"
                        .into());
                }
                Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
                Payload::End(_) => depth = depth.saturating_sub(1),
                Payload::ComponentImportSection(s) if depth == 0 => {
                    for import in s {
                        let name = import.map_err(|e| e.to_string())?.name.name.to_string();
                        let verdict = match judge_import(&name) {
                            ImportVerdict::Allowed => "allowed".to_string(),
                            ImportVerdict::NeedsGrant(g) => format!("needs grant {}", g.name()),
                            ImportVerdict::Forbidden(reason) => format!("refused: {reason}"),
                        };
                        imports.push(Import { name, verdict });
                    }
                }
                Payload::ComponentExportSection(s) if depth == 0 => {
                    for export in s {
                        exports.push(export.map_err(|e| e.to_string())?.name.name.to_string());
                    }
                }
                _ => {}
            }
        }
        let contract = exports
            .iter()
            .find_map(|e| e.strip_prefix("berth:driver/driver@"))
            .map(|version| format!("berth:driver@{version}"));
        Ok(Inspection {
            size: wasm.len(),
            sha256: digest(wasm),
            supported: contract.as_deref().is_some_and(|c| CONTRACTS.iter().any(|v| v.name() == c)),
            contract,
            exports,
            imports,
            footprint: Footprint::of(wasm)?,
            cached: None,
            allowed_hosts: None,
        })
    }

    /// Whether `cache_dir` holds a compiled artifact of this component (any engine version).
    pub fn look_in_cache(&mut self, cache_dir: &Path) {
        let prefix = &self.sha256[..32];
        let found = std::fs::read_dir(cache_dir).is_ok_and(|entries| {
            entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with(prefix))
        });
        self.cached = Some(found);
    }

    /// The grants the component needs (each once), with what each gives.
    pub fn grants(&self) -> Vec<&'static crate::capabilities::CapabilitySpec> {
        let mut out: Vec<&'static crate::capabilities::CapabilitySpec> = Vec::new();
        for i in &self.imports {
            let interface = i.name.split_once('@').map_or(i.name.as_str(), |(n, _)| n);
            if let Some(grant) = crate::capabilities::Grant::admitting(interface)
                && !out.iter().any(|c| c.grant == grant)
            {
                out.push(grant.spec());
            }
        }
        out
    }

    pub fn json(&self) -> Json {
        json!({
            "grants": self.grants().iter().map(|g| json!({"grant": g.name, "gives": g.what})).collect::<Vec<_>>(),
            "allowed_hosts": self.allowed_hosts,
            "size_bytes": self.size,
            "sha256": self.sha256,
            "contract": self.contract,
            "supported": self.supported,
            "exports": self.exports,
            "imports": self.imports.iter().map(|i| json!({"name": i.name, "verdict": i.verdict})).collect::<Vec<_>>(),
            "core_instances": self.footprint.core_instances,
            "memories": self.footprint.memories,
            "tables": self.footprint.tables,
            "cached": self.cached,
        })
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let contract = match (&self.contract, self.supported) {
            (Some(c), true) if c == CONTRACT => format!("{c} (supported, the latest)"),
            (Some(c), true) => format!("{c} (supported through its adapter; the latest is {CONTRACT})"),
            (Some(c), false) => format!("{c} (this host implements {})", ContractVersion::supported()),
            (None, _) => "none: it does not export berth:driver/driver".into(),
        };
        out.push_str(&format!("contract:  {contract}\n"));
        out.push_str(&format!("size:      {} bytes\nsha256:    {}\n", self.size, self.sha256));
        out.push_str(&format!("footprint: {}\n", self.footprint));
        if let Some(cached) = self.cached {
            out.push_str(&format!("cached:    {}\n", if cached { "yes" } else { "no" }));
        }
        out.push_str("exports:\n");
        for e in &self.exports {
            out.push_str(&format!("  {e}\n"));
        }
        out.push_str("imports:\n");
        for i in &self.imports {
            out.push_str(&format!("  {:<44} {}\n", i.name, i.verdict));
        }
        let grants = self.grants();
        if !grants.is_empty() {
            out.push_str("grants it needs:\n");
            for g in grants {
                out.push_str(&format!("  {:<14} {}\n", g.name, g.what));
            }
        }
        if grants_network(&self.imports) {
            match &self.allowed_hosts {
                Some(hosts) if !hosts.is_empty() => {
                    out.push_str("allowed hosts (from --config):\n");
                    for h in hosts {
                        out.push_str(&format!("  {h}\n"));
                    }
                }
                _ => out.push_str(
                    "allowed hosts: none given (--config with a [network] table names them; without, every request is refused)\n",
                ),
            }
        }
        out
    }
}

fn grants_network(imports: &[Import]) -> bool {
    imports.iter().any(|i| i.name.starts_with("wasi:http/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shipped_driver_is_described() {
        let wasm = std::fs::read(concat!(env!("BERTH_DRIVER_DIR"), "/tgt-iscsi.wasm")).unwrap();
        let i = Inspection::of(&wasm).unwrap();
        assert_eq!(i.contract.as_deref(), Some(CONTRACT));
        assert!(i.supported);
        assert!(i.exports.iter().any(|e| e == "berth:driver/driver@0.3.0"), "{:?}", i.exports);
        assert!(i.text().contains("(supported, the latest)"), "{}", i.text());
        let grant = i.imports.iter().find(|x| x.name.starts_with("berth:driver/iscsi-target@")).unwrap();
        assert_eq!(grant.verdict, "needs grant iscsi-target");
        assert!(i.imports.iter().any(|x| x.verdict == "allowed"));
        assert!(i.footprint.core_instances >= 1);
    }

    #[test]
    fn a_driver_that_reaches_for_the_filesystem_is_flagged() {
        let wasm = std::fs::read(concat!(env!("BERTH_DRIVER_DIR"), "/sneaky.wasm")).unwrap();
        let i = Inspection::of(&wasm).unwrap();
        assert!(
            i.imports
                .iter()
                .any(|x| x.name.starts_with("wasi:filesystem/") && x.verdict == "needs grant inert-wasi"),
            "{:?}",
            i.imports
        );
        assert!(Inspection::of(b"\0asm\x01\0\0\0").unwrap_err().contains("not a component"));
    }

    #[test]
    fn a_file_that_is_not_webassembly_is_said_to_be_so_in_one_line() {
        let e = Inspection::of(b"junk\n").unwrap_err();
        assert_eq!(
            e,
            "not a WebAssembly component: the file begins with \"junk\", not with WebAssembly's magic \"\\0asm\""
        );
        let e = Inspection::of(b"\0asm\x0d\0\x01\0\x07").unwrap_err();
        assert!(e.starts_with("not a valid WebAssembly component: ") && !e.contains('\n'), "{e}");
        assert_eq!(Footprint::of(b"").unwrap_err(), "not a WebAssembly component: the file is empty");
    }
}

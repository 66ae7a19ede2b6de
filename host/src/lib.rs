//! Berth: a WebAssembly-pluggable storage driver host with a Cinder-compatible attachment API.
//!
//! Rooms: `api` (HTTP), `attach` (state machine and orchestration), `store` (SQL), `runtime`
//! (wasmtime), `capabilities` (what drivers may do to the outside world), `client` (`berth` as an
//! attach client), `keystone` (Identity v3, for the API and the client), `compute` (events to
//! Nova), `failpoint` (crash
//! points for tests, compiled in only for them).

pub mod api;
pub mod attach;
pub mod capabilities;
pub mod client;
pub mod compute;
pub mod config;
pub mod conformance;
pub mod domain;
pub mod failpoint;
pub mod keystone;
pub mod logging;
pub mod metrics;
pub mod runtime;
pub mod serve;
pub mod shipped;
pub mod store;
pub mod tls;
pub mod upgrade;

/// The rooms' floors, lowest first: a room may import only rooms on floors below its own, so no
/// import runs back up and no two rooms import each other (README, "Layout"). The domain stands
/// on the runtime only for the contract's types, which the runtime generates from the WIT.
/// Inside a room the same holds without a list: no modules of one folder import each other in a
/// circle, at any depth.
#[cfg(test)]
mod floors {
    use std::collections::BTreeSet;
    use std::path::Path;

    const FLOORS: &[&str] = &[
        "failpoint",
        "logging",
        "metrics",
        "keystone",
        "tls",
        "capabilities",
        "runtime",
        "shipped",
        "domain",
        "store",
        "config",
        "compute",
        "conformance",
        "attach",
        "upgrade",
        "api",
        "client",
        "serve",
    ];

    /// The rooms a file's code (not its comments) names through `crate::`.
    fn imports(code: &str) -> BTreeSet<String> {
        let mut rooms = BTreeSet::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String =
                    line[at + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                if FLOORS.contains(&name.as_str()) {
                    rooms.insert(name);
                }
            }
        }
        rooms
    }

    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn every_room_imports_only_the_floors_below_it() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&src, &mut all);
        let mut wrong = Vec::new();
        let mut rooms_seen = BTreeSet::new();
        for path in all {
            let relative = path.strip_prefix(&src).unwrap();
            let room = relative.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_string();
            let Some(floor) = FLOORS.iter().position(|r| *r == room) else {
                assert!(["lib", "main"].contains(&room.as_str()), "{room} has no floor in FLOORS");
                continue;
            };
            rooms_seen.insert(room.clone());
            for import in imports(&std::fs::read_to_string(&path).unwrap()) {
                if FLOORS.iter().position(|r| *r == import).unwrap() > floor {
                    wrong.push(format!("{} imports {import}, a floor above {room}", relative.display()));
                }
            }
        }
        assert_eq!(rooms_seen.len(), FLOORS.len(), "every floor names a room that exists");
        assert!(wrong.is_empty(), "imports that run back up:\n{}", wrong.join("\n"));
    }

    /// A file's module: `runtime/glue/network.rs` is `runtime::glue::network`, `runtime/mod.rs`
    /// is `runtime`.
    fn module_of(relative: &Path) -> Vec<String> {
        let mut parts: Vec<String> =
            relative.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
        if parts.last().is_some_and(|l| l == "mod") {
            parts.pop();
        }
        parts
    }

    /// The paths a module's code (not its comments, not its `mod tests`) names through `crate::`,
    /// `super::` or `self::`, made absolute.
    fn named_paths(module: &[String], code: &str) -> Vec<Vec<String>> {
        let code = code.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
        let mut paths = Vec::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            let words: Vec<&str> = line
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .filter(|w| w.contains("::"))
                .collect();
            for word in words {
                let mut segments = word.split("::").filter(|s| !s.is_empty()).peekable();
                let mut path: Vec<String> = match segments.peek() {
                    Some(&"crate") => Vec::new(),
                    Some(&"self") => module.to_vec(),
                    Some(&"super") => module.to_vec(),
                    _ => continue,
                };
                segments.next();
                if word.starts_with("super") {
                    path.pop();
                    while segments.peek() == Some(&"super") {
                        segments.next();
                        path.pop();
                    }
                }
                path.extend(segments.map(str::to_string));
                paths.push(path);
            }
        }
        paths
    }

    /// The circles among the modules of one folder: for every pair of modules, an import from
    /// one (or anything inside it) of the other (or anything inside it) is an edge between the
    /// two where their paths part.
    fn circles(files: &[(Vec<String>, String)]) -> Vec<String> {
        use std::collections::{BTreeMap, BTreeSet};
        let modules: BTreeSet<Vec<String>> =
            files.iter().flat_map(|(m, _)| (1..=m.len()).map(|n| m[..n].to_vec())).collect();
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for (module, code) in files {
            for path in named_paths(module, code) {
                let common = module.iter().zip(&path).take_while(|(a, b)| a == b).count();
                if common < module.len() && common < path.len() && modules.contains(&path[..=common]) {
                    edges.entry(module[..=common].to_vec()).or_default().insert(path[..=common].to_vec());
                }
            }
        }
        // Depth-first: a module met again while still on the path closes a circle.
        fn visit(
            at: &Vec<String>,
            edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
            path: &mut Vec<Vec<String>>,
            done: &mut BTreeSet<Vec<String>>,
            found: &mut Vec<String>,
        ) {
            if let Some(i) = path.iter().position(|m| m == at) {
                let circle: Vec<String> = path[i..].iter().chain([at]).map(|m| m.join("::")).collect();
                found.push(circle.join(" -> "));
                return;
            }
            if !done.insert(at.clone()) {
                return;
            }
            path.push(at.clone());
            for next in edges.get(at).into_iter().flatten() {
                visit(next, edges, path, done, found);
            }
            path.pop();
        }
        let mut found = Vec::new();
        let mut done = BTreeSet::new();
        for start in edges.keys() {
            visit(start, &edges, &mut Vec::new(), &mut done, &mut found);
        }
        found
    }

    #[test]
    fn no_modules_of_one_folder_import_each_other_in_a_circle() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&src, &mut all);
        let sources: Vec<(Vec<String>, String)> = all
            .iter()
            .map(|p| (module_of(p.strip_prefix(&src).unwrap()), std::fs::read_to_string(p).unwrap()))
            .collect();
        assert!(sources.len() > 100, "every file is read");
        let found = circles(&sources);
        assert!(found.is_empty(), "modules that import each other:\n{}", found.join("\n"));
    }

    #[test]
    fn a_circle_inside_a_room_is_seen() {
        let m = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
        let files = vec![
            (m("runtime::call"), "use super::error::CallError;\n".to_string()),
            (m("runtime::error"), "pub call: crate::runtime::call::Call,\n".to_string()),
            (m("runtime::glue::log"), "use super::super::state::HostState;\n".to_string()),
            (m("runtime::state"), "// use crate::runtime::glue::log; a comment\n".to_string()),
        ];
        assert_eq!(circles(&files), vec!["runtime::call -> runtime::error -> runtime::call".to_string()]);
    }

    #[test]
    fn an_import_back_up_is_seen() {
        let code = "use crate::runtime::state::HostState;\n// crate::api in a comment is not an import\n";
        assert_eq!(imports(code), BTreeSet::from(["runtime".to_string()]));
    }
}

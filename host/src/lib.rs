//! Berth: a WebAssembly-pluggable storage driver host with a Cinder-compatible attachment API.
//!
//! Rooms: `api` (HTTP), `attach` (state machine and orchestration), `store` (SQL), `runtime`
//! (wasmtime), `capabilities` (what drivers may do to the outside world), `client` (`berth` as an
//! attach client), `keystone` (Identity v3, for the API and the client), `failpoint` (crash
//! points for tests, compiled in only for them).

pub mod api;
pub mod attach;
pub mod capabilities;
pub mod client;
pub mod config;
pub mod conformance;
pub mod domain;
pub mod failpoint;
pub mod keystone;
pub mod metrics;
pub mod runtime;
pub mod serve;
pub mod shipped;
pub mod store;
pub mod upgrade;

/// The rooms' floors, lowest first: a room may import only rooms on floors below its own, so no
/// import runs back up and no two rooms import each other (README, "Layout"). The domain stands
/// on the runtime only for the contract's types, which the runtime generates from the WIT.
#[cfg(test)]
mod floors {
    use std::collections::BTreeSet;
    use std::path::Path;

    const FLOORS: &[&str] = &[
        "failpoint",
        "metrics",
        "keystone",
        "capabilities",
        "runtime",
        "shipped",
        "domain",
        "store",
        "config",
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

    #[test]
    fn an_import_back_up_is_seen() {
        let code = "use crate::runtime::state::HostState;\n// crate::api in a comment is not an import\n";
        assert_eq!(imports(code), BTreeSet::from(["runtime".to_string()]));
    }
}

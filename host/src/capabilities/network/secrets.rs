//! The array's credentials, kept by the host. The operator names each secret and where it comes
//! from (a file only the service can read, or an environment variable; never a value in the
//! configuration file) and the allowed hosts it may be sent to. A driver never holds one: it
//! writes `{{secret:<name>}}` where the secret goes (a header value, or the body of a login
//! request), and the host puts it there, for those hosts only. A request that names a secret for
//! another host, or one that is not configured, is refused before it goes out.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::allow::AllowedHost;
use crate::capabilities::secret::Secret;

/// Where one secret comes from, and where it may go.
#[derive(Debug, Clone, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// A file holding the secret (trailing newlines are not part of it). It must not be readable
    /// by group or others.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// ...or an environment variable of the service.
    #[serde(default)]
    pub env: Option<String>,
    /// The `allowed_hosts` entries it may be sent to.
    pub hosts: Vec<String>,
}

/// A loaded secret.
#[derive(Debug, Clone)]
pub struct NamedSecret {
    pub value: Secret,
    /// Entries of the allow-list.
    pub hosts: Vec<String>,
}

const OPEN: &str = "{{secret:";
const CLOSE: &str = "}}";

/// Loads every secret of a backend, refusing sources that are missing, empty, or readable by
/// others, and hosts that are not in the allow-list.
pub fn load(
    sources: &BTreeMap<String, SecretSource>,
    allowed: &[AllowedHost],
) -> Result<BTreeMap<String, NamedSecret>, String> {
    let mut out = BTreeMap::new();
    for (name, source) in sources {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("secret {name:?}: a name is letters, digits, - and _"));
        }
        let value = match (&source.file, &source.env) {
            (Some(file), None) => read_private(file).map_err(|e| format!("secret {name}: {e}"))?,
            (None, Some(var)) => std::env::var(var)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("secret {name}: the environment variable {var} is not set"))?,
            _ => return Err(format!("secret {name}: give exactly one of file or env")),
        };
        for host in &source.hosts {
            let parsed = AllowedHost::parse(host).map_err(|e| format!("secret {name}: {e}"))?;
            if !allowed.iter().any(|a| a.entry == parsed.entry) {
                return Err(format!("secret {name}: {host} is not one of the backend's allowed_hosts"));
            }
        }
        if source.hosts.is_empty() {
            return Err(format!("secret {name}: name the allowed hosts it may be sent to (hosts = [...])"));
        }
        out.insert(name.clone(), NamedSecret { value: Secret::new(value), hosts: source.hosts.clone() });
    }
    Ok(out)
}

/// A secret's file: present, not readable by group or others, not empty.
fn read_private(path: &std::path::Path) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} is readable by others (mode {mode:o}); make it readable by the service only (chmod 600)",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value = text.trim_end_matches(['\n', '\r']).to_string();
    if value.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(value)
}

/// Why a request's placeholders could not be filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FillError {
    Unknown(String),
    NotForHost { name: String, host: String },
}

impl std::fmt::Display for FillError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FillError::Unknown(name) => write!(f, "the request names secret {name}, which is not configured"),
            FillError::NotForHost { name, host } => {
                write!(f, "the request names secret {name}, which may not be sent to {host}")
            }
        }
    }
}

/// Replaces every `{{secret:<name>}}` in `text` with the secret, when `host` (an allow-list
/// entry) is one it may go to. `json`: the text is a JSON document, and the secret goes inside a
/// JSON string (escaped). Returns `None` when there is no placeholder.
pub fn fill(
    text: &[u8],
    secrets: &BTreeMap<String, NamedSecret>,
    host: &str,
    json: bool,
) -> Result<Option<Vec<u8>>, FillError> {
    let open = OPEN.as_bytes();
    if !text.windows(open.len()).any(|w| w == open) {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.windows(open.len()).position(|w| w == open) {
        out.extend_from_slice(&rest[..at]);
        let after = &rest[at + open.len()..];
        let Some(end) = after.windows(CLOSE.len()).position(|w| w == CLOSE.as_bytes()) else {
            out.extend_from_slice(&rest[at..]);
            return Ok(Some(out));
        };
        let name = String::from_utf8_lossy(&after[..end]).into_owned();
        let secret = secrets.get(&name).ok_or_else(|| FillError::Unknown(name.clone()))?;
        if !secret.hosts.iter().any(|h| h == host) {
            return Err(FillError::NotForHost { name, host: host.to_string() });
        }
        if json {
            let quoted = serde_json::to_string(secret.value.expose()).expect("a string serialises");
            out.extend_from_slice(&quoted.as_bytes()[1..quoted.len() - 1]);
        } else {
            out.extend_from_slice(secret.value.expose().as_bytes());
        }
        rest = &after[end + CLOSE.len()..];
    }
    out.extend_from_slice(rest);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets() -> BTreeMap<String, NamedSecret> {
        [(
            "array".to_string(),
            NamedSecret { value: Secret::new("pa\"ss"), hosts: vec!["https://array.example".into()] },
        )]
        .into()
    }

    #[test]
    fn placeholders_are_filled_only_for_the_hosts_a_secret_may_go_to() {
        let s = secrets();
        let body = br#"{"username": "admin", "password": "{{secret:array}}"}"#;
        let filled = fill(body, &s, "https://array.example", true).unwrap().unwrap();
        assert_eq!(filled, br#"{"username": "admin", "password": "pa\"ss"}"#.to_vec());
        assert_eq!(
            fill(b"Basic {{secret:array}}", &s, "https://array.example", false).unwrap().unwrap(),
            b"Basic pa\"ss"
        );
        assert_eq!(
            fill(body, &s, "https://evil.example", true),
            Err(FillError::NotForHost { name: "array".into(), host: "https://evil.example".into() })
        );
        assert_eq!(
            fill(b"{{secret:other}}", &s, "https://array.example", false),
            Err(FillError::Unknown("other".into()))
        );
        assert_eq!(fill(b"no placeholder", &s, "https://array.example", false), Ok(None));
    }

    #[test]
    fn a_secret_file_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, "hunter2hunter2\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let allowed = vec![AllowedHost::parse("https://a.example").unwrap()];
        let source = |hosts: Vec<String>| {
            BTreeMap::from([("s".to_string(), SecretSource { file: Some(path.clone()), env: None, hosts })])
        };
        let e = load(&source(vec!["https://a.example".into()]), &allowed).unwrap_err();
        assert!(e.contains("readable by others"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let loaded = load(&source(vec!["https://a.example".into()]), &allowed).unwrap();
        assert_eq!(loaded["s"].value.expose(), "hunter2hunter2");
        let e = load(&source(vec!["https://b.example".into()]), &allowed).unwrap_err();
        assert!(e.contains("not one of the backend's allowed_hosts"), "{e}");
    }
}

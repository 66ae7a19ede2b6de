//! The log of `berth serve`: its format, and its filter, which an admin changes while it serves
//! (`cinder service-set-log`, `service-get-log`, 3.32; `api/services.rs`), as Cinder's services
//! take new log levels without a restart. The filter starts from `BERTH_LOG` (`info,sqlx=warn`
//! when unset); each change sets one target's level (a module path: `berth::attach`, `sqlx`; none:
//! every target's default) on top of it. A change lasts until the process ends. What any level
//! logs never holds a secret (docs/security.md).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, fmt, reload};

/// The filter when `BERTH_LOG` is unset.
pub const DEFAULT_FILTER: &str = "info,sqlx=warn";

/// How `berth serve` writes its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Lines for people: `time level span{request_id=...}: message`.
    Text,
    /// One JSON object per line, with the request's span (request ids) in `span`.
    Json,
}

/// The filter in force: the text it started from, the levels set since by target (`""`: the
/// default), and the handle that replaces it.
struct Live {
    base: String,
    set: BTreeMap<String, LevelFilter>,
    handle: reload::Handle<EnvFilter, Registry>,
}

static LIVE: OnceLock<Mutex<Live>> = OnceLock::new();

/// Why a level was not set.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("Invalid input received: level {0:?} is not one of DEBUG, INFO, WARNING, ERROR")]
    Level(String),
    #[error("Invalid input received: prefix {0:?} is not a module path (letters, digits, _ and ::)")]
    Prefix(String),
    /// The process's log is not `berth serve`'s (a library user's, a test's).
    #[error("This process's log is not set up by berth serve; its levels cannot be changed")]
    NotServing,
}

/// Sets up the log of `berth serve` (once; later calls do nothing).
pub fn init(format: Format) {
    let text = std::env::var("BERTH_LOG").ok().filter(|t| EnvFilter::try_new(t).is_ok());
    let text = text.unwrap_or_else(|| DEFAULT_FILTER.to_string());
    let (filter, handle) = reload::Layer::new(filter_of(&text, &BTreeMap::new()));
    let registry = tracing_subscriber::registry().with(filter);
    let done = match format {
        Format::Text => registry
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
        Format::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    if done.is_ok() {
        let _ = LIVE.set(Mutex::new(Live { base: text, set: BTreeMap::new(), handle }));
    }
}

/// A directive's target and level, if it is `target=level` or a bare level (the default's);
/// `None` for one that also names spans or fields.
fn target_level(directive: &str) -> Option<(String, LevelFilter)> {
    if directive.contains('[') {
        return None;
    }
    let (target, level) = directive.rsplit_once('=').unwrap_or(("", directive));
    Some((target.trim().to_string(), level.trim().parse::<LevelFilter>().ok()?))
}

/// The levels of a filter's text by target, with `set` over them.
fn levels_of(base: &str, set: &BTreeMap<String, LevelFilter>) -> BTreeMap<String, LevelFilter> {
    let mut levels: BTreeMap<String, LevelFilter> = base.split(',').filter_map(target_level).collect();
    levels.extend(set.iter().map(|(t, l)| (t.clone(), *l)));
    levels
}

/// The filter: `base` without the directives of the targets `set` names, then `set`'s.
fn filter_of(base: &str, set: &BTreeMap<String, LevelFilter>) -> EnvFilter {
    let kept = base
        .split(',')
        .filter(|d| !d.trim().is_empty())
        .filter(|d| target_level(d).is_none_or(|(target, _)| !set.contains_key(&target)))
        .map(str::to_string);
    let added =
        set.iter().map(
            |(target, level)| if target.is_empty() { level.to_string() } else { format!("{target}={level}") },
        );
    let text: Vec<String> = kept.chain(added).collect();
    EnvFilter::try_new(text.join(",")).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
}

/// A level as Cinder names it (`WARNING`, not `WARN`).
fn cinder_name(level: LevelFilter) -> &'static str {
    match level {
        LevelFilter::OFF => "OFF",
        LevelFilter::ERROR => "ERROR",
        LevelFilter::WARN => "WARNING",
        LevelFilter::INFO => "INFO",
        LevelFilter::DEBUG => "DEBUG",
        _ => "TRACE",
    }
}

/// Checks a level and a prefix as a request gives them, before anything is changed.
pub fn checked(prefix: Option<&str>, level: &str) -> Result<(String, LevelFilter), LogError> {
    let level = match level.to_ascii_uppercase().as_str() {
        "DEBUG" => LevelFilter::DEBUG,
        "INFO" => LevelFilter::INFO,
        "WARNING" | "WARN" => LevelFilter::WARN,
        "ERROR" => LevelFilter::ERROR,
        _ => return Err(LogError::Level(level.to_string())),
    };
    let prefix = prefix.unwrap_or("").trim();
    let path = |p: &str| {
        p.split("::")
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    };
    if !prefix.is_empty() && (prefix.len() > 255 || !path(prefix)) {
        return Err(LogError::Prefix(prefix.to_string()));
    }
    Ok((prefix.to_string(), level))
}

/// Sets `prefix`'s level (none: the default).
pub fn set(prefix: Option<&str>, level: &str) -> Result<(), LogError> {
    let (prefix, level) = checked(prefix, level)?;
    let live = LIVE.get().ok_or(LogError::NotServing)?;
    let mut live = live.lock().unwrap_or_else(|e| e.into_inner());
    live.set.insert(prefix.clone(), level);
    let filter = filter_of(&live.base, &live.set);
    live.handle.reload(filter).map_err(|_| LogError::NotServing)?;
    tracing::info!(target = %prefix, level = cinder_name(level), "log level set");
    Ok(())
}

/// The levels in force, by target (`""`: the default), of the targets that start with `prefix`.
pub fn levels(prefix: Option<&str>) -> Result<BTreeMap<String, String>, LogError> {
    let live = LIVE.get().ok_or(LogError::NotServing)?;
    let live = live.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = prefix.unwrap_or("");
    Ok(levels_of(&live.base, &live.set)
        .iter()
        .filter(|(target, _)| target.starts_with(prefix))
        .map(|(target, level)| (target.clone(), cinder_name(*level).to_string()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_set_replaces_its_targets_directive_and_keeps_the_others() {
        let base = "info,sqlx=warn,berth[request]=debug";
        let set = BTreeMap::from([
            ("sqlx".to_string(), LevelFilter::DEBUG),
            ("berth::api".into(), LevelFilter::ERROR),
        ]);
        let levels = levels_of(base, &set);
        assert_eq!(levels.get(""), Some(&LevelFilter::INFO));
        assert_eq!(levels.get("sqlx"), Some(&LevelFilter::DEBUG));
        assert_eq!(levels.get("berth::api"), Some(&LevelFilter::ERROR));
        let text = filter_of(base, &set).to_string();
        assert!(text.contains("sqlx=debug") && !text.contains("sqlx=warn"), "{text}");
        assert!(text.contains("berth[request]=debug") && text.contains("berth::api=error"), "{text}");
    }

    #[test]
    fn levels_and_prefixes_are_checked() {
        assert_eq!(checked(Some("berth::api"), "debug").unwrap(), ("berth::api".into(), LevelFilter::DEBUG));
        assert_eq!(checked(None, "WARNING").unwrap(), (String::new(), LevelFilter::WARN));
        assert!(matches!(checked(None, "LOUD"), Err(LogError::Level(_))));
        assert!(matches!(checked(Some("berth,sqlx=trace"), "INFO"), Err(LogError::Prefix(_))));
        assert!(matches!(checked(Some("berth::"), "INFO"), Err(LogError::Prefix(_))));
    }
}

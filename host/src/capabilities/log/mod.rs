//! `berth:driver/log`: a driver's log lines in the host's log, attributed to the driver and the
//! call, bounded in size and count, stripped of control characters, and scrubbed of the secrets
//! the host knows about for that call.

use super::secret::Redactor;

/// The longest log message kept, in bytes; longer ones are cut at a character boundary.
pub const MAX_MESSAGE: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// Makes driver-produced text safe to log or return: no control characters (so no forged log
/// lines or terminal escapes), at most `max` bytes, known secrets replaced by `***`.
pub fn sanitize(text: &str, max: usize, redactor: &Redactor) -> String {
    let mut clean: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if clean.len() > max {
        let mut cut = max;
        while !clean.is_char_boundary(cut) {
            cut -= 1;
        }
        clean.truncate(cut);
        clean.push('…');
    }
    redactor.redact(&clean)
}

/// Emits one driver log line.
pub fn emit(driver: &str, call: &str, level: Level, message: &str, redactor: &Redactor) {
    let message = sanitize(message, MAX_MESSAGE, redactor);
    match level {
        Level::Trace => tracing::trace!(target: "berth::driver", driver, call, "{message}"),
        Level::Debug => tracing::debug!(target: "berth::driver", driver, call, "{message}"),
        Level::Info => tracing::info!(target: "berth::driver", driver, call, "{message}"),
        Level::Warn => tracing::warn!(target: "berth::driver", driver, call, "{message}"),
        Level::Error => tracing::error!(target: "berth::driver", driver, call, "{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_strips_controls_bounds_length_and_redacts() {
        let mut r = Redactor::default();
        r.add("s3cretPassw0rd");
        assert_eq!(sanitize("a\nb\x1b[31mc", 100, &r), "a b [31mc");
        assert_eq!(sanitize("pw=s3cretPassw0rd", 100, &r), "pw=***");
        assert_eq!(sanitize("ééé", 3, &r), "é…");
    }
}

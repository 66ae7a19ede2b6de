//! Secrets (CHAP passwords, API tokens): a newtype that never prints its content, and a redactor
//! that scrubs known secrets from text a driver produced before it reaches a log or a response.

use std::fmt;

/// A secret string. `Debug` and `Display` print `***`; read it with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself. Call sites are the few places that must send it somewhere.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Replaces every known secret in a text with `***`.
#[derive(Debug, Default, Clone)]
pub struct Redactor {
    secrets: Vec<Secret>,
    /// The array's credentials and what the network capability learned from answers (a login's
    /// token) during the call, shared with its requests as they run. A driver's stored model
    /// update must not hold one of these.
    network: std::sync::Arc<std::sync::Mutex<Vec<Secret>>>,
}

impl Redactor {
    /// Remembers a secret. Values shorter than 6 characters are not treated as secrets (they
    /// would redact ordinary words).
    pub fn add(&mut self, secret: &str) {
        if secret.len() >= 6 && !self.secrets.iter().any(|s| s.expose() == secret) {
            self.secrets.push(Secret::new(secret));
        }
    }

    /// Remembers the secret parts of a Cinder-style `provider_auth` (`CHAP <user> <secret>`):
    /// the user name and the secret.
    pub fn add_provider_auth(&mut self, provider_auth: &str) {
        for word in provider_auth.split_whitespace().skip(1) {
            self.add(word);
        }
    }

    /// Remembers a network secret (see the field's notes); shared with every clone.
    pub fn add_network(&self, secret: &str) {
        if secret.len() < 6 {
            return;
        }
        let mut list = self.network.lock().unwrap_or_else(|p| p.into_inner());
        if !list.iter().any(|s| s.expose() == secret) {
            list.push(Secret::new(secret));
        }
    }

    /// Whether a text holds one of the network secrets.
    pub fn holds_network_secret(&self, text: &str) -> bool {
        self.network.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|s| text.contains(s.expose()))
    }

    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        let network = self.network.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for secret in self.secrets.iter().chain(&network) {
            if out.contains(secret.expose()) {
                out = out.replace(secret.expose(), "***");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("hunter2hunter2");
        assert_eq!(format!("{s} {s:?}"), "*** Secret(***)");
    }

    #[test]
    fn redactor_scrubs_provider_auth_parts() {
        let mut r = Redactor::default();
        r.add_provider_auth("CHAP userABCDEF secretXYZ123456");
        assert_eq!(r.redact("login userABCDEF with secretXYZ123456 failed"), "login *** with *** failed");
        assert_eq!(r.redact("CHAP is fine"), "CHAP is fine");
    }
}

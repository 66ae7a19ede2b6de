//! The allow-list of one backend: `scheme://host:port` entries, where `host` may be a name, an
//! IP address, or `*.` and a domain (any name below it, not the domain itself). A request goes
//! out only to an entry it matches exactly in scheme, host and port, and only to addresses that
//! are not this machine's or the cloud's (loopback, link-local, the metadata service, unspecified)
//! unless that address is itself an entry: a name that resolves there is refused (no DNS
//! rebinding into the host).

use std::net::IpAddr;

/// One entry of `allowed_hosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    /// As the operator wrote it (the metric label and what log lines name).
    pub entry: String,
    pub https: bool,
    pub host: HostPattern,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// A name, lower case.
    Name(String),
    /// `*.domain`: any name ending in `.domain`.
    Below(String),
    Ip(IpAddr),
}

impl AllowedHost {
    /// Parses `https://host[:port]` or `http://host[:port]` (no path, no user).
    pub fn parse(entry: &str) -> Result<AllowedHost, String> {
        let bad = |why: &str| format!("allowed host {entry:?}: {why} (write scheme://host[:port])");
        let (scheme, rest) = entry.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return Err(bad("the scheme is neither https nor http")),
        };
        let rest = rest.trim_end_matches('/');
        if rest.is_empty() || rest.contains(['/', '@', '?', '#', ' ']) {
            return Err(bad("a host and port only"));
        }
        let (host, port) = split_host_port(rest).ok_or_else(|| bad("a malformed host or port"))?;
        let port = port.unwrap_or(if https { 443 } else { 80 });
        let host = if let Some(domain) = host.strip_prefix("*.") {
            if domain.is_empty() || domain.contains('*') || !is_name(domain) {
                return Err(bad("a wildcard is `*.` and a domain"));
            }
            HostPattern::Below(domain.to_ascii_lowercase())
        } else if let Ok(ip) = host.parse::<IpAddr>() {
            HostPattern::Ip(ip)
        } else if is_name(host) {
            HostPattern::Name(host.to_ascii_lowercase())
        } else {
            return Err(bad("not a host name or address"));
        };
        Ok(AllowedHost { entry: entry.trim_end_matches('/').to_string(), https, host, port })
    }

    /// Whether a request to `scheme://host:port` may go out under this entry.
    pub fn matches(&self, https: bool, host: &str, port: u16) -> bool {
        if self.https != https || self.port != port {
            return false;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        match &self.host {
            HostPattern::Name(name) => *name == host,
            HostPattern::Below(domain) => {
                host.len() > domain.len() + 1 && host.ends_with(domain.as_str()) && {
                    let cut = host.len() - domain.len();
                    host.as_bytes()[cut - 1] == b'.'
                }
            }
            HostPattern::Ip(ip) => host.parse::<IpAddr>().is_ok_and(|h| h == *ip),
        }
    }
}

fn split_host_port(text: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((host, port));
    }
    match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => Some((host, Some(port.parse().ok()?))),
        Some(_) => Some((text, None)), // a bare IPv6 address
        None => Some((text, None)),
    }
}

fn is_name(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Addresses that belong to this machine or to the cloud it runs in: loopback, link-local (the
/// metadata service, 169.254.169.254, among them), unspecified, and their IPv4-mapped forms.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified() || v4.is_broadcast(),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                // AWS's IPv6 metadata service.
                || v6.segments()[..4] == [0xfd00, 0x0ec2, 0, 0]
        }
    }
}

/// The allow-list of a backend.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    pub hosts: Vec<AllowedHost>,
}

impl AllowList {
    pub fn parse(entries: &[String]) -> Result<AllowList, String> {
        Ok(AllowList { hosts: entries.iter().map(|e| AllowedHost::parse(e)).collect::<Result<_, _>>()? })
    }

    /// The entry a request to `scheme://host:port` goes out under, if any.
    pub fn find(&self, https: bool, host: &str, port: u16) -> Option<&AllowedHost> {
        self.hosts.iter().find(|h| h.matches(https, host, port))
    }

    /// Whether an internal address is listed itself (then a name may resolve to it).
    pub fn lists_address(&self, ip: IpAddr) -> bool {
        self.hosts.iter().any(|h| h.host == HostPattern::Ip(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (entry, scheme is https, host, port) -> allowed?
    #[test]
    fn entries_match_scheme_host_and_port_exactly_and_wildcards_only_below_their_domain() {
        let cases: &[(&str, bool, &str, u16, bool)] = &[
            ("https://array-1.example:8443", true, "array-1.example", 8443, true),
            ("https://array-1.example:8443", true, "ARRAY-1.example", 8443, true),
            ("https://array-1.example:8443", true, "array-1.example", 443, false),
            ("https://array-1.example:8443", false, "array-1.example", 8443, false),
            ("https://array-1.example", true, "array-1.example", 443, true),
            ("http://array-1.example", false, "array-1.example", 80, true),
            ("https://*.example.com", true, "a.example.com", 443, true),
            ("https://*.example.com", true, "a.b.example.com", 443, true),
            ("https://*.example.com", true, "example.com", 443, false),
            ("https://*.example.com", true, "badexample.com", 443, false),
            ("https://*.example.com", true, "example.com.evil", 443, false),
            ("https://10.0.0.5:8443", true, "10.0.0.5", 8443, true),
            ("https://[::1]:8443", true, "[::1]", 8443, true),
            ("https://[::1]:8443", true, "::1", 8443, true),
        ];
        for (entry, https, host, port, allowed) in cases {
            let e = AllowedHost::parse(entry).unwrap();
            assert_eq!(e.matches(*https, host, *port), *allowed, "{entry} vs {https} {host}:{port}");
        }
    }

    #[test]
    fn malformed_entries_are_refused_naming_them() {
        for bad in [
            "array.example",
            "ftp://a",
            "https://a/path",
            "https://u@a",
            "https://*.",
            "https://a:port",
            "https://*.*.a",
        ] {
            let e = AllowedHost::parse(bad).unwrap_err();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn loopback_link_local_metadata_and_unspecified_are_internal_and_private_networks_are_not() {
        for ip in [
            "127.0.0.1",
            "127.8.9.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "fd00:ec2::254",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.1.2.3", "192.168.1.10", "172.16.0.1", "8.8.8.8", "2001:db8::1", "fd12::1"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }
}

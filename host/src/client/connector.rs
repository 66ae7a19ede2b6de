//! This machine's connector, as os-brick's `get_connector_properties` builds it: platform,
//! os_type, ip, host, multipath, enforce_multipath, the iSCSI initiator name from
//! `/etc/iscsi/initiatorname.iscsi` and the NVMe host NQN from `/etc/nvme/hostnqn` when present.

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::path::PathBuf;

use serde_json::{Map, Value as Json, json};

use super::error::ClientError;

/// Where os-brick (and open-iscsi) keep the initiator name.
pub const INITIATOR_NAME_FILE: &str = "/etc/iscsi/initiatorname.iscsi";
const HOST_NQN_FILE: &str = "/etc/nvme/hostnqn";

#[derive(Debug, Clone, clap::Args)]
pub struct ConnectorOptions {
    /// Ask for a multipath connection.
    #[arg(long)]
    pub multipath: bool,
    /// Fail rather than fall back to a single path.
    #[arg(long)]
    pub enforce_multipath: bool,
    /// The network interface whose IPv4 address is the connector's `ip`.
    #[arg(long)]
    pub nic: Option<String>,
    /// The file holding this machine's iSCSI initiator name (`InitiatorName=...`).
    #[arg(long, default_value = INITIATOR_NAME_FILE)]
    pub initiator_name_file: PathBuf,
}

/// The connector, with `host` set to `host` when given (else this machine's hostname).
pub fn connector(opts: &ConnectorOptions, host: Option<&str>) -> Result<Map<String, Json>, ClientError> {
    let ip = match &opts.nic {
        Some(nic) => interface_ipv4(nic)?,
        None => my_ip(),
    };
    let host = match host {
        Some(h) => h.to_string(),
        None => hostname(),
    };
    let mut c = Map::new();
    c.insert("platform".into(), json!(std::env::consts::ARCH));
    c.insert("os_type".into(), json!(std::env::consts::OS));
    c.insert("ip".into(), json!(ip.to_string()));
    c.insert("host".into(), json!(host));
    c.insert("multipath".into(), json!(opts.multipath));
    c.insert("enforce_multipath".into(), json!(opts.enforce_multipath));
    if let Some(initiator) = initiator_name(&opts.initiator_name_file) {
        c.insert("initiator".into(), json!(initiator));
    }
    if let Some(nqn) =
        std::fs::read_to_string(HOST_NQN_FILE).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    {
        c.insert("nqn".into(), json!(nqn));
    }
    Ok(c)
}

/// `InitiatorName=` from open-iscsi's file, if it is there.
pub fn initiator_name(file: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix("InitiatorName="))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The address this machine would use to reach the outside (os-brick: the local end of a UDP
/// socket "connected" to 8.8.8.8, which sends nothing), else loopback.
fn my_ip() -> IpAddr {
    UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| s.connect("8.8.8.8:80").map(|()| s))
        .and_then(|s| s.local_addr())
        .map(|a| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The first IPv4 address of a network interface.
fn interface_ipv4(nic: &str) -> Result<IpAddr, ClientError> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list that is walked read-only and freed once below.
    unsafe {
        if libc::getifaddrs(&mut addrs) != 0 {
            return Err(ClientError::Usage(format!(
                "cannot list network interfaces: {}",
                std::io::Error::last_os_error()
            )));
        }
        let mut found = None;
        let mut cursor = addrs;
        while !cursor.is_null() {
            let a = &*cursor;
            if !a.ifa_addr.is_null()
                && i32::from((*a.ifa_addr).sa_family) == libc::AF_INET
                && std::ffi::CStr::from_ptr(a.ifa_name).to_bytes() == nic.as_bytes()
            {
                let sin = &*(a.ifa_addr as *const libc::sockaddr_in);
                found = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
                break;
            }
            cursor = a.ifa_next;
        }
        libc::freeifaddrs(addrs);
        found.ok_or_else(|| ClientError::Usage(format!("network interface {nic} has no IPv4 address")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initiator_name_is_read_like_open_iscsi_does() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("initiatorname.iscsi");
        std::fs::write(
            &file,
            "## generated\n#InitiatorName=iqn.old\nInitiatorName=iqn.1993-08.org.debian:01:abc\n",
        )
        .unwrap();
        assert_eq!(initiator_name(&file).as_deref(), Some("iqn.1993-08.org.debian:01:abc"));
        assert_eq!(initiator_name(&dir.path().join("absent")), None);
    }

    #[test]
    fn the_loopback_interface_has_its_address() {
        assert_eq!(interface_ipv4("lo").unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(interface_ipv4("no-such-nic0").is_err());
    }
}

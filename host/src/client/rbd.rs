//! Mapping an RBD image on this machine, as os-brick's RBD connector does for a local attach
//! (`do_local_attach`): with `rbd-nbd` (userspace librbd behind the kernel's `nbd` module) when it
//! is here, else with the kernel's own RBD driver (`rbd device map`, the `rbd` module). Each needs
//! a kernel module; without one, the command says which, and maps nothing.
//!
//! The tools run from `PATH` with an argument vector, never a shell, and a timeout. A keyring the
//! connection info carries goes to a file only root can read for the time of the map; otherwise
//! the tools read the identity's keyring from `/etc/ceph/<cluster>.client.<user>.keyring`, as on
//! a compute host.

// This room runs rbd-nbd and rbd (host/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value as Json;

use super::error::ClientError;

/// The image a connection info names, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `pool/image`.
    pub spec: String,
    /// `host:port` of each monitor.
    pub monitors: Vec<String>,
    pub user: Option<String>,
    pub cluster: String,
    pub keyring: Option<String>,
}

impl Image {
    /// From Cinder's RBD connection info (`name`, `hosts`, `ports`, `auth_username`, ...).
    pub fn from_connection_info(info: &Json) -> Result<Image, ClientError> {
        let bad = |what: &str| ClientError::Api(format!("the RBD connection info has no valid {what}"));
        let spec = info["name"].as_str().filter(|n| n.split('/').count() == 2).ok_or_else(|| bad("name"))?;
        let hosts = info["hosts"].as_array().ok_or_else(|| bad("hosts"))?;
        let ports = info["ports"].as_array().ok_or_else(|| bad("ports"))?;
        let port = |p: &Json| p.as_str().map(str::to_string).or_else(|| p.as_u64().map(|n| n.to_string()));
        let monitors = hosts
            .iter()
            .zip(ports)
            .map(|(h, p)| {
                let host = h.as_str().ok_or_else(|| bad("hosts"))?;
                let host = if host.contains(':') { format!("[{host}]") } else { host.to_string() };
                Ok(format!("{host}:{}", port(p).ok_or_else(|| bad("ports"))?))
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        let safe = |s: &str| {
            !s.is_empty()
                && !s.starts_with('-')
                && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        let (pool, image) = spec.split_once('/').expect("checked");
        if !safe(pool) || !safe(image) {
            return Err(bad("name"));
        }
        let user = match (info["auth_enabled"].as_bool(), info["auth_username"].as_str()) {
            (Some(false), _) => None,
            (_, Some(u)) if safe(u) => Some(u.to_string()),
            (_, Some(_)) => return Err(bad("auth_username")),
            (_, None) => None,
        };
        let cluster = info["cluster_name"].as_str().unwrap_or("ceph");
        if !safe(cluster) {
            return Err(bad("cluster_name"));
        }
        Ok(Image {
            spec: spec.to_string(),
            monitors,
            user,
            cluster: cluster.to_string(),
            keyring: info["keyring"].as_str().map(str::to_string),
        })
    }
}

/// How this machine maps RBD images.
#[derive(Debug, Clone)]
pub enum Mapper {
    /// `rbd-nbd` and the kernel's `nbd` module.
    Nbd(PathBuf),
    /// `rbd` and the kernel's `rbd` module.
    Kernel(PathBuf),
}

const TIMEOUT: Duration = Duration::from_secs(120);

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

impl Mapper {
    /// What this machine has, or what it lacks: `root` is where `/sys` is (`/`, but for tests).
    pub fn find(root: &Path) -> Result<Mapper, ClientError> {
        let nbd_module = root.join("sys/module/nbd").exists();
        let rbd_module = root.join("sys/bus/rbd").exists();
        let (rbd_nbd, rbd) = (on_path("rbd-nbd"), on_path("rbd"));
        match (rbd_nbd, nbd_module, rbd, rbd_module) {
            (Some(p), true, _, _) => return Ok(Mapper::Nbd(p)),
            (_, _, Some(p), true) => return Ok(Mapper::Kernel(p)),
            _ => {}
        }
        let mut lacks = Vec::new();
        match (on_path("rbd-nbd").is_some(), nbd_module) {
            (false, false) => lacks.push("rbd-nbd is not installed (Debian: apt-get install rbd-nbd) and the nbd kernel module is not loaded (modprobe nbd)"),
            (false, true) => lacks.push("rbd-nbd is not installed (Debian: apt-get install rbd-nbd)"),
            (true, false) => lacks.push("rbd-nbd is installed but the nbd kernel module is not loaded (modprobe nbd)"),
            _ => {}
        }
        match (on_path("rbd").is_some(), rbd_module) {
            (false, false) => lacks.push("the rbd tool is not installed (Debian: apt-get install ceph-common) and the kernel's rbd module is not loaded (modprobe rbd)"),
            (false, true) => lacks.push("the rbd tool is not installed (Debian: apt-get install ceph-common)"),
            (true, false) => lacks.push("the kernel's rbd module is not loaded (modprobe rbd)"),
            _ => {}
        }
        Err(ClientError::Tools(format!(
            "this is an RBD volume: attaching it to this machine needs rbd-nbd with the nbd kernel module, or the \
             kernel's own RBD driver; here {}. (A virtual machine needs neither: qemu opens the image itself.)",
            lacks.join(", and ")
        )))
    }

    fn program(&self) -> &Path {
        match self {
            Mapper::Nbd(p) | Mapper::Kernel(p) => p,
        }
    }

    /// Maps the image; returns its device (`/dev/nbd0`, `/dev/rbd0`).
    pub async fn map(&self, image: &Image, read_only: bool) -> Result<PathBuf, ClientError> {
        let keyring = match &image.keyring {
            Some(text) => {
                let file = tempfile::Builder::new()
                    .prefix("berth-keyring-")
                    .tempfile()
                    .map_err(|e| ClientError::Connect(format!("cannot write the keyring: {e}")))?;
                std::fs::write(file.path(), text)
                    .map_err(|e| ClientError::Connect(format!("cannot write the keyring: {e}")))?;
                Some(file)
            }
            None => None,
        };
        let mut args: Vec<String> = match self {
            Mapper::Nbd(_) => vec!["map".into()],
            Mapper::Kernel(_) => vec!["device".into(), "map".into()],
        };
        args.extend(["--cluster".into(), image.cluster.clone(), "-m".into(), image.monitors.join(",")]);
        if let Some(user) = &image.user {
            args.extend(["--id".into(), user.clone()]);
        }
        if let Some(k) = &keyring {
            args.extend(["--keyring".into(), k.path().display().to_string()]);
        }
        if read_only {
            args.push("--read-only".into());
        }
        args.push(image.spec.clone());
        let out = self.run(&args).await.map_err(ClientError::Connect)?;
        let device = out.lines().map(str::trim).find(|l| l.starts_with("/dev/")).ok_or_else(|| {
            ClientError::Connect(format!("{} named no device: {out:?}", self.program().display()))
        })?;
        Ok(PathBuf::from(device))
    }

    /// Unmaps a device this machine mapped.
    pub async fn unmap(&self, device: &Path) -> Result<(), ClientError> {
        let device = device.display().to_string();
        let args: Vec<String> = match self {
            Mapper::Nbd(_) => vec!["unmap".into(), device],
            Mapper::Kernel(_) => vec!["device".into(), "unmap".into(), device],
        };
        self.run(&args).await.map(drop).map_err(ClientError::Connect)
    }

    /// The device the image is mapped to here, if it is.
    pub async fn mapped(&self, image: &Image) -> Result<Option<PathBuf>, ClientError> {
        let args: Vec<String> = match self {
            Mapper::Nbd(_) => vec!["list-mapped".into(), "--format".into(), "json".into()],
            Mapper::Kernel(_) => vec!["device".into(), "list".into(), "--format".into(), "json".into()],
        };
        let out = self.run(&args).await.map_err(ClientError::Connect)?;
        let list: Json = serde_json::from_str(out.trim()).unwrap_or(Json::Array(Vec::new()));
        let (pool, name) = image.spec.split_once('/').expect("checked");
        Ok(list.as_array().into_iter().flatten().find_map(|m| {
            (m["pool"].as_str() == Some(pool) && m["image"].as_str() == Some(name))
                .then(|| m["device"].as_str().map(PathBuf::from))
                .flatten()
        }))
    }

    async fn run(&self, args: &[String]) -> Result<String, String> {
        let shown = format!("{} {}", self.program().display(), args.join(" "));
        let child = tokio::process::Command::new(self.program())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run {shown}: {e}"))?;
        let output = match tokio::time::timeout(TIMEOUT, child.wait_with_output()).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(format!("{shown}: {e}")),
            Err(_) => return Err(format!("{shown} did not finish in {TIMEOUT:?}")),
        };
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!("{shown} failed: {}", String::from_utf8_lossy(&output.stderr).trim()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cinders_connection_info_names_the_image_its_monitors_and_identity() {
        let info = json!({"name": "volumes/volume-1", "hosts": ["10.0.0.1", "::1"], "ports": ["6789", 3300],
            "auth_enabled": true, "auth_username": "cinder", "cluster_name": "ceph"});
        let image = Image::from_connection_info(&info).unwrap();
        assert_eq!(image.spec, "volumes/volume-1");
        assert_eq!(image.monitors, ["10.0.0.1:6789", "[::1]:3300"]);
        assert_eq!(image.user.as_deref(), Some("cinder"));
        for bad in [
            json!({"name": "volumes/a/b", "hosts": [], "ports": []}),
            json!({"name": "volumes/x;rm", "hosts": [], "ports": []}),
            json!({"name": "volumes/--keyring", "hosts": [], "ports": []}),
            json!({"name": "volumes/x", "hosts": ["h"], "ports": [null]}),
            json!({"name": "volumes/x", "hosts": [], "ports": [], "auth_username": "a b"}),
        ] {
            assert!(Image::from_connection_info(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_a_kernel_module_it_says_what_is_missing() {
        let root = tempfile::tempdir().unwrap();
        let message = Mapper::find(root.path()).unwrap_err().to_string();
        assert!(message.contains("modprobe nbd") && message.contains("modprobe rbd"), "{message}");
    }
}

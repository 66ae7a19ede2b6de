//! Connecting this machine to an iSCSI target with open-iscsi's `iscsiadm`, as os-brick's
//! `ISCSIConnector` does: discovery, the node's CHAP settings, login, then waiting for the
//! `/dev/disk/by-path` device; and back: logout, node delete.
//!
//! `iscsiadm` runs from `PATH` with an argument vector, never a shell, and a timeout. Its only
//! way to take a CHAP secret is `--value` on its command line (as os-brick passes it), so the
//! secret is visible in that one short-lived process's arguments; it never appears in Berth's
//! output or errors (every message is redacted).

// This room runs iscsiadm (host/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value as Json;

use super::error::ClientError;

/// One target to log in to.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    pub portal: String,
    pub iqn: String,
    pub lun: i64,
    /// (user, secret) for CHAP.
    pub chap: Option<(String, String)>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("portal", &self.portal)
            .field("iqn", &self.iqn)
            .field("lun", &self.lun)
            .finish()
    }
}

impl Target {
    /// The targets of a flattened Cinder `connection_info`: every path when `multipath` and the
    /// driver gave `target_portals`/`target_iqns`/`target_luns`, else the one target.
    pub fn from_connection_info(info: &Json, multipath: bool) -> Result<Vec<Target>, ClientError> {
        let bad = |what: &str| ClientError::Api(format!("the connection information has no usable {what}"));
        let chap = match info["auth_method"].as_str() {
            Some(m) if m.eq_ignore_ascii_case("CHAP") => Some((
                info["auth_username"].as_str().ok_or_else(|| bad("auth_username"))?.to_string(),
                info["auth_password"].as_str().ok_or_else(|| bad("auth_password"))?.to_string(),
            )),
            _ => None,
        };
        let lun = |v: &Json| v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok()));
        if multipath
            && let (Some(portals), Some(iqns), Some(luns)) = (
                info["target_portals"].as_array(),
                info["target_iqns"].as_array(),
                info["target_luns"].as_array(),
            )
            && portals.len() == iqns.len()
            && portals.len() == luns.len()
            && !portals.is_empty()
        {
            return portals
                .iter()
                .zip(iqns)
                .zip(luns)
                .map(|((p, i), l)| {
                    Ok(Target {
                        portal: p.as_str().ok_or_else(|| bad("target_portals"))?.to_string(),
                        iqn: i.as_str().ok_or_else(|| bad("target_iqns"))?.to_string(),
                        lun: lun(l).ok_or_else(|| bad("target_luns"))?,
                        chap: chap.clone(),
                    })
                })
                .collect();
        }
        Ok(vec![Target {
            portal: info["target_portal"].as_str().ok_or_else(|| bad("target_portal"))?.to_string(),
            iqn: info["target_iqn"].as_str().ok_or_else(|| bad("target_iqn"))?.to_string(),
            lun: lun(&info["target_lun"]).ok_or_else(|| bad("target_lun"))?,
            chap,
        }])
    }

    /// The device udev names for this LUN: `ip-<portal>-iscsi-<iqn>-lun-<lun>`.
    pub fn by_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!("ip-{}-iscsi-{}-lun-{}", self.portal, self.iqn, self.lun))
    }
}

/// iscsiadm's exit codes that mean "already so" (open-iscsi `include/iscsi_err.h`).
const ERR_SESS_EXISTS: i32 = 15;
const ERR_NO_OBJS_FOUND: i32 = 21;

/// open-iscsi's administration tool.
#[derive(Debug, Clone)]
pub struct Iscsiadm {
    program: PathBuf,
    timeout: Duration,
}

impl Iscsiadm {
    /// Finds `iscsiadm` on `PATH`.
    pub fn find(timeout: Duration) -> Result<Iscsiadm, ClientError> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .map(|dir| dir.join("iscsiadm"))
            .find(|p| is_executable(p))
            .map(|program| Iscsiadm { program, timeout })
            .ok_or_else(|| {
                ClientError::Tools(
                    "iscsiadm was not found on PATH: install open-iscsi (Debian: apt-get install open-iscsi)"
                        .into(),
                )
            })
    }

    /// Runs iscsiadm; `secret` is redacted from anything reported.
    async fn run(&self, args: &[&str], secret: Option<&str>) -> Result<String, (Option<i32>, String)> {
        let redact = |s: &str| match secret {
            Some(secret) if !secret.is_empty() => s.replace(secret, "***"),
            _ => s.to_string(),
        };
        let shown = redact(&args.join(" "));
        let child = tokio::process::Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| (None, format!("cannot run iscsiadm {shown}: {e}")))?;
        let output = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err((None, format!("iscsiadm {shown}: {e}"))),
            Err(_) => return Err((None, format!("iscsiadm {shown} did not finish in {:?}", self.timeout))),
        };
        if output.status.success() {
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        let stderr = redact(String::from_utf8_lossy(&output.stderr).trim());
        let code = output.status.code();
        let status = code.map_or_else(|| "a signal".to_string(), |c| format!("status {c}"));
        Err((code, format!("iscsiadm {shown} failed with {status}: {stderr}")))
    }

    fn node(t: &Target) -> Vec<&str> {
        vec!["-m", "node", "-T", &t.iqn, "-p", &t.portal]
    }

    /// SendTargets discovery on the portal; creates the target's node record if discovery did
    /// not list it (a target may be hidden from discovery).
    pub async fn discover(&self, t: &Target) -> Result<(), ClientError> {
        let out = self
            .run(&["-m", "discovery", "-t", "sendtargets", "-p", &t.portal], None)
            .await
            .map_err(|(_, m)| ClientError::Connect(m))?;
        let listed = out.lines().any(|l| l.split_whitespace().nth(1) == Some(t.iqn.as_str()));
        if !listed {
            let mut args = Self::node(t);
            args.extend(["--interface", "default", "--op", "new"]);
            self.run(&args, None).await.map_err(|(_, m)| ClientError::Connect(m))?;
        }
        Ok(())
    }

    /// Sets one node setting.
    async fn update(&self, t: &Target, name: &str, value: &str, secret: bool) -> Result<(), ClientError> {
        let mut args = Self::node(t);
        args.extend(["--op", "update", "-n", name, "-v", value]);
        self.run(&args, secret.then_some(value)).await.map(drop).map_err(|(_, m)| ClientError::Connect(m))
    }

    /// The node's CHAP settings (or none).
    pub async fn set_auth(&self, t: &Target) -> Result<(), ClientError> {
        match &t.chap {
            Some((user, secret)) => {
                self.update(t, "node.session.auth.authmethod", "CHAP", false).await?;
                self.update(t, "node.session.auth.username", user, false).await?;
                self.update(t, "node.session.auth.password", secret, true).await
            }
            None => self.update(t, "node.session.auth.authmethod", "None", false).await,
        }
    }

    /// Logs in (an existing session is fine) and makes the session come back after a reboot.
    pub async fn login(&self, t: &Target) -> Result<(), ClientError> {
        let mut args = Self::node(t);
        args.push("--login");
        match self.run(&args, None).await {
            Ok(_) => {}
            Err((Some(ERR_SESS_EXISTS), _)) => {}
            Err((_, m)) => return Err(ClientError::Connect(m)),
        }
        self.update(t, "node.startup", "automatic", false).await
    }

    /// Logs out; no session is fine.
    pub async fn logout(&self, t: &Target) -> Result<(), ClientError> {
        let mut args = Self::node(t);
        args.push("--logout");
        match self.run(&args, None).await {
            Ok(_) | Err((Some(ERR_NO_OBJS_FOUND), _)) => Ok(()),
            Err((_, m)) => Err(ClientError::Connect(m)),
        }
    }

    /// Deletes the node record; no record is fine.
    pub async fn delete_node(&self, t: &Target) -> Result<(), ClientError> {
        let mut args = Self::node(t);
        args.extend(["--op", "delete"]);
        match self.run(&args, None).await {
            Ok(_) | Err((Some(ERR_NO_OBJS_FOUND), _)) => Ok(()),
            Err((_, m)) => Err(ClientError::Connect(m)),
        }
    }
}

/// Waits until `path` exists (udev creates by-path links shortly after login).
pub async fn wait_for_device(path: &Path, timeout: Duration) -> Result<(), ClientError> {
    let deadline = Instant::now() + timeout;
    loop {
        if path.exists() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ClientError::Connect(format!(
                "the device {} did not appear within {}s of login",
                path.display(),
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_target_or_every_path() {
        let info = json!({
            "target_portal": "10.0.0.1:3260", "target_iqn": "iqn.x:1", "target_lun": 1,
            "target_portals": ["10.0.0.1:3260", "10.0.0.2:3260"], "target_iqns": ["iqn.x:1", "iqn.x:1"],
            "target_luns": [1, 1], "auth_method": "CHAP", "auth_username": "u", "auth_password": "s"
        });
        let single = Target::from_connection_info(&info, false).unwrap();
        assert_eq!(single.len(), 1);
        assert_eq!(single[0].chap, Some(("u".into(), "s".into())));
        assert_eq!(Target::from_connection_info(&info, true).unwrap().len(), 2);
        assert_eq!(
            single[0].by_path(Path::new("/dev/disk/by-path")),
            PathBuf::from("/dev/disk/by-path/ip-10.0.0.1:3260-iscsi-iqn.x:1-lun-1")
        );
        assert!(Target::from_connection_info(&json!({"target_iqn": "iqn.x:1"}), false).is_err());
    }

    #[test]
    fn a_target_never_prints_its_secret() {
        let t = Target {
            portal: "p".into(),
            iqn: "i".into(),
            lun: 1,
            chap: Some(("user".into(), "s3cr3tSECRET".into())),
        };
        assert!(!format!("{t:?}").contains("s3cr3tSECRET"));
    }
}

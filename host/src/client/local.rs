//! `berth local-attach` and `berth local-detach`: attach a volume to the machine the command runs
//! on, without an orchestrator (the seed `003_*`; python-brick-cinderclient-ext's commands).
//!
//! local-attach: create the attachment with this machine's connector, connect what the
//! connection info names (iSCSI: discovery, CHAP, login, wait for the device; RBD: map the image
//! with rbd-nbd or the kernel's RBD driver, `rbd.rs`), complete the attachment, print the device.
//! On any failure the steps already done are undone in reverse order, so no reservation, session,
//! node record or mapping is left behind.
//!
//! local-detach: disconnect (flush, then logout and node delete, or unmap), then delete the
//! attachment.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value as Json, json};

use super::api::Endpoint;
use super::connector::{ConnectorOptions, connector};
use super::error::ClientError;
use super::iscsi::{Iscsiadm, Target, wait_for_device};
use super::rbd::{Image, Mapper};

/// How this machine connects targets.
#[derive(Debug, Clone, clap::Args)]
pub struct InitiatorOptions {
    /// Seconds to wait for the device to appear after login.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Where udev links iSCSI devices by path.
    #[arg(long, default_value = "/dev/disk/by-path", hide = true)]
    pub device_dir: PathBuf,
    /// Where `/sys` is found, for the kernel modules RBD needs (tests).
    #[arg(long, default_value = "/", hide = true)]
    pub sys_root: PathBuf,
}

/// The tools of this machine, looked for when a volume needs them: an RBD volume needs no
/// iscsiadm, an iSCSI one no rbd-nbd.
pub struct Tools {
    iscsiadm: Result<Iscsiadm, ClientError>,
}

impl Tools {
    pub fn find() -> Tools {
        Tools { iscsiadm: Iscsiadm::find(ISCSIADM_TIMEOUT) }
    }

    fn iscsiadm(&self) -> Result<&Iscsiadm, ClientError> {
        self.iscsiadm.as_ref().map_err(|e| ClientError::Tools(e.to_string()))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct AttachArgs {
    /// The volume to attach.
    pub volume_id: String,
    /// Where the volume will be mounted (recorded in the attachment).
    #[arg(long)]
    pub mountpoint: Option<String>,
    /// Access mode (the API's `mode`, microversion 3.54).
    #[arg(long, value_parser = ["rw", "ro"])]
    pub mode: Option<String>,
    /// The host name to record in the connector (default: this machine's).
    #[arg(long)]
    pub hostname: Option<String>,
    /// Print the device information as JSON instead of the device path.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connector: ConnectorOptions,
    #[command(flatten)]
    pub initiator: InitiatorOptions,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DetachArgs {
    /// The volume to detach.
    pub volume_id: String,
    /// The attachment to remove; needed only when the volume has several.
    #[arg(long)]
    pub attachment_id: Option<String>,
    /// What local-attach printed with --json (its `path` is flushed before logout).
    #[arg(long)]
    pub device_info: Option<String>,
    /// Accepted for compatibility with brick-ext; every path of the attachment is disconnected.
    #[arg(long)]
    pub multipath: bool,
    /// Accepted for compatibility with brick-ext.
    #[arg(long)]
    pub enforce_multipath: bool,
    #[command(flatten)]
    pub initiator: InitiatorOptions,
}

/// Refuses to start what would fail halfway for lack of privileges.
pub fn require_root(command: &str) -> Result<(), ClientError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(ClientError::Tools(format!(
            "{command} must run as root: it changes the kernel's iSCSI sessions or block devices"
        )));
    }
    Ok(())
}

/// A step to undo, in reverse order of doing.
enum Undo {
    DeleteAttachment(String),
    DeleteNode(Target),
    Logout(Target),
    Unmap(Mapper, PathBuf),
}

/// The command's iscsiadm timeout: a login may retry for a while.
const ISCSIADM_TIMEOUT: Duration = Duration::from_secs(120);

/// Attaches the volume; returns the device information (`path`, `paths`, `type`, ids).
pub async fn local_attach(api: &Endpoint, tools: &Tools, args: &AttachArgs) -> Result<Json, ClientError> {
    let mut c = connector(&args.connector, args.hostname.as_deref())?;
    if let Some(m) = &args.mountpoint {
        c.insert("mountpoint".into(), json!(m));
    }
    if let Some(mode) = &args.mode {
        c.insert("mode".into(), json!(mode));
    }
    let mut undo = Vec::new();
    match attach_steps(api, tools, args, &c, &mut undo).await {
        Ok(info) => Ok(info),
        Err(error) => {
            let mut failed = Vec::new();
            for step in undo.into_iter().rev() {
                let result = match &step {
                    Undo::Logout(t) => match tools.iscsiadm() {
                        Ok(iscsi) => iscsi.logout(t).await,
                        Err(e) => Err(e),
                    },
                    Undo::DeleteNode(t) => match tools.iscsiadm() {
                        Ok(iscsi) => iscsi.delete_node(t).await,
                        Err(e) => Err(e),
                    },
                    Undo::Unmap(mapper, device) => mapper.unmap(device).await,
                    Undo::DeleteAttachment(id) => api.delete_attachment(id).await,
                };
                if let Err(e) = result {
                    failed.push(e.to_string());
                }
            }
            if failed.is_empty() {
                Err(error)
            } else {
                let also = format!("; undoing it failed too: {}", failed.join("; "));
                Err(match error {
                    ClientError::Connect(m) => ClientError::Connect(m + &also),
                    ClientError::Api(m) => ClientError::Api(m + &also),
                    other => other.context(&also),
                })
            }
        }
    }
}

async fn attach_steps(
    api: &Endpoint,
    tools: &Tools,
    args: &AttachArgs,
    connector: &serde_json::Map<String, Json>,
    undo: &mut Vec<Undo>,
) -> Result<Json, ClientError> {
    let no_initiator = || {
        ClientError::Tools(format!(
            "this machine has no iSCSI initiator name ({} is missing or empty): install open-iscsi",
            args.connector.initiator_name_file.display()
        ))
    };
    let attachment = match api.create_attachment(&args.volume_id, connector, args.mode.as_deref()).await {
        // A driver that needs an initiator refuses a connector without one.
        Err(ClientError::Api(m)) if !connector.contains_key("initiator") && m.contains("initiator") => {
            return Err(no_initiator());
        }
        other => other?,
    };
    let id = attachment["id"]
        .as_str()
        .ok_or_else(|| ClientError::Api("the attachment in the answer has no id".into()))?
        .to_string();
    undo.push(Undo::DeleteAttachment(id.clone()));
    let info = &attachment["connection_info"];
    let protocol = info["driver_volume_type"].as_str().unwrap_or("(none)").to_ascii_lowercase();
    match protocol.as_str() {
        "iscsi" => {}
        "rbd" => {
            let image = Image::from_connection_info(info)?;
            let mapper = Mapper::find(&args.initiator.sys_root)?;
            let read_only = info["access_mode"].as_str() == Some("ro");
            let device = mapper.map(&image, read_only).await?;
            undo.push(Undo::Unmap(mapper, device.clone()));
            api.complete(&id).await?;
            let shown = device.display().to_string();
            return Ok(json!({
                "type": "block",
                "path": shown,
                "paths": [shown],
                "volume_id": args.volume_id,
                "attachment_id": id,
                "name": image.spec,
            }));
        }
        other => {
            return Err(ClientError::Api(format!(
                "volume {} is exported over {other}; berth local-attach connects iscsi and rbd volumes",
                args.volume_id
            )));
        }
    }
    if !connector.contains_key("initiator") {
        return Err(no_initiator());
    }
    let iscsi = tools.iscsiadm()?;
    let targets = Target::from_connection_info(info, args.connector.multipath)?;
    let mut paths = Vec::new();
    let mut last_error = None;
    for t in &targets {
        let connected = async {
            undo.push(Undo::DeleteNode(t.clone()));
            iscsi.discover(t).await?;
            iscsi.set_auth(t).await?;
            undo.push(Undo::Logout(t.clone()));
            iscsi.login(t).await?;
            let path = t.by_path(&args.initiator.device_dir);
            wait_for_device(&path, Duration::from_secs(args.initiator.timeout)).await?;
            Ok::<_, ClientError>(path)
        }
        .await;
        match connected {
            Ok(path) => paths.push(path),
            // One path of several may fail, unless every path is required.
            Err(e) if targets.len() > 1 && !args.connector.enforce_multipath => last_error = Some(e),
            Err(e) => return Err(e),
        }
    }
    if paths.is_empty() {
        return Err(last_error.unwrap_or_else(|| ClientError::Connect("no path could be connected".into())));
    }
    api.complete(&id).await?;
    let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    Ok(json!({
        "type": "block",
        "path": shown[0],
        "paths": shown,
        "volume_id": args.volume_id,
        "attachment_id": id,
        "target_iqn": targets[0].iqn,
    }))
}

/// Detaches the volume: disconnects every path of its attachment, then deletes it.
pub async fn local_detach(api: &Endpoint, tools: &Tools, args: &DetachArgs) -> Result<String, ClientError> {
    let id = match &args.attachment_id {
        Some(id) => id.clone(),
        None => {
            let listed = api.attachments_of(&args.volume_id).await?;
            match listed.as_slice() {
                [] => {
                    api.volume(&args.volume_id).await?;
                    return Err(ClientError::NotFound(format!(
                        "volume {} has no attachments",
                        args.volume_id
                    )));
                }
                [one] => one["id"].as_str().unwrap_or_default().to_string(),
                several => {
                    let ids: Vec<&str> = several.iter().filter_map(|a| a["id"].as_str()).collect();
                    return Err(ClientError::Busy(format!(
                        "volume {} has {} attachments ({}): pass --attachment-id",
                        args.volume_id,
                        ids.len(),
                        ids.join(", ")
                    )));
                }
            }
        }
    };
    let attachment = api.attachment(&id).await?;
    if attachment["volume_id"].as_str() != Some(args.volume_id.as_str()) {
        return Err(ClientError::Usage(format!(
            "attachment {id} belongs to volume {}, not {}",
            attachment["volume_id"].as_str().unwrap_or("?"),
            args.volume_id
        )));
    }
    let info = &attachment["connection_info"];
    let given = match &args.device_info {
        Some(text) => {
            let v: Json = serde_json::from_str(text)
                .map_err(|e| ClientError::Usage(format!("--device-info is not JSON: {e}")))?;
            v["path"].as_str().map(PathBuf::from)
        }
        None => None,
    };
    if info["driver_volume_type"].as_str().is_some_and(|t| t.eq_ignore_ascii_case("rbd")) {
        let image = Image::from_connection_info(info)?;
        let mapper = Mapper::find(&args.initiator.sys_root)?;
        let device = match given {
            Some(device) => Some(device),
            None => mapper.mapped(&image).await?,
        };
        if let Some(device) = device {
            flush(&device)?;
            mapper.unmap(&device).await?;
        }
    } else if info.get("target_iqn").is_some() {
        let iscsi = tools.iscsiadm()?;
        let targets = Target::from_connection_info(info, true)?;
        let devices: Vec<PathBuf> =
            given.into_iter().chain(targets.iter().map(|t| t.by_path(&args.initiator.device_dir))).collect();
        for device in &devices {
            flush(device)?;
        }
        for t in &targets {
            iscsi.logout(t).await?;
            iscsi.delete_node(t).await?;
        }
    }
    api.delete_attachment(&id).await.map_err(|e| {
        e.context(&format!(
            "the volume is disconnected from this machine, but attachment {id} could not be deleted \
             (run local-detach again)"
        ))
    })?;
    Ok(id)
}

/// Writes a block device's dirty buffers out before its session goes away.
fn flush(device: &std::path::Path) -> Result<(), ClientError> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::metadata(device) else { return Ok(()) };
    if !meta.file_type().is_block_device() {
        return Ok(());
    }
    std::fs::File::open(device)
        .and_then(|f| f.sync_all())
        .map_err(|e| ClientError::Connect(format!("cannot flush {}: {e}", device.display())))
}

//! Stand-ins for the kernel initiator's tools, which CI machines cannot run (no kernel modules):
//! small scripts put first on `PATH` that record every command line they are given. What they
//! were told (target, portal, CHAP credentials) is then checked for real with libiscsi.

use std::path::{Path, PathBuf};

/// A directory of stand-in tools and the log they append to, one command line per line.
pub struct StandIns {
    pub bin: PathBuf,
    pub log: PathBuf,
    pub devices: PathBuf,
    _dir: tempfile::TempDir,
}

fn script(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

impl StandIns {
    fn new() -> StandIns {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let devices = dir.path().join("by-path");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&devices).unwrap();
        let log = dir.path().join("iscsiadm.log");
        std::fs::write(&log, "").unwrap();
        StandIns { bin, log, devices, _dir: dir }
    }

    /// An `iscsiadm` for `berth local-attach`: `--login` makes the LUN 1 device appear in
    /// `devices` (as udev would) and `--logout` removes it. A command line containing
    /// `$ISCSIADM_FAIL` fails with status 8; `ISCSIADM_NO_DEVICE=1` keeps the device from appearing;
    /// `ISCSIADM_ON_LOGIN` is a shell command run after a login.
    pub fn for_berth() -> StandIns {
        let s = StandIns::new();
        script(
            &s.bin.join("iscsiadm"),
            &format!(
                r#"line="$*"
printf '%s\n' "$line" >> '{log}'
if [ -n "$ISCSIADM_FAIL" ]; then
  case "$line" in *"$ISCSIADM_FAIL"*) echo "iscsiadm: stand-in failure" >&2; exit 8;; esac
fi
iqn=; portal=
while [ $# -gt 0 ]; do
  case "$1" in -T) iqn=$2; shift;; -p) portal=$2; shift;; esac
  shift
done
dev="{devices}/ip-$portal-iscsi-$iqn-lun-1"
case "$line" in
  *--login*) [ "$ISCSIADM_NO_DEVICE" = 1 ] || : > "$dev"; [ -z "$ISCSIADM_ON_LOGIN" ] || sh -c "$ISCSIADM_ON_LOGIN";;
  *--logout*) rm -f "$dev";;
esac
exit 0
"#,
                log = s.log.display(),
                devices = s.devices.display()
            ),
        );
        s
    }

    /// The tools os-brick runs, for python-brick-cinderclient-ext: `sudo` (runs the command),
    /// `cat` (answers `InitiatorName=<initiator>` for open-iscsi's file), and an `iscsiadm` that
    /// refuses `--login`, since this machine has no kernel initiator: the flow stops there.
    pub fn for_os_brick(initiator: &str) -> StandIns {
        let s = StandIns::new();
        script(&s.bin.join("sudo"), "exec \"$@\"\n");
        script(
            &s.bin.join("cat"),
            &format!(
                "if [ \"$1\" = /etc/iscsi/initiatorname.iscsi ]; then echo 'InitiatorName={initiator}'; exit 0; fi\nexec /bin/cat \"$@\"\n"
            ),
        );
        script(
            &s.bin.join("iscsiadm"),
            &format!(
                r#"printf '%s\n' "$*" >> '{log}'
case "$*" in
  *--login*) echo "iscsiadm: no kernel iSCSI initiator on this machine (stand-in)" >&2; exit 12;;
  *"-m session"*) echo "iscsiadm: No active sessions." >&2; exit 21;;
esac
exit 0
"#,
                log = s.log.display()
            ),
        );
        s
    }

    /// `PATH` with the stand-ins first.
    pub fn path(&self) -> String {
        format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default())
    }

    /// Every command line recorded so far.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log).unwrap().lines().map(str::to_string).collect()
    }

    /// The value given to `-n <name> -v <value>` in the last matching call.
    pub fn setting(&self, name: &str) -> Option<String> {
        self.calls().iter().rev().find_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            let at = words.windows(2).position(|w| w[0] == "-n" && w[1] == name)?;
            (words.get(at + 2) == Some(&"-v")).then(|| words.get(at + 3).map(|v| v.to_string())).flatten()
        })
    }
}

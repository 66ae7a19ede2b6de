//! Where the kept targets are written down (`state_file`), so that a restarted Berth still knows
//! which inert targets it kept: a journal, one line appended per change (`+<tid> <iqn>` when a
//! target is kept, `-<iqn>` when it no longer is), so that a detach costs one small write however
//! many targets are kept (rewriting the whole list cost a file and a rename per detach, and grew
//! with the list). Rewritten whole, atomically, when it holds many more lines than kept targets.
//! Not synced: a line lost in a power failure only leaves an inert target that the drift report
//! names, or names one that was taken back since, which the first listing ignores (it keeps only
//! targets that are still inert, with the same id). A file of the earlier format (one JSON map)
//! is read too.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub(super) struct KeptJournal {
    path: Option<PathBuf>,
    /// The file, open for appending, and the lines appended since it was last written whole.
    file: Mutex<(Option<std::fs::File>, usize)>,
}

/// Lines beyond the kept targets' number before the journal is written whole again.
const SLACK: usize = 1024;

impl KeptJournal {
    pub(super) fn new(path: Option<PathBuf>) -> KeptJournal {
        KeptJournal { path, file: Mutex::new((None, 0)) }
    }

    /// The kept targets the journal names: iqn and tid.
    pub(super) fn load(&self) -> Vec<(String, u32)> {
        let Some(path) = &self.path else { return Vec::new() };
        let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
        if let Ok(map) = serde_json::from_str::<HashMap<String, u32>>(&text) {
            return map.into_iter().collect();
        }
        let mut kept: HashMap<String, u32> = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix('+') {
                if let Some((tid, iqn)) = rest.split_once(' ')
                    && let Ok(tid) = tid.parse()
                {
                    kept.insert(iqn.to_string(), tid);
                }
            } else if let Some(iqn) = line.strip_prefix('-') {
                kept.remove(iqn);
            }
        }
        kept.into_iter().collect()
    }

    /// `iqn` is kept now (`Some(tid)`), or no longer (`None`); `kept` targets are kept in all,
    /// which `all` lists when the journal is written whole.
    pub(super) fn note(
        &self,
        iqn: &str,
        tid: Option<u32>,
        kept: usize,
        all: impl FnOnce() -> Vec<(String, u32)>,
    ) {
        let Some(path) = &self.path else { return };
        let line = match tid {
            Some(tid) => format!("+{tid} {iqn}\n"),
            None => format!("-{iqn}\n"),
        };
        let mut file = super::guard(&self.file);
        let (handle, lines) = &mut *file;
        let result = if handle.is_none() || *lines > kept * 2 + SLACK {
            rewrite(path, &all()).map(|f| {
                *handle = Some(f);
                *lines = 0;
            })
        } else {
            let f = handle.as_mut().expect("checked above");
            f.write_all(line.as_bytes()).map(|()| *lines += 1)
        };
        if let Err(e) = result {
            *handle = None;
            tracing::warn!("cannot write {}: {e}", path.display());
        }
    }
}

/// Writes the journal whole (atomically) and opens it for appending.
fn rewrite(path: &Path, all: &[(String, u32)]) -> std::io::Result<std::fs::File> {
    let tmp = path.with_extension("tmp");
    let mut text = String::new();
    for (iqn, tid) in all {
        text.push_str(&format!("+{tid} {iqn}\n"));
    }
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    std::fs::OpenOptions::new().append(true).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_replays_to_the_kept_targets_and_is_rewritten_when_long() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kept.json");
        let journal = KeptJournal::new(Some(path.clone()));
        let mut kept: HashMap<String, u32> = HashMap::new();
        let mut note = |iqn: &str, tid: Option<u32>| {
            match tid {
                Some(t) => kept.insert(iqn.to_string(), t),
                None => kept.remove(iqn),
            };
            let all: Vec<(String, u32)> = kept.iter().map(|(i, t)| (i.clone(), *t)).collect();
            journal.note(iqn, tid, all.len(), || all);
        };
        for round in 0..2000u32 {
            note(&format!("iqn.2010-10.org.openstack:v-{}", round % 7), Some(round % 7 + 1));
            if round % 3 == 0 {
                note(&format!("iqn.2010-10.org.openstack:v-{}", round % 5), None);
            }
        }
        let mut loaded = KeptJournal::new(Some(path.clone())).load();
        loaded.sort();
        let mut expected: Vec<(String, u32)> = kept.into_iter().collect();
        expected.sort();
        assert_eq!(loaded, expected);
        let lines = std::fs::read_to_string(&path).unwrap().lines().count();
        assert!(lines <= 2 * expected.len() + SLACK + 1, "{lines} lines: written whole again");

        // A torn last line (a crash mid-write) loses nothing before it (what it names, the first
        // listing finds no bare target of); the earlier format is read.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"-iqn.2010-1").unwrap();
        let mut loaded = KeptJournal::new(Some(path.clone())).load();
        loaded.sort();
        assert_eq!(loaded, expected);
        std::fs::write(&path, r#"{"iqn.2010-10.org.openstack:old":4}"#).unwrap();
        assert_eq!(
            KeptJournal::new(Some(path)).load(),
            vec![("iqn.2010-10.org.openstack:old".to_string(), 4)]
        );
    }
}

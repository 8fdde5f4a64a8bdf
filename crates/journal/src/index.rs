//! The run index: one small file per run under `<state-dir>/index/<run-id>`, so that listing
//! runs never opens a journal.
//!
//! Each file is a few `key=value` lines (values escaped: `\\`, `\n`, `\r`), written atomically
//! (temp file, fsync, rename). The index is a cache of what the journals say: the runner
//! updates it at each status change, and a journal stays the source of truth.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sortie_core::{RunId, Timestamp};

use crate::{Error, Result, create_private_dir};

/// What the index knows about one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEntry {
    /// The run.
    pub run_id: RunId,
    /// When it was created.
    pub created: Timestamp,
    /// Where its batch came from (a file path or a description).
    pub source: String,
    /// How many tasks it has.
    pub tasks: u32,
    /// Its status, as the runner last wrote it (e.g. `running`, `interrupted`, `completed`).
    pub status: String,
    /// The pid of the process that last owned it.
    pub pid: u32,
    /// When this entry was last written.
    pub updated: Timestamp,
}

/// The index directory of a state dir.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("index")
}

/// The index file of a run.
pub fn path(state_dir: &Path, run: &RunId) -> PathBuf {
    dir(state_dir).join(run.as_str())
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

impl RunEntry {
    fn render(&self) -> String {
        format!(
            "run_id={}\ncreated={}\nsource={}\ntasks={}\nstatus={}\npid={}\nupdated={}\n",
            self.run_id,
            self.created.0,
            escape(&self.source),
            self.tasks,
            escape(&self.status),
            self.pid,
            self.updated.0,
        )
    }

    fn parse(text: &str) -> std::result::Result<RunEntry, String> {
        let mut run_id = None;
        let (mut created, mut updated, mut tasks, mut pid) = (None, None, None, None);
        let (mut source, mut status) = (None, None);
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                return Err(format!("line {line:?} is not key=value"));
            };
            let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{k}: {e}"));
            match k {
                "run_id" => run_id = Some(RunId::new(v).map_err(|e| e.to_string())?),
                "created" => created = Some(Timestamp(num(v)?)),
                "updated" => updated = Some(Timestamp(num(v)?)),
                "source" => source = Some(unescape(v)),
                "status" => status = Some(unescape(v)),
                "tasks" => tasks = Some(v.parse::<u32>().map_err(|e| format!("{k}: {e}"))?),
                "pid" => pid = Some(v.parse::<u32>().map_err(|e| format!("{k}: {e}"))?),
                _ => {} // a later version's field
            }
        }
        let missing = |k: &str| format!("{k} is missing");
        Ok(RunEntry {
            run_id: run_id.ok_or_else(|| missing("run_id"))?,
            created: created.ok_or_else(|| missing("created"))?,
            source: source.unwrap_or_default(),
            tasks: tasks.unwrap_or(0),
            status: status.unwrap_or_default(),
            pid: pid.unwrap_or(0),
            updated: updated.or(created).unwrap_or_default(),
        })
    }
}

/// Writes (creates or replaces) a run's entry atomically.
pub fn write(state_dir: &Path, entry: &RunEntry) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = dir(state_dir);
    create_private_dir(&dir)?;
    let target = path(state_dir, &entry.run_id);
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        entry.run_id,
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(entry.render().as_bytes()).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        fs::rename(&tmp, &target).map_err(io(&target))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    if let Ok(d) = fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads a run's entry; `Error::NotFound` when the run has none.
pub fn read(state_dir: &Path, run: &RunId) -> Result<RunEntry> {
    let p = path(state_dir, run);
    let text = match fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::NotFound { path: p });
        }
        Err(source) => return Err(Error::Io { path: p, source }),
    };
    RunEntry::parse(&text).map_err(|reason| Error::BadIndex { path: p, reason })
}

/// Changes a run's entry with `f` (which may set `updated`) and writes it back atomically.
pub fn update(state_dir: &Path, run: &RunId, f: impl FnOnce(&mut RunEntry)) -> Result<RunEntry> {
    let mut entry = read(state_dir, run)?;
    f(&mut entry);
    write(state_dir, &entry)?;
    Ok(entry)
}

/// Every run in the index, newest first (by creation time, then id). Unreadable entries are
/// skipped with a warning, so that one damaged file does not hide every run.
pub fn list(state_dir: &Path) -> Result<Vec<RunEntry>> {
    let dir = dir(state_dir);
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Error::Io { path: dir, source }),
    };
    let mut runs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(run) = RunId::new(name) else { continue }; // temp files start with '.'
        match read(state_dir, &run) {
            Ok(e) => runs.push(e),
            Err(Error::NotFound { .. }) => {} // removed meanwhile
            Err(e) => tracing::warn!("skipping index entry {name}: {e}"),
        }
    }
    runs.sort_by(|a, b| {
        b.created
            .cmp(&a.created)
            .then_with(|| b.run_id.cmp(&a.run_id))
    });
    Ok(runs)
}

/// Removes a run's entry (no error when it has none).
pub fn remove(state_dir: &Path, run: &RunId) -> Result<()> {
    let p = path(state_dir, run);
    match fs::remove_file(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(Error::Io { path: p, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, created: u64) -> RunEntry {
        RunEntry {
            run_id: RunId::new(id).unwrap(),
            created: Timestamp(created),
            source: "batch\\ with\nnewline.toml".into(),
            tasks: 3,
            status: "running".into(),
            pid: 42,
            updated: Timestamp(created + 1),
        }
    }

    #[test]
    fn writes_reads_updates_and_lists_newest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path();
        assert!(list(state).unwrap().is_empty());
        write(state, &entry("old", 1)).unwrap();
        write(state, &entry("new", 5)).unwrap();
        assert_eq!(
            read(state, &RunId::new("old").unwrap()).unwrap(),
            entry("old", 1)
        );
        let updated = update(state, &RunId::new("old").unwrap(), |e| {
            e.status = "completed".into();
        })
        .unwrap();
        assert_eq!(updated.status, "completed");
        fs::write(dir(state).join("broken"), "nonsense").unwrap();
        let ids: Vec<_> = list(state).unwrap().into_iter().map(|e| e.run_id).collect();
        assert_eq!(
            ids,
            vec![RunId::new("new").unwrap(), RunId::new("old").unwrap()]
        );
        assert!(matches!(
            read(state, &RunId::new("missing").unwrap()),
            Err(Error::NotFound { .. })
        ));
        remove(state, &RunId::new("new").unwrap()).unwrap();
        assert_eq!(list(state).unwrap().len(), 1);
    }
}

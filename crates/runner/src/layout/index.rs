//! The run index: one small JSON file per run under `<state-dir>/index/<run-id>`, so that
//! listing runs never opens a journal.
//!
//! Each file is written atomically (temp file, fsync, rename). The index is a cache of what the
//! journals say: the runner updates it at each status change, and a journal stays the source of
//! truth. An entry that cannot be read (damaged, or written by an older sortie in another
//! format) is rebuilt from its run's journal when the runs are listed.

use std::fs;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sortie_core::{RunId, RunOutcome, RunState, RunStatus, Timestamp};
use sortie_journal::Mark;

use super::StateDir;
use crate::{Error, Result};

/// Where a run stands, as the index last heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IndexStatus {
    /// A process owns the run (or owned it when it died).
    Running,
    /// Stopped on purpose, resumable.
    Interrupted,
    /// Ended with this outcome.
    Finished(RunOutcome),
}

impl IndexStatus {
    /// The status of a run in `state`.
    pub fn of(state: &RunState) -> IndexStatus {
        match &state.status {
            RunStatus::Finished { state } => IndexStatus::Finished(*state),
            RunStatus::Interrupted { .. } => IndexStatus::Interrupted,
            RunStatus::NotStarted | RunStatus::Running => IndexStatus::Running,
        }
    }

    /// The word shown for it (`running`, `interrupted`, or the outcome).
    pub fn as_str(self) -> &'static str {
        match self {
            IndexStatus::Running => "running",
            IndexStatus::Interrupted => "interrupted",
            IndexStatus::Finished(o) => o.as_str(),
        }
    }

    /// Whether the run is over (finished, whatever its outcome).
    pub fn is_finished(self) -> bool {
        matches!(self, IndexStatus::Finished(_))
    }
}

impl std::fmt::Display for IndexStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the index knows about one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunEntry {
    /// The run.
    pub run_id: RunId,
    /// When it was created.
    pub created: Timestamp,
    /// Where its batch came from (a file path or a description).
    pub source: String,
    /// How many tasks it has.
    pub tasks: u32,
    /// Its status, as the runner last wrote it.
    pub status: IndexStatus,
    /// The pid of the process that last owned it.
    pub pid: u32,
    /// When this entry was last written.
    pub updated: Timestamp,
    /// The journal's acknowledged high-water mark, as its owner last wrote it (a copy of the
    /// mark beside the journal, kept here too so that losing one does not hide damage).
    #[serde(default)]
    pub acked: Option<Mark>,
    /// Why the journal is damaged, once a command found it so (`list` says so without opening
    /// the journal).
    #[serde(default)]
    pub damaged: Option<String>,
    /// The run this one reruns (`sortie rerun`), for `list`'s lineage.
    #[serde(default)]
    pub parent: Option<RunId>,
    /// #32: how many times `sortie recover` rebuilt its journal (`list` says so).
    #[serde(default)]
    pub recovered: u32,
}

impl RunEntry {
    /// The entry of a run as its replayed journal describes it.
    pub fn from_state(run_id: RunId, state: &RunState, updated: Timestamp) -> RunEntry {
        RunEntry {
            run_id,
            created: state.started_at.unwrap_or(updated),
            source: state
                .batch
                .as_ref()
                .map(|b| b.source.clone())
                .unwrap_or_default(),
            tasks: state.tasks.len() as u32,
            status: IndexStatus::of(state),
            pid: state.pid,
            updated,
            acked: None,
            damaged: None,
            parent: state.parent.clone(),
            recovered: state.recovered.len() as u32,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a run's entry atomically.
pub fn write(state_dir: &StateDir, entry: &RunEntry) -> Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = state_dir.index();
    super::private_dir(&dir)?;
    let target = dir.join(entry.run_id.as_str());
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        entry.run_id,
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let bytes = serde_json::to_vec(entry).map_err(|e| Error::Io {
        path: target.clone(),
        source: std::io::Error::other(e),
    })?;
    let result = (|| {
        let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(&bytes).map_err(io(&tmp))?;
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

/// Creates a new run's entry, before its first event.
pub fn create(state_dir: &StateDir, run: &RunId, source: &str, now: Timestamp) -> Result<()> {
    let entry = RunEntry {
        run_id: run.clone(),
        created: now,
        source: source.to_owned(),
        tasks: 0,
        status: IndexStatus::Running,
        pid: std::process::id(),
        updated: now,
        acked: None,
        damaged: None,
        parent: None,
        recovered: 0,
    };
    write(state_dir, &entry)
}

/// Brings a run's entry up to date with its state and its journal's high-water mark, as owned
/// by this process.
pub fn record(
    state_dir: &StateDir,
    run: &RunId,
    state: &RunState,
    acked: Option<Mark>,
    now: Timestamp,
) -> Result<()> {
    let fresh = || RunEntry::from_state(run.clone(), state, now);
    update(state_dir, run, fresh, |e| {
        e.status = IndexStatus::of(state);
        e.tasks = state.tasks.len() as u32;
        e.pid = std::process::id();
        e.updated = now;
        e.parent = state.parent.clone();
        e.recovered = state.recovered.len() as u32;
        if acked.is_some() {
            e.acked = acked;
        }
    })
    .map(drop)
}

/// Records that a run's journal is damaged, and why (a command that opened it found out).
/// An entry that cannot be read is left alone: `list` rebuilds it from the journal, which fails
/// with the same words.
pub fn record_damage(state_dir: &StateDir, run: &RunId, why: &str) -> Result<()> {
    match read(state_dir, run) {
        Ok(Some(mut e)) if e.damaged.as_deref() != Some(why) => {
            e.damaged = Some(why.to_owned());
            write(state_dir, &e)
        }
        _ => Ok(()),
    }
}

/// Forgets a run's recorded damage (its journal opened whole after all, or was recovered).
pub fn clear_damage(state_dir: &StateDir, run: &RunId) -> Result<()> {
    match read(state_dir, run) {
        Ok(Some(mut e)) if e.damaged.is_some() => {
            e.damaged = None;
            write(state_dir, &e)
        }
        _ => Ok(()),
    }
}

/// The high-water mark the index holds for a run, if it can be read.
pub fn acked(state_dir: &StateDir, run: &RunId) -> Option<Mark> {
    read(state_dir, run).ok().flatten().and_then(|e| e.acked)
}

/// Reads a run's entry; `None` when the run has none.
pub fn read(state_dir: &StateDir, run: &RunId) -> Result<Option<RunEntry>> {
    let p = state_dir.index().join(run.as_str());
    let bytes = match fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path: p, source }),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Io {
            path: p,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        })
}

/// Changes a run's entry with `f` and writes it back atomically; an entry that is missing or
/// unreadable starts over from `fresh`.
pub fn update(
    state_dir: &StateDir,
    run: &RunId,
    fresh: impl FnOnce() -> RunEntry,
    f: impl FnOnce(&mut RunEntry),
) -> Result<RunEntry> {
    let mut entry = match read(state_dir, run) {
        Ok(Some(e)) => e,
        Ok(None) | Err(_) => fresh(),
    };
    f(&mut entry);
    write(state_dir, &entry)?;
    Ok(entry)
}

/// Every run in the index, newest first (by creation time, then id). An entry that cannot be
/// read is rebuilt from its run's journal (and written back), and so is a run dir with a
/// journal and no entry; one whose journal cannot be read either is skipped with a warning, so
/// that one damaged run does not hide the others.
pub fn list(state_dir: &StateDir) -> Result<Vec<RunEntry>> {
    let dir = state_dir.index();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => Some(e),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(Error::Io { path: dir, source }),
    };
    let mut runs = Vec::new();
    for entry in entries.into_iter().flatten() {
        let entry = entry.map_err(io(&dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(run) = RunId::new(name) else { continue }; // temp files start with '.'
        match read(state_dir, &run) {
            Ok(Some(e)) => runs.push(e),
            Ok(None) => {} // removed meanwhile
            Err(e) => match rebuild(state_dir, &run) {
                Ok(rebuilt) => runs.push(rebuilt),
                Err(again) => tracing::warn!("skipping index entry {name}: {e}; {again}"),
            },
        }
    }
    // A run whose index file was lost (deleted, or never written past a crash) while its
    // journal is there: rebuilt from the journal, as `status` reads it.
    for run in unindexed(state_dir, &runs)? {
        match rebuild(state_dir, &run) {
            Ok(rebuilt) => runs.push(rebuilt),
            Err(e) => tracing::warn!("run {run} has no index entry and its journal: {e}"),
        }
    }
    runs.sort_by(|a, b| {
        b.created
            .cmp(&a.created)
            .then_with(|| b.run_id.cmp(&a.run_id))
    });
    Ok(runs)
}

/// The runs under `<state-dir>/runs/` that hold a journal and are not in `listed`.
fn unindexed(state_dir: &StateDir, listed: &[RunEntry]) -> Result<Vec<RunId>> {
    let dir = state_dir.runs();
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(Error::Io { path: dir, source }),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(&dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Ok(run) = RunId::new(name) else { continue };
        if listed.iter().any(|e| e.run_id == run) || !state_dir.run(&run).journal().exists() {
            continue;
        }
        found.push(run);
    }
    Ok(found)
}

/// A run's entry from its journal, written back to the index.
fn rebuild(state_dir: &StateDir, run: &RunId) -> Result<RunEntry> {
    let journal = sortie_journal::Journal::open_read_only(state_dir.run(run).path())?;
    let state = journal.replay_latest()?;
    let entry = RunEntry::from_state(run.clone(), &state, state.last_at.unwrap_or_default());
    write(state_dir, &entry)?;
    Ok(entry)
}

/// Removes a run's entry (no error when it has none).
pub fn remove(state_dir: &StateDir, run: &RunId) -> Result<()> {
    let p = state_dir.index().join(run.as_str());
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
            status: IndexStatus::Running,
            pid: 42,
            updated: Timestamp(created + 1),
            acked: None,
            damaged: None,
            parent: None,
            recovered: 0,
        }
    }

    #[test]
    fn writes_reads_updates_and_lists_newest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::new(tmp.path());
        assert!(list(&state).unwrap().is_empty());
        write(&state, &entry("old", 1)).unwrap();
        write(&state, &entry("new", 5)).unwrap();
        let old = RunId::new("old").unwrap();
        assert_eq!(read(&state, &old).unwrap(), Some(entry("old", 1)));
        let updated = update(
            &state,
            &old,
            || entry("old", 1),
            |e| e.status = IndexStatus::Finished(RunOutcome::Partial),
        )
        .unwrap();
        assert_eq!(updated.status.as_str(), "partial");
        assert!(updated.status.is_finished());
        let ids: Vec<_> = list(&state)
            .unwrap()
            .into_iter()
            .map(|e| e.run_id)
            .collect();
        assert_eq!(ids, vec![RunId::new("new").unwrap(), old.clone()]);
        assert_eq!(read(&state, &RunId::new("missing").unwrap()).unwrap(), None);
        remove(&state, &RunId::new("new").unwrap()).unwrap();
        assert_eq!(list(&state).unwrap().len(), 1);
    }

    #[test]
    fn an_unreadable_entry_without_a_journal_is_skipped_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir::new(tmp.path());
        write(&state, &entry("good", 1)).unwrap();
        fs::write(
            state.index().join("broken"),
            "run_id=broken\nstatus=running\n",
        )
        .unwrap();
        let ids: Vec<_> = list(&state)
            .unwrap()
            .into_iter()
            .map(|e| e.run_id)
            .collect();
        assert_eq!(ids, vec![RunId::new("good").unwrap()]);
    }
}

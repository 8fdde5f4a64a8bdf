//! `sortie recover RUN`: a damaged journal becomes a journal `resume` continues, losing nothing
//! more than the damage did.
//!
//! The damaged files are never modified: they are moved aside, whole, to
//! `runs/<id>/damaged/<time>/` (the journal's directory, its high-water mark, its snapshots),
//! and sled never opens them in place (salvage reads a private copy: sled's recovery rewrites a
//! damaged log). A new journal is built from every record that can still be read, in order, with
//! their seqs and times; its high-water mark and a snapshot are written, and
//! `runs/<id>/recovered.json` says what was lost: the seq range, and the tasks whose fate is
//! uncertain. Nothing is appended that the run did not record: attempts that were live in the
//! surviving records (their end lost) are found by `resume`, which records them orphaned and
//! retries them; tasks that finished only in lost records run again.

use std::path::PathBuf;

use serde::Serialize;
use sortie_core::{RunId, RunState, TaskState, Timestamp};
use sortie_journal::{Journal, Salvage};

use crate::clock::now;
use crate::layout::{StateDir, index};
use crate::{Error, Result};

/// What `recover` did.
#[derive(Debug, Clone, Serialize)]
pub struct Recovered {
    /// The run.
    pub run_id: RunId,
    /// How many records the new journal holds (the readable prefix).
    pub kept: u64,
    /// How many records the journal had acknowledged, when its mark says.
    pub acknowledged: Option<u64>,
    /// The lost records (`first..=last`), when known.
    pub lost: Option<(u64, u64)>,
    /// Why reading stopped, if it stopped before the end of what sled gave.
    pub stopped: Option<String>,
    /// Tasks whose end may be lost: an attempt was live in the surviving records (resume
    /// records it orphaned and retries it), or the newest snapshot, taken after records now
    /// lost, says they finished (they run again).
    pub uncertain: Vec<String>,
    /// Where the damaged files are now.
    pub damaged: PathBuf,
}

/// Recovers a run that no process owns (see the module docs).
pub fn recover(state_dir: &StateDir, run_id: &RunId) -> Result<Recovered> {
    let dir = state_dir.run(run_id);
    if !dir.exists() {
        return Err(Error::NoSuchRun(run_id.clone()));
    }
    let _lock = dir.lock()?;
    let salvage = Journal::salvage(dir.path())?;
    // Another run's journal (a backup restored to the wrong run dir) is not this run's to
    // rebuild: its records would show run B's tasks and costs as run A's.
    if let Some(theirs) = salvage.state.run_id.as_ref().filter(|id| *id != run_id) {
        return Err(Error::Journal(sortie_journal::Error::Damaged {
            file: sortie_journal::db_dir(dir.path()),
            message: format!(
                "this journal is run {theirs}'s, not run {run_id}'s (restored to the wrong run \
                 dir?); nothing was changed"
            ),
        }));
    }
    // Nothing readable (a zero-length or garbled log): a journal rebuilt from no record would
    // read as whole and empty, and resume could not go on from it. Refused, the files left.
    if salvage.records.is_empty() {
        return Err(Error::Journal(sortie_journal::Error::Damaged {
            file: sortie_journal::db_dir(dir.path()).join("db"),
            message: "no record of the journal can be read: there is nothing to rebuild the run \
                      from (its files are left as they are)"
                .into(),
        }));
    }
    dir.claim()?;
    let acked = crate::layout::open::acknowledged(state_dir, run_id, salvage.acked);
    let kept = salvage.records.len() as u64;
    let lost = acked.filter(|a| *a > kept).map(|a| (kept, a - 1));
    let uncertain = uncertain(&salvage);

    // Move the damaged files aside, whole.
    let stamp = now().0;
    let aside = dir.damaged(stamp);
    crate::layout::private_dir(&aside)?;
    let run_dir = dir.path();
    let mut moves: Vec<PathBuf> = vec![dir.journal(), sortie_journal::mark_path(run_dir)];
    moves.extend(sortie_journal::snapshot_paths(run_dir));
    for from in moves {
        let Some(name) = from.file_name() else {
            continue;
        };
        let to = aside.join(name);
        match std::fs::rename(&from, &to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path: from, source }),
        }
    }

    let journal = Journal::create(run_dir)?;
    rebuild(&journal, &salvage)?;
    let mark = journal.write_snapshot(&salvage.state)?;
    let report = Recovered {
        run_id: run_id.clone(),
        kept,
        acknowledged: acked,
        lost,
        stopped: salvage.stopped.clone(),
        uncertain,
        damaged: aside,
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| Error::Io {
        path: dir.recovered(),
        source: std::io::Error::other(e),
    })?;
    crate::files::write_atomic(&dir.recovered(), &json, 0o600)?;
    let mut entry = index::RunEntry::from_state(run_id.clone(), &salvage.state, now());
    entry.acked = mark;
    index::write(state_dir, &entry)?;
    Ok(report)
}

/// Appends the salvaged records to the new journal, durably, in big writes.
fn rebuild(journal: &Journal, salvage: &Salvage) -> Result<()> {
    journal.set_durability(sortie_journal::Durability::Sync);
    for chunk in salvage.records.chunks(4096) {
        let events: Vec<(Timestamp, sortie_core::Event)> =
            chunk.iter().map(|s| (s.at, s.event.clone())).collect();
        journal.append_all(&events)?;
    }
    Ok(())
}

/// The tasks whose end may be lost (see [`Recovered::uncertain`]).
fn uncertain(salvage: &Salvage) -> Vec<String> {
    let state: &RunState = &salvage.state;
    let snapshot = salvage
        .snapshot
        .as_ref()
        .filter(|(mark, _)| mark.records > state.next_seq.0)
        .map(|(_, s)| s);
    (0..state.tasks.len())
        .filter(|&i| {
            let here = &state.tasks[i].state;
            let live = matches!(here, TaskState::Running { .. } | TaskState::Ended { .. });
            let finished_later = !here.is_terminal()
                && snapshot
                    .and_then(|s| s.tasks.get(i))
                    .is_some_and(|t| t.state.is_terminal());
            live || finished_later
        })
        .map(|i| state.label(sortie_core::TaskId(i as u32)))
        .collect()
}

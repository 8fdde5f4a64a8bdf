//! Opening a run: the one path every reader and the owner that takes a run over go through.
//!
//! A run's journal is checked against two high-water marks (the one beside it, which the
//! journal checks itself, and the copy the run index holds), and what the open finds is written
//! back to the index: damage recorded (so that `sortie list` says so), or cleared once the
//! journal opens whole again. Readers get a [`RunReader`] on a private copy (what
//! `sortie_journal::Journal::open_read_only` makes, so a live run is never disturbed); an owner
//! that takes a run over gets [`take_over`]'s journal opened in place, checked first on a copy
//! because sled's own open rewrites a damaged log's tail.

use std::thread::JoinHandle;

use sortie_core::{RunId, RunState, Seq, Stamped};
use sortie_journal::{Audit, CheckedReplay, ExportRecord, Journal, Prefetch};

pub use sortie_journal::Closing;

use super::{RunDir, StateDir, index};
use crate::Result;

/// A run opened for reading: its journal's private copy, checked against both marks.
pub struct RunReader {
    journal: Journal,
    /// The newest snapshot's decoding, started before the copy was made.
    prefetch: Option<Prefetch>,
}

impl std::fmt::Debug for RunReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunReader")
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

impl RunReader {
    /// Opens run `run` of `state_dir` for reading (it may be live in another process), checked
    /// against the mark the run index holds; damage found is recorded in the index, and a
    /// journal that opens whole has its recorded damage cleared.
    pub fn open(state_dir: &StateDir, run: &RunId) -> sortie_journal::Result<RunReader> {
        Self::opened(state_dir, run, None)
    }

    /// [`RunReader::open`] for [`RunReader::latest`]: the newest snapshot's decoding starts
    /// before the journal's private copy is made and opened (see `sortie_journal::Prefetch`).
    pub fn open_prefetching(
        state_dir: &StateDir,
        run: &RunId,
    ) -> sortie_journal::Result<RunReader> {
        let prefetch = Prefetch::start(state_dir.run(run).path());
        Self::opened(state_dir, run, Some(prefetch))
    }

    fn opened(
        state_dir: &StateDir,
        run: &RunId,
        prefetch: Option<Prefetch>,
    ) -> sortie_journal::Result<RunReader> {
        let opened = checked_copy(state_dir, run);
        note(state_dir, run, &opened, true);
        Ok(RunReader {
            journal: opened?,
            prefetch,
        })
    }

    /// The run's state after every record, from its newest valid snapshot and the tail.
    pub fn state(&self) -> sortie_journal::Result<RunState> {
        self.journal.replay_latest()
    }

    /// [`RunReader::state`], with the prefetch [`RunReader::open_prefetching`] started; the
    /// journal's copy is then closed (sled's teardown, the copy removed) on a thread of its own
    /// while the caller goes on, until the returned [`Closing`] is dropped.
    pub fn latest(self) -> sortie_journal::Result<(RunState, Closing)> {
        let state = match self.prefetch {
            Some(prefetch) => self.journal.replay_latest_from(prefetch)?,
            None => self.journal.replay_latest()?,
        };
        Ok((state, self.journal.close_beside()))
    }

    /// Every record up to `upto` (None: all) folded from seq 0, with the snapshot's verdict
    /// (see `sortie_journal::Journal::replay_checked`).
    pub fn replay_checked(&self, upto: Option<Seq>) -> sortie_journal::Result<CheckedReplay> {
        self.journal.replay_checked(upto)
    }

    /// The seq the next record would take: one past the journal's last.
    pub fn next_seq(&self) -> Seq {
        self.journal.next_seq()
    }

    /// Every record, each checked; the iterator stops after the first error.
    pub fn events(&self) -> impl Iterator<Item = sortie_journal::Result<Stamped>> + '_ {
        self.journal.read(Seq(0), None)
    }

    /// #35: the records from `from` on (`sortie serve`'s event stream), each checked.
    pub fn events_from(
        &self,
        from: Seq,
    ) -> impl Iterator<Item = sortie_journal::Result<Stamped>> + '_ {
        self.journal.read(from, None)
    }

    /// Every record in the journal's versioned export format (`sortie export`).
    pub fn export(&self) -> impl Iterator<Item = sortie_journal::Result<ExportRecord>> + '_ {
        self.events().map(|r| r.map(|s| ExportRecord::from(&s)))
    }

    /// The whole journal checked (see `sortie_journal::Journal::audit`).
    pub fn audit(&self) -> Audit {
        self.journal.audit()
    }
}

/// The tasks' environment values, one list per task (`RunDir::load_env`).
type Env = Vec<Vec<(String, sortie_batch::EnvValue)>>;

/// A run's journal opened in place by the process that takes the run over, and its state.
#[derive(Debug)]
pub(crate) struct TakenOver {
    /// The journal, open for appends.
    pub(crate) journal: Journal,
    /// The state after every record.
    pub(crate) state: RunState,
    /// The tasks' environment values, read on a thread of their own (see [`TakenOver::env`]).
    env: Option<JoinHandle<Result<Env>>>,
}

impl TakenOver {
    /// The tasks' environment values, one list per task of the state (the ones the file
    /// lacks are empty).
    pub(crate) fn env(&mut self, dir: &RunDir) -> Result<Env> {
        let tasks = self.state.tasks.len();
        let mut env = match self.env.take().map(JoinHandle::join) {
            Some(Ok(loaded)) => loaded?,
            // No thread, or it panicked: read them here.
            _ => dir.load_env(tasks)?,
        };
        env.resize(tasks, Vec::new());
        Ok(env)
    }
}

/// Opens run `dir`'s journal in place for its new owner (the caller holds the run's lock).
///
/// #12: the journal is checked on a private copy (what every reader opens) before sled opens
/// it in place: sled's open rewrites a damaged log's tail, and `recover` must see the bytes the
/// damage left. A journal a command already found damaged is folded from seq 0 (every record
/// read back); otherwise from its newest valid snapshot, and the state found is the one
/// resumed (sled recovers the same bytes alike), so the tail is replayed once. Damage found on
/// the way is recorded in the index; recorded damage is cleared when the copy reads whole.
pub(crate) fn take_over(state_dir: &StateDir, dir: &RunDir) -> Result<TakenOver> {
    let run = dir.id();
    let known_damaged = index::read(state_dir, run)
        .ok()
        .flatten()
        .is_some_and(|e| e.damaged.is_some());
    // From the newest valid snapshot and the records after it: its decoding starts now, while
    // sled opens the copy.
    let prefetch = Prefetch::start(dir.path());
    let checked = checked_copy(state_dir, run).and_then(|journal| {
        let state = if known_damaged {
            journal.replay(None)
        } else {
            journal.replay_latest_from(prefetch)
        }?;
        // The copy is closed (and its files removed) beside the in-place open below.
        Ok((journal.close_beside(), state))
    });
    note(state_dir, run, &checked, known_damaged);
    let (_copy_closing, checked) = checked?;
    // A finished run is refused from the copy: its own files are never opened for writing
    // (sled's open in place would grow its log and write a snapshot).
    if let sortie_core::RunStatus::Finished { state } = checked.status {
        return Err(crate::Error::AlreadyFinished(
            run.clone(),
            state.to_string(),
        ));
    }
    // The environment values (a JSON file of one list per task: ~25 M instructions for
    // 100,000 tasks) are read on a thread of their own while sled opens the journal in place.
    let env = {
        let (dir, tasks) = (dir.clone(), checked.tasks.len());
        std::thread::Builder::new()
            .name("load-env".into())
            .spawn(move || dir.load_env(tasks))
            .ok()
    };
    // A reader (`sortie status`) may hold sled's lock for a moment: the open waits for it.
    // A journal that lost acknowledged records (its mark, beside it or in the index, says so)
    // is refused: appending to it would write over what was lost.
    let opened = Journal::open(dir.path()).and_then(|journal| {
        check_index_mark(state_dir, run, &journal)?;
        // The copy's state, when the files held the same records (nothing writes them while
        // we hold the run's lock); else from the newest valid snapshot and the records after.
        let state = if journal.next_seq() == checked.next_seq {
            checked
        } else {
            journal.replay_latest()?
        };
        Ok((journal, state))
    });
    note(state_dir, run, &opened, false);
    let (journal, state) = opened?;
    Ok(TakenOver {
        journal,
        state,
        env,
    })
}

/// The high-water mark a run acknowledged: the larger of the one beside its journal (which
/// `recover` salvages) and the copy the run index holds.
pub(crate) fn acknowledged(
    state_dir: &StateDir,
    run: &RunId,
    beside: Option<sortie_journal::Mark>,
) -> Option<u64> {
    [beside, index::acked(state_dir, run)]
        .into_iter()
        .flatten()
        .map(|m| m.records)
        .max()
}

/// The journal's private copy, opened and checked against the mark the run index holds (the
/// journal checks the one beside it). Read before the open: a live run's copy holds every
/// record acknowledged before it.
fn checked_copy(state_dir: &StateDir, run: &RunId) -> sortie_journal::Result<Journal> {
    let acked = index::acked(state_dir, run);
    let journal = Journal::open_read_only(state_dir.run(run).path())?;
    if let Some(mark) = acked {
        journal.check_mark(&mark)?;
    }
    Ok(journal)
}

/// Checks `journal` against the mark the run index holds for `run`, if any.
fn check_index_mark(
    state_dir: &StateDir,
    run: &RunId,
    journal: &Journal,
) -> sortie_journal::Result<()> {
    match index::acked(state_dir, run) {
        Some(mark) => journal.check_mark(&mark),
        None => Ok(()),
    }
}

/// Writes what an open found to the run index: damage recorded, or (`clear`) cleared when the
/// open succeeded. The index is a cache of what the journal says: a write that fails is left
/// for the next open.
fn note<T>(state_dir: &StateDir, run: &RunId, opened: &sortie_journal::Result<T>, clear: bool) {
    match opened {
        Err(e) if e.is_damage() => {
            let _ = index::record_damage(state_dir, run, &e.to_string());
        }
        Err(_) => {}
        Ok(_) if clear => {
            let _ = index::clear_damage(state_dir, run);
        }
        Ok(_) => {}
    }
}

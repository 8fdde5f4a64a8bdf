//! #35: the runs `sortie serve` shows, each read through the same path as `sortie status` (a
//! private copy of its journal, `RunReader`), never the owner's files in place. Every run is
//! loaded once, when the server starts (newest first, in the background: [`Runs::preload`]) or
//! on its first request if that comes sooner; requests that arrive during a load wait for it
//! rather than start another. From then on a follower looks at its journal's files every
//! [`TICK`] (a `stat` of each: nothing else while nothing changes) and, when they changed,
//! opens a new copy, reads the records past the ones it has (what is durable), applies them to
//! its state and keeps them, as export JSON, for the event streams.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use sortie_core::{RunId, RunState, Seq};
use sortie_journal::ExportRecord;
use sortie_runner::layout::open::RunReader;
use sortie_runner::layout::{Owner, StateDir};
use tokio::sync::{OnceCell, watch};

/// How often a followed run's files are looked at.
pub(crate) const TICK: Duration = Duration::from_millis(250);
/// How many of the newest records a run keeps for its streams (older ones are read again).
const TAIL: usize = 50_000;

/// A run as of its last reading.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// The run.
    pub(crate) run: RunId,
    /// Its state after its first `next_seq` records.
    pub(crate) state: RunState,
    /// How many records the state folds.
    pub(crate) next_seq: u64,
    /// The owner's pid while a process runs it.
    pub(crate) live_pid: Option<u32>,
    /// The task table's columns (`api::rows`), made once per snapshot.
    pub(crate) rows: OnceLock<Arc<String>>,
}

/// A run's files as the follower saw them: each file's name, length and modification time.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// One run: its latest snapshot (watched by its streams) and its newest records.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) snap: watch::Sender<Arc<Snapshot>>,
    tail: Mutex<Tail>,
}

/// The records from seq `from` on, as export JSON.
#[derive(Debug, Default)]
struct Tail {
    from: u64,
    events: VecDeque<Arc<str>>,
}

/// Every run loaded so far.
#[derive(Debug)]
pub(crate) struct Runs {
    pub(crate) layout: StateDir,
    /// Each run's slot, once loaded (the cell is empty while its first load runs).
    slots: Mutex<HashMap<RunId, Arc<OnceCell<Arc<Slot>>>>>,
}

/// An error a handler turns into an answer: the status and the message.
pub(crate) type Failure = (axum::http::StatusCode, String);

fn failure(e: impl std::fmt::Display) -> Failure {
    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// A lock that a panic elsewhere does not poison.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn live_pid(layout: &StateDir, run: &RunId) -> Option<u32> {
    match layout.run(run).owner() {
        Owner::Live { pid } => Some(pid.unwrap_or(0)),
        Owner::Free => None,
    }
}

fn fingerprint(layout: &StateDir, run: &RunId) -> Fingerprint {
    let dir = layout.run(run);
    let mut files = vec![sortie_journal::mark_path(dir.path())];
    if let Ok(entries) = std::fs::read_dir(sortie_journal::db_dir(dir.path())) {
        files.extend(entries.flatten().map(|e| e.path()));
    }
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let m = std::fs::metadata(&p).ok();
            let len = m.as_ref().map_or(0, std::fs::Metadata::len);
            let at = m.and_then(|m| m.modified().ok());
            (p, len, at)
        })
        .collect()
}

impl Runs {
    pub(crate) fn new(layout: StateDir) -> Arc<Runs> {
        Arc::new(Runs {
            layout,
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// The run named `id` (a whole id), loaded on first use (one load at a time per run:
    /// a request during it waits for it) and followed from then on.
    pub(crate) async fn slot(self: &Arc<Self>, id: &str) -> Result<Arc<Slot>, Failure> {
        let run = RunId::new(id).map_err(|e| (axum::http::StatusCode::NOT_FOUND, e.to_string()))?;
        let known = lock(&self.slots).get(&run).cloned();
        let cell = match known {
            Some(cell) => cell,
            None => {
                if !self.layout.run(&run).exists() {
                    return Err((
                        axum::http::StatusCode::NOT_FOUND,
                        format!("no run {run} in {}", self.layout.root().display()),
                    ));
                }
                lock(&self.slots).entry(run.clone()).or_default().clone()
            }
        };
        cell.get_or_try_init(|| self.load(run)).await.cloned()
    }

    /// A run's first reading (the newest snapshot decoded while its journal is copied, as
    /// `sortie status` reads), then its follower started.
    async fn load(self: &Arc<Self>, run: RunId) -> Result<Arc<Slot>, Failure> {
        let layout = self.layout.clone();
        let r = run.clone();
        // On a task of its own: a request that goes away does not drop a load half done.
        let (snapshot, seen) = tokio::spawn(async move {
            tokio::task::spawn_blocking(move || {
                let seen = fingerprint(&layout, &r);
                let live = live_pid(&layout, &r);
                let reader = RunReader::open_prefetching(&layout, &r).map_err(failure)?;
                let (state, closing) = reader.latest().map_err(failure)?;
                // The copy is removed once the snapshot is served.
                std::thread::spawn(move || drop(closing));
                Ok::<_, Failure>((snap(r, state, live), seen))
            })
            .await
            .map_err(failure)?
        })
        .await
        .map_err(failure)??;
        let from = snapshot.next_seq;
        let slot = Arc::new(Slot {
            snap: watch::channel(Arc::new(snapshot)).0,
            tail: Mutex::new(Tail {
                from,
                events: VecDeque::new(),
            }),
        });
        tokio::spawn(follow(self.layout.clone(), run, slot.clone(), seen));
        Ok(slot)
    }

    /// Loads every run of the index, newest first, one at a time, each made ready by `warm`
    /// (its table's columns): the first visit of a run page then finds it read.
    pub(crate) async fn preload(self: Arc<Self>, warm: fn(&Snapshot)) {
        let layout = self.layout.clone();
        let listed = tokio::task::spawn_blocking(move || {
            if layout.root().exists() {
                sortie_runner::layout::index::list(&layout).unwrap_or_default()
            } else {
                Vec::new()
            }
        })
        .await
        .unwrap_or_default();
        for entry in listed {
            let Ok(slot) = self.slot(entry.run_id.as_str()).await else {
                continue;
            };
            let snap = slot.snap.borrow().clone();
            let _ = tokio::task::spawn_blocking(move || warm(&snap)).await;
        }
    }
}

fn snap(run: RunId, state: RunState, live_pid: Option<u32>) -> Snapshot {
    Snapshot {
        run,
        next_seq: state.next_seq.0,
        state,
        live_pid,
        rows: OnceLock::new(),
    }
}

/// Follows a run's files until the server ends.
async fn follow(layout: StateDir, run: RunId, slot: Arc<Slot>, mut seen: Fingerprint) {
    loop {
        tokio::time::sleep(TICK).await;
        let (l, r) = (layout.clone(), run.clone());
        let looked = tokio::task::spawn_blocking(move || (fingerprint(&l, &r), live_pid(&l, &r)));
        let Ok((now, live)) = looked.await else {
            continue;
        };
        let old = slot.snap.borrow().clone();
        if now == seen && live == old.live_pid {
            continue;
        }
        seen = now;
        let (l, r, s) = (layout.clone(), run.clone(), slot.clone());
        let read = tokio::task::spawn_blocking(move || read_on(&l, &r, &s, &old, live)).await;
        match read {
            Ok(Ok(Some(next))) => {
                slot.snap.send_replace(Arc::new(next));
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::warn!("cannot read run {run} again: {}", e.1),
            Err(e) => tracing::warn!("cannot read run {run} again: {e}"),
        }
    }
}

/// The run's next snapshot from a new copy of its journal: the records past `old`'s applied
/// to its state (a whole replay if one does not apply), and kept in the tail.
fn read_on(
    layout: &StateDir,
    run: &RunId,
    slot: &Slot,
    old: &Snapshot,
    live: Option<u32>,
) -> Result<Option<Snapshot>, Failure> {
    let reader = RunReader::open(layout, run).map_err(failure)?;
    let mut fresh = Vec::new();
    for rec in reader.events_from(Seq(old.next_seq)) {
        fresh.push(rec.map_err(failure)?);
    }
    if fresh.is_empty() && live == old.live_pid {
        return Ok(None);
    }
    let mut state = old.state.clone();
    let mut whole = false;
    for s in &fresh {
        if state.apply(s).is_err() {
            whole = true;
            break;
        }
    }
    if whole {
        state = reader.state().map_err(failure)?;
    }
    {
        let mut tail = lock(&slot.tail);
        for s in &fresh {
            if s.seq.0 != tail.from + tail.events.len() as u64 {
                continue;
            }
            let json = serde_json::to_string(&ExportRecord::from(s)).map_err(failure)?;
            tail.events.push_back(json.into());
        }
        while tail.events.len() > TAIL {
            tail.events.pop_front();
            tail.from += 1;
        }
    }
    Ok(Some(snap(run.clone(), state, live)))
}

impl Slot {
    /// The records `from..to` as export JSON with their seqs: from the tail, and what is older
    /// read again from a new copy of the journal.
    pub(crate) fn events(
        &self,
        layout: &StateDir,
        run: &RunId,
        from: u64,
        to: u64,
    ) -> Result<Vec<(u64, Arc<str>)>, Failure> {
        let mut out = Vec::new();
        let tail_from = lock(&self.tail).from;
        if from < tail_from {
            let reader = RunReader::open(layout, run).map_err(failure)?;
            for rec in reader.events_from(Seq(from)) {
                let s = rec.map_err(failure)?;
                if s.seq.0 >= tail_from.min(to) {
                    break;
                }
                let json = serde_json::to_string(&ExportRecord::from(&s)).map_err(failure)?;
                out.push((s.seq.0, json.into()));
            }
        }
        let tail = lock(&self.tail);
        let start = from.max(tail.from);
        for seq in start..to {
            let Some(json) = tail.events.get((seq - tail.from) as usize) else {
                break;
            };
            out.push((seq, json.clone()));
        }
        Ok(out)
    }
}

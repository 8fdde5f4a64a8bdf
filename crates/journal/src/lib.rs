//! sortie-journal: the append-only, checksummed, durable event log of a run.
//!
//! This crate owns bytes and storage, not rules: it stores `sortie_core::Event`s in order, each
//! with a seq, a timestamp, a format version and a CRC, and folds them through
//! `RunState::apply` for replay and audit. It also keeps the run index ([`index`]), so that
//! listing runs never opens a journal.
//!
//! Layout: one sled database per run in `<state-dir>/runs/<run-id>/journal/` (see [`run_dir`]);
//! the run directory itself is free for the runner's other files. sled lives behind `store`,
//! bincode behind `codec`, and the on-disk schema (`StoredEvent` v1, converted explicitly from
//! and to `core::Event`) in `stored`: each can be swapped without touching the rest. A record is
//! `[version u8][CRC-32 u32][bincode payload: seq, timestamp, StoredEvent]` under the key
//! `seq.to_be_bytes()`.
//!
//! Invariants:
//! - **an append is durable when it returns**: [`Journal::append`] returns only after a flush
//!   that covers its record (see [`Durability`] for what a flush survives). Concurrent appends
//!   share flushes (group commit): whoever finds no flush in progress flushes for everyone who
//!   had inserted when it starts;
//! - seqs are assigned by the journal, dense from 0, and inserted in seq order under one lock,
//!   so sled's recovery after a crash (a prefix of its log) leaves a dense prefix of the
//!   journal. Every read checks that key, stored seq and expected seq agree: a gap or a
//!   mismatch is [`Error::Corrupt`] naming the seq;
//! - reading never panics, whatever the bytes on disk: a bad record is an error naming its seq,
//!   decoding is bounded (no length prefix can make it allocate more than 256 MiB), and
//!   [`Journal::audit`] reports the first bad record;
//! - the journal stores what it is given: the caller (the runner) checks each event with
//!   `RunState::check` before appending it. Replay and audit re-check everything;
//! - one writer per run: a second [`Journal::open`] (from any process) gets
//!   [`Error::Locked`], never a hang.
//!
//! Live reading: sled locks a database against every other open handle, so
//! [`Journal::open_read_only`] first tries a normal open and, when another process holds the run
//! (a live `sortie run`), copies the run's sled files into a private temporary directory (0700)
//! and opens the copy: sled recovers a consistent prefix of its log, so the copy shows the run as
//! of the moment it was taken, every append acknowledged before then included. Snapshot files
//! are copied before the log, and the copy is retried if sled wrote a new snapshot meanwhile.
//! The copy is removed when the handle is dropped. We chose copying over a lock-free reader of
//! sled's files because sled has no read-only mode and its format is not ours to parse; the
//! cost is a file copy (a million-event journal is ~200 MB). A read-only handle on an idle run
//! holds the lock while it lives, so commands keep such handles short-lived.
//!
//! Performance: replay and audit scan, check and decode the two halves of the key space on two
//! threads while the caller's thread applies the records in order (sled's leaves hold 16 items,
//! so its scan alone costs about as much as decoding and applying together); a million
//! realistic events take ~1.6 s of CPU in all. Concurrent appends share flushes. Measured by
//! `examples/journal_bench.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sortie_core::ledger::{Ledger, ledger};
use sortie_core::{Attempt, Event, RunId, RunState, Seq, Stamped, TaskId, Timestamp, Usage};

mod codec;
pub mod index;
mod store;
mod stored;

use store::Store;

/// The journal's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a journal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Another handle (usually another process) has the journal open for writing.
    #[error("journal {} is in use by another process", path.display())]
    Locked {
        /// The journal's directory.
        path: PathBuf,
    },
    /// `create` found a journal already there.
    #[error("a journal already exists in {}", path.display())]
    Exists {
        /// The journal's directory.
        path: PathBuf,
    },
    /// No journal (or index entry) where one was expected.
    #[error("{} not found", path.display())]
    NotFound {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A record cannot be read back as it was written.
    #[error("journal corrupt at seq {seq}: {reason}")]
    Corrupt {
        /// The first bad record.
        seq: Seq,
        /// What is wrong with it.
        reason: String,
    },
    /// A record decodes but replay refuses it.
    #[error("journal violation at seq {seq}: {violation}")]
    Violation {
        /// The record.
        seq: Seq,
        /// What rule it breaks.
        violation: sortie_core::Violation,
    },
    /// An append to a journal opened read-only.
    #[error("the journal is open read-only")]
    ReadOnly,
    /// An event that cannot be stored (e.g. too large).
    #[error("cannot store {event}: {reason}")]
    Unstorable {
        /// The event's name.
        event: &'static str,
        /// Why.
        reason: String,
    },
    /// The storage engine failed.
    #[error("{}: storage error: {message}", path.display())]
    Storage {
        /// The database's directory.
        path: PathBuf,
        /// sled's message.
        message: String,
    },
    /// The journal's files were removed while it was open (its state dir deleted): writes
    /// still reach the open file, but nothing appended can ever be read back.
    #[error(
        "journal {} was removed while the run was live (its state dir deleted?): nothing \
         appended from now on could be read back",
        path.display()
    )]
    Removed {
        /// The journal's directory.
        path: PathBuf,
    },
    /// A run index entry cannot be parsed.
    #[error("{}: bad index entry: {reason}", path.display())]
    BadIndex {
        /// The entry's file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// The seq this error is about, for corruption and violations.
    pub fn seq(&self) -> Option<Seq> {
        match self {
            Error::Corrupt { seq, .. } | Error::Violation { seq, .. } => Some(*seq),
            _ => None,
        }
    }
}

/// The directory of a run: `<state-dir>/runs/<run-id>`.
pub fn run_dir(state_dir: &Path, run: &RunId) -> PathBuf {
    state_dir.join("runs").join(run.as_str())
}

/// The sled directory inside a run directory.
fn db_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("journal")
}

/// Creates a directory and its missing parents, private to the user (0700).
pub(crate) fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| Error::Io {
            path: dir.to_owned(),
            source,
        })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What "durable" means for an append: what it survives once it has returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// A sled flush: the record is in the operating system's hands, so it survives the sortie
    /// process dying in any way (SIGKILL, panic, OOM). A power loss or kernel crash may lose
    /// up to about a second of appends (sled `fsync`s in the background once a second).
    /// Cheap: tens of microseconds per flush.
    #[default]
    Flush,
    /// A sled flush followed by `fdatasync` of the log: survives a power loss too. Costs a disk
    /// round trip per flush (milliseconds), which group commit shares between appenders.
    Sync,
}

/// The longest a flusher waits for writers to join its flush (see `Journal::wait_durable`).
const MAX_LINGER: Duration = Duration::from_millis(1);

/// What an insert did.
enum Inserted {
    /// No events: the next seq.
    Nothing(u64),
    /// The last seq inserted.
    UpTo(u64),
}

/// Group commit bookkeeping.
struct Commit {
    /// A thread is flushing (or about to) now.
    flushing: bool,
    /// Parked threads waiting for a flush to cover their seq.
    waiters: Vec<Waiter>,
    /// How many threads were inside `wait_durable` when the last flush ended: the writers
    /// that are likely to append again right away.
    active: u32,
    /// How long the last flush took.
    last_flush: Duration,
    /// The flusher, while it waits for writers to join its flush.
    lingerer: Option<std::thread::Thread>,
}

/// A thread parked in `wait_durable`.
struct Waiter {
    /// The last seq it appended.
    seq: u64,
    /// The thread, to unpark.
    thread: std::thread::Thread,
}

/// A private copy of a live journal's files, removed on drop.
struct SnapshotDir(PathBuf);

impl Drop for SnapshotDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The journal of one run. `Send + Sync`: share it with an `Arc`.
pub struct Journal {
    // Field order matters: the store closes before its snapshot copy is removed.
    store: Store,
    run_dir: PathBuf,
    read_only: bool,
    /// The next seq to assign; held while a record is inserted, so keys enter sled in order.
    writer: Mutex<u64>,
    /// How many records are inserted (seqs below this are in sled, maybe not durable yet).
    inserted: AtomicU64,
    /// Every seq below this is durable.
    durable: AtomicU64,
    /// Threads inside `wait_durable`.
    waiting: AtomicU32,
    commit: Mutex<Commit>,
    /// How many flushes this handle made (for benchmarks).
    flushes: AtomicU64,
    /// `Durability::Sync` when set.
    sync: std::sync::atomic::AtomicBool,
    _snapshot: Option<SnapshotDir>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("run_dir", &self.run_dir)
            .field("read_only", &self.read_only)
            .field("next_seq", &self.next_seq())
            .finish()
    }
}

/// How many times, and how often, `create` tries again while a reader holds sled's lock.
const CREATE_TRIES: u32 = 50;
/// See [`CREATE_TRIES`].
const CREATE_RETRY: Duration = Duration::from_millis(100);

impl Journal {
    /// Creates the journal of a new run in `run_dir` (created with its parents, 0700).
    /// `Error::Exists` when a journal is already there.
    ///
    /// A journal directory without sled's files (a `create` that died before sled wrote
    /// anything) is not a journal: `create` takes it over.
    pub fn create(run_dir: &Path) -> Result<Journal> {
        if existing_db_dir(run_dir).is_ok() {
            return Err(Error::Exists {
                path: run_dir.to_owned(),
            });
        }
        let db = db_dir(run_dir);
        create_private_dir(&db)?;
        // sled creates its files before it locks them: a reader (`sortie status` or `export`
        // of the run being started) that opens them in between holds the lock for a moment.
        // Wait for it. Another writer that created the journal meanwhile holds the lock for
        // its whole life, or has left records behind.
        let exists = || Error::Exists {
            path: run_dir.to_owned(),
        };
        let mut tries = 0;
        loop {
            match Store::open(&db) {
                Ok(store) if store.last_seq()?.is_some() => return Err(exists()),
                Ok(store) => return Journal::with_store(store, run_dir, false, None),
                Err(Error::Locked { .. }) if tries < CREATE_TRIES => {
                    tries += 1;
                    std::thread::sleep(CREATE_RETRY);
                }
                Err(Error::Locked { .. }) => return Err(exists()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Opens an existing journal for appending (resume, cancel). There is one writer per run:
    /// `Error::Locked` when another handle has it open, `Error::NotFound` when there is none.
    pub fn open(run_dir: &Path) -> Result<Journal> {
        let db = existing_db_dir(run_dir)?;
        Journal::with_store(Store::open(&db)?, run_dir, false, None)
    }

    /// Opens a journal for reading, even while another process writes it (see the crate docs:
    /// a private copy is opened then). [`Journal::append`] returns `Error::ReadOnly`.
    pub fn open_read_only(run_dir: &Path) -> Result<Journal> {
        let db = existing_db_dir(run_dir)?;
        match Store::open(&db) {
            Ok(store) => return Journal::with_store(store, run_dir, true, None),
            Err(Error::Locked { .. }) => {}
            Err(Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => return Err(e),
        }
        let mut last_err = None;
        for _ in 0..5 {
            let copy = SnapshotDir(private_temp_dir()?);
            match store::copy_files(&db, &copy.0) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            }
            match Store::open(&copy.0) {
                Ok(store) => return Journal::with_store(store, run_dir, true, Some(copy)),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(Error::Locked { path: db }))
    }

    fn with_store(
        store: Store,
        run_dir: &Path,
        read_only: bool,
        snapshot: Option<SnapshotDir>,
    ) -> Result<Journal> {
        let next = store.last_seq()?.map_or(0, |seq| seq.saturating_add(1));
        Ok(Journal {
            store,
            run_dir: run_dir.to_owned(),
            read_only,
            writer: Mutex::new(next),
            inserted: AtomicU64::new(next),
            durable: AtomicU64::new(next),
            waiting: AtomicU32::new(0),
            commit: Mutex::new(Commit {
                flushing: false,
                waiters: Vec::new(),
                active: 0,
                last_flush: Duration::ZERO,
                lingerer: None,
            }),
            flushes: AtomicU64::new(0),
            sync: std::sync::atomic::AtomicBool::new(false),
            _snapshot: snapshot,
        })
    }

    /// The run directory this journal belongs to.
    pub fn path(&self) -> &Path {
        &self.run_dir
    }

    /// Chooses what an append's return guarantees (default [`Durability::Flush`]).
    pub fn set_durability(&self, durability: Durability) {
        self.sync
            .store(durability == Durability::Sync, Ordering::Relaxed);
    }

    /// The current [`Durability`].
    pub fn durability(&self) -> Durability {
        if self.sync.load(Ordering::Relaxed) {
            Durability::Sync
        } else {
            Durability::Flush
        }
    }

    /// Fails with [`Error::Removed`] when the journal's files were removed while it is open
    /// (its state dir deleted): every append checks this after its flush; a writer whose
    /// appends are far apart can ask in between. One `fstat`.
    pub fn check_present(&self) -> Result<()> {
        self.store.check_linked()
    }

    /// True when opened with [`Journal::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The seq the next append will get (= how many records the journal holds).
    pub fn next_seq(&self) -> Seq {
        Seq(*lock(&self.writer))
    }

    /// Appends one event and returns its seq once it is durable.
    pub fn append(&self, at: Timestamp, event: &Event) -> Result<Seq> {
        self.append_iter(std::iter::once((at, event)))
    }

    /// Appends events in order, all durable on return after a single flush; returns the seq of
    /// the first (the next seq when `events` is empty).
    pub fn append_all(&self, events: &[(Timestamp, Event)]) -> Result<Seq> {
        self.append_iter(events.iter().map(|(at, e)| (*at, e)))
    }

    fn append_iter<'e>(
        &self,
        events: impl ExactSizeIterator<Item = (Timestamp, &'e Event)>,
    ) -> Result<Seq> {
        let count = events.len() as u64;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let last = match self.insert(events)? {
            Inserted::Nothing(next) => return Ok(Seq(next)),
            Inserted::UpTo(last) => last,
        };
        self.wait_durable(last)?;
        Ok(Seq(last + 1 - count))
    }

    /// Encodes and inserts events under the writer lock, so that keys enter sled in seq order.
    fn insert<'e>(
        &self,
        events: impl ExactSizeIterator<Item = (Timestamp, &'e Event)>,
    ) -> Result<Inserted> {
        {
            let mut next = lock(&self.writer);
            let first = *next;
            let mut encoded = Vec::with_capacity(events.len());
            for (i, (at, event)) in (first..).zip(events) {
                let bytes =
                    codec::encode(Seq(i), at, event).map_err(|reason| Error::Unstorable {
                        event: event.name(),
                        reason,
                    })?;
                encoded.push(bytes);
            }
            if encoded.is_empty() {
                return Ok(Inserted::Nothing(first));
            }
            for bytes in encoded {
                self.store.insert(*next, bytes)?;
                *next += 1;
                self.inserted.store(*next, Ordering::Release);
            }
            Ok(Inserted::UpTo(*next - 1))
        }
    }

    /// Returns once `seq` is durable, flushing if no flush that covers it is under way.
    ///
    /// Group commit: a writer that finds no flush under way becomes the flusher for every
    /// record inserted when its flush starts; the others park until a flush covers them. The
    /// flusher then unparks exactly the writers it covered (they return without taking a lock)
    /// and hands the lead to one writer it did not cover, if any.
    ///
    /// Before flushing, the flusher lingers until as many writers wait as did at the end of the
    /// last flush (at most as long as that flush took, and never over 1 ms): the writers the
    /// last flush released are appending again, and would otherwise start the next flush with
    /// half a batch, splitting the writers into two alternating groups. A lone writer never
    /// lingers.
    fn wait_durable(&self, seq: u64) -> Result<()> {
        if self.durable.load(Ordering::Acquire) > seq {
            return Ok(());
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let result = self.wait_or_flush(seq);
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        result
    }

    fn wait_or_flush(&self, seq: u64) -> Result<()> {
        let me = std::thread::current();
        let mut c = lock(&self.commit);
        if let Some(flusher) = &c.lingerer
            && self.waiting.load(Ordering::Acquire) >= c.active
        {
            flusher.unpark();
        }
        loop {
            if self.durable.load(Ordering::Acquire) > seq {
                return Ok(());
            }
            if c.flushing {
                c.waiters.push(Waiter {
                    seq,
                    thread: me.clone(),
                });
                drop(c);
                std::thread::park();
                if self.durable.load(Ordering::Acquire) > seq {
                    return Ok(()); // the flusher removed our entry
                }
                // Handed the lead, or woken spuriously (then our entry is still listed).
                c = lock(&self.commit);
                c.waiters.retain(|w| w.thread.id() != me.id());
                continue;
            }
            c.flushing = true;
            let until = Instant::now() + c.last_flush.min(MAX_LINGER);
            while self.waiting.load(Ordering::Acquire) < c.active {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                c.lingerer = Some(me.clone());
                drop(c);
                std::thread::park_timeout(until - now);
                c = lock(&self.commit);
                c.lingerer = None;
            }
            let target = self.inserted.load(Ordering::Acquire);
            drop(c);
            let started = Instant::now();
            let mut flushed = self.store.flush();
            if flushed.is_ok() && self.sync.load(Ordering::Relaxed) {
                flushed = self.store.sync_data();
            }
            if flushed.is_ok() {
                // Written to a file no name reaches any more is not durable.
                flushed = self.store.check_linked();
            }
            self.flushes.fetch_add(1, Ordering::Relaxed);
            c = lock(&self.commit);
            c.flushing = false;
            c.last_flush = started.elapsed();
            c.active = self.waiting.load(Ordering::Acquire);
            if flushed.is_ok() {
                self.durable.fetch_max(target, Ordering::AcqRel);
            }
            let durable = self.durable.load(Ordering::Acquire);
            let mut next = None;
            c.waiters.retain(|w| {
                if w.seq < durable {
                    w.thread.unpark();
                    false
                } else if next.is_none() {
                    next = Some(w.thread.clone());
                    false
                } else {
                    true
                }
            });
            if let Some(t) = next {
                t.unpark();
            }
            // Our own record was inserted before `target` was read: covered, unless the flush
            // failed (then the next leader retries for the others).
            return flushed;
        }
    }

    /// Reads records `from..=to` (`to` = None: to the end), each checked: key, stored seq and
    /// expected seq agree, version and CRC hold, the payload decodes. The iterator stops after
    /// the first error.
    pub fn read(&self, from: Seq, to: Option<Seq>) -> impl Iterator<Item = Result<Stamped>> + '_ {
        Reader {
            inner: Box::new(self.store.range(from.0)),
            checker: Checker { expected: from.0 },
            to: to.map(|s| s.0),
            done: false,
        }
    }

    /// The state as of `upto` inclusive (None: every record), folded through
    /// `RunState::apply`. A bad record is an error naming its seq.
    pub fn replay(&self, upto: Option<Seq>) -> Result<RunState> {
        let mut state = RunState::new();
        let mut failure = None;
        self.scan(upto, |record| {
            let applied = record.and_then(|r| {
                let seq = r.seq;
                state
                    .apply_owned(r)
                    .map_err(|violation| Error::Violation { seq, violation })
            });
            match applied {
                Ok(()) => true,
                Err(e) => {
                    failure = Some(e);
                    false
                }
            }
        });
        match failure {
            Some(e) => Err(e),
            None => Ok(state),
        }
    }

    /// Calls `f` with every checked record from seq 0 up to `upto` inclusive, in order, until
    /// `f` returns false or a record is bad (`f` sees that error, then the scan stops).
    ///
    /// sled's iteration costs about as much as decoding and applying together (its leaves hold
    /// 16 items, so a scan loads a page every few records). So the key space is cut into
    /// chunks (1/8 of the journal, 1024 to 32768 records), dealt alternately to two threads
    /// that scan, check and decode them, while this thread applies the records in order: both
    /// cores stay busy, each scanner working a chunk ahead while the other's is applied. Each
    /// scanner runs at most 64 batches (of up to 1024 records or 64 KiB) ahead, ~15 MB of
    /// decoded records. Without threads, it all runs here.
    fn scan(&self, upto: Option<Seq>, mut f: impl FnMut(Result<Stamped>) -> bool) {
        const DEPTH: usize = 64;
        const SCANNERS: u64 = 2;
        let to = upto.map(|s| s.0);
        let known = self.next_seq().0;
        let end = to.map_or(known, |t| t.saturating_add(1).min(known));
        let chunk = (end / 8).clamp(1024, 32768);
        // Chunk i covers keys [i * chunk, (i + 1) * chunk); the last one runs to `upto` (or to
        // the very end, stray keys included).
        let chunks = end.div_ceil(chunk).max(1);
        let bounds = move |i: u64| {
            let until = if i + 1 == chunks {
                to.map(|t| t.saturating_add(1))
            } else {
                Some((i + 1) * chunk)
            };
            (i * chunk, until)
        };
        let expected = std::cell::Cell::new(0u64);
        // Checks continuity across chunks and feeds `f`; false once the scan must stop.
        let mut feed = |item: Result<Stamped>| -> bool {
            let item = item.and_then(|s| {
                if s.seq.0 == expected.get() {
                    Ok(s)
                } else {
                    Err(Error::Corrupt {
                        seq: Seq(expected.get()),
                        reason: format!("missing: the next record is seq {}", s.seq),
                    })
                }
            });
            let ok = item.is_ok();
            expected.set(expected.get() + u64::from(ok));
            f(item) && ok
        };
        std::thread::scope(|scope| {
            let mut scanners = Vec::new();
            for first in 0..SCANNERS.min(chunks) {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Result<Stamped>>>(DEPTH);
                // Emptied batches go back to the scanner: a batch is ~200 KiB, and allocating
                // it in one thread and freeing it in another costs glibc an mmap, page faults
                // and a heap consolidation per batch.
                let (back, recycled) = std::sync::mpsc::channel::<Vec<Result<Stamped>>>();
                let spawned = std::thread::Builder::new()
                    .name("journal-scan".into())
                    .spawn_scoped(scope, move || {
                        for i in (first..chunks).step_by(SCANNERS as usize) {
                            let (from, until) = bounds(i);
                            let mut go = true;
                            let mut failed = false;
                            self.produce(
                                from,
                                until,
                                |batch| {
                                    failed = batch.last().is_some_and(Result::is_err);
                                    go = tx.send(batch).is_ok();
                                    go
                                },
                                || recycled.try_recv().unwrap_or_default(),
                            );
                            // An empty batch ends the chunk.
                            if !go || failed || tx.send(Vec::new()).is_err() {
                                return;
                            }
                        }
                    });
                match spawned {
                    Ok(_) => scanners.push((rx, back)),
                    Err(_) => break,
                }
            }
            if scanners.len() as u64 != SCANNERS.min(chunks) {
                scanners.clear(); // the scanners' next send fails and they stop
            }
            if scanners.is_empty() {
                // No thread: scan everything here.
                for i in 0..chunks {
                    let (from, until) = bounds(i);
                    let mut go = true;
                    self.produce(
                        from,
                        until,
                        |batch| {
                            go = batch.into_iter().all(&mut feed);
                            go
                        },
                        Vec::new,
                    );
                    if !go {
                        return;
                    }
                }
            } else {
                let n = scanners.len() as u64;
                for i in 0..chunks {
                    let Some((rx, back)) =
                        usize::try_from(i % n).ok().and_then(|k| scanners.get(k))
                    else {
                        return;
                    };
                    // Until the chunk's end marker (or the scanner stopped).
                    while let Ok(mut batch) = rx.recv() {
                        if batch.is_empty() {
                            break;
                        }
                        for item in batch.drain(..) {
                            if !feed(item) {
                                return; // drops the receivers: the scanners stop
                            }
                        }
                        let _ = back.send(batch);
                    }
                }
            }
            // Records this handle appended (or found at open) that are gone.
            if expected.get() < end {
                feed(Err(Error::Corrupt {
                    seq: Seq(expected.get()),
                    reason: format!("missing: the journal holds {end} records"),
                }));
            }
        });
    }

    /// Scans, checks and decodes the records with keys in `from..until` (`until` = None: to the
    /// end, garbage keys included), handing them to `send` in batches (vectors from `empty`),
    /// in order, until `send` returns false or a record is bad (the batch with the error is
    /// the last).
    fn produce(
        &self,
        from: u64,
        until: Option<u64>,
        mut send: impl FnMut(Vec<Result<Stamped>>) -> bool,
        mut empty: impl FnMut() -> Vec<Result<Stamped>>,
    ) {
        const BATCH: usize = 1024;
        const BATCH_BYTES: usize = 64 << 10;
        let limit = until.map(store::key);
        let mut checker = Checker { expected: from };
        let mut next_batch = || {
            let mut batch = empty();
            batch.reserve(BATCH);
            batch
        };
        let mut batch = next_batch();
        let mut bytes = 0;
        for raw in self.store.range(from) {
            if let (Ok(r), Some(limit)) = (&raw, &limit)
                && r.key() >= limit.as_slice()
            {
                break;
            }
            bytes += raw.as_ref().map_or(0, |r| r.value().len());
            let item = raw.and_then(|r| checker.check(&r));
            let failed = item.is_err();
            batch.push(item);
            if batch.len() == BATCH || bytes >= BATCH_BYTES || failed {
                bytes = 0;
                let full = std::mem::replace(&mut batch, next_batch());
                if !send(full) || failed {
                    return;
                }
            }
        }
        if !batch.is_empty() {
            send(batch);
        }
    }

    /// Checks the whole journal: versions, CRCs, dense seqs, legal transitions, and the usage
    /// ledger recomputed from the raw events against the replayed state. Never panics; reports
    /// the first bad record.
    pub fn audit(&self) -> Audit {
        let mut state = RunState::new();
        let mut events = 0u64;
        let mut first_bad = None;
        // (task, attempt) -> (model, last reported usage), from the raw events alone.
        let mut attempts: std::collections::BTreeMap<(TaskId, Attempt), (Option<String>, Usage)> =
            std::collections::BTreeMap::new();
        self.scan(None, |record| {
            let record = match record {
                Ok(r) => r,
                Err(e) => {
                    first_bad = Some((e.seq().unwrap_or(Seq(events)), e.to_string()));
                    return false;
                }
            };
            if let Err(v) = state.apply(&record) {
                let e = Error::Violation {
                    seq: record.seq,
                    violation: v,
                };
                first_bad = Some((record.seq, e.to_string()));
                return false;
            }
            match &record.event {
                Event::AttemptLaunching {
                    task,
                    attempt,
                    model,
                } => {
                    attempts.insert((*task, *attempt), (model.clone(), Usage::ZERO));
                }
                Event::AttemptProgress {
                    task,
                    attempt,
                    usage,
                }
                | Event::AttemptFinished {
                    task,
                    attempt,
                    usage,
                    ..
                } => {
                    if let Some(entry) = attempts.get_mut(&(*task, *attempt)) {
                        entry.1 = *usage;
                    }
                }
                _ => {}
            }
            events += 1;
            true
        });
        let mut recomputed = Ledger::new();
        for ((task, _), (model, usage)) in &attempts {
            recomputed.add(*task, model.as_deref(), usage);
        }
        let replayed = ledger(&state);
        let ledger_mismatch = recomputed
            .difference(&replayed)
            .map(|d| format!("ledger from the raw events differs from the replayed state: {d}"))
            .or_else(|| {
                let usage = state.usage();
                (usage != recomputed.total).then(|| {
                    format!(
                        "ledger total {:?} differs from the run's usage {usage:?}",
                        recomputed.total
                    )
                })
            });
        Audit {
            events,
            first_bad,
            state,
            ledger: recomputed,
            ledger_mismatch,
        }
    }

    /// The raw bytes of a record (for tests and forensic tools).
    #[doc(hidden)]
    pub fn raw_get(&self, seq: Seq) -> Result<Option<Vec<u8>>> {
        self.store.get(seq.0)
    }

    /// Overwrites the raw bytes stored under a key, without a flush (to corrupt journals in tests).
    #[doc(hidden)]
    pub fn raw_put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.store.put_raw(key, value)
    }

    /// Removes a raw key, without a flush (to corrupt journals in tests).
    #[doc(hidden)]
    pub fn raw_remove(&self, key: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.store.remove_raw(key)
    }

    /// How many flushes this handle has made (group commit makes it fewer than appends).
    #[doc(hidden)]
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Iterates every raw record without decoding it; returns how many there are and their
    /// total size (for benchmarks: the storage engine's share of a replay).
    #[doc(hidden)]
    pub fn raw_scan(&self) -> Result<(u64, u64)> {
        let (mut n, mut bytes) = (0, 0);
        for r in self.store.range(0) {
            let r = r?;
            n += 1;
            bytes += r.value().len() as u64;
        }
        Ok((n, bytes))
    }

    /// The sled directory, for diagnostics.
    #[doc(hidden)]
    pub fn db_path(&self) -> &Path {
        self.store.path()
    }
}

fn existing_db_dir(run_dir: &Path) -> Result<PathBuf> {
    let db = db_dir(run_dir);
    if db.join("db").is_file() || db.join("conf").is_file() {
        Ok(db)
    } else {
        Err(Error::NotFound {
            path: run_dir.to_owned(),
        })
    }
}

fn private_temp_dir() -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = base.join(format!(
        "sortie-journal-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
    Ok(dir)
}

/// Checks raw records in order: key, stored seq and expected seq agree, the record decodes.
struct Checker {
    expected: u64,
}

impl Checker {
    fn check(&mut self, raw: &store::RawRecord) -> Result<Stamped> {
        let seq = Seq(self.expected);
        let corrupt = |reason: String| Error::Corrupt { seq, reason };
        let Some(key) = store::seq_of_key(raw.key()) else {
            return Err(corrupt(format!(
                "a key of {} bytes follows seq {}",
                raw.key().len(),
                self.expected.wrapping_sub(1)
            )));
        };
        if key != self.expected {
            return Err(corrupt(format!("missing: the next record is seq {key}")));
        }
        let stamped = codec::decode(raw.value()).map_err(corrupt)?;
        if stamped.seq != seq {
            return Err(corrupt(format!(
                "the record under key {key} says it is seq {}",
                stamped.seq
            )));
        }
        self.expected += 1;
        Ok(stamped)
    }
}

/// The checked iterator behind [`Journal::read`].
struct Reader<'a> {
    inner: Box<dyn Iterator<Item = Result<store::RawRecord>> + 'a>,
    checker: Checker,
    to: Option<u64>,
    done: bool,
}

impl Iterator for Reader<'_> {
    type Item = Result<Stamped>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.to.is_some_and(|to| self.checker.expected > to) {
            return None;
        }
        let item = match self.inner.next()? {
            Ok(raw) => self.checker.check(&raw),
            Err(e) => Err(e),
        };
        self.done = item.is_err();
        Some(item)
    }
}

/// What [`Journal::audit`] found.
#[derive(Debug, Clone)]
pub struct Audit {
    /// How many records were read and applied before the first bad one (all, when clean).
    pub events: u64,
    /// The first bad record and what is wrong with it.
    pub first_bad: Option<(Seq, String)>,
    /// The state replayed up to just before the first bad record.
    pub state: RunState,
    /// The usage ledger recomputed from the raw events (each attempt's last reported usage).
    pub ledger: Ledger,
    /// How the recomputed ledger differs from the replayed state's, if it does.
    pub ledger_mismatch: Option<String>,
}

impl Audit {
    /// True when every record is good and the ledger adds up.
    pub fn is_clean(&self) -> bool {
        self.first_bad.is_none() && self.ledger_mismatch.is_none()
    }
}

/// Entry points for the fuzz targets (`fuzz/`, `cargo xtask fuzz`): the record codec, which is
/// otherwise private. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use sortie_core::{Event, Seq, Stamped, Timestamp};

    /// Decodes one stored record (version, CRC, payload) as a replay would.
    pub fn decode_record(bytes: &[u8]) -> Result<Stamped, String> {
        crate::codec::decode(bytes)
    }

    /// Frames `payload` with this build's version byte and the payload's correct CRC, so that
    /// arbitrary payloads reach the bincode decoder instead of stopping at the checksum.
    pub fn frame(payload: &[u8]) -> Vec<u8> {
        crate::codec::frame(payload)
    }

    /// Encodes one record as an append would.
    pub fn encode_record(seq: Seq, at: Timestamp, event: &Event) -> Result<Vec<u8>, String> {
        crate::codec::encode(seq, at, event)
    }
}

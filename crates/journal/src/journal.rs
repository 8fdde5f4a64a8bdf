//! Opening a journal: create (a new run), open (the one writer), and the read-only open that
//! copies a live run's files (see the crate docs), plus the `Journal` handle itself.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sortie_core::Seq;

use crate::commit::{Commit, Durability};
use crate::mark::Mark;
use crate::store::{self, Role, Store};
use crate::{Error, Result};

/// The sled directory inside a run directory.
pub fn db_dir(run_dir: &Path) -> PathBuf {
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

/// Locks a mutex, poisoned or not (a panicking holder leaves nothing half done here).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A private copy of a live journal's files, removed on drop.
struct SnapshotDir(PathBuf);

impl Drop for SnapshotDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A journal being closed on a thread of its own ([`Journal::close_beside`]); dropping this
/// waits until it is closed.
#[derive(Debug)]
pub struct Closing(Option<std::thread::JoinHandle<()>>);

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

/// The journal of one run. `Send + Sync`: share it with an `Arc`.
pub struct Journal {
    // Field order matters: the store closes before its snapshot copy is removed.
    pub(crate) store: Store,
    pub(crate) run_dir: PathBuf,
    pub(crate) read_only: bool,
    /// The next seq to assign; held while a record is inserted, so keys enter sled in order.
    pub(crate) writer: Mutex<u64>,
    /// How many records are inserted (seqs below this are in sled, maybe not durable yet).
    pub(crate) inserted: AtomicU64,
    /// Every seq below this is durable.
    pub(crate) durable: AtomicU64,
    /// Threads inside `wait_durable`.
    pub(crate) waiting: AtomicU32,
    pub(crate) commit: Mutex<Commit>,
    /// How many flushes this handle made (for benchmarks).
    pub(crate) flushes: AtomicU64,
    /// `Durability::Sync` when set.
    pub(crate) sync: AtomicBool,
    /// How many records the journal held when sled last opened its database (see
    /// `Store::reopen`).
    pub(crate) opened_at: AtomicU64,
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

/// How long a writer's open ([`Journal::create`], [`Journal::open`]) waits for sled's lock
/// before it calls the journal in use: a reader (`sortie status` or `export`) holds the lock
/// for a moment, and sled lets go of it from background threads a moment after the last
/// handle in this process is dropped. The one retry there is (`Store::open` polls until then).
pub(crate) const WRITER_PATIENCE: Duration = Duration::from_secs(5);

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
        match Store::open(&db, WRITER_PATIENCE, Role::Writer) {
            Ok(store) if store.last_seq()?.is_some() => Err(exists()),
            Ok(store) => {
                // A mark left by a create that died is not this journal's.
                let _ = fs::remove_file(crate::mark::mark_path(run_dir));
                Journal::with_store(store, run_dir, false, None)
            }
            Err(Error::Locked { .. }) => Err(exists()),
            Err(e) => Err(e),
        }
    }

    /// Opens an existing journal for appending (resume, cancel). There is one writer per run:
    /// `Error::Locked` when another handle has it open (after waiting up to 5 s for a reader to
    /// let go), `Error::NotFound` when there is none.
    ///
    /// The journal's high-water mark is checked: one that lost acknowledged records is
    /// [`Error::Truncated`] (or `Corrupt`), and nothing can be appended to it.
    pub fn open(run_dir: &Path) -> Result<Journal> {
        let db = existing_db_dir(run_dir)?;
        let mark = Mark::read(run_dir);
        let journal = Journal::with_store(
            Store::open(&db, WRITER_PATIENCE, Role::Writer)?,
            run_dir,
            false,
            None,
        )?;
        journal.checked(mark)
    }

    fn checked(self, mark: Option<Mark>) -> Result<Journal> {
        if let Some(mark) = mark {
            self.check_mark(&mark)?;
        }
        Ok(self)
    }

    /// Opens a journal for reading, even while another process writes it (see the crate docs:
    /// a private copy is opened then). [`Journal::append`] returns `Error::ReadOnly`.
    ///
    /// The high-water mark is checked as by [`Journal::open`]; it is read before the files are
    /// copied, so it never counts records the copy could not hold.
    pub fn open_read_only(run_dir: &Path) -> Result<Journal> {
        let mark = Mark::read(run_dir);
        Journal::open_read_only_unchecked(run_dir)?.checked(mark)
    }

    /// [`Journal::open_read_only`] without the high-water mark check. Always a private copy:
    /// sled has no read-only mode, and its open rewrites the files it is given (it zeroes its
    /// log after the last entry it can read and may write a new page-table snapshot), so a
    /// reader that opened a damaged journal in place would destroy what `recover` could still
    /// read. A reader never lets sled open the run's own files.
    fn open_read_only_unchecked(run_dir: &Path) -> Result<Journal> {
        Journal::open_copy(run_dir)
    }

    /// Opens a private copy of a journal's files, read-only and without the high-water mark
    /// check: sled's recovery of a damaged log rewrites it (it zeroes what it cannot read), so
    /// salvage never lets sled open the damaged files themselves.
    pub(crate) fn open_copy(run_dir: &Path) -> Result<Journal> {
        Journal::open_copy_but(run_dir, false)
    }

    /// [`Journal::open_copy`], leaving sled's own snapshot files out of the copy when
    /// `no_snapshots` (sled then reads its log from the start).
    pub(crate) fn open_copy_but(run_dir: &Path, no_snapshots: bool) -> Result<Journal> {
        let db = existing_db_dir(run_dir)?;
        let mut last_err = None;
        for _ in 0..5 {
            let copy = SnapshotDir(private_temp_dir()?);
            match store::copy_files_but(&db, &copy.0, no_snapshots) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            }
            // The copy is private: nothing else can hold its lock.
            match Store::open(&copy.0, Duration::ZERO, Role::Reader) {
                Ok(store) => return Journal::with_store(store, run_dir, true, Some(copy)),
                Err(e) => last_err = Some(in_place(e, &copy.0, &db)),
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
            commit: Mutex::new(Commit::default()),
            flushes: AtomicU64::new(0),
            sync: AtomicBool::new(false),
            opened_at: AtomicU64::new(next),
            _snapshot: snapshot,
        })
    }

    /// Closes this handle on a thread of its own: sled's flush and the end of its threads,
    /// and for a read-only copy the removal of its files (tens of milliseconds for a
    /// 100,000-task journal), while the caller goes on. The returned [`Closing`] waits for it
    /// when dropped, so that nothing is left behind when the process exits.
    pub fn close_beside(self) -> Closing {
        // A thread that cannot be started drops its closure: the journal is closed here.
        let thread = std::thread::Builder::new()
            .name("journal-close".into())
            .spawn(move || drop(self));
        Closing(thread.ok())
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
}

/// An error of sled's over the private copy `copy` of the journal's files in `db`, said of the
/// run's own files (the copy is gone once the command ends): what sled refuses in them (files it
/// cannot read, or did not write, such as two of its files swapped) is damage (exit 4), and
/// names the run's file.
fn in_place(e: Error, copy: &Path, db: &Path) -> Error {
    let own = |path: &Path| match path.strip_prefix(copy) {
        Ok(rel) if rel.as_os_str().is_empty() => db.to_path_buf(),
        Ok(rel) => db.join(rel),
        Err(_) => path.to_path_buf(),
    };
    match e {
        Error::Damaged { file, message } => Error::Damaged {
            file: own(&file),
            message,
        },
        Error::Storage { path, message } => Error::Damaged {
            file: own(&path),
            message: format!("sled cannot open it: {message}"),
        },
        Error::Io { path, source } => Error::Io {
            path: own(&path),
            source,
        },
        other => other,
    }
}

fn existing_db_dir(run_dir: &Path) -> Result<PathBuf> {
    let db = db_dir(run_dir);
    let log = db.join("db");
    // A run whose journal once acknowledged records (its mark or its snapshot is beside it)
    // and whose log is gone or is not a file (deleted, a directory, a link to a device) has a
    // damaged journal, not none: the damage names the run's own file.
    let had_journal = ["journal.mark", "journal.snapshot"]
        .iter()
        .any(|f| run_dir.join(f).is_file());
    if log.is_file() {
        return Ok(db);
    }
    if had_journal {
        let message = match fs::symlink_metadata(&log) {
            Err(_) if !db.is_dir() => "the journal's directory is missing".to_owned(),
            Err(_) => "the journal's log file is missing".to_owned(),
            Ok(m) if m.is_dir() => "a directory stands where the log file should be".to_owned(),
            Ok(_) => "the log is not a regular file".to_owned(),
        };
        return Err(Error::Damaged {
            file: if db.is_dir() { log } else { db },
            message,
        });
    }
    if db.join("conf").is_file() {
        Ok(db)
    } else {
        Err(Error::NotFound {
            path: run_dir.to_owned(),
        })
    }
}

/// The prefix of a reader's private copy in the temporary directory, before its owner's pid.
const COPY_PREFIX: &str = "sortie-journal-";

/// Removes the private copies that readers killed mid-read left in `base` (their pid is gone),
/// once per process: a copy is as large as its journal (100 MB for a 112,000-task run).
fn sweep_dead_copies(base: &Path) {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        let Ok(entries) = fs::read_dir(base) else {
            return;
        };
        // This process's user: the owner of its own `/proc` entry.
        let Ok(uid) = fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.strip_prefix(COPY_PREFIX))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            let ours = entry
                .metadata()
                .is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == uid);
            if ours && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    });
}

fn private_temp_dir() -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    sweep_dead_copies(&base);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = base.join(format!(
        "{COPY_PREFIX}{}-{}-{nanos}",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_closed_beside_is_removed_once_its_closing_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        drop(Journal::create(dir.path()).unwrap());
        let copy = Journal::open_read_only(dir.path()).unwrap();
        let files = copy._snapshot.as_ref().unwrap().0.clone();
        assert!(files.join("db").is_file(), "the copy holds sled's log");
        let closing = copy.close_beside();
        drop(closing);
        assert!(!files.exists(), "{} left behind", files.display());
        assert!(
            db_dir(dir.path()).join("db").is_file(),
            "the original stays"
        );
    }
}

//! The storage backend: the only module that knows sled.
//!
//! One sled database per run, in `<run-dir>/journal/`. Keys are big-endian `u64` seqs, values
//! are encoded records (see `codec`). This module knows nothing of records: it stores bytes,
//! flushes them, iterates them in key order, and turns sled's errors into [`Error`]s (a database
//! locked by another process becomes [`Error::Locked`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The sled cache capacity of a reader (an upper bound, not an allocation). A journal is read
/// front to back, so a small cache is enough. Measured on replay and audit of a million events
/// (`journal_bench`): 16 MiB spends ~20% more CPU scanning than 32 MiB, and 64 MiB saves nothing
/// more but costs ~180 MB more resident memory (sled's accounting undercounts).
const READER_CACHE_BYTES: u64 = 32 << 20;

/// The sled cache capacity of the run's owner (`Journal::create`, `Journal::open`), which
/// appends at the end and reads back only its last key when it opens; its replays and audits
/// read private copies, with [`READER_CACHE_BYTES`]. sled's memory grows by up to the cache's
/// size between two of the owner's reopens (after each snapshot). Measured on `sortie run` of
/// 100,000 × `true` at 64 (2026-12-03, load average 10 to 16): peak RSS 178.3 and 178.7 MB
/// with 32 MiB, 165.7 MB with 1 MiB as an experiment, 167.2 MB with this (`CPU` 78.9 s user,
/// 39.3 s sys; 77.1 s and 44.8 s with 32 MiB); 5,000 × `true` at 16, three rounds each: 6.27 s
/// of CPU against 6.38 s with 32 MiB.
const WRITER_CACHE_BYTES: u64 = 1 << 20;

/// What a [`Store`] is opened for: its sled cache's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A reader (replay, audit, `status`): the whole journal, front to back.
    Reader,
    /// The run's one writer: appends at the end.
    Writer,
}

impl Role {
    fn cache_bytes(self) -> u64 {
        match self {
            Role::Reader => READER_CACHE_BYTES,
            Role::Writer => WRITER_CACHE_BYTES,
        }
    }
}

/// How often [`Store::open`] tries again while the database is locked.
const LOCK_POLL: Duration = Duration::from_millis(20);

/// The sled database of one run.
pub(crate) struct Store {
    /// The open database (None only after a [`Store::reopen`] that failed). sled's handles are
    /// shared references: each operation clones one.
    db: std::sync::RwLock<Option<sled::Db>>,
    path: PathBuf,
    /// What it was opened for (a reopen keeps it).
    role: Role,
    /// sled's log file, opened for `fdatasync` (see [`Store::sync_data`]).
    log: Option<fs::File>,
    /// A write failed (a full disk, a file-size limit): sled's log buffer can never become
    /// stable, and sled's own drop of the database waits for that forever (see `Drop`).
    broken: std::sync::atomic::AtomicBool,
}

/// One raw record: key and value bytes, as stored.
pub(crate) struct RawRecord {
    key: sled::IVec,
    value: sled::IVec,
}

impl RawRecord {
    /// The key bytes.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// The value bytes.
    pub(crate) fn value(&self) -> &[u8] {
        &self.value
    }
}

/// The key of a seq.
pub(crate) fn key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The seq of a key, if it is one.
pub(crate) fn seq_of_key(key: &[u8]) -> Option<u64> {
    key.try_into().ok().map(u64::from_be_bytes)
}

impl Drop for Store {
    /// sled flushes a database when its last handle drops, and after a failed write that flush
    /// waits forever for a log buffer that can never be written: a broken store's database is
    /// left to the process's exit instead (what it held durably is on disk; the rest never was).
    fn drop(&mut self) {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            let db = self
                .db
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            std::mem::forget(db);
        }
    }
}

impl Store {
    /// Opens (or creates) the database in `path`, waiting up to `patience` while another
    /// handle holds its lock; [`Error::Locked`] after that. This is the journal's only retry
    /// on sled's lock: sled lets go of it from background threads a moment after the last
    /// handle is dropped, and a reader holds it while it reads.
    pub(crate) fn open(path: &Path, patience: Duration, role: Role) -> Result<Store> {
        let open = || {
            sled::Config::new()
                .path(path)
                .cache_capacity(role.cache_bytes())
                // Appends flush themselves; sled's own flusher also `fsync`s the whole file once
                // a second, which bounds what a power loss can take in `Durability::Flush` mode.
                .flush_every_ms(Some(1000))
                .open()
                .map_err(|e| open_error(path, e))
        };
        let deadline = Instant::now() + patience;
        let db = loop {
            match open() {
                Err(Error::Locked { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(LOCK_POLL);
                }
                other => break other?,
            }
        };
        let log = fs::OpenOptions::new().read(true).open(lock_file(path)).ok();
        Ok(Store {
            db: std::sync::RwLock::new(Some(db)),
            path: path.to_owned(),
            role,
            log,
            broken: std::sync::atomic::AtomicBool::new(false),
        })
    }

    #[cfg(feature = "test-util")]
    /// Where the database lives.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: sled::Error) -> Error {
        sled_error(&self.path, e)
    }

    /// The error of a failed write, which leaves the store broken (see `Drop`).
    fn write_err(&self, e: sled::Error) -> Error {
        self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
        self.err(e)
    }

    /// A handle on the open database.
    fn db(&self) -> Result<sled::Db> {
        let db = self
            .db
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        db.clone().ok_or_else(|| Error::Storage {
            path: self.path.clone(),
            message: "the database could not be opened again".into(),
        })
    }

    /// Closes and opens the database again, durably flushed first. sled writes the snapshot of
    /// its page table only when it opens a database (it replays its log from the last one, and
    /// nothing else ever writes one), so a run that went on for hours without an open leaves a
    /// log that the next open (a resume after a crash) reads from its start: for the
    /// 100,000-task run, 0.64 G of the instructions before its first spawn. The owner reopens
    /// after each of its own snapshots; the open reads only the log since the last one.
    /// Waits up to `patience` for sled's background threads to let go of the lock.
    pub(crate) fn reopen(&self, patience: Duration) -> Result<()> {
        let mut slot = self
            .db
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(db) = slot.as_ref() {
            db.flush().map_err(|e| self.write_err(e))?;
        }
        drop(slot.take());
        *slot = Some(Store::open(&self.path, patience, self.role)?.into_db()?);
        Ok(())
    }

    fn into_db(mut self) -> Result<sled::Db> {
        let path = self.path.clone();
        self.db
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or(Error::Storage {
                path,
                message: "the database could not be opened again".into(),
            })
    }

    /// The greatest key that is a seq. Keys of another length (only corruption puts them
    /// there) are skipped here; reading reports them.
    pub(crate) fn last_seq(&self) -> Result<Option<u64>> {
        for entry in self.db()?.iter().rev() {
            let (k, _) = entry.map_err(|e| self.err(e))?;
            if let Some(seq) = seq_of_key(&k) {
                return Ok(Some(seq));
            }
        }
        Ok(None)
    }

    /// Stores one value (not yet durable: see [`Store::flush`]).
    pub(crate) fn insert(&self, seq: u64, value: Vec<u8>) -> Result<()> {
        self.db()?
            .insert(key(seq), value)
            .map(drop)
            .map_err(|e| self.write_err(e))
    }

    /// Makes every value inserted before this call durable.
    pub(crate) fn flush(&self) -> Result<()> {
        self.db()?.flush().map(drop).map_err(|e| self.write_err(e))
    }

    /// Forces sled's log file to stable storage (`fdatasync`). sled's flush writes the log with
    /// `sync_file_range` on Linux, which survives the process dying but neither flushes the
    /// drive's cache nor the file's size, so it is not enough against a power loss.
    pub(crate) fn sync_data(&self) -> Result<()> {
        match &self.log {
            Some(f) => f.sync_data().map_err(|source| Error::Io {
                path: lock_file(&self.path),
                source,
            }),
            None => Ok(()),
        }
    }

    /// Fails with [`Error::Removed`] when sled's log file has no name left (its directory was
    /// deleted while open: writes still succeed, but nothing could read them back). One
    /// `fstat`, next to a flush it costs nothing.
    pub(crate) fn check_linked(&self) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        match self.log.as_ref().map(fs::File::metadata) {
            Some(Ok(m)) if m.nlink() == 0 => Err(Error::Removed {
                path: self.path.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Records in key order, from `from` on.
    pub(crate) fn range(&self, from: u64) -> impl Iterator<Item = Result<RawRecord>> + '_ {
        let (db, failed) = match self.db() {
            Ok(db) => (Some(db), None),
            Err(e) => (None, Some(Err(e))),
        };
        failed.into_iter().chain(
            db.into_iter()
                .flat_map(move |db| db.range(key(from)..))
                .map(move |r| match r {
                    Ok((key, value)) => Ok(RawRecord { key, value }),
                    Err(e) => Err(self.err(e)),
                }),
        )
    }

    /// The raw value stored under a seq.
    pub(crate) fn get(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        self.db()?
            .get(key(seq))
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| self.err(e))
    }

    #[cfg(feature = "test-util")]
    /// Stores raw bytes under a raw key, not flushed (tests only).
    pub(crate) fn put_raw(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.db()?
            .insert(key, value)
            .map(drop)
            .map_err(|e| self.err(e))
    }

    #[cfg(feature = "test-util")]
    /// Removes a raw key, not flushed (tests only).
    pub(crate) fn remove_raw(&self, key: &[u8]) -> Result<()> {
        self.db()?.remove(key).map(drop).map_err(|e| self.err(e))
    }
}

/// The file sled locks.
fn lock_file(path: &Path) -> PathBuf {
    path.join("db")
}

/// Tells whether another open handle holds the database's lock.
fn is_locked(path: &Path) -> bool {
    let Ok(file) = fs::OpenOptions::new().read(true).open(lock_file(path)) else {
        return false;
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            false
        }
        Err(fs::TryLockError::WouldBlock) => true,
        Err(fs::TryLockError::Error(_)) => false,
    }
}

fn open_error(path: &Path, e: sled::Error) -> Error {
    if let sled::Error::Io(io) = &e
        && (io.to_string().contains("could not acquire lock") || is_locked(path))
    {
        return Error::Locked {
            path: path.to_owned(),
        };
    }
    sled_error(path, e)
}

fn sled_error(path: &Path, e: sled::Error) -> Error {
    let e = match e {
        sled::Error::Io(source) => sled::Error::Io(uncloned(source)),
        other => other,
    };
    let damaged = |message: String| Error::Damaged {
        file: lock_file(path),
        message,
    };
    match e {
        // A log that ends in the middle of an entry, or bytes sled cannot make sense of: its
        // files are damaged, not the disk unreachable.
        sled::Error::Io(source)
            if matches!(
                source.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::InvalidData
            ) =>
        {
            damaged(format!("sled cannot read it: {source}"))
        }
        sled::Error::Io(source) => Error::Io {
            path: path.to_owned(),
            source,
        },
        sled::Error::Corruption { at, .. } => damaged(match at {
            Some(at) => format!("sled found corrupted data at {at}"),
            None => "sled found corrupted data".to_owned(),
        }),
        other => Error::Storage {
            path: path.to_owned(),
            message: other.to_string(),
        },
    }
}

/// The OS error a clone of sled's stands for. sled hands the same error to every waiter by
/// cloning it as `io::Error::new(kind, format!("{:?}", e))`: a user would read `Os { code: 28,
/// kind: StorageFull, message: "No space left on device" }` where the OS said `No space left on
/// device (os error 28)`. The code is read back from that text; any other error is kept.
fn uncloned(source: io::Error) -> io::Error {
    if source.raw_os_error().is_some() {
        return source;
    }
    let text = source.to_string();
    let code = text
        .strip_prefix("Os { code: ")
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse::<i32>().ok());
    match code {
        Some(code) => io::Error::from_raw_os_error(code),
        None => source,
    }
}

/// Copies the sled files of `from` into the empty directory `to`, so that the copy can be opened
/// while another process holds `from`. Snapshot files are copied before the log, so the log is
/// never older than the snapshot that points into it; if the set of snapshots changed during the
/// copy (sled compacted meanwhile), the copy is reported as inconsistent and the caller retries.
///
/// Leaves sled's own snapshots out when `no_snapshots` (sled then rebuilds its
/// page table from the log alone: salvage's way past a snapshot sled cannot read).
pub(crate) fn copy_files_but(from: &Path, to: &Path, no_snapshots: bool) -> Result<bool> {
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source: io::Error| Error::Io { path, source }
    };
    let snapshots = |dir: &Path| -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("snap.") && !name.ends_with(".generating") {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    };
    let before = snapshots(from)?;
    let conf = from.join("conf");
    if conf.exists() {
        fs::copy(&conf, to.join("conf")).map_err(io_err(&conf))?;
    }
    for name in before.iter().filter(|_| !no_snapshots) {
        let src = from.join(name);
        match fs::copy(&src, to.join(name)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_err(&src)(e)),
        }
    }
    let db = lock_file(from);
    fs::copy(&db, lock_file(to)).map_err(io_err(&db))?;
    let blobs = from.join("blobs");
    let blobs_to = to.join("blobs");
    fs::create_dir_all(&blobs_to).map_err(io_err(&blobs_to))?;
    if let Ok(entries) = fs::read_dir(&blobs) {
        for entry in entries {
            let entry = entry.map_err(io_err(&blobs))?;
            let src = entry.path();
            match fs::copy(&src, blobs_to.join(entry.file_name())) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(e) => return Err(io_err(&src)(e)),
            }
        }
    }
    Ok(snapshots(from)? == before)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_keeps_its_small_cache_across_reopens_and_a_reader_has_the_large_one() {
        assert!(Role::Writer.cache_bytes() < Role::Reader.cache_bytes());
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Duration::ZERO, Role::Writer).unwrap();
        store.insert(0, vec![1, 2, 3]).unwrap();
        store.reopen(Duration::from_secs(5)).unwrap();
        assert_eq!(store.role, Role::Writer);
        assert_eq!(store.get(0).unwrap(), Some(vec![1, 2, 3]));
        drop(store);
        let reader = Store::open(dir.path(), Duration::from_secs(5), Role::Reader).unwrap();
        assert_eq!(reader.role, Role::Reader);
    }

    #[test]
    fn an_os_error_sled_cloned_reads_as_the_os_said_it() {
        let os = io::Error::from_raw_os_error(28);
        let cloned = io::Error::new(os.kind(), format!("{os:?}"));
        assert!(cloned.to_string().starts_with("Os { code: 28"), "{cloned}");
        assert_eq!(uncloned(cloned).to_string(), os.to_string());
        assert_eq!(
            uncloned(io::Error::other("Os { code: x")).to_string(),
            "Os { code: x"
        );
    }
}

//! sortie-journal: the append-only, checksummed, durable event log of a run.
//!
//! This crate owns bytes and storage, not rules: it stores `sortie_core::Event`s in order, each
//! with a seq, a timestamp, a format version and a CRC, and folds them through
//! `RunState::apply` for replay and audit.
//!
//! Layout: one sled database per run, in the `journal/` directory of the run directory it is
//! given (the runner's `layout` says where run directories are; the rest of a run directory
//! is the runner's). sled lives behind `store`,
//! bincode behind `codec`, and the on-disk schema (`StoredEvent`, formats v1 and v2, converted
//! explicitly from and to `core::Event`) in `stored`: each can be swapped without touching the rest. A record is
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
//! - one writer per run: a second [`Journal::open`] (from any process) gets [`Error::Locked`]
//!   (after giving sled 5 s to let go of a handle just dropped), never a hang.
//!
//! Reading: sled locks a database against every other open handle, has no read-only mode, and
//! its open rewrites the files it is given (it zeroes its log after the last entry it can read,
//! and writes a snapshot of its page table): a reader that let sled open a damaged journal in
//! place would destroy what `recover` can still read. So [`Journal::open_read_only`] never
//! opens the run's own files: it copies them into a private temporary directory (0700) and
//! opens the copy, whether or not a live `sortie run` holds them. sled recovers a consistent
//! prefix of its log, so the copy shows the run as of the moment it was taken, every append
//! acknowledged before then included. Snapshot files are copied before the log, and the copy is
//! retried if sled wrote a new snapshot meanwhile. The copy is removed when the handle is
//! dropped. We chose copying over a lock-free reader of sled's files because sled's format is
//! not ours to parse; the cost is a file copy (the 100,000-task run's ~90 MB log: see
//! `examples/scale_bench.rs`).
//!
//! Performance: replay and audit scan, check and decode the two halves of the key space on two
//! threads while the caller's thread applies the records in order (sled's leaves hold 16 items,
//! so its scan alone costs about as much as decoding and applying together); a million
//! realistic events take ~1.6 s of CPU in all. `replay_latest` decodes the newest snapshot on a
//! third thread while the tail after it is scanned (see `snapshot::Prefetch`). Concurrent
//! appends share flushes. Measured by `examples/journal_bench.rs`.
//!
//! Modules: `journal` (the handle; create, open, the read-only snapshot copy), `commit` (appends
//! and group commit), `read` (the checked iterator, replay, the two-thread scan), `audit`,
//! `store` (sled, and the one wait on its lock), `codec` (bincode and the frame), `stored` (the
//! on-disk schema), `export` (that schema as `sortie export`'s JSON), `mark` (the acknowledged
//! high-water mark kept outside sled, checked at every open: a journal that lost acknowledged
//! records is `Error::Truncated`, never a shorter whole one), `snapshot` (the run's state at a
//! seq beside the journal, checksummed and tied to this build's schema: readers start from the
//! newest valid one and replay the tail, `audit` checks it against the fold). The `test-util` feature adds raw access for tests, benchmarks and the fuzz targets
//! (`test_util`).

use std::path::PathBuf;

use sortie_core::Seq;

mod audit;
mod codec;
mod commit;
mod export;
mod journal;
mod mark;
mod read;
mod salvage;
mod snapshot;
mod store;
mod stored;
#[cfg(feature = "test-util")]
mod test_util;

pub use audit::{Audit, CheckedReplay};
pub use commit::Durability;
pub use export::{EXPORT_VERSION, ExportRecord};
pub use journal::{Closing, Journal, db_dir};
pub use mark::{Mark, mark_path};
pub use salvage::Salvage;
pub use snapshot::{Prefetch, remove_snapshots, snapshot_paths};
#[cfg(feature = "test-util")]
pub use test_util::fuzzing;

/// The journal's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a journal.
///
/// Each message is whole: an I/O error's text says its cause too, and [`std::error::Error::source`]
/// is `None`, so a chain printed with `{:#}` says every cause once. The runner and cli fold
/// these messages into their own (journaled task errors, the gc report), which keeps them
/// whole there as well.
#[derive(Debug)]
pub enum Error {
    /// A filesystem operation failed.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Another handle (usually another process) has the journal open for writing.
    Locked {
        /// The journal's directory.
        path: PathBuf,
    },
    /// `create` found a journal already there.
    Exists {
        /// The journal's directory.
        path: PathBuf,
    },
    /// No journal (or index entry) where one was expected.
    NotFound {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A record cannot be read back as it was written.
    Corrupt {
        /// The first bad record.
        seq: Seq,
        /// What is wrong with it.
        reason: String,
    },
    /// A record decodes but replay refuses it.
    Violation {
        /// The record.
        seq: Seq,
        /// What rule it breaks.
        violation: sortie_core::Violation,
    },
    /// An append to a journal opened read-only.
    ReadOnly,
    /// An event that cannot be stored (e.g. too large).
    Unstorable {
        /// The event's name.
        event: &'static str,
        /// Why.
        reason: String,
    },
    /// The storage engine failed.
    Storage {
        /// The database's directory.
        path: PathBuf,
        /// sled's message.
        message: String,
    },
    /// The journal's files were removed while it was open (its state dir deleted): writes
    /// still reach the open file, but nothing appended can ever be read back.
    Removed {
        /// The journal's directory.
        path: PathBuf,
    },
    /// The journal holds fewer records than it acknowledged (its high-water mark, kept outside
    /// sled: see `mark`): records `from..=to` are lost.
    Truncated {
        /// The first lost record.
        from: Seq,
        /// The last acknowledged record.
        to: Seq,
    },
    /// sled cannot open or read its files.
    Damaged {
        /// The damaged file.
        file: PathBuf,
        /// What sled said.
        message: String,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Error::Locked { path } => {
                write!(f, "journal {} is in use by another process", path.display())
            }
            Error::Exists { path } => write!(f, "a journal already exists in {}", path.display()),
            Error::NotFound { path } => write!(f, "{} not found", path.display()),
            Error::Corrupt { seq, reason } => write!(f, "journal corrupt at seq {seq}: {reason}"),
            Error::Violation { seq, violation } => {
                write!(f, "journal violation at seq {seq}: {violation}")
            }
            Error::ReadOnly => write!(f, "the journal is open read-only"),
            Error::Unstorable { event, reason } => write!(f, "cannot store {event}: {reason}"),
            Error::Storage { path, message } => {
                write!(f, "{}: storage error: {message}", path.display())
            }
            Error::Removed { path } => write!(
                f,
                "journal {} was removed while the run was live (its state dir deleted?): nothing \
                 appended from now on could be read back",
                path.display()
            ),
            Error::Truncated { from, to } => {
                write!(f, "truncated: records {from}..{to} lost")
            }
            Error::Damaged { file, message } => {
                write!(f, "storage damaged: {}: {message}", file.display())
            }
        }
    }
}

/// The cause of an `Io` error is in its message (see [`Error`]).
impl std::error::Error for Error {}

impl Error {
    /// The seq this error is about, for corruption and violations.
    pub fn seq(&self) -> Option<Seq> {
        match self {
            Error::Corrupt { seq, .. } | Error::Violation { seq, .. } => Some(*seq),
            Error::Truncated { from, .. } => Some(*from),
            _ => None,
        }
    }

    /// True when the journal itself is damaged (a bad or lost record, files sled cannot read),
    /// as opposed to being unreachable, busy or missing.
    pub fn is_damage(&self) -> bool {
        matches!(
            self,
            Error::Corrupt { .. }
                | Error::Violation { .. }
                | Error::Truncated { .. }
                | Error::Damaged { .. }
        )
    }
}

//! Salvage: every record of a damaged journal that can still be read, for `sortie recover`.
//!
//! The damaged files are never opened by sled in place (its recovery rewrites a damaged log):
//! salvage reads a private copy. What it gives is the longest prefix of records that read back
//! whole and apply in order, the state they fold to, why reading stopped there, how many
//! records the journal had acknowledged (its high-water mark), and the newest snapshot that
//! decodes, even one taken after records that are now lost.
//!
//! sled stops reading its log at the first damage (a flipped byte, a cut), and may refuse to
//! open it at all (its header damaged, its files swapped). The records it no longer gives may
//! still lie whole in the files: each is framed with its own version byte and CRC (`codec`), so
//! the journal directory's files are scanned for them, read-only ([`codec::scan`]), and the
//! prefix goes on with every next seq found there that applies.

use std::collections::BTreeMap;
use std::path::Path;

use sortie_core::{RunState, Seq, Stamped};

use crate::codec;
use crate::journal::{Journal, db_dir};
use crate::mark::Mark;
use crate::{Error, Result};

/// What could be read from a damaged journal.
#[derive(Debug)]
pub struct Salvage {
    /// Every record from seq 0 up to the first one that cannot be read or applied.
    pub records: Vec<Stamped>,
    /// The state they fold to.
    pub state: RunState,
    /// Why reading stopped before the end, if it did (a bad record, a refused one).
    pub stopped: Option<String>,
    /// The high-water mark beside the journal, if one can be read.
    pub acked: Option<Mark>,
    /// The newest snapshot that decodes, whether or not the records it follows survived.
    pub snapshot: Option<(Mark, RunState)>,
    /// How many of `records` sled did not give and the scan of the files found.
    pub scanned: u64,
}

impl Journal {
    /// Reads what can be read of the journal in `run_dir` (see the module docs). Fails only
    /// when there is nothing to read at all (no journal; files sled refuses to open).
    pub fn salvage(run_dir: &Path) -> Result<Salvage> {
        let acked = Mark::read(run_dir);
        let snapshot = crate::snapshot::newest_decodable(run_dir);
        // A page table (sled's snapshot) sled cannot read: read the log without it.
        let journal = match Journal::open_copy(run_dir) {
            Err(Error::Damaged { .. }) => Journal::open_copy_but(run_dir, true),
            other => other,
        };
        let mut records = Vec::new();
        let mut state = RunState::new();
        let mut stopped = None;
        let apply = |r: Stamped, state: &mut RunState| {
            state
                .apply(&r)
                .map(|()| r)
                .map_err(|violation| Error::Violation {
                    seq: Seq(state.next_seq.0),
                    violation,
                })
        };
        match &journal {
            Ok(journal) => {
                for record in journal.read(Seq(0), None) {
                    match record.and_then(|r| apply(r, &mut state)) {
                        Ok(r) => records.push(r),
                        Err(e) => {
                            stopped = Some(e.to_string());
                            break;
                        }
                    }
                }
            }
            // sled cannot open it at all: only the scan reads it.
            Err(e) => stopped = Some(e.to_string()),
        }
        let mut found = scan_files(&db_dir(run_dir));
        let mut scanned = 0;
        while let Some(r) = found.remove(&state.next_seq.0) {
            match apply(r, &mut state) {
                Ok(r) => {
                    records.push(r);
                    scanned += 1;
                }
                Err(_) => break,
            }
        }
        if scanned > 0 && found.is_empty() && journal.is_ok() {
            // sled stopped early, yet every record was found.
            stopped = stopped
                .map(|why| format!("{why} (every later record was found whole in the files)"));
        }
        if records.is_empty() {
            journal?;
        }
        Ok(Salvage {
            records,
            state,
            stopped,
            acked,
            snapshot,
            scanned,
        })
    }
}

/// The records framed in the files under `dir` (sled's log, its blobs), by seq: the last whole
/// one of each. Files that cannot be read are skipped.
fn scan_files(dir: &Path) -> BTreeMap<u64, Stamped> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file()
                && let Ok(bytes) = std::fs::read(entry.path())
            {
                // The last copy of a seq in a file is its newest write (a record sled dropped
                // in a crash and written again under the same seq comes later in its log).
                for r in codec::scan(&bytes) {
                    found.insert(r.seq.0, r);
                }
            }
        }
    }
    found
}

//! Salvage: every record of a damaged journal that can still be read, for `sortie recover`.
//!
//! The damaged files are never opened by sled in place (its recovery rewrites a damaged log):
//! salvage reads a private copy. What it gives is the longest prefix of records that read back
//! whole and apply in order, the state they fold to, why reading stopped there, how many
//! records the journal had acknowledged (its high-water mark), and the newest snapshot that
//! decodes, even one taken after records that are now lost.

use std::path::Path;

use sortie_core::{RunState, Seq, Stamped};

use crate::journal::Journal;
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
}

impl Journal {
    /// Reads what can be read of the journal in `run_dir` (see the module docs). Fails only
    /// when there is nothing to read at all (no journal; files sled refuses to open).
    pub fn salvage(run_dir: &Path) -> Result<Salvage> {
        let acked = Mark::read(run_dir);
        let snapshot = crate::snapshot::newest_decodable(run_dir);
        // A page table (sled's snapshot) sled cannot read: read the log without it.
        let journal = match Journal::open_copy(run_dir) {
            Err(Error::Damaged { .. }) => Journal::open_copy_but(run_dir, true)?,
            other => other?,
        };
        let mut records = Vec::new();
        let mut state = RunState::new();
        let mut stopped = None;
        for record in journal.read(Seq(0), None) {
            let applied = record.and_then(|r| {
                state.apply(&r).map_err(|violation| Error::Violation {
                    seq: r.seq,
                    violation,
                })?;
                Ok(r)
            });
            match applied {
                Ok(r) => records.push(r),
                Err(e) => {
                    stopped = Some(e.to_string());
                    break;
                }
            }
        }
        Ok(Salvage {
            records,
            state,
            stopped,
            acked,
            snapshot,
        })
    }
}

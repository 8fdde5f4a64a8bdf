//! Audit: the whole journal checked record by record, and the usage ledger recomputed from the
//! raw events (core's `Ledger::from_events`) against the replayed state's.

use sortie_core::ledger::{Ledger, LedgerFold};
use sortie_core::{Event, RunState, Seq, Stamped};

use crate::journal::Journal;
use crate::{Error, Result};

impl Journal {
    /// Every record from seq 0 up to `upto` inclusive (None: to the end) and the state folded
    /// from them, never from the snapshot; the newest valid snapshot is checked against the
    /// fold when the fold reaches its seq (a snapshot that differs is damage: `sortie replay`
    /// exits 4). A bad record is an error naming its seq, as for [`Journal::replay`].
    pub fn replay_checked(&self, upto: Option<Seq>) -> Result<CheckedReplay> {
        let snapshot = self.snapshot();
        let mut state = RunState::new();
        let mut events = Vec::new();
        let mut snapshot_mismatch = None;
        for record in self.read(Seq(0), upto) {
            let stamped = record?;
            state
                .apply(&stamped)
                .map_err(|violation| Error::Violation {
                    seq: stamped.seq,
                    violation,
                })?;
            if let Some((mark, snap)) = &snapshot
                && mark.records == state.next_seq.0
            {
                snapshot_mismatch = crate::snapshot::differs(snap, &state);
            }
            events.push(stamped);
        }
        Ok(CheckedReplay {
            events,
            state,
            snapshot_mismatch,
        })
    }

    /// Checks the whole journal: versions, CRCs, dense seqs, legal transitions, and the usage
    /// ledger recomputed from the raw events against the replayed state. Never panics; reports
    /// the first bad record.
    pub fn audit(&self) -> Audit {
        let mut state = RunState::new();
        let mut events = 0u64;
        let mut first_bad = None;
        // Only the events replay accepted, as replay sees them.
        let mut raw = LedgerFold::new();
        // The snapshot is checked against the fold at its seq.
        let snapshot = self.snapshot();
        let mut snapshot_mismatch = None;
        let mut compare = |state: &RunState| {
            if let Some((mark, snap)) = &snapshot
                && state.next_seq.0 == mark.records
            {
                snapshot_mismatch = crate::snapshot::differs(snap, state);
            }
        };
        compare(&state);
        self.scan(None, |record| {
            let record = match record {
                Ok(r) => r,
                Err(e) => {
                    first_bad = Some((e.seq().unwrap_or(Seq(events)), e.to_string()));
                    return false;
                }
            };
            let seq = record.seq;
            let applied = match record.event {
                // Moved into the state, not copied (the ledger counts attempts only). No event
                // applies before it: the fold is still empty, and now knows the run's tasks.
                Event::RunStarted { .. } => state
                    .apply_owned(record)
                    .map(|()| raw = LedgerFold::with_tasks(state.tasks.len())),
                _ => state.apply(&record).map(|()| raw.observe(&record.event)),
            };
            if let Err(violation) = applied {
                let e = Error::Violation { seq, violation };
                first_bad = Some((seq, e.to_string()));
                return false;
            }
            events += 1;
            compare(&state);
            true
        });
        let recomputed = raw.finish();
        let ledger_mismatch = recomputed
            .difference_from_state(&state)
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
            snapshot_mismatch,
        }
    }
}

/// What [`Journal::replay_checked`] read: the records, their fold, and the snapshot's verdict.
#[derive(Debug, Clone)]
pub struct CheckedReplay {
    /// The records read, in seq order.
    pub events: Vec<Stamped>,
    /// The state folded from them.
    pub state: RunState,
    /// How the newest valid snapshot differs from the fold at its seq, if the fold reached
    /// that seq and it does.
    pub snapshot_mismatch: Option<String>,
}

impl CheckedReplay {
    /// True when the snapshot, if the fold reached it, agrees with the fold.
    pub fn snapshot_agrees(&self) -> bool {
        self.snapshot_mismatch.is_none()
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
    /// How the newest valid snapshot differs from the fold at its seq, if it does.
    pub snapshot_mismatch: Option<String>,
}

impl Audit {
    /// True when every record is good and the ledger adds up.
    pub fn is_clean(&self) -> bool {
        self.first_bad.is_none()
            && self.ledger_mismatch.is_none()
            && self.snapshot_mismatch.is_none()
    }
}

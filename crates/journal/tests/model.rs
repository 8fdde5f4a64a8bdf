//! Model-based test of the journal on disk: the core generator's random legal runs (with
//! crashes, Ctrl-C, resumes and cancels) are appended to a real `Journal` in a temporary
//! directory. A crash drops the handle without closing anything; a resume opens the journal
//! again from disk. After every reopen and at the end, the journal must give back the model:
//! `replay(None)` equals the live state before the crash, `read` yields every event with dense
//! seqs, `audit()` is clean, and the audited ledger is what the fake agents reported.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256); the property prints
//! `proptest: NAME: N cases` to stderr when it passes.

#[path = "../../core/tests/support/gen.rs"]
mod generator;

#[path = "../../core/tests/support/oracle.rs"]
mod oracle;

use std::path::PathBuf;

use proptest::test_runner::TestCaseError;
use sortie_core::ledger::{Ledger, ledger};
use sortie_core::{Event, RunState, Seq, Stamped, TaskId, Timestamp};
use sortie_journal::Journal;

use generator::{Backend, Driver, scenario_strategy};
use oracle::{check_grammar, property};

/// A journal on disk that crashes by being dropped.
struct DiskBackend {
    dir: PathBuf,
    journal: Option<Journal>,
    reopens: usize,
}

/// Reads every record, asserting dense seqs from 0.
fn read_all(j: &Journal) -> Vec<Stamped> {
    let events: Vec<Stamped> = j
        .read(Seq(0), None)
        .map(|r| r.unwrap_or_else(|e| panic!("read failed: {e:#}")))
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.seq, Seq(i as u64), "read gives dense seqs");
    }
    assert_eq!(j.next_seq(), Seq(events.len() as u64));
    events
}

impl Backend for DiskBackend {
    fn append(&mut self, at: Timestamp, event: &Event) -> Seq {
        let j = self.journal.as_ref().expect("an open journal to append to");
        j.append(at, event)
            .unwrap_or_else(|e| panic!("append {} failed: {e:#}", event.name()))
    }

    fn crash(&mut self) {
        // No close, no flush: what was acknowledged must be on disk already.
        self.journal = None;
    }

    fn reopen(&mut self) -> RunState {
        self.journal = None;
        let j = open_again(&self.dir);
        self.reopens += 1;
        read_all(&j);
        let audit = j.audit();
        assert!(audit.is_clean(), "audit after a crash: {audit:?}");
        let state = j
            .replay(None)
            .unwrap_or_else(|e| panic!("replay failed: {e:#}"));
        assert_eq!(audit.state, state, "audit replays what replay does");
        self.journal = Some(j);
        state
    }
}

/// Opens the journal again in this process. sled releases its file lock from a background
/// thread after the last handle is dropped, so an open right after a drop may find it still
/// locked for a moment: retry while it says `Locked` (a real crash ends the process, and the
/// lock with it).
fn open_again(dir: &std::path::Path) -> Journal {
    let mut tries = 0u32;
    loop {
        match Journal::open(dir) {
            Ok(j) => return j,
            Err(sortie_journal::Error::Locked { .. }) if tries < 1000 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => panic!("reopen failed after {tries} tries: {e:#}"),
        }
    }
}

/// The ledger of the attempts the journal holds, from the fake agents' reports and the models
/// the attempts were launched on.
fn expected_ledger(events: &[Stamped], trace: &generator::Trace) -> Ledger {
    let mut attempts: Vec<(TaskId, sortie_core::Attempt, Option<String>)> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::AttemptLaunching {
                task,
                attempt,
                model,
            } => Some((*task, *attempt, model.clone())),
            _ => None,
        })
        .collect();
    attempts.sort();
    let mut l = Ledger::new();
    for (task, attempt, model) in attempts {
        let usage = trace
            .reported
            .get(&(task, attempt))
            .copied()
            .unwrap_or(sortie_core::Usage::ZERO);
        l.add(task, model.as_deref(), &usage);
    }
    l
}

#[test]
fn the_journal_on_disk_is_the_model_across_crashes() {
    property(
        "the_journal_on_disk_is_the_model_across_crashes",
        scenario_strategy(),
        |s| {
            let tmp = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            let dir = tmp.path().join("runs").join("model-run");
            let backend = DiskBackend {
                journal: Some(Journal::create(&dir).expect("create the journal")),
                dir,
                reopens: 0,
            };
            let (trace, mut backend) = Driver::run(&s, backend);
            assert_eq!(backend.reopens, trace.reopens);
            // A last crash; a reader sees the run as it was, then a writer reads it all back.
            backend.crash();
            let reader = Journal::open_read_only(&backend.dir).expect("open read-only");
            assert!(reader.is_read_only());
            assert_eq!(read_all(&reader), trace.events, "a reader sees every event");
            drop(reader);
            let state = backend.reopen();
            let j = backend.journal.take().expect("reopened");
            let last = trace.lives.last().expect("RunStarted at least");
            assert_eq!(&state, last, "the journal replays to the last live state");
            let events = read_all(&j);
            assert_eq!(
                events, trace.events,
                "the journal holds exactly what was appended"
            );
            check_grammar(&trace.batch, &events, state.is_finished())
                .map_err(TestCaseError::fail)?;
            let audit = j.audit();
            assert_eq!(
                audit.ledger,
                expected_ledger(&events, &trace),
                "the audited ledger is what the fake agents reported"
            );
            assert_eq!(audit.ledger, ledger(&state));
            for k in [0, events.len() / 2, events.len() - 1] {
                let at = j
                    .replay(Some(Seq(k as u64)))
                    .unwrap_or_else(|e| panic!("replay to {k}: {e:#}"));
                assert_eq!(&at, &trace.lives[k], "replay up to seq {k}");
            }
            // A snapshot of the state at any seq, plus the tail after it, is the full fold;
            // audit, which folds from seq 0, finds the snapshot equal to its fold.
            let n = events.len();
            for k in [0, n / 2, n - 1] {
                j.write_snapshot(&trace.lives[k])
                    .unwrap_or_else(|e| panic!("snapshot at seq {k}: {e:#}"));
                let (mark, snapshot) = j.snapshot().expect("the snapshot just written is valid");
                assert_eq!(mark.records, k as u64 + 1);
                assert_eq!(
                    &snapshot, &trace.lives[k],
                    "the snapshot is the state at seq {k}"
                );
                let latest = j
                    .replay_latest()
                    .unwrap_or_else(|e| panic!("replay from the snapshot at {k}: {e:#}"));
                assert_eq!(latest, state, "snapshot at seq {k} + tail == the full fold");
                let audit = j.audit();
                assert_eq!(audit.snapshot_mismatch, None, "snapshot at seq {k}");
            }
            Ok(())
        },
    );
}

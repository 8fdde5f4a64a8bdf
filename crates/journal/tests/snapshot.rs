//! Property: for random runs (the core generator's, with crashes, Ctrl-C, resumes and
//! cancels), the state read back from a snapshot taken after any event, plus the events after
//! it, is the state of the full fold; and a snapshot is the state it was taken of, bit for bit.
//!
//! `PROPTEST_CASES` sets the number of cases (default 256; `cargo xtask proptest` runs 10,000);
//! the property prints `proptest: NAME: N cases` to stderr when it passes. The on-disk side
//! (write, the newest valid one, stale and corrupt ones ignored) is in `model.rs` and the unit
//! tests of `snapshot.rs`.

#[path = "../../core/tests/support/gen.rs"]
mod generator;

#[path = "../../core/tests/support/oracle.rs"]
mod oracle;

use proptest::test_runner::TestCaseError;
use sortie_journal::fuzzing::{decode_snapshot, encode_snapshot};

use generator::{Driver, MemBackend, scenario_strategy};
use oracle::property;

#[test]
fn state_from_a_snapshot_and_its_tail_is_the_full_fold() {
    property(
        "state_from_a_snapshot_and_its_tail_is_the_full_fold",
        scenario_strategy(),
        |s| {
            let (t, _) = Driver::run(&s, MemBackend::default());
            let last = t.lives.last().expect("RunStarted at least");
            for k in 0..t.events.len() {
                let bytes = encode_snapshot(&t.lives[k]).map_err(TestCaseError::fail)?;
                let mut state = decode_snapshot(&bytes).map_err(TestCaseError::fail)?;
                if state != t.lives[k] {
                    return Err(TestCaseError::fail(format!(
                        "the snapshot after event {k} decodes to another state"
                    )));
                }
                for e in &t.events[k + 1..] {
                    state.apply(e).map_err(|v| {
                        TestCaseError::fail(format!(
                            "seq {} refused after the snapshot: {v}",
                            e.seq
                        ))
                    })?;
                }
                if &state != last {
                    return Err(TestCaseError::fail(format!(
                        "snapshot after event {k} + tail differs from the full fold"
                    )));
                }
            }
            Ok(())
        },
    );
}

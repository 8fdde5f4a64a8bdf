//! The committed format-v2 journal (`tests/fixtures/v2/`, written by `cargo xtask fixture v2`)
//! must still read and replay to the run it holds (`support::v2::every_variant_v2`), every
//! field added since v1 included, whatever fields later builds append to v2's extensions.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod support;

use std::path::{Path, PathBuf};

use sortie_core::{Event, Seq};
use sortie_journal::Journal;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v2")
}

/// The kinds whose records hold a v2 extension: appending a field to it changes how this build
/// writes them, never how the fixture's records read.
const WITH_EXTENSION: [&str; 4] = [
    "RunStarted",
    "AttemptFinished",
    "TaskFinished",
    "TaskCarried",
];

#[test]
fn the_v2_run_is_legal_and_uses_every_variant() {
    let events = support::v2::every_variant_v2();
    let mut names: Vec<&str> = events.iter().map(|(_, e)| e.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), 28, "every variant of Event: {names:?}");
    let tmp = tempfile::tempdir().unwrap();
    let j = Journal::create(&tmp.path().join("run")).unwrap();
    for (at, e) in &events {
        j.append(*at, e).unwrap();
    }
    let audit = j.audit();
    assert!(audit.is_clean(), "{audit:?}");
}

#[test]
fn format_v2_fixture_still_reads_and_replays() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    // Work on a copy: opening a sled database writes to it.
    support::copy_dir(&fixture(), &run);
    let j = Journal::open(&run).unwrap();
    let expected = support::v2::every_variant_v2();
    let records: Vec<_> = j.read(Seq(0), None).map(Result::unwrap).collect();
    assert_eq!(records.len(), expected.len());
    for (i, (r, (at, e))) in records.iter().zip(&expected).enumerate() {
        assert_eq!(
            (r.seq, r.at, &r.event),
            (Seq(i as u64), *at, e),
            "record {i}"
        );
    }
    let audit = j.audit();
    assert!(audit.is_clean(), "{audit:?}");

    // The fields added since v1, as the fixture stored them.
    let state = j.replay(None).unwrap();
    let Some(Event::RunStarted { batch, .. }) = records.first().map(|r| &r.event) else {
        panic!("the fixture starts with RunStarted");
    };
    assert_eq!(batch, &support::v2::batch_v2());
    assert_eq!(batch.tasks[0].tools, ["Read", "Bash"]);
    assert_eq!(batch.config.budget.warn_percent, 75);
    assert_eq!(state.parent.as_ref().unwrap().as_str(), "fixture-v1");
    let states: Vec<&str> = state.tasks.iter().map(|t| t.state.name()).collect();
    assert_eq!(states, ["completed", "cancelled", "cancelled", "completed"]);
    let denied = &state.tasks[0].attempts[0];
    assert_eq!(denied.outcome().unwrap().denials.len(), 2);

    // This build writes the same bytes for every record without an extension; the others
    // read back to the same events.
    let fresh = Journal::create(&tmp.path().join("fresh")).unwrap();
    for (at, e) in &expected {
        fresh.append(*at, e).unwrap();
    }
    for (i, (_, e)) in expected.iter().enumerate() {
        let seq = Seq(i as u64);
        if WITH_EXTENSION.contains(&e.name()) {
            continue;
        }
        assert_eq!(
            fresh.raw_get(seq).unwrap(),
            j.raw_get(seq).unwrap(),
            "record {i} ({}) is encoded differently from format v2",
            e.name()
        );
    }
}

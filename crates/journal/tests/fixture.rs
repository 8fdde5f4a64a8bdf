//! The committed format-v1 journal (`tests/fixtures/v1/`) must still read, replay to the
//! expected state, and be what this build would write for the same events.
//!
//! Regenerate it only together with a format change, in its own commit: `cargo xtask fixture`
//! (which runs `crates/journal/examples/write_fixture.rs`).

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod support;

use std::path::{Path, PathBuf};

use sortie_core::ledger::ledger;
use sortie_core::{RunOutcome, RunStatus, Seq, TaskId};
use sortie_journal::Journal;

/// The kinds that format v2 writes as their `...V2` variant: their records differ from v1's.
const REWRITTEN_IN_V2: [&str; 3] = ["RunStarted", "AttemptFinished", "TaskFinished"];

/// Whether this build still writes `event` with its v1 bytes.
fn written_as_v1(event: &sortie_core::Event) -> bool {
    !REWRITTEN_IN_V2.contains(&event.name())
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1")
}

#[test]
fn format_v1_fixture_still_reads_and_replays() {
    // Work on a copy: opening a sled database writes to it.
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    support::copy_dir(&fixture(), &run);
    let j = Journal::open(&run).unwrap();

    let expected = support::every_variant();
    let names: Vec<&str> = expected.iter().map(|(_, e)| e.name()).collect();
    let mut seen: Vec<&str> = names.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen.len(),
        16,
        "the fixture covers every variant it was written with"
    );

    let records: Vec<_> = j.read(Seq(0), None).map(Result::unwrap).collect();
    assert_eq!(records.len(), expected.len());
    for (i, (r, (at, e))) in records.iter().zip(&expected).enumerate() {
        assert_eq!(
            (r.seq, r.at, &r.event),
            (Seq(i as u64), *at, e),
            "record {i}"
        );
    }

    // The state it replays to, pinned.
    let state = j.replay(None).unwrap();
    assert_eq!(
        state.status,
        RunStatus::Finished {
            state: RunOutcome::Partial
        }
    );
    assert_eq!(state.run_id.as_ref().unwrap().as_str(), "fixture-v1");
    assert_eq!(
        (state.pid, state.resumes, state.next_seq),
        (4343, 1, Seq(27))
    );
    assert_eq!(state.batch_digest, 0xDEAD_BEEF_0123_4567);
    let states: Vec<&str> = state.tasks.iter().map(|t| t.state.name()).collect();
    assert_eq!(states, ["completed", "timeout", "skipped"]);
    let t0 = &state.tasks[0];
    let models: Vec<_> = t0.attempts.iter().map(|a| a.model()).collect();
    assert_eq!(
        models,
        [
            Some("anthropic/claude-sonnet"),
            Some("openai/gpt"),
            Some("anthropic/claude-sonnet")
        ]
    );
    assert_eq!(t0.steps().artifact.as_ref().unwrap().bytes, 17);
    assert_eq!(
        t0.steps().worktree_final.clone(),
        Some((true, Some("2 files changed, 10 insertions(+)".into())))
    );
    let total = state.usage();
    assert_eq!(
        (total.input, total.output, total.turns),
        (16_000, 1_600, 16)
    );
    assert_eq!((total.cost.nanos, total.cost.unreported), (148_140, 1));
    let l = ledger(&state);
    assert_eq!(l.attempts, 4);
    assert_eq!(l.tasks[&TaskId(1)].input, 7_000);
    assert_eq!(l.models[&Some("openai/gpt".to_owned())].input, 3_000);
    assert_eq!(l.models[&None].input, 7_000);

    let audit = j.audit();
    assert!(audit.is_clean(), "{audit:?}");
    assert_eq!(audit.state, state);

    // This build writes the same bytes for the same events, but for the kinds v2 rewrote.
    let fresh = Journal::create(&tmp.path().join("fresh")).unwrap();
    for (at, e) in &expected {
        fresh.append(*at, e).unwrap();
    }
    let rewritten = expected.iter().filter(|(_, e)| !written_as_v1(e)).count();
    assert!(rewritten >= 3, "the fixture holds each rewritten kind");
    for (i, (_, e)) in expected.iter().enumerate() {
        let i = i as u64;
        if !written_as_v1(e) {
            continue;
        }
        assert_eq!(
            fresh.raw_get(Seq(i)).unwrap(),
            j.raw_get(Seq(i)).unwrap(),
            "record {i} is encoded differently from format v1"
        );
    }
}

/// Variants appended to v1 after the fixture was written (`support::appended_variants`): the
/// fixture's run with them inserted writes, reads back and replays, every variant is covered,
/// and the records before the first insertion are byte for byte the fixture's.
#[test]
fn variants_appended_after_the_fixture_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    support::copy_dir(&fixture(), &run);
    let old = Journal::open(&run).unwrap();

    let events = support::every_variant_and_later();
    let mut names: Vec<&str> = events.iter().map(|(_, e)| e.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(
        names.len(),
        24,
        "every event variant, old and appended (AttemptRecorded aside)"
    );

    let j = Journal::create(&tmp.path().join("later")).unwrap();
    for (at, e) in &events {
        j.append(*at, e).unwrap();
    }
    let records: Vec<_> = j.read(Seq(0), None).map(Result::unwrap).collect();
    assert_eq!(records.len(), events.len());
    for (i, (r, (at, e))) in records.iter().zip(&events).enumerate() {
        assert_eq!(
            (r.seq, r.at, &r.event),
            (Seq(i as u64), *at, e),
            "record {i}"
        );
    }
    let state = j.replay(None).unwrap();
    let planned = state.tasks[0].steps().worktree.as_ref().unwrap();
    assert_eq!(planned.branch, "sortie/fixture-v1/t0");
    assert_eq!(planned.base.len(), 40);
    let attempts = &state.tasks[0].attempts;
    assert!(attempts[0].side_effects, "AttemptSideEffects is replayed");
    assert_eq!(
        attempts[2].continues(),
        Some("/work/project/.sortie/runs/fixture-v1/sessions/0.2/s.jsonl")
    );
    assert!(j.audit().is_clean());

    let first = support::appended_variants()
        .iter()
        .map(|(i, _)| *i)
        .min()
        .unwrap();
    for (i, (_, e)) in events.iter().enumerate().take(first) {
        if !written_as_v1(e) {
            continue;
        }
        let i = i as u64;
        assert_eq!(
            j.raw_get(Seq(i)).unwrap(),
            old.raw_get(Seq(i)).unwrap(),
            "record {i}"
        );
    }
}

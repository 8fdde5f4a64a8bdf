//! End-to-end test: a short crash torture (20 SIGKILLs of a 10-task batch at random moments,
//! each followed by a resume), so that CI runs what `cargo xtask torture` runs at length. The
//! torture itself is `xtask/src/torture.rs`, included here as a module so that both drive the
//! same checks; this test runs it against the binary the tests build. The seed comes from the
//! clock and is printed: a failure names it, and `cargo xtask torture --seed S` replays the
//! same choices.
//!
//! The torture stays xtask's (its options, its `anyhow` violations, its report) rather than
//! the test kit's: the kit holds helpers, not drivers, and stays free of anyhow. What the
//! torture shares with the crash tests (the export's view, waits, the `/proc` scan, git) is in
//! `sortie-testkit`, which both xtask and these tests depend on, so nothing is written twice.

#[path = "../../xtask/src/torture.rs"]
#[allow(
    dead_code,
    reason = "the command-line parsing serves only `cargo xtask torture`"
)]
mod engine;

use crate::support::fake_agent;

#[test]
fn a_short_torture_finds_no_violation() {
    let seed = std::env::var("SORTIE_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(engine::clock_seed);
    let opts = engine::Options {
        crashes: 20,
        tasks: 10,
        concurrency: 4,
        max_delay_ms: 1200,
        verbose: true,
        ..engine::Options::new(seed)
    };
    eprintln!("torture: seed {seed} (SORTIE_TORTURE_SEED={seed} replays its choices)");
    let scratch = tempfile::tempdir().expect("tempdir");
    let root = scratch.path().join("torture");
    match engine::torture(
        &opts,
        std::path::Path::new(env!("CARGO_BIN_EXE_sortie")),
        &fake_agent(),
        &root,
    ) {
        Ok(report) => eprintln!("{}", report.text()),
        Err(e) => {
            // Keep the files for a post-mortem.
            let kept = scratch.keep();
            panic!("{e:#}\n(files in {})", kept.display());
        }
    }
}

/// The torture restates the engine's pause hook (xtask does not build the runner): the two
/// must name the same variable, or every paused kill of the torture would be a plain one.
#[test]
fn the_torture_names_the_engines_pause_hook() {
    assert_eq!(engine::PAUSE_AFTER, sortie_runner::engine::TEST_PAUSE_AFTER);
}

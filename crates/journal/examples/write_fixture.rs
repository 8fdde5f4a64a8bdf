//! Writes the committed format-v1 journal fixture (`crates/journal/tests/fixtures/v1`): the
//! run of `support::every_variant`, the events the fixture test reads back and pins.
//!
//! `cargo run -p sortie-journal --example write_fixture -- DIR` (run by `cargo xtask fixture`).
//! Regenerate the fixture only together with a format change, in its own commit: the test
//! `tests/fixture.rs` exists to catch a build that writes v1 differently.

#![allow(
    clippy::unwrap_used,
    reason = "a developer tool: any failure aborts it"
)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;

use sortie_journal::Journal;

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: write_fixture DIR"));
    // Only a journal fixture is replaced: a directory holding anything else is refused.
    if dir.exists() {
        let foreign: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "journal")
            .collect();
        assert!(
            foreign.is_empty(),
            "{} holds more than a journal ({foreign:?}): not replacing it",
            dir.display()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
    let j = Journal::create(&dir).unwrap();
    for (at, e) in support::every_variant() {
        j.append(at, &e).unwrap();
    }
    drop(j);
    println!("write_fixture: wrote {}", dir.display());
}

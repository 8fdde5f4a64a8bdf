//! Writes a committed journal fixture: v1 (`crates/journal/tests/fixtures/v1`) holds the run of
//! `support::every_variant`, v2 (`fixtures/v2`) the run of `support::v2::every_variant_v2`; the
//! fixture tests read them back and pin them.
//!
//! `cargo run -p sortie-journal --example write_fixture -- v1|v2 DIR` (run by `cargo xtask
//! fixture v1|v2`). A fixture is written once, when its format is made, in its own commit: the
//! tests `tests/fixture.rs` and `tests/fixture_v2.rs` exist to catch a build that can no longer
//! read what an older one wrote.

#![allow(
    clippy::unwrap_used,
    reason = "a developer tool: any failure aborts it"
)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;

use sortie_journal::Journal;

fn main() {
    let usage = "usage: write_fixture v1|v2 DIR";
    let version = std::env::args().nth(1).expect(usage);
    let dir = PathBuf::from(std::env::args().nth(2).expect(usage));
    let events = match version.as_str() {
        "v1" => support::every_variant(),
        "v2" => support::v2::every_variant_v2(),
        _ => panic!("{usage}"),
    };
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
    for (at, e) in events {
        j.append(at, &e).unwrap();
    }
    drop(j);
    println!("write_fixture: wrote {}", dir.display());
}

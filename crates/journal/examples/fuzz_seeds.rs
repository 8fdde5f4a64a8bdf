//! Writes the seed corpus of the `journal_decode` fuzz target: one file per record, encoded by
//! this build, for every event variant and a short realistic run.
//!
//! `cargo run -p sortie-journal --example fuzz_seeds -- DIR` (run by `cargo xtask fuzz`).

#![allow(
    clippy::unwrap_used,
    reason = "a developer tool: any failure aborts it"
)]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;

use sortie_core::Seq;
use sortie_journal::fuzzing::encode_record;

fn main() {
    let dir = PathBuf::from(std::env::args().nth(1).expect("usage: fuzz_seeds DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (at, event)) in support::every_variant_and_later()
        .into_iter()
        .chain(support::realistic(2, 1))
        .enumerate()
    {
        let bytes = encode_record(Seq(i as u64), at, &event).unwrap();
        std::fs::write(dir.join(format!("record-{i:03}")), bytes).unwrap();
    }
}

//! The export format (`sortie export`): every event kind prints exactly as core's serde derive
//! printed it when the format was frozen (plus `"v": 1`), and a small journal's export is pinned
//! to a committed file.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests panic on failure"
)]

mod support;

use sortie_core::{Seq, Stamped};
use sortie_journal::{EXPORT_VERSION, ExportRecord};

fn stamped(all: Vec<(sortie_core::Timestamp, sortie_core::Event)>) -> Vec<Stamped> {
    all.into_iter()
        .enumerate()
        .map(|(i, (at, event))| Stamped {
            seq: Seq(i as u64),
            at,
            event,
        })
        .collect()
}

#[test]
fn every_event_exports_as_core_serialized_it_plus_the_version() {
    for s in stamped(support::every_variant_and_later()) {
        // Text, not values: the fields come in the same order too.
        let core = serde_json::to_string(&s).unwrap();
        let export = serde_json::to_string(&ExportRecord::from(&s)).unwrap();
        let core = format!("{{\"v\":{EXPORT_VERSION},{}", &core[1..]);
        assert_eq!(export, core, "{}", s.event.name());
    }
}

#[test]
fn a_small_journal_exports_as_the_committed_file() {
    let lines: String = stamped(support::every_variant_and_later())
        .iter()
        .map(|s| serde_json::to_string(&ExportRecord::from(s)).unwrap() + "\n")
        .collect();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/export-v1.jsonl");
    let expected = std::fs::read_to_string(path).expect("the committed export");
    assert!(
        lines == expected,
        "the export format changed: a change users parse. If it is meant, bump EXPORT_VERSION \
         and commit the new file ({path}). Now:\n{lines}"
    );
}

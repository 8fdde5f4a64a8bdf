//! Shared by the tests that read recorded agent streams: where the fixtures are, the exit code
//! each stream was recorded with, feeding a stream to a fresh reader, and the monotone-progress
//! check every reader must pass.

#![allow(dead_code, reason = "each test binary uses a different part")]

use std::collections::BTreeMap;

use sortie_core::{Protocol, Usage};
use sortie_protocol::{Exit, Finished, Progress, reader_for};

/// The recorded streams and their exit-code tables.
pub(crate) const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/agents");

/// The text of `<name>.jsonl`.
pub(crate) fn fixture(name: &str) -> String {
    let path = format!("{FIXTURES}/{name}.jsonl");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The exit code of every stream listed in `table` (a TSV of `name<TAB>exit=N ...`).
pub(crate) fn exit_codes(table: &str) -> BTreeMap<String, i32> {
    let path = format!("{FIXTURES}/{table}");
    let tsv = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    tsv.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut fields = l.split('\t');
            let name = fields.next().expect("name").to_owned();
            let code = fields
                .next()
                .and_then(|f| f.strip_prefix("exit="))
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("no exit= in {l:?}"));
            (name, code)
        })
        .collect()
}

/// Feeds `lines` to a fresh reader; returns every progress, the parse errors and the end.
pub(crate) fn run<'a>(
    protocol: Protocol,
    lines: impl IntoIterator<Item = &'a str>,
    exit: Exit,
    stderr: &str,
) -> (Vec<Progress>, u64, Finished) {
    let mut r = reader_for(protocol);
    let progress: Vec<Progress> = lines.into_iter().filter_map(|l| r.line(l)).collect();
    let errors = r.parse_errors();
    (progress, errors, r.finish(exit, stderr))
}

/// Live usage never goes backwards, side effects once seen stay seen, and the final usage is
/// at least the last progress.
pub(crate) fn assert_monotone(name: &str, progress: &[Progress], finished: &Finished) {
    let mut prev = Usage::ZERO;
    let mut side_effects = false;
    for p in progress {
        assert!(
            p.usage.dominates(&prev),
            "{name}: {:?} after {prev:?}",
            p.usage
        );
        assert!(
            p.side_effects || !side_effects,
            "{name}: side effects forgotten"
        );
        prev = p.usage;
        side_effects = p.side_effects;
    }
    assert!(
        finished.usage.dominates(&prev),
        "{name}: final {:?} < {prev:?}",
        finished.usage
    );
}

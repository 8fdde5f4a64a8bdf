//! Helpers shared by sortie's fuzz targets: how an input becomes protocol lines and an exit.

use sortie_core::{Protocol, Usage};
use sortie_protocol::{Exit, reader_for};

/// Feeds `data` to the reader of `protocol` as stdout lines, then finishes it.
///
/// The input is split at newlines (invalid UTF-8 replaced, as the attempt's line reader does);
/// a line holding only `\x00EXIT` starts the tail: its next byte picks the exit (even: that
/// code, odd: that signal) and the rest is the stderr tail. Every reader must take any line
/// and any end without panicking, and report progress whose token and turn counters never go
/// backwards ([`Usage::dominates`], the journal's rule for live checkpoints, but for the cost,
/// which the attempt loop raises to the larger reading itself).
pub fn run_reader(protocol: Protocol, data: &[u8]) {
    let (stdout, tail) = match find(data, b"\n\x00EXIT") {
        Some(i) => (&data[..i], &data[i + 6..]),
        None => (data, &[][..]),
    };
    let exit = match tail.first() {
        None => Exit::Code(0),
        Some(b) if b % 2 == 0 => Exit::Code(i32::from(*b / 2)),
        Some(b) => Exit::Signal(i32::from(*b / 2)),
    };
    let stderr = String::from_utf8_lossy(tail.get(1..).unwrap_or_default());
    let mut reader = reader_for(protocol);
    let mut last: Option<Usage> = None;
    for line in stdout.split(|b| *b == b'\n') {
        let line = String::from_utf8_lossy(line);
        if let Some(p) = reader.line(line.trim_end_matches('\r')) {
            if let Some(prev) = &last {
                // The counters never go backwards. The cost may: a reader replaces it with
                // the latest reading (a later `result` of a malformed Claude stream can report
                // less), and the attempt loop keeps the larger before anything is journaled.
                let counters = |u: &Usage| Usage {
                    cost: prev.cost,
                    context_tokens: 0,
                    ..*u
                };
                assert!(
                    counters(&p.usage).dominates(&counters(prev)),
                    "usage counters went backwards: {prev:?} then {:?}",
                    p.usage
                );
            }
            last = Some(p.usage);
        }
    }
    let _ = reader.parse_errors();
    let _ = reader.run_phase();
    let _ = reader.finish(exit, &stderr);
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

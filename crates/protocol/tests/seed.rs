//! #10: a resumed attempt whose transcript was cut below the journaled offset: a reader that
//! reads only the lines after the cut, seeded with what the cut lines counted (the journal's
//! checkpoint less what the reader made of the lines it saw), ends with the usage of a reader
//! that read every line, for each protocol.

use sortie_core::{Protocol, Usage};
use sortie_protocol::{Exit, reader_for};

/// The usage a reader of `protocol` gives after `lines` (seeded first when `seed` is some),
/// and its last progress reading after the first `at` of them.
fn read(protocol: Protocol, lines: &[String], seed_at: Option<(Usage, usize)>) -> Usage {
    let mut reader = reader_for(protocol);
    for (k, line) in lines.iter().enumerate() {
        if let Some((seed, at)) = seed_at
            && k == at
        {
            reader.seed(seed);
        }
        reader.line(line);
    }
    reader.finish(Exit::Code(0), "").usage
}

/// The last reading after `lines`.
fn reading(protocol: Protocol, lines: &[String]) -> Usage {
    let mut reader = reader_for(protocol);
    let mut last = Usage::ZERO;
    for line in lines {
        if let Some(p) = reader.line(line) {
            last = p.usage;
        }
    }
    last
}

/// Checks that cutting `lines[cut.0..cut.1]` and seeding at `cut.1` gives the full usage.
fn check(protocol: Protocol, lines: &[String], cut: (usize, usize), journaled_at: usize) {
    let whole = read(protocol, lines, None);
    // What the journal held: the reading after the first `journaled_at` lines (its checkpoint
    // and offset share a write).
    let seen = reading(protocol, &lines[..journaled_at]);
    let kept: Vec<String> = lines[..cut.0]
        .iter()
        .chain(&lines[cut.1..])
        .cloned()
        .collect();
    let offset_in_kept = journaled_at - (cut.1 - cut.0);
    let replayed = reading(protocol, &kept[..offset_in_kept]);
    let seeded = read(
        protocol,
        &kept,
        Some((seen.minus(&replayed), offset_in_kept)),
    );
    let field = |u: &Usage| (u.input, u.output, u.turns);
    assert_eq!(field(&seeded), field(&whole), "{protocol:?}");
    let unseeded = read(protocol, &kept, None);
    assert_ne!(
        field(&unseeded),
        field(&whole),
        "{protocol:?}: the cut loses usage without the seed"
    );
}

#[test]
fn pi_counts_the_cut_calls() {
    let lines: Vec<String> = (1..=10)
        .map(|k| {
            let stop = if k == 10 { "stop" } else { "toolUse" };
            format!(
                r#"{{"type":"message_end","message":{{"role":"assistant","content":[{{"type":"text","text":"step {k}"}}],"usage":{{"input":10,"output":2,"totalTokens":12}},"stopReason":"{stop}"}}}}"#
            )
        })
        .collect();
    check(Protocol::PiJson, &lines, (2, 5), 7);
}

#[test]
fn claude_counts_the_cut_messages_until_its_result() {
    let mut lines: Vec<String> = (1..=8)
        .map(|k| {
            format!(
                r#"{{"type":"assistant","message":{{"id":"m{k}","content":[{{"type":"text","text":"step {k}"}}],"usage":{{"input_tokens":10,"output_tokens":2}}}}}}"#
            )
        })
        .collect();
    // Without a result line the sum of the messages is the attempt's usage.
    check(Protocol::ClaudeStreamJson, &lines, (1, 4), 6);
    // With one, its totals are, seeded or not.
    lines.push(
        r#"{"type":"result","subtype":"success","is_error":false,"result":"done","usage":{"input_tokens":80,"output_tokens":16},"total_cost_usd":0.01,"num_turns":8}"#
            .to_owned(),
    );
    let whole = read(Protocol::ClaudeStreamJson, &lines, None);
    let kept: Vec<String> = lines[..1].iter().chain(&lines[4..]).cloned().collect();
    let seeded = read(
        Protocol::ClaudeStreamJson,
        &kept,
        Some((
            Usage {
                input: 30,
                output: 6,
                turns: 3,
                ..Usage::ZERO
            },
            2,
        )),
    );
    assert_eq!((seeded.input, seeded.output), (whole.input, whole.output));
}

#[test]
fn codex_counts_the_cut_turns() {
    let lines: Vec<String> = (1..=6)
        .flat_map(|k| {
            [
                r#"{"type":"turn.started"}"#.to_owned(),
                format!(
                    r#"{{"type":"turn.completed","usage":{{"input_tokens":{},"output_tokens":{}}}}}"#,
                    10 * k,
                    2 * k
                ),
            ]
        })
        .collect();
    let whole = read(Protocol::CodexJson, &lines, None);
    let kept: Vec<String> = lines[..2].iter().chain(&lines[6..]).cloned().collect();
    let seen = reading(Protocol::CodexJson, &lines[..8]);
    let replayed = reading(Protocol::CodexJson, &kept[..4]);
    let seeded = read(Protocol::CodexJson, &kept, Some((seen.minus(&replayed), 4)));
    assert_eq!(
        (seeded.input, seeded.output, seeded.turns),
        (whole.input, whole.output, whole.turns)
    );
}

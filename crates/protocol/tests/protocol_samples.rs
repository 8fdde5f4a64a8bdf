//! The pi-json and claude-stream-json readers over the streams recorded from the real CLIs
//! (pi 0.73.1 and Claude Code 2.1.332 against a scripted mock model server; copied into
//! `tests/fixtures/agents`, with the exit code each was recorded with in `exit_codes.tsv`),
//! and over damaged streams: garbage lines, streams cut short, empty stdout, huge lines.

use std::collections::BTreeMap;
use std::time::Instant;

use sortie_core::{AttemptStatus, Protocol, StopReason};
use sortie_protocol::{Exit, classify_provider_error, reader_for};

mod samples;

use samples::{assert_monotone, fixture, run};

fn exit_codes() -> BTreeMap<String, i32> {
    samples::exit_codes("exit_codes.tsv")
}

fn protocol_of(name: &str) -> Protocol {
    if name.starts_with("claude") {
        Protocol::ClaudeStreamJson
    } else {
        Protocol::PiJson
    }
}

/// What a reader must derive from one recorded sample.
struct Expect {
    name: &'static str,
    /// input, output, cache_read, cache_write.
    tokens: [u64; 4],
    /// Cost in nano-dollars (always reported in these samples).
    nanos: u64,
    turns: u32,
    context_tokens: u64,
    status: AttemptStatus,
    reason: StopReason,
    /// `classify_provider_error` of the outcome's error, when there is an error.
    error_class: Option<StopReason>,
    /// The error text, when there is one.
    error: Option<&'static str>,
    /// The attempt's text (the answer, else the error).
    output: &'static str,
    side_effects: bool,
}

const CLAUDE_500: &str = "API Error: 500 mock: internal server error. This is a server-side \
                          issue, usually temporary — try again in a moment. If it persists, \
                          check your inference gateway (127.0.0.1:";
const CLAUDE_429: &str = "API Error: Request rejected (429) · mock: rate limit exceeded (429)";
const HELLO: &str = "Hello from the mock LLM. Task complete.";
const DONE: &str = "Done: I ran the command and wrote out.txt.";

fn expectations() -> Vec<Expect> {
    use AttemptStatus::{Completed, Failed, Partial};
    let ok = |name, tokens, nanos, turns, ctx, output, side_effects| Expect {
        name,
        tokens,
        nanos,
        turns,
        context_tokens: ctx,
        status: Completed,
        reason: StopReason::Completed,
        error_class: None,
        error: None,
        output,
        side_effects,
    };
    let failed = |name, turns, error: &'static str| Expect {
        name,
        tokens: [0; 4],
        nanos: 0,
        turns,
        context_tokens: 0,
        status: Failed,
        reason: StopReason::Error,
        error_class: Some(StopReason::Error),
        error: Some(error),
        output: error,
        side_effects: false,
    };
    vec![
        // pi, OpenAI-style provider.
        ok("ok", [100, 12, 50, 0], 495_000, 1, 162, HELLO, false),
        ok("tool", [200, 24, 100, 0], 990_000, 2, 162, DONE, true),
        failed("error500", 4, "500 mock: internal server error"),
        failed("ratelimit429", 4, "429 mock: rate limit exceeded (429)"),
        failed("error500_noretry", 1, "500 mock: internal server error"),
        failed(
            "ratelimit429_noretry",
            1,
            "429 mock: rate limit exceeded (429)",
        ),
        ok(
            "flaky500",
            [100, 12, 50, 0],
            495_000,
            1,
            162,
            "Recovered after a transient error. Task complete.",
            false,
        ),
        ok(
            "slow",
            [100, 12, 50, 0],
            495_000,
            1,
            162,
            "one two three four five six seven eight nine ten",
            false,
        ),
        Expect {
            name: "stall_then_close",
            tokens: [0; 4],
            nanos: 0,
            turns: 1,
            context_tokens: 0,
            status: Partial,
            reason: StopReason::ProtocolError,
            error_class: None,
            error: Some(
                "the answer was cut short: pi reported no usage for it (a stream closed early)",
            ),
            output: "Starting the ",
            side_effects: false,
        },
        failed("hangpre_timeout", 1, "Request timed out."),
        // pi, Anthropic-style provider.
        ok(
            "anthropic_ok",
            [100, 12, 50, 0],
            495_000,
            1,
            162,
            HELLO,
            false,
        ),
        ok(
            "anthropic_tool",
            [200, 24, 100, 0],
            990_000,
            2,
            162,
            DONE,
            true,
        ),
        // Claude Code.
        ok("claude_ok", [100, 12, 50, 0], 495_000, 1, 151, HELLO, false),
        ok(
            "claude_tool",
            [200, 24, 100, 0],
            990_000,
            2,
            151,
            DONE,
            true,
        ),
        failed("claude_error500_noretry", 1, CLAUDE_500),
        failed("claude_ratelimit429_noretry", 1, CLAUDE_429),
        failed("claude_error500_default_retries", 1, CLAUDE_500),
        failed("claude_ratelimit429_default_retries", 1, CLAUDE_429),
        // result.usage says 13 output tokens, modelUsage (and the cost) 15: the larger wins.
        ok(
            "claude_stall_then_close",
            [200, 15, 100, 0],
            855_000,
            1,
            162,
            "Starting the work",
            false,
        ),
    ]
}

#[test]
fn every_recorded_sample_is_read_as_expected() {
    let codes = exit_codes();
    let expected = expectations();
    let covered: Vec<&str> = expected.iter().map(|e| e.name).collect();
    let recorded: Vec<&str> = codes.keys().map(String::as_str).collect();
    let mut sorted = covered.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted, recorded,
        "every sample of exit_codes.tsv has an expectation"
    );

    for e in &expected {
        let code = codes[e.name];
        let text = fixture(e.name);
        let (_, errors, f) = run(protocol_of(e.name), text.lines(), Exit::Code(code), "");
        let u = f.usage;
        let at = format!("sample {} (exit {code})", e.name);
        assert_eq!(errors, 0, "{at}: parse errors");
        assert_eq!(
            [u.input, u.output, u.cache_read, u.cache_write],
            e.tokens,
            "{at}: tokens"
        );
        assert_eq!(u.reasoning, 0, "{at}: reasoning");
        assert_eq!(u.cost.nanos, e.nanos, "{at}: cost");
        assert!(u.cost.is_complete(), "{at}: cost reported");
        assert_eq!(u.turns, e.turns, "{at}: turns");
        assert_eq!(u.context_tokens, e.context_tokens, "{at}: context tokens");
        assert_eq!(f.outcome.status, e.status, "{at}: status");
        assert_eq!(f.outcome.stop_reason, e.reason, "{at}: stop reason");
        assert_eq!(f.outcome.side_effects, e.side_effects, "{at}: side effects");
        assert_eq!(f.outcome.signal, None, "{at}");
        let want_exit = if e.status == AttemptStatus::Failed && code == 0 {
            1
        } else {
            code
        };
        assert_eq!(f.outcome.exit_code, Some(want_exit), "{at}: exit code");
        match e.error {
            Some(want) => {
                let got = f.outcome.error.as_deref().unwrap_or_default();
                assert!(got.starts_with(want), "{at}: error {got:?}");
            }
            None => assert_eq!(f.outcome.error, None, "{at}: error"),
        }
        assert_eq!(
            f.outcome.error.as_deref().and_then(classify_provider_error),
            e.error_class,
            "{at}: error class"
        );
        assert!(
            f.output.starts_with(e.output),
            "{at}: output {:?}",
            f.output
        );
        assert_eq!(
            f.has_output,
            e.status != AttemptStatus::Failed,
            "{at}: has_output"
        );
    }
}

/// Progress never goes backwards, and the final usage is never below the last progress.
#[test]
fn progress_is_monotone_on_every_sample() {
    for (name, code) in exit_codes() {
        let text = fixture(&name);
        let (progress, _, f) = run(protocol_of(&name), text.lines(), Exit::Code(code), "");
        assert!(!progress.is_empty(), "{name}: some progress");
        assert_monotone(&name, &progress, &f);
    }
}

#[test]
fn claude_progress_comes_from_the_assistant_messages_before_the_result() {
    let text = fixture("claude_tool");
    let lines: Vec<&str> = text.lines().collect();
    let mut r = reader_for(Protocol::ClaudeStreamJson);
    assert_eq!(
        r.line(lines[0]).and_then(|p| p.activity).as_deref(),
        Some("starting")
    );
    let p = r.line(lines[1]).expect("tool call");
    assert_eq!(p.activity.as_deref(), Some("Bash: echo hi > out.txt"));
    assert!(p.side_effects);
    // The message_start snapshot: output 1, cost unknown until the result line.
    assert_eq!((p.usage.input, p.usage.output, p.usage.turns), (100, 1, 1));
    assert!(!p.usage.cost.is_complete());
    r.line(lines[2]);
    let p = r.line(lines[3]).expect("second message");
    assert_eq!((p.usage.input, p.usage.output, p.usage.turns), (200, 2, 2));
    let p = r.line(lines[4]).expect("result");
    assert_eq!((p.usage.input, p.usage.output, p.usage.turns), (200, 24, 2));
    assert_eq!(p.usage.cost.nanos, 990_000);
}

#[test]
fn pi_progress_sums_each_call_and_names_the_tool() {
    let text = fixture("tool");
    let mut r = reader_for(Protocol::PiJson);
    let mut seen = Vec::new();
    for line in text.lines() {
        if let Some(p) = r.line(line) {
            seen.push(p);
        }
    }
    let tool = seen
        .iter()
        .find(|p| p.activity.as_deref() == Some("bash: echo hi > out.txt"))
        .expect("the tool shows as the activity");
    assert!(tool.side_effects);
    assert_eq!((tool.usage.input, tool.usage.turns), (100, 1));
    assert_eq!(tool.usage.cost.nanos, 495_000);
    let last = seen.last().expect("progress");
    assert_eq!((last.usage.input, last.usage.turns), (200, 2));
}

#[test]
fn garbage_lines_are_counted_and_change_nothing() {
    let garbage = [
        "not json",
        "{",
        "[1,2,3]",
        "42",
        r#"{"no_type":true}"#,
        r#"{"type":7}"#,
        "\u{0}\u{1}binary",
        r#"{"type":"message_end","message":{"role":"assistant","usage":"lots"}}"#,
        "(node:123) ExperimentalWarning: something",
    ];
    for (name, protocol) in [
        ("ok", Protocol::PiJson),
        ("claude_ok", Protocol::ClaudeStreamJson),
    ] {
        let text = fixture(name);
        let clean = run(protocol, text.lines(), Exit::Code(0), "").2;
        let mut lines: Vec<&str> = Vec::new();
        for l in text.lines() {
            lines.extend(garbage);
            lines.push(l);
            lines.push("");
        }
        let (_, errors, f) = run(protocol, lines, Exit::Code(0), "");
        // The last garbage line is a bad message_end for pi only; for Claude it is an
        // unknown event type, which is not an error.
        let per_line = if protocol == Protocol::PiJson { 9 } else { 8 };
        assert_eq!(errors, per_line * text.lines().count() as u64, "{name}");
        assert_eq!(f, clean, "{name}: garbage changes nothing");
        assert_eq!(f.outcome.status, AttemptStatus::Completed);
    }
}

#[test]
fn pi_cut_in_the_middle_of_an_answer_is_not_completed() {
    let text = fixture("ok");
    let head: Vec<&str> = text.lines().take(10).collect();

    let (_, _, f) = run(Protocol::PiJson, head.iter().copied(), Exit::Code(0), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    assert_eq!(
        f.output, "Hello from the ",
        "the text streamed so far is kept"
    );
    assert_eq!(f.outcome.exit_code, Some(0));
    assert!(
        f.outcome
            .error
            .as_deref()
            .is_some_and(|e| e.contains("before the end of its run")),
        "{:?}",
        f.outcome.error
    );

    // pi exits 143 on SIGTERM (it handles the signal).
    let (_, _, f) = run(Protocol::PiJson, head.iter().copied(), Exit::Code(143), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);
    assert_eq!(f.outcome.exit_code, Some(143));
    assert!(
        f.outcome
            .error
            .as_deref()
            .is_some_and(|e| e.contains("SIGTERM"))
    );

    let (_, _, f) = run(Protocol::PiJson, head.iter().copied(), Exit::Signal(9), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);
    assert_eq!(f.outcome.signal, Some(9));

    // Cut before any text: nothing useful, failed.
    let (_, _, f) = run(Protocol::PiJson, text.lines().take(6), Exit::Code(0), "");
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    assert_eq!(
        f.outcome.exit_code,
        Some(1),
        "a failed exit 0 is reported as 1"
    );

    // Cut after the answer but before agent_end: the answer is there, the run did not end.
    let (_, _, f) = run(Protocol::PiJson, text.lines().take(16), Exit::Code(0), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.output, HELLO);
    assert_eq!(f.usage.output, 12);
}

#[test]
fn pi_killed_while_it_waits_to_retry_is_failed() {
    let text = fixture("error500");
    // Up to and including the first auto_retry_start.
    let head: Vec<&str> = text.lines().take(10).collect();
    assert!(head[9].contains("auto_retry_start"));
    let (_, _, f) = run(Protocol::PiJson, head.iter().copied(), Exit::Code(143), "");
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::Error);
    let (_, _, f) = run(Protocol::PiJson, head.iter().copied(), Exit::Signal(15), "");
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);
    assert!(
        f.outcome
            .error
            .as_deref()
            .is_some_and(|e| e.contains("500 mock: internal server error"))
    );
}

#[test]
fn pi_recovered_retry_counts_every_call() {
    // A failed call, pi's own retry, then a good answer: the last agent_end decides.
    let error = fixture("error500_noretry");
    let ok = fixture("ok");
    let mut lines: Vec<&str> = error.lines().collect();
    let retry_start = r#"{"type":"auto_retry_start","attempt":1,"maxAttempts":3,"delayMs":2000,"errorMessage":"500 mock: internal server error"}"#;
    let retry_end = r#"{"type":"auto_retry_end","success":true,"attempt":1}"#;
    lines.push(retry_start);
    let ok_lines: Vec<&str> = ok.lines().collect();
    lines.push(ok_lines[1]); // agent_start
    lines.push(ok_lines[2]); // turn_start
    lines.extend(&ok_lines[5..16]); // assistant message_start .. message_end
    lines.push(retry_end);
    lines.extend(&ok_lines[16..]); // turn_end, agent_end
    let (_, errors, f) = run(Protocol::PiJson, lines, Exit::Code(0), "");
    assert_eq!(errors, 0);
    assert_eq!(f.outcome.status, AttemptStatus::Completed);
    assert_eq!(f.output, HELLO);
    assert_eq!((f.usage.turns, f.usage.output), (2, 12));
}

#[test]
fn claude_cut_before_the_result_is_not_completed() {
    let text = fixture("claude_tool");
    // Tool call and its result only: no text, nothing useful.
    let (_, _, f) = run(
        Protocol::ClaudeStreamJson,
        text.lines().take(3),
        Exit::Code(0),
        "",
    );
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    assert_eq!(f.outcome.exit_code, Some(1));
    assert!(f.outcome.side_effects);
    assert!(
        !f.usage.cost.is_complete(),
        "no result line: the cost is unknown"
    );
    // The final message without its result line: partial.
    let (_, _, f) = run(
        Protocol::ClaudeStreamJson,
        text.lines().take(4),
        Exit::Signal(15),
        "",
    );
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);
    assert_eq!(f.output, DONE);
    assert_eq!((f.usage.input, f.usage.turns), (200, 2));
}

#[test]
fn a_line_cut_in_half_is_a_parse_error_and_not_completed() {
    for name in ["ok", "claude_ok"] {
        let text = fixture(name);
        let lines: Vec<&str> = text.lines().collect();
        let last = lines[lines.len() - 1];
        let mut cut = lines[..lines.len() - 1].to_vec();
        cut.push(&last[..last.len() / 2]);
        let (_, errors, f) = run(protocol_of(name), cut, Exit::Code(0), "");
        assert_eq!(errors, 1, "{name}");
        assert_ne!(f.outcome.status, AttemptStatus::Completed, "{name}");
        assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError, "{name}");
    }
}

#[test]
fn empty_stdout_is_never_completed() {
    for protocol in [Protocol::PiJson, Protocol::ClaudeStreamJson] {
        let (_, _, f) = run(protocol, [], Exit::Code(0), "");
        assert_eq!(f.outcome.status, AttemptStatus::Failed);
        assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
        assert_eq!(f.outcome.exit_code, Some(1));
        assert!(
            f.outcome
                .error
                .as_deref()
                .is_some_and(|e| e.contains("without printing its event stream")),
            "{:?}",
            f.outcome.error
        );
        assert!(!f.has_output);
        assert!(
            !f.usage.cost.is_complete(),
            "nothing reported: unknown cost"
        );

        // Exit 1 with a stderr that names the problem (pi: no usable model or API key).
        let stderr = "Warning: something\nError: No API key found for provider anthropic\n";
        let (_, _, f) = run(protocol, [], Exit::Code(1), stderr);
        assert_eq!(f.outcome.stop_reason, StopReason::ModelError);
        assert_eq!(f.outcome.exit_code, Some(1));
        assert!(
            f.output
                .ends_with("No API key found for provider anthropic"),
            "{}",
            f.output
        );
        let (_, _, f) = run(protocol, [], Exit::Code(2), "bad settings\n");
        assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    }
}

#[test]
fn huge_message_update_lines_are_read_quickly() {
    let text = fixture("ok");
    let lines: Vec<&str> = text.lines().collect();
    // A 1 MiB update, as pi prints late in a long answer (the partial message twice).
    let body = "x".repeat(500 * 1024);
    let huge = format!(
        r#"{{"type":"message_update","assistantMessageEvent":{{"type":"text_delta","contentIndex":0,"delta":"y","partial":{{"role":"assistant","content":[{{"type":"text","text":"{body}"}}]}}}},"message":{{"role":"assistant","content":[{{"type":"text","text":"{body}"}}]}}}}"#
    );
    let cut = &huge[..huge.len() - 10];
    let mut with_huge: Vec<&str> = lines[..14].to_vec();
    for _ in 0..20 {
        with_huge.push(&huge);
    }
    with_huge.push(cut);
    with_huge.extend(&lines[14..]);
    let start = Instant::now();
    let (_, errors, f) = run(Protocol::PiJson, with_huge, Exit::Code(0), "");
    let took = start.elapsed();
    assert_eq!(errors, 1, "the line cut by the 1 MiB cap is a parse error");
    assert_eq!(f.outcome.status, AttemptStatus::Completed);
    assert_eq!(f.output, HELLO, "the final message decides the text");
    eprintln!("21 MiB of message_update lines read in {took:?}");

    // Killed right after the huge updates: their deltas are the partial text.
    let mut killed: Vec<&str> = lines[..8].to_vec();
    killed.push(&huge);
    let (_, _, f) = run(Protocol::PiJson, killed, Exit::Signal(15), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.output, "Hello y");
}

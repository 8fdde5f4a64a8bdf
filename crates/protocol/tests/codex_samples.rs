//! The codex-json reader over the streams recorded from the real Codex CLI (codex-cli 0.171.0
//! against `tests/mock-llm/codex_server.py`; in `tests/fixtures/agents/codex_*.jsonl`, with the
//! exit code each was recorded with in `codex_exit_codes.tsv`), and over damaged streams:
//! garbage lines, streams cut short, a stream killed while codex retries.

use std::collections::BTreeMap;

use sortie_core::{AttemptStatus, Protocol, StopReason};
use sortie_protocol::codex::classify_codex_error;
use sortie_protocol::{Exit, Finished, Progress};

mod samples;

use samples::{assert_monotone, fixture};

/// The exit code of every codex sample, from `codex_exit_codes.tsv`.
fn exit_codes() -> BTreeMap<String, i32> {
    samples::exit_codes("codex_exit_codes.tsv")
}

/// Feeds `lines` to a fresh codex reader; returns every progress, the parse errors and the end.
fn run<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    exit: Exit,
    stderr: &str,
) -> (Vec<Progress>, u64, Finished) {
    samples::run(Protocol::CodexJson, lines, exit, stderr)
}

/// What the reader must derive from one recorded sample.
struct Expect {
    name: &'static str,
    /// input (without cached), output, cache_read, cache_write.
    tokens: [u64; 4],
    reasoning: u64,
    turns: u32,
    status: AttemptStatus,
    reason: StopReason,
    /// The error text (a prefix of it), when there is one.
    error: Option<&'static str>,
    /// The attempt's text (a prefix: the answer, else the error).
    output: &'static str,
    side_effects: bool,
}

const HELLO: &str = "Hello from the mock LLM. Task complete.";
const DONE: &str = "Done: I ran the command and wrote out.txt.";
const DEMAND: &str =
    "We\u{2019}re currently experiencing high demand, which may cause temporary errors.";
const RETRY_429: &str = "exceeded retry limit, last status: 429 Too Many Requests";
const AUTH: &str = "unexpected status 401 Unauthorized: Incorrect API key provided: mock-key., \
                    url: http://127.0.0.1:";
const QUOTA: &str = "Quota exceeded. Check your plan and billing details.";
const CUT: &str = "stream disconnected before completion: stream closed before response.completed";

fn expectations() -> Vec<Expect> {
    use AttemptStatus::{Completed, Failed};
    // One call: input 150 (50 cached), output 12 (4 reasoning).
    let one = [100, 12, 50, 0];
    // Two calls: the second adds input 250 (150 cached), output 20.
    let two = [200, 32, 200, 0];
    let ok = |name, tokens, reasoning, turns, output, side_effects| Expect {
        name,
        tokens,
        reasoning,
        turns,
        status: Completed,
        reason: StopReason::Completed,
        error: None,
        output,
        side_effects,
    };
    let failed = |name, reason, error: &'static str| Expect {
        name,
        tokens: [0; 4],
        reasoning: 0,
        turns: 1,
        status: Failed,
        reason,
        error: Some(error),
        output: error,
        side_effects: false,
    };
    vec![
        ok("codex_ok", one, 4, 1, HELLO, false),
        ok("codex_tool", two, 4, 2, DONE, true),
        ok("codex_patch", two, 4, 2, "Done: I added hello.txt.", true),
        // The `error` item (unknown model metadata) is a warning, not a failure.
        ok("codex_unknown_model", one, 4, 1, HELLO, false),
        // codex's own retries: invisible (a 500, then 200), or a `Reconnecting...` notice.
        ok("codex_flaky500", one, 4, 1, HELLO, false),
        ok("codex_ratelimit429_retry_after", one, 4, 1, HELLO, false),
        // `codex exec resume`: the usage is the thread's, with the first run's call in it.
        ok("codex_resumed", [200, 24, 100, 0], 8, 1, HELLO, false),
        // A read-only sandbox: the command failed (status "failed"): it still counts.
        ok("codex_tool_readonly", two, 4, 2, DONE, true),
        // The same, when codex did not print the command at all: one call is all it shows.
        ok("codex_tool_readonly_unshown", two, 4, 1, DONE, false),
        failed("codex_error500", StopReason::Error, DEMAND),
        failed("codex_error500_noretry", StopReason::Error, DEMAND),
        failed("codex_ratelimit429", StopReason::Error, RETRY_429),
        failed("codex_ratelimit429_noretry", StopReason::Error, RETRY_429),
        failed("codex_auth401", StopReason::ModelError, AUTH),
        failed("codex_auth401_noretry", StopReason::ModelError, AUTH),
        failed("codex_quota429", StopReason::ModelError, QUOTA),
        failed("codex_stream_cut", StopReason::Error, CUT),
        failed("codex_stream_cut_noretry", StopReason::Error, CUT),
        failed(
            "codex_failed_noretry",
            StopReason::Error,
            "stream disconnected before completion: mock: the model failed in the stream",
        ),
        // SIGTERM (exit 143) while codex retried invisibly: no answer, no error seen.
        failed(
            "codex_sigterm",
            StopReason::UnexpectedSignal,
            "codex exited with code 143 (SIGTERM) before the end of its run",
        ),
        // SIGTERM while codex waited for the network: the last notice is the error.
        failed(
            "codex_refused",
            StopReason::Error,
            "Connection failed: error sending request",
        ),
        failed(
            "codex_refused_noretry",
            StopReason::Error,
            "Connection failed: error sending request",
        ),
    ]
}

#[test]
fn every_recorded_codex_sample_is_read_as_expected() {
    let codes = exit_codes();
    let expected = expectations();
    let mut covered: Vec<&str> = expected.iter().map(|e| e.name).collect();
    covered.sort_unstable();
    let recorded: Vec<&str> = codes.keys().map(String::as_str).collect();
    assert_eq!(
        covered, recorded,
        "every sample of codex_exit_codes.tsv has an expectation"
    );

    for e in &expected {
        let code = codes[e.name];
        let text = fixture(e.name);
        let (_, errors, f) = run(text.lines(), Exit::Code(code), "");
        let u = f.usage;
        let at = format!("sample {} (exit {code})", e.name);
        assert_eq!(errors, 0, "{at}: parse errors");
        assert_eq!(
            [u.input, u.output, u.cache_read, u.cache_write],
            e.tokens,
            "{at}: tokens"
        );
        assert_eq!(u.reasoning, e.reasoning, "{at}: reasoning");
        assert_eq!(u.cost.nanos, 0, "{at}: cost");
        assert!(
            !u.cost.is_complete(),
            "{at}: codex reports no cost: unreported, not 0"
        );
        assert_eq!(u.turns, e.turns, "{at}: turns");
        assert_eq!(u.context_tokens, 0, "{at}: codex reports no context size");
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
                if e.reason != StopReason::UnexpectedSignal {
                    assert_eq!(classify_codex_error(got), Some(e.reason), "{at}: class");
                }
            }
            None => assert_eq!(f.outcome.error, None, "{at}: error"),
        }
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

/// Progress never goes backwards, side effects are never forgotten, and the final usage is never
/// below the last progress.
#[test]
fn codex_progress_is_monotone_on_every_sample() {
    for (name, code) in exit_codes() {
        let text = fixture(&name);
        let (progress, _, f) = run(text.lines(), Exit::Code(code), "");
        assert!(!progress.is_empty(), "{name}: some progress");
        assert_monotone(&name, &progress, &f);
    }
}

#[test]
fn codex_progress_names_the_command_the_patch_and_the_retries() {
    let activities = |name: &str| -> Vec<Progress> {
        let text = fixture(name);
        run(text.lines(), Exit::Code(0), "").0
    };
    let tool = activities("codex_tool");
    let shell = tool
        .iter()
        .find(|p| p.activity.as_deref() == Some("shell: echo hi > out.txt"))
        .expect("the command shows as the activity");
    assert!(shell.side_effects);
    assert_eq!(shell.usage.turns, 1);
    assert!(
        tool.iter()
            .any(|p| p.activity.as_deref() == Some("thinking"))
    );
    let last = tool.last().expect("progress");
    assert_eq!((last.usage.input, last.usage.turns), (200, 2));
    assert_eq!(last.activity.as_deref(), Some("done"));

    let patch = activities("codex_patch");
    assert!(
        patch
            .iter()
            .any(|p| p.activity.as_deref() == Some("patch: add hello.txt") && p.side_effects)
    );

    let retries = activities("codex_error500");
    assert!(
        retries.iter().any(|p| p.activity.as_deref()
            == Some(
                "retrying (3/5) after: We\u{2019}re currently experiencing high demand, which \
                 may cause temporary errors."
            )),
        "{:?}",
        retries.iter().map(|p| &p.activity).collect::<Vec<_>>()
    );
    let waiting = activities("codex_refused");
    assert_eq!(
        waiting.last().and_then(|p| p.activity.as_deref()),
        Some("retrying (waiting for network) after: Connection failed: error sending request")
    );
}

#[test]
fn codex_garbage_lines_are_counted_and_change_nothing() {
    let garbage = [
        "not json",
        "{",
        "[1,2,3]",
        "42",
        r#"{"no_type":true}"#,
        r#"{"type":7}"#,
        "\u{0}\u{1}binary",
        r#"{"type":"turn.completed","usage":"lots"}"#,
        r#"{"type":"item.completed","item":"lots"}"#,
        "(node:123) ExperimentalWarning: something",
    ];
    // Unknown event types are not errors: a newer codex may add some.
    let unknown = [
        r#"{"type":"thread.paused","message":{"nested":true},"usage":"n/a"}"#,
        r#"{"type":"item.created","item":{"id":"z","type":"hologram"}}"#,
    ];
    for name in ["codex_ok", "codex_tool", "codex_error500_noretry"] {
        let text = fixture(name);
        let code = exit_codes()[name];
        let clean = run(text.lines(), Exit::Code(code), "").2;
        let mut lines: Vec<&str> = Vec::new();
        for l in text.lines() {
            lines.extend(garbage);
            lines.extend(unknown);
            lines.push(l);
            lines.push("");
        }
        let (_, errors, f) = run(lines, Exit::Code(code), "");
        assert_eq!(
            errors,
            garbage.len() as u64 * text.lines().count() as u64,
            "{name}"
        );
        assert_eq!(f, clean, "{name}: garbage changes nothing");
    }
}

#[test]
fn codex_cut_short_is_never_completed() {
    let text = fixture("codex_tool");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[4].contains("item.completed") && lines[4].contains("command_execution"));

    // Cut after the command: nothing to show, but the command ran.
    let (_, _, f) = run(lines[..5].iter().copied(), Exit::Code(0), "");
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    assert_eq!(
        f.outcome.exit_code,
        Some(1),
        "a failed exit 0 is reported as 1"
    );
    assert!(f.outcome.side_effects);
    assert!(
        f.outcome
            .error
            .as_deref()
            .is_some_and(|e| e.contains("codex exited 0 before the end of its run")),
        "{:?}",
        f.outcome.error
    );
    assert_eq!(f.usage.turns, 1);
    assert!(!f.usage.cost.is_complete());

    // Cut after the answer, before turn.completed: partial, the answer kept, no usage yet.
    let (_, _, f) = run(lines[..6].iter().copied(), Exit::Code(0), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    assert_eq!(f.output, DONE);
    assert_eq!((f.usage.input, f.usage.turns), (0, 2));

    // codex exits 143 on SIGTERM; a signal may also kill it outright.
    let (_, _, f) = run(lines[..6].iter().copied(), Exit::Code(143), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);
    assert_eq!(f.outcome.exit_code, Some(143));
    let (_, _, f) = run(lines[..6].iter().copied(), Exit::Signal(9), "");
    assert_eq!(f.outcome.status, AttemptStatus::Partial);
    assert_eq!(f.outcome.signal, Some(9));

    // Nothing on stdout: codex refused to start (its reason is on stderr).
    let stderr = "Not inside a trusted directory and --skip-git-repo-check was not specified.\n";
    let (_, errors, f) = run([], Exit::Code(1), stderr);
    assert_eq!(errors, 0);
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::ProtocolError);
    assert_eq!(
        f.outcome.error.as_deref(),
        Some(
            "codex exited with code 1 before the end of its run: Not inside a trusted \
             directory and --skip-git-repo-check was not specified."
        )
    );

    // A finished turn, then a nonzero exit: a real failure, the answer kept.
    let (_, _, f) = run(text.lines(), Exit::Code(2), "");
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::NonzeroExit);
    assert_eq!(f.output, DONE);
}

#[test]
fn codex_killed_while_it_retries_is_failed_with_its_error() {
    let text = fixture("codex_error500");
    let lines: Vec<&str> = text.lines().collect();
    // Up to and including the second `Reconnecting...` notice.
    let head = &lines[..4];
    assert!(head[3].contains("Reconnecting... 2/5"));
    let (_, _, f) = run(head.iter().copied(), Exit::Code(143), "");
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::Error);
    assert_eq!(f.outcome.error.as_deref(), Some(DEMAND));
    let (_, _, f) = run(head.iter().copied(), Exit::Signal(15), "");
    assert_eq!(f.outcome.status, AttemptStatus::Failed);
    assert_eq!(f.outcome.stop_reason, StopReason::UnexpectedSignal);
    assert!(
        f.outcome
            .error
            .as_deref()
            .is_some_and(|e| e.contains("high demand")),
        "{:?}",
        f.outcome.error
    );
}

/// #13: the recorded streams name the agent's session on their first line (Claude Code's
/// `session_id` of `system`/`init`, Codex's `thread_id` of `thread.started`), which a later
/// attempt resumes; pi's JSON stream names none a resume takes (its session is a file).
#[test]
fn the_recorded_streams_name_their_session() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/agents");
    for (protocol, file, want) in [
        (
            sortie_core::Protocol::ClaudeStreamJson,
            "claude_ok.jsonl",
            Some("2aeb74c4-0d55-4785-87a3-a477ba3dd3a3"),
        ),
        (
            sortie_core::Protocol::CodexJson,
            "codex_ok.jsonl",
            Some("01a22c56-9341-7eb0-8e43-e4c1bf7ac9a6"),
        ),
        (sortie_core::Protocol::PiJson, "ok.jsonl", None),
    ] {
        let text = std::fs::read_to_string(dir.join(file)).expect("fixture");
        let mut reader = sortie_protocol::reader_for(protocol);
        let mut first = None;
        for line in text.lines() {
            reader.line(line);
            if first.is_none() {
                first = Some(reader.session().map(str::to_owned));
            }
        }
        assert_eq!(
            first.flatten().as_deref(),
            want,
            "{file}: named on its first line"
        );
        assert_eq!(reader.session(), want, "{file}");
    }
}

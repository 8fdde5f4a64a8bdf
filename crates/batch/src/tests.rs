//! The batch loader's tests: every field resolved, flags and defaults, digests, and each kind
//! of problem located (file, line, field), on the fixtures in `tests/batches`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sortie_core::digest::fnv1a;
use sortie_core::{Isolation, MaxOutput, OutputMode, Protocol, RunConfig, TaskSpec};

use crate::fields::{TASK_FIELDS, suggest};
use crate::load::digest;
use crate::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/batches")
        .join(name)
}

fn dir() -> String {
    fixture("")
        .to_string_lossy()
        .trim_end_matches('/')
        .to_owned()
}

pub(crate) fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, crate::EnvValue)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), crate::EnvValue::from(*v)))
        .collect()
}

/// Loads a file that must fail, and returns its issues as `(line, field)` and the text.
type Located = Vec<(Option<usize>, Option<String>)>;

fn issues(name: &str) -> (Located, String) {
    let err = load(&fixture(name), None, &Overrides::default()).unwrap_err();
    let located = err
        .issues()
        .iter()
        .map(|i| (i.line, i.field.clone()))
        .collect();
    (located, err.to_string())
}

/// Asserts that loading `name` fails with exactly one issue, on `line`, naming `field`, and
/// that its text names the file, the line, the field and says `says`.
fn check_one(name: &str, line: usize, field: Option<&str>, says: &str) {
    let (located, text) = issues(name);
    assert_eq!(
        located,
        vec![(Some(line), field.map(str::to_owned))],
        "{text}"
    );
    assert!(text.contains(&format!("{name}:{line}: ")), "{text}");
    if let Some(field) = field {
        assert!(text.contains(&format!("field `{field}`")), "{text}");
    }
    assert!(text.contains(says), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}

#[test]
fn batch_toml_resolves_every_field() {
    let loaded = load_toml(&fixture("full.toml"), &Overrides::default()).unwrap();
    let d = dir();
    let b = &loaded.batch;
    assert_eq!(b.source, format!("{d}/full.toml"));
    assert_eq!(
        b.config,
        RunConfig {
            concurrency: 8,
            fail_fast: true,
            ..RunConfig::default()
        }
    );
    let demo = &b.agents["demo"];
    assert_eq!(demo.command[0], "python3");
    assert!(demo.model_args.is_empty());
    assert_eq!(demo.protocol, Protocol::Plain);
    assert_eq!(demo.env_keys, vec!["DEMO_KEY"]);
    assert!(!demo.can_steer && demo.can_continue && !demo.may_write);
    assert!(b.agents.contains_key("pi") && b.agents.contains_key("command"));

    let [a, second, third] = b.tasks.as_slice() else {
        panic!("three tasks expected: {b:?}");
    };
    let mut want = TaskSpec::new("a", format!("{d}/sub"));
    want.prompt = Some("first".into());
    want.agent = "claude".into();
    want.model = Some("big".into());
    want.fallback_models = vec!["m2".into(), "m3".into()];
    want.max_retries = 3;
    want.attempt_timeout = secs(90);
    want.deadline = Some(secs(7200));
    want.stall_after = secs(90);
    want.stall_kill_after = secs(30);
    want.kill_grace = secs(5);
    want.max_turns = Some(10);
    want.max_tokens = Some(100_000);
    want.max_cost_nanos = Some(2_500_000_000);
    want.grace_turns = 1;
    want.isolation = Isolation::Worktree;
    want.include_wip = true;
    want.output = Some(format!("{d}/out/a.md"));
    want.output_mode = OutputMode::FileOnly;
    // A task's max_output merges with the defaults' field by field.
    want.max_output = MaxOutput {
        bytes: 1000,
        lines: 100,
    };
    want.reads = vec![format!("{d}/x.md"), "/abs/y.md".into()];
    want.env_keys = vec!["OVERRIDDEN".into(), "SHARED".into(), "TASK_ONLY".into()];
    want.retry_after_side_effects = true;
    want.permissions = sortie_core::Permissions::ReadOnly;
    want.tools = vec!["Read".into(), "Grep".into()];
    want.allow_denials = true;
    want.system_prompt = Some("Be brief.".into());
    want.thinking = Some("high".into());
    // #34: a built-in agent profile's task is sandboxed unless it says otherwise.
    want.sandbox = sortie_core::sandbox::Sandbox::Workspace;
    assert_eq!(a, &want);

    // Defaults apply; the label is task-N; the cwd is the batch file's directory.
    let mut want = TaskSpec::new("task-2", d.clone());
    want.prompt = Some("second: {previous}".into());
    want.agent = "demo".into();
    want.model = Some("small".into());
    want.max_retries = 1;
    want.attempt_timeout = secs(600);
    want.stall_after = secs(120);
    want.max_output = MaxOutput {
        bytes: 200 * 1024,
        lines: 100,
    };
    want.reads = vec![format!("{d}/docs/README.md")];
    want.needs = vec!["a".into()];
    want.env_keys = vec!["DEMO_KEY".into(), "OVERRIDDEN".into(), "SHARED".into()];
    assert_eq!(second, &want);

    // A task with `command` and no `agent` uses the `command` profile.
    assert_eq!(third.label, "task-3");
    assert_eq!(third.agent, "command");
    assert_eq!(third.command, Some(vec!["echo".into(), "hi".into()]));
    assert_eq!(third.env_keys, vec!["OVERRIDDEN", "SHARED"]);

    assert_eq!(
        loaded.env,
        vec![
            env(&[
                ("OVERRIDDEN", "task"),
                ("SHARED", "from-defaults"),
                ("TASK_ONLY", "secret-task"),
            ]),
            env(&[
                ("DEMO_KEY", "secret-demo"),
                ("OVERRIDDEN", "defaults"),
                ("SHARED", "from-defaults"),
            ]),
            env(&[("OVERRIDDEN", "defaults"), ("SHARED", "from-defaults")]),
        ]
    );
    for (t, e) in b.tasks.iter().zip(&loaded.env) {
        let names: Vec<&String> = e.iter().map(|(k, _)| k).collect();
        assert_eq!(t.env_keys.iter().collect::<Vec<_>>(), names);
    }
}

#[test]
fn batch_env_values_never_enter_the_batch() {
    let loaded = load_toml(&fixture("full.toml"), &Overrides::default()).unwrap();
    let journaled = serde_json::to_string(&loaded.batch).unwrap();
    assert!(!journaled.contains("secret"), "{journaled}");
    let debug = format!("{loaded:?}");
    assert!(!debug.contains("secret"), "{debug}");
    assert!(debug.contains("TASK_ONLY"));
}

#[test]
fn batch_flags_are_defaults_and_override_run_settings() {
    let flags = Overrides {
        concurrency: Some(2),
        fail_fast: Some(false),
        agent: Some("codex".into()),
        model: Some("flag-model".into()),
        ..Overrides::default()
    };
    let b = load_toml(&fixture("full.toml"), &flags).unwrap().batch;
    assert_eq!(
        b.config,
        RunConfig {
            concurrency: 2,
            fail_fast: false,
            ..RunConfig::default()
        }
    );
    // The task's own agent and model win over the flags.
    assert_eq!(
        (b.tasks[0].agent.as_str(), b.tasks[0].model.as_deref()),
        ("claude", Some("big"))
    );
    // The flags win over [defaults].
    assert_eq!(
        (b.tasks[1].agent.as_str(), b.tasks[1].model.as_deref()),
        ("codex", Some("flag-model"))
    );
    // A task's own `command` still means the `command` profile.
    assert_eq!(b.tasks[2].agent, "command");
}

#[test]
fn batch_digest_is_stable_and_follows_the_bytes() {
    // Each part framed by its length, 8 bytes little endian, then FNV-1a 64 (core's).
    assert_eq!(digest(&[b"a"]), fnv1a(b"\x01\0\0\0\0\0\0\0a"));
    let path = fixture("full.toml");
    let first = load_toml(&path, &Overrides::default()).unwrap().digest;
    let flags = Overrides {
        concurrency: Some(1),
        ..Overrides::default()
    };
    assert_eq!(load_toml(&path, &flags).unwrap().digest, first);
    assert_eq!(first, digest(&[&std::fs::read(&path).unwrap()]));
    assert_ne!(digest(&[b"ab", b""]), digest(&[b"a", b"b"]));
}

#[test]
fn batch_jsonl_with_a_toml_defaults_file() {
    let loaded = load(
        &fixture("tasks.jsonl"),
        Some(&fixture("jsonl_defaults.toml")),
        &Overrides::default(),
    )
    .unwrap();
    let d = dir();
    let b = &loaded.batch;
    assert_eq!(b.config.concurrency, 2);
    let [one, two, three] = b.tasks.as_slice() else {
        panic!("three tasks expected: {b:?}");
    };
    assert_eq!(one.label, "one");
    assert_eq!(one.agent, "demo");
    assert_eq!(one.max_retries, 0);
    assert_eq!(one.attempt_timeout, secs(120));
    assert_eq!(one.max_cost_nanos, Some(1_000_000_000));
    // Labels count task lines, not file lines; null is the same as absent.
    assert_eq!(two.label, "task-2");
    assert_eq!(two.model, None);
    assert_eq!(two.attempt_timeout, secs(45));
    assert_eq!(two.needs, vec!["one"]);
    assert_eq!(three.agent, "command");
    let parent = Path::new(&d)
        .parent()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(three.cwd, format!("{d}/.."));
    assert!(three.cwd.starts_with(&parent));
    assert_eq!(three.output, Some(format!("{d}/out.md")));
    assert_eq!(
        loaded.env,
        vec![
            env(&[("DEMO", "p"), ("FROM_DEFAULTS", "d")]),
            env(&[("DEMO", "p"), ("FROM_DEFAULTS", "d"), ("TASK_KEY", "t")]),
            env(&[("FROM_DEFAULTS", "d")]),
        ]
    );
    let jsonl = std::fs::read(fixture("tasks.jsonl")).unwrap();
    let defaults = std::fs::read(fixture("jsonl_defaults.toml")).unwrap();
    assert_eq!(loaded.digest, digest(&[&jsonl, &defaults]));
}

#[test]
fn batch_jsonl_with_a_json_defaults_file_and_flags() {
    let flags = Overrides {
        model: Some("m".into()),
        ..Overrides::default()
    };
    let b = load_jsonl(
        &fixture("tasks.jsonl"),
        Some(&fixture("jsonl_defaults.json")),
        &flags,
    )
    .unwrap()
    .batch;
    assert!(b.config.fail_fast);
    assert_eq!(b.config.concurrency, 4);
    assert_eq!(b.tasks[0].agent, "codex");
    assert_eq!(b.tasks[0].stall_after, secs(60));
    assert_eq!(b.tasks[0].model.as_deref(), Some("m"));
    // #37: a defaults file's `prices` price the model a codex task under `max_cost` runs.
    let m = b.config.prices.models.get("m").expect("priced");
    assert_eq!(
        (m.input, m.output, m.cache_read, m.cache_write),
        (1_250_000_000, 10_000_000_000, 125_000_000, 0)
    );
    let plain = load_jsonl(&fixture("tasks.jsonl"), None, &Overrides::default()).unwrap();
    assert_eq!(plain.batch.tasks[0].agent, "pi");
}

#[test]
fn batch_error_malformed_toml() {
    check_one("malformed.toml", 3, None, "(column");
}

#[test]
fn batch_error_unknown_field() {
    check_one(
        "unknown_field.toml",
        6,
        Some("max_retrys"),
        "unknown field; did you mean `max_retries`?",
    );
}

#[test]
fn batch_error_wrong_type() {
    check_one(
        "wrong_type.toml",
        6,
        Some("max_retries"),
        "expected an integer, found a string",
    );
}

#[test]
fn batch_error_duplicate_label() {
    check_one(
        "duplicate_label.toml",
        6,
        Some("label"),
        "duplicate label \"same\"",
    );
}

#[test]
fn batch_error_needs_cycle() {
    check_one(
        "needs_cycle.toml",
        4,
        Some("needs"),
        "dependency cycle: a → b → a",
    );
}

#[test]
fn batch_error_needs_unknown_label() {
    check_one(
        "needs_unknown.toml",
        8,
        Some("needs"),
        "unknown label \"ghost\"",
    );
}

#[test]
fn batch_error_unknown_permissions() {
    check_one(
        "bad_permissions.toml",
        3,
        Some("permissions"),
        "\"read-only\", \"edit\" or \"full\"",
    );
}

#[test]
fn batch_error_unknown_thinking_level() {
    check_one(
        "bad_thinking.toml",
        3,
        Some("thinking"),
        "off, minimal, low",
    );
}

#[test]
fn batch_error_include_wip_without_worktree() {
    check_one("include_wip.toml", 3, Some("include_wip"), "worktree");
}

#[test]
fn batch_error_file_only_without_output() {
    check_one(
        "file_only.toml",
        6,
        Some("output_mode"),
        "needs an `output` path",
    );
}

#[test]
fn batch_error_duplicate_output_path() {
    check_one("duplicate_output.toml", 7, Some("output"), "out/result.md");
}

#[test]
fn batch_error_shared_writes_name_both_tasks_and_can_be_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let text = "concurrency = 2\n\n[[tasks]]\nlabel = \"a\"\nprompt = \"x\"\n\n\
                [[tasks]]\nlabel = \"b\"\nprompt = \"y\"\n";
    let path = dir.path().join("w.toml");
    std::fs::write(&path, text).unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let text_err = err.to_string();
    assert_eq!(err.issues().len(), 1, "{text_err}");
    assert!(
        text_err.starts_with(&format!(
            "{}:7: field `isolation`: tasks \"a\" (line 3) and \"b\" may both write in",
            path.display()
        )),
        "{text_err}"
    );
    let allowed = Overrides {
        allow_shared_writes: Some(true),
        ..Overrides::default()
    };
    assert!(load(&path, None, &allowed).is_ok());
    std::fs::write(&path, format!("allow_shared_writes = true\n{text}")).unwrap();
    assert!(load(&path, None, &Overrides::default()).is_ok());
    let serial = Overrides {
        concurrency: Some(1),
        ..Overrides::default()
    };
    std::fs::write(&path, text).unwrap();
    assert!(load(&path, None, &serial).is_ok());
}

#[test]
fn batch_error_output_inside_the_worktrees() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("o.toml");
    std::fs::write(
        &path,
        "[[tasks]]\nprompt = \"x\"\noutput = \"st/worktrees/r/x/out.md\"\n",
    )
    .unwrap();
    let with_state = Overrides {
        worktrees: Some(dir.path().join("st").join("worktrees")),
        ..Overrides::default()
    };
    let err = load(&path, None, &with_state).unwrap_err();
    assert_eq!(
        err.issues()
            .iter()
            .map(|i| (i.line, i.field.as_deref()))
            .collect::<Vec<_>>(),
        vec![(Some(3), Some("output"))],
        "{err}"
    );
    assert!(
        err.to_string().contains("inside sortie's worktrees"),
        "{err}"
    );
    assert!(load(&path, None, &Overrides::default()).is_ok());
}

#[test]
fn batch_error_unknown_agent() {
    check_one(
        "unknown_agent.toml",
        6,
        Some("agent"),
        "unknown agent profile \"ghost\"",
    );
}

#[test]
fn batch_error_unknown_protocol() {
    check_one(
        "unknown_protocol.toml",
        3,
        Some("agents.mine.protocol"),
        "unknown protocol \"xml\"",
    );
}

#[test]
fn batch_error_bad_duration() {
    check_one(
        "bad_duration.toml",
        3,
        Some("attempt_timeout"),
        "invalid duration \"ten minutes\"",
    );
}

#[test]
fn batch_error_from_defaults_names_the_defaults_line_and_the_task() {
    check_one(
        "defaults_blame.toml",
        2,
        Some("output_mode"),
        "task `no-output`: `file-only` needs an `output` path",
    );
}

#[test]
fn batch_error_reports_every_problem_in_file_order() {
    let (located, text) = issues("many_errors.toml");
    let want: Located = [
        (2, "concurrency"),
        (3, "colour"),
        (6, "kill_grace"),
        (8, "agents.half.command"),
        (14, "max_retries"),
        (15, "isolation"),
        (18, "label"),
        (20, "needs"),
        (21, "max_output.bytes"),
        (21, "max_output.rows"),
        (23, "prompt"),
        (24, "env.BAD"),
    ]
    .iter()
    .map(|(l, f)| (Some(*l), Some((*f).to_owned())))
    .collect();
    assert_eq!(located, want, "{text}");
    assert_eq!(text.lines().count(), want.len());
    assert!(
        text.lines()
            .all(|l| l.contains("many_errors.toml:") && l.contains("field `"))
    );
}

#[test]
fn batch_error_jsonl_names_each_line() {
    let (located, text) = issues("bad.jsonl");
    assert_eq!(
        located,
        vec![
            (Some(2), Some("promt".to_owned())),
            (Some(2), Some("prompt".to_owned())),
            (Some(3), Some("max_turns".to_owned())),
            (Some(4), None),
            (Some(5), None),
            (Some(6), Some("label".to_owned())),
        ],
        "{text}"
    );
    assert!(text.contains("bad.jsonl:2: field `promt`: unknown field; did you mean `prompt`?"));
    assert!(text.contains("bad.jsonl:4: invalid JSON: EOF while parsing a value (column 30)"));
    assert!(
        text.contains("bad.jsonl:5: expected a JSON object (one task per line), found an array")
    );
    assert!(text.contains("bad.jsonl:6: field `label`: duplicate label \"ok\""));
}

#[test]
fn batch_error_jsonl_garbage_bytes_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.jsonl");
    let mut bytes = b"{\"prompt\": \"ok\"}\n".to_vec();
    bytes.extend([0xff, 0xfe, 0x00, 0x9f, b'\n']);
    bytes.extend(b"\x00\x01\x02 binary\n{\"prompt\": \"\xe2\x82\"}\n\x1b[31m\n");
    std::fs::write(&path, &bytes).unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let lines: Vec<Option<usize>> = err.issues().iter().map(|i| i.line).collect();
    assert_eq!(lines, vec![Some(2), Some(3), Some(4), Some(5)], "{err}");
    assert!(
        err.to_string().contains("garbage.jsonl:2: not valid UTF-8"),
        "{err}"
    );
    // Every byte value on its own, and some random-ish noise: an error, never a panic.
    for b in 0..=255u8 {
        std::fs::write(&path, [b, b'\n', b'{', b]).unwrap();
        let _ = load(&path, None, &Overrides::default());
    }
}

#[test]
fn batch_error_toml_not_utf8_and_datetime() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latin1.toml");
    std::fs::write(&path, b"[[tasks]]\nprompt = \"caf\xe9\"\n").unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    assert!(
        err.to_string().contains("latin1.toml:2: not valid UTF-8"),
        "{err}"
    );
    let path = dir.path().join("date.toml");
    std::fs::write(&path, "[[tasks]]\nprompt = \"a\"\ndeadline = 2026-01-01\n").unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    assert!(
        err.to_string().contains("date.toml:3: a date or time"),
        "{err}"
    );
}

#[test]
fn batch_error_io_names_the_path() {
    let err = load(&fixture("missing.toml"), None, &Overrides::default()).unwrap_err();
    assert!(matches!(err, BatchError::Io { .. }));
    assert!(err.to_string().contains("missing.toml"));
    let err = load(
        &fixture("full.toml"),
        Some(&fixture("jsonl_defaults.toml")),
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("jsonl_defaults.toml: a defaults file goes with")
    );
}

#[test]
fn batch_error_empty_batch_and_concurrency_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.toml");
    std::fs::write(&path, "# nothing\nconcurrency = 0\n").unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("empty.toml: field `tasks`: the batch has no tasks"),
        "{text}"
    );
    assert!(
        text.contains("empty.toml:2: field `concurrency`: must be between 1 and 1024 (found 0)"),
        "{text}"
    );
}

#[test]
fn batch_one_off_prompt() {
    let flags = Overrides {
        agent: Some("codex".into()),
        model: Some("flag".into()),
        concurrency: Some(3),
        ..Overrides::default()
    };
    let loaded = one_off_prompt(
        "fix it",
        Some("claude"),
        None,
        Path::new("/tmp/x/./y"),
        &flags,
    )
    .unwrap();
    let t = &loaded.batch.tasks[0];
    assert_eq!(loaded.batch.tasks.len(), 1);
    assert_eq!((t.label.as_str(), t.agent.as_str()), ("task-1", "claude"));
    assert_eq!(t.model.as_deref(), Some("flag"));
    assert_eq!(t.prompt.as_deref(), Some("fix it"));
    assert_eq!(t.cwd, "/tmp/x/y");
    assert_eq!(loaded.batch.config.concurrency, 3);
    assert_eq!(loaded.batch.source, "prompt: fix it");
    let other = one_off_prompt("fix it", Some("pi"), None, Path::new("/tmp"), &flags).unwrap();
    assert_ne!(loaded.digest, other.digest);

    let relative = one_off_prompt("p", None, None, Path::new("sub"), &flags).unwrap();
    let t = &relative.batch.tasks[0];
    assert_eq!(t.agent, "codex");
    let cwd = std::env::current_dir().unwrap().join("sub");
    assert_eq!(t.cwd, cwd.to_string_lossy());

    let err = one_off_prompt("p", Some("ghost"), None, Path::new("/"), &flags).unwrap_err();
    assert_eq!(
        err.to_string(),
        "<command line>: field `agent`: unknown agent profile \"ghost\""
    );
    let ghost = Overrides {
        agent: Some("ghost".into()),
        ..Overrides::default()
    };
    let err = one_off_prompt("p", None, None, Path::new("/"), &ghost).unwrap_err();
    assert!(err.to_string().contains("(agent from --agent)"), "{err}");
}

#[test]
fn batch_one_off_command() {
    let argv: Vec<String> = vec!["echo".into(), "hello world".into()];
    let loaded = one_off_command(&argv, Path::new("/tmp"), &Overrides::default()).unwrap();
    let t = &loaded.batch.tasks[0];
    assert_eq!(t.agent, "command");
    assert_eq!(t.command.as_ref(), Some(&argv));
    assert_eq!(t.prompt, None);
    assert_eq!(loaded.batch.source, "command: echo hello world");
    assert_eq!(loaded.env, vec![Vec::new()]);
    let err = one_off_command(&[], Path::new("/tmp"), &Overrides::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "<command line>: field `command`: must not be empty"
    );
}

#[test]
fn batch_toml_inline_tasks_and_suggestions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inline.toml");
    std::fs::write(
        &path,
        "tasks = [\n  { prompt = \"a\" },\n  { prompt = \"b\", outptu = \"x\" },\n]\n",
    )
    .unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:3: field `outptu`: unknown field; did you mean `output`?",
            path.display()
        )
    );
    assert_eq!(
        suggest("Max-Retries", TASK_FIELDS),
        "; did you mean `max_retries`?"
    );
    assert_eq!(suggest("zzz", TASK_FIELDS), "");
}

#[test]
fn batch_error_defaults_file_problems_name_the_defaults_file() {
    let dir = tempfile::tempdir().unwrap();
    let defaults = dir.path().join("defaults.toml");
    std::fs::write(
        &defaults,
        "[defaults]\nmax_retries = 1\n\n[[tasks]]\nprompt = \"x\"\n",
    )
    .unwrap();
    let json = dir.path().join("defaults.json");
    std::fs::write(&json, "{\"defaults\": {\"stall_after\": true}}").unwrap();
    let batch = dir.path().join("b.ndjson");
    std::fs::write(&batch, "{\"prompt\": \"a\", \"max_retries\": 1.5}\n").unwrap();
    let err = load(&batch, Some(&defaults), &Overrides::default()).unwrap_err();
    let text = err.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].ends_with(
            "defaults.toml:4: field `tasks`: tasks belong in the JSON Lines file, one per line"
        ),
        "{text}"
    );
    assert!(
        lines[1].ends_with("b.ndjson:1: field `max_retries`: expected an integer, found a float"),
        "{text}"
    );
    let err = load(&batch, Some(&json), &Overrides::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("defaults.json: field `stall_after`: expected a duration, found a boolean"),
        "{err}"
    );
}

#[test]
fn batch_error_a_check_that_read_a_field_that_did_not_parse_is_left_out() {
    // Each field below is reported once, for its type; the checks that read it (a prompt or a
    // command, include_wip's isolation, {previous}'s needs) saw the default put in its place.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("follow.toml");
    std::fs::write(
        &path,
        "[[tasks]]\nprompt = 5\n\n\
         [[tasks]]\nprompt = \"b\"\nisolation = \"sandbox\"\ninclude_wip = true\n\n\
         [[tasks]]\nprompt = \"{previous}\"\nneeds = \"task-2\"\n",
    )
    .unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let located = crate::tests::places(&err);
    assert_eq!(
        located,
        vec![
            (Some(2), Some("prompt")),
            (Some(6), Some("isolation")),
            (Some(11), Some("needs")),
        ],
        "{err}"
    );
    // The same checks on fields that parsed are reported, each at its own line.
    std::fs::write(
        &path,
        "[[tasks]]\nprompt = \"a\"\n\n\
         [[tasks]]\nprompt = \"b\"\ninclude_wip = true\n\n\
         [[tasks]]\nprompt = \"{previous}\"\n",
    )
    .unwrap();
    let err = load(&path, None, &Overrides::default()).unwrap_err();
    let located = crate::tests::places(&err);
    assert_eq!(
        located,
        vec![(Some(6), Some("include_wip")), (Some(9), Some("prompt"))],
        "{err}"
    );
}

// The limits of values, the executor's options and the run's budget.
mod limits;

// #15
#[test]
fn batch_on_task_end_is_batch_wide_and_per_task() {
    let b = load(&fixture("on-task-end.toml"), None, &Overrides::default())
        .unwrap()
        .batch;
    assert_eq!(
        b.config.on_task_end.as_deref(),
        Some("notify-send \"$SORTIE_TASK $SORTIE_STATE\"")
    );
    // A task without its own leaves it to the run's; a task's own is its spec's.
    assert_eq!(b.tasks[0].on_task_end, None);
    assert_eq!(
        b.tasks[1].on_task_end.as_deref(),
        Some("echo $SORTIE_TASK >> done.log")
    );
    check_one(
        "bad-on-task-end.toml",
        6,
        Some("on_task_end"),
        "the command must not be empty",
    );
}

// #13: roles and sessions.
mod roles;
// #34: where a task's sandbox comes from.
mod sandbox;
// Issue 13: structured results.
mod schema;
// #33: a judge over samples.
mod needs;

/// Where each of a load error's issues is: its line and field, in order.
pub(crate) fn places(err: &crate::BatchError) -> Vec<(Option<usize>, Option<&str>)> {
    err.issues()
        .iter()
        .map(|i| (i.line, i.field.as_deref()))
        .collect()
}

//! docs/cli.md, the `--json` output of every command: each example parses, every command of
//! `sortie --help` has its section, and the run view's example has the keys `status --json`
//! prints.

use std::collections::BTreeSet;

use crate::support::Scratch;

fn doc() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md"))
        .expect("docs/cli.md")
}

/// The ```json blocks of the doc, with the section each is in.
fn examples(doc: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut block: Option<String> = None;
    for line in doc.lines() {
        match (&mut block, line) {
            (None, l) if l.starts_with("## ") => section = l[3..].to_owned(),
            (None, "```json") => block = Some(String::new()),
            (Some(b), "```") => {
                out.push((section.clone(), std::mem::take(b)));
                block = None;
            }
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            _ => {}
        }
    }
    out
}

#[test]
fn every_json_example_of_docs_cli_md_parses_and_every_command_is_documented() {
    let doc = doc();
    let examples = examples(&doc);
    assert!(examples.len() >= 20, "{} examples", examples.len());
    for (section, text) in &examples {
        serde_json::from_str::<serde_json::Value>(text)
            .unwrap_or_else(|e| panic!("the example of {section} does not parse: {e}\n{text}"));
    }
    let s = Scratch::new();
    let help = String::from_utf8_lossy(&s.run_ok(&["--help"]).stdout).into_owned();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() > 15, "{commands:?}");
    for c in commands {
        let heading = format!("## `sortie {c}`");
        assert!(
            doc.lines().any(|l| l == heading),
            "docs/cli.md has no section {heading}"
        );
    }

    // The run view's example has exactly the keys `status --json` prints, and so do its tasks.
    let out = s.run_ok(&["--quiet", "run", "--run-id", "docs", "--", "true"]);
    assert!(out.status.success());
    let live: serde_json::Value =
        serde_json::from_slice(&s.run_ok(&["--json", "status", "docs"]).stdout).expect("JSON");
    let (_, view) = examples
        .iter()
        .find(|(section, _)| section.contains("`sortie status`"))
        .expect("the status example");
    let view: serde_json::Value = serde_json::from_str(view).expect("parses");
    let keys = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(keys(&view), keys(&live), "the run view's keys");
    assert_eq!(
        keys(&view["tasks"][0]),
        keys(&live["tasks"][0]),
        "a task's keys"
    );
}

#[test]
fn completions_cover_every_shell_and_replay_reads_as_an_indented_timeline() {
    let s = Scratch::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = s.run_ok(&["completions", shell]);
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("steer") && script.contains("report"),
            "{shell}: {script}"
        );
    }
    assert_eq!(s.run(&["completions", "tcsh"]).status.code(), Some(2));
    s.run_ok(&["--quiet", "run", "--run-id", "timeline", "--", "echo", "hi"]);
    let out = s.run_ok(&["replay", "timeline"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("run timeline, started "), "{text}");
    let line = |name: &str| {
        lines
            .iter()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no {name}:\n{text}"))
            .to_owned()
    };
    assert!(
        line("RunStarted")
            .trim_start()
            .starts_with("+0.000s  run RunStarted"),
        "{text}"
    );
    // A task's own events at its label, its attempt's one step in.
    let launching = line("AttemptLaunching");
    let started = line("AttemptStarted");
    let at = |l: &str, word: &str| l.find(word).unwrap_or_default();
    assert!(launching.contains("] AttemptLaunching"), "{launching}");
    assert_eq!(
        at(started, "AttemptStarted"),
        at(launching, "AttemptLaunching") + 4,
        "{text}"
    );
    let help = String::from_utf8_lossy(&s.run_ok(&["--help"]).stdout).into_owned();
    assert!(
        help.contains("Examples:") && help.contains("sortie run --detach"),
        "{help}"
    );
}

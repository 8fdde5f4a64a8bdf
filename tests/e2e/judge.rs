//! A judge over samples end to end (#33): `needs = ["s-*"]` names every sample of a template,
//! and with `needs_mode = "settled"` the judge runs after all of them, its prompt holding each
//! sample's output or, for a sample that failed, its error; by default it is skipped.

use crate::support::{Scratch, labels};
use sortie_testkit::Events;

/// Five samples of a plain command: s-1, s-3 and s-5 fail (exit 1, a message on stderr), s-2
/// and s-4 print an answer; the judge (an agent that is a plain command) writes the prompt it
/// was given to `judge-prompt.txt`.
fn batch(mode: Option<&str>) -> String {
    let mode = mode.map_or_else(String::new, |m| format!("needs_mode = \"{m}\"\n"));
    format!(
        "concurrency = 5\n\n\
         [[tasks]]\nlabel = \"s-{{sample}}\"\ncount = 5\nmax_retries = 0\n\
         command = [\"sh\", \"-c\", \"case {{label}} in s-1|s-3|s-5) echo '{{label}} broke down' >&2; \
         exit 1;; esac; echo '{{label}} answers 4{{label}}'\"]\n\n\
         [[tasks]]\nlabel = \"judge\"\nneeds = [\"s-*\"]\n{mode}\
         prompt = \"\"\"Pick the best.\n1: {{outputs.s-1}}\n2: {{outputs.s-2}}\n\
         3: {{outputs.s-3}}\n4: {{outputs.s-4}}\n5: {{outputs.s-5}}\"\"\"\n\
         agent = \"judge\"\n\n\
         [agents.judge]\nprotocol = \"plain\"\n\
         command = [\"sh\", \"-c\", \"printf '%s' \\\"$1\\\" > judge-prompt.txt; echo judged\", \
         \"judge\", \"{{prompt}}\"]\n"
    )
}

/// The final state of each task, by label.
fn ends(s: &Scratch, run: &str) -> Vec<(String, String)> {
    let events = s.events(run);
    labels(&events)
        .into_iter()
        .enumerate()
        .map(|(i, label)| {
            let finished = events.of(i as u64, "TaskFinished");
            assert_eq!(finished.len(), 1, "{label}: {finished:?}");
            let state = finished[0]["result"]["state"].as_str().expect("a state");
            (label, state.to_owned())
        })
        .collect()
}

#[test]
fn a_settled_judge_runs_after_every_sample_and_reads_their_outputs_and_errors() {
    let s = Scratch::new();
    let path = s.write("batch.toml", &batch(Some("settled")));
    let run = crate::support::unique_run("judge");
    let out = s.run(&["run", path.to_str().expect("utf-8"), "--run-id", &run]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "some samples failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Vec<(String, String)> = [
        ("s-1", "failed"),
        ("s-2", "completed"),
        ("s-3", "failed"),
        ("s-4", "completed"),
        ("s-5", "failed"),
        ("judge", "completed"),
    ]
    .iter()
    .map(|(l, st)| ((*l).to_owned(), (*st).to_owned()))
    .collect();
    assert_eq!(ends(&s, &run), want);
    let prompt = std::fs::read_to_string(s.path().join("judge-prompt.txt")).expect("the judge ran");
    for text in [
        "1: exited with code 1: s-1 broke down",
        "2: s-2 answers 4s-2",
        "3: exited with code 1: s-3 broke down",
        "4: s-4 answers 4s-4",
        "5: exited with code 1: s-5 broke down",
    ] {
        assert!(
            prompt.contains(text),
            "{text:?} not in the judge's prompt:\n{prompt}"
        );
    }
    s.audit_clean(&run);
}

#[test]
fn check_shows_what_a_needs_pattern_matched() {
    let s = Scratch::new();
    let path = s.write("batch.toml", &batch(Some("settled")));
    let out = s.run_ok(&["check", path.to_str().expect("utf-8")]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("needs \"s-*\": s-1, s-2, s-3, s-4, s-5 (task judge)\n"),
        "{said}"
    );
    let out = s.run_ok(&["--json", "check", path.to_str().expect("utf-8")]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v["needs_patterns"],
        serde_json::json!([{
            "pattern": "s-*",
            "matched": ["s-1", "s-2", "s-3", "s-4", "s-5"],
            "tasks": ["judge"],
        }])
    );
}

#[test]
fn by_default_a_judge_whose_sample_failed_is_skipped() {
    let s = Scratch::new();
    let path = s.write("batch.toml", &batch(None));
    let run = crate::support::unique_run("judge");
    let out = s.run(&["run", path.to_str().expect("utf-8"), "--run-id", &run]);
    assert_eq!(out.status.code(), Some(1));
    let ends = ends(&s, &run);
    assert_eq!(
        ends.last(),
        Some(&("judge".to_owned(), "skipped".to_owned())),
        "{ends:?}"
    );
    assert!(
        !s.path().join("judge-prompt.txt").exists(),
        "the judge never ran"
    );
}

#[test]
fn a_needs_pattern_that_matches_no_task_is_refused_at_its_line() {
    let s = Scratch::new();
    let path = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"a\"\ncommand = [\"true\"]\n\n\
         [[tasks]]\nlabel = \"judge\"\ncommand = [\"true\"]\nneeds = [\"fix-*\"]\n",
    );
    for cmd in ["run", "check"] {
        let out = s.run(&[cmd, path.to_str().expect("utf-8")]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        let said = format!("{err}{}", String::from_utf8_lossy(&out.stdout));
        assert!(
            said.contains("batch.toml:8: field `needs`: the pattern \"fix-*\" matches no task"),
            "{cmd}: {said}"
        );
    }
}

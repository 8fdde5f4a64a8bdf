//! Task graphs, prompts and artifacts, end to end: outputs flow through `{previous}`,
//! `{outputs.LABEL}`, `{task}` and the `Context:` block (the fake agent answers with the prompt
//! it was given, so each task's journaled output is its rendered prompt); a failed task skips
//! its dependents; artifacts land where the batch says, `file-only` and `max_output` shape the
//! summary; admission refuses a batch before anything runs; resume writes an artifact whose
//! write was cut short by a crash, from the output held in the journal.

use std::path::Path;

use crate::support::{Background, Scratch, fake_agent, poll, send_signal, task_view, unique_run};
use sortie_testkit::Events;

/// `[agents.echo]` (answers with its prompt, writes nothing) and `[agents.broken]` (the same,
/// then exits 3: a real task failure), and defaults that use `echo` without retries.
fn profiles() -> String {
    let fake = format!("{:?}", fake_agent().display().to_string());
    format!(
        "[agents.echo]\n\
         command = [\"python3\", {fake}, \"--quiet\", \"--answer-prompt\", \"{{prompt}}\"]\n\
         may_write = false\n\n\
         [agents.broken]\n\
         command = [\"python3\", {fake}, \"--quiet\", \"--answer-prompt\", \"--exit\", \"3\", \
         \"{{prompt}}\"]\n\
         may_write = false\n\n\
         [defaults]\n\
         agent = \"echo\"\n\
         max_retries = 0\n"
    )
}

/// The journaled output of task number `task`'s only attempt.
fn output_of(events: &[serde_json::Value], task: usize) -> String {
    let finished = events.of(task as u64, "AttemptFinished");
    assert_eq!(finished.len(), 1, "task {task} ran once");
    finished[0]["output"]
        .as_str()
        .expect("an output")
        .to_owned()
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn graphs_chain_passes_outputs_and_artifacts_land_where_asked() {
    let s = Scratch::new();
    let run = unique_run("graphs-chain");
    let batch = format!(
        "concurrency = 4\n\n{}\n\
         [[tasks]]\nlabel = \"one\"\nprompt = \"alpha\"\n\n\
         [[tasks]]\nlabel = \"two\"\nneeds = [\"one\"]\nprompt = \"two saw [{{previous}}]\"\n\n\
         [[tasks]]\nlabel = \"three\"\nneeds = [\"two\"]\n\
         prompt = \"three saw [{{previous}}] of [{{task}}]\"\noutput = \"out/three.md\"\n\n\
         [[tasks]]\nlabel = \"ctx\"\nneeds = [\"one\", \"two\"]\nprompt = \"summarize\"\n\
         output = \"out/ctx.md\"\noutput_mode = \"file-only\"\n\n\
         [[tasks]]\nlabel = \"long\"\nneeds = [\"one\"]\n\
         prompt = \"{{outputs.one}}\\nl2\\nl3\\nl4\"\noutput = \"out/deep/long.md\"\n\
         max_output = {{ lines = 2 }}\n",
        profiles()
    );
    let file = s.write("batch.toml", &batch);
    let out = s.run(&["run", "--run-id", &run, file.to_str().expect("utf-8 path")]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));

    // Each task's output is the prompt it was given.
    let events = s.events(&run);
    assert_eq!(output_of(&events, 0), "alpha");
    assert_eq!(output_of(&events, 1), "two saw [alpha]");
    assert_eq!(
        output_of(&events, 2),
        "three saw [two saw [alpha]] of [alpha]",
        "{{previous}} is two's output, {{task}} the chain root's prompt"
    );
    assert_eq!(
        output_of(&events, 3),
        "summarize\n\n---\nContext:\n--- one ---\nalpha\n--- two ---\ntwo saw [alpha]",
        "no placeholder: the needed outputs are appended under their labels"
    );
    assert_eq!(output_of(&events, 4), "alpha\nl2\nl3\nl4");

    // Artifacts: the whole text, at the path relative to the batch file's directory.
    let read = |p: &str| std::fs::read_to_string(s.path().join(p)).expect("artifact written");
    assert_eq!(
        read("out/three.md"),
        "three saw [two saw [alpha]] of [alpha]"
    );
    assert_eq!(read("out/ctx.md"), output_of(&events, 3));
    assert_eq!(read("out/deep/long.md"), "alpha\nl2\nl3\nl4");

    // The summary: file-only names the artifact instead of the text; max_output cuts the
    // inline text and names the full artifact.
    let ctx_path = s.path().join("out/ctx.md");
    assert!(
        stdout.contains(&format!(
            "[ctx] completed\nOutput written to {}\n",
            ctx_path.display()
        )),
        "{stdout}"
    );
    let long_path = s.path().join("out/deep/long.md");
    assert!(
        stdout.contains(&format!(
            "[long] completed\nalpha\nl2\n[output truncated at 8 of 14 bytes; full output in {}]",
            long_path.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("[three] completed\nthree saw [two saw [alpha]] of [alpha]\n"),
        "{stdout}"
    );
    // Whole lines only: the temp dir's random name can hold "l3" too.
    assert!(
        !stdout.lines().any(|l| l == "l3" || l == "l4"),
        "the cut lines are not shown: {stdout}"
    );
}

#[test]
fn graphs_failed_middle_task_skips_the_last() {
    let s = Scratch::new();
    let run = unique_run("graphs-skip");
    let batch = format!(
        "{}\n\
         [[tasks]]\nlabel = \"one\"\nprompt = \"alpha\"\n\n\
         [[tasks]]\nlabel = \"two\"\nagent = \"broken\"\nneeds = [\"one\"]\n\
         prompt = \"two saw [{{previous}}]\"\n\n\
         [[tasks]]\nlabel = \"three\"\nneeds = [\"two\"]\nprompt = \"{{previous}}\"\n\
         output = \"out/three.md\"\n",
        profiles()
    );
    let file = s.write("batch.toml", &batch);
    let out = s.run(&["run", "--run-id", &run, file.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // #37: the summary says the state once, not `skipped: skipped: dependency`.
    let printed = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        printed.contains("dependency \"two\" did not complete"),
        "{printed}"
    );
    assert!(!printed.contains("skipped: skipped"), "{printed}");
    let status = s.status(&run);
    assert_eq!(task_view(&status, "one")["state"], "completed");
    assert_eq!(task_view(&status, "two")["state"], "failed");
    let three = task_view(&status, "three");
    assert_eq!(three["state"], "skipped", "{three}");
    assert!(
        three["error"]
            .as_str()
            .is_some_and(|e| e.contains("dependency \"two\" did not complete (failed)")),
        "{three}"
    );
    let events = s.events(&run);
    assert!(events.of(2, "AttemptLaunching").is_empty());
    assert!(
        !s.path().join("out/three.md").exists(),
        "a skipped task writes no artifact"
    );
}

#[test]
fn graphs_admission_refuses_writers_sharing_a_checkout_before_anything_runs() {
    let s = Scratch::new();
    let fake = format!("{:?}", fake_agent().display().to_string());
    let batch = format!(
        "concurrency = 2\n\n\
         [agents.writer]\ncommand = [\"python3\", {fake}, \"{{prompt}}\"]\n\n\
         [[tasks]]\nlabel = \"left\"\nagent = \"writer\"\nprompt = \"edit a\"\n\n\
         [[tasks]]\nlabel = \"right\"\nagent = \"writer\"\nprompt = \"edit b\"\n"
    );
    let file = s.write("batch.toml", &batch);
    let out = s.run(&["run", file.to_str().expect("utf-8 path")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:11: field `isolation`: tasks \"left\" (line 6) and \"right\" may both write in {}",
            file.display(),
            s.path()
                .canonicalize()
                .expect("canonical scratch dir")
                .display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("allow_shared_writes = true"), "{stderr}");
    let runs = s.state_dir().join("runs");
    assert!(
        !runs.exists() || std::fs::read_dir(&runs).expect("runs dir").next().is_none(),
        "nothing ran"
    );

    // A placeholder naming a task that is not needed is refused the same way.
    let bad = format!(
        "{}\n[[tasks]]\nlabel = \"a\"\nprompt = \"x\"\n\n\
         [[tasks]]\nlabel = \"b\"\nprompt = \"{{outputs.a}}\"\n",
        profiles()
    );
    let file = s.write("bad.toml", &bad);
    let out = s.run(&["run", file.to_str().expect("utf-8 path")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let line = bad
        .lines()
        .position(|l| l.contains("{outputs.a}"))
        .expect("the prompt line")
        + 1;
    assert!(
        stderr.contains(&format!(
            "{}:{line}: field `prompt`: `{{outputs.a}}` names task \"a\", which this task does not need",
            file.display()
        )),
        "{stderr}"
    );
}

/// Killed after the attempt's end was journaled but before its artifact was written: resume
/// writes the artifact from the journaled output, without running the task again.
#[test]
fn graphs_resume_writes_an_artifact_cut_short_by_a_crash() {
    let s = Scratch::new();
    let run = unique_run("graphs-artifact");
    let counter = s.path().join("counter");
    let batch = format!(
        "{}\n[[tasks]]\nlabel = \"only\"\nprompt = \"the whole answer\"\n\
         output = \"out/only.md\"\n",
        profiles().replace(
            "\"--quiet\", \"--answer-prompt\", \"{prompt}\"]",
            &format!(
                "\"--quiet\", \"--answer-prompt\", \"--counter\", {:?}, \"{{prompt}}\"]",
                counter.display().to_string()
            )
        )
    );
    let file = s.write("batch.toml", &batch);
    let path = file.to_str().expect("utf-8 path");
    let mut cmd = s.sortie();
    cmd.env("SORTIE_TEST_PAUSE_AFTER", "AttemptFinished")
        .args(["run", "--run-id", &run, path])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let bg = Background::from_command(cmd, &run);
    poll("the attempt's end in the journal", 60, || {
        s.try_events(&run)
            .filter(|ev| !ev.of(0, "AttemptFinished").is_empty())
    });
    send_signal(bg.pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = bg.finish(30);
    let artifact = s.path().join("out/only.md");
    assert!(!artifact.exists(), "killed before the artifact was written");
    assert!(s.events(&run).of(0, "ArtifactWritten").is_empty());

    let out = s.run(&["resume", &run]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let events = s.events(&run);
    assert_eq!(events.of(0, "AttemptLaunching").len(), 1, "not run again");
    let journaled = output_of(&events, 0);
    assert_eq!(journaled, "the whole answer");
    assert_eq!(
        std::fs::read_to_string(&artifact).expect("resume wrote the artifact"),
        journaled
    );
    let written = events.of(0, "ArtifactWritten");
    assert_eq!(written.len(), 1);
    assert_eq!(written[0]["path"], artifact.display().to_string());
    assert_eq!(
        std::fs::read_to_string(&counter)
            .expect("counter")
            .lines()
            .count(),
        1,
        "the agent answered once"
    );
    let leftovers: Vec<_> = std::fs::read_dir(artifact.parent().expect("a parent"))
        .expect("out dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "no temp file left: {leftovers:?}");
    assert!(Path::new(&artifact).exists());
}

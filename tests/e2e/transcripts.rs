//! End-to-end tests of transcripts (#10): every attempt, supervised or not, keeps the agent's
//! whole stdout in its attempt dir; `sortie status --task` lists them (path, size, cut),
//! `sortie logs` prints them (the last attempt by default, `--attempt N`, `--follow` tailing a
//! live one from another terminal until it ends), a chatty agent is cut to the cap
//! (`SORTIE_TRANSCRIPT_CAP`: its head and tail kept, what was cut said), and `sortie gc`
//! removes them with the run's other leftovers.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Background, Scratch, fake_command, finish, poll, unique_run};

/// How long a bounded wait may last, in seconds.
const PATIENCE: u64 = 60;

fn attempt_file(s: &Scratch, run: &str, task: u32, attempt: u32, name: &str) -> PathBuf {
    s.state_dir()
        .join("runs")
        .join(run)
        .join("attempts")
        .join(format!("{task}.{attempt}"))
        .join(name)
}

fn task_status(s: &Scratch, run: &str, label: &str) -> Value {
    let out = s.run_ok(&["--json", "status", run, "--task", label]);
    serde_json::from_slice(&out.stdout).expect("status --task --json is JSON")
}

/// A task that fails its first attempt (a transient error) and answers on its second, once
/// supervised and once over pipes (`supervise = false`): both keep both transcripts, and
/// `logs` prints exactly what the agent wrote.
#[test]
fn every_attempt_keeps_its_transcript_and_logs_prints_it() {
    let s = Scratch::new();
    let run = &unique_run("logs");
    let agent = |answer: &str| {
        fake_command(&[
            "--attempt",
            "{attempt}",
            "--fail-attempts",
            "1:error",
            "--turns",
            "2",
            "--usage",
            "100,10,0.01",
            "--answer",
            answer,
        ])
    };
    let b = s.write(
        "batch.toml",
        &format!(
            "[defaults]\nmax_retries = 2\n\n\
             [[tasks]]\nlabel = \"sup\"\ncommand = {}\n\n\
             [[tasks]]\nlabel = \"pipes\"\nsupervise = false\ncommand = {}\n",
            agent("sup done"),
            agent("pipes done")
        ),
    );
    s.run_ok(&[
        "--quiet",
        "run",
        "--run-id",
        run,
        b.to_str().expect("utf-8"),
    ]);

    for (task, label, executor) in [(0, "sup", "local"), (1, "pipes", "direct")] {
        let last = std::fs::read(attempt_file(&s, run, task, 2, "stdout")).expect("kept");
        let text = String::from_utf8_lossy(&last);
        assert!(text.contains(&format!("{label} done")), "{text}");
        assert!(text.contains("SORTIE_USAGE"), "the raw stream: {text}");
        // The default is the last attempt, printed as the agent wrote it.
        let out = s.run_ok(&["logs", run, label]);
        assert_eq!(out.stdout, last, "{label}: logs prints the last transcript");
        let first = s.run_ok(&["logs", run, label, "--attempt", "1"]);
        assert_eq!(
            first.stdout,
            std::fs::read(attempt_file(&s, run, task, 1, "stdout")).expect("kept")
        );
        assert!(
            String::from_utf8_lossy(&first.stdout).contains("SORTIE_ERROR"),
            "attempt 1 failed, and its transcript says how"
        );

        let v = task_status(&s, run, label);
        assert_eq!(v["label"], label);
        assert_eq!(v["state"], "completed");
        let ts = v["transcripts"].as_array().expect("transcripts");
        assert_eq!(ts.len(), 2, "{v}");
        for (i, t) in ts.iter().enumerate() {
            let path = attempt_file(&s, run, task, i as u32 + 1, "stdout");
            assert_eq!(t["attempt"], i + 1);
            assert_eq!(t["executor"], executor);
            assert_eq!(t["path"], path.to_str().expect("utf-8"));
            assert_eq!(t["exists"], true);
            assert_eq!(
                t["bytes"],
                std::fs::metadata(&path).expect("kept").len(),
                "{t}"
            );
            assert_eq!(t["cut"], Value::Null, "a small transcript is whole");
        }
        assert_eq!(ts[0]["end"], "failed");
        assert_eq!(ts[1]["end"], "completed");

        let text = s.run_ok(&["status", run, "--task", label]);
        let text = String::from_utf8_lossy(&text.stdout);
        for n in 1..=2 {
            let path = attempt_file(&s, run, task, n, "stdout");
            assert!(
                text.contains(&format!("attempt {n} ({executor}, ")),
                "{text}"
            );
            assert!(text.contains(path.to_str().expect("utf-8")), "{text}");
        }
    }

    // What is absent is named.
    let out = s.run(&["logs", run, "nope"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(run.as_str()) && err.contains("no task \"nope\""),
        "{err}"
    );
    let out = s.run(&["logs", run, "sup", "--attempt", "7"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(run.as_str()) && err.contains("sup") && err.contains("no attempt 7"),
        "{err}"
    );

    // gc removes the transcripts of a finished run with its other leftovers.
    let out = s.run_ok(&["--json", "gc", "--older-than", "0s"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let entry = report
        .as_array()
        .and_then(|a| a.iter().find(|e| e["run"] == run.as_str()))
        .unwrap_or_else(|| panic!("gc names the run: {report}"));
    assert_eq!(entry["transcripts"]["attempts"], 4, "{entry}");
    assert!(!attempt_file(&s, run, 0, 1, "stdout").exists());
    assert!(
        !s.state_dir()
            .join("runs")
            .join(run)
            .join("attempts")
            .exists()
    );
    let v = task_status(&s, run, "sup");
    assert_eq!(v["transcripts"][1]["exists"], false, "{v}");
    let out = s.run(&["logs", run, "sup"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("attempt 2 of task sup") && err.contains("sortie gc"),
        "{err}"
    );
    // The journal still has every outcome: the run's status is untouched.
    assert_eq!(s.status(run)["status"], "completed");
}

/// A chatty agent (2.5 MB of JSON lines) under a 64 KiB cap, supervised and over pipes: the
/// file keeps its length but takes about the cap on disk, its first lines and its last lines
/// are kept, `status --task` says what was cut, and `logs` prints only whole lines, saying on
/// stderr what it jumped over. The task still completes: its end was kept.
#[test]
fn a_chatty_agent_is_cut_to_the_cap_keeping_its_head_and_tail() {
    let s = Scratch::new();
    let run = &unique_run("cap");
    let chatty = r#"["sh", "-c", "seq 1 200000 | awk '{print \"{\\\"n\\\":\" $1 \"}\"}'"]"#;
    let b = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"sup\"\ncommand = {chatty}\n\n\
             [[tasks]]\nlabel = \"pipes\"\nsupervise = false\ncommand = {chatty}\n"
        ),
    );
    let out = s
        .sortie()
        .env("SORTIE_TRANSCRIPT_CAP", "64KiB")
        .args([
            "--quiet",
            "run",
            "--run-id",
            run,
            b.to_str().expect("utf-8"),
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let whole: usize = (1..=200_000).map(|n: u32| n.to_string().len() + 7).sum();
    for (task, label) in [(0, "sup"), (1, "pipes")] {
        let path = attempt_file(&s, run, task, 1, "stdout");
        let v = task_status(&s, run, label);
        let t = &v["transcripts"][0];
        assert_eq!(
            t["bytes"], whole as u64,
            "{label}: the stream's length stays"
        );
        let disk = t["disk_bytes"].as_u64().expect("disk_bytes");
        assert!(disk <= 2 * 64 * 1024, "{label}: {disk} bytes on disk");
        assert_eq!(t["cut"]["from"], 16 * 1024, "{label}: {t}");
        let to = t["cut"]["to"].as_u64().expect("cut.to");
        assert!(
            whole as u64 - to < 52 * 1024,
            "{label}: the tail is kept: {t}"
        );
        assert_eq!(t["path"], path.to_str().expect("utf-8"));

        let out = s.run_ok(&["logs", run, label]);
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first(), Some(&"{\"n\":1}"), "{label}: the head");
        assert_eq!(lines.last(), Some(&"{\"n\":200000}"), "{label}: the tail");
        assert!(
            lines.iter().all(|l| {
                l.strip_prefix("{\"n\":")
                    .and_then(|r| r.strip_suffix('}'))
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            }),
            "{label}: every line printed is whole"
        );
        assert!(text.len() <= 68 * 1024, "{label}: {} bytes", text.len());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("were cut") && err.contains(&format!("bytes 16384..{to}")),
            "{label}: {err}"
        );
        let human = String::from_utf8_lossy(&s.run_ok(&["status", run, "--task", label]).stdout)
            .into_owned();
        assert!(human.contains(", cut "), "{human}");
    }
}

/// `logs --follow` from another terminal prints what a live attempt writes, as it writes it,
/// and returns by itself once the attempt ended: supervised and over pipes.
#[test]
fn logs_follow_tails_a_live_attempt_until_it_ends() {
    let s = Scratch::new();
    let run = &unique_run("follow");
    let go = s.path().join("go");
    let script = format!(
        "echo one; while [ ! -e {} ]; do sleep 0.1; done; echo two",
        go.display()
    );
    let b = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"sup\"\ncommand = [\"sh\", \"-c\", {script:?}]\n\n\
             [[tasks]]\nlabel = \"pipes\"\nsupervise = false\ncommand = [\"sh\", \"-c\", {script:?}]\n"
        ),
    );
    let sortie = Background::start(
        &s,
        run,
        &[
            "--quiet",
            "run",
            "--run-id",
            run,
            b.to_str().expect("utf-8"),
        ],
    );
    for task in [0, 1] {
        poll("the first line", PATIENCE, || {
            std::fs::read_to_string(attempt_file(&s, run, task, 1, "stdout"))
                .ok()
                .filter(|t| t.contains("one"))
        });
    }
    let mut followers = Vec::new();
    for label in ["sup", "pipes"] {
        let mut child = s
            .sortie()
            .args(["logs", run, label, "--follow"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("logs --follow");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let first = rx
            .recv_timeout(Duration::from_secs(PATIENCE))
            .expect("the live attempt's first line");
        assert_eq!(first, "one", "{label}");
        followers.push((label, child, rx));
    }
    // The attempts are still running: nothing more was printed, and the followers wait.
    std::fs::write(&go, "").expect("go");
    for (label, child, rx) in followers {
        let out = finish(child, PATIENCE);
        assert_eq!(out.status.code(), Some(0), "{label}: {out:?}");
        let rest: Vec<String> = rx.iter().collect();
        assert_eq!(rest, vec!["two".to_owned()], "{label}: the rest, once");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("ended"), "{label}: {err}");
    }
    let out = sortie.finish(PATIENCE);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

//! End-to-end tests of transcripts (#10): every attempt, supervised or not, keeps the agent's
//! whole stdout (in its attempt dir, or beside the dir's name for the shepherd's attempts);
//! `sortie status --task` lists them (path, size, cut), `sortie logs` prints them (the last
//! attempt by default, `--attempt N`, `--follow` tailing a live one from another terminal until
//! it ends), a chatty agent is cut to the cap (`SORTIE_TRANSCRIPT_CAP`: its head and tail kept,
//! what was cut said), and `sortie gc` removes them with the run's other leftovers.

use sortie_testkit::Events;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::support::{Background, Scratch, fake_command, finish, poll, unique_run};

/// How long a bounded wait may last, in seconds.
const PATIENCE: u64 = 60;

fn attempt_dir(s: &Scratch, run: &str, task: u32, attempt: u32) -> PathBuf {
    s.state_dir()
        .join("runs")
        .join(run)
        .join("attempts")
        .join(format!("{task}.{attempt}"))
}

/// The attempt's file `name` (`stdout`, `stderr`): inside its dir (the direct executor's, a
/// supervisor's of its own), or beside the dir's name when it has none (the shepherd's).
fn attempt_file(s: &Scratch, run: &str, task: u32, attempt: u32, name: &str) -> PathBuf {
    let dir = attempt_dir(s, run, task, attempt);
    if dir.is_dir() {
        return dir.join(name);
    }
    let mut beside = dir.into_os_string();
    beside.push(format!(".{name}"));
    PathBuf::from(beside)
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

    // The shepherd's attempts have no dir: their files lie beside the dir's name, where
    // `status` says they are; the direct executor's are in a dir each.
    for attempt in [1, 2] {
        assert!(!attempt_dir(&s, run, 0, attempt).exists());
        assert!(attempt_dir(&s, run, 1, attempt).join("stdout").is_file());
    }
    let dir = attempt_dir(&s, run, 0, 1);
    let attempts = dir.parent().expect("the attempts dir");
    for name in ["0.1.stdout", "0.1.stderr", "0.2.stdout", "0.2.stderr"] {
        assert!(attempts.join(name).is_file(), "{name}");
    }
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

/// A run that an earlier sortie started kept every shepherd's attempt in a dir of its own
/// (`attempts/0.1/stdout`): `logs` and `status --task` still find the files there.
#[test]
fn the_transcripts_of_an_earlier_sorties_dir_per_attempt_are_still_read() {
    let s = Scratch::new();
    let run = &unique_run("olddirs");
    let b = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"sup\"\ncommand = {}\n",
            fake_command(&["--turns", "2", "--answer", "kept"])
        ),
    );
    s.run_ok(&[
        "--quiet",
        "run",
        "--run-id",
        run,
        b.to_str().expect("utf-8"),
    ]);
    // What the shepherd's attempt looked like before: its files inside its dir.
    let dir = attempt_dir(&s, run, 0, 1);
    let (stdout, stderr) = (
        attempt_file(&s, run, 0, 1, "stdout"),
        attempt_file(&s, run, 0, 1, "stderr"),
    );
    assert!(!dir.exists() && stdout.is_file() && stderr.is_file());
    let text = std::fs::read(&stdout).expect("stdout");
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::rename(&stdout, dir.join("stdout")).expect("mv stdout");
    std::fs::rename(&stderr, dir.join("stderr")).expect("mv stderr");

    let out = s.run_ok(&["logs", run, "sup"]);
    assert_eq!(out.stdout, text);
    assert!(String::from_utf8_lossy(&text).contains("kept"));
    let v = task_status(&s, run, "sup");
    let t = &v["transcripts"][0];
    assert_eq!(
        t["path"],
        dir.join("stdout").to_str().expect("utf-8"),
        "{v}"
    );
    assert_eq!(
        t["stderr"],
        dir.join("stderr").to_str().expect("utf-8"),
        "{v}"
    );
    assert_eq!(t["exists"], true, "{v}");
    assert_eq!(t["bytes"], text.len(), "{v}");
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
        // #37: the end in words, not a Rust debug value (`Code(0)`).
        assert!(err.contains("ended with exit code 0"), "{label}: {err}");
        assert!(!err.contains("Code("), "{label}: {err}");
    }
    let out = sortie.finish(PATIENCE);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// A pi-json agent for the cap tests: each step is a tool's output (`pad` bytes) and an
/// assistant message whose usage is its own call's (pi's: summed by the reader, so a step lost
/// is usage lost). `steps` steps, then the file `<label>.phase1`; then, once the file `go` is
/// there, `more` steps and `<label>.phase2`; then, if `wait_end`, it waits for the file `end`
/// and makes `last` steps. It ends with its answer and `agent_end`.
const CAP_AGENT: &str = r#"
import json, os, sys, time
label, steps, more, last, wait_end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
pad = "x" * 900
def step(k, stop="toolUse", text=None):
    sys.stdout.write(json.dumps({"type": "tool_execution_end", "toolCallId": f"c{k}", "toolName": "read", "result": {"content": [{"type": "text", "text": pad}]}, "isError": False}) + "\n")
    usage = {"input": 10, "output": 2, "totalTokens": 12, "cost": {"total": 0.001}}
    m = {"role": "assistant", "content": [{"type": "text", "text": text or f"step {k}"}], "usage": usage, "stopReason": stop}
    sys.stdout.write(json.dumps({"type": "message_end", "message": m}) + "\n")
    sys.stdout.flush()
def wait(name):
    while not os.path.exists(name):
        time.sleep(0.05)
k = 0
for _ in range(steps):
    k += 1; step(k)
open(label + ".phase1", "w").close()
wait("go")
for _ in range(more):
    k += 1; step(k)
open(label + ".phase2", "w").close()
if wait_end:
    wait("end")
    for _ in range(last):
        k += 1; step(k)
k += 1; step(k, "stop", label + " done")
sys.stdout.write(json.dumps({"type": "agent_end", "messages": []}) + "\n")
sys.stdout.flush()
"#;

/// #10: supervised pi agents go on writing usage past the transcript's cap while sortie is
/// SIGKILLed. The cutter never cuts what sortie has not read and journaled: the files grow past
/// the cap instead (nothing of the unread part cut), resume reads every step, and the ledger
/// is exactly what each agent reported, for an attempt that ended while sortie was down
/// (recorded) and for one still running (adopted); once they ended, the files are back under
/// the cap. One that outgrows the hard bound (4 times the cap) while sortie is down is cut all
/// the same, and `logs` and `status --task` name what was cut unread. sortie is killed only
/// once it acknowledged reading past the head the cap keeps, so the cutter cuts lines sortie
/// read while it is down: their usage is counted from the journal (it was lost before).
#[test]
fn the_cap_never_cuts_what_sortie_has_not_read_and_names_what_the_hard_bound_cut() {
    const CAP: u64 = 64 * 1024;
    let s = Scratch::new();
    let run = &unique_run("unread");
    // An agent that waits for its go (the adopted one) outlives a failed assertion otherwise.
    let _cleanup = sortie_testkit::procs::KillOnDrop(run.clone());
    let agent = s.write("cap-agent.py", CAP_AGENT);
    // (label, steps before the crash, steps while sortie is down, steps after resume, waits)
    // A step is about 1.2 KiB: 150 steps are about 2.8 times the cap, 260 about 4.9.
    let tasks = [
        ("recorded", 20, 150, 0, false),
        ("adopted", 20, 150, 30, true),
        ("flood", 20, 260, 0, false),
    ];
    let mut toml = String::new();
    for (label, steps, more, last, wait) in tasks {
        let argv = [
            "python3".to_owned(),
            agent.display().to_string(),
            label.to_owned(),
            steps.to_string(),
            more.to_string(),
            last.to_string(),
            if wait { "1" } else { "0" }.to_owned(),
            "{prompt}".to_owned(),
        ];
        let quoted: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
        toml.push_str(&format!(
            "[agents.{label}]\ncommand = [{}]\nprotocol = \"pi-json\"\nmay_write = false\n\n\
             [[tasks]]\nlabel = \"{label}\"\nagent = \"{label}\"\nprompt = \"go\"\n\
             cwd = {:?}\n\n",
            quoted.join(", "),
            s.path().display().to_string()
        ));
    }
    let b = s.write("batch.toml", &toml);
    let cap = CAP.to_string();
    let mut cmd = s.sortie();
    cmd.env("SORTIE_TRANSCRIPT_CAP", &cap).args([
        "run",
        "--run-id",
        run,
        b.to_str().expect("utf-8"),
    ]);
    let sortie = Background::from_command(cmd, run);
    let marker = |name: &str| s.path().join(name).exists();
    poll("the agents' first steps", PATIENCE, || {
        tasks
            .iter()
            .all(|t| marker(&format!("{}.phase1", t.0)))
            .then_some(())
    });
    // Once sortie acknowledged reading past the head the cap keeps (a quarter of it) and a
    // block more, the cutter cuts read lines while sortie is down: resume must count them from
    // the journal, since it cannot read them again.
    poll("sortie to acknowledge the first steps", PATIENCE, || {
        [0, 1]
            .iter()
            .all(|t| {
                let stdout = attempt_file(&s, run, *t, 1, "stdout");
                std::fs::read_to_string(sortie_runner::transcript::read_file(&stdout))
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                    .is_some_and(|acked| acked >= CAP / 4 + 4096)
            })
            .then_some(())
    });
    crate::support::send_signal(sortie.pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = sortie.finish(30);
    // sortie is down: the agents write on.
    std::fs::write(s.path().join("go"), "").expect("go");
    poll("the agents' steps while sortie is down", PATIENCE, || {
        let ended = [0, 2]
            .iter()
            .all(|t| sortie_testkit::exit_recorded(&attempt_dir(&s, run, *t, 1)));
        (ended && marker("adopted.phase2")).then_some(())
    });
    for (task, label) in [(0, "recorded"), (1, "adopted")] {
        let path = attempt_file(&s, run, task, 1, "stdout");
        let len = std::fs::metadata(&path).expect("stdout").len();
        assert!(len > 2 * CAP, "{label} wrote past its cap: {len}");
        let cut = process_cut(&path);
        assert!(
            cut.is_none_or(|(_, to)| to <= 30 * 1024),
            "{label}: nothing sortie had not read is cut: {cut:?}"
        );
        if task == 0 {
            // Ended, so cut to the cap: what sortie read, past the head, is gone from the file.
            assert!(
                cut.is_some_and(|(from, to)| from < to),
                "{label}: what sortie read is cut: {cut:?}"
            );
        }
    }
    let flood = attempt_file(&s, run, 2, 1, "stdout");
    let len = std::fs::metadata(&flood).expect("stdout").len();
    assert!(len > 4 * CAP, "the flood passed the hard bound: {len}");
    assert!(
        process_cut(&flood).is_some(),
        "the flood is cut all the same"
    );

    let mut cmd = s.sortie();
    cmd.env("SORTIE_TRANSCRIPT_CAP", &cap)
        .args(["resume", run])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let resumed = Background::from_command(cmd, run);
    poll("the adopted attempt to be adopted", PATIENCE, || {
        let j = sortie_testkit::Journal::from_events(s.try_events(run)?).ok()?;
        (j.count("AttemptAdopted") == 1).then_some(())
    });
    std::fs::write(s.path().join("end"), "").expect("end");
    let out = resumed.finish(120);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "the run completes: {err}");
    assert!(
        err.contains("were cut before sortie read them"),
        "the resume warns of the flood's loss: {err}"
    );

    let j = sortie_testkit::Journal::from_events(s.events(run)).expect("events");
    assert_eq!(j.count("AttemptRecorded"), 2, "recorded and flood");
    assert_eq!(j.count("AttemptAdopted"), 1);
    let usage = j.attempt_usage();
    for (task, (label, steps, more, last, _)) in tasks.iter().enumerate() {
        let calls = (steps + more + last + 1) as u64;
        let reported = sortie_testkit::Usage {
            input: 10 * calls,
            output: 2 * calls,
            nanos: 1_000_000 * calls,
            turns: calls,
            ..Default::default()
        };
        let counted = usage[&(task as u64, 1)];
        if *label == "flood" {
            assert!(
                counted.input < reported.input,
                "the flood's unread part is not counted: {counted:?}"
            );
        } else {
            assert_eq!(
                counted, reported,
                "{label}: the ledger is the agent's report"
            );
        }
        // Ended: back under the cap, the stream's length kept.
        let v = task_status(&s, run, label);
        let t = &v["transcripts"][0];
        let disk = t["disk_bytes"].as_u64().expect("disk_bytes");
        assert!(disk <= 2 * CAP, "{label}: {disk} bytes on disk: {t}");
        if *label != "flood" {
            assert!(t["cut"]["unread"].is_null(), "{label}: {t}");
        }
    }
    let v = task_status(&s, run, "flood");
    let unread = v["transcripts"][0]["cut"]["unread"].as_u64();
    assert!(unread.is_some(), "status names the unread part: {v}");
    let out = s.run_ok(&["logs", run, "flood"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cut before sortie read") && err.contains("not counted"),
        "logs names the loss: {err}"
    );
    let human =
        String::from_utf8_lossy(&s.run_ok(&["status", run, "--task", "flood"]).stdout).into_owned();
    assert!(human.contains("cut before sortie read it"), "{human}");
}

/// The cut recorded beside `path` (`<from> <to>`), if any.
fn process_cut(path: &std::path::Path) -> Option<(u64, u64)> {
    let mut name = path.file_name()?.to_os_string();
    name.push(".cut");
    let text = std::fs::read_to_string(path.with_file_name(name)).ok()?;
    let mut it = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

/// #37: sortie's log lines (WARN and the like) carry no colour codes on a pipe.
#[test]
fn log_lines_off_a_terminal_carry_no_colour_codes() {
    let s = Scratch::new();
    let b = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"a\"\ncommand = [\"true\"]\n",
    );
    let out = s
        .sortie()
        .env("RUST_LOG", "debug")
        .args(["--quiet", "run", b.to_str().expect("utf-8")])
        .output()
        .expect("sortie");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DEBUG"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err}");
}

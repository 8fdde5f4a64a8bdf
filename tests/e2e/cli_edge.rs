//! The cli's edge: a stdout closed by its reader (`sortie list | head -1` under
//! `set -o pipefail`) ends the command quietly with exit 0, and `sortie export` prints the
//! versioned export format, pinned here to a committed file; with `--json`, every error is
//! one JSON object on stdout carrying its exit code.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The journal crate's committed format-v1 run (every event kind of its first version).
fn fixture_run() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../journal/tests/fixtures/v1")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read the fixture") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy");
        }
    }
}

/// A state dir holding the fixture as run `fixture-v1`.
fn state_with_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&fixture_run(), &dir.path().join("runs/fixture-v1"));
    dir
}

fn sortie(state: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sortie"));
    cmd.env_remove("SORTIE_DIR")
        .env_remove("RUST_LOG")
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// Runs sortie with stdout a pipe whose reading end is closed before sortie starts: its first
/// write to stdout fails with EPIPE, every time.
fn with_closed_stdout(state: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    sortie(state, args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run sortie")
}

#[test]
fn a_closed_stdout_ends_each_command_quietly_with_exit_0() {
    let empty = tempfile::tempdir().expect("tempdir");
    let state = state_with_fixture();
    let cases: [(&Path, &[&str]); 6] = [
        (empty.path(), &["list"]),
        (empty.path(), &["--json", "list"]),
        (state.path(), &["export", "fixture-v1"]),
        (state.path(), &["status", "fixture-v1"]),
        (state.path(), &["--json", "status", "fixture-v1"]),
        (state.path(), &["replay", "fixture-v1"]),
    ];
    for (dir, args) in cases {
        let out = with_closed_stdout(dir, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(0),
            "sortie {args:?} with a closed stdout: a broken pipe is graceful\nstderr:\n{stderr}"
        );
        assert!(
            stderr.is_empty(),
            "sortie {args:?} says nothing about a closed stdout: {stderr}"
        );
    }
}

#[test]
fn under_pipefail_a_listing_cut_short_by_head_succeeds() {
    let state = state_with_fixture();
    // head reads nothing and exits at once, long before sortie has opened the journal, so
    // sortie's writes fail with EPIPE. (Were sortie first, its writes would land in the pipe
    // and it would exit 0 all the same: the test above is the one that cannot race.)
    let script = format!(
        "set -o pipefail; {} --state-dir {} export fixture-v1 | head -c 0",
        env!("CARGO_BIN_EXE_sortie"),
        state.path().display()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env_remove("SORTIE_DIR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{script}\nstderr:\n{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

#[test]
fn export_prints_the_committed_v1_export_of_the_fixture_run() {
    let state = state_with_fixture();
    let out = sortie(state.path(), &["export", "fixture-v1"])
        .output()
        .expect("run sortie");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).expect("utf-8");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/e2e/data/export-v1.jsonl"
    );
    let expected = std::fs::read_to_string(path).expect("the committed export");
    assert!(
        got == expected,
        "`sortie export` changed what users parse; if that is meant, bump the format's version \
         (sortie_journal::EXPORT_VERSION) and commit the new {path}. Now:\n{got}"
    );
    for line in got.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(v["v"], 1, "{line}");
    }
}

/// The run index is a cache of the journals: an entry that cannot be read (damaged, or in the
/// `key=value` format of sortie before 0.1's layout) is rebuilt from its run's journal by
/// `sortie list`, not dropped from the listing.
#[test]
fn list_rebuilds_an_unreadable_index_entry_from_the_journal() {
    let state = state_with_fixture();
    let index = state.path().join("index");
    std::fs::create_dir_all(&index).expect("mkdir");
    std::fs::write(
        index.join("fixture-v1"),
        "run_id=fixture-v1\nstatus=running\ntasks=2\n",
    )
    .expect("write an old-format entry");
    let out = sortie(state.path(), &["--json", "list"])
        .output()
        .expect("sortie list");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list --json");
    assert_eq!(rows[0]["run_id"], "fixture-v1", "{rows}");
    let journal = sortie(state.path(), &["--json", "status", "fixture-v1"])
        .output()
        .expect("sortie status");
    let status: serde_json::Value = serde_json::from_slice(&journal.stdout).expect("status");
    assert_eq!(
        rows[0]["tasks"].as_u64(),
        status["tasks"].as_array().map(|t| t.len() as u64),
        "the task count comes from the journal: {rows}"
    );
    let rewritten = std::fs::read_to_string(index.join("fixture-v1")).expect("entry");
    assert!(
        rewritten.trim_start().starts_with('{'),
        "the entry is written back in the current format: {rewritten}"
    );
}

/// A run whose index file was lost while its journal is there is listed (`status` reads it),
/// its entry rebuilt from the journal.
#[test]
fn list_shows_a_run_whose_index_file_was_lost() {
    let state = state_with_fixture();
    let index = state.path().join("index");
    let _ = std::fs::remove_file(index.join("fixture-v1"));
    assert!(!index.join("fixture-v1").exists());
    let status = sortie(state.path(), &["--json", "status", "fixture-v1"])
        .output()
        .expect("sortie status");
    assert_eq!(status.status.code().map(|c| c == 0 || c == 1), Some(true));
    let out = sortie(state.path(), &["--json", "list"])
        .output()
        .expect("sortie list");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("list --json");
    assert_eq!(rows[0]["run_id"], "fixture-v1", "{rows}");
    assert!(
        index.join("fixture-v1").exists(),
        "the entry is written back"
    );
}

/// Runs sortie in `state` and reads its stdout as the one JSON error `--json` prints: the
/// object, and the exit code, which must be its `code`; nothing on stderr.
fn json_error(state: &Path, args: &[&str]) -> serde_json::Value {
    let out = sortie(state, args).output().expect("run sortie");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("sortie {args:?}: one JSON object on stdout ({e}): {stdout}"));
    assert!(v["error"].is_string(), "sortie {args:?}: {v}");
    assert_eq!(
        out.status.code().map(i64::from),
        v["code"].as_i64(),
        "sortie {args:?}: the exit code is the code said: {v}"
    );
    assert!(stderr.trim().is_empty(), "sortie {args:?}: {stderr}");
    v
}

/// #37: with `--json`, every error is `{"error": ..., "code": N}` on stdout with exit N:
/// clap's own parse errors, a usage error, an unknown run, a corrupt journal.
#[test]
fn with_json_every_error_is_a_json_object_with_its_exit_code() {
    let state = state_with_fixture();
    let dir = state.path();
    for args in [
        &["--json", "bogus"][..],
        &["status", "--bogus", "--json"],
        &["--json", "replay"],
    ] {
        assert_eq!(json_error(dir, args)["code"], 2, "{args:?}");
    }
    let unknown = json_error(dir, &["--json", "status", "nosuch"]);
    assert_eq!(unknown["code"], 2);
    assert!(
        unknown["error"]
            .as_str()
            .is_some_and(|e| e.contains("nosuch")),
        "{unknown}"
    );
    let not_live = json_error(dir, &["--json", "hold", "fixture-v1"]);
    assert!(
        not_live["error"]
            .as_str()
            .is_some_and(|e| e.contains("not running")),
        "{not_live}"
    );

    // A journal whose log is noise, with no snapshot: corrupt, exit 4.
    let s = crate::support::Scratch::new();
    s.run_ok(&["--quiet", "run", "--run-id", "noise", "--", "true"]);
    let run_dir = s.state_dir().join("runs/noise");
    let db = run_dir.join("journal/db");
    let len = std::fs::metadata(&db).expect("the log").len() as usize;
    let noise: Vec<u8> = (0..len).map(|i| (i * 7919 % 251) as u8).collect();
    std::fs::write(&db, noise).expect("write the noise");
    for name in ["journal.snapshot", "journal.snapshot.1"] {
        let _ = std::fs::remove_file(run_dir.join(name));
    }
    let corrupt = json_error(&s.state_dir(), &["--json", "status", "noise"]);
    assert_eq!(corrupt["code"], 4, "{corrupt}");
    // A wait that times out on a live run: code 5.
    let live = crate::support::Background::start(
        &s,
        "slow",
        &["run", "--run-id", "slow", "--", "sleep", "30"],
    );
    s.wait_task_state("slow", 0, "running");
    let waited = json_error(
        &s.state_dir(),
        &["--json", "wait", "slow", "--timeout", "100ms"],
    );
    assert_eq!(waited["code"], 5, "{waited}");
    let _ = s.run(&["cancel", "slow"]);
    drop(live);
    // Without --json, the same errors stay words on stderr.
    let out = sortie(dir, &["status", "nosuch"]).output().expect("sortie");
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("sortie: no run nosuch"));
}

/// #37: two `run --run-id X` started at once: one runs it, the other always exits 2 (the run
/// exists), never 1 (a failed run's code), whichever step it loses the race at.
#[test]
fn of_two_runs_of_one_id_started_at_once_the_loser_always_exits_2() {
    let s = crate::support::Scratch::new();
    let batch = s.write("b.toml", "[[tasks]]\nlabel = \"t\"\ncommand = [\"true\"]\n");
    let b = batch.to_str().expect("utf-8");
    let pairs: Vec<(String, [std::process::Child; 2])> = (0..8)
        .map(|i| {
            let run = format!("race-{i}");
            let start = || {
                s.sortie()
                    .args(["--quiet", "run", "--run-id", &run, b])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn sortie")
            };
            let pair = [start(), start()];
            (run, pair)
        })
        .collect();
    for (run, pair) in pairs {
        let mut codes: Vec<(Option<i32>, String)> = pair
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output().expect("wait");
                (
                    out.status.code(),
                    String::from_utf8_lossy(&out.stderr).into_owned(),
                )
            })
            .collect();
        codes.sort();
        assert_eq!(codes[0].0, Some(0), "{run}: one ran it: {codes:?}");
        assert_eq!(codes[1].0, Some(2), "{run}: the other exits 2: {codes:?}");
        assert!(codes[1].1.contains("exists already"), "{run}: {codes:?}");
    }
}

/// #37: a resume refused because another process holds the run (here a stand-in for a second
/// resume that has taken the lock and not yet written its pid) never names the crashed owner's
/// dead pid as the live one.
#[test]
fn a_refused_resume_never_names_a_dead_owners_pid_as_live() {
    let s = crate::support::Scratch::new();
    let mut owner = s.spawn(&["--quiet", "run", "--run-id", "dead", "--", "sleep", "30"]);
    let run_dir = s.state_dir().join("runs/dead");
    s.wait_task_state("dead", 0, "running");
    let pid = owner.id();
    let _ = owner.kill();
    let _ = owner.wait();
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(run_dir.join("owner.lock"))
        .arg("cat")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("flock holds the run's lock");
    // flock takes the lock before it runs `cat`: wait for the lock to be held.
    let locker = format!(" {} ", holder.id());
    crate::support::poll("flock to hold the run's lock", 60, || {
        std::fs::read_to_string("/proc/locks")
            .unwrap_or_default()
            .contains(&locker)
            .then_some(())
    });
    let out = s.run(&["resume", "dead"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is live"), "{err}");
    assert!(
        !err.contains(&pid.to_string()),
        "the dead owner {pid} named as live: {err}"
    );
    drop(holder.stdin.take());
    let _ = holder.wait();
    let _ = s.run(&["cancel", "dead"]);
}

//! Helpers shared by the end-to-end tests: a scratch state dir, running `sortie`, reading its
//! journal through `export`. What the torture shares too (polls and waits, the `/proc` marker
//! scan, run ids, the export's view) is in `sortie-testkit`, re-exported here.

#![allow(dead_code, reason = "each test module uses a different subset")]
#![allow(
    unreachable_pub,
    reason = "a test binary exports nothing: `pub` here means \"for the test modules\""
)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub use sortie_testkit::{finish, live_processes_of, poll, unique_run};

/// A scratch directory with a state dir, where batches are written and `sortie` runs.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Writes a file under the scratch dir and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    /// A `sortie` command with `--state-dir` set, run from the scratch dir.
    pub fn sortie(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sortie"));
        c.current_dir(self.dir.path())
            .env_remove("SORTIE_DIR")
            .env_remove("RUST_LOG")
            .env_remove("COLUMNS")
            .arg("--state-dir")
            .arg(self.state_dir())
            .stdin(Stdio::null());
        c
    }

    /// Runs `sortie ARGS` to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.sortie().args(args).output().expect("run sortie")
    }

    /// Runs `sortie ARGS` to its end, panicking unless it exits 0 (naming the command, cwd,
    /// status, stdout and stderr: `sortie_testkit::run`).
    pub fn run_ok(&self, args: &[&str]) -> Output {
        sortie_testkit::run(self.sortie().args(args))
    }

    /// Starts `sortie ARGS` in the background (stdout and stderr piped).
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.sortie()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sortie")
    }

    /// The run's events, through `sortie export`.
    pub fn events(&self, run: &str) -> Vec<serde_json::Value> {
        let out = self.run_ok(&["export", run]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("export prints JSON lines"))
            .collect()
    }

    /// The display state of task `index` of `run` as `status --json` says it (None while the
    /// run cannot be read yet).
    pub fn task_state(&self, run: &str, index: usize) -> Option<String> {
        let out = self.run(&["--json", "status", run]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["tasks"][index]["state"].as_str().map(str::to_owned)
    }

    /// Waits (60 s at most) until task `index` of `run` is in display state `state`.
    pub fn wait_task_state(&self, run: &str, index: usize, state: &str) {
        poll(&format!("task {index} of {run} to be {state}"), 60, || {
            (self.task_state(run, index).as_deref() == Some(state)).then_some(())
        });
    }

    /// `sortie status --json RUN`.
    pub fn status(&self, run: &str) -> serde_json::Value {
        let out = self.run_ok(&["--json", "status", run]);
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
    }
}

/// The fake agent shipped in `examples/agents/`.
pub fn fake_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents/fake-agent.py")
}

/// A TOML array (`["python3", "<fake agent>", args...]`) for a task's `command`.
pub fn fake_command(args: &[&str]) -> String {
    let mut parts = vec!["python3".to_owned(), fake_agent().display().to_string()];
    parts.extend(args.iter().map(|a| (*a).to_owned()));
    let quoted: Vec<String> = parts.iter().map(|p| format!("{p:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Runs `sortie run --run-id RUN BATCH` to its end (within 300 s) as the fake user whose home
/// is `home`, with the agent's own variables in `unset` removed (the machine's user must not
/// leak in); returns its output and its stderr.
pub fn run_as_user(
    s: &Scratch,
    home: &Path,
    unset: &[&str],
    run: &str,
    batch: &Path,
) -> (Output, String) {
    let mut cmd = s.sortie();
    cmd.env("HOME", home);
    for name in unset {
        cmd.env_remove(name);
    }
    cmd.args(["run", "--run-id", run])
        .arg(batch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = Background::from_command(cmd, run).finish(300);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stderr)
}

/// Sends `signal` to `pid`.
pub fn send_signal(pid: u32, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits in i32"));
    nix::sys::signal::kill(pid, signal).expect("send a signal");
}

/// An exported event's kind (`"TaskFinished"`) and body.
pub fn event_kind(e: &serde_json::Value) -> (&str, &serde_json::Value) {
    let obj = e["event"].as_object().expect("an event is an object");
    let (k, v) = obj.iter().next().expect("an event has a kind");
    (k.as_str(), v)
}

/// The task labels of a run, in task-number order, from its `RunStarted` event.
pub fn labels(events: &[serde_json::Value]) -> Vec<String> {
    let started = events
        .iter()
        .map(event_kind)
        .find(|(k, _)| *k == "RunStarted")
        .expect("the journal starts with RunStarted")
        .1;
    started["batch"]["tasks"]
        .as_array()
        .expect("the batch has tasks")
        .iter()
        .map(|t| t["label"].as_str().expect("a label").to_owned())
        .collect()
}

/// A task's entry in `status --json` output, by label.
pub fn task_view<'a>(status: &'a serde_json::Value, label: &str) -> &'a serde_json::Value {
    status["tasks"]
        .as_array()
        .expect("status has tasks")
        .iter()
        .find(|t| t["label"] == label)
        .unwrap_or_else(|| panic!("no task {label} in status"))
}

impl Scratch {
    /// The run ids `sortie --json list` shows.
    pub fn listed_runs(&self) -> Vec<String> {
        let out = self.run_ok(&["--json", "list"]);
        let rows: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).expect("list --json prints JSON");
        rows.iter()
            .map(|r| r["run_id"].as_str().expect("a run id").to_owned())
            .collect()
    }

    /// `sortie --json audit RUN`, asserting it exits 0 and finds the journal whole.
    pub fn audit_clean(&self, run: &str) -> serde_json::Value {
        let out = self.run_ok(&["--json", "audit", run]);
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("audit --json prints JSON");
        assert_eq!(v["clean"], true, "audit: {v}");
        assert!(v["ledger_mismatch"].is_null(), "audit: {v}");
        v
    }
}

impl Scratch {
    /// The run's events once its journal's clock (the `at` of its last event) has passed
    /// `at_ms`: a wait measured by the journal, for a test that asserts something did not
    /// happen within a span (a batch with a task that keeps reporting keeps the clock moving).
    pub fn events_past(&self, run: &str, at_ms: u64, what: &str) -> Vec<serde_json::Value> {
        use sortie_testkit::Events;
        sortie_testkit::poll(what, 60, || {
            self.try_events(run)
                .filter(|events| events.clock() >= at_ms)
        })
    }

    /// The run's events through `sortie export`, or `None` while there is no such run yet (or
    /// export fails for another reason): for polling a run that is starting.
    pub fn try_events(&self, run: &str) -> Option<Vec<serde_json::Value>> {
        let out = self.run(&["export", run]);
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// A `sortie` started in the background for a run. If the test lets go of it without
/// [`Background::finish`] (it failed), it is interrupted, then killed, and whatever is left of
/// its run's agents is killed, so that a failed test leaves no process behind.
pub struct Background {
    child: Option<Child>,
    run: String,
}

impl Background {
    /// Starts `sortie ARGS` in the background for `run`.
    pub fn start(s: &Scratch, run: &str, args: &[&str]) -> Background {
        Background {
            child: Some(s.spawn(args)),
            run: run.to_owned(),
        }
    }

    /// Starts `cmd` (a [`Scratch::sortie`] command with its arguments, and whatever extra
    /// environment the test needs) in the background for `run`.
    pub fn from_command(mut cmd: Command, run: &str) -> Background {
        Background {
            child: Some(cmd.spawn().expect("spawn sortie")),
            run: run.to_owned(),
        }
    }

    /// The pid of the `sortie` process.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Waits for it to end (see [`finish`]).
    pub fn finish(mut self, secs: u64) -> Output {
        // From here on the test checks what is left behind itself.
        self.run.clear();
        finish(self.child.take().expect("not finished yet"), secs)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGINT,
                );
            }
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.run.is_empty() {
            return;
        }
        for pid in live_processes_of(&self.run) {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

//! One cell's scene: a scratch directory with the workload's tasks (each a directory with its
//! `work.sh`), the gates the matrix opens, each task's side-effect counter and the pids of its
//! runs, and for an agent the loopback mock model server and the fake user pointed at it.
//!
//! A task's work, the same under sortie and under GNU parallel (an agent runs it as its one
//! `bash` tool call, which the mock asks for):
//!
//! ```sh
//! echo $$ >> pids                          # it began (not a side effect)
//! until [ -e ../../go1 ]; do sleep 0.05; done  # held before its side effect
//! echo start >> count                          # the side effect begins
//! until [ -e ../../go2 ]; do sleep 0.05; done  # held while it runs
//! echo end >> count                            # and ends
//! ```
//!
//! (its files in its own directory, where an agent's sandbox lets it write). The gates make every moment exact without a timed kill: the matrix opens `go1` and `go2`
//! when the moment it kills at wants the work to go on.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use serde_json::Value;
use sortie_testkit::real_agent::{MockServer, PI_VARS, codex_user, pi_user};

use super::Work;

/// The shell command the mock's tool call runs, in the task's directory.
const TOOL_COMMAND: &str = "sh work.sh";

/// The prompt each agent task is given (the mock answers it with the tool call regardless).
pub(super) const PROMPT: &str = "Run `sh work.sh` in the current directory, then say done.";

/// The model every agent task asks for (`tool`: the tool call first, then the answer).
const MODEL: &str = "tool";

/// A scene: its directory, its tasks and, for an agent, its mock and fake user.
pub(super) struct Scene {
    /// The scratch directory (left for a post-mortem).
    pub(super) dir: PathBuf,
    /// How many tasks.
    pub(super) tasks: usize,
    /// What each task is.
    pub(super) work: Work,
    mock: Option<MockServer>,
}

impl Scene {
    /// Makes `dir` (fresh) with `tasks` tasks of `work`, and starts its mock.
    pub(super) fn new(dir: PathBuf, work: Work, tasks: usize) -> Result<Scene> {
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        for t in 0..tasks {
            let task_dir = dir.join("work").join(format!("t{t}"));
            fs::create_dir_all(&task_dir)
                .with_context(|| format!("creating {}", task_dir.display()))?;
            let (d, w) = (dir.display(), task_dir.display());
            let script = format!(
                "echo $$ >> '{w}/pids'\n\
                 until [ -e '{d}/go1' ]; do sleep 0.05; done\n\
                 echo start >> '{w}/count'\n\
                 until [ -e '{d}/go2' ]; do sleep 0.05; done\n\
                 echo end >> '{w}/count'\n"
            );
            fs::write(task_dir.join("work.sh"), script).context("writing work.sh")?;
        }
        let mock = match work {
            Work::Plain | Work::Slurm => None,
            Work::Pi => Some(MockServer::start(
                &dir,
                "server.py",
                &mock_args("--model", "tool"),
            )),
            Work::Claude => Some(MockServer::start(
                &dir,
                "anthropic_server.py",
                &mock_args("--model", "tool"),
            )),
            Work::Codex => {
                let mut args = vec!["--print-port".to_owned()];
                args.extend(mock_args("--model-scenario", "tool_each"));
                Some(MockServer::start(&dir, "codex_server.py", &args))
            }
        };
        let scene = Scene {
            dir,
            tasks,
            work,
            mock,
        };
        if let Some(port) = scene.mock.as_ref().map(|m| m.port) {
            match work {
                Work::Pi => drop(pi_user(&scene.home(), port, &[MODEL])),
                Work::Codex => drop(codex_user(&scene.home(), port)),
                Work::Claude | Work::Plain | Work::Slurm => {
                    fs::create_dir_all(scene.home()).context("creating the fake home")?;
                }
            }
        }
        Ok(scene)
    }

    /// The fake user's home (agents only).
    pub(super) fn home(&self) -> PathBuf {
        self.dir.join("home")
    }

    /// A task's directory.
    pub(super) fn task_dir(&self, t: usize) -> PathBuf {
        self.dir.join("work").join(format!("t{t}"))
    }

    /// Points `cmd` (sortie, or parallel and the agents it starts) at the mock as the fake
    /// user, and nowhere else.
    pub(super) fn agent_env(&self, cmd: &mut Command) {
        let Some(mock) = &self.mock else {
            return;
        };
        let home = self.home();
        cmd.env("HOME", &home);
        for name in PI_VARS {
            cmd.env_remove(name);
        }
        match self.work {
            Work::Claude => mock.claude_env(cmd, &home),
            Work::Codex => {
                cmd.env("MOCK_API_KEY", "mock-key")
                    .env_remove("CODEX_HOME")
                    .env_remove("OPENAI_API_KEY");
            }
            Work::Pi | Work::Plain | Work::Slurm => {}
        }
    }

    /// The model a task names (in the agent's own terms).
    pub(super) fn model(&self) -> &'static str {
        match self.work {
            Work::Pi => "mock/tool",
            _ => MODEL,
        }
    }

    /// Opens gate `n` (1: the side effect may begin; 2: it may end).
    pub(super) fn open(&self, n: u8) -> Result<()> {
        let gate = self.dir.join(format!("go{n}"));
        fs::write(&gate, "").with_context(|| format!("opening {}", gate.display()))
    }

    fn lines(&self, t: usize, name: &str) -> Vec<String> {
        fs::read_to_string(self.task_dir(t).join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Task `t`'s side effects: (begun, ended).
    pub(super) fn counts(&self, t: usize) -> (u64, u64) {
        let lines = self.lines(t, "count");
        let n = |w: &str| lines.iter().filter(|l| l.as_str() == w).count() as u64;
        (n("start"), n("end"))
    }

    /// Whether every task's side effect has begun at least `n` times.
    pub(super) fn all_begun(&self, n: u64) -> bool {
        (0..self.tasks).all(|t| self.counts(t).0 >= n)
    }

    /// The pids of task `t`'s runs of its work, in order (one line each run began; the pid
    /// is the one its shell saw, maybe in a sandbox's namespace).
    pub(super) fn pids(&self, t: usize) -> Vec<String> {
        self.lines(t, "pids")
    }

    /// Whether every task's work was begun at least `n` times.
    pub(super) fn all_spawned(&self, n: usize) -> bool {
        (0..self.tasks).all(|t| self.pids(t).len() >= n)
    }

    /// Whether anything of any task still runs: a live process whose working directory is
    /// in a task's (its work, an agent, an agent's tool; found in `/proc`, since a pid the
    /// work wrote may be a sandbox's own).
    pub(super) fn work_alive(&self) -> bool {
        let work = self.dir.join("work");
        let Ok(procs) = fs::read_dir("/proc") else {
            return false;
        };
        procs.flatten().any(|p| {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                return false;
            };
            fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(&work))
                && alive(pid)
        })
    }

    /// SIGKILLs every process working in the scene (its directory or below: the controller,
    /// the agents, the work), for a cell that failed.
    pub(super) fn kill_all(&self) {
        let Ok(procs) = fs::read_dir("/proc") else {
            return;
        };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if fs::read_link(p.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(&self.dir)) {
                sortie_testkit::signal(pid, "KILL");
            }
        }
    }

    /// Tokens the mock served in all (input, output, cache read and write), None without a
    /// mock.
    pub(super) fn served(&self) -> Option<u64> {
        let mock = self.mock.as_ref()?;
        Some(mock.served().iter().map(served_tokens).sum())
    }
}

/// The mock's arguments: the tool model (its scenario `kind`), whose tool call runs
/// [`TOOL_COMMAND`].
fn mock_args(flag: &str, kind: &str) -> Vec<String> {
    vec![
        flag.to_owned(),
        format!("{MODEL}={kind}"),
        "--command".to_owned(),
        TOOL_COMMAND.to_owned(),
    ]
}

/// The tokens of one logged response: its `tokens` (pi's and Claude's mocks) every kind
/// summed, or its `usage`'s `total_tokens` (Codex's).
fn served_tokens(r: &Value) -> u64 {
    if let Some(total) = r["usage"]["total_tokens"].as_u64() {
        return total;
    }
    let t = if r["tokens"].is_object() {
        &r["tokens"]
    } else {
        &r["usage"]
    };
    t.as_object()
        .map(|o| o.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0)
}

/// Whether `pid` is a live process (not a zombie).
pub(super) fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Polls `done` every 100 ms for at most `secs` seconds; an error names `what`.
pub(super) fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) -> Result<()> {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if done() {
            return Ok(());
        }
        if std::time::Instant::now() > until {
            anyhow::bail!("gave up after {secs} s waiting for {what}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `path` as a shell word.
pub(super) fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

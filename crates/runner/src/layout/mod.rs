//! Where everything of sortie's lives on disk: the one place that knows the state dir's tree.
//! Each entry names, in brackets, the module that writes it; [`StateDir`] and [`RunDir`] hand
//! out its path (the journal names its own files; [`attempt`] names the inside of an attempt
//! dir).
//!
//! ```text
//! <state-dir>/                        0700
//!   runs/<run-id>/                    a run dir (RunDir)
//!     journal/                        the run's journal (sled)              [sortie-journal]
//!     journal.mark                    the journal's high-water mark    [sortie-journal mark]
//!     journal.snapshot, .snapshot.1   the state at a sequence, and the one before it
//!                                                                [sortie-journal snapshot]
//!     owner.lock                      held with flock by the one live process    [layout]
//!     owner.pid                       that process's pid                         [layout]
//!     control.sock                    the live owner's control socket, while it runs
//!                                                                               [control]
//!     env.json                        0600: the tasks' environment values, never journaled
//!                                                                                [layout]
//!     logs/<task>.<attempt>.stderr    each attempt's stderr tail                [attempt]
//!     agents/<task>.<attempt>/        each attempt's own agent config directory   [agent]
//!     sessions/<task>.<attempt>/      each attempt's agent session (continuable)  [agent]
//!     conversations/<task>/           #13: a conversation's session store, by its first
//!                                     task (its attempts' agent homes share it)   [agent]
//!     copies/<task>/                  #14: a task's throwaway copy of its cwd      [copy]
//!     sandbox/<task>.<attempt>/       #34: a sandboxed attempt's policy.json and its
//!                                     private tmp/ (its TMPDIR)       [attempt (launch)]
//!     attempts/<task>.<attempt>/      an attempt's dir, when its executor makes one (a
//!                                     supervisor of its own, direct, Slurm); its files are
//!                                     named by layout::attempt:
//!       stdout, stderr                the agent's output (the transcript)
//!                                     [supervisor, process (direct), the Slurm job]
//!       stdout.cut, stdout.read       the cap's cut and sortie's read offset; stderr.cut
//!                                                                            [transcript]
//!       started, exit                 the agent's pid and start, its end
//!                                     [supervisor; exit: process (direct)]
//!       stdin                         #10: the FIFO of an agent driven over stdin
//!                                                                            [supervisor]
//!       job.sh, job                   a Slurm job's script and id      [executor::slurm]
//!     attempts/<task>.<attempt>.stdout, .stderr (and their .cut, .read)
//!                                     the shepherd's attempts' files, beside the dir's
//!                                     name (no dir)               [supervisor, transcript]
//!     checks/<task>.<attempt>         #33: a check's placement (its files beside the name
//!                                     under the shepherd, as for an attempt; its own
//!                                     status.log)                 [supervisor, executor]
//!     checks/<task>.<attempt>.log     the check's stdout then stderr, kept     [engine checks]
//!     checks/<task>.<attempt>.output  the agent's answer the check reads (SORTIE_OUTPUT)
//!                                                                         [engine checks]
//!     checks/<task>.<attempt>.result  SORTIE_VERIFY_RESULT: what the check may write
//!                                                                      [the check itself]
//!     attempts/status.log             the shepherd's started and exit records
//!                                                                 [supervisor::status_log]
//!     prompts/<task>.<attempt>        an attempt's prompt, when the agent reads it on stdin
//!                                                                               [attempt]
//!     prompts/<task>.<attempt>.repair #13: the repair round's request (read on stdin)
//!                                                                       [attempt::repair]
//!     patches/<name>.patch            a kept worktree's change                 [worktree]
//!     damaged/<stamp>/                a damaged journal's files, moved aside untouched
//!                                                                               [recover]
//!     recovered.json                  what `sortie recover` found lost          [recover]
//!   index/<run-id>                    the run index: one JSON file per run  [layout::index]
//!   logs/<run-id>.log                 a detached run's output (`run --detach`)
//!                                                                      [process::detach]
//!   worktrees/<run-id>/<name>/        isolated tasks' git worktrees            [worktree]
//! ```
//!
//! Nothing else in the product joins a path onto the state dir. A [`RunDir`] also takes and
//! reports the run's owner lock, and keeps its environment file.

pub mod attempt;
pub mod index;
pub mod open;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use sortie_core::RunId;

use crate::files::write_atomic;
use crate::{Error, Result};

/// #34: the name of a sandboxed attempt's record of connections, in its sandbox dir.
pub const SANDBOX_NET_FILE: &str = "net.jsonl";
/// A state dir (`--state-dir`, `SORTIE_DIR`, `./.sortie`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// The state dir at `root` (nothing is created).
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    /// The same state dir with an absolute path (git runs elsewhere, so paths it is given
    /// must not depend on this process's cwd). Falls back to the path as given.
    pub fn absolute(&self) -> StateDir {
        StateDir::new(std::path::absolute(&self.root).unwrap_or_else(|_| self.root.clone()))
    }

    /// The same state dir with symlinks resolved, when it exists.
    pub fn canonical(&self) -> StateDir {
        StateDir::new(fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone()))
    }

    /// Its root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the state dir (mode 0700) and its `runs/` if missing.
    pub fn ensure(&self) -> Result<()> {
        for dir in [self.root.clone(), self.runs()] {
            private_dir(&dir)?;
        }
        Ok(())
    }

    /// `runs/`: one run dir per run.
    pub fn runs(&self) -> PathBuf {
        self.root.join("runs")
    }

    /// The ids of the runs whose directories are in `runs/` (unsorted; names that are not run
    /// ids are left out).
    pub fn run_ids(&self) -> Vec<RunId> {
        let Ok(entries) = std::fs::read_dir(self.runs()) else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| RunId::new(e.file_name().to_string_lossy().as_ref()).ok())
            .collect()
    }

    /// Where `sortie run --detach` sends a detached run's output: `logs/<run>.log`, beside the
    /// run dir that the detached process creates.
    pub fn detached_log(&self, run: &RunId) -> PathBuf {
        self.root.join("logs").join(format!("{}.log", run.as_str()))
    }

    /// A run's directory (it may not exist).
    pub fn run(&self, run: &RunId) -> RunDir {
        RunDir {
            id: run.clone(),
            path: self.runs().join(run.as_str()),
        }
    }

    /// `index/`: the run index.
    pub fn index(&self) -> PathBuf {
        self.root.join("index")
    }

    /// `worktrees/`: isolated tasks' worktrees, one directory per run.
    pub fn worktrees(&self) -> PathBuf {
        self.root.join("worktrees")
    }

    /// A run's worktrees.
    pub fn run_worktrees(&self, run: &str) -> PathBuf {
        self.worktrees().join(run)
    }

    /// One task's worktree, by its safe name.
    pub fn worktree(&self, run: &str, name: &str) -> PathBuf {
        self.run_worktrees(run).join(name)
    }
}

/// One run's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDir {
    id: RunId,
    path: PathBuf,
}

/// Proof that this process owns a run: the lock is released when it is dropped (or when the
/// process dies, which is what makes a crashed run resumable).
#[derive(Debug)]
pub struct OwnerLock {
    _lock: Flock<File>,
}

/// Who holds a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// A live process holds the run.
    Live {
        /// Its pid, when recorded.
        pid: Option<u32>,
    },
    /// Nobody holds it.
    Free,
}

impl RunDir {
    /// The run.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the run exists.
    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// The journal's directory (sortie-journal names it and owns what is inside).
    pub fn journal(&self) -> PathBuf {
        sortie_journal::db_dir(&self.path)
    }

    /// The owner lock file.
    pub fn owner_lock(&self) -> PathBuf {
        self.path.join("owner.lock")
    }

    /// The owner's pid file.
    pub fn owner_pid(&self) -> PathBuf {
        self.path.join("owner.pid")
    }

    /// The environment values of the tasks (0600).
    pub fn env(&self) -> PathBuf {
        self.path.join("env.json")
    }

    /// Where an attempt's stderr tail is kept.
    pub fn stderr_log(&self, task: u32, attempt: u32) -> PathBuf {
        self.path
            .join("logs")
            .join(format!("{task}.{attempt}.stderr"))
    }

    /// An attempt's own agent config directory.
    pub fn agent_home(&self, task: u32, attempt: u32) -> PathBuf {
        self.path.join("agents").join(format!("{task}.{attempt}"))
    }

    /// The file an attempt's prompt is written to when the agent reads it on stdin.
    pub fn prompt_file(&self, task: u32, attempt: u32) -> PathBuf {
        self.path.join("prompts").join(format!("{task}.{attempt}"))
    }

    /// An attempt's agent session directory.
    pub fn sessions(&self, task: u32, attempt: u32) -> PathBuf {
        self.path.join("sessions").join(format!("{task}.{attempt}"))
    }

    /// #13: the session store of one conversation (a task and its retries, or a `session`'s
    /// tasks), keyed by its first task: the agent homes of its attempts share it.
    pub fn conversation(&self, root: u32) -> PathBuf {
        self.path.join("conversations").join(root.to_string())
    }

    /// An attempt's dir (see `executor`): its output files and its executor's records.
    pub fn attempt_dir(&self, task: u32, attempt: u32) -> PathBuf {
        self.path.join("attempts").join(format!("{task}.{attempt}"))
    }

    /// #33: where the check of attempt `attempt` of `task` runs: its placement's dir (the
    /// shepherd's check files lie beside its name, in `checks/`).
    pub fn check_dir(&self, task: u32, attempt: u32) -> PathBuf {
        self.path.join("checks").join(format!("{task}.{attempt}"))
    }

    /// #33: the check's kept output (`sortie logs RUN LABEL --verify`), its input files.
    pub fn check_file(&self, task: u32, attempt: u32, what: &str) -> PathBuf {
        self.path
            .join("checks")
            .join(format!("{task}.{attempt}.{what}"))
    }

    /// Where the attempt dirs are.
    pub fn attempts(&self) -> PathBuf {
        self.path.join("attempts")
    }

    /// #34: a sandboxed attempt's policy file and private temporary directory.
    pub fn sandbox_dir(&self, task: u32, attempt: u32) -> PathBuf {
        self.path.join("sandbox").join(format!("{task}.{attempt}"))
    }

    /// #34: a sandboxed attempt's record of its connections (its wrapper's outer helper writes
    /// it, a line per connection; the run folds it into `SandboxNet` at the attempt's end).
    pub fn sandbox_net(&self, task: u32, attempt: u32) -> PathBuf {
        self.sandbox_dir(task, attempt).join(SANDBOX_NET_FILE)
    }

    /// #14: a task's throwaway copy of its `cwd` (`isolation = "copy"`, see `copy`).
    pub fn copy_dir(&self, task: u32) -> PathBuf {
        self.path.join("copies").join(task.to_string())
    }

    /// Where the prompt files are (see [`RunDir::prompt_file`]).
    pub fn prompts(&self) -> PathBuf {
        self.path.join("prompts")
    }

    /// A kept worktree's patch, by its safe name.
    pub fn patch(&self, name: &str) -> PathBuf {
        self.path.join("patches").join(format!("{name}.patch"))
    }

    /// The live run's control socket (`sortie hold`, `release`, `cancel --task`, `steer`,
    /// `concurrency`), there while its owner runs.
    pub fn control_socket(&self) -> PathBuf {
        self.path.join("control.sock")
    }

    /// Where `sortie recover` moves a damaged journal's files, untouched (`stamp`: when).
    pub fn damaged(&self, stamp: u64) -> PathBuf {
        self.path.join("damaged").join(stamp.to_string())
    }

    /// What `sortie recover` found lost, as JSON.
    pub fn recovered(&self) -> PathBuf {
        self.path.join("recovered.json")
    }

    /// Takes ownership of the run, or says which pid holds it.
    pub fn acquire(&self) -> Result<OwnerLock> {
        let lock = self.lock()?;
        self.claim()?;
        Ok(lock)
    }

    /// Writes this process's pid as the owner's (after [`RunDir::lock`]).
    pub fn claim(&self) -> Result<()> {
        let pid = std::process::id().to_string();
        write_atomic(&self.owner_pid(), pid.as_bytes(), 0o600)
    }

    /// Takes the run's lock without saying so in `owner.pid` yet ([`RunDir::claim`]): a take-over
    /// that refuses the run (it has finished) leaves the previous owner's pid as it was.
    pub fn lock(&self) -> Result<OwnerLock> {
        let path = self.owner_lock();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(OwnerLock { _lock: lock }),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(Error::Live {
                run_dir: self.path.clone(),
                pid: self.read_pid(),
            }),
            Err((_, errno)) => Err(Error::Io {
                path,
                source: std::io::Error::from_raw_os_error(errno as i32),
            }),
        }
    }

    /// Whether a live process holds the run (without taking it).
    pub fn owner(&self) -> Owner {
        let Ok(file) = File::open(self.owner_lock()) else {
            return Owner::Free;
        };
        match Flock::lock(file, FlockArg::LockSharedNonblock) {
            Ok(_shared) => Owner::Free,
            Err(_) => Owner::Live {
                pid: self.read_pid(),
            },
        }
    }

    /// The owner's pid as `owner.pid` names it, when that process is alive and a sortie (the
    /// lock's holder may not have claimed the run yet: a crashed owner's pid is still there,
    /// and the kernel may have given it to another program since).
    fn read_pid(&self) -> Option<u32> {
        let pid: u32 = fs::read_to_string(self.owner_pid())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        comm.trim().starts_with("sortie").then_some(pid)
    }

    /// Keeps the tasks' environment values in `env.json` (0600), outside the journal: a plain
    /// value as written, a reference (#34) as the reference, never its value.
    pub fn save_env(&self, env: &[Vec<(String, sortie_batch::EnvValue)>]) -> Result<()> {
        let bytes = serde_json::to_vec(env).map_err(|e| Error::Io {
            path: self.env(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&self.env(), &bytes, 0o600)
    }

    /// Reads the environment values saved by [`RunDir::save_env`]; a run without any has none.
    pub fn load_env(&self, tasks: usize) -> Result<Vec<Vec<(String, sortie_batch::EnvValue)>>> {
        let path = self.env();
        let mut env: Vec<Vec<(String, sortie_batch::EnvValue)>> = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Io {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(source) => return Err(Error::Io { path, source }),
        };
        env.resize(tasks, Vec::new());
        Ok(env)
    }

    // Issue 13: structured results.
    /// The file the repair round's request of an attempt is written to (the agent reads it on
    /// stdin).
    pub fn repair_prompt_file(&self, task: u32, attempt: u32) -> PathBuf {
        self.path
            .join("prompts")
            .join(format!("{task}.{attempt}.repair"))
    }
}

/// Creates a directory and its missing parents, private to the user (0700).
pub(crate) fn private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_names_the_owner() {
        let tmp = tempfile::tempdir().unwrap();
        let run = StateDir::new(tmp.path()).run(&RunId::new("r1").unwrap());
        fs::create_dir_all(run.path()).unwrap();
        assert_eq!(run.owner(), Owner::Free);
        let lock = run.acquire().unwrap();
        assert_eq!(
            run.owner(),
            Owner::Live {
                pid: Some(std::process::id())
            }
        );
        match run.acquire() {
            Err(Error::Live { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("expected Live, got {other:?}"),
        }
        drop(lock);
        assert_eq!(run.owner(), Owner::Free);
    }

    #[test]
    fn the_tree_is_the_documented_one() {
        let s = StateDir::new("/s");
        let r = s.run(&RunId::new("r1").unwrap());
        assert_eq!(r.journal(), Path::new("/s/runs/r1/journal"));
        assert_eq!(r.stderr_log(2, 3), Path::new("/s/runs/r1/logs/2.3.stderr"));
        assert_eq!(r.agent_home(2, 3), Path::new("/s/runs/r1/agents/2.3"));
        assert_eq!(r.sessions(2, 3), Path::new("/s/runs/r1/sessions/2.3"));
        assert_eq!(r.attempt_dir(2, 3), Path::new("/s/runs/r1/attempts/2.3"));
        assert_eq!(r.patch("a"), Path::new("/s/runs/r1/patches/a.patch"));
        assert_eq!(s.index(), Path::new("/s/index"));
        assert_eq!(s.worktree("r1", "a"), Path::new("/s/worktrees/r1/a"));
    }
}

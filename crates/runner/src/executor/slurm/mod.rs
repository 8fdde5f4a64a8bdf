//! The Slurm executor: each attempt is one `sbatch` job, named from (run, task, attempt,
//! incarnation) so that any sortie process finds it again (see `jobs`, the commands as
//! data).
//!
//! - Launch: the job's script (`job.sh`: the attempt's variables, then `exec` of its argv) and
//!   `sbatch`'s arguments (`sbatch.args`) are written durably into the attempt dir, then the
//!   job is submitted, then its id is written beside them (`job`). The attempt was journaled
//!   launching before all this, so a crash before `sbatch` leaves a job that can be submitted
//!   once, under the same name, from these files ([`Executor::adopt`]).
//! - Output: the job writes its stdout and stderr into the attempt dir (a shared filesystem on a
//!   real cluster), followed from the files like a supervised attempt's, and kept under the
//!   transcript cap by that follower (#10: `follow`).
//! - Status: the run's [`Cluster`] polls every live job at once (`squeue`, then `sacct`).
//! - Stop: `scancel` (TERM, then the cluster's `KillWait`), SIGKILL through `scancel` after the
//!   task's `kill_grace`; since `scancel` exits 0 for an unknown id, the stop counts as sent only
//!   once the job's state shows it cancelled.
//! - Find: by name: pending or running → alive; ended → its exit; never submitted (a script
//!   but no job) → alive, to be submitted once by adopt; unknown and never written → gone.
//!
//! The job's environment is the submitter's (sbatch's default) plus the attempt's variables
//! from `job.sh` (0700, beside the run's `env.json`); the attempt marker is not set, since the
//! job is not a process of this machine's sortie (resume must not kill it).
//!
//! The files: this one (the executor), `cluster.rs` (the run's one status poller), `follow.rs`
//! (a job's output, followed from its files), `jobs/` (Slurm's commands and their output, as
//! data, tested from recorded output), `place.rs` (the executor of a task's spec or of a
//! journaled placement, sharing the run's cluster).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sortie_core::{SlurmOptions, StopReason};
use sortie_protocol::Exit;
use tokio::sync::{mpsc, watch};

use self::jobs::{JobId, JobState, JobStatus, Submission, job_end, sbatch_args};
use super::{
    Adoption, BoxFuture, Capabilities, Control, Execution, Executor, LaunchRequest, Placement,
    Presence, Sig, Started,
};
use crate::process::{Line, SpawnError, Stdin, WaitError};

mod cluster;
pub(in crate::executor) mod follow;
pub mod jobs;
pub(super) mod place;

use cluster::Seen;
pub use cluster::{Cluster, controller_answers};
use follow::Over as _;

/// The journaled name of the Slurm executor.
pub const SLURM: &str = "slurm";

/// Test-only hook (`tests/e2e/slurm_crash.rs`): when set, sortie SIGKILLs itself after the
/// job's files are written and before `sbatch` runs, the crash the write-ahead must survive.
pub const TEST_CRASH_BEFORE_SBATCH: &str = "SORTIE_TEST_CRASH_BEFORE_SBATCH";

/// The job's script, its `sbatch` arguments, and its id, in the attempt dir.
const SCRIPT_FILE: &str = "job.sh";
const ARGS_FILE: &str = "sbatch.args";
const JOB_FILE: &str = "job";

/// #32: the id of the Slurm job an attempt dir's `job` file names, if it names one (`recover`
/// restores the attempt from it when the journal lost its records).
pub fn read_job_id(dir: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(JOB_FILE)).ok()?;
    let id = text.trim();
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b == b'_')).then(|| id.to_owned())
}

/// How long a stop waits for Slurm to report the job over after SIGKILL.
const STOP_WAIT: Duration = Duration::from_secs(120);

/// One attempt's Slurm executor: the run's cluster, and the task's options.
#[derive(Debug, Clone)]
pub struct Slurm {
    cluster: Arc<Cluster>,
    options: SlurmOptions,
    label: String,
    time_limit: Option<Duration>,
}

impl Slurm {
    /// The executor of a task labelled `label` with `options`, whose jobs Slurm stops after
    /// `time_limit` even when no sortie is there to.
    pub fn new(
        cluster: Arc<Cluster>,
        options: SlurmOptions,
        label: &str,
        time_limit: Option<Duration>,
    ) -> Slurm {
        Slurm {
            cluster,
            options,
            label: label.to_owned(),
            time_limit,
        }
    }

    fn name(&self, p: &Placement) -> String {
        self.cluster.key(p.task, p.attempt).name()
    }

    /// Writes the job's files, then submits it (the test hook crashes in between).
    async fn submit(&self, req: &LaunchRequest) -> Result<JobId, SpawnError> {
        let p = &req.placement;
        let err = |error: io::Error| SpawnError::Io {
            program: "sbatch".into(),
            error,
        };
        std::fs::create_dir_all(&p.dir).map_err(err)?;
        let key = self.cluster.key(p.task, p.attempt);
        let (stdout, stderr) = (p.stdout(), p.stderr());
        let args = sbatch_args(&Submission {
            key: &key,
            label: &self.label,
            options: &self.options,
            time_limit: self.time_limit,
            cwd: &req.spawn.cwd,
            stdout: &stdout,
            stderr: &stderr,
            argv: &req.spawn.argv,
        });
        // `--wrap` is for one-off commands; the journaled attempt runs its script file.
        let args: Vec<String> = args
            .into_iter()
            .filter(|a| !a.starts_with("--wrap="))
            .collect();
        let script = job_script(&req.spawn.env, &req.spawn.argv);
        let io_err = |e: crate::Error| err(io::Error::other(e.to_string()));
        crate::files::write_atomic(&p.dir.join(SCRIPT_FILE), script.as_bytes(), 0o700)
            .map_err(io_err)?;
        let args_json = serde_json::to_vec(&args).map_err(|e| err(io::Error::other(e)))?;
        crate::files::write_atomic(&p.dir.join(ARGS_FILE), &args_json, 0o600).map_err(io_err)?;
        if std::env::var_os(TEST_CRASH_BEFORE_SBATCH).is_some() {
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::SIGKILL);
        }
        self.submit_files(&p.dir).await
    }

    /// Submits the job written in `dir`, and records its id there.
    async fn submit_files(&self, dir: &Path) -> Result<JobId, SpawnError> {
        let err = |error: io::Error| SpawnError::Io {
            program: "sbatch".into(),
            error,
        };
        let args = std::fs::read(dir.join(ARGS_FILE)).map_err(err)?;
        let args: Vec<String> =
            serde_json::from_slice(&args).map_err(|e| err(io::Error::other(e)))?;
        let id = self
            .cluster
            .sbatch(&args, &dir.join(SCRIPT_FILE))
            .await
            .map_err(|e| err(io::Error::other(e)))?;
        // Best effort: the name finds the job again without it.
        if let Err(e) =
            crate::files::write_atomic(&dir.join(JOB_FILE), id.to_string().as_bytes(), 0o600)
        {
            tracing::warn!("cannot record Slurm job {id}: {e}");
        }
        Ok(id)
    }

    /// Follows job `id` of the attempt at `p`.
    fn follow(&self, p: &Placement, id: JobId) -> Box<dyn Execution> {
        let name = self.name(p);
        let status = self.cluster.track(name, id);
        let (lines, [bytes, cut_to]) = follow::follow(p.stdout(), status.clone());
        let control = Arc::new(JobControl {
            cluster: Arc::clone(&self.cluster),
            job: id,
            status: status.clone(),
            reason: Arc::new(Mutex::new(None)),
            sent: Arc::new(Mutex::new(None)),
        });
        Box::new(JobExecution {
            job: id,
            status,
            lines,
            bytes,
            cut_to,
            stderr: p.stderr(),
            control,
        })
    }

    /// What Slurm knows of the attempts at `placements`, with one query.
    async fn presences(&self, placements: &[&Placement]) -> Vec<Presence> {
        let names: Vec<String> = placements.iter().map(|p| self.name(p)).collect();
        let since = "now-30days";
        let found = match self.cluster.query_names(&names, since).await {
            Ok(found) => found,
            Err(e) => {
                // Not knowing is not "gone": an orphan would be retried while its job runs.
                tracing::warn!("cannot ask Slurm about the run's jobs: {e}");
                return placements.iter().map(|_| Presence::Alive).collect();
            }
        };
        placements
            .iter()
            .zip(&names)
            .map(|(p, name)| match found.get(name) {
                Some(s) => presence_of(s),
                None if p.dir.join(SCRIPT_FILE).exists() && !p.dir.join(JOB_FILE).exists() => {
                    // Written, never submitted: adopt submits it, once, under this name.
                    Presence::Alive
                }
                None => Presence::Gone,
            })
            .collect()
    }
}

/// A job's status as a presence: a job that ended while sortie was down is recorded, whatever
/// ended it (its follower reads Slurm's end, a time limit or a lost node, as the outcome).
fn presence_of(s: &JobStatus) -> Presence {
    match job_end(s) {
        None => Presence::Alive,
        Some(end) => Presence::Ended(end.exit(s)),
    }
}

/// The job's script: the attempt's variables, then `exec` of its argv.
fn job_script(env: &[(String, String)], argv: &[String]) -> String {
    let quote = |w: &str| format!("'{}'", w.replace('\'', r"'\''"));
    let mut s = String::from("#!/bin/sh\n# An attempt of a sortie run (see its job name).\n");
    for (k, v) in env {
        if is_shell_name(k) {
            s.push_str(&format!("export {k}={}\n", quote(v)));
        }
    }
    let words: Vec<String> = argv.iter().map(|w| quote(w)).collect();
    s.push_str(&format!("exec {}\n", words.join(" ")));
    s
}

/// Whether `k` can be a shell variable's name (others cannot be exported by `sh`).
fn is_shell_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Executor for Slurm {
    fn kind(&self) -> &'static str {
        SLURM
    }

    // A batch job: queued, polled with the run's other jobs, run on another node.
    fn can(&self) -> Capabilities {
        Capabilities {
            outlives_sortie: true,
            follows_files: true,
            clocks_from_real_start: true,
            polls_in_batch: true,
            repairs_locally: false,
        }
    }

    fn launch(&self, req: LaunchRequest) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>> {
        Box::pin(async move {
            if req.piped_stdin {
                return Err(SpawnError::Io {
                    program: "sbatch".into(),
                    error: io::Error::other(
                        "the Slurm executor cannot drive an agent over stdin (a batch job's \
                         stdin is /dev/null); use a profile that takes its prompt as an argument",
                    ),
                });
            }
            let id = self.submit(&req).await?;
            self.cluster.nudge();
            Ok(self.follow(&req.placement, id))
        })
    }

    fn find<'a>(&'a self, adoption: &'a Adoption) -> BoxFuture<'a, Presence> {
        Box::pin(async move {
            let mut p = self.presences(&[&adoption.placement]).await;
            p.pop().unwrap_or(Presence::Gone)
        })
    }

    fn poll<'a>(&'a self, adoptions: &'a [Adoption]) -> BoxFuture<'a, Vec<Presence>> {
        Box::pin(async move {
            let placements: Vec<&Placement> = adoptions.iter().map(|a| &a.placement).collect();
            self.presences(&placements).await
        })
    }

    fn adopt(&self, adoption: Adoption) -> BoxFuture<'_, Result<Box<dyn Execution>, SpawnError>> {
        Box::pin(async move {
            let p = &adoption.placement;
            let name = self.name(p);
            let found = self
                .cluster
                .query_names(std::slice::from_ref(&name), "now-30days")
                .await
                .map_err(|e| SpawnError::Io {
                    program: "squeue".into(),
                    error: io::Error::other(e),
                })?;
            let id = match found.get(&name) {
                Some(s) => s.id,
                None if p.dir.join(SCRIPT_FILE).exists() && !p.dir.join(JOB_FILE).exists() => {
                    self.submit_files(&p.dir).await?
                }
                None => {
                    return Err(SpawnError::Io {
                        program: "sbatch".into(),
                        error: io::Error::other(format!("Slurm knows no job named {name}")),
                    });
                }
            };
            Ok(self.follow(p, id))
        })
    }

    fn signal<'a>(&'a self, adoption: &'a Adoption, sig: Sig) -> BoxFuture<'a, io::Result<bool>> {
        Box::pin(async move {
            let name = self.name(&adoption.placement);
            let found = self
                .cluster
                .query_names(std::slice::from_ref(&name), "now-30days")
                .await
                .map_err(io::Error::other)?;
            match found.get(&name) {
                Some(s) if !s.state.is_final() => {
                    let signal = signal_name(sig);
                    self.cluster
                        .scancel(s.id, Some(signal))
                        .await
                        .map_err(io::Error::other)?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
    }
}

/// `scancel --signal`'s name for a signal.
fn signal_name(sig: Sig) -> &'static str {
    match sig {
        Sig::Term => "TERM",
        Sig::Kill => "KILL",
        Sig::Stop => "STOP",
        Sig::Cont => "CONT",
    }
}

/// A submitted job, followed.
struct JobExecution {
    job: JobId,
    status: watch::Receiver<Seen>,
    lines: mpsc::Receiver<Line>,
    bytes: Arc<AtomicU64>,
    /// The end of the last cut of its stdout the follower jumped (0: none).
    cut_to: Arc<AtomicU64>,
    stderr: PathBuf,
    control: Arc<JobControl>,
}

impl Execution for JobExecution {
    fn started(&mut self) -> BoxFuture<'_, Result<Started, SpawnError>> {
        Box::pin(async move {
            // A remote job has no process on this machine: pid 0 says so (nothing to signal
            // or to find by pid after a crash; the job's name finds it).
            let _ = self
                .status
                .wait_for(|s| match s {
                    Seen::Nothing => false,
                    Seen::Unknown => true,
                    Seen::Status(s) => s.state != JobState::Pending,
                })
                .await;
            Ok(Started {
                pid: 0,
                start_time: 0,
            })
        })
    }

    fn handle(&self) -> Option<String> {
        Some(self.job.to_string())
    }

    fn next_line(&mut self) -> BoxFuture<'_, Option<Line>> {
        Box::pin(self.lines.recv())
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Exit, WaitError>> {
        Box::pin(async move {
            let job = self.job;
            let lost = |message: String| WaitError {
                pid: 0,
                message,
                orphan: None,
            };
            let seen = match self.status.wait_for(Seen::is_over).await {
                Ok(s) => s.clone(),
                Err(_) => return Err(lost(format!("stopped following Slurm job {job}"))),
            };
            match seen {
                // Slurm's own ends (a time limit, a lost node) are `executor_end`'s.
                Seen::Status(s) => match job_end(&s) {
                    Some(end) => Ok(end.exit(&s)),
                    None => Err(lost(format!("Slurm job {job} has no end"))),
                },
                _ => Err(lost(format!(
                    "Slurm knows no job {job} any more (neither squeue nor sacct)"
                ))),
            }
        })
    }

    fn stderr_tail(&self) -> String {
        follow::tail(&self.stderr)
    }

    fn stdout_offset(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn cut_before(&self) -> bool {
        let to = self.cut_to.load(Ordering::Relaxed);
        to > 0 && to <= self.bytes.load(Ordering::Relaxed)
    }

    fn control(&self) -> Arc<dyn Control> {
        Arc::clone(&self.control) as Arc<dyn Control>
    }

    fn take_stdin(&mut self) -> Option<Stdin> {
        None
    }

    fn ran_before(&self) -> Option<Duration> {
        match &*self.status.borrow() {
            Seen::Status(s) => s.ran,
            _ => None,
        }
    }

    fn executor_end(&self) -> Option<sortie_core::AttemptOutcome> {
        match &*self.status.borrow() {
            Seen::Status(s) => job_end(s)?.outcome(self.job),
            _ => None,
        }
    }
}

/// Stops and signals a job through `scancel`, checking its state after.
#[derive(Debug, Clone)]
struct JobControl {
    cluster: Arc<Cluster>,
    job: JobId,
    status: watch::Receiver<Seen>,
    /// The first stop reason asked for.
    reason: Arc<Mutex<Option<StopReason>>>,
    /// The reason, once the job's state showed the stop reached it.
    sent: Arc<Mutex<Option<StopReason>>>,
}

impl JobControl {
    fn is_over(&self) -> bool {
        self.status.borrow().is_over()
    }

    fn cancelled(&self) -> bool {
        matches!(&*self.status.borrow(), Seen::Status(s) if s.state == JobState::Cancelled)
    }
}

impl Control for JobControl {
    fn signal(&self, sig: Sig) -> io::Result<bool> {
        if self.is_over() {
            return Ok(false);
        }
        let (cluster, job) = (Arc::clone(&self.cluster), self.job);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return Ok(false);
        };
        rt.spawn(async move {
            if let Err(e) = cluster.scancel(job, Some(signal_name(sig))).await {
                tracing::warn!("cannot signal Slurm job {job}: {e}");
            }
        });
        Ok(true)
    }

    fn stop(&self, reason: StopReason, grace: Duration) -> BoxFuture<'static, StopReason> {
        let reason = *lock(&self.reason).get_or_insert(reason);
        let me = self.clone();
        Box::pin(async move {
            if me.is_over() {
                return reason;
            }
            if let Err(e) = me.cluster.scancel(me.job, None).await {
                tracing::warn!("cannot cancel Slurm job {}: {e}", me.job);
            }
            me.cluster.nudge();
            let mut status = me.status.clone();
            let timed_out = tokio::time::timeout(grace, status.wait_for(Seen::is_over))
                .await
                .is_err();
            if timed_out {
                let _ = me.cluster.scancel(me.job, Some("KILL")).await;
                me.cluster.nudge();
                let waited = tokio::time::timeout(STOP_WAIT, status.wait_for(Seen::is_over)).await;
                drop(waited);
            }
            // scancel exits 0 for a job it does not know: only the job's state says it worked.
            if me.cancelled() {
                *lock(&me.sent) = Some(reason);
            }
            reason
        })
    }

    fn sent_reason(&self) -> Option<StopReason> {
        *lock(&self.sent)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

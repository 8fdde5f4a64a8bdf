//! #33: a task's check (`verify`), run once its attempt ended completed and `VerifyStarted` is
//! durable: in the task's working directory (its worktree or copy), with the task's
//! environment, through the executor its attempts use (locally under the run's shepherd, so
//! that a crash of sortie does not lose it; on Slurm a job of its own). Its stdout and stderr
//! are kept (`checks/<task>.<attempt>.log`, `sortie logs --verify`); core's `verify::verdict`
//! reads its exit, its output and its result file, and the loop journals the verdict
//! (`VerifyEnded`).
//!
//! Resume finds a check that was running when sortie died by its placement (its dir under
//! `checks/` and its executor follow from the spec, so nothing else is journaled): alive, it
//! is adopted and followed; ended, its end is read from its files; gone, it runs again. Its
//! verdict is journaled once either way. A check on Slurm that a crash cut short runs again
//! (its job is named as its attempt's, which the scheduler's lookup would confuse).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sortie_core::verify::{self, CheckRun, Verdict};
use sortie_core::{Attempt, Isolation, StopReason, TaskId};
use tokio::sync::{mpsc, oneshot};

use super::Engine;
use crate::attempt::Msg;
use crate::executor::{Adoption, Execution, Executor, LaunchRequest, Placement, Presence};
use crate::process::SpawnSpec;
use crate::{executor, process, worktree};

/// The most of a check's output kept: its end (the log and what the verdict reads).
const KEPT: usize = 1 << 20;
/// The most of a result file read.
const RESULT_MAX: u64 = 64 * 1024;

/// The run loop's handle on a running check.
pub(super) struct CheckHandle {
    stop: Option<oneshot::Sender<StopReason>>,
    join: tokio::task::JoinHandle<()>,
}

impl CheckHandle {
    /// Asks the check to stop: `Interrupted` leaves it without a verdict (resume runs it
    /// again); any other reason ends it with a failed one.
    pub(super) fn stop(&mut self, reason: StopReason) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(reason);
        }
    }

    /// Drops it at once (a second Ctrl-C).
    pub(super) fn abort(&self) {
        self.join.abort();
    }
}

/// Everything a check's run needs, decided by the loop.
struct CheckJob {
    task: TaskId,
    attempt: Attempt,
    spawn: SpawnSpec,
    executor: Arc<dyn Executor>,
    placement: Placement,
    /// Resume found it alive or ended: followed, not launched.
    adopt: Option<Adoption>,
    timeout: Duration,
    grace: Duration,
    /// `checks/<task>.<attempt>.log`, `.result`, `.output`.
    log: PathBuf,
    result: PathBuf,
    output_file: PathBuf,
    /// The agent's answer, written to `output_file` before the check starts.
    output: String,
    /// #34: the task's secrets, taken out of the check's log and its verdict's error.
    redactor: sortie_batch::Redactor,
}

impl Engine {
    /// Starts the check of `task`'s last attempt, journaled as started.
    pub(super) fn start_check(&mut self, task: TaskId) {
        self.spawn_check(task, None);
    }

    fn spawn_check(&mut self, task: TaskId, adopt: Option<Adoption>) {
        let Some(mut job) = self.check_job(task) else {
            return;
        };
        job.adopt = adopt;
        let (stop_tx, stop_rx) = oneshot::channel();
        let tx = self.tx.clone();
        let join = tokio::spawn(run(job, stop_rx, tx));
        let handle = CheckHandle {
            stop: Some(stop_tx),
            join,
        };
        if let Some(mut old) = self.checks.insert(task, handle) {
            old.stop(StopReason::Interrupted);
        }
    }

    /// #33, resume: the checks that were running when the run died: each is found again
    /// (adopted, or its end read from its files) or, gone, run again. Before the marker scan:
    /// `spare` gets the ones that run on.
    pub(super) async fn find_checks(
        &self,
        tasks: &[TaskId],
        spare: &mut std::collections::HashSet<(TaskId, Attempt)>,
    ) -> Vec<(TaskId, Option<Adoption>)> {
        let mut out = Vec::with_capacity(tasks.len());
        for &task in tasks {
            let Some(job) = self.check_job(task) else {
                continue;
            };
            let adoption = Adoption {
                placement: job.placement.clone(),
                started: None,
            };
            // A batch scheduler's check job shares its attempt's job name (the scheduler
            // finds jobs by it): it is run again rather than mistaken for the attempt's.
            let can = job.executor.can();
            let found = if can.outlives_sortie && !can.polls_in_batch {
                job.executor.find(&adoption).await
            } else {
                Presence::Gone
            };
            if found == Presence::Gone {
                out.push((task, None));
            } else {
                spare.insert((task, job.attempt));
                out.push((task, Some(adoption)));
            }
        }
        out
    }

    /// Starts the checks resume found (see `find_checks`).
    pub(super) fn follow_checks(&mut self, found: Vec<(TaskId, Option<Adoption>)>) {
        for (task, adopt) in found {
            self.spawn_check(task, adopt);
        }
    }

    /// The check of `task`'s last attempt: its command, where and how it runs.
    fn check_job(&self, task: TaskId) -> Option<CheckJob> {
        let spec = self.state.spec(task)?;
        let rec = self.state.task(task)?;
        let last = rec.attempts.last()?;
        let argv = spec.verify.clone()?;
        let cwd = match (&spec.isolation, &rec.steps().worktree) {
            (Isolation::Worktree, Some(plan)) => worktree::agent_cwd(plan, &spec.cwd),
            (Isolation::Copy, _) => self.run_dir.copy_dir(task.0),
            _ => PathBuf::from(&spec.cwd),
        };
        let (t, a) = (task.0, last.attempt.0);
        let result = self.run_dir.check_file(t, a, "result");
        let output_file = self.run_dir.check_file(t, a, "output");
        // #34: the task's references, read again (one that cannot be read is left out: its
        // attempt failed to launch for it).
        let refs = self
            .env
            .get(&task.index())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut redactor = sortie_batch::Redactor::default();
        let mut env: Vec<(String, String)> = Vec::new();
        for (name, value) in refs {
            if let Ok(v) = value.resolve(name) {
                if value.is_reference() {
                    redactor.add(name, &v);
                }
                env.push((name.clone(), v));
            }
        }
        env.extend([
            ("SORTIE_RUN".to_owned(), self.run_id.to_string()),
            ("SORTIE_TASK".to_owned(), spec.label.clone()),
            (
                "SORTIE_OUTPUT".to_owned(),
                output_file.display().to_string(),
            ),
            (verify::RESULT_VAR.to_owned(), result.display().to_string()),
        ]);
        // The attempt's marker (`SORTIE_ATTEMPT`, its number the third part), told apart from
        // the attempt's own processes by a last part.
        let (name, value) = process::marker(&self.run_id, task, last.attempt, self.incarnation());
        let marker = (name, format!("{value}/check"));
        let supervise = spec.supervise && self.run_dir.path().to_str().is_some();
        let choice = executor::Choice {
            shared: &self.executors,
            run: &self.run_id,
            incarnation: self.incarnation(),
            deadline_at: None,
            supervise,
        };
        let executor = executor::for_spec(spec, &choice);
        let placement = executor.place(self.run_dir.check_dir(t, a), task, last.attempt);
        Some(CheckJob {
            task,
            attempt: last.attempt,
            spawn: SpawnSpec {
                argv,
                cwd,
                env,
                marker,
            },
            executor,
            placement,
            adopt: None,
            timeout: spec.verify_timeout,
            grace: spec.kill_grace,
            log: self.run_dir.check_file(t, a, "log"),
            result,
            output_file,
            output: last.output().unwrap_or_default().to_owned(),
            redactor,
        })
    }
}

/// Runs (or follows) a check and reports its verdict; nothing when it was interrupted.
async fn run(job: CheckJob, stop: oneshot::Receiver<StopReason>, tx: mpsc::UnboundedSender<Msg>) {
    let (task, attempt) = (job.task, job.attempt);
    let (redactor, log) = (job.redactor.clone(), job.log.clone());
    let mut verdict = check(job, stop).await;
    if !redactor.is_empty() {
        crate::transcript::mask_files([log.as_path()], &redactor);
        if let Some(e) = verdict.as_mut().and_then(|v| v.error.as_mut()) {
            *e = redactor.redact(e).into_owned();
        }
    }
    let _ = tx.send(Msg::Verified {
        task,
        attempt,
        verdict,
    });
}

/// The check's verdict; None when it was stopped by an interrupt of sortie.
async fn check(job: CheckJob, mut stop: oneshot::Receiver<StopReason>) -> Option<Verdict> {
    let fresh = job.adopt.is_none();
    if let Some(dir) = job.log.parent()
        && let Err(e) = crate::layout::private_dir(dir)
    {
        return Some(failed_to_start(&e.to_string()));
    }
    if fresh {
        // What an earlier run of the check left is not this run's.
        for stale in [&job.result, &job.log] {
            let _ = std::fs::remove_file(stale);
        }
        let files = job.placement.files();
        for stale in [files.stdout, files.stderr, job.placement.exit_file()] {
            let _ = std::fs::remove_file(stale);
        }
    }
    if let Err(e) = crate::files::write_atomic(&job.output_file, job.output.as_bytes(), 0o600) {
        return Some(failed_to_start(&e.to_string()));
    }
    let launched = match job.adopt.clone() {
        Some(adoption) => job.executor.adopt(adoption).await,
        None => {
            job.executor
                .launch(LaunchRequest {
                    placement: job.placement.clone(),
                    spawn: job.spawn.clone(),
                    piped_stdin: false,
                    stdin_file: None,
                })
                .await
        }
    };
    let mut exec = match launched {
        Ok(exec) => exec,
        Err(e) => return Some(failed_to_start(&e.to_string())),
    };
    if let Err(e) = exec.started().await {
        return Some(failed_to_start(&e.to_string()));
    }
    let mut out = Tail::default();
    let mut timed_out = None;
    let mut stopped = None;
    let ended = tokio::select! {
        ended = tokio::time::timeout(job.timeout, drain(&mut *exec, &mut out)) => ended.ok(),
        reason = &mut stop => {
            stopped = Some(reason.unwrap_or(StopReason::Interrupted));
            None
        }
    };
    let exit = match ended {
        Some(exit) => exit,
        None => {
            if stopped.is_none() {
                timed_out = Some(job.timeout);
            }
            let why = stopped.unwrap_or(StopReason::Timeout);
            exec.control().stop(why, job.grace).await;
            exec.wait().await.ok()
        }
    };
    if stopped == Some(StopReason::Interrupted) {
        return None;
    }
    let stderr = exec.stderr_tail();
    let mut output = out.text;
    if !stderr.trim().is_empty() {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&stderr);
    }
    let _ = crate::files::write_atomic(&job.log, output.as_bytes(), 0o600);
    let result_file = read_capped(&job.result);
    let mut verdict = verify::verdict(&CheckRun {
        exit: exit.and_then(|e| e.code()),
        timed_out,
        spawn_error: None,
        signal: exit.and_then(|e| match e {
            sortie_protocol::Exit::Signal(s) => Some(s),
            sortie_protocol::Exit::Code(_) => None,
        }),
        output: &output,
        result_file: result_file.as_deref(),
    });
    if let Some(reason) = stopped {
        verdict.passed = false;
        verdict.score = 0;
        verdict.error = Some(format!("the check was stopped: the task was {reason}"));
    }
    Some(verdict)
}

/// Reads the check's stdout to its end, then waits for its exit.
async fn drain(exec: &mut dyn Execution, out: &mut Tail) -> Option<sortie_protocol::Exit> {
    while let Some(line) = exec.next_line().await {
        out.push(&line.text);
    }
    exec.wait().await.ok()
}

/// The verdict of a check that could not start.
fn failed_to_start(why: &str) -> Verdict {
    verify::verdict(&CheckRun {
        spawn_error: Some(why),
        ..CheckRun::default()
    })
}

/// A file's text, at most [`RESULT_MAX`] bytes of it; None when it is not there.
fn read_capped(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.take(RESULT_MAX).read_to_end(&mut bytes).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The end of a check's output, at most [`KEPT`] bytes.
#[derive(Default)]
struct Tail {
    text: String,
}

impl Tail {
    fn push(&mut self, line: &str) {
        self.text.push_str(line);
        self.text.push('\n');
        if self.text.len() > 2 * KEPT {
            let mut cut = self.text.len() - KEPT;
            while !self.text.is_char_boundary(cut) {
                cut += 1;
            }
            self.text.drain(..cut);
        }
    }
}

//! The Ray executor (#36): each attempt is one job through a Ray head node's HTTP job API
//! (no Python in sortie), its submission id derived from (run, task, attempt, incarnation), so
//! that any sortie process finds it again, and a second submission of it is refused by Ray.
//!
//! - Launch: the job's script (`job.sh`: the attempt's variables, `cd` to its working
//!   directory, then `exec` of its argv with stdout and stderr into the attempt dir) is written
//!   durably into the attempt dir, then the job is submitted with the entrypoint
//!   `sh <dir>/job.sh`, then `submitted` is written beside it. The attempt was journaled placed
//!   before all this (the placement is the id). A refused duplicate is an adoption, not an
//!   error. The attempt dir and the working directory must be on a filesystem the cluster's
//!   workers share (nothing is uploaded).
//! - Output: followed from the attempt dir's files, as a Slurm job's (`slurm::follow`).
//! - Status: the run's [`Cluster`] lists every job once per poll (`GET /api/jobs/`).
//! - Ends: `SUCCEEDED` and `FAILED` with the driver's exit code are the attempt's exit;
//!   `FAILED` without one (its entrypoint never ran) is a launch failure; `STOPPED` from
//!   outside is an unexpected signal (retried); a head that stops answering is a transient
//!   error naming it.
//! - Stop: `POST /api/jobs/{id}/stop` (Ray sends TERM, then KILL); the stop counts as sent
//!   once the job's state shows `STOPPED`.
//! - Find: by id: pending or running → alive; ended → its exit; written but never submitted
//!   → alive, submitted once by adopt; unknown and never written → gone.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sortie_core::{AttemptOutcome, RayOptions, StopReason, TaskSpec};
use sortie_protocol::Exit;
use tokio::sync::{mpsc, watch};

use self::api::{JobState, Submitted};
use self::cluster::{Cluster, Seen};
use super::slurm::follow::{self, Over as _};
use super::{
    Adoption, BoxFuture, Capabilities, Choice, Control, Execution, Executor, LaunchRequest,
    Placement, Presence, Sig, Started,
};
use crate::process::{Line, SpawnError, Stdin, WaitError};

mod api;
mod cluster;

/// The journaled name of the Ray executor.
pub const RAY: &str = "ray";

/// Test-only hook (`tests/e2e/ray.rs`): when set, sortie SIGKILLs itself after the job's
/// script is written and before it is submitted, the crash the write-ahead must survive.
pub const TEST_CRASH_BEFORE_SUBMIT: &str = "SORTIE_TEST_CRASH_BEFORE_RAY_SUBMIT";

const SCRIPT_FILE: &str = "job.sh";
const SUBMITTED_FILE: &str = "submitted";
/// How long a stop waits for Ray to report the job over.
const STOP_WAIT: Duration = Duration::from_secs(60);

/// The address of the head of `options`: its own, else `RAY_ADDRESS` when it is an HTTP
/// address, else the local default.
pub fn address(options: &RayOptions) -> String {
    if let Some(a) = &options.address {
        return a.clone();
    }
    match std::env::var("RAY_ADDRESS") {
        Ok(a) if a.starts_with("http://") => a.trim_end_matches('/').to_owned(),
        _ => RayOptions::DEFAULT_ADDRESS.to_owned(),
    }
}

/// #37: whether the heads of `addresses` answer (`GET /api/version`): Ok with what each said
/// of itself (its version, nodes and resources), or the first that does not, named.
pub async fn heads_answer(addresses: &[String]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for a in addresses {
        let api = api::Api::new(a);
        let v = api.version().await?;
        // A head that answers its version but not its status (an older Ray) is still reached.
        let r = api
            .resources()
            .await
            .unwrap_or_else(|e| format!("resources unknown: {e}"));
        out.push(format!("Ray {v} at {a}: {r}"));
    }
    Ok(out)
}

/// The run's head nodes, by address.
pub(super) type Heads = Mutex<HashMap<String, Arc<Cluster>>>;

/// One attempt's Ray executor.
#[derive(Debug, Clone)]
pub struct Ray {
    cluster: Arc<Cluster>,
    options: RayOptions,
}

/// The executor of a task with `spec` (its options, or the defaults for a placement whose
/// task is no longer on Ray), sharing the run's head node at its address.
pub(super) fn for_spec(spec: &TaskSpec, choice: &Choice<'_>) -> Arc<dyn Executor> {
    let options = match &spec.executor {
        sortie_core::Executor::Ray(o) => o.clone(),
        _ => RayOptions::default(),
    };
    let address = address(&options);
    let mut heads = choice
        .shared
        .ray
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let cluster = heads
        .entry(address.clone())
        .or_insert_with(|| Cluster::new(&address, choice.run.clone(), choice.incarnation));
    Arc::new(Ray {
        cluster: Arc::clone(cluster),
        options,
    })
}

fn io_err(e: impl ToString) -> SpawnError {
    SpawnError::Io {
        program: "ray job".into(),
        error: io::Error::other(e.to_string()),
    }
}

impl Ray {
    fn id(&self, p: &Placement) -> String {
        self.cluster.id(p.task, p.attempt)
    }

    /// Writes the job's script, then submits it (the test hook crashes in between).
    async fn submit(&self, req: &LaunchRequest) -> Result<String, SpawnError> {
        let p = &req.placement;
        std::fs::create_dir_all(&p.dir).map_err(io_err)?;
        let stdin = if req.piped_stdin {
            None
        } else {
            req.stdin_file.as_deref()
        };
        let script = job_script(req, stdin);
        crate::files::write_atomic(&p.dir.join(SCRIPT_FILE), script.as_bytes(), 0o700)
            .map_err(io_err)?;
        if std::env::var_os(TEST_CRASH_BEFORE_SUBMIT).is_some() {
            let _ = nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::SIGKILL);
        }
        self.submit_files(p).await
    }

    /// Submits the job written in the attempt dir (once: Ray refuses its id again).
    async fn submit_files(&self, p: &Placement) -> Result<String, SpawnError> {
        let id = self.id(p);
        let script = p.dir.join(SCRIPT_FILE);
        let entrypoint = format!("exec /bin/sh {}", quote(&script.to_string_lossy()));
        let body = api::submit_body(&id, &entrypoint, &self.options);
        match self.cluster.api.submit(body).await.map_err(io_err)? {
            Submitted::New => {}
            Submitted::Exists => tracing::info!("Ray job {id} was already submitted: adopted"),
        }
        if let Err(e) =
            crate::files::write_atomic(&p.dir.join(SUBMITTED_FILE), id.as_bytes(), 0o600)
        {
            tracing::warn!("cannot record Ray job {id}: {e}");
        }
        Ok(id)
    }

    fn follow(&self, p: &Placement, id: String) -> Box<dyn Execution> {
        let status = self.cluster.track(&id);
        let (lines, [bytes, cut_to]) = follow::follow(p.stdout(), status.clone());
        let control = Arc::new(JobControl {
            cluster: Arc::clone(&self.cluster),
            id: id.clone(),
            status: status.clone(),
            reason: Arc::new(Mutex::new(None)),
            sent: Arc::new(Mutex::new(None)),
        });
        Box::new(JobExecution {
            id,
            address: self.cluster.api.address.clone(),
            status,
            lines,
            bytes,
            cut_to,
            stderr: p.stderr(),
            control,
        })
    }

    /// Where the attempts at `placements` stand, with one job list.
    async fn presences(&self, placements: &[&Placement]) -> Vec<Presence> {
        let found = match self.cluster.list().await {
            Ok(found) => found,
            Err(e) => {
                // Not knowing is not "gone": an orphan would be retried while its job runs.
                tracing::warn!("cannot ask Ray about the run's jobs: {e}");
                return placements.iter().map(|_| Presence::Alive).collect();
            }
        };
        placements
            .iter()
            .map(|p| match found.get(&self.id(p)) {
                Some(j) if j.state.is_final() => Presence::Ended(j.exit()),
                Some(_) => Presence::Alive,
                None if written_not_submitted(&p.dir) => Presence::Alive,
                None => Presence::Gone,
            })
            .collect()
    }
}

/// A job written and perhaps never submitted (a crash in between): adopt submits it once.
fn written_not_submitted(dir: &Path) -> bool {
    dir.join(SCRIPT_FILE).exists() && !dir.join(SUBMITTED_FILE).exists()
}

fn quote(w: &str) -> String {
    format!("'{}'", w.replace('\'', r"'\''"))
}

/// The job's script: the attempt's variables, its working directory, then `exec` of its argv
/// with its stdin, stdout and stderr files.
fn job_script(req: &LaunchRequest, stdin: Option<&Path>) -> String {
    let p = &req.placement;
    let mut s = String::from("#!/bin/sh\n# An attempt of a sortie run (see its submission id).\n");
    for (k, v) in &req.spawn.env {
        if is_shell_name(k) {
            s.push_str(&format!("export {k}={}\n", quote(v)));
        }
    }
    s.push_str(&format!(
        "cd {} || exit 127\n",
        quote(&req.spawn.cwd.to_string_lossy())
    ));
    let words: Vec<String> = req.spawn.argv.iter().map(|w| quote(w)).collect();
    let input = stdin.map_or_else(
        || "/dev/null".to_owned(),
        |f| f.to_string_lossy().into_owned(),
    );
    s.push_str(&format!(
        "exec {} <{} >{} 2>{}\n",
        words.join(" "),
        quote(&input),
        quote(&p.stdout().to_string_lossy()),
        quote(&p.stderr().to_string_lossy()),
    ));
    s
}

fn is_shell_name(k: &str) -> bool {
    let mut chars = k.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Executor for Ray {
    fn kind(&self) -> &'static str {
        RAY
    }

    // A job on a cluster: queued, polled with the run's other jobs, run on another node.
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
                return Err(io_err(
                    "the Ray executor cannot drive an agent over stdin (a job's stdin is a \
                     file); use a profile that takes its prompt as an argument",
                ));
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
            let id = self.id(p);
            let known = self.cluster.api.job(&id).await.map_err(io_err)?;
            let id = match known {
                Some(_) => id,
                None if p.dir.join(SCRIPT_FILE).exists() => self.submit_files(p).await?,
                None => return Err(io_err(format!("Ray knows no job {id}"))),
            };
            Ok(self.follow(p, id))
        })
    }

    fn signal<'a>(&'a self, adoption: &'a Adoption, sig: Sig) -> BoxFuture<'a, io::Result<bool>> {
        Box::pin(async move {
            if !matches!(sig, Sig::Term | Sig::Kill) {
                return Ok(false);
            }
            let id = self.id(&adoption.placement);
            match self.cluster.api.job(&id).await.map_err(io::Error::other)? {
                Some(j) if !j.state.is_final() => {
                    self.cluster.api.stop(&id).await.map_err(io::Error::other)?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
    }
}

/// A submitted job, followed.
struct JobExecution {
    id: String,
    address: String,
    status: watch::Receiver<Seen>,
    lines: mpsc::Receiver<Line>,
    bytes: Arc<AtomicU64>,
    cut_to: Arc<AtomicU64>,
    stderr: std::path::PathBuf,
    control: Arc<JobControl>,
}

impl Execution for JobExecution {
    fn started(&mut self) -> BoxFuture<'_, Result<Started, SpawnError>> {
        Box::pin(async move {
            // No process on this machine: pid 0 (the submission id finds it again).
            let _ = self
                .status
                .wait_for(|s| match s {
                    Seen::Nothing => false,
                    Seen::Job(j) => j.state != JobState::Pending,
                    Seen::Unknown | Seen::Lost(_) => true,
                })
                .await;
            Ok(Started {
                pid: 0,
                start_time: 0,
            })
        })
    }

    fn handle(&self) -> Option<String> {
        Some(self.id.clone())
    }

    fn next_line(&mut self) -> BoxFuture<'_, Option<Line>> {
        Box::pin(self.lines.recv())
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Exit, WaitError>> {
        Box::pin(async move {
            let lost = |message: String| WaitError {
                pid: 0,
                message,
                orphan: None,
            };
            let seen = match self.status.wait_for(Seen::is_over).await {
                Ok(s) => s.clone(),
                Err(_) => return Err(lost(format!("stopped following Ray job {}", self.id))),
            };
            match seen {
                Seen::Job(j) => Ok(j.exit()),
                // The outcome (`executor_end`) names the head.
                Seen::Lost(_) => Ok(Exit::Signal(libc::SIGKILL)),
                _ => Err(lost(format!(
                    "the Ray head at {} knows no job {} any more",
                    self.address, self.id
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
            Seen::Job(j) if j.start_ms > 0 => {
                let now = crate::clock::now().0;
                Some(Duration::from_millis(now.saturating_sub(j.start_ms)))
            }
            _ => None,
        }
    }

    fn executor_end(&self) -> Option<AttemptOutcome> {
        match &*self.status.borrow() {
            Seen::Job(j) => end_outcome(j, &self.id),
            Seen::Lost(why) => Some(AttemptOutcome::failed(StopReason::Error, why.clone())),
            _ => None,
        }
    }
}

/// The outcome of an end Ray caused: a stop from outside sortie, or an entrypoint that never
/// ran (Ray gives no exit code then).
fn end_outcome(j: &api::JobInfo, id: &str) -> Option<AttemptOutcome> {
    match (j.state, j.exit_code) {
        (JobState::Stopped, _) => Some(AttemptOutcome {
            signal: Some(libc::SIGTERM),
            ..AttemptOutcome::failed(
                StopReason::UnexpectedSignal,
                format!("Ray job {id} was stopped outside sortie (STOPPED)"),
            )
        }),
        (JobState::Failed, None) => Some(AttemptOutcome::failed(
            StopReason::SpawnError,
            format!(
                "Ray job {id} failed before its entrypoint ran: {}",
                j.message
            ),
        )),
        _ => None,
    }
}

/// Stops a job through Ray's stop endpoint, checking its state after.
#[derive(Debug, Clone)]
struct JobControl {
    cluster: Arc<Cluster>,
    id: String,
    status: watch::Receiver<Seen>,
    reason: Arc<Mutex<Option<StopReason>>>,
    sent: Arc<Mutex<Option<StopReason>>>,
}

impl JobControl {
    fn is_over(&self) -> bool {
        self.status.borrow().is_over()
    }

    fn stopped(&self) -> bool {
        matches!(&*self.status.borrow(), Seen::Job(j) if j.state == JobState::Stopped)
    }
}

impl Control for JobControl {
    fn signal(&self, sig: Sig) -> io::Result<bool> {
        // Ray stops jobs; it neither holds nor releases them.
        if self.is_over() || !matches!(sig, Sig::Term | Sig::Kill) {
            return Ok(false);
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return Ok(false);
        };
        let (cluster, id) = (Arc::clone(&self.cluster), self.id.clone());
        rt.spawn(async move {
            if let Err(e) = cluster.api.stop(&id).await {
                tracing::warn!("cannot stop Ray job {id}: {e}");
            }
            cluster.nudge();
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
            if let Err(e) = me.cluster.api.stop(&me.id).await {
                tracing::warn!("cannot stop Ray job {}: {e}", me.id);
            }
            me.cluster.nudge();
            let mut status = me.status.clone();
            // Ray sends TERM, then KILL after its own wait: wait for its end.
            let wait = grace + STOP_WAIT;
            let _ = tokio::time::timeout(wait, status.wait_for(Seen::is_over)).await;
            // Only the job's state says the stop reached it.
            if me.stopped() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: JobState, exit_code: Option<i64>) -> api::JobInfo {
        api::JobInfo {
            id: "sortie-r-0-1-a".into(),
            state,
            exit_code,
            message: "runtime env setup failed".into(),
            start_ms: 0,
            end_ms: 0,
        }
    }

    #[test]
    fn rays_ends_read_as_users_expect() {
        // FAILED with the driver's exit code: the attempt's own exit, read by its reader.
        assert_eq!(end_outcome(&job(JobState::Failed, Some(3)), "j"), None);
        assert_eq!(end_outcome(&job(JobState::Succeeded, Some(0)), "j"), None);
        // STOPPED from outside: an unexpected signal (retried).
        let stopped = end_outcome(&job(JobState::Stopped, None), "j").expect("an end");
        assert_eq!(stopped.stop_reason, StopReason::UnexpectedSignal);
        assert!(
            stopped
                .error
                .as_deref()
                .is_some_and(|e| e.contains("STOPPED"))
        );
        // FAILED before the entrypoint ran: a launch failure.
        let never = end_outcome(&job(JobState::Failed, None), "j").expect("an end");
        assert_eq!(never.stop_reason, StopReason::SpawnError);
        assert!(
            never
                .error
                .as_deref()
                .is_some_and(|e| e.contains("runtime env"))
        );
        // A lost head is over, and its outcome a transient error naming it.
        assert!(Seen::Lost("lost the Ray head at http://h:8265".into()).is_over());
    }

    #[test]
    fn the_job_script_quotes_every_word() {
        let req = LaunchRequest {
            placement: Placement {
                executor: RAY.into(),
                task: sortie_core::TaskId(0),
                attempt: sortie_core::Attempt(1),
                dir: "/state/runs/r/attempts/0.1".into(),
                handle: None,
            },
            spawn: crate::process::SpawnSpec {
                argv: vec!["agent".into(), "a b".into()],
                cwd: "/work dir".into(),
                env: vec![
                    ("A_B".into(), "it's".into()),
                    ("BAD-NAME".into(), "x".into()),
                ],
                marker: ("M".into(), "v".into()),
            },
            piped_stdin: false,
            stdin_file: None,
        };
        let s = job_script(&req, None);
        assert!(s.contains("export A_B='it'\\''s'\n"), "{s}");
        assert!(!s.contains("BAD-NAME"), "{s}");
        assert!(s.contains("cd '/work dir' || exit 127\n"), "{s}");
        assert!(s.contains("exec 'agent' 'a b' <'/dev/null' >'/state/runs/r/attempts/0.1/stdout'"));
    }
}

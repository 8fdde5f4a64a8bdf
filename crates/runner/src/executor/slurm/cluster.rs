//! A run's view of its Slurm cluster: the Slurm commands it runs (through
//! [`process::run_tool`], each bounded by a timeout), and the one poller that asks for the
//! status of all the run's live jobs at once, `squeue` by name, then `sacct` by id for the jobs
//! slurmctld has forgotten (`scontrol` where the cluster keeps no accounting), at an adaptive,
//! bounded pace. Each tracked job's latest status is published on a watch channel that its
//! execution and control wait on.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use sortie_core::{Attempt, RunId, TaskId};
use tokio::sync::{Notify, watch};

use super::follow::Over;
use super::jobs::{
    Accounting, JobId, JobKey, JobStatus, Lookup, PollPace, parse_sacct, parse_scontrol,
    parse_squeue, sacct_args, scontrol_args, squeue_args,
};
use crate::process::{self, ToolOutput};

/// The bound on one Slurm command (a slurmctld that does not answer is an error, not a hang).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The fastest and the slowest poll.
const POLL_MIN: Duration = Duration::from_millis(500);
const POLL_MAX: Duration = Duration::from_secs(5);
/// Polls in a row that found no trace of a submitted job before it counts as unknown to Slurm.
const UNKNOWN_AFTER: u32 = 3;

/// How long `sortie check` and `run` wait for the controller to answer before a batch that
/// runs on Slurm is refused.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// #37: whether a Slurm controller answers (`scontrol ping`), asked once before a batch that
/// runs on Slurm starts (and by `sortie check`): without one each attempt would fail only after
/// its `sbatch` gave up. The error says what `scontrol` said (its first informative line).
pub async fn controller_answers() -> Result<(), String> {
    let argv = ["scontrol".to_owned(), "ping".to_owned()];
    let ran = tokio::time::timeout(PING_TIMEOUT, process::run_tool(&argv, Path::new("/"), &[]));
    match ran.await {
        Err(_) => Err(format!(
            "no Slurm controller answered `scontrol ping` within {}s",
            PING_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => Err(format!("{e} (is Slurm installed on this machine?)")),
        Ok(Ok(out)) if out.success() => Ok(()),
        Ok(Ok(out)) => {
            let said = format!("{}\n{}", out.stderr, String::from_utf8_lossy(&out.stdout));
            let line = sortie_core::decide::error_line(&said).unwrap_or("no output");
            Err(format!(
                "no Slurm controller answers (`scontrol ping` exited {}: {})",
                out.code
                    .map_or_else(|| "by a signal".to_owned(), |c| c.to_string()),
                line.trim()
            ))
        }
    }
}

/// What the poller last saw of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seen {
    /// Not polled yet.
    Nothing,
    /// Its status.
    Status(JobStatus),
    /// Neither `squeue`, `sacct` nor `scontrol` knows it, several polls in a row.
    Unknown,
}

impl Over for Seen {
    /// True once nothing more will change: a final state, or unknown to Slurm.
    fn is_over(&self) -> bool {
        match self {
            Seen::Nothing => false,
            Seen::Status(s) => s.state.is_final(),
            Seen::Unknown => true,
        }
    }
}

/// A job the poller follows.
struct Tracked {
    id: JobId,
    tx: watch::Sender<Seen>,
    misses: u32,
}

/// A run's cluster (see the module doc). Shared by the run's Slurm attempts.
#[derive(Debug)]
pub struct Cluster {
    run: RunId,
    incarnation: u64,
    inner: Mutex<HashMap<String, TrackedCell>>,
    wake: Notify,
    polls: AtomicU64,
    /// `sacct` or `scontrol` for the jobs `squeue` no longer lists: decided by the first
    /// `sacct` that answers ([`Lookup::after_sacct`]).
    lookup: Mutex<Lookup>,
}

/// [`Tracked`] behind a `Debug` that shows the id only.
struct TrackedCell(Tracked);

impl std::fmt::Debug for TrackedCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {}", self.0.id)
    }
}

impl Cluster {
    /// The cluster as run `run` (in `incarnation`) sees it. Its poller starts with the first
    /// tracked job and ends with the cluster.
    pub fn new(run: RunId, incarnation: u64) -> Arc<Cluster> {
        Arc::new(Cluster {
            run,
            incarnation,
            inner: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            polls: AtomicU64::new(0),
            lookup: Mutex::new(Lookup::Undecided),
        })
    }

    /// The key of an attempt's job.
    pub(super) fn key(&self, task: TaskId, attempt: Attempt) -> JobKey {
        JobKey {
            run: self.run.clone(),
            task,
            attempt,
            incarnation: self.incarnation,
        }
    }

    /// How many status queries the poller made (for the benchmark's figures).
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, TrackedCell>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the jobs `squeue` no longer lists are looked up (so far).
    pub fn lookup(&self) -> Lookup {
        *self.lookup.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `sacct ARGS`, when the cluster is not known to keep no accounting; the lookup is
    /// decided from its answer. `None`: no accounting (or it failed): ask `scontrol`.
    async fn sacct(&self, which: Accounting<'_>) -> Result<Option<String>, String> {
        if !self.lookup().asks_sacct() {
            return Ok(None);
        }
        let out = call(&sacct_args(which)).await?;
        let mut lookup = self.lookup.lock().unwrap_or_else(PoisonError::into_inner);
        let before = *lookup;
        *lookup = lookup.after_sacct(out.success(), &out.stderr);
        if *lookup != before {
            tracing::info!(
                "Slurm jobs that squeue no longer lists: asking {:?}",
                *lookup
            );
        }
        Ok(out.success().then(|| out.text()))
    }

    /// Follows job `id` named `name`: its statuses arrive on the returned channel.
    pub(super) fn track(self: &Arc<Self>, name: String, id: JobId) -> watch::Receiver<Seen> {
        let mut jobs = self.lock();
        let first = jobs.is_empty();
        if let Some(t) = jobs.get(&name)
            && t.0.id == id
        {
            return t.0.tx.subscribe();
        }
        let (tx, rx) = watch::channel(Seen::Nothing);
        jobs.insert(name, TrackedCell(Tracked { id, tx, misses: 0 }));
        drop(jobs);
        if first {
            tokio::spawn(poll_loop(Arc::downgrade(self)));
        }
        self.wake.notify_one();
        rx
    }

    /// Asks the poller to poll now (a job was just stopped, or submitted).
    pub(super) fn nudge(&self) {
        self.wake.notify_one();
    }

    /// The status of the jobs named `names`, now: `squeue`, then `sacct` by name (since
    /// `since`) for those `squeue` does not know. Jobs of another name are left out; of two
    /// jobs with one name, the newest. An error when `squeue` itself fails.
    pub(super) async fn query_names(
        &self,
        names: &[String],
        since: &str,
    ) -> Result<HashMap<String, JobStatus>, String> {
        let mut found: HashMap<String, JobStatus> = HashMap::new();
        if names.is_empty() {
            return Ok(found);
        }
        self.polls.fetch_add(1, Ordering::Relaxed);
        let out = ok(call(&squeue_args(names)).await?)?;
        for s in parse_squeue(&out) {
            keep_newest(&mut found, s, names);
        }
        let missing: Vec<String> = names
            .iter()
            .filter(|n| !found.contains_key(*n))
            .cloned()
            .collect();
        // Without accounting nothing else finds a job by name: squeue's `--states=all` was it.
        if !missing.is_empty()
            && let Some(out) = self.sacct(Accounting::Names(&missing, since)).await?
        {
            for s in parse_sacct(&out) {
                keep_newest(&mut found, s, names);
            }
        }
        Ok(found)
    }

    /// Submits a job: `sbatch ARGS SCRIPT`; its id, or why not.
    pub(super) async fn sbatch(&self, args: &[String], script: &Path) -> Result<JobId, String> {
        let mut argv = args.to_vec();
        argv.push(script.display().to_string());
        let out = call(&argv).await?;
        if !out.success() {
            return Err(format!("sbatch failed: {}", out.stderr.trim()));
        }
        super::jobs::parse_sbatch(&out.text())
            .ok_or_else(|| format!("sbatch printed no job id: {:?}", out.text()))
    }

    /// `scancel` of one job, with a signal (`None`: cancel it: TERM, then KILL after the
    /// cluster's `KillWait`). Its exit says little (0 for an unknown id): callers check the
    /// job's state after.
    pub(super) async fn scancel(&self, job: JobId, signal: Option<&str>) -> Result<(), String> {
        let mut argv = vec!["scancel".to_owned()];
        if let Some(sig) = signal {
            argv.push(format!("--signal={sig}"));
            // The batch script and every step, not only the steps.
            argv.push("--full".to_owned());
        }
        argv.push(job.to_string());
        ok(call(&argv).await?).map(|_| ())
    }
}

/// Keeps `s` when it is one of `names` and newer than what is kept for its name.
fn keep_newest(found: &mut HashMap<String, JobStatus>, s: JobStatus, names: &[String]) {
    if !names.contains(&s.name) {
        return;
    }
    match found.get(&s.name) {
        Some(old) if old.id >= s.id => {}
        _ => {
            found.insert(s.name.clone(), s);
        }
    }
}

/// Runs a Slurm command, bounded by [`CALL_TIMEOUT`].
async fn call(argv: &[String]) -> Result<ToolOutput, String> {
    let program = argv.first().cloned().unwrap_or_default();
    match tokio::time::timeout(CALL_TIMEOUT, process::run_tool(argv, Path::new("/"), &[])).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "`{program}` did not answer in {}s",
            CALL_TIMEOUT.as_secs()
        )),
    }
}

/// The stdout of a command that succeeded, else its stderr as the error.
fn ok(out: ToolOutput) -> Result<String, String> {
    if out.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(out.stderr.trim().to_owned())
    }
}

/// The poller: one `squeue` for every live tracked job per round, `sacct` (or `scontrol`) only
/// for those `squeue` no longer lists. Ends when the cluster is dropped.
async fn poll_loop(cluster: Weak<Cluster>) {
    // While it sleeps it holds the cluster; it ends at the first round after the run let go.
    let mut pace = PollPace::new(POLL_MIN, POLL_MAX);
    loop {
        let Some(c) = cluster.upgrade() else { return };
        // Only this loop holds it: the run is over.
        if Arc::strong_count(&c) == 1 {
            return;
        }
        let live: Vec<(String, JobId)> = c
            .lock()
            .iter()
            .filter(|(_, t)| !t.0.tx.borrow().is_over())
            .map(|(n, t)| (n.clone(), t.0.id))
            .collect();
        let changed = if live.is_empty() {
            false
        } else {
            match poll_once(&c, &live).await {
                Ok(changed) => changed,
                Err(e) => {
                    tracing::warn!("Slurm status query failed: {e}");
                    false
                }
            }
        };
        let wait = pace.next(changed);
        tokio::select! {
            () = c.wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One round of the poller; true when a job's status changed.
async fn poll_once(c: &Cluster, live: &[(String, JobId)]) -> Result<bool, String> {
    let names: Vec<String> = live.iter().map(|(n, _)| n.clone()).collect();
    c.polls.fetch_add(1, Ordering::Relaxed);
    let out = ok(call(&squeue_args(&names)).await?)?;
    let mut by_id: HashMap<JobId, JobStatus> =
        parse_squeue(&out).into_iter().map(|s| (s.id, s)).collect();
    let missing: Vec<JobId> = live
        .iter()
        .map(|(_, id)| *id)
        .filter(|id| !by_id.contains_key(id))
        .collect();
    if !missing.is_empty() {
        match c.sacct(Accounting::Ids(&missing)).await? {
            Some(out) => by_id.extend(parse_sacct(&out).into_iter().map(|s| (s.id, s))),
            None if c.lookup() == Lookup::Scontrol => {
                // No accounting: slurmctld alone knows jobs, until MinJobAge after their end
                // (squeue missed them only in a race with its end, or once it is purged).
                for id in &missing {
                    let out = call(&scontrol_args(*id)).await?;
                    if out.success() {
                        by_id.extend(parse_scontrol(&out.text()).into_iter().map(|s| (s.id, s)));
                    }
                }
            }
            None => {}
        }
    }
    let mut changed = false;
    let mut jobs = c.lock();
    for (name, id) in live {
        let Some(t) = jobs.get_mut(name) else {
            continue;
        };
        let t = &mut t.0;
        let seen = match by_id.remove(id) {
            Some(s) => {
                t.misses = 0;
                Seen::Status(s)
            }
            None => {
                t.misses += 1;
                if t.misses < UNKNOWN_AFTER {
                    continue;
                }
                Seen::Unknown
            }
        };
        changed |= t.tx.send_if_modified(|old| {
            if *old == seen {
                false
            } else {
                *old = seen;
                true
            }
        });
    }
    Ok(changed)
}

//! A run's view of one Ray head node: its job API, and the one poller that asks for every job
//! of the run with one `GET /api/jobs/` per round, at an adaptive, bounded pace. Each tracked
//! job's latest status is published on a watch channel that its execution and control wait on.
//! A head that does not answer for [`LOST_AFTER`] ends the run's live jobs as lost (a transient
//! error naming the head), so that their tasks retry instead of waiting forever.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use sortie_core::{Attempt, RunId, TaskId};
use tokio::sync::{Notify, watch};

use super::api::{Api, JobInfo};
use crate::executor::slurm::follow::Over;
use crate::executor::slurm::jobs::PollPace;

/// The fastest and the slowest poll.
const POLL_MIN: Duration = Duration::from_millis(300);
const POLL_MAX: Duration = Duration::from_secs(3);
/// Polls in a row that found no trace of a submitted job before it counts as unknown to Ray.
const UNKNOWN_AFTER: u32 = 3;
/// How long the head may not answer before the live jobs count as lost.
const LOST_AFTER: Duration = Duration::from_secs(60);

/// Test-only (`tests/e2e/ray.rs`): [`LOST_AFTER`] in milliseconds, so that a lost head is seen
/// in seconds.
const TEST_LOST_AFTER_MS: &str = "SORTIE_TEST_RAY_LOST_AFTER_MS";

fn lost_after() -> Duration {
    std::env::var(TEST_LOST_AFTER_MS)
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(LOST_AFTER, Duration::from_millis)
}

/// The prefix of every submission id sortie gives.
const ID_PREFIX: &str = "sortie-";

/// An attempt's submission id: `sortie-<run>-<task>-<attempt>-<incarnation in hex>`, from its
/// identity alone, so that any sortie process finds the job again, and a second submission of
/// it is refused by Ray (its idempotency key).
pub(crate) fn submission_id(
    run: &RunId,
    task: TaskId,
    attempt: Attempt,
    incarnation: u64,
) -> String {
    format!("{ID_PREFIX}{run}-{}-{}-{incarnation:x}", task.0, attempt.0)
}

/// What the poller last saw of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Not polled yet.
    Nothing,
    /// Its status.
    Job(JobInfo),
    /// Ray does not list it, several polls in a row.
    Unknown,
    /// The head did not answer for [`LOST_AFTER`]: why.
    Lost(String),
}

impl Over for Seen {
    fn is_over(&self) -> bool {
        match self {
            Seen::Nothing => false,
            Seen::Job(j) => j.state.is_final(),
            Seen::Unknown | Seen::Lost(_) => true,
        }
    }
}

struct Tracked {
    tx: watch::Sender<Seen>,
    misses: u32,
}

/// A run's head node (see the module doc), shared by the run's Ray attempts on it.
pub(crate) struct Cluster {
    pub(crate) api: Api,
    run: RunId,
    incarnation: u64,
    jobs: Mutex<HashMap<String, Tracked>>,
    wake: Notify,
    polls: AtomicU64,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ray head {}", self.api.address)
    }
}

impl Cluster {
    pub(crate) fn new(address: &str, run: RunId, incarnation: u64) -> Arc<Cluster> {
        Arc::new(Cluster {
            api: Api::new(address),
            run,
            incarnation,
            jobs: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            polls: AtomicU64::new(0),
        })
    }

    /// The submission id of an attempt of this run.
    pub(crate) fn id(&self, task: TaskId, attempt: Attempt) -> String {
        submission_id(&self.run, task, attempt, self.incarnation)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Tracked>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Follows job `id`: its statuses arrive on the returned channel.
    pub(crate) fn track(self: &Arc<Self>, id: &str) -> watch::Receiver<Seen> {
        let mut jobs = self.lock();
        if let Some(t) = jobs.get(id) {
            return t.tx.subscribe();
        }
        let first = jobs.is_empty();
        let (tx, rx) = watch::channel(Seen::Nothing);
        jobs.insert(id.to_owned(), Tracked { tx, misses: 0 });
        drop(jobs);
        if first {
            tokio::spawn(poll_loop(Arc::downgrade(self)));
        }
        self.wake.notify_one();
        rx
    }

    /// Asks the poller to poll now.
    pub(crate) fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Every job the head knows, by submission id (one call).
    pub(crate) async fn list(&self) -> Result<HashMap<String, JobInfo>, String> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        let jobs = self.api.list().await?;
        Ok(jobs.into_iter().map(|j| (j.id.clone(), j)).collect())
    }
}

/// The poller: one job list per round for every live tracked job. Ends when the run let go of
/// the cluster.
async fn poll_loop(cluster: Weak<Cluster>) {
    let mut pace = PollPace::new(POLL_MIN, POLL_MAX);
    let mut failing_since: Option<Instant> = None;
    loop {
        let Some(c) = cluster.upgrade() else { return };
        if Arc::strong_count(&c) == 1 {
            return;
        }
        let live = c.lock().values().any(|t| !t.tx.borrow().is_over());
        let changed = if live {
            match c.list().await {
                Ok(found) => {
                    failing_since = None;
                    publish(&c, found)
                }
                Err(e) => {
                    tracing::warn!("{e}");
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= lost_after() {
                        lose(&c, &e);
                    }
                    false
                }
            }
        } else {
            false
        };
        let wait = pace.next(changed);
        tokio::select! {
            () = c.wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// Publishes a round's statuses; true when one changed.
fn publish(c: &Cluster, mut found: HashMap<String, JobInfo>) -> bool {
    let mut changed = false;
    for (id, t) in c.lock().iter_mut() {
        if t.tx.borrow().is_over() {
            continue;
        }
        let seen = match found.remove(id) {
            Some(j) => {
                t.misses = 0;
                Seen::Job(j)
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
    changed
}

/// Ends every live job as lost: the head did not answer.
fn lose(c: &Cluster, why: &str) {
    for t in c.lock().values() {
        if !t.tx.borrow().is_over() {
            t.tx.send_replace(Seen::Lost(format!(
                "lost the Ray head at {} for {}s: {why}",
                c.api.address,
                lost_after().as_secs()
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_id_is_its_identity() {
        let run = RunId::new("my-run.1").expect("a run id");
        let id = submission_id(&run, TaskId(3), Attempt(2), 0xbeef);
        assert_eq!(id, "sortie-my-run.1-3-2-beef");
    }
}

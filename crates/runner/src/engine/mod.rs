//! The run loop: the one owner of a run's state.
//!
//! One tokio task owns the [`RunState`]. Each round, core's [`Planner`] says what to do next
//! from the state and the facts this loop observed (the time, live attempts, worktree jobs in
//! flight, setups that failed, worktrees missing on disk); the loop appends the round's events
//! in one durable write (`commit`: check, append, apply), and only then performs the effects
//! the round announces (`effects`: spawning an attempt, writing an artifact, finalizing a
//! worktree, ending a task). The loop holds no scheduling rule of its own.
//!
//! The rooms: `commit` (the one path for state changes, and the run index), `reports` (attempt
//! reports → events, fenced by attempt number), `effects` (what a round's actions do),
//! `launch` (an attempt's context from its spec, record and agent), `worktree_jobs` (setup and
//! finalize beside the loop), `resume` (taking over a run no process owns).
//!
//! Stopping: the first SIGINT, SIGTERM or SIGHUP interrupts (stop launching, stop the children,
//! journal their attempts as interrupted, which spends no retry, then `RunInterrupted`:
//! resumable); a second SIGINT kills the children's process groups and returns at once (still
//! resumable: resume finds the orphans).
//! SIGUSR1 (sent by `sortie cancel`) cancels: every unfinished task ends cancelled.
//! A journal append that fails (a full disk, a file-size limit, the state dir removed) stops
//! the run at once: nothing more launches, the children's groups are killed (their ends cannot
//! be journaled: resume finds them orphaned), and `Error::JournalWrite` says what happened.
//! SIGXFSZ is caught so that a file-size limit fails the write instead of killing sortie.

mod checks;
mod commit;
mod control;
mod effects;
mod hooks;
mod launch;
mod reports;
mod resume;
#[cfg(test)]
mod tests;
mod worktree_jobs;
// #11

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sortie_core::plan::{Action, Facts, JobKind, Planner, RunEnding, Stopping};
use sortie_core::{Attempt, TaskId, TaskResult};
use sortie_core::{Event, RunId, RunOutcome, RunState, RunStatus, Seq, Stamped, StopReason};
use sortie_journal::Journal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::attempt::{AttemptHandle, Msg, StopRequest};
use crate::clock::{self, now};
use crate::layout::{OwnerLock, RunDir, StateDir, index};
use crate::{Error, Result, process};
use sortie_batch::LoadedBatch;

pub use commit::snapshot_every;

/// What gives the process's free memory back to the system (see [`on_release_memory`]).
static RELEASE_MEMORY: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Sets what a run's owner calls to give its allocator's free memory back to the system: after
/// each snapshot of a big run's state (and sled's reopen with it, which frees its old page
/// table) and before the run's last event, whose summary (3.6 MB for 100,000 tasks, held by the
/// event, its encoding and sled at once) is the peak of the run's memory. The allocator is the
/// binary's choice, so the binary says how (`sortie`'s `main`: glibc's `malloc_trim`); unset,
/// nothing is done. Only the first call counts.
pub fn on_release_memory(release: fn()) {
    let _ = RELEASE_MEMORY.set(release);
}

/// Gives the allocator's free memory back to the system, if the binary said how.
fn release_memory() {
    if let Some(release) = RELEASE_MEMORY.get() {
        release();
    }
}

/// The environment variable that marks every attempt's process (see `process::marker`).
pub use crate::process::MARKER;

/// Test-only hook for the crash tests (`tests/e2e/crash.rs`): when this environment variable
/// names an event (`AttemptFinished`, `AttemptLaunching`, ...), the run loop, once the round that
/// committed the first such event has done its side effects (spawns, artifact writes), waits
/// forever, so that a test can SIGKILL sortie at exactly that point. Unset: no effect.
/// `before:WorktreeFinalized` instead freezes the loop once the first finalize job has done its
/// work (worktree removed, or patch written), right before its event is committed;
/// `before:spawn` once a round's launches are durable (`AttemptLaunching`, and `AttemptPlaced`
/// where the executor outlives sortie), before any of them is spawned.
pub const TEST_PAUSE_AFTER: &str = "SORTIE_TEST_PAUSE_AFTER";

/// How often the run loop checks, between appends, that its journal was not removed.
const JOURNAL_CHECK: Duration = Duration::from_secs(2);

/// How long the loop lets more reports gather after one arrives while other attempts are
/// live, before it journals them (group commit: one durable write for the reports of several
/// attempts and the round planned from them, instead of one each; a report is journaled at
/// most this much later, which tokio's timer makes 2 to 3 ms). 2 ms rather than 1 since the
/// reports' own write was folded into the planned round's (`commit_pending`): 5,000 × `true`
/// at 16 went 0.731–0.802× xargs at 1 ms, 0.744–0.806× at 2 ms and 0.746–0.801× at 3 ms, the
/// same five rounds; 5 ms left slots idle (0.70–0.75×). On the current-thread runtime 1 ms and
/// 2 ms gave the same wall time (0.831–0.876× both, five rounds), 2 ms a little less CPU.
const REPORT_LINGER: Duration = Duration::from_millis(2);

/// How long reports that are all `AttemptStarted` may linger for one that is not, before they
/// are journaled alone (#10: a write of its own for starts only was a tenth of all writes).
/// An attempt placed but not yet started stays found by its placement on resume, as before.
const STARTS_LINGER: Duration = Duration::from_millis(5);

/// Something that wants to see each event as it is applied (progress display, logs).
pub trait Observer: Send {
    /// Called after `stamped` was made durable and applied to `state`.
    fn event(&mut self, state: &RunState, stamped: &Stamped);

    /// Called when what a live attempt is doing changed (the tool it runs, `thinking`): for
    /// displays only, never journaled.
    fn activity(&mut self, _state: &RunState, _task: TaskId, _attempt: Attempt, _text: &str) {}
}

/// An observer that ignores everything.
pub struct Quiet;

/// What a front end (the CLI, a test) gives a run besides its batch: who watches it, and the
/// `--on-task-end` command. The engine runs the task-end hooks itself (`hooks.rs`), so a
/// front end that only watches still runs the batch's hooks.
pub struct Front {
    /// Told of each event once it is durable.
    pub observer: Box<dyn Observer>,
    /// `--on-task-end CMD`: run for every task that ends, instead of the batch's own hooks.
    pub on_task_end: Option<String>,
}

impl From<Box<dyn Observer>> for Front {
    fn from(observer: Box<dyn Observer>) -> Front {
        Front {
            observer,
            on_task_end: None,
        }
    }
}

impl Observer for Quiet {
    fn event(&mut self, _: &RunState, _: &Stamped) {}
}

/// How a run's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The run finished (`RunFinished` is in the journal).
    Finished(RunOutcome),
    /// The run was interrupted and can be resumed.
    Interrupted,
}

/// What a run (or a resume) came to.
#[derive(Debug)]
pub struct RunEnd {
    /// The run.
    pub run_id: RunId,
    /// Its state as this process left it.
    pub state: RunState,
    /// How it ended.
    pub end: End,
}

/// Starts a new run of a loaded batch and runs it to its end.
pub async fn run(
    state_dir: &StateDir,
    run_id: Option<RunId>,
    loaded: LoadedBatch,
    front: Front,
) -> Result<RunEnd> {
    let end = start(state_dir, run_id, loaded, Vec::new(), front).await?;
    Ok(discard_losers(state_dir, end).await)
}

/// #33: once a run finished (its lock released), the kept worktrees of the samples its `pick`
/// did not choose are discarded.
async fn discard_losers(state_dir: &StateDir, end: RunEnd) -> RunEnd {
    if matches!(end.end, End::Finished(_)) {
        for r in crate::worktree::kept::discard_losers(&end.state, state_dir, &end.run_id).await {
            if let Err((label, why)) = r {
                tracing::warn!("could not discard the worktree of {label} (not picked): {why}");
            }
        }
    }
    end
}

/// What a rerun carries from its parent run (`sortie rerun`).
#[derive(Debug, Clone)]
pub struct Rerun {
    /// The run whose batch runs again.
    pub parent: RunId,
    /// The tasks not selected, with their results and the usage they spent before (core's
    /// `rerun::select` decides them).
    pub carried: Vec<sortie_core::rerun::Carried>,
}

/// Starts a rerun of a finished run's batch (`loaded`: its journaled batch and saved
/// environment) and runs it to its end: `RunRerunOf` and each carried task's `TaskCarried`
/// are journaled right after `RunStarted`, before anything is planned.
pub async fn rerun(
    state_dir: &StateDir,
    run_id: Option<RunId>,
    loaded: LoadedBatch,
    rerun: Rerun,
    front: Front,
) -> Result<RunEnd> {
    let mut prelude = vec![Event::RunRerunOf {
        parent: rerun.parent,
    }];
    prelude.extend(rerun.carried.into_iter().map(|c| Event::TaskCarried {
        task: c.task,
        result: c.result,
        usage: c.usage,
    }));
    let end = start(state_dir, run_id, loaded, prelude, front).await?;
    Ok(discard_losers(state_dir, end).await)
}

/// A new run: its journal, `RunStarted`, then `prelude`, then the loop.
async fn start(
    state_dir: &StateDir,
    run_id: Option<RunId>,
    loaded: LoadedBatch,
    prelude: Vec<Event>,
    front: Front,
) -> Result<RunEnd> {
    crate::slots::check_depth()?;
    process::survive_file_size_limit()?;
    state_dir.ensure()?;
    let run_id = run_id.unwrap_or_else(clock::new_run_id);
    let dir = state_dir.run(&run_id);
    if dir.exists() {
        return Err(Error::RunExists(run_id));
    }
    // Two runs of one id started at once: the one whose journal is created second lost the
    // race, as if it had seen the run dir (#37).
    let journal = Journal::create(dir.path()).map_err(|e| match e {
        sortie_journal::Error::Exists { .. } => Error::RunExists(run_id.clone()),
        other => Error::from(other),
    })?;
    let lock = dir.acquire()?;
    dir.save_env(&loaded.env)?;
    let parts = Parts {
        state_dir: state_dir.clone(),
        run_id: run_id.clone(),
        run_dir: dir,
        journal,
        lock,
        env: loaded.env,
    };
    let mut engine = Engine::new(parts, RunState::new(), front);
    index::create(state_dir, &engine.run_id, &loaded.batch.source, now())?;
    let started = Event::RunStarted {
        run_id,
        batch: loaded.batch,
        batch_digest: loaded.digest,
        host: process::hostname(),
        pid: std::process::id(),
    };
    engine.commit(vec![started])?;
    if !prelude.is_empty() {
        engine.commit(prelude)?;
    }
    engine.planner = Planner::new(&engine.state);
    engine.drive().await
}

/// What `resume` or `cancel` should do with a run found in the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// Continue the run to its end.
    Resume,
    /// End every unfinished task as cancelled.
    Cancel,
}

/// Takes over a run that no process owns (crashed or interrupted): replays its journal, makes
/// sure no process of its attempts survives, records those attempts as orphaned, then resumes
/// or cancels it.
pub async fn take_over(
    state_dir: &StateDir,
    run_id: RunId,
    how: Takeover,
    front: Front,
) -> Result<RunEnd> {
    crate::slots::check_depth()?;
    process::survive_file_size_limit()?;
    let dir = state_dir.run(&run_id);
    if !dir.exists() {
        return Err(Error::NoSuchRun(run_id));
    }
    let lock = dir.lock()?;
    let mut opened = crate::layout::open::take_over(state_dir, &dir)?;
    dir.claim()?;
    if let RunStatus::Finished { state: s } = opened.state.status {
        return Err(Error::AlreadyFinished(run_id, s.to_string()));
    }
    let env = opened.env(&dir)?;
    let (journal, state) = (opened.journal, opened.state);
    let parts = Parts {
        state_dir: state_dir.clone(),
        run_id,
        run_dir: dir,
        journal,
        lock,
        env,
    };
    let mut engine = Engine::new(parts, state, front);
    let from_seq = Seq(engine.state.next_seq.0.saturating_sub(1));
    engine.commit(vec![Event::RunResumed {
        pid: std::process::id(),
        from_seq,
    }])?;
    engine.reap_orphans().await?;
    // #14: the copies of tasks that ended before the crash cut their removal short.
    let ended: Vec<TaskId> = (0..engine.state.tasks.len())
        .map(|i| TaskId(u32::try_from(i).unwrap_or(u32::MAX)))
        .filter(|t| engine.state.task(*t).is_some_and(|r| r.state.is_terminal()))
        .collect();
    for task in ended {
        engine.discard_copy(task).await;
    }
    engine.planner = Planner::new(&engine.state);
    // A user's `sortie cancel` that a crash cut short goes on too.
    if how == Takeover::Cancel || engine.state.control.run_cancelled {
        // Adopted attempts (#11) are live: they are stopped like a live run's.
        engine.stop_all(Stopping::Cancel);
    }
    let end = engine.drive().await?;
    Ok(discard_losers(state_dir, end).await)
}

/// What a run's owner holds, whether it started the run or took it over.
struct Parts {
    state_dir: StateDir,
    run_id: RunId,
    run_dir: RunDir,
    journal: Journal,
    lock: OwnerLock,
    env: Vec<Vec<(String, sortie_batch::EnvValue)>>,
}

/// A worktree job in flight.
struct Job {
    kind: JobKind,
    handle: tokio::task::JoinHandle<()>,
    /// For a finalize: the result the task ends with once its worktree is finalized.
    ending: Option<TaskResult>,
}

struct Engine {
    state_dir: StateDir,
    run_id: RunId,
    run_dir: RunDir,
    journal: Arc<Journal>,
    _lock: OwnerLock,
    /// Each task's environment variables, by task index; a task without any is not held.
    env: HashMap<usize, Vec<(String, sortie_batch::EnvValue)>>,
    state: RunState,
    planner: Planner,
    live: HashMap<TaskId, AttemptHandle>,
    /// #33: the checks running, by task (each holds a slot, as an attempt does).
    checks: HashMap<TaskId, checks::CheckHandle>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    stopping: Option<Stopping>,
    observer: Box<dyn Observer>,
    /// `--on-task-end CMD` (see [`Front`]).
    on_task_end: Option<String>,
    /// [`TEST_PAUSE_AFTER`]'s event name, and whether such an event was committed.
    pause_after: (Option<String>, bool),
    /// Worktree jobs in flight (setup or finalize), by task.
    jobs: BTreeMap<TaskId, Job>,
    wt_tx: mpsc::UnboundedSender<worktree_jobs::WtMsg>,
    wt_rx: mpsc::UnboundedReceiver<worktree_jobs::WtMsg>,
    /// Tasks whose worktree setup failed, and why: they end `setup_error` (or timeout).
    setup_failed: BTreeMap<TaskId, String>,
    /// The records counted by the last high-water mark, and when it was written.
    marked: (u64, std::time::Instant),
    /// What the run's attempts share of their executors (#11: Slurm's one status poller).
    executors: crate::executor::Shared,
    /// The records the last snapshot holds (or the state this process started from).
    snapshotted: u64,
    /// Events appended and applied but not yet durable (`commit_pending`), in order: the
    /// observer sees them once they are (`settle`).
    unsettled: Vec<Stamped>,
    /// What the transcripts' cutter is to be told once the pending events are durable.
    untold: reports::Told,
    /// #13: each task's session predecessor (`sortie_core::session::session_links`), computed
    /// once: the batch of a run never changes.
    session_links: std::sync::OnceLock<Vec<Option<usize>>>,
}

impl Engine {
    fn new(parts: Parts, state: RunState, front: Front) -> Engine {
        let state_seq = state.next_seq.0;
        let (tx, rx) = mpsc::unbounded_channel();
        let (wt_tx, wt_rx) = mpsc::unbounded_channel();
        // The journal is the product: an acknowledged event survives a power loss too, not
        // only the death of this process. Group commit shares the fdatasync.
        parts
            .journal
            .set_durability(sortie_journal::Durability::Sync);
        Engine {
            state_dir: parts.state_dir,
            run_id: parts.run_id,
            run_dir: parts.run_dir,
            journal: Arc::new(parts.journal),
            _lock: parts.lock,
            // Only the tasks that have variables: a big batch's tasks mostly have none, and a
            // list of one empty list per task was 2.4 MB held by a 100,000-task run to its end.
            env: parts
                .env
                .into_iter()
                .enumerate()
                .filter(|(_, vars)| !vars.is_empty())
                .collect(),
            // Both callers build the planner once the state is complete (after `RunStarted`,
            // or after resume's own events): a 100,000-task state is indexed once.
            planner: Planner::new(&RunState::new()),
            state,
            live: HashMap::new(),
            checks: HashMap::new(),
            tx,
            rx,
            stopping: None,
            observer: front.observer,
            on_task_end: front.on_task_end,
            pause_after: (std::env::var(TEST_PAUSE_AFTER).ok(), false),
            jobs: BTreeMap::new(),
            wt_tx,
            wt_rx,
            setup_failed: BTreeMap::new(),
            // Counted from the records found at open (checked against the mark, if any): a
            // resumed run's first commit does not rewrite the mark and the index (four fsyncs
            // before its first spawn); the clock (`MARK_EVERY`) brings them up to date.
            marked: (state_seq, std::time::Instant::now()),
            executors: crate::executor::Shared::default(),
            snapshotted: state_seq,
            session_links: std::sync::OnceLock::new(),
            unsettled: Vec::new(),
            untold: Vec::new(),
        }
    }

    /// Runs the loop to its end. When the journal cannot be written (a full disk, a removed
    /// state dir), nothing more may happen that the journal does not hold: nothing more is
    /// launched, the live attempts' process groups are killed at once (their ends cannot be
    /// journaled: resume finds them orphaned and retries them), worktree jobs are dropped
    /// (resume redoes each step), and the error goes up to say so.
    async fn drive(mut self) -> Result<RunEnd> {
        let end = self.drive_loop().await;
        if let Err(e @ Error::JournalWrite { .. }) = &end {
            tracing::debug!("stopping on a journal failure: {e}");
            self.abort_now();
        }
        // #10: the run's shepherd exits once its attempts are gone; sortie waits for it.
        crate::supervisor::release_shepherds().await;
        end.map(|end| RunEnd {
            run_id: self.run_id,
            state: self.state,
            end,
        })
    }

    async fn drive_loop(&mut self) -> Result<End> {
        self.update_index();
        let mut sigint = signal(SignalKind::interrupt()).map_err(|e| self.io(e))?;
        let mut sigterm = signal(SignalKind::terminate()).map_err(|e| self.io(e))?;
        let mut sighup = signal(SignalKind::hangup()).map_err(|e| self.io(e))?;
        let mut sigusr1 = signal(SignalKind::user_defined1()).map_err(|e| self.io(e))?;
        let (ctl_tx, mut ctl_rx) = mpsc::unbounded_channel();
        let _listener = control::listen(&self.run_dir.control_socket(), ctl_tx);
        // Appends notice a removed journal; between them (agents silent for minutes), this does.
        let mut presence = tokio::time::interval(JOURNAL_CHECK);
        presence.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Plan and perform rounds until nothing more can happen without waiting.
            loop {
                if self.pause_after.0.is_some() {
                    // The crash tests freeze the loop once the event they name is durable and
                    // its effects done, before anything is planned from it.
                    self.settle()?;
                }
                self.pause_point().await;
                let actions = self.plan();
                if actions.is_empty() {
                    break;
                }
                if let Some(ending) = self.perform(actions).await? {
                    return self.end_run(ending);
                }
            }
            // Nothing more to plan: the reports' pending rounds become durable before the loop
            // waits (a round planned from them already made them so).
            self.settle()?;
            let wake = self.planner.next_wake_of(&self.state, now());
            let sleep = async {
                match wake {
                    Some(t) => tokio::time::sleep(t.since(now())).await,
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                msg = self.rx.recv() => {
                    let mut msgs = Vec::new();
                    msgs.extend(msg);
                    // Other live attempts may report too: their reports share the write.
                    // Reports that are all starts linger on (up to `STARTS_LINGER`) for a
                    // report that is not: a write of starts alone changes nothing the loop
                    // acts on, and an attempt's end usually follows its start closely.
                    let lingered = tokio::time::Instant::now();
                    loop {
                        if self.live.len() > 1 {
                            tokio::time::sleep(REPORT_LINGER).await;
                        }
                        while let Ok(m) = self.rx.try_recv() {
                            msgs.push(m);
                        }
                        if self.live.len() <= 1
                            || !reports::only_starts(&msgs)
                            || lingered.elapsed() >= STARTS_LINGER
                        {
                            break;
                        }
                    }
                    self.handle(msgs)?;
                }
                _ = sleep => {}
                _ = sigint.recv() => {
                    if self.stopping == Some(Stopping::Interrupt) {
                        self.abort_now();
                        return Ok(End::Interrupted);
                    }
                    self.stop_all(Stopping::Interrupt);
                }
                _ = sigterm.recv() => self.stop_all(Stopping::Interrupt),
                // The terminal closed (an ssh session dropped): an interrupt, resumable.
                _ = sighup.recv() => self.stop_all(Stopping::Interrupt),
                _ = sigusr1.recv() => self.stop_all(Stopping::Cancel),
                Some(msg) = ctl_rx.recv() => self.control(msg)?,
                _ = presence.tick() => {
                    self.journal.check_present().map_err(|e| self.journal_error(e))?;
                }
                msg = self.wt_rx.recv() => {
                    if let Some(msg) = msg {
                        self.handle_wt(msg).await?;
                    }
                }
            }
        }
    }

    /// The facts of this moment, and the planner's round for them.
    fn plan(&mut self) -> Vec<Action> {
        let jobs: BTreeMap<TaskId, JobKind> = self.jobs.iter().map(|(t, j)| (*t, j.kind)).collect();
        let missing: BTreeSet<TaskId> = self
            .planner
            .planned_worktrees(&self.state)
            .filter(|(_, path)| !Path::new(path).exists())
            .map(|(t, _)| t)
            .collect();
        let facts = Facts {
            now: now(),
            stopping: self.stopping,
            live: self.live.len() + self.checks.len(),
            jobs: &jobs,
            setup_failed: &self.setup_failed,
            missing_worktrees: &missing,
        };
        self.planner.plan(&self.state, &facts)
    }

    /// Journals the run's end that the planner decided ([`Action::EndRun`]) and says how the
    /// process ends.
    fn end_run(&mut self, ending: RunEnding) -> Result<End> {
        self.settle()?;
        if ending == RunEnding::Finished {
            // sled's reopen (when its log grew enough) now rather than after the last event,
            // in the snapshot that follows it: the reopen's memory and that of the summary
            // (3.6 MB for 100,000 tasks, held by the event, its encoding and sled at once) no
            // longer add up at the run's end, its peak of memory.
            self.journal
                .reopen_if_grown()
                .map_err(|e| self.journal_error(e))?;
            release_memory();
        }
        let event = ending.event(&self.state);
        let end = match &event {
            Event::RunFinished { state, .. } => End::Finished(*state),
            _ => End::Interrupted,
        };
        self.commit(vec![event])?;
        self.update_index();
        Ok(end)
    }

    /// [`TEST_PAUSE_AFTER`]: once its event was committed and the effects that follow it done,
    /// nothing more happens.
    async fn pause_point(&self) {
        if self.pause_after.1 {
            std::future::pending::<()>().await;
        }
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.run_dir.path().to_path_buf(),
            source,
        }
    }

    fn stop_all(&mut self, how: Stopping) {
        if self.stopping == Some(Stopping::Cancel) {
            return;
        }
        self.stopping = Some(how);
        let (reason, message) = match how {
            Stopping::Interrupt => (StopReason::Interrupted, "sortie was interrupted"),
            Stopping::Cancel => (StopReason::Cancelled, "the run was cancelled"),
        };
        for h in self.live.values() {
            h.stop(StopRequest {
                reason,
                phase: None,
                message: message.into(),
            });
        }
        // #33: an interrupted check has no verdict (resume runs it again); a cancelled one
        // fails.
        for c in self.checks.values_mut() {
            c.stop(reason);
        }
    }

    /// The run's budget ran out: every live attempt is asked to wrap up (a steerable agent
    /// gets its grace turns, see the watchdog) or is stopped, with stop reason `budget`.
    fn wind_down(&mut self, reason: &str) {
        for h in self.live.values() {
            h.stop(StopRequest {
                reason: StopReason::Budget,
                phase: None,
                message: format!("the run's budget ran out: {reason}"),
            });
        }
    }

    /// A second Ctrl-C: kill every child's group without waiting, leave the rest to resume.
    fn abort_now(&mut self) {
        for h in self.live.values() {
            h.kill_now();
        }
        for c in std::mem::take(&mut self.checks).into_values() {
            c.abort();
        }
        // Their git commands die with them; resume redoes each step from the journal.
        for (_, job) in std::mem::take(&mut self.jobs) {
            job.handle.abort();
        }
    }
}

#[cfg(test)]
mod release_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    static CALLS: AtomicUsize = AtomicUsize::new(0);
    static OTHER: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        CALLS.fetch_add(1, Ordering::SeqCst);
    }

    fn other() {
        OTHER.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn the_owner_releases_memory_the_way_the_binary_said_and_only_the_first_way() {
        super::on_release_memory(count);
        super::on_release_memory(other);
        super::release_memory();
        super::release_memory();
        assert_eq!(CALLS.load(Ordering::SeqCst), 2);
        assert_eq!(OTHER.load(Ordering::SeqCst), 0);
    }
}

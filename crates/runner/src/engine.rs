//! The run loop: the one owner of a run's state.
//!
//! One tokio task owns the [`RunState`]. It plans rounds of events (queue ready tasks, skip
//! tasks whose dependencies did not complete, time out waiting tasks, decide what follows an
//! ended attempt, launch attempts up to the concurrency limit), checks each against the state,
//! appends the round to the journal in one durable write, applies it, and only then performs the
//! side effects the events announce (spawning an attempt, writing an artifact). A round holds at
//! most one event per task, so every event of a round is checked against the same state.
//!
//! Attempts run in their own tokio tasks (see `attempt`) and report back through a channel;
//! their reports become events in the next round.
//!
//! Stopping: the first SIGINT or SIGTERM interrupts (stop launching, stop the children, journal
//! their attempts as interrupted, then `RunInterrupted`: resumable); a second SIGINT kills the
//! children's process groups and returns at once (still resumable: resume finds the orphans).
//! SIGUSR1 (sent by `sortie cancel`) cancels: every unfinished task ends cancelled.
//! A journal append that fails (a full disk, a file-size limit, the state dir removed) stops
//! the run at once: nothing more launches, the children's groups are killed (their ends cannot
//! be journaled: resume finds them orphaned), and `Error::JournalWrite` says what happened.
//! SIGXFSZ is caught so that a file-size limit fails the write instead of killing sortie.
//!
//! Worktrees (`isolation = "worktree"`, see `worktree`): a queued task is set up before its
//! first attempt by jobs that run beside the loop and report back like attempts: plan (read the
//! repository) → `WorktreePlanned` → create → `TaskSetUp`. A setup job holds a concurrency slot
//! and is bounded by the task's deadline. Before `TaskFinished` of a task with a planned worktree
//! (whatever its end: completed, failed, timeout, cancelled, fail_fast, setup error), a finalize
//! job keeps or removes it → `WorktreeFinalized`. Each step is idempotent and derived from the
//! journal, so resume finishes whatever a crash cut short.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sortie_core::decide::{deadline_result, result_without_attempt};
use sortie_core::{
    Attempt, Event, NextStep, OrphanAction, Phase, RunId, RunOutcome, RunState, RunStatus, Seq,
    Stamped, StopReason, TaskId, TaskState, TerminalState, Timestamp,
};
use sortie_core::{Isolation, PlannedWorktree, TaskRecord, TaskResult};
use sortie_journal::Journal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::attempt::{self, AttemptCtx, AttemptHandle, Msg, StopRequest};
use crate::batch::LoadedBatch;
use crate::statedir::{self, OwnerLock, now};
use crate::worktree::{self, Finalized};
use crate::{Error, Result, agent, process, prompt};

/// The environment variable that marks every attempt's process with
/// `<run>/<task>/<attempt>/<incarnation>`, so that resume finds a crashed run's children even
/// when their pid never reached the journal. The incarnation (the run's start time in ms, in
/// hex, from its journal) tells apart runs of the same id in other state dirs, which resume
/// leaves alone; a marker without it counts as this run's.
pub const MARKER: &str = "SORTIE_ATTEMPT";

/// Test-only hook for the crash tests (`tests/e2e/crash.rs`): when this environment variable
/// names an event (`AttemptFinished`, `AttemptLaunching`, ...), the run loop, once the round that
/// committed the first such event has done its side effects (spawns, artifact writes), waits
/// forever, so that a test can SIGKILL sortie at exactly that point. Unset: no effect.
/// `before:WorktreeFinalized` instead freezes the loop once the first finalize job has done its
/// work (worktree removed, or patch written), right before its event is committed.
pub const TEST_PAUSE_AFTER: &str = "SORTIE_TEST_PAUSE_AFTER";

/// How often the run loop checks, between appends, that its journal was not removed.
const JOURNAL_CHECK: Duration = Duration::from_secs(2);

/// Something that wants to see each event as it is applied (progress display, logs).
pub trait Observer: Send {
    /// Called after `stamped` was made durable and applied to `state`.
    fn event(&mut self, state: &RunState, stamped: &Stamped);
}

/// An observer that ignores everything.
pub struct Quiet;

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
    state_dir: &Path,
    run_id: Option<RunId>,
    loaded: LoadedBatch,
    observer: Box<dyn Observer>,
) -> Result<RunEnd> {
    survive_file_size_limit()?;
    statedir::ensure_state_dir(state_dir)?;
    let run_id = run_id.unwrap_or_else(statedir::new_run_id);
    let dir = statedir::run_dir(state_dir, &run_id);
    if dir.exists() {
        return Err(Error::RunExists(run_id));
    }
    let journal = Journal::create(&dir)?;
    let lock = statedir::acquire(&dir)?;
    statedir::save_env(&dir, &loaded.env)?;
    let mut engine = Engine::new(
        state_dir,
        run_id.clone(),
        dir,
        journal,
        lock,
        loaded.env,
        observer,
    );
    engine.index_entry(&loaded.batch.source)?;
    let started = Event::RunStarted {
        run_id,
        batch: loaded.batch,
        batch_digest: loaded.digest,
        host: hostname(),
        pid: std::process::id(),
    };
    engine.commit(vec![started])?;
    engine.sched.rebuild(&engine.state);
    engine.rebuild_isolated();
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
    state_dir: &Path,
    run_id: RunId,
    how: Takeover,
    observer: Box<dyn Observer>,
) -> Result<RunEnd> {
    survive_file_size_limit()?;
    let dir = statedir::run_dir(state_dir, &run_id);
    if !dir.exists() {
        return Err(Error::NoSuchRun(run_id));
    }
    let lock = statedir::acquire(&dir)?;
    let journal = open_for_takeover(&dir).await?;
    let state = journal.replay(None)?;
    if let RunStatus::Finished { state: s } = state.status {
        return Err(Error::AlreadyFinished(run_id, s.to_string()));
    }
    let tasks = state.tasks.len();
    let env = statedir::load_env(&dir, tasks)?;
    let mut engine = Engine::new(state_dir, run_id.clone(), dir, journal, lock, env, observer);
    engine.state = state;
    let from_seq = Seq(engine.state.next_seq.0.saturating_sub(1));
    engine.commit(vec![Event::RunResumed {
        pid: std::process::id(),
        from_seq,
    }])?;
    engine.reap_orphans().await?;
    engine.sched.rebuild(&engine.state);
    engine.rebuild_isolated();
    if how == Takeover::Cancel {
        engine.stopping = Some(Stopping::Cancel);
    }
    engine.drive().await
}

/// A file-size limit (`ulimit -f`, RLIMIT_FSIZE: how a full disk is simulated, and a real limit
/// on some machines) makes a write past it raise SIGXFSZ, whose default action kills the
/// process without a word. With a handler installed, the write fails with EFBIG instead and the
/// journal's append returns an error, which stops the run cleanly (see [`Error::JournalWrite`]).
/// tokio keeps the handler for the life of the process; children get the default action back
/// at exec.
fn survive_file_size_limit() -> Result<()> {
    let xfsz = SignalKind::from_raw(nix::sys::signal::Signal::SIGXFSZ as i32);
    signal(xfsz).map(drop).map_err(|source| Error::Io {
        path: PathBuf::from("SIGXFSZ"),
        source,
    })
}

/// Opens the journal for writing once the owner lock is ours. A reader (`sortie status`) may
/// hold sled's lock for a moment; wait for it rather than fail.
async fn open_for_takeover(dir: &Path) -> Result<Journal> {
    let mut tries = 0;
    loop {
        match Journal::open(dir) {
            Err(sortie_journal::Error::Locked { .. }) if tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return Ok(other?),
        }
    }
}

/// Why the loop is winding down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopping {
    /// Ctrl-C or SIGTERM: resumable.
    Interrupt,
    /// `sortie cancel`: final.
    Cancel,
}

struct Engine {
    state_dir: PathBuf,
    run_id: RunId,
    run_dir: PathBuf,
    journal: Arc<Journal>,
    _lock: OwnerLock,
    env: Vec<Vec<(String, String)>>,
    state: RunState,
    sched: Sched,
    live: HashMap<TaskId, AttemptHandle>,
    tx: mpsc::UnboundedSender<Msg>,
    rx: mpsc::UnboundedReceiver<Msg>,
    stopping: Option<Stopping>,
    fail_fast_tripped: bool,
    observer: Box<dyn Observer>,
    /// [`TEST_PAUSE_AFTER`]'s event name, and whether such an event was committed.
    pause_after: (Option<String>, bool),
    /// Worktree jobs in flight (setup or finalize), by task.
    jobs: HashMap<TaskId, Job>,
    wt_tx: mpsc::UnboundedSender<WtMsg>,
    wt_rx: mpsc::UnboundedReceiver<WtMsg>,
    /// Tasks whose worktree setup failed, and why: they end `setup_error` (or timeout).
    setup_failed: HashMap<TaskId, String>,
    /// Tasks whose worktree finalize failed, and why: they end without `WorktreeFinalized`.
    finalize_failed: HashMap<TaskId, String>,
    /// Unfinished tasks with `isolation = "worktree"`.
    isolated: BTreeSet<TaskId>,
}

/// What a worktree job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobKind {
    /// Read the repository: `WorktreePlanned` follows.
    Plan,
    /// Create the planned worktree (or re-create a missing one): `TaskSetUp` follows.
    Create,
    /// Keep or remove it: `WorktreeFinalized` follows.
    Finalize,
}

struct Job {
    kind: JobKind,
    handle: tokio::task::JoinHandle<()>,
}

/// A worktree job's report.
enum WtMsg {
    Planned(TaskId, std::result::Result<PlannedWorktree, String>),
    Created(TaskId, std::result::Result<(), String>),
    Finalized(TaskId, std::result::Result<Finalized, String>),
}

impl Engine {
    fn new(
        state_dir: &Path,
        run_id: RunId,
        run_dir: PathBuf,
        journal: Journal,
        lock: OwnerLock,
        env: Vec<Vec<(String, String)>>,
        observer: Box<dyn Observer>,
    ) -> Engine {
        let (tx, rx) = mpsc::unbounded_channel();
        let (wt_tx, wt_rx) = mpsc::unbounded_channel();
        Engine {
            state_dir: state_dir.to_path_buf(),
            run_id,
            run_dir,
            journal: {
                // The journal is the product: an acknowledged event survives a power loss too,
                // not only the death of this process. Group commit shares the fdatasync.
                journal.set_durability(sortie_journal::Durability::Sync);
                Arc::new(journal)
            },
            _lock: lock,
            env,
            state: RunState::new(),
            sched: Sched::default(),
            live: HashMap::new(),
            tx,
            rx,
            stopping: None,
            fail_fast_tripped: false,
            observer,
            pause_after: (std::env::var(TEST_PAUSE_AFTER).ok(), false),
            jobs: HashMap::new(),
            wt_tx,
            wt_rx,
            setup_failed: HashMap::new(),
            finalize_failed: HashMap::new(),
            isolated: BTreeSet::new(),
        }
    }

    /// The one path for state changes: check every event against the state, append them all
    /// durably in one write, then apply them in order.
    fn commit(&mut self, events: Vec<Event>) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        for e in &events {
            self.state.check(e)?;
        }
        let at = now();
        let stamped_events: Vec<(Timestamp, Event)> = events.into_iter().map(|e| (at, e)).collect();
        let journal = Arc::clone(&self.journal);
        let first = tokio::task::block_in_place(|| journal.append_all(&stamped_events)).map_err(
            |source| Error::JournalWrite {
                run: self.run_id.clone(),
                path: self.run_dir.join("journal"),
                source,
            },
        )?;
        for (i, (at, event)) in stamped_events.into_iter().enumerate() {
            let stamped = Stamped {
                seq: Seq(first.0 + i as u64),
                at,
                event,
            };
            self.state.apply(&stamped)?;
            if let Event::TaskFinished { task, .. } = &stamped.event {
                self.isolated.remove(task);
                self.setup_failed.remove(task);
                self.finalize_failed.remove(task);
            }
            if let Event::TaskFinished { result, .. } = &stamped.event {
                let fail_fast = self
                    .state
                    .batch
                    .as_ref()
                    .is_some_and(|b| b.config.fail_fast);
                self.fail_fast_tripped |= fail_fast
                    && matches!(result.state, TerminalState::Failed | TerminalState::Timeout);
            }
            self.sched.observe(&self.state, &stamped.event);
            self.observer.event(&self.state, &stamped);
            self.pause_after.1 |= self.pause_after.0.as_deref() == Some(stamped.event.name());
        }
        Ok(())
    }

    fn index_entry(&self, source: &str) -> Result<()> {
        let entry = sortie_journal::index::RunEntry {
            run_id: self.run_id.clone(),
            created: now(),
            source: source.to_owned(),
            tasks: 0,
            status: "running".to_owned(),
            pid: std::process::id(),
            updated: now(),
        };
        sortie_journal::index::write(&self.state_dir, &entry)?;
        Ok(())
    }

    fn update_index(&self) {
        let status = match &self.state.status {
            RunStatus::Finished { state } => state.to_string(),
            RunStatus::Interrupted { .. } => "interrupted".to_owned(),
            _ => "running".to_owned(),
        };
        let tasks = self.state.tasks.len() as u32;
        let updated = sortie_journal::index::update(&self.state_dir, &self.run_id, |e| {
            e.status = status;
            e.tasks = tasks;
            e.pid = std::process::id();
            e.updated = now();
        });
        if let Err(e) = updated {
            // The index only speeds up `list`; the journal stays the truth.
            tracing::warn!("could not update the run index: {e}");
        }
    }

    /// This run's incarnation (see [`MARKER`]).
    fn incarnation(&self) -> u64 {
        self.state.started_at.map_or(0, |t| t.0)
    }

    /// Resume's first duty: no process of a live attempt may survive, whether or not its pid
    /// made it to the journal. Each live attempt is then recorded as orphaned.
    async fn reap_orphans(&mut self) -> Result<()> {
        let plan = sortie_core::resume_plan(&self.state);
        let prefix = format!("{}/", self.run_id);
        let marked = process::find_marked(MARKER, &prefix);
        let grace = Duration::from_secs(3);
        let mut killed: HashMap<(TaskId, Attempt), bool> = HashMap::new();
        for m in &marked {
            let key = parse_marker(&m.marker_value, &self.run_id);
            if let Some((_, _, Some(other))) = key
                && other != self.incarnation()
            {
                continue;
            }
            let r = process::kill_group_if_same(m.pid, m.start_time, grace).await;
            if r == process::KillResult::Survived {
                return Err(Error::Survivor {
                    pid: m.pid,
                    run: self.run_id.clone(),
                });
            }
            if let Some((task, attempt, _)) = key {
                *killed.entry((task, attempt)).or_default() |= r == process::KillResult::Killed;
            }
        }
        let mut events = Vec::new();
        for o in &plan.orphans {
            let mut was_killed = killed.get(&(o.task, o.attempt)).copied().unwrap_or(false);
            if let (Some(pid), Some(st)) = (o.pid, o.start_time) {
                match process::kill_group_if_same(pid, st, grace).await {
                    process::KillResult::Killed => was_killed = true,
                    process::KillResult::Gone => {}
                    // Retrying while the old attempt still runs could do its work twice.
                    process::KillResult::Survived => {
                        return Err(Error::Survivor {
                            pid,
                            run: self.run_id.clone(),
                        });
                    }
                }
            }
            let action = if was_killed {
                OrphanAction::Killed
            } else {
                OrphanAction::Gone
            };
            events.push(Event::AttemptOrphaned {
                task: o.task,
                attempt: o.attempt,
                action,
            });
        }
        self.commit(events)
    }

    /// Runs the loop to its end. When the journal cannot be written (a full disk, a removed
    /// state dir), nothing more may happen that the journal does not hold: nothing more is
    /// launched, the live attempts' process groups are killed at once (their ends cannot be
    /// journaled: resume finds them orphaned and retries them), worktree jobs are dropped
    /// (resume redoes each step), and the error goes up to say so.
    async fn drive(mut self) -> Result<RunEnd> {
        match self.drive_loop().await {
            Ok(end) => Ok(self.end(end)),
            Err(e) => {
                if matches!(e, Error::JournalWrite { .. }) {
                    tracing::debug!("stopping on a journal failure: {e}");
                    self.abort_now();
                }
                Err(e)
            }
        }
    }

    async fn drive_loop(&mut self) -> Result<End> {
        self.update_index();
        let mut sigint = signal(SignalKind::interrupt()).map_err(|e| self.io(e))?;
        let mut sigterm = signal(SignalKind::terminate()).map_err(|e| self.io(e))?;
        let mut sigusr1 = signal(SignalKind::user_defined1()).map_err(|e| self.io(e))?;
        // Appends notice a removed journal; between them (agents silent for minutes), this does.
        let mut presence = tokio::time::interval(JOURNAL_CHECK);
        presence.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Plan and commit rounds until nothing more can happen without waiting.
            loop {
                if self.pause_after.1 {
                    std::future::pending::<()>().await;
                }
                let round = self.plan_round(now());
                if round.is_empty() {
                    break;
                }
                self.commit(round.events)?;
                for task in round.launch {
                    self.launch(task)?;
                }
                for (task, result) in round.write_artifacts {
                    self.write_artifact(task, result)?;
                }
                for (task, kind) in round.jobs {
                    self.start_job(task, kind);
                }
            }
            if self.state.all_finished() {
                let state = self.state.aggregate();
                let summary = sortie_core::summary_text(&self.state);
                self.commit(vec![Event::RunFinished { state, summary }])?;
                self.update_index();
                return Ok(End::Finished(state));
            }
            if self.stopping == Some(Stopping::Interrupt)
                && self.live.is_empty()
                && self.jobs.is_empty()
            {
                self.commit(vec![Event::RunInterrupted {
                    reason: "interrupted by a signal".into(),
                }])?;
                self.update_index();
                return Ok(End::Interrupted);
            }
            let wake = self.sched.next_wake(now());
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
                    while let Ok(m) = self.rx.try_recv() {
                        msgs.push(m);
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
                _ = sigusr1.recv() => self.stop_all(Stopping::Cancel),
                _ = presence.tick() => {
                    self.journal.check_present().map_err(|source| Error::JournalWrite {
                        run: self.run_id.clone(),
                        path: self.run_dir.join("journal"),
                        source,
                    })?;
                }
                msg = self.wt_rx.recv() => {
                    if let Some(msg) = msg {
                        self.handle_wt(msg).await?;
                    }
                }
            }
        }
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            path: self.run_dir.clone(),
            source,
        }
    }

    fn end(self, end: End) -> RunEnd {
        RunEnd {
            run_id: self.run_id,
            state: self.state,
            end,
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
    }

    /// A second Ctrl-C: kill every child's group without waiting, leave the rest to resume.
    fn abort_now(&mut self) {
        for h in self.live.values() {
            h.kill_now();
        }
        // Their git commands die with them; resume redoes each step from the journal.
        for (_, job) in self.jobs.drain() {
            job.handle.abort();
        }
    }

    /// Turns attempt reports into events: one round per distinct task, in arrival order.
    fn handle(&mut self, msgs: Vec<Msg>) -> Result<()> {
        let mut round: Vec<Event> = Vec::new();
        let mut in_round: BTreeSet<TaskId> = BTreeSet::new();
        for msg in msgs {
            let task = msg.task();
            if in_round.contains(&task) {
                self.commit(std::mem::take(&mut round))?;
                in_round.clear();
            }
            if let Msg::Finished { .. } = msg {
                self.live.remove(&task);
            }
            let Some(event) = self.event_for(msg) else {
                continue;
            };
            in_round.insert(task);
            round.push(event);
        }
        self.commit(round)
    }

    /// The event an attempt's report becomes; reports of an attempt that is not live anymore
    /// (fencing) are dropped.
    fn event_for(&self, msg: Msg) -> Option<Event> {
        let live = self
            .state
            .task(msg.task())
            .and_then(|r| r.live_attempt())
            .map(|a| a.attempt);
        if live != Some(msg.attempt()) {
            tracing::debug!(
                "dropping a report for attempt {} of task {}",
                msg.attempt(),
                msg.task()
            );
            return None;
        }
        Some(match msg {
            Msg::Started {
                task,
                attempt,
                pid,
                start_time,
            } => Event::AttemptStarted {
                task,
                attempt,
                pid,
                start_time,
            },
            Msg::Progress {
                task,
                attempt,
                usage,
            } => {
                let last = self.state.task(task)?.attempts.last()?.usage;
                Event::AttemptProgress {
                    task,
                    attempt,
                    usage: usage.max(&last),
                }
            }
            Msg::Stalled { task, attempt } => Event::AttemptStalled { task, attempt },
            Msg::SideEffects { task, attempt } => {
                if self.state.task(task)?.attempts.last()?.side_effects {
                    return None;
                }
                Event::AttemptSideEffects { task, attempt }
            }
            Msg::Finished {
                task,
                attempt,
                outcome,
                usage,
                output,
            } => {
                let last = self.state.task(task)?.attempts.last()?.usage;
                Event::AttemptFinished {
                    task,
                    attempt,
                    outcome,
                    usage: attempt::final_usage(usage, &last),
                    output,
                }
            }
        })
    }

    /// Plans one round: at most one event per task, all checked against the current state.
    fn plan_round(&mut self, now: Timestamp) -> Round {
        let mut round = Round::default();
        let Some(batch) = self.state.batch.as_ref() else {
            return round;
        };
        let cancelling = self.stopping == Some(Stopping::Cancel);
        let interrupting = self.stopping == Some(Stopping::Interrupt);
        let no_launch = self.stopping.is_some() || self.fail_fast_tripped;
        let mut used: BTreeSet<TaskId> = BTreeSet::new();

        // Tasks whose last attempt ended: retry, or write the artifact, or finish.
        for task in self.sched.ended.clone() {
            let Some(rec) = self.state.task(task) else {
                continue;
            };
            let Some(spec) = self.state.spec(task) else {
                continue;
            };
            if !matches!(rec.state, TaskState::Ended { .. }) {
                self.sched.ended.remove(&task);
                continue;
            }
            if self.jobs.contains_key(&task) {
                // Its worktree is being finalized.
                used.insert(task);
                continue;
            }
            let jitter = jitter(&self.run_id, task, rec.attempts.len() as u32);
            let step = sortie_core::next_step(spec, rec, now, jitter);
            let event = match step {
                NextStep::Retry {
                    attempt,
                    model,
                    delay,
                    reason,
                } if !no_launch && rec.worktree_final.is_none() => Event::RetryScheduled {
                    task,
                    next_attempt: attempt,
                    model,
                    delay,
                    reason,
                },
                // Left undecided on purpose: resume decides, seeing the interruption.
                NextStep::Retry { .. } if interrupting => continue,
                NextStep::Retry { .. } => {
                    let mut result = sortie_core::finish_result(
                        rec,
                        &rec.attempts
                            .last()
                            .and_then(|a| a.outcome())
                            .unwrap_or_else(|| {
                                sortie_core::AttemptOutcome::failed(
                                    StopReason::Cancelled,
                                    "cancelled",
                                )
                            }),
                        rec.attempts
                            .last()
                            .and_then(|a| a.output())
                            .unwrap_or_default(),
                    );
                    result.state = TerminalState::Cancelled;
                    result.stop_reason = StopReason::Cancelled;
                    // Say why the task ends here, not only why its last attempt ended.
                    let why = if cancelling {
                        "cancelled"
                    } else {
                        "cancelled: not retried after a failure (fail_fast)"
                    };
                    result.error = Some(match result.error.take() {
                        Some(e) => format!("{why} (last attempt: {e})"),
                        None => why.to_owned(),
                    });
                    used.insert(task);
                    match end_event(task, rec, result, &self.finalize_failed) {
                        Some(e) => round.events.push(e),
                        None => round.jobs.push((task, JobKind::Finalize)),
                    }
                    continue;
                }
                NextStep::GiveUp(result) => {
                    // fail_fast: nothing launches in the round that decides a failure (the
                    // flag is set again when its TaskFinished is applied).
                    self.fail_fast_tripped |= batch.config.fail_fast
                        && matches!(result.state, TerminalState::Failed | TerminalState::Timeout);
                    if spec.output.is_some() && rec.artifact.is_none() {
                        // Write-ahead: the attempt's end is durable; the artifact comes next,
                        // and the task's end only after it.
                        used.insert(task);
                        round.write_artifacts.push((task, result));
                        continue;
                    }
                    used.insert(task);
                    match end_event(task, rec, result, &self.finalize_failed) {
                        Some(e) => round.events.push(e),
                        None => round.jobs.push((task, JobKind::Finalize)),
                    }
                    continue;
                }
            };
            used.insert(task);
            round.events.push(event);
        }

        // Worktrees of waiting tasks: set up (plan, create, or re-create a missing one), end a
        // task whose setup failed, finalize before cancellation, fail_fast or a deadline ends a
        // task (the section below ends those without a worktree), and end a task whose
        // worktree a crash left finalized.
        // Set up and about to launch: they hold their slots too.
        let ready = self
            .isolated
            .iter()
            .filter(|t| !self.jobs.contains_key(t))
            .filter_map(|t| self.state.task(*t))
            .filter(|r| {
                matches!(r.state, TaskState::Queued { .. })
                    && r.worktree_final.is_none()
                    && worktree_ready(r)
            })
            .count();
        let mut setup_slots = (batch.config.concurrency as usize)
            .saturating_sub(self.live.len() + self.setup_jobs() + ready);
        let mut new_setups = 0;
        for &task in &self.isolated {
            if used.contains(&task) || self.jobs.contains_key(&task) {
                continue;
            }
            let Some(rec) = self.state.task(task) else {
                continue;
            };
            let Some(spec) = self.state.spec(task) else {
                continue;
            };
            if !matches!(
                rec.state,
                TaskState::Queued { .. } | TaskState::Retrying { .. }
            ) {
                continue;
            }
            let expired =
                matches!((spec.deadline, rec.ready_at), (Some(d), Some(r)) if now >= r.plus(d));
            let ending = cancelling || self.fail_fast_tripped || expired;
            let failed = self.setup_failed.contains_key(&task);
            if rec.worktree_final.is_some() || (rec.worktree.is_none() && failed) {
                used.insert(task);
                let result = self.waiting_result(task, rec, now, cancelling);
                round.events.push(Event::TaskFinished { task, result });
                continue;
            }
            if failed || ending {
                if rec.worktree.is_none() {
                    continue; // nothing to finalize: the section below ends it
                }
                used.insert(task);
                let result = self.waiting_result(task, rec, now, cancelling);
                match end_event(task, rec, result, &self.finalize_failed) {
                    Some(e) => round.events.push(e),
                    None => round.jobs.push((task, JobKind::Finalize)),
                }
                continue;
            }
            if no_launch || self.fail_fast_tripped || setup_slots == 0 {
                continue;
            }
            let kind = match &rec.worktree {
                None => JobKind::Plan,
                Some(_) if rec.setup.is_none() => JobKind::Create,
                Some(p) if !Path::new(&p.path).exists() => JobKind::Create,
                Some(_) => continue,
            };
            used.insert(task);
            round.jobs.push((task, kind));
            setup_slots -= 1;
            new_setups += 1;
        }

        // Pending tasks whose dependencies all ended.
        for task in std::mem::take(&mut self.sched.check_pending) {
            let Some(rec) = self.state.task(task) else {
                continue;
            };
            if rec.state != TaskState::Pending || used.contains(&task) {
                continue;
            }
            let Some(spec) = self.state.spec(task) else {
                continue;
            };
            if cancelling || self.fail_fast_tripped {
                used.insert(task);
                round.events.push(cancelled(task, cancelling));
                continue;
            }
            let mut blocked = None;
            let mut waiting = false;
            for need in &spec.needs {
                let Some(dep) = self.state.task_by_label(need) else {
                    continue;
                };
                match self.state.task(dep).map(|r| &r.state) {
                    Some(TaskState::Finished(r)) if r.state == TerminalState::Completed => {}
                    Some(TaskState::Finished(r)) => blocked = Some((need.clone(), r.state)),
                    _ => waiting = true,
                }
            }
            let event = match (blocked, waiting) {
                (Some((need, st)), _) => Event::TaskFinished {
                    task,
                    result: result_without_attempt(
                        TerminalState::Skipped,
                        StopReason::Cancelled,
                        None,
                        &format!("skipped: dependency {need:?} did not complete ({st})"),
                    ),
                },
                (None, true) => continue,
                (None, false) if interrupting => continue,
                (None, false) => Event::TaskQueued { task },
            };
            used.insert(task);
            round.events.push(event);
        }

        // Waiting tasks: cancellation and fail_fast end them all; deadlines end the expired.
        let waiting: Vec<(TaskId, Phase)> = if cancelling || self.fail_fast_tripped {
            self.sched
                .all_waiting()
                .map(|t| (t, Phase::Queued))
                .collect()
        } else {
            self.sched.expired(&self.state, now)
        };
        for (task, phase) in waiting {
            if used.contains(&task) || self.jobs.contains_key(&task) {
                continue;
            }
            let Some(rec) = self.state.task(task) else {
                continue;
            };
            let event = if cancelling || self.fail_fast_tripped {
                cancelled(task, cancelling)
            } else {
                let output = rec
                    .attempts
                    .last()
                    .and_then(|a| a.output())
                    .unwrap_or_default();
                Event::TaskFinished {
                    task,
                    result: deadline_result(rec, phase, output),
                }
            };
            used.insert(task);
            round.events.push(event);
        }

        // Launches, oldest first, up to the concurrency limit.
        if !no_launch && !self.fail_fast_tripped {
            let limit = batch.config.concurrency as usize;
            let setups = self.setup_jobs() + new_setups;
            let mut free = limit.saturating_sub(self.live.len() + setups);
            for task in self
                .sched
                .launchable(now, free + used.len() + self.jobs.len())
            {
                if free == 0 {
                    break;
                }
                if used.contains(&task) {
                    continue;
                }
                let Some(rec) = self.state.task(task) else {
                    continue;
                };
                let Some(spec) = self.state.spec(task) else {
                    continue;
                };
                if spec.isolation == Isolation::Worktree && !worktree_ready(rec) {
                    continue; // set up by the section above
                }
                let (attempt, model) = match &rec.state {
                    TaskState::Queued { .. } => {
                        let a = Attempt(rec.attempts.len() as u32 + 1);
                        (a, sortie_core::model_for_attempt(spec, a))
                    }
                    TaskState::Retrying { next, model, .. } => (*next, model.clone()),
                    _ => continue,
                };
                used.insert(task);
                round.events.push(Event::AttemptLaunching {
                    task,
                    attempt,
                    model,
                });
                round.launch.push(task);
                free -= 1;
            }
        }
        round
    }

    /// Indexes the unfinished tasks with `isolation = "worktree"`.
    fn rebuild_isolated(&mut self) {
        let Some(batch) = &self.state.batch else {
            return;
        };
        self.isolated = batch
            .tasks
            .iter()
            .enumerate()
            .map(|(i, spec)| (TaskId(i as u32), spec))
            .filter(|(t, spec)| {
                spec.isolation == Isolation::Worktree
                    && self.state.task(*t).is_some_and(|r| !r.state.is_terminal())
            })
            .map(|(t, _)| t)
            .collect();
    }

    /// Setup jobs in flight: each holds a concurrency slot.
    fn setup_jobs(&self) -> usize {
        self.jobs
            .values()
            .filter(|j| j.kind != JobKind::Finalize)
            .count()
    }

    /// How a waiting (queued or retrying) task with a worktree ends: its deadline, its failed
    /// setup, cancellation or fail_fast; a task whose worktree a crash left finalized ends as
    /// cancelled.
    fn waiting_result(
        &self,
        task: TaskId,
        rec: &TaskRecord,
        now: Timestamp,
        cancelling: bool,
    ) -> TaskResult {
        let expired = match (self.state.spec(task).and_then(|s| s.deadline), rec.ready_at) {
            (Some(d), Some(ready)) => now >= ready.plus(d),
            _ => false,
        };
        if expired {
            let output = rec
                .attempts
                .last()
                .and_then(|a| a.output())
                .unwrap_or_default();
            let phase = if rec.attempts.is_empty() && rec.worktree.is_none() {
                Phase::Queued
            } else {
                Phase::Starting
            };
            return deadline_result(rec, phase, output);
        }
        if let Some(why) = self.setup_failed.get(&task) {
            return result_without_attempt(
                TerminalState::Failed,
                StopReason::SetupError,
                None,
                &format!("worktree setup failed: {why}"),
            );
        }
        match cancelled(task, cancelling || !self.fail_fast_tripped) {
            Event::TaskFinished { result, .. } => result,
            _ => result_without_attempt(
                TerminalState::Cancelled,
                StopReason::Cancelled,
                None,
                "cancelled",
            ),
        }
    }

    /// Starts a worktree job for a task; its report comes back through `wt_rx`.
    fn start_job(&mut self, task: TaskId, kind: JobKind) {
        let (Some(spec), Some(rec)) = (self.state.spec(task), self.state.task(task)) else {
            return;
        };
        let tx = self.wt_tx.clone();
        // Setup counts against the task's deadline; a finalize always runs to its end.
        let budget = match (spec.deadline, rec.ready_at) {
            (Some(d), Some(ready)) => ready.plus(d).since(now()),
            _ => Duration::MAX,
        };
        let handle = match (kind, rec.worktree.clone()) {
            (JobKind::Plan, _) => {
                let state_dir =
                    std::fs::canonicalize(&self.state_dir).unwrap_or(self.state_dir.clone());
                let (path, branch) =
                    worktree::location(&state_dir, self.run_id.as_str(), &spec.label, task.0);
                let scratch = path.with_extension("index.tmp");
                let cwd = PathBuf::from(&spec.cwd);
                let wip = spec.include_wip;
                let fut = async move {
                    worktree::plan(&cwd, &path, &branch, wip, &scratch, &state_dir)
                        .await
                        .map_err(|e| e.to_string())
                };
                tokio::spawn(async move {
                    let _ = tx.send(WtMsg::Planned(task, within(budget, fut).await));
                })
            }
            (JobKind::Create, Some(plan)) => {
                let fut = async move { worktree::create(&plan).await.map_err(|e| e.to_string()) };
                tokio::spawn(async move {
                    let _ = tx.send(WtMsg::Created(task, within(budget, fut).await));
                })
            }
            (JobKind::Finalize, Some(plan)) => {
                let patch = worktree::patch_path(&self.run_dir, &spec.label, task.0);
                tokio::spawn(async move {
                    let r = worktree::finalize(&plan, &patch)
                        .await
                        .map_err(|e| e.to_string());
                    let _ = tx.send(WtMsg::Finalized(task, r));
                })
            }
            (JobKind::Create | JobKind::Finalize, None) => return,
        };
        self.jobs.insert(task, Job { kind, handle });
    }

    /// Turns a worktree job's report into its event (checked first: a report that no longer
    /// fits the state is dropped), or records why the step failed.
    async fn handle_wt(&mut self, msg: WtMsg) -> Result<()> {
        let (task, event) = match msg {
            WtMsg::Planned(task, Ok(plan)) => (
                task,
                Event::WorktreePlanned {
                    task,
                    repo: plan.repo,
                    path: plan.path,
                    branch: plan.branch,
                    base: plan.base,
                },
            ),
            WtMsg::Created(task, Ok(())) => {
                self.jobs.remove(&task);
                let Some(rec) = self.state.task(task) else {
                    return Ok(());
                };
                if rec.setup.is_some() {
                    return Ok(()); // a missing worktree was made again
                }
                let worktree = rec.worktree.as_ref().map(|p| p.path.clone());
                (task, Event::TaskSetUp { task, worktree })
            }
            WtMsg::Finalized(task, Ok(f)) => {
                if self.pause_after.0.as_deref() == Some("before:WorktreeFinalized") {
                    std::future::pending::<()>().await;
                }
                (
                    task,
                    Event::WorktreeFinalized {
                        task,
                        changed: f.changed,
                        diff: f.diff,
                    },
                )
            }
            WtMsg::Planned(task, Err(why)) | WtMsg::Created(task, Err(why)) => {
                tracing::warn!("worktree setup of task {task} failed: {why}");
                self.jobs.remove(&task);
                self.setup_failed.insert(task, why);
                return Ok(());
            }
            WtMsg::Finalized(task, Err(why)) => {
                tracing::warn!("worktree finalize of task {task} failed: {why}");
                self.jobs.remove(&task);
                self.finalize_failed.insert(task, why);
                return Ok(());
            }
        };
        self.jobs.remove(&task);
        match self.state.check(&event) {
            Ok(()) => self.commit(vec![event]),
            Err(v) => {
                tracing::warn!("dropping a worktree report: {v}");
                Ok(())
            }
        }
    }

    /// Spawns the attempt that was just journaled as launching. An attempt that continues an
    /// interrupted attempt's session has `AttemptContinues` journaled first.
    fn launch(&mut self, task: TaskId) -> Result<()> {
        let Some((ctx, continues)) = self.attempt_ctx(task) else {
            return Ok(());
        };
        if let Some(session) = continues {
            self.commit(vec![Event::AttemptContinues {
                task,
                attempt: ctx.attempt,
                session,
            }])?;
        }
        let handle = attempt::start(ctx, self.tx.clone());
        self.live.insert(task, handle);
        Ok(())
    }

    fn attempt_ctx(&self, task: TaskId) -> Option<(AttemptCtx, Option<String>)> {
        let batch = self.state.batch.as_ref()?;
        let spec = self.state.spec(task)?;
        let rec = self.state.task(task)?;
        let live = rec.live_attempt()?;
        let prompt_text = prompt::render(&self.state, task);
        let cwd = match (&spec.isolation, &rec.worktree) {
            (Isolation::Worktree, Some(plan)) => worktree::agent_cwd(plan, &spec.cwd),
            _ => PathBuf::from(&spec.cwd),
        };
        let profile_name = if spec.command.is_some() {
            "command"
        } else {
            spec.agent.as_str()
        };
        let profile = batch
            .agents
            .get(profile_name)
            .or_else(|| batch.agents.get(&spec.agent))?;
        let env = self.env.get(task.index()).cloned().unwrap_or_default();
        // The agent the profile speaks (none for a task's own command) shapes the launch: its
        // prompt, session, stdin drive and per-attempt home (see `agent`).
        let plan = agent::launch_plan(
            &agent::LaunchInput {
                profile,
                spec,
                rec,
                task,
                live,
                run_dir: &self.run_dir,
                cwd: &cwd,
                env: &env,
            },
            prompt_text,
        );
        let prior = sortie_core::Usage::sum(
            rec.attempts[..rec.attempts.len().saturating_sub(1)]
                .iter()
                .map(|a| &a.usage),
        );
        let deadline_at = match (spec.deadline, rec.ready_at) {
            (Some(d), Some(ready)) => Some(ready.plus(d)),
            _ => None,
        };
        let continues = plan.continues.clone();
        Some((
            AttemptCtx {
                task,
                attempt: live.attempt,
                launch: plan,
                cwd,
                env,
                marker: (
                    MARKER.to_owned(),
                    format!(
                        "{}/{}/{}/{:x}",
                        self.run_id,
                        task.0,
                        live.attempt.0,
                        self.incarnation()
                    ),
                ),
                stderr_log: self
                    .run_dir
                    .join("logs")
                    .join(format!("{}.{}.stderr", task.0, live.attempt.0)),
                limits: attempt::Limits {
                    attempt_timeout: spec.attempt_timeout,
                    deadline_at,
                    stall_after: spec.stall_after,
                    stall_kill_after: spec.stall_kill_after,
                    max_turns: spec.max_turns,
                    max_tokens: spec.max_tokens,
                    max_cost_nanos: spec.max_cost_nanos,
                    grace_turns: spec.grace_turns,
                    prior,
                },
                kill_grace: spec.kill_grace,
            },
            continues,
        ))
    }

    /// Writes a finished task's artifact atomically, then journals it. A failed write ends the
    /// task at once with the failure in its result (completed becomes partial): it is the
    /// task's outcome, not an error of the run.
    fn write_artifact(&mut self, task: TaskId, mut result: sortie_core::TaskResult) -> Result<()> {
        let Some(path) = self.state.spec(task).and_then(|s| s.output.clone()) else {
            return Ok(());
        };
        let text = result.text.clone();
        let path_buf = PathBuf::from(&path);
        let written = match path_buf.parent() {
            Some(dir) => std::fs::create_dir_all(dir).map_err(|source| Error::Io {
                path: dir.to_path_buf(),
                source,
            }),
            None => Ok(()),
        }
        .and_then(|()| statedir::write_atomic(&path_buf, text.as_bytes(), 0o644));
        match written {
            Ok(()) => self.commit(vec![Event::ArtifactWritten {
                task,
                path,
                bytes: text.len() as u64,
                digest: fnv1a(text.as_bytes()),
            }]),
            Err(e) => {
                if result.state == TerminalState::Completed {
                    result.state = TerminalState::Partial;
                }
                result.error = Some(format!("Artifact write failed: {e}"));
                self.commit(vec![Event::TaskFinished { task, result }])
            }
        }
    }
}

/// A task that never (re)started, cancelled by `sortie cancel` or by `fail_fast`.
fn cancelled(task: TaskId, by_user: bool) -> Event {
    let why = if by_user {
        "cancelled"
    } else {
        "cancelled: not started after a failure (fail_fast)"
    };
    Event::TaskFinished {
        task,
        result: result_without_attempt(TerminalState::Cancelled, StopReason::Cancelled, None, why),
    }
}

/// One round of events, and the side effects to perform once they are durable.
#[derive(Default)]
struct Round {
    events: Vec<Event>,
    launch: Vec<TaskId>,
    write_artifacts: Vec<(TaskId, sortie_core::TaskResult)>,
    /// Worktree jobs to start.
    jobs: Vec<(TaskId, JobKind)>,
}

impl Round {
    fn is_empty(&self) -> bool {
        self.events.is_empty()
            && self.launch.is_empty()
            && self.write_artifacts.is_empty()
            && self.jobs.is_empty()
    }
}

/// Runs a setup step within the task's deadline (dropping it kills its git command).
async fn within<T>(
    budget: Duration,
    fut: impl std::future::Future<Output = std::result::Result<T, String>>,
) -> std::result::Result<T, String> {
    match tokio::time::timeout(budget, fut).await {
        Ok(r) => r,
        Err(_) => Err("the task's deadline ran out during worktree setup".to_owned()),
    }
}

/// Whether an isolated task's worktree is planned, set up, and there.
fn worktree_ready(rec: &TaskRecord) -> bool {
    match &rec.worktree {
        Some(plan) => rec.setup.is_some() && Path::new(&plan.path).exists(),
        None => false,
    }
}

/// The event that ends a task with `result`, or `None` when its worktree must be finalized
/// first. A finalize that failed leaves the worktree as it is (kept) and says so in the
/// result: a completed task becomes partial.
fn end_event(
    task: TaskId,
    rec: &TaskRecord,
    mut result: TaskResult,
    finalize_failed: &HashMap<TaskId, String>,
) -> Option<Event> {
    if rec.worktree.is_some() && rec.worktree_final.is_none() {
        let why = finalize_failed.get(&task)?;
        if result.state == TerminalState::Completed {
            result.state = TerminalState::Partial;
        }
        let msg = format!("Worktree finalize failed (the worktree is kept): {why}");
        result.error = Some(match result.error.take() {
            Some(e) => format!("{e}; {msg}"),
            None => msg,
        });
    }
    Some(Event::TaskFinished { task, result })
}

/// Indexes over the state that let a round avoid scanning every task. They are caches: rebuilt
/// from the state on start and resume, and kept current by observing each applied event.
#[derive(Default)]
struct Sched {
    /// Tasks in `Queued`, by (ready time, id): FIFO launch order.
    queued: BTreeSet<(Timestamp, TaskId)>,
    /// Tasks in `Retrying`, by (not before, id).
    retrying: BTreeSet<(Timestamp, TaskId)>,
    /// Tasks in `Ended`.
    ended: BTreeSet<TaskId>,
    /// Pending tasks to look at (their dependencies may have ended).
    check_pending: Vec<TaskId>,
    /// Dependents of each task.
    dependents: Vec<Vec<TaskId>>,
    /// Deadlines of tasks that have one, by (deadline, id).
    deadlines: BTreeSet<(Timestamp, TaskId)>,
}

impl Sched {
    fn rebuild(&mut self, state: &RunState) {
        *self = Sched::default();
        let Some(batch) = &state.batch else { return };
        self.dependents = vec![Vec::new(); batch.tasks.len()];
        for (i, spec) in batch.tasks.iter().enumerate() {
            for need in &spec.needs {
                if let Some(dep) = state.task_by_label(need) {
                    self.dependents[dep.index()].push(TaskId(i as u32));
                }
            }
        }
        for i in 0..state.tasks.len() {
            self.index_task(state, TaskId(i as u32));
        }
    }

    /// Indexes a task that is in no index yet (`rebuild` starts from empty ones: removing it
    /// first would scan every index once per task, quadratic in a 100,000-task resume).
    fn index_task(&mut self, state: &RunState, task: TaskId) {
        let Some(rec) = state.task(task) else { return };
        match &rec.state {
            TaskState::Pending => self.check_pending.push(task),
            TaskState::Queued { since } => {
                self.queued.insert((*since, task));
            }
            TaskState::Retrying { not_before, .. } => {
                self.retrying.insert((*not_before, task));
            }
            TaskState::Ended { .. } => {
                self.ended.insert(task);
            }
            TaskState::Running { .. } | TaskState::Finished(_) => {}
        }
        if let (Some(d), Some(ready), false) = (
            state.spec(task).and_then(|s| s.deadline),
            rec.ready_at,
            rec.state.is_terminal(),
        ) {
            self.deadlines.insert((ready.plus(d), task));
        }
    }

    fn observe(&mut self, state: &RunState, event: &Event) {
        let Some(task) = event.task() else { return };
        // Keep the indexes cheap: only the task's own entries move.
        let Some(rec) = state.task(task) else { return };
        match &rec.state {
            TaskState::Queued { since } if matches!(event, Event::TaskQueued { .. }) => {
                self.queued.insert((*since, task));
                if let (Some(d), Some(ready)) =
                    (state.spec(task).and_then(|s| s.deadline), rec.ready_at)
                {
                    self.deadlines.insert((ready.plus(d), task));
                }
            }
            TaskState::Running { .. } if matches!(event, Event::AttemptLaunching { .. }) => {
                self.queued.retain(|&(_, t)| t != task);
                self.retrying.retain(|&(_, t)| t != task);
            }
            TaskState::Ended { .. } => {
                self.ended.insert(task);
            }
            TaskState::Retrying { not_before, .. } => {
                self.ended.remove(&task);
                self.retrying.insert((*not_before, task));
            }
            TaskState::Finished(_) => {
                self.queued.retain(|&(_, t)| t != task);
                self.retrying.retain(|&(_, t)| t != task);
                self.ended.remove(&task);
                self.deadlines.retain(|&(_, t)| t != task);
                if let Some(deps) = self.dependents.get(task.index()) {
                    self.check_pending.extend(deps.iter().copied());
                }
            }
            _ => {}
        }
    }

    /// Queued and retrying tasks whose deadline passed, with the phase it hit them in.
    fn expired(&self, state: &RunState, now: Timestamp) -> Vec<(TaskId, Phase)> {
        let mut out: Vec<(TaskId, Phase)> = Vec::new();
        let expired = self
            .deadlines
            .iter()
            .take_while(|(d, _)| *d <= now)
            .map(|&(_, t)| t);
        for task in expired {
            match state.task(task).map(|r| &r.state) {
                Some(TaskState::Queued { .. }) => {
                    // A worktree being set up counts as starting.
                    let started = state
                        .task(task)
                        .is_some_and(|r| !r.attempts.is_empty() || r.worktree.is_some());
                    out.push((
                        task,
                        if started {
                            Phase::Starting
                        } else {
                            Phase::Queued
                        },
                    ));
                }
                Some(TaskState::Retrying { .. }) => out.push((task, Phase::Starting)),
                _ => {}
            }
        }
        out
    }

    /// Same, for cancellation and fail_fast: every queued or retrying task.
    fn all_waiting(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.queued
            .iter()
            .chain(self.retrying.iter())
            .map(|&(_, t)| t)
    }

    /// Tasks that may launch now, oldest first.
    fn launchable(&self, now: Timestamp, n: usize) -> Vec<TaskId> {
        let mut out: Vec<(Timestamp, TaskId)> = self.queued.iter().take(n).copied().collect();
        out.extend(
            self.retrying
                .iter()
                .take_while(|(t, _)| *t <= now)
                .take(n)
                .copied(),
        );
        out.sort();
        out.into_iter().take(n).map(|(_, t)| t).collect()
    }

    /// The next future time something falls due (a retry or a deadline). Times already past
    /// need no timer: a due retry waits for a free slot, which comes with an attempt's report,
    /// and an expired deadline of a waiting task was handled by the last round (a running
    /// task's deadline is its attempt's own timer).
    fn next_wake(&self, now: Timestamp) -> Option<Timestamp> {
        let after = |set: &BTreeSet<(Timestamp, TaskId)>| {
            set.range((Timestamp(now.0.saturating_add(1)), TaskId(0))..)
                .next()
                .map(|&(t, _)| t)
        };
        match (after(&self.retrying), after(&self.deadlines)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Reads a [`MARKER`] value of run `run`: task, attempt, and the incarnation when present.
fn parse_marker(value: &str, run: &RunId) -> Option<(TaskId, Attempt, Option<u64>)> {
    let rest = value.strip_prefix(run.as_str())?.strip_prefix('/')?;
    let mut parts = rest.split('/');
    let task = parts.next()?.parse().ok()?;
    let attempt = parts.next()?.parse().ok()?;
    let incarnation = match parts.next() {
        Some(i) => Some(u64::from_str_radix(i, 16).ok()?),
        None => None,
    };
    Some((TaskId(task), Attempt(attempt), incarnation))
}

/// A deterministic jitter seed for a task's retry.
fn jitter(run: &RunId, task: TaskId, attempt: u32) -> u64 {
    let mut bytes = run.as_str().as_bytes().to_vec();
    bytes.extend_from_slice(&task.0.to_le_bytes());
    bytes.extend_from_slice(&attempt.to_le_bytes());
    fnv1a(&bytes)
}

/// FNV-1a 64: a small stable digest (not cryptographic).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

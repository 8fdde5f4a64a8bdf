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

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sortie_core::decide::{deadline_result, result_without_attempt};
use sortie_core::{
    Attempt, Event, NextStep, OrphanAction, Phase, RunId, RunOutcome, RunState, RunStatus, Seq,
    Stamped, StopReason, TaskId, TaskState, TerminalState, Timestamp,
};
use sortie_journal::Journal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::attempt::{self, AttemptCtx, AttemptHandle, Msg, StopRequest};
use crate::batch::LoadedBatch;
use crate::statedir::{self, OwnerLock, now};
use crate::{Error, Result, process, prompt};

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
pub const TEST_PAUSE_AFTER: &str = "SORTIE_TEST_PAUSE_AFTER";

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
    if how == Takeover::Cancel {
        engine.stopping = Some(Stopping::Cancel);
    }
    engine.drive().await
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
        Engine {
            state_dir: state_dir.to_path_buf(),
            run_id,
            run_dir,
            journal: Arc::new(journal),
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
        let first = tokio::task::block_in_place(|| journal.append_all(&stamped_events))?;
        for (i, (at, event)) in stamped_events.into_iter().enumerate() {
            let stamped = Stamped {
                seq: Seq(first.0 + i as u64),
                at,
                event,
            };
            self.state.apply(&stamped)?;
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

    async fn drive(mut self) -> Result<RunEnd> {
        self.update_index();
        let mut sigint = signal(SignalKind::interrupt()).map_err(|e| self.io(e))?;
        let mut sigterm = signal(SignalKind::terminate()).map_err(|e| self.io(e))?;
        let mut sigusr1 = signal(SignalKind::user_defined1()).map_err(|e| self.io(e))?;
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
                    self.launch(task);
                }
                for (task, result) in round.write_artifacts {
                    self.write_artifact(task, result)?;
                }
            }
            if self.state.all_finished() {
                let state = self.state.aggregate();
                let summary = sortie_core::summary_text(&self.state);
                self.commit(vec![Event::RunFinished { state, summary }])?;
                self.update_index();
                return Ok(self.end(End::Finished(state)));
            }
            if self.stopping == Some(Stopping::Interrupt) && self.live.is_empty() {
                self.commit(vec![Event::RunInterrupted {
                    reason: "interrupted by a signal".into(),
                }])?;
                self.update_index();
                return Ok(self.end(End::Interrupted));
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
                        return Ok(self.end(End::Interrupted));
                    }
                    self.stop_all(Stopping::Interrupt);
                }
                _ = sigterm.recv() => self.stop_all(Stopping::Interrupt),
                _ = sigusr1.recv() => self.stop_all(Stopping::Cancel),
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
                    usage: usage.max(&last),
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
            let jitter = jitter(&self.run_id, task, rec.attempts.len() as u32);
            let step = sortie_core::next_step(spec, rec, now, jitter);
            let event = match step {
                NextStep::Retry {
                    attempt,
                    model,
                    delay,
                    reason,
                } if !no_launch => Event::RetryScheduled {
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
                    Event::TaskFinished { task, result }
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
                    Event::TaskFinished { task, result }
                }
            };
            used.insert(task);
            round.events.push(event);
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
            if used.contains(&task) {
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
            let mut free = limit.saturating_sub(self.live.len());
            for task in self.sched.launchable(now, free + used.len()) {
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

    /// Spawns the attempt that was just journaled as launching.
    fn launch(&mut self, task: TaskId) {
        let Some(ctx) = self.attempt_ctx(task) else {
            return;
        };
        let handle = attempt::start(ctx, self.tx.clone());
        self.live.insert(task, handle);
    }

    fn attempt_ctx(&self, task: TaskId) -> Option<AttemptCtx> {
        let batch = self.state.batch.as_ref()?;
        let spec = self.state.spec(task)?;
        let rec = self.state.task(task)?;
        let live = rec.live_attempt()?;
        let prompt_text = prompt::render(&self.state, task);
        let vars = process::Vars {
            prompt: prompt_text,
            model: live.model.clone(),
            cwd: spec.cwd.clone(),
            attempt: live.attempt.0,
            label: spec.label.clone(),
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
        let argv = process::render_argv(profile, spec.command.as_deref(), &vars);
        let prior = sortie_core::Usage::sum(
            rec.attempts[..rec.attempts.len().saturating_sub(1)]
                .iter()
                .map(|a| &a.usage),
        );
        let deadline_at = match (spec.deadline, rec.ready_at) {
            (Some(d), Some(ready)) => Some(ready.plus(d)),
            _ => None,
        };
        Some(AttemptCtx {
            task,
            attempt: live.attempt,
            argv,
            cwd: PathBuf::from(&spec.cwd),
            env: self.env.get(task.index()).cloned().unwrap_or_default(),
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
            protocol: if spec.command.is_some() {
                sortie_core::Protocol::Plain
            } else {
                profile.protocol
            },
            attempt_timeout: spec.attempt_timeout,
            deadline_at,
            stall_after: spec.stall_after,
            stall_kill_after: spec.stall_kill_after,
            kill_grace: spec.kill_grace,
            max_turns: spec.max_turns,
            max_tokens: spec.max_tokens,
            max_cost_nanos: spec.max_cost_nanos,
            prior,
        })
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
}

impl Round {
    fn is_empty(&self) -> bool {
        self.events.is_empty() && self.launch.is_empty() && self.write_artifacts.is_empty()
    }
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

    fn index_task(&mut self, state: &RunState, task: TaskId) {
        let Some(rec) = state.task(task) else { return };
        self.queued.retain(|&(_, t)| t != task);
        self.retrying.retain(|&(_, t)| t != task);
        self.ended.remove(&task);
        self.deadlines.retain(|&(_, t)| t != task);
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
                    let started = state.task(task).is_some_and(|r| !r.attempts.is_empty());
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

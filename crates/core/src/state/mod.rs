//! The run and task state machine: `RunState::apply` folds events into state, refusing any
//! illegal transition with a [`Violation`] and leaving the state untouched when it does.
//!
//! Per task, events follow the grammar
//! `Queued Planned? SetUp? (Launching Continues? Started? (Stalled | Progress | SideEffects)*
//! (Finished | Orphaned) Retry?)* Artifact? Worktree? Finished`, with at most one
//! `SideEffects` per attempt, with `Finished` alone allowed from pending (skipped, cancelled) and
//! nothing after it. A planned worktree must be set up before an attempt launches; it may be
//! finalized without having been set up (a setup that failed or was cut short). Attempt reports carry their attempt number and are refused when that
//! attempt is not the live one (fencing).

use serde::{Deserialize, Serialize};

mod apply;
mod check;
mod compact;
mod outcome_record;
mod placed;
mod rare;

pub use outcome_record::OutcomeRecord;
pub(crate) use placed::Interner;
pub use placed::{Found, Placed};

use rare::Rare;

use crate::event::{BudgetLimit, ControlAction, DiscardedBy, Event, OrphanAction, Stamped};
use crate::ids::{Attempt, RunId, Seq, TaskId, Timestamp};
use crate::outcome::{AttemptOutcome, RunOutcome, StopReason, TaskResult, aggregate};
use crate::spec::{Batch, TaskSpec};
use crate::usage::Usage;

/// Where a run stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    /// No `RunStarted` yet.
    NotStarted,
    /// A process owns the run (or owned it when it died: the journal cannot tell a crash).
    Running,
    /// Stopped on purpose, resumable.
    Interrupted {
        /// Why.
        reason: String,
    },
    /// Ended.
    Finished {
        /// The aggregate state.
        state: RunOutcome,
    },
}

/// Where a task stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Waiting for its dependencies.
    Pending,
    /// Ready, waiting for a slot.
    Queued {
        /// When it became ready (its deadline counts from here).
        since: Timestamp,
    },
    /// An attempt is live (launching or running).
    Running {
        /// The live attempt.
        attempt: Attempt,
    },
    /// An attempt ended; the next step (retry or finish) is not yet recorded.
    Ended {
        /// The attempt that ended.
        attempt: Attempt,
    },
    /// A retry is scheduled.
    Retrying {
        /// The attempt that will run.
        next: Attempt,
        /// Its model.
        model: Option<String>,
        /// Not before this time.
        not_before: Timestamp,
    },
    /// Terminal.
    Finished(TaskResult),
}

impl TaskState {
    /// A short name for displays.
    pub fn name(&self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Queued { .. } => "queued",
            TaskState::Running { .. } => "running",
            TaskState::Ended { .. } => "finishing",
            TaskState::Retrying { .. } => "retrying",
            TaskState::Finished(r) => r.state.as_str(),
        }
    }

    /// True once the task has finished.
    pub fn is_terminal(&self) -> bool {
        matches!(self, TaskState::Finished(_))
    }
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttemptEnd {
    /// It finished and reported.
    Finished {
        /// Its outcome and text.
        outcome: OutcomeRecord,
        /// When.
        at: Timestamp,
    },
    /// Resume found it live after a crash.
    Orphaned {
        /// What was done about it.
        action: OrphanAction,
        /// When.
        at: Timestamp,
    },
}

/// One attempt of a task. A big run holds one for each attempt of each of its tasks: what most
/// attempts of a plain command never set (a model, a usage, sessions) is boxed and its end kept
/// compact ([`OutcomeRecord`]), so a record is 104 bytes (it was 336).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Its number.
    pub attempt: Attempt,
    /// Whether it is marked stalled.
    pub stalled: bool,
    /// Whether it ran a side-effecting tool (`AttemptSideEffects`, or its finished outcome
    /// says so).
    pub side_effects: bool,
    /// When it was launched.
    pub launched_at: Timestamp,
    /// Its process id, once started.
    pub pid: Option<u32>,
    /// Its process start time, once started.
    pub start_time: Option<u64>,
    /// How it ended, once it has.
    pub end: Option<AttemptEnd>,
    /// Where it runs (`AttemptPlaced`), and what resume found of it; boxed: a big run's
    /// records stay small.
    pub placed: Option<Box<Placed>>,
    /// Its last known usage, once it is not zero (see [`AttemptRecord::usage`]).
    usage: Rare<Usage>,
    /// Its model and sessions, once it has any of them.
    more: Rare<AttemptMore>,
}

/// What an [`AttemptRecord`] keeps boxed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
struct AttemptMore {
    model: Option<String>,
    continues: Option<String>,
    session: Option<String>,
    /// #37: when it began waiting for a machine-wide slot (`AttemptWaiting`), and when its
    /// start ended the wait.
    waited: Option<(Timestamp, Option<Timestamp>)>,
    /// #33: its check: `Some(None)` once started (`VerifyStarted`), then its verdict.
    verify: Option<Option<crate::verify::Verdict>>,
    /// #34: its sandbox's flows (`SandboxNet`), once journaled.
    net: Option<Vec<crate::sandbox_net::Flow>>,
}

impl AttemptRecord {
    /// A new attempt launched at `launched_at`, on `model`.
    pub fn new(attempt: Attempt, model: Option<String>, launched_at: Timestamp) -> Self {
        let mut record = AttemptRecord {
            attempt,
            stalled: false,
            side_effects: false,
            launched_at,
            pid: None,
            start_time: None,
            end: None,
            placed: None,
            usage: Rare::default(),
            more: Rare::default(),
        };
        if model.is_some() {
            record.set_model(model);
        }
        record
    }

    /// Its last known usage.
    pub fn usage(&self) -> &Usage {
        self.usage.get().unwrap_or(&Usage::ZERO)
    }

    /// Sets its usage.
    pub fn set_usage(&mut self, usage: Usage) {
        if usage != *self.usage() {
            *self.usage.get_mut() = usage;
        }
    }

    /// Its model.
    pub fn model(&self) -> Option<&str> {
        self.more.get().and_then(|m| m.model.as_deref())
    }

    /// The session of an earlier attempt it continues (`AttemptContinues`).
    pub fn continues(&self) -> Option<&str> {
        self.more.get().and_then(|m| m.continues.as_deref())
    }

    /// #13: the agent's own id of the conversation it is in (`AttemptSession`), once its
    /// stream named it: what a later attempt resumes.
    pub fn session(&self) -> Option<&str> {
        self.more.get().and_then(|m| m.session.as_deref())
    }

    /// Sets its model.
    pub fn set_model(&mut self, model: Option<String>) {
        self.more.get_mut().model = model;
    }

    /// Sets the session it continues.
    pub fn set_continues(&mut self, session: Option<String>) {
        self.more.get_mut().continues = session;
    }

    /// #34: its sandbox's flows (`SandboxNet`), once journaled.
    pub fn net(&self) -> Option<&[crate::sandbox_net::Flow]> {
        self.more.get().and_then(|m| m.net.as_deref())
    }

    /// Sets its sandbox's flows.
    pub fn set_net(&mut self, flows: Vec<crate::sandbox_net::Flow>) {
        self.more.get_mut().net = Some(flows);
    }

    /// Sets its own session.
    pub fn set_session(&mut self, session: Option<String>) {
        self.more.get_mut().session = session;
    }

    /// #37: when it began waiting for a machine-wide slot, and when its start ended the wait
    /// (`None` while it waits).
    pub fn waited(&self) -> Option<(Timestamp, Option<Timestamp>)> {
        self.more.get().and_then(|m| m.waited)
    }

    /// Whether it waits for a machine-wide slot now (waiting, not started, not ended).
    pub fn is_waiting(&self) -> bool {
        self.end.is_none() && matches!(self.waited(), Some((_, None)))
    }

    /// When its attempt clock starts: its launch, or the end of its wait for a slot.
    pub fn clock_from(&self) -> Timestamp {
        match self.waited() {
            Some((_, Some(started))) => started,
            _ => self.launched_at,
        }
    }

    /// #33: whether its check was started (`VerifyStarted`).
    pub fn verify_started(&self) -> bool {
        self.more.get().is_some_and(|m| m.verify.is_some())
    }

    /// #33: its check's verdict (`VerifyEnded`), once it ended.
    pub fn verdict(&self) -> Option<&crate::verify::Verdict> {
        self.more.get().and_then(|m| m.verify.as_ref()?.as_ref())
    }

    /// #33: whether its check runs now (started, no verdict yet).
    pub fn checking(&self) -> bool {
        self.verify_started() && self.verdict().is_none()
    }

    fn set_verify(&mut self, verdict: Option<crate::verify::Verdict>) {
        self.more.get_mut().verify = Some(verdict);
    }

    fn set_waited(&mut self, waited: (Timestamp, Option<Timestamp>)) {
        self.more.get_mut().waited = Some(waited);
    }

    /// The outcome that decisions see: an orphaned attempt counts as interrupted, with the
    /// side effects its `AttemptSideEffects` recorded.
    pub fn outcome(&self) -> Option<AttemptOutcome> {
        match &self.end {
            Some(AttemptEnd::Finished { outcome, .. }) => Some(outcome.outcome()),
            Some(AttemptEnd::Orphaned { action, .. }) => {
                let what = match action {
                    OrphanAction::Killed => "its process was still running and was killed",
                    OrphanAction::Gone => "its process was gone",
                };
                Some(AttemptOutcome {
                    side_effects: self.side_effects,
                    ..AttemptOutcome::failed(
                        StopReason::Interrupted,
                        format!(
                            "sortie or its supervisor stopped while attempt {} ran; {what}",
                            self.attempt
                        ),
                    )
                })
            }
            None => None,
        }
    }

    /// Whether it was orphaned (resume found it gone, or killed it): a crash of sortie, not
    /// the task's fault; it counts against `max_orphans`, not `max_retries`.
    pub fn orphaned(&self) -> bool {
        matches!(self.end, Some(AttemptEnd::Orphaned { .. }))
    }

    /// The attempt's text, when it finished.
    pub fn output(&self) -> Option<&str> {
        match &self.end {
            Some(AttemptEnd::Finished { outcome, .. }) => Some(outcome.output()),
            _ => None,
        }
    }
}

/// A written artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// Where.
    pub path: String,
    /// How many bytes.
    pub bytes: u64,
    /// Digest of the content.
    pub digest: u64,
}

/// A task's worktree, as `WorktreePlanned` recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedWorktree {
    /// The root of the repository it belongs to.
    pub repo: String,
    /// Its path.
    pub path: String,
    /// Its branch.
    pub branch: String,
    /// The commit its branch starts at (HEAD, or the seed commit with `include_wip`).
    pub base: String,
}

/// One task's state and history. A big run holds one for each of its tasks: its rarer steps
/// are boxed together ([`TaskSteps`]), so a record is 128 bytes (it was 176).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Where it stands.
    pub state: TaskState,
    /// When it became ready (queued).
    pub ready_at: Option<Timestamp>,
    /// Its attempts, in order (attempt `i + 1` at index `i`).
    pub attempts: Vec<AttemptRecord>,
    /// Its worktree and artifact steps and its carrying, once it has any.
    steps: Rare<TaskSteps>,
}

/// A task's worktree and artifact steps and its carrying: what most tasks of a big run never
/// record (see [`TaskRecord::steps`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TaskSteps {
    /// Whether `TaskSetUp` was recorded, and the worktree it named.
    pub setup: Option<Option<String>>,
    /// The worktree `WorktreePlanned` recorded, if any.
    pub worktree: Option<PlannedWorktree>,
    /// Its artifact, once written.
    pub artifact: Option<Artifact>,
    /// Its worktree's fate, once finalized: (changed, diff summary).
    pub worktree_final: Option<(bool, Option<String>)>,
    /// Carried from the parent run (`TaskCarried`), with the usage it spent there.
    pub carried: Option<Usage>,
    /// #37: its kept worktree was removed (`WorktreeDiscarded`).
    pub discarded: Option<Discarded>,
}

/// A removed kept worktree, as `WorktreeDiscarded` recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Discarded {
    /// Who removed it.
    pub by: DiscardedBy,
    /// When.
    pub at: Timestamp,
    /// Whether its branch was kept.
    pub branch_kept: bool,
}

/// The steps of a task that has recorded none.
static NO_STEPS: TaskSteps = TaskSteps {
    setup: None,
    worktree: None,
    artifact: None,
    worktree_final: None,
    carried: None,
    discarded: None,
};

impl Default for TaskRecord {
    fn default() -> Self {
        TaskRecord::new()
    }
}

impl TaskRecord {
    /// A pending task's record, before any of its events.
    pub fn new() -> Self {
        TaskRecord {
            state: TaskState::Pending,
            ready_at: None,
            attempts: Vec::new(),
            steps: Rare::default(),
        }
    }

    /// When the task's deadline falls: its ready time plus the spec's `deadline`. None when
    /// the spec has no deadline or the task was never ready (the clock starts at ready).
    pub fn deadline_at(&self, spec: &TaskSpec) -> Option<Timestamp> {
        Some(self.ready_at?.plus(spec.deadline?))
    }

    /// Its worktree and artifact steps and its carrying.
    pub fn steps(&self) -> &TaskSteps {
        self.steps.get().unwrap_or(&NO_STEPS)
    }

    /// [`TaskRecord::steps`], to change them.
    pub fn steps_mut(&mut self) -> &mut TaskSteps {
        self.steps.get_mut()
    }

    /// The task's usage: the sum over its attempts of each attempt's last known usage.
    pub fn usage(&self) -> Usage {
        Usage::sum(self.attempts.iter().map(AttemptRecord::usage))
    }

    /// The tool calls its agent's permissions denied, summed over its attempts.
    pub fn denials(&self) -> Vec<crate::Denial> {
        let mut all: Vec<crate::Denial> = Vec::new();
        for o in self.attempts.iter().filter_map(AttemptRecord::outcome) {
            for d in o.denials {
                match all.iter_mut().find(|a| a.tool == d.tool) {
                    Some(a) => a.count = a.count.saturating_add(d.count),
                    None => all.push(d),
                }
            }
        }
        all
    }

    /// The task's result, once it finished.
    pub fn result(&self) -> Option<&TaskResult> {
        match &self.state {
            TaskState::Finished(r) => Some(r),
            _ => None,
        }
    }

    /// The live attempt, if one is running.
    pub fn live_attempt(&self) -> Option<&AttemptRecord> {
        match self.state {
            TaskState::Running { .. } => self.attempts.last(),
            _ => None,
        }
    }
}

/// Why an event cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A record's seq is not the next one.
    #[error("seq {got} where {expected} was expected")]
    SeqGap {
        /// The seq the state expected.
        expected: Seq,
        /// The seq the event carried.
        got: Seq,
    },
    /// The first event must be `RunStarted`, and only the first.
    #[error("{event} before RunStarted")]
    NotStarted {
        /// The event's name.
        event: &'static str,
    },
    /// `RunStarted` appeared twice.
    #[error("RunStarted after the run had started")]
    AlreadyStarted,
    /// Something followed `RunFinished`.
    #[error("{event} after RunFinished")]
    RunEnded {
        /// The event's name.
        event: &'static str,
    },
    /// The run-level event does not fit the run's status.
    #[error("{event} while the run is {status}")]
    RunStatus {
        /// The event's name.
        event: &'static str,
        /// The run's status.
        status: &'static str,
    },
    /// No such task in the batch.
    #[error("{event} for task {task}, which is not in the batch")]
    UnknownTask {
        /// The event's name.
        event: &'static str,
        /// The task.
        task: TaskId,
    },
    /// The task's state does not allow the event.
    #[error("{event} for task {task} ({label}) while it is {state}")]
    IllegalTransition {
        /// The task.
        task: TaskId,
        /// Its label.
        label: String,
        /// Its state's name.
        state: &'static str,
        /// The event's name.
        event: &'static str,
    },
    /// A report for an attempt that is not the live one (fencing).
    #[error("{event} for attempt {got} of task {task}, but the live attempt is {live}")]
    StaleAttempt {
        /// The task.
        task: TaskId,
        /// The event's name.
        event: &'static str,
        /// The live attempt (0: none).
        live: Attempt,
        /// The attempt the event named.
        got: Attempt,
    },
    /// Attempt numbers must be consecutive and within the task's policy.
    #[error("attempt {got} of task {task} where {expected} (at most {max}) was expected")]
    AttemptNumber {
        /// The task.
        task: TaskId,
        /// The attempt expected next.
        expected: Attempt,
        /// The attempt the event named.
        got: Attempt,
        /// The task's most attempts.
        max: u32,
    },
    /// The launch does not use the model the retry scheduled.
    #[error("attempt {attempt} of task {task} launched on {got:?}, but {expected:?} was scheduled")]
    ModelMismatch {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The scheduled model.
        expected: Option<String>,
        /// The launched model.
        got: Option<String>,
    },
    /// A live usage counter went backwards.
    #[error("usage of attempt {attempt} of task {task} went backwards")]
    UsageDecreased {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
    },
    /// `RunFinished` while some task is not finished.
    #[error("RunFinished while {unfinished} task(s) are not finished")]
    TasksUnfinished {
        /// How many.
        unfinished: usize,
    },
    /// `RunFinished` names a state that is not the aggregate of the task results.
    #[error("RunFinished says {got} but the task results aggregate to {expected}")]
    WrongAggregate {
        /// The aggregate of the results.
        expected: RunOutcome,
        /// What the event said.
        got: RunOutcome,
    },
    /// An artifact or worktree step recorded twice.
    #[error("{event} recorded twice for task {task}")]
    Duplicate {
        /// The task.
        task: TaskId,
        /// The event's name.
        event: &'static str,
    },
    /// A run budget event recorded twice (a limit warned twice, or exceeded twice).
    #[error("{event} recorded twice for the run's {limit:?} limit")]
    BudgetTwice {
        /// The event's name.
        event: &'static str,
        /// The limit.
        limit: BudgetLimit,
    },
    /// A control action that does not apply now.
    #[error("{why}")]
    IllegalControl {
        /// Why, for people.
        why: String,
    },
    /// `RunRerunOf` twice, or after the run's tasks began.
    #[error("RunRerunOf recorded twice")]
    RerunTwice,
}

/// The state of a run: what replaying its journal gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// The run's id (once started).
    pub run_id: Option<RunId>,
    /// The resolved batch (once started).
    #[serde(with = "compact::batch")]
    pub batch: Option<Batch>,
    /// The batch digest.
    pub batch_digest: u64,
    /// Where the run stands.
    pub status: RunStatus,
    /// The tasks, indexed by `TaskId`.
    #[serde(deserialize_with = "compact::exact")]
    pub tasks: Vec<TaskRecord>,
    /// The seq the next event must carry (= how many events were applied).
    pub next_seq: Seq,
    /// When the run started.
    pub started_at: Option<Timestamp>,
    /// When the last event happened.
    pub last_at: Option<Timestamp>,
    /// The pid of the process that last owned the run.
    pub pid: u32,
    /// The host the run started on.
    pub host: String,
    /// How many times the run was resumed.
    pub resumes: u32,
    /// The summary text, once finished.
    pub summary: Option<String>,
    /// Task ids sorted by label (then id): each label is held once, in its spec, and a lookup
    /// is a binary search (a map of label copies was ~90 bytes a task).
    #[serde(deserialize_with = "compact::exact")]
    labels: Vec<TaskId>,
    /// How many tasks have finished, kept as events apply (see [`RunState::done_count`]).
    done: usize,
    /// The counters of the run's usage, kept as events apply (see
    /// [`RunState::usage_counters`]).
    tally: Usage,
    /// The run budget's limits warned about (`RunBudgetWarned`).
    pub budget_warned: Vec<BudgetLimit>,
    /// The limit that ran out and why (`RunBudgetExceeded`).
    pub budget_exceeded: Option<(BudgetLimit, String)>,
    /// What users asked of the live run (`Event::Control`): held, cancelled, concurrency.
    pub control: ControlState,
    /// The run this one reruns (`RunRerunOf`).
    pub parent: Option<RunId>,
    /// Each time `sortie recover` rebuilt the journal after damage (`RunRecovered`).
    pub recovered: Vec<Recovery>,
    /// The pools' state (issue 14), by name: a fold of their attempts (see `crate::pool`).
    pub pools: std::collections::BTreeMap<String, crate::pool::PoolState>,
    /// The strings the placements share.
    #[serde(skip)]
    strings: Interner,
}

/// One rebuild of the journal by `sortie recover` (see `Event::RunRecovered`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recovery {
    /// When.
    pub at: Timestamp,
    /// The records read back, of which `scanned` from the scan of the journal's files.
    pub kept: u64,
    /// See `kept`.
    pub scanned: u64,
    /// The acknowledged records lost (`first..=last`), when known.
    pub lost: Option<(u64, u64)>,
    /// The attempts restored from their files.
    pub restored: Vec<(TaskId, Attempt)>,
    /// Where the damaged files went.
    pub damaged: String,
}

/// What `Event::Control` changed, as the planner and the runner need it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ControlState {
    /// The whole run is held: nothing launches, every live attempt is stopped.
    pub run_held: bool,
    /// Tasks held one by one.
    pub held: std::collections::BTreeSet<TaskId>,
    /// Tasks a user cancelled: they end cancelled, never retried.
    pub cancelled: std::collections::BTreeSet<TaskId>,
    /// The concurrency a user set, over the batch's.
    pub concurrency: Option<u32>,
    /// A user cancelled the whole run: a process that takes it over goes on cancelling.
    pub run_cancelled: bool,
}

impl ControlState {
    /// Whether task `task` is held (by itself or with the run).
    pub fn is_held(&self, task: TaskId) -> bool {
        self.run_held || self.held.contains(&task)
    }
}

impl Default for RunState {
    fn default() -> Self {
        RunState::new()
    }
}

impl RunState {
    /// The state before any event.
    pub fn new() -> Self {
        RunState {
            run_id: None,
            batch: None,
            batch_digest: 0,
            status: RunStatus::NotStarted,
            tasks: Vec::new(),
            next_seq: Seq(0),
            started_at: None,
            last_at: None,
            pid: 0,
            host: String::new(),
            resumes: 0,
            summary: None,
            labels: Vec::new(),
            done: 0,
            tally: Usage::ZERO,
            budget_warned: Vec::new(),
            budget_exceeded: None,
            control: ControlState::default(),
            parent: None,
            recovered: Vec::new(),
            pools: std::collections::BTreeMap::new(),
            strings: Interner::default(),
        }
    }

    /// Folds a sequence of events from the start.
    pub fn replay<'a>(
        events: impl IntoIterator<Item = &'a Stamped>,
    ) -> Result<Self, (Seq, Violation)> {
        let mut state = RunState::new();
        for s in events {
            state.apply(s).map_err(|v| (s.seq, v))?;
        }
        Ok(state)
    }

    /// The task's spec.
    pub fn spec(&self, task: TaskId) -> Option<&TaskSpec> {
        self.batch.as_ref().and_then(|b| b.tasks.get(task.index()))
    }

    /// The task's label (or its id when unknown).
    pub fn label(&self, task: TaskId) -> String {
        self.spec(task)
            .map(|s| s.label.clone())
            .unwrap_or_else(|| task.to_string())
    }

    /// Finds a task by label (of two with the same label, which validation refuses, the
    /// later).
    pub fn task_by_label(&self, label: &str) -> Option<TaskId> {
        let tasks = &self.batch.as_ref()?.tasks;
        let label_of = |t: &TaskId| tasks.get(t.index()).map(|s| s.label.as_str());
        let end = self
            .labels
            .partition_point(|t| label_of(t).is_some_and(|l| l <= label));
        let found = *self.labels.get(end.checked_sub(1)?)?;
        (label_of(&found) == Some(label)).then_some(found)
    }

    /// The record of a task.
    pub fn task(&self, task: TaskId) -> Option<&TaskRecord> {
        self.tasks.get(task.index())
    }

    /// The run's usage: the sum over its tasks.
    pub fn usage(&self) -> Usage {
        Usage::sum(
            self.tasks
                .iter()
                .flat_map(|t| t.attempts.iter().map(AttemptRecord::usage)),
        )
    }

    /// True when every task has finished.
    pub fn all_finished(&self) -> bool {
        self.done == self.tasks.len()
    }

    /// How many tasks have finished, without a pass over the tasks (a live display asks after
    /// every event, and a run may hold 100,000 tasks).
    pub fn done_count(&self) -> usize {
        self.done
    }

    /// The counters of [`RunState::usage`] (tokens, reasoning, cost, turns), kept up to date as
    /// events apply instead of summed over every task. `context_tokens`, a level rather than a
    /// counter, is 0: ask [`RunState::usage`] for it.
    pub fn usage_counters(&self) -> Usage {
        self.tally
    }

    /// True once `RunFinished` was applied.
    pub fn is_finished(&self) -> bool {
        matches!(self.status, RunStatus::Finished { .. })
    }

    /// The aggregate of the task results (meaningful once all have finished).
    pub fn aggregate(&self) -> RunOutcome {
        aggregate(
            self.tasks
                .iter()
                .filter_map(|t| t.result().map(|r| r.state)),
        )
    }

    fn status_name(&self) -> &'static str {
        match self.status {
            RunStatus::NotStarted => "not started",
            RunStatus::Running => "running",
            RunStatus::Interrupted { .. } => "interrupted",
            RunStatus::Finished { .. } => "finished",
        }
    }

    /// Applies one journal record: its seq must be the next one, and the event legal.
    pub fn apply(&mut self, stamped: &Stamped) -> Result<(), Violation> {
        self.apply_parts(stamped.seq, stamped.at, &stamped.event)
    }

    /// [`RunState::apply`] of a record given by its parts.
    fn apply_parts(&mut self, seq: Seq, at: Timestamp, event: &Event) -> Result<(), Violation> {
        if seq != self.next_seq {
            return Err(Violation::SeqGap {
                expected: self.next_seq,
                got: seq,
            });
        }
        self.check(event)?;
        self.mutate(at, event);
        self.next_seq = Seq(self.next_seq.0 + 1);
        self.last_at = Some(at);
        Ok(())
    }

    /// [`RunState::apply`] taking the record by value: `RunStarted`'s batch moves into the
    /// state instead of being copied (for a 100,000-task batch, tens of megabytes and a good
    /// part of a replay's time). Replay uses it.
    pub fn apply_owned(&mut self, stamped: Stamped) -> Result<(), Violation> {
        let Stamped { seq, at, event } = stamped;
        let Event::RunStarted {
            run_id,
            batch,
            batch_digest,
            host,
            pid,
        } = event
        else {
            // By reference, without moving the event into a new record.
            return self.apply_parts(seq, at, &event);
        };
        if seq != self.next_seq {
            return Err(Violation::SeqGap {
                expected: self.next_seq,
                got: seq,
            });
        }
        if self.status != RunStatus::NotStarted {
            return Err(Violation::AlreadyStarted);
        }
        self.start(at, run_id, batch, batch_digest, host, pid);
        self.next_seq = Seq(self.next_seq.0 + 1);
        self.last_at = Some(at);
        Ok(())
    }
}

#[cfg(test)]
mod tests;

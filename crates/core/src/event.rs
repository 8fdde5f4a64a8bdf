//! The event vocabulary: everything that can happen to a run, as data.
//!
//! A run is its journal: a sequence of [`Stamped`] events. The journal assigns `seq`; the runner
//! decides `at` (from its clock) and the payload. Environment values and secrets never appear in
//! an event.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::{Attempt, RunId, Seq, TaskId, Timestamp};
use crate::outcome::{AttemptOutcome, RunOutcome, TaskResult};
use crate::spec::Batch;
use crate::usage::Usage;

/// An event with its place in the journal and its time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamped {
    /// The journal's sequence number (dense from 0).
    pub seq: Seq,
    /// When the event was decided.
    pub at: Timestamp,
    /// What happened.
    pub event: Event,
}

/// What resume found of an attempt that was live when its run died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrphanAction {
    /// A process of the attempt was still running and was killed.
    Killed,
    /// No process of the attempt was left.
    Gone,
}

/// Everything that can happen to a run.
///
/// Variants are never removed or reordered: the journal's stored form mirrors them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// The first event of every run.
    RunStarted {
        /// The run's id.
        run_id: RunId,
        /// The resolved batch (specs with defaults applied, profiles, settings).
        batch: Batch,
        /// A digest of the batch as given, to tell whether a file changed since.
        batch_digest: u64,
        /// The host the run started on.
        host: String,
        /// The pid of the sortie process.
        pid: u32,
    },
    /// A new sortie process took the run over after a crash or an interrupt.
    RunResumed {
        /// The pid of the resuming process.
        pid: u32,
        /// The seq of the last event before this resume.
        from_seq: Seq,
    },
    /// The run was stopped on purpose (Ctrl-C, SIGTERM) and can be resumed.
    RunInterrupted {
        /// Why it stopped, for people.
        reason: String,
    },
    /// The run ended; nothing follows.
    RunFinished {
        /// The aggregate state.
        state: RunOutcome,
        /// The summary text.
        summary: String,
    },
    /// A task's dependencies are met: it waits for a slot, and its deadline starts.
    TaskQueued {
        /// The task.
        task: TaskId,
    },
    /// A task's setup finished (e.g. its worktree exists).
    TaskSetUp {
        /// The task.
        task: TaskId,
        /// The worktree's path, when the task is isolated.
        worktree: Option<String>,
    },
    /// An attempt is about to be spawned. Durable before the spawn.
    AttemptLaunching {
        /// The task.
        task: TaskId,
        /// The attempt's number.
        attempt: Attempt,
        /// The model it uses.
        model: Option<String>,
    },
    /// The attempt's process exists.
    AttemptStarted {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The process id (also its process group id).
        pid: u32,
        /// The process's start time in clock ticks since boot (pid reuse guard).
        start_time: u64,
    },
    /// A checkpoint of usage while the attempt runs (rate-limited).
    AttemptProgress {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The attempt's usage so far (cumulative, never decreasing).
        usage: Usage,
    },
    /// The attempt has been silent for `stall_after`.
    AttemptStalled {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
    },
    /// The attempt ended.
    AttemptFinished {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// How it ended.
        outcome: AttemptOutcome,
        /// Its final usage (cumulative for the attempt).
        usage: Usage,
        /// Its text: final message, else error, else the last stderr lines.
        output: String,
    },
    /// Resume found an attempt that was live when the run died.
    AttemptOrphaned {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// What was done about its processes.
        action: OrphanAction,
    },
    /// The task will be tried again.
    RetryScheduled {
        /// The task.
        task: TaskId,
        /// The attempt that will run next.
        next_attempt: Attempt,
        /// Its model.
        model: Option<String>,
        /// How long to wait first.
        delay: Duration,
        /// Why the last attempt is retried, for people.
        reason: String,
    },
    /// The task's artifact was written.
    ArtifactWritten {
        /// The task.
        task: TaskId,
        /// Where.
        path: String,
        /// How many bytes.
        bytes: u64,
        /// A digest of the content.
        digest: u64,
    },
    /// The task's worktree was finalized.
    WorktreeFinalized {
        /// The task.
        task: TaskId,
        /// Whether it changed (and so was kept).
        changed: bool,
        /// The diff summary, when it changed.
        diff: Option<String>,
    },
    /// The task ended; nothing of this task follows.
    TaskFinished {
        /// The task.
        task: TaskId,
        /// How it ended.
        result: TaskResult,
    },
    /// A worktree is about to be created for the task (`isolation = "worktree"`). Durable
    /// before any git command that creates it; `TaskSetUp { worktree: Some(path) }` follows
    /// once it exists. Resume finds (or re-creates) the worktree from this record.
    WorktreePlanned {
        /// The task.
        task: TaskId,
        /// The root of the repository the worktree belongs to (the one holding the task's cwd).
        repo: String,
        /// The worktree's path: `<state-dir>/worktrees/<run>/<label>`.
        path: String,
        /// Its branch: `sortie/<run>/<label>`.
        branch: String,
        /// The commit the branch starts at: the repository's HEAD, or with `include_wip` a
        /// "sortie: seed" commit on top of HEAD that holds the uncommitted and untracked files.
        /// The worktree counts as changed when it moved past this commit or is dirty.
        base: String,
    },
    /// The live attempt ran a side-effecting tool (bash, write, edit): recorded once per
    /// attempt, as soon as the agent's stream shows it, so that an attempt cut short by a crash
    /// is still known to have changed things (it is then retried only inside a worktree).
    AttemptSideEffects {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
    },
    /// The launching attempt continues the conversation of an earlier, interrupted attempt of
    /// the same task (the agent's session file). Durable after `AttemptLaunching` and before
    /// the spawn; at most once per attempt.
    AttemptContinues {
        /// The task.
        task: TaskId,
        /// The attempt that continues.
        attempt: Attempt,
        /// The session it continues: the agent's session file, as passed to the agent.
        session: String,
    },
    /// The run's use of one of its budget's limits reached the warning threshold (once per
    /// limit).
    RunBudgetWarned {
        /// Which limit.
        limit: BudgetLimit,
        /// How much of it is used (nano-dollars, tokens, or milliseconds).
        used: u64,
        /// The limit, in the same unit.
        of: u64,
    },
    /// The run's budget ran out: nothing new launches, running attempts wrap up or stop, tasks
    /// not started end cancelled. Once per run.
    RunBudgetExceeded {
        /// Which limit.
        limit: BudgetLimit,
        /// What happened, for people (`run cost $5.10 passed max_cost $5.00`).
        reason: String,
    },
    // #10: attempts that outlive sortie.
    /// Where the launching attempt runs and how it is found again: its executor and its
    /// attempt dir. Durable after `AttemptLaunching` (and `AttemptContinues`) and before the
    /// executor starts it; at most once per attempt, only before its process exists.
    AttemptPlaced {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The executor's name (`local`: a supervisor that outlives sortie; `direct`: a child
        /// of sortie; `slurm`).
        executor: String,
        /// The attempt dir (absolute): its output files and its executor's records.
        dir: String,
    },
    /// The executor's own id of the placed attempt (a batch job id), once known; at most once.
    AttemptHandle {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The id.
        handle: String,
    },
    /// Resume found the live attempt still running: it is adopted and followed from its files
    /// (its clocks re-armed from the journaled times); it ends with its own `AttemptFinished`.
    AttemptAdopted {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The size of its stdout when it was adopted (what sortie had not seen yet starts at
        /// or before it).
        offset: u64,
    },
    /// Resume found the live attempt ended while no sortie watched it: its outcome is read
    /// from its files exactly as if it had been watched (`AttemptFinished` follows); it is not
    /// run again.
    AttemptRecorded {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
    },
    /// A user acted on the live run through its control socket (`sortie hold`, `release`,
    /// `cancel --task`, `steer`, `concurrency`). Journaled before it takes effect, so that
    /// replay shows it and a resume keeps it (a held task stays held).
    Control {
        /// Who: the peer's user and pid as the socket's credentials gave them.
        by: String,
        /// What.
        action: ControlAction,
    },
    /// The run is a rerun of `parent` (`sortie rerun`): right after `RunStarted`, once.
    RunRerunOf {
        /// The run whose batch it runs again.
        parent: RunId,
    },
    /// A task not selected for a rerun is carried from the parent run with its result; its
    /// usage was spent by the parent and is shown apart (the run's own usage leaves it out).
    /// Only for a pending task, before anything else happened to it.
    TaskCarried {
        /// The task.
        task: TaskId,
        /// Its result in the parent run.
        result: TaskResult,
        /// Its usage in the parent run.
        usage: Usage,
    },
    // #10: adoption reads on from the journaled offset.
    /// The journal holds what the placed attempt's stdout said (usage, side effects) up to
    /// byte `offset` of its transcript: journaled after the `AttemptProgress` it goes with, so
    /// that an adopted attempt's reader reports only what comes after it. Never decreases.
    AttemptRead {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The byte offset in its stdout, at a line's end.
        offset: u64,
    },
    // #13: sessions.
    /// The live attempt's agent named the conversation it is in (Claude Code's `session_id`,
    /// Codex's `thread_id`): journaled as soon as its stream shows it, so that a later attempt
    /// (the retry of an interrupted one, or the next task of its `session`) resumes it, even
    /// after a crash. At most once per attempt.
    AttemptSession {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// The agent's session id.
        session: String,
    },
    // #32: recovery.
    /// `sortie recover` rebuilt this run's journal after damage: appended once the records
    /// that could be read are, before any event recover restored from the attempts' files.
    RunRecovered {
        /// How many records were read back (sled's own reading, then the scan of its files).
        kept: u64,
        /// Of which the scan of the journal's files found (sled no longer gave them).
        scanned: u64,
        /// The acknowledged records that were lost (`first..=last`), when the mark says.
        lost: Option<(u64, u64)>,
        /// The attempts recover found in their files and restored as launched (resume then
        /// records or adopts each from its files: never run again, its number never reused).
        restored: Vec<(TaskId, Attempt)>,
        /// Where the damaged files were moved.
        damaged: String,
    },
    // #37: what the user reviews.
    /// The attempt found no free machine-wide slot (`SORTIE_MACHINE_SLOTS`) and waits for one;
    /// its `AttemptStarted` ends the wait, and its attempt clock runs from there.
    AttemptWaiting {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
    },
    /// A kept worktree was removed (`sortie discard`, `sortie gc`); its patch stays. The one
    /// task event a run takes after its end.
    WorktreeDiscarded {
        /// The task.
        task: TaskId,
        /// Who removed it.
        by: DiscardedBy,
        /// Whether its branch was kept (gc keeps a branch with commits found nowhere else).
        branch_kept: bool,
    },
    // #33: verified results.
    /// The task's check (`verify`) of its completed attempt is about to run. Durable before
    /// the check starts; a resume finds it again (or runs it again) from here.
    VerifyStarted {
        /// The task.
        task: TaskId,
        /// The attempt it checks (the task's last, ended completed).
        attempt: Attempt,
    },
    /// The check of the attempt ended: its verdict. Once per attempt.
    VerifyEnded {
        /// The task.
        task: TaskId,
        /// The attempt it checked.
        attempt: Attempt,
        /// What it said.
        verdict: crate::verify::Verdict,
    },
    // #34: the sandbox's network.
    /// A sandboxed attempt's connections (and refused name lookups), folded into flows:
    /// journaled once, just before the attempt's end, from the wrapper's record of them.
    SandboxNet {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: Attempt,
        /// Its flows, denied first (see [`crate::sandbox_net::fold`]).
        flows: Vec<crate::sandbox_net::Flow>,
    },
}

/// Who removed a kept worktree (see [`Event::WorktreeDiscarded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscardedBy {
    /// `sortie discard RUN LABEL`.
    Discard,
    /// `sortie gc`.
    Gc,
    /// #33: after the run, the sample a `pick` did not choose.
    Pick,
}

impl DiscardedBy {
    /// The command's name.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscardedBy::Discard => "discard",
            DiscardedBy::Gc => "gc",
            DiscardedBy::Pick => "pick",
        }
    }

    /// Who removed it, for people: `` `sortie discard` ``, `` `sortie gc` ``, or the run's
    /// `pick` (after the run, a sample it did not choose).
    pub fn who(self) -> &'static str {
        match self {
            DiscardedBy::Discard => "`sortie discard`",
            DiscardedBy::Gc => "`sortie gc`",
            DiscardedBy::Pick => "the run's `pick` (a sample it did not choose)",
        }
    }
}

/// One limit of a run's budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetLimit {
    /// `max_cost`.
    Cost,
    /// `max_tokens`.
    Tokens,
    /// `deadline`.
    Deadline,
}

impl BudgetLimit {
    /// The field's name in `[budget]`.
    pub fn field(self) -> &'static str {
        match self {
            BudgetLimit::Cost => "max_cost",
            BudgetLimit::Tokens => "max_tokens",
            BudgetLimit::Deadline => "deadline",
        }
    }
}

/// What a user did to a live run (see [`Event::Control`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlAction {
    /// Hold one task (its processes stopped, nothing of it launched), or the whole run.
    Hold {
        /// The task; `None`: the run.
        task: Option<TaskId>,
    },
    /// Release one held task, or the run and every held task.
    Release {
        /// The task; `None`: everything held.
        task: Option<TaskId>,
    },
    /// Cancel one task (its attempt stopped, not retried; it ends cancelled), or the run.
    Cancel {
        /// The task; `None`: the run.
        task: Option<TaskId>,
    },
    /// Send a message to a running task's agent (one that can be steered).
    Steer {
        /// The task.
        task: TaskId,
        /// The message.
        message: String,
    },
    /// Change how many tasks run at once.
    Concurrency {
        /// The new limit (at least 1).
        n: u32,
    },
}

impl ControlAction {
    /// The task the action is about, if one.
    pub fn task(&self) -> Option<TaskId> {
        match self {
            ControlAction::Hold { task }
            | ControlAction::Release { task }
            | ControlAction::Cancel { task } => *task,
            ControlAction::Steer { task, .. } => Some(*task),
            ControlAction::Concurrency { .. } => None,
        }
    }

    /// The action's name, as the CLI's commands say it.
    pub fn name(&self) -> &'static str {
        match self {
            ControlAction::Hold { .. } => "hold",
            ControlAction::Release { .. } => "release",
            ControlAction::Cancel { .. } => "cancel",
            ControlAction::Steer { .. } => "steer",
            ControlAction::Concurrency { .. } => "concurrency",
        }
    }
}

impl Event {
    /// The task this event is about, if any.
    pub fn task(&self) -> Option<TaskId> {
        match self {
            Event::RunStarted { .. }
            | Event::RunResumed { .. }
            | Event::RunInterrupted { .. }
            | Event::RunFinished { .. }
            | Event::RunBudgetWarned { .. }
            | Event::RunBudgetExceeded { .. }
            | Event::RunRerunOf { .. }
            | Event::RunRecovered { .. } => None,
            Event::TaskQueued { task }
            | Event::TaskSetUp { task, .. }
            | Event::AttemptLaunching { task, .. }
            | Event::AttemptStarted { task, .. }
            | Event::AttemptProgress { task, .. }
            | Event::AttemptStalled { task, .. }
            | Event::AttemptFinished { task, .. }
            | Event::AttemptOrphaned { task, .. }
            | Event::RetryScheduled { task, .. }
            | Event::ArtifactWritten { task, .. }
            | Event::WorktreeFinalized { task, .. }
            | Event::TaskFinished { task, .. }
            | Event::WorktreePlanned { task, .. }
            | Event::AttemptSideEffects { task, .. }
            | Event::AttemptContinues { task, .. }
            | Event::AttemptPlaced { task, .. }
            | Event::AttemptHandle { task, .. }
            | Event::AttemptAdopted { task, .. }
            | Event::AttemptRecorded { task, .. }
            | Event::TaskCarried { task, .. }
            | Event::AttemptRead { task, .. }
            | Event::AttemptSession { task, .. }
            | Event::AttemptWaiting { task, .. }
            | Event::WorktreeDiscarded { task, .. }
            | Event::VerifyStarted { task, .. }
            | Event::VerifyEnded { task, .. }
            | Event::SandboxNet { task, .. } => Some(*task),
            Event::Control { action, .. } => action.task(),
        }
    }

    /// The attempt this event is about, if it is an attempt's event.
    pub fn attempt(&self) -> Option<Attempt> {
        match self {
            Event::AttemptLaunching { attempt, .. }
            | Event::AttemptStarted { attempt, .. }
            | Event::AttemptProgress { attempt, .. }
            | Event::AttemptStalled { attempt, .. }
            | Event::AttemptFinished { attempt, .. }
            | Event::AttemptOrphaned { attempt, .. }
            | Event::AttemptSideEffects { attempt, .. }
            | Event::AttemptContinues { attempt, .. }
            | Event::AttemptPlaced { attempt, .. }
            | Event::AttemptHandle { attempt, .. }
            | Event::AttemptAdopted { attempt, .. }
            | Event::AttemptRecorded { attempt, .. }
            | Event::AttemptRead { attempt, .. }
            | Event::AttemptSession { attempt, .. }
            | Event::AttemptWaiting { attempt, .. }
            | Event::SandboxNet { attempt, .. } => Some(*attempt),
            Event::RunStarted { .. }
            | Event::RunResumed { .. }
            | Event::RunInterrupted { .. }
            | Event::RunFinished { .. }
            | Event::RunBudgetWarned { .. }
            | Event::RunBudgetExceeded { .. }
            | Event::RunRerunOf { .. }
            | Event::TaskQueued { .. }
            | Event::TaskSetUp { .. }
            | Event::RetryScheduled { .. }
            | Event::ArtifactWritten { .. }
            | Event::WorktreeFinalized { .. }
            | Event::TaskFinished { .. }
            | Event::WorktreePlanned { .. }
            | Event::TaskCarried { .. }
            | Event::RunRecovered { .. }
            | Event::WorktreeDiscarded { .. }
            | Event::VerifyStarted { .. }
            | Event::VerifyEnded { .. }
            | Event::Control { .. } => None,
        }
    }

    /// The event's name, as shown in timelines and exports.
    pub fn name(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "RunStarted",
            Event::RunResumed { .. } => "RunResumed",
            Event::RunInterrupted { .. } => "RunInterrupted",
            Event::RunFinished { .. } => "RunFinished",
            Event::TaskQueued { .. } => "TaskQueued",
            Event::TaskSetUp { .. } => "TaskSetUp",
            Event::AttemptLaunching { .. } => "AttemptLaunching",
            Event::AttemptStarted { .. } => "AttemptStarted",
            Event::AttemptProgress { .. } => "AttemptProgress",
            Event::AttemptStalled { .. } => "AttemptStalled",
            Event::AttemptFinished { .. } => "AttemptFinished",
            Event::AttemptOrphaned { .. } => "AttemptOrphaned",
            Event::RetryScheduled { .. } => "RetryScheduled",
            Event::ArtifactWritten { .. } => "ArtifactWritten",
            Event::WorktreeFinalized { .. } => "WorktreeFinalized",
            Event::TaskFinished { .. } => "TaskFinished",
            Event::WorktreePlanned { .. } => "WorktreePlanned",
            Event::AttemptSideEffects { .. } => "AttemptSideEffects",
            Event::AttemptContinues { .. } => "AttemptContinues",
            Event::RunBudgetWarned { .. } => "RunBudgetWarned",
            Event::RunBudgetExceeded { .. } => "RunBudgetExceeded",
            Event::AttemptPlaced { .. } => "AttemptPlaced",
            Event::AttemptHandle { .. } => "AttemptHandle",
            Event::AttemptAdopted { .. } => "AttemptAdopted",
            Event::AttemptRecorded { .. } => "AttemptRecorded",
            Event::Control { .. } => "Control",
            Event::RunRerunOf { .. } => "RunRerunOf",
            Event::TaskCarried { .. } => "TaskCarried",
            Event::AttemptRead { .. } => "AttemptRead",
            Event::AttemptSession { .. } => "AttemptSession",
            Event::RunRecovered { .. } => "RunRecovered",
            Event::AttemptWaiting { .. } => "AttemptWaiting",
            Event::WorktreeDiscarded { .. } => "WorktreeDiscarded",
            Event::VerifyStarted { .. } => "VerifyStarted",
            Event::VerifyEnded { .. } => "VerifyEnded",
            Event::SandboxNet { .. } => "SandboxNet",
        }
    }
}

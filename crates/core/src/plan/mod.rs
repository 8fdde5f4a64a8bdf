//! The round planner: what the runner does next, as a pure function of the state and of the
//! facts the runner observed.
//!
//! [`Planner::plan`] returns [`Action`]s (restate's action collector): events to append, attempts
//! to launch once those are durable, tasks to end through effects (an artifact to write, a
//! worktree to finalize), worktree jobs to start. The runner appends the events in one durable
//! write, applies them, and then performs the effects; nothing else decides.
//!
//! The body is a list of named passes, one reason each (pueue's task handler), in this order
//! (after the tasks a user cancelled, and #33's [`picked samples`](Planner::picked_samples):
//! the samples that lost to a `pick = "first-pass"` winner end or are stopped):
//! 1. [`ended tasks`](Planner::ended_tasks): retry, or end (decided once, as [`Action::EndTask`]
//!    when an effect must come first);
//! 2. [`worktrees`](Planner::worktrees): set up the worktrees of waiting isolated tasks, and end
//!    those whose setup failed or who must end for another reason (after a finalize);
//! 3. [`ready tasks`](Planner::ready_tasks): queue a pending task whose needs completed (or
//!    ended, with `needs_mode = "settled"`), skip one whose need did not, cancel on
//!    cancellation or fail_fast;
//! 4. [`expired waits`](Planner::expired_waits): end waiting tasks whose deadline passed (or all
//!    of them on cancellation or fail_fast);
//! 5. [`free slots`](Planner::free_slots): launch, oldest first, up to the concurrency limit.
//!
//! Before the passes, the run's budget (`budget`): a limit reached is journaled
//! (`RunBudgetExceeded`) with [`Action::WindDown`] for the live attempts, and from then on the
//! passes launch nothing and end the waiting tasks (`decide::run_budget_result`); a limit whose
//! use reached the warning threshold is journaled once (`RunBudgetWarned`).
//!
//! A round holds at most one action per task, so every event of a round is checked against the
//! same state. The planner keeps indexes (a cache of the state, see `sched`) so that a round
//! does not scan 100,000 tasks; it is built from the state and told of every applied event.

mod budget;
mod pick;
mod sched;

use std::collections::{BTreeMap, BTreeSet};

use crate::decide::{self, NextStep};
use crate::digest::fnv1a;
use crate::event::Event;
use crate::ids::{Attempt, TaskId, Timestamp};
use crate::outcome::{Phase, StopReason, TaskResult, TerminalState};
use crate::spec::{Isolation, NeedsMode};
use crate::state::{RunState, TaskRecord, TaskState};
use sched::Sched;

/// Why the run is winding down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopping {
    /// Ctrl-C or SIGTERM: resumable. Nothing new starts; what is undecided stays undecided.
    Interrupt,
    /// `sortie cancel`: every unfinished task ends cancelled.
    Cancel,
}

/// A worktree job, run by the runner beside the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum JobKind {
    /// Read the repository: `WorktreePlanned` follows.
    Plan,
    /// Create the planned worktree (or re-create a missing one): `TaskSetUp` follows.
    Create,
    /// Keep or remove it: `WorktreeFinalized` follows.
    Finalize,
}

/// What the runner knows that the journal does not.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The time now.
    pub now: Timestamp,
    /// Whether the run is winding down.
    pub stopping: Option<Stopping>,
    /// How many attempts are live (each holds a concurrency slot).
    pub live: usize,
    /// The worktree jobs in flight (a setup job holds a slot; a task with any job in flight is
    /// left alone until it reports).
    pub jobs: &'a BTreeMap<TaskId, JobKind>,
    /// Tasks whose worktree setup failed in this process, and why.
    pub setup_failed: &'a BTreeMap<TaskId, String>,
    /// Tasks whose planned worktree is not on disk (see [`Planner::planned_worktrees`]).
    pub missing_worktrees: &'a BTreeSet<TaskId>,
}

/// One thing for the runner to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Append this event (with the round's other events, in one durable write).
    Append(Event),
    /// Spawn the attempt the round journaled as launching for this task.
    Launch(TaskId),
    /// End the task with `result`, once its effects are done, in this order: write its
    /// artifact (`ArtifactWritten`; a failed write downgrades the result, see
    /// [`decide::artifact_failed`]), finalize its worktree (`WorktreeFinalized`; a failure keeps
    /// it and downgrades the result, see [`decide::finalize_failed`]), then `TaskFinished`.
    EndTask {
        /// The task.
        task: TaskId,
        /// Its result, decided here once.
        result: TaskResult,
        /// Write its artifact first.
        artifact: bool,
        /// Finalize its worktree first.
        finalize: bool,
    },
    /// Start a worktree setup job.
    StartJob(TaskId, JobKind),
    /// #33: stop the task's live attempt with stop reason `cancelled` and this message (a
    /// sample that lost to a `pick = "first-pass"` winner); its end reports as any stopped
    /// attempt's does.
    StopTask(TaskId, String),
    /// #33: run the check of the task's last attempt, which the round journaled as started
    /// (`VerifyStarted`); its verdict comes back as `VerifyEnded`.
    Verify(TaskId),
    /// The run's budget ran out (the round journals `RunBudgetExceeded`): ask every live
    /// attempt to wrap up (a steerable agent gets its grace turns) or stop, with stop reason
    /// `budget` and this message.
    WindDown(String),
    /// The run is over: nothing else is left to do this round, and every task finished, or a
    /// stop (an interrupt) was asked for and no attempt nor job is in flight. The runner
    /// journals [`RunEnding::event`] and exits; it decides nothing of it.
    EndRun(RunEnding),
}

/// How a run ends (see [`Action::EndRun`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnding {
    /// Every task finished: `RunFinished`, with the aggregate and the summary.
    Finished,
    /// Stopped by a signal with tasks left: `RunInterrupted`; a resume goes on.
    Interrupted,
}

impl RunEnding {
    /// The event that ends the run in `state`.
    pub fn event(self, state: &RunState) -> Event {
        match self {
            RunEnding::Finished => Event::RunFinished {
                state: state.aggregate(),
                summary: crate::summary::summary_text(state),
            },
            RunEnding::Interrupted => Event::RunInterrupted {
                reason: "interrupted by a signal".into(),
            },
        }
    }
}

impl Action {
    /// The task the action is about.
    pub fn task(&self) -> Option<TaskId> {
        match self {
            Action::Append(e) => e.task(),
            Action::Launch(t)
            | Action::EndTask { task: t, .. }
            | Action::StartJob(t, _)
            | Action::Verify(t)
            | Action::StopTask(t, _) => Some(*t),
            Action::WindDown(_) | Action::EndRun(_) => None,
        }
    }
}

/// The planner with its indexes.
#[derive(Debug, Clone)]
pub struct Planner {
    sched: Sched,
    /// Unfinished tasks with `isolation = "worktree"`.
    isolated: BTreeSet<TaskId>,
    /// fail_fast is on and a task failed (or its failure was decided): nothing new starts.
    fail_fast_tripped: bool,
    /// The run's budget ran out (journaled, or decided this round): nothing new starts, the
    /// waiting tasks end.
    budget_out: Option<String>,
    /// Some task may launch an attempt that is in no pool (issue 14): a round whose pools
    /// all hold back must still look for it.
    unpooled: bool,
    /// #33: the `pick = "first-pass"` items.
    picks: pick::Picks,
}

/// One round in the making.
struct Round<'f> {
    facts: Facts<'f>,
    actions: Vec<Action>,
    used: BTreeSet<TaskId>,
    /// Setup jobs this round starts (they hold slots).
    new_setups: usize,
}

impl Round<'_> {
    fn push(&mut self, action: Action) {
        if let Some(t) = action.task() {
            self.used.insert(t);
        }
        self.actions.push(action);
    }

    /// Ends `task` with `result`: at once, or through its effects.
    fn end(&mut self, task: TaskId, rec: &TaskRecord, result: TaskResult, artifact: bool) {
        let finalize = rec.steps().worktree.is_some() && rec.steps().worktree_final.is_none();
        if artifact || finalize {
            self.push(Action::EndTask {
                task,
                result,
                artifact,
                finalize,
            });
        } else {
            self.push(Action::Append(Event::TaskFinished { task, result }));
        }
    }

    fn busy(&self, task: TaskId) -> bool {
        self.used.contains(&task) || self.facts.jobs.contains_key(&task)
    }

    fn cancelling(&self) -> bool {
        self.facts.stopping == Some(Stopping::Cancel)
    }
}

impl Planner {
    /// A planner for `state` (a new run, or a resumed one).
    pub fn new(state: &RunState) -> Planner {
        let fail_fast = state.batch.as_ref().is_some_and(|b| b.config.fail_fast);
        let mut isolated = BTreeSet::new();
        let mut failed = false;
        if let Some(batch) = &state.batch {
            for (i, (spec, rec)) in batch.tasks.iter().zip(&state.tasks).enumerate() {
                if spec.isolation == Isolation::Worktree && !rec.state.is_terminal() {
                    isolated.insert(TaskId(i as u32));
                }
                // A task carried from a parent run failed there, not here.
                failed |=
                    rec.steps().carried.is_none() && rec.result().is_some_and(|r| trips(r.state));
            }
        }
        Planner {
            picks: pick::Picks::new(state),
            sched: Sched::new(state),
            isolated,
            fail_fast_tripped: fail_fast && failed,
            budget_out: state.budget_exceeded.as_ref().map(|(_, r)| r.clone()),
            unpooled: state.batch.as_ref().is_some_and(|b| {
                b.tasks.iter().any(|t| {
                    std::iter::once(t.model.as_deref())
                        .chain(t.fallback_models.iter().map(|m| Some(m.as_str())))
                        .any(|m| crate::pool::pool_of(b, t, m).is_none())
                })
            }),
        }
    }

    /// Keeps the indexes current: `event` was just applied to `state`.
    pub fn observe(&mut self, state: &RunState, event: &Event) {
        if let Event::TaskFinished { task, result } = event {
            self.isolated.remove(task);
            let fail_fast = state.batch.as_ref().is_some_and(|b| b.config.fail_fast);
            self.fail_fast_tripped |= fail_fast && trips(result.state);
        }
        self.picks.observe(state, event);
        self.sched.observe(state, event);
    }

    /// The planned worktrees of unfinished isolated tasks: the runner checks which are on disk
    /// and passes the missing ones as [`Facts::missing_worktrees`].
    pub fn planned_worktrees<'s>(
        &'s self,
        state: &'s RunState,
    ) -> impl Iterator<Item = (TaskId, &'s str)> + 's {
        self.isolated.iter().filter_map(|&t| {
            let plan = state.task(t)?.steps().worktree.as_ref()?;
            Some((t, plan.path.as_str()))
        })
    }

    /// The next future time something falls due without a report (a retry's backoff, a
    /// deadline of a waiting task). A time already past needs no timer: a due retry waits for a
    /// free slot, which comes with a report, and an expired deadline was handled by the last
    /// round (a running task's deadline is its attempt's own timer).
    pub fn next_wake(&self, now: Timestamp) -> Option<Timestamp> {
        self.sched.next_wake(now)
    }

    /// [`Planner::next_wake`], and the run budget's deadline and its warning, when they are
    /// ahead (they fall due without a report).
    pub fn next_wake_of(&self, state: &RunState, now: Timestamp) -> Option<Timestamp> {
        let deadline = budget::deadline_wakes(state)
            .into_iter()
            .filter(|t| *t > now)
            .min();
        // A pool backing off launches again when its retry-after passed (issue 14).
        let pools = state
            .pools
            .values()
            .filter_map(|p| p.backoff_until)
            .filter(|t| *t > now)
            .min();
        [self.sched.next_wake(now), deadline, pools]
            .into_iter()
            .flatten()
            .min()
    }

    /// Plans one round. An empty round means nothing more happens without waiting.
    pub fn plan(&mut self, state: &RunState, facts: &Facts<'_>) -> Vec<Action> {
        let mut round = Round {
            facts: *facts,
            actions: Vec::new(),
            used: BTreeSet::new(),
            new_setups: 0,
        };
        if state.batch.is_none() || state.is_finished() {
            return round.actions;
        }
        if self.budget_out.is_none()
            && let Some(reason) = budget::check(state, &mut round)
        {
            round.push(Action::WindDown(reason.clone()));
            self.budget_out = Some(reason);
        }
        // Fixed for the round: a failure decided by this round stops launches from the next
        // pass on, but not a retry decided in this one.
        let no_launch =
            facts.stopping.is_some() || self.fail_fast_tripped || self.budget_out.is_some();
        self.picks.begin();
        self.cancelled_tasks(state, &mut round);
        self.picked_samples(state, &mut round);
        self.ended_tasks(state, &mut round, no_launch);
        self.worktrees(state, &mut round, no_launch);
        self.ready_tasks(state, &mut round);
        self.expired_waits(state, &mut round);
        if !no_launch && !self.fail_fast_tripped {
            self.free_slots(state, &mut round);
        }
        if round.actions.is_empty()
            && let Some(end) = run_end(state, facts)
        {
            round.push(Action::EndRun(end));
        }
        round.actions
    }

    /// Pass 1: tasks whose last attempt ended: retry, or end.
    /// Tasks a user cancelled (`sortie cancel --task`) that are not running: they end
    /// cancelled now (a running one ends once its stopped attempt reports, see `ended_tasks`).
    fn cancelled_tasks(&mut self, state: &RunState, round: &mut Round<'_>) {
        for &task in &state.control.cancelled {
            if round.busy(task) {
                continue;
            }
            let Some(rec) = state.task(task) else {
                continue;
            };
            let result = match rec.state {
                TaskState::Pending | TaskState::Queued { .. } if rec.attempts.is_empty() => {
                    decide::not_started_result(true)
                }
                TaskState::Pending | TaskState::Queued { .. } | TaskState::Retrying { .. } => {
                    decide::not_retried_result(rec, true)
                }
                _ => continue,
            };
            round.end(task, rec, result, false);
        }
    }

    fn ended_tasks(&mut self, state: &RunState, round: &mut Round<'_>, no_launch: bool) {
        let interrupting = round.facts.stopping == Some(Stopping::Interrupt);
        for task in self.sched.ended.clone() {
            let (Some(rec), Some(spec)) = (state.task(task), state.spec(task)) else {
                continue;
            };
            if !matches!(rec.state, TaskState::Ended { .. }) {
                self.sched.ended.remove(&task);
                continue;
            }
            if round.facts.jobs.contains_key(&task) {
                continue; // its worktree is being finalized
            }
            let seed = jitter(state, task, rec.attempts.len() as u32);
            let cancelled = state.control.cancelled.contains(&task);
            let step = decide::next_step(spec, rec, round.facts.now, seed);
            // #33: a sample that lost to a first-pass winner goes no further.
            if let Some(why) = self.picks.loss(state, task)
                && matches!(
                    step,
                    NextStep::Retry { .. } | NextStep::Verify | NextStep::Feedback { .. }
                )
            {
                let result = pick::lost_result(rec, &why);
                self.give_up(state, round, task, result);
                continue;
            }
            match step {
                // A user cancelled it: its attempt is not retried.
                NextStep::Retry { .. } if cancelled => {
                    let result = decide::not_retried_result(rec, true);
                    round.end(task, rec, result, false);
                }
                NextStep::Retry {
                    attempt,
                    model,
                    delay,
                    reason,
                } if !no_launch && rec.steps().worktree_final.is_none() => {
                    round.push(Action::Append(Event::RetryScheduled {
                        task,
                        next_attempt: attempt,
                        model,
                        delay,
                        reason,
                    }));
                }
                // Left undecided on purpose: resume decides, seeing the interruption.
                NextStep::Retry { .. } if interrupting => {}
                NextStep::Retry { .. } => {
                    let result = match &self.budget_out {
                        Some(reason) if !round.cancelling() => {
                            decide::run_budget_result(rec, reason)
                        }
                        _ => decide::not_retried_result(rec, round.cancelling()),
                    };
                    round.end(task, rec, result, false);
                }
                NextStep::GiveUp(result) => self.give_up(state, round, task, result),
                // #33: the check runs; a cancel stops it, and its verdict ends the task.
                NextStep::Checking => {}
                // Ended as a retry is when it cannot run: no artifact (a resume may decide
                // again, and an artifact would stand in the way of the check).
                NextStep::Verify if cancelled || round.cancelling() => {
                    let result = crate::verify::unverified_result(rec, "cancelled");
                    round.end(task, rec, result, false);
                }
                // Left undecided: resume runs the check.
                NextStep::Verify if interrupting => {}
                NextStep::Verify => {
                    if let Some(last) = rec.attempts.last() {
                        round.push(Action::Append(Event::VerifyStarted {
                            task,
                            attempt: last.attempt,
                        }));
                        round.push(Action::Verify(task));
                    }
                }
                NextStep::Feedback {
                    attempt,
                    model,
                    reason,
                    ..
                } if !no_launch && !cancelled && rec.steps().worktree_final.is_none() => {
                    round.push(Action::Append(Event::RetryScheduled {
                        task,
                        next_attempt: attempt,
                        model,
                        delay: std::time::Duration::ZERO,
                        reason,
                    }));
                }
                NextStep::Feedback { .. } if interrupting && !cancelled => {}
                NextStep::Feedback { failed, .. } => round.end(task, rec, failed, false),
            }
        }
    }

    /// Ends a task whose next step is to stop, with `result`: its artifact first when it has
    /// one to write (see `Round::end`).
    fn give_up(
        &mut self,
        state: &RunState,
        round: &mut Round<'_>,
        task: TaskId,
        mut result: TaskResult,
    ) {
        let (Some(rec), Some(spec)) = (state.task(task), state.spec(task)) else {
            return;
        };
        let fail_fast = state.batch.as_ref().is_some_and(|b| b.config.fail_fast);
        // fail_fast: nothing launches from the round that decides a failure on.
        self.fail_fast_tripped |= fail_fast && trips(result.state);
        let mut artifact = spec.output.is_some() && rec.steps().artifact.is_none();
        if artifact && rec.steps().worktree_final.is_some() {
            // The artifact comes before the finalize: a crash after a failed write left this.
            // The grammar allows no artifact after the finalize.
            artifact = false;
            result = decide::artifact_failed(
                result,
                "not written before the task's worktree was finalized",
            );
        }
        self.picks.ending(task, &result);
        round.end(task, rec, result, artifact);
    }

    /// Pass 2: the worktrees of waiting isolated tasks: set up (plan, create, or re-create a
    /// missing one), end a task whose setup failed, finalize before cancellation, fail_fast or a
    /// deadline ends a task (pass 4 ends those without a worktree), and end a task whose
    /// worktree a crash left finalized.
    fn worktrees(&mut self, state: &RunState, round: &mut Round<'_>, no_launch: bool) {
        if state.batch.is_none() {
            return;
        }
        let facts = round.facts;
        // Set up and about to launch: they hold their slots too.
        let ready = self
            .isolated
            .iter()
            .filter(|t| !facts.jobs.contains_key(t))
            .filter(|&&t| {
                state.task(t).is_some_and(|r| {
                    matches!(r.state, TaskState::Queued { .. })
                        && r.steps().worktree_final.is_none()
                        && worktree_ready(t, r, &facts)
                })
            })
            .count();
        let mut slots = concurrency(state).saturating_sub(facts.live + setup_jobs(&facts) + ready);
        for &task in &self.isolated {
            if round.busy(task) {
                continue;
            }
            let (Some(rec), Some(spec)) = (state.task(task), state.spec(task)) else {
                continue;
            };
            if !matches!(
                rec.state,
                TaskState::Queued { .. } | TaskState::Retrying { .. }
            ) {
                continue;
            }
            let expired = rec.deadline_at(spec).is_some_and(|at| facts.now >= at);
            let failed = facts.setup_failed.get(&task);
            let ending = round.cancelling()
                || self.fail_fast_tripped
                || self.budget_out.is_some()
                || expired;
            if rec.steps().worktree_final.is_some() || (failed.is_some() || ending) {
                if rec.steps().worktree_final.is_none()
                    && rec.steps().worktree.is_none()
                    && failed.is_none()
                {
                    continue; // nothing to finalize: pass 4 ends it
                }
                let result = self.waiting_result(state, task, rec, &facts);
                round.end(task, rec, result, false);
                continue;
            }
            if no_launch || slots == 0 || state.control.is_held(task) || self.picks.holds(task) {
                continue;
            }
            let kind = match &rec.steps().worktree {
                None => JobKind::Plan,
                Some(_)
                    if rec.steps().setup.is_none() || facts.missing_worktrees.contains(&task) =>
                {
                    JobKind::Create
                }
                Some(_) => continue,
            };
            round.push(Action::StartJob(task, kind));
            round.new_setups += 1;
            slots -= 1;
        }
    }

    /// Pass 3: pending tasks whose dependencies may all have ended.
    fn ready_tasks(&mut self, state: &RunState, round: &mut Round<'_>) {
        let interrupting = round.facts.stopping == Some(Stopping::Interrupt);
        for task in std::mem::take(&mut self.sched.check_pending) {
            let (Some(rec), Some(spec)) = (state.task(task), state.spec(task)) else {
                continue;
            };
            if rec.state != TaskState::Pending || round.used.contains(&task) {
                continue;
            }
            if round.cancelling() || self.fail_fast_tripped || self.budget_out.is_some() {
                let result = self.not_started(rec, round.cancelling());
                round.push(Action::Append(Event::TaskFinished { task, result }));
                continue;
            }
            let mut blocked = None;
            let mut waiting = false;
            // #13: a session task waits for the task of its session listed before it.
            let session_prev = self
                .sched
                .session_prev
                .get(task.index())
                .copied()
                .flatten()
                .and_then(|p| state.spec(p).map(|s| (p, &s.label, NeedsMode::Completed)));
            // #33: the task's `needs_mode` says which ends of its needs let it run; the
            // session's previous task must complete (its conversation goes on).
            let needs = spec
                .needs
                .iter()
                .filter_map(|n| state.task_by_label(n).map(|d| (d, n, spec.needs_mode)));
            for (dep, need, mode) in needs.chain(session_prev) {
                match state.task(dep).map(|r| &r.state) {
                    Some(TaskState::Finished(r)) if mode.accepts(r.state) => {}
                    Some(TaskState::Finished(r)) => blocked = Some((need, r.state)),
                    _ => waiting = true,
                }
            }
            let event = match (blocked, waiting) {
                (Some((need, st)), _) => Event::TaskFinished {
                    task,
                    result: decide::skipped_result(need, st),
                },
                (None, true) => continue,
                (None, false) if interrupting => continue,
                (None, false) => Event::TaskQueued { task },
            };
            round.push(Action::Append(event));
        }
    }

    /// Pass 4: waiting tasks: cancellation and fail_fast end them all; deadlines end the
    /// expired.
    fn expired_waits(&mut self, state: &RunState, round: &mut Round<'_>) {
        let all = round.cancelling() || self.fail_fast_tripped || self.budget_out.is_some();
        let waiting: Vec<(TaskId, Phase)> = if all {
            self.sched
                .all_waiting()
                .map(|t| (t, Phase::Queued))
                .collect()
        } else {
            self.sched.expired(state, round.facts.now)
        };
        for (task, phase) in waiting {
            if round.busy(task) {
                continue;
            }
            let Some(rec) = state.task(task) else {
                continue;
            };
            let result = if all {
                self.not_started(rec, round.cancelling())
            } else {
                let output = rec.attempts.last().and_then(|a| a.output());
                decide::deadline_result(rec, phase, output.unwrap_or_default())
            };
            round.push(Action::Append(Event::TaskFinished { task, result }));
        }
    }

    /// Pass 5: launches, oldest first, up to the concurrency limit.
    fn free_slots(&mut self, state: &RunState, round: &mut Round<'_>) {
        if state.batch.is_none() {
            return;
        }
        let facts = round.facts;
        let limit = concurrency(state);
        let mut free = limit.saturating_sub(facts.live + setup_jobs(&facts) + round.new_setups);
        // Issue 14: each pool's launches this round, and the pools that hold back.
        let mut planned: BTreeMap<String, u32> = BTreeMap::new();
        let mut holding: BTreeSet<String> = BTreeSet::new();
        for task in self.sched.launchable(facts.now) {
            if free == 0 {
                break;
            }
            if round.used.contains(&task) || state.control.is_held(task) || self.picks.holds(task) {
                continue;
            }
            let (Some(rec), Some(spec)) = (state.task(task), state.spec(task)) else {
                continue;
            };
            if spec.isolation == Isolation::Worktree && !worktree_ready(task, rec, &facts) {
                continue; // set up by pass 2
            }
            let (attempt, model) = match &rec.state {
                TaskState::Queued { .. } => {
                    let a = Attempt(rec.attempts.len() as u32 + 1);
                    (a, decide::model_for_attempt(spec, a))
                }
                TaskState::Retrying { next, model, .. } => (*next, model.clone()),
                _ => continue,
            };
            if let Some(batch) = &state.batch
                && let Some(name) = crate::pool::pool_of(batch, spec, model.as_deref())
            {
                let more = planned.get(&name).copied().unwrap_or(0);
                let holds = state
                    .pools
                    .get(&name)
                    .is_some_and(|p| p.holds(facts.now, limit as u32, more));
                if holds {
                    holding.insert(name);
                    if !self.unpooled && holding.len() >= state.pools.len() {
                        break; // every pool holds back: nothing further can launch
                    }
                    continue;
                }
                *planned.entry(name).or_insert(0) += 1;
            }
            round.push(Action::Append(Event::AttemptLaunching {
                task,
                attempt,
                model,
            }));
            round.push(Action::Launch(task));
            free -= 1;
        }
    }

    /// How a waiting (queued or retrying) isolated task ends: its deadline, its failed setup,
    /// cancellation or fail_fast; one whose worktree a crash left finalized ends cancelled.
    fn waiting_result(
        &self,
        state: &RunState,
        task: TaskId,
        rec: &TaskRecord,
        facts: &Facts<'_>,
    ) -> TaskResult {
        let expired = state
            .spec(task)
            .and_then(|spec| rec.deadline_at(spec))
            .is_some_and(|at| facts.now >= at);
        if expired {
            let output = rec.attempts.last().and_then(|a| a.output());
            let phase = if rec.attempts.is_empty() && rec.steps().worktree.is_none() {
                Phase::Queued
            } else {
                Phase::Starting
            };
            return decide::deadline_result(rec, phase, output.unwrap_or_default());
        }
        if let Some(why) = facts.setup_failed.get(&task) {
            return decide::result_without_attempt(
                TerminalState::Failed,
                StopReason::SetupError,
                None,
                &format!("worktree setup failed: {why}"),
            );
        }
        let cancelling = facts.stopping == Some(Stopping::Cancel);
        if !cancelling && let Some(reason) = &self.budget_out {
            return decide::run_budget_result(rec, reason);
        }
        decide::not_started_result(cancelling || !self.fail_fast_tripped)
    }

    /// How a task that waits ends when nothing more starts: cancelled by the user, by the run's
    /// budget, or by fail_fast.
    fn not_started(&self, rec: &TaskRecord, cancelling: bool) -> TaskResult {
        match &self.budget_out {
            Some(reason) if !cancelling => decide::run_budget_result(rec, reason),
            _ => decide::not_started_result(cancelling),
        }
    }
}

/// Whether a task's end trips fail_fast.
fn trips(state: TerminalState) -> bool {
    matches!(state, TerminalState::Failed | TerminalState::Timeout)
}

/// Setup jobs in flight: each holds a concurrency slot.
fn setup_jobs(facts: &Facts<'_>) -> usize {
    facts
        .jobs
        .values()
        .filter(|k| **k != JobKind::Finalize)
        .count()
}

/// Whether an isolated task's worktree is planned, set up, and there.
fn worktree_ready(task: TaskId, rec: &TaskRecord, facts: &Facts<'_>) -> bool {
    rec.steps().worktree.is_some()
        && rec.steps().setup.is_some()
        && !facts.missing_worktrees.contains(&task)
}

/// The deterministic jitter seed of a task's retry: a digest of run, task and attempt count.
pub fn jitter(state: &RunState, task: TaskId, attempts: u32) -> u64 {
    let run = state.run_id.as_ref().map_or("", |r| r.as_str());
    let mut bytes = run.as_bytes().to_vec();
    bytes.extend_from_slice(&task.0.to_le_bytes());
    bytes.extend_from_slice(&attempts.to_le_bytes());
    fnv1a(&bytes)
}

/// How many tasks may run at once: a user's `sortie concurrency`, else the batch's.
fn concurrency(state: &RunState) -> usize {
    let batch = state.batch.as_ref().map_or(1, |b| b.config.concurrency);
    state.control.concurrency.unwrap_or(batch) as usize
}

/// Whether the run ends now, once a round has nothing else to do: finished when every task is;
/// interrupted when an interrupt was asked for and nothing is in flight (no live attempt, no
/// worktree job). A cancel ends every task instead, and so finishes the run.
fn run_end(state: &RunState, facts: &Facts<'_>) -> Option<RunEnding> {
    if state.all_finished() {
        return Some(RunEnding::Finished);
    }
    (facts.stopping == Some(Stopping::Interrupt) && facts.live == 0 && facts.jobs.is_empty())
        .then_some(RunEnding::Interrupted)
}

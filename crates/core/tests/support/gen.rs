//! A generator of random but legal sortie runs, shared by core's and the journal's model tests.
//!
//! A [`Scenario`] is a small random batch and a list of [`Op`]s that a runner could do (queue,
//! launch, start, report progress, finish, decide, skip, cancel, Ctrl-C, crash, resume, ...).
//! [`Driver::run`] interprets the ops against a [`Backend`] that stores the events (a `Vec` for
//! core, a real journal on disk for the journal crate) and keeps the live [`RunState`] the way
//! the runner does: it asks the state to `check` every event before appending it, appends it,
//! then applies it. Ops that do not fit the current state are no-ops, so every op list is legal
//! and shrinks well. A crash drops the live state (and the backend's handle); a resume rebuilds
//! it from the backend, orphans the live attempts and decides the undecided tasks.
//!
//! The "fake agents" report usage that is unique per attempt: `reasoning` is the bit
//! `1 << (4 * task + attempt - 1)`, so a usage counted twice shows up as a carry.
//!
//! Included with `#[path = "../../core/tests/support/gen.rs"] mod gen;` (no extra crate).

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the generator"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use sortie_core::decide::{deadline_result, result_without_attempt};
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, AttemptStatus, Batch, Cost, Event, Isolation, NextStep,
    OrphanAction, Phase, ResumePlan, RunConfig, RunId, RunState, Seq, Stamped, StopReason, TaskId,
    TaskResult, TaskSpec, TaskState, TerminalState, Timestamp, Usage, model_for_attempt, next_step,
    resume_plan, summary_text, validate_batch,
};

/// The most tasks a generated batch has.
pub(crate) const MAX_TASKS: usize = 6;

/// Where the generated events go: the runner's storage.
pub(crate) trait Backend {
    /// Stores an event durably and returns the seq it was given.
    fn append(&mut self, at: Timestamp, event: &Event) -> Seq;
    /// The process died: forget everything that is not stored.
    fn crash(&mut self);
    /// A new process opens the run: the state replayed from storage.
    fn reopen(&mut self) -> RunState;
}

/// The simplest backend: a `Vec` in memory, which survives crashes by construction.
#[derive(Debug, Default)]
pub(crate) struct MemBackend {
    /// The stored events.
    pub(crate) events: Vec<Stamped>,
}

impl Backend for MemBackend {
    fn append(&mut self, at: Timestamp, event: &Event) -> Seq {
        let seq = Seq(self.events.len() as u64);
        self.events.push(Stamped {
            seq,
            at,
            event: event.clone(),
        });
        seq
    }

    fn crash(&mut self) {}

    fn reopen(&mut self) -> RunState {
        RunState::replay(&self.events).expect("stored events replay")
    }
}

/// How a fake attempt ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutcomeKind {
    /// Completed, exit 0.
    Completed,
    /// Partial: stopped by a budget.
    PartialBudget,
    /// A real task failure.
    NonzeroExit,
    /// A transient provider error.
    Error,
    /// A model error (quota, auth).
    ModelError,
    /// The agent could not be spawned.
    SpawnError,
    /// Stopped by the stall watchdog.
    Stalled,
    /// `attempt_timeout` while running.
    TimeoutRunning,
    /// Cancelled.
    Cancelled,
    /// The protocol was incomplete.
    ProtocolError,
}

impl OutcomeKind {
    /// The outcome an attempt reports.
    pub(crate) fn outcome(self, side_effects: bool) -> AttemptOutcome {
        let mut o = match self {
            OutcomeKind::Completed => AttemptOutcome::completed(),
            OutcomeKind::PartialBudget => {
                let mut o = AttemptOutcome::failed(StopReason::Budget, "token budget exhausted");
                o.status = AttemptStatus::Partial;
                o
            }
            OutcomeKind::NonzeroExit => {
                let mut o = AttemptOutcome::failed(StopReason::NonzeroExit, "exit code 1");
                o.exit_code = Some(1);
                o
            }
            OutcomeKind::Error => AttemptOutcome::failed(StopReason::Error, "429 rate limit"),
            OutcomeKind::ModelError => {
                AttemptOutcome::failed(StopReason::ModelError, "403 quota exceeded")
            }
            OutcomeKind::SpawnError => {
                AttemptOutcome::failed(StopReason::SpawnError, "No such file or directory")
            }
            OutcomeKind::Stalled => AttemptOutcome::failed(StopReason::Stalled, "no output"),
            OutcomeKind::TimeoutRunning => {
                let mut o = AttemptOutcome::failed(StopReason::Timeout, "attempt timed out");
                o.phase = Some(Phase::Running);
                o
            }
            OutcomeKind::Cancelled => AttemptOutcome::failed(StopReason::Cancelled, "cancelled"),
            OutcomeKind::ProtocolError => {
                AttemptOutcome::failed(StopReason::ProtocolError, "no final message")
            }
        };
        o.side_effects = side_effects;
        o
    }
}

/// One thing a runner (or its user, or fate) may do. Selectors pick among the tasks the op fits,
/// modulo their number; an op that fits nothing does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Time passes (a quarter of this many ms: up to 16 s).
    Tick(u16),
    /// A pending task whose needs completed is queued.
    Queue(u8),
    /// A queued task is set up (worktree or not) before its first attempt.
    SetUp(u8),
    /// A queued or retrying task launches an attempt, if a slot is free.
    Launch(u8),
    /// A launching attempt's process is started.
    Start(u8),
    /// A running attempt's agent does some work; it is checkpointed when the flag says so.
    Progress(u8, u8, bool),
    /// A running attempt is marked stalled.
    Stall(u8),
    /// A running attempt's agent runs a side-effecting tool (`AttemptSideEffects`, once).
    SideEffects(u8),
    /// A launching retry continues an earlier attempt's session (`AttemptContinues`).
    Continue(u8),
    /// A live attempt ends (side effects or not).
    Finish(u8, OutcomeKind, bool),
    /// The next step of an ended task is decided and recorded.
    Decide(u8),
    /// A pending task whose need did not complete is skipped.
    Skip(u8),
    /// A task's deadline runs out.
    Deadline(u8),
    /// After a failure with `fail_fast`, tasks not started are cancelled.
    FailFast,
    /// Ctrl-C: live attempts end as interrupted, `RunInterrupted`, the process exits.
    Interrupt,
    /// The process dies after this many more events (0: at the next one).
    CrashIn(u8),
    /// The process dies now.
    Crash,
    /// A new process resumes the run (orphan actions chosen by the bits).
    Resume(u8),
    /// `sortie cancel`: everything unfinished is cancelled and the run finishes.
    Cancel,
    /// The run finishes, if every task has.
    FinishRun,
}

/// A batch and what happens to it.
#[derive(Clone)]
pub(crate) struct Scenario {
    /// The batch.
    pub(crate) batch: Batch,
    /// The ops, in order.
    pub(crate) ops: Vec<Op>,
    /// Whether the run is driven to its end after the ops (else it stops wherever it is).
    pub(crate) finish: bool,
}

impl std::fmt::Debug for Scenario {
    /// One line per task, so that a shrunk failure reads at a glance.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let c = &self.batch.config;
        writeln!(
            f,
            "Scenario (concurrency {}, fail_fast {}, finish {}):",
            c.concurrency, c.fail_fast, self.finish
        )?;
        for t in &self.batch.tasks {
            writeln!(
                f,
                "  {}: model {:?} fallbacks {:?} max_retries {} deadline {:?} {:?} output {:?} \
                 retry_after_side_effects {} needs {:?}",
                t.label,
                t.model,
                t.fallback_models,
                t.max_retries,
                t.deadline,
                t.isolation,
                t.output,
                t.retry_after_side_effects,
                t.needs
            )?;
        }
        writeln!(f, "  ops: {:?}", self.ops)
    }
}

fn task_strategy(i: usize) -> impl Strategy<Value = TaskSpec> {
    let pool = ["m-a", "m-b", "m-c"];
    (
        prop::option::weighted(0.7, 0..pool.len()),
        prop::collection::vec(0..pool.len(), 0..=3),
        0u32..=3,
        prop::option::weighted(0.4, 5u64..120),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(any::<bool>(), i),
    )
        .prop_map(
            move |(model, fallbacks, retries, deadline, worktree, output, rase, needs)| {
                let mut t = TaskSpec::new(format!("t{i}"), "/work");
                t.prompt = Some(format!("do task {i}"));
                t.model = model.map(|m| pool[m].to_owned());
                t.fallback_models = fallbacks.into_iter().map(|m| pool[m].to_owned()).collect();
                t.max_retries = retries;
                t.deadline = deadline.map(Duration::from_secs);
                if worktree {
                    t.isolation = Isolation::Worktree;
                }
                if output {
                    t.output = Some(format!("/work/out/t{i}.md"));
                }
                t.retry_after_side_effects = rase;
                t.needs = needs
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n)
                    .map(|(j, _)| format!("t{j}"))
                    .collect();
                t
            },
        )
}

/// A valid batch of 1 to [`MAX_TASKS`] tasks whose `needs` form a DAG.
pub(crate) fn batch_strategy() -> impl Strategy<Value = Batch> {
    (1..=MAX_TASKS, 1u32..=3, prop::bool::weighted(0.3)).prop_flat_map(|(n, concurrency, ff)| {
        let tasks: Vec<_> = (0..n).map(task_strategy).collect();
        tasks.prop_map(move |tasks| Batch {
            tasks,
            agents: AgentProfile::builtins(),
            config: RunConfig {
                concurrency,
                fail_fast: ff,
            },
            source: "model.toml".into(),
        })
    })
}

fn outcome_kind() -> impl Strategy<Value = OutcomeKind> {
    prop_oneof![
        3 => Just(OutcomeKind::Completed),
        1 => Just(OutcomeKind::PartialBudget),
        1 => Just(OutcomeKind::NonzeroExit),
        3 => Just(OutcomeKind::Error),
        2 => Just(OutcomeKind::ModelError),
        1 => Just(OutcomeKind::SpawnError),
        1 => Just(OutcomeKind::Stalled),
        1 => Just(OutcomeKind::TimeoutRunning),
        1 => Just(OutcomeKind::Cancelled),
        1 => Just(OutcomeKind::ProtocolError),
    ]
}

/// One op.
pub(crate) fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => any::<u16>().prop_map(Op::Tick),
        30 => any::<u8>().prop_map(Op::Queue),
        5 => any::<u8>().prop_map(Op::SetUp),
        40 => any::<u8>().prop_map(Op::Launch),
        30 => any::<u8>().prop_map(Op::Start),
        80 => (any::<u8>(), any::<u8>(), prop::bool::weighted(0.7))
            .prop_map(|(s, i, j)| Op::Progress(s, i, j)),
        5 => any::<u8>().prop_map(Op::Stall),
        8 => any::<u8>().prop_map(Op::SideEffects),
        5 => any::<u8>().prop_map(Op::Continue),
        40 => (any::<u8>(), outcome_kind(), prop::bool::weighted(0.3))
            .prop_map(|(s, k, fx)| Op::Finish(s, k, fx)),
        40 => any::<u8>().prop_map(Op::Decide),
        10 => any::<u8>().prop_map(Op::Skip),
        4 => any::<u8>().prop_map(Op::Deadline),
        5 => Just(Op::FailFast),
        3 => Just(Op::Interrupt),
        4 => (0u8..6).prop_map(Op::CrashIn),
        3 => Just(Op::Crash),
        20 => any::<u8>().prop_map(Op::Resume),
        1 => Just(Op::Cancel),
        5 => Just(Op::FinishRun),
    ]
}

/// A scenario: a batch, 10 to 200 ops, and (mostly) a drive to the end.
pub(crate) fn scenario_strategy() -> impl Strategy<Value = Scenario> {
    (
        batch_strategy(),
        prop::collection::vec(op_strategy(), 10..200),
        prop::bool::weighted(0.85),
    )
        .prop_map(|(batch, ops, finish)| Scenario { batch, ops, finish })
}

/// A resume, as the generator saw it: the plan, and how many events the journal held.
#[derive(Debug, Clone)]
pub(crate) struct Resume {
    /// How many events were stored when the run was reopened (before `RunResumed`).
    pub(crate) at: usize,
    /// The state replayed at reopen.
    pub(crate) state: RunState,
    /// The plan computed from it.
    pub(crate) plan: ResumePlan,
}

/// What a scenario produced.
#[derive(Debug, Clone)]
pub(crate) struct Trace {
    /// The batch.
    pub(crate) batch: Batch,
    /// Every stored event, in order.
    pub(crate) events: Vec<Stamped>,
    /// The live state right after each event (`lives[k]` after `events[k]`).
    pub(crate) lives: Vec<RunState>,
    /// The last usage each fake agent reported that made it to storage, per (task, attempt).
    pub(crate) reported: BTreeMap<(TaskId, Attempt), Usage>,
    /// Every resume.
    pub(crate) resumes: Vec<Resume>,
    /// How many crashes happened.
    pub(crate) crashes: usize,
    /// How many times a new process opened the run (resumes, and reopens of a finished run).
    pub(crate) reopens: usize,
}

/// A live fake agent: what its attempt has consumed so far (stored or not).
#[derive(Debug, Clone, Copy)]
struct Agent {
    current: Usage,
}

/// The bit that marks a task's attempt in `Usage::reasoning`.
pub(crate) fn attempt_bit(task: TaskId, attempt: Attempt) -> u64 {
    1u64 << (4 * u64::from(task.0) + u64::from(attempt.0.saturating_sub(1)))
}

/// The jitter the runner would use for a task's attempt.
pub(crate) fn jitter(task: TaskId, attempt: Attempt) -> u64 {
    u64::from(task.0) * 7919 + u64::from(attempt.0) * 104_729
}

/// Interprets ops against a backend, keeping the live state as the runner does.
pub(crate) struct Driver<B: Backend> {
    backend: B,
    batch: Batch,
    /// The live state; `None` while no process owns the run (after a crash or Ctrl-C).
    state: Option<RunState>,
    events: Vec<Stamped>,
    lives: Vec<RunState>,
    agents: BTreeMap<(TaskId, Attempt), Agent>,
    reported: BTreeMap<(TaskId, Attempt), Usage>,
    resumes: Vec<Resume>,
    crashes: usize,
    reopens: usize,
    now: u64,
    pid: u32,
    /// Events left before a planned crash.
    crash_in: Option<u8>,
}

impl<B: Backend> Driver<B> {
    /// Runs a scenario against a backend and returns the trace and the backend.
    pub(crate) fn run(scenario: &Scenario, backend: B) -> (Trace, B) {
        let mut d = Driver {
            backend,
            batch: scenario.batch.clone(),
            state: Some(RunState::new()),
            events: Vec::new(),
            lives: Vec::new(),
            agents: BTreeMap::new(),
            reported: BTreeMap::new(),
            resumes: Vec::new(),
            crashes: 0,
            reopens: 0,
            now: 1_000_000,
            pid: 100,
            crash_in: None,
        };
        assert_eq!(validate_batch(&d.batch), Ok(()), "generated batch is valid");
        let started = Event::RunStarted {
            run_id: RunId::new("model-run").expect("valid run id"),
            batch: d.batch.clone(),
            batch_digest: 42,
            host: "model-host".into(),
            pid: d.pid,
        };
        d.emit(started);
        for op in &scenario.ops {
            d.op(op);
        }
        if scenario.finish {
            d.crash_in = None;
            d.wind_down();
        }
        let trace = Trace {
            batch: d.batch,
            events: d.events,
            lives: d.lives,
            reported: d.reported,
            resumes: d.resumes,
            crashes: d.crashes,
            reopens: d.reopens,
        };
        (trace, d.backend)
    }

    fn st(&self) -> Option<&RunState> {
        self.state.as_ref().filter(|s| !s.is_finished())
    }

    fn tasks(&self) -> Vec<TaskId> {
        (0..self.batch.tasks.len())
            .map(|i| TaskId(i as u32))
            .collect()
    }

    fn spec(&self, task: TaskId) -> &TaskSpec {
        &self.batch.tasks[task.index()]
    }

    /// Tasks of the live state that satisfy `pred`, picked by `sel`.
    fn pick(
        &self,
        sel: u8,
        pred: impl Fn(&RunState, TaskId, &sortie_core::TaskRecord) -> bool,
    ) -> Option<TaskId> {
        let st = self.st()?;
        let fits: Vec<TaskId> = self
            .tasks()
            .into_iter()
            .filter(|&t| pred(st, t, &st.tasks[t.index()]))
            .collect();
        if fits.is_empty() {
            None
        } else {
            Some(fits[usize::from(sel) % fits.len()])
        }
    }

    /// Checks, stores and applies one event. `None` when the process is dead (or dies now).
    fn emit(&mut self, event: Event) -> Option<()> {
        let state = self.state.as_ref()?;
        if let Some(left) = self.crash_in {
            if left == 0 {
                self.crash();
                return None;
            }
            self.crash_in = Some(left - 1);
        }
        self.now += 1;
        if let Err(v) = state.check(&event) {
            panic!("the generator made an event the state refuses: {v}\nevent: {event:?}");
        }
        let at = Timestamp(self.now);
        let seq = self.backend.append(at, &event);
        let state = self.state.as_mut().expect("live");
        assert_eq!(seq, state.next_seq, "the backend assigns the next seq");
        let stamped = Stamped { seq, at, event };
        if let Err(v) = state.apply(&stamped) {
            panic!("apply refused an event that check accepted: {v}\n{stamped:?}");
        }
        match &stamped.event {
            Event::AttemptProgress {
                task,
                attempt,
                usage,
            }
            | Event::AttemptFinished {
                task,
                attempt,
                usage,
                ..
            } => {
                self.reported.insert((*task, *attempt), *usage);
            }
            _ => {}
        }
        self.lives.push(state.clone());
        self.events.push(stamped);
        Some(())
    }

    fn crash(&mut self) {
        if self.state.take().is_some() {
            self.backend.crash();
            self.agents.clear();
            self.crashes += 1;
        }
        self.crash_in = None;
    }

    fn live_count(st: &RunState) -> usize {
        st.tasks
            .iter()
            .filter(|t| matches!(t.state, TaskState::Running { .. }))
            .count()
    }

    fn fail_fast_tripped(&self, st: &RunState) -> bool {
        self.batch.config.fail_fast
            && st.tasks.iter().any(|t| {
                t.result().is_some_and(|r| {
                    matches!(r.state, TerminalState::Failed | TerminalState::Timeout)
                })
            })
    }

    fn needs(&self, st: &RunState, task: TaskId) -> Vec<TaskId> {
        self.spec(task)
            .needs
            .iter()
            .map(|l| st.task_by_label(l).expect("needs name tasks of the batch"))
            .collect()
    }

    fn needs_done(&self, st: &RunState, task: TaskId) -> bool {
        self.needs(st, task).iter().all(|n| {
            st.tasks[n.index()]
                .result()
                .is_some_and(|r| r.state == TerminalState::Completed)
        })
    }

    fn need_failed(&self, st: &RunState, task: TaskId) -> bool {
        self.needs(st, task).iter().any(|n| {
            st.tasks[n.index()]
                .result()
                .is_some_and(|r| r.state != TerminalState::Completed)
        })
    }

    fn past_deadline(&self, st: &RunState, task: TaskId) -> bool {
        let rec = &st.tasks[task.index()];
        match (self.spec(task).deadline, rec.ready_at) {
            (Some(d), Some(ready)) => Timestamp(self.now) >= ready.plus(d),
            _ => false,
        }
    }

    fn bump(&mut self, task: TaskId, attempt: Attempt, inc: u8) -> Usage {
        let agent = self.agents.entry((task, attempt)).or_insert_with(|| {
            let cost = if (task.0 + attempt.0).is_multiple_of(3) {
                Cost::unreported()
            } else {
                Cost::reported_nanos(0)
            };
            Agent {
                current: Usage {
                    reasoning: attempt_bit(task, attempt),
                    cost,
                    ..Usage::ZERO
                },
            }
        });
        let u = &mut agent.current;
        let inc = u64::from(inc);
        u.input += 100 + inc;
        u.output += inc;
        u.cache_read += inc / 2;
        u.cache_write += inc % 3;
        u.turns += 1;
        if u.cost.unreported == 0 {
            u.cost.nanos += 1000 * (inc + 1);
        }
        u.context_tokens = 50 + inc;
        *u
    }

    /// What a live attempt consumed in the end: its agent's count, else its last checkpoint.
    fn final_usage(&self, task: TaskId, attempt: Attempt, stored: Usage) -> Usage {
        self.agents
            .get(&(task, attempt))
            .map_or(stored, |a| a.current)
    }

    fn op(&mut self, op: &Op) {
        match op {
            Op::Tick(ms) => self.now += u64::from(*ms) / 4,
            Op::Queue(sel) => {
                if let Some(t) = self.pick(*sel, |st, t, r| {
                    r.state == TaskState::Pending
                        && self.needs_done(st, t)
                        && !self.fail_fast_tripped(st)
                }) {
                    self.emit(Event::TaskQueued { task: t });
                }
            }
            Op::SetUp(sel) => {
                if let Some(t) = self.pick(*sel, |_, _, r| {
                    matches!(r.state, TaskState::Queued { .. })
                        && r.setup.is_none()
                        && r.worktree_final.is_none()
                }) {
                    self.set_up(t);
                }
            }
            Op::Launch(sel) => {
                if let Some(t) = self.pick(*sel, |st, t, r| self.can_launch(st, t, r)) {
                    self.launch(t);
                }
            }
            Op::Start(sel) => {
                if let Some(t) = self.pick(*sel, |_, _, r| {
                    r.live_attempt().is_some_and(|a| a.pid.is_none())
                }) {
                    self.start(t);
                }
            }
            Op::Progress(sel, inc, store) => {
                if let Some(t) = self.pick(*sel, |_, _, r| {
                    r.live_attempt().is_some_and(|a| a.pid.is_some())
                }) {
                    let attempt = self.live_attempt(t);
                    let usage = self.bump(t, attempt, *inc);
                    if *store {
                        self.emit(Event::AttemptProgress {
                            task: t,
                            attempt,
                            usage,
                        });
                    }
                }
            }
            Op::Stall(sel) => {
                if let Some(t) = self.pick(*sel, |_, _, r| {
                    r.live_attempt().is_some_and(|a| a.pid.is_some())
                }) {
                    let attempt = self.live_attempt(t);
                    self.emit(Event::AttemptStalled { task: t, attempt });
                }
            }
            Op::SideEffects(sel) => {
                if let Some(t) = self.pick(*sel, |_, _, r| {
                    r.live_attempt()
                        .is_some_and(|a| a.pid.is_some() && !a.side_effects)
                }) {
                    let attempt = self.live_attempt(t);
                    self.emit(Event::AttemptSideEffects { task: t, attempt });
                }
            }
            Op::Continue(sel) => {
                if let Some(t) = self.pick(*sel, |_, _, r| {
                    r.attempts.len() >= 2
                        && r.live_attempt()
                            .is_some_and(|a| a.pid.is_none() && a.continues.is_none())
                }) {
                    let attempt = self.live_attempt(t);
                    let session =
                        format!("/state/runs/model-run/sessions/{}.{}", t.0, attempt.0 - 1);
                    self.emit(Event::AttemptContinues {
                        task: t,
                        attempt,
                        session,
                    });
                }
            }
            Op::Finish(sel, kind, fx) => {
                if let Some(t) = self.pick(*sel, |_, _, r| r.live_attempt().is_some()) {
                    self.finish_attempt(t, *kind, *fx);
                }
            }
            Op::Decide(sel) => {
                if let Some(t) =
                    self.pick(*sel, |_, _, r| matches!(r.state, TaskState::Ended { .. }))
                {
                    self.decide(t);
                }
            }
            Op::Skip(sel) => {
                if let Some(t) = self.pick(*sel, |st, t, r| {
                    r.state == TaskState::Pending && self.need_failed(st, t)
                }) {
                    self.skip(t);
                }
            }
            Op::Deadline(sel) => {
                if let Some(t) = self.pick(*sel, |_, t, r| {
                    self.spec(t).deadline.is_some()
                        && r.ready_at.is_some()
                        && matches!(
                            r.state,
                            TaskState::Queued { .. }
                                | TaskState::Retrying { .. }
                                | TaskState::Running { .. }
                        )
                }) {
                    self.deadline(t);
                }
            }
            Op::FailFast => {
                if self.st().is_some_and(|st| self.fail_fast_tripped(st)) {
                    self.cancel_unstarted();
                }
            }
            Op::Interrupt => {
                self.interrupt();
            }
            Op::CrashIn(n) => {
                if self.state.is_some() {
                    self.crash_in = Some(*n);
                }
            }
            Op::Crash => self.crash(),
            Op::Resume(bits) => {
                if self.state.is_none() {
                    self.resume(*bits);
                }
            }
            Op::Cancel => {
                self.cancel();
            }
            Op::FinishRun => {
                if self.st().is_some_and(RunState::all_finished) {
                    self.finish_run();
                }
            }
        }
    }

    fn live_attempt(&self, task: TaskId) -> Attempt {
        self.state.as_ref().expect("live").tasks[task.index()]
            .live_attempt()
            .expect("a live attempt")
            .attempt
    }

    fn setup_event(&self, task: TaskId) -> Event {
        let worktree = (self.spec(task).isolation == Isolation::Worktree)
            .then(|| format!("/state/worktrees/t{}", task.0));
        Event::TaskSetUp { task, worktree }
    }

    /// `WorktreePlanned` (for an isolated task, unless a crash left it recorded already), then
    /// `TaskSetUp`; a crash may fall between them.
    fn set_up(&mut self, task: TaskId) -> Option<()> {
        let planned = self.st()?.tasks[task.index()].worktree.is_some();
        if self.spec(task).isolation == Isolation::Worktree && !planned {
            self.emit(Event::WorktreePlanned {
                task,
                repo: "/repo".into(),
                path: format!("/state/worktrees/run/t{}", task.0),
                branch: format!("sortie/run/t{}", task.0),
                base: "0".repeat(40),
            })?;
        }
        self.emit(self.setup_event(task))
    }

    fn can_launch(&self, st: &RunState, task: TaskId, rec: &sortie_core::TaskRecord) -> bool {
        if Self::live_count(st) >= self.batch.config.concurrency as usize
            || self.past_deadline(st, task)
        {
            return false;
        }
        if rec.worktree_final.is_some() {
            return false;
        }
        match rec.state {
            TaskState::Queued { .. } => !self.fail_fast_tripped(st),
            TaskState::Retrying { .. } => true,
            _ => false,
        }
    }

    fn launch(&mut self, task: TaskId) -> Option<()> {
        let rec = &self.st()?.tasks[task.index()];
        let needs_setup = self.spec(task).isolation == Isolation::Worktree && rec.setup.is_none();
        let (attempt, model, not_before) = match &rec.state {
            TaskState::Queued { .. } => {
                let a = Attempt(rec.attempts.len() as u32 + 1);
                (a, model_for_attempt(self.spec(task), a), 0)
            }
            TaskState::Retrying {
                next,
                model,
                not_before,
            } => (*next, model.clone(), not_before.0),
            _ => return None,
        };
        // A runner waits for the backoff before it launches a retry.
        self.now = self.now.max(not_before);
        if needs_setup {
            self.set_up(task)?;
        }
        self.emit(Event::AttemptLaunching {
            task,
            attempt,
            model,
        })
    }

    fn start(&mut self, task: TaskId) -> Option<()> {
        let attempt = self.live_attempt(task);
        self.emit(Event::AttemptStarted {
            task,
            attempt,
            pid: 10_000 + task.0 * 10 + attempt.0,
            start_time: self.now,
        })
    }

    fn finish_attempt(
        &mut self,
        task: TaskId,
        kind: OutcomeKind,
        side_effects: bool,
    ) -> Option<()> {
        let unstarted = self.st()?.tasks[task.index()]
            .live_attempt()
            .is_some_and(|a| a.pid.is_none());
        if unstarted && kind != OutcomeKind::SpawnError {
            self.start(task)?;
        }
        let rec = &self.st()?.tasks[task.index()];
        let a = rec.live_attempt()?;
        let attempt = a.attempt;
        let (outcome, usage) = if a.pid.is_none() {
            // Without a process, the only way for an attempt to end is a spawn error.
            (OutcomeKind::SpawnError.outcome(false), a.usage)
        } else {
            // The reader that reported side effects live says so again at the end.
            let side_effects = side_effects || a.side_effects;
            let usage = self.bump(task, attempt, attempt.0 as u8);
            (kind.outcome(side_effects), usage)
        };
        let output = if outcome.status == AttemptStatus::Failed {
            String::new()
        } else {
            format!("output of t{} attempt {}", task.0, attempt.0)
        };
        self.emit(Event::AttemptFinished {
            task,
            attempt,
            outcome,
            usage,
            output,
        })?;
        self.agents.remove(&(task, attempt));
        Some(())
    }

    /// Records the next step of an ended task.
    fn decide(&mut self, task: TaskId) -> Option<()> {
        let rec = &self.st()?.tasks[task.index()];
        let attempt = rec.attempts.last()?.attempt;
        let step = next_step(
            self.spec(task),
            rec,
            Timestamp(self.now),
            jitter(task, attempt),
        );
        match step {
            // A finish step is stored (a crash cut a cancel short): the task cannot run again,
            // and nothing in the journal says why it was finishing; end it as cancelled.
            NextStep::Retry { .. } if rec.artifact.is_some() || rec.worktree_final.is_some() => {
                let result = cancelled_result(rec);
                self.finish_task(task, result, false)
            }
            NextStep::Retry {
                attempt,
                model,
                delay,
                reason,
            } => self.emit(Event::RetryScheduled {
                task,
                next_attempt: attempt,
                model,
                delay,
                reason,
            }),
            NextStep::GiveUp(result) => self.finish_task(task, result, true),
        }
    }

    /// `ArtifactWritten?` `WorktreeFinalized?` `TaskFinished`, skipping what is already stored;
    /// the artifact only when `artifact` (a task cancelled instead of retried has none).
    fn finish_task(&mut self, task: TaskId, result: TaskResult, artifact: bool) -> Option<()> {
        let rec = &self.st()?.tasks[task.index()];
        let artifact = match (&self.spec(task).output, &rec.state, &rec.artifact) {
            (Some(path), TaskState::Ended { .. }, None) if artifact => {
                Some(Event::ArtifactWritten {
                    task,
                    path: path.clone(),
                    bytes: result.text.len() as u64,
                    digest: result.text.len() as u64 * 31 + u64::from(task.0),
                })
            }
            _ => None,
        };
        if let Some(event) = artifact {
            self.emit(event)?;
        }
        let rec = &self.st()?.tasks[task.index()];
        if (matches!(rec.setup, Some(Some(_))) || rec.worktree.is_some())
            && rec.worktree_final.is_none()
        {
            let changed = !rec.attempts.is_empty() && task.0.is_multiple_of(2);
            self.emit(Event::WorktreeFinalized {
                task,
                changed,
                diff: changed.then(|| "1 file changed".to_owned()),
            })?;
        }
        self.emit(Event::TaskFinished { task, result })
    }

    fn skip(&mut self, task: TaskId) -> Option<()> {
        let result = result_without_attempt(
            TerminalState::Skipped,
            StopReason::Cancelled,
            None,
            "a dependency did not complete",
        );
        self.emit(Event::TaskFinished { task, result })
    }

    fn deadline(&mut self, task: TaskId) -> Option<()> {
        let rec = &self.st()?.tasks[task.index()];
        let (Some(d), Some(ready)) = (self.spec(task).deadline, rec.ready_at) else {
            return None;
        };
        let live = rec.live_attempt().map(|a| (a.attempt, a.usage));
        let result = match rec.state {
            TaskState::Queued { .. } => Some(deadline_result(rec, Phase::Queued, "")),
            TaskState::Retrying { .. } => Some(deadline_result(rec, Phase::Starting, "")),
            _ => None,
        };
        self.now = self.now.max(ready.plus(d).0);
        if let Some(r) = result {
            return self.finish_task(task, r, false);
        }
        let (attempt, stored) = live?;
        let usage = self.final_usage(task, attempt, stored);
        let mut outcome = AttemptOutcome::failed(StopReason::Timeout, "deadline exceeded");
        outcome.phase = Some(Phase::Running);
        self.emit(Event::AttemptFinished {
            task,
            attempt,
            outcome,
            usage,
            output: String::new(),
        })?;
        self.agents.remove(&(task, attempt));
        self.decide(task)
    }

    /// Tasks not started (pending, or queued without an attempt) become cancelled.
    fn cancel_unstarted(&mut self) -> Option<()> {
        for t in self.tasks() {
            let rec = &self.st()?.tasks[t.index()];
            if matches!(rec.state, TaskState::Pending | TaskState::Queued { .. })
                && rec.attempts.is_empty()
            {
                let r = result_without_attempt(
                    TerminalState::Cancelled,
                    StopReason::Cancelled,
                    None,
                    "not started after a failure (fail_fast)",
                );
                self.finish_task(t, r, false)?;
            }
        }
        Some(())
    }

    fn interrupt(&mut self) -> Option<()> {
        self.st()?;
        for t in self.tasks() {
            let rec = &self.st()?.tasks[t.index()];
            if let Some(a) = rec.live_attempt() {
                let (attempt, stored) = (a.attempt, a.usage);
                let usage = self.final_usage(t, attempt, stored);
                self.emit(Event::AttemptFinished {
                    task: t,
                    attempt,
                    outcome: AttemptOutcome::failed(StopReason::Interrupted, "interrupted"),
                    usage,
                    output: String::new(),
                })?;
            }
        }
        self.emit(Event::RunInterrupted {
            reason: "Ctrl-C".into(),
        })?;
        // The process exits: nothing more is stored until a resume.
        self.crash();
        Some(())
    }

    fn resume(&mut self, bits: u8) -> Option<()> {
        self.reopens += 1;
        let reopened = self.backend.reopen();
        let model = self.lives.last().cloned().unwrap_or_default();
        assert_eq!(
            reopened, model,
            "the reopened state is the state before the crash"
        );
        if reopened.is_finished() {
            return None;
        }
        let plan = resume_plan(&reopened);
        self.resumes.push(Resume {
            at: self.events.len(),
            state: reopened.clone(),
            plan: plan.clone(),
        });
        self.pid += 1;
        let from_seq = Seq(reopened.next_seq.0 - 1);
        self.state = Some(reopened);
        self.emit(Event::RunResumed {
            pid: self.pid,
            from_seq,
        })?;
        let mut decide: Vec<TaskId> = plan.undecided.clone();
        for (i, o) in plan.orphans.iter().enumerate() {
            let action = if bits >> (i % 8) & 1 == 1 {
                OrphanAction::Killed
            } else {
                OrphanAction::Gone
            };
            self.emit(Event::AttemptOrphaned {
                task: o.task,
                attempt: o.attempt,
                action,
            })?;
            decide.push(o.task);
        }
        decide.sort();
        for t in decide {
            self.decide(t)?;
        }
        Some(())
    }

    fn cancel(&mut self) -> Option<()> {
        self.st()?;
        for t in self.tasks() {
            if self.st()?.tasks[t.index()].live_attempt().is_some() {
                self.finish_attempt(t, OutcomeKind::Cancelled, false)?;
            }
        }
        for t in self.tasks() {
            let rec = &self.st()?.tasks[t.index()];
            let result = match &rec.state {
                TaskState::Finished(_) => continue,
                TaskState::Ended { .. } => {
                    let attempt = rec.attempts.last()?.attempt;
                    match next_step(self.spec(t), rec, Timestamp(self.now), jitter(t, attempt)) {
                        NextStep::GiveUp(r) => (r, true),
                        NextStep::Retry { .. } => (cancelled_result(rec), false),
                    }
                }
                _ => (cancelled_result(rec), false),
            };
            self.finish_task(t, result.0, result.1)?;
        }
        self.finish_run()
    }

    fn finish_run(&mut self) -> Option<()> {
        let st = self.st()?;
        let state = st.aggregate();
        let summary = summary_text(st);
        self.emit(Event::RunFinished { state, summary })
    }

    /// Drives the run to its end with nothing going wrong any more.
    fn wind_down(&mut self) {
        if self.state.is_none() && self.resume(0).is_none() {
            return;
        }
        for _ in 0..1000 {
            let Some(st) = self.st() else { return };
            if st.all_finished() {
                self.finish_run();
                return;
            }
            for t in self.tasks() {
                let Some(step) = self.wind_down_step(t) else {
                    continue;
                };
                match step {
                    Step::Decide => self.decide(t),
                    Step::StartAndComplete(start) => {
                        if start {
                            self.start(t);
                        }
                        self.finish_attempt(t, OutcomeKind::Completed, false)
                    }
                    Step::Skip => self.skip(t),
                    Step::CancelUnstarted => self.cancel_unstarted(),
                    Step::Queue => self.emit(Event::TaskQueued { task: t }),
                    Step::Deadline => self.deadline(t),
                    Step::Launch => self.launch(t),
                    Step::Cancel => {
                        let result = self.st().map(|st| cancelled_result(&st.tasks[t.index()]));
                        result.and_then(|r| self.finish_task(t, r, false))
                    }
                };
            }
        }
        panic!("the run did not finish after 1000 rounds of wind-down");
    }

    fn wind_down_step(&self, t: TaskId) -> Option<Step> {
        let st = self.st()?;
        let rec = &st.tasks[t.index()];
        match &rec.state {
            TaskState::Finished(_) => None,
            TaskState::Ended { .. } => Some(Step::Decide),
            TaskState::Running { .. } => Some(Step::StartAndComplete(
                rec.live_attempt().is_some_and(|a| a.pid.is_none()),
            )),
            TaskState::Pending => {
                if self.need_failed(st, t) {
                    Some(Step::Skip)
                } else if self.fail_fast_tripped(st) {
                    Some(Step::CancelUnstarted)
                } else if self.needs_done(st, t) {
                    Some(Step::Queue)
                } else {
                    None
                }
            }
            // A crash cut a cancel short after the worktree was finalized.
            TaskState::Queued { .. } | TaskState::Retrying { .. }
                if rec.worktree_final.is_some() =>
            {
                Some(Step::Cancel)
            }
            TaskState::Queued { .. } | TaskState::Retrying { .. } => {
                if self.past_deadline(st, t) {
                    Some(Step::Deadline)
                } else if matches!(rec.state, TaskState::Queued { .. })
                    && self.fail_fast_tripped(st)
                {
                    Some(Step::CancelUnstarted)
                } else if self.can_launch(st, t, rec) {
                    Some(Step::Launch)
                } else {
                    None
                }
            }
        }
    }
}

/// What wind-down does next for a task.
enum Step {
    Decide,
    StartAndComplete(bool),
    Skip,
    CancelUnstarted,
    Queue,
    Deadline,
    Launch,
    Cancel,
}

fn cancelled_result(rec: &sortie_core::TaskRecord) -> TaskResult {
    if rec.attempts.is_empty() {
        result_without_attempt(
            TerminalState::Cancelled,
            StopReason::Cancelled,
            None,
            "cancelled",
        )
    } else {
        sortie_core::finish_result(
            rec,
            &AttemptOutcome::failed(StopReason::Cancelled, "cancelled"),
            "",
        )
    }
}

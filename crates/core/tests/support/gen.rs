//! A generator of random but legal sortie runs, shared by core's and the journal's model tests.
//!
//! A [`Scenario`] is a small random batch and a list of [`Op`]s: what the fake agents do (start,
//! report progress, stall, run a side-effecting tool, end), what happens to sortie (time passes,
//! Ctrl-C, `sortie cancel`, a crash, a resume) and when the runner plans a round. Every
//! scheduling decision (queue, skip, retry, deadline, fail_fast, cancel texts, launches within
//! the concurrency, worktree setup and finalize, artifacts) comes from core's real
//! [`Planner`]: the driver only performs the actions it returns, as the runner's effects do, so
//! these tests prove the planner's rounds against the oracles, not a copy of its rules.
//!
//! [`Driver::run`] interprets the ops against a [`Backend`] that stores the events (a `Vec` for
//! core, a real journal on disk for the journal crate) and keeps the live [`RunState`] the way
//! the runner does: it asks the state to `check` every event before appending it, appends it,
//! then applies it. Ops that do not fit the current state are no-ops, so every op list is legal
//! and shrinks well. A crash drops the live state (and the backend's handle); a resume rebuilds
//! it from the backend, orphans the live attempts and plans on from there.
//!
//! The "fake agents" report usage that is unique per attempt: `reasoning` is the bit
//! `1 << (8 * task + attempt - 1)` (up to 4 attempts by the policy, 3 more orphaned and 1 rate limited), so a
//! usage counted twice shows up as a carry.
//!
//! Supervised tasks (`supervise`) have their attempts placed (`AttemptPlaced`): their fake
//! agents survive a crash, and a resume finds each one still running (adopted: it goes on and
//! ends normally), ended while sortie was down (recorded: its end is stored as it happened), or
//! gone (a reboot: orphaned), as the resume's bits choose.
//!
//! Included with `#[path = "../../core/tests/support/gen.rs"] mod gen;` (no extra crate).

#![allow(
    dead_code,
    reason = "each test binary uses a different part of the generator"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use sortie_core::decide;
use sortie_core::plan::{Action, Facts, JobKind, Planner, RunEnding, Stopping};
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, AttemptStatus, Batch, Cost, Event, Isolation,
    OrphanAction, Phase, ResumePlan, RunConfig, RunId, RunState, Seq, Stamped, StopReason, TaskId,
    TaskResult, TaskSpec, TaskState, Timestamp, Usage, resume_plan, validate_batch,
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
    /// A rate limit (429) with a retry-after (issue 14).
    RateLimited,
    // Issue 13: structured results.
    /// Completed with a validated structured result.
    CompletedStructured,
    /// Its structured result did not match, even after the repair round.
    PartialStructured,
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
            OutcomeKind::RateLimited => {
                let mut o = AttemptOutcome::failed(StopReason::Error, "429 try again in 2s");
                o.rate_limited = true;
                o.retry_after_ms = Some(2000);
                o
            }
            OutcomeKind::CompletedStructured => {
                AttemptOutcome::completed().judge_result(Ok(r#"{"answer":42}"#.into()))
            }
            OutcomeKind::PartialStructured => {
                AttemptOutcome::completed().judge_result(Err("at /answer: not an integer".into()))
            }
        };
        o.side_effects = side_effects;
        o
    }
}

/// One thing an agent, the user, fate or the runner's loop may do. Selectors pick among the
/// tasks the op fits, modulo their number; an op that fits nothing does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    /// Time passes (a quarter of this many ms: up to 16 s).
    Tick(u16),
    /// The loop plans a round with the real planner and performs its actions. The bits say
    /// which effects fail this round: 1 a worktree setup, 2 a worktree finalize, 4 an artifact
    /// write.
    Plan(u8),
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
    /// Ctrl-C: live attempts end as interrupted, the loop winds down, `RunInterrupted`, exit.
    Interrupt,
    /// The process dies after this many more events (0: at the next one).
    CrashIn(u8),
    /// The process dies now.
    Crash,
    /// A new process resumes the run (orphan actions chosen by the bits).
    Resume(u8),
    /// `sortie cancel`: live attempts end cancelled and the loop ends every unfinished task.
    Cancel,
    /// Live control (`Event::Control`), chosen by the first byte: hold, release or cancel a task
    /// (picked by the second), hold or release the run, or set the concurrency; a cancelled live
    /// attempt then ends cancelled, as the runner stops it.
    Control(u8, u8),
    /// #13: a running attempt's agent names its session (`AttemptSession`, once).
    Session(u8),
    /// #34: a live attempt's sandbox connections are journaled (`SandboxNet`, once), as the
    /// runner does just before its end.
    Net(u8),
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
    /// Per task: carried from a parent run (a rerun) as completed (0) or failed (1); any
    /// other value: not carried.
    pub(crate) carried: Vec<u8>,
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
                 retry_after_side_effects {} needs {:?} {:?} budget {:?}/{:?}/{:?} grace {}",
                t.label,
                t.model,
                t.fallback_models,
                t.max_retries,
                t.deadline,
                t.isolation,
                t.output,
                t.retry_after_side_effects,
                t.needs,
                t.needs_mode,
                t.max_turns,
                t.max_tokens,
                t.max_cost_nanos,
                t.grace_turns
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
        (0u32..=3, prop::bool::weighted(0.7)),
        (prop::bool::weighted(0.5), 0u32..=1),
        (
            prop::option::weighted(0.5, 1u32..4),
            prop::option::weighted(0.2, 100u64..1500),
            prop::option::weighted(0.15, 1000u64..20_000),
            prop_oneof![1 => Just(0u32), 3 => 1u32..=2],
        ),
        // #33: a check and its feedback rounds; a third of the tasks run once their needs
        // ended, however.
        (
            (prop::bool::weighted(0.3), 0u32..=2),
            prop::bool::weighted(0.3),
        ),
    )
        .prop_map(
            move |(
                model,
                fallbacks,
                retries,
                deadline,
                worktree,
                output,
                rase,
                needs,
                (orphans, supervise),
                (pooled, rate_limits),
                (max_turns, max_tokens, max_cost_nanos, grace_turns),
                ((verify, verify_rounds), settled),
            )| {
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
                t.max_orphans = orphans;
                t.supervise = supervise;
                // Issue 14: half the tasks share the pool `p`; one rate limit at most spares
                // a retry (the usage bits hold 8 attempts per task).
                t.pool = pooled.then(|| "p".to_owned());
                t.max_rate_limits = rate_limits;
                // The task's budgets: the model checks core's budget decisions on the usage
                // its fake agents report (the driver does not act on them).
                t.max_turns = max_turns;
                t.max_tokens = max_tokens;
                t.max_cost_nanos = max_cost_nanos;
                t.grace_turns = grace_turns;
                if verify {
                    t.verify = Some(vec!["sh".into(), "-c".into(), "make test".into()]);
                    t.verify_rounds = verify_rounds;
                }
                t.needs = needs
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| **n)
                    .map(|(j, _)| format!("t{j}"))
                    .collect();
                if settled {
                    t.needs_mode = sortie_core::NeedsMode::Settled;
                }
                t
            },
        )
}

/// A valid batch of 1 to [`MAX_TASKS`] tasks whose `needs` form a DAG.
pub(crate) fn batch_strategy() -> impl Strategy<Value = Batch> {
    let budget = (
        prop::option::weighted(0.2, 1u64..3000),
        prop::option::weighted(0.2, 1u64..2000),
        prop::option::weighted(0.1, 1u64..500),
    );
    let pools = (1u32..=2, any::<bool>());
    (
        1..=MAX_TASKS,
        1u32..=3,
        prop::bool::weighted(0.3),
        budget,
        pools,
    )
        .prop_flat_map(
            |(n, concurrency, ff, (tokens, cost, deadline_ms), (pool_size, adaptive))| {
                let tasks: Vec<_> = (0..n).map(task_strategy).collect();
                // #33: half the batches are one item's samples, a third of those without
                // `pick`, the others with `first-pass` or `best-score`.
                (tasks, 0u8..6).prop_map(move |(mut tasks, samples)| {
                    if samples >= 3 {
                        let pick = match samples {
                            3 => None,
                            4 => Some(sortie_core::verify::Pick::FirstPass),
                            _ => Some(sortie_core::verify::Pick::BestScore),
                        };
                        for t in &mut tasks {
                            let body = std::sync::Arc::make_mut(&mut t.body);
                            body.sample_of = Some("t*".to_owned());
                            body.pick = pick;
                        }
                    }
                    Batch {
                        tasks,
                        agents: AgentProfile::builtins(),
                        config: RunConfig {
                            concurrency,
                            fail_fast: ff,
                            budget: sortie_core::RunBudget {
                                max_tokens: tokens,
                                max_cost_nanos: cost,
                                deadline: deadline_ms.map(Duration::from_millis),
                                ..sortie_core::RunBudget::default()
                            },
                            pools: [(
                                "p".to_owned(),
                                sortie_core::PoolSpec {
                                    concurrency: Some(pool_size),
                                    adaptive,
                                },
                            )]
                            .into(),
                            on_task_end: None,
                            // #37: a price kept with the run round-trips.
                            prices: Box::new(sortie_core::prices::Prices {
                                as_of: sortie_core::prices::PRICES_AS_OF.to_owned(),
                                models: [(
                                    "gpt-5-codex".to_owned(),
                                    sortie_core::prices::ModelPrice::from_usd([
                                        1.25, 10.0, 0.125, 0.0,
                                    ]),
                                )]
                                .into(),
                            }),
                        },
                        source: "model.toml".into(),
                    }
                })
            },
        )
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
        2 => Just(OutcomeKind::RateLimited),
        1 => Just(OutcomeKind::CompletedStructured),
        1 => Just(OutcomeKind::PartialStructured),
    ]
}

/// One op.
pub(crate) fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        20 => any::<u16>().prop_map(Op::Tick),
        100 => prop_oneof![8 => Just(0u8), 1 => Just(1), 1 => Just(2), 1 => Just(4)]
            .prop_map(Op::Plan),
        30 => any::<u8>().prop_map(Op::Start),
        80 => (any::<u8>(), any::<u8>(), prop::bool::weighted(0.7))
            .prop_map(|(s, i, j)| Op::Progress(s, i, j)),
        5 => any::<u8>().prop_map(Op::Stall),
        8 => any::<u8>().prop_map(Op::SideEffects),
        5 => any::<u8>().prop_map(Op::Continue),
        40 => (any::<u8>(), outcome_kind(), prop::bool::weighted(0.3))
            .prop_map(|(s, k, fx)| Op::Finish(s, k, fx)),
        3 => Just(Op::Interrupt),
        4 => (0u8..6).prop_map(Op::CrashIn),
        3 => Just(Op::Crash),
        20 => any::<u8>().prop_map(Op::Resume),
        1 => Just(Op::Cancel),
        4 => (any::<u8>(), any::<u8>()).prop_map(|(k, sel)| Op::Control(k, sel)),
        4 => any::<u8>().prop_map(Op::Session),
        3 => any::<u8>().prop_map(Op::Net),
    ]
}

/// A scenario: a batch, 10 to 200 ops, and (mostly) a drive to the end.
pub(crate) fn scenario_strategy() -> impl Strategy<Value = Scenario> {
    (
        batch_strategy(),
        prop::collection::vec(op_strategy(), 10..200),
        prop::bool::weighted(0.85),
        prop::collection::vec(
            prop_oneof![1 => Just(0u8), 1 => Just(1u8), 8 => Just(2u8)],
            MAX_TASKS,
        ),
    )
        .prop_map(|(batch, ops, finish, carried)| Scenario {
            batch,
            ops,
            finish,
            carried,
        })
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
    1u64 << (8 * u64::from(task.0) + u64::from(attempt.0.saturating_sub(1)))
}

/// Interprets ops against a backend, keeping the live state as the runner does.
pub(crate) struct Driver<B: Backend> {
    backend: B,
    batch: Batch,
    /// The live state; `None` while no process owns the run (after a crash or Ctrl-C).
    state: Option<RunState>,
    /// The live process's planner (rebuilt from the state by every new process).
    planner: Option<Planner>,
    /// Why the live process is winding down.
    stopping: Option<Stopping>,
    /// Worktree setups that failed in the live process (a fact the planner is given).
    setup_failed: BTreeMap<TaskId, String>,
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
    /// #33: checks started and not yet ended (they end at the next round; a crash loses them
    /// and resume runs them again), with whether each passes.
    checks: BTreeMap<TaskId, bool>,
}

impl<B: Backend> Driver<B> {
    /// Runs a scenario against a backend and returns the trace and the backend.
    pub(crate) fn run(scenario: &Scenario, backend: B) -> (Trace, B) {
        let mut d = Driver {
            backend,
            batch: scenario.batch.clone(),
            state: Some(RunState::new()),
            planner: None,
            stopping: None,
            setup_failed: BTreeMap::new(),
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
            checks: BTreeMap::new(),
        };
        assert_eq!(validate_batch(&d.batch), Ok(()), "generated batch is valid");
        let started = Event::RunStarted {
            run_id: RunId::new("model-run").expect("valid run id"),
            batch: d.batch.clone(),
            batch_digest: 42,
            host: "model-host".into(),
            pid: d.pid,
        };
        if d.emit(started).is_some() {
            d.carry(&scenario.carried);
            d.planner = d.state.as_ref().map(Planner::new);
        }
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

    /// Tasks of the live state that satisfy `pred`, picked by `sel`.
    fn pick(&self, sel: u8, pred: impl Fn(&sortie_core::TaskRecord) -> bool) -> Option<TaskId> {
        let st = self.st()?;
        let fits: Vec<TaskId> = self
            .tasks()
            .into_iter()
            .filter(|&t| pred(&st.tasks[t.index()]))
            .collect();
        if fits.is_empty() {
            None
        } else {
            Some(fits[usize::from(sel) % fits.len()])
        }
    }

    /// Checks, stores and applies one event, and tells the planner. `None` when the process is
    /// dead (or dies now).
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
            panic!(
                "the planner or the fake agents made an event the state refuses: {v}\nevent: {event:?}"
            );
        }
        let at = Timestamp(self.now);
        let seq = self.backend.append(at, &event);
        let state = self.state.as_mut().expect("live");
        assert_eq!(seq, state.next_seq, "the backend assigns the next seq");
        let stamped = Stamped { seq, at, event };
        if let Err(v) = state.apply(&stamped) {
            panic!("apply refused an event that check accepted: {v}\n{stamped:?}");
        }
        if let Some(p) = self.planner.as_mut() {
            p.observe(state, &stamped.event);
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
            Event::TaskFinished { task, .. } => {
                self.setup_failed.remove(task);
            }
            _ => {}
        }
        self.lives.push(state.clone());
        self.events.push(stamped);
        Some(())
    }

    fn crash(&mut self) {
        self.checks.clear();
        if let Some(state) = self.state.take() {
            self.backend.crash();
            // Placed (supervised) agents outlive sortie; the others die with it.
            self.agents.retain(|(task, attempt), _| {
                state.tasks[task.index()]
                    .live_attempt()
                    .is_some_and(|a| a.attempt == *attempt && a.placed.is_some())
            });
            self.crashes += 1;
        }
        self.planner = None;
        self.stopping = None;
        self.setup_failed.clear();
        self.crash_in = None;
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
            Op::Plan(fail) => {
                self.plan_round(*fail);
            }
            Op::Start(sel) => {
                if let Some(t) =
                    self.pick(*sel, |r| r.live_attempt().is_some_and(|a| a.pid.is_none()))
                {
                    self.start(t);
                }
            }
            Op::Progress(sel, inc, store) => {
                if let Some(t) =
                    self.pick(*sel, |r| r.live_attempt().is_some_and(|a| a.pid.is_some()))
                {
                    let attempt = self.live_attempt(t);
                    let usage = self.bump(t, attempt, *inc);
                    if *store {
                        self.emit(Event::AttemptProgress {
                            task: t,
                            attempt,
                            usage,
                        });
                        // #10: a placed attempt's checkpoint says how far its stdout was read.
                        let read = self.st().and_then(|s| {
                            let a = s.tasks[t.index()].live_attempt()?;
                            Some(a.placed.as_ref()?.read)
                        });
                        if let Some(read) = read {
                            self.emit(Event::AttemptRead {
                                task: t,
                                attempt,
                                offset: read + 1 + u64::from(*inc),
                            });
                        }
                    }
                }
            }
            Op::Stall(sel) => {
                if let Some(t) =
                    self.pick(*sel, |r| r.live_attempt().is_some_and(|a| a.pid.is_some()))
                {
                    let attempt = self.live_attempt(t);
                    self.emit(Event::AttemptStalled { task: t, attempt });
                }
            }
            Op::SideEffects(sel) => {
                if let Some(t) = self.pick(*sel, |r| {
                    r.live_attempt()
                        .is_some_and(|a| a.pid.is_some() && !a.side_effects)
                }) {
                    let attempt = self.live_attempt(t);
                    self.emit(Event::AttemptSideEffects { task: t, attempt });
                }
            }
            Op::Session(sel) => {
                if let Some(t) = self.pick(*sel, |r| {
                    r.live_attempt()
                        .is_some_and(|a| a.pid.is_some() && a.session().is_none())
                }) {
                    let attempt = self.live_attempt(t);
                    self.emit(Event::AttemptSession {
                        task: t,
                        attempt,
                        session: format!("session-{}-{}", t.0, attempt.0),
                    });
                }
            }
            Op::Net(sel) => {
                if let Some(t) = self.pick(*sel, |r| {
                    r.live_attempt().is_some_and(|a| a.net().is_none())
                }) {
                    let attempt = self.live_attempt(t);
                    let flow = |host: &str, allowed| sortie_core::sandbox_net::Flow {
                        host: host.into(),
                        port: 443,
                        allowed,
                        count: u32::from(*sel % 4),
                        bytes_out: u64::from(*sel),
                        bytes_in: u64::from(*sel) * 7,
                    };
                    let flows = match *sel % 3 {
                        0 => Vec::new(),
                        1 => vec![flow("example.com", false)],
                        _ => vec![flow("example.com", false), flow("pypi.org", true)],
                    };
                    self.emit(Event::SandboxNet {
                        task: t,
                        attempt,
                        flows,
                    });
                }
            }
            Op::Continue(sel) => {
                if let Some(t) = self.pick(*sel, |r| {
                    r.attempts.len() >= 2
                        && r.live_attempt()
                            .is_some_and(|a| a.pid.is_none() && a.continues().is_none())
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
                if let Some(t) = self.pick(*sel, |r| r.live_attempt().is_some()) {
                    self.finish_attempt(t, *kind, *fx);
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
            Op::Control(kind, sel) => {
                self.control(*kind, *sel);
            }
        }
    }

    /// A user's live control: journaled as the runner does (checked first: one that does not
    /// apply is refused, not stored), then its effect on a live attempt.
    fn control(&mut self, kind: u8, sel: u8) -> Option<()> {
        use sortie_core::ControlAction as C;
        let st = self.st()?;
        if self.stopping.is_some() {
            return None;
        }
        let task = self.pick(sel, |r| !r.state.is_terminal());
        let action = match (kind % 6, task) {
            (0, Some(t)) => C::Hold { task: Some(t) },
            (1, Some(t)) => C::Release { task: Some(t) },
            (2, Some(t)) => C::Cancel { task: Some(t) },
            (3, _) => C::Hold { task: None },
            (4, _) => C::Release { task: None },
            (_, _) => C::Concurrency {
                n: u32::from(sel % 4) + 1,
            },
        };
        let event = Event::Control {
            by: "uid 1000 pid 7".into(),
            action: action.clone(),
        };
        st.check(&event).ok()?;
        self.emit(event)?;
        if let C::Cancel { task: Some(t) } = action
            && self.st()?.tasks[t.index()].live_attempt().is_some()
        {
            self.finish_attempt(t, OutcomeKind::Cancelled, false);
        }
        Some(())
    }

    fn live_attempt(&self, task: TaskId) -> Attempt {
        self.state.as_ref().expect("live").tasks[task.index()]
            .live_attempt()
            .expect("a live attempt")
            .attempt
    }

    /// One round of the real planner, performed as the runner's effects would: the round's
    /// events, then launches (attempts wait for `Start`), task ends (artifact, finalize, end)
    /// and worktree jobs (done at once; `fail` bits make them fail). When nothing is left to
    /// do and every task finished, the run finishes. Returns whether anything happened.
    fn plan_round(&mut self, fail: u8) -> Option<bool> {
        self.state.as_ref().filter(|s| !s.is_finished())?;
        // #33: the checks started by earlier rounds report their verdicts.
        for (task, passed) in std::mem::take(&mut self.checks) {
            self.end_check(task, passed)?;
        }
        let st = self.state.as_ref().filter(|s| !s.is_finished())?;
        let live = st
            .tasks
            .iter()
            .filter(|t| matches!(t.state, TaskState::Running { .. }))
            .count();
        let jobs = BTreeMap::new();
        let missing = BTreeSet::new();
        let facts = Facts {
            now: Timestamp(self.now),
            stopping: self.stopping,
            live,
            jobs: &jobs,
            setup_failed: &self.setup_failed,
            missing_worktrees: &missing,
        };
        let actions = self.planner.as_mut()?.plan(st, &facts);
        if actions.is_empty() {
            assert!(
                !st.all_finished(),
                "the planner did not end a run whose tasks all finished"
            );
            return Some(false);
        }
        let mut effects = Vec::new();
        for action in actions {
            match action {
                Action::Append(e) => self.emit(e)?,
                other => effects.push(other),
            }
        }
        for action in effects {
            match action {
                Action::Append(_) => {}
                // A supervised attempt's placement is durable before its process starts.
                Action::Launch(task) => {
                    if self.batch.tasks[task.index()].supervise {
                        let attempt = self.live_attempt(task);
                        self.emit(Event::AttemptPlaced {
                            task,
                            attempt,
                            executor: "local".into(),
                            dir: format!("/state/runs/model-run/attempts/{}.{}", task.0, attempt.0),
                        })?;
                    }
                }
                Action::EndTask {
                    task,
                    result,
                    artifact,
                    finalize,
                } => self.end_task(task, result, artifact, finalize, fail)?,
                Action::StartJob(task, kind) => self.job(task, kind, fail & 1 != 0)?,
                // #33: a check passes unless a bit says; another bit leaves it running
                // (reported by the next round, or lost to a crash and run again on resume).
                Action::Verify(task) => {
                    let passed = fail & 8 == 0;
                    if fail & 16 != 0 {
                        self.checks.insert(task, passed);
                    } else {
                        self.end_check(task, passed)?;
                    }
                }
                // #33: a sample that lost to a first-pass winner: its live attempt is stopped.
                Action::StopTask(task, why) => self.stop_live_of(
                    Some(task),
                    &AttemptOutcome::failed(StopReason::Cancelled, why),
                )?,
                // The run's budget ran out: the loop stops every live attempt (budget, partial).
                Action::WindDown(_) => {
                    self.stop_live(&OutcomeKind::PartialBudget.outcome(false))?
                }
                // The run's end, decided by the planner: journaled; an interrupted run's
                // process then exits.
                Action::EndRun(ending) => {
                    let event = ending.event(self.st()?);
                    self.emit(event)?;
                    if ending == RunEnding::Interrupted {
                        self.crash();
                    }
                    return Some(false);
                }
            }
        }
        Some(true)
    }

    /// A task's end through its effects, as the runner performs `EndTask`.
    fn end_task(
        &mut self,
        task: TaskId,
        mut result: TaskResult,
        artifact: bool,
        finalize: bool,
        fail: u8,
    ) -> Option<()> {
        if artifact {
            if fail & 4 != 0 {
                result = decide::artifact_failed(result, "No space left on device");
            } else {
                let path = self.batch.tasks[task.index()].output.clone()?;
                self.emit(Event::ArtifactWritten {
                    task,
                    path,
                    bytes: result.text.len() as u64,
                    digest: sortie_core::digest::fnv1a(result.text.as_bytes()),
                })?;
            }
        }
        if finalize {
            if fail & 2 != 0 {
                result = decide::finalize_failed(result, "git worktree remove failed");
            } else {
                let rec = &self.st()?.tasks[task.index()];
                let changed = !rec.attempts.is_empty() && task.0.is_multiple_of(2);
                self.emit(Event::WorktreeFinalized {
                    task,
                    changed,
                    diff: changed.then(|| "1 file changed".to_owned()),
                })?;
            }
        }
        self.emit(Event::TaskFinished { task, result })
    }

    /// A worktree setup job, done at once (or failed).
    fn job(&mut self, task: TaskId, kind: JobKind, fails: bool) -> Option<()> {
        if fails {
            self.setup_failed
                .insert(task, "fatal: not a git repository".to_owned());
            return Some(());
        }
        match kind {
            JobKind::Plan => self.emit(Event::WorktreePlanned {
                task,
                repo: "/repo".into(),
                path: format!("/state/worktrees/run/t{}", task.0),
                branch: format!("sortie/run/t{}", task.0),
                base: "0".repeat(40),
            }),
            JobKind::Create => {
                let rec = &self.st()?.tasks[task.index()];
                if rec.steps().setup.is_some() {
                    return Some(()); // a missing worktree was made again
                }
                let worktree = rec.steps().worktree.as_ref().map(|p| p.path.clone());
                self.emit(Event::TaskSetUp { task, worktree })
            }
            JobKind::Finalize => Some(()),
        }
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
            (OutcomeKind::SpawnError.outcome(false), *a.usage())
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

    /// A rerun's prelude, as `engine::rerun` journals it: `RunRerunOf`, then each carried task
    /// finished with its parent's result.
    fn carry(&mut self, carried: &[u8]) -> Option<()> {
        let tasks: Vec<(TaskId, u8)> = self
            .tasks()
            .into_iter()
            .filter_map(|t| carried.get(t.index()).map(|c| (t, *c)))
            .filter(|(_, c)| *c < 2)
            .collect();
        if tasks.is_empty() {
            return Some(());
        }
        self.emit(Event::RunRerunOf {
            parent: RunId::new("model-parent").expect("valid run id"),
        })?;
        for (task, c) in tasks {
            let (state, stop_reason) = if c == 0 {
                (sortie_core::TerminalState::Completed, StopReason::Completed)
            } else {
                (sortie_core::TerminalState::Failed, StopReason::NonzeroExit)
            };
            let result = TaskResult {
                state,
                stop_reason,
                phase: None,
                error: None,
                text: format!("carried t{}", task.0),
                result: None,
            };
            self.emit(Event::TaskCarried {
                task,
                result,
                usage: Usage::ZERO,
            })?;
        }
        Some(())
    }

    /// Every live attempt ends with `outcome` (the loop stopped them), its agent's last count as
    /// its usage.
    fn stop_live(&mut self, outcome: &AttemptOutcome) -> Option<()> {
        self.stop_live_of(None, outcome)
    }

    /// [`Self::stop_live`], of one task's attempt when `only` names it.
    fn stop_live_of(&mut self, only: Option<TaskId>, outcome: &AttemptOutcome) -> Option<()> {
        for t in self.tasks() {
            if only.is_some_and(|o| o != t) {
                continue;
            }
            let rec = &self.st()?.tasks[t.index()];
            if let Some(a) = rec.live_attempt() {
                let (attempt, stored) = (a.attempt, *a.usage());
                let usage = self.final_usage(t, attempt, stored);
                self.emit(Event::AttemptFinished {
                    task: t,
                    attempt,
                    outcome: outcome.clone(),
                    usage,
                    output: String::new(),
                })?;
                self.agents.remove(&(t, attempt));
            }
        }
        Some(())
    }

    /// Plans rounds until nothing more happens without waiting.
    fn settle(&mut self) -> Option<()> {
        for _ in 0..100 {
            if !self.plan_round(0)? {
                return Some(());
            }
        }
        panic!("the planner did not settle after 100 rounds");
    }

    /// Ctrl-C: the loop stops the live attempts (interrupted), plans what is left to decide
    /// while interrupting, then records `RunInterrupted` and the process exits.
    fn interrupt(&mut self) -> Option<()> {
        self.st()?;
        self.stopping = Some(Stopping::Interrupt);
        self.stop_live(&AttemptOutcome::failed(
            StopReason::Interrupted,
            "interrupted",
        ))?;
        self.settle()?;
        // The planner ended the run: `RunInterrupted` once nothing was in flight (the process
        // then exited), or `RunFinished` when the last tasks finished on the way.
        assert!(
            self.st().is_none(),
            "the planner did not end an interrupted run with nothing in flight"
        );
        Some(())
    }

    /// #33: the check of `task`'s last attempt ends with a verdict.
    fn end_check(&mut self, task: TaskId, passed: bool) -> Option<()> {
        let attempt = self.st()?.tasks[task.index()].attempts.last()?.attempt;
        self.emit(Event::VerifyEnded {
            task,
            attempt,
            verdict: sortie_core::verify::Verdict {
                passed,
                score: if passed { 1_000_000 } else { 250_000 },
                exit: Some(if passed { 0 } else { 1 }),
                digest: u64::from(attempt.0),
                error: (!passed).then(|| "the check exited 1: 1 failed".to_owned()),
            },
        })
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
        for (i, o) in plan.orphans.iter().enumerate() {
            let placed = self.st()?.tasks[o.task.index()]
                .live_attempt()
                .is_some_and(|a| a.placed.is_some());
            // A placed attempt is adopted, recorded or (a reboot) orphaned, as two bits say.
            let how = if placed { (bits >> (i % 4 * 2)) & 3 } else { 3 };
            match how {
                0 | 1 => {
                    let offset = self.now;
                    self.emit(Event::AttemptAdopted {
                        task: o.task,
                        attempt: o.attempt,
                        offset,
                    })?;
                }
                2 => {
                    self.emit(Event::AttemptRecorded {
                        task: o.task,
                        attempt: o.attempt,
                    })?;
                    let kind = if bits & 0x80 == 0 {
                        OutcomeKind::Completed
                    } else {
                        OutcomeKind::Error
                    };
                    self.finish_attempt(o.task, kind, false)?;
                }
                _ => {
                    let action = if bits >> (i % 8) & 1 == 1 {
                        OrphanAction::Killed
                    } else {
                        OrphanAction::Gone
                    };
                    self.agents.remove(&(o.task, o.attempt));
                    self.emit(Event::AttemptOrphaned {
                        task: o.task,
                        attempt: o.attempt,
                        action,
                    })?;
                }
            }
        }
        // #33: a check that was running when the run died runs again (its verdict once).
        for (i, &task) in plan.checks.iter().enumerate() {
            self.end_check(task, (bits >> (i % 8)) & 1 == 0)?;
        }
        self.planner = self.state.as_ref().map(Planner::new);
        Some(())
    }

    /// `sortie cancel`: the loop stops the live attempts (cancelled), and the planner ends
    /// every unfinished task; the run finishes.
    fn cancel(&mut self) -> Option<()> {
        self.st()?;
        self.stopping = Some(Stopping::Cancel);
        self.stop_live(&OutcomeKind::Cancelled.outcome(false))?;
        self.settle()
    }

    /// Drives the run to its end with nothing going wrong any more: agents start and complete,
    /// and the planner plans; when nothing is left to do now, time moves to the planner's next
    /// wake. A run that can neither move nor wake is stuck: the planner has a bug.
    fn wind_down(&mut self) {
        if self.state.is_none() && self.resume(0).is_none() {
            return;
        }
        // Whatever a user held is released: a held task would wait for ever.
        let held = self
            .st()
            .is_some_and(|st| st.control.run_held || !st.control.held.is_empty());
        if held {
            self.emit(Event::Control {
                by: "uid 1000 pid 7".into(),
                action: sortie_core::ControlAction::Release { task: None },
            });
        }
        for _ in 0..1000 {
            let Some(st) = self.st() else { return };
            let live: Vec<(TaskId, bool)> = self
                .tasks()
                .into_iter()
                .filter_map(|t| {
                    let a = st.tasks[t.index()].live_attempt()?;
                    Some((t, a.pid.is_none()))
                })
                .collect();
            for (t, unstarted) in live {
                if unstarted {
                    self.start(t);
                }
                self.finish_attempt(t, OutcomeKind::Completed, false);
            }
            match self.plan_round(0) {
                Some(true) => continue,
                Some(false) => {}
                None => return,
            }
            let Some(st) = self.st() else { return };
            if st.tasks.iter().any(|t| t.live_attempt().is_some()) {
                continue;
            }
            let wake = self
                .planner
                .as_ref()
                .and_then(|p| p.next_wake_of(st, Timestamp(self.now)));
            match wake {
                Some(t) => self.now = self.now.max(t.0),
                None => {
                    let states: Vec<String> = st
                        .tasks
                        .iter()
                        .map(|t| format!("{:?} worktree {:?}", t.state, t.steps().worktree_final))
                        .collect();
                    panic!("the run is stuck: nothing to do, nothing to wait for: {states:?}")
                }
            }
        }
        panic!("the run did not finish after 1000 rounds of wind-down");
    }
}

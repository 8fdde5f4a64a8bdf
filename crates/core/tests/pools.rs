//! Shared rate limits (issue 14): a pool holds back launches over its limit and while it backs
//! off, a rate-limited attempt is retried without spending `max_retries`, the pool's state is
//! a fold of the journal (replay gives it back), and `max_rate_limits` caps the rate limits.

use std::collections::{BTreeMap, BTreeSet};

use sortie_core::plan::{Action, Facts, Planner};
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, Batch, Event, PoolSpec, RunConfig, RunId, RunState,
    Stamped, StopReason, TaskId, TaskSpec, TaskState, Timestamp, Usage,
};

struct Run {
    events: Vec<Stamped>,
    state: RunState,
    planner: Planner,
    now: u64,
}

fn task(label: &str, pool: Option<&str>) -> TaskSpec {
    let mut t = TaskSpec::new(label, "/work");
    t.prompt = Some(format!("do {label}"));
    t.pool = pool.map(str::to_owned);
    t
}

fn rate_limited(retry_after_ms: Option<u64>) -> AttemptOutcome {
    let mut o = AttemptOutcome::failed(StopReason::Error, "429 rate limit exceeded");
    o.rate_limited = true;
    o.retry_after_ms = retry_after_ms;
    o
}

impl Run {
    fn new(concurrency: u32, pools: &[(&str, u32, bool)], tasks: Vec<TaskSpec>) -> Run {
        let pools: BTreeMap<String, PoolSpec> = pools
            .iter()
            .map(|(n, c, adaptive)| {
                let spec = PoolSpec {
                    concurrency: Some(*c),
                    adaptive: *adaptive,
                };
                ((*n).to_owned(), spec)
            })
            .collect();
        let mut run = Run {
            events: Vec::new(),
            state: RunState::new(),
            planner: Planner::new(&RunState::new()),
            now: 1_000,
        };
        run.push(Event::RunStarted {
            run_id: RunId::new("pools-test").expect("run id"),
            batch: Batch {
                tasks,
                agents: AgentProfile::builtins(),
                config: RunConfig {
                    concurrency,
                    pools,
                    ..RunConfig::default()
                },
                source: "pools.toml".into(),
            },
            batch_digest: 0,
            host: "h".into(),
            pid: 1,
        });
        run.planner = Planner::new(&run.state);
        run
    }

    fn push(&mut self, event: Event) {
        self.now += 1;
        let stamped = Stamped {
            seq: self.state.next_seq,
            at: Timestamp(self.now),
            event,
        };
        self.state
            .apply(&stamped)
            .unwrap_or_else(|v| panic!("test event refused: {v}\n{stamped:?}"));
        self.planner.observe(&self.state, &stamped.event);
        self.events.push(stamped);
    }

    /// Plans a round `after_ms` from now and performs its appends; returns the tasks launched.
    fn round(&mut self, after_ms: u64) -> Vec<String> {
        self.now += after_ms;
        let (jobs, failed, missing) = (BTreeMap::new(), BTreeMap::new(), BTreeSet::new());
        let live = self
            .state
            .tasks
            .iter()
            .filter(|t| t.live_attempt().is_some())
            .count();
        let facts = Facts {
            now: Timestamp(self.now),
            stopping: None,
            live,
            jobs: &jobs,
            setup_failed: &failed,
            missing_worktrees: &missing,
        };
        let actions = self.planner.plan(&self.state, &facts);
        let mut launched = Vec::new();
        for a in actions {
            match a {
                Action::Append(e) => {
                    if let Event::AttemptLaunching { task, .. } = &e {
                        launched.push(self.state.label(*task));
                    }
                    self.push(e);
                }
                Action::Launch(_) => {}
                other => panic!("unexpected action {other:?}"),
            }
        }
        launched
    }

    fn finish(&mut self, t: u32, outcome: AttemptOutcome) {
        let task = TaskId(t);
        let attempt = Attempt(self.state.tasks[t as usize].attempts.len() as u32);
        self.push(Event::AttemptFinished {
            task,
            attempt,
            outcome,
            usage: Usage::ZERO,
            output: String::new(),
        });
    }

    fn pool(&self, name: &str) -> &sortie_core::PoolState {
        &self.state.pools[name]
    }
}

#[test]
fn a_named_pool_limits_its_attempts_in_flight_and_others_go_past_it() {
    let tasks = vec![
        task("a1", Some("p")),
        task("a2", Some("p")),
        task("a3", Some("p")),
        task("b", None),
    ];
    let mut run = Run::new(8, &[("p", 2, true)], tasks);
    run.round(0); // queue
    assert_eq!(run.round(0), ["a1", "a2", "b"], "a3 waits for its pool");
    assert_eq!(run.pool("p").in_flight, 2);
    run.finish(0, AttemptOutcome::completed());
    assert_eq!(run.round(0), ["a3"], "a1's end frees its pool's slot");
}

#[test]
fn a_rate_limit_backs_the_pool_off_and_its_retry_spends_no_retry() {
    let mut tasks: Vec<TaskSpec> = (0..4).map(|i| task(&format!("t{i}"), Some("p"))).collect();
    for t in &mut tasks {
        t.max_retries = 0;
    }
    let mut run = Run::new(8, &[("p", 4, true)], tasks);
    run.round(0);
    assert_eq!(run.round(0).len(), 4);
    run.finish(0, rate_limited(Some(5_000)));
    assert_eq!(run.pool("p").limit(8), 3, "down to the 3 still in flight");
    let until = run.pool("p").backoff_until.expect("backing off");
    // The retry is scheduled though max_retries = 0, after the retry-after.
    run.round(0);
    let due = match &run.state.tasks[0].state {
        TaskState::Retrying {
            next, not_before, ..
        } => {
            assert_eq!(*next, Attempt(2));
            assert!(*not_before >= until && not_before.0 <= until.0 + 5);
            *not_before
        }
        other => panic!("not retrying: {other:?}"),
    };
    // Two more end: the pool is at 3 with 1 in flight, but it backs off: nothing launches.
    run.finish(1, AttemptOutcome::completed());
    run.finish(2, AttemptOutcome::completed());
    run.round(0);
    assert_eq!(run.round(0), Vec::<String>::new(), "backing off");
    assert_eq!(
        run.planner.next_wake_of(&run.state, Timestamp(run.now)),
        Some(until),
        "the loop wakes when the pool may launch again"
    );
    run.now = due.0;
    assert_eq!(run.round(0), ["t0"]);
    run.finish(0, AttemptOutcome::completed());
    run.round(0);
    assert!(
        matches!(&run.state.tasks[0].state, TaskState::Finished(r) if r.state.as_str() == "completed")
    );
    // Replay folds the same pool.
    let replayed = RunState::replay(&run.events).expect("replay");
    assert_eq!(replayed.pools, run.state.pools);
    assert_eq!(replayed, run.state);
}

#[test]
fn max_rate_limits_caps_the_rate_limited_retries() {
    let mut t = task("t", Some("p"));
    t.max_retries = 0;
    t.max_rate_limits = 2;
    let mut run = Run::new(4, &[("p", 4, false)], vec![t]);
    run.round(0);
    for _ in 0..3 {
        assert_eq!(run.round(10_000), ["t"]);
        run.finish(0, rate_limited(None));
        run.round(0);
    }
    let TaskState::Finished(r) = &run.state.tasks[0].state else {
        panic!("not finished: {:?}", run.state.tasks[0].state);
    };
    assert_eq!(r.state.as_str(), "failed");
    let error = r.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("rate limited 3 times (max_rate_limits = 2)"),
        "{error}"
    );
    assert_eq!(run.pool("p").rate_limited, 3);
    assert_eq!(
        run.pool("p").backoff_until,
        None,
        "a fixed pool does not back off"
    );
}

#[test]
fn with_max_rate_limits_0_a_rate_limit_spends_a_retry() {
    let mut t = task("t", Some("p"));
    t.max_retries = 1;
    t.max_rate_limits = 0;
    let mut run = Run::new(4, &[("p", 4, true)], vec![t]);
    run.round(0);
    for _ in 0..2 {
        assert_eq!(run.round(100_000), ["t"]);
        run.finish(0, rate_limited(Some(1)));
        run.round(0);
    }
    assert!(
        matches!(&run.state.tasks[0].state, TaskState::Finished(r) if r.state.as_str() == "failed")
    );
    assert_eq!(run.state.tasks[0].attempts.len(), 2);
}

#[test]
fn provider_pools_come_from_the_models_and_adapt_without_a_table() {
    let mut a = task("a", None);
    a.model = Some("anthropic/claude-sonnet-4".into());
    let mut b = task("b", None);
    b.model = Some("gpt-5".into());
    b.fallback_models = vec!["claude-haiku-4".into()];
    let run = Run::new(4, &[], vec![a, b]);
    let names: Vec<&String> = run.state.pools.keys().collect();
    assert_eq!(names, ["anthropic", "openai"]);
    assert_eq!(run.pool("anthropic").limit(4), 4, "the run's concurrency");
    assert!(run.pool("anthropic").adaptive);
}

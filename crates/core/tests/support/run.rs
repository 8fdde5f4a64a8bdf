//! A run built event by event, the planner told of each event as the runner tells it: what
//! the planner's tests share (each adds the steps it needs in its own `impl Run`).

use sortie_core::plan::Planner;
use sortie_core::{
    AgentProfile, Attempt, AttemptOutcome, Batch, Event, RunConfig, RunId, RunState, Stamped,
    TaskId, TaskSpec, Timestamp, Usage,
};

/// The state and the planner of a run under test, and its clock (ms).
pub(crate) struct Run {
    pub(crate) state: RunState,
    pub(crate) planner: Planner,
    pub(crate) now: u64,
}

impl Run {
    /// A run `id` of `tasks` (from the batch file `source`) with `config` and the built-in
    /// profiles, started at 1,000 ms.
    pub(crate) fn start(id: &str, source: &str, config: RunConfig, tasks: Vec<TaskSpec>) -> Run {
        let mut run = Run {
            state: RunState::new(),
            planner: Planner::new(&RunState::new()),
            now: 1_000,
        };
        run.push(Event::RunStarted {
            run_id: RunId::new(id).expect("run id"),
            batch: Batch {
                tasks,
                agents: AgentProfile::builtins(),
                config,
                source: source.into(),
            },
            batch_digest: 0,
            host: "h".into(),
            pid: 1,
        });
        run.planner = Planner::new(&run.state);
        run
    }

    /// Applies one event a millisecond after the last, and tells the planner.
    pub(crate) fn push(&mut self, event: Event) -> &mut Run {
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
        self
    }

    /// Attempt `attempt` of task `t` (launched) starts, then ends with `outcome` and `output`.
    pub(crate) fn start_and_end(
        &mut self,
        t: u32,
        attempt: Attempt,
        outcome: AttemptOutcome,
        output: &str,
    ) -> &mut Run {
        let task = TaskId(t);
        self.push(Event::AttemptStarted {
            task,
            attempt,
            pid: 100 + t,
            start_time: 1,
        })
        .push(Event::AttemptFinished {
            task,
            attempt,
            outcome,
            usage: Usage::ZERO,
            output: output.into(),
        })
    }
}

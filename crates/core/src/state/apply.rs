//! Applying an event that `check` accepted: how each event changes the run and its task.

use super::*;

impl RunState {
    /// Applies an event that `check` accepted.
    pub(super) fn mutate(&mut self, at: Timestamp, event: &Event) {
        match event {
            Event::RunStarted {
                run_id,
                batch,
                batch_digest,
                host,
                pid,
            } => self.start(
                at,
                run_id.clone(),
                batch.clone(),
                *batch_digest,
                host.clone(),
                *pid,
            ),
            Event::RunResumed { pid, .. } => {
                self.pid = *pid;
                self.resumes += 1;
                self.status = RunStatus::Running;
            }
            Event::RunInterrupted { reason } => {
                self.status = RunStatus::Interrupted {
                    reason: reason.clone(),
                };
            }
            Event::RunFinished { state, summary } => {
                self.status = RunStatus::Finished { state: *state };
                self.summary = Some(summary.clone());
            }
            Event::RunBudgetWarned { limit, .. } => self.budget_warned.push(*limit),
            Event::RunRerunOf { parent } => self.parent = Some(parent.clone()),
            Event::RunRecovered {
                kept,
                scanned,
                lost,
                restored,
                damaged,
            } => self.recovered.push(super::Recovery {
                at,
                kept: *kept,
                scanned: *scanned,
                lost: *lost,
                restored: restored.clone(),
                damaged: damaged.clone(),
            }),
            Event::RunBudgetExceeded { limit, reason } => {
                self.budget_exceeded = Some((*limit, reason.clone()));
            }
            Event::Control { action, .. } => self.control_apply(action),
            _ => {
                let Some(task) = event.task() else { return };
                let resumes = self.resumes;
                let Some(rec) = self.tasks.get_mut(task.index()) else {
                    return;
                };
                // Only these change an attempt's usage: the others spare two sums.
                let moves_usage = matches!(
                    event,
                    Event::AttemptLaunching { .. }
                        | Event::AttemptProgress { .. }
                        | Event::AttemptFinished { .. }
                );
                let was_done = rec.state.is_terminal();
                let before = moves_usage.then(|| rec.usage());
                Self::mutate_task(rec, at, event, resumes, &mut self.strings);
                let is_done = rec.state.is_terminal();
                if let Some(before) = before {
                    let after = rec.usage();
                    if after != before {
                        self.tally = counters_minus(&self.tally.plus(&after), &before);
                    }
                }
                match (was_done, is_done) {
                    (false, true) => self.done += 1,
                    (true, false) => self.done = self.done.saturating_sub(1),
                    _ => {}
                }
                self.pool_follow(task, at, event);
            }
        }
    }

    /// Applies `RunStarted`.
    pub(super) fn start(
        &mut self,
        at: Timestamp,
        run_id: RunId,
        batch: Batch,
        batch_digest: u64,
        host: String,
        pid: u32,
    ) {
        self.run_id = Some(run_id);
        self.tasks = batch.tasks.iter().map(|_| TaskRecord::new()).collect();
        (self.done, self.tally) = (0, Usage::ZERO);
        self.labels = (0..batch.tasks.len() as u32).map(TaskId).collect();
        self.labels.sort_unstable_by(|a, b| {
            (batch.tasks[a.index()].label.as_str(), a)
                .cmp(&(batch.tasks[b.index()].label.as_str(), b))
        });
        self.pools = crate::pool::pool_names(&batch)
            .into_iter()
            .chain(batch.config.pools.keys().cloned())
            .map(|name| {
                let pool = crate::pool::PoolState::new(batch.config.pools.get(&name));
                (name, pool)
            })
            .collect();
        self.batch = Some(batch);
        self.batch_digest = batch_digest;
        self.host = host;
        self.pid = pid;
        self.started_at = Some(at);
        self.status = RunStatus::Running;
    }

    /// Folds an attempt's launch and end into its pool (see `crate::pool`).
    fn pool_follow(&mut self, task: TaskId, at: Timestamp, event: &Event) {
        let ended = match event {
            Event::AttemptLaunching { .. } => false,
            Event::AttemptFinished { .. } | Event::AttemptOrphaned { .. } => true,
            _ => return,
        };
        let (Some(batch), Some(rec)) = (&self.batch, self.tasks.get(task.index())) else {
            return;
        };
        let (Some(spec), Some(attempt)) = (batch.tasks.get(task.index()), rec.attempts.last())
        else {
            return;
        };
        let Some(name) = crate::pool::pool_ref(batch, spec, attempt.model()) else {
            return;
        };
        let run = self.control.concurrency.unwrap_or(batch.config.concurrency);
        // The pool is nearly always known (the run's start made every pool its tasks name):
        // found by the borrowed name, without allocating a key.
        if !self.pools.contains_key(name.as_ref()) {
            let pool = crate::pool::PoolState::new(batch.config.pools.get(name.as_ref()));
            self.pools.insert(name.clone().into_owned(), pool);
        }
        let Some(pool) = self.pools.get_mut(name.as_ref()) else {
            return;
        };
        match (&attempt.end, ended) {
            (_, false) => pool.launched(),
            (Some(AttemptEnd::Finished { outcome, .. }), true) => {
                // `max_rate_limits = 0`: a rate limit is an ordinary transient error, and
                // the pool still learns from it.
                let limited = outcome.rate_limited.then(|| {
                    outcome
                        .retry_after_ms()
                        .map(std::time::Duration::from_millis)
                });
                pool.ended(at, attempt.launched_at, limited, run);
            }
            _ => pool.orphaned(),
        }
    }

    /// Applies an event to the task it names: its state and steps here, its attempts in
    /// [`Self::mutate_attempt`]. The match names every event, so that a new one is placed by
    /// the compiler.
    pub(super) fn mutate_task(
        rec: &mut TaskRecord,
        at: Timestamp,
        event: &Event,
        resumes: u32,
        strings: &mut Interner,
    ) {
        match event {
            Event::TaskQueued { .. } => {
                rec.ready_at = Some(at);
                rec.state = TaskState::Queued { since: at };
            }
            Event::TaskSetUp { worktree, .. } => rec.steps_mut().setup = Some(worktree.clone()),
            Event::WorktreePlanned {
                repo,
                path,
                branch,
                base,
                ..
            } => {
                rec.steps_mut().worktree = Some(PlannedWorktree {
                    repo: repo.clone(),
                    path: path.clone(),
                    branch: branch.clone(),
                    base: base.clone(),
                });
            }
            Event::RetryScheduled {
                next_attempt,
                model,
                delay,
                ..
            } => {
                rec.state = TaskState::Retrying {
                    next: *next_attempt,
                    model: model.clone(),
                    not_before: at.plus(*delay),
                };
            }
            Event::ArtifactWritten {
                path,
                bytes,
                digest,
                ..
            } => {
                rec.steps_mut().artifact = Some(Artifact {
                    path: path.clone(),
                    bytes: *bytes,
                    digest: *digest,
                });
            }
            Event::WorktreeFinalized { changed, diff, .. } => {
                rec.steps_mut().worktree_final = Some((*changed, diff.clone()));
            }
            Event::WorktreeDiscarded {
                by, branch_kept, ..
            } => {
                rec.steps_mut().discarded = Some(Discarded {
                    by: *by,
                    at,
                    branch_kept: *branch_kept,
                });
            }
            Event::TaskFinished { result, .. } => rec.state = TaskState::Finished(result.clone()),
            // #33: the check of the ended attempt (the task stays `Ended` around it).
            Event::VerifyStarted { .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_verify(None);
                }
            }
            Event::VerifyEnded { verdict, .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_verify(Some(verdict.clone()));
                }
            }
            Event::TaskCarried { result, usage, .. } => {
                rec.state = TaskState::Finished(result.clone());
                rec.steps_mut().carried = Some(*usage);
            }
            Event::AttemptLaunching { .. }
            | Event::AttemptStarted { .. }
            | Event::AttemptProgress { .. }
            | Event::AttemptStalled { .. }
            | Event::AttemptFinished { .. }
            | Event::AttemptOrphaned { .. }
            | Event::AttemptSideEffects { .. }
            | Event::AttemptContinues { .. }
            | Event::AttemptSession { .. }
            | Event::SandboxNet { .. }
            | Event::AttemptPlaced { .. }
            | Event::AttemptHandle { .. }
            | Event::AttemptRead { .. }
            | Event::AttemptAdopted { .. }
            | Event::AttemptRecorded { .. }
            | Event::AttemptWaiting { .. } => {
                Self::mutate_attempt(rec, at, event, resumes, strings);
            }
            Event::RunStarted { .. }
            | Event::RunResumed { .. }
            | Event::RunInterrupted { .. }
            | Event::RunFinished { .. }
            | Event::RunBudgetWarned { .. }
            | Event::RunBudgetExceeded { .. }
            | Event::Control { .. }
            | Event::RunRerunOf { .. }
            | Event::RunRecovered { .. } => {}
        }
    }

    /// Applies an attempt's event to the task's attempts (the last one, except a launch, which
    /// adds one) and, for a launch or an end, to the task's state.
    fn mutate_attempt(
        rec: &mut TaskRecord,
        at: Timestamp,
        event: &Event,
        resumes: u32,
        strings: &mut Interner,
    ) {
        match event {
            Event::AttemptLaunching { attempt, model, .. } => {
                // Most tasks make one attempt: no room for four (a Vec's first growth) in each
                // of a big run's 100,000 records.
                rec.attempts.reserve_exact(1);
                rec.attempts
                    .push(AttemptRecord::new(*attempt, model.clone(), at));
                rec.state = TaskState::Running { attempt: *attempt };
            }
            Event::AttemptStarted {
                pid, start_time, ..
            } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.pid = Some(*pid);
                    a.start_time = Some(*start_time);
                    if let Some((began, None)) = a.waited() {
                        a.set_waited((began, Some(at)));
                    }
                }
            }
            Event::AttemptWaiting { .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_waited((at, None));
                }
            }
            Event::AttemptProgress { usage, .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_usage(*usage);
                    a.stalled = false;
                }
            }
            Event::AttemptStalled { .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.stalled = true;
                }
            }
            Event::AttemptFinished {
                attempt,
                outcome,
                usage,
                output,
                ..
            } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_usage(*usage);
                    a.side_effects |= outcome.side_effects;
                    a.end = Some(AttemptEnd::Finished {
                        outcome: OutcomeRecord::new(outcome, output),
                        at,
                    });
                }
                rec.state = TaskState::Ended { attempt: *attempt };
            }
            Event::AttemptOrphaned {
                attempt, action, ..
            } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.end = Some(AttemptEnd::Orphaned {
                        action: *action,
                        at,
                    });
                }
                rec.state = TaskState::Ended { attempt: *attempt };
            }
            Event::AttemptSideEffects { .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.side_effects = true;
                }
            }
            Event::AttemptContinues { session, .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_continues(Some(session.clone()));
                }
            }
            Event::AttemptSession { session, .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_session(Some(session.clone()));
                }
            }
            Event::SandboxNet { flows, .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.set_net(flows.clone());
                }
            }
            Event::AttemptPlaced { executor, dir, .. } => {
                if let Some(a) = rec.attempts.last_mut() {
                    a.placed = Some(Box::new(Placed::interned(executor, dir, strings)));
                }
            }
            Event::AttemptHandle { handle, .. } => {
                if let Some(p) = rec.attempts.last_mut().and_then(|a| a.placed.as_mut()) {
                    p.handle = Some(handle.clone());
                }
            }
            Event::AttemptRead { offset, .. } => {
                if let Some(p) = rec.attempts.last_mut().and_then(|a| a.placed.as_mut()) {
                    p.read = *offset;
                }
            }
            Event::AttemptAdopted { .. } | Event::AttemptRecorded { .. } => {
                let found = match event {
                    Event::AttemptAdopted { .. } => Found::Adopted,
                    _ => Found::Recorded,
                };
                if let Some(p) = rec.attempts.last_mut().and_then(|a| a.placed.as_mut()) {
                    p.found = Some((resumes, found));
                }
            }
            _ => {}
        }
    }

    /// Applies `Event::Control`.
    fn control_apply(&mut self, action: &ControlAction) {
        let c = &mut self.control;
        match action {
            ControlAction::Hold { task: Some(t) } => {
                c.held.insert(*t);
            }
            ControlAction::Hold { task: None } => c.run_held = true,
            ControlAction::Release { task: Some(t) } => {
                c.held.remove(t);
            }
            ControlAction::Release { task: None } => {
                c.run_held = false;
                c.held.clear();
            }
            ControlAction::Cancel { task: Some(t) } => {
                c.cancelled.insert(*t);
                c.held.remove(t);
            }
            ControlAction::Cancel { task: None } => c.run_cancelled = true,
            ControlAction::Steer { .. } => {}
            ControlAction::Concurrency { n } => c.concurrency = Some(*n),
        }
    }
}

/// `a - b` counter by counter (saturating), with `context_tokens` 0: undoes a `plus` of `b` in
/// a running total of counters.
fn counters_minus(a: &Usage, b: &Usage) -> Usage {
    Usage {
        input: a.input.saturating_sub(b.input),
        output: a.output.saturating_sub(b.output),
        cache_read: a.cache_read.saturating_sub(b.cache_read),
        cache_write: a.cache_write.saturating_sub(b.cache_write),
        reasoning: a.reasoning.saturating_sub(b.reasoning),
        cost: crate::usage::Cost {
            nanos: a.cost.nanos.saturating_sub(b.cost.nanos),
            unreported: a.cost.unreported.saturating_sub(b.cost.unreported),
        },
        turns: a.turns.saturating_sub(b.turns),
        context_tokens: 0,
    }
}

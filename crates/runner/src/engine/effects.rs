//! What a round's actions do, once its events are durable: spawn the attempts it journaled as
//! launching, end tasks through their effects (artifact, then worktree finalize, then
//! `TaskFinished`), start worktree setup jobs.

use std::path::Path;

use sortie_core::plan::{Action, RunEnding};
use sortie_core::{Event, TaskId, TaskResult, decide};

use super::Engine;
use crate::attempt;
use crate::{Result, files};

impl Engine {
    /// Appends the round's events in one durable write, with the placements of its launches
    /// and its task ends that are only their event, then performs its effects: launches, then
    /// the other task ends, then worktree jobs. Returns the run's end when the planner decided
    /// it (the loop journals it: `Engine::end_run`).
    pub(super) async fn perform(&mut self, actions: Vec<Action>) -> Result<Option<RunEnding>> {
        // The planner ends a run in a round of its own: nothing to write or perform here.
        if let [Action::EndRun(end)] = actions[..] {
            return Ok(Some(end));
        }
        let mut launches = Vec::new();
        let mut ending = None;
        let mut ends = Vec::new();
        let mut jobs = Vec::new();
        let mut wind_down = None;
        let mut ended = Vec::new();
        let mut checks = Vec::new();
        let mut stops = Vec::new();
        // Collected in place: the events take over the actions' buffer (an `Action` is the size
        // of an `Event`) instead of a second one beside it (the first round of a 100,000-task
        // run queues every task: 32 MB each).
        let mut events: Vec<Event> = actions
            .into_iter()
            .filter_map(|action| match action {
                Action::Append(e) => {
                    // A task the planner ended with its event alone: its copy goes too.
                    if let Event::TaskFinished { task, .. } = &e {
                        ended.push(*task);
                    }
                    Some(e)
                }
                Action::Launch(task) => {
                    launches.push(task);
                    None
                }
                Action::EndTask {
                    task,
                    result,
                    artifact,
                    finalize,
                } => {
                    ends.push((task, result, artifact, finalize));
                    None
                }
                Action::StartJob(task, kind) => {
                    jobs.push((task, kind));
                    None
                }
                Action::Verify(task) => {
                    checks.push(task);
                    None
                }
                Action::StopTask(task, message) => {
                    stops.push((task, message));
                    None
                }
                Action::WindDown(reason) => {
                    wind_down = Some(reason);
                    None
                }
                Action::EndRun(end) => {
                    ending = Some(end);
                    None
                }
            })
            .collect();
        // #10: an attempt that outlives sortie (supervised, or a Slurm job) is placed before
        // it starts (resume finds it again from its placement): its `AttemptPlaced` follows
        // its `AttemptLaunching` in the round's write (`check_round` checks it against the
        // launch), so a launch costs one durable write, not two.
        let placed: Vec<Event> = launches
            .iter()
            .filter_map(|task| self.placed_event(&events, *task))
            .collect();
        events.extend(placed);
        // A task end that is only its event (no artifact to write first, no worktree to
        // finalize) shares the write too.
        let (plain, effectful): (Vec<_>, Vec<_>) = ends
            .into_iter()
            .partition(|(_, _, artifact, finalize)| !artifact && !finalize);
        let mut plain_tasks = Vec::with_capacity(plain.len());
        for (task, result, ..) in plain {
            plain_tasks.push(task);
            events.push(Event::TaskFinished { task, result });
        }
        // The reports that arrived meanwhile share the write (`commit_with_reports`).
        let reports = self.commit_with_reports(events)?;
        if let Some(reason) = wind_down {
            self.wind_down(&reason);
        }
        // #33: a sample that lost to a first-pass winner: stopped as a cancel stops it.
        for (task, message) in stops {
            if let Some(h) = self.live.get(&task) {
                h.stop(crate::attempt::StopRequest {
                    reason: sortie_core::outcome::StopReason::Cancelled,
                    phase: None,
                    message,
                });
            }
        }
        self.launch_all(launches).await?;
        for task in plain_tasks.into_iter().chain(ended) {
            self.discard_copy(task).await;
        }
        for (task, result, artifact, finalize) in effectful {
            self.end_task(task, result, artifact, finalize).await?;
        }
        for (task, kind) in jobs {
            self.start_job(task, kind, None);
        }
        for task in checks {
            self.start_check(task);
        }
        if !reports.is_empty() {
            self.handle(reports)?;
        }
        Ok(ending)
    }

    /// The placement event of the attempt `events` launch for `task`, when its executor
    /// outlives sortie.
    fn placed_event(&self, events: &[Event], task: TaskId) -> Option<Event> {
        let attempt = events.iter().find_map(|e| match e {
            Event::AttemptLaunching {
                task: t, attempt, ..
            } if *t == task => Some(*attempt),
            _ => None,
        })?;
        let (executor, placement) = self.new_placement(task, attempt)?;
        if !executor.can().outlives_sortie {
            return None;
        }
        Some(Event::AttemptPlaced {
            task,
            attempt,
            executor: placement.executor,
            dir: placement.dir.to_string_lossy().into_owned(),
        })
    }

    /// Starts the attempts that were just journaled as launching (and placed, see
    /// `perform`). An attempt that continues an interrupted attempt's session has
    /// `AttemptContinues` journaled first; an attempt that outlives sortie and was not placed
    /// in its launch's write has its placement journaled (one write for the round's
    /// launches) before its executor starts it. Under the test hook `before:spawn`
    /// ([`super::TEST_PAUSE_AFTER`]) the loop freezes here, the launches durable and nothing
    /// spawned.
    async fn launch_all(&mut self, tasks: Vec<TaskId>) -> Result<()> {
        let mut ready = Vec::with_capacity(tasks.len());
        let mut placed = Vec::new();
        for task in tasks {
            let Some((ctx, continues)) = self.attempt_ctx(task) else {
                continue;
            };
            if let Some(session) = continues {
                self.commit(vec![Event::AttemptContinues {
                    task,
                    attempt: ctx.attempt,
                    session,
                }])?;
            }
            let unplaced = self
                .state
                .task(task)
                .and_then(|r| r.live_attempt())
                .is_some_and(|a| a.placed.is_none());
            if unplaced && ctx.executor.can().outlives_sortie {
                placed.push(Event::AttemptPlaced {
                    task,
                    attempt: ctx.attempt,
                    executor: ctx.placement.executor.clone(),
                    dir: ctx.placement.dir.to_string_lossy().into_owned(),
                });
            }
            ready.push(ctx);
        }
        self.commit(placed)?;
        if !ready.is_empty() && self.pause_after.0.as_deref() == Some("before:spawn") {
            self.settle()?;
            std::future::pending::<()>().await;
        }
        for ctx in ready {
            self.start_attempt(ctx);
        }
        Ok(())
    }

    /// Starts following an attempt (launched, or adopted on resume) and counts it live.
    pub(super) fn start_attempt(&mut self, ctx: attempt::AttemptCtx) {
        let task = ctx.task;
        let handle = attempt::start(ctx, self.tx.clone());
        // Only an attempt adopted after a crash can be of a held task (a held task does not
        // launch): it was stopped, and stays stopped, its clocks with it.
        if self.state.control.is_held(task) {
            handle.control(attempt::Ctl::Hold);
        }
        self.live.insert(task, handle);
    }

    /// Ends a task whose result the planner decided: its artifact first (write-ahead: the
    /// attempt's end is durable, the artifact comes next, the task's end only after it), then
    /// its worktree's finalize (a job; `TaskFinished` follows its report), else `TaskFinished`.
    async fn end_task(
        &mut self,
        task: TaskId,
        mut result: TaskResult,
        artifact: bool,
        finalize: bool,
    ) -> Result<()> {
        if artifact {
            match self.write_artifact(task, &result) {
                Ok(Some(event)) => {
                    self.commit(vec![event])?;
                    self.pause_point().await;
                }
                Ok(None) => {}
                // The task's outcome, not an error of the run.
                Err(e) => result = decide::artifact_failed(result, &e.to_string()),
            }
        }
        if finalize {
            self.start_job(task, sortie_core::JobKind::Finalize, Some(result));
            return Ok(());
        }
        self.commit(vec![Event::TaskFinished { task, result }])?;
        self.discard_copy(task).await;
        Ok(())
    }

    /// #14: once a task with `isolation = "copy"` ended, its copy goes (best effort: a copy
    /// that cannot be removed is a warning; a resume tries again).
    pub(super) async fn discard_copy(&self, task: TaskId) {
        let is_copy = self
            .state
            .spec(task)
            .is_some_and(|s| s.isolation == sortie_core::Isolation::Copy);
        if !is_copy {
            return;
        }
        let dir = self.run_dir.copy_dir(task.0);
        let gone = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || crate::copy::discard(&dir)
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        if let Err(e) = gone {
            tracing::warn!("cannot remove the copy {}: {e}", dir.display());
        }
    }

    /// Writes a finished task's artifact atomically (temp file and rename) and returns the
    /// event that records it.
    fn write_artifact(&self, task: TaskId, result: &TaskResult) -> Result<Option<Event>> {
        let Some(path) = self.state.spec(task).and_then(|s| s.output.clone()) else {
            return Ok(None);
        };
        let text = result.text.as_bytes();
        files::write_atomic_creating_dirs(Path::new(&path), text, 0o644)?;
        Ok(Some(Event::ArtifactWritten {
            task,
            path,
            bytes: text.len() as u64,
            digest: sortie_core::digest::fnv1a(text),
        }))
    }
}

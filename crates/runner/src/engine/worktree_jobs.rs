//! Worktree jobs beside the run loop: plan (read the repository) → `WorktreePlanned`, create →
//! `TaskSetUp`, finalize (keep or remove) → `WorktreeFinalized` then the task's end. Each reports
//! back like an attempt; each step is idempotent and derived from the journal, so resume
//! finishes whatever a crash cut short. A setup job holds a concurrency slot and is bounded by
//! the task's deadline; a finalize always runs to its end.

use std::path::PathBuf;
use std::time::Duration;

use sortie_core::plan::JobKind;
use sortie_core::{Event, PlannedWorktree, TaskId, TaskResult, decide};

use super::{Engine, Job};
use crate::Result;
use crate::clock::now;
use crate::worktree::{self, Finalized};

/// A worktree job's report.
pub(super) enum WtMsg {
    Planned(TaskId, std::result::Result<PlannedWorktree, String>),
    Created(TaskId, std::result::Result<(), String>),
    Finalized(TaskId, std::result::Result<Finalized, String>),
}

impl Engine {
    /// Starts a worktree job for a task; its report comes back through `wt_rx`. A finalize
    /// carries the result the task ends with.
    pub(super) fn start_job(&mut self, task: TaskId, kind: JobKind, ending: Option<TaskResult>) {
        let (Some(spec), Some(rec)) = (self.state.spec(task), self.state.task(task)) else {
            return;
        };
        let tx = self.wt_tx.clone();
        // Setup counts against the task's deadline; a finalize always runs to its end.
        let budget = rec
            .deadline_at(spec)
            .map_or(Duration::MAX, |at| at.since(now()));
        let handle = match (kind, rec.steps().worktree.clone()) {
            (JobKind::Plan, _) => {
                let state_dir = self.state_dir.canonical();
                let (path, branch) =
                    worktree::location(&state_dir, self.run_id.as_str(), &spec.label, task.0);
                let scratch = path.with_extension("index.tmp");
                let cwd = PathBuf::from(&spec.cwd);
                let wip = spec.include_wip;
                let fut = async move {
                    worktree::plan(&cwd, &path, &branch, wip, &scratch, state_dir.root())
                        .await
                        .map_err(|e| e.to_string())
                };
                tokio::spawn(async move {
                    let _ = tx.send(WtMsg::Planned(task, worktree::within(budget, fut).await));
                })
            }
            (JobKind::Create, Some(plan)) => {
                let fut = async move { worktree::create(&plan).await.map_err(|e| e.to_string()) };
                tokio::spawn(async move {
                    let _ = tx.send(WtMsg::Created(task, worktree::within(budget, fut).await));
                })
            }
            (JobKind::Finalize, Some(plan)) => {
                let patch = self
                    .run_dir
                    .patch(&worktree::safe_name(&spec.label, task.0));
                tokio::spawn(async move {
                    let r = worktree::finalize(&plan, &patch)
                        .await
                        .map_err(|e| e.to_string());
                    let _ = tx.send(WtMsg::Finalized(task, r));
                })
            }
            (JobKind::Create | JobKind::Finalize, None) => return,
        };
        self.jobs.insert(
            task,
            Job {
                kind,
                handle,
                ending,
            },
        );
    }

    /// Turns a worktree job's report into its event (checked first: a report that no longer
    /// fits the state is dropped), or records why the step failed. A finalize's report ends its
    /// task: a failure keeps the worktree and downgrades the result.
    pub(super) async fn handle_wt(&mut self, msg: WtMsg) -> Result<()> {
        let (task, event) = match msg {
            WtMsg::Planned(task, Ok(plan)) => (
                task,
                Event::WorktreePlanned {
                    task,
                    repo: plan.repo,
                    path: plan.path,
                    branch: plan.branch,
                    base: plan.base,
                },
            ),
            WtMsg::Created(task, Ok(())) => {
                self.jobs.remove(&task);
                let Some(rec) = self.state.task(task) else {
                    return Ok(());
                };
                if rec.steps().setup.is_some() {
                    return Ok(()); // a missing worktree was made again
                }
                let worktree = rec.steps().worktree.as_ref().map(|p| p.path.clone());
                (task, Event::TaskSetUp { task, worktree })
            }
            WtMsg::Finalized(task, Ok(f)) => {
                if self.pause_after.0.as_deref() == Some("before:WorktreeFinalized") {
                    std::future::pending::<()>().await;
                }
                let event = Event::WorktreeFinalized {
                    task,
                    changed: f.changed,
                    diff: f.diff,
                };
                let ending = self.jobs.remove(&task).and_then(|j| j.ending);
                self.commit_report(event)?;
                self.pause_point().await;
                return self.end_after_finalize(task, ending);
            }
            WtMsg::Planned(task, Err(why)) | WtMsg::Created(task, Err(why)) => {
                tracing::warn!("worktree setup of task {task} failed: {why}");
                self.jobs.remove(&task);
                self.setup_failed.insert(task, why);
                return Ok(());
            }
            WtMsg::Finalized(task, Err(why)) => {
                tracing::warn!("worktree finalize of task {task} failed: {why}");
                let ending = self.jobs.remove(&task).and_then(|j| j.ending);
                let ending = ending.map(|r| decide::finalize_failed(r, &why));
                return self.end_after_finalize(task, ending);
            }
        };
        self.jobs.remove(&task);
        self.commit_report(event)
    }

    /// Commits a job's event unless it no longer fits the state.
    fn commit_report(&mut self, event: Event) -> Result<()> {
        match self.state.check(&event) {
            Ok(()) => self.commit(vec![event]),
            Err(v) => {
                tracing::warn!("dropping a worktree report: {v}");
                Ok(())
            }
        }
    }

    /// The end a finalize was for.
    fn end_after_finalize(&mut self, task: TaskId, ending: Option<TaskResult>) -> Result<()> {
        match ending {
            Some(result) => self.commit_report(Event::TaskFinished { task, result }),
            None => Ok(()),
        }
    }
}

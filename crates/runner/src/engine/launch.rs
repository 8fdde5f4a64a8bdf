//! An attempt's context, from its spec, its task's record and its agent profile: the
//! rendered prompt, the agent's launch plan (argv, home, session, drive: see `agent`), the
//! working directory, the environment, the limits, and the marker that lets resume find its
//! processes. The engine knows no agent by name.

use std::path::PathBuf;
use std::sync::Arc;

use sortie_core::{Isolation, TaskId};

use super::Engine;
use crate::attempt::{self, AttemptCtx};
use crate::executor::{self, Executor, Placement};
use crate::{agent, process, worktree};

impl Engine {
    /// The context of the attempt just journaled as launching, and the session it continues.
    pub(super) fn attempt_ctx(&self, task: TaskId) -> Option<(AttemptCtx, Option<String>)> {
        let batch = self.state.batch.as_ref()?;
        let spec = self.state.spec(task)?;
        let rec = self.state.task(task)?;
        let live = rec.live_attempt()?;
        let mut prompt_text = sortie_core::prompt::render(&self.state, task);
        let cwd = match (&spec.isolation, &rec.steps().worktree) {
            (Isolation::Worktree, Some(plan)) => worktree::agent_cwd(plan, &spec.cwd),
            // #14: the task's copy, made by its attempt before the spawn.
            (Isolation::Copy, _) => self.run_dir.copy_dir(task.0),
            _ => PathBuf::from(&spec.cwd),
        };
        let profile = batch.launch_profile(spec)?;
        // #34: references are read now (and again at resume), never kept; a value that
        // cannot be read fails the launch (see `AttemptCtx::env_error`).
        let refs = self.env.get(&task.index()).map(Vec::as_slice);
        let (mut env, redactor, env_error) =
            match sortie_batch::resolve_env(refs.unwrap_or_default()) {
                Ok(r) => (r.env, r.redactor, None),
                Err(e) => (Vec::new(), sortie_batch::Redactor::default(), Some(e)),
            };
        // A run the attempt starts is nested one deeper (`slots::DEPTH_VAR`).
        env.push((
            crate::slots::DEPTH_VAR.to_owned(),
            (crate::slots::depth() + 1).to_string(),
        ));
        // #33: a feedback round is asked with the check's failure (an agent, as its prompt in
        // the same conversation; a command, in the file SORTIE_VERIFY_FEEDBACK names).
        if let Some((feedback, file)) = self.feedback(task) {
            env.push((
                sortie_core::verify::FEEDBACK_VAR.to_owned(),
                file.display().to_string(),
            ));
            if spec.command.is_none() {
                prompt_text = feedback;
            }
        }
        // #13: the conversation this attempt continues, if any (an interrupted attempt's, or
        // its session's).
        let links = self
            .session_links
            .get_or_init(|| sortie_core::session::session_links(batch));
        let (conversation_root, conversation) =
            sortie_core::session::conversation(&self.state, links, task);
        // The agent the profile speaks (none for a task's own command) shapes the launch: its
        // prompt, session, stdin drive and per-attempt home (see `agent`).
        let mut plan = agent::launch_plan(
            &agent::LaunchInput {
                profile,
                spec,
                rec,
                task,
                live,
                run_dir: &self.run_dir,
                cwd: &cwd,
                env: &env,
                conversation: &conversation,
                conversation_root,
            },
            prompt_text,
        );
        // #37: the price the run resolved for the attempt's model, when its agent reports no
        // cost.
        plan.price = sortie_core::prices::attempt_price(
            &batch.config.prices.models,
            plan.protocol,
            live.model(),
        );
        let deadline_at = rec.deadline_at(spec);
        let continues = plan.continues.clone();
        // A placed attempt keeps its executor and dir (resume follows it there); a new one
        // is placed by `new_placement`.
        let (executor, placement): (Arc<dyn Executor>, Placement) = match live.placed {
            Some(_) => {
                let dir = self.run_dir.attempt_dir(task.0, live.attempt.0);
                let placement = Placement::of_record(task, live, dir);
                (self.executor_of(&placement.executor, task)?, placement)
            }
            None => self.new_placement(task, live.attempt)?,
        };
        Some((
            AttemptCtx {
                task,
                attempt: live.attempt,
                launch: plan,
                cwd,
                env,
                env_error,
                redactor: Arc::new(redactor),
                marker: process::marker(&self.run_id, task, live.attempt, self.incarnation()),
                stderr_log: self.run_dir.stderr_log(task.0, live.attempt.0),
                limits: attempt::Limits {
                    attempt_timeout: spec.attempt_timeout,
                    deadline_at,
                    stall_after: spec.stall_after,
                    stall_kill_after: spec.stall_kill_after,
                    budget: sortie_core::budget::TaskBudget::for_attempt(spec, rec),
                },
                kill_grace: spec.kill_grace,
                executor,
                placement,
                // #37: an attempt that waited for a machine slot is clocked from its start.
                launched_at: live.clock_from(),
                adopt: None,
                allow_denials: spec.allow_denials,
                resumed: None,
                read_until: 0,
                transient_on: spec.transient_on.clone(),
                copy_from: (spec.isolation == Isolation::Copy).then(|| {
                    (
                        PathBuf::from(&spec.cwd),
                        self.state_dir.root().to_path_buf(),
                    )
                }),

                output_schema: spec.output_schema.clone(),
                repair_prompt: self.run_dir.repair_prompt_file(task.0, live.attempt.0),
                // #34: the kernel sandbox.
                sandbox: (spec.sandbox == sortie_core::sandbox::Sandbox::Workspace).then(|| {
                    attempt::sandbox::SandboxPlan {
                        dir: self.run_dir.sandbox_dir(task.0, live.attempt.0),
                        write: spec.sandbox_write.clone(),
                        read: spec.sandbox_read.clone(),
                        hosts: spec.sandbox_hosts.clone(),
                        model: live.model().map(str::to_owned),
                    }
                }),
            },
            continues,
        ))
    }

    /// #33: when the live attempt of `task` answers a failed check (a feedback round, or its
    /// retry): the message, written to `checks/<task>.<checked attempt>.feedback`.
    fn feedback(&self, task: TaskId) -> Option<(String, PathBuf)> {
        let spec = self.state.spec(task)?;
        let rec = self.state.task(task)?;
        let (checked, verdict) = sortie_core::verify::answering(rec)?;
        let command = spec.verify.as_deref().unwrap_or_default();
        let (t, a) = (task.0, checked.attempt.0);
        let log = std::fs::read(self.run_dir.check_file(t, a, "log")).unwrap_or_default();
        let message =
            sortie_core::verify::feedback_message(command, verdict, &String::from_utf8_lossy(&log));
        let file = self.run_dir.check_file(t, a, "feedback");
        if let Err(e) = crate::files::write_atomic(&file, message.as_bytes(), 0o600) {
            tracing::warn!("cannot write {}: {e}", file.display());
        }
        Some((message, file))
    }

    /// Where a new attempt (`attempt` of `task`, journaled as launching or about to be) runs:
    /// the executor its spec chooses (see `executor::for_spec`; a task or profile that says
    /// not to supervise runs direct). Read from the spec and its profile only, so that the
    /// placement is known before the launch is applied and is journaled in the launch's write
    /// (see `perform`).
    pub(super) fn new_placement(
        &self,
        task: TaskId,
        attempt: sortie_core::Attempt,
    ) -> Option<(Arc<dyn Executor>, Placement)> {
        let batch = self.state.batch.as_ref()?;
        let spec = self.state.spec(task)?;
        let profile = batch.launch_profile(spec)?;
        let dir = self.run_dir.attempt_dir(task.0, attempt.0);
        // The dir is journaled as text: a path that is not UTF-8 runs direct.
        let supervise = spec.supervise && profile.supervise && dir.to_str().is_some();
        let executor = executor::for_spec(spec, &self.executor_choice(task, supervise)?);
        let placement = executor.place(dir, task, attempt);
        Some((executor, placement))
    }

    /// The executor of a journaled placement's executor name `name` for `task` (see
    /// `executor::for_placement`).
    pub(super) fn executor_of(&self, name: &str, task: TaskId) -> Option<Arc<dyn Executor>> {
        let spec = self.state.spec(task)?;
        executor::for_placement(name, spec, &self.executor_choice(task, false)?)
    }

    /// What choosing `task`'s executor needs beside its spec.
    fn executor_choice(&self, task: TaskId, supervise: bool) -> Option<executor::Choice<'_>> {
        let spec = self.state.spec(task)?;
        let rec = self.state.task(task)?;
        Some(executor::Choice {
            shared: &self.executors,
            run: &self.run_id,
            incarnation: self.incarnation(),
            deadline_at: rec.deadline_at(spec),
            supervise,
        })
    }
}

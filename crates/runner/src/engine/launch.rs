//! An attempt's context, from its spec, its task's record and its agent profile: the
//! rendered prompt and argv, the working directory, the environment, the agent's own home and
//! session, the limits, and the marker that lets resume find its processes.

use std::path::{Path, PathBuf};

use sortie_core::{Attempt, Isolation, StopReason, TaskId, TaskRecord};

use super::Engine;
use crate::attempt::{self, AttemptCtx};
use crate::{agent_home, process, worktree};

/// The environment variable that marks every attempt's process with
/// `<run>/<task>/<attempt>/<incarnation>`, so that resume finds a crashed run's children even
/// when their pid never reached the journal. The incarnation (the run's start time in ms, in
/// hex, from its journal) tells apart runs of the same id in other state dirs, which resume
/// leaves alone; a marker without it counts as this run's.
pub const MARKER: &str = "SORTIE_ATTEMPT";

impl Engine {
    /// The session arguments of a live attempt of a continuable pi profile (see
    /// [`process::SESSION_ARGS`]): its own session directory under the run dir, and, when the
    /// task's previous attempt was interrupted (a crash or a Ctrl-C) and left a session file,
    /// that file to continue. Returns the directory, the arguments and the continued session.
    fn session_plan(
        &self,
        task: TaskId,
        rec: &TaskRecord,
        attempt: Attempt,
    ) -> (PathBuf, Vec<String>, Option<String>) {
        let dir = self.run_dir.sessions(task.0, attempt.0);
        let mut args = vec!["--session-dir".to_owned(), dir.display().to_string()];
        let previous = rec
            .attempts
            .len()
            .checked_sub(2)
            .and_then(|i| rec.attempts.get(i));
        let continued = previous
            .filter(|p| {
                p.outcome()
                    .is_some_and(|o| o.stop_reason == StopReason::Interrupted)
            })
            .and_then(|p| {
                p.continues
                    .clone()
                    .filter(|s| Path::new(s).is_file())
                    .or_else(|| latest_session(&self.run_dir.sessions(task.0, p.attempt.0)))
            });
        if let Some(session) = &continued {
            args.push("--session".to_owned());
            args.push(session.clone());
        }
        (dir, args, continued)
    }

    pub(super) fn attempt_ctx(&self, task: TaskId) -> Option<(AttemptCtx, Option<String>)> {
        let batch = self.state.batch.as_ref()?;
        let spec = self.state.spec(task)?;
        let rec = self.state.task(task)?;
        let live = rec.live_attempt()?;
        let prompt_text = sortie_core::prompt::render(&self.state, task);
        let cwd = match (&spec.isolation, &rec.worktree) {
            (Isolation::Worktree, Some(plan)) => worktree::agent_cwd(plan, &spec.cwd),
            _ => PathBuf::from(&spec.cwd),
        };
        let vars = process::Vars {
            prompt: prompt_text,
            model: live.model.clone(),
            cwd: cwd.display().to_string(),
            attempt: live.attempt.0,
            label: spec.label.clone(),
        };
        let profile_name = if spec.command.is_some() {
            "command"
        } else {
            spec.agent.as_str()
        };
        let profile = batch
            .agents
            .get(profile_name)
            .or_else(|| batch.agents.get(&spec.agent))?;
        let mut vars = vars;
        if spec.command.is_none() && profile.protocol == sortie_core::Protocol::PiJson {
            vars.prompt = crate::protocol::pi::guard_prompt(&vars.prompt).into_owned();
        }
        let protocol = if spec.command.is_some() {
            sortie_core::Protocol::Plain
        } else {
            profile.protocol
        };
        let pi = matches!(
            protocol,
            sortie_core::Protocol::PiJson | sortie_core::Protocol::PiRpc
        );
        let (session_dir, session_args, continues) = if pi && profile.can_continue {
            let (dir, args, continues) = self.session_plan(task, rec, live.attempt);
            (Some(dir), args, continues)
        } else {
            (None, Vec::new(), None)
        };
        let drive = (protocol == sortie_core::Protocol::PiRpc)
            .then(|| attempt::Drive::pi_rpc(&vars.prompt, profile.can_steer));
        let argv = process::render_argv(profile, spec.command.as_deref(), &vars)
            .map(|argv| process::expand_element(argv, process::SESSION_ARGS, &session_args));
        let prior = sortie_core::Usage::sum(
            rec.attempts[..rec.attempts.len().saturating_sub(1)]
                .iter()
                .map(|a| &a.usage),
        );
        let deadline_at = match (spec.deadline, rec.ready_at) {
            (Some(d), Some(ready)) => Some(ready.plus(d)),
            _ => None,
        };
        let env = self.env.get(task.index()).cloned().unwrap_or_default();
        // An agent that keeps state in a config directory gets its own per attempt, seeded
        // from the user's (see `agent_home`); a task's own `command` is plain and gets none.
        let home = agent_home::Kind::for_protocol(profile.protocol)
            .filter(|_| spec.command.is_none())
            .map(|kind| attempt::HomePlan {
                kind,
                dir: self.run_dir.agent_home(task.0, live.attempt.0),
                user: agent_home::UserEnv::inherited(&env),
            });
        Some((
            AttemptCtx {
                task,
                attempt: live.attempt,
                argv,
                cwd,
                env,
                home,
                marker: (
                    MARKER.to_owned(),
                    format!(
                        "{}/{}/{}/{:x}",
                        self.run_id,
                        task.0,
                        live.attempt.0,
                        self.incarnation()
                    ),
                ),
                stderr_log: self.run_dir.stderr_log(task.0, live.attempt.0),
                protocol,
                grace_turns: spec.grace_turns,
                drive,
                session_dir,
                attempt_timeout: spec.attempt_timeout,
                deadline_at,
                stall_after: spec.stall_after,
                stall_kill_after: spec.stall_kill_after,
                kill_grace: spec.kill_grace,
                max_turns: spec.max_turns,
                max_tokens: spec.max_tokens,
                max_cost_nanos: spec.max_cost_nanos,
                prior,
            },
            continues,
        ))
    }
}

/// The most recently modified session file (`*.jsonl`) in a session directory, if any.
fn latest_session(dir: &Path) -> Option<String> {
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .filter_map(|e| {
            let modified = e.metadata().and_then(|m| m.modified()).ok()?;
            Some((modified, e.path()))
        })
        .max()
        .map(|(_, p)| p.display().to_string())
}

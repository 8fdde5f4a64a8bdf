//! Sessions (`session = "NAME"`, issue 13): the tasks naming one session are one agent
//! conversation. They run one after another in batch order (each implicitly depends on the task
//! of its session listed before it, as if it needed it: a predecessor that does not complete
//! skips it), and each continues the conversation the one before left, through the agent CLI's
//! own resume of its session (the runner's `agent/` says how per agent).
//!
//! What must hold before anything runs ([`session_errors`]): a session task has a prompt (a
//! command has no conversation), its agent can continue a conversation (`can_continue` and a
//! command template that places `{session_args}`), and every task of the session runs the same
//! agent (one CLI cannot resume another's session). Cycles through the implicit order and
//! explicit `needs` are found with the other dependency cycles (`spec::validate_batch`).

use std::collections::HashMap;

use crate::ids::TaskId;
use crate::outcome::StopReason;
use crate::spec::{Batch, Protocol, SpecError};
use crate::state::{AttemptRecord, RunState};

/// The argv element of an agent profile's template where the agent's session arguments go (the
/// session it keeps, and the one it continues); a profile whose template lacks it cannot
/// continue a conversation.
pub const SESSION_ARGS: &str = "{session_args}";

/// For each task, the task of its session listed just before it (its implicit dependency), if
/// any; empty when no task has a session (a big batch of independent tasks holds no `None`
/// per task).
pub fn session_links(batch: &Batch) -> Vec<Option<usize>> {
    if batch.tasks.iter().all(|t| t.session.is_none()) {
        return Vec::new();
    }
    let mut last: HashMap<&str, usize> = HashMap::new();
    batch
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let name = t.session.as_deref()?;
            last.insert(name, i)
        })
        .collect()
}

/// The earlier attempts whose conversation a launching attempt of `task` continues, newest
/// first, and the conversation's root task (whose id keys the agent's session store; see the
/// runner's `agent/`):
/// - when the task's previous attempt was interrupted (a crash, a Ctrl-C: stop reason
///   `interrupted`, or orphaned) or cut short by a rate limit, its own earlier attempts: the
///   retry goes on with that conversation instead of starting over;
/// - for a task of a `session`, its own earlier attempts, then those of the task of its
///   session listed before it, and so on back to the session's first task;
/// - otherwise none: a retry after the agent's run ended starts over.
///
/// `links` is [`session_links`] of the run's batch. The agent picks the newest attempt that
/// left a session it can resume (its `session`, or for pi a session file).
pub fn conversation<'a>(
    state: &'a RunState,
    links: &[Option<usize>],
    task: TaskId,
) -> (TaskId, Vec<(TaskId, &'a AttemptRecord)>) {
    let mut root = task;
    let mut out = Vec::new();
    let Some(rec) = state.task(task) else {
        return (root, out);
    };
    let earlier = &rec.attempts[..rec.attempts.len().saturating_sub(1)];
    // Interrupted, or cut short by the provider's rate limit (issue 14): the conversation goes
    // on where it stopped.
    let interrupted = earlier.last().is_some_and(|a| {
        a.outcome()
            .is_some_and(|o| o.stop_reason == StopReason::Interrupted || o.rate_limited)
    }) || crate::verify::answering(rec).is_some();
    // #33: a feedback round (and its retries) goes on in the checked attempt's conversation.
    let in_session = state.spec(task).is_some_and(|s| s.session.is_some());
    if !interrupted && !in_session {
        return (root, out);
    }
    out.extend(earlier.iter().rev().map(|a| (task, a)));
    if !in_session {
        return (root, out);
    }
    let mut cur = links.get(task.index()).copied().flatten();
    // At most one step per task: a malformed `links` cannot loop.
    for _ in 0..links.len() {
        let Some(prev) = cur else { break };
        let prev_id = TaskId(u32::try_from(prev).unwrap_or(u32::MAX));
        root = prev_id;
        if let Some(r) = state.task(prev_id) {
            out.extend(r.attempts.iter().rev().map(|a| (prev_id, a)));
        }
        cur = links.get(prev).copied().flatten();
    }
    (root, out)
}

/// The session problems of the batch, given its [`session_links`].
pub(crate) fn session_errors(batch: &Batch, links: &[Option<usize>]) -> Vec<SpecError> {
    let mut errors = Vec::new();
    let mut err = |task: usize, reads: &'static [&'static str], message: String| {
        errors.push(SpecError {
            task: Some(task),
            field: reads[0],
            reads,
            message,
        });
    };
    for (i, t) in batch.tasks.iter().enumerate() {
        let Some(name) = &t.session else { continue };
        if name.trim().is_empty() {
            err(i, &["session"], "a session name must not be empty".into());
            continue;
        }
        if t.command.is_some() {
            err(
                i,
                &["session", "command"],
                "a command has no agent conversation to continue; a session is for tasks \
                 with a `prompt`"
                    .into(),
            );
            continue;
        }
        if let Some(p) = batch.agents.get(&t.agent)
            && (p.protocol == Protocol::Plain
                || !p.can_continue
                || !p.command.iter().any(|a| a == SESSION_ARGS))
        {
            err(
                i,
                &["session", "agent"],
                format!(
                    "agent {:?} cannot continue a conversation (it needs `can_continue = true`, \
                     an agent protocol and {SESSION_ARGS} in its command)",
                    t.agent
                ),
            );
        }
        if let Some(prev) = links.get(i).copied().flatten()
            && let Some(p) = batch.tasks.get(prev)
            && p.agent != t.agent
        {
            err(
                i,
                &["session", "agent"],
                format!(
                    "session {name:?} is a conversation with agent {:?} (task {:?}); this task \
                     runs {:?}: an agent cannot continue another agent's session",
                    p.agent, p.label, t.agent
                ),
            );
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{AgentProfile, RunConfig, TaskSpec, validate_batch};

    fn task(label: &str, session: Option<&str>, agent: &str) -> TaskSpec {
        let mut t = TaskSpec::new(label, "/tmp");
        t.prompt = Some("go".into());
        t.agent = agent.into();
        t.session = session.map(Into::into);
        t
    }

    fn batch(tasks: Vec<TaskSpec>) -> Batch {
        Batch {
            tasks,
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "b.toml".into(),
        }
    }

    #[test]
    fn each_session_task_follows_the_one_listed_before_it() {
        let b = batch(vec![
            task("a", Some("s"), "claude"),
            task("x", None, "claude"),
            task("b", Some("t"), "codex"),
            task("c", Some("s"), "claude"),
            task("d", Some("s"), "claude"),
        ]);
        assert_eq!(session_links(&b), vec![None, None, None, Some(0), Some(3)]);
        assert_eq!(validate_batch(&b), Ok(()));
    }

    #[test]
    fn a_batch_without_sessions_has_no_links_at_all() {
        let b = batch(vec![task("a", None, "claude"), task("b", None, "codex")]);
        assert!(session_links(&b).is_empty());
        assert_eq!(validate_batch(&b), Ok(()));
    }

    #[test]
    fn a_session_needs_one_agent_that_can_continue_and_a_prompt() {
        let mut cmd = task("cmd", Some("s2"), "command");
        cmd.prompt = None;
        cmd.command = Some(vec!["true".into()]);
        let b = batch(vec![
            task("a", Some("s"), "claude"),
            task("b", Some("s"), "codex"),
            cmd,
        ]);
        let errors = validate_batch(&b).unwrap_err();
        let found: Vec<(Option<usize>, &str)> = errors.iter().map(|e| (e.task, e.field)).collect();
        assert_eq!(
            found,
            [(Some(1), "session"), (Some(2), "session")],
            "{errors:?}"
        );
        assert!(
            errors[0].message.contains("another agent's session"),
            "{errors:?}"
        );
        assert!(errors[1].message.contains("command"), "{errors:?}");

        let mut b = batch(vec![task("a", Some("s"), "own")]);
        let mut own = b.agents["claude"].clone();
        own.name = "own".into();
        own.command.retain(|a| a != SESSION_ARGS);
        b.agents.insert("own".into(), own);
        let errors = validate_batch(&b).unwrap_err();
        assert!(errors[0].message.contains(SESSION_ARGS), "{errors:?}");
    }

    #[test]
    fn a_cycle_through_a_session_and_needs_is_refused() {
        // b follows a in session s; a needs b: neither can start.
        let mut a = task("a", Some("s"), "claude");
        a.needs = vec!["b".into()];
        let b = batch(vec![a, task("b", Some("s"), "claude")]);
        let errors = validate_batch(&b).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(
            errors[0].to_string(),
            "task 1 field `needs`: dependency cycle: a → b → a (the tasks of a session run \
             in batch order)"
        );
    }
}

//! The agents sortie knows beyond their profiles' argv templates: one file per agent, holding
//! its launch plan (the prompt made safe, its session and how a retry continues it, how it is
//! driven over stdin and steered), its per-attempt home, and nothing else. The scheduler knows
//! no agent by name: it calls [`launch_plan`], and the attempt prepares the [`HomePlan`] and
//! follows the [`Drive`].
//!
//! An agent is keyed on its profile's protocol ([`for_protocol`]): the profile is journaled in a
//! versioned format, so the rules live here, not in profile fields. A task with its own
//! `command` speaks `plain` and is no agent at all. Adding an agent: its file (an [`Agent`]
//! implementation) and one line in [`AGENTS`], plus its reader in `protocol`.

use std::fmt;
use std::path::{Path, PathBuf};

use sortie_core::spec::AGENT_ARGS;
use sortie_core::{AgentProfile, AttemptRecord, Protocol, TaskId, TaskRecord, TaskSpec, Usage};

use crate::layout::RunDir;
use crate::process::{self, RenderError, Vars};

mod claude;
mod codex;
pub(crate) mod home;
mod pi;

pub(crate) use home::{HomeError, UserEnv};

/// Every agent sortie knows, in the order they are asked whether they speak a protocol.
static AGENTS: &[&dyn Agent] = &[&pi::Pi, &claude::Claude, &codex::Codex];

/// What sortie knows about one agent. Every method but [`Agent::name`] and [`Agent::speaks`]
/// has a default: an agent that keeps no state and is launched as its template says needs
/// nothing more.
pub(crate) trait Agent: fmt::Debug + Sync {
    /// A short name (`pi`, `claude`, `codex`), for people.
    fn name(&self) -> &'static str;

    /// Whether a profile speaking `protocol` runs this agent.
    fn speaks(&self, protocol: Protocol) -> bool;

    /// How its per-attempt home is seeded (see [`home`]); `None`: it gets no home.
    fn home(&self) -> Option<&'static home::Rules> {
        None
    }

    /// The agent's own step in preparing its home, after the allow-lists were applied: its
    /// config rewritten with its own retries off, say. `user` is the user's config directory,
    /// when there is one (it may not exist).
    fn seed_home(&self, user: Option<&Path>, dir: &Path, env: &UserEnv) -> Result<(), HomeError> {
        let _ = (user, dir, env);
        Ok(())
    }

    /// The agent's part of a launch: it may change the prompt, give session arguments (for
    /// [`process::SESSION_ARGS`]) and a session to continue, and drive the agent over stdin.
    fn launch(&self, input: &LaunchInput<'_>, launch: &mut Launch) {
        let _ = (input, launch);
    }

    /// Where its credentials are, for `sortie check`; `None`: not checked.
    fn credentials(&self) -> Option<&'static Credentials> {
        None
    }

    // #34: the kernel sandbox.
    /// The base URLs a sandboxed attempt of this agent talks to (its provider: a base URL in
    /// `env`, the child's environment, or in its prepared home `home`, else its provider's
    /// public API, for `model`); core reaches each as `host:port`. Empty: none.
    fn providers(
        &self,
        home: &Path,
        env: &dyn Fn(&str) -> Option<String>,
        model: Option<&str>,
    ) -> Vec<String> {
        let _ = (home, env, model);
        Vec::new()
    }

    /// Directories a sandboxed attempt of this agent writes outside its home, created (mode
    /// 0700) before the attempt starts when missing. Empty: none.
    fn sandbox_write(&self) -> Vec<PathBuf> {
        Vec::new()
    }

    // Issue 13: structured results.
    /// For a task with an `output_schema`: keeps the agent's session (drops from the rendered
    /// `argv` the flags that turn it off; the session lives in the attempt's own home or
    /// session directory) and says how the repair round continues the attempt's conversation.
    /// `None`: no repair round (a mismatch ends the attempt partial at once).
    fn structured(
        &self,
        input: &LaunchInput<'_>,
        launch: &mut Launch,
        argv: &mut Vec<String>,
    ) -> Option<Repair> {
        let _ = (input, launch, argv);
        None
    }
}

/// How the repair round of a structured result reaches the agent (issue 13): it is told the
/// validation error in the same conversation, once.
#[derive(Debug, Clone)]
pub(crate) enum Repair {
    /// The agent is still running, driven over stdin: this command line carries the request
    /// (pi's RPC `prompt`), sent instead of closing its stdin.
    Steer(fn(&str) -> String),
    /// The agent is run again, continuing the attempt's session: this argv, with the request
    /// on stdin; with `session_in`, the newest session file of that directory is appended as
    /// `--session FILE` (pi).
    Continue {
        /// The argv of the repair run.
        argv: Vec<String>,
        /// pi: the attempt's session directory.
        session_in: Option<PathBuf>,
        /// The agent reports its session's running total, the first run's usage included
        /// (Claude Code, Codex): the attempt's usage is the larger of the two, not their sum.
        cumulative: bool,
    },
}

/// Drops every `flag` (a switch without a value) from `argv`; whether one was there.
pub(crate) fn drop_switch(argv: &mut Vec<String>, flag: &str) -> bool {
    let before = argv.len();
    argv.retain(|a| a != flag);
    argv.len() != before
}

/// Where an agent finds its credentials: any one of these files in its config directory, or
/// any one of these variables set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Credentials {
    /// Files in the agent's config directory (a credential file, or a provider config).
    pub(crate) files: &'static [&'static str],
    /// Variables holding a key.
    pub(crate) env: &'static [&'static str],
}

/// The agent that a profile speaking `protocol` runs, if any (`plain` is none).
pub(crate) fn for_protocol(protocol: Protocol) -> Option<&'static dyn Agent> {
    all().find(|a| a.speaks(protocol))
}

/// Every agent sortie knows.
pub(crate) fn all() -> impl Iterator<Item = &'static dyn Agent> {
    AGENTS.iter().copied()
}

/// What sortie tells an agent whose budget ran out, when it can be steered.
pub(crate) const WRAP_UP: &str = "You have reached your budget for this task. Stop starting new \
work: give your final answer now, summarizing what you did and what is left.";

/// How an agent driven over stdin is driven (pi's RPC mode).
#[derive(Debug, Clone)]
pub(crate) struct Drive {
    /// The first command line: the prompt.
    pub(crate) prompt_command: String,
    /// The command line that asks the agent to wrap up, when it can be steered.
    pub(crate) wrap_up_command: Option<String>,
    /// The command line that passes a user's message on (`sortie steer`), when it can be
    /// steered.
    pub(crate) steer_command: Option<fn(&str) -> String>,
}

/// Which agent home an attempt gets (see [`home`]), prepared right before the spawn.
#[derive(Debug, Clone)]
pub(crate) struct HomePlan {
    /// The agent whose home it is.
    pub(crate) agent: &'static dyn Agent,
    /// `<run-dir>/agents/<task>.<attempt>`.
    pub(crate) dir: PathBuf,
    /// Where the user's own config is looked for.
    pub(crate) user: UserEnv,
    /// #13: a name in the home linked to the conversation's session store (see
    /// [`Launch::session_store`]).
    pub(crate) session_store: Option<(&'static str, PathBuf)>,
}

/// What the engine knows when it launches an attempt.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaunchInput<'a> {
    /// The task's profile (the `command` profile for a task with its own command).
    pub(crate) profile: &'a AgentProfile,
    /// The task.
    pub(crate) spec: &'a TaskSpec,
    /// The task's record; its last attempt is the one being launched.
    #[allow(
        dead_code,
        reason = "what an agent's launch may read; the continued conversation is `conversation`"
    )]
    pub(crate) rec: &'a TaskRecord,
    /// The task's id.
    pub(crate) task: TaskId,
    /// The attempt being launched.
    pub(crate) live: &'a AttemptRecord,
    /// The run's directory.
    pub(crate) run_dir: &'a RunDir,
    /// The attempt's working directory.
    pub(crate) cwd: &'a Path,
    /// The task's extra environment (the values).
    pub(crate) env: &'a [(String, String)],
    // #13: sessions.
    /// The earlier attempts whose conversation this attempt continues, newest first (core's
    /// `session::conversation`: the retry of an interrupted attempt, or a `session`'s task).
    pub(crate) conversation: &'a [(TaskId, &'a AttemptRecord)],
    /// The conversation's first task: its id keys the session store the agent homes of the
    /// conversation's attempts share (`RunDir::conversation`).
    pub(crate) conversation_root: TaskId,
}

/// The parts of a launch an agent may shape (see [`Agent::launch`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Launch {
    /// The prompt as the agent gets it.
    pub(crate) prompt: String,
    /// What [`process::SESSION_ARGS`] expands to (nothing by default).
    pub(crate) session_args: Vec<String>,
    /// The agent's session directory, created before the spawn.
    pub(crate) session_dir: Option<PathBuf>,
    /// The session of an earlier attempt this one continues.
    pub(crate) continues: Option<String>,
    /// Set for an agent driven over stdin.
    pub(crate) drive: Option<Drive>,
    /// Whether the prompt goes to the agent's stdin (the template does not place `{prompt}`
    /// and the agent is not driven over stdin): set by [`launch_plan`] before the agent's
    /// [`Agent::launch`], which then leaves the prompt as it is (no argv guard needed).
    pub(crate) prompt_on_stdin: bool,
    /// The agent's flags for the task's permissions and tools: what
    /// [`sortie_core::spec::AGENT_ARGS`] expands to (a template without it gets none; the
    /// batch is refused when it asks for permissions such a profile cannot get).
    pub(crate) agent_args: Vec<String>,
    // #13: sessions.
    /// The usage the continued session was journaled with, for an agent that reports a
    /// resumed session's usage cumulatively: taken off every reading (`protocol::rebased`).
    pub(crate) usage_base: Option<Usage>,
    /// Where the agent keeps its sessions in its home (a name in it), and the conversation's
    /// store that name is linked to, so that the next attempt of the conversation finds them.
    pub(crate) session_store: Option<(&'static str, PathBuf)>,
}

/// How an attempt is launched: what [`launch_plan`] returns.
#[derive(Debug, Clone)]
pub(crate) struct LaunchPlan {
    /// The rendered argv, or why it could not be rendered (the attempt then fails `invalid`).
    pub(crate) argv: Result<Vec<String>, RenderError>,
    /// The protocol its stdout is read in (`plain` for a task's own command).
    pub(crate) protocol: Protocol,
    /// Set for an agent driven over stdin.
    pub(crate) drive: Option<Drive>,
    /// The agent's session directory, created before the spawn (continuable profiles).
    pub(crate) session_dir: Option<PathBuf>,
    /// The session of an interrupted attempt that this one continues: the engine journals
    /// `AttemptContinues` with it before the spawn.
    pub(crate) continues: Option<String>,
    /// The attempt's own agent config directory, prepared right before the spawn.
    pub(crate) home: Option<HomePlan>,
    /// The prompt the child reads on stdin, and the file it is written to right before the
    /// spawn (`<run-dir>/prompts/<task>.<attempt>`): no argv limit applies to it.
    pub(crate) stdin_prompt: Option<(PathBuf, String)>,
    /// #13: the usage taken off the reader's readings (see [`Launch::usage_base`]).
    pub(crate) usage_base: Option<Usage>,
    /// #37: the price the attempt's usage is charged at, for an agent that reports no cost
    /// (`protocol::priced`; set by the engine from the run's stored prices).
    pub(crate) price: Option<sortie_core::prices::ModelPrice>,
    // Issue 13: structured results.
    /// How a structured result's repair round reaches the agent (see [`Agent::structured`]).
    pub(crate) repair: Option<Repair>,
}

/// Whether an argv template places the prompt (any element mentions `{prompt}`).
pub(crate) fn places_prompt(template: &[String]) -> bool {
    template.iter().any(|e| e.contains("{prompt}"))
}

/// Plans the launch of `input.live` with its rendered `prompt`: the agent its profile speaks
/// (none for a task's own `command`) shapes the prompt, the session and the drive; the argv is
/// the profile's template (or the task's command) rendered with them; an agent that keeps state
/// in a config directory gets its own per attempt, seeded from the user's.
pub(crate) fn launch_plan(input: &LaunchInput<'_>, prompt: String) -> LaunchPlan {
    let own_command = input.spec.command.is_some();
    let protocol = if own_command {
        Protocol::Plain
    } else {
        input.profile.protocol
    };
    let agent = for_protocol(protocol);
    let template = input
        .spec
        .command
        .as_deref()
        .unwrap_or(&input.profile.command);
    let mut launch = Launch {
        prompt,
        prompt_on_stdin: input.spec.prompt.is_some() && !places_prompt(template),
        ..Launch::default()
    };
    if let Some(agent) = agent {
        agent.launch(input, &mut launch);
    }
    let prompt_on_stdin = launch.prompt_on_stdin && launch.drive.is_none();
    let stdin_prompt = prompt_on_stdin.then(|| {
        let file = input
            .run_dir
            .prompt_file(input.task.0, input.live.attempt.0);
        (file, std::mem::take(&mut launch.prompt))
    });
    let vars = Vars {
        prompt: std::mem::take(&mut launch.prompt),
        model: input.live.model().map(str::to_owned),
        cwd: input.cwd.display().to_string(),
        attempt: input.live.attempt.0,
        label: input.spec.label.clone(),
    };
    let mut argv = process::render_argv(input.profile, input.spec.command.as_deref(), &vars)
        .map(|argv| process::expand_element(argv, process::SESSION_ARGS, &launch.session_args))
        .map(|argv| process::expand_element(argv, AGENT_ARGS, &launch.agent_args));
    // Issue 13: a task with an output_schema keeps its agent's session for the repair round.
    let repair = match (agent, &mut argv) {
        (Some(agent), Ok(argv)) if input.spec.output_schema.is_some() => {
            launch.prompt_on_stdin = prompt_on_stdin;
            agent.structured(input, &mut launch, argv)
        }
        _ => None,
    };
    let home = agent.filter(|a| a.home().is_some()).map(|agent| HomePlan {
        agent,
        dir: input.run_dir.agent_home(input.task.0, input.live.attempt.0),
        user: UserEnv::inherited(input.env),
        session_store: launch.session_store.take(),
    });
    LaunchPlan {
        argv,
        protocol,
        drive: launch.drive,
        session_dir: launch.session_dir,
        continues: launch.continues,
        home,
        stdin_prompt,
        usage_base: launch.usage_base,
        price: None,
        repair,
    }
}

/// The newest attempt of the conversation that named its agent's session (`AttemptSession`),
/// and the usage journaled by the attempts that ran in that session (what an agent reporting
/// a resumed session's usage cumulatively counts again). For Claude Code and Codex.
pub(crate) fn resumable(input: &LaunchInput<'_>) -> Option<(String, Usage)> {
    let id = input
        .conversation
        .iter()
        .find_map(|(_, a)| a.session().map(str::to_owned))?;
    let base = Usage::sum(
        input
            .conversation
            .iter()
            .filter(|(_, a)| a.session() == Some(id.as_str()))
            .map(|(_, a)| a.usage()),
    );
    Some((id, base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_follow_the_protocol() {
        let name = |p| for_protocol(p).map(|a| a.name());
        assert_eq!(name(Protocol::PiJson), Some("pi"));
        assert_eq!(name(Protocol::PiRpc), Some("pi"));
        assert_eq!(name(Protocol::ClaudeStreamJson), Some("claude"));
        assert_eq!(name(Protocol::CodexJson), Some("codex"));
        assert_eq!(name(Protocol::Plain), None);
    }
}

#[cfg(test)]
mod plan_tests {
    use sortie_core::state::AttemptEnd;
    use sortie_core::{Attempt, AttemptOutcome, OutcomeRecord, StopReason, Timestamp};

    use super::*;
    use sortie_batch::{Overrides, one_off_command, one_off_prompt};

    fn attempt(n: u32, end: Option<AttemptEnd>) -> AttemptRecord {
        let mut a = AttemptRecord::new(Attempt(n), None, Timestamp(0));
        a.end = end;
        a
    }

    fn record(attempts: Vec<AttemptRecord>) -> TaskRecord {
        let mut rec = TaskRecord::new();
        rec.attempts = attempts;
        rec
    }

    /// The plan of the last attempt of `rec` for a one-off task, in run `t` of the state dir
    /// at `root` (its run dir is `<root>/runs/t`).
    fn plan(batch: &sortie_batch::LoadedBatch, rec: &TaskRecord, root: &Path) -> LaunchPlan {
        let run_dir =
            crate::layout::StateDir::new(root).run(&sortie_core::RunId::new("t").unwrap());
        let run_dir = &run_dir;
        let spec = &batch.batch.tasks[0];
        let name = if spec.command.is_some() {
            "command"
        } else {
            &spec.agent
        };
        // The conversation core gives a retry of an interrupted attempt: its earlier attempts.
        let earlier = &rec.attempts[..rec.attempts.len() - 1];
        let interrupted = earlier.last().is_some_and(|a| {
            a.outcome()
                .is_some_and(|o| o.stop_reason == StopReason::Interrupted)
        });
        let conversation: Vec<(TaskId, &AttemptRecord)> = if interrupted {
            earlier.iter().rev().map(|a| (TaskId(0), a)).collect()
        } else {
            Vec::new()
        };
        let input = LaunchInput {
            profile: &batch.batch.agents[name],
            spec,
            rec,
            task: TaskId(0),
            live: rec.attempts.last().unwrap(),
            run_dir,
            cwd: Path::new("/w"),
            env: &[],
            conversation: &conversation,
            conversation_root: TaskId(0),
        };
        launch_plan(&input, "-p, a prompt".into())
    }

    fn one_off(agent: &str) -> sortie_batch::LoadedBatch {
        let o = Overrides::default();
        one_off_prompt("unused", Some(agent), None, Path::new("/"), &o).unwrap()
    }

    #[test]
    fn pi_json_gets_its_prompt_on_stdin_a_home_and_a_session_dir() {
        let rec = record(vec![attempt(1, None)]);
        let p = plan(&one_off("pi"), &rec, Path::new("/run"));
        let argv = p.argv.unwrap();
        assert!(!argv.iter().any(|a| a.contains("a prompt")), "{argv:?}");
        let (file, prompt) = p.stdin_prompt.unwrap();
        assert_eq!(file, PathBuf::from("/run/runs/t/prompts/0.1"));
        assert_eq!(prompt, "-p, a prompt", "unguarded: stdin is no argument");
        assert_eq!(p.protocol, Protocol::PiJson);
        assert!(p.drive.is_none() && p.continues.is_none());
        let dir = PathBuf::from("/run/runs/t/sessions/0.1");
        assert_eq!(p.session_dir.as_deref(), Some(dir.as_path()));
        assert!(
            argv.windows(2)
                .any(|w| w == ["--session-dir", "/run/runs/t/sessions/0.1"])
        );
        let home = p.home.unwrap();
        assert_eq!(
            (home.agent.name(), home.dir),
            ("pi", PathBuf::from("/run/runs/t/agents/0.1"))
        );
    }

    /// The argv of a one-off task of `agent` with `permissions` and `tools`.
    fn argv_with(agent: &str, permissions: sortie_core::Permissions, tools: &[&str]) -> String {
        let mut batch = one_off(agent);
        batch.batch.tasks[0].permissions = permissions;
        batch.batch.tasks[0].tools = tools.iter().map(|t| (*t).to_owned()).collect();
        let rec = record(vec![attempt(1, None)]);
        let argv = plan(&batch, &rec, Path::new("/run")).argv.unwrap();
        assert!(!argv.iter().any(|a| a.contains('{')), "{argv:?}");
        format!("{} ", argv.join(" "))
    }

    #[test]
    fn permissions_and_tools_become_each_agents_own_flags() {
        use sortie_core::Permissions::{Edit, Full, ReadOnly};
        let claude = argv_with("claude", ReadOnly, &[]);
        assert!(
            claude.contains("--permission-mode dontAsk --allowedTools Read,Glob,Grep"),
            "{claude}"
        );
        let claude = argv_with("claude", Edit, &["Bash", "Read"]);
        assert!(
            claude.contains("--permission-mode acceptEdits --allowedTools")
                && claude.contains("--tools Bash,Read"),
            "{claude}"
        );
        assert!(argv_with("claude", Full, &[]).contains("--permission-mode bypassPermissions"));
        for (p, mode) in [
            (ReadOnly, "read-only"),
            (Edit, "workspace-write"),
            (Full, "danger-full-access"),
        ] {
            let codex = argv_with("codex", p, &[]);
            assert!(codex.contains(&format!("--sandbox {mode} ")), "{codex}");
            assert!(codex.ends_with(" - "), "the prompt from stdin: {codex}");
        }
        assert!(argv_with("pi", ReadOnly, &[]).contains("--tools read,grep,find,ls"));
        assert!(argv_with("pi", ReadOnly, &["read", "bash"]).contains("--tools read "));
        assert!(argv_with("pi", ReadOnly, &["bash"]).contains("--no-tools"));
        assert!(!argv_with("pi", Edit, &[]).contains("--tools"));
        assert!(argv_with("pi-rpc", Full, &["bash", "read"]).contains("--tools bash,read"));
    }

    #[test]
    fn system_prompt_and_thinking_become_each_agents_own_flags() {
        let argv = |agent: &str, thinking: &str| {
            let mut batch = one_off(agent);
            batch.batch.tasks[0].system_prompt = Some("Be \"brief\".".into());
            batch.batch.tasks[0].thinking = Some(thinking.into());
            let rec = record(vec![attempt(1, None)]);
            plan(&batch, &rec, Path::new("/run")).argv.unwrap()
        };
        let has = |argv: &[String], pair: [&str; 2]| argv.windows(2).any(|w| w == pair);
        let a = argv("claude", "off");
        assert!(
            has(&a, ["--append-system-prompt", "Be \"brief\"."]),
            "{a:?}"
        );
        assert!(has(&a, ["--effort", "low"]), "{a:?}");
        let a = argv("pi", "high");
        assert!(
            has(&a, ["--append-system-prompt", "Be \"brief\"."]),
            "{a:?}"
        );
        assert!(has(&a, ["--thinking", "high"]), "{a:?}");
        let a = argv("codex", "off");
        assert!(
            has(&a, ["-c", r#"developer_instructions="Be \"brief\".""#]),
            "{a:?}"
        );
        assert!(has(&a, ["-c", r#"model_reasoning_effort="none""#]), "{a:?}");
    }

    #[test]
    fn pi_rpc_is_driven_keeps_its_session_and_continues_an_interrupted_one() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        let rec = record(vec![attempt(1, None)]);
        let p = plan(&one_off("pi-rpc"), &rec, run);
        let drive = p.drive.unwrap();
        assert!(
            drive.prompt_command.contains("\"-p, a prompt\""),
            "not guarded on stdin"
        );
        assert!(drive.wrap_up_command.is_some(), "pi-rpc can steer");
        let first = run.join("runs/t/sessions/0.1");
        assert_eq!(p.session_dir.as_deref(), Some(first.as_path()));
        let argv = p.argv.unwrap();
        let at = argv.iter().position(|a| a == "--session-dir").unwrap();
        assert_eq!(argv[at + 1], first.display().to_string());
        assert!(!argv.iter().any(|a| a == "--session" || a.contains('{')));
        assert!(p.continues.is_none());

        // The retry of an interrupted attempt continues its latest session file.
        std::fs::create_dir_all(&first).unwrap();
        let file = first.join("s.jsonl");
        std::fs::write(&file, "{}").unwrap();
        let interrupted = AttemptEnd::Finished {
            outcome: OutcomeRecord::new(
                &AttemptOutcome::failed(StopReason::Interrupted, "interrupted"),
                "",
            ),
            at: Timestamp(1),
        };
        let rec = record(vec![attempt(1, Some(interrupted)), attempt(2, None)]);
        let p = plan(&one_off("pi-rpc"), &rec, run);
        let file = file.display().to_string();
        assert_eq!(p.continues.as_deref(), Some(file.as_str()));
        let argv = p.argv.unwrap();
        let at = argv.iter().position(|a| a == "--session").unwrap();
        assert_eq!(argv[at + 1], file);
        assert_eq!(p.session_dir, Some(run.join("runs/t/sessions/0.2")));
    }

    #[test]
    fn claude_and_codex_resume_the_session_an_interrupted_attempt_named() {
        let interrupted = AttemptEnd::Finished {
            outcome: OutcomeRecord::new(
                &AttemptOutcome::failed(StopReason::Interrupted, "interrupted"),
                "",
            ),
            at: Timestamp(1),
        };
        let mut first = attempt(1, Some(interrupted));
        first.set_session(Some("sess-1".into()));
        first.set_usage(sortie_core::Usage {
            input: 100,
            output: 12,
            ..sortie_core::Usage::ZERO
        });
        let rec = record(vec![first, attempt(2, None)]);
        let has = |argv: &[String], pair: [&str; 2]| argv.windows(2).any(|w| w == pair);

        let p = plan(&one_off("claude"), &rec, Path::new("/run"));
        let argv = p.argv.unwrap();
        assert!(has(&argv, ["--resume", "sess-1"]), "{argv:?}");
        assert_eq!(p.continues.as_deref(), Some("sess-1"));
        let base = p.usage_base.unwrap();
        assert_eq!((base.input, base.output), (100, 12));

        let p = plan(&one_off("codex"), &rec, Path::new("/run"));
        let argv = p.argv.unwrap();
        assert_eq!(
            &argv[..4],
            ["codex", "exec", "resume", "sess-1"],
            "{argv:?}"
        );
        assert!(
            has(&argv, ["-c", r#"sandbox_mode="workspace-write""#]),
            "{argv:?}"
        );
        assert!(
            !argv.iter().any(|a| a == "--sandbox"),
            "resume takes no --sandbox: {argv:?}"
        );
        assert_eq!(argv.last().map(String::as_str), Some("-"));
        assert_eq!(p.usage_base.map(|b| b.input), Some(100));
        assert_eq!(
            p.home.unwrap().session_store,
            Some(("sessions", PathBuf::from("/run/runs/t/conversations/0")))
        );

        // An attempt that ended otherwise is not continued: the retry starts over.
        let mut failed = attempt(
            1,
            Some(AttemptEnd::Finished {
                outcome: OutcomeRecord::new(&AttemptOutcome::failed(StopReason::Error, "500"), ""),
                at: Timestamp(1),
            }),
        );
        failed.set_session(Some("sess-1".into()));
        let rec = record(vec![failed, attempt(2, None)]);
        let p = plan(&one_off("claude"), &rec, Path::new("/run"));
        assert!(!p.argv.unwrap().iter().any(|a| a == "--resume"));
        assert!(p.continues.is_none() && p.usage_base.is_none());
    }

    #[test]
    fn claude_gets_its_home_and_a_task_command_is_no_agent() {
        let rec = record(vec![attempt(1, None)]);
        let p = plan(&one_off("claude"), &rec, Path::new("/run"));
        assert!(!p.argv.unwrap().iter().any(|a| a.contains("a prompt")));
        assert_eq!(
            p.stdin_prompt.map(|(_, p)| p).as_deref(),
            Some("-p, a prompt")
        );
        let home = p.home.unwrap();
        assert_eq!(home.agent.name(), "claude");
        assert_eq!(
            home.session_store,
            Some(("projects", PathBuf::from("/run/runs/t/conversations/0")))
        );
        assert!(p.drive.is_none() && p.session_dir.is_none() && p.continues.is_none());
        let p = plan(&one_off("codex"), &rec, Path::new("/run"));
        assert_eq!(p.argv.unwrap().last().map(String::as_str), Some("-"));
        assert!(p.stdin_prompt.is_some());

        let o = Overrides::default();
        let argv = ["sh".to_owned(), "-c".to_owned(), "true".to_owned()];
        let batch = one_off_command(&argv, Path::new("/"), &o).unwrap();
        let p = plan(&batch, &rec, Path::new("/run"));
        assert_eq!(p.protocol, Protocol::Plain);
        assert_eq!(p.argv.unwrap(), argv);
        assert!(
            p.stdin_prompt.is_none(),
            "a command without a prompt reads /dev/null"
        );
        assert!(p.home.is_none() && p.drive.is_none() && p.session_dir.is_none());
    }

    // Issue 13: structured results.
    #[test]
    fn a_task_with_a_schema_keeps_its_agents_session_and_gets_its_repair_round() {
        let plan_of = |agent: &str, permissions| {
            let mut batch = one_off(agent);
            batch.batch.tasks[0].output_schema = Some(r#"{"type":"object"}"#.into());
            batch.batch.tasks[0].permissions = permissions;
            let rec = record(vec![attempt(1, None)]);
            plan(&batch, &rec, Path::new("/run"))
        };
        use sortie_core::Permissions::{Edit, ReadOnly};
        let p = plan_of("claude", Edit);
        let argv = p.argv.unwrap();
        assert!(
            !argv.iter().any(|a| a == "--no-session-persistence"),
            "{argv:?}"
        );
        let Some(Repair::Continue {
            argv: repair,
            session_in: None,
            cumulative: true,
        }) = p.repair
        else {
            panic!("{:?}", p.repair)
        };
        assert_eq!(repair[..argv.len()], argv[..]);
        assert_eq!(repair[argv.len()..], ["--continue".to_owned()]);

        let p = plan_of("codex", ReadOnly);
        let argv = p.argv.unwrap();
        assert!(!argv.iter().any(|a| a == "--ephemeral"), "{argv:?}");
        let Some(Repair::Continue { argv: repair, .. }) = p.repair else {
            panic!("{:?}", p.repair)
        };
        let repair = repair.join(" ");
        assert!(
            repair.starts_with("codex exec resume --last --json --skip-git-repo-check -c sandbox_mode=\"read-only\" "),
            "{repair}"
        );
        assert!(
            repair.ends_with(" -") && !repair.contains("--sandbox"),
            "{repair}"
        );

        let p = plan_of("pi", Edit);
        let argv = p.argv.unwrap();
        assert!(!argv.iter().any(|a| a == "--no-session"), "{argv:?}");
        let dir = PathBuf::from("/run/runs/t/sessions/0.1");
        let at = argv.iter().position(|a| a == "--session-dir").unwrap();
        assert_eq!(argv[at + 1], dir.display().to_string());
        assert_eq!(p.session_dir.as_deref(), Some(dir.as_path()));
        assert!(
            matches!(&p.repair, Some(Repair::Continue { session_in: Some(d), .. }) if *d == dir),
            "{:?}",
            p.repair
        );

        let p = plan_of("pi-rpc", Edit);
        let Some(Repair::Steer(command)) = p.repair else {
            panic!("{:?}", p.repair)
        };
        let line: serde_json::Value = serde_json::from_str(&command("fix it")).unwrap();
        assert_eq!(
            line,
            serde_json::json!({"type": "prompt", "message": "fix it"})
        );

        // Without a schema there is no repair round; the session is kept all the same (every
        // attempt keeps it, so that a crashed one is continued).
        let rec = record(vec![attempt(1, None)]);
        let p = plan(&one_off("claude"), &rec, Path::new("/run"));
        assert!(
            !p.argv
                .unwrap()
                .iter()
                .any(|a| a == "--no-session-persistence")
        );
        assert!(p.repair.is_none());
    }
}

//! The task spec (every field of the batch file, resolved with its defaults), agent profiles,
//! run settings, and the validation that must pass before anything runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::agent_options::{AGENT_ARGS, Permissions, THINKING_LEVELS};
pub use crate::run_budget::RunBudget;

/// How a task's working directory is isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// Run in `cwd` as it is.
    #[default]
    None,
    /// Run in a git worktree of its own under the state dir.
    Worktree,
    /// #14: run in a throwaway copy of `cwd` under the run dir (for a directory that is not a
    /// git repository), made before its first attempt (reflinked where the filesystem can)
    /// and discarded once the task ended: the original is never written.
    Copy,
}

/// How a task's output is shown when it has an artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutputMode {
    /// The text is shown (cut to `max_output`) and written to the artifact.
    #[default]
    Inline,
    /// Only `Output written to PATH` is shown.
    FileOnly,
}

/// #33: when a task's needs let it run (`needs_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NeedsMode {
    /// Once every need completed; a need that ended otherwise skips the task.
    #[default]
    Completed,
    /// Once every need ended, in any terminal state (a judge over samples, some of which may
    /// fail): a need that did not complete gives its error as its output.
    Settled,
}

impl NeedsMode {
    /// The name a batch file uses.
    pub fn as_str(self) -> &'static str {
        match self {
            NeedsMode::Completed => "completed",
            NeedsMode::Settled => "settled",
        }
    }

    /// The mode named `name`, as a batch file writes it.
    pub fn parse(name: &str) -> Option<NeedsMode> {
        match name {
            "completed" => Some(NeedsMode::Completed),
            "settled" => Some(NeedsMode::Settled),
            _ => None,
        }
    }

    /// Whether a need that ended in `state` lets the task run (else the task is skipped).
    pub fn accepts(self, state: crate::outcome::TerminalState) -> bool {
        match self {
            NeedsMode::Completed => state == crate::outcome::TerminalState::Completed,
            NeedsMode::Settled => true,
        }
    }
}

/// The cap on the text shown inline; the artifact keeps everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MaxOutput {
    /// At most this many bytes.
    pub bytes: u64,
    /// At most this many lines.
    pub lines: u64,
}

impl Default for MaxOutput {
    fn default() -> Self {
        MaxOutput {
            bytes: 200 * 1024,
            lines: 5000,
        }
    }
}

/// Which output protocol an agent speaks on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Stdout is the output; exit 0 is success.
    #[default]
    Plain,
    /// `pi --mode json`.
    PiJson,
    /// `claude -p --output-format stream-json --verbose`.
    ClaudeStreamJson,
    /// `codex exec --json`.
    CodexJson,
    /// `pi --mode rpc`: the same event stream as `pi --mode json`, plus command responses;
    /// the prompt is sent as a command on stdin, which also lets sortie steer the agent (ask
    /// it to wrap up on a budget breach). Appended after the first v1 journal fixture.
    PiRpc,
}

impl Protocol {
    /// The name used in batch files.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Plain => "plain",
            Protocol::PiJson => "pi-json",
            Protocol::ClaudeStreamJson => "claude-stream-json",
            Protocol::CodexJson => "codex-json",
            Protocol::PiRpc => "pi-rpc",
        }
    }

    /// Whether an agent speaking it reports its own cost (#37): Codex reports tokens only, so
    /// sortie prices them ([`crate::prices`]). A plain command spends nothing.
    pub fn reports_cost(self) -> bool {
        self != Protocol::CodexJson
    }

    /// Parses a batch-file name.
    pub fn parse(name: &str) -> Option<Protocol> {
        [
            Protocol::Plain,
            Protocol::PiJson,
            Protocol::ClaudeStreamJson,
            Protocol::CodexJson,
            Protocol::PiRpc,
        ]
        .into_iter()
        .find(|p| p.as_str() == name)
    }
}

/// How to launch an agent: an argv template and the protocol it speaks.
///
/// Placeholders `{prompt}`, `{model}`, `{cwd}`, `{attempt}`, `{label}` (alias `{task}`) are
/// substituted inside argv elements; an element that is exactly `{model_args}` expands to
/// `model_args` when the attempt has a model, and to nothing otherwise. No shell is involved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentProfile {
    /// The profile's name.
    pub name: String,
    /// The argv template; the first element is the program.
    pub command: Vec<String>,
    /// Arguments that select a model, used when a model is set.
    pub model_args: Vec<String>,
    /// The output protocol.
    pub protocol: Protocol,
    /// Names of extra environment variables (values live outside the journal).
    pub env_keys: Vec<String>,
    /// Whether the agent can be told to wrap up while it runs.
    pub can_steer: bool,
    /// Whether an interrupted attempt's conversation can be continued.
    pub can_continue: bool,
    /// Whether the agent may edit files or run a shell.
    pub may_write: bool,
    // #10: attempts that outlive sortie.
    /// Whether its attempts run under a supervisor that outlives sortie (`supervise = false`
    /// runs them as sortie's children, which die with it; see docs/design/resume.md).
    pub supervise: bool,
}

impl AgentProfile {
    /// The built-in profiles: `pi`, `pi-rpc`, `claude`, `codex` and `command`.
    ///
    /// `pi-rpc` runs pi in RPC mode: the prompt goes to pi's stdin as a command, so that
    /// sortie can ask it to wrap up when a budget runs out (`can_steer`), and pi keeps its
    /// session under the run dir (`{session_args}`), so that a retry after a crash or an
    /// interrupt continues the conversation (`can_continue`).
    pub fn builtins() -> BTreeMap<String, AgentProfile> {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let profiles = [
            AgentProfile {
                name: "pi".into(),
                // Headless: JSON events, no start-up network traffic, none of the user's
                // extensions, skills, prompt templates or themes (context files such as
                // AGENTS.md still load). No `{prompt}`: the runner gives the prompt on stdin
                // (pi reads it to EOF), so its size has no argv limit. `{session_args}`: its
                // session is kept under the run dir, and continued by a session's next task
                // or the retry of an interrupted attempt.
                command: s(&[
                    "pi",
                    "--mode",
                    "json",
                    "{session_args}",
                    "--offline",
                    "--no-extensions",
                    "--no-skills",
                    "--no-prompt-templates",
                    "--no-themes",
                    "{agent_args}",
                    "{model_args}",
                ]),
                model_args: s(&["--model", "{model}"]),
                protocol: Protocol::PiJson,
                env_keys: vec![],
                can_steer: false,
                can_continue: true,
                may_write: true,
                supervise: true,
            },
            AgentProfile {
                name: "claude".into(),
                // The prompt on stdin (`claude -p` reads it there when no prompt argument is
                // given): no argv limit. `{session_args}`: `--resume ID` when it continues a
                // conversation (its sessions are kept in the attempt's home, under the run
                // dir).
                command: s(&[
                    "claude",
                    "-p",
                    "--output-format",
                    "stream-json",
                    "--verbose",
                    "{session_args}",
                    "{agent_args}",
                    "{model_args}",
                ]),
                model_args: s(&["--model", "{model}"]),
                protocol: Protocol::ClaudeStreamJson,
                env_keys: vec![],
                can_steer: false,
                can_continue: true,
                may_write: true,
                supervise: true,
            },
            AgentProfile {
                name: "codex".into(),
                // Headless: JSONL events; runs outside a git repository too (codex exec
                // refuses to start in a directory that is neither a git repository nor
                // trusted in its config); the prompt read from stdin (`-`), so its size has no
                // argv limit. `{session_args}`: `resume ID` when it continues a conversation
                // (its session files are kept in the attempt's home, under the run dir).
                command: s(&[
                    "codex",
                    "exec",
                    "{session_args}",
                    "--json",
                    "--skip-git-repo-check",
                    "{agent_args}",
                    "{model_args}",
                    "-",
                ]),
                model_args: s(&["--model", "{model}"]),
                protocol: Protocol::CodexJson,
                env_keys: vec![],
                can_steer: false,
                can_continue: true,
                may_write: true,
                supervise: true,
            },
            AgentProfile {
                name: "pi-rpc".into(),
                command: s(&[
                    "pi",
                    "--mode",
                    "rpc",
                    "--offline",
                    "--no-extensions",
                    "--no-skills",
                    "--no-prompt-templates",
                    "--no-themes",
                    "{agent_args}",
                    "{session_args}",
                    "{model_args}",
                ]),
                model_args: s(&["--model", "{model}"]),
                protocol: Protocol::PiRpc,
                env_keys: vec![],
                can_steer: true,
                can_continue: true,
                may_write: true,
                supervise: true,
            },
            AgentProfile {
                name: "command".into(),
                command: vec![],
                model_args: vec![],
                protocol: Protocol::Plain,
                env_keys: vec![],
                can_steer: false,
                can_continue: false,
                may_write: false,
                supervise: true,
            },
        ];
        profiles.into_iter().map(|p| (p.name.clone(), p)).collect()
    }

    /// #34: the built-in profiles whose tasks are sandboxed unless a task, `[defaults]`, a
    /// role or the profile says otherwise: every built-in agent but `codex` (whose own
    /// bubblewrap sandbox cannot start inside sortie's yet: docs/sandbox.md) and `command`.
    pub const BUILTIN_AGENTS: [&'static str; 3] = ["pi", "pi-rpc", "claude"];
}

/// One task, every field resolved (defaults applied, paths absolute): its label and prompt,
/// and the rest of its fields in a [`SpecBody`] that tasks alike share.
///
/// A batch of 100,000 generated tasks usually holds a handful of distinct bodies (a body is
/// ~700 bytes and a few strings): [`Batch::share_bodies`] makes equal bodies one `Arc`, so a
/// task costs its label, its prompt and a pointer. The body's fields read through `Deref`
/// (`spec.cwd`); writing one (`DerefMut`) gives the task a body of its own first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    /// Unique name within the batch.
    pub label: String,
    /// What the agent is asked (placeholders not yet substituted).
    pub prompt: Option<String>,
    /// Every other field, shared with the tasks alike.
    pub body: Arc<SpecBody>,
}

impl std::ops::Deref for TaskSpec {
    type Target = SpecBody;
    fn deref(&self) -> &SpecBody {
        &self.body
    }
}

impl std::ops::DerefMut for TaskSpec {
    fn deref_mut(&mut self) -> &mut SpecBody {
        Arc::make_mut(&mut self.body)
    }
}

/// A task's serde form: its label, its prompt, then its body's fields, flat (the form a
/// `TaskSpec` of one struct had; `sortie export` is pinned to it). A snapshot stores a batch
/// through `state::compact`, never this form (bincode cannot encode a flattened struct).
#[derive(Serialize)]
struct SpecOut<'a> {
    label: &'a str,
    prompt: &'a Option<String>,
    #[serde(flatten)]
    body: &'a SpecBody,
}

#[derive(Deserialize)]
struct SpecIn {
    label: String,
    prompt: Option<String>,
    #[serde(flatten)]
    body: SpecBody,
}

impl Serialize for TaskSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        SpecOut {
            label: &self.label,
            prompt: &self.prompt,
            body: &self.body,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for TaskSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let SpecIn {
            label,
            prompt,
            body,
        } = SpecIn::deserialize(d)?;
        Ok(TaskSpec {
            label,
            prompt,
            body: Arc::new(body),
        })
    }
}

/// The fields of a task beyond its label and prompt (see [`TaskSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecBody {
    /// An argv run as is with the plain protocol.
    pub command: Option<Vec<String>>,
    /// The agent profile's name.
    pub agent: String,
    /// The primary model (None: the agent's own).
    pub model: Option<String>,
    /// Models tried in order after the primary.
    pub fallback_models: Vec<String>,
    /// Extra attempts for transient failures.
    pub max_retries: u32,
    /// Hard wall clock of one attempt while running.
    pub attempt_timeout: Duration,
    /// Wall clock of the whole task from when it is ready.
    pub deadline: Option<Duration>,
    /// Silence before an attempt is marked stalled.
    pub stall_after: Duration,
    /// Further silence before a stalled attempt is stopped.
    pub stall_kill_after: Duration,
    /// SIGTERM to the process group, then SIGKILL after this.
    pub kill_grace: Duration,
    /// Turn budget.
    pub max_turns: Option<u32>,
    /// Token budget.
    pub max_tokens: Option<u64>,
    /// Cost budget in nano-dollars.
    pub max_cost_nanos: Option<u64>,
    /// Turns granted to wrap up after a budget breach (steerable agents only).
    pub grace_turns: u32,
    /// Absolute working directory.
    pub cwd: String,
    /// Isolation mode.
    pub isolation: Isolation,
    /// Seed the worktree with uncommitted changes and untracked files.
    pub include_wip: bool,
    /// Absolute artifact path.
    pub output: Option<String>,
    /// Inline or file-only.
    pub output_mode: OutputMode,
    /// Cap on the inline text.
    pub max_output: MaxOutput,
    /// Files the agent should read first.
    pub reads: Vec<String>,
    /// Labels that must end first (complete, unless `needs_mode` is settled); a batch file's
    /// patterns are resolved to labels when it loads.
    pub needs: Vec<String>,
    /// Names of the task's extra environment variables; their values are never journaled.
    pub env_keys: Vec<String>,
    /// Retry even after side-effecting tools ran outside a worktree.
    pub retry_after_side_effects: bool,
    // #10: attempts that outlive sortie.
    /// How many of its attempts a crash of sortie may cost (orphaned attempts, retried as
    /// transient): separate from `max_retries`, which a crash never spends.
    pub max_orphans: u32,
    /// Whether its attempts run under a supervisor that outlives sortie (on by default; the
    /// profile's `supervise = false` turns it off too).
    pub supervise: bool,
    // #11
    /// Where its attempts run: locally, or as Slurm jobs with their `[slurm]` options.
    pub executor: crate::slurm::Executor,
    // Agents as their users run them (issue 13).
    /// What the agent may do (translated into each agent CLI's own flags).
    pub permissions: Permissions,
    /// The tools the agent is offered, by the agent's own names (empty: its default set).
    pub tools: Vec<String>,
    /// A completed attempt with denied tool calls stays `completed` instead of `partial`.
    pub allow_denials: bool,
    /// Text appended to the agent's own system prompt.
    pub system_prompt: Option<String>,
    /// How hard the agent thinks: one of [`THINKING_LEVELS`] (None: the agent's default).
    pub thinking: Option<String>,
    /// A plain command's failures that are transient: a nonzero exit whose stderr tail or
    /// last output lines contain one of these (case-insensitive) is retried like a provider
    /// error.
    pub transient_on: Vec<String>,
    // Shared rate limits (issue 14).
    /// The pool its attempts belong to (a `[pools.NAME]` table); None: its model's provider.
    pub pool: Option<String>,
    /// How many of its attempts may end rate limited, retried apart from `max_retries` (0: a
    /// rate limit spends a retry like any transient error).
    pub max_rate_limits: u32,
    // #15: the task-end hook as a batch field.
    /// A command run through `sh -c`, in the task's `cwd`, when the task ends (with its label,
    /// state, cost and artifact in the environment); over the run's own `on_task_end`. The
    /// `--on-task-end` flag of the process running the run wins over both.
    pub on_task_end: Option<String>,

    // #13: roles and sessions.
    /// The role the task's agent fields came from (`role = "reviewer"`), for people: what it
    /// gave (model, permissions, tools, thinking, system prompt) is already in this spec.
    pub role: Option<String>,
    /// The conversation the task belongs to (`session = "NAME"`): the tasks of one session run
    /// one after another in batch order, each continuing the agent conversation of the one
    /// before (see [`crate::session`]).
    pub session: Option<String>,
    // Issue 13: structured results.
    /// The JSON Schema the task's result must match (compact JSON text, resolved from the
    /// batch's inline table or `.json` file): the prompt gets the contract, the result is taken
    /// from the answer's last `json:result` block and validated, with one repair round.
    pub output_schema: Option<String>,
    // #37
    /// Retry an attempt that ran out its `attempt_timeout` (by default a timeout is final).
    pub retry_timeouts: bool,
    // #33: verified results.
    /// The check run after an attempt ends completed (an argv; a batch's string is `sh -c`):
    /// the task completes only when it passes (see [`crate::verify`]).
    pub verify: Option<Vec<String>>,
    /// How long the check may run.
    pub verify_timeout: Duration,
    /// How many times a failed check is fed back to the agent in the same conversation.
    pub verify_rounds: u32,
    /// Which samples of its item a template keeps (`pick`), when it has one.
    pub pick: Option<crate::verify::Pick>,
    /// The item whose samples the task is one of (a template with `count` > 1): its name, the
    /// template's label with `{sample}` as `*`; samples of one item are counted together
    /// (pass@k) and `pick` chooses among them.
    pub sample_of: Option<String>,
    // #33: a judge over samples.
    /// When its `needs` let it run: once they all completed (a need that did not skips it),
    /// or once they all ended, whatever their end.
    pub needs_mode: NeedsMode,
    // #34: the kernel sandbox.
    /// Whether its attempts run sandboxed (see [`crate::sandbox`]).
    pub sandbox: crate::sandbox::Sandbox,
    /// Paths a sandboxed attempt may also write (relative: to its working directory).
    pub sandbox_write: Vec<String>,
    /// Paths a sandboxed attempt may also read.
    pub sandbox_read: Vec<String>,
    /// `host:port`s a sandboxed attempt may reach.
    pub sandbox_hosts: Vec<String>,
}

impl TaskSpec {
    /// Whether the task may write to its working directory, as admission trusts it: derived
    /// from its permissions for an agent sortie knows (any protocol but `plain`: sortie turns
    /// `read-only` into the agent's own flags, so such a task cannot write); a profile may
    /// still say it never writes (`may_write = false`, a wrapper or a fake); a `plain` profile
    /// says so itself; an unknown profile may write.
    pub fn may_write(&self, profile: Option<&AgentProfile>) -> bool {
        match profile {
            Some(p) if p.protocol != Protocol::Plain => {
                p.may_write && self.permissions != Permissions::ReadOnly
            }
            Some(p) => p.may_write,
            None => true,
        }
    }

    /// A spec with every default, for the given label and prompt.
    pub fn new(label: impl Into<String>, cwd: impl Into<String>) -> TaskSpec {
        TaskSpec {
            label: label.into(),
            prompt: None,
            body: Arc::new(SpecBody::new(cwd.into())),
        }
    }
}

impl SpecBody {
    /// Every default, for a task in `cwd`.
    fn new(cwd: String) -> SpecBody {
        SpecBody {
            command: None,
            agent: "pi".into(),
            model: None,
            fallback_models: vec![],
            max_retries: 2,
            attempt_timeout: Duration::from_secs(15 * 60),
            deadline: None,
            stall_after: Duration::from_secs(5 * 60),
            stall_kill_after: Duration::from_secs(60),
            kill_grace: Duration::from_secs(3),
            max_turns: None,
            max_tokens: None,
            max_cost_nanos: None,
            grace_turns: 2,
            cwd,
            isolation: Isolation::None,
            include_wip: false,
            output: None,
            output_mode: OutputMode::Inline,
            max_output: MaxOutput::default(),
            reads: vec![],
            needs: vec![],
            env_keys: vec![],
            retry_after_side_effects: false,
            max_orphans: 3,
            supervise: true,
            executor: crate::slurm::Executor::Local,
            permissions: Permissions::Edit,
            tools: vec![],
            allow_denials: false,
            system_prompt: None,
            thinking: None,
            transient_on: vec![],
            pool: None,
            max_rate_limits: crate::pool::DEFAULT_MAX_RATE_LIMITS,
            on_task_end: None,

            role: None,
            session: None,
            output_schema: None,
            retry_timeouts: false,
            verify: None,
            verify_timeout: Duration::from_secs(crate::verify::DEFAULT_TIMEOUT_SECS),
            verify_rounds: 0,
            pick: None,
            sample_of: None,
            // #33: a judge over samples.
            needs_mode: NeedsMode::Completed,
            // #34: the kernel sandbox.
            sandbox: crate::sandbox::Sandbox::Off,
            sandbox_write: vec![],
            sandbox_read: vec![],
            sandbox_hosts: vec![],
        }
    }
}

impl TaskSpec {
    /// The most attempts this task may make that are not orphaned (a crash of sortie does
    /// not spend them): `1 + max(max_retries, fallbacks)`; orphaned attempts add up to
    /// `max_orphans` more (see [`TaskSpec::max_attempts_with`]).
    pub fn max_attempts(&self) -> u32 {
        let fallbacks = u32::try_from(self.fallback_models.len()).unwrap_or(u32::MAX);
        1u32.saturating_add(self.max_retries.max(fallbacks))
    }

    /// The most attempts this task may make once `orphans` of its attempts were orphaned:
    /// [`TaskSpec::max_attempts`] plus the orphans, up to `max_orphans` of them.
    pub fn max_attempts_with(&self, orphans: u32) -> u32 {
        self.max_attempts()
            .saturating_add(orphans.min(self.max_orphans))
    }
}

/// Run-level settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConfig {
    /// How many tasks run at once.
    pub concurrency: u32,
    /// Stop launching after the first failed task.
    pub fail_fast: bool,
    /// The whole run's budget (`[budget]`; issue 14).
    pub budget: RunBudget,
    /// The named pools (`[pools.NAME]`; issue 14).
    pub pools: BTreeMap<String, crate::pool::PoolSpec>,
    // #15
    /// The run's task-end hook (`on_task_end` at the top of a batch file), for every task
    /// without its own.
    pub on_task_end: Option<String>,
    // #37
    /// The price of each model the run's tasks may need priced (the batch's `[prices]` over
    /// the built-in table), resolved when the batch was loaded and kept with the run, so that
    /// an attempt is priced the same live, resumed or replayed (see [`crate::prices`]). Boxed:
    /// `RunStarted`, and so every event, stays small.
    pub prices: Box<crate::prices::Prices>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            concurrency: 4,
            fail_fast: false,
            budget: RunBudget::default(),
            pools: BTreeMap::new(),
            on_task_end: None,
            prices: Box::default(),
        }
    }
}

/// A whole batch: tasks in file order, the agent profiles they use, run settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The tasks, in file order; `TaskId(i)` is `tasks[i]`.
    pub tasks: Vec<TaskSpec>,
    /// Agent profiles by name (built-ins merged with the file's own).
    pub agents: BTreeMap<String, AgentProfile>,
    /// Run settings.
    pub config: RunConfig,
    /// Where the batch came from (a file path, or a description of a one-off).
    pub source: String,
}

/// How many distinct bodies a [`BodySharer`] compares each task's with (the most recent
/// ones): batches repeat a body in runs, and a batch of all-different bodies must not cost a
/// quadratic pass.
const RECENT_BODIES: usize = 8;

/// Makes tasks whose bodies are equal share one (see [`TaskSpec`]), one task at a time: each
/// task's body is compared with the few most recent distinct ones. A task stays equal to what
/// it was; only memory shrinks. Whoever makes a batch's tasks one by one (the loader, the
/// journal's decoding) shares each as it is made, so that the unshared batch never exists
/// whole.
#[derive(Debug, Default)]
pub struct BodySharer {
    recent: Vec<Arc<SpecBody>>,
}

impl BodySharer {
    /// Gives `task` the recent body equal to its own, if there is one.
    pub fn share(&mut self, task: &mut TaskSpec) {
        match self.recent.iter().rev().find(|b| **b == task.body) {
            Some(b) => task.body = Arc::clone(b),
            None => {
                if self.recent.len() == RECENT_BODIES {
                    self.recent.remove(0);
                }
                self.recent.push(Arc::clone(&task.body));
            }
        }
    }
}

impl Batch {
    /// The agent profile a task's attempts launch with: `command` for a task with its own
    /// `command`, else its agent's (the `command` profile missing, its agent's too).
    pub fn launch_profile(&self, spec: &TaskSpec) -> Option<&AgentProfile> {
        let name = if spec.command.is_some() {
            "command"
        } else {
            spec.agent.as_str()
        };
        self.agents
            .get(name)
            .or_else(|| self.agents.get(&spec.agent))
    }

    /// Makes the tasks whose bodies are equal share one (a [`BodySharer`] over the tasks).
    pub fn share_bodies(&mut self) {
        let mut sharer = BodySharer::default();
        for task in &mut self.tasks {
            sharer.share(task);
        }
    }

    /// Each distinct task body once, in order of first use, and per task the index of its body
    /// there (what a snapshot and the journal's `RunStarted` store): a task's body is compared
    /// with the few most recent distinct ones, first as the same `Arc` (what
    /// [`Batch::share_bodies`] left), then by value.
    pub fn body_table(&self) -> (Vec<&Arc<SpecBody>>, Vec<u32>) {
        let mut bodies: Vec<&Arc<SpecBody>> = Vec::new();
        let mut index = Vec::with_capacity(self.tasks.len());
        for spec in &self.tasks {
            let recent = bodies.len().saturating_sub(RECENT_BODIES);
            let found = bodies[recent..]
                .iter()
                .rposition(|b| Arc::ptr_eq(b, &spec.body))
                .or_else(|| bodies[recent..].iter().rposition(|b| **b == spec.body));
            let i = match found {
                Some(i) => recent + i,
                None => {
                    bodies.push(&spec.body);
                    bodies.len() - 1
                }
            };
            index.push(i as u32);
        }
        (bodies, index)
    }
}

pub use crate::bounds::{self, MAX_CONCURRENCY};
pub use crate::validate::{
    MAX_FALLBACKS, PromptPart, SpecError, chain_previous, chain_root, prompt_parts, validate_batch,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_agents_are_the_builtins_that_speak_an_agent_protocol() {
        let agents: Vec<String> = AgentProfile::builtins()
            .into_values()
            .filter(|p| p.protocol != Protocol::Plain && p.name != "codex")
            .map(|p| p.name)
            .collect();
        let mut want: Vec<&str> = AgentProfile::BUILTIN_AGENTS.to_vec();
        want.sort_unstable();
        assert_eq!(agents, want);
    }

    #[test]
    fn a_spec_serializes_flat_and_comes_back_equal() {
        let mut t = TaskSpec::new("a", "/w");
        t.prompt = Some("go".into());
        t.max_retries = 7;
        let json = serde_json::to_value(&t).unwrap();
        assert_eq!(json["label"], "a");
        assert_eq!(json["max_retries"], 7);
        assert!(json.get("body").is_none(), "{json}");
        let back: TaskSpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn equal_bodies_are_shared_and_a_write_gives_a_task_its_own() {
        let mut b = batch(vec![task("a"), task("b"), task("c")]);
        b.share_bodies();
        assert!(Arc::ptr_eq(&b.tasks[0].body, &b.tasks[2].body));
        b.tasks[1].max_retries = 9;
        assert_eq!((b.tasks[0].max_retries, b.tasks[1].max_retries), (2, 9));
        assert!(!Arc::ptr_eq(&b.tasks[0].body, &b.tasks[1].body));
    }

    fn batch(tasks: Vec<TaskSpec>) -> Batch {
        Batch {
            tasks,
            agents: AgentProfile::builtins(),
            config: RunConfig::default(),
            source: "test.toml".into(),
        }
    }

    fn task(label: &str) -> TaskSpec {
        let mut t = TaskSpec::new(label, "/tmp");
        t.prompt = Some("do it".into());
        t
    }

    fn fields(b: &Batch) -> Vec<(Option<usize>, &'static str)> {
        validate_batch(b)
            .err()
            .unwrap_or_default()
            .iter()
            .map(|e| (e.task, e.field))
            .collect()
    }

    #[test]
    fn defaults_follow_the_semantics_table() {
        let t = TaskSpec::new("a", "/");
        assert_eq!(t.agent, "pi");
        assert_eq!(t.max_retries, 2);
        assert_eq!(t.attempt_timeout, Duration::from_secs(900));
        assert_eq!(t.stall_after, Duration::from_secs(300));
        assert_eq!(t.stall_kill_after, Duration::from_secs(60));
        assert_eq!(t.kill_grace, Duration::from_secs(3));
        assert_eq!(t.grace_turns, 2);
        assert_eq!(
            t.max_output,
            MaxOutput {
                bytes: 204_800,
                lines: 5000
            }
        );
        assert_eq!(RunConfig::default().concurrency, 4);
        assert_eq!(t.max_attempts(), 3);
    }

    #[test]
    fn permissions_and_tools_need_an_agent_that_can_take_them() {
        let mut ok = task("ok");
        ok.agent = "claude".into();
        ok.permissions = Permissions::ReadOnly;
        ok.tools = vec!["Read".into()];
        let mut codex = task("codex");
        codex.agent = "codex".into();
        codex.tools = vec!["shell".into()];
        let mut own = task("own");
        own.agent = "own".into();
        own.permissions = Permissions::ReadOnly;
        let mut b = batch(vec![ok, codex, own]);
        let mut profile = b.agents["claude"].clone();
        profile.name = "own".into();
        profile.command.retain(|a| a != AGENT_ARGS);
        b.agents.insert("own".into(), profile);
        let errors = validate_batch(&b).unwrap_err();
        let found: Vec<(Option<usize>, &str)> = errors.iter().map(|e| (e.task, e.field)).collect();
        assert_eq!(
            found,
            [(Some(1), "tools"), (Some(2), "permissions")],
            "{errors:?}"
        );
        assert!(
            errors[0].message.contains("codex exec"),
            "{}",
            errors[0].message
        );
        assert!(
            errors[1].message.contains(AGENT_ARGS),
            "{}",
            errors[1].message
        );
        // transient_on is for plain commands only.
        let mut agent = task("agent");
        agent.transient_on = vec!["429".into()];
        let mut cmd = task("cmd");
        cmd.prompt = None;
        cmd.command = Some(vec!["curl".into()]);
        cmd.agent = "command".into();
        cmd.transient_on = vec!["429".into()];
        let errors = validate_batch(&batch(vec![agent, cmd])).unwrap_err();
        let found: Vec<(Option<usize>, &str)> = errors.iter().map(|e| (e.task, e.field)).collect();
        assert_eq!(found, [(Some(0), "transient_on")], "{errors:?}");
        // may_write follows the permissions for a known agent.
        let t = &b.tasks[0];
        assert!(!t.may_write(b.agents.get("claude")));
        assert!(b.tasks[1].may_write(b.agents.get("codex")));
    }

    #[test]
    fn a_valid_batch_passes() {
        let mut b = task("b");
        b.needs = vec!["a".into()];
        assert_eq!(validate_batch(&batch(vec![task("a"), b])), Ok(()));
    }

    #[test]
    fn each_error_names_its_task_and_field() {
        let mut wip = task("wip");
        wip.include_wip = true;
        let mut fo = task("fo");
        fo.output_mode = OutputMode::FileOnly;
        let mut o1 = task("o1");
        o1.output = Some("/x/out.md".into());
        let mut o2 = task("o2");
        o2.output = Some("/x/out.md".into());
        let mut unknown = task("u");
        unknown.needs = vec!["nope".into()];
        let mut neither = task("n");
        neither.prompt = None;
        let b = batch(vec![
            task("a"),
            task("a"),
            wip,
            fo,
            o1,
            o2,
            unknown,
            neither,
        ]);
        assert_eq!(
            fields(&b),
            vec![
                (Some(1), "label"),
                (Some(2), "include_wip"),
                (Some(3), "output_mode"),
                (Some(5), "output"),
                (Some(6), "needs"),
                (Some(7), "prompt"),
            ]
        );
    }

    #[test]
    fn each_error_says_which_fields_its_check_read() {
        let mut wip = task("wip");
        wip.include_wip = true;
        let mut second = task("second");
        second.prompt = Some("{previous}".into());
        let errs = validate_batch(&batch(vec![wip, second])).unwrap_err();
        let reads: Vec<(&str, &[&str])> = errs.iter().map(|e| (e.field, e.reads)).collect();
        assert_eq!(
            reads,
            vec![
                ("include_wip", &["include_wip", "isolation"][..]),
                ("prompt", &["prompt", "needs"][..]),
            ]
        );
    }

    #[test]
    fn a_needs_cycle_is_named() {
        let mut a = task("a");
        a.needs = vec!["c".into()];
        let mut b = task("b");
        b.needs = vec!["a".into()];
        let mut c = task("c");
        c.needs = vec!["b".into()];
        let errs = validate_batch(&batch(vec![a, b, c])).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].to_string(),
            "task 1 field `needs`: dependency cycle: a → c → b → a"
        );
    }

    #[test]
    fn prompt_parts_are_found_in_one_pass() {
        use PromptPart::*;
        assert_eq!(
            prompt_parts("a {previous} b {outputs.x-1}{task} {other} {outputs.} {"),
            vec![
                Text("a "),
                Previous,
                Text(" b "),
                Output("x-1"),
                Task,
                Text(" {other} {outputs.} {"),
            ]
        );
        assert_eq!(prompt_parts(""), vec![]);
    }

    #[test]
    fn chains_and_their_roots() {
        let mut b1 = task("b1");
        b1.needs = vec!["a".into()];
        let mut c = task("c");
        c.needs = vec!["b1".into()];
        let mut d = task("d");
        // Not a chain step (the task before it, c, is not needed): follows its first need.
        d.needs = vec!["b1".into()];
        let b = batch(vec![task("a"), b1, c, d]);
        assert_eq!(chain_previous(&b, 0), None);
        assert_eq!(chain_previous(&b, 2), Some(1));
        assert_eq!(chain_previous(&b, 3), None);
        assert_eq!(
            (0..4).map(|i| chain_root(&b, i)).collect::<Vec<_>>(),
            vec![0, 0, 0, 0]
        );
    }

    #[test]
    fn placeholders_must_name_needed_tasks() {
        let mut first = task("first");
        first.prompt = Some("{previous} and {task}".into());
        let mut second = task("second");
        second.needs = vec!["first".into()];
        second.prompt = Some("{previous} {task} {outputs.first}".into());
        let mut third = task("third");
        third.needs = vec!["first".into()];
        third.prompt = Some("{previous} {outputs.second} {outputs.second}".into());
        let errs = validate_batch(&batch(vec![first, second, third])).unwrap_err();
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:#?}");
        assert!(
            text[0].starts_with("task 1 field `prompt`: `{previous}`"),
            "{text:#?}"
        );
        assert!(
            text[1].starts_with("task 1 field `prompt`: `{task}`"),
            "{text:#?}"
        );
        assert!(
            text[2].contains("task 3 field `prompt`: `{previous}` is the output of the task listed just before (\"second\")"),
            "{text:#?}"
        );
        assert!(
            text[3].contains(
                "`{outputs.second}` names task \"second\", which this task does not need"
            ),
            "{text:#?}"
        );
    }

    #[test]
    fn unknown_agent_and_too_many_fallbacks() {
        let mut t = task("a");
        t.agent = "ghost".into();
        t.fallback_models = (0..9).map(|i| format!("m{i}")).collect();
        assert_eq!(
            fields(&batch(vec![t])),
            vec![(Some(0), "agent"), (Some(0), "fallback_models")]
        );
    }
}

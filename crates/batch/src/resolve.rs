//! Resolution: defaults, flags and each task's own fields merged into a [`Batch`], then core's
//! validation (each error placed by `locate`) and, for a valid batch, admission.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sortie_core::sandbox::Sandbox;
use sortie_core::{
    AgentProfile, Batch, Executor, ExecutorKind, MaxOutput, RunConfig, SlurmOptions, TaskSpec,
    validate_batch,
};

use crate::agents::Agents;
use crate::document::RunDoc;
use crate::error::{BatchError, Issues};
use crate::fields::{RawTask, Written};
use crate::load::clean;
use crate::roles::{Role, RoleBook, RoleUse};
use crate::{LoadedBatch, Overrides};
use crate::{admission, locate};

/// A parsed batch: its run-level document, and its tasks resolved one by one as they are read
/// ([`Input::add`]), never all raw at once (a raw task is ~1 KB: 100,000 of them held until
/// the last was read were the peak of `sortie run`'s memory).
pub(crate) struct Input<'a> {
    /// The batch file as the caller named it.
    pub(crate) file: &'a Path,
    /// The defaults file, for a JSON Lines batch.
    pub(crate) defaults_file: Option<&'a Path>,
    /// `Batch::source`.
    pub(crate) source: String,
    /// Where relative paths start.
    pub(crate) base: PathBuf,
    pub(crate) run: RunDoc,
    /// Where each task was written, by task index.
    pub(crate) tasks: Vec<Written>,
    pub(crate) digest: u64,
    /// The tasks resolved so far.
    resolved: Resolved,
}

/// The tasks resolved so far, and what their resolution keeps between tasks.
struct Resolved {
    /// `base` as text; None: it is not UTF-8, and no task resolves.
    base: Option<String>,
    /// #13: the roles the tasks name, each looked up once.
    roles: RoleBook,
    /// Tasks alike share one body as they are resolved (see `TaskSpec`).
    sharer: sortie_core::BodySharer,
    specs: Vec<TaskSpec>,
    env: Vec<Vec<(String, crate::EnvValue)>>,
}

impl<'a> Input<'a> {
    /// A batch with no task yet; its `[defaults]` (in `run`) are read.
    pub(crate) fn new(
        file: &'a Path,
        defaults_file: Option<&'a Path>,
        source: String,
        base: PathBuf,
        run: RunDoc,
        digest: u64,
        issues: &mut Issues,
    ) -> Input<'a> {
        let text = base.to_str().map(str::to_owned);
        let mut roles = RoleBook::new(&base);
        if text.is_some() {
            roles.see(&run.defaults, issues);
        }
        let resolved = Resolved {
            base: text,
            roles,
            sharer: sortie_core::BodySharer::default(),
            specs: Vec::new(),
            env: Vec::new(),
        };
        Input {
            file,
            defaults_file,
            source,
            base,
            run,
            tasks: Vec::new(),
            digest,
            resolved,
        }
    }

    /// Room for `n` more tasks.
    pub(crate) fn reserve(&mut self, n: usize) {
        self.tasks.reserve_exact(n);
        self.resolved.specs.reserve_exact(n);
        self.resolved.env.reserve_exact(n);
    }

    /// Adds a task as it is read: expanded when it is a template (see `expand`), each task it
    /// makes resolved against the run's `[defaults]`, the flags and its role; only where it was
    /// written is kept of its raw fields.
    pub(crate) fn add(&mut self, raw: RawTask, ov: &Overrides, issues: &mut Issues) {
        let Input {
            base,
            run,
            tasks,
            resolved,
            ..
        } = self;
        crate::expand::expand(raw, base, issues, &mut |t, issues| {
            let Some(base) = &resolved.base else { return };
            resolved.roles.see(&t, issues);
            let index = tasks.len();
            let (mut spec, env) = resolve_task(
                index,
                &t,
                &run.defaults,
                ov,
                base,
                &run.agents,
                &resolved.roles,
            );
            resolved.sharer.share(&mut spec);
            resolved.specs.push(spec);
            resolved.env.push(env);
            tasks.push(t.written());
        });
    }

    /// The files in the order their issues are listed: the defaults file, then the batch.
    pub(crate) fn order(&self) -> Vec<&'a Path> {
        self.defaults_file.into_iter().chain([self.file]).collect()
    }
}

/// Validates the resolved batch and admits it.
pub(crate) fn resolve(
    input: Input<'_>,
    ov: &Overrides,
    issues: Issues,
) -> Result<LoadedBatch, BatchError> {
    let order = input.order();
    let (loaded, issues, _) = resolve_all(input, ov, issues);
    match loaded {
        Some(loaded) if issues.0.is_empty() => Ok(loaded),
        _ => Err(issues.into_error(&order)),
    }
}

/// Validates and admits the resolved batch, keeping it even when it has issues (`sortie
/// check` looks further at what did resolve), with the roles its tasks use and its `needs`
/// patterns. None: not even the base directory could be named.
pub(crate) fn resolve_all(
    mut input: Input<'_>,
    ov: &Overrides,
    mut issues: Issues,
) -> (Option<LoadedBatch>, Issues, Resolution) {
    if input.resolved.base.is_none() {
        issues.add(
            input.file,
            None,
            None,
            format!("the directory {} is not valid UTF-8", input.base.display()),
        );
        return (None, issues, Resolution::default());
    }
    let run = &input.run;
    let defaults_config = RunConfig::default();
    let config = RunConfig {
        concurrency: ov
            .concurrency
            .or(run.concurrency)
            .unwrap_or(defaults_config.concurrency),
        fail_fast: ov
            .fail_fast
            .or(run.fail_fast)
            .unwrap_or(defaults_config.fail_fast),
        budget: run.budget,
        pools: run
            .pools
            .iter()
            .map(|(k, p)| (k.clone(), p.spec.clone()))
            .collect(),
        on_task_end: run.on_task_end.clone(),
        prices: Box::default(),
    };
    let tasks = std::mem::take(&mut input.resolved.specs);
    let env = std::mem::take(&mut input.resolved.env);
    let uses = role_uses(&tasks, &input.resolved.roles);
    let run = &input.run;
    let mut batch = Batch {
        tasks,
        agents: run.agents.profiles.clone(),
        config,
        source: input.source.clone(),
    };
    // #33: `needs` patterns become the labels they match, before validation sees them.
    let defaults = run.defaults.written();
    let patterns = crate::needs::resolve_patterns(&mut batch, &input.tasks, &defaults, &mut issues);
    // #37: the price of every model a task may need priced, resolved once and kept with the
    // run (a later table never reprices it).
    let models = sortie_core::prices::resolve(&batch, &run.prices);
    if !models.is_empty() {
        batch.config.prices = Box::new(sortie_core::prices::Prices {
            as_of: sortie_core::prices::PRICES_AS_OF.to_owned(),
            models,
        });
    }
    // Issue 14: a pool no task uses is a mistake (a misspelt provider limits nothing).
    let used = sortie_core::pool::pools_used(&batch);
    for (name, pool) in &run.pools {
        if !used.contains_key(name) {
            issues.add(
                &run.file,
                pool.line,
                Some(&format!("pools.{name}")),
                format!(
                    "no task uses pool {name:?} (a task's pool is its `pool`, else its model's \
                     provider: {})",
                    used_list(&used)
                ),
            );
        }
    }
    // Tasks whose lines did not parse are tasks all the same: "the batch has no tasks" would
    // name the wrong thing, and before the real error.
    let tasks_unread = batch.tasks.is_empty()
        && issues
            .0
            .iter()
            .any(|i| i.file == input.file && i.line.is_some());
    if let Err(errors) = validate_batch(&batch) {
        for e in &errors {
            if tasks_unread && e.task.is_none() && e.field == "tasks" {
                continue;
            }
            if let Some(issue) = locate::issue(e, &input, &batch, ov) {
                issues.0.push(issue);
            }
        }
    } else if issues.0.is_empty() {
        admission::admit(&input, &batch, ov, &mut issues);
    }
    let loaded = LoadedBatch {
        batch,
        env,
        digest: input.digest,
    };
    let resolved = Resolution {
        roles: uses,
        patterns,
    };
    (Some(loaded), issues, resolved)
}

/// What `sortie check` shows of a batch's resolution besides its issues.
#[derive(Default)]
pub(crate) struct Resolution {
    /// #13: the roles the tasks use.
    pub(crate) roles: Vec<RoleUse>,
    /// #33: the `needs` patterns and what each matched.
    pub(crate) patterns: Vec<crate::needs::PatternUse>,
}

/// The roles the resolved tasks use, by name, each with its tasks.
fn role_uses(tasks: &[TaskSpec], roles: &RoleBook) -> Vec<RoleUse> {
    roles
        .found()
        .map(|r| RoleUse {
            name: r.name.clone(),
            file: r.file.clone(),
            tasks: tasks
                .iter()
                .filter(|t| t.role.as_deref() == Some(r.name.as_str()))
                .map(|t| t.label.clone())
                .collect(),
        })
        .collect()
}

/// The pools the tasks use, for a message.
fn used_list(used: &BTreeMap<String, Vec<usize>>) -> String {
    if used.is_empty() {
        return "none here".into();
    }
    used.keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

fn pick<T: Clone>(task: &Option<T>, defaults: &Option<T>) -> Option<T> {
    task.as_ref().or(defaults.as_ref()).cloned()
}

/// `base/p` (or `p` when absolute), without `.` components.
fn absolute(base: &str, p: &str) -> String {
    clean(&Path::new(base).join(p))
        .to_string_lossy()
        .into_owned()
}

/// The level a task's agent comes from, most specific first: the task's `agent`, the task's
/// `command` (the `command` profile), the `--agent` flag, `[defaults]`' `agent`, its `command`;
/// none of them: the built-in default (`pi`). `gives(level, "agent" or "command")` says whether
/// a level gives the field: resolution asks for a value, `locate` for a key written (one that
/// did not parse included), so both take the levels in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AgentFrom {
    /// The task's `agent`.
    Task,
    /// The task's `command`.
    TaskCommand,
    /// `--agent`.
    Flag,
    /// `[defaults]`' `agent`.
    Defaults,
    /// `[defaults]`' `command`.
    DefaultsCommand,
    /// None: the built-in default.
    Builtin,
}

/// Which level a task's agent comes from (see [`AgentFrom`]).
pub(crate) fn agent_from<L>(
    t: &L,
    d: &L,
    ov: &Overrides,
    gives: impl Fn(&L, &str) -> bool,
) -> AgentFrom {
    if gives(t, "agent") {
        AgentFrom::Task
    } else if gives(t, "command") {
        AgentFrom::TaskCommand
    } else if ov.agent.is_some() {
        AgentFrom::Flag
    } else if gives(d, "agent") {
        AgentFrom::Defaults
    } else if gives(d, "command") {
        AgentFrom::DefaultsCommand
    } else {
        AgentFrom::Builtin
    }
}

/// The task's agent, from the level [`agent_from`] picks among those with a value.
fn resolve_agent(t: &RawTask, d: &RawTask, ov: &Overrides) -> String {
    let valued = |level: &RawTask, field: &str| match field {
        "agent" => level.agent.is_some(),
        _ => level.command.is_some(),
    };
    let agent = match agent_from(t, d, ov, valued) {
        AgentFrom::Task => t.agent.clone(),
        AgentFrom::Flag => ov.agent.clone(),
        AgentFrom::Defaults => d.agent.clone(),
        AgentFrom::TaskCommand | AgentFrom::DefaultsCommand => Some("command".to_owned()),
        AgentFrom::Builtin => None,
    };
    agent.unwrap_or_else(|| TaskSpec::new("", "").agent.clone())
}

fn resolve_task(
    index: usize,
    t: &RawTask,
    d: &RawTask,
    ov: &Overrides,
    base: &str,
    agents: &Agents,
    roles: &RoleBook,
) -> (TaskSpec, Vec<(String, crate::EnvValue)>) {
    let label = t
        .label
        .clone()
        .unwrap_or_else(|| format!("task-{}", index + 1));
    let cwd = pick(&t.cwd, &d.cwd).map_or_else(|| base.to_owned(), |c| absolute(base, &c));
    let mut s = TaskSpec::new(label, cwd);
    s.prompt = pick(&t.prompt, &d.prompt);
    s.command = pick(&t.command, &d.command);
    s.agent = resolve_agent(t, d, ov);
    s.model = t
        .model
        .clone()
        .or_else(|| ov.model.clone())
        .or_else(|| d.model.clone());
    macro_rules! set {
        ($($field:ident),*) => {$(
            if let Some(v) = pick(&t.$field, &d.$field) {
                s.$field = v;
            }
        )*};
    }
    set!(
        fallback_models,
        max_retries,
        attempt_timeout,
        stall_after,
        stall_kill_after,
        kill_grace,
        grace_turns,
        isolation,
        include_wip,
        output_mode,
        needs,
        retry_after_side_effects,
        retry_timeouts,
        permissions,
        tools,
        allow_denials,
        transient_on,
        // #10: attempts that outlive sortie.
        max_orphans,
        supervise,
        // Shared rate limits (issue 14).
        max_rate_limits
    );
    s.pool = pick(&t.pool, &d.pool);
    s.deadline = pick(&t.deadline, &d.deadline);
    s.system_prompt = pick(&t.system_prompt, &d.system_prompt);
    s.thinking = pick(&t.thinking, &d.thinking);
    s.max_turns = pick(&t.max_turns, &d.max_turns);
    s.max_tokens = pick(&t.max_tokens, &d.max_tokens);
    s.max_cost_nanos = pick(&t.max_cost_nanos, &d.max_cost_nanos);
    s.output = pick(&t.output, &d.output).map(|o| absolute(base, &o));
    s.reads = pick(&t.reads, &d.reads)
        .unwrap_or_default()
        .iter()
        .map(|r| absolute(base, r))
        .collect();
    let cap = MaxOutput::default();
    s.max_output = MaxOutput {
        bytes: pick(&t.max_output_bytes, &d.max_output_bytes).unwrap_or(cap.bytes),
        lines: pick(&t.max_output_lines, &d.max_output_lines).unwrap_or(cap.lines),
    };
    let mut env: BTreeMap<String, crate::EnvValue> = BTreeMap::new();
    let layers = [agents.env.get(&s.agent), d.env.as_ref(), t.env.as_ref()];
    for layer in layers.into_iter().flatten() {
        env.extend(layer.iter().cloned());
    }
    s.env_keys = env.keys().cloned().collect();
    s.executor = resolve_executor(t, d, ov);
    s.on_task_end = pick(&t.on_task_end, &d.on_task_end);

    // #33: a judge over samples (a role's below wins over [defaults]').
    if let Some(mode) = pick(&t.needs_mode, &d.needs_mode) {
        s.needs_mode = mode;
    }
    // #34: the kernel sandbox (a role's, below, over [defaults]').
    resolve_sandbox(&mut s, t, d, agents);
    // #13: a role gives what the task itself does not (its own fields win), over `[defaults]`.
    if let Some(role) = pick(&t.role, &d.role).and_then(|n| roles.get(&n)) {
        apply_role(&mut s, role, t);
    }
    s.session = t.session.clone();
    // Issue 13: structured results.
    s.output_schema = pick(&t.output_schema, &d.output_schema);
    // #33: verified results (a role's check comes in `apply_role`, under the task's own).
    if t.verify.is_some() || s.verify.is_none() {
        s.verify = pick(&t.verify, &d.verify);
    }
    if let Some(v) = pick(&t.verify_timeout, &d.verify_timeout) {
        s.verify_timeout = v;
    }
    if let Some(v) = t.verify_rounds.or(if s.verify_rounds == 0 {
        d.verify_rounds
    } else {
        None
    }) {
        s.verify_rounds = v;
    }
    s.pick = pick(&t.pick, &d.pick);
    s.sample_of = t.sample_of.clone();
    (s, env.into_iter().collect())
}

/// Applies `role` to a task resolved without it: each field the task does not give itself
/// comes from the role when the role gives it (over `[defaults]`, and over `--model`: a role
/// is part of the task). The role's system prompt comes first, the task's own after it (an agent
/// file's body first, then the task's own prompt, as the agents' own agent files are read).
fn apply_role(s: &mut TaskSpec, role: &Role, t: &RawTask) {
    s.role = Some(role.name.clone());
    if t.model.is_none()
        && let Some(m) = &role.model
    {
        s.model = Some(m.clone());
    }
    if t.permissions.is_none()
        && let Some(p) = role.permissions
    {
        s.permissions = p;
    }
    if t.tools.is_none()
        && let Some(tools) = &role.tools
    {
        s.tools = tools.clone();
    }
    if t.thinking.is_none()
        && let Some(level) = &role.thinking
    {
        s.thinking = Some(level.clone());
    }
    // #33: a role's check, under the task's own.
    if let Some(check) = &role.verify {
        s.verify = Some(check.clone());
    }
    if let Some(n) = role.verify_rounds {
        s.verify_rounds = n;
    }
    // #33: a judge over samples.
    if t.needs_mode.is_none()
        && let Some(mode) = role.needs_mode
    {
        s.needs_mode = mode;
    }
    // #34: the role's sandbox.
    if t.sandbox.is_none()
        && let Some(mode) = role.sandbox
    {
        s.sandbox = mode;
    }
    if let Some(body) = &role.system_prompt {
        s.system_prompt = Some(match &t.system_prompt {
            Some(own) => format!("{body}\n\n{own}"),
            None => body.clone(),
        });
    }
}

/// The task's executor (#11): its own `executor`, else `--executor`, else `[defaults]`'; a
/// Slurm executor takes each `slurm` option from the task, else from `[defaults]`.
fn resolve_executor(t: &RawTask, d: &RawTask, ov: &Overrides) -> Executor {
    let kind = t
        .executor
        .or(ov.executor)
        .or(d.executor)
        .unwrap_or_default();
    match kind {
        ExecutorKind::Local => Executor::Local,
        ExecutorKind::Slurm => Executor::Slurm(SlurmOptions {
            partition: pick(&t.slurm.partition, &d.slurm.partition),
            account: pick(&t.slurm.account, &d.slurm.account),
            cpus: pick(&t.slurm.cpus, &d.slurm.cpus),
            mem_mb: pick(&t.slurm.mem_mb, &d.slurm.mem_mb),
            extra_args: pick(&t.slurm.extra_args, &d.slurm.extra_args).unwrap_or_default(),
        }),
        ExecutorKind::Ray => Executor::Ray(sortie_core::RayOptions {
            address: pick(&t.ray.address, &d.ray.address),
            num_cpus: pick(&t.ray.num_cpus, &d.ray.num_cpus),
            num_gpus: pick(&t.ray.num_gpus, &d.ray.num_gpus),
            memory: pick(&t.ray.memory, &d.ray.memory),
            resources: pick(&t.ray.resources, &d.ray.resources).unwrap_or_default(),
            entrypoint_resources: pick(&t.ray.entrypoint_resources, &d.ray.entrypoint_resources)
                .unwrap_or_default(),
            runtime_env: pick(&t.ray.runtime_env, &d.ray.runtime_env).unwrap_or_default(),
        }),
    }
}

/// #34: the kernel sandbox's fields, the task's over `[defaults]`; `sandbox` then falls to
/// the profile's own (`[agents.NAME] sandbox`), then to the built-in rule: a task run by a
/// built-in agent profile (pi, pi-rpc, claude, codex) is sandboxed, a task's own `command`
/// (or a profile of the file's own) is not. A role's, applied after, sits over `[defaults]`.
fn resolve_sandbox(s: &mut TaskSpec, t: &RawTask, d: &RawTask, agents: &Agents) {
    let builtin_agent =
        || s.command.is_none() && AgentProfile::BUILTIN_AGENTS.contains(&s.agent.as_str());
    s.sandbox = pick(&t.sandbox, &d.sandbox)
        .or_else(|| agents.sandbox.get(&s.agent).copied())
        .unwrap_or_else(|| {
            if builtin_agent() {
                Sandbox::Workspace
            } else {
                Sandbox::Off
            }
        });
    s.sandbox_write = pick(&t.sandbox_write, &d.sandbox_write).unwrap_or_default();
    s.sandbox_read = pick(&t.sandbox_read, &d.sandbox_read).unwrap_or_default();
    s.sandbox_hosts = pick(&t.sandbox_hosts, &d.sandbox_hosts).unwrap_or_default();
}

//! The validation of a batch that must pass before anything runs (names, dependencies and their
//! cycles, prompts' placeholders, fields' bounds), and the prompt's placeholder syntax it checks.

use std::collections::{HashMap, HashSet};

use crate::bounds::{self, bounds_errors};
use crate::spec::*;

/// A batch error: which task (by index) and which field is wrong, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}field `{field}`: {message}", task.map(|t| format!("task {} ", t + 1)).unwrap_or_default())]
pub struct SpecError {
    /// Index of the task in the batch (None: a run-level field).
    pub task: Option<usize>,
    /// The field's name as written in the batch file.
    pub field: &'static str,
    /// The fields of the same task (or the run, for a run-level error) whose values the check
    /// read, `field` first. A loader that could not read one of them (it reported that
    /// already, and put a default in its place) drops the error: the check saw the stand-in,
    /// not what the user wrote.
    pub reads: &'static [&'static str],
    /// What is wrong.
    pub message: String,
}

/// The most fallback models a task may list.
pub const MAX_FALLBACKS: usize = 8;

/// Checks everything that must hold before anything runs. Returns every error found, in task
/// order, so a user can fix a file in one pass.
pub fn validate_batch(batch: &Batch) -> Result<(), Vec<SpecError>> {
    let mut found = Found::default();
    run_errors(batch, &mut found);
    let mut labels: HashMap<&str, usize> = HashMap::new();
    let mut outputs: HashMap<&str, usize> = HashMap::new();
    for (i, t) in batch.tasks.iter().enumerate() {
        let mut task = TaskErrors {
            found: &mut found,
            task: i,
        };
        task_shape_errors(batch, t, &mut labels, &mut task);
        agent_capability_errors(batch, t, &mut task);
        price_errors(batch, t, &mut task);
        task_output_errors(t, &mut outputs, &mut task);
        task_needs_errors(batch, t, &mut task);
    }
    graph_errors(batch, &mut found);
    if found.errors.is_empty() {
        Ok(())
    } else {
        Err(found.errors)
    }
}

/// The errors found so far, in the order they were found.
#[derive(Default)]
struct Found {
    errors: Vec<SpecError>,
}

impl Found {
    /// An error of the task at `task` (None: of the run), about `reads[0]`.
    fn push(&mut self, task: Option<usize>, reads: &'static [&'static str], message: String) {
        self.errors.push(SpecError {
            task,
            field: reads[0],
            reads,
            message,
        });
    }
}

/// The errors of one task.
struct TaskErrors<'a> {
    found: &'a mut Found,
    task: usize,
}

impl TaskErrors<'_> {
    fn push(&mut self, reads: &'static [&'static str], message: String) {
        self.found.push(Some(self.task), reads, message);
    }
}

/// #37: a cost budget binds an agent that reports no cost only through a price: a task under
/// `max_cost` (its own or the run's) whose agent reports no cost needs a price for every model
/// it may run (its agent's own default cannot be priced: sortie does not know it).
fn price_errors(batch: &Batch, t: &TaskSpec, err: &mut TaskErrors<'_>) {
    let budgeted = t.max_cost_nanos.is_some() || batch.config.budget.max_cost_nanos.is_some();
    if !budgeted || !crate::prices::needs_price(batch, t) {
        return;
    }
    let whose = if t.max_cost_nanos.is_some() {
        "its `max_cost`"
    } else {
        "the run's `[budget] max_cost`"
    };
    for model in crate::prices::models_of(t) {
        match model {
            None => err.push(
                &["max_cost", "model", "agent"],
                format!(
                    "task `{}`: agent {:?} reports no cost and the task runs the agent's own \
                     default model, which sortie cannot price, so {whose} could not bind it: \
                     set `model` (and `[prices.\"MODEL\"]` when sortie has no price for it)",
                    t.label, t.agent
                ),
            ),
            Some(m) if crate::prices::lookup(&batch.config.prices.models, m).is_none() => err.push(
                &["max_cost", "model", "fallback_models", "agent"],
                format!(
                    "task `{}`: agent {:?} reports no cost and sortie has no price for model \
                     {m:?}, so {whose} could not bind it: add `[prices.{m:?}]` with `input`, \
                     `output`, `cache_read` and `cache_write` (US dollars per million tokens)",
                    t.label, t.agent
                ),
            ),
            Some(_) => {}
        }
    }
}

/// The run-level fields: concurrency, that there are tasks, the run's budget.
fn run_errors(batch: &Batch, found: &mut Found) {
    let mut err =
        |reads: &'static [&'static str], message: String| found.push(None, reads, message);
    if !(1..=MAX_CONCURRENCY).contains(&batch.config.concurrency) {
        err(
            &["concurrency"],
            format!(
                "must be between 1 and {MAX_CONCURRENCY} (found {})",
                batch.config.concurrency
            ),
        );
    }
    if batch.tasks.is_empty() {
        err(&["tasks"], "the batch has no tasks".into());
    }
    let budget = &batch.config.budget;
    if budget
        .max_cost_nanos
        .is_some_and(|v| v == 0 || v > bounds::MAX_COST_NANOS)
    {
        err(
            &["budget.max_cost"],
            "must be more than 0 and at most 1000000 (US dollars)".into(),
        );
    }
    if budget
        .max_tokens
        .is_some_and(|v| v == 0 || v > bounds::MAX_TOKENS)
    {
        err(
            &["budget.max_tokens"],
            format!("must be between 1 and {}", bounds::MAX_TOKENS),
        );
    }
    if budget
        .deadline
        .is_some_and(|d| d.is_zero() || d > bounds::DEADLINE)
    {
        err(
            &["budget.deadline"],
            format!(
                "must be more than 0, at most {}",
                bounds::format(bounds::DEADLINE)
            ),
        );
    }
    if !(1..=100).contains(&budget.warn_percent) {
        err(
            &["budget.warn_at"],
            format!(
                "must be between 1 and 100 (percent; found {})",
                budget.warn_percent
            ),
        );
    }
}

/// A task's identity and what it runs: its label (unique), prompt or command, agent profile,
/// fallbacks, bounded fields and pool.
fn task_shape_errors<'b>(
    batch: &'b Batch,
    t: &'b TaskSpec,
    labels: &mut HashMap<&'b str, usize>,
    err: &mut TaskErrors<'_>,
) {
    if t.label.is_empty() {
        err.push(&["label"], "must not be empty".into());
    }
    if let Some(first) = labels.insert(&t.label, err.task) {
        err.push(
            &["label"],
            format!("duplicate label {:?} (also task {})", t.label, first + 1),
        );
    }
    match (&t.prompt, &t.command) {
        (None, None) => err.push(
            &["prompt", "command"],
            "a task needs a `prompt` or a `command`".into(),
        ),
        (Some(_), Some(_)) => err.push(
            &["command", "prompt"],
            "give either `prompt` or `command`, not both".into(),
        ),
        (None, Some(c)) if c.is_empty() => err.push(&["command"], "must not be empty".into()),
        _ => {}
    }
    match batch.agents.get(&t.agent) {
        None if t.command.is_none() => err.push(
            &["agent", "command"],
            format!("unknown agent profile {:?}", t.agent),
        ),
        Some(p) if t.command.is_none() && p.command.is_empty() => err.push(
            &["agent", "command"],
            format!(
                "agent {:?} has no command; give the task a `command`",
                t.agent
            ),
        ),
        _ => {}
    }
    if t.fallback_models.len() > MAX_FALLBACKS {
        err.push(
            &["fallback_models"],
            format!("at most {MAX_FALLBACKS} fallback models"),
        );
    }
    for (field, message) in bounds_errors(t) {
        err.push(field, message);
    }
    // Issue 14: a task's `pool` names a `[pools.NAME]` table.
    if let Some(p) = &t.pool
        && !batch.config.pools.contains_key(p)
    {
        let known: Vec<&str> = batch.config.pools.keys().map(String::as_str).collect();
        err.push(
            &["pool"],
            if known.is_empty() {
                format!("no pool {p:?}: the batch has no [pools.NAME] tables")
            } else {
                format!("no pool {p:?} (pools: {})", known.join(", "))
            },
        );
    }
}

/// What the task's agent can be given: permissions, tools, a system prompt and thinking need
/// the agent's command to place its flags; a tool allow-list needs an agent that has one;
/// `transient_on` is for plain commands only.
fn agent_capability_errors(batch: &Batch, t: &TaskSpec, err: &mut TaskErrors<'_>) {
    let agent_fields = t.permissions != Permissions::Edit
        || !t.tools.is_empty()
        || t.system_prompt.is_some()
        || t.thinking.is_some();
    if agent_fields
        && t.command.is_none()
        && let Some(p) = batch.agents.get(&t.agent)
        && p.protocol != Protocol::Plain
        && !p.command.iter().any(|a| a == AGENT_ARGS)
    {
        err.push(
            &["permissions", "tools", "agent"],
            format!(
                "agent {:?} cannot be given permissions, tools, system_prompt or \
                 thinking: its command does not place {AGENT_ARGS} (where the agent's own \
                 flags for them go)",
                t.agent
            ),
        );
    }
    if !t.tools.is_empty()
        && t.command.is_none()
        && let Some(p) = batch.agents.get(&t.agent)
        && matches!(p.protocol, Protocol::CodexJson | Protocol::Plain)
    {
        err.push(
            &["tools", "agent"],
            format!(
                "agent {:?} takes no tool allow-list ({} has none); use `permissions`",
                t.agent,
                if p.protocol == Protocol::Plain {
                    "a plain command"
                } else {
                    "codex exec"
                }
            ),
        );
    }
    let plain = t.command.is_some()
        || batch
            .agents
            .get(&t.agent)
            .is_some_and(|p| p.protocol == Protocol::Plain);
    if !t.transient_on.is_empty() && !plain {
        err.push(
            &["transient_on", "agent", "command"],
            format!(
                "agent {:?} speaks an agent protocol, whose errors sortie classifies from \
                 its stream; `transient_on` is for plain commands",
                t.agent
            ),
        );
    }
}

/// Where the task's work and output go: `include_wip` needs a worktree, `file-only` an output
/// path, and no two tasks share an output path.
fn task_output_errors<'b>(
    t: &'b TaskSpec,
    outputs: &mut HashMap<&'b str, usize>,
    err: &mut TaskErrors<'_>,
) {
    if t.include_wip && t.isolation != Isolation::Worktree {
        err.push(
            &["include_wip", "isolation"],
            "needs `isolation = \"worktree\"`".into(),
        );
    }
    if t.output_mode == OutputMode::FileOnly && t.output.is_none() {
        err.push(
            &["output_mode", "output"],
            "`file-only` needs an `output` path".into(),
        );
    }
    if let Some(out) = &t.output
        && let Some(first) = outputs.insert(out, err.task)
    {
        err.push(
            &["output"],
            format!("output path {out:?} is also task {}'s", first + 1),
        );
    }
}

/// The task's `needs` (each once, not itself, a known label) and its prompt's placeholders.
fn task_needs_errors(batch: &Batch, t: &TaskSpec, err: &mut TaskErrors<'_>) {
    let mut seen = HashSet::new();
    for need in &t.needs {
        if !seen.insert(need) {
            err.push(&["needs"], format!("{need:?} is listed twice"));
        } else if need == &t.label {
            err.push(&["needs", "label"], "a task cannot need itself".into());
        } else if !batch.tasks.iter().any(|o| &o.label == need) {
            err.push(&["needs"], format!("unknown label {need:?}"));
        }
    }
    for message in prompt_errors(batch, err.task) {
        err.push(&["prompt", "needs"], message);
    }
}

/// The dependency graph as a whole: sessions (their implicit order is part of the graph) and
/// cycles.
fn graph_errors(batch: &Batch, found: &mut Found) {
    let links = crate::session::session_links(batch);
    found
        .errors
        .extend(crate::session::session_errors(batch, &links));
    if let Some(cycle) = find_cycle(batch, &links) {
        let names: Vec<&str> = cycle
            .iter()
            .map(|&i| batch.tasks[i].label.as_str())
            .collect();
        let through_session = cycle
            .windows(2)
            .any(|w| links.get(w[0]).copied().flatten() == Some(w[1]));
        found.push(
            Some(cycle[0]),
            &["needs"],
            format!(
                "dependency cycle: {}{}",
                names.join(" → "),
                if through_session {
                    " (the tasks of a session run in batch order)"
                } else {
                    ""
                }
            ),
        );
    }
}

/// One piece of a task prompt: literal text or a placeholder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptPart<'a> {
    /// Text given as is.
    Text(&'a str),
    /// `{previous}`: the output of the task listed just before, which the task needs.
    Previous,
    /// `{task}`: the prompt of the chain's root (see [`chain_root`]).
    Task,
    /// `{outputs.LABEL}`: the output of a needed task.
    Output(&'a str),
    /// `{outputs.LABEL.json}`: the validated structured result of a needed task that has an
    /// `output_schema` (issue 13), as compact JSON.
    OutputJson(&'a str),
}

/// Splits a prompt into literal text and placeholders, in order, in one pass. Only
/// `{previous}`, `{task}` and `{outputs.LABEL}` are placeholders; any other brace text is
/// literal text.
pub fn prompt_parts(text: &str) -> Vec<PromptPart<'_>> {
    let mut parts = Vec::new();
    let mut rest = text;
    let mut literal_start = 0usize;
    let mut pos = 0usize;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let placeholder = after.find('}').and_then(|end| {
            let name = &after[..end];
            let part = match name {
                "previous" => Some(PromptPart::Previous),
                "task" => Some(PromptPart::Task),
                _ => name
                    .strip_prefix("outputs.")
                    .filter(|l| !l.is_empty())
                    .map(|l| match l.strip_suffix(".json") {
                        Some(label) if !label.is_empty() => PromptPart::OutputJson(label),
                        _ => PromptPart::Output(l),
                    }),
            }?;
            Some((part, end))
        });
        match placeholder {
            Some((part, end)) => {
                let start = pos + open;
                if start > literal_start {
                    parts.push(PromptPart::Text(&text[literal_start..start]));
                }
                parts.push(part);
                pos = start + 1 + end + 1;
                literal_start = pos;
                rest = &text[pos..];
            }
            None => {
                pos += open + 1;
                rest = &text[pos..];
            }
        }
    }
    if literal_start < text.len() {
        parts.push(PromptPart::Text(&text[literal_start..]));
    }
    parts
}

/// The task `{previous}` of task `i` names: the task listed just before it, when `i` needs it.
pub fn chain_previous(batch: &Batch, i: usize) -> Option<usize> {
    let prev = i.checked_sub(1)?;
    let spec = batch.tasks.get(i)?;
    let label = &batch.tasks.get(prev)?.label;
    spec.needs.contains(label).then_some(prev)
}

/// The root of task `i`'s chain, whose prompt `{task}` stands for: walking back from `i` to
/// the task it follows (the one just before it when it needs that one, else its first listed
/// need) until a task that needs nothing. A task that needs nothing is its own root. Stops
/// after as many steps as there are tasks, so a `needs` cycle cannot loop it.
pub fn chain_root(batch: &Batch, i: usize) -> usize {
    let mut cur = i;
    for _ in 0..batch.tasks.len() {
        let Some(spec) = batch.tasks.get(cur) else {
            return cur;
        };
        let next = chain_previous(batch, cur).or_else(|| {
            spec.needs
                .first()
                .and_then(|n| batch.tasks.iter().position(|t| &t.label == n))
        });
        match next {
            Some(n) => cur = n,
            None => return cur,
        }
    }
    cur
}

/// The placeholder problems of task `i`'s prompt.
fn prompt_errors(batch: &Batch, i: usize) -> Vec<String> {
    let mut out = Vec::new();
    let Some(spec) = batch.tasks.get(i) else {
        return out;
    };
    let Some(prompt) = &spec.prompt else {
        return out;
    };
    let mut seen = HashSet::new();
    for part in prompt_parts(prompt) {
        if !seen.insert(part) {
            continue;
        }
        match part {
            PromptPart::Text(_) => {}
            PromptPart::Previous if chain_previous(batch, i).is_none() => {
                out.push(match i.checked_sub(1).and_then(|p| batch.tasks.get(p)) {
                    Some(prev) => format!(
                        "`{{previous}}` is the output of the task listed just before \
                         ({:?}), which this task does not need; add it to `needs`",
                        prev.label
                    ),
                    None => "`{previous}` is the output of the task listed just before, and \
                             this is the first task"
                        .to_owned(),
                });
            }
            PromptPart::Previous => {}
            PromptPart::Task if spec.needs.is_empty() => out.push(
                "`{task}` is the prompt of the first task of this task's chain, and this \
                 task needs nothing (it has no chain)"
                    .to_owned(),
            ),
            PromptPart::Task => {
                let root = chain_root(batch, i);
                if root != i && batch.tasks.get(root).is_some_and(|r| r.prompt.is_none()) {
                    out.push(format!(
                        "`{{task}}` is the prompt of the chain's first task {:?}, which has \
                         no prompt (it is a command)",
                        batch.tasks[root].label
                    ));
                }
            }
            PromptPart::Output(label) if !spec.needs.iter().any(|n| n == label) => {
                out.push(format!(
                    "`{{outputs.{label}}}` names task {label:?}, which this task does not \
                     need; add it to `needs`"
                ));
            }
            PromptPart::Output(_) => {}
            PromptPart::OutputJson(label) if !spec.needs.iter().any(|n| n == label) => {
                out.push(format!(
                    "`{{outputs.{label}.json}}` names task {label:?}, which this task does not \
                     need; add it to `needs`"
                ));
            }
            PromptPart::OutputJson(label) => {
                let named = batch.tasks.iter().find(|t| t.label == label);
                if named.is_some_and(|t| t.output_schema.is_none()) {
                    out.push(format!(
                        "`{{outputs.{label}.json}}` is the structured result of task {label:?}, \
                         which has no `output_schema`"
                    ));
                }
            }
        }
    }
    out
}

/// Finds a dependency cycle (`needs`, and each session task's implicit dependency on the one
/// before it, `links`), returned as task indices with the first repeated at the end.
fn find_cycle(batch: &Batch, links: &[Option<usize>]) -> Option<Vec<usize>> {
    let index: HashMap<&str, usize> = batch
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (t.label.as_str(), i))
        .collect();
    let deps: Vec<Vec<usize>> = batch
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.needs
                .iter()
                .filter_map(|n| index.get(n.as_str()).copied())
                .chain(links.get(i).copied().flatten())
                .collect()
        })
        .collect();
    // 0 = unvisited, 1 = on the stack, 2 = done. Iterative DFS: deep chains must not overflow.
    let mut mark = vec![0u8; deps.len()];
    for root in 0..deps.len() {
        if mark[root] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
        mark[root] = 1;
        while let Some(&mut (node, ref mut next)) = stack.last_mut() {
            if let Some(&dep) = deps[node].get(*next) {
                *next += 1;
                match mark[dep] {
                    0 => {
                        mark[dep] = 1;
                        stack.push((dep, 0));
                    }
                    1 => {
                        let start = stack.iter().position(|&(n, _)| n == dep).unwrap_or(0);
                        let mut cycle: Vec<usize> =
                            stack[start..].iter().map(|&(n, _)| n).collect();
                        cycle.push(dep);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                mark[node] = 2;
                stack.pop();
            }
        }
    }
    None
}

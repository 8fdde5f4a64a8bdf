//! A task's fields (or `[defaults]`), type-checked one by one into a [`RawTask`], and the
//! scalar readers and "did you mean" suggestions the other documents share.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sortie_core::{ExecutorKind, Isolation, NeedsMode, OutputMode, Permissions};

use crate::error::Issues;
use crate::secret::EnvValue;
use crate::value::{Entry, Val};

/// Every task field, as written in a batch file.
pub(crate) const TASK_FIELDS: &[&str] = &[
    "label",
    "prompt",
    "command",
    "agent",
    "model",
    "fallback_models",
    "max_retries",
    "attempt_timeout",
    "deadline",
    "stall_after",
    "stall_kill_after",
    "kill_grace",
    "max_turns",
    "max_tokens",
    "max_cost",
    "grace_turns",
    "cwd",
    "isolation",
    "include_wip",
    "output",
    "output_mode",
    "max_output",
    "reads",
    "needs",
    "env",
    "retry_after_side_effects",
    "retry_timeouts",
    // Expansion (issue 14): a task as a template over a list and/or samples.
    "for_each",
    "count",
    // #10: attempts that outlive sortie.
    "max_orphans",
    "supervise",
    // #11
    "executor",
    "slurm",
    // #36
    "ray",
    // Issue 13.
    "permissions",
    "tools",
    "allow_denials",
    "system_prompt",
    "thinking",
    "transient_on",
    // Shared rate limits (issue 14).
    "pool",
    "max_rate_limits",
    // #15: the task-end hook.
    "on_task_end",
    // #13: roles and sessions.
    "role",
    "session",
    // Issue 13: structured results.
    "output_schema",
    // #33: verified results.
    "verify",
    "verify_timeout",
    "verify_rounds",
    "pick",
    // #33: a judge over samples.
    "needs_mode",
    // #34: the kernel sandbox.
    "sandbox",
    "sandbox_write",
    "sandbox_read",
    "sandbox_hosts",
];

/// The top-level keys of a batch file.
pub(crate) const RUN_FIELDS: &[&str] = &[
    "concurrency",
    "fail_fast",
    "allow_shared_writes",
    "defaults",
    "agents",
    "tasks",
    // The whole run's budget (issue 14).
    "budget",
    // Shared rate limits (issue 14).
    "pools",
    // #15: the run's task-end hook.
    "on_task_end",
    // #37: model prices, over the built-in table.
    "prices",
];

/// The keys of an `[agents.NAME]` table.
pub(crate) const AGENT_FIELDS: &[&str] = &[
    "command",
    "model_args",
    "protocol",
    "env",
    "can_steer",
    "can_continue",
    "may_write",
    // #10: attempts that outlive sortie.
    "supervise",
    // #34: the profile's sandbox default.
    "sandbox",
];

/// One task's fields (or `[defaults]`), type-checked, not yet resolved.
#[derive(Default, Clone)]
pub(crate) struct RawTask {
    /// The file the table is in.
    pub(crate) file: PathBuf,
    /// Where the task starts.
    pub(crate) line: Option<usize>,
    /// The line of each field given.
    pub(crate) keys: FieldLines,
    /// Fields given with a problem already reported.
    pub(crate) failed: HashSet<&'static str>,
    pub(crate) label: Option<String>,
    pub(crate) prompt: Option<String>,
    pub(crate) command: Option<Vec<String>>,
    pub(crate) agent: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) fallback_models: Option<Vec<String>>,
    pub(crate) max_retries: Option<u32>,
    pub(crate) attempt_timeout: Option<Duration>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) stall_after: Option<Duration>,
    pub(crate) stall_kill_after: Option<Duration>,
    pub(crate) kill_grace: Option<Duration>,
    pub(crate) max_turns: Option<u32>,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) max_cost_nanos: Option<u64>,
    pub(crate) grace_turns: Option<u32>,
    pub(crate) cwd: Option<String>,
    pub(crate) isolation: Option<Isolation>,
    pub(crate) include_wip: Option<bool>,
    pub(crate) output: Option<String>,
    pub(crate) output_mode: Option<OutputMode>,
    pub(crate) max_output_bytes: Option<u64>,
    pub(crate) max_output_lines: Option<u64>,
    pub(crate) reads: Option<Vec<String>>,
    pub(crate) needs: Option<Vec<String>>,
    pub(crate) env: Option<Vec<(String, EnvValue)>>,
    pub(crate) retry_after_side_effects: Option<bool>,
    pub(crate) retry_timeouts: Option<bool>,
    /// `for_each`: what the task is a template over.
    pub(crate) for_each: Option<crate::expand::ForEach>,
    /// `count`: samples of each item (or of the task).
    pub(crate) count: Option<u32>,
    /// Set on a task made by expansion: where it came from.
    pub(crate) expanded: Option<crate::expand::Origin>,
    // #10: attempts that outlive sortie.
    pub(crate) max_orphans: Option<u32>,
    pub(crate) supervise: Option<bool>,
    // #11
    pub(crate) executor: Option<ExecutorKind>,
    pub(crate) slurm: RawSlurm,
    // #36
    pub(crate) ray: crate::ray_fields::RawRay,
    // Issue 13.
    pub(crate) permissions: Option<Permissions>,
    pub(crate) tools: Option<Vec<String>>,
    pub(crate) allow_denials: Option<bool>,
    pub(crate) system_prompt: Option<String>,
    pub(crate) thinking: Option<String>,
    pub(crate) transient_on: Option<Vec<String>>,
    // Shared rate limits (issue 14).
    pub(crate) pool: Option<String>,
    pub(crate) max_rate_limits: Option<u32>,
    // #15
    pub(crate) on_task_end: Option<String>,

    // #13: roles and sessions.
    pub(crate) role: Option<String>,
    pub(crate) session: Option<String>,
    // Issue 13: structured results.
    pub(crate) output_schema: Option<String>,
    // #33: verified results.
    pub(crate) verify: Option<Vec<String>>,
    pub(crate) verify_timeout: Option<Duration>,
    pub(crate) verify_rounds: Option<u32>,
    pub(crate) pick: Option<sortie_core::verify::Pick>,
    // #33: a judge over samples.
    pub(crate) needs_mode: Option<NeedsMode>,
    // #34: the kernel sandbox.
    pub(crate) sandbox: Option<sortie_core::sandbox::Sandbox>,
    pub(crate) sandbox_write: Option<Vec<String>>,
    pub(crate) sandbox_read: Option<Vec<String>>,
    pub(crate) sandbox_hosts: Option<Vec<String>>,
    /// #33: set on a sample made by a template with `count` of at least 2: its item's name
    /// (see `expand`).
    pub(crate) sample_of: Option<String>,
}

/// What of a task's table outlives its resolution: where the task and each field it gave are
/// written, the fields that failed to parse, the expansion it came from. Locating an issue
/// (`locate`, `admission`, `sortie check`) needs nothing more, so a task's ~1 KB of raw values
/// is dropped as soon as the task is resolved.
#[derive(Clone)]
pub(crate) struct Written {
    /// The file the table is in.
    pub(crate) file: PathBuf,
    /// Where the task starts.
    pub(crate) line: Option<usize>,
    /// The line of each field given.
    pub(crate) keys: FieldLines,
    /// Fields given with a problem already reported.
    pub(crate) failed: HashSet<&'static str>,
    /// Set on a task made by expansion: where it came from.
    pub(crate) expanded: Option<crate::expand::Origin>,
}

/// The fields a table gave, each with its line, in the order given. A task gives a few: a
/// vector searched in order is smaller than a map (a 100,000-task batch held 100,000 maps of
/// ~150 bytes each while it loaded).
#[derive(Default, Clone)]
pub(crate) struct FieldLines(Vec<(&'static str, Option<usize>)>);

impl FieldLines {
    /// The line of `field`, if the table gave it (None inside: given, line unknown).
    pub(crate) fn get(&self, field: &str) -> Option<&Option<usize>> {
        self.0
            .iter()
            .find(|(k, _)| *k == field)
            .map(|(_, line)| line)
    }

    /// Whether the table gave `field`.
    pub(crate) fn contains_key(&self, field: &str) -> bool {
        self.get(field).is_some()
    }

    /// Records `field` at `line` (a field given again keeps its last line).
    pub(crate) fn insert(&mut self, field: &'static str, line: Option<usize>) {
        match self.0.iter_mut().find(|(k, _)| *k == field) {
            Some(entry) => entry.1 = line,
            None => self.0.push((field, line)),
        }
    }
}

/// The keys of a `slurm` table (#11).
pub(crate) const SLURM_FIELDS: &[&str] = &["partition", "account", "cpus", "mem", "extra_args"];

/// A `slurm` table's fields, type-checked; each is picked from the task, then `[defaults]`.
#[derive(Default, Clone)]
pub(crate) struct RawSlurm {
    pub(crate) partition: Option<String>,
    pub(crate) account: Option<String>,
    pub(crate) cpus: Option<u32>,
    pub(crate) mem_mb: Option<u64>,
    pub(crate) extra_args: Option<Vec<String>>,
}

/// Where a table of task fields is: a task, or `[defaults]`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    Task,
    Defaults,
}

impl RawTask {
    pub(crate) fn new(file: &Path, line: Option<usize>) -> RawTask {
        RawTask {
            file: file.to_path_buf(),
            line,
            ..RawTask::default()
        }
    }

    /// Where the table and its fields are written (see [`Written`]).
    pub(crate) fn written(&self) -> Written {
        Written {
            file: self.file.clone(),
            line: self.line,
            keys: self.keys.clone(),
            failed: self.failed.clone(),
            expanded: self.expanded.clone(),
        }
    }

    pub(crate) fn set(&mut self, field: &'static str, line: Option<usize>) {
        self.keys.insert(field, line);
    }

    /// Type-checks a task table (or `[defaults]`), reporting every problem.
    pub(crate) fn parse(
        entries: &[Entry],
        file: &Path,
        line: Option<usize>,
        scope: Scope,
        issues: &mut Issues,
    ) -> RawTask {
        let mut t = RawTask::new(file, line);
        for e in entries {
            if matches!(e.val, Val::Null) {
                continue;
            }
            let Some(&name) = TASK_FIELDS.iter().find(|f| **f == e.key) else {
                let hint = if scope == Scope::Task && RUN_FIELDS.contains(&e.key.as_str()) {
                    "; it is a run-level setting, at the top of the file".to_owned()
                } else {
                    suggest(&e.key, TASK_FIELDS)
                };
                issues.add(file, e.line, Some(&e.key), format!("unknown field{hint}"));
                continue;
            };
            t.set(name, e.line);
            if let Err(message) = t.parse_field(name, e, scope, issues) {
                issues.add(file, e.line, Some(name), message);
                t.failed.insert(name);
            }
        }
        t
    }

    fn parse_field(
        &mut self,
        name: &'static str,
        e: &Entry,
        scope: Scope,
        issues: &mut Issues,
    ) -> Result<(), String> {
        let v = &e.val;
        match name {
            "label" if scope == Scope::Defaults => {
                return Err("a label names one task; it cannot be a default".into());
            }
            "label" => self.label = Some(string(v)?),
            "prompt" => self.prompt = Some(string(v)?),
            "command" => self.command = Some(strings(v)?),
            "agent" => self.agent = Some(string(v)?),
            "model" => self.model = Some(string(v)?),
            "fallback_models" => self.fallback_models = Some(strings(v)?),
            "max_retries" => self.max_retries = Some(uint(v)?),
            "attempt_timeout" => self.attempt_timeout = Some(duration(v)?),
            "deadline" => self.deadline = Some(duration(v)?),
            "stall_after" => self.stall_after = Some(duration(v)?),
            "stall_kill_after" => self.stall_kill_after = Some(duration(v)?),
            "kill_grace" => self.kill_grace = Some(duration(v)?),
            "max_turns" => self.max_turns = Some(uint(v)?),
            "max_tokens" => self.max_tokens = Some(uint(v)?),
            "max_cost" => self.max_cost_nanos = Some(cost_nanos(v)?),
            "grace_turns" => self.grace_turns = Some(uint(v)?),
            "cwd" => self.cwd = Some(path_string(v)?),
            "isolation" => self.isolation = Some(isolation(v)?),
            "include_wip" => self.include_wip = Some(boolean(v)?),
            "output" => self.output = Some(path_string(v)?),
            "output_mode" => self.output_mode = Some(output_mode(v)?),
            "max_output" => self.parse_max_output(e, issues)?,
            "reads" => {
                self.reads = Some(checked_strings(
                    v,
                    |r| r.is_empty(),
                    "a path must not be empty",
                )?);
            }
            "needs" => self.needs = Some(strings(v)?),
            "env" => self.env = Some(env_table(e, &self.file, "env", issues)?),
            "retry_after_side_effects" => self.retry_after_side_effects = Some(boolean(v)?),
            "retry_timeouts" => self.retry_timeouts = Some(boolean(v)?),
            "for_each" | "count" if scope == Scope::Defaults => {
                return Err("expansion makes tasks of one task; it cannot be a default".into());
            }
            "pick" if scope == Scope::Defaults => {
                return Err("`pick` chooses among one template's samples (`count`); \
                            it cannot be a default"
                    .into());
            }
            "for_each" => self.for_each = Some(crate::expand::ForEach::parse(v)?),
            "count" => self.count = Some(crate::expand::count(v)?),
            // #10: attempts that outlive sortie.
            "max_orphans" => self.max_orphans = Some(uint(v)?),
            "supervise" => self.supervise = Some(boolean(v)?),
            "executor" => self.executor = Some(executor(v)?),
            "slurm" => self.parse_slurm(e, issues)?,
            "ray" => self.parse_ray(e, issues)?,
            "permissions" => self.permissions = Some(permissions(v)?),
            "tools" => {
                self.tools = Some(checked_strings(
                    v,
                    |t| t.trim().is_empty() || t.contains(','),
                    "a tool name must not be empty nor contain `,`",
                )?);
            }
            "allow_denials" => self.allow_denials = Some(boolean(v)?),
            "system_prompt" => self.system_prompt = Some(string(v)?),
            "on_task_end" => self.on_task_end = Some(hook_command(v)?),
            "transient_on" => {
                self.transient_on = Some(checked_strings(
                    v,
                    |p| p.trim().is_empty(),
                    "a pattern must not be empty",
                )?);
            }
            "pool" => self.pool = Some(named(v, "a pool's name must not be empty")?),
            "max_rate_limits" => self.max_rate_limits = Some(uint(v)?),
            "thinking" => self.thinking = Some(thinking(v)?),
            // #13: roles and sessions.
            "role" => {
                let name = string(v)?;
                crate::roles::check_name(&name)?;
                self.role = Some(name);
            }
            "session" if scope == Scope::Defaults => {
                return Err(
                    "a session is a conversation of the tasks that name it; it cannot be a default"
                        .into(),
                );
            }
            "session" => self.session = Some(named(v, "a session name must not be empty")?),
            // Issue 13: structured results (its own lines: a problem inside an inline
            // schema is placed at the line of the key it is about).
            "output_schema" => match crate::schema::parse(e, &self.file) {
                Ok(schema) => self.output_schema = Some(schema),
                Err(err) => {
                    issues.add(&self.file, err.line, Some(name), err.message);
                    self.failed.insert(name);
                }
            },
            // #33: verified results.
            "verify" => self.verify = Some(verify_command(v)?),
            "verify_timeout" => self.verify_timeout = Some(duration(v)?),
            "verify_rounds" => self.verify_rounds = Some(uint(v)?),
            "pick" => self.pick = Some(pick(v)?),
            // #33: a judge over samples.
            "needs_mode" => self.needs_mode = Some(needs_mode(v)?),
            // #34: the kernel sandbox.
            "sandbox" => self.sandbox = Some(sandbox(v)?),
            "sandbox_write" => self.sandbox_write = Some(strings(v)?),
            "sandbox_read" => self.sandbox_read = Some(strings(v)?),
            "sandbox_hosts" => self.sandbox_hosts = Some(sandbox_hosts(v)?),
            _ => return Err("unknown field".into()),
        }
        Ok(())
    }

    /// `{ bytes, lines }`, either may be given; each sub-field's problem is its own issue.
    fn parse_max_output(&mut self, e: &Entry, issues: &mut Issues) -> Result<(), String> {
        let Val::Table(entries) = &e.val else {
            return Err(expected("a table { bytes, lines }", &e.val));
        };
        for sub in entries {
            let field = format!("max_output.{}", sub.key);
            let parsed = match sub.key.as_str() {
                "bytes" => uint(&sub.val).map(|b| self.max_output_bytes = Some(b)),
                "lines" => uint(&sub.val).map(|l| self.max_output_lines = Some(l)),
                _ if matches!(sub.val, Val::Null) => Ok(()),
                _ => Err(format!(
                    "unknown field{}",
                    suggest(&sub.key, &["bytes", "lines"])
                )),
            };
            if let Err(message) = parsed {
                issues.add(&self.file, sub.line, Some(&field), message);
                self.failed.insert("max_output");
            }
        }
        Ok(())
    }
}

impl RawTask {
    /// `{ partition, account, cpus, mem, extra_args }`, any of them; each sub-field's problem
    /// is its own issue (#11).
    fn parse_slurm(&mut self, e: &Entry, issues: &mut Issues) -> Result<(), String> {
        let Val::Table(entries) = &e.val else {
            return Err(expected(
                "a table { partition, account, cpus, mem, extra_args }",
                &e.val,
            ));
        };
        for sub in entries {
            let field = format!("slurm.{}", sub.key);
            let v = &sub.val;
            let o = &mut self.slurm;
            let parsed = match sub.key.as_str() {
                _ if matches!(v, Val::Null) => Ok(()),
                "partition" => string(v).map(|p| o.partition = Some(p)),
                "account" => string(v).map(|a| o.account = Some(a)),
                "cpus" => match uint::<u32>(v) {
                    Ok(0) => Err("must be at least 1".to_owned()),
                    Ok(c) => {
                        o.cpus = Some(c);
                        Ok(())
                    }
                    Err(m) => Err(m),
                },
                "mem" => megabytes(v).map(|m| o.mem_mb = Some(m)),
                "extra_args" => strings(v).and_then(|args| {
                    let probe = sortie_core::SlurmOptions {
                        extra_args: args,
                        ..sortie_core::SlurmOptions::default()
                    };
                    if let Some(a) = probe.reserved_extra_arg() {
                        return Err(format!(
                            "{a:?} is set by sortie itself (it names the job, keeps it from \
                             being requeued and chooses its output files)"
                        ));
                    }
                    o.extra_args = Some(probe.extra_args);
                    Ok(())
                }),
                _ => Err(format!("unknown field{}", suggest(&sub.key, SLURM_FIELDS))),
            };
            if let Err(message) = parsed {
                issues.add(&self.file, sub.line, Some(&field), message);
                self.failed.insert("slurm");
            }
        }
        Ok(())
    }
}

/// A memory size in megabytes: an integer (megabytes) or a string with a unit, `"512M"`,
/// `"8G"`, `"1T"` (Slurm's units, powers of 1024).
fn megabytes(v: &Val) -> Result<u64, String> {
    const MSG: &str = "expected megabytes or a size such as \"512M\", \"8G\" or \"1T\"";
    let mb = match v {
        Val::Int(i) => u64::try_from(*i).ok(),
        Val::Str(s) => {
            let s = s.trim();
            let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (n, unit) = s.split_at(split);
            let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
                "" | "M" | "MB" => 1,
                "G" | "GB" => 1024,
                "T" | "TB" => 1024 * 1024,
                _ => return Err(format!("{MSG}, found {s:?}")),
            };
            n.parse::<u64>().ok().and_then(|n| n.checked_mul(scale))
        }
        other => return Err(format!("{MSG}, found {}", other.kind())),
    };
    match mb {
        Some(0) => Err("must be at least 1 megabyte".to_owned()),
        Some(mb) => Ok(mb),
        None => Err(format!("{MSG}, found {}", v.kind())),
    }
}

/// A table of strings or references (`env`); each bad entry is its own issue and is left out.
pub(crate) fn env_table(
    e: &Entry,
    file: &Path,
    field: &str,
    issues: &mut Issues,
) -> Result<Vec<(String, EnvValue)>, String> {
    let Val::Table(entries) = &e.val else {
        return Err(expected("a table of strings", &e.val));
    };
    let mut env = Vec::new();
    for var in entries {
        let name = format!("{field}.{}", var.key);
        if var.key.is_empty() || var.key.contains(['=', '\0']) {
            issues.add(
                file,
                var.line,
                Some(&name),
                "a variable name must not be empty nor contain `=` or NUL",
            );
            continue;
        }
        match &var.val {
            Val::Str(s) if s.contains('\0') => {
                issues.add(file, var.line, Some(&name), "a value must not contain NUL");
            }
            Val::Str(s) => env.push((var.key.clone(), EnvValue::Plain(s.clone()))),
            Val::Null => {}
            Val::Table(r) => match reference(r) {
                Ok(v) => env.push((var.key.clone(), v)),
                Err(m) => issues.add(file, var.line, Some(&name), m),
            },
            other => issues.add(
                file,
                var.line,
                Some(&name),
                expected("a string or a reference (`from_env`, `from_file`)", other),
            ),
        }
    }
    Ok(env)
}

/// #34: `{ from_env = "NAME" }` or `{ from_file = "PATH" }`.
fn reference(r: &[Entry]) -> Result<EnvValue, String> {
    const MSG: &str = "a reference is `{ from_env = \"NAME\" }` or `{ from_file = \"PATH\" }`";
    let [one] = r else {
        return Err(MSG.to_owned());
    };
    let Val::Str(s) = &one.val else {
        return Err(format!(
            "{MSG}: expected a string, found {}",
            one.val.kind()
        ));
    };
    if s.is_empty() || s.contains('\0') {
        return Err(format!("{MSG}: it must not be empty nor contain NUL"));
    }
    match one.key.as_str() {
        "from_env" if s.contains('=') => Err(format!("{MSG}: a variable name has no `=`")),
        "from_env" => Ok(EnvValue::FromEnv {
            from_env: s.clone(),
        }),
        "from_file" => Ok(EnvValue::FromFile {
            from_file: s.clone(),
        }),
        other => Err(format!("{MSG}, found `{other}`")),
    }
}

pub(crate) fn expected(what: &str, found: &Val) -> String {
    format!("expected {what}, found {}", found.kind())
}

pub(crate) fn string(v: &Val) -> Result<String, String> {
    match v {
        Val::Str(s) => Ok(s.clone()),
        other => Err(expected("a string", other)),
    }
}

pub(crate) fn path_string(v: &Val) -> Result<String, String> {
    let s = string(v)?;
    if s.is_empty() {
        return Err("a path must not be empty".into());
    }
    Ok(s)
}

pub(crate) fn strings(v: &Val) -> Result<Vec<String>, String> {
    let Val::Array(items) = v else {
        return Err(expected("an array of strings", v));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Val::Str(s) => Ok(s.clone()),
            other => Err(format!(
                "expected an array of strings, element {} is {}",
                i + 1,
                other.kind()
            )),
        })
        .collect()
}

pub(crate) fn boolean(v: &Val) -> Result<bool, String> {
    match v {
        Val::Bool(b) => Ok(*b),
        other => Err(expected("true or false", other)),
    }
}

pub(crate) fn uint<T: TryFrom<i128> + num::Max>(v: &Val) -> Result<T, String> {
    match v {
        Val::Int(i) => T::try_from(*i).map_err(|_| format!("must be between 0 and {}", T::MAX)),
        other => Err(expected("an integer", other)),
    }
}

/// The largest value of the integer types fields use, for messages.
mod num {
    pub(crate) trait Max {
        const MAX: u64;
    }
    impl Max for u32 {
        const MAX: u64 = u32::MAX as u64;
    }
    impl Max for u64 {
        const MAX: u64 = u64::MAX;
    }
}

const DURATION_HINT: &str =
    "use a duration such as \"90s\", \"1m 30s\", \"2h\" or a number of seconds";

pub(crate) fn duration(v: &Val) -> Result<Duration, String> {
    match v {
        Val::Str(s) => humantime::parse_duration(s.trim())
            .map_err(|e| format!("invalid duration {s:?} ({e}); {DURATION_HINT}")),
        Val::Int(i) => u64::try_from(*i)
            .map(Duration::from_secs)
            .map_err(|_| format!("a duration must not be negative; {DURATION_HINT}")),
        Val::Float(f) => Duration::try_from_secs_f64(*f)
            .map_err(|_| format!("invalid duration {f}; {DURATION_HINT}")),
        other => Err(format!(
            "{}; {DURATION_HINT}",
            expected("a duration", other)
        )),
    }
}

/// A cost in US dollars, as nano-dollars.
pub(crate) fn cost_nanos(v: &Val) -> Result<u64, String> {
    const MSG: &str = "expected a cost in US dollars, at least 0 (such as 2.5)";
    let nanos = match v {
        Val::Int(i) => i
            .checked_mul(1_000_000_000)
            .and_then(|n| u64::try_from(n).ok()),
        Val::Float(f) if f.is_finite() && *f >= 0.0 && *f * 1e9 < u64::MAX as f64 => {
            // Finite, non-negative and below u64::MAX: checked just above.
            Some((*f * 1e9).round() as u64)
        }
        _ => None,
    };
    nanos.ok_or_else(|| format!("{MSG}, found {}", v.kind()))
}

/// `; did you mean `x`?` when a known name is close to `key` (Levenshtein distance, over
/// characters, at most 2 or a quarter of the known name's length).
pub(crate) fn suggest(key: &str, known: &[&str]) -> String {
    let norm = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    known
        .iter()
        .map(|k| (strsim::levenshtein(&norm(key), k), *k))
        .filter(|&(d, k)| d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| format!("; did you mean `{k}`?"))
        .unwrap_or_default()
}

/// #33: a check (`verify`): an argv array, or a string run with `sh -c`.
pub(crate) fn verify_command(v: &Val) -> Result<Vec<String>, String> {
    match v {
        Val::Str(s) if s.trim().is_empty() => Err("a check must not be empty".into()),
        Val::Str(s) => Ok(vec!["sh".into(), "-c".into(), s.clone()]),
        Val::Array(_) => {
            let argv = strings(v)?;
            match argv.first() {
                None => Err("a check's argv must not be empty".into()),
                Some(p) if p.is_empty() => Err("a check's program must not be empty".into()),
                Some(_) => Ok(argv),
            }
        }
        other => Err(expected(
            "a command: a string (run with `sh -c`) or an array of strings (an argv)",
            other,
        )),
    }
}

/// #33: `pick = "first-pass"` or `"best-score"`.
fn pick(v: &Val) -> Result<sortie_core::verify::Pick, String> {
    let name = string(v)?;
    sortie_core::verify::Pick::parse(&name)
        .ok_or_else(|| format!("expected \"first-pass\" or \"best-score\", found {name:?}"))
}

/// A task-end hook's command (`on_task_end`, #15): a non-empty string, run through `sh -c`.
pub(crate) fn hook_command(v: &Val) -> Result<String, String> {
    let cmd = string(v)?;
    if cmd.trim().is_empty() {
        return Err("the command must not be empty (leave the field out for no hook)".into());
    }
    Ok(cmd)
}

/// `isolation`: "none", "worktree" or "copy".
fn isolation(v: &Val) -> Result<Isolation, String> {
    match string(v)?.as_str() {
        "none" => Ok(Isolation::None),
        "worktree" => Ok(Isolation::Worktree),
        // #14
        "copy" => Ok(Isolation::Copy),
        other => Err(format!(
            "expected \"none\", \"worktree\" or \"copy\", found {other:?}"
        )),
    }
}

/// `output_mode`: "inline" or "file-only".
fn output_mode(v: &Val) -> Result<OutputMode, String> {
    match string(v)?.as_str() {
        "inline" => Ok(OutputMode::Inline),
        "file-only" => Ok(OutputMode::FileOnly),
        other => Err(format!(
            "expected \"inline\" or \"file-only\", found {other:?}"
        )),
    }
}

/// `sandbox` (#34): "workspace" or "off".
pub(crate) fn sandbox(v: &Val) -> Result<sortie_core::sandbox::Sandbox, String> {
    let name = string(v)?;
    sortie_core::sandbox::Sandbox::parse(&name)
        .ok_or_else(|| format!("expected \"workspace\" or \"off\", found {name:?}"))
}

/// `sandbox_hosts` (#34): `host:port` strings.
fn sandbox_hosts(v: &Val) -> Result<Vec<String>, String> {
    let hosts = strings(v)?;
    for h in &hosts {
        sortie_core::sandbox::check_host(h)?;
    }
    Ok(hosts)
}

/// `needs_mode` (#33): "completed" or "settled".
fn needs_mode(v: &Val) -> Result<NeedsMode, String> {
    let name = string(v)?;
    NeedsMode::parse(&name)
        .ok_or_else(|| format!("expected \"completed\" or \"settled\", found {name:?}"))
}

/// `executor`: an executor's kind.
fn executor(v: &Val) -> Result<ExecutorKind, String> {
    let name = string(v)?;
    ExecutorKind::parse(&name)
        .ok_or_else(|| format!("expected \"local\", \"slurm\" or \"ray\", found {name:?}"))
}

/// `permissions`: "read-only", "edit" or "full".
fn permissions(v: &Val) -> Result<Permissions, String> {
    let name = string(v)?;
    Permissions::parse(&name)
        .ok_or_else(|| format!("expected \"read-only\", \"edit\" or \"full\", found {name:?}"))
}

/// `thinking`: one of the thinking levels.
fn thinking(v: &Val) -> Result<String, String> {
    let level = string(v)?;
    if !sortie_core::spec::THINKING_LEVELS.contains(&level.as_str()) {
        return Err(format!(
            "expected one of {}, found {level:?}",
            sortie_core::spec::THINKING_LEVELS.join(", ")
        ));
    }
    Ok(level)
}

/// A list of strings none of which is `bad` (else `message`).
fn checked_strings(
    v: &Val,
    bad: impl Fn(&str) -> bool,
    message: &str,
) -> Result<Vec<String>, String> {
    let list = strings(v)?;
    if list.iter().any(|s| bad(s)) {
        return Err(message.to_owned());
    }
    Ok(list)
}

/// A name that is not blank (else `message`).
fn named(v: &Val, message: &str) -> Result<String, String> {
    let name = string(v)?;
    if name.trim().is_empty() {
        return Err(message.to_owned());
    }
    Ok(name)
}

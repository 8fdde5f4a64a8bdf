//! Loading a batch: a TOML file, a JSON Lines file (with an optional defaults file), or a
//! one-off prompt or command, resolved into a [`sortie_core::Batch`] (defaults applied, paths
//! absolute) plus the environment values that must never reach the journal.
//!
//! Every problem names the file, the 1-based line and the field, and all the problems found are
//! reported together ([`BatchError::Invalid`]): a batch with any problem never runs.
//!
//! How lines are found. TOML is parsed into a small value tree whose keys carry their spans
//! (`toml::Spanned`), so every key knows its line; a task's own line is its `[[tasks]]` header
//! (the first of its keys when the tasks are written as an inline array). In JSON Lines every
//! field of a task is on the task's line. A JSON defaults file's issues carry no line (a TOML
//! one's do).
//!
//! Precedence, lowest first: the built-in defaults, the file's `[defaults]`, the command-line
//! flags `--agent` and `--model` (a flag is a default: it never beats a task's own field), the
//! task's own fields. The `concurrency` and `fail_fast` flags override the file's run settings.
//!
//! Invariant: environment values live only in [`LoadedBatch::env`]; the [`Batch`] holds their
//! names (`TaskSpec::env_keys`, `AgentProfile::env_keys`), so journaling the batch never
//! journals a secret.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use sortie_core::{
    AgentProfile, Batch, Isolation, MaxOutput, OutputMode, Protocol, RunConfig, SpecError,
    TaskSpec, validate_batch,
};
use toml::Spanned;

/// The name that issues about a one-off (flags, no file) carry as their file.
pub const COMMAND_LINE: &str = "<command line>";

/// A batch ready to run.
#[derive(Clone)]
pub struct LoadedBatch {
    /// The tasks, resolved: defaults applied, `cwd`, `output` and `reads` absolute (relative to
    /// the batch file's directory; for one-offs relative to the given directory).
    pub batch: Batch,
    /// Per task index: the extra environment of the task's child (the agent profile's `env`,
    /// then `[defaults]`'s, then the task's own; a later one wins), sorted by name. The names
    /// of `env[i]` are `batch.tasks[i].env_keys`, in the same order. Never journaled.
    pub env: Vec<Vec<(String, String)>>,
    /// A stable digest of the input: FNV-1a 64 over each input's length (8 bytes, little
    /// endian) then its bytes: the batch file, then the defaults file when there is one. For a
    /// one-off, over its prompt or argv, agent and model. Flags are not part of it.
    pub digest: u64,
}

impl fmt::Debug for LoadedBatch {
    /// Shows the environment's names only: its values are secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env: Vec<Vec<&str>> = self
            .env
            .iter()
            .map(|e| e.iter().map(|(k, _)| k.as_str()).collect())
            .collect();
        f.debug_struct("LoadedBatch")
            .field("batch", &self.batch)
            .field("env (names only)", &env)
            .field("digest", &format_args!("{:016x}", self.digest))
            .finish()
    }
}

/// Command-line flags that change a batch. `agent` and `model` are defaults: they win over the
/// file's `[defaults]` but not over a task's own field. `concurrency` and `fail_fast` override
/// the file's run settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--concurrency`.
    pub concurrency: Option<u32>,
    /// `--fail-fast`.
    pub fail_fast: Option<bool>,
    /// `--agent`.
    pub agent: Option<String>,
    /// `--model`.
    pub model: Option<String>,
    /// `--allow-shared-writes`: overrides the file's `allow_shared_writes`.
    pub allow_shared_writes: Option<bool>,
    /// The state dir the batch will run under: an `output` inside its `worktrees/` is refused.
    /// None: not checked.
    pub state_dir: Option<PathBuf>,
}

/// One problem in a batch, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchIssue {
    /// The file it is in, as the caller named it ([`COMMAND_LINE`] for a one-off).
    pub file: PathBuf,
    /// The 1-based line, when known.
    pub line: Option<usize>,
    /// The field as written in the file (`max_retries`, `max_output.bytes`, `agents.demo.protocol`).
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for BatchIssue {
    /// `batch.toml:12: field `max_retries`: expected an integer, found a string`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Why a batch did not load. Nothing runs after either.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A file could not be read, or the current directory could not be found.
    #[error("{}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The batch has problems: every one found, one per line, in file order.
    #[error("{}", issues_text(.errors))]
    Invalid {
        /// The problems.
        errors: Vec<BatchIssue>,
    },
}

impl BatchError {
    /// The located problems (empty for an I/O error).
    pub fn issues(&self) -> &[BatchIssue] {
        match self {
            BatchError::Io { .. } => &[],
            BatchError::Invalid { errors } => errors,
        }
    }
}

fn issues_text(errors: &[BatchIssue]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Loads a batch file by its extension: `.jsonl` or `.ndjson` is JSON Lines (with `defaults`,
/// a TOML or JSON file of defaults), anything else TOML (which takes no defaults file: its
/// defaults are its own `[defaults]`).
pub fn load(
    path: &Path,
    defaults: Option<&Path>,
    overrides: &Overrides,
) -> Result<LoadedBatch, BatchError> {
    if is_jsonl(path) {
        load_jsonl(path, defaults, overrides)
    } else if let Some(d) = defaults {
        Err(BatchError::Invalid {
            errors: vec![BatchIssue {
                file: d.to_path_buf(),
                line: None,
                field: None,
                message: "a defaults file goes with a JSON Lines batch; a TOML batch has its \
                          own [defaults]"
                    .into(),
            }],
        })
    } else {
        load_toml(path, overrides)
    }
}

fn is_jsonl(path: &Path) -> bool {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    matches!(ext.as_deref(), Some("jsonl" | "ndjson"))
}

/// Loads a TOML batch: run settings, `[defaults]`, `[agents.NAME]` and `[[tasks]]`.
pub fn load_toml(path: &Path, overrides: &Overrides) -> Result<LoadedBatch, BatchError> {
    let bytes = read(path)?;
    let (source, base) = locate_file(path)?;
    let mut issues = Issues::default();
    let Some(mut run) = parse_toml_doc(path, &bytes, true, &mut issues) else {
        return Err(issues.into_error(&[path]));
    };
    let tasks = std::mem::take(&mut run.tasks);
    let input = Input {
        file: path,
        defaults_file: None,
        source,
        base,
        run,
        tasks,
        digest: digest(&[&bytes]),
    };
    resolve(input, overrides, issues)
}

/// Loads a JSON Lines batch: one task object per line (blank lines and lines starting with `#`
/// skipped), with run settings, `[defaults]` and `[agents.NAME]` from `defaults`: a TOML file
/// shaped like a TOML batch without tasks, or the same as a JSON object when it ends in
/// `.json`. Relative paths, the defaults file's included, resolve against the JSON Lines file's
/// directory.
pub fn load_jsonl(
    path: &Path,
    defaults: Option<&Path>,
    overrides: &Overrides,
) -> Result<LoadedBatch, BatchError> {
    let bytes = read(path)?;
    let defaults_bytes = defaults.map(read).transpose()?;
    let (source, base) = locate_file(path)?;
    let mut issues = Issues::default();
    let run = match (defaults, &defaults_bytes) {
        (Some(d), Some(db)) => parse_defaults_file(d, db, &mut issues),
        _ => Some(RunDoc::new(path)),
    };
    let tasks = parse_jsonl_tasks(path, &bytes, &mut issues);
    let order: Vec<&Path> = defaults.into_iter().chain([path]).collect();
    let Some(run) = run else {
        return Err(issues.into_error(&order));
    };
    let mut parts: Vec<&[u8]> = vec![&bytes];
    if let Some(db) = &defaults_bytes {
        parts.push(db);
    }
    let input = Input {
        file: path,
        defaults_file: defaults,
        source,
        base,
        run,
        tasks,
        digest: digest(&parts),
    };
    resolve(input, overrides, issues)
}

/// A batch of one task asking `prompt` of `agent` (else `--agent`, else `pi`) with `model`
/// (else `--model`), run in `cwd` (relative to the current directory).
pub fn one_off_prompt(
    prompt: &str,
    agent: Option<&str>,
    model: Option<&str>,
    cwd: &Path,
    overrides: &Overrides,
) -> Result<LoadedBatch, BatchError> {
    let file = Path::new(COMMAND_LINE);
    let mut task = RawTask::new(file, None);
    task.set("prompt", None);
    task.prompt = Some(prompt.to_owned());
    if let Some(a) = agent {
        task.set("agent", None);
        task.agent = Some(a.to_owned());
    }
    if let Some(m) = model {
        task.set("model", None);
        task.model = Some(m.to_owned());
    }
    let digest = digest(&[
        b"prompt",
        prompt.as_bytes(),
        agent.unwrap_or_default().as_bytes(),
        model.unwrap_or_default().as_bytes(),
    ]);
    one_off(
        file,
        format!("prompt: {}", snippet(prompt)),
        task,
        cwd,
        digest,
        overrides,
    )
}

/// A batch of one task running `argv` as is (the `command` profile, plain protocol) in `cwd`
/// (relative to the current directory).
pub fn one_off_command(
    argv: &[String],
    cwd: &Path,
    overrides: &Overrides,
) -> Result<LoadedBatch, BatchError> {
    let file = Path::new(COMMAND_LINE);
    let mut task = RawTask::new(file, None);
    task.set("command", None);
    task.command = Some(argv.to_vec());
    let mut parts: Vec<&[u8]> = vec![b"command"];
    parts.extend(argv.iter().map(|a| a.as_bytes()));
    let digest = digest(&parts);
    one_off(
        file,
        format!("command: {}", snippet(&argv.join(" "))),
        task,
        cwd,
        digest,
        overrides,
    )
}

fn one_off(
    file: &Path,
    source: String,
    task: RawTask,
    cwd: &Path,
    digest: u64,
    overrides: &Overrides,
) -> Result<LoadedBatch, BatchError> {
    let base = std::path::absolute(cwd).map_err(|source| BatchError::Io {
        path: cwd.to_path_buf(),
        source,
    })?;
    let input = Input {
        file,
        defaults_file: None,
        source,
        base: clean(&base),
        run: RunDoc::new(file),
        tasks: vec![task],
        digest,
    };
    resolve(input, overrides, Issues::default())
}

/// The first line of `text`, cut to 60 characters.
fn snippet(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut s: String = line.chars().take(60).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    s
}

fn read(path: &Path) -> Result<Vec<u8>, BatchError> {
    std::fs::read(path).map_err(|source| BatchError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The batch file's absolute path (its `Batch::source`) and directory.
fn locate_file(path: &Path) -> Result<(String, PathBuf), BatchError> {
    let abs = std::path::absolute(path).map_err(|source| BatchError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let abs = clean(&abs);
    let dir = abs.parent().map_or_else(|| abs.clone(), Path::to_path_buf);
    Ok((abs.to_string_lossy().into_owned(), dir))
}

/// Drops `.` components. `..` is kept: removing it lexically is wrong across symlinks.
fn clean(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// FNV-1a 64 over each part's length (8 bytes, little endian) and bytes.
fn digest(parts: &[&[u8]]) -> u64 {
    let mut h = Fnv::default();
    for part in parts {
        h.write(&(part.len() as u64).to_le_bytes());
        h.write(part);
    }
    h.0
}

/// The FNV-1a 64-bit hash: stable across releases and platforms.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Issues

#[derive(Default)]
struct Issues(Vec<BatchIssue>);

impl Issues {
    fn add(
        &mut self,
        file: &Path,
        line: Option<usize>,
        field: Option<&str>,
        message: impl Into<String>,
    ) {
        self.0.push(BatchIssue {
            file: file.to_path_buf(),
            line,
            field: field.map(str::to_owned),
            message: message.into(),
        });
    }

    /// The issues in file order: files in `order` first (in that order), then by line.
    fn into_error(mut self, order: &[&Path]) -> BatchError {
        let rank = |f: &Path| order.iter().position(|o| *o == f).unwrap_or(order.len());
        self.0.sort_by_key(|i| (rank(&i.file), i.line.unwrap_or(0)));
        BatchError::Invalid { errors: self.0 }
    }
}

// ---------------------------------------------------------------------------------------------
// The value tree shared by TOML and JSON

/// A parsed value. Keys carry their line.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    /// JSON `null`: the same as an absent field.
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Array(Vec<Val>),
    Table(Vec<Entry>),
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    key: String,
    line: Option<usize>,
    val: Val,
}

impl Val {
    fn kind(&self) -> &'static str {
        match self {
            Val::Null => "null",
            Val::Bool(_) => "a boolean",
            Val::Int(_) => "an integer",
            Val::Float(_) => "a float",
            Val::Str(_) => "a string",
            Val::Array(_) => "an array",
            Val::Table(_) => "a table",
        }
    }

    fn from_json(v: serde_json::Value, line: Option<usize>) -> Val {
        use serde_json::Value as J;
        match v {
            J::Null => Val::Null,
            J::Bool(b) => Val::Bool(b),
            J::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Val::Int(i128::from(i)),
                (None, Some(u)) => Val::Int(i128::from(u)),
                _ => Val::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Val::Str(s),
            J::Array(a) => Val::Array(a.into_iter().map(|v| Val::from_json(v, line)).collect()),
            J::Object(m) => Val::Table(
                m.into_iter()
                    .map(|(key, v)| Entry {
                        key,
                        line,
                        val: Val::from_json(v, line),
                    })
                    .collect(),
            ),
        }
    }
}

/// A TOML value whose keys keep their byte spans.
enum RawToml {
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<RawToml>),
    Table(Vec<(Spanned<String>, RawToml)>),
}

impl<'de> Deserialize<'de> for RawToml {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawToml, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawToml;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a TOML value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawToml, E> {
                Ok(RawToml::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawToml, E> {
                Ok(RawToml::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawToml, E> {
                i64::try_from(v)
                    .map(RawToml::Int)
                    .map_err(|_| E::custom("integer out of range"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawToml, E> {
                Ok(RawToml::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawToml, E> {
                Ok(RawToml::Str(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<RawToml, E> {
                Ok(RawToml::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawToml, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(RawToml::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawToml, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Spanned<String>>()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(RawToml::Table(entries))
            }
        }
        d.deserialize_any(V)
    }
}

impl RawToml {
    fn lower(self, index: &LineIndex) -> Val {
        match self {
            RawToml::Bool(b) => Val::Bool(b),
            RawToml::Int(i) => Val::Int(i128::from(i)),
            RawToml::Float(f) => Val::Float(f),
            RawToml::Str(s) => Val::Str(s),
            RawToml::Array(a) => Val::Array(a.into_iter().map(|v| v.lower(index)).collect()),
            RawToml::Table(t) => Val::Table(
                t.into_iter()
                    .map(|(k, v)| Entry {
                        line: Some(index.line(k.span().start)),
                        key: k.into_inner(),
                        val: v.lower(index),
                    })
                    .collect(),
            ),
        }
    }
}

/// Byte offset to 1-based line and column.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> LineIndex {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        LineIndex { starts }
    }

    fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset).max(1)
    }

    fn column(&self, text: &str, offset: usize) -> usize {
        let start = self.starts.get(self.line(offset) - 1).copied().unwrap_or(0);
        text.get(start..offset).map_or(1, |s| s.chars().count() + 1)
    }
}

/// Lines of the `[[tasks]]` headers, in order.
fn task_headers(text: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.trim_start()
                .strip_prefix("[[")
                .and_then(|r| r.trim_start().strip_prefix("tasks"))
                .is_some_and(|r| r.trim_start().starts_with("]]"))
        })
        .map(|(i, _)| i + 1)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Fields

/// Every task field, as written in a batch file.
const TASK_FIELDS: &[&str] = &[
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
];

/// The top-level keys of a batch file.
const RUN_FIELDS: &[&str] = &[
    "concurrency",
    "fail_fast",
    "allow_shared_writes",
    "defaults",
    "agents",
    "tasks",
];

/// The keys of an `[agents.NAME]` table.
const AGENT_FIELDS: &[&str] = &[
    "command",
    "model_args",
    "protocol",
    "env",
    "can_steer",
    "can_continue",
    "may_write",
];

/// One task's fields (or `[defaults]`), type-checked, not yet resolved.
#[derive(Default)]
struct RawTask {
    /// The file the table is in.
    file: PathBuf,
    /// Where the task starts.
    line: Option<usize>,
    /// The line of each field given.
    keys: HashMap<&'static str, Option<usize>>,
    /// Fields given with a problem already reported.
    failed: HashSet<&'static str>,
    label: Option<String>,
    prompt: Option<String>,
    command: Option<Vec<String>>,
    agent: Option<String>,
    model: Option<String>,
    fallback_models: Option<Vec<String>>,
    max_retries: Option<u32>,
    attempt_timeout: Option<Duration>,
    deadline: Option<Duration>,
    stall_after: Option<Duration>,
    stall_kill_after: Option<Duration>,
    kill_grace: Option<Duration>,
    max_turns: Option<u32>,
    max_tokens: Option<u64>,
    max_cost_nanos: Option<u64>,
    grace_turns: Option<u32>,
    cwd: Option<String>,
    isolation: Option<Isolation>,
    include_wip: Option<bool>,
    output: Option<String>,
    output_mode: Option<OutputMode>,
    max_output_bytes: Option<u64>,
    max_output_lines: Option<u64>,
    reads: Option<Vec<String>>,
    needs: Option<Vec<String>>,
    env: Option<Vec<(String, String)>>,
    retry_after_side_effects: Option<bool>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Task,
    Defaults,
}

impl RawTask {
    fn new(file: &Path, line: Option<usize>) -> RawTask {
        RawTask {
            file: file.to_path_buf(),
            line,
            ..RawTask::default()
        }
    }

    fn set(&mut self, field: &'static str, line: Option<usize>) {
        self.keys.insert(field, line);
    }

    /// Type-checks a task table (or `[defaults]`), reporting every problem.
    fn parse(
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
            "isolation" => {
                self.isolation = Some(match string(v)?.as_str() {
                    "none" => Isolation::None,
                    "worktree" => Isolation::Worktree,
                    other => {
                        return Err(format!(
                            "expected \"none\" or \"worktree\", found {other:?}"
                        ));
                    }
                });
            }
            "include_wip" => self.include_wip = Some(boolean(v)?),
            "output" => self.output = Some(path_string(v)?),
            "output_mode" => {
                self.output_mode = Some(match string(v)?.as_str() {
                    "inline" => OutputMode::Inline,
                    "file-only" => OutputMode::FileOnly,
                    other => {
                        return Err(format!(
                            "expected \"inline\" or \"file-only\", found {other:?}"
                        ));
                    }
                });
            }
            "max_output" => self.parse_max_output(e, issues)?,
            "reads" => {
                let reads = strings(v)?;
                if reads.iter().any(String::is_empty) {
                    return Err("a path must not be empty".into());
                }
                self.reads = Some(reads);
            }
            "needs" => self.needs = Some(strings(v)?),
            "env" => self.env = Some(env_table(e, &self.file, "env", issues)?),
            "retry_after_side_effects" => self.retry_after_side_effects = Some(boolean(v)?),
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

/// A table of strings (`env`); each bad entry is its own issue and is left out.
fn env_table(
    e: &Entry,
    file: &Path,
    field: &str,
    issues: &mut Issues,
) -> Result<Vec<(String, String)>, String> {
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
            Val::Str(s) => env.push((var.key.clone(), s.clone())),
            Val::Null => {}
            other => issues.add(file, var.line, Some(&name), expected("a string", other)),
        }
    }
    Ok(env)
}

fn expected(what: &str, found: &Val) -> String {
    format!("expected {what}, found {}", found.kind())
}

fn string(v: &Val) -> Result<String, String> {
    match v {
        Val::Str(s) => Ok(s.clone()),
        other => Err(expected("a string", other)),
    }
}

fn path_string(v: &Val) -> Result<String, String> {
    let s = string(v)?;
    if s.is_empty() {
        return Err("a path must not be empty".into());
    }
    Ok(s)
}

fn strings(v: &Val) -> Result<Vec<String>, String> {
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

fn boolean(v: &Val) -> Result<bool, String> {
    match v {
        Val::Bool(b) => Ok(*b),
        other => Err(expected("true or false", other)),
    }
}

fn uint<T: TryFrom<i128> + num::Max>(v: &Val) -> Result<T, String> {
    match v {
        Val::Int(i) => T::try_from(*i).map_err(|_| format!("must be between 0 and {}", T::MAX)),
        other => Err(expected("an integer", other)),
    }
}

/// The largest value of the integer types fields use, for messages.
mod num {
    pub(super) trait Max {
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

fn duration(v: &Val) -> Result<Duration, String> {
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
fn cost_nanos(v: &Val) -> Result<u64, String> {
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

/// `; did you mean `x`?` when a known name is close to `key`.
fn suggest(key: &str, known: &[&str]) -> String {
    let norm = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    known
        .iter()
        .map(|k| (edit_distance(&norm(key), k), *k))
        .filter(|&(d, k)| d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| format!("; did you mean `{k}`?"))
        .unwrap_or_default()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

// ---------------------------------------------------------------------------------------------
// Run-level documents

/// User agent profiles merged over the built-ins.
struct Agents {
    profiles: BTreeMap<String, AgentProfile>,
    env: HashMap<String, Vec<(String, String)>>,
    /// Profiles with a problem already reported.
    failed: HashSet<String>,
}

impl Default for Agents {
    fn default() -> Self {
        Agents {
            profiles: AgentProfile::builtins(),
            env: HashMap::new(),
            failed: HashSet::new(),
        }
    }
}

impl Agents {
    /// `[agents.NAME]` tables. A profile named like a built-in starts from the built-in, so
    /// `[agents.pi] env = { ... }` only adds environment; a new profile needs a `command`.
    fn parse(e: &Entry, file: &Path, issues: &mut Issues) -> Agents {
        let mut agents = Agents::default();
        let Val::Table(profiles) = &e.val else {
            issues.add(
                file,
                e.line,
                Some("agents"),
                expected("a table of profiles", &e.val),
            );
            return agents;
        };
        for pe in profiles {
            let name = pe.key.clone();
            let at = |k: &str| format!("agents.{name}.{k}");
            let Val::Table(keys) = &pe.val else {
                issues.add(
                    file,
                    pe.line,
                    Some(&format!("agents.{name}")),
                    expected("a table", &pe.val),
                );
                agents.failed.insert(name);
                continue;
            };
            let builtin = AgentProfile::builtins().remove(&name);
            let is_new = builtin.is_none();
            let mut p = builtin.unwrap_or_else(|| AgentProfile {
                name: name.clone(),
                command: vec![],
                model_args: vec![],
                protocol: Protocol::Plain,
                env_keys: vec![],
                can_steer: false,
                can_continue: false,
                // Unknown agents may write: the safe assumption for retries.
                may_write: true,
            });
            let mut env = Vec::new();
            let mut bad = name.is_empty();
            if name.is_empty() {
                issues.add(
                    file,
                    pe.line,
                    Some("agents"),
                    "a profile name must not be empty",
                );
            }
            let mut has_command = false;
            for k in keys {
                if matches!(k.val, Val::Null) {
                    continue;
                }
                let parsed = match k.key.as_str() {
                    "command" => strings(&k.val).and_then(|c| {
                        has_command = true;
                        if c.is_empty() {
                            Err("must not be empty: the first element is the program".into())
                        } else {
                            p.command = c;
                            Ok(())
                        }
                    }),
                    "model_args" => strings(&k.val).map(|a| p.model_args = a),
                    "protocol" => string(&k.val).and_then(|s| {
                        Protocol::parse(&s)
                            .map(|proto| p.protocol = proto)
                            .ok_or_else(|| {
                                format!(
                                    "unknown protocol {s:?}; expected plain, pi-json, \
                                 pi-rpc, claude-stream-json or codex-json"
                                )
                            })
                    }),
                    "env" => env_table(k, file, &at("env"), issues).map(|e| env = e),
                    "can_steer" => boolean(&k.val).map(|b| p.can_steer = b),
                    "can_continue" => boolean(&k.val).map(|b| p.can_continue = b),
                    "may_write" => boolean(&k.val).map(|b| p.may_write = b),
                    other => Err(format!("unknown field{}", suggest(other, AGENT_FIELDS))),
                };
                if let Err(message) = parsed {
                    issues.add(file, k.line, Some(&at(&k.key)), message);
                    bad = true;
                }
            }
            if is_new && !has_command {
                issues.add(
                    file,
                    pe.line,
                    Some(&at("command")),
                    "missing: a new agent profile needs a `command` (an argv template)",
                );
                bad = true;
            }
            env.sort();
            env.dedup_by(|a, b| a.0 == b.0);
            p.env_keys = env.iter().map(|(k, _)| k.clone()).collect();
            if bad {
                agents.failed.insert(name.clone());
            }
            agents.env.insert(name.clone(), env);
            agents.profiles.insert(name, p);
        }
        agents
    }
}

/// The run-level part of a batch file (or of a defaults file), and its tasks.
struct RunDoc {
    file: PathBuf,
    concurrency: Option<u32>,
    concurrency_line: Option<usize>,
    fail_fast: Option<bool>,
    allow_shared_writes: Option<bool>,
    defaults: RawTask,
    agents: Agents,
    tasks: Vec<RawTask>,
}

impl RunDoc {
    fn new(file: &Path) -> RunDoc {
        RunDoc {
            file: file.to_path_buf(),
            concurrency: None,
            concurrency_line: None,
            fail_fast: None,
            allow_shared_writes: None,
            defaults: RawTask::new(file, None),
            agents: Agents::default(),
            tasks: Vec::new(),
        }
    }

    /// Reads the top-level table. `headers`: lines of the `[[tasks]]` headers; `None` where
    /// tasks are not allowed (a defaults file).
    fn parse(top: &[Entry], file: &Path, headers: Option<&[usize]>, issues: &mut Issues) -> RunDoc {
        let mut doc = RunDoc::new(file);
        for e in top {
            if matches!(e.val, Val::Null) {
                continue;
            }
            let key = e.key.as_str();
            let problem = match key {
                "concurrency" => {
                    doc.concurrency_line = e.line;
                    uint(&e.val).map(|c| doc.concurrency = Some(c))
                }
                "fail_fast" => boolean(&e.val).map(|b| doc.fail_fast = Some(b)),
                "allow_shared_writes" => boolean(&e.val).map(|b| doc.allow_shared_writes = Some(b)),
                "defaults" => match &e.val {
                    Val::Table(t) => {
                        doc.defaults = RawTask::parse(t, file, e.line, Scope::Defaults, issues);
                        Ok(())
                    }
                    other => Err(expected("a table of task fields", other)),
                },
                "agents" => {
                    doc.agents = Agents::parse(e, file, issues);
                    Ok(())
                }
                "tasks" => match headers {
                    Some(headers) => doc.parse_tasks(e, headers, issues),
                    None => Err("tasks belong in the JSON Lines file, one per line".into()),
                },
                _ if TASK_FIELDS.contains(&key) => Err(format!(
                    "unknown field at the top level; a task field goes in [defaults] or in a \
                     task{}",
                    if headers.is_some() {
                        " ([[tasks]])"
                    } else {
                        ""
                    }
                )),
                _ => Err(format!("unknown field{}", suggest(key, RUN_FIELDS))),
            };
            if let Err(message) = problem {
                issues.add(file, e.line, Some(key), message);
            }
        }
        doc
    }

    fn parse_tasks(
        &mut self,
        e: &Entry,
        headers: &[usize],
        issues: &mut Issues,
    ) -> Result<(), String> {
        let Val::Array(items) = &e.val else {
            return Err(expected("an array of tables ([[tasks]])", &e.val));
        };
        let from_headers = headers.len() == items.len();
        for (i, item) in items.iter().enumerate() {
            let Val::Table(entries) = item else {
                issues.add(
                    &self.file,
                    e.line,
                    Some("tasks"),
                    format!("task {} is {}, expected a table", i + 1, item.kind()),
                );
                continue;
            };
            let line = if from_headers {
                headers.get(i).copied()
            } else {
                entries.iter().filter_map(|k| k.line).min().or(e.line)
            };
            let task = RawTask::parse(entries, &self.file, line, Scope::Task, issues);
            self.tasks.push(task);
        }
        Ok(())
    }
}

/// Parses a TOML batch (or defaults file, `tasks_allowed = false`). None: it is not TOML at all
/// (the issue is reported).
fn parse_toml_doc(
    file: &Path,
    bytes: &[u8],
    tasks_allowed: bool,
    issues: &mut Issues,
) -> Option<RunDoc> {
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            let valid = bytes.get(..e.valid_up_to()).unwrap_or_default();
            let line = 1 + valid.iter().filter(|&&b| b == b'\n').count();
            issues.add(file, Some(line), None, "not valid UTF-8");
            return None;
        }
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let index = LineIndex::new(text);
    let raw = match toml::from_str::<RawToml>(text) {
        Ok(raw) => raw,
        Err(e) => {
            let mut message = e.message().trim().replace('\n', "; ");
            // A datetime reaches the visitor as a private map that `Spanned` keys refuse; no
            // field takes a datetime, so say that.
            if message.contains("$__toml_private_datetime") {
                message = "a date or time is not a value any batch field takes".into();
            }
            let (line, column) = match e.span() {
                Some(span) => (
                    Some(index.line(span.start)),
                    format!(" (column {})", index.column(text, span.start)),
                ),
                None => (None, String::new()),
            };
            issues.add(file, line, None, format!("{message}{column}"));
            return None;
        }
    };
    let Val::Table(top) = raw.lower(&index) else {
        issues.add(file, None, None, "expected a TOML table");
        return None;
    };
    let headers = task_headers(text);
    Some(RunDoc::parse(
        &top,
        file,
        tasks_allowed.then_some(headers.as_slice()),
        issues,
    ))
}

/// A defaults file for a JSON Lines batch: JSON when it ends in `.json`, else TOML.
fn parse_defaults_file(file: &Path, bytes: &[u8], issues: &mut Issues) -> Option<RunDoc> {
    let is_json = file
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if !is_json {
        return parse_toml_doc(file, bytes, false, issues);
    }
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(v @ serde_json::Value::Object(_)) => match Val::from_json(v, None) {
            Val::Table(top) => Some(RunDoc::parse(&top, file, None, issues)),
            _ => None,
        },
        Ok(other) => {
            let found = Val::from_json(other, None);
            issues.add(file, Some(1), None, expected("a JSON object", &found));
            None
        }
        Err(e) => {
            issues.add(file, Some(e.line()), None, json_message(&e, 0));
            None
        }
    }
}

/// serde_json's message without its own position, plus the column (shifted by `lead` bytes).
fn json_message(e: &serde_json::Error, lead: usize) -> String {
    let full = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&position).unwrap_or(&full);
    format!("invalid JSON: {message} (column {})", e.column() + lead)
}

fn parse_jsonl_tasks(file: &Path, bytes: &[u8], issues: &mut Issues) -> Vec<RawTask> {
    let mut tasks = Vec::new();
    for (n, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = n + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let text = match std::str::from_utf8(raw) {
            Ok(t) => t,
            Err(e) => {
                let column = e.valid_up_to() + 1;
                issues.add(
                    file,
                    Some(line),
                    None,
                    format!("not valid UTF-8 (byte {column} of the line)"),
                );
                continue;
            }
        };
        let text = if n == 0 {
            text.strip_prefix('\u{feff}').unwrap_or(text)
        } else {
            text
        };
        let trimmed = text.trim_start();
        if trimmed.trim_end().is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let lead = text.len() - trimmed.len();
        match serde_json::from_str::<serde_json::Value>(trimmed) {
            Ok(v @ serde_json::Value::Object(_)) => {
                if let Val::Table(entries) = Val::from_json(v, Some(line)) {
                    tasks.push(RawTask::parse(
                        &entries,
                        file,
                        Some(line),
                        Scope::Task,
                        issues,
                    ));
                }
            }
            Ok(other) => {
                let found = Val::from_json(other, Some(line));
                issues.add(
                    file,
                    Some(line),
                    None,
                    expected("a JSON object (one task per line)", &found),
                );
            }
            Err(e) => issues.add(file, Some(line), None, json_message(&e, lead)),
        }
    }
    tasks
}

// ---------------------------------------------------------------------------------------------
// Resolution and validation

struct Input<'a> {
    /// The batch file as the caller named it.
    file: &'a Path,
    /// The defaults file, for a JSON Lines batch.
    defaults_file: Option<&'a Path>,
    /// `Batch::source`.
    source: String,
    /// Where relative paths start.
    base: PathBuf,
    run: RunDoc,
    tasks: Vec<RawTask>,
    digest: u64,
}

fn resolve(
    input: Input<'_>,
    ov: &Overrides,
    mut issues: Issues,
) -> Result<LoadedBatch, BatchError> {
    let order: Vec<&Path> = input
        .defaults_file
        .into_iter()
        .chain([input.file])
        .collect();
    let Some(base) = input.base.to_str() else {
        issues.add(
            input.file,
            None,
            None,
            format!("the directory {} is not valid UTF-8", input.base.display()),
        );
        return Err(issues.into_error(&order));
    };
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
    };
    let (tasks, env): (Vec<TaskSpec>, Vec<Vec<(String, String)>>) = input
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| resolve_task(i, t, &run.defaults, ov, base, &run.agents))
        .unzip();
    let batch = Batch {
        tasks,
        agents: run.agents.profiles.clone(),
        config,
        source: input.source.clone(),
    };
    if let Err(errors) = validate_batch(&batch) {
        for e in &errors {
            if let Some(issue) = locate(e, &input, &batch, ov) {
                issues.0.push(issue);
            }
        }
    } else if issues.0.is_empty() {
        admit(&input, &batch, ov, &mut issues);
    }
    if issues.0.is_empty() {
        Ok(LoadedBatch {
            batch,
            env,
            digest: input.digest,
        })
    } else {
        Err(issues.into_error(&order))
    }
}

/// The admission checks that need the filesystem (see `admission`), on a batch that passed
/// validation: artifacts inside the state dir's worktrees, and agent tasks that could write in
/// the same checkout at once.
fn admit(input: &Input<'_>, batch: &Batch, ov: &Overrides, issues: &mut Issues) {
    let task_at = |i: usize| {
        input
            .tasks
            .get(i)
            .map_or((input.file, None), |t| (t.file.as_path(), t.line))
    };
    if let Some(state_dir) = &ov.state_dir {
        let worktrees = std::path::absolute(state_dir)
            .map(|d| clean(&d))
            .unwrap_or_else(|_| state_dir.clone())
            .join("worktrees");
        for (i, spec) in batch.tasks.iter().enumerate() {
            let Some(out) = &spec.output else { continue };
            if crate::admission::is_inside(Path::new(out), &worktrees) {
                let (file, task_line) = task_at(i);
                let line = input
                    .tasks
                    .get(i)
                    .and_then(|t| t.keys.get("output").copied().flatten())
                    .or(task_line);
                issues.add(
                    file,
                    line,
                    Some("output"),
                    format!(
                        "{out} is inside sortie's worktrees ({}); an artifact must live \
                         outside every worktree",
                        worktrees.display()
                    ),
                );
            }
        }
    }
    let allowed = ov
        .allow_shared_writes
        .or(input.run.allow_shared_writes)
        .unwrap_or(false);
    if allowed {
        return;
    }
    for c in crate::admission::shared_writes(batch) {
        let (file, line) = task_at(c.second);
        let (first_file, first_line) = task_at(c.first);
        let first_at = match first_line {
            Some(l) if first_file == file => format!(" (line {l})"),
            Some(l) => format!(" ({}:{l})", first_file.display()),
            None => String::new(),
        };
        issues.add(
            file,
            line,
            Some("isolation"),
            format!(
                "tasks {:?}{first_at} and {:?} may both write in {} at the same time; give \
                 one of them `isolation = \"worktree\"`, make one need the other, or set \
                 `allow_shared_writes = true` at the top of the batch file",
                batch.tasks[c.first].label,
                batch.tasks[c.second].label,
                c.checkout.display()
            ),
        );
    }
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

/// The agent of the most specific level that sets `agent` or `command`: the task, then the
/// `--agent` flag, then `[defaults]`; a level that sets `command` but no `agent` means the
/// `command` profile. None at all: `pi`.
fn resolve_agent(t: &RawTask, d: &RawTask, ov: &Overrides) -> String {
    if let Some(a) = &t.agent {
        a.clone()
    } else if t.command.is_some() {
        "command".into()
    } else if let Some(a) = &ov.agent {
        a.clone()
    } else if let Some(a) = &d.agent {
        a.clone()
    } else if d.command.is_some() {
        "command".into()
    } else {
        TaskSpec::new("", "").agent
    }
}

fn resolve_task(
    index: usize,
    t: &RawTask,
    d: &RawTask,
    ov: &Overrides,
    base: &str,
    agents: &Agents,
) -> (TaskSpec, Vec<(String, String)>) {
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
        retry_after_side_effects
    );
    s.deadline = pick(&t.deadline, &d.deadline);
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
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let layers = [agents.env.get(&s.agent), d.env.as_ref(), t.env.as_ref()];
    for layer in layers.into_iter().flatten() {
        env.extend(layer.iter().cloned());
    }
    s.env_keys = env.keys().cloned().collect();
    (s, env.into_iter().collect())
}

/// Where a validation error belongs: the task's own key, else the `[defaults]` key it came
/// from (naming the task), else the task's first line. None: a problem with the same field was
/// already reported while parsing, so this one would only repeat it.
fn locate(e: &SpecError, input: &Input<'_>, batch: &Batch, ov: &Overrides) -> Option<BatchIssue> {
    let run = &input.run;
    let issue = |file: &Path, line: Option<usize>, message: String| BatchIssue {
        file: file.to_path_buf(),
        line,
        field: Some(e.field.to_owned()),
        message,
    };
    let Some(i) = e.task else {
        return Some(match e.field {
            "concurrency" if ov.concurrency.is_some() => issue(
                input.file,
                None,
                format!("{} (from --concurrency)", e.message),
            ),
            "concurrency" => issue(&run.file, run.concurrency_line, e.message.clone()),
            _ => issue(input.file, None, e.message.clone()),
        });
    };
    let (t, spec) = (input.tasks.get(i)?, batch.tasks.get(i)?);
    let d = &run.defaults;
    let failed =
        |f: &str| t.failed.contains(f) || (!t.keys.contains_key(f) && d.failed.contains(f));
    let repeats = match e.field {
        "prompt" | "command" => failed("prompt") || failed("command"),
        "agent" => failed("agent") || run.agents.failed.contains(&spec.agent),
        f => failed(f),
    };
    if repeats {
        return None;
    }
    let foreign = |file: &Path, line: Option<usize>, from: &str| {
        issue(
            file,
            line,
            format!("task `{}`{from}: {}", spec.label, e.message),
        )
    };
    Some(if let Some(&line) = t.keys.get(e.field) {
        issue(&t.file, line, e.message.clone())
    } else if e.field == "agent" && t.keys.contains_key("command") {
        issue(
            &t.file,
            t.keys.get("command").copied().flatten(),
            e.message.clone(),
        )
    } else if e.field == "agent" && ov.agent.is_some() {
        foreign(input.file, None, " (agent from --agent)")
    } else if let Some(&line) = d.keys.get(e.field) {
        foreign(&d.file, line, "")
    } else {
        issue(&t.file, t.line, e.message.clone())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/batches")
            .join(name)
    }

    fn dir() -> String {
        fixture("")
            .to_string_lossy()
            .trim_end_matches('/')
            .to_owned()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Loads a file that must fail, and returns its issues as `(line, field)` and the text.
    type Located = Vec<(Option<usize>, Option<String>)>;

    fn issues(name: &str) -> (Located, String) {
        let err = load(&fixture(name), None, &Overrides::default()).unwrap_err();
        let located = err
            .issues()
            .iter()
            .map(|i| (i.line, i.field.clone()))
            .collect();
        (located, err.to_string())
    }

    /// Asserts that loading `name` fails with exactly one issue, on `line`, naming `field`, and
    /// that its text names the file, the line, the field and says `says`.
    fn check_one(name: &str, line: usize, field: Option<&str>, says: &str) {
        let (located, text) = issues(name);
        assert_eq!(
            located,
            vec![(Some(line), field.map(str::to_owned))],
            "{text}"
        );
        assert!(text.contains(&format!("{name}:{line}: ")), "{text}");
        if let Some(field) = field {
            assert!(text.contains(&format!("field `{field}`")), "{text}");
        }
        assert!(text.contains(says), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    #[test]
    fn batch_toml_resolves_every_field() {
        let loaded = load_toml(&fixture("full.toml"), &Overrides::default()).unwrap();
        let d = dir();
        let b = &loaded.batch;
        assert_eq!(b.source, format!("{d}/full.toml"));
        assert_eq!(
            b.config,
            RunConfig {
                concurrency: 8,
                fail_fast: true
            }
        );
        let demo = &b.agents["demo"];
        assert_eq!(demo.command[0], "python3");
        assert!(demo.model_args.is_empty());
        assert_eq!(demo.protocol, Protocol::Plain);
        assert_eq!(demo.env_keys, vec!["DEMO_KEY"]);
        assert!(!demo.can_steer && demo.can_continue && !demo.may_write);
        assert!(b.agents.contains_key("pi") && b.agents.contains_key("command"));

        let [a, second, third] = b.tasks.as_slice() else {
            panic!("three tasks expected: {b:?}");
        };
        let mut want = TaskSpec::new("a", format!("{d}/sub"));
        want.prompt = Some("first".into());
        want.agent = "claude".into();
        want.model = Some("big".into());
        want.fallback_models = vec!["m2".into(), "m3".into()];
        want.max_retries = 3;
        want.attempt_timeout = secs(90);
        want.deadline = Some(secs(7200));
        want.stall_after = secs(90);
        want.stall_kill_after = secs(30);
        want.kill_grace = secs(5);
        want.max_turns = Some(10);
        want.max_tokens = Some(100_000);
        want.max_cost_nanos = Some(2_500_000_000);
        want.grace_turns = 1;
        want.isolation = Isolation::Worktree;
        want.include_wip = true;
        want.output = Some(format!("{d}/out/a.md"));
        want.output_mode = OutputMode::FileOnly;
        // A task's max_output merges with the defaults' field by field.
        want.max_output = MaxOutput {
            bytes: 1000,
            lines: 100,
        };
        want.reads = vec![format!("{d}/x.md"), "/abs/y.md".into()];
        want.env_keys = vec!["OVERRIDDEN".into(), "SHARED".into(), "TASK_ONLY".into()];
        want.retry_after_side_effects = true;
        assert_eq!(a, &want);

        // Defaults apply; the label is task-N; the cwd is the batch file's directory.
        let mut want = TaskSpec::new("task-2", d.clone());
        want.prompt = Some("second: {previous}".into());
        want.agent = "demo".into();
        want.model = Some("small".into());
        want.max_retries = 1;
        want.attempt_timeout = secs(600);
        want.stall_after = secs(120);
        want.max_output = MaxOutput {
            bytes: 200 * 1024,
            lines: 100,
        };
        want.reads = vec![format!("{d}/docs/README.md")];
        want.needs = vec!["a".into()];
        want.env_keys = vec!["DEMO_KEY".into(), "OVERRIDDEN".into(), "SHARED".into()];
        assert_eq!(second, &want);

        // A task with `command` and no `agent` uses the `command` profile.
        assert_eq!(third.label, "task-3");
        assert_eq!(third.agent, "command");
        assert_eq!(third.command, Some(vec!["echo".into(), "hi".into()]));
        assert_eq!(third.env_keys, vec!["OVERRIDDEN", "SHARED"]);

        assert_eq!(
            loaded.env,
            vec![
                env(&[
                    ("OVERRIDDEN", "task"),
                    ("SHARED", "from-defaults"),
                    ("TASK_ONLY", "secret-task"),
                ]),
                env(&[
                    ("DEMO_KEY", "secret-demo"),
                    ("OVERRIDDEN", "defaults"),
                    ("SHARED", "from-defaults"),
                ]),
                env(&[("OVERRIDDEN", "defaults"), ("SHARED", "from-defaults")]),
            ]
        );
        for (t, e) in b.tasks.iter().zip(&loaded.env) {
            let names: Vec<&String> = e.iter().map(|(k, _)| k).collect();
            assert_eq!(t.env_keys.iter().collect::<Vec<_>>(), names);
        }
    }

    #[test]
    fn batch_env_values_never_enter_the_batch() {
        let loaded = load_toml(&fixture("full.toml"), &Overrides::default()).unwrap();
        let journaled = serde_json::to_string(&loaded.batch).unwrap();
        assert!(!journaled.contains("secret"), "{journaled}");
        let debug = format!("{loaded:?}");
        assert!(!debug.contains("secret"), "{debug}");
        assert!(debug.contains("TASK_ONLY"));
    }

    #[test]
    fn batch_flags_are_defaults_and_override_run_settings() {
        let flags = Overrides {
            concurrency: Some(2),
            fail_fast: Some(false),
            agent: Some("codex".into()),
            model: Some("flag-model".into()),
            ..Overrides::default()
        };
        let b = load_toml(&fixture("full.toml"), &flags).unwrap().batch;
        assert_eq!(
            b.config,
            RunConfig {
                concurrency: 2,
                fail_fast: false
            }
        );
        // The task's own agent and model win over the flags.
        assert_eq!(
            (b.tasks[0].agent.as_str(), b.tasks[0].model.as_deref()),
            ("claude", Some("big"))
        );
        // The flags win over [defaults].
        assert_eq!(
            (b.tasks[1].agent.as_str(), b.tasks[1].model.as_deref()),
            ("codex", Some("flag-model"))
        );
        // A task's own `command` still means the `command` profile.
        assert_eq!(b.tasks[2].agent, "command");
    }

    #[test]
    fn batch_digest_is_stable_and_follows_the_bytes() {
        let mut h = Fnv::default();
        h.write(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c, "FNV-1a 64 test vector");
        assert_eq!(Fnv::default().0, 0xcbf2_9ce4_8422_2325);
        let path = fixture("full.toml");
        let first = load_toml(&path, &Overrides::default()).unwrap().digest;
        let flags = Overrides {
            concurrency: Some(1),
            ..Overrides::default()
        };
        assert_eq!(load_toml(&path, &flags).unwrap().digest, first);
        assert_eq!(first, digest(&[&std::fs::read(&path).unwrap()]));
        assert_ne!(digest(&[b"ab", b""]), digest(&[b"a", b"b"]));
    }

    #[test]
    fn batch_jsonl_with_a_toml_defaults_file() {
        let loaded = load(
            &fixture("tasks.jsonl"),
            Some(&fixture("jsonl_defaults.toml")),
            &Overrides::default(),
        )
        .unwrap();
        let d = dir();
        let b = &loaded.batch;
        assert_eq!(b.config.concurrency, 2);
        let [one, two, three] = b.tasks.as_slice() else {
            panic!("three tasks expected: {b:?}");
        };
        assert_eq!(one.label, "one");
        assert_eq!(one.agent, "demo");
        assert_eq!(one.max_retries, 0);
        assert_eq!(one.attempt_timeout, secs(120));
        assert_eq!(one.max_cost_nanos, Some(1_000_000_000));
        // Labels count task lines, not file lines; null is the same as absent.
        assert_eq!(two.label, "task-2");
        assert_eq!(two.model, None);
        assert_eq!(two.attempt_timeout, secs(45));
        assert_eq!(two.needs, vec!["one"]);
        assert_eq!(three.agent, "command");
        let parent = Path::new(&d)
            .parent()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(three.cwd, format!("{d}/.."));
        assert!(three.cwd.starts_with(&parent));
        assert_eq!(three.output, Some(format!("{d}/out.md")));
        assert_eq!(
            loaded.env,
            vec![
                env(&[("DEMO", "p"), ("FROM_DEFAULTS", "d")]),
                env(&[("DEMO", "p"), ("FROM_DEFAULTS", "d"), ("TASK_KEY", "t")]),
                env(&[("FROM_DEFAULTS", "d")]),
            ]
        );
        let jsonl = std::fs::read(fixture("tasks.jsonl")).unwrap();
        let defaults = std::fs::read(fixture("jsonl_defaults.toml")).unwrap();
        assert_eq!(loaded.digest, digest(&[&jsonl, &defaults]));
    }

    #[test]
    fn batch_jsonl_with_a_json_defaults_file_and_flags() {
        let flags = Overrides {
            model: Some("m".into()),
            ..Overrides::default()
        };
        let b = load_jsonl(
            &fixture("tasks.jsonl"),
            Some(&fixture("jsonl_defaults.json")),
            &flags,
        )
        .unwrap()
        .batch;
        assert!(b.config.fail_fast);
        assert_eq!(b.config.concurrency, 4);
        assert_eq!(b.tasks[0].agent, "codex");
        assert_eq!(b.tasks[0].stall_after, secs(60));
        assert_eq!(b.tasks[0].model.as_deref(), Some("m"));
        let plain = load_jsonl(&fixture("tasks.jsonl"), None, &Overrides::default()).unwrap();
        assert_eq!(plain.batch.tasks[0].agent, "pi");
    }

    #[test]
    fn batch_error_malformed_toml() {
        check_one("malformed.toml", 3, None, "(column");
    }

    #[test]
    fn batch_error_unknown_field() {
        check_one(
            "unknown_field.toml",
            6,
            Some("max_retrys"),
            "unknown field; did you mean `max_retries`?",
        );
    }

    #[test]
    fn batch_error_wrong_type() {
        check_one(
            "wrong_type.toml",
            6,
            Some("max_retries"),
            "expected an integer, found a string",
        );
    }

    #[test]
    fn batch_error_duplicate_label() {
        check_one(
            "duplicate_label.toml",
            6,
            Some("label"),
            "duplicate label \"same\"",
        );
    }

    #[test]
    fn batch_error_needs_cycle() {
        check_one(
            "needs_cycle.toml",
            4,
            Some("needs"),
            "dependency cycle: a → b → a",
        );
    }

    #[test]
    fn batch_error_needs_unknown_label() {
        check_one(
            "needs_unknown.toml",
            8,
            Some("needs"),
            "unknown label \"ghost\"",
        );
    }

    #[test]
    fn batch_error_include_wip_without_worktree() {
        check_one("include_wip.toml", 3, Some("include_wip"), "worktree");
    }

    #[test]
    fn batch_error_file_only_without_output() {
        check_one(
            "file_only.toml",
            6,
            Some("output_mode"),
            "needs an `output` path",
        );
    }

    #[test]
    fn batch_error_duplicate_output_path() {
        check_one("duplicate_output.toml", 7, Some("output"), "out/result.md");
    }

    #[test]
    fn batch_error_shared_writes_name_both_tasks_and_can_be_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let text = "concurrency = 2\n\n[[tasks]]\nlabel = \"a\"\nprompt = \"x\"\n\n\
                    [[tasks]]\nlabel = \"b\"\nprompt = \"y\"\n";
        let path = dir.path().join("w.toml");
        std::fs::write(&path, text).unwrap();
        let err = load(&path, None, &Overrides::default()).unwrap_err();
        let text_err = err.to_string();
        assert_eq!(err.issues().len(), 1, "{text_err}");
        assert!(
            text_err.starts_with(&format!(
                "{}:7: field `isolation`: tasks \"a\" (line 3) and \"b\" may both write in",
                path.display()
            )),
            "{text_err}"
        );
        let allowed = Overrides {
            allow_shared_writes: Some(true),
            ..Overrides::default()
        };
        assert!(load(&path, None, &allowed).is_ok());
        std::fs::write(&path, format!("allow_shared_writes = true\n{text}")).unwrap();
        assert!(load(&path, None, &Overrides::default()).is_ok());
        let serial = Overrides {
            concurrency: Some(1),
            ..Overrides::default()
        };
        std::fs::write(&path, text).unwrap();
        assert!(load(&path, None, &serial).is_ok());
    }

    #[test]
    fn batch_error_output_inside_the_worktrees() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.toml");
        std::fs::write(
            &path,
            "[[tasks]]\nprompt = \"x\"\noutput = \"st/worktrees/r/x/out.md\"\n",
        )
        .unwrap();
        let with_state = Overrides {
            state_dir: Some(dir.path().join("st")),
            ..Overrides::default()
        };
        let err = load(&path, None, &with_state).unwrap_err();
        assert_eq!(
            err.issues()
                .iter()
                .map(|i| (i.line, i.field.as_deref()))
                .collect::<Vec<_>>(),
            vec![(Some(3), Some("output"))],
            "{err}"
        );
        assert!(
            err.to_string().contains("inside sortie's worktrees"),
            "{err}"
        );
        assert!(load(&path, None, &Overrides::default()).is_ok());
    }

    #[test]
    fn batch_error_unknown_agent() {
        check_one(
            "unknown_agent.toml",
            6,
            Some("agent"),
            "unknown agent profile \"ghost\"",
        );
    }

    #[test]
    fn batch_error_unknown_protocol() {
        check_one(
            "unknown_protocol.toml",
            3,
            Some("agents.mine.protocol"),
            "unknown protocol \"xml\"",
        );
    }

    #[test]
    fn batch_error_bad_duration() {
        check_one(
            "bad_duration.toml",
            3,
            Some("attempt_timeout"),
            "invalid duration \"ten minutes\"",
        );
    }

    #[test]
    fn batch_error_from_defaults_names_the_defaults_line_and_the_task() {
        check_one(
            "defaults_blame.toml",
            2,
            Some("output_mode"),
            "task `no-output`: `file-only` needs an `output` path",
        );
    }

    #[test]
    fn batch_error_reports_every_problem_in_file_order() {
        let (located, text) = issues("many_errors.toml");
        let want: Located = [
            (2, "concurrency"),
            (3, "colour"),
            (6, "kill_grace"),
            (8, "agents.half.command"),
            (14, "max_retries"),
            (15, "isolation"),
            (18, "label"),
            (20, "needs"),
            (21, "max_output.bytes"),
            (21, "max_output.rows"),
            (23, "prompt"),
            (24, "env.BAD"),
        ]
        .iter()
        .map(|(l, f)| (Some(*l), Some((*f).to_owned())))
        .collect();
        assert_eq!(located, want, "{text}");
        assert_eq!(text.lines().count(), want.len());
        assert!(
            text.lines()
                .all(|l| l.contains("many_errors.toml:") && l.contains("field `"))
        );
    }

    #[test]
    fn batch_error_jsonl_names_each_line() {
        let (located, text) = issues("bad.jsonl");
        assert_eq!(
            located,
            vec![
                (Some(2), Some("promt".to_owned())),
                (Some(2), Some("prompt".to_owned())),
                (Some(3), Some("max_turns".to_owned())),
                (Some(4), None),
                (Some(5), None),
                (Some(6), Some("label".to_owned())),
            ],
            "{text}"
        );
        assert!(text.contains("bad.jsonl:2: field `promt`: unknown field; did you mean `prompt`?"));
        assert!(text.contains("bad.jsonl:4: invalid JSON: EOF while parsing a value (column 30)"));
        assert!(
            text.contains(
                "bad.jsonl:5: expected a JSON object (one task per line), found an array"
            )
        );
        assert!(text.contains("bad.jsonl:6: field `label`: duplicate label \"ok\""));
    }

    #[test]
    fn batch_error_jsonl_garbage_bytes_never_panic() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("garbage.jsonl");
        let mut bytes = b"{\"prompt\": \"ok\"}\n".to_vec();
        bytes.extend([0xff, 0xfe, 0x00, 0x9f, b'\n']);
        bytes.extend(b"\x00\x01\x02 binary\n{\"prompt\": \"\xe2\x82\"}\n\x1b[31m\n");
        std::fs::write(&path, &bytes).unwrap();
        let err = load(&path, None, &Overrides::default()).unwrap_err();
        let lines: Vec<Option<usize>> = err.issues().iter().map(|i| i.line).collect();
        assert_eq!(lines, vec![Some(2), Some(3), Some(4), Some(5)], "{err}");
        assert!(
            err.to_string().contains("garbage.jsonl:2: not valid UTF-8"),
            "{err}"
        );
        // Every byte value on its own, and some random-ish noise: an error, never a panic.
        for b in 0..=255u8 {
            std::fs::write(&path, [b, b'\n', b'{', b]).unwrap();
            let _ = load(&path, None, &Overrides::default());
        }
    }

    #[test]
    fn batch_error_toml_not_utf8_and_datetime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("latin1.toml");
        std::fs::write(&path, b"[[tasks]]\nprompt = \"caf\xe9\"\n").unwrap();
        let err = load(&path, None, &Overrides::default()).unwrap_err();
        assert!(
            err.to_string().contains("latin1.toml:2: not valid UTF-8"),
            "{err}"
        );
        let path = dir.path().join("date.toml");
        std::fs::write(&path, "[[tasks]]\nprompt = \"a\"\ndeadline = 2026-01-01\n").unwrap();
        let err = load(&path, None, &Overrides::default()).unwrap_err();
        assert!(
            err.to_string().contains("date.toml:3: a date or time"),
            "{err}"
        );
    }

    #[test]
    fn batch_error_io_names_the_path() {
        let err = load(&fixture("missing.toml"), None, &Overrides::default()).unwrap_err();
        assert!(matches!(err, BatchError::Io { .. }));
        assert!(err.to_string().contains("missing.toml"));
        let err = load(
            &fixture("full.toml"),
            Some(&fixture("jsonl_defaults.toml")),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("jsonl_defaults.toml: a defaults file goes with")
        );
    }

    #[test]
    fn batch_error_empty_batch_and_concurrency_zero() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.toml");
        std::fs::write(&path, "# nothing\nconcurrency = 0\n").unwrap();
        let err = load(&path, None, &Overrides::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("empty.toml: field `tasks`: the batch has no tasks"),
            "{text}"
        );
        assert!(
            text.contains("empty.toml:2: field `concurrency`: must be at least 1"),
            "{text}"
        );
    }

    #[test]
    fn batch_one_off_prompt() {
        let flags = Overrides {
            agent: Some("codex".into()),
            model: Some("flag".into()),
            concurrency: Some(3),
            ..Overrides::default()
        };
        let loaded = one_off_prompt(
            "fix it",
            Some("claude"),
            None,
            Path::new("/tmp/x/./y"),
            &flags,
        )
        .unwrap();
        let t = &loaded.batch.tasks[0];
        assert_eq!(loaded.batch.tasks.len(), 1);
        assert_eq!((t.label.as_str(), t.agent.as_str()), ("task-1", "claude"));
        assert_eq!(t.model.as_deref(), Some("flag"));
        assert_eq!(t.prompt.as_deref(), Some("fix it"));
        assert_eq!(t.cwd, "/tmp/x/y");
        assert_eq!(loaded.batch.config.concurrency, 3);
        assert_eq!(loaded.batch.source, "prompt: fix it");
        let other = one_off_prompt("fix it", Some("pi"), None, Path::new("/tmp"), &flags).unwrap();
        assert_ne!(loaded.digest, other.digest);

        let relative = one_off_prompt("p", None, None, Path::new("sub"), &flags).unwrap();
        let t = &relative.batch.tasks[0];
        assert_eq!(t.agent, "codex");
        let cwd = std::env::current_dir().unwrap().join("sub");
        assert_eq!(t.cwd, cwd.to_string_lossy());

        let err = one_off_prompt("p", Some("ghost"), None, Path::new("/"), &flags).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<command line>: field `agent`: unknown agent profile \"ghost\""
        );
        let ghost = Overrides {
            agent: Some("ghost".into()),
            ..Overrides::default()
        };
        let err = one_off_prompt("p", None, None, Path::new("/"), &ghost).unwrap_err();
        assert!(err.to_string().contains("(agent from --agent)"), "{err}");
    }

    #[test]
    fn batch_one_off_command() {
        let argv: Vec<String> = vec!["echo".into(), "hello world".into()];
        let loaded = one_off_command(&argv, Path::new("/tmp"), &Overrides::default()).unwrap();
        let t = &loaded.batch.tasks[0];
        assert_eq!(t.agent, "command");
        assert_eq!(t.command.as_ref(), Some(&argv));
        assert_eq!(t.prompt, None);
        assert_eq!(loaded.batch.source, "command: echo hello world");
        assert_eq!(loaded.env, vec![Vec::new()]);
        let err = one_off_command(&[], Path::new("/tmp"), &Overrides::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<command line>: field `command`: must not be empty"
        );
    }

    #[test]
    fn batch_toml_inline_tasks_and_suggestions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inline.toml");
        std::fs::write(
            &path,
            "tasks = [\n  { prompt = \"a\" },\n  { prompt = \"b\", outptu = \"x\" },\n]\n",
        )
        .unwrap();
        let err = load(&path, None, &Overrides::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}:3: field `outptu`: unknown field; did you mean `output`?",
                path.display()
            )
        );
        assert_eq!(
            suggest("Max-Retries", TASK_FIELDS),
            "; did you mean `max_retries`?"
        );
        assert_eq!(suggest("zzz", TASK_FIELDS), "");
    }

    #[test]
    fn batch_error_defaults_file_problems_name_the_defaults_file() {
        let dir = tempfile::tempdir().unwrap();
        let defaults = dir.path().join("defaults.toml");
        std::fs::write(
            &defaults,
            "[defaults]\nmax_retries = 1\n\n[[tasks]]\nprompt = \"x\"\n",
        )
        .unwrap();
        let json = dir.path().join("defaults.json");
        std::fs::write(&json, "{\"defaults\": {\"stall_after\": true}}").unwrap();
        let batch = dir.path().join("b.ndjson");
        std::fs::write(&batch, "{\"prompt\": \"a\", \"max_retries\": 1.5}\n").unwrap();
        let err = load(&batch, Some(&defaults), &Overrides::default()).unwrap_err();
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].ends_with(
                "defaults.toml:4: field `tasks`: tasks belong in the JSON Lines file, one per line"
            ),
            "{text}"
        );
        assert!(
            lines[1]
                .ends_with("b.ndjson:1: field `max_retries`: expected an integer, found a float"),
            "{text}"
        );
        let err = load(&batch, Some(&json), &Overrides::default()).unwrap_err();
        assert!(
            err.to_string().contains(
                "defaults.json: field `stall_after`: expected a duration, found a boolean"
            ),
            "{err}"
        );
    }
}

//! The entry points: a batch file by its extension (TOML, JSON Lines with its defaults file),
//! a one-off prompt or command; and the input's digest.

use std::path::{Component, Path, PathBuf};

use sortie_core::digest::fnv1a;

use crate::document::{
    RunDoc, jsonl_task_lines, parse_defaults_file, parse_jsonl_tasks, parse_toml_doc,
};
use crate::error::{BatchError, BatchIssue, Issues};
use crate::expand::expand;
use crate::fields::RawTask;
use crate::resolve::{Input, resolve};
use crate::{COMMAND_LINE, LoadedBatch, Overrides};

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

pub(crate) fn is_jsonl(path: &Path) -> bool {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    matches!(ext.as_deref(), Some("jsonl" | "ndjson"))
}

/// Loads a TOML batch: run settings, `[defaults]`, `[agents.NAME]` and `[[tasks]]`.
pub fn load_toml(path: &Path, overrides: &Overrides) -> Result<LoadedBatch, BatchError> {
    match toml_input(path, overrides)? {
        (Some(input), issues) => resolve(input, overrides, issues),
        (None, issues) => Err(issues.into_error(&[path])),
    }
}

/// A TOML batch parsed, its tasks expanded and resolved, not yet validated. None: it is not
/// TOML at all.
pub(crate) fn toml_input<'a>(
    path: &'a Path,
    overrides: &Overrides,
) -> Result<(Option<Input<'a>>, Issues), BatchError> {
    let bytes = read(path)?;
    let (source, base) = locate_file(path)?;
    let mut issues = Issues::default();
    let Some(mut run) = parse_toml_doc(path, &bytes, true, &mut issues) else {
        return Ok((None, issues));
    };
    let tasks = std::mem::take(&mut run.tasks);
    let digest = digest(&[&bytes]);
    let mut input = Input::new(path, None, source, base, run, digest, &mut issues);
    input.reserve(tasks.len());
    for t in tasks {
        input.add(t, overrides, &mut issues);
    }
    Ok((Some(input), issues))
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
    match jsonl_input(path, defaults, overrides)? {
        (Some(input), issues) => resolve(input, overrides, issues),
        (None, issues) => {
            let order: Vec<&Path> = defaults.into_iter().chain([path]).collect();
            Err(issues.into_error(&order))
        }
    }
}

/// A JSON Lines batch (and its defaults file) parsed, each task expanded and resolved as it is
/// read, not yet validated. None: the defaults file could not be read as a document (the tasks
/// are still read, for their own issues).
pub(crate) fn jsonl_input<'a>(
    path: &'a Path,
    defaults: Option<&'a Path>,
    overrides: &Overrides,
) -> Result<(Option<Input<'a>>, Issues), BatchError> {
    let bytes = read(path)?;
    let defaults_bytes = defaults.map(read).transpose()?;
    let (source, base) = locate_file(path)?;
    let mut issues = Issues::default();
    let run = match (defaults, &defaults_bytes) {
        (Some(d), Some(db)) => parse_defaults_file(d, db, &mut issues),
        _ => Some(RunDoc::new(path)),
    };
    let Some(run) = run else {
        let mut drop_it = |_, _: &mut Issues| {};
        parse_jsonl_tasks(path, &bytes, &mut issues, &mut |t, issues| {
            expand(t, &base, issues, &mut drop_it);
        });
        return Ok((None, issues));
    };
    let mut parts: Vec<&[u8]> = vec![&bytes];
    if let Some(db) = &defaults_bytes {
        parts.push(db);
    }
    let digest = digest(&parts);
    let mut input = Input::new(path, defaults, source, base, run, digest, &mut issues);
    input.reserve(jsonl_task_lines(&bytes));
    parse_jsonl_tasks(path, &bytes, &mut issues, &mut |t, issues| {
        input.add(t, overrides, issues);
    });
    Ok((Some(input), issues))
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
    let mut issues = Issues::default();
    let run = RunDoc::new(file);
    let mut input = Input::new(file, None, source, clean(&base), run, digest, &mut issues);
    input.add(task, overrides, &mut issues);
    resolve(input, overrides, issues)
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
    let limit = sortie_core::bounds::input_limits::BATCH_FILE;
    crate::read::read_limited(path, "a batch file", limit).map_err(|source| BatchError::Io {
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
pub(crate) fn clean(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

/// FNV-1a 64 over each part's length (8 bytes, little endian) and bytes: the parts one after
/// another, so `["ab", ""]` and `["a", "b"]` differ.
pub(crate) fn digest(parts: &[&[u8]]) -> u64 {
    let len: usize = parts.iter().map(|p| 8 + p.len()).sum();
    let mut bytes = Vec::with_capacity(len);
    for part in parts {
        bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
        bytes.extend_from_slice(part);
    }
    fnv1a(&bytes)
}

//! `sortie check`'s view of a batch: every issue `load` would report, and the batch resolved
//! as far as it goes even when there are some, so that the checks that need more than the
//! file (the runner's preflight: binaries, credentials, directories, repositories) can look at
//! it too and place what they find at the file, line and field of the task.

use std::path::{Path, PathBuf};

use crate::error::{BatchError, BatchIssue, Issues};
use crate::load::{is_jsonl, jsonl_input, toml_input};
use crate::resolve::{Input, resolve_all};
use crate::{LoadedBatch, Overrides};

/// A batch as `sortie check` sees it.
pub struct Checked {
    /// The batch, resolved as far as it goes (tasks whose template failed to expand are left
    /// out); None when the file could not be read as a batch at all.
    pub loaded: Option<LoadedBatch>,
    issues: Vec<BatchIssue>,
    sites: Vec<Sites>,
    order: Vec<PathBuf>,
    /// #13: the roles the tasks use and where each came from.
    roles: Vec<crate::RoleUse>,
    /// #33: the `needs` patterns and the labels each matched.
    patterns: Vec<crate::PatternUse>,
}

/// Where a task's fields were written.
struct Sites {
    file: PathBuf,
    line: Option<usize>,
    keys: crate::fields::FieldLines,
    defaults_file: PathBuf,
    defaults: crate::fields::FieldLines,
}

/// Loads `path` as `run` would, keeping every issue and the batch as far as it resolves.
/// Err: a file could not be read.
pub fn load_for_check(
    path: &Path,
    defaults: Option<&Path>,
    overrides: &Overrides,
) -> Result<Checked, BatchError> {
    let (input, issues) = if is_jsonl(path) {
        jsonl_input(path, defaults, overrides)?
    } else if let Some(d) = defaults {
        let mut issues = Issues::default();
        issues.add(
            d,
            None,
            None,
            "a defaults file goes with a JSON Lines batch; a TOML batch has its own [defaults]",
        );
        (None, issues)
    } else {
        toml_input(path, overrides)?
    };
    let order: Vec<PathBuf> = defaults
        .into_iter()
        .chain([path])
        .map(Path::to_path_buf)
        .collect();
    let Some(input) = input else {
        return Ok(Checked {
            loaded: None,
            issues: issues.0,
            sites: Vec::new(),
            order,
            roles: Vec::new(),
            patterns: Vec::new(),
        });
    };
    let sites = sites(&input);
    let (loaded, issues, resolved) = resolve_all(input, overrides, issues);
    Ok(Checked {
        loaded,
        issues: issues.0,
        sites,
        order,
        roles: resolved.roles,
        patterns: resolved.patterns,
    })
}

fn sites(input: &Input<'_>) -> Vec<Sites> {
    let d = &input.run.defaults;
    input
        .tasks
        .iter()
        .map(|t| Sites {
            file: t.file.clone(),
            line: t.line,
            keys: t.keys.clone(),
            defaults_file: d.file.clone(),
            defaults: d.keys.clone(),
        })
        .collect()
}

impl Checked {
    /// An issue about task `task`'s `field`, at the line of the layer that gave the field
    /// (the task's own key, else `[defaults]`, else the task's first line), its message
    /// naming the task.
    pub fn issue(&self, task: usize, field: &str, message: impl std::fmt::Display) -> BatchIssue {
        let label = self
            .loaded
            .as_ref()
            .and_then(|l| l.batch.tasks.get(task))
            .map_or_else(|| format!("{}", task + 1), |t| t.label.clone());
        let (file, line) = match self.sites.get(task) {
            Some(s) => match (s.keys.get(field), s.defaults.get(field)) {
                (Some(line), _) => (s.file.clone(), *line),
                (None, Some(line)) => (s.defaults_file.clone(), *line),
                (None, None) => (s.file.clone(), s.line),
            },
            None => (self.order.last().cloned().unwrap_or_default(), None),
        };
        BatchIssue {
            file,
            line,
            field: Some(field.to_owned()),
            message: format!("task `{label}`: {message}"),
        }
    }

    /// The roles the tasks use (#13): each with its file (None: built in) and its tasks.
    pub fn roles(&self) -> &[crate::RoleUse] {
        &self.roles
    }

    /// The `needs` patterns of the batch (#33): each with the labels it matched and the tasks
    /// that need it.
    pub fn patterns(&self) -> &[crate::PatternUse] {
        &self.patterns
    }

    /// Adds an issue found beyond the file.
    pub fn push(&mut self, issue: BatchIssue) {
        self.issues.push(issue);
    }

    /// Every issue, in file order (the defaults file first, then by line), each once.
    pub fn issues(&self) -> Vec<BatchIssue> {
        let rank = |f: &Path| {
            self.order
                .iter()
                .position(|o| o == f)
                .unwrap_or(self.order.len())
        };
        let mut out = self.issues.clone();
        out.sort_by_key(|i| (rank(&i.file), i.line.unwrap_or(0)));
        out.dedup();
        out
    }
}

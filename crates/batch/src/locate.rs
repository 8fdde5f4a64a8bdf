//! Where a validation error belongs. Core's `validate_batch` names a task (or the run) and a
//! field; the issue goes to the line of the layer that gave the field, in the order resolution
//! takes the layers: the task's own key, then (for `agent`) its `command` and the `--agent`
//! flag, then `[defaults]` (naming the task), else the task's own line.
//!
//! An error whose check read a field that did not parse is dropped: that field's own issue is
//! reported already, and the check saw the default put in its place, not what the user wrote
//! (core says which fields each check read, `SpecError::reads`).

use std::path::Path;

use sortie_core::{Batch, SpecError};

use crate::Overrides;
use crate::error::BatchIssue;
use crate::fields::Written;
use crate::resolve::{AgentFrom, Input, agent_from};

/// The located issue for a validation error. None: the error follows from a problem already
/// reported.
pub(crate) fn issue(
    e: &SpecError,
    input: &Input<'_>,
    batch: &Batch,
    ov: &Overrides,
) -> Option<BatchIssue> {
    let issue = |file: &Path, line: Option<usize>, message: String| BatchIssue {
        file: file.to_path_buf(),
        line,
        field: Some(e.field.to_owned()),
        message,
    };
    let Some(i) = e.task else {
        let run = &input.run;
        return Some(match e.field {
            "concurrency" if ov.concurrency.is_some() => issue(
                input.file,
                None,
                format!("{} (from --concurrency)", e.message),
            ),
            "concurrency" => issue(&run.file, run.concurrency_line, e.message.clone()),
            f if f.starts_with("budget.") => {
                // Not written: the check saw a default (a value that did not parse is reported
                // already).
                let line = *run.budget_lines.get(f)?;
                issue(&run.file, line, e.message.clone())
            }
            _ => issue(input.file, None, e.message.clone()),
        });
    };
    let (task, spec) = (input.tasks.get(i)?, batch.tasks.get(i)?);
    let defaults = input.run.defaults.written();
    let layers = Layers {
        task,
        defaults: &defaults,
        ov,
        profile_failed: input.run.agents.failed.contains(&spec.agent),
    };
    if !e.reads.iter().all(|f| layers.site(f).readable) {
        return None;
    }
    let site = layers.site(e.field);
    let label = &spec.label;
    let e = &expanded_from(e, task);
    Some(match site.from {
        From::Task => issue(site.file, site.line, e.message.clone()),
        From::Defaults => issue(
            site.file,
            site.line,
            format!("task `{label}`: {}", e.message),
        ),
        From::AgentFlag => issue(
            input.file,
            None,
            format!("task `{label}` (agent from --agent): {}", e.message),
        ),
    })
}

/// The layers a task's fields come from.
struct Layers<'a> {
    task: &'a Written,
    defaults: &'a Written,
    ov: &'a Overrides,
    /// Whether the task's agent profile had a problem (reported with the profile).
    profile_failed: bool,
}

/// Which layer gave a field.
enum From {
    /// The task itself (its key, or its first line when no layer gave the field).
    Task,
    /// `[defaults]`.
    Defaults,
    /// The `--agent` flag.
    AgentFlag,
}

/// Where a field was given, and whether it parsed.
struct Site<'a> {
    file: &'a Path,
    line: Option<usize>,
    from: From,
    readable: bool,
}

impl Layers<'_> {
    fn site(&self, field: &str) -> Site<'_> {
        let (t, d) = (self.task, self.defaults);
        let key = |layer: &Written, key: &str| layer.keys.get(key).copied().flatten();
        let own = |k: &str| Site {
            file: &t.file,
            line: key(t, k),
            from: From::Task,
            readable: !t.failed.contains(k),
        };
        let default = |k: &str| Site {
            file: &d.file,
            line: key(d, k),
            from: From::Defaults,
            readable: !d.failed.contains(k),
        };
        let task_line = Site {
            file: &t.file,
            line: t.line,
            from: From::Task,
            readable: true,
        };
        if field == "agent" {
            let written = |layer: &Written, k: &str| layer.keys.contains_key(k);
            let mut site = match agent_from(t, d, self.ov, written) {
                AgentFrom::Task => own("agent"),
                AgentFrom::TaskCommand => own("command"),
                AgentFrom::Flag => Site {
                    from: From::AgentFlag,
                    ..task_line
                },
                AgentFrom::Defaults => default("agent"),
                AgentFrom::DefaultsCommand => default("command"),
                AgentFrom::Builtin => task_line,
            };
            site.readable &= !self.profile_failed;
            site
        } else if t.keys.contains_key(field) {
            own(field)
        } else if d.keys.contains_key(field) {
            default(field)
        } else {
            task_line
        }
    }
}

/// The error with the expansion a task came from (its item and sample) named after it, so
/// that two expanded tasks that collide say which of the template's tasks they are.
fn expanded_from(e: &SpecError, task: &Written) -> SpecError {
    let mut e = e.clone();
    if let Some(o) = &task.expanded {
        let from = match &o.item {
            Some(item) => format!("item {item:?}, sample {}", o.sample),
            None => format!("sample {}", o.sample),
        };
        e.message = format!("{} ({from})", e.message);
    }
    e
}

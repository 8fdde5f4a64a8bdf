//! `sortie check BATCH`: every problem `run` would refuse the batch for, and the runner's
//! preflight on what resolved (programs, credentials, directories, repositories, artifact
//! directories, prompt sizes), all at once. Nothing is spawned (but `git rev-parse`) and
//! nothing written: no run is created. The same problem of many tasks of one template is one
//! line naming the tasks.

use std::collections::BTreeMap;
use std::io::Write;

use sortie_batch::{BatchIssue, load_for_check};

use super::{Code, block_on};
use crate::args::{CheckArgs, Global};
use crate::error::Result;

/// `sortie check`.
pub(crate) fn check(g: &Global, args: &CheckArgs) -> Result<Code> {
    let overrides = args.overrides(g);
    let mut checked = load_for_check(&args.batch, args.defaults.as_deref(), &overrides)?;
    let mut tasks = 0;
    let mut sandbox = None;
    let mut reached = Vec::new();
    if let Some(loaded) = &checked.loaded {
        tasks = loaded.batch.tasks.len();
        // #34: whether this machine can sandbox, and what each sandboxed task may do.
        sandbox = sortie_runner::preflight::sandbox_report(&loaded.batch);
        // #36: what each cluster the tasks use says of itself (a Ray head's version).
        reached = block_on(sortie_runner::executor::reached(&loaded.batch.tasks))?;
        let findings = block_on(sortie_runner::preflight::check(&loaded.batch, &loaded.env))?;
        let issues: Vec<BatchIssue> = findings
            .iter()
            .map(|f| checked.issue(f.task, f.field, &f.message))
            .collect();
        for i in issues {
            checked.push(i);
        }
    }
    let problems = grouped(checked.issues());
    let file = args.batch.display();
    let mut out = std::io::stdout().lock();
    if g.json {
        let list: Vec<serde_json::Value> = problems
            .iter()
            .map(|(i, tasks)| {
                serde_json::json!({
                    "file": i.file.display().to_string(),
                    "line": i.line,
                    "field": i.field,
                    "message": i.message,
                    "tasks": tasks,
                })
            })
            .collect();
        let mut v = serde_json::json!({ "ok": list.is_empty(), "tasks": tasks, "problems": list });
        // #13: where each role came from.
        v["roles"] = checked
            .roles()
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "file": r.file.as_ref().map(|f| f.display().to_string()),
                    "tasks": r.tasks,
                })
            })
            .collect();
        // #33: what each `needs` pattern matched.
        v["needs_patterns"] = checked
            .patterns()
            .iter()
            .map(|p| {
                serde_json::json!({
                    "pattern": p.pattern,
                    "matched": p.matched,
                    "tasks": p.tasks,
                })
            })
            .collect();
        if let Some(r) = &sandbox {
            v["sandbox"] = sandbox_json(r);
        }
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else if problems.is_empty() {
        for line in &reached {
            writeln!(out, "{line}")?;
        }
        write_sandbox(&mut out, sandbox.as_ref())?;
        write_roles(&mut out, checked.roles())?;
        write_patterns(&mut out, checked.patterns())?;
        writeln!(
            out,
            "{file}: {tasks} task{} ready to run; no problem found",
            if tasks == 1 { "" } else { "s" }
        )?;
    } else {
        for (i, _) in &problems {
            writeln!(out, "{i}")?;
        }
        write_sandbox(&mut out, sandbox.as_ref())?;
        write_roles(&mut out, checked.roles())?;
        write_patterns(&mut out, checked.patterns())?;
        writeln!(
            out,
            "{file}: {} problem{}; nothing was run",
            problems.len(),
            if problems.len() == 1 { "" } else { "s" }
        )?;
    }
    Ok(if problems.is_empty() {
        Code::Ok
    } else {
        Code::Usage
    })
}

/// #34: the sandbox in `--json`: the machine (`ok`, `landlock_abi` or `reason`) and each
/// sandboxed task's own paths and hosts.
fn sandbox_json(r: &sortie_runner::preflight::SandboxReport) -> serde_json::Value {
    let machine = match &r.machine {
        Ok(abi) => serde_json::json!({
            "ok": true,
            "landlock_abi": abi,
            "user_namespaces": true,
        }),
        Err(why) => serde_json::json!({ "ok": false, "reason": why }),
    };
    let tasks: Vec<serde_json::Value> = r
        .tasks
        .iter()
        .map(|t| {
            serde_json::json!({
                "label": t.label,
                "sandbox_write": t.write,
                "sandbox_read": t.read,
                "sandbox_hosts": t.hosts,
                "network": if t.hosts.is_empty() { "loopback" } else { "forwarded" },
            })
        })
        .collect();
    serde_json::json!({ "machine": machine, "tasks": tasks })
}

/// #34: the sandbox in text, when a task is sandboxed: whether this machine can, and what each
/// sandboxed task may do beyond its workspace (docs/sandbox.md).
fn write_sandbox(
    out: &mut impl Write,
    report: Option<&sortie_runner::preflight::SandboxReport>,
) -> std::io::Result<()> {
    let Some(r) = report else {
        return Ok(());
    };
    match &r.machine {
        Ok(abi) => writeln!(
            out,
            "sandbox: this machine can sandbox (Landlock ABI {abi} or later, user and network \
             namespaces)"
        )?,
        Err(why) => writeln!(out, "sandbox: this machine cannot sandbox: {why}")?,
    }
    let list = |l: &[String]| {
        if l.is_empty() {
            String::new()
        } else {
            format!(" and {}", l.join(", "))
        }
    };
    for t in &r.tasks {
        let network = if t.hosts.is_empty() {
            "loopback only".to_owned()
        } else {
            format!("loopback and {}, forwarded by name", t.hosts.join(", "))
        };
        writeln!(
            out,
            "sandbox {}: writes its working directory, agent home and TMPDIR{}; reads the \
             system and its agent's install{}; network: {}",
            crate::text::printable(&t.label),
            list(&t.write),
            list(&t.read),
            crate::text::printable(&network),
        )?;
    }
    Ok(())
}

/// One line per role the tasks use (#13): `role reviewer: .claude/agents/reviewer.md (tasks a,
/// b)`, or `built-in` for a built-in role.
fn write_roles(out: &mut impl Write, roles: &[sortie_batch::RoleUse]) -> std::io::Result<()> {
    for r in roles {
        let from = r
            .file
            .as_ref()
            .map_or_else(|| "built-in".to_owned(), |f| f.display().to_string());
        writeln!(out, "role {}: {from}{}", r.name, of_tasks(&r.tasks))?;
    }
    Ok(())
}

/// ` (task a)`, ` (tasks a, b)`, the first five and how many more; nothing for none.
fn of_tasks(tasks: &[String]) -> String {
    match tasks.len() {
        0 => String::new(),
        1 => format!(" (task {})", crate::text::printable(&tasks[0])),
        _ => format!(" (tasks {})", few(tasks)),
    }
}

/// The first five labels, and how many more (each label made printable: the batch wrote it).
fn few(labels: &[String]) -> String {
    let shown = |ls: &[String]| {
        ls.iter()
            .map(|l| crate::text::printable(l))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match labels.get(..5) {
        Some(first) if labels.len() > 5 => {
            format!("{}, and {} more", shown(first), labels.len() - 5)
        }
        _ => shown(labels),
    }
}

/// One line per `needs` pattern (#33): `needs "s-*": s-1, s-2, s-3 (task judge)`; a pattern
/// that matched nothing is a problem, listed above.
fn write_patterns(
    out: &mut impl Write,
    patterns: &[sortie_batch::PatternUse],
) -> std::io::Result<()> {
    for p in patterns.iter().filter(|p| !p.matched.is_empty()) {
        writeln!(
            out,
            "needs {:?}: {}{}",
            p.pattern,
            few(&p.matched),
            of_tasks(&p.tasks)
        )?;
    }
    Ok(())
}

/// The issues, those that differ only by the task they name (`task `x`: ...`) made one that
/// names the tasks (`tasks `a`, `b`: ...`, the first five and how many more), with the labels.
fn grouped(issues: Vec<BatchIssue>) -> Vec<(BatchIssue, Vec<String>)> {
    let mut order: Vec<(BatchIssue, Vec<String>)> = Vec::new();
    let mut index: BTreeMap<(String, Option<usize>, Option<String>, String), usize> =
        BTreeMap::new();
    for issue in issues {
        let (label, rest) = split_task(&issue.message);
        let key = (
            issue.file.display().to_string(),
            issue.line,
            issue.field.clone(),
            rest.to_owned(),
        );
        match (label, index.get(&key)) {
            (Some(l), Some(&at)) => order[at].1.push(l.to_owned()),
            (Some(l), None) => {
                index.insert(key, order.len());
                order.push((issue.clone(), vec![l.to_owned()]));
            }
            (None, _) => order.push((issue, Vec::new())),
        }
    }
    for (issue, labels) in &mut order {
        if labels.len() > 1 {
            let (_, rest) = split_task(&issue.message);
            let shown: Vec<String> = labels.iter().take(5).map(|l| format!("`{l}`")).collect();
            let more = match labels.len().saturating_sub(5) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            issue.message = format!("tasks {}{more}: {rest}", shown.join(", "));
        }
    }
    order
}

/// `task `x`: rest` → (`x`, `rest`).
fn split_task(message: &str) -> (Option<&str>, &str) {
    message
        .strip_prefix("task `")
        .and_then(|r| r.split_once("`: "))
        .map_or((None, message), |(l, rest)| (Some(l), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issue(line: usize, message: &str) -> BatchIssue {
        BatchIssue {
            file: "b.toml".into(),
            line: Some(line),
            field: Some("cwd".into()),
            message: message.into(),
        }
    }

    #[test]
    fn the_same_problem_of_many_tasks_is_one_line_naming_them() {
        let mut issues: Vec<BatchIssue> = (1..=7)
            .map(|n| issue(3, &format!("task `r{n}`: git is missing")))
            .collect();
        issues.push(issue(3, "task `r8`: something else"));
        issues.push(issue(9, "not about a task"));
        let got: Vec<String> = grouped(issues).iter().map(|(i, _)| i.to_string()).collect();
        assert_eq!(
            got,
            [
                "b.toml:3: field `cwd`: tasks `r1`, `r2`, `r3`, `r4`, `r5` and 2 more: git is \
                 missing",
                "b.toml:3: field `cwd`: task `r8`: something else",
                "b.toml:9: field `cwd`: not about a task",
            ]
        );
    }
}

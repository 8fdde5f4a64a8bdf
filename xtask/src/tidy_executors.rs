//! Tidy: executors are asked what they can do, never told apart by name.
//!
//! The engine, the attempt and the front ends decide behaviour through the runner's `Executor`
//! trait (its capabilities: outlives sortie, follows files, clocks from the real start, polls
//! in batch, repairs locally) and choose a task's executor through `executor::for_spec`. This
//! check fails when product code outside the places that own executors decides by an
//! executor's name or kind:
//! - a name literal (`"slurm"`, `"direct"`, `"supervised"`, `"local"`) or a name constant
//!   (`SLURM`, `DIRECT`, `SUPERVISED`) beside `==` or `!=`, as a match arm, or in `matches!`;
//! - an executor's `kind()` compared or matched (`executor.kind() == ...`);
//! - one of core's executor variants examined (`Executor::Slurm`, `ExecutorKind::Local`, ...).
//!
//! Where it does not look, and why:
//! - `crates/runner/src/executor/`: the executors themselves, where a name maps to its
//!   executor (`for_placement`) and a spec to its choice (`for_spec`);
//! - `crates/core/`: the executor's configuration type and its names (`ExecutorKind::parse`);
//! - `crates/batch/`: reading the batch file's `executor` field and `[slurm]` table into core's
//!   types (a field value parsed, a table key matched: nothing there decides how an attempt
//!   runs);
//! - `crates/journal/`: the stored form of core's executor configuration (a mapping);
//! - tests (`#[cfg(test)]` code, `src/tests/`, `tests.rs`) and the test kit; comments.
//!
//! The check reads lines, not syntax: an expression split over lines can escape it. It catches
//! the shapes such decisions take in this code base, and its tests name them.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// The executors' journaled and configured names.
const NAMES: &[&str] = &["\"slurm\"", "\"direct\"", "\"supervised\"", "\"local\""];

/// The runner's constants holding those names.
const CONSTANTS: &[&str] = &["SLURM", "DIRECT", "SUPERVISED"];

/// Core's executor variants.
const VARIANTS: &[&str] = &[
    "Executor::Slurm",
    "Executor::Local",
    "ExecutorKind::Slurm",
    "ExecutorKind::Local",
];

/// The folders (relative to the workspace root) that own executors or their configuration.
const OWNERS: &[&str] = &[
    "crates/runner/src/executor/",
    "crates/core/",
    "crates/batch/",
    "crates/journal/",
    "crates/testkit/",
];

/// Every product file outside the owners that decides by an executor's name, one line each
/// (`path:line: text`).
pub(crate) fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for path in crate::tidy::files_under(&root.join("crates"), ".rs")? {
        let rel = path.strip_prefix(root).unwrap_or(&path);
        let rel = rel.to_string_lossy().replace('\\', "/");
        if !checked(&rel) {
            continue;
        }
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for (n, line) in name_checks(&text) {
            problems.push(format!(
                "{rel}:{n}: an executor told apart by name (ask the Executor trait): {}",
                line.trim()
            ));
        }
    }
    Ok(problems)
}

/// Whether the file at `rel` (relative to the root, `/`-separated) is product code this check
/// reads: a crate's `src/`, outside the owners and the test files.
fn checked(rel: &str) -> bool {
    rel.starts_with("crates/")
        && rel.contains("/src/")
        && !OWNERS.iter().any(|o| rel.starts_with(o))
        && !rel.contains("/src/tests/")
        && !rel.ends_with("/tests.rs")
}

/// The lines (numbered from 1) of `text` that decide by an executor's name, up to its
/// `#[cfg(test)]` module.
fn name_checks(text: &str) -> Vec<(usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| !l.trim_start().starts_with("#[cfg(test)]"))
        .filter(|(_, l)| decides_by_name(code_of(l)))
        .map(|(i, l)| (i + 1, l))
        .collect()
}

/// A line without its comment (a `//` outside a string literal, roughly: the last quote
/// before it closes a string).
fn code_of(line: &str) -> &str {
    let mut in_str = false;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'"' if i == 0 || bytes[i - 1] != b'\\' => in_str = !in_str,
            b'/' if !in_str && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
            _ => {}
        }
    }
    line
}

/// Whether a line of code compares or matches an executor's name, its kind, or core's
/// executor variants.
fn decides_by_name(code: &str) -> bool {
    if VARIANTS.iter().any(|v| has_word(code, v)) {
        return true;
    }
    let needles = NAMES.iter().chain(CONSTANTS).copied();
    for needle in needles {
        for (at, _) in code.match_indices(needle) {
            let before = &code[..at];
            let after = &code[at + needle.len()..];
            let quoted = needle.starts_with('"');
            if !quoted && !word_bounded(before, after) {
                continue;
            }
            // A constant's path (`crate::executor::SLURM`) is part of the operand.
            let before = if quoted {
                before
            } else {
                before.trim_end_matches(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
            };
            if compared(before, after) || code.contains("matches!(") {
                return true;
            }
        }
    }
    code.match_indices(".kind()").any(|(at, _)| {
        let receiver = before_path(&code[..at]);
        receiver.to_ascii_lowercase().contains("executor")
            && (compared(&code[..at - receiver.len()], &code[at + ".kind()".len()..])
                || code[..at - receiver.len()].trim_end().ends_with("match"))
    })
}

/// Whether an operand between `before` and `after` is compared (`==`, `!=`) or is a match
/// arm's pattern (`=>`, or one of `|` alternatives).
fn compared(before: &str, after: &str) -> bool {
    let (before, after) = (before.trim_end(), after.trim_start());
    let op = |s: &str| s.starts_with("==") || s.starts_with("!=");
    let left = before.ends_with("==") || before.ends_with("!=");
    let alt_before = before.ends_with('|') && !before.ends_with("||");
    let alt_after = after.starts_with('|') && !after.starts_with("||");
    left || op(after) || after.starts_with("=>") || alt_before || alt_after
}

/// The receiver expression's tail just before a method call: its path and field chain.
fn before_path(before: &str) -> &str {
    let start = before
        .rfind(|c: char| {
            !(c.is_alphanumeric() || c == '_' || c == '.' || c == ':' || c == '(' || c == ')')
        })
        .map_or(0, |i| i + 1);
    &before[start..]
}

/// Whether `word` occurs in `code` with no identifier character on either side.
fn has_word(code: &str, word: &str) -> bool {
    code.match_indices(word)
        .any(|(at, _)| word_bounded(&code[..at], &code[at + word.len()..]))
}

/// Whether the text around a match leaves it a whole identifier (or path).
fn word_bounded(before: &str, after: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    !before.chars().next_back().is_some_and(ident) && !after.chars().next().is_some_and(ident)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(line: &str) -> bool {
        !name_checks(&format!("//! x\nfn f() {{\n{line}\n}}\n")).is_empty()
    }

    #[test]
    fn the_workspace_tells_no_executor_apart_by_name() {
        let root = crate::workspace_root();
        let problems = check(&root).expect("the check reads the workspace");
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn planted_name_checks_are_found() {
        for planted in [
            "if ctx.executor.kind() == crate::executor::slurm::SLURM {",
            "let batch = ctx.executor.kind() == SLURM;",
            "if executor.kind() != executor::DIRECT {",
            "Some(a) if a.placement.executor == crate::executor::slurm::SLURM => {",
            "if t.executor == crate::executor::SUPERVISED",
            "if placement.executor == \"slurm\" {",
            "if \"direct\" != name {",
            "    \"local\" => supervised(),",
            "    \"slurm\" | \"direct\" => remote(),",
            "    DIRECT => Arc::new(Direct),",
            "let remote = matches!(name, \"slurm\");",
            "let sortie_core::Executor::Slurm(options) = &spec.executor else {",
            "if spec.executor.kind() == sortie_core::ExecutorKind::Local {",
            "match ctx.executor.kind() {",
            "let same = a.executor.kind() == b.kind();",
        ] {
            assert!(flags(planted), "not found: {planted}");
        }
        let rel = "crates/runner/src/engine/effects.rs";
        assert!(checked(rel));
        assert!(checked("crates/cli/src/commands/run.rs"));
    }

    #[test]
    fn the_allowed_shapes_and_places_pass() {
        for fine in [
            "Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,",
            "if executor.outlives_sortie() {",
            "let conf = std::env::var(\"SLURM_CONF\");",
            "#[arg(long, value_parser = [\"local\", \"slurm\"])]",
            "// if executor.kind() == SLURM, the clocks start later",
            "let x = 1; // \"slurm\" == name",
            "executor: DIRECT.to_owned(),",
            "let kind = ExecutorKind::parse(&name);",
            "let msg = \"the slurm executor\";",
        ] {
            assert!(!flags(fine), "flagged: {fine}");
        }
        for owner in [
            "crates/runner/src/executor/mod.rs",
            "crates/runner/src/executor/slurm/place.rs",
            "crates/core/src/slurm.rs",
            "crates/batch/src/fields.rs",
            "crates/journal/src/stored/v2.rs",
            "crates/testkit/src/slurm.rs",
            "crates/batch/src/tests/limits.rs",
            "crates/runner/src/engine/tests.rs",
            "tests/e2e/slurm.rs",
            "xtask/src/main.rs",
        ] {
            assert!(!checked(owner), "checked: {owner}");
        }
        let in_tests = "//! x\n#[cfg(test)]\nmod tests {\n    fn f() { assert!(k == SLURM); }\n}\n";
        assert!(name_checks(in_tests).is_empty());
    }
}

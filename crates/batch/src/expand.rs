//! Expansion: a task written once as a template over a list (`for_each`) and/or a number of
//! samples (`count`) becomes ordinary tasks, one per item and sample, before resolution, so
//! that the batch (and the journal) only ever holds ordinary tasks.
//!
//! `for_each` takes an array of strings (the items as given), `{ glob = "repos/*" }` (the
//! directories matching a pattern relative to the batch file's directory, sorted; `*` and `?`
//! match within one path component, a component starting with `.` only when the pattern's
//! does), `{ file = "repos.txt" }` (one item per line, blank lines and `#` comments skipped) or
//! `{ models = ["a", "b"] }` (the items are models: each task's `model` is its item).
//! `count = N` (1 to [`MAX_COUNT`]) makes N samples of each item, or of the task.
//!
//! In `label`, `prompt`, `cwd`, `output` and `model`, `{item}` is the item, `{name}` its last
//! path component, `{index}` the 1-based position of the task among its template's tasks
//! (items first, then samples), `{sample}` the 1-based sample. A template that makes more
//! than one task needs a placeholder in its `label` (else every task would carry the same
//! label); two expanded tasks with the same label or output are refused as any duplicate is,
//! at the template's line.
//!
//! #33: the samples of one item (a template with `count` of at least 2) are grouped under the
//! item's name, their `sample_of`: the template's `label` with `{sample}` written `*` and the
//! other placeholders filled (`fix-{name}-{sample}` over `a` → `fix-a-*`); a label without
//! `{sample}` names the item by its first sample's label followed by `*` (`t-{index}` → `t-1*`,
//! `t-6*`, ...); a template without a label by `task-line-N` (its line), its item's `{name}`
//! and `*`. `pick` is only for such a template: anywhere else it is refused at its line.

use std::path::Path;

use crate::error::Issues;
use crate::fields::{RawTask, expected, strings, uint};
use crate::value::Val;

/// The most samples of one item.
pub(crate) const MAX_COUNT: u32 = 10_000;

/// The most tasks one template may make.
pub(crate) const MAX_EXPANDED: usize = 100_000;

/// What a template is expanded over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ForEach {
    /// The items as written.
    List(Vec<String>),
    /// Directories matching a pattern.
    Glob(String),
    /// Items read from a file, one per line.
    File(String),
    /// Models: each task's `model` is its item.
    Models(Vec<String>),
}

/// Where an expanded task came from (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The item, when the template has a `for_each`.
    pub(crate) item: Option<String>,
    /// The 1-based sample.
    pub(crate) sample: u32,
}

impl ForEach {
    /// Reads a `for_each` value.
    pub(crate) fn parse(v: &Val) -> Result<ForEach, String> {
        const SHAPES: &str = "an array of strings, { glob = \"dir/*\" }, { file = \"list.txt\" } \
                              or { models = [\"a\", \"b\"] }";
        let items = |v: &Val| -> Result<Vec<String>, String> {
            let items = strings(v)?;
            if items.is_empty() {
                return Err("the list is empty: the template would make no task".into());
            }
            if items.iter().any(String::is_empty) {
                return Err("an item must not be empty".into());
            }
            Ok(items)
        };
        let one = |v: &Val, what: &str| -> Result<String, String> {
            match v {
                Val::Str(s) if !s.is_empty() => Ok(s.clone()),
                Val::Str(_) => Err(format!("`{what}` must not be empty")),
                other => Err(expected(&format!("`{what}` to be a string"), other)),
            }
        };
        match v {
            Val::Array(_) => items(v).map(ForEach::List),
            Val::Table(entries) => {
                let given: Vec<_> = entries
                    .iter()
                    .filter(|e| !matches!(e.val, Val::Null))
                    .collect();
                let [e] = given.as_slice() else {
                    return Err(format!("expected exactly one key: {SHAPES}"));
                };
                match e.key.as_str() {
                    "glob" => one(&e.val, "glob").map(ForEach::Glob),
                    "file" => one(&e.val, "file").map(ForEach::File),
                    "models" => items(&e.val).map(ForEach::Models),
                    other => Err(format!("unknown key `{other}`; expected {SHAPES}")),
                }
            }
            other => Err(expected(SHAPES, other)),
        }
    }
}

/// Reads a `count` value: 1 to [`MAX_COUNT`].
pub(crate) fn count(v: &Val) -> Result<u32, String> {
    let n: u32 = uint(v)?;
    if (1..=MAX_COUNT).contains(&n) {
        Ok(n)
    } else {
        Err(format!("must be between 1 and {MAX_COUNT} (found {n})"))
    }
}

/// Hands `out` the task as it is, or the tasks it makes when it is a template, in file order.
/// `base`: where relative patterns and files start. A template with a problem is reported and
/// makes nothing.
pub(crate) fn expand(
    t: RawTask,
    base: &Path,
    issues: &mut Issues,
    out: &mut impl FnMut(RawTask, &mut Issues),
) {
    if t.pick.is_some() && t.count.unwrap_or(1) < 2 {
        let line = t.keys.get("pick").copied().flatten().or(t.line);
        let message = "`pick` chooses among a template's samples: it needs `count` of at least 2";
        issues.add(&t.file, line, Some("pick"), message);
        return;
    }
    if t.for_each.is_none() && t.count.is_none() {
        out(t, issues);
        return;
    }
    match expand_one(&t, base) {
        Ok(made) => made.into_iter().for_each(|m| out(m, issues)),
        Err((field, message)) => {
            let line = t.keys.get(field).copied().flatten().or(t.line);
            issues.add(&t.file, line, Some(field), message);
        }
    }
}

/// The tasks one template makes, or the field at fault and why.
fn expand_one(t: &RawTask, base: &Path) -> Result<Vec<RawTask>, (&'static str, String)> {
    let (items, models) = match &t.for_each {
        None => (None, false),
        Some(ForEach::List(items)) => (Some(items.clone()), false),
        Some(ForEach::Models(items)) => (Some(items.clone()), true),
        Some(ForEach::Glob(pattern)) => (Some(glob_dirs(base, pattern)?), false),
        Some(ForEach::File(file)) => (Some(read_items(base, file)?), false),
    };
    let samples = t.count.unwrap_or(1);
    let n_items = items.as_ref().map_or(1, Vec::len);
    let total = n_items.saturating_mul(samples as usize);
    if total > MAX_EXPANDED {
        return Err((
            if t.for_each.is_some() {
                "for_each"
            } else {
                "count"
            },
            format!("makes {total} tasks; at most {MAX_EXPANDED} from one task"),
        ));
    }
    if total > 1 && t.label.as_deref().is_some_and(|l| !has_placeholder(l)) {
        let label = t.label.as_deref().unwrap_or_default();
        return Err((
            "label",
            format!(
                "the task makes {total} tasks, and every one would be labelled {label:?}; \
                 put {{item}}, {{name}}, {{index}} or {{sample}} in the label"
            ),
        ));
    }
    if models && t.model.is_some() && !t.model.as_deref().is_some_and(has_placeholder) {
        return Err((
            "model",
            "`for_each = { models = [...] }` gives each task its model; drop `model`".into(),
        ));
    }
    let mut made = Vec::with_capacity(total);
    let mut index = 0u64;
    let item_list: Vec<Option<&str>> = match &items {
        Some(items) => items.iter().map(|s| Some(s.as_str())).collect(),
        None => vec![None],
    };
    for item in item_list {
        let mut sample_of = None;
        for sample in 1..=samples {
            index += 1;
            let values = Values {
                item: item.unwrap_or_default(),
                name: item.map(last_component).unwrap_or_default(),
                index,
                sample,
            };
            let mut e = t.clone();
            e.for_each = None;
            e.count = None;
            e.label = t.label.as_deref().map(|s| values.fill(s));
            if samples > 1 {
                let name =
                    sample_of.get_or_insert_with(|| item_name(t, &values, e.label.as_deref()));
                e.sample_of = Some(name.clone());
            }
            e.prompt = t.prompt.as_deref().map(|s| values.fill(s));
            e.cwd = t.cwd.as_deref().map(|s| values.fill(s));
            e.output = t.output.as_deref().map(|s| values.fill(s));
            e.model = t.model.as_deref().map(|s| values.fill(s));
            if models && t.model.is_none() {
                e.model = item.map(str::to_owned);
                e.set("model", t.keys.get("for_each").copied().flatten());
            }
            e.expanded = Some(Origin {
                item: item.map(str::to_owned),
                sample,
            });
            made.push(e);
        }
    }
    Ok(made)
}

/// #33: the name of an item's samples (see the module's doc), from its first sample.
fn item_name(t: &RawTask, first: &Values<'_>, first_label: Option<&str>) -> String {
    match (t.label.as_deref(), first_label) {
        (Some(template), _) if template.contains("{sample}") => first.fill_as(template, Some("*")),
        (_, Some(label)) => format!("{label}*"),
        _ => {
            let line = t.line.map_or_else(String::new, |l| format!("-line-{l}"));
            let item = if first.name.is_empty() {
                String::new()
            } else {
                format!("-{}", first.name)
            };
            format!("task{line}{item}-*")
        }
    }
}

/// The values of the placeholders for one expanded task.
struct Values<'a> {
    item: &'a str,
    name: &'a str,
    index: u64,
    sample: u32,
}

const PLACEHOLDERS: [&str; 4] = ["{item}", "{name}", "{index}", "{sample}"];

fn has_placeholder(s: &str) -> bool {
    PLACEHOLDERS.iter().any(|p| s.contains(p))
}

impl Values<'_> {
    /// `s` with each placeholder replaced, in one pass (a value that itself reads like a
    /// placeholder is not replaced again).
    fn fill(&self, s: &str) -> String {
        self.fill_as(s, None)
    }

    /// [`Values::fill`], with `{sample}` written `sample` when given.
    fn fill_as(&self, s: &str, sample: Option<&str>) -> String {
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let tail = &rest[open..];
            let hit = PLACEHOLDERS.iter().find(|p| tail.starts_with(**p));
            match hit {
                Some(p) => {
                    match *p {
                        "{item}" => out.push_str(self.item),
                        "{name}" => out.push_str(self.name),
                        "{index}" => out.push_str(&self.index.to_string()),
                        _ => match sample {
                            Some(v) => out.push_str(v),
                            None => out.push_str(&self.sample.to_string()),
                        },
                    }
                    rest = &tail[p.len()..];
                }
                None => {
                    out.push('{');
                    rest = &tail[1..];
                }
            }
        }
        out.push_str(rest);
        out
    }
}

/// The last path component of an item (`repos/a/` → `a`); the item itself when it has none.
fn last_component(item: &str) -> &str {
    let trimmed = item.trim_end_matches('/');
    trimmed
        .rsplit('/')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(item)
}

/// Items from a file, one per line, blank lines and `#` comments skipped, trimmed.
fn read_items(base: &Path, file: &str) -> Result<Vec<String>, (&'static str, String)> {
    let path = base.join(file);
    let limit = sortie_core::bounds::input_limits::FOR_EACH_FILE;
    let text = crate::read::read_text(&path, "a `for_each` file", limit)
        .map_err(|e| ("for_each", format!("cannot read {}: {e}", path.display())))?;
    let items: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    if items.is_empty() {
        return Err((
            "for_each",
            format!(
                "{} lists no item: the template would make no task",
                path.display()
            ),
        ));
    }
    Ok(items)
}

/// The directories matching `pattern` (relative to `base`, or absolute), sorted, each as the
/// pattern writes it (relative stays relative).
fn glob_dirs(base: &Path, pattern: &str) -> Result<Vec<String>, (&'static str, String)> {
    let absolute = pattern.starts_with('/');
    let parts: Vec<&str> = pattern.split('/').filter(|p| !p.is_empty()).collect();
    if parts.contains(&"**") {
        return Err((
            "for_each",
            "`**` is not supported; use `*` per level".into(),
        ));
    }
    // (path on disk, path as written)
    let root = if absolute {
        Path::new("/").to_path_buf()
    } else {
        base.to_path_buf()
    };
    let mut found: Vec<(std::path::PathBuf, String)> = vec![(root, String::new())];
    for part in &parts {
        let mut next = Vec::new();
        for (dir, written) in &found {
            let join = |name: &str| {
                if written.is_empty() {
                    if absolute {
                        format!("/{name}")
                    } else {
                        name.to_owned()
                    }
                } else {
                    format!("{written}/{name}")
                }
            };
            if !part.contains(['*', '?']) {
                let p = dir.join(part);
                if p.exists() || *part == "." || *part == ".." {
                    next.push((p, join(part)));
                }
                continue;
            }
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut names: Vec<String> = entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| wildcard(part, n) && (part.starts_with('.') || !n.starts_with('.')))
                .collect();
            names.sort();
            for n in names {
                next.push((dir.join(&n), join(&n)));
            }
        }
        found = next;
    }
    let dirs: Vec<String> = found
        .into_iter()
        .filter(|(p, _)| p.is_dir())
        .map(|(_, w)| w)
        .collect();
    if dirs.is_empty() {
        return Err((
            "for_each",
            format!(
                "the pattern {pattern:?} matches no directory (under {})",
                base.display()
            ),
        ));
    }
    Ok(dirs)
}

/// Whether `name` matches `pattern` (`*`: any run of characters, `?`: one character).
fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some(pi);
                mark = ni;
                pi += 1;
            }
            Some(c) if *c == '?' || *c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some(s) => {
                    pi = s + 1;
                    mark += 1;
                    ni = mark;
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Overrides, load};

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn wildcards() {
        assert!(wildcard("repo-*", "repo-a"));
        assert!(wildcard("*", "x"));
        assert!(wildcard("a?c", "abc"));
        assert!(!wildcard("a?c", "ac"));
        assert!(wildcard("*.d*", "x.dir"));
        assert!(!wildcard("repo-*", "other"));
    }

    #[test]
    fn a_glob_over_directories_times_samples_makes_ordinary_tasks() {
        let tmp = tempfile::tempdir().unwrap();
        for r in ["r2", "r1", "r3"] {
            std::fs::create_dir_all(tmp.path().join("repos").join(r)).unwrap();
        }
        std::fs::write(tmp.path().join("repos/not-a-dir"), "").unwrap();
        let f = write(
            tmp.path(),
            "b.toml",
            "allow_shared_writes = true\n[[tasks]]\nlabel = \"{name}-{sample}\"\nprompt = \"fix {item} ({index})\"\n\
             cwd = \"{item}\"\noutput = \"out/{name}-{sample}.md\"\n\
             for_each = { glob = \"repos/*\" }\ncount = 2\n",
        );
        let b = load(&f, None, &Overrides::default()).unwrap().batch;
        let labels: Vec<&str> = b.tasks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["r1-1", "r1-2", "r2-1", "r2-2", "r3-1", "r3-2"]);
        let d = tmp.path().to_string_lossy().into_owned();
        assert_eq!(b.tasks[2].cwd, format!("{d}/repos/r2"));
        assert_eq!(b.tasks[3].prompt.as_deref(), Some("fix repos/r2 (4)"));
        assert_eq!(
            b.tasks[5].output.as_deref(),
            Some(format!("{d}/out/r3-2.md").as_str())
        );
    }

    #[test]
    fn a_list_a_file_and_models() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "items.txt", "# repos\nalpha\n\n  beta  \n");
        let f = write(
            tmp.path(),
            "b.toml",
            "allow_shared_writes = true\n[[tasks]]\nlabel = \"l-{item}\"\nprompt = \"p\"\nfor_each = [\"x\", \"y\"]\n\n\
             [[tasks]]\nlabel = \"f-{index}\"\nprompt = \"{item}\"\nfor_each = { file = \"items.txt\" }\n\n\
             [[tasks]]\nlabel = \"m-{index}\"\nprompt = \"p\"\nfor_each = { models = [\"m1\", \"m2\"] }\n\n\
             [[tasks]]\nlabel = \"solo\"\nprompt = \"p\"\ncount = 1\n",
        );
        let b = load(&f, None, &Overrides::default()).unwrap().batch;
        let got: Vec<(&str, Option<&str>, Option<&str>)> = b
            .tasks
            .iter()
            .map(|t| (t.label.as_str(), t.prompt.as_deref(), t.model.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("l-x", Some("p"), None),
                ("l-y", Some("p"), None),
                ("f-1", Some("alpha"), None),
                ("f-2", Some("beta"), None),
                ("m-1", Some("p"), Some("m1")),
                ("m-2", Some("p"), Some("m2")),
                ("solo", Some("p"), None),
            ]
        );
    }

    #[test]
    fn collisions_and_bad_expansions_are_refused_with_file_and_line() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a/x")).unwrap();
        std::fs::create_dir_all(tmp.path().join("b/x")).unwrap();
        let f = write(
            tmp.path(),
            "b.toml",
            "[[tasks]]\nlabel = \"same\"\nprompt = \"p\"\ncount = 2\n\n\
             [[tasks]]\nlabel = \"{name}\"\nprompt = \"p\"\nfor_each = { glob = \"*/x\" }\n\n\
             [[tasks]]\nprompt = \"p\"\nfor_each = { glob = \"nothing-*\" }\n\n\
             [[tasks]]\nprompt = \"p\"\ncount = 0\n\n\
             [defaults]\ncount = 2\n",
        );
        let err = load(&f, None, &Overrides::default()).unwrap_err();
        let text = err.to_string();
        let got = crate::tests::places(&err);
        assert_eq!(
            got,
            [
                (Some(2), Some("label")),
                (Some(7), Some("label")),
                (Some(13), Some("for_each")),
                (Some(17), Some("count")),
                (Some(20), Some("count")),
            ],
            "{text}"
        );
        assert!(
            text.contains("b.toml:2: field `label`: the task makes 2 tasks"),
            "{text}"
        );
        assert!(text.contains("duplicate label \"x\""), "{text}");
        assert!(text.contains("(item \"b/x\", sample 1)"), "{text}");
        assert!(text.contains("matches no directory"), "{text}");
        assert!(
            text.contains("must be between 1 and 10000 (found 0)"),
            "{text}"
        );
    }

    #[test]
    fn jsonl_tasks_expand_too() {
        let tmp = tempfile::tempdir().unwrap();
        let f = write(
            tmp.path(),
            "b.jsonl",
            "{\"label\": \"s{sample}\", \"command\": [\"true\"], \"count\": 3}\n",
        );
        let b = load(&f, None, &Overrides::default()).unwrap().batch;
        let labels: Vec<&str> = b.tasks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["s1", "s2", "s3"]);
    }

    #[test]
    fn samples_are_grouped_under_their_item_and_pick_needs_samples() {
        let tmp = tempfile::tempdir().unwrap();
        let f = write(
            tmp.path(),
            "b.toml",
            "[[tasks]]\nlabel = \"fix-{item}-{sample}\"\ncommand = [\"true\"]\n\
             for_each = [\"a\", \"b\"]\ncount = 2\npick = \"first-pass\"\n\n\
             [[tasks]]\nlabel = \"t-{index}\"\ncommand = [\"true\"]\n\
             for_each = [\"a\", \"b\"]\ncount = 2\n\n\
             [[tasks]]\nlabel = \"one-{item}\"\ncommand = [\"true\"]\nfor_each = [\"a\"]\n",
        );
        let b = load(&f, None, &Overrides::default()).unwrap().batch;
        let got: Vec<(&str, Option<&str>)> = b
            .tasks
            .iter()
            .map(|t| (t.label.as_str(), t.sample_of.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                ("fix-a-1", Some("fix-a-*")),
                ("fix-a-2", Some("fix-a-*")),
                ("fix-b-1", Some("fix-b-*")),
                ("fix-b-2", Some("fix-b-*")),
                ("t-1", Some("t-1*")),
                ("t-2", Some("t-1*")),
                ("t-3", Some("t-3*")),
                ("t-4", Some("t-3*")),
                ("one-a", None),
            ]
        );
        assert_eq!(b.tasks[0].pick, Some(sortie_core::verify::Pick::FirstPass));

        let f = write(
            tmp.path(),
            "bad.toml",
            "[[tasks]]\nlabel = \"x\"\ncommand = [\"true\"]\npick = \"best-score\"\n\n\
             [[tasks]]\nlabel = \"y{sample}\"\ncommand = [\"true\"]\ncount = 1\n\
             pick = \"first-pass\"\n\n\
             [defaults]\npick = \"first-pass\"\n",
        );
        let err = load(&f, None, &Overrides::default()).unwrap_err();
        let text = err.to_string();
        let got = crate::tests::places(&err);
        assert_eq!(
            got,
            [
                (Some(4), Some("pick")),
                (Some(10), Some("pick")),
                (Some(13), Some("pick")),
            ],
            "{text}"
        );
        assert!(text.contains("needs `count` of at least 2"), "{text}");
        assert!(text.contains("cannot be a default"), "{text}");
    }
}

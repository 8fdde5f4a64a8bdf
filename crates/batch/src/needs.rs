//! `needs` patterns (#33, a judge over samples): `needs = ["fix-*"]` names every task whose
//! label matches (`*` any run of characters, `?` one character; a name with neither is a label
//! as written). Patterns are resolved when the batch loads, against the labels of every task
//! (templates expanded), so the resolved batch, the journal and the planner only ever see
//! labels. A pattern never matches the task itself; one that matches no other task is an
//! error at the line of the `needs` that gave it.

use std::collections::{HashMap, HashSet};

use sortie_core::Batch;

use crate::error::Issues;
use crate::fields::Written;

/// A `needs` pattern of the batch, as `sortie check` shows it: the labels it matched, in batch
/// order (a task's own label is then left out of its own needs), and the tasks whose `needs`
/// have it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternUse {
    /// The pattern as written.
    pub pattern: String,
    /// The labels it matched.
    pub matched: Vec<String>,
    /// The labels of the tasks that need it, in batch order.
    pub tasks: Vec<String>,
}

/// Whether a `needs` entry is a pattern (it has a `*` or a `?`).
pub(crate) fn is_pattern(need: &str) -> bool {
    need.contains(['*', '?'])
}

/// Whether `text` matches `pattern`: `*` any run of characters (none included), `?` exactly
/// one, anything else itself. Linear in practice: the last `*` is the only backtrack point.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || t.get(ti) == Some(&c) => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                // Let the last `*` take one more character.
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == '*'))
}

/// The most dependencies the patterns of one batch may stand for in all (each task's matches
/// summed): `needs = ["*"]` in `[defaults]` of a 100,000-task batch would be 10^10.
pub(crate) const MAX_PATTERN_NEEDS: usize = 1_000_000;

/// Each pattern of a batch once, in order of first use: the tasks it matches and the tasks
/// that need it (task indexes).
#[derive(Default)]
struct Uses {
    list: Vec<(String, Vec<usize>, Vec<usize>)>,
    by_pattern: HashMap<String, usize>,
}

impl Uses {
    fn of(batch: &Batch, labels: &[String]) -> Uses {
        let mut uses = Uses::default();
        for (i, spec) in batch.tasks.iter().enumerate() {
            for need in spec.needs.iter().filter(|n| is_pattern(n)) {
                let u = *uses.by_pattern.entry(need.clone()).or_insert_with(|| {
                    let matched = (0..labels.len())
                        .filter(|&j| labels.get(j).is_some_and(|l| glob_match(need, l)))
                        .collect();
                    uses.list.push((need.clone(), matched, Vec::new()));
                    uses.list.len() - 1
                });
                if let Some((_, _, users)) = uses.list.get_mut(u)
                    && users.last() != Some(&i)
                {
                    users.push(i);
                }
            }
        }
        uses
    }

    fn matched(&self, pattern: &str) -> &[usize] {
        self.by_pattern
            .get(pattern)
            .and_then(|&u| self.list.get(u))
            .map_or(&[], |(_, m, _)| m.as_slice())
    }
}

/// Replaces each task's `needs` patterns by the labels they match, in batch order, each once
/// (a label the task also names itself is left to that name), never the task itself. A pattern
/// that matches nothing else is an issue at the `needs` key that gave it (the task's own, else
/// `[defaults]`'), reported once per key and pattern; so are patterns that stand for more than
/// [`MAX_PATTERN_NEEDS`] dependencies in all. Returns each pattern's use.
pub(crate) fn resolve_patterns(
    batch: &mut Batch,
    tasks: &[Written],
    defaults: &Written,
    issues: &mut Issues,
) -> Vec<PatternUse> {
    if !batch
        .tasks
        .iter()
        .any(|t| t.needs.iter().any(|n| is_pattern(n)))
    {
        return Vec::new();
    }
    let labels: Vec<String> = batch.tasks.iter().map(|t| t.label.clone()).collect();
    let uses = Uses::of(batch, &labels);
    let total: usize = uses
        .list
        .iter()
        .map(|(_, m, users)| m.len().saturating_mul(users.len()))
        .fold(0, usize::saturating_add);
    let too_many = total > MAX_PATTERN_NEEDS;
    if too_many {
        let first = uses.list.first().and_then(|(_, _, users)| users.first());
        let (file, line) = needs_site(first.and_then(|&i| tasks.get(i)), defaults);
        issues.add(
            &file,
            line,
            Some("needs"),
            format!(
                "the batch's `needs` patterns stand for {total} dependencies in all, more than \
                 {MAX_PATTERN_NEEDS}"
            ),
        );
    }
    let mut reported: HashSet<(std::path::PathBuf, Option<usize>, String)> = HashSet::new();
    for (i, spec) in batch.tasks.iter_mut().enumerate() {
        if !spec.needs.iter().any(|n| is_pattern(n)) {
            continue;
        }
        let explicit: HashSet<&str> = spec
            .needs
            .iter()
            .filter(|n| !is_pattern(n))
            .map(String::as_str)
            .collect();
        let mut resolved: Vec<String> = Vec::with_capacity(spec.needs.len());
        let mut added: HashSet<usize> = HashSet::new();
        for need in &spec.needs {
            if !is_pattern(need) {
                resolved.push(need.clone());
                continue;
            }
            if too_many {
                continue; // reported above; the batch does not load
            }
            let mut any = false;
            for &j in uses.matched(need) {
                let Some(label) = labels.get(j) else { continue };
                if j == i || *label == spec.label {
                    continue;
                }
                any = true;
                if !explicit.contains(label.as_str()) && added.insert(j) {
                    resolved.push(label.clone());
                }
            }
            if !any {
                let (file, line) = needs_site(tasks.get(i), defaults);
                if reported.insert((file.clone(), line, need.clone())) {
                    issues.add(
                        &file,
                        line,
                        Some("needs"),
                        format!("the pattern {need:?} matches no task"),
                    );
                }
            }
        }
        std::sync::Arc::make_mut(&mut spec.body).needs = resolved;
    }
    batch.share_bodies();
    let named = |ids: Vec<usize>| -> Vec<String> {
        ids.into_iter()
            .filter_map(|j| labels.get(j).cloned())
            .collect()
    };
    uses.list
        .into_iter()
        .map(|(pattern, matched, users)| PatternUse {
            pattern,
            matched: named(matched),
            tasks: named(users),
        })
        .collect()
}

/// Where a task's `needs` was written: its own key, else `[defaults]`', else the task.
fn needs_site(task: Option<&Written>, defaults: &Written) -> (std::path::PathBuf, Option<usize>) {
    match task {
        Some(t) if t.keys.contains_key("needs") => {
            (t.file.clone(), t.keys.get("needs").copied().flatten())
        }
        _ if defaults.keys.contains_key("needs") => (
            defaults.file.clone(),
            defaults.keys.get("needs").copied().flatten(),
        ),
        Some(t) => (t.file.clone(), t.line),
        None => (defaults.file.clone(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_matches_star_as_any_run_and_question_mark_as_one_character() {
        let table = [
            ("fix-*", "fix-1", true),
            ("fix-*", "fix-", true),
            ("fix-*", "fix", false),
            ("fix-*", "prefix-1", false),
            ("*-judge", "a-b-judge", true),
            ("s-?", "s-1", true),
            ("s-?", "s-10", false),
            ("s-??", "s-10", true),
            ("*", "anything", true),
            ("a*b*c", "a-x-b-y-c", true),
            ("a*b*c", "a-x-c-y-b", false),
            ("*é?", "café", false),
            ("*é?", "café!", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ];
        for (pattern, text, want) in table {
            assert_eq!(glob_match(pattern, text), want, "{pattern:?} ~ {text:?}");
        }
    }

    #[test]
    fn only_names_with_a_star_or_a_question_mark_are_patterns() {
        assert!(is_pattern("s-*") && is_pattern("s-?"));
        assert!(!is_pattern("build") && !is_pattern("s-[1]"));
    }
}

//! A batch file's documents: the run-level table of a TOML batch or a defaults file (run
//! settings, `[defaults]`, `[agents.NAME]`, `[[tasks]]`), and the task lines of a JSON Lines
//! file.

use std::path::{Path, PathBuf};

use crate::agents::Agents;
use crate::error::Issues;
use crate::fields::{
    RUN_FIELDS, RawTask, Scope, TASK_FIELDS, boolean, cost_nanos, duration, expected, suggest, uint,
};
use crate::value::{Entry, LineIndex, RawToml, Val, task_headers};

/// The keys of the `[budget]` table.
pub(crate) const BUDGET_FIELDS: &[&str] = &["max_cost", "max_tokens", "deadline", "warn_at"];

/// The keys of a `[prices."MODEL"]` table (#37).
pub(crate) const PRICE_FIELDS: &[&str] = sortie_core::prices::PRICE_FIELDS;

/// The keys of a `[pools.NAME]` table.
pub(crate) const POOL_FIELDS: &[&str] = &["concurrency", "adaptive"];

/// The run-level part of a batch file (or of a defaults file), and its tasks.
pub(crate) struct RunDoc {
    pub(crate) file: PathBuf,
    pub(crate) concurrency: Option<u32>,
    pub(crate) concurrency_line: Option<usize>,
    pub(crate) fail_fast: Option<bool>,
    pub(crate) allow_shared_writes: Option<bool>,
    pub(crate) defaults: RawTask,
    pub(crate) agents: Agents,
    pub(crate) tasks: Vec<RawTask>,
    /// `[budget]`: the whole run's budget.
    pub(crate) budget: sortie_core::RunBudget,
    /// The line of each `[budget]` key given (`budget.max_cost`).
    pub(crate) budget_lines: std::collections::HashMap<String, Option<usize>>,
    /// `[pools.NAME]` (issue 14), by name.
    pub(crate) pools: std::collections::BTreeMap<String, RawPool>,
    /// #15: the run's `on_task_end`.
    pub(crate) on_task_end: Option<String>,
    /// #37: `[prices."MODEL"]`, over the built-in table.
    pub(crate) prices: std::collections::BTreeMap<String, sortie_core::prices::ModelPrice>,
}

/// A `[pools.NAME]` table and where it was written.
pub(crate) struct RawPool {
    pub(crate) spec: sortie_core::PoolSpec,
    /// The table's line.
    pub(crate) line: Option<usize>,
}

impl RunDoc {
    pub(crate) fn new(file: &Path) -> RunDoc {
        RunDoc {
            file: file.to_path_buf(),
            concurrency: None,
            concurrency_line: None,
            fail_fast: None,
            allow_shared_writes: None,
            defaults: RawTask::new(file, None),
            agents: Agents::default(),
            tasks: Vec::new(),
            budget: sortie_core::RunBudget::default(),
            budget_lines: std::collections::HashMap::new(),
            pools: std::collections::BTreeMap::new(),
            on_task_end: None,
            prices: std::collections::BTreeMap::new(),
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
                "budget" => doc.parse_budget(e, issues),
                "pools" => doc.parse_pools(e, issues),
                "prices" => doc.parse_prices(e, issues),
                "on_task_end" => {
                    crate::fields::hook_command(&e.val).map(|c| doc.on_task_end = Some(c))
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

    /// `[budget]`: `max_cost` (US dollars), `max_tokens`, `deadline`, `warn_at` (percent);
    /// each sub-field's problem is its own issue.
    fn parse_budget(&mut self, e: &Entry, issues: &mut Issues) -> Result<(), String> {
        let Val::Table(entries) = &e.val else {
            return Err(expected(
                "a table { max_cost, max_tokens, deadline, warn_at }",
                &e.val,
            ));
        };
        for sub in entries {
            if matches!(sub.val, Val::Null) {
                continue;
            }
            let field = format!("budget.{}", sub.key);
            self.budget_lines.insert(field.clone(), sub.line);
            let b = &mut self.budget;
            let parsed = match sub.key.as_str() {
                "max_cost" => cost_nanos(&sub.val).map(|c| b.max_cost_nanos = Some(c)),
                "max_tokens" => uint(&sub.val).map(|t| b.max_tokens = Some(t)),
                "deadline" => duration(&sub.val).map(|d| b.deadline = Some(d)),
                "warn_at" => uint::<u32>(&sub.val).and_then(|p| {
                    u8::try_from(p)
                        .ok()
                        .filter(|p| (1..=100).contains(p))
                        .map(|p| b.warn_percent = p)
                        .ok_or_else(|| format!("must be between 1 and 100 (percent; found {p})"))
                }),
                _ => Err(format!("unknown field{}", suggest(&sub.key, BUDGET_FIELDS))),
            };
            if let Err(message) = parsed {
                issues.add(&self.file, sub.line, Some(&field), message);
            }
        }
        Ok(())
    }

    /// `[pools.NAME]`: `concurrency` (1 to the most a run allows) and `adaptive` (true by
    /// default); each sub-field's problem is its own issue.
    fn parse_pools(&mut self, e: &Entry, issues: &mut Issues) -> Result<(), String> {
        let Val::Table(pools) = &e.val else {
            return Err(expected(
                "a table of pools ([pools.NAME] concurrency = N)",
                &e.val,
            ));
        };
        for pool in pools {
            let field = format!("pools.{}", pool.key);
            let Val::Table(entries) = &pool.val else {
                let message = expected("a table { concurrency, adaptive }", &pool.val);
                issues.add(&self.file, pool.line, Some(&field), message);
                continue;
            };
            let line = pool
                .line
                .or_else(|| entries.iter().filter_map(|s| s.line).min());
            let mut spec = sortie_core::PoolSpec::default();
            for sub in entries {
                if matches!(sub.val, Val::Null) {
                    continue;
                }
                let max = sortie_core::spec::MAX_CONCURRENCY;
                let parsed = match sub.key.as_str() {
                    "concurrency" => uint::<u32>(&sub.val).and_then(|c| {
                        if (1..=max).contains(&c) {
                            spec.concurrency = Some(c);
                            Ok(())
                        } else {
                            Err(format!("must be between 1 and {max} (found {c})"))
                        }
                    }),
                    "adaptive" => boolean(&sub.val).map(|b| spec.adaptive = b),
                    _ => Err(format!("unknown field{}", suggest(&sub.key, POOL_FIELDS))),
                };
                if let Err(message) = parsed {
                    let field = format!("{field}.{}", sub.key);
                    issues.add(&self.file, sub.line, Some(&field), message);
                }
            }
            self.pools.insert(pool.key.clone(), RawPool { spec, line });
        }
        Ok(())
    }

    /// #37: `[prices."MODEL"]`: `input`, `output`, `cache_read`, `cache_write`, each in US
    /// dollars per million tokens (finite, at least 0; one left out is 0); each sub-field's
    /// problem is its own issue.
    fn parse_prices(&mut self, e: &Entry, issues: &mut Issues) -> Result<(), String> {
        let Val::Table(models) = &e.val else {
            return Err(expected(
                "a table of models ([prices.\"MODEL\"] input = 1.25, output = 10.0)",
                &e.val,
            ));
        };
        for model in models {
            let field = format!("prices.{:?}", model.key);
            let Val::Table(entries) = &model.val else {
                let message = expected(
                    "a table { input, output, cache_read, cache_write }",
                    &model.val,
                );
                issues.add(&self.file, model.line, Some(&field), message);
                continue;
            };
            let mut price = sortie_core::prices::ModelPrice::default();
            for sub in entries {
                if matches!(sub.val, Val::Null) {
                    continue;
                }
                let parsed = match sub.key.as_str() {
                    "input" => cost_nanos(&sub.val).map(|n| price.input = n),
                    "output" => cost_nanos(&sub.val).map(|n| price.output = n),
                    "cache_read" => cost_nanos(&sub.val).map(|n| price.cache_read = n),
                    "cache_write" => cost_nanos(&sub.val).map(|n| price.cache_write = n),
                    _ => Err(format!("unknown field{}", suggest(&sub.key, PRICE_FIELDS))),
                };
                if let Err(message) = parsed {
                    let field = format!("{field}.{}", sub.key);
                    let message =
                        message.replace("a cost in US dollars", "US dollars per million tokens");
                    issues.add(&self.file, sub.line, Some(&field), message);
                }
            }
            self.prices.insert(model.key.clone(), price);
        }
        Ok(())
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
pub(crate) fn parse_toml_doc(
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
pub(crate) fn parse_defaults_file(
    file: &Path,
    bytes: &[u8],
    issues: &mut Issues,
) -> Option<RunDoc> {
    let is_json = file
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if !is_json {
        return parse_toml_doc(file, bytes, false, issues);
    }
    match crate::json::from_slice(bytes) {
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
/// A duplicate key (refused by [`crate::json`], valid JSON otherwise) is not called invalid.
fn json_message(e: &serde_json::Error, lead: usize) -> String {
    let full = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    let message = full.strip_suffix(&position).unwrap_or(&full);
    let what = match e.classify() {
        serde_json::error::Category::Data => "",
        _ => "invalid JSON: ",
    };
    format!("{what}{message} (column {})", e.column() + lead)
}

/// How many lines of a JSON Lines file may hold a task (those not blank): room for the tasks
/// at once.
pub(crate) fn jsonl_task_lines(bytes: &[u8]) -> usize {
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| l.iter().any(|b| !b.is_ascii_whitespace()))
        .count()
}

/// Reads the task lines of a JSON Lines file, handing each task to `add` as soon as it is
/// read (the caller resolves it: the raw tasks never exist all at once).
pub(crate) fn parse_jsonl_tasks(
    file: &Path,
    bytes: &[u8],
    issues: &mut Issues,
    add: &mut impl FnMut(RawTask, &mut Issues),
) {
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
        match crate::json::from_str(trimmed) {
            Ok(v @ serde_json::Value::Object(_)) => {
                if let Val::Table(entries) = Val::from_json(v, Some(line)) {
                    let task = RawTask::parse(&entries, file, Some(line), Scope::Task, issues);
                    add(task, issues);
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
}

//! `sortie results [RUN] [--jsonl]` (issue 13): one record per task, for scoring scripts:
//! its label, state, validated structured result (`value`), error and usage, in batch order.
//! A table by default; `--json` prints an array, `--jsonl` one object per line.
//!
//! #33: a run with samples (a template with `count` of at least 2) adds, after the tasks, the
//! samples table and the pass rates per model and per role; `--json` is then an object
//! `{"tasks": [...], "samples": [...], "rates": {...}}` (a run without samples keeps the array),
//! and `--jsonl` adds one line per item (`"kind": "samples"`) and per rate (`"kind": "rate"`).

use std::io::Write;

use serde::Serialize;
use sortie_core::{TaskId, Usage};

use super::{Code, newest, open_read, replay_all};
use crate::args::{Global, ResultsArgs};
use crate::error::Result;
use crate::output::structured_value;

/// One task's record.
#[derive(Debug, Serialize)]
struct Record {
    /// Its label.
    label: String,
    /// Its state (`completed`, `partial`, ..., or a live state while the run goes on).
    state: String,
    /// Its validated structured result; `null` without an `output_schema`, before its end,
    /// or when its answer did not match.
    value: Option<serde_json::Value>,
    /// Its error (a mismatch says why).
    error: Option<String>,
    /// Its usage over its attempts.
    usage: Usage,
    /// Its cost, for people.
    cost: String,
}

/// Prints the records of a run (the newest by default).
pub(crate) fn results(g: &Global, args: &ResultsArgs) -> Result<Code> {
    let run = match &args.run {
        Some(r) => super::find_run(g, r)?,
        None => newest(&g.layout(), false)?,
    };
    let state = replay_all(&open_read(&g.layout(), &run)?)?;
    let records: Vec<Record> = state
        .tasks
        .iter()
        .enumerate()
        .map(|(i, rec)| {
            let result = rec.result();
            let usage = rec.usage();
            Record {
                label: state.label(TaskId(i as u32)),
                state: rec.display_state().to_owned(),
                value: result.and_then(structured_value),
                error: result.and_then(|r| r.error.clone()),
                cost: usage.cost.to_string(),
                usage,
            }
        })
        .filter(|r: &Record| g.rows.shows(state.tasks.len(), &r.state))
        .collect();
    let items = crate::samples::items(&state);
    let rates = (!items.is_empty()).then(|| crate::samples::rates(&state));
    let mut out = std::io::stdout().lock();
    if args.jsonl {
        for r in &records {
            serde_json::to_writer(&mut out, r)?;
            writeln!(out)?;
        }
        for i in &items {
            let mut v = serde_json::to_value(i)?;
            if let Some(o) = v.as_object_mut() {
                o.insert("kind".into(), "samples".into());
            }
            serde_json::to_writer(&mut out, &v)?;
            writeln!(out)?;
        }
        if let Some(rates) = &rates {
            let by = [("model", &rates.models), ("role", &rates.roles)];
            for (by, list) in by {
                for r in list {
                    let mut v = serde_json::to_value(r)?;
                    if let Some(o) = v.as_object_mut() {
                        o.insert("kind".into(), "rate".into());
                        o.insert("by".into(), by.into());
                    }
                    serde_json::to_writer(&mut out, &v)?;
                    writeln!(out)?;
                }
            }
        }
    } else if g.json {
        if let Some(rates) = &rates {
            let v = serde_json::json!({ "tasks": records, "samples": items, "rates": rates });
            serde_json::to_writer_pretty(&mut out, &v)?;
        } else {
            serde_json::to_writer_pretty(&mut out, &records)?;
        }
        writeln!(out)?;
    } else {
        let width = records
            .iter()
            .map(|r| r.label.len())
            .max()
            .unwrap_or(5)
            .max(5);
        writeln!(
            out,
            "{:<width$}  {:<10}  {:>10}  VALUE",
            "LABEL", "STATE", "COST"
        )?;
        for r in &records {
            let value = match (&r.value, &r.error) {
                (Some(v), _) => v.to_string(),
                (None, Some(e)) => format!("({e})"),
                (None, None) => "-".to_owned(),
            };
            // What the agents wrote is shown, never obeyed by the terminal.
            writeln!(
                out,
                "{:<width$}  {:<10}  {:>10}  {}",
                crate::text::printable(&r.label),
                r.state,
                r.cost,
                crate::text::printable(&value)
            )?;
        }
        if let Some(rates) = &rates {
            writeln!(out)?;
            for line in crate::samples::items_table(&items) {
                writeln!(out, "{line}")?;
            }
            for (what, list) in [("MODEL", &rates.models), ("ROLE", &rates.roles)] {
                if list.is_empty() {
                    continue;
                }
                writeln!(out)?;
                for line in crate::samples::rates_table(what, list) {
                    writeln!(out, "{line}")?;
                }
            }
        }
    }
    Ok(Code::Ok)
}

//! `sortie list`: the runs in the state dir, newest first, from the run index (no journal is
//! opened).

use std::io::Write;

use crate::error::{Result, ResultExt};
use serde::Serialize;
use sortie_runner::layout::index::IndexStatus;
use sortie_runner::layout::{Owner, index};

use super::Code;
use crate::args::Global;
use crate::output::clock;

#[derive(Serialize)]
struct Row {
    run_id: String,
    status: String,
    live_pid: Option<u32>,
    tasks: u32,
    created: u64,
    source: String,
    /// The run this one reruns.
    parent: Option<String>,
    /// #32: how many times `sortie recover` rebuilt its journal.
    recovered: u32,
}

/// Lists the runs.
pub(crate) fn list(g: &Global) -> Result<Code> {
    let entries = if g.state_dir.exists() {
        index::list(&g.layout())
            .with_context(|| format!("cannot list runs in {}", g.state_dir.display()))?
    } else {
        Vec::new()
    };
    // Runs whose journal a command found damaged (`sortie_runner::layout::open` records it).
    let mut damaged = Vec::new();
    let rows: Vec<Row> = entries
        .into_iter()
        .map(|e| {
            let live = g.layout().run(&e.run_id).owner();
            let live_pid = match live {
                Owner::Live { pid } => Some(pid.unwrap_or(0)),
                Owner::Free => None,
            };
            // A run whose owner died is resumable, whatever the index last heard.
            let status = match (live_pid, e.status) {
                (None, IndexStatus::Running) => IndexStatus::Interrupted,
                (_, s) => s,
            };
            if let Some(why) = &e.damaged {
                damaged.push(format!("run {}: {why}", e.run_id));
            }
            Row {
                run_id: e.run_id.to_string(),
                status: match e.damaged {
                    Some(_) => "damaged".to_owned(),
                    None => status.to_string(),
                },
                live_pid,
                tasks: e.tasks,
                created: e.created.0,
                source: e.source,
                parent: e.parent.as_ref().map(ToString::to_string),
                recovered: e.recovered,
            }
        })
        .collect();
    let code = if damaged.is_empty() {
        Code::Ok
    } else {
        Code::Corrupt
    };
    let mut out = std::io::stdout().lock();
    if g.json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
        return Ok(say_damaged(&damaged, code));
    }
    if rows.is_empty() {
        writeln!(out, "no runs in {}", g.state_dir.display())?;
    }
    for r in rows {
        writeln!(
            out,
            "{:<22} {:<12} {:>6} tasks  started {}  {}{}",
            r.run_id,
            r.status,
            r.tasks,
            clock(r.created),
            r.source,
            r.parent
                .as_deref()
                .map(|p| format!("  (rerun of {p})"))
                .unwrap_or_default()
                + if r.recovered > 0 {
                    "  (recovered after damage: sortie audit says what)"
                } else {
                    ""
                }
        )?;
    }
    Ok(say_damaged(&damaged, code))
}

/// One line on stderr per damaged run (see `sortie audit RUN`, `sortie recover RUN`).
fn say_damaged(damaged: &[String], code: Code) -> Code {
    let mut err = std::io::stderr().lock();
    for d in damaged {
        let _ = writeln!(err, "sortie: {d}");
    }
    code
}

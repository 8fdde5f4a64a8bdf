//! `sortie list`: the runs in the state dir, newest first, from the run index (no journal is
//! opened).

use std::io::Write;

use crate::error::{Result, ResultExt};
use serde::Serialize;
use sortie_runner::statedir::{self, Owner};

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
}

/// Lists the runs.
pub(crate) fn list(g: &Global) -> Result<Code> {
    let entries = if g.state_dir.exists() {
        sortie_journal::index::list(&g.state_dir)
            .with_context(|| format!("cannot list runs in {}", g.state_dir.display()))?
    } else {
        Vec::new()
    };
    let rows: Vec<Row> = entries
        .into_iter()
        .map(|e| {
            let live = statedir::owner(&statedir::run_dir(&g.state_dir, &e.run_id));
            let live_pid = match live {
                Owner::Live { pid } => Some(pid.unwrap_or(0)),
                Owner::Free => None,
            };
            let status = match (live_pid, e.status.as_str()) {
                (None, "running") => "interrupted".to_owned(),
                (_, s) => s.to_owned(),
            };
            Row {
                run_id: e.run_id.to_string(),
                status,
                live_pid,
                tasks: e.tasks,
                created: e.created.0,
                source: e.source,
            }
        })
        .collect();
    let mut out = std::io::stdout().lock();
    if g.json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
        return Ok(Code::Ok);
    }
    if rows.is_empty() {
        writeln!(out, "no runs in {}", g.state_dir.display())?;
    }
    for r in rows {
        writeln!(
            out,
            "{:<22} {:<12} {:>6} tasks  started {}  {}",
            r.run_id,
            r.status,
            r.tasks,
            clock(r.created),
            r.source
        )?;
    }
    Ok(Code::Ok)
}

//! `sortie report RUN --html FILE`: the run's post-mortem as one self-contained HTML file
//! (`crate::report`).

use std::io::Write;

use super::{Code, find_run, open_read};
use crate::args::{Global, ReportArgs};
use crate::error::{Result, ResultExt};

/// Writes the report of a run (live or not) to `--html FILE`.
pub(crate) fn report(g: &Global, args: &ReportArgs) -> Result<Code> {
    let run = find_run(g, &args.run)?;
    let journal = open_read(&g.layout(), &run)?;
    // The snapshot's verdict is `replay`'s and `audit`'s to say: the report shows the fold.
    let sortie_journal::CheckedReplay { events, state, .. } = journal.replay_checked(None)?;
    let mut view = crate::output::view(&run, &state, None, false);
    view.commands = Vec::new();
    let html = crate::report::html(&state, &events, &view);
    std::fs::write(&args.html, html)
        .with_context(|| format!("cannot write {}", args.html.display()))?;
    let mut out = std::io::stdout().lock();
    if g.json {
        let v = serde_json::json!({
            "run_id": run.to_string(),
            "html": args.html.display().to_string(),
            "tasks": state.tasks.len(),
            "events": events.len(),
        });
        serde_json::to_writer_pretty(&mut out, &v)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "wrote the report of run {run} to {}",
            args.html.display()
        )?;
    }
    Ok(Code::Ok)
}

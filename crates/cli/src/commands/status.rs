//! `sortie status [RUN]`: a run's state, read from its journal, live or not.

use std::io::Write;

use crate::error::Result;
use sortie_runner::layout::Owner;

use super::{Code, newest, open_read, replay_all};
use crate::args::Global;
use crate::output;

/// Prints the state of a run (the newest by default).
pub(crate) fn status(g: &Global, run: Option<&str>) -> Result<Code> {
    let run = match run {
        Some(r) => super::find_run(g, r)?,
        None => newest(&g.layout(), false)?,
    };
    let live_pid = match g.layout().run(&run).owner() {
        Owner::Live { pid } => Some(pid.unwrap_or(0)),
        Owner::Free => None,
    };
    let state = replay_all(&open_read(&g.layout(), &run)?)?;
    let view = output::view(&run, &state, live_pid, false);
    // Buffered: stdout is line-buffered, and a 100,000-task run is as many lines.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if g.json {
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
    } else {
        output::print_status(&mut out, &view)?;
        output::print_kept(&mut out, &view)?;
        output::print_carried(&mut out, &state)?;
        if let Some(pool) = sortie_runner::slots::Pool::configured() {
            writeln!(
                out,
                "machine-wide slots: {} of {} held ({})",
                pool.held(),
                pool.slots,
                pool.dir.display()
            )?;
        }
    }
    out.flush()?;
    // The process ends here: freeing a 100,000-task state and its view one allocation at a
    // time is a tenth of a second of nothing (callgrind: 9% of `status` of that run).
    std::mem::forget(view);
    std::mem::forget(state);
    Ok(Code::Ok)
}

//! `sortie export RUN`: every event of the run as one JSON object per line.

use std::io::{BufWriter, Write};

use anyhow::Result;

use super::{Code, open_read, run_id};
use crate::args::Global;

/// Prints the run's events as JSON Lines on stdout.
pub(crate) fn export(g: &Global, run: &str) -> Result<Code> {
    let run = run_id(run)?;
    let journal = open_read(&g.state_dir, &run)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    for record in journal.read(sortie_core::Seq(0), None) {
        let stamped = record?;
        serde_json::to_writer(&mut out, &stamped)?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(Code::Ok)
}

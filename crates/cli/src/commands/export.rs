//! `sortie export RUN`: every event of the run as one JSON object per line, in the journal's
//! versioned export format (`sortie_journal::ExportRecord`, `"v": 1`, through
//! `RunReader::export`), not core's serde derive: what users parse does not move when core
//! renames a field.

use std::io::{BufWriter, Write};

use crate::error::Result;

use super::{Code, open_read};
use crate::args::Global;

/// Prints the run's events as JSON Lines on stdout.
pub(crate) fn export(g: &Global, run: &str) -> Result<Code> {
    let run = super::find_run(g, run)?;
    let journal = open_read(&g.layout(), &run)?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    for record in journal.export() {
        serde_json::to_writer(&mut out, &record?)?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(Code::Ok)
}

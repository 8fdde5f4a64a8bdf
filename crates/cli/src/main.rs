//! The `sortie` binary: parses the command line, runs the command, exits with its code.
//!
//! Exit codes: 0 completed, 1 failed or partial (or an error), 2 usage error (bad flags, a batch
//! that does not load, an unknown or live run), 3 interrupted (resumable), 4 journal corrupt.
//! Each error gets its code where its type is known (`error`); a closed stdout exits 0.

mod args;
mod board;
mod commands;
mod error;
mod output;
mod summary;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = args::Cli::parse();
    output::init_tracing(args.global.verbose);
    match commands::dispatch(args) {
        Ok(code) => code.into(),
        Err(err) => {
            err.print();
            err.code().into()
        }
    }
}

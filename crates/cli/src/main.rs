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
// #14: shared rate limits.
mod pools;
mod report;
mod summary;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // The per-attempt supervisor (`sortie_runner::process::supervise_main`): hidden, before
    // clap, so that it starts as fast as it can and its argv is taken as is.
    let raw: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if raw.get(1).map(String::as_str) == Some(sortie_runner::process::SUPERVISE_ARG) {
        let code = sortie_runner::process::supervise_main(&raw[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // #10: the run's shepherd (`sortie_runner::process::shepherd_main`), the same way.
    if raw.get(1).map(String::as_str) == Some(sortie_runner::process::SHEPHERD_ARG) {
        let code = sortie_runner::process::shepherd_main();
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Attempts run under a supervisor that outlives this process: this very binary.
    if let Ok(exe) = std::env::current_exe() {
        sortie_runner::executor::use_supervisor(exe);
    }
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

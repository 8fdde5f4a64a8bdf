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
    // Still one thread here: the arena setting must come before any other starts.
    if matches!(
        args.command,
        args::Command::Run(_) | args::Command::Rerun(_)
    ) {
        one_malloc_arena();
    }
    output::init_tracing(args.global.verbose);
    match commands::dispatch(args) {
        Ok(code) => code.into(),
        Err(err) => {
            err.print();
            err.code().into()
        }
    }
}

/// One malloc arena for the whole process, for `run` and `rerun` (a new run, whose memory
/// grows with its tasks for hours). glibc gives each thread that allocates an arena of its own
/// (tokio's workers and blocking threads, sled's threads), and memory freed in one is not
/// reused by another: measured on `sortie run` of 100,000 × `true` (one build, load average 14
/// to 17), 208.8 MB peak RSS with glibc's default, 178.5 MB with one arena
/// (`MALLOC_ARENA_MAX=1`, which this sets in-process; a `MALLOC_ARENA_MAX` in the environment
/// is left to glibc). Not for `status` and `resume`: their snapshot decode and journal scanners
/// allocate on three threads at once, and one arena made them slower (the 100,000-task run,
/// quiet machine: `status` 0.274 -> 0.318 s, `resume` to its first spawn 0.279 -> 0.338 s).
fn one_malloc_arena() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(
        unsafe_code,
        reason = "mallopt is only reachable through libc; the product's one unsafe call"
    )]
    // SAFETY: `mallopt(M_ARENA_MAX, 1)` only sets a tunable of glibc's allocator: it takes no
    // pointer, glibc serializes it with its own lock, and it is called first thing in `main`,
    // before this process starts a thread. A refusal (return value 0) keeps glibc's default,
    // which is correct, only bigger.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

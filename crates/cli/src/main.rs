//! The `sortie` binary: parses the command line, runs the command, exits with its code.
//!
//! Exit codes: 0 completed, 1 failed or partial (or an error), 2 usage error (bad flags, a batch
//! that does not load, an unknown or live run), 3 interrupted (resumable), 4 journal corrupt.
//! Each error gets its code where its type is known (`error`); a closed stdout exits 0.

mod args;
mod board;
mod commands;
mod error;
mod log_lines;
mod output;
// #14: shared rate limits.
mod pools;
mod report;
mod samples;
mod serve;
mod summary;
mod text;
mod verify_view;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // The per-attempt supervisor (`sortie_runner::supervisor::supervise_main`): hidden, before
    // clap, so that it starts as fast as it can and its argv is taken as is.
    let raw: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if raw.get(1).map(String::as_str) == Some(sortie_runner::supervisor::SUPERVISE_ARG) {
        let code = sortie_runner::supervisor::supervise_main(&raw[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // #34: the exec wrapper of a sandboxed attempt (`sortie_runner::supervisor::sandbox_main`):
    // it must run single-threaded, before anything else.
    if raw.get(1).map(String::as_str) == Some(sortie_runner::supervisor::SANDBOX_ARG) {
        let code = sortie_runner::supervisor::sandbox_main(&raw[2..]);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // #10: the run's shepherd (`sortie_runner::supervisor::shepherd_main`), the same way.
    if raw.get(1).map(String::as_str) == Some(sortie_runner::supervisor::SHEPHERD_ARG) {
        let code = sortie_runner::supervisor::shepherd_main();
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    // Attempts run under a supervisor that outlives this process: this very binary.
    if let Ok(exe) = std::env::current_exe() {
        sortie_runner::executor::use_supervisor(exe);
    }
    let args = match args::Cli::try_parse() {
        Ok(args) => args,
        Err(e) => return parse_error(&e, &raw),
    };
    let json = args.global.json;
    // Still one thread here: the allocator's settings must come before any other starts.
    if matches!(
        args.command,
        args::Command::Run(_) | args::Command::Rerun(_)
    ) {
        tune_malloc();
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    sortie_runner::engine::on_release_memory(trim_malloc);
    output::init_tracing(args.global.verbose);
    match commands::dispatch(args) {
        Ok(code) => code.into(),
        Err(err) => {
            err.print(json);
            err.code().into()
        }
    }
}

/// clap's own error (or the help it was asked for): printed as clap prints it, or with
/// `--json` among the arguments (before a `--`) as any other error is (`error::print_json`),
/// the first paragraph of clap's message, with its exit code.
fn parse_error(e: &clap::Error, raw: &[String]) -> ExitCode {
    let json = raw
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    if !json || !e.use_stderr() {
        e.exit();
    }
    let text = e.render().to_string();
    let text = text.trim_start_matches("error: ");
    let first = text.split("\n\n").next().unwrap_or(text).trim();
    let code = match e.exit_code() {
        0 => error::Code::Ok,
        2 => error::Code::Usage,
        _ => error::Code::Failed,
    };
    error::print_json(first, code);
    code.into()
}

/// glibc's allocator for `run` and `rerun` (a new run, whose memory grows with its tasks for
/// hours): one malloc arena for the whole process. glibc gives each thread that allocates an
/// arena of its own (tokio's workers and blocking threads, sled's threads), and memory freed in
/// one is not reused by another: measured on `sortie run` of 100,000 × `true` (one build, load average 14
/// to 17), 208.8 MB peak RSS with glibc's default, 178.5 MB with one arena
/// (`MALLOC_ARENA_MAX=1`, which this sets in-process; a `MALLOC_ARENA_MAX` in the environment
/// is left to glibc). Not for `status` and `resume`: their snapshot decode and journal scanners
/// allocate on three threads at once, and one arena made them slower (the 100,000-task run,
/// quiet machine: `status` 0.274 -> 0.318 s, `resume` to its first spawn 0.279 -> 0.338 s).
///
/// And a fixed mmap threshold of 128 KiB: glibc starts there but raises the threshold each time
/// a mapped block is freed (up to 32 MiB), after which large, short-lived buffers (a round's
/// events, sled's page table rebuilt at every reopen, a snapshot's tables) come from the one
/// heap, whose free space in the middle is never given back, so the long-lived task records
/// settle between them and the heap only grows. Fixed, each such block is its own mapping,
/// returned whole when freed. Measured on `sortie run` of 100,000 × `true` at 64 (2026-12-03,
/// load average 10 to 16, the owner's 1 MiB sled cache): peak RSS 167.2 MB with glibc's
/// sliding threshold, 147.0 MB fixed by the environment and 146.6 MB by this (78.9 s user and
/// 39.3 s sys of CPU, and 78.2 s and 40.7 s, the two run side by side); 5,000 × `true` at 16,
/// three rounds each: 6.27 s and 6.29 s of CPU; 64 KiB: 143.7 MB, within the noise. A
/// `MALLOC_MMAP_THRESHOLD_` in the environment is left to glibc.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            mallopt(libc::M_ARENA_MAX, 1);
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
        }
    }
}

/// Gives the free memory of glibc's heap back to the system (`malloc_trim`), called by a run's
/// owner after each snapshot and before the run's last event (see
/// `sortie_runner::engine::on_release_memory`). The heap's free space in the middle (what a
/// round's buffers, sled's page table before a reopen and the tasks' attempts in flight left) is
/// otherwise never given back, and the run's end, its peak, comes on top of it. Measured on
/// `sortie run` of 100,000 × `true` at 64 (2026-12-03, load average 2 to 4, one run each):
/// peak RSS 100.4 MB without it; 94.3 MB with the trim before the last event alone (which gave
/// back 9 MB there); 95.9 and 96.9 MB with both (the gain depends on how much of the free space
/// lies in whole pages: ~2 MB before the last event in the first of those).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(
    unsafe_code,
    reason = "malloc_trim is only reachable through libc, like mallopt below"
)]
fn trim_malloc() {
    // SAFETY: `malloc_trim` takes no pointer and only returns free pages of glibc's heaps to
    // the system (madvise), under glibc's own arena locks; it may be called from any thread at
    // any time. Its result (whether anything was released) needs no handling.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Sets one of glibc's allocator tunables.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(
    unsafe_code,
    reason = "mallopt is only reachable through libc; with malloc_trim, the product's only unsafe calls"
)]
fn mallopt(param: libc::c_int, value: libc::c_int) {
    // SAFETY: `mallopt` only sets a tunable of glibc's allocator: it takes no pointer, glibc
    // serializes it with its own lock, and it is called first thing in `main`, before this
    // process starts a thread. A refusal (return value 0) keeps glibc's default, which is
    // correct, only bigger.
    unsafe {
        libc::mallopt(param, value);
    }
}

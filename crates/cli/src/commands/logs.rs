//! `sortie logs RUN LABEL [--attempt N] [--follow] [--stderr | --verify]`: prints an attempt's
//! transcript (or, #33, `--verify`: the output of its check),
//! the agent's stdout as it wrote it (raw: for pi, Claude Code and Codex, their JSON Lines, for
//! `jq`), jumping over what the transcript cap cut (said on stderr), the secrets the task was
//! given by reference shown as `[redacted:NAME]` (#34). `--follow` prints what a
//! live attempt writes until it ends; it reads the files only, so it works from any terminal
//! while the run goes, and never touches the run.

use std::io::Write;

use sortie_runner::transcript::{self, CutNotice, Reading, Step, Transcript};

use super::{Code, open_read, replay_all};
use crate::args::{Global, LogsArgs};
use crate::error::{CliError, Result};

/// Prints the transcript.
pub(crate) fn logs(g: &Global, args: &LogsArgs) -> Result<Code> {
    let run = super::find_run(g, &args.run)?;
    let layout = g.layout();
    let state = replay_all(&open_read(&layout, &run)?)?;
    let label = &args.label;
    let task = state.task_by_label(label).ok_or_else(|| {
        CliError::usage(format_args!(
            "run {run} has no task {label:?} (see `sortie status {run}`)"
        ))
    })?;
    let run_dir = layout.run(&run);
    if args.verify {
        return check_log(&state, &run_dir, task, args);
    }
    let all = transcript::of_task(&state, &run_dir, task);
    let t = pick(&all, args.attempt)
        .map_err(|why| CliError::usage(format_args!("task {label} of run {run} {why}")))?;
    let path = if args.stderr { &t.stderr } else { &t.path };
    let waits = args.follow && transcript::may_grow(t, &run_dir);
    if !path.exists() && !waits {
        return Err(CliError::usage(format_args!(
            "attempt {} of task {label} in run {run} has no transcript at {} (it never started, \
             or `sortie gc` removed it)",
            t.attempt,
            path.display()
        )));
    }
    let mut reading = if args.follow {
        Reading::following(path, t, &run_dir)
    } else {
        Reading::new(path)
    };
    let mut out = Redacting {
        out: std::io::stdout().lock(),
        redactor: redactor_of(&run_dir, state.tasks.len(), task),
        line: Vec::new(),
    };
    while let Step::Cut(notice) = reading.next(&mut out)? {
        tell_cut(&notice);
    }
    drop(out);
    if args.follow
        && let Some(exit) = t.exit()
    {
        eprintln!(
            "sortie: attempt {} of task {label} ended with {exit}",
            t.attempt
        );
    }
    Ok(Code::Ok)
}

/// #33: prints the kept output of the task's check of attempt `--attempt` (default: the last
/// attempt that was checked).
fn check_log(
    state: &sortie_core::RunState,
    run_dir: &sortie_runner::layout::RunDir,
    task: sortie_core::TaskId,
    args: &LogsArgs,
) -> Result<Code> {
    let (run, label) = (&args.run, &args.label);
    let rec = state
        .task(task)
        .ok_or_else(|| CliError::usage(format_args!("run {run} has no task {label:?}")))?;
    let checked = rec
        .attempts
        .iter()
        .rev()
        .filter(|a| a.verify_started())
        .find(|a| args.attempt.is_none_or(|n| a.attempt.0 == n))
        .ok_or_else(|| {
            CliError::usage(format_args!(
                "task {label} of run {run} has no check{} (its `verify` runs once an attempt \
                 completes)",
                args.attempt
                    .map(|n| format!(" of attempt {n}"))
                    .unwrap_or_default()
            ))
        })?;
    let path = run_dir.check_file(task.0, checked.attempt.0, "log");
    let text = std::fs::read(&path).map_err(|e| {
        CliError::usage(format_args!(
            "the check of attempt {} of task {label} has no output at {} ({e}; it is still \
             running, or `sortie gc` removed it)",
            checked.attempt,
            path.display()
        ))
    })?;
    let mut out = Redacting {
        out: std::io::stdout().lock(),
        redactor: redactor_of(run_dir, state.tasks.len(), task),
        line: Vec::new(),
    };
    out.write_all(&text).map_err(CliError::from)?;
    Ok(Code::Ok)
}

/// Says on stderr what a cut left out of the transcript.
fn tell_cut(notice: &CutNotice) {
    let cut = &notice.cut;
    eprintln!(
        "sortie: bytes {}..{} ({}) of this transcript were cut to keep it under its cap ({}); \
         the lines at the cut's edges are left out",
        cut.from,
        cut.to,
        size(cut.bytes()),
        notice.cap_var
    );
    if let Some(unread) = cut.unread {
        eprintln!(
            "sortie: bytes {unread}..{} ({}) of them were cut before sortie read them (the \
             transcript outgrew {} times its cap while sortie was down): the usage and tool \
             calls in them are not counted",
            cut.to,
            size(cut.unread_bytes()),
            notice.hard_factor
        );
    }
}

/// The attempt asked for (default: the last), or why there is none.
fn pick(all: &[Transcript], attempt: Option<u32>) -> std::result::Result<&Transcript, String> {
    match (attempt, all.last()) {
        (_, None) => Err("has not started an attempt yet".into()),
        (None, Some(last)) => Ok(last),
        (Some(n), Some(last)) => all.iter().find(|t| t.attempt == n).ok_or_else(|| {
            format!(
                "has no attempt {n} (its attempts: {}..={})",
                all[0].attempt, last.attempt
            )
        }),
    }
}

/// A size for people: `812 B`, `12.3 KiB`, `80.0 MiB`.
pub(crate) fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// #34: the secrets of `task` that its run's references name, read again now (one that cannot
/// be read is left out: the transcript files of an ended attempt are masked already).
fn redactor_of(
    run_dir: &sortie_runner::layout::RunDir,
    tasks: usize,
    task: sortie_core::TaskId,
) -> sortie_batch::Redactor {
    let mut redactor = sortie_batch::Redactor::default();
    let env = run_dir.load_env(tasks).unwrap_or_default();
    for (name, value) in env.get(task.index()).map(Vec::as_slice).unwrap_or_default() {
        if value.is_reference()
            && let Ok(v) = value.resolve(name)
        {
            redactor.add(name, &v);
        }
    }
    redactor
}

/// #34: writes whole lines with the task's secrets replaced by `[redacted:NAME]` and a masked
/// secret's padding left out (see `transcript::mask_file`).
struct Redacting<W: Write> {
    out: W,
    redactor: sortie_batch::Redactor,
    line: Vec<u8>,
}

impl<W: Write> Redacting<W> {
    fn emit(&mut self, upto: usize) -> std::io::Result<()> {
        let line: Vec<u8> = self.line.drain(..upto).collect();
        let clean = sortie_batch::unpad(&line);
        if self.redactor.is_empty() {
            self.out.write_all(&clean)
        } else {
            self.out.write_all(&self.redactor.redact_bytes(&clean))
        }
    }
}

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        while let Some(i) = self.line.iter().position(|&b| b == b'\n') {
            self.emit(i + 1)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl<W: Write> Drop for Redacting<W> {
    /// A last line without its newline.
    fn drop(&mut self) {
        let n = self.line.len();
        if n > 0 {
            let _ = self.emit(n);
        }
        let _ = self.out.flush();
    }
}

//! The inside of an attempt dir (`runs/<run>/attempts/<task>.<attempt>`), or the files beside
//! its name: the names of the files an attempt leaves there ([`STDOUT_FILE`], [`STDERR_FILE`],
//! [`STARTED_FILE`], [`EXIT_FILE`], [`STDIN_FIFO`]), where its transcript is ([`AttemptFiles`]:
//! inside or beside), and the two records written there (`started`: [`StartedFile`]; `exit`:
//! `exit_text`, `parse_exit`). Whoever writes them (a supervisor, the shepherd, the direct
//! executor, a Slurm job) and whoever reads them take the names and formats from here.
//!
//! The files of an attempt dir:
//! - `stdout`, `stderr`: the agent's output, written by the agent itself (no pipe through
//!   sortie or the supervisor: a crash of either costs the agent nothing), or by sortie's
//!   reader for a direct attempt; beside them the transcript's `<file>.cut` and `<file>.read`
//!   (see `transcript`);
//! - `started`: `<agent pid> <agent start time> <supervisor pid> <supervisor start time>`;
//! - `exit`: `code <n>` or `signal <n>`, once everything of the attempt is gone;
//! - `stdin`: #10, the FIFO of an attempt driven over stdin;
//! - `nospace`: #32, empty, written before `exit` when the agent failed while the disk of its
//!   output was full ([`output_disk_full`]): its writes failed, not the task (the shepherd
//!   records the same as a `nospace` line of its status log);
//! - `job.sh`, `job`: a Slurm job's script and id (see `executor::slurm`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sortie_protocol::Exit;

/// The agent's stdout in an attempt dir: its transcript.
pub const STDOUT_FILE: &str = "stdout";
/// The agent's stderr in an attempt dir.
pub const STDERR_FILE: &str = "stderr";
/// The `started` record of an attempt dir ([`StartedFile`]).
pub const STARTED_FILE: &str = "started";
/// The `exit` record of an attempt dir (`exit_text`).
pub const EXIT_FILE: &str = "exit";

/// #32: the mark that the agent failed while the disk of its output was full (empty).
pub const NOSPACE_FILE: &str = "nospace";

/// #32: below this many free bytes (for this user) the disk of an attempt's output counts as
/// full: a write of the agent's failed or was about to (one 64 KiB pipe's worth).
const FULL_BELOW: u64 = 64 * 1024;

/// #32: whether the disk holding `files` is full (fewer than 64 KiB free for this user: root
/// may use the blocks reserved for it). Read when an agent failed: a full disk makes its own
/// writes fail (`No space left on device`), and it exits nonzero through no fault of the task.
pub fn output_disk_full(files: &AttemptFiles) -> bool {
    files.stdout.parent().is_some_and(disk_full)
}

/// #32: whether the disk holding `dir` is full (see [`output_disk_full`]).
pub fn disk_full(dir: &Path) -> bool {
    let Ok(st) = nix::sys::statvfs::statvfs(dir) else {
        return false;
    };
    let blocks = if nix::unistd::geteuid().is_root() {
        st.blocks_free()
    } else {
        st.blocks_available()
    };
    blocks.saturating_mul(st.fragment_size()) < FULL_BELOW
}

/// #10: an attempt driven over stdin (pi's RPC mode) gets, in its attempt dir, a FIFO of this
/// name that its supervisor forwards to the agent's stdin: sortie writes commands into it (and
/// a resumed sortie again), and the supervisor holds it open, so that a crash of sortie does
/// not close the agent's stdin. A line holding only [`STDIN_CLOSE`] closes it.
pub const STDIN_FIFO: &str = "stdin";
/// See [`STDIN_FIFO`]: the line that closes the agent's stdin (never in a JSON command).
pub const STDIN_CLOSE: &[u8] = b"\0\n";

/// Where an attempt's `stdout` and `stderr` are. An attempt the run's shepherd starts (the
/// default) has no directory of its own: its files lie beside the name of its attempt dir,
/// `<task>.<attempt>.stdout` and `.stderr` in the run's `attempts/` (a directory per attempt
/// cost a `mkdir`, a block of the disk and an inode each; the shepherd's status log already
/// keeps its records there). Every other attempt (a supervisor of its own, the direct executor,
/// a Slurm job) and every attempt of a run that a sortie before the change started has them
/// inside its dir.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttemptFiles {
    /// The agent's stdout: its transcript.
    pub stdout: PathBuf,
    /// The agent's stderr.
    pub stderr: PathBuf,
}

impl AttemptFiles {
    /// Beside the attempt dir `dir`, which is never created (the shepherd's attempts).
    pub fn beside(dir: &Path) -> AttemptFiles {
        let named = |suffix: &str| {
            let mut name = dir.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        };
        AttemptFiles {
            stdout: named(".stdout"),
            stderr: named(".stderr"),
        }
    }

    /// Inside the attempt dir `dir`.
    pub fn inside(dir: &Path) -> AttemptFiles {
        AttemptFiles {
            stdout: dir.join(STDOUT_FILE),
            stderr: dir.join(STDERR_FILE),
        }
    }

    /// Those of an attempt placed with the dir `dir`, whoever started it: inside it when it is
    /// a directory, else beside it.
    pub fn of(dir: &Path) -> AttemptFiles {
        if dir.is_dir() {
            AttemptFiles::inside(dir)
        } else {
            AttemptFiles::beside(dir)
        }
    }

    /// Whether `path` is an attempt's stdout (inside its dir or beside it).
    pub fn is_stdout(path: &Path) -> bool {
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == STDOUT_FILE || n.ends_with(".stdout"))
    }
}

/// What `started` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartedFile {
    /// The agent's pid (its process group id).
    pub pid: u32,
    /// The agent's start time.
    pub start_time: u64,
    /// The supervisor's pid.
    pub supervisor: u32,
    /// The supervisor's start time.
    pub supervisor_start: u64,
}

impl StartedFile {
    /// Reads the record's text (see [`StartedFile::text`]).
    pub(crate) fn parse(text: &str) -> Option<StartedFile> {
        let mut f = text.split_ascii_whitespace().map(str::parse::<u64>);
        let mut next = || f.next()?.ok();
        Some(StartedFile {
            pid: u32::try_from(next()?).ok()?,
            start_time: next()?,
            supervisor: u32::try_from(next()?).ok()?,
            supervisor_start: next()?,
        })
    }

    /// The record's text: its four numbers, with a newline.
    pub(crate) fn text(&self) -> String {
        format!(
            "{} {} {} {}\n",
            self.pid, self.start_time, self.supervisor, self.supervisor_start
        )
    }
}

/// An exit as the exit file (and the shepherd's `exit` line) says it: `code <n>` or
/// `signal <n>`.
pub(crate) fn parse_exit(text: &str) -> Option<Exit> {
    let (kind, n) = text.trim().split_once(' ')?;
    let n: i32 = n.parse().ok()?;
    match kind {
        "code" => Some(Exit::Code(n)),
        "signal" => Some(Exit::Signal(n)),
        _ => None,
    }
}

/// What [`parse_exit`] reads, with a newline.
pub(crate) fn exit_text(exit: Exit) -> String {
    match exit {
        Exit::Code(c) => format!("code {c}\n"),
        Exit::Signal(s) => format!("signal {s}\n"),
    }
}

/// Writes `dir/exit` (the supervisor's format, which `supervisor::read_exit` reads) for a
/// direct attempt, renamed into place.
pub(crate) fn write_exit(dir: &Path, exit: Exit) -> io::Result<()> {
    let tmp = dir.join(".exit.tmp");
    fs::write(&tmp, exit_text(exit))?;
    fs::rename(&tmp, dir.join(EXIT_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempts_files_are_inside_its_dir_when_it_has_one_else_beside_its_name() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (old, new) = (tmp.path().join("0.1"), tmp.path().join("1.1"));
        // A dir of its own (a run of an earlier sortie, a supervisor of its own, Slurm).
        fs::create_dir(&old).expect("mkdir");
        assert_eq!(
            AttemptFiles::of(&old),
            AttemptFiles {
                stdout: old.join("stdout"),
                stderr: old.join("stderr"),
            }
        );
        // None: the shepherd's.
        let beside = AttemptFiles {
            stdout: tmp.path().join("1.1.stdout"),
            stderr: tmp.path().join("1.1.stderr"),
        };
        assert_eq!(AttemptFiles::of(&new), beside);
        assert_eq!(AttemptFiles::beside(&new), beside);
        assert_eq!(AttemptFiles::inside(&new).stdout, new.join("stdout"));
        for stdout in [&beside.stdout, &old.join("stdout")] {
            assert!(AttemptFiles::is_stdout(stdout));
        }
        for other in [&beside.stderr, &old.join("stderr"), &tmp.path().join("1.1")] {
            assert!(!AttemptFiles::is_stdout(other));
        }
    }
}

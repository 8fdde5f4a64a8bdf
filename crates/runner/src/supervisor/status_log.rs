//! #10: the shepherd's status log: one append-only file per directory of attempt dirs (a
//! run's `attempts/`), [`STATUS_LOG`], where the run's shepherd records what the per-attempt
//! supervisor records in two files of each attempt dir (`started`, `exit`; see `supervise`):
//! two inodes and two renames fewer per attempt. One line per record, written by one `write`
//! on a file opened `O_APPEND` (so that records of two shepherds, the one a crashed sortie
//! left and its resume's, never interleave):
//!
//! ```text
//! <attempt dir name> started <pid> <start time> <shepherd pid> <shepherd start time> #<fnv>
//! <attempt dir name> exit code <n>|signal <n> #<fnv>
//! <attempt dir name> forgot #<fnv>
//! <attempt dir name> nospace #<fnv>
//! ```
//!
//! `<fnv>` is the FNV-1a 64 (16 hex digits) of the line before ` #`. Not fsynced, like the
//! supervisor's files (a power loss takes the attempts' processes with it): a line that a
//! power loss tore or filled with zeros fails its check and reads as no record, so its attempt
//! reads as gone (orphaned), never as a wrong status; a writer that finds the file not ending
//! in a newline ends the torn line first. `forgot` (sortie dropped the attempt) takes back its
//! `started`: the attempt has no status, as when the supervisor's `started` file is removed.
//! `nospace` (#32, before its `exit`): the agent failed while the disk of its output was full
//! (what a supervisor's `nospace` file says); a reader that does not know it skips the line.
//!
//! Readers ([`lookup`]) read a log once and then only what was appended since (a resume polls
//! each adopted attempt's status), per log.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use sortie_protocol::Exit;

use crate::layout::attempt::{StartedFile, exit_text, parse_exit};
use crate::sync::lock;

/// The status log's name in the directory of attempt dirs.
pub(super) const STATUS_LOG: &str = "status.log";

/// One record of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Record {
    /// Its agent runs (what `started` holds).
    Started(StartedFile),
    /// It ended so, and everything of it is gone (what `exit` holds).
    Exit(Exit),
    /// sortie dropped it: no status.
    Forgot,
    /// #32: it failed while the disk of its output was full (what `nospace` says).
    NoSpace,
}

/// What the log says of one attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Logged {
    pub(super) started: Option<StartedFile>,
    pub(super) exit: Option<Exit>,
    /// #32: it failed while the disk of its output was full.
    pub(super) nospace: bool,
}

impl Logged {
    fn add(&mut self, record: Record) {
        match record {
            Record::Started(s) => self.started = Some(s),
            // The first exit stands (an attempt ends once).
            Record::Exit(e) => self.exit = self.exit.or(Some(e)),
            Record::Forgot => self.started = None,
            Record::NoSpace => self.nospace = true,
        }
    }
}

/// The log beside the attempt dir `dir`, and the dir's name in it.
fn place(dir: &Path) -> Option<(PathBuf, &str)> {
    Some((dir.parent()?.join(STATUS_LOG), dir.file_name()?.to_str()?))
}

/// The line of `record` for the attempt dir named `name`.
fn line(name: &str, record: &Record) -> String {
    let body = match record {
        Record::Started(s) => format!("{name} started {}", s.text().trim_end()),
        Record::Exit(e) => format!("{name} exit {}", exit_text(*e).trim_end()),
        Record::Forgot => format!("{name} forgot"),
        Record::NoSpace => format!("{name} nospace"),
    };
    let sum = sortie_core::digest::fnv1a(body.as_bytes());
    format!("{body} #{sum:016x}\n")
}

/// The attempt dir's name and the record of one line (without its newline), if it is whole.
fn parse(line: &[u8]) -> Option<(&str, Record)> {
    let line = std::str::from_utf8(line).ok()?;
    let (body, sum) = line.rsplit_once(" #")?;
    if sum.len() != 16
        || u64::from_str_radix(sum, 16).ok()? != sortie_core::digest::fnv1a(body.as_bytes())
    {
        return None;
    }
    let (name, rest) = body.split_once(' ')?;
    let (kind, fields) = rest.split_once(' ').unwrap_or((rest, ""));
    let record = match kind {
        "started" => Record::Started(StartedFile::parse(fields)?),
        "exit" => Record::Exit(parse_exit(fields)?),
        "forgot" if fields.is_empty() => Record::Forgot,
        "nospace" if fields.is_empty() => Record::NoSpace,
        _ => return None,
    };
    Some((name, record))
}

/// A status log open for appending (the shepherd's).
#[derive(Debug)]
pub(super) struct StatusLog {
    file: File,
}

impl StatusLog {
    /// Opens (creates) the log beside the attempt dir `dir`; ends a torn last line.
    pub(super) fn open(dir: &Path) -> io::Result<StatusLog> {
        let (path, _) = place(dir).ok_or_else(|| no_place(dir))?;
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)?;
        let len = file.metadata()?.len();
        let mut last = [0u8; 1];
        if len > 0 && file.read_at(&mut last, len - 1)? == 1 && last[0] != b'\n' {
            file.write_all(b"\n")?;
        }
        Ok(StatusLog { file })
    }

    /// Appends `record` of the attempt dir `dir` (one write).
    pub(super) fn append(&mut self, dir: &Path, record: &Record) -> io::Result<()> {
        let (_, name) = place(dir).ok_or_else(|| no_place(dir))?;
        self.file.write_all(line(name, record).as_bytes())
    }
}

fn no_place(dir: &Path) -> io::Error {
    io::Error::other(format!("{}: not an attempt dir", dir.display()))
}

/// A log read so far: the file it was (device, inode), how far, the bytes of a line not yet
/// ended, and the records by attempt dir name.
#[derive(Default)]
struct Reading {
    file: (u64, u64),
    offset: u64,
    partial: Vec<u8>,
    by_name: HashMap<String, Logged>,
}

impl Reading {
    fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let (head, tail) = rest.split_at(nl);
            rest = &tail[1..];
            let whole;
            let line = if self.partial.is_empty() {
                head
            } else {
                self.partial.extend_from_slice(head);
                whole = std::mem::take(&mut self.partial);
                &whole[..]
            };
            if let Some((name, record)) = parse(line) {
                self.by_name.entry(name.to_owned()).or_default().add(record);
            }
        }
        self.partial.extend_from_slice(rest);
    }
}

/// What the status log beside the attempt dir `dir` says of it (nothing without a log).
pub(super) fn lookup(dir: &Path) -> Logged {
    let Some((path, name)) = place(dir) else {
        return Logged::default();
    };
    let Ok(mut file) = File::open(&path) else {
        return Logged::default();
    };
    let Ok(meta) = file.metadata() else {
        return Logged::default();
    };
    static READ: OnceLock<Mutex<HashMap<PathBuf, Reading>>> = OnceLock::new();
    let mut all = lock(READ.get_or_init(Default::default));
    let read = all.entry(path).or_default();
    let id = (meta.dev(), meta.ino());
    if read.file != id || meta.len() < read.offset {
        *read = Reading {
            file: id,
            ..Reading::default()
        };
    }
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(read.offset)).is_ok() && file.read_to_end(&mut bytes).is_ok() {
        read.offset += bytes.len() as u64;
        read.feed(&bytes);
    }
    read.by_name.get(name).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(pid: u32) -> StartedFile {
        StartedFile {
            pid,
            start_time: 7,
            supervisor: 3,
            supervisor_start: 5,
        }
    }

    #[test]
    fn records_read_back_by_attempt_and_forgot_takes_back_started() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (a, b) = (tmp.path().join("0.1"), tmp.path().join("1.1"));
        let mut log = StatusLog::open(&a).expect("open");
        log.append(&a, &Record::Started(started(10)))
            .expect("append");
        log.append(&b, &Record::Started(started(11)))
            .expect("append");
        assert_eq!(lookup(&a).started, Some(started(10)));
        assert_eq!(lookup(&a).exit, None);
        // Read on from where the first lookup stopped.
        log.append(&a, &Record::Exit(Exit::Signal(9)))
            .expect("append");
        log.append(&b, &Record::Forgot).expect("append");
        assert_eq!(
            lookup(&a),
            Logged {
                started: Some(started(10)),
                exit: Some(Exit::Signal(9)),
                nospace: false,
            }
        );
        assert_eq!(lookup(&b), Logged::default());
        // #32: a failure on a full disk says so before its exit.
        log.append(&b, &Record::NoSpace).expect("append");
        log.append(&b, &Record::Exit(Exit::Code(1)))
            .expect("append");
        assert!(lookup(&b).nospace);
        assert_eq!(lookup(&b).exit, Some(Exit::Code(1)));
        assert_eq!(lookup(&tmp.path().join("2.1")), Logged::default());
    }

    #[test]
    fn a_torn_or_zeroed_line_is_no_record_and_the_next_writer_ends_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = tmp.path().join("0.1");
        let whole = line("0.1", &Record::Exit(Exit::Code(0)));
        // Every cut of a line, and the line with a byte zeroed (a power loss), reads as nothing.
        for cut in 0..whole.len() - 1 {
            assert_eq!(parse(&whole.as_bytes()[..cut]), None, "cut at {cut}");
            let mut zeroed = whole.as_bytes()[..whole.len() - 1].to_vec();
            zeroed[cut] = 0;
            assert_eq!(parse(&zeroed), None, "zero at {cut}");
        }
        // A code changed by one digit fails the check: never a wrong status.
        let wrong = whole.replace("code 0", "code 1");
        assert_eq!(parse(wrong.trim_end().as_bytes()), None);
        // A torn last line: the next writer ends it before its own record.
        std::fs::write(tmp.path().join(STATUS_LOG), &whole.as_bytes()[..10]).expect("write");
        let mut log = StatusLog::open(&a).expect("open");
        log.append(&a, &Record::Started(started(10)))
            .expect("append");
        assert_eq!(
            lookup(&a),
            Logged {
                started: Some(started(10)),
                exit: None,
                nospace: false,
            }
        );
    }
}

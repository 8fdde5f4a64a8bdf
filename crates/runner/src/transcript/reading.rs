//! Reading a transcript for a person (`sortie logs`): its whole lines from the start, across
//! the cap's cuts (each one told, with what the reader needs to say about it), and with
//! `--follow` on as the attempt writes, until nothing can write to it any more.

use std::io::{self, Write};
use std::path::Path;
use std::time::Duration;

use super::kept::{CAP_VAR, Cut, HARD_FACTOR, Kept, KeptReader, WholeLines};
use super::list::{Transcript, may_grow};
use crate::layout::RunDir;

/// How often a followed transcript is looked at for more.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// A cut met on the way, with what a reader is told about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutNotice {
    /// The byte range cut out (the lines at its edges are left out too).
    pub cut: Cut,
    /// The environment variable that sets the cap.
    pub cap_var: &'static str,
    /// How many times its cap a transcript may grow to before unread bytes are cut.
    pub hard_factor: u64,
}

/// What [`Reading::next`] met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A cut: the whole lines before it are written.
    Cut(CutNotice),
    /// The end: every whole line is written and flushed (following: nothing can write more).
    End,
}

/// A transcript file being read as whole lines.
pub struct Reading<'a> {
    reader: KeptReader,
    lines: WholeLines,
    buf: Vec<u8>,
    /// Following: the transcript and its run, asked whether anything may still write.
    follow: Option<(&'a Transcript, &'a RunDir)>,
    last_look: bool,
}

impl std::fmt::Debug for Reading<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reading")
            .field("offset", &self.reader.offset())
            .field("follow", &self.follow.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> Reading<'a> {
    /// Reads `path` (a transcript's stdout or stderr) from its start to its current end.
    pub fn new(path: &Path) -> Reading<'a> {
        Reading {
            reader: KeptReader::new(path, 0),
            lines: WholeLines::default(),
            buf: vec![0u8; 64 * 1024],
            follow: None,
            last_look: false,
        }
    }

    /// Reads `path`, a file of `t`, on while anything may still write to `t` (see
    /// [`may_grow`]), and once more after that for what was written last.
    pub fn following(path: &Path, t: &'a Transcript, run_dir: &'a RunDir) -> Reading<'a> {
        Reading {
            follow: Some((t, run_dir)),
            ..Reading::new(path)
        }
    }

    /// Writes whole lines to `out` until a cut or the end.
    pub fn next(&mut self, out: &mut impl Write) -> io::Result<Step> {
        loop {
            match self.reader.read(&mut self.buf)? {
                Kept::Bytes(n) => self.lines.push(&self.buf[..n], out)?,
                Kept::Cut(cut) => {
                    self.lines.cut();
                    return Ok(Step::Cut(CutNotice {
                        cut,
                        cap_var: CAP_VAR,
                        hard_factor: HARD_FACTOR,
                    }));
                }
                Kept::Idle => {
                    out.flush()?;
                    match self.follow {
                        Some((t, run_dir)) if !self.last_look => {
                            // Once nothing can write anymore, one more look reads what was
                            // written last.
                            self.last_look = !may_grow(t, run_dir);
                            if !self.last_look {
                                std::thread::sleep(FOLLOW_POLL);
                            }
                        }
                        _ => {
                            self.lines.finish(out)?;
                            out.flush()?;
                            return Ok(Step::End);
                        }
                    }
                }
            }
        }
    }
}

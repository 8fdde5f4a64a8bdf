//! Reading a child's output: stdout as bounded lines (a longer line is cut, flagged and the
//! rest of it skipped), stderr into a tail buffer, both readers stopping
//! [`DRAIN_AFTER_EXIT`] after the leader exited.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::exit::ExitSlot;
use crate::sync::lock;
use crate::transcript::Trimmer;

/// The longest stdout line delivered whole; longer lines are cut to this and flagged.
pub const MAX_LINE_BYTES: usize = sortie_protocol::LINE_LIMIT_BYTES;
/// How much of stderr is kept (the end of it).
pub const STDERR_TAIL_BYTES: usize = 50 * 1024;
/// How long the output readers keep reading after the leader exited (for pipes held open by a
/// process that left the group).
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// Lines buffered between the stdout reader and the caller; beyond that the child blocks on
/// its pipe (backpressure, bounded memory).
pub(crate) const LINE_QUEUE: usize = 16;
/// The read size for stdout and stderr.
const READ_CHUNK: usize = 64 * 1024;
/// The first read size: a reader's buffer grows to [`READ_CHUNK`] once a read fills it (most
/// streams are small, and two readers per attempt zeroed 64 KiB each).
pub(crate) const FIRST_CHUNK: usize = 4 * 1024;

/// Grows `buf` to [`READ_CHUNK`] once a read of `n` bytes filled it.
pub(crate) fn grow(buf: &mut Vec<u8>, n: usize) {
    if n == buf.len() && buf.len() < READ_CHUNK {
        buf.resize(READ_CHUNK, 0);
    }
}

/// One stdout line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The text, without its newline (and a `\r` before it), decoded lossily as UTF-8.
    pub text: String,
    /// True when the line was longer than [`MAX_LINE_BYTES`]: `text` is its beginning and the
    /// rest of it was skipped.
    pub truncated: bool,
}

/// Reads a chunk; 0 means stop (end of file, error, or the drain time after exit is over).
async fn read_some<R: AsyncRead + Unpin>(
    src: &mut R,
    buf: &mut [u8],
    exit: &mut watch::Receiver<ExitSlot>,
    deadline: &mut Option<Instant>,
) -> usize {
    loop {
        if deadline.is_none() && exit.borrow().is_some() {
            *deadline = Some(Instant::now() + DRAIN_AFTER_EXIT);
        }
        match *deadline {
            Some(d) => {
                return tokio::select! {
                    r = src.read(buf) => r.unwrap_or(0),
                    _ = tokio::time::sleep_until(d) => 0,
                };
            }
            None => {
                tokio::select! {
                    r = src.read(buf) => return r.unwrap_or(0),
                    changed = exit.changed() => {
                        if changed.is_err() {
                            *deadline = Some(Instant::now() + DRAIN_AFTER_EXIT);
                        }
                    }
                }
            }
        }
    }
}

/// Reads a child's stdout into lines for `tx`, writing what it reads to `transcript` too (a
/// direct attempt's transcript file: sortie writes what it reads).
pub(crate) async fn read_stdout<R: AsyncRead + Unpin>(
    mut src: R,
    tx: mpsc::Sender<Line>,
    bytes: Arc<AtomicU64>,
    mut exit: watch::Receiver<ExitSlot>,
    mut transcript: Option<Trimmer>,
) {
    let mut buf = vec![0u8; FIRST_CHUNK];
    let mut splitter = LineSplitter::new(MAX_LINE_BYTES);
    let mut ready = Vec::new();
    let mut deadline = None;
    // Once the caller is gone, keep draining the pipe so that the child never blocks on it.
    let mut listening = true;
    loop {
        let n = read_some(&mut src, &mut buf, &mut exit, &mut deadline).await;
        if n == 0 {
            break;
        }
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        keep(&mut transcript, &buf[..n]);
        splitter.push(&buf[..n], &mut ready);
        grow(&mut buf, n);
        for line in ready.drain(..) {
            if listening && tx.send(line).await.is_err() {
                listening = false;
            }
        }
    }
    if let Some(t) = transcript.as_mut() {
        let _ = t.check(true);
    }
    if let Some(line) = splitter.finish()
        && listening
    {
        let _ = tx.send(line).await;
    }
}

/// Reads a child's stderr into its tail, writing what it reads to `transcript` too.
pub(crate) async fn read_stderr<R: AsyncRead + Unpin>(
    mut src: R,
    tail: Arc<Mutex<TailBuffer>>,
    mut exit: watch::Receiver<ExitSlot>,
    mut transcript: Option<Trimmer>,
) {
    let mut buf = vec![0u8; FIRST_CHUNK];
    let mut deadline = None;
    loop {
        let n = read_some(&mut src, &mut buf, &mut exit, &mut deadline).await;
        if n == 0 {
            break;
        }
        keep(&mut transcript, &buf[..n]);
        lock(&tail).push(&buf[..n]);
        grow(&mut buf, n);
    }
    if let Some(t) = transcript.as_mut() {
        let _ = t.check(true);
    }
}

/// Writes to a transcript; one that cannot be written is given up (the attempt goes on: the
/// protocol reader has the lines).
fn keep(transcript: &mut Option<Trimmer>, bytes: &[u8]) {
    if let Some(t) = transcript
        && let Err(e) = t.write(bytes)
    {
        tracing::warn!("cannot write a transcript: {e}; it stops here");
        *transcript = None;
    }
}

/// Splits a byte stream into bounded lines.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    current: Vec<u8>,
    /// True while skipping the rest of a line that was cut.
    skipping: bool,
    max: usize,
}

impl LineSplitter {
    pub(crate) fn new(max: usize) -> Self {
        LineSplitter {
            current: Vec::new(),
            skipping: false,
            max,
        }
    }

    pub(crate) fn push(&mut self, mut chunk: &[u8], out: &mut Vec<Line>) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            self.take(&chunk[..i], out);
            if self.skipping {
                self.skipping = false;
            } else {
                let mut bytes = std::mem::take(&mut self.current);
                if bytes.last() == Some(&b'\r') {
                    bytes.pop();
                }
                out.push(line(bytes, false));
            }
            chunk = &chunk[i + 1..];
        }
        self.take(chunk, out);
    }

    /// Adds part of a line; cuts and delivers it when it grows past the limit.
    fn take(&mut self, part: &[u8], out: &mut Vec<Line>) {
        if self.skipping {
            return;
        }
        let room = self.max - self.current.len();
        if part.len() <= room {
            self.current.extend_from_slice(part);
        } else {
            self.current.extend_from_slice(&part[..room]);
            out.push(line(std::mem::take(&mut self.current), true));
            self.skipping = true;
        }
    }

    /// Like [`LineSplitter::push`], with each line's end: the stream offset just after its
    /// newline (`base` is the offset of the chunk's first byte; a line cut at the limit ends
    /// at its newline, or at the chunk's end while its rest is still to come).
    pub(crate) fn push_at(&mut self, chunk: &[u8], base: u64, out: &mut Vec<(Line, u64)>) {
        let mut lines = Vec::new();
        let mut at = 0;
        while let Some(i) = chunk[at..].iter().position(|&b| b == b'\n') {
            self.push(&chunk[at..=at + i], &mut lines);
            at += i + 1;
            out.extend(lines.drain(..).map(|l| (l, base + at as u64)));
        }
        self.push(&chunk[at..], &mut lines);
        let end = base + chunk.len() as u64;
        out.extend(lines.drain(..).map(|l| (l, end)));
    }

    /// The stream jumps over a cut (a transcript's): the partial line goes, and so does the
    /// rest of the line after the cut.
    pub(crate) fn cut(&mut self) {
        self.current.clear();
        self.skipping = true;
    }

    /// The last line when the stream ended without a newline.
    pub(crate) fn finish(self) -> Option<Line> {
        (!self.skipping && !self.current.is_empty()).then(|| line(self.current, false))
    }
}

fn line(bytes: Vec<u8>, truncated: bool) -> Line {
    let text = String::from_utf8(bytes)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    Line { text, truncated }
}

/// The last `cap` bytes of a stream.
#[derive(Debug)]
pub(crate) struct TailBuffer {
    buf: VecDeque<u8>,
    cap: usize,
    dropped: u64,
}

impl TailBuffer {
    pub(crate) fn new(cap: usize) -> Self {
        TailBuffer {
            buf: VecDeque::new(),
            cap,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        let data = if data.len() > self.cap {
            self.dropped += (data.len() - self.cap) as u64;
            &data[data.len() - self.cap..]
        } else {
            data
        };
        let over = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.dropped += over as u64;
        self.buf.extend(data);
    }

    pub(crate) fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut bytes = Vec::with_capacity(self.buf.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        // A cut may have split a character: skip its continuation bytes.
        let start = if self.dropped > 0 {
            bytes
                .iter()
                .take(3)
                .take_while(|b| (**b & 0xC0) == 0x80)
                .count()
        } else {
            0
        };
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_buffer_grows_only_once_a_read_fills_it() {
        let mut buf = vec![0u8; FIRST_CHUNK];
        grow(&mut buf, FIRST_CHUNK - 1);
        assert_eq!(buf.len(), FIRST_CHUNK);
        grow(&mut buf, FIRST_CHUNK);
        assert_eq!(buf.len(), READ_CHUNK);
        grow(&mut buf, READ_CHUNK);
        assert_eq!(buf.len(), READ_CHUNK);
    }

    fn split(chunks: &[&[u8]], max: usize) -> Vec<Line> {
        let mut s = LineSplitter::new(max);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        out.extend(s.finish());
        out
    }

    fn texts(lines: &[Line]) -> Vec<(&str, bool)> {
        lines
            .iter()
            .map(|l| (l.text.as_str(), l.truncated))
            .collect()
    }

    #[test]
    fn splitter_joins_chunks_and_strips_crlf() {
        let lines = split(&[b"he", b"llo\r\nwor", b"ld\n\nlast"], 100);
        assert_eq!(
            texts(&lines),
            [
                ("hello", false),
                ("world", false),
                ("", false),
                ("last", false)
            ]
        );
    }

    #[test]
    fn splitter_cuts_long_lines_and_skips_their_rest() {
        let lines = split(&[b"abcdefgh", b"ijk\nok\n", b"0123456789"], 4);
        assert_eq!(
            texts(&lines),
            [("abcd", true), ("ok", false), ("0123", true)]
        );
        // Exactly the limit is not a cut.
        assert_eq!(texts(&split(&[b"abcd\n"], 4)), [("abcd", false)]);
    }

    #[test]
    fn splitter_gives_each_line_its_end_offset() {
        let mut s = LineSplitter::new(4);
        let mut out = Vec::new();
        s.push_at(b"ab\ncdefgh\nx", 100, &mut out);
        s.push_at(b"y\n", 111, &mut out);
        let got: Vec<(&str, u64)> = out.iter().map(|(l, e)| (l.text.as_str(), *e)).collect();
        assert_eq!(got, [("ab", 103), ("cdef", 110), ("xy", 113)]);
    }

    #[test]
    fn splitter_decodes_garbage_lossily() {
        let lines = split(&[&[0xff, 0xfe, b'a', b'\n', 0xc3]], 100);
        assert_eq!(lines[0].text, "\u{fffd}\u{fffd}a");
        assert_eq!(lines[1].text, "\u{fffd}");
    }

    #[test]
    fn tail_buffer_keeps_the_end_at_a_char_boundary() {
        let mut t = TailBuffer::new(5);
        t.push(b"abc");
        assert_eq!(t.text(), "abc");
        t.push("déf".as_bytes()); // 4 more bytes: "ab" is dropped
        assert_eq!(t.text(), "cdéf");
        t.push("xyzéé".as_bytes()); // 7 bytes, more than the cap
        assert_eq!(t.text(), "zéé");
        t.push("é".as_bytes());
        // The cut falls inside the first é: its continuation byte is skipped.
        assert_eq!(t.text(), "éé");
    }
}

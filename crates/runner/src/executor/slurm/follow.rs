//! Following a job's output file as Slurm writes it: stdout as bounded lines from the start of
//! the file, until the job is over and the file is read to its end; and the tail of its stderr
//! file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::cluster::Seen;
use crate::process::{Line, MAX_LINE_BYTES, STDERR_TAIL_BYTES};

/// How often a growing file is read.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// After the job is over, how long a file that has not grown is still read (a shared
/// filesystem shows the last writes of another node late).
const SETTLE: Duration = Duration::from_millis(500);
const READ_CHUNK: usize = 64 * 1024;

/// Starts following `path`; lines arrive on the receiver, which closes once the job is over
/// and the file read to its end. The counter holds the bytes read.
pub(super) fn follow(
    path: PathBuf,
    job: watch::Receiver<Seen>,
) -> (mpsc::Receiver<Line>, Arc<AtomicU64>) {
    let (tx, rx) = mpsc::channel(1024);
    let bytes = Arc::new(AtomicU64::new(0));
    tokio::spawn(follow_file(path, tx, Arc::clone(&bytes), job));
    (rx, bytes)
}

async fn follow_file(
    path: PathBuf,
    tx: mpsc::Sender<Line>,
    bytes: Arc<AtomicU64>,
    mut job: watch::Receiver<Seen>,
) {
    let mut file: Option<File> = None;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut split = Splitter::default();
    let mut quiet_since_over: Option<tokio::time::Instant> = None;
    loop {
        if file.is_none() {
            file = File::open(&path).ok();
        }
        let n = file.as_mut().map_or(0, |f| f.read(&mut buf).unwrap_or(0));
        if n > 0 {
            bytes.fetch_add(n as u64, Ordering::Relaxed);
            for line in split.push(&buf[..n]) {
                if tx.send(line).await.is_err() {
                    return;
                }
            }
            quiet_since_over = None;
            continue;
        }
        if job.borrow().is_over() {
            let since = *quiet_since_over.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() >= SETTLE {
                break;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
            continue;
        }
        tokio::select! {
            _ = job.changed() => {}
            () = tokio::time::sleep(FOLLOW_POLL) => {}
        }
    }
    if let Some(line) = split.finish() {
        let _ = tx.send(line).await;
    }
}

/// Bytes into lines of at most [`MAX_LINE_BYTES`] (a longer line is cut, flagged, and the rest
/// of it skipped), decoded lossily, without the newline (and a `\r` before it).
#[derive(Default)]
struct Splitter {
    partial: Vec<u8>,
    /// Inside a line that was already delivered cut: skip to its newline.
    skipping: bool,
}

impl Splitter {
    fn push(&mut self, mut chunk: &[u8]) -> Vec<Line> {
        let mut out = Vec::new();
        while !chunk.is_empty() {
            let nl = chunk.iter().position(|&b| b == b'\n');
            let (part, rest) = match nl {
                Some(i) => (&chunk[..i], Some(&chunk[i + 1..])),
                None => (chunk, None),
            };
            if !self.skipping {
                let room = MAX_LINE_BYTES - self.partial.len();
                if part.len() > room {
                    self.partial.extend_from_slice(&part[..room]);
                    out.push(self.take(true));
                    self.skipping = true;
                } else {
                    self.partial.extend_from_slice(part);
                }
            }
            match rest {
                Some(rest) => {
                    if !self.skipping {
                        out.push(self.take(false));
                    }
                    self.skipping = false;
                    chunk = rest;
                }
                None => break,
            }
        }
        out
    }

    fn take(&mut self, truncated: bool) -> Line {
        let mut bytes = std::mem::take(&mut self.partial);
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        Line {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            truncated,
        }
    }

    fn finish(mut self) -> Option<Line> {
        (!self.partial.is_empty() && !self.skipping).then(|| self.take(false))
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a file, decoded lossily from a char boundary.
pub(super) fn tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let from = len.saturating_sub(STDERR_TAIL_BYTES as u64);
    let mut bytes = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut bytes).is_err() {
        return String::new();
    }
    let mut start = 0;
    if from > 0 {
        // Skip a character cut in the middle.
        while start < bytes.len() && (bytes[start] & 0xC0) == 0x80 {
            start += 1;
        }
    }
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(lines: &[Line]) -> Vec<(&str, bool)> {
        lines
            .iter()
            .map(|l| (l.text.as_str(), l.truncated))
            .collect()
    }

    #[test]
    fn lines_split_across_chunks_and_cut_when_too_long() {
        let mut s = Splitter::default();
        assert!(s.push(b"ab").is_empty());
        assert_eq!(
            texts(&s.push(b"c\r\nd\n\ne")),
            [("abc", false), ("d", false), ("", false)]
        );
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let out = s.push(&long);
        assert_eq!(out.len(), 1);
        assert!(out[0].truncated && out[0].text.starts_with('e'));
        assert_eq!(out[0].text.len(), MAX_LINE_BYTES);
        assert_eq!(texts(&s.push(b"xx\nnext")), [] as [(&str, bool); 0]);
        assert_eq!(s.finish().map(|l| l.text), Some("next".to_owned()));
    }

    #[tokio::test]
    async fn a_file_is_followed_until_the_job_is_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let (tx, rx) = watch::channel(Seen::Nothing);
        let (mut lines, bytes) = follow(path.clone(), rx);
        std::fs::write(&path, "one\ntw").unwrap();
        assert_eq!(lines.recv().await.unwrap().text, "one");
        std::fs::write(&path, "one\ntwo\nthree").unwrap();
        assert_eq!(lines.recv().await.unwrap().text, "two");
        tx.send_replace(Seen::Unknown);
        assert_eq!(lines.recv().await.unwrap().text, "three");
        assert!(lines.recv().await.is_none());
        assert_eq!(bytes.load(Ordering::Relaxed), 13);
    }

    #[test]
    fn the_tail_starts_at_a_char_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr");
        let mut text = "é".repeat(STDERR_TAIL_BYTES);
        text.push_str("end");
        std::fs::write(&path, &text).unwrap();
        let t = tail(&path);
        assert!(t.ends_with("end") && !t.contains('\u{fffd}'));
        assert_eq!(tail(&dir.path().join("none")), "");
    }
}

//! Following a job's output file as Slurm writes it: stdout as bounded lines from the start of
//! the file (across the transcript's cut, which this follower makes: see [`follow`]), until the
//! job is over and the file is read to its end; and the tail of its stderr file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::process::lines::LineSplitter;
use crate::process::{Line, MAX_LINE_BYTES, STDERR_TAIL_BYTES};
use crate::transcript::{CHECK_EVERY, Cap, Kept, KeptReader, Trimmer};

/// How often a growing file is read.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// After the job is over, how long a file that has not grown is still read (a shared
/// filesystem shows the last writes of another node late).
const SETTLE: Duration = Duration::from_millis(500);
const READ_CHUNK: usize = 64 * 1024;

/// What a follower asks of a job's latest status (#36: Slurm's and Ray's).
pub(in crate::executor) trait Over: Send + Sync + 'static {
    /// True once nothing more will change: the job's output is complete once read.
    fn is_over(&self) -> bool;
}

/// Starts following `path`; lines arrive on the receiver, which closes once the job is over
/// and the file read to its end. The counter holds the end of the last line read (the offset
/// just after it: what the journal may record as read, `AttemptRead`); the second, the end of
/// the last cut of the file the reads jumped (0: none).
///
/// #10: sortie's follower is the one cutter of a job's files while the job runs (nothing of
/// sortie's runs beside the job on its node): its stdout is cut to the cap below what the
/// journal acknowledged (`transcript::write_read`), its stderr at once; the reads jump the cut.
pub(in crate::executor) fn follow<S: Over>(
    path: PathBuf,
    job: watch::Receiver<S>,
) -> (mpsc::Receiver<Line>, [Arc<AtomicU64>; 2]) {
    let (tx, rx) = mpsc::channel(1024);
    let bytes = Arc::new(AtomicU64::new(0));
    let cut_to = Arc::new(AtomicU64::new(0));
    tokio::spawn(follow_file(
        path,
        tx,
        [Arc::clone(&bytes), Arc::clone(&cut_to)],
        job,
    ));
    (rx, [bytes, cut_to])
}

async fn follow_file<S: Over>(
    path: PathBuf,
    tx: mpsc::Sender<Line>,
    [bytes, cut_to]: [Arc<AtomicU64>; 2],
    mut job: watch::Receiver<S>,
) {
    let mut reader = KeptReader::new(&path, 0);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut split = LineSplitter::new(MAX_LINE_BYTES);
    let mut ready = Vec::new();
    let mut quiet_since_over: Option<tokio::time::Instant> = None;
    let mut cutter = Cutter::new(&path);
    loop {
        cutter.look();
        let base = reader.offset();
        match reader.read(&mut buf).unwrap_or(Kept::Idle) {
            Kept::Bytes(n) => {
                split.push_at(&buf[..n], base, &mut ready);
                for (line, end) in ready.drain(..) {
                    bytes.store(end, Ordering::Relaxed);
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
                quiet_since_over = None;
                continue;
            }
            Kept::Cut(cut) => {
                split.cut();
                cut_to.fetch_max(cut.to, Ordering::Relaxed);
                continue;
            }
            Kept::Idle => {}
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
        bytes.store(reader.offset(), Ordering::Relaxed);
        let _ = tx.send(line).await;
    }
}

/// The cutter of a job's stdout and stderr (see [`follow`]), each opened once Slurm created
/// it, looked at every [`CHECK_EVERY`] at most.
struct Cutter {
    cap: Cap,
    files: Vec<PathBuf>,
    trimmers: Vec<Trimmer>,
    last: Option<std::time::Instant>,
}

impl Cutter {
    fn new(stdout: &Path) -> Cutter {
        let cap = Cap::from_env();
        let files = if cap.is_unbounded() {
            Vec::new()
        } else {
            vec![
                stdout.to_path_buf(),
                stdout.with_file_name(crate::layout::attempt::STDERR_FILE),
            ]
        };
        Cutter {
            cap,
            files,
            trimmers: Vec::new(),
            last: None,
        }
    }

    fn look(&mut self) {
        if (self.files.is_empty() && self.trimmers.is_empty())
            || self.last.is_some_and(|t| t.elapsed() < CHECK_EVERY)
        {
            return;
        }
        self.last = Some(std::time::Instant::now());
        let (cap, trimmers) = (self.cap, &mut self.trimmers);
        self.files.retain(|f| match Trimmer::open(f, cap) {
            Ok(t) => {
                trimmers.push(t);
                false
            }
            Err(_) => true,
        });
        for t in &mut self.trimmers {
            let _ = t.check(false);
        }
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a file, decoded lossily from a char boundary.
pub(in crate::executor) fn tail(path: &Path) -> String {
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
    use super::super::cluster::Seen;
    use super::*;

    #[tokio::test]
    async fn a_file_is_followed_until_the_job_is_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout");
        let (tx, rx) = watch::channel(Seen::Nothing);
        let (mut lines, [bytes, cut_to]) = follow(path.clone(), rx);
        std::fs::write(&path, "one\ntw").unwrap();
        assert_eq!(lines.recv().await.unwrap().text, "one");
        std::fs::write(&path, "one\ntwo\nthree").unwrap();
        assert_eq!(lines.recv().await.unwrap().text, "two");
        tx.send_replace(Seen::Unknown);
        assert_eq!(lines.recv().await.unwrap().text, "three");
        assert!(lines.recv().await.is_none());
        assert_eq!(bytes.load(Ordering::Relaxed), 13);
        assert_eq!(cut_to.load(Ordering::Relaxed), 0, "nothing was cut");
    }

    /// #10: a job's stdout cut below what the journal acknowledged (by the follower of a
    /// sortie that died since): a new follower reads from the start, jumps the cut and says
    /// where it ended, so that a resume counts the cut lines' usage from the journal.
    #[tokio::test]
    async fn a_follower_says_where_the_cut_it_jumped_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(crate::layout::attempt::STDOUT_FILE);
        let line = format!("{}\n", "x".repeat(99));
        std::fs::write(&path, line.repeat(640)).unwrap();
        crate::transcript::write_read(&path, 48 * 1024).unwrap();
        let cap = Cap::parse("16KiB").unwrap();
        crate::transcript::Trimmer::open(&path, cap)
            .unwrap()
            .check(true)
            .unwrap();
        let cut = crate::transcript::read_cut(&path).expect("the file was cut");
        let (tx, rx) = watch::channel(Seen::Unknown);
        let (mut lines, [bytes, cut_to]) = follow(path.clone(), rx);
        while lines.recv().await.is_some() {}
        drop(tx);
        assert_eq!(cut_to.load(Ordering::Relaxed), cut.to);
        assert!(cut.to > 0 && cut.to <= bytes.load(Ordering::Relaxed));
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

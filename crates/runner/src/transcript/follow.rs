//! Following a supervised attempt from its files (see `supervisor`): its stdout as bounded
//! lines, read from the start of the file (or, adopted, from the journaled offset) as it
//! grows, across the transcript's cut, its exit from its exit record once the
//! supervisor recorded it, and a [`Stopper`] over its process group (behind the pid-reuse
//! guard). The same follower serves an attempt this process launched (it waits on the
//! supervisor, its child) and one adopted after a crash (it polls the files and `/proc`).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use tokio::sync::{mpsc, watch};

use super::kept::{Kept, KeptReader};
use crate::layout::attempt::{AttemptFiles, StartedFile};
use crate::process::exit::ExitSlot;
use crate::process::lines::{
    FIRST_CHUNK, LINE_QUEUE, LineSplitter, MAX_LINE_BYTES, STDERR_TAIL_BYTES, TailBuffer, grow,
};
use crate::process::procfs::{is_running, pid_of};
use crate::process::{Line, Stopper, WaitError, wait_orphan};
use crate::supervisor::{DirPresence, Forget, Shepherded, presence, read_exit};

/// How often a growing stdout file is read while the attempt runs.
const FOLLOW_POLL: Duration = Duration::from_millis(50);
/// How often an adopted attempt's dir is looked at for its end.
const ADOPT_POLL: Duration = Duration::from_millis(100);

/// A supervised attempt, followed through its files.
#[derive(Debug)]
pub struct Followed {
    /// What its supervisor recorded.
    pub started: StartedFile,
    /// Its stdout and stderr.
    files: AttemptFiles,
    stopper: Stopper,
    lines: mpsc::Receiver<(Line, u64)>,
    exit: watch::Receiver<ExitSlot>,
    stdout_bytes: Arc<AtomicU64>,
    /// The end of the last cut jumped over (0: none yet).
    cut_to: Arc<AtomicU64>,
    /// The end of the last line delivered (a line's end in the stdout file).
    line_end: u64,
    forget: Option<Forget>,
}

/// What tells a follower that its attempt ended.
#[derive(Debug)]
pub enum Watcher {
    /// The attempt's own supervisor, a child of this process: its exit.
    Supervisor(tokio::process::Child),
    /// The run's shepherd: its `exit` line.
    Shepherd(Shepherded),
    /// Nothing: an adopted attempt, whose dir and `/proc` are polled.
    Files,
}

impl Followed {
    /// Follows the attempt placed with the dir `dir`, whose output goes to `files`, its stdout
    /// from byte `from`; `watcher` says how its end is seen (at once when this process started
    /// it, by polling for an adopted attempt).
    pub fn new(
        dir: &Path,
        files: AttemptFiles,
        from: u64,
        started: StartedFile,
        watcher: Watcher,
    ) -> Followed {
        let (exit_tx, exit_rx) = watch::channel(None);
        let dir = dir.to_path_buf();
        let (watcher, forget) = match watcher {
            Watcher::Shepherd(s) => (Ended::Shepherd(s.ended), Some(s.forget)),
            Watcher::Supervisor(child) => (Ended::Supervisor(child), None),
            Watcher::Files => (Ended::Files, None),
        };
        tokio::spawn(watch_exit(dir, started, watcher, exit_tx));
        let (line_tx, lines) = mpsc::channel(LINE_QUEUE);
        let stdout_bytes = Arc::new(AtomicU64::new(0));
        let cut_to = Arc::new(AtomicU64::new(0));
        tokio::spawn(follow_stdout(
            files.stdout.clone(),
            from,
            line_tx,
            [Arc::clone(&stdout_bytes), Arc::clone(&cut_to)],
            exit_rx.clone(),
        ));
        Followed {
            stopper: Stopper::external(started.pid, started.start_time, exit_rx.clone()),
            started,
            files,
            lines,
            exit: exit_rx,
            stdout_bytes,
            cut_to,
            line_end: from,
            forget,
        }
    }

    /// The next stdout line; None once the attempt ended and its file was read to its end.
    pub async fn next_line(&mut self) -> Option<Line> {
        let (line, end) = self.lines.recv().await?;
        self.line_end = end;
        Some(line)
    }

    /// The offset just after the last line [`Followed::next_line`] gave (at a line's end:
    /// where an adopted attempt's reader may read on from).
    pub fn line_end(&self) -> u64 {
        self.line_end
    }

    /// Whether a cut of the transcript was jumped over before the last line delivered.
    pub fn cut_before(&self) -> bool {
        let to = self.cut_to.load(Ordering::Relaxed);
        to > 0 && to <= self.line_end
    }

    /// Waits for the attempt's end.
    pub async fn wait(&mut self) -> Result<sortie_protocol::Exit, WaitError> {
        let pid = self.started.pid;
        match self.exit.wait_for(Option::is_some).await {
            Ok(slot) => slot.clone().unwrap_or_else(|| {
                Err(WaitError {
                    pid,
                    message: "no status".into(),
                    orphan: None,
                })
            }),
            Err(_) => Err(WaitError {
                pid,
                message: "the follower stopped".into(),
                orphan: None,
            }),
        }
    }

    /// The bytes of stdout read so far.
    pub fn stdout_bytes(&self) -> u64 {
        self.stdout_bytes.load(Ordering::Relaxed)
    }

    /// The last [`STDERR_TAIL_BYTES`] of its stderr file.
    pub fn stderr_tail(&self) -> String {
        stderr_tail(&self.files.stderr)
    }

    /// Its stopper.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }
}

impl Drop for Followed {
    /// Dropped before its end (a second Ctrl-C, a journal failure): the supervisor goes first,
    /// so that no status is recorded (resume finds it gone: orphaned), then the group.
    fn drop(&mut self) {
        if self.exit.borrow().is_some() {
            return;
        }
        // A shepherd's attempt: the shepherd kills it and records nothing.
        if self.forget.as_ref().is_some_and(Forget::forget) {
            return;
        }
        let s = self.started;
        if is_running(s.supervisor, s.supervisor_start) {
            let _ = kill(pid_of(s.supervisor), Signal::SIGKILL);
        }
        if is_running(s.pid, s.start_time) {
            let _ = killpg(pid_of(s.pid), Signal::SIGKILL);
        }
    }
}

/// How [`watch_exit`] learns of the end.
enum Ended {
    Supervisor(tokio::process::Child),
    Shepherd(tokio::sync::oneshot::Receiver<Option<sortie_protocol::Exit>>),
    Files,
}

/// Publishes the attempt's end: the supervisor's exit (when it is our child) or the
/// shepherd's word, else the exit record (file or status log), polled.
async fn watch_exit(
    dir: PathBuf,
    started: StartedFile,
    watcher: Ended,
    tx: watch::Sender<ExitSlot>,
) {
    // Whether its supervisor died while this process watched: the agent, reparented to us,
    // is ours to wait for (see `adopted_or_lost`), even once its exit was recorded (its
    // zombie, to be reaped).
    let mut died = false;
    let watcher = match watcher {
        Ended::Shepherd(ended) => match ended.await {
            // Said with the `exit` line, once its exit was recorded.
            Ok(Some(exit)) => {
                tx.send_replace(Some(Ok(exit)));
                return;
            }
            Ok(None) => match read_exit(&dir) {
                Some(exit) => {
                    tx.send_replace(Some(Ok(exit)));
                    return;
                }
                None => Ended::Files,
            },
            // The shepherd is gone: its files say the rest.
            Err(_) => {
                died = true;
                Ended::Files
            }
        },
        other => other,
    };
    let result = match watcher {
        Ended::Supervisor(mut child) => {
            let status = child.wait().await;
            let message = format!(
                "its supervisor ended ({}) without recording its exit",
                status.map_or_else(|e| e.to_string(), |s| s.to_string())
            );
            match read_exit(&dir) {
                Some(exit) => Ok(exit),
                None => adopted_or_lost(&dir, started, message).await,
            }
        }
        Ended::Shepherd(_) | Ended::Files => loop {
            match presence(&dir) {
                DirPresence::Ended(exit) => {
                    if died {
                        let _ =
                            wait_orphan(started.pid, started.start_time, started.supervisor).await;
                    }
                    break Ok(exit);
                }
                DirPresence::Gone => {
                    let message = "its supervisor is gone without recording its exit";
                    break adopted_or_lost(&dir, started, message.into()).await;
                }
                DirPresence::Alive(_) => tokio::time::sleep(ADOPT_POLL).await,
            }
        },
    };
    tx.send_replace(Some(result));
}

/// The attempt's supervisor is gone (`message` says how) and no exit was recorded: its exit as
/// this process, the agent's new parent, waits for it to end (`process::wait_orphan`: the attempt
/// ends once, with its own status, and never runs beside its retry); else it is lost: handed
/// to another process, it may run on, and the attempt stops it (see `WaitError::orphan`).
async fn adopted_or_lost(
    dir: &Path,
    started: StartedFile,
    message: String,
) -> Result<sortie_protocol::Exit, WaitError> {
    match wait_orphan(started.pid, started.start_time, started.supervisor).await {
        Some(exit) => {
            tracing::warn!(
                "{}: {message}; sortie waited for its agent (pid {}) itself",
                dir.display(),
                started.pid
            );
            if let Some(recorded) = read_exit(dir) {
                return Ok(recorded);
            }
            // Recorded as its supervisor would have: the files stay the attempt's truth.
            if let Err(e) = crate::supervisor::record_exit(dir, exit) {
                tracing::warn!("{}: cannot record its exit: {e}", dir.display());
            }
            Ok(exit)
        }
        None => read_exit(dir).ok_or(WaitError {
            pid: started.pid,
            message,
            orphan: Some(started.start_time),
        }),
    }
}

/// Reads the stdout file from byte `from` as it grows, jumping over its cut (the transcript's
/// cap: `transcript`), until the attempt ended and the file is read to its end. `bytes` is the
/// offset reached, `cut_to` the end of the last cut jumped over.
async fn follow_stdout(
    path: PathBuf,
    from: u64,
    tx: mpsc::Sender<(Line, u64)>,
    [bytes, cut_to]: [Arc<AtomicU64>; 2],
    mut exit: watch::Receiver<ExitSlot>,
) {
    let mut reader = KeptReader::new(&path, from);
    let mut buf = vec![0u8; FIRST_CHUNK];
    let mut splitter = LineSplitter::new(MAX_LINE_BYTES);
    if from > 0 {
        // Read on from a line's start (the journaled offset of an adopted attempt is one).
        bytes.store(from, Ordering::Relaxed);
    }
    let mut ready = Vec::new();
    let mut warned = false;
    loop {
        let ended = exit.borrow().is_some();
        let base = reader.offset();
        match reader.read(&mut buf).unwrap_or(Kept::Idle) {
            Kept::Bytes(n) => {
                splitter.push_at(&buf[..n], base, &mut ready);
                // Small first: most streams are (see `lines::grow`).
                grow(&mut buf, n);
                bytes.store(reader.offset(), Ordering::Relaxed);
                for line in ready.drain(..) {
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
                continue;
            }
            Kept::Cut(cut) => {
                if let Some(unread) = cut.unread
                    && !warned
                {
                    // #10: the cutter had to cut what sortie had not read (see `transcript`).
                    warned = true;
                    tracing::warn!(
                        "{}: bytes {unread}..{} ({} bytes) were cut before sortie read them \
                         (the transcript outgrew its hard bound while sortie was down): the \
                         usage and tool calls in them are not counted",
                        path.display(),
                        cut.to,
                        cut.unread_bytes()
                    );
                }
                splitter.cut();
                cut_to.fetch_max(cut.to, Ordering::Relaxed);
                bytes.store(reader.offset(), Ordering::Relaxed);
                continue;
            }
            Kept::Idle => {}
        }
        if ended {
            break;
        }
        tokio::select! {
            _ = exit.changed() => {}
            () = tokio::time::sleep(FOLLOW_POLL) => {}
        }
    }
    if let Some(line) = splitter.finish() {
        let _ = tx.send((line, reader.offset())).await;
    }
}

/// The end of a stderr file, at a char boundary.
fn stderr_tail(path: &Path) -> String {
    // Most attempts write nothing there: one `statx` instead of opening and reading it
    // (six syscalls an attempt).
    if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
        return String::new();
    }
    let mut tail = TailBuffer::new(STDERR_TAIL_BYTES);
    if let Ok(mut f) = File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let from = len.saturating_sub(STDERR_TAIL_BYTES as u64);
        let mut bytes = Vec::new();
        if f.seek(SeekFrom::Start(from)).is_ok() && f.read_to_end(&mut bytes).is_ok() {
            if from > 0 {
                // Marks the start as cut, so that a split character's rest is skipped.
                tail.push(b"\xff");
            }
            tail.push(&bytes);
        }
    }
    tail.text()
}

//! sortie's side of the per-run shepherd (`shepherd.rs`): starts it at the run's first
//! supervised launch, sends it requests through its stdin (one writer task: a request is
//! queued without waiting, from async code or a `Drop`), and reads its replies from its stdout
//! (one reader task), which wake the launch (`started`, `error`) and the attempt's follower
//! (`exit`). [`release_shepherds`] closes the run's shepherds at its end and waits until they
//! are gone.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sortie_protocol::Exit;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};

use super::shepherd::{Request, SHEPHERD_ARG, SHEPHERD_MARKER};
use crate::layout::attempt::{AttemptFiles, StartedFile, parse_exit};
use crate::process::spawn::{check_cwd, too_long};
use crate::process::{SpawnError, SpawnSpec};
use crate::sync::lock;

/// How long [`release_shepherds`] waits for a shepherd to exit.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

type StartReply = Result<StartedFile, SpawnError>;

#[derive(Default)]
struct Pending {
    /// The program, why its argv would be too long ([`too_long`]), and who waits.
    starting: HashMap<u64, (String, String, oneshot::Sender<StartReply>)>,
    running: HashMap<u64, oneshot::Sender<Option<Exit>>>,
    dead: bool,
}

/// A live shepherd, as its sortie sees it.
#[derive(Debug)]
struct Shepherd {
    requests: mpsc::UnboundedSender<String>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    dead: Arc<AtomicBool>,
    gone: watch::Receiver<bool>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("starting", &self.starting.len())
            .field("running", &self.running.len())
            .finish()
    }
}

/// The shepherds of this process, by run (a process usually serves one run).
fn shepherds() -> &'static tokio::sync::Mutex<HashMap<String, Arc<Shepherd>>> {
    static ALL: OnceLock<tokio::sync::Mutex<HashMap<String, Arc<Shepherd>>>> = OnceLock::new();
    ALL.get_or_init(Default::default)
}

/// An attempt started by a shepherd: what it recorded, and its end's wake-up.
#[derive(Debug)]
pub struct Shepherded {
    /// The attempt's `started` record (the shepherd as its supervisor).
    pub started: StartedFile,
    /// Resolves once the shepherd recorded the attempt's exit, with the exit it recorded
    /// (`None` from a shepherd that does not say it: the follower reads the exit record); an
    /// error when the shepherd is gone before (the follower then looks at the files).
    pub ended: oneshot::Receiver<Option<Exit>>,
    /// Drops the attempt (see [`Forget::forget`]).
    pub forget: Forget,
}

/// Asks the shepherd to drop an attempt: kill it and record nothing.
#[derive(Debug)]
pub struct Forget {
    id: u64,
    shepherd: Arc<Shepherd>,
}

impl Forget {
    /// Queues the request; false when the shepherd is gone (the caller kills the group).
    pub fn forget(&self) -> bool {
        !self.shepherd.dead.load(Ordering::SeqCst)
            && self.shepherd.send(&Request::Forget { id: self.id })
    }
}

impl Shepherd {
    fn send(&self, request: &Request) -> bool {
        match serde_json::to_string(request) {
            Ok(line) => self.requests.send(line).is_ok(),
            Err(_) => false,
        }
    }
}

/// Starts `spec` under the run's shepherd (started with the program `program`, run as
/// `program __shepherd`, when the run has none alive), placed with the attempt dir `dir` (never
/// created: the status log beside it keys its records by its name) and its output going to
/// `files` (beside it, in the same directory), and waits until it runs.
///
/// A shepherd that dies with the request is no failure of the attempt's: when it recorded the
/// start, the attempt is followed from its record (its agent, handed to sortie, is waited for:
/// `process::wait_orphan`); else an agent it may have started unrecorded is ended, and the
/// request goes to a new shepherd, once.
pub async fn spawn_shepherded(
    program: &Path,
    spec: &SpawnSpec,
    dir: &Path,
    files: &AttemptFiles,
    stdin: Option<&Path>,
) -> Result<Shepherded, SpawnError> {
    match spawn_once(program, spec, dir, files, stdin).await {
        Err(Failed::Died(error, forget)) => {
            if let Some(started) = super::read_started(dir) {
                // Its sender is gone with the shepherd: the follower looks at the files.
                let (_, ended) = oneshot::channel();
                return Ok(Shepherded {
                    started,
                    ended,
                    forget,
                });
            }
            tracing::warn!("the run's shepherd died with a spawn request ({error}): once more");
            let marker = spec.marker.1.clone();
            let _ = tokio::task::spawn_blocking(move || {
                crate::process::end_marked_children(&marker);
            })
            .await;
            spawn_once(program, spec, dir, files, stdin)
                .await
                .map_err(|f| match f {
                    Failed::Died(e, _) | Failed::Spawn(e) => e,
                })
        }
        Err(Failed::Spawn(e)) => Err(e),
        Ok(s) => Ok(s),
    }
}

/// Why [`spawn_once`] failed.
enum Failed {
    /// The spawn failed (the shepherd said why, or none could be started).
    Spawn(SpawnError),
    /// The shepherd died with the request (and its `forget`, which says so).
    Died(SpawnError, Forget),
}

/// One try of [`spawn_shepherded`].
async fn spawn_once(
    program: &Path,
    spec: &SpawnSpec,
    dir: &Path,
    files: &AttemptFiles,
    stdin: Option<&Path>,
) -> Result<Shepherded, Failed> {
    let Some(first) = spec.argv.first() else {
        return Err(Failed::Spawn(SpawnError::EmptyArgv));
    };
    check_cwd(first, &spec.cwd).map_err(Failed::Spawn)?;
    let io_err = |error| SpawnError::Io {
        program: first.clone(),
        error,
    };
    let run = spec
        .marker
        .1
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let shepherd = {
        let mut all = shepherds().lock().await;
        match all.get(&run) {
            Some(s) if !s.dead.load(Ordering::SeqCst) => Arc::clone(s),
            _ => {
                // The directory of the run's attempt dirs, where the files and the status log
                // go: made once per shepherd, not once per attempt.
                if let Some(attempts) = dir.parent() {
                    std::fs::create_dir_all(attempts).map_err(|e| Failed::Spawn(io_err(e)))?;
                }
                let s = Arc::new(
                    start(program, &spec.marker.1)
                        .await
                        .map_err(|e| Failed::Spawn(io_err(e)))?,
                );
                all.insert(run, Arc::clone(&s));
                s
            }
        }
    };
    let id = shepherd.next_id.fetch_add(1, Ordering::SeqCst);
    let died = |message: &str| {
        Failed::Died(
            io_err(io::Error::other(message.to_owned())),
            Forget {
                id,
                shepherd: Arc::clone(&shepherd),
            },
        )
    };
    let (started_tx, started_rx) = oneshot::channel();
    let (ended_tx, ended) = oneshot::channel();
    let why = too_long(&spec.argv, &spec.env);
    {
        let mut p = lock(&shepherd.pending);
        if p.dead {
            return Err(died("the run's shepherd is gone"));
        }
        p.starting.insert(id, (first.clone(), why, started_tx));
        p.running.insert(id, ended_tx);
    }
    let sent = shepherd.send(&Request::Spawn {
        id,
        dir: dir.to_path_buf(),
        files: Box::new(files.clone()),
        argv: spec.argv.clone(),
        cwd: spec.cwd.clone(),
        env: spec.env.clone(),
        marker: spec.marker.clone(),
        stdin: stdin.map(Path::to_path_buf),
    });
    if !sent {
        return Err(died("the run's shepherd is gone"));
    }
    match started_rx.await {
        Ok(Ok(started)) => Ok(Shepherded {
            started,
            ended,
            forget: Forget { id, shepherd },
        }),
        Ok(Err(e)) => Err(Failed::Spawn(e)),
        Err(_) => Err(died("the run's shepherd ended before starting it")),
    }
}

/// Starts a shepherd and its writer, reader and reaper tasks.
#[allow(clippy::disallowed_methods, reason = "the shepherd's spawn")]
async fn start(program: &Path, marker: &str) -> io::Result<Shepherd> {
    // `<run>/<incarnation>` of the attempt marker `<run>/<task>/<attempt>/<incarnation>`.
    let mut parts = marker.split('/');
    let run = parts.next().unwrap_or_default();
    let incarnation = parts.nth(2).unwrap_or_default();
    // Should the shepherd die, its agents are handed to us, to be waited for (`wait_orphan`).
    crate::process::become_subreaper();
    let mut child = tokio::process::Command::new(program)
        .arg(SHEPHERD_ARG)
        .env(SHEPHERD_MARKER, format!("{run}/{incarnation}"))
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(false)
        .spawn()?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(io::Error::other("the shepherd has no pipes"));
    };
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines.next_line().await?.unwrap_or_default();
    if !ready.starts_with("ready ") {
        let _ = child.kill().await;
        return Err(io::Error::other("the shepherd did not start"));
    }
    let (requests, mut rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut batch = String::new();
        while let Some(line) = rx.recv().await {
            batch.clear();
            batch.push_str(&line);
            batch.push('\n');
            while let Ok(more) = rx.try_recv() {
                batch.push_str(&more);
                batch.push('\n');
            }
            if stdin.write_all(batch.as_bytes()).await.is_err() {
                return;
            }
        }
        // Every sender dropped: the end of its stdin.
    });
    let (gone_tx, gone) = watch::channel(false);
    tokio::spawn(async move {
        let _ = child.wait().await;
        let _ = gone_tx.send(true);
    });
    let pending = Arc::new(Mutex::new(Pending::default()));
    let dead = Arc::new(AtomicBool::new(false));
    let (p, d) = (Arc::clone(&pending), Arc::clone(&dead));
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            reply(&p, &line);
        }
        d.store(true, Ordering::SeqCst);
        let mut p = lock(&p);
        p.dead = true;
        // Their senders dropped: launches fail, followers look at the files.
        p.starting.clear();
        p.running.clear();
    });
    Ok(Shepherd {
        requests,
        pending,
        next_id: AtomicU64::new(1),
        dead,
        gone,
    })
}

/// Carries one reply line to whoever waits for it.
fn reply(pending: &Mutex<Pending>, line: &str) {
    let mut words = line.splitn(3, ' ');
    let (Some(kind), Some(Ok(id))) = (words.next(), words.next().map(str::parse::<u64>)) else {
        return;
    };
    let rest = words.next().unwrap_or_default();
    let mut p = lock(pending);
    match kind {
        "started" => {
            if let Some((program, _, tx)) = p.starting.remove(&id) {
                let _ = tx.send(StartedFile::parse(rest).ok_or_else(|| SpawnError::Io {
                    program,
                    error: io::Error::other(format!("the shepherd said {line:?}")),
                }));
            }
        }
        "error" => {
            p.running.remove(&id);
            if let Some((program, why, tx)) = p.starting.remove(&id) {
                let (kind, msg) = rest.split_once(' ').unwrap_or((rest, ""));
                let _ = tx.send(Err(SpawnError::from_kind(kind, program, msg, why)));
            }
        }
        // `exit <id> code <n>` or `exit <id> signal <n>`: what its exit record holds.
        "exit" => {
            if let Some(tx) = p.running.remove(&id) {
                let _ = tx.send(parse_exit(rest));
            }
        }
        _ => {}
    }
}

/// Closes this process's shepherds (their runs ended) and waits, for a bounded time, until
/// each is gone: it exits once its attempts are.
pub async fn release_shepherds() {
    let all: Vec<Arc<Shepherd>> = shepherds().lock().await.drain().map(|(_, s)| s).collect();
    for s in &all {
        s.send(&Request::Close);
    }
    for s in all {
        let mut gone = s.gone.clone();
        let _ = tokio::time::timeout(RELEASE_WAIT, gone.wait_for(|g| *g)).await;
    }
}

//! The per-run shepherd: one long-lived process that starts the run's supervised attempts on
//! sortie's request and outlives sortie, as conmon or containerd's shim do. sortie starts it
//! once per run as `sortie __shepherd` ([`SHEPHERD_ARG`]); it leaves sortie's session
//! (`setsid`: neither the terminal's Ctrl-C nor sortie's death reaches it), becomes a child
//! subreaper, says `ready <pid> <start time>` on its stdout, and then reads requests, one JSON
//! line each ([`Request`]), from its stdin:
//! - `spawn`: starts the agent in its own process group, stdout and stderr going to the files
//!   the request names (`AttemptFiles::beside` the attempt dir, which is never created), records
//!   its pid and start time (and the shepherd's) in the status log beside the attempt dir
//!   (`status_log`: what a supervisor's `started` file holds), and says `started <id> <pid>
//!   <start> <shepherd pid> <shepherd start>` (or `error <id> <kind> <message>`);
//! - `forget`: the attempt's sortie dropped it (a second Ctrl-C, a journal failure): its
//!   `started` is taken back (a `forgot` record) and its group killed, and no status is recorded (resume finds it
//!   gone: orphaned);
//! - `close`: sortie's run ended; the shepherd exits once its last attempt is gone (so does
//!   the end of its stdin: sortie died).
//!
//! When an agent's leader exits, the shepherd kills what is left of its group (the leader is
//! still an unreaped zombie, so its group id cannot be reused), records its exit status in the
//! status log (what the per-attempt supervisor writes to its `exit` file, see `supervise.rs`;
//! `presence`, adoption and resume read both alike), then reaps it (a shepherd killed in
//! between leaves the record or the zombie, whose status sortie, its next parent, reads), and
//! says `exit <id> code <n>` (or `signal <n>`: what the record holds): sortie is woken by that
//! line, not by polling, and reads the status from it, not from the file. Descendants that
//! left the agent's group and were reparented to the shepherd are killed by a sweep of `/proc`
//! once their attempt ended: at once when no sweep ran in the last [`SWEEP_EVERY`], else by
//! the next one, within that time (a sweep reads every process's stat, too costly for each of a thousand attempts a
//! second). Its last act is a sweep of everything left; it never outlives its attempts by more.
//!
//! A spawn request read after sortie died (its parent changed) is not carried out: the attempt
//! is placed but never started, and resume finds it gone.
//!
//! Its threads are slots: one per live attempt and a few idle, one of which at a time reads
//! the next request. The slot that reads a `spawn` starts the agent (another slot reads on
//! meanwhile, so spawns overlap), waits for that agent's leader alone, and ends the attempt
//! itself: an agent's end reaches the next spawn with no hand-over between threads, as in the
//! dispatch floor (`examples/dispatch_floor.rs`). A slot that ends its attempt while
//! [`IDLE_SLOTS`] others are idle exits; a slot that reads a `spawn` when none is idle starts
//! another. Reparented descendants that end are reaped by the sweep.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use serde::{Deserialize, Serialize};
use sortie_protocol::Exit;

use super::status_log::{Record, StatusLog};
use crate::layout::attempt::{AttemptFiles, StartedFile, exit_text, output_disk_full};
use crate::process::MARKER;
use crate::process::procfs::{
    children_of, children_with_state, env_value, pid_of, process_start_time,
};
use crate::process::resolve::spawn_resolved;
use crate::sync::lock;
use crate::transcript::{CHECK_EVERY, Trimmer};

/// The hidden subcommand that runs a shepherd.
pub const SHEPHERD_ARG: &str = "__shepherd";

/// The shepherd's own marker variable: `<run>/<incarnation>` of the run it serves (so that a
/// test, or a user, finds it in `/proc`; resume never kills it: it finds it alive instead).
pub const SHEPHERD_MARKER: &str = "SORTIE_SHEPHERD";

/// How often, at most, the shepherd sweeps `/proc` for descendants of ended attempts.
pub const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// How many idle slots (see the module doc) the shepherd keeps: a slot whose attempt ended
/// exits when this many others wait for a request already. With 4, 5,000 × `true` at 16 made
/// ~1,500 threads (the idle count swings with every end and spawn); with 16, none after the
/// first 17, in the same time.
const IDLE_SLOTS: usize = 16;

/// A slot's stack: it parses a request, spawns and waits (the default 2 MiB is for any code).
const SLOT_STACK: usize = 256 << 10;

/// A request from sortie, one JSON line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum Request {
    /// Start an attempt.
    Spawn {
        /// sortie's id of the request (echoed in the replies).
        id: u64,
        /// The attempt dir: its name keys the attempt's records in the status log beside it
        /// (never created: the agent's files lie beside it too, see `AttemptFiles::beside`).
        dir: PathBuf,
        /// The agent's stdout and stderr, created (truncated) for the spawn.
        files: Box<AttemptFiles>,
        /// The program and its arguments.
        argv: Vec<String>,
        /// Its working directory.
        cwd: PathBuf,
        /// Variables added to the environment.
        env: Vec<(String, String)>,
        /// The attempt's marker variable.
        marker: (String, String),
        /// A file for its stdin, else `/dev/null`.
        stdin: Option<PathBuf>,
    },
    /// Drop an attempt: kill it, record nothing.
    Forget {
        /// The spawn request's id.
        id: u64,
    },
    /// The run ended: exit once no attempt is left.
    Close,
}

/// An attempt the shepherd watches.
struct Watched {
    id: u64,
    dir: PathBuf,
    marker: (String, String),
    child: std::process::Child,
    forgotten: bool,
    /// #10: its stdout and stderr kept under the transcript cap (see `transcript`).
    trimmers: Vec<Trimmer>,
}

#[derive(Default)]
struct State {
    /// By the leader's pid.
    live: HashMap<u32, Watched>,
    /// Request id → leader pid.
    ids: HashMap<u64, u32>,
    /// No more requests will come.
    closed: bool,
    /// Slots waiting for a request.
    idle: usize,
    /// Spawn requests being carried out: spawning, or their attempt live.
    busy: usize,
    /// The markers of the attempts being spawned (not yet in `live`): a sweep spares them.
    spawning: Vec<String>,
    /// An attempt ended since the last sweep.
    sweep_due: bool,
    last_sweep: Option<Instant>,
    /// The status logs, by the directory of attempt dirs they are in.
    logs: HashMap<PathBuf, StatusLog>,
}

impl State {
    /// Whether the shepherd's work is done: no request can come and none is being carried
    /// out.
    fn done(&self) -> bool {
        self.closed && self.busy == 0 && self.live.is_empty()
    }

    /// Records `record` of the attempt dir `dir` in its status log.
    fn record(&mut self, dir: &Path, record: &Record) -> io::Result<()> {
        let parent = dir.parent().unwrap_or(dir);
        let log = match self.logs.get_mut(parent) {
            Some(log) => log,
            None => self
                .logs
                .entry(parent.to_path_buf())
                .or_insert(StatusLog::open(dir)?),
        };
        log.append(dir, record)
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the main thread (the shepherd's end) and the sweep thread.
    wake: Condvar,
    /// sortie's requests: a slot reads one line at a time (`Stdin` reads a line under its own
    /// lock).
    input: io::Stdin,
    parent: nix::unistd::Pid,
    /// The shepherd's pid and start time.
    me: (u32, u64),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// Says `line` on stdout (sortie may be gone: a closed pipe is fine).
fn say(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// The shepherd's body (see the module doc). Returns its exit code.
pub fn shepherd_main() -> i32 {
    let _ = nix::unistd::setsid();
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let me = std::process::id();
    let me_start = process_start_time(me).unwrap_or(0);
    let parent = nix::unistd::getppid();
    let shared = Arc::new(Shared {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
        input: io::stdin(),
        parent,
        me: (me, me_start),
    });
    say(&format!("ready {me} {me_start}"));
    let sweeper = Arc::clone(&shared);
    let swept = std::thread::Builder::new()
        .name("sweep".into())
        .spawn(move || sweep_loop(&sweeper, me));
    // #10: the transcripts' cap, kept for every live attempt a few times a second.
    let keeper = Arc::clone(&shared);
    let kept = std::thread::Builder::new()
        .name("trim".into())
        .spawn(move || trim_loop(&keeper));
    if swept.is_err() || kept.is_err() || !add_slot(&shared) {
        return 1;
    }
    let mut st = shared.lock();
    while !st.done() {
        st = match shared.wake.wait_timeout(st, SWEEP_EVERY) {
            Ok((g, _)) => g,
            Err(p) => p.into_inner().0,
        };
    }
    sweep(&mut st, me, true);
    drop(st);
    reap_all(me);
    0
}

/// Starts a slot; false when no thread could be made.
fn add_slot(shared: &Arc<Shared>) -> bool {
    let shared = Arc::clone(shared);
    std::thread::Builder::new()
        .name("slot".into())
        .stack_size(SLOT_STACK)
        .spawn(move || slot(&shared))
        .is_ok()
}

/// A slot (see the module doc): reads a request, carries it out, and reads the next, until
/// the end of stdin, or until enough other slots are idle.
fn slot(shared: &Arc<Shared>) {
    let mut line = String::new();
    loop {
        {
            let mut st = shared.lock();
            if st.idle >= IDLE_SLOTS {
                return;
            }
            st.idle += 1;
        }
        line.clear();
        let read = shared.input.read_line(&mut line);
        let mut st = shared.lock();
        st.idle -= 1;
        if !matches!(read, Ok(n) if n > 0) {
            // sortie died or closed its end: no request comes any more.
            st.closed = true;
            drop(st);
            shared.wake.notify_all();
            return;
        }
        let Ok(request) = serde_json::from_str::<Request>(&line) else {
            continue;
        };
        match request {
            Request::Spawn {
                id,
                dir,
                files,
                argv,
                cwd,
                env,
                marker,
                stdin,
            } => {
                // sortie died after asking: its resume decides about this attempt, not us.
                if nix::unistd::getppid() != shared.parent {
                    continue;
                }
                st.busy += 1;
                st.spawning.push(marker.1.clone());
                // Someone must read the next request while this slot spawns and waits.
                let grow = st.idle == 0;
                drop(st);
                if grow {
                    add_slot(shared);
                }
                let spawned = start(&files, &argv, &cwd, &env, &marker, stdin.as_deref());
                let leader = register(shared, id, dir, marker, spawned);
                if let Some(pid) = leader {
                    attend(shared, pid);
                }
                shared.lock().busy -= 1;
                shared.wake.notify_all();
            }
            Request::Forget { id } => {
                if let Some(pid) = st.ids.get(&id).copied()
                    && let Some(w) = st.live.get_mut(&pid)
                {
                    w.forgotten = true;
                    let dir = w.dir.clone();
                    let _ = st.record(&dir, &Record::Forgot);
                    let _ = killpg(pid_of(pid), Signal::SIGKILL);
                }
            }
            // Still read on: a `forget` may follow (a second Ctrl-C).
            Request::Close => {
                st.closed = true;
                drop(st);
                shared.wake.notify_all();
            }
        }
    }
}

/// Registers a spawn's outcome under the lock: the attempt live, its start recorded and said
/// (before its `exit` line can be), or the error said. Returns the leader's pid.
fn register(
    shared: &Shared,
    id: u64,
    dir: PathBuf,
    marker: (String, String),
    spawned: Spawned,
) -> Option<u32> {
    let mut st = shared.lock();
    if let Some(i) = st.spawning.iter().position(|m| *m == marker.1) {
        st.spawning.swap_remove(i);
    }
    match spawned {
        Ok((child, trimmers)) => {
            let pid = child.id();
            let started = StartedFile {
                pid,
                start_time: process_start_time(pid).unwrap_or(0),
                supervisor: shared.me.0,
                supervisor_start: shared.me.1,
            };
            // Not fsynced: a reboot that loses it loses the processes too.
            let _ = st.record(&dir, &Record::Started(started));
            st.ids.insert(id, pid);
            st.live.insert(
                pid,
                Watched {
                    id,
                    dir,
                    marker,
                    child,
                    forgotten: false,
                    trimmers,
                },
            );
            say(&format!("started {id} {}", started.text().trim()));
            Some(pid)
        }
        Err((kind, e)) => {
            say(&format!("error {id} {kind} {e}"));
            None
        }
    }
}

/// Waits for the leader `pid` to exit (seen, not reaped), then ends its attempt.
fn attend(shared: &Shared, pid: u32) {
    let status = loop {
        match waitid(
            Id::Pid(pid_of(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        ) {
            Ok(status) => break status,
            Err(Errno::EINTR) => {}
            // A signal nix has no name for (or no such child): `end_attempt` reaps it and
            // reads the status the reaping gives.
            Err(_) => break WaitStatus::StillAlive,
        }
    };
    let mut st = shared.lock();
    if let Some(w) = st.live.remove(&pid) {
        st.ids.remove(&w.id);
        end_attempt(&mut st, w, &status);
    }
}

/// A spawn's outcome: the agent and the trimmers of its transcript, or the error's kind (as
/// the client parses it) and the error.
type Spawned = Result<(std::process::Child, Vec<Trimmer>), (&'static str, io::Error)>;

/// Starts one agent, and the trimmers of its transcript; an error is its kind (as the client
/// parses it) and the error.
fn start(
    files: &AttemptFiles,
    argv: &[String],
    cwd: &Path,
    env: &[(String, String)],
    marker: &(String, String),
    stdin: Option<&Path>,
) -> Spawned {
    let io = |e| ("io", e);
    let Some(program) = argv.first() else {
        return Err(("io", io::Error::other("nothing to run")));
    };
    let open = |path: &Path| {
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
    };
    let out = open(&files.stdout).map_err(io)?;
    let err = open(&files.stderr).map_err(io)?;
    let prompt;
    let stdin = match stdin {
        Some(file) => {
            prompt = File::open(file).map_err(|e| {
                io(io::Error::new(
                    e.kind(),
                    format!("cannot open its stdin {}: {e}", file.display()),
                ))
            })?;
            &prompt
        }
        // `/dev/null`, opened once: the spawn duplicates it.
        None => dev_null().map_err(io)?,
    };
    // The program found on PATH once (see `resolve`); found no more, by its name again.
    let spawned = spawn_resolved(program, env, |path| {
        spawn_one(path, argv, cwd, env, marker, stdin, &out, &err)
    });
    // The handles on the files go to their trimmers (the agent has its own).
    let trimmers = Trimmer::for_attempt(files, [out, err]);
    let child = spawned.map_err(|e| (crate::process::spawn::kind_of(&e), e))?;
    Ok((child, trimmers))
}

/// `/dev/null`, opened once for the shepherd's life (an attempt's stdin when it has no file).
fn dev_null() -> io::Result<&'static File> {
    static NULL: std::sync::OnceLock<File> = std::sync::OnceLock::new();
    if let Some(f) = NULL.get() {
        return Ok(f);
    }
    let f = File::open("/dev/null")?;
    Ok(NULL.get_or_init(|| f))
}

/// Spawns `program` (argv[0] stays `argv`'s) with the attempt's stdio, once.
#[allow(clippy::too_many_arguments, reason = "one spawn's parts")]
fn spawn_one(
    program: &Path,
    argv: &[String],
    cwd: &Path,
    env: &[(String, String)],
    marker: &(String, String),
    stdin: &File,
    out: &File,
    err: &File,
) -> io::Result<std::process::Child> {
    let stdin = Stdio::from(stdin.try_clone()?);
    #[allow(
        clippy::disallowed_methods,
        reason = "the shepherd's spawn of an attempt"
    )]
    let mut cmd = std::process::Command::new(program);
    cmd.arg0(&argv[0])
        .args(&argv[1..])
        .current_dir(cwd)
        .env_remove(SHEPHERD_MARKER)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env(&marker.0, &marker.1)
        .stdin(stdin)
        .stdout(out.try_clone()?)
        .stderr(err.try_clone()?)
        .process_group(0);
    cmd.spawn()
}

/// The leader of `w` exited (seen, not reaped: `status`): kill the rest of its group, record
/// its exit, reap it, and sweep for its escaped descendants (now, or soon). The exit is
/// recorded before the reaping: a shepherd killed in between leaves the record, or the
/// unreaped leader, whose status sortie (its next parent, see `process::wait_orphan`) reads.
fn end_attempt(st: &mut State, mut w: Watched, status: &WaitStatus) {
    let pid = w.child.id();
    let _ = killpg(pid_of(pid), Signal::SIGKILL);
    let seen = match status {
        WaitStatus::Exited(_, code) => Some(Exit::Code(*code)),
        WaitStatus::Signaled(_, sig, _) => Some(Exit::Signal(*sig as i32)),
        _ => None,
    };
    // #10: cut to the cap once more, now that the files are complete.
    for t in &mut w.trimmers {
        let _ = t.check(true);
    }
    // #32: an agent that failed while the disk of its output was full failed for the disk
    // (said before its exit).
    let nospace = |st: &mut State, dir: &Path, exit: Exit| {
        if exit != Exit::Code(0) && output_disk_full(&AttemptFiles::beside(dir)) {
            let _ = st.record(dir, &Record::NoSpace);
        }
    };
    if let Some(exit) = seen.filter(|_| !w.forgotten) {
        nospace(st, &w.dir, exit);
    }
    let recorded = match seen {
        // Not fsynced: like the supervisor's exit file (see `supervise.rs`).
        Some(exit) if !w.forgotten => st.record(&w.dir, &Record::Exit(exit)).is_ok(),
        _ => false,
    };
    let reaped = w.child.wait();
    let exit = seen.unwrap_or_else(|| match reaped {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(sig)) => Exit::Signal(sig),
            (None, None) => Exit::Code(-1),
        },
        Err(_) => Exit::Code(-1),
    });
    if st.last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
        sweep(st, std::process::id(), false);
    } else {
        st.sweep_due = true;
    }
    if w.forgotten {
        return;
    }
    if !recorded && seen.is_none() {
        nospace(st, &w.dir, exit);
    }
    if recorded || st.record(&w.dir, &Record::Exit(exit)).is_ok() {
        say(&format!("exit {} {}", w.id, exit_text(exit).trim_end()));
    }
}

/// Keeps every live attempt's transcript under its cap (see `transcript`), until no request
/// can come and no attempt is left.
fn trim_loop(shared: &Shared) {
    loop {
        std::thread::sleep(CHECK_EVERY);
        let mut st = shared.lock();
        if st.done() {
            return;
        }
        for w in st.live.values_mut() {
            for t in &mut w.trimmers {
                let _ = t.check(false);
            }
        }
    }
}

/// Sweeps when an attempt ended since the last sweep, at most every [`SWEEP_EVERY`].
fn sweep_loop(shared: &Shared, me: u32) {
    loop {
        let mut st = shared.lock();
        while !st.sweep_due {
            if st.done() {
                return;
            }
            st = match shared.wake.wait_timeout(st, SWEEP_EVERY) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        drop(st);
        std::thread::sleep(SWEEP_EVERY);
        let mut st = shared.lock();
        sweep(&mut st, me, false);
    }
}

/// Kills the shepherd's children that are not a live attempt's leader: those whose marker is
/// not a live attempt's (descendants of ended attempts), or, with `all`, every one.
fn sweep(st: &mut State, me: u32, all: bool) {
    st.sweep_due = false;
    st.last_sweep = Some(Instant::now());
    let children = children_with_state(me);
    for &(pid, ended) in &children {
        if ended || st.live.contains_key(&pid) {
            continue;
        }
        let doomed = all
            || env_value(pid, MARKER).is_some_and(|m| {
                !st.live.values().any(|w| w.marker.1 == m) && !st.spawning.contains(&m)
            });
        if doomed {
            let _ = killpg(pid_of(pid), Signal::SIGKILL);
            let _ = kill(pid_of(pid), Signal::SIGKILL);
            // Reaped by the next sweep.
            st.sweep_due = true;
        }
    }
    // Descendants that ended (killed by an earlier sweep, or on their own) are reaped here:
    // no slot waits for them. Not while a spawn is under way: its leader may have ended
    // before its slot registered it, and that slot reads its status; the next sweep does.
    for &(pid, ended) in &children {
        if ended && !st.live.contains_key(&pid) {
            if st.spawning.is_empty() {
                let _ = waitpid(pid_of(pid), Some(WaitPidFlag::WNOHANG));
            } else {
                st.sweep_due = true;
            }
        }
    }
}

/// Kills and reaps every child left, until none is.
fn reap_all(me: u32) {
    loop {
        for pid in children_of(me) {
            let _ = kill(pid_of(pid), Signal::SIGKILL);
        }
        match waitpid(None::<nix::unistd::Pid>, None) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

//! The per-attempt supervisor: a small process that outlives sortie. sortie starts it as
//! `sortie __supervise <attempt-dir> <argv...>` (the hidden subcommand, [`SUPERVISE_ARG`]); it
//! leaves sortie's session (`setsid`, so that neither the terminal's Ctrl-C nor sortie's death
//! reaches it), becomes a child subreaper (an agent's daemonized grandchildren are reparented
//! to it, not to init), starts the agent in its own process group with stdout and stderr going
//! to the attempt dir's `stdout` and `stderr`, records the agent's pid and start time in
//! `started`, and tells sortie the same on its stdout. When the agent's leader exits it kills
//! what is left of the group and every descendant reparented to it, reaps them, writes the exit
//! status atomically to `exit` (a temp file renamed), and exits: it never outlives its
//! attempt by more than that cleanup.
//!
//! The files of an attempt dir and their formats are `layout::attempt`'s.
//!
//! An attempt dir with `exit` ended; with `started` and a live supervisor it runs; anything
//! else is gone (see [`presence`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use sortie_protocol::Exit;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::status_log;
use crate::layout::attempt::{
    AttemptFiles, EXIT_FILE, NOSPACE_FILE, STARTED_FILE, STDERR_FILE, STDIN_CLOSE, STDIN_FIFO,
    STDOUT_FILE, StartedFile, exit_text, output_disk_full, parse_exit,
};
use crate::process::procfs::{children_of, is_running, pid_of, process_start_time};
use crate::process::spawn::{check_cwd, kind_of, too_long};
use crate::process::{SUPERVISOR_MARKER, SpawnError, SpawnSpec};
use crate::transcript::{Cap, Keeper};

/// The hidden subcommand that runs a supervisor.
pub const SUPERVISE_ARG: &str = "__supervise";

/// Set (to `fifo`) in the supervisor's environment when the agent is driven over stdin.
const STDIN_VAR: &str = "SORTIE_SUPERVISE_STDIN";

/// Reads an attempt dir's `started`, if it is there and whole (the run's shepherd records it
/// in its status log instead: see `status_log`).
pub fn read_started(dir: &Path) -> Option<StartedFile> {
    fs::read_to_string(dir.join(STARTED_FILE))
        .ok()
        .and_then(|text| StartedFile::parse(&text))
        .or_else(|| status_log::lookup(dir).started)
}

/// Reads an attempt dir's `exit`, if it is there and whole (or the shepherd's status log's).
pub fn read_exit(dir: &Path) -> Option<Exit> {
    fs::read_to_string(dir.join(EXIT_FILE))
        .ok()
        .and_then(|text| parse_exit(&text))
        .or_else(|| status_log::lookup(dir).exit)
}

/// #32: records the exit of the attempt of `dir` where its supervisor would have (its `exit`
/// file in a per-attempt dir, else an `exit` line of the shepherd's status log), for an agent
/// whose supervisor died and that sortie waited for itself: the files stay the attempt's truth
/// (a `recover` after damage to the journal reads its end from them). Not fsynced, like theirs.
pub fn record_exit(dir: &Path, exit: Exit) -> io::Result<()> {
    if dir.is_dir() {
        write_file(dir, EXIT_FILE, exit_text(exit).as_bytes(), false)
    } else {
        status_log::StatusLog::open(dir)?.append(dir, &status_log::Record::Exit(exit))
    }
}

/// #32: whether the agent of the attempt dir `dir` failed while the disk of its output was full
/// (its supervisor's `nospace` file, or the shepherd's `nospace` record).
pub fn read_nospace(dir: &Path) -> bool {
    dir.join(NOSPACE_FILE).exists() || status_log::lookup(dir).nospace
}

/// Where a supervised attempt stands, from its dir and `/proc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirPresence {
    /// Its supervisor runs.
    Alive(StartedFile),
    /// It ended so.
    Ended(Exit),
    /// No status and no supervisor.
    Gone,
}

/// Where the supervised attempt in `dir` stands. The exit is read again after a dead
/// supervisor is seen (it records the exit before it exits).
pub fn presence(dir: &Path) -> DirPresence {
    if let Some(exit) = read_exit(dir) {
        return DirPresence::Ended(exit);
    }
    match read_started(dir) {
        Some(s) if is_running(s.supervisor, s.supervisor_start) => DirPresence::Alive(s),
        _ => match read_exit(dir) {
            Some(exit) => DirPresence::Ended(exit),
            None => DirPresence::Gone,
        },
    }
}

/// A supervisor just started by this process: its own handle (sortie reaps it) and the
/// agent's pid and start time.
#[derive(Debug)]
pub struct SupervisorChild {
    /// The supervisor process (a child of sortie while sortie lives; never killed on drop).
    pub process: tokio::process::Child,
    /// What the supervisor recorded.
    pub started: StartedFile,
}

/// Starts a supervisor (the program `supervisor`, run as `supervisor __supervise <dir>
/// <argv...>`) for `spec` with its files in `dir`, and waits until it started the agent.
/// `stdin`: a file the agent reads as its stdin (its prompt), else `/dev/null` (the supervisor
/// is given it and hands it on); `fifo`: the agent is driven over stdin, through the attempt
/// dir's [`STDIN_FIFO`].
#[allow(clippy::disallowed_methods, reason = "the supervisor's spawn")]
pub async fn spawn_supervised(
    supervisor: &Path,
    spec: &SpawnSpec,
    dir: &Path,
    stdin: Option<&Path>,
    fifo: bool,
) -> Result<SupervisorChild, SpawnError> {
    let Some(program) = spec.argv.first() else {
        return Err(SpawnError::EmptyArgv);
    };
    check_cwd(program, &spec.cwd)?;
    // Should the supervisor die, its agent is handed to us, to be waited for (`wait_orphan`).
    crate::process::become_subreaper();
    let io_err = |error| SpawnError::Io {
        program: program.clone(),
        error,
    };
    fs::create_dir_all(dir).map_err(io_err)?;
    let stdin = match stdin {
        Some(file) => Stdio::from(File::open(file).map_err(|e| {
            io_err(io::Error::new(
                e.kind(),
                format!("cannot open its stdin {}: {e}", file.display()),
            ))
        })?),
        None => Stdio::null(),
    };
    let mut cmd = tokio::process::Command::new(supervisor);
    cmd.arg(SUPERVISE_ARG)
        .arg(dir)
        .args(&spec.argv)
        .current_dir(&spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env(
            SUPERVISOR_MARKER,
            format!("{}={}", spec.marker.0, spec.marker.1),
        )
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(false);
    if fifo {
        cmd.env(STDIN_VAR, "fifo");
    }
    let mut process = cmd.spawn().map_err(|e| match kind_of(&e) {
        // The agent's argv and environment are the supervisor's: what is wrong with them is.
        kind @ ("nul_byte" | "too_long") => {
            SpawnError::from_kind(kind, program.clone(), "", too_long(&spec.argv, &spec.env))
        }
        _ => io_err(e),
    })?;
    let Some(out) = process.stdout.take() else {
        return Err(io_err(io::Error::other("the supervisor has no stdout")));
    };
    let mut first = String::new();
    let read = BufReader::new(out).read_line(&mut first).await;
    let line = first.trim();
    if let Some(rest) = line.strip_prefix("started ")
        && let Some(started) = StartedFile::parse(rest)
    {
        return Ok(SupervisorChild { process, started });
    }
    // It could not start the agent (and said why), or it died.
    let _ = process.wait().await;
    Err(match line.split_once(' ') {
        Some(("error", rest)) => {
            let (kind, msg) = rest.split_once(' ').unwrap_or((rest, ""));
            SpawnError::from_kind(kind, program.clone(), msg, too_long(&spec.argv, &spec.env))
        }
        _ => io_err(io::Error::other(format!(
            "the supervisor ended before starting it{}",
            read.err().map(|e| format!(": {e}")).unwrap_or_default()
        ))),
    })
}

/// The supervisor's body (see the module doc): `args` are `<attempt-dir> <argv...>`. Returns
/// its exit code. Single-threaded and synchronous: it does only what it must.
#[allow(clippy::disallowed_methods, reason = "the supervisor's one spawn")]
pub fn supervise_main(args: &[String]) -> i32 {
    let say = |line: &str| {
        let mut out = io::stdout().lock();
        // sortie may be gone: a closed pipe is fine.
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    };
    let (Some(dir), Some(program)) = (args.first(), args.get(1)) else {
        say("error usage sortie __supervise <attempt-dir> <program> [args...]");
        return 2;
    };
    let dir = PathBuf::from(dir);
    // Out of sortie's session and group: its Ctrl-C and its death do not reach us.
    let _ = nix::unistd::setsid();
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let open = |name: &str| {
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(dir.join(name))
    };
    let (out, err) = match (open(STDOUT_FILE), open(STDERR_FILE)) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            say(&format!("error io cannot open {}: {e}", dir.display()));
            return 1;
        }
    };
    // The agent carries the attempt's marker (`NAME=value`, from sortie), not the supervisor's.
    let mut cmd = std::process::Command::new(program);
    if let Ok(marker) = std::env::var(SUPERVISOR_MARKER) {
        cmd.env_remove(SUPERVISOR_MARKER);
        if let Some((name, value)) = marker.split_once('=') {
            cmd.env(name, value);
        }
    }
    // #10: an agent driven over stdin reads what the supervisor forwards from the FIFO.
    let fifo = match std::env::var_os(STDIN_VAR) {
        Some(_) => {
            cmd.env_remove(STDIN_VAR);
            match open_fifo(&dir) {
                Ok(f) => Some(f),
                Err(e) => {
                    say(&format!(
                        "error io cannot make its stdin in {}: {e}",
                        dir.display()
                    ));
                    return 1;
                }
            }
        }
        None => None,
    };
    let mut child = match cmd
        .args(&args[2..])
        // The supervisor's own stdin: /dev/null, or the attempt's prompt file.
        .stdin(if fifo.is_some() {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            let kind = crate::process::spawn::kind_of(&e);
            say(&format!("error {kind} {e}"));
            return 1;
        }
    };
    if let (Some(fifo), Some(to)) = (fifo, child.stdin.take()) {
        // Never joined: it waits on the FIFO, which we hold open, until the agent's stdin is
        // closed (or we exit).
        let _ = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || forward_stdin(fifo, to));
    }
    let me = std::process::id();
    let started = StartedFile {
        pid: child.id(),
        start_time: process_start_time(child.id()).unwrap_or(0),
        supervisor: me,
        supervisor_start: process_start_time(me).unwrap_or(0),
    };
    // Not fsynced: a reboot that loses it loses the processes too.
    let _ = write_file(&dir, STARTED_FILE, started.text().as_bytes(), false);
    say(&format!("started {}", started.text().trim()));
    // #10: the transcript's cap, kept by a thread beside the wait.
    let files = [dir.join(STDOUT_FILE), dir.join(STDERR_FILE)];
    let keeper = Keeper::start(&files, Cap::from_env());
    let exit = wait_leader(started.pid);
    // The leader is an unreaped zombie: its group id is still its own.
    let _ = killpg(pid_of(started.pid), Signal::SIGKILL);
    let exit = match (exit, child.wait()) {
        (Some(e), _) => e,
        (None, Ok(status)) => match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            (None, None) => Exit::Code(-1),
        },
        (None, Err(_)) => Exit::Code(-1),
    };
    reap_descendants(me);
    if let Some(k) = keeper {
        k.finish();
    }
    // #32: an agent that failed while the disk of its output was full failed for the disk.
    if exit != Exit::Code(0) && output_disk_full(&AttemptFiles::inside(&dir)) {
        let _ = write_file(&dir, NOSPACE_FILE, b"", false);
    }
    let text = exit_text(exit);
    // Renamed into place, not fsynced: it must survive sortie, not a power loss (which takes
    // the attempt's processes, and most of its work, with it; resume then finds it gone).
    // Measured: the two fsyncs per attempt cost more than the rest of the supervisor.
    match write_file(&dir, EXIT_FILE, text.as_bytes(), false) {
        Ok(()) => 0,
        Err(_) => 3,
    }
}

/// Waits until the leader exited, without reaping it.
fn wait_leader(pid: u32) -> Option<Exit> {
    loop {
        match waitid(
            Id::Pid(pid_of(pid)),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
        ) {
            Ok(WaitStatus::Exited(_, code)) => return Some(Exit::Code(code)),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Some(Exit::Signal(sig as i32)),
            Ok(_) | Err(Errno::EINTR) => {}
            // A signal nix has no name for, or no such child: the reap says.
            Err(_) => return None,
        }
    }
}

/// Kills and reaps every process reparented to us (we are a subreaper), until none is left.
/// The common case, no child left, costs one `waitpid`; only then is `/proc` read.
fn reap_descendants(me: u32) {
    loop {
        match waitpid(None::<nix::unistd::Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(_) | Err(Errno::EINTR) => continue,
            // ECHILD: none left.
            Err(_) => return,
        }
        for pid in children_of(me) {
            let _ = kill(pid_of(pid), Signal::SIGKILL);
        }
        match waitpid(None::<nix::unistd::Pid>, None) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// Writes `dir/name` atomically (a temp file renamed), fsynced with its dir when `durable`.
fn write_file(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    fs::rename(&tmp, dir.join(name))?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Makes the attempt dir's [`STDIN_FIFO`] and opens it for reading and writing: the open
/// does not wait for a writer, and the FIFO never reads as ended while we hold it.
fn open_fifo(dir: &Path) -> io::Result<File> {
    let path = dir.join(STDIN_FIFO);
    let _ = fs::remove_file(&path);
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .map_err(io::Error::from)?;
    OpenOptions::new().read(true).write(true).open(&path)
}

/// Forwards the FIFO's lines to the agent's stdin until a [`STDIN_CLOSE`] line (or the agent
/// closed its end); then the agent's stdin is closed.
fn forward_stdin(fifo: File, mut to: std::process::ChildStdin) {
    use std::io::BufRead;
    let mut from = io::BufReader::new(fifo);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) if line == STDIN_CLOSE => return,
            Ok(_) => {
                if to.write_all(&line).and_then(|()| to.flush()).is_err() {
                    return;
                }
            }
        }
    }
}

//! What sortie reads from `/proc`: a process's stat line (state, group, start time, whether
//! it is in the middle of an exec), its environment, and the scan for processes carrying a
//! marker variable ([`find_marked`]).

use std::time::Duration;

use nix::unistd::Pid;

/// A pid as nix takes it (a pid always fits an i32: pid_max <= 2^22).
pub(crate) fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX))
}

/// How long [`find_marked`] waits for a process in the middle of an exec.
const EXEC_WAIT: Duration = Duration::from_millis(100);

/// What sortie needs from `/proc/<pid>/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    state: char,
    pub(crate) ppid: u32,
    pub(crate) pgrp: i32,
    flags: u64,
    pub(crate) start_time: u64,
    env_end: Option<u64>,
}

/// `PF_KTHREAD`: a kernel thread (no environment, ever).
const PF_KTHREAD: u64 = 0x0020_0000;

impl Stat {
    pub(crate) fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    /// True while an `execve` has not yet laid out the new environment: `/proc/<pid>/environ`
    /// reads empty for that instant (after the exec "succeeded" for the parent).
    fn in_exec(&self) -> bool {
        self.flags & PF_KTHREAD == 0 && self.env_end == Some(0) && !self.is_dead()
    }
}

pub(crate) fn read_stat(pid: u32) -> Option<Stat> {
    use std::io::Read;
    // One read into a buffer larger than any stat line: `std::fs::read` sizes its buffer by
    // the file's size, which `/proc` says is 0 (a `statx`, then a read per few dozen bytes),
    // and the shepherd's sweeps read the stat of every process on the machine.
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut buf = [0u8; 1024];
    let n = loop {
        match file.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            read => break read.ok()?,
        }
    };
    let mut bytes = buf[..n].to_vec();
    if n == buf.len() {
        file.read_to_end(&mut bytes).ok()?;
    }
    parse_stat(&String::from_utf8_lossy(&bytes))
}

/// Parses a stat line; the command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_ascii_whitespace().collect();
    // fields[0] is field 3 of proc_pid_stat(5).
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        state: field(3)?.chars().next()?,
        ppid: field(4)?.parse().ok()?,
        pgrp: field(5)?.parse().ok()?,
        flags: field(9)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
        env_end: field(51).and_then(|f| f.parse().ok()),
    })
}

/// The start time of a process in clock ticks since boot (`/proc/<pid>/stat` field 22), or
/// None when there is no such process. With the pid it names one process for good.
pub fn process_start_time(pid: u32) -> Option<u64> {
    read_stat(pid).map(|s| s.start_time)
}

/// True when the process `pid` started at `start_time` still runs (a zombie does not).
pub fn is_running(pid: u32, start_time: u64) -> bool {
    read_stat(pid).is_some_and(|s| s.start_time == start_time && !s.is_dead())
}

/// A process found by its marker variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedProcess {
    /// Its pid.
    pub pid: u32,
    /// Its start time (see [`process_start_time`]).
    pub start_time: u64,
    /// The marker's value, e.g. `<run-id>/<task>/<attempt>`.
    pub marker_value: String,
}

/// Every live process whose environment has `marker_key` set to a value starting with
/// `value_prefix`, by pid. Children inherit the marker, so an attempt's grandchildren are
/// found too. Entries that cannot be read (other users' processes, processes that vanished)
/// are skipped silently. Blocking (reads `/proc`, and may wait up to 100 ms for a process in
/// the middle of an exec): from async code, call it once, or through `spawn_blocking`.
pub fn find_marked(marker_key: &str, value_prefix: &str) -> Vec<MarkedProcess> {
    find_marked_since(marker_key, value_prefix, 0)
}

/// [`find_marked`] among the processes started at or after `since` (a start time, see
/// [`process_start_time`]): the descendants of a process that started then. Only their
/// environments are read.
pub(crate) fn find_marked_since(
    marker_key: &str,
    value_prefix: &str,
    since: u64,
) -> Vec<MarkedProcess> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = format!("{marker_key}=");
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Some(before) = read_stat(pid).filter(|s| s.start_time >= since) else {
            continue;
        };
        let Some(environ) = read_environ(pid, before) else {
            continue;
        };
        let Some(value) = environ
            .split(|b| *b == 0)
            .find_map(|kv| kv.strip_prefix(needle.as_bytes()))
            .and_then(|v| std::str::from_utf8(v).ok())
        else {
            continue;
        };
        // The same process before and after reading its environment (no pid reuse between).
        if !value.starts_with(value_prefix)
            || before.is_dead()
            || process_start_time(pid) != Some(before.start_time)
        {
            continue;
        }
        found.push(MarkedProcess {
            pid,
            start_time: before.start_time,
            marker_value: value.to_owned(),
        });
    }
    found.sort_by_key(|p| p.pid);
    found
}

/// The live children of process `parent` (by `/proc/<pid>/stat`'s ppid). Blocking.
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    children_with_state(parent)
        .into_iter()
        .filter_map(|(pid, ended)| (!ended).then_some(pid))
        .collect()
}

/// The children of process `parent`, each with whether it ended and waits to be reaped (a
/// zombie). Blocking (reads every process's stat).
pub(crate) fn children_with_state(parent: u32) -> Vec<(u32, bool)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter_map(|pid| {
            read_stat(pid)
                .filter(|s| s.ppid == parent)
                .map(|s| (pid, s.is_dead()))
        })
        .collect()
}

/// The value of the variable `key` in the environment of the live process `pid`, if it has it.
/// Blocking (reads `/proc`).
pub(crate) fn env_value(pid: u32, key: &str) -> Option<String> {
    let stat = read_stat(pid).filter(|s| !s.is_dead())?;
    let environ = read_environ(pid, stat)?;
    let needle = format!("{key}=");
    environ
        .split(|b| *b == 0)
        .find_map(|kv| kv.strip_prefix(needle.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_owned)
}

/// Reads a process's environment; a process caught in the middle of an exec is read again
/// (for at most [`EXEC_WAIT`]) once the exec has laid its environment out.
fn read_environ(pid: u32, mut stat: Stat) -> Option<Vec<u8>> {
    let start = std::time::Instant::now();
    loop {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        if !environ.is_empty() || !stat.in_exec() || start.elapsed() > EXEC_WAIT {
            return Some(environ);
        }
        std::thread::sleep(Duration::from_millis(1));
        stat = read_stat(pid).filter(|s| s.start_time == stat.start_time)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_stat_counts_fields_after_the_command_name() {
        let line = "1234 (a b) c)) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                ppid: 1,
                pgrp: 77,
                flags: 4194560,
                start_time: 987654,
                env_end: None,
            })
        );
        let mid_exec = "9 (sleep) R 8 9 9 0 -1 4194304 2 0 0 0 0 0 0 0 20 0 1 0 71274 4096 0 \
                        18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 \
                        140723747936916 0 0 0 0";
        let stat = parse_stat(mid_exec).unwrap();
        assert_eq!((stat.start_time, stat.env_end), (71274, Some(0)));
        assert!(stat.in_exec());
        let own = read_stat(std::process::id()).unwrap();
        assert!(!own.in_exec() && !own.is_dead());
        assert_eq!(own.pgrp, nix::unistd::getpgrp().as_raw());
        assert_eq!(parse_stat("garbage"), None);
    }
}

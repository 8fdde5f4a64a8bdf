//! Bounded polls and waits, and SIGKILL of a child: nothing here waits without a deadline,
//! and a deadline passed is a failure that names what was awaited.

use std::io::Read;
use std::process::{Child, ExitStatus, Output};
use std::time::{Duration, Instant};

/// Polls `f` every 50 ms until it returns `Some`, for at most `secs` seconds; panics naming
/// `what` when it never does.
pub fn poll<T>(what: &str, secs: u64, f: impl FnMut() -> Option<T>) -> T {
    poll_every(what, secs, Duration::from_millis(50), f)
}

/// [`poll`], every `every` (a poll that runs `sortie export` may want fewer readers).
pub fn poll_every<T>(
    what: &str,
    secs: u64,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < until,
            "gave up after {secs}s waiting for {what}"
        );
        std::thread::sleep(every);
    }
}

/// A child that did not exit within its patience (it was killed and reaped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut {
    /// The child's pid.
    pub pid: u32,
    /// How long it was given.
    pub patience: Duration,
}

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "process {} did not end within {:?} (a hang?); it was killed",
            self.pid, self.patience
        )
    }
}

impl std::error::Error for TimedOut {}

/// Waits for `child` to exit, at most `patience`; past that it is SIGKILLed, reaped, and the
/// wait fails.
pub fn wait_exit(child: &mut Child, patience: Duration) -> Result<ExitStatus, TimedOut> {
    let until = Instant::now() + patience;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Ok(s);
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TimedOut {
                pid: child.id(),
                patience,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for a child with piped stdout and stderr to end, at most `secs` seconds, reading both
/// meanwhile so that it never blocks on a full pipe. Past the deadline it is killed and this
/// panics, showing its stderr.
pub fn finish(mut child: Child, secs: u64) -> Output {
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    match wait_exit(&mut child, Duration::from_secs(secs)) {
        Ok(status) => Output {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        },
        Err(e) => {
            let stderr = err.join().unwrap_or_default();
            panic!("{e}; stderr:\n{}", String::from_utf8_lossy(&stderr));
        }
    }
}

/// Sends the signal named `signal` (`INT`, `TERM`, `KILL`) to process `pid` through `kill(1)`;
/// false when it could not be sent (the process is gone).
#[allow(clippy::disallowed_methods, reason = "the test kit runs kill(1)")]
pub fn signal(pid: u32, signal: &str) -> bool {
    std::process::Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// SIGKILLs `child` (std's `kill` is SIGKILL) and reaps it. False when it had already exited
/// by itself (then it is reaped, not killed).
pub fn kill9(child: &mut Child) -> bool {
    if child.try_wait().ok().flatten().is_some() {
        return false;
    }
    let _ = child.kill();
    let _ = child.wait();
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::disallowed_methods, reason = "the tests start `sh`")]

    use std::process::{Command, Stdio};

    use super::*;

    fn sh(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sh")
    }

    #[test]
    fn poll_returns_the_first_value() {
        let mut n = 0;
        assert_eq!(
            poll("three calls", 10, || {
                n += 1;
                (n == 3).then_some(n)
            }),
            3
        );
    }

    #[test]
    #[should_panic(expected = "gave up after 0s waiting for nothing")]
    fn poll_gives_up_naming_what_it_waited_for() {
        poll::<()>("nothing", 0, || None);
    }

    #[test]
    fn finish_reads_both_pipes_and_the_status() {
        let out = finish(sh("echo out; echo err >&2; exit 3"), 30);
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn wait_exit_kills_a_child_past_its_patience() {
        let mut child = sh("exec sleep 1000");
        let e = wait_exit(&mut child, Duration::ZERO).expect_err("sleep outlives no patience");
        assert_eq!(e.pid, child.id());
        assert!(e.to_string().contains("did not end"), "{e}");
        // Reaped: killing it again finds no process.
        assert!(child.try_wait().ok().flatten().is_some());
    }

    #[test]
    fn kill9_kills_a_live_child_and_not_an_ended_one() {
        let mut live = sh("exec sleep 1000");
        assert!(kill9(&mut live));
        let status = live.wait().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        let mut ended = sh("exit 0");
        ended.wait().expect("wait");
        assert!(!kill9(&mut ended));
    }
}

//! How a process ended: [`Exit`], the one type the spawner and the readers share, and the names
//! of Linux's signals for its display.

use std::fmt;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal (this number) ended it.
    Signal(i32),
}

impl Exit {
    /// The exit code, when it exited.
    pub fn code(self) -> Option<i32> {
        match self {
            Exit::Code(c) => Some(c),
            Exit::Signal(_) => None,
        }
    }

    /// The signal number, when a signal ended it.
    pub fn signal(self) -> Option<i32> {
        match self {
            Exit::Code(_) => None,
            Exit::Signal(s) => Some(s),
        }
    }

    /// True for exit code 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => match signal_name(s) {
                Some(name) => write!(f, "signal {s} ({name})"),
                None => write!(f, "signal {s}"),
            },
        }
    }
}

/// Linux's signals 1 to 31 by number (x86, Arm, RISC-V numbering), as `nix::sys::signal::Signal`
/// names them; the real-time signals above 31 have no name.
const SIGNAL_NAMES: [&str; 31] = [
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

/// The name of signal `n` (`SIGTERM` for 15), when `n` is one of Linux's named signals.
pub(crate) fn signal_name(n: i32) -> Option<&'static str> {
    let index = usize::try_from(n).ok()?.checked_sub(1)?;
    SIGNAL_NAMES.get(index).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_displays_signal_names() {
        assert_eq!(Exit::Code(2).to_string(), "exit code 2");
        assert_eq!(Exit::Signal(15).to_string(), "signal 15 (SIGTERM)");
        assert_eq!(Exit::Signal(99).to_string(), "signal 99");
    }

    #[test]
    fn signal_names_are_the_ones_nix_gives_on_this_platform() {
        for n in -1..=70 {
            let nix = nix::sys::signal::Signal::try_from(n)
                .ok()
                .map(|s| s.as_str());
            assert_eq!(signal_name(n), nix, "signal {n}");
        }
    }
}

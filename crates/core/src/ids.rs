//! Newtype identifiers: run ids, task ids, attempt numbers, journal sequence numbers, timestamps.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The id of a run: a short string made of `[A-Za-z0-9._-]`, usable as a directory name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RunId(String);

/// Why a string is not a valid run id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid run id {0:?}: use 1 to 64 characters of A-Z a-z 0-9 . _ -, not starting with '.'")]
pub struct InvalidRunId(pub String);

impl RunId {
    /// Checks and wraps a run id.
    pub fn new(id: impl Into<String>) -> Result<Self, InvalidRunId> {
        let id = id.into();
        let ok = !id.is_empty()
            && id.len() <= 64
            && !id.starts_with('.')
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if ok {
            Ok(RunId(id))
        } else {
            Err(InvalidRunId(id))
        }
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for RunId {
    type Err = InvalidRunId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunId::new(s)
    }
}

/// A task's index in the run's batch (0-based, in file order).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct TaskId(pub u32);

impl TaskId {
    /// The index into the batch's task list.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// An attempt number, 1-based: attempt 1 is the first launch of a task.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Attempt(pub u32);

impl Attempt {
    /// The first attempt.
    pub const FIRST: Attempt = Attempt(1);

    /// The attempt after this one.
    pub fn next(self) -> Attempt {
        Attempt(self.0.saturating_add(1))
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A journal sequence number: dense from 0, assigned by the journal.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Seq(pub u64);

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Seq {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(Seq)
    }
}

/// Wall-clock time as milliseconds since the Unix epoch. Core never reads a clock: every
/// timestamp arrives as event data.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// This time plus a duration (saturating).
    pub fn plus(self, d: std::time::Duration) -> Timestamp {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// The duration from `earlier` to this time (zero when `earlier` is later).
    pub fn since(self, earlier: Timestamp) -> std::time::Duration {
        std::time::Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_directory_safe() {
        assert!(RunId::new("r-2026_11.30").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(65)] {
            assert!(RunId::new(bad).is_err(), "{bad:?} should be refused");
        }
    }
}

//! How a task is shown: the state name that `sortie status`, `replay` and the JSON views print.
//!
//! The journal's [`TaskState`] is what the rules need; a display names three moments it does
//! not: an attempt stopped by an interrupt, waiting for resume to decide its retry
//! (`interrupted`), a queued task whose worktree is planned but not yet made (`setting-up`), and
//! a running task whose attempt waits for a machine-wide slot (`waiting`). Every display asks
//! here, so they agree.

use crate::outcome::StopReason;
use crate::state::{AttemptRecord, TaskRecord, TaskState};

impl TaskRecord {
    /// The task's state as displays name it: [`TaskState::name`], except `interrupted` for an
    /// ended task whose last attempt was interrupted, `setting-up` for a queued task whose
    /// planned worktree is not yet set up, and `waiting` for a running task whose attempt waits
    /// for a machine-wide slot.
    pub fn display_state(&self) -> &'static str {
        match &self.state {
            TaskState::Ended { .. }
                if self
                    .attempts
                    .last()
                    .and_then(|a| a.outcome())
                    .is_some_and(|o| o.stop_reason == StopReason::Interrupted) =>
            {
                "interrupted"
            }
            // #33: its check runs.
            TaskState::Ended { .. }
                if self.attempts.last().is_some_and(AttemptRecord::checking) =>
            {
                "verifying"
            }
            TaskState::Queued { .. }
                if self.steps().worktree.is_some() && self.steps().setup.is_none() =>
            {
                "setting-up"
            }
            TaskState::Running { .. }
                if self.attempts.last().is_some_and(AttemptRecord::is_waiting) =>
            {
                "waiting"
            }
            state => state.name(),
        }
    }
}

/// `text` as it may reach a terminal when sortie did not write it (a label, an agent's output or
/// error, a model name): every control character but the newline is shown, not obeyed, so that
/// nothing printed can clear, retitle or rewrite the user's terminal. Tab and carriage return
/// read `\t` and `\r`; ESC, the other C0 characters and DEL read `\x1b`-style; the C1
/// controls (U+0080 to U+009F, which some terminals obey as ESC sequences) read `\u{9b}`-style.
/// Text without any comes back borrowed.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let shown = |c: char| c != '\n' && c.is_control();
    if !text.chars().any(shown) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if shown(c) && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if shown(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Every name [`TaskRecord::display_state`] gives, in the order a task may pass through them:
/// what `--state` accepts.
pub const DISPLAY_STATES: &[&str] = &[
    "pending",
    "queued",
    "setting-up",
    "waiting",
    "running",
    "finishing",
    "retrying",
    "interrupted",
    "completed",
    "partial",
    "failed",
    "timeout",
    "cancelled",
    "skipped",
];

/// A run of more tasks than this is big: its summary and `status` list only the tasks that
/// did not complete (and one line per state), and what it prints while it goes leaves out the
/// launches and the completed tasks for a progress line (docs/cli.md).
pub const BIG_RUN: usize = 50;

/// Off a terminal, a big run prints a progress line at most this often (ms, in the journal's
/// time), when an event comes.
pub const PROGRESS_EVERY_MS: u64 = 5_000;

/// Whether a run of `tasks` tasks is big ([`BIG_RUN`]).
pub fn is_big_run(tasks: usize) -> bool {
    tasks > BIG_RUN
}

/// Which tasks' rows a table of a run lists (the summary, `status`, `results`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowFilter {
    /// Only tasks in these display states (`--state failed,partial`).
    pub states: Option<Vec<&'static str>>,
    /// Every row, even of a big run (`--all`).
    pub all: bool,
}

impl RowFilter {
    /// The filter of `--state LIST` (comma-separated display states; `None`: no filter) and
    /// `--all`; an unknown state is an error naming it and the known ones.
    pub fn new(states: Option<&str>, all: bool) -> Result<RowFilter, String> {
        let states = match states {
            None => None,
            Some(list) => {
                let mut names = Vec::new();
                for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
                    match DISPLAY_STATES.iter().find(|s| **s == word) {
                        Some(s) => names.push(*s),
                        None => {
                            return Err(format!(
                                "unknown state {word:?}; the states are {}",
                                DISPLAY_STATES.join(", ")
                            ));
                        }
                    }
                }
                if names.is_empty() {
                    return Err(format!(
                        "--state needs at least one state: {}",
                        DISPLAY_STATES.join(", ")
                    ));
                }
                Some(names)
            }
        };
        Ok(RowFilter { states, all })
    }

    /// Whether the row of a task in display state `state`, in a run of `tasks` tasks, is
    /// listed: a `--state` filter names it; else `--all`, a run that is not big, or a task
    /// that did not complete.
    pub fn shows(&self, tasks: usize, state: &str) -> bool {
        match &self.states {
            Some(names) => names.contains(&state),
            None => self.all || !is_big_run(tasks) || state != "completed",
        }
    }

    /// Whether some rows of a run of `tasks` tasks may be left out (then the table says how
    /// many tasks are in each state).
    pub fn leaves_out(&self, tasks: usize) -> bool {
        self.states.is_some() || (!self.all && is_big_run(tasks))
    }
}

/// What a run prints while it goes, off a terminal and above the board: every launch and
/// every task's end for a run that is not big; for a big run, no launch and only the ends of
/// tasks that did not complete, with a progress line when one is due.
pub fn logs_launch(tasks: usize) -> bool {
    !is_big_run(tasks)
}

/// Whether the end of a task in state `state` gets a line (see [`logs_launch`]).
pub fn logs_task_end(tasks: usize, state: &str) -> bool {
    !is_big_run(tasks) || state != "completed"
}

/// Whether a big run's progress line is due at `now` (ms), the last one printed (or the first
/// event seen) at `since`: the first event [`PROGRESS_EVERY_MS`] after it; never for a run
/// that is not big.
pub fn progress_due(tasks: usize, since: u64, now: u64) -> bool {
    is_big_run(tasks) && now.saturating_sub(since) >= PROGRESS_EVERY_MS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::OrphanAction;
    use crate::ids::{Attempt, Timestamp};
    use crate::outcome::AttemptOutcome;
    use crate::state::{AttemptEnd, AttemptRecord, OutcomeRecord, PlannedWorktree};

    fn record(state: TaskState) -> TaskRecord {
        let mut rec = TaskRecord::new();
        rec.state = state;
        rec
    }

    fn attempt(end: Option<AttemptEnd>) -> AttemptRecord {
        let mut a = AttemptRecord::new(Attempt(1), None, Timestamp(0));
        a.end = end;
        a
    }

    fn finished(stop_reason: StopReason) -> Option<AttemptEnd> {
        Some(AttemptEnd::Finished {
            outcome: OutcomeRecord::new(&AttemptOutcome::failed(stop_reason, "x"), ""),
            at: Timestamp(1),
        })
    }

    fn worktree() -> PlannedWorktree {
        PlannedWorktree {
            repo: "/r".into(),
            path: "/r/wt".into(),
            branch: "b".into(),
            base: "c".into(),
        }
    }

    #[test]
    fn printable_text_shows_every_control_character_but_the_newline() {
        assert!(matches!(
            printable("plain é ✓\nline"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            printable("a\u{1b}[2Jb\u{1b}]0;pwned\u{7}c\td\re\u{7f}f\u{9b}g"),
            "a\\x1b[2Jb\\x1b]0;pwned\\x07c\\td\\re\\x7ff\\u{9b}g"
        );
    }

    proptest::proptest! {
        #[test]
        fn printable_text_holds_no_control_character_but_newlines(text in ".*") {
            let shown = printable(&text);
            proptest::prop_assert!(!shown.chars().any(|c| c != '\n' && c.is_control()));
            proptest::prop_assert_eq!(shown.matches('\n').count(), text.matches('\n').count());
        }
    }

    #[test]
    fn an_ended_task_whose_last_attempt_was_interrupted_shows_interrupted() {
        let ended = TaskState::Ended {
            attempt: Attempt(1),
        };
        let mut rec = record(ended.clone());
        rec.attempts
            .push(attempt(finished(StopReason::Interrupted)));
        assert_eq!(rec.display_state(), "interrupted");
        // An orphaned attempt counts as interrupted too.
        let mut rec = record(ended.clone());
        rec.attempts.push(attempt(Some(AttemptEnd::Orphaned {
            action: OrphanAction::Gone,
            at: Timestamp(1),
        })));
        assert_eq!(rec.display_state(), "interrupted");
        // Any other stop is the state machine's own name.
        let mut rec = record(ended);
        rec.attempts.push(attempt(finished(StopReason::Invalid)));
        assert_eq!(rec.display_state(), "finishing");
    }

    #[test]
    fn only_an_ended_task_shows_interrupted() {
        let mut rec = record(TaskState::Running {
            attempt: Attempt(1),
        });
        rec.attempts
            .push(attempt(finished(StopReason::Interrupted)));
        assert_eq!(rec.display_state(), "running");
    }

    #[test]
    fn a_queued_task_with_a_planned_worktree_not_yet_set_up_shows_setting_up() {
        let queued = TaskState::Queued {
            since: Timestamp(0),
        };
        let mut rec = record(queued.clone());
        assert_eq!(rec.display_state(), "queued", "no worktree");
        rec.steps_mut().worktree = Some(worktree());
        assert_eq!(rec.display_state(), "setting-up");
        rec.steps_mut().setup = Some(Some("/r/wt".into()));
        assert_eq!(rec.display_state(), "queued", "set up");
        let mut pending = record(TaskState::Pending);
        pending.steps_mut().worktree = Some(worktree());
        assert_eq!(pending.display_state(), "pending", "only a queued task");
    }
}

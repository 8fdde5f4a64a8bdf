//! Data-driven tests of what a big run shows (issue 37): which rows a table lists, which
//! events get a line while a run goes, and when a progress line is due.

use sortie_core::view::{
    BIG_RUN, PROGRESS_EVERY_MS, RowFilter, is_big_run, logs_launch, logs_task_end, progress_due,
};

#[test]
fn a_run_is_big_above_the_documented_size() {
    for (tasks, big) in [
        (0, false),
        (1, false),
        (BIG_RUN, false),
        (BIG_RUN + 1, true),
        (5_000, true),
    ] {
        assert_eq!(is_big_run(tasks), big, "{tasks} tasks");
    }
}

#[test]
fn the_rows_a_table_lists() {
    let big = 5_000;
    let small = BIG_RUN;
    // (--state, --all, tasks in the run, the task's state, listed)
    let table: &[(Option<&str>, bool, usize, &str, bool)] = &[
        (None, false, small, "completed", true),
        (None, false, small, "failed", true),
        (None, false, big, "completed", false),
        (None, false, big, "failed", true),
        (None, false, big, "running", true),
        (None, true, big, "completed", true),
        (Some("failed,partial"), false, big, "failed", true),
        (Some("failed,partial"), false, big, "partial", true),
        (Some("failed,partial"), false, big, "completed", false),
        (Some("failed,partial"), false, small, "completed", false),
        (Some("completed"), false, big, "completed", true),
        (Some(" failed , timeout "), true, small, "timeout", true),
        (Some("failed"), true, small, "completed", false),
    ];
    for (states, all, tasks, state, listed) in table {
        let f = RowFilter::new(*states, *all).expect("a valid filter");
        assert_eq!(
            f.shows(*tasks, state),
            *listed,
            "--state {states:?} --all {all}, {tasks} tasks, a {state} task"
        );
    }
}

#[test]
fn a_table_says_when_it_may_leave_rows_out() {
    let table: &[(Option<&str>, bool, usize, bool)] = &[
        (None, false, BIG_RUN, false),
        (None, false, BIG_RUN + 1, true),
        (None, true, BIG_RUN + 1, false),
        (Some("failed"), false, 3, true),
        (Some("failed"), true, 3, true),
    ];
    for (states, all, tasks, leaves_out) in table {
        let f = RowFilter::new(*states, *all).expect("a valid filter");
        assert_eq!(
            f.leaves_out(*tasks),
            *leaves_out,
            "{states:?} {all} {tasks}"
        );
    }
}

#[test]
fn an_unknown_or_empty_state_is_refused_naming_the_known_ones() {
    for (given, names) in [
        ("failed,bogus", "\"bogus\""),
        ("", "--state"),
        (",", "--state"),
    ] {
        let e = RowFilter::new(Some(given), false).expect_err(given);
        assert!(e.contains(names), "{given:?}: {e}");
        assert!(e.contains("completed, partial, failed"), "{e}");
    }
}

#[test]
fn a_big_run_prints_no_launch_and_only_the_tasks_that_did_not_complete() {
    let table: &[(usize, &str, bool, bool)] = &[
        // (tasks, end state, a launch line, an end line)
        (BIG_RUN, "completed", true, true),
        (BIG_RUN, "failed", true, true),
        (BIG_RUN + 1, "completed", false, false),
        (BIG_RUN + 1, "failed", false, true),
        (BIG_RUN + 1, "partial", false, true),
        (BIG_RUN + 1, "skipped", false, true),
    ];
    for (tasks, state, launch, end) in table {
        assert_eq!(logs_launch(*tasks), *launch, "{tasks} {state}");
        assert_eq!(logs_task_end(*tasks, state), *end, "{tasks} {state}");
    }
}

#[test]
fn a_progress_line_is_due_every_few_seconds_of_a_big_run_only() {
    let p = PROGRESS_EVERY_MS;
    // (tasks, the last line or the first event, now, due)
    let table: &[(usize, u64, u64, bool)] = &[
        (BIG_RUN, 0, 0, false),
        (BIG_RUN, 0, 10 * p, false),
        (BIG_RUN + 1, 7, 7, false),
        (BIG_RUN + 1, 1_000, 1_000 + p - 1, false),
        (BIG_RUN + 1, 1_000, 1_000 + p, true),
        (BIG_RUN + 1, 1_000, 1_000 + 3 * p, true),
        // A clock that went back is not a reason to print.
        (BIG_RUN + 1, 9_000, 1_000, false),
    ];
    for (tasks, since, now, due) in table {
        assert_eq!(
            progress_due(*tasks, *since, *now),
            *due,
            "{tasks} {since} {now}"
        );
    }
}

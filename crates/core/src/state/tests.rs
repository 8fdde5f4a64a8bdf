//! Unit tests of the state: record sizes, the compact forms, the rare fields.

use super::*;
use std::sync::Arc;

use crate::outcome::{Denial, Phase};
use crate::spec::{AgentProfile, RunConfig};

fn started(labels: &[&str]) -> RunState {
    let batch = Batch {
        tasks: labels.iter().map(|l| TaskSpec::new(*l, "/w")).collect(),
        agents: AgentProfile::builtins(),
        config: RunConfig::default(),
        source: "t.toml".into(),
    };
    let mut state = RunState::new();
    state.start(
        Timestamp(1),
        RunId::new("r").unwrap(),
        batch,
        0,
        "h".into(),
        1,
    );
    state
}

#[test]
fn a_task_is_found_by_its_label_and_an_unknown_label_finds_none() {
    let state = started(&["b", "task-10", "a", "task-2", "c"]);
    for (i, label) in ["b", "task-10", "a", "task-2", "c"].iter().enumerate() {
        assert_eq!(
            state.task_by_label(label),
            Some(TaskId(i as u32)),
            "{label}"
        );
    }
    for missing in ["", "task-1", "d", "0"] {
        assert_eq!(state.task_by_label(missing), None, "{missing}");
    }
    assert_eq!(RunState::new().task_by_label("a"), None);
}

/// A big run holds a task record, an attempt record and a placement per task: their sizes
/// are pinned (on 64-bit targets), so that a field added inline is a decision.
#[test]
#[cfg(target_pointer_width = "64")]
fn a_big_runs_records_stay_small() {
    use std::mem::size_of;
    assert_eq!(size_of::<TaskRecord>(), 128);
    assert_eq!(size_of::<AttemptRecord>(), 104);
    assert_eq!(size_of::<OutcomeRecord>(), 32);
    assert_eq!(size_of::<Placed>(), 72);
}

#[test]
fn a_placement_keeps_its_dir_whole_and_shares_its_parent_and_executor() {
    let mut strings = Interner::default();
    for dir in ["/run/attempts/7.1", "7.1", "/", "", "/run/", "a/b"] {
        let p = Placed::interned("local", dir, &mut strings);
        assert_eq!((p.dir(), p.executor()), (dir.to_owned(), "local"));
        assert_eq!(
            p,
            Placed::new("local", dir),
            "equal whatever shares its strings"
        );
    }
    let a = Placed::interned("local", "/run/attempts/1.1", &mut strings);
    let b = Placed::interned("local", "/run/attempts/2.1", &mut strings);
    assert!(Arc::ptr_eq(&a.at, &b.at));
    let c = Placed::interned("slurm", "/run/attempts/3.1", &mut strings);
    assert!(!Arc::ptr_eq(&a.at, &c.at));
    assert_eq!(
        (c.executor(), c.dir()),
        ("slurm", "/run/attempts/3.1".to_owned())
    );
    assert_ne!(a, b);
}

#[test]
fn an_outcome_record_gives_back_the_outcome_and_text_it_was_made_of() {
    let plain = AttemptOutcome::completed();
    let rich = AttemptOutcome {
        denials: vec![Denial {
            tool: "Bash".into(),
            count: 2,
        }],
        retry_after_ms: Some(5),
        result: Some("{}".into()),
        exit_code: Some(3),
        signal: Some(9),
        phase: Some(Phase::Running),
        rate_limited: true,
        side_effects: true,
        ..AttemptOutcome::failed(StopReason::Error, "boom")
    };
    for (o, text) in [(&plain, ""), (&plain, "said"), (&rich, ""), (&rich, "said")] {
        let r = OutcomeRecord::new(o, text);
        assert_eq!((r.outcome(), r.output()), (o.clone(), text));
    }
    assert!(
        OutcomeRecord::new(&plain, "").rest.get().is_none(),
        "nothing boxed"
    );
}

#[test]
fn an_attempts_boxed_fields_read_back_and_a_zero_usage_is_no_box() {
    let mut a = AttemptRecord::new(Attempt(1), None, Timestamp(0));
    assert_eq!((a.model(), a.continues(), a.session()), (None, None, None));
    assert!(a.more.get().is_none());
    a.set_usage(Usage::ZERO);
    assert!(a.usage.get().is_none());
    let used = Usage {
        input: 3,
        ..Usage::ZERO
    };
    a.set_usage(used);
    a.set_model(Some("m".into()));
    a.set_continues(Some("c".into()));
    a.set_session(Some("s".into()));
    assert_eq!(*a.usage(), used);
    assert_eq!(
        (a.model(), a.continues(), a.session()),
        (Some("m"), Some("c"), Some("s"))
    );
    let mut b = AttemptRecord::new(Attempt(1), Some("m".into()), Timestamp(0));
    b.set_usage(used);
    b.set_continues(Some("c".into()));
    b.set_session(Some("s".into()));
    assert_eq!(a, b);
}

#[test]
fn of_two_tasks_with_one_label_the_later_is_found() {
    let state = started(&["x", "a", "x"]);
    assert_eq!(state.task_by_label("x"), Some(TaskId(2)));
}

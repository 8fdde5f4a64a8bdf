//! `Event::Control` (live control, issue 15) on disk: every action writes, reads back and
//! replays into the run's control state, and exports under its own name with who asked.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests panic on failure"
)]

mod support;

use sortie_core::{ControlAction, Event, Seq, Stamped, TaskId};
use sortie_journal::{ExportRecord, Journal};

#[test]
fn every_control_action_round_trips_and_replays_into_the_control_state() {
    let tmp = tempfile::tempdir().unwrap();
    let j = Journal::create(tmp.path()).unwrap();
    let mut events = support::every_variant();
    // Right after RunStarted, while every task is pending.
    let actions = [
        ControlAction::Hold {
            task: Some(TaskId(1)),
        },
        ControlAction::Hold { task: None },
        ControlAction::Release { task: None },
        ControlAction::Hold {
            task: Some(TaskId(2)),
        },
        ControlAction::Cancel { task: None },
        ControlAction::Concurrency { n: 3 },
    ];
    for (i, action) in actions.iter().enumerate() {
        let at = events[0].0;
        events.insert(
            1 + i,
            (
                at,
                Event::Control {
                    by: format!("uid 1000 pid {i}"),
                    action: action.clone(),
                },
            ),
        );
    }
    // RunResumed's from_seq moves with the inserted records.
    for (_, e) in &mut events {
        if let Event::RunResumed { from_seq, .. } = e {
            *from_seq = Seq(from_seq.0 + actions.len() as u64);
        }
    }
    for (at, e) in &events {
        j.append(*at, e).unwrap();
    }
    let read: Vec<Stamped> = j.read(Seq(0), None).map(Result::unwrap).collect();
    for (r, (_, e)) in read.iter().zip(&events) {
        assert_eq!(&r.event, e);
    }
    let state = j.replay(Some(Seq(actions.len() as u64))).unwrap();
    assert!(!state.control.run_held, "released");
    assert_eq!(
        state.control.held.iter().copied().collect::<Vec<_>>(),
        [TaskId(2)]
    );
    assert_eq!(state.control.concurrency, Some(3));
    assert!(j.audit().is_clean());
    let export = serde_json::to_value(ExportRecord::from(&read[4])).unwrap();
    assert_eq!(
        export["event"]["Control"],
        serde_json::json!({"by": "uid 1000 pid 3", "action": {"hold": {"task": 2}}})
    );
    // A steer exports its message.
    let steer = Stamped {
        seq: Seq(0),
        at: read[0].at,
        event: Event::Control {
            by: "uid 1000 pid 9".into(),
            action: ControlAction::Steer {
                task: TaskId(0),
                message: "focus".into(),
            },
        },
    };
    let export = serde_json::to_value(ExportRecord::from(&steer)).unwrap();
    assert_eq!(
        export["event"]["Control"]["action"],
        serde_json::json!({"steer": {"task": 0, "message": "focus"}})
    );
}

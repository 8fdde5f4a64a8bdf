//! The loop tells nothing outside it of an event before the journal's files hold it: a round of
//! reports is appended without a flush of its own (`commit_pending`), and the round planned
//! from it makes both durable in one write (`settle` when nothing is planned).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sortie_core::{Event, RunState, Stamped};
use sortie_journal::Journal;

use super::{End, Observer};
use crate::layout::StateDir;

/// What an observer saw of one event: its name and seq, and the next seq of the journal read
/// from its files at that moment (a reader's private copy, as `sortie status` opens it).
type Seen = (&'static str, u64, u64);

struct OnDisk {
    state_dir: StateDir,
    run_dir: Option<PathBuf>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Observer for OnDisk {
    fn event(&mut self, _: &RunState, s: &Stamped) {
        if let Event::RunStarted { run_id, .. } = &s.event {
            self.run_dir = Some(self.state_dir.run(run_id).path().to_path_buf());
        }
        let Some(dir) = &self.run_dir else {
            return;
        };
        let on_disk = Journal::open_read_only(dir).map_or(0, |j| j.next_seq().0);
        if let Ok(mut seen) = self.seen.lock() {
            seen.push((s.event.name(), s.seq.0, on_disk));
        }
    }
}

#[test]
fn the_observer_is_told_of_an_event_only_once_the_journal_files_hold_it() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let batch = tmp.path().join("batch.jsonl");
    let task = r#"{"command": ["sh", "-c", "exit 0"], "supervise": false}"#;
    std::fs::write(&batch, [task; 12].join("\n")).expect("the batch");
    let overrides = sortie_batch::Overrides {
        concurrency: Some(4),
        ..Default::default()
    };
    let loaded = sortie_batch::load(&batch, None, &overrides).expect("a valid batch");
    let state_dir = StateDir::new(tmp.path().join("state"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let observer = OnDisk {
        state_dir: state_dir.clone(),
        run_dir: None,
        seen: Arc::clone(&seen),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let end = runtime
        .block_on(super::run(
            &state_dir,
            None,
            loaded,
            super::Front {
                observer: Box::new(observer),
                on_task_end: None,
            },
        ))
        .expect("the run ends");
    assert!(matches!(end.end, End::Finished(_)), "{:?}", end.end);
    let seen = seen.lock().expect("the observer's record").clone();
    let told = |name: &str| seen.iter().filter(|(n, ..)| *n == name).count();
    // Every attempt's report was observed (they go through the pending rounds).
    assert_eq!(told("AttemptStarted"), 12, "{seen:?}");
    assert_eq!(told("AttemptFinished"), 12, "{seen:?}");
    assert_eq!(told("TaskFinished"), 12, "{seen:?}");
    let ahead: Vec<&Seen> = seen
        .iter()
        .filter(|(name, seq, on_disk)| *name != "RunStarted" && seq >= on_disk)
        .collect();
    assert!(
        ahead.is_empty(),
        "told of events the journal's files did not hold yet (name, seq, next seq on disk): \
         {ahead:?}"
    );
}

/// The lines a hook log holds once it holds `n` of them (hooks run in the background), within
/// a bound.
fn hook_lines(log: &std::path::Path, n: usize) -> Vec<String> {
    for _ in 0..400 {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n {
            lines.sort();
            return lines;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{} never held {n} hook lines", log.display());
}

#[test]
fn the_engine_runs_the_task_end_hooks_for_any_front_end() {
    let tmp = tempfile::tempdir().expect("a temp dir");
    let log = tmp.path().join("hooks.log");
    let hook = format!("echo \"$SORTIE_TASK $SORTIE_STATE\" >> {}", log.display());
    let tasks: Vec<String> = [("ok", "exit 0"), ("bad", "exit 3")]
        .iter()
        .map(|(label, script)| {
            serde_json::json!({
                "label": label,
                "command": ["sh", "-c", script],
                "supervise": false,
                "on_task_end": hook,
            })
            .to_string()
        })
        .collect();
    let batch = tmp.path().join("batch.jsonl");
    std::fs::write(&batch, tasks.join("\n")).expect("the batch");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let run = |on_task_end: Option<String>, state: &str| {
        let loaded = sortie_batch::load(&batch, None, &Default::default()).expect("a batch");
        let front = super::Front {
            observer: Box::new(super::Quiet),
            on_task_end,
        };
        let state_dir = StateDir::new(tmp.path().join(state));
        runtime
            .block_on(super::run(&state_dir, None, loaded, front))
            .expect("the run ends");
    };
    // No CLI, a quiet observer: the batch's hooks still run, once per task.
    run(None, "s1");
    assert_eq!(hook_lines(&log, 2), ["bad failed", "ok completed"]);
    // `--on-task-end` wins over the batch's.
    let flag_log = tmp.path().join("flag.log");
    run(
        Some(format!(
            "echo \"flag $SORTIE_TASK\" >> {}",
            flag_log.display()
        )),
        "s2",
    );
    assert_eq!(hook_lines(&flag_log, 2), ["flag bad", "flag ok"]);
    let batch_lines = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        batch_lines.lines().count(),
        2,
        "the batch's hooks did not run beside the flag's: {batch_lines}"
    );
}

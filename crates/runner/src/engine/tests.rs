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
        .block_on(super::run(&state_dir, None, loaded, Box::new(observer)))
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

//! End-to-end tests: what the views say of a run as of a moment. `sortie replay RUN --at SEQ`
//! shows a past moment: a task running then is `running`, and so is the run, as of that seq;
//! only the final view of a run whose owner is gone calls it `interrupted`.

use serde_json::Value;

use crate::support::{Scratch, unique_run};

#[test]
fn replay_at_a_past_moment_calls_what_ran_then_running_not_interrupted() {
    let s = Scratch::new();
    let run = &unique_run("views-past");
    let batch = s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"a\"\ncommand = [\"sh\", \"-c\", \"echo hi\"]\n",
    );
    s.run_ok(&["run", "--run-id", run, batch.to_str().expect("utf-8")]);
    let replay = |args: &[&str]| -> Value {
        let mut all = vec!["--json", "replay", run.as_str()];
        all.extend(args);
        serde_json::from_slice(&s.run_ok(&all).stdout).expect("replay --json prints JSON")
    };
    let started = replay(&[])["events"]
        .as_array()
        .expect("events")
        .iter()
        .find(|e| e["event"].get("AttemptStarted").is_some())
        .and_then(|e| e["seq"].as_u64())
        .expect("the attempt started");
    let at = started.to_string();

    let past = replay(&["--at", &at]);
    assert_eq!(past["state"]["status"], "running", "{}", past["state"]);
    assert_eq!(past["state"]["tasks"][0]["state"], "running");
    let text = s.run_ok(&["replay", run, "--at", &at]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("state as of seq {started}:"))
            && text.contains(&format!("run {run}: running")),
        "{text}"
    );
    assert!(!text.contains("interrupted"), "{text}");

    assert_eq!(replay(&[])["state"]["status"], "completed");
}

/// A live run's replay (its owner still holds it) says running, not interrupted.
#[test]
fn replay_of_a_live_run_calls_it_running() {
    let s = Scratch::new();
    let run = &unique_run("views-live");
    let live =
        crate::support::Background::start(&s, run, &["run", "--run-id", run, "--", "sleep", "30"]);
    s.wait_task_state(run, 0, "running");
    let v: Value = serde_json::from_slice(&s.run_ok(&["--json", "replay", run]).stdout)
        .expect("replay --json prints JSON");
    assert_eq!(v["state"]["status"], "running", "{}", v["state"]);
    let _ = s.run(&["cancel", run]);
    drop(live);
}

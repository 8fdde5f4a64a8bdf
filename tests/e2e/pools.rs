//! Shared rate limits (issue 14): a pool backs off on 429s and its rate-limited attempts are
//! retried without spending `max_retries`; a named pool limits its attempts in flight (seen in
//! /proc and in the journal); `status` shows the pool and the tasks it holds back; `check`
//! names the pool mistakes.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::{Background, Scratch, event_kind, fake_command, unique_run};
use sortie_testkit::Events;

/// The most attempts of the journal's run that were in flight at once (launching to finished),
/// folded from the events alone.
fn most_in_flight(events: &[serde_json::Value]) -> usize {
    let mut live = BTreeSet::new();
    let mut most = 0;
    for e in events {
        let (kind, body) = event_kind(e);
        let key = body["task"].as_u64();
        match kind {
            "AttemptLaunching" => {
                live.insert(key);
            }
            "AttemptFinished" | "AttemptOrphaned" => {
                live.remove(&key);
            }
            _ => {}
        }
        most = most.max(live.len());
    }
    most
}

#[test]
fn a_pool_backs_off_on_429s_and_the_run_completes_without_spending_max_retries() {
    let s = Scratch::new();
    // Every task's first two attempts are refused with a 429 asking for 300 ms.
    let work = fake_command(&[
        "--quiet",
        "--fail-attempts",
        "2:rate_limit",
        "--retry-after",
        "300ms",
        "--attempt",
        "{attempt}",
    ]);
    let mut toml = String::from("concurrency = 4\n\n[pools.mock]\nconcurrency = 4\n");
    for l in ["a", "b", "c"] {
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"{l}\"\npool = \"mock\"\nmax_retries = 0\ncommand = {work}\n"
        ));
    }
    let batch = s.write("batch.toml", &toml);
    let run = unique_run("rl");
    let out = s.run(&["run", batch.to_str().expect("utf-8"), "--run-id", &run]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(&run);
    for i in 0..3 {
        let finished = events.of(i, "AttemptFinished");
        assert_eq!(finished.len(), 3, "task {i}: two 429s, then a success");
        for f in &finished[..2] {
            assert_eq!(f["outcome"]["rate_limited"], true, "{f}");
            assert_eq!(f["outcome"]["retry_after_ms"], 300, "{f}");
        }
        let retries = events.of(i, "RetryScheduled");
        assert_eq!(retries.len(), 2);
        for r in retries {
            let reason = r["reason"].as_str().unwrap_or_default();
            assert!(reason.contains("no retry spent"), "{reason}");
        }
        let end = events.of(i, "TaskFinished");
        assert_eq!(
            end[0]["result"]["state"], "completed",
            "max_retries = 0 was not spent"
        );
    }
    // The pool backed off: after each rate-limited end, nothing of the pool launched within
    // the retry-after the provider asked for.
    let mut until = 0u64;
    for e in &events {
        let at = e["at"].as_u64().expect("at");
        match event_kind(e) {
            ("AttemptFinished", b) if b["outcome"]["rate_limited"] == true => {
                until = until.max(at + 300);
            }
            ("AttemptLaunching", b) => {
                assert!(
                    at >= until || until == 0,
                    "launched at {at} before {until}: {b}"
                );
            }
            _ => {}
        }
    }
    let status = s.status(&run);
    let pool = &status["pools"][0];
    assert_eq!(pool["name"], "mock", "{status}");
    assert_eq!(pool["rate_limited"], 6, "{status}");
    assert_eq!(pool["succeeded"], 3, "{status}");
    assert_eq!(pool["in_flight"], 0, "{status}");
    s.audit_clean(&run);
}

#[test]
fn a_named_pool_limits_the_attempts_in_flight() {
    let s = Scratch::new();
    let work = fake_command(&["--quiet", "--sleep", "0.8"]);
    let mut toml = String::from("concurrency = 6\n\n[pools.narrow]\nconcurrency = 2\n");
    for i in 0..6 {
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"t{i}\"\npool = \"narrow\"\ncommand = {work}\n"
        ));
    }
    let batch = s.write("batch.toml", &toml);
    let run = unique_run("narrow");
    let bg = Background::start(
        &s,
        &run,
        &["run", batch.to_str().expect("utf-8"), "--run-id", &run],
    );
    let done = || {
        std::fs::read(s.state_dir().join("index").join(&run))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|e| e["status"].get("finished").is_some())
    };
    let mut most = 0;
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the run did not finish"
        );
        let alive: BTreeSet<_> = sortie_testkit::marked_processes(&run)
            .into_iter()
            .map(|m| m.attempt)
            .collect();
        most = most.max(alive.len());
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = bg.finish(60);
    assert!(out.status.success(), "{out:?}");
    assert!(most <= 2, "{most} attempts of the pool were alive at once");
    let events = s.events(&run);
    assert_eq!(
        most_in_flight(&events),
        2,
        "the journal: 2 at once, never more"
    );
    for i in 0..6 {
        assert_eq!(
            events.of(i, "TaskFinished")[0]["result"]["state"],
            "completed"
        );
    }
}

#[test]
fn status_shows_the_pool_and_the_tasks_it_holds_back() {
    let s = Scratch::new();
    let work = fake_command(&["--quiet", "--sleep", "3"]);
    let mut toml = String::from("concurrency = 4\n\n[pools.one]\nconcurrency = 1\n");
    for l in ["first", "second", "third"] {
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"{l}\"\npool = \"one\"\ncommand = {work}\n"
        ));
    }
    let batch = s.write("batch.toml", &toml);
    let run = unique_run("status");
    let bg = Background::start(
        &s,
        &run,
        &["run", batch.to_str().expect("utf-8"), "--run-id", &run],
    );
    let status = sortie_testkit::poll("the pool's first attempt in flight", 60, || {
        let out = s.sortie().args(["--json", "status", &run]).output().ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["pools"][0]["in_flight"] == 1 && v["pools"][0]["waiting"] == 2).then_some(v)
    });
    let pool = &status["pools"][0];
    assert_eq!(pool["name"], "one");
    assert_eq!(
        (pool["limit"].as_u64(), pool["max"].as_u64()),
        (Some(1), Some(1))
    );
    let waiting: Vec<&str> = status["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .filter(|t| t["waiting_for_pool"] == "one")
        .map(|t| t["label"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(waiting.len(), 2, "{status}");
    let text = String::from_utf8_lossy(&s.run_ok(&["status", &run]).stdout).into_owned();
    assert!(text.contains("pools:"), "{text}");
    assert!(
        text.contains("limit 1 of 1, 1 in flight, 2 waiting"),
        "{text}"
    );
    assert!(text.contains("waiting for pool one"), "{text}");
    let out = bg.finish(60);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn check_names_the_pool_mistakes() {
    let s = Scratch::new();
    let work = fake_command(&["--quiet"]);
    let toml = format!(
        "[pools.used]\nconcurrency = 2\n\n[pools.unused]\nconcurrency = 2\n\n\
         [pools.huge]\nconcurrency = 5000\n\n\
         [[tasks]]\nlabel = \"a\"\npool = \"used\"\ncommand = {work}\n\n\
         [[tasks]]\nlabel = \"b\"\npool = \"nowhere\"\ncommand = {work}\n\n\
         [[tasks]]\nlabel = \"c\"\npool = \"huge\"\nmax_rate_limits = 5000\ncommand = {work}\n"
    );
    let batch = s.write("batch.toml", &toml);
    let out = s.run(&["check", batch.to_str().expect("utf-8")]);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    for (line, says) in [
        (4, "no task uses pool \"unused\""),
        (
            8,
            "field `pools.huge.concurrency`: must be between 1 and 1024 (found 5000)",
        ),
        (
            17,
            "field `pool`: no pool \"nowhere\" (pools: huge, unused, used)",
        ),
        (
            23,
            "field `max_rate_limits`: must be between 0 and 1000 (found 5000)",
        ),
    ] {
        assert!(
            text.contains(&format!("batch.toml:{line}: ")),
            "line {line}: {text}"
        );
        assert!(text.contains(says), "{says}: {text}");
    }
}

#[test]
fn the_live_board_says_waiting_for_pool_for_a_task_its_pool_holds_back() {
    use std::io::Read;
    use std::sync::{Arc, Mutex};

    let s = Scratch::new();
    let work = fake_command(&["--quiet", "--sleep", "2"]);
    let mut toml = String::from("concurrency = 4\n\n[pools.one]\nconcurrency = 1\n");
    for l in ["first", "second"] {
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"{l}\"\npool = \"one\"\ncommand = {work}\n"
        ));
    }
    let batch = s.write("batch.toml", &toml);
    let (mut child, master) = crate::board::in_pty(
        &s,
        24,
        80,
        &["run", &batch.display().to_string(), "--run-id", "poolboard"],
    );
    let seen: Arc<Mutex<(vt100::Parser, Vec<String>)>> =
        Arc::new(Mutex::new((vt100::Parser::new(24, 80, 0), Vec::new())));
    let mut reader = master.try_clone_reader().expect("pty reader");
    let feeder = {
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut g = seen.lock().expect("screen");
                g.0.process(&buf[..n]);
                let rows: Vec<String> = g.0.screen().rows(0, 80).collect();
                g.1.extend(rows);
            }
        })
    };
    let status = child.wait().expect("wait for sortie");
    drop(master);
    let _ = feeder.join();
    assert!(status.success(), "sortie exited {status:?}");
    let g = seen.lock().expect("screen");
    // One screen showed the second task held back by its pool while the first ran.
    let waiting =
        g.1.iter()
            .find(|r| r.starts_with("  second") && r.trim_end().ends_with("waiting for pool one"));
    assert!(
        waiting.is_some(),
        "no board line `second ... waiting for pool one`; rows seen: {:?}",
        g.1.iter()
            .filter(|r| r.starts_with("  "))
            .collect::<std::collections::BTreeSet<_>>()
    );
    assert!(
        g.1.iter().any(|r| r.starts_with("  first")),
        "the running task's line"
    );
}

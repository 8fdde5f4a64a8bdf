//! The scale benchmark of `cargo xtask bench`: resume of a big crashed run, and the peak memory
//! of a big batch, both measured on the real `sortie` binary.
//!
//! - Resume: a journal of `--tasks` tasks (default 100,000) of which `--finished` (99,000) have
//!   finished and `--running` (16) were running when the owner died is written through the
//!   journal API, event for event what the engine writes for a plain command (`RunStarted` with
//!   the batch as `sortie run` loads it, every task queued, then per task launching, started,
//!   finished, task finished, sixteen tasks interleaved, snapshots at the engine's cadence).
//!   Then, `--rounds` times (default 3) each on a fresh copy of that state dir, `sortie status`
//!   of it, and `sortie resume` of it, under `/usr/bin/time`; every task's command is `touch
//!   MARKER`, so the marker appears with the first new spawn. Reported (medians): the wall
//!   time from spawning `sortie resume` to the marker (process start, replay, orphan reaping,
//!   first launch) and the CPU time (user + system, from `/proc`) it had used by then, the time
//!   to the end of the run, the peak RSS of the resume; the wall and CPU time of `status`. On
//!   a loaded machine the CPU times are the figures to compare: the wall times wait for cores.
//! - Batch: `sortie run` of `--run-tasks` (100,000) `true` tasks at `--run-concurrency` (64)
//!   under `/usr/bin/time`: wall time and peak RSS. `--run-tasks 0` skips it.
//!
//! `cargo run --release -p sortie-runner --example scale_bench -- --sortie target/release/sortie`
//! (`--work DIR` keeps the state dirs and logs there, for profiling).
//!
//! Prints a table, then one line `scale_bench key=value ...` for `cargo xtask bench`.

#![allow(clippy::unwrap_used, reason = "a benchmark: any failure aborts it")]
#![allow(
    clippy::disallowed_methods,
    reason = "a benchmark runs sortie and /usr/bin/time"
)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sortie_batch::{Overrides, load};
use sortie_core::{
    Attempt, AttemptOutcome, Event, RunId, RunState, Seq, Stamped, StopReason, TaskId, TaskResult,
    TerminalState, Timestamp, Usage,
};
use sortie_journal::Journal;
use sortie_runner::clock;
use sortie_runner::layout::StateDir;
use sortie_runner::layout::index::{self, IndexStatus, RunEntry};

struct Args {
    sortie: PathBuf,
    tasks: u32,
    finished: u32,
    running: u32,
    run_tasks: u32,
    run_concurrency: u32,
    work: Option<PathBuf>,
    rounds: usize,
}

fn args() -> Args {
    let mut a = Args {
        sortie: PathBuf::from("target/release/sortie"),
        tasks: 100_000,
        finished: 99_000,
        running: 16,
        run_tasks: 100_000,
        run_concurrency: 64,
        work: None,
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--sortie" => a.sortie = value.into(),
            "--tasks" => a.tasks = value.parse().unwrap(),
            "--finished" => a.finished = value.parse().unwrap(),
            "--running" => a.running = value.parse().unwrap(),
            "--run-tasks" => a.run_tasks = value.parse().unwrap(),
            "--run-concurrency" => a.run_concurrency = value.parse().unwrap(),
            "--work" => a.work = Some(value.into()),
            "--rounds" => a.rounds = value.parse::<usize>().unwrap().max(1),
            other => panic!(
                "unknown flag {other} (use --sortie, --tasks, --finished, --running, \
                 --run-tasks, --run-concurrency, --work, --rounds)"
            ),
        }
    }
    assert!(a.finished + a.running < a.tasks, "some tasks must remain");
    a.sortie = std::path::absolute(&a.sortie).unwrap();
    a
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// A JSON Lines batch of `n` tasks, each running `argv`.
fn write_batch(path: &Path, n: u32, argv: &[&str]) {
    let line = format!(
        "{{\"command\": [{}]}}\n",
        argv.iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for _ in 0..n {
        f.write_all(line.as_bytes()).unwrap();
    }
    f.flush().unwrap();
}

/// Appends events, checked against the state as the engine checks them, in big writes.
struct Writer {
    journal: Journal,
    state: RunState,
    pending: Vec<(Timestamp, Event)>,
    at: u64,
    /// The records the last snapshot holds.
    snapshotted: u64,
    /// How long each snapshot took to write.
    snapshot_secs: Vec<f64>,
}

impl Writer {
    fn push(&mut self, event: Event) {
        self.at += 1;
        let stamped = Stamped {
            seq: self.state.next_seq,
            at: Timestamp(self.at),
            event,
        };
        self.state.apply(&stamped).unwrap();
        self.pending.push((stamped.at, stamped.event));
        if self.pending.len() >= 10_000 {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.pending.is_empty() {
            self.journal.append_all(&self.pending).unwrap();
            self.pending.clear();
        }
        // Snapshots at the engine's cadence, as a live run leaves them.
        let every = sortie_runner::engine::snapshot_every(self.state.tasks.len());
        if self.state.next_seq.0 - self.snapshotted >= every {
            let t = Instant::now();
            self.journal.write_snapshot(&self.state).unwrap();
            self.snapshot_secs.push(t.elapsed().as_secs_f64());
            self.snapshotted = self.state.next_seq.0;
        }
    }
}

/// Writes the crashed run; returns its id and how many events it holds.
fn crashed_run(state_dir: &Path, batch_file: &Path, a: &Args) -> (RunId, u64) {
    let loaded = load(batch_file, None, &Overrides::default()).unwrap();
    let state_dir = StateDir::new(state_dir);
    state_dir.ensure().unwrap();
    let run_id = RunId::new("scale-resume").unwrap();
    let dir = state_dir.run(&run_id);
    let journal = Journal::create(dir.path()).unwrap();
    let lock = dir.acquire().unwrap();
    dir.save_env(&loaded.env).unwrap();
    let start = clock::now();
    index::write(
        &state_dir,
        &RunEntry {
            run_id: run_id.clone(),
            created: start,
            source: loaded.batch.source.clone(),
            tasks: a.tasks,
            status: IndexStatus::Running,
            pid: 1,
            updated: start,
            acked: None,
            damaged: None,
            parent: None,
            recovered: 0,
        },
    )
    .unwrap();
    let mut w = Writer {
        journal,
        state: RunState::new(),
        pending: Vec::new(),
        at: start.0.saturating_sub(3_600_000),
        snapshotted: 0,
        snapshot_secs: Vec::new(),
    };
    w.push(Event::RunStarted {
        run_id: run_id.clone(),
        batch: loaded.batch,
        batch_digest: loaded.digest,
        host: "bench-host".into(),
        pid: 1,
    });
    for t in 0..a.tasks {
        w.push(Event::TaskQueued { task: TaskId(t) });
    }
    let a1 = Attempt(1);
    // Sixteen at a time, as at concurrency 16: launch, start, finish, finish the task.
    for group in (0..a.finished).collect::<Vec<_>>().chunks(16) {
        for &t in group {
            w.push(Event::AttemptLaunching {
                task: TaskId(t),
                attempt: a1,
                model: None,
            });
        }
        for &t in group {
            w.push(started(t));
        }
        for &t in group {
            w.push(Event::AttemptFinished {
                task: TaskId(t),
                attempt: a1,
                outcome: AttemptOutcome::completed(),
                usage: Usage::ZERO,
                output: String::new(),
            });
            w.push(Event::TaskFinished {
                task: TaskId(t),
                result: TaskResult {
                    state: TerminalState::Completed,
                    stop_reason: StopReason::Completed,
                    phase: None,
                    error: None,
                    text: "(no output)".into(),
                    result: None,
                },
            });
        }
    }
    // The attempts running when the owner died: their processes are gone (a start time that
    // matches no process), so resume records them orphaned and runs them again.
    for t in a.finished..a.finished + a.running {
        w.push(Event::AttemptLaunching {
            task: TaskId(t),
            attempt: a1,
            model: None,
        });
        w.push(started(t));
    }
    w.flush();
    let events = w.state.next_seq.0;
    println!(
        "snapshots written while the journal was: {} ({})",
        w.snapshot_secs.len(),
        w.snapshot_secs
            .iter()
            .map(|s| format!("{s:.3} s"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    drop(lock);
    (run_id, events)
}

fn started(t: u32) -> Event {
    Event::AttemptStarted {
        task: TaskId(t),
        attempt: Attempt(1),
        pid: 3_000_000 + t,
        start_time: 1,
    }
}

/// What one timed `sortie` command took.
struct Timed {
    /// Seconds from the spawn to `marker`, if one was given and appeared.
    first: Option<f64>,
    /// CPU seconds (user + system) the command had used when `marker` appeared.
    first_cpu: Option<f64>,
    /// Seconds to its end.
    total: f64,
    /// CPU seconds (user + system) in all.
    cpu: f64,
    /// Peak RSS in KiB.
    rss_kib: u64,
}

/// CPU seconds (user + system) process `pid` has used so far, from `/proc` (clock ticks of
/// 1/100 s).
fn cpu_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// The one child of process `pid` (`/usr/bin/time`'s sortie).
fn child_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Runs `sortie ARGS` under `/usr/bin/time`.
fn timed_sortie(a: &Args, work: &Path, sortie_args: &[&str], marker: Option<&Path>) -> Timed {
    let rss_file = work.join("time.out");
    let log = std::fs::File::create(work.join("sortie.log")).unwrap();
    let start = Instant::now();
    let mut child = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M %U %S")
        .arg("-o")
        .arg(&rss_file)
        .arg(&a.sortie)
        .args(sortie_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let (mut first, mut first_cpu, mut sortie_pid) = (None, None, None);
    if let Some(marker) = marker {
        loop {
            if sortie_pid.is_none() {
                sortie_pid = child_of(child.id());
            }
            if marker.exists() {
                first = Some(start.elapsed().as_secs_f64());
                first_cpu = sortie_pid.and_then(cpu_of);
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let status = child.wait().unwrap();
    let total = start.elapsed().as_secs_f64();
    assert!(
        status.success(),
        "sortie {sortie_args:?} failed ({status}); see {}",
        work.join("sortie.log").display()
    );
    let line = std::fs::read_to_string(&rss_file)
        .unwrap()
        .lines()
        .rfind(|l| l.split_whitespace().count() == 3)
        .unwrap()
        .to_owned();
    let v: Vec<f64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    Timed {
        first,
        first_cpu,
        total,
        cpu: v[1] + v[2],
        rss_kib: v[0] as u64,
    }
}

/// The median of some figures.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Copies a state dir (a fresh copy of the crashed run for each round).
fn copy_state(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let copied = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(copied.success());
}

/// Milliseconds from `RunResumed` to the first `AttemptStarted` after it, by the journal's
/// clock (the engine's view, without process start and replay before `RunResumed`).
fn journal_gap_ms(state_dir: &Path, run_id: &RunId, from: u64) -> Option<u64> {
    let j = Journal::open_read_only(StateDir::new(state_dir).run(run_id).path()).unwrap();
    let mut resumed = None;
    for r in j.read(Seq(from), None) {
        let s = r.unwrap();
        match s.event {
            Event::RunResumed { .. } => resumed = Some(s.at.0),
            Event::AttemptStarted { .. } if resumed.is_some() => {
                return resumed.map(|r| s.at.0.saturating_sub(r));
            }
            _ => {}
        }
    }
    None
}

fn main() {
    let a = args();
    let tmp = tempfile::tempdir().unwrap();
    let work = match &a.work {
        Some(w) => {
            let _ = std::fs::remove_dir_all(w);
            std::fs::create_dir_all(w).unwrap();
            w.as_path()
        }
        None => tmp.path(),
    };
    let load_before = loadavg();
    println!(
        "scale_bench: resume of {} tasks ({} finished, {} running when it died), then a batch of \
         {} tasks (load average {load_before})",
        a.tasks, a.finished, a.running, a.run_tasks
    );

    let marker = work.join("spawned");
    let batch_file = work.join("resume.jsonl");
    write_batch(&batch_file, a.tasks, &["touch", marker.to_str().unwrap()]);
    let crashed = work.join("state.crashed");
    let build = Instant::now();
    let (run_id, events) = crashed_run(&crashed, &batch_file, &a);
    let build_s = build.elapsed().as_secs_f64();
    let state = work.join("state");
    let state_s = state.to_str().unwrap();
    // `sortie status` of the crashed run, each round on a fresh copy (a reader's open of the
    // copy is what a user's would be).
    let mut status = Vec::new();
    for _ in 0..a.rounds {
        copy_state(&crashed, &state);
        status.push(timed_sortie(
            &a,
            work,
            &["--state-dir", state_s, "status", run_id.as_str()],
            None,
        ));
    }
    let mut resumes = Vec::new();
    for _ in 0..a.rounds {
        copy_state(&crashed, &state);
        let _ = std::fs::remove_file(&marker);
        let t = timed_sortie(
            &a,
            work,
            &["--state-dir", state_s, "resume", run_id.as_str()],
            Some(&marker),
        );
        assert!(t.first.is_some(), "the marker appeared");
        resumes.push(t);
    }
    let first = median(resumes.iter().filter_map(|t| t.first).collect());
    let first_cpu = median(resumes.iter().filter_map(|t| t.first_cpu).collect());
    let resume_total = median(resumes.iter().map(|t| t.total).collect());
    let resume_rss = resumes.iter().map(|t| t.rss_kib).max().unwrap_or(0);
    let status_s = median(status.iter().map(|t| t.total).collect());
    let status_cpu = median(status.iter().map(|t| t.cpu).collect());
    let status_rss = status.iter().map(|t| t.rss_kib).max().unwrap_or(0);
    let gap_ms = journal_gap_ms(&state, &run_id, events);
    let rounds = |v: &mut dyn Iterator<Item = f64>| {
        v.map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(", ")
    };

    println!();
    println!(
        "{:<52} {:>12}",
        format!("resume ({} rounds, medians)", a.rounds),
        ""
    );
    println!(
        "{:<52} {:>10.3} s",
        format!("journal written ({events} events)"),
        build_s
    );
    println!(
        "{:<52} {:>10.3} s ({})",
        "sortie status of the crashed run",
        status_s,
        rounds(&mut status.iter().map(|t| t.total))
    );
    println!(
        "{:<52} {:>10.3} s ({})",
        "  its CPU (user + system)",
        status_cpu,
        rounds(&mut status.iter().map(|t| t.cpu))
    );
    println!(
        "{:<52} {:>10.1} MB",
        "  its peak RSS",
        status_rss as f64 / 1024.0
    );
    println!(
        "{:<52} {:>10.3} s ({})",
        "sortie resume: spawn to first new task's process",
        first,
        rounds(&mut resumes.iter().filter_map(|t| t.first))
    );
    println!(
        "{:<52} {:>10.3} s ({})",
        "  its CPU (user + system) by then",
        first_cpu,
        rounds(&mut resumes.iter().filter_map(|t| t.first_cpu))
    );
    println!(
        "{:<52} {:>10} ms",
        "  of which RunResumed to AttemptStarted (journal)",
        gap_ms.map_or("?".into(), |g| g.to_string())
    );
    println!(
        "{:<52} {:>10.3} s",
        format!("sortie resume: to the end ({} tasks)", a.tasks - a.finished),
        resume_total
    );
    println!(
        "{:<52} {:>10.1} MB",
        "sortie resume: peak RSS",
        resume_rss as f64 / 1024.0
    );
    if a.work.is_none() {
        let _ = std::fs::remove_dir_all(&state);
        let _ = std::fs::remove_dir_all(&crashed);
    }

    let (mut run_s, mut run_rss) = (f64::NAN, 0);
    if a.run_tasks > 0 {
        let run_file = work.join("run.jsonl");
        write_batch(&run_file, a.run_tasks, &["true"]);
        let run_state = work.join("run-state");
        let concurrency = a.run_concurrency.to_string();
        let t = timed_sortie(
            &a,
            work,
            &[
                "--state-dir",
                run_state.to_str().unwrap(),
                "run",
                run_file.to_str().unwrap(),
                "--concurrency",
                &concurrency,
            ],
            None,
        );
        (run_s, run_rss) = (t.total, t.rss_kib);
        println!(
            "{:<52} {:>10.3} s ({:.0} tasks/s)",
            format!(
                "sortie run: {} x true, concurrency {}",
                a.run_tasks, a.run_concurrency
            ),
            run_s,
            f64::from(a.run_tasks) / run_s
        );
        println!(
            "{:<52} {:>10.1} MB",
            "sortie run: peak RSS",
            run_rss as f64 / 1024.0
        );
    }
    let load_after = loadavg();
    println!("load average before {load_before}, after {load_after} (2 cores)");
    println!(
        "scale_bench resume_tasks={} resume_finished={} resume_events={events} \
         resume_first_spawn_s={first:.3} resume_first_cpu_s={first_cpu:.3} resume_gap_ms={} \
         resume_total_s={resume_total:.3} resume_rss_mb={:.1} status_s={status_s:.3} \
         status_cpu_s={status_cpu:.3} rounds={} run_tasks={} run_concurrency={} run_s={run_s:.3} \
         run_rss_mb={:.1} load={load_after}",
        a.tasks,
        a.finished,
        gap_ms.map_or("?".into(), |g| g.to_string()),
        resume_rss as f64 / 1024.0,
        a.rounds,
        a.run_tasks,
        a.run_concurrency,
        run_rss as f64 / 1024.0,
    );
}

//! The journal benchmark: durable append throughput (one writer flushing per event, then many
//! writers sharing flushes through group commit, in both durability modes) and replay/audit
//! speed over a realistic journal of about a million events.
//!
//! `cargo run --release -p sortie-journal --example journal_bench [-- --events N --secs S
//! --writers W --dir PATH --replay-only]` (`--dir` keeps the big journal there and reuses it
//! next time; `--replay-only` skips the appends and measures the reads alone; `--only replay`
//! or `--only audit` measures that one read alone, for `valgrind --tool=callgrind`, whose
//! instruction counts then hold the journal's opens and that read only).
//!
//! Prints a table and a last line `journal_bench key=value ...` for scripts (`cargo xtask
//! bench`). The machine may be shared: wall-clock rates come with the CPU time spent and the
//! load average, so that a slow run can be told from a slow journal.

#![allow(clippy::unwrap_used, reason = "a benchmark: any failure aborts it")]

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sortie_core::{Attempt, Event, Seq, TaskId, Timestamp};
use sortie_journal::{Durability, Journal};

struct Args {
    events: u64,
    secs: f64,
    writers: u32,
    dir: Option<PathBuf>,
    replay_only: bool,
    /// `--only replay|audit`: measure that read alone (with `--replay-only`, for callgrind).
    only: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        events: 1_000_000,
        secs: 2.0,
        writers: 16,
        dir: None,
        replay_only: false,
        only: None,
    };
    const USAGE: &str = "journal_bench [--events N] [--secs S] [--writers N] [--dir DIR] \
                         [--replay-only] [--only replay|audit]";
    let fail = |message: String| -> ! {
        eprintln!("journal_bench: {message}\nusage: {USAGE}");
        std::process::exit(2)
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--replay-only" => {
                a.replay_only = true;
                continue;
            }
            "-h" | "--help" => {
                println!("usage: {USAGE}");
                std::process::exit(0)
            }
            _ => {}
        }
        let Some(value) = it.next() else {
            fail(format!("{flag} needs a value"))
        };
        let bad = || -> ! { fail(format!("{flag} takes a number, not {value:?}")) };
        match flag.as_str() {
            "--events" => a.events = value.parse().unwrap_or_else(|_| bad()),
            "--secs" => a.secs = value.parse().unwrap_or_else(|_| bad()),
            "--writers" => a.writers = value.parse().unwrap_or_else(|_| bad()),
            "--dir" => a.dir = Some(value.into()),
            "--only" if value == "replay" || value == "audit" => a.only = Some(value),
            other => fail(format!("unknown flag {other}")),
        }
    }
    a
}

/// CPU seconds (user + system, all threads) this process has used.
fn cpu_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// Runs `f`, returning its result, wall seconds and CPU seconds.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (start, cpu) = (Instant::now(), cpu_secs());
    let out = f();
    (out, start.elapsed().as_secs_f64(), cpu_secs() - cpu)
}

struct Rate {
    per_s: f64,
    appends: u64,
    flushes: u64,
}

/// Appends from `writers` threads, one event per append, for `secs`.
fn append_rate(writers: u32, secs: f64, durability: Durability) -> Rate {
    let tmp = tempfile::tempdir().unwrap();
    let j = Arc::new(Journal::create(tmp.path()).unwrap());
    j.set_durability(durability);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let (j, stop, count) = (Arc::clone(&j), Arc::clone(&stop), Arc::clone(&count));
            std::thread::spawn(move || {
                let mut k = 0;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    let e = Event::AttemptProgress {
                        task: TaskId(w),
                        attempt: Attempt(1),
                        usage: support::reported(k),
                    };
                    j.append(Timestamp(k), &e).unwrap();
                    count.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let appends = count.load(Ordering::Relaxed);
    assert_eq!(j.next_seq().0, appends);
    Rate {
        per_s: appends as f64 / elapsed,
        appends,
        flushes: j.flush_count(),
    }
}

fn row(what: &str, rate: &Rate) {
    println!(
        "{:<48} {:>10.0}/s {:>10} {:>9.1}",
        what,
        rate.per_s,
        rate.appends,
        rate.appends as f64 / rate.flushes.max(1) as f64
    );
}

/// Writes the realistic journal of `tasks` tasks in `dir` unless it is already there.
fn build(dir: &Path, tasks: u32, total: u64) -> Option<f64> {
    if Journal::open_read_only(dir).is_ok_and(|j| j.next_seq().0 == total) {
        return None;
    }
    let _ = std::fs::remove_dir_all(dir);
    let start = Instant::now();
    let j = Journal::create(dir).unwrap();
    let mut batch = Vec::with_capacity(10_000);
    for e in support::realistic(tasks, 3) {
        batch.push(e);
        if batch.len() == batch.capacity() {
            j.append_all(&batch).unwrap();
            batch.clear();
        }
    }
    j.append_all(&batch).unwrap();
    assert_eq!(j.next_seq().0, total);
    Some(start.elapsed().as_secs_f64())
}

fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            dir_size(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

fn main() {
    let args = args();
    if let Some(only) = args.only.as_deref() {
        measure_alone(&args, only);
        return;
    }
    let w = args.writers;
    // `--replay-only`: no time spent appending (the rows read as zero).
    let secs = if args.replay_only { 0.0 } else { args.secs };
    let load_before = loadavg();
    println!(
        "journal_bench: {}s of appends per row, then replay of ~{} events (load average {load_before})",
        args.secs, args.events
    );
    println!();
    println!(
        "{:<48} {:>12} {:>10} {:>9}",
        "durable appends", "rate", "appends", "per flush"
    );
    let flush_1 = append_rate(1, secs, Durability::Flush);
    row("flush: 1 writer (one flush per event)", &flush_1);
    let flush_w = append_rate(w, secs, Durability::Flush);
    row(&format!("flush: {w} writers (group commit)"), &flush_w);
    let sync_1 = append_rate(1, secs, Durability::Sync);
    row("sync: 1 writer (one fdatasync per event)", &sync_1);
    let sync_w = append_rate(w, secs, Durability::Sync);
    row(&format!("sync: {w} writers (group commit)"), &sync_w);
    let sync_4w = append_rate(4 * w, secs, Durability::Sync);
    row(&format!("sync: {} writers (group commit)", 4 * w), &sync_4w);
    let flush_ratio = flush_w.per_s / flush_1.per_s;
    let sync_ratio = sync_w.per_s / sync_1.per_s;
    let sync_ratio_4w = sync_4w.per_s / sync_1.per_s;
    println!(
        "group commit speed-up: flush {flush_ratio:.1}x ({w} writers), sync {sync_ratio:.1}x \
         ({w} writers), sync {sync_ratio_4w:.1}x ({} writers)",
        4 * w
    );

    // A realistic journal: RunStarted, then per task queued, launching, started, 3 progress
    // checkpoints, finished, task finished; four tasks interleaved; RunFinished.
    let tasks = u32::try_from(args.events.saturating_sub(2) / 8).unwrap();
    let total = support::realistic_len(tasks, 3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    let build_secs = build(&dir, tasks, total);
    let size = dir_size(&dir);

    // Each measure on a freshly opened journal: nothing cached by sled, as for a CLI command.
    let (j, open_secs, _) = timed(|| Journal::open_read_only(&dir).unwrap());
    let (state, replay_secs, replay_cpu) = timed(|| j.replay(None).unwrap());
    assert!(state.is_finished() && state.next_seq.0 == total);
    drop((j, state));
    let j = Journal::open_read_only(&dir).unwrap();
    let (audit, audit_secs, audit_cpu) = timed(|| j.audit());
    assert!(audit.is_clean(), "{:?}", audit.first_bad);
    drop((j, audit));
    let j = Journal::open_read_only(&dir).unwrap();
    let ((scanned, record_bytes), scan_secs, scan_cpu) = timed(|| j.raw_scan().unwrap());
    assert_eq!(scanned, total);
    drop(j);
    let j = Journal::open_read_only(&dir).unwrap();
    let (read, read_secs, read_cpu) = timed(|| {
        j.read(Seq(0), None)
            .map(|r| r.map(drop))
            .collect::<Result<Vec<()>, _>>()
            .unwrap()
            .len() as u64
    });
    assert_eq!(read, total);
    let (_, first_secs, _) = timed(|| j.replay(Some(Seq(0))).unwrap());
    drop(j);

    let replay_rate = total as f64 / replay_secs;
    let audit_rate = total as f64 / audit_secs;
    println!();
    println!(
        "{:<48} {:>12} {:>10} {:>9}",
        format!("{total} events, {tasks} tasks"),
        "rate",
        "wall s",
        "cpu s"
    );
    let line = |what: &str, secs: f64, cpu: f64| {
        println!(
            "{:<48} {:>10.0}/s {:>10.3} {:>9.3}",
            what,
            total as f64 / secs,
            secs,
            cpu
        );
    };
    if let Some(secs) = build_secs {
        line("write with append_all (10k per call)", secs, f64::NAN);
    }
    line(
        "replay (2 scan+decode threads, apply)",
        replay_secs,
        replay_cpu,
    );
    line("audit (replay + ledger recomputed)", audit_secs, audit_cpu);
    line(
        "sled scan alone, one thread (no decoding)",
        scan_secs,
        scan_cpu,
    );
    line(
        "read() iterator, one thread (scan + decode)",
        read_secs,
        read_cpu,
    );
    println!(
        "{:<48} {:>12} {:>10.3}",
        format!("of which RunStarted ({tasks} specs)"),
        "",
        first_secs
    );
    println!("{:<48} {:>12} {:>10.3}", "open", "", open_secs);
    println!(
        "{:<48} {:>10.1} MiB ({:.1} MiB of records)",
        "size on disk",
        size as f64 / f64::from(1 << 20),
        record_bytes as f64 / f64::from(1 << 20)
    );
    let load_after = loadavg();
    println!("load average before {load_before}, after {load_after} (2 cores)");
    println!(
        "journal_bench flush_1_per_s={:.0} flush_{w}_per_s={:.0} flush_ratio={flush_ratio:.1} \
         sync_1_per_s={:.0} sync_{w}_per_s={:.0} sync_ratio={sync_ratio:.1} \
         sync_{}_per_s={:.0} sync_ratio_{}={sync_ratio_4w:.1} replay_events={total} \
         replay_per_s={replay_rate:.0} replay_cpu_s={replay_cpu:.2} audit_per_s={audit_rate:.0} \
         bytes={size} load={load_after}",
        flush_1.per_s,
        flush_w.per_s,
        sync_1.per_s,
        sync_w.per_s,
        4 * w,
        sync_4w.per_s,
        4 * w,
    );
}

/// `--only replay|audit`: that read alone on the big journal, nothing else measured (no
/// appends), so that `valgrind --tool=callgrind` counts its instructions only (and the open's).
fn measure_alone(args: &Args, only: &str) {
    let tasks = u32::try_from(args.events.saturating_sub(2) / 8).unwrap();
    let total = support::realistic_len(tasks, 3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = args.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    build(&dir, tasks, total);
    let j = Journal::open_read_only(&dir).unwrap();
    let sys_before = sys_secs();
    if only == "replay" {
        let (state, secs, cpu) = timed(|| j.replay(None).unwrap());
        assert!(state.is_finished() && state.next_seq.0 == total);
        println!(
            "replay alone: {:.0}/s, {secs:.3} s, {cpu:.3} s CPU",
            total as f64 / secs
        );
    } else {
        let (audit, secs, cpu) = timed(|| j.audit());
        assert!(audit.is_clean(), "{:?}", audit.first_bad);
        println!(
            "audit alone: {:.0}/s, {secs:.3} s, {cpu:.3} s CPU",
            total as f64 / secs
        );
    }
    println!("of which system: {:.3} s", sys_secs() - sys_before);
}

/// System CPU seconds (all threads) this process has used.
fn sys_secs() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    stat.rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().nth(12))
        .and_then(|f| f.parse::<f64>().ok())
        .map_or(0.0, |ticks| ticks / 100.0)
}

//! A damaged journal is never silent: for many damage positions across a real multi-task
//! journal (flipped bytes inside its written records, a truncated file, zeroed pages of the log,
//! a zeroed sled snapshot), `audit` exits 4 with one line naming what was lost, never says
//! "whole", never panics; `status`, `replay`, `resume` and `list` refuse it in the same words.

use std::path::{Path, PathBuf};

use crate::support::{Scratch, fake_command};
use sortie_testkit::Events;

const RUN: &str = "good";
const TASKS: usize = 12;

/// A finished run of [`TASKS`] fake agents reporting usage, in a scratch state dir.
fn finished_run() -> Scratch {
    let s = Scratch::new();
    let mut toml = String::from("concurrency = 3\n");
    for i in 0..TASKS {
        let usage = format!("{},{},0.00{:02}", 100 + i, 10 + i, 10 + i);
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"t{i:02}\"\ncommand = {}\n",
            fake_command(&["--usage", &usage, "--turns", "2", "--answer", "done"])
        ));
    }
    let batch = s.write("batch.toml", &toml);
    s.run_ok(&["run", "--run-id", RUN, batch.to_str().expect("utf-8")]);
    s
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        let kind = entry.file_type().expect("type");
        if kind.is_dir() {
            copy_dir(&entry.path(), &target);
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
        // A live run's control socket or an agent's FIFO is not the run's record.
    }
}

/// A copy of `original`'s state dir, damaged by `damage` (given the journal's directory).
fn damaged(original: &Scratch, damage: impl FnOnce(&Path)) -> Scratch {
    let copy = Scratch::new();
    copy_dir(&original.state_dir(), &copy.state_dir());
    damage(&journal_dir(&copy));
    copy
}

fn journal_dir(s: &Scratch) -> PathBuf {
    s.state_dir().join("runs").join(RUN).join("journal")
}

fn db(s: &Scratch) -> Vec<u8> {
    std::fs::read(journal_dir(s).join("db")).expect("read the db")
}

/// The length of the log's written part (the rest of the segment is zeros).
fn written(bytes: &[u8]) -> usize {
    bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1)
}

/// The stored bytes of every record, read through a private copy of the journal.
fn records(s: &Scratch) -> Vec<Vec<u8>> {
    let copy = tempfile::tempdir().expect("tempdir");
    let run_dir = copy.path().join("run");
    copy_dir(&s.state_dir().join("runs").join(RUN), &run_dir);
    let journal = sortie_journal::Journal::open_read_only(&run_dir).expect("the journal opens");
    (0..journal.next_seq().0)
        .map(|seq| {
            journal
                .raw_get(sortie_core::Seq(seq))
                .expect("readable")
                .expect("present")
        })
        .collect()
}

/// Every offset where `needle` is in `hay`.
fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

/// What `sortie audit` says about a damaged copy: asserts exit 4, one line that names the
/// loss, no "whole", no panic, no raw sled log; returns the line.
fn audit_refuses(s: &Scratch, what: &str) -> String {
    let out = s.run(&["audit", RUN]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(4),
        "{what}: audit must exit 4\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        !stdout.contains("whole"),
        "{what}: audit says whole: {stdout}"
    );
    assert!(
        !stderr.contains("panicked"),
        "{what}: audit panicked: {stderr}"
    );
    assert!(!stderr.contains("sled"), "{what}: raw sled log: {stderr}");
    let first = stdout.lines().next().unwrap_or_default().to_owned();
    assert!(
        first.contains("truncated: records ")
            || first.contains("storage damaged: ")
            || first.contains("CORRUPT at seq"),
        "{what}: audit does not name the loss: {stdout}"
    );
    first
}

#[test]
fn a_flipped_byte_in_any_written_record_is_never_silent() {
    let original = finished_run();
    let records = records(&original);
    assert!(records.len() > 50, "a real multi-task journal");
    let log = db(&original);
    let mut tried = 0;
    for (seq, record) in records.iter().enumerate().step_by(3) {
        let places = find_all(&log, record);
        if places.is_empty() {
            continue; // held only in a form sled rewrote (a page image), not as written
        }
        let copy = damaged(&original, |dir| {
            let mut bytes = db(&original);
            for at in &places {
                bytes[at + record.len() / 2] ^= 0x5a;
            }
            std::fs::write(dir.join("db"), bytes).expect("write");
        });
        let line = audit_refuses(&copy, &format!("record {seq} flipped"));
        if let Some(rest) = line.split("truncated: records ").nth(1) {
            let from: u64 = rest
                .split("..")
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a seq");
            assert!(from <= seq as u64, "record {seq} flipped, says {line}");
        }
        tried += 1;
    }
    assert!(
        tried >= 15,
        "only {tried} records found as written in the log"
    );
}

#[test]
fn a_truncated_log_or_zeroed_pages_are_never_silent() {
    let original = finished_run();
    let log = db(&original);
    let end = written(&log);
    for cut in [end / 10, end / 3, end / 2, end * 9 / 10] {
        let copy = damaged(&original, |dir| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("db"))
                .expect("open");
            f.set_len(cut as u64).expect("truncate");
        });
        audit_refuses(&copy, &format!("log cut at {cut} of {end}"));
    }
    // Cut just before the end, inside the last record as the log last holds it: sled's log
    // also holds records a second time (the page images it rewrites), so such a cut may lose
    // no record at all. Then the journal is whole, and every record reads back unchanged;
    // otherwise audit refuses it.
    let original_records = records(&original);
    let last = original_records.last().cloned().expect("records");
    for cut in [
        end - 20,
        find_all(&log, &last)
            .last()
            .map_or(end - 20, |at| at + last.len() / 2),
    ] {
        let copy = damaged(&original, |dir| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(dir.join("db"))
                .expect("open");
            f.set_len(cut as u64).expect("truncate");
        });
        whole_or_refused(
            &copy,
            &original_records,
            &format!("log cut at {cut} of {end}"),
        );
    }
    // A zeroed page may likewise hold only such second copies (the last page often does, when
    // the writer's close flushed page images last): whole is then true, and must mean unchanged.
    let mut refused = 0;
    for page in (0..end).step_by(4096).skip(1) {
        let copy = damaged(&original, |dir| {
            let mut bytes = db(&original);
            let stop = (page + 4096).min(bytes.len());
            bytes[page..stop].fill(0);
            std::fs::write(dir.join("db"), bytes).expect("write");
        });
        if !whole_or_refused(&copy, &original_records, &format!("page at {page} zeroed")) {
            refused += 1;
        }
    }
    assert!(refused > 0, "no zeroed page of the log lost a record");
}

/// Either `audit` says the damaged copy is whole and every record reads back as it was written,
/// or it refuses it as [`audit_refuses`] demands; true when it said whole.
fn whole_or_refused(copy: &Scratch, original_records: &[Vec<u8>], what: &str) -> bool {
    let out = copy.run(&["audit", RUN]);
    if out.status.code() == Some(0) {
        assert_eq!(
            records(copy),
            original_records,
            "{what}: audit says whole, so nothing may be lost"
        );
        true
    } else {
        audit_refuses(copy, what);
        false
    }
}

#[test]
fn a_zeroed_or_removed_sled_snapshot_with_damage_behind_it_is_never_silent() {
    let original = finished_run();
    // A writer's open and close leaves sled's own snapshot of its page table beside the log
    // (readers never open the run's own files: they read a private copy).
    drop(
        sortie_journal::Journal::open(&original.state_dir().join("runs").join(RUN))
            .expect("the journal opens"),
    );
    let snaps = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .expect("read dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
            })
            .collect()
    };
    assert!(
        !snaps(&journal_dir(&original)).is_empty(),
        "sled wrote a snapshot"
    );
    let copy = damaged(&original, |dir| {
        for snap in snaps(dir) {
            let len = std::fs::metadata(&snap).expect("stat").len();
            std::fs::write(&snap, vec![0u8; len as usize]).expect("zero");
        }
    });
    let line = audit_refuses(&copy, "sled snapshot zeroed");
    assert!(line.contains("storage damaged: "), "{line}");
    // sled's own complaint is for -v.
    let verbose = copy.run(&["-v", "audit", RUN]);
    assert_eq!(verbose.status.code(), Some(4));
    assert!(
        String::from_utf8_lossy(&verbose.stderr).contains("sled"),
        "-v shows what sled logged"
    );
    let end = written(&db(&original));
    let copy = damaged(&original, |dir| {
        for snap in snaps(dir) {
            std::fs::remove_file(snap).expect("remove");
        }
        let mut bytes = db(&original);
        bytes[end / 2] ^= 0xff;
        std::fs::write(dir.join("db"), bytes).expect("write");
    });
    audit_refuses(&copy, "sled snapshot removed, a byte flipped behind it");
}

#[test]
fn every_reader_refuses_a_truncated_journal_in_the_same_words() {
    let original = finished_run();
    let end = written(&db(&original));
    let copy = damaged(&original, |dir| {
        let mut bytes = db(&original);
        bytes[end / 2] ^= 0xff;
        std::fs::write(dir.join("db"), bytes).expect("write");
    });
    let line = audit_refuses(&copy, "a byte flipped");
    let words = line
        .split(&format!("journal of run {RUN}: "))
        .nth(1)
        .expect("the audit line names the run")
        .to_owned();
    assert!(words.starts_with("truncated: records "), "{line}");
    for args in [
        vec!["status", RUN],
        vec!["replay", RUN],
        vec!["resume", RUN],
        vec!["list"],
    ] {
        let out = copy.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {stdout} {stderr}");
        assert!(stderr.contains(&words), "{args:?} says: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(!stdout.contains("not started"), "{args:?}: {stdout}");
    }
    let listed = copy.run(&["list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("damaged"));
}

#[test]
fn a_zeroed_stale_or_foreign_snapshot_is_ignored_with_a_warning_never_trusted() {
    let original = finished_run();
    let run_dir = original.state_dir().join("runs").join(RUN);
    let snapshot = run_dir.join("journal.snapshot");
    assert!(snapshot.is_file(), "the end of a run writes a snapshot");
    let whole = original.run_ok(&["--json", "status", RUN]).stdout;
    let audit = original.run_ok(&["audit", RUN]);
    assert!(String::from_utf8_lossy(&audit.stdout).contains("whole"));
    // Another run's snapshot (same batch, other times): its last record differs.
    let other = finished_run();
    let foreign = std::fs::read(
        other
            .state_dir()
            .join("runs")
            .join(RUN)
            .join("journal.snapshot"),
    )
    .expect("read");
    let len = std::fs::metadata(&snapshot).expect("stat").len() as usize;
    let cases: [(&str, Vec<u8>); 3] = [
        ("zeroed", vec![0u8; len]),
        (
            "cut short",
            std::fs::read(&snapshot).expect("read")[..len / 2].to_vec(),
        ),
        ("another run's", foreign),
    ];
    for (what, bytes) in cases {
        let copy = damaged(&original, |_| {});
        let target = copy
            .state_dir()
            .join("runs")
            .join(RUN)
            .join("journal.snapshot");
        std::fs::write(&target, bytes).expect("write");
        let status = copy.run(&["--json", "status", RUN]);
        assert_eq!(status.status.code(), Some(0), "{what}");
        assert_eq!(
            status.stdout, whole,
            "{what}: status folds the journal instead"
        );
        let stderr = String::from_utf8_lossy(&status.stderr);
        // Another run's snapshot after more records than this journal holds is passed over
        // quietly (a live reader's copy meets that too); every other one is warned about.
        if what != "another run's" {
            assert!(
                stderr.contains("ignoring snapshot"),
                "{what}: warned: {stderr}"
            );
        }
        let audit = copy.run(&["audit", RUN]);
        assert_eq!(audit.status.code(), Some(0), "{what}: the journal is whole");
        assert!(
            String::from_utf8_lossy(&audit.stdout).contains("whole"),
            "{what}"
        );
    }
}

/// Lines in a file (0 when missing).
/// A finished run of [`TASKS`] fake agents after `header`, each counting its answers in
/// `count-tNN` and logging its usage reports in `usage-tNN` (in the scratch dir), task `i`'s
/// extra settings `extra(i)`.
fn counted_run(header: &str, extra: impl Fn(usize) -> &'static str) -> Scratch {
    let s = Scratch::new();
    let mut toml = String::from(header);
    for i in 0..TASKS {
        let usage = format!("{},{},0.00{:02}", 100 + i, 10 + i, 10 + i);
        let counter = s.path().join(format!("count-t{i:02}"));
        let log = s.path().join(format!("usage-t{i:02}"));
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"t{i:02}\"\n{}command = {}\n",
            extra(i),
            fake_command(&[
                "--usage",
                &usage,
                "--turns",
                "2",
                "--counter",
                counter.to_str().expect("utf-8"),
                "--usage-log",
                log.to_str().expect("utf-8"),
            ])
        ));
    }
    let batch = s.write("batch.toml", &toml);
    s.run_ok(&["run", "--run-id", RUN, batch.to_str().expect("utf-8")]);
    s
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|t| t.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

#[test]
fn recover_then_resume_finishes_the_run_and_never_runs_a_surviving_finished_task_again() {
    let s = counted_run("concurrency = 2\n[defaults]\nmax_retries = 3\n", |_| "");
    // Damage a record past the middle of the journal, in every place the log holds it.
    let records = records(&s);
    let log = db(&s);
    let target = (records.len() * 3 / 5..records.len())
        .find(|&k| !find_all(&log, &records[k]).is_empty())
        .expect("a record as written in the log");
    let mut bytes = log.clone();
    for at in find_all(&log, &records[target]) {
        bytes[at + records[target].len() / 2] ^= 0x5a;
    }
    std::fs::write(journal_dir(&s).join("db"), &bytes).expect("write");

    let out = s.run_ok(&["--json", "recover", RUN]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let kept = report["kept"].as_u64().expect("kept");
    assert!(kept <= target as u64, "{report}");
    assert_eq!(report["lost"][0].as_u64(), Some(kept), "{report}");
    assert_eq!(
        report["lost"][1].as_u64(),
        Some(records.len() as u64 - 1),
        "{report}"
    );
    // The damaged files are moved aside untouched.
    let aside = PathBuf::from(report["damaged"].as_str().expect("a path"));
    assert_eq!(
        std::fs::read(aside.join("journal").join("db")).expect("moved aside"),
        bytes,
        "the damaged log is kept as it was"
    );
    // The tasks whose end survived.
    let survivors: Vec<String> = s
        .events(RUN)
        .iter()
        .filter(|e| crate::support::event_kind(e).0 == "TaskFinished")
        .map(|e| {
            let task = e["event"]["TaskFinished"]["task"].as_u64().expect("a task");
            format!("t{task:02}")
        })
        .collect();
    assert!(
        !survivors.is_empty() && survivors.len() < TASKS,
        "{survivors:?}"
    );
    // The records kept, then `RunRecovered` and what it restored from the attempts' files.
    let audit = s.audit_clean(RUN);
    assert!(audit["events"].as_u64() > Some(kept), "{audit}");
    assert_eq!(
        crate::support::event_kind(&s.events(RUN)[kept as usize]).0,
        "RunRecovered"
    );

    let resumed = s.run(&["resume", RUN]);
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let status = s.status(RUN);
    assert_eq!(status["status"], "completed", "{status}");
    let audit = s.audit_clean(RUN);
    let ledger: std::collections::BTreeMap<String, serde_json::Value> = audit["ledger"]["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|p| (p[0].as_str().expect("label").to_owned(), p[1].clone()))
        .collect();
    for label in &survivors {
        let ran = lines(&s.path().join(format!("count-{label}")));
        assert_eq!(
            ran.len(),
            1,
            "{label} finished before the damage and ran again"
        );
        let reports = lines(&s.path().join(format!("usage-{label}")));
        let last: serde_json::Value =
            serde_json::from_str(reports.last().expect("a report")).expect("JSON");
        let usage = &ledger[label];
        assert_eq!(usage["input"], last["usage"]["input"], "{label}: {usage}");
        assert_eq!(usage["output"], last["usage"]["output"], "{label}: {usage}");
    }
}

/// Every file under `dir` (relative path, bytes), for comparing a tree before and after.
fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                todo.push(path);
            } else {
                let rel = path.strip_prefix(dir).expect("under dir").to_owned();
                out.insert(rel, std::fs::read(&path).expect("read"));
            }
        }
    }
    out
}

#[test]
fn readers_never_change_a_damaged_journals_bytes_so_recover_sees_what_the_damage_left() {
    let original = finished_run();
    // sled's page-table snapshot beside the log: its open reads the log after it.
    drop(
        sortie_journal::Journal::open(&original.state_dir().join("runs").join(RUN))
            .expect("the journal opens"),
    );
    let end = written(&db(&original));
    type Damage<'a> = Box<dyn Fn(&Path) + 'a>;
    let damages: [(&str, Damage); 3] = [
        (
            "a byte flipped in the log",
            Box::new(|dir: &Path| {
                let mut bytes = db(&original);
                bytes[end / 2] ^= 0xff;
                std::fs::write(dir.join("db"), bytes).expect("write");
            }),
        ),
        (
            "the log cut short",
            Box::new(|dir: &Path| {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dir.join("db"))
                    .expect("open");
                f.set_len((end * 2 / 3) as u64).expect("truncate");
            }),
        ),
        (
            "a page of the log zeroed",
            Box::new(|dir: &Path| {
                let mut bytes = db(&original);
                let page = (end / 2) & !4095;
                bytes[page..page + 4096].fill(0);
                std::fs::write(dir.join("db"), bytes).expect("write");
            }),
        ),
    ];
    for (what, damage) in damages {
        let copy = damaged(&original, damage);
        let journal = journal_dir(&copy);
        let left = tree(&journal);
        let run_dir = copy.state_dir().join("runs").join(RUN);
        let mark = std::fs::read(run_dir.join("journal.mark")).expect("a mark");
        audit_refuses(&copy, what);
        for args in [
            vec!["status", RUN],
            vec!["--json", "status", RUN],
            vec!["replay", RUN],
            vec!["export", RUN],
            vec!["list"],
            vec!["resume", RUN],
            vec!["audit", RUN],
        ] {
            let out = copy.run(&args);
            assert_eq!(
                out.status.code(),
                Some(4),
                "{what}: {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                tree(&journal) == left,
                "{what}: `sortie {}` changed the damaged journal's files",
                args.join(" ")
            );
        }
        assert_eq!(
            std::fs::read(run_dir.join("journal.mark")).expect("a mark"),
            mark,
            "{what}: the mark is the owner's"
        );
        // `recover` moves aside exactly the bytes the damage left.
        let out = copy.run_ok(&["--json", "recover", RUN]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let aside = PathBuf::from(report["damaged"].as_str().expect("a path"));
        assert!(
            tree(&aside.join("journal")) == left,
            "{what}: the files moved aside are the damaged ones"
        );
    }
}

/// #12: a crashed run whose journal was damaged before any command saw it: `sortie resume`,
/// the first command to look, refuses it (exit 4, one line naming the lost records) and leaves
/// every byte under `journal/` as the damage left it (sled's open in place would have zeroed
/// the log after the damage), so that `audit` and `recover` still see it.
#[test]
fn a_resume_is_the_first_to_see_a_crashed_runs_damage_and_changes_no_byte_of_it() {
    let s = Scratch::new();
    let run = crate::support::unique_run("crashed");
    let mut toml = String::from("concurrency = 3\n");
    for (label, sleep) in [("quick1", "0"), ("quick2", "0"), ("slow", "600")] {
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"{label}\"\ncommand = {}\n",
            fake_command(&[
                "--sleep",
                sleep,
                "--usage",
                "100,10,0.001",
                "--answer",
                "done"
            ])
        ));
    }
    let batch = s.write("batch.toml", &toml);
    let bg = crate::support::Background::start(
        &s,
        &run,
        &["run", "--run-id", &run, batch.to_str().expect("utf-8")],
    );
    let run_dir = s.state_dir().join("runs").join(&run);
    // The quick tasks ended and the mark beside the journal acknowledges records.
    crate::support::poll("two tasks to finish and a mark", 60, || {
        let done = s.try_events(&run)?.count("TaskFinished") >= 2;
        let mark = sortie_journal::Mark::read(&run_dir)?;
        (done && mark.records > 0).then_some(mark)
    });
    crate::support::send_signal(bg.pid(), nix::sys::signal::Signal::SIGKILL);
    let _ = bg.finish(30);
    for pid in crate::support::live_processes_of(&run) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid")),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Flip bytes inside the first acknowledged record found as written in the log.
    let mark = sortie_journal::Mark::read(&run_dir).expect("a mark");
    let copy = tempfile::tempdir().expect("tempdir");
    copy_dir(&run_dir, &copy.path().join("run"));
    let held = sortie_journal::Journal::open_read_only(&copy.path().join("run")).expect("opens");
    let journal = run_dir.join("journal");
    let mut log = std::fs::read(journal.join("db")).expect("the log");
    let flipped = (0..mark.records).find_map(|seq| {
        let record = held.raw_get(sortie_core::Seq(seq)).ok().flatten()?;
        let places = find_all(&log, &record);
        for at in &places {
            log[at + record.len() / 2] ^= 0x5a;
        }
        (!places.is_empty()).then_some(seq)
    });
    drop(held);
    let seq = flipped.expect("an acknowledged record is in the log as written");
    std::fs::write(journal.join("db"), &log).expect("write the damage");
    let left = tree(&journal);

    let out = s.run(&["resume", &run]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "resume: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.contains("truncated: records "),
        "resume names the loss: {stderr}"
    );
    assert!(
        tree(&journal) == left,
        "`sortie resume` changed the damaged journal's files (record {seq} flipped)"
    );
    // What audit sees afterwards is still what the damage left.
    let out = s.run(&["audit", &run]);
    assert_eq!(out.status.code(), Some(4));
    let said = String::from_utf8_lossy(&out.stdout);
    let from: u64 = said
        .split("truncated: records ")
        .nth(1)
        .and_then(|rest| rest.split("..").next()?.parse().ok())
        .unwrap_or_else(|| panic!("audit names the lost records: {said}"));
    assert!(from <= seq, "record {seq} flipped, audit says {said}");
    assert!(tree(&journal) == left, "`sortie audit` changed them");
}

/// Every file of a run dir, with its bytes, for a check that nothing changed.
fn run_files(s: &Scratch) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, out: &mut std::collections::BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
            let p = entry.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.is_file() {
                out.insert(p.clone(), std::fs::read(&p).expect("read"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(&s.state_dir().join("runs").join(RUN), &mut out);
    out
}

/// #32: a refused `resume` or `cancel` of a finished run changes no byte of it (sled used to be
/// opened in place: its log grew from about 1 KB to 512 KB, a snapshot appeared, `owner.pid`
/// named the refused process).
#[test]
fn a_refused_resume_or_cancel_of_a_finished_run_writes_nothing() {
    let s = finished_run();
    let before = run_files(&s);
    for command in ["resume", "cancel"] {
        let out = s.run(&[command, RUN]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{command} of a finished run is refused"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("has already finished"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let after = run_files(&s);
        assert_eq!(
            before.keys().collect::<Vec<_>>(),
            after.keys().collect::<Vec<_>>(),
            "{command}: the run dir's files"
        );
        for (path, bytes) in &before {
            assert!(
                after[path] == *bytes,
                "{command} changed {}",
                path.display()
            );
        }
    }
}

/// #32: the private copy a reader killed mid-read left in `$TMPDIR` is removed by the next
/// reader; a live reader's copy is left alone.
#[test]
fn a_killed_readers_journal_copy_is_removed_by_the_next_reader() {
    let s = finished_run();
    let tmp = s.path().join("tmp");
    // A pid above any pid_max: its reader is gone. This test's own pid: a live reader.
    let dead = tmp.join("sortie-journal-999999999-0-1");
    let live = tmp.join(format!("sortie-journal-{}-0-1", std::process::id()));
    for dir in [&dead, &live] {
        std::fs::create_dir_all(dir).expect("mkdir");
        std::fs::write(dir.join("db"), vec![7u8; 4096]).expect("write");
    }
    let out = s
        .sortie()
        .env("TMPDIR", &tmp)
        .args(["status", RUN])
        .output()
        .expect("status");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dead.exists(), "the dead reader's copy is removed");
    assert!(live.join("db").is_file(), "a live reader's copy stays");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .expect("read tmp")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left.len(), 1, "status removed its own copy too: {left:?}");
}

/// #32: a journal whose log file is deleted, replaced by a directory or by a link to
/// `/dev/null`, or whose whole `journal/` is deleted, is a damaged journal, not a failure
/// (exit 1) nor a missing run (exit 2): `status`, `audit` and `resume` exit 4 naming the run's
/// own file, never a private copy's.
#[test]
fn missing_or_replaced_journal_files_are_damage_named_by_the_runs_own_path() {
    let original = finished_run();
    type Damage = fn(&Path);
    let cases: [(&str, Damage); 6] = [
        ("one byte of sled's conf flipped", flip_conf),
        ("log and conf swapped", swap_log_and_conf),
        ("log deleted", |dir| {
            std::fs::remove_file(dir.join("db")).expect("rm")
        }),
        ("log a directory", |dir| {
            std::fs::remove_file(dir.join("db")).expect("rm");
            std::fs::create_dir(dir.join("db")).expect("mkdir");
        }),
        ("log a link to /dev/null", |dir| {
            std::fs::remove_file(dir.join("db")).expect("rm");
            std::os::unix::fs::symlink("/dev/null", dir.join("db")).expect("ln");
        }),
        ("journal/ deleted", |dir| {
            std::fs::remove_dir_all(dir).expect("rm -r")
        }),
    ];
    for (what, damage) in cases {
        let copy = damaged(&original, damage);
        for command in ["status", "audit", "resume"] {
            let out = copy.run(&[command, RUN]);
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(out.status.code(), Some(4), "{what}: {command}: {text}");
            assert!(
                text.contains("storage damaged: ") && text.contains("journal"),
                "{what}: {command} names the damage: {text}"
            );
            assert!(
                !text.contains("sortie-journal-"),
                "{what}: {command} names a private copy: {text}"
            );
        }
    }
}

fn flip_conf(dir: &Path) {
    let mut bytes = std::fs::read(dir.join("conf")).expect("read conf");
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(dir.join("conf"), bytes).expect("write conf");
}

fn swap_log_and_conf(dir: &Path) {
    std::fs::rename(dir.join("db"), dir.join("swap")).expect("mv");
    std::fs::rename(dir.join("conf"), dir.join("db")).expect("mv");
    std::fs::rename(dir.join("swap"), dir.join("conf")).expect("mv");
}

/// #32, finding 7: where the records are intact, damage to sled's other files is recoverable:
/// one flipped byte of its 62-byte `conf` (recover used to fail though the log was whole), the
/// log and `conf` swapped, or the log's first byte flipped (sled refuses to open each). The
/// records are found whole in the files: recover keeps every one, the audit is clean, the run
/// stays finished, and `status`, `list` and `audit` say it was recovered.
#[test]
fn damage_beside_intact_records_is_recovered_with_every_record() {
    let original = finished_run();
    let events = original.audit_clean(RUN)["events"]
        .as_u64()
        .expect("events");
    type Damage = fn(&Path);
    let cases: [(&str, Damage); 3] = [
        ("one byte of sled's conf flipped", flip_conf),
        ("log and conf swapped", swap_log_and_conf),
        ("the log's first byte flipped", |dir| {
            let mut bytes = std::fs::read(dir.join("db")).expect("read");
            bytes[0] ^= 0xff;
            std::fs::write(dir.join("db"), bytes).expect("write");
        }),
    ];
    for (what, damage) in cases {
        let copy = damaged(&original, damage);
        let out = copy.run_ok(&["--json", "recover", RUN]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(report["kept"].as_u64(), Some(events), "{what}: {report}");
        assert!(report["lost"].is_null(), "{what}: {report}");
        let audit = copy.audit_clean(RUN);
        assert_eq!(
            audit["events"].as_u64(),
            Some(events + 1),
            "{what}: {audit}"
        );
        assert_recovered(&copy, what);
        assert_eq!(copy.status(RUN)["status"], "completed", "{what}");
    }
}

/// `status`, `list` and `audit` (text and JSON) say the run was recovered after damage.
fn assert_recovered(s: &Scratch, what: &str) {
    for args in [
        vec!["status", RUN],
        vec!["audit", RUN],
        vec!["list"],
        vec!["--json", "status", RUN],
        vec!["--json", "audit", RUN],
    ] {
        let out = s.run(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("recovered"),
            "{what}: `sortie {}` does not say the run was recovered:\n{text}",
            args.join(" ")
        );
    }
}

/// #32, findings 4 and 5: the journal of a finished run loses its last records (the log cut
/// at 45%, every copy past it gone) or all of them (a zero-length log, what a power loss can
/// leave). `recover` rebuilds it from what remains: the records, the run's start from its
/// snapshot when none is left, and the attempts' own files (each attempt whose records were
/// lost is restored as launched, and resume records it from its files). Every task completes,
/// none runs again (each agent's counter says once), no attempt number is used twice, the
/// ledger holds what each agent reported, and the run says it was recovered. Before, tasks
/// whose records were lost ran again under the same attempt number, overwriting its files,
/// and a zero-length log could not be recovered at all.
#[test]
fn recover_never_runs_finished_work_again_nor_reuses_an_attempt_number() {
    // t03 needs t02: a dependent's lost attempt is restored too.
    let s = counted_run("concurrency = 3\n", |i| {
        if i == 3 { "needs = [\"t02\"]\n" } else { "" }
    });
    type Damage = fn(&Path);
    let cases: [(&str, Damage); 2] = [
        ("the log cut at 45%", |dir| {
            let bytes = std::fs::read(dir.join("db")).expect("read");
            let cut = written(&bytes) * 45 / 100;
            std::fs::write(dir.join("db"), &bytes[..cut]).expect("write");
        }),
        ("a zero-length log", |dir| {
            std::fs::write(dir.join("db"), b"").expect("truncate")
        }),
    ];
    for (what, damage) in cases {
        let copy = damaged(&s, damage);
        // The agents write their counters and usage logs where the batch says, in `s`: kept
        // here, and put back after each case.
        let kept: Vec<(PathBuf, Vec<u8>)> = (0..TASKS)
            .flat_map(|i| [format!("count-t{i:02}"), format!("usage-t{i:02}")])
            .map(|name| s.path().join(name))
            .map(|p| {
                let bytes = std::fs::read(&p).expect("an agent's file");
                (p, bytes)
            })
            .collect();
        let out = copy.run_ok(&["--json", "recover", RUN]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let resumed = copy.run(&["resume", RUN]);
        assert_eq!(
            resumed.status.code(),
            Some(0),
            "{what}: {}",
            String::from_utf8_lossy(&resumed.stderr)
        );
        assert_eq!(copy.status(RUN)["status"], "completed", "{what}");
        let audit = copy.audit_clean(RUN);
        let ledger: std::collections::BTreeMap<String, serde_json::Value> =
            audit["ledger"]["tasks"]
                .as_array()
                .expect("tasks")
                .iter()
                .map(|p| (p[0].as_str().expect("label").to_owned(), p[1].clone()))
                .collect();
        let events = copy.events(RUN);
        for i in 0..TASKS {
            let label = format!("t{i:02}");
            // The fake agent's counter is in the original scratch dir: a run again adds a line.
            let ran = lines(&s.path().join(format!("count-{label}")));
            assert_eq!(ran.len(), 1, "{what}: {label} ran again");
            let launched: Vec<u64> = events
                .of(i as u64, "AttemptLaunching")
                .iter()
                .map(|e| e["attempt"].as_u64().expect("attempt"))
                .collect();
            let mut distinct = launched.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(
                launched, distinct,
                "{what}: {label} reused an attempt number"
            );
            let reports = lines(&s.path().join(format!("usage-{label}")));
            let last: serde_json::Value =
                serde_json::from_str(reports.last().expect("a report")).expect("JSON");
            assert_eq!(
                ledger[&label]["input"], last["usage"]["input"],
                "{what}: {label}"
            );
        }
        // What recover restored from the attempts' files (before: nothing).
        let restored = report["restored"].as_array().expect("restored").len();
        assert!(
            restored > 0,
            "{what}: attempts restored from files: {report}"
        );
        assert_recovered(&copy, what);
        for (p, bytes) in kept {
            std::fs::write(p, bytes).expect("put back");
        }
    }
}

/// #32: another run's journal restored into this run's dir is refused by `recover` too (it
/// used to keep every foreign record, and `status` then showed the other run's tasks and costs
/// as this run's), naming both runs and changing nothing.
#[test]
fn recover_refuses_another_runs_journal() {
    let s = finished_run();
    let other = s.write(
        "other.toml",
        &format!(
            "[[tasks]]\nlabel = \"foreign\"\ncommand = {}\n",
            fake_command(&["--answer", "not ours"])
        ),
    );
    s.run_ok(&["run", "--run-id", "other", other.to_str().expect("utf-8")]);
    let ours = journal_dir(&s);
    std::fs::remove_dir_all(&ours).expect("rm");
    copy_dir(&s.state_dir().join("runs/other/journal"), &ours);
    let before = run_files(&s);
    let out = s.run(&["recover", RUN]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("run other's") && stderr.contains(&format!("not run {RUN}'s")),
        "{stderr}"
    );
    assert_eq!(before, run_files(&s), "recover changed nothing");
    let status = s.run(&["status", RUN]);
    assert_eq!(status.status.code(), Some(4), "status still refuses it");
}

/// #32: a journal with nothing readable (a zero-length log, what a power loss can leave, or
/// noise) and no snapshot holding the run's start is refused by `recover` (exit 4, its files
/// left as they are) instead of rebuilt empty: audit then said "whole, 0 events" and resume
/// stopped with an internal error. (With a snapshot it is rebuilt: see
/// `recover_never_runs_finished_work_again_nor_reuses_an_attempt_number`.)
#[test]
fn recover_refuses_a_journal_with_nothing_readable() {
    let original = finished_run();
    type Damage = fn(&Path);
    fn no_snapshot(dir: &Path) {
        let run_dir = dir.parent().expect("the run dir");
        for name in ["journal.snapshot", "journal.snapshot.1"] {
            let _ = std::fs::remove_file(run_dir.join(name));
        }
    }
    let cases: [(&str, Damage); 2] = [
        ("zero-length log, no snapshot", |dir| {
            std::fs::write(dir.join("db"), b"").expect("truncate");
            no_snapshot(dir);
        }),
        ("random bytes, no snapshot", |dir| {
            let len = std::fs::metadata(dir.join("db")).expect("stat").len() as usize;
            let noise: Vec<u8> = (0..len).map(|i| (i * 7919 % 251) as u8).collect();
            std::fs::write(dir.join("db"), noise).expect("write");
            no_snapshot(dir);
        }),
    ];
    for (what, damage) in cases {
        let copy = damaged(&original, damage);
        let before = run_files(&copy);
        let out = copy.run(&["recover", RUN]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{what}: {stderr}");
        assert!(
            stderr.contains("no record of the journal can be read"),
            "{what}: {stderr}"
        );
        assert_eq!(before, run_files(&copy), "{what}: recover changed nothing");
        for command in ["audit", "resume", "status"] {
            let out = copy.run(&[command, RUN]);
            let text = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(4), "{what}: {command}: {text}");
            assert!(
                !text.contains("internal error"),
                "{what}: {command}: {text}"
            );
        }
    }
}

/// #32, finding 4: a direct attempt (`supervise = false`) has no supervisor, but sortie wrote
/// its files and its `exit` record in its attempt dir; when the journal loses its records,
/// recover restores it from them and resume records it: no task runs again, and no attempt's
/// files are written over (a second attempt 1 used to overwrite them).
#[test]
fn recover_records_ended_direct_attempts_and_never_reuses_their_numbers() {
    let s = Scratch::new();
    let mut toml = String::from("concurrency = 2\n[defaults]\nsupervise = false\n");
    for i in 0..6 {
        let counter = s.path().join(format!("count-d{i}"));
        toml.push_str(&format!(
            "\n[[tasks]]\nlabel = \"d{i}\"\ncommand = {}\n",
            fake_command(&[
                "--answer",
                "done",
                "--counter",
                counter.to_str().expect("utf-8"),
            ])
        ));
    }
    let batch = s.write("batch.toml", &toml);
    s.run_ok(&["run", "--run-id", RUN, batch.to_str().expect("utf-8")]);
    let attempts = s.state_dir().join("runs").join(RUN).join("attempts");
    let before: std::collections::BTreeMap<PathBuf, Vec<u8>> = tree(&attempts);
    let bytes = std::fs::read(journal_dir(&s).join("db")).expect("read");
    let cut = written(&bytes) * 45 / 100;
    std::fs::write(journal_dir(&s).join("db"), &bytes[..cut]).expect("write");
    let out = s.run_ok(&["--json", "recover", RUN]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let resumed = s.run(&["resume", RUN]);
    assert_eq!(resumed.status.code(), Some(0));
    assert_eq!(s.status(RUN)["status"], "completed");
    for i in 0..6 {
        let ran = lines(&s.path().join(format!("count-d{i}")));
        assert_eq!(ran.len(), 1, "d{i} ran again: {report}");
    }
    let after = tree(&attempts);
    for (path, bytes) in &before {
        assert_eq!(
            after.get(path),
            Some(bytes),
            "{}: an attempt's files were written over",
            path.display()
        );
    }
    s.audit_clean(RUN);
}

/// Torture seed 791571778: a damage that keeps a worktree task's `WorktreePlanned` but loses
/// its `TaskSetUp` and everything after, once the task had ended unchanged (its worktree and
/// branch removed). Recover restores its finished attempt from its files (it used to refuse
/// the launch, "while it is queued": a planned worktree not set up), and resume records it and
/// finishes the task: the agent ran once, and no worktree or branch is left.
#[test]
fn recover_restores_a_finished_task_in_a_removed_worktree_whose_setup_was_lost() {
    let s = Scratch::new();
    let repo = s.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir");
    sortie_testkit::git(&repo, &["init", "-q"]);
    std::fs::write(repo.join("a.txt"), "base\n").expect("write");
    sortie_testkit::git(&repo, &["add", "-A"]);
    sortie_testkit::git(&repo, &["commit", "-q", "-m", "initial"]);
    let counter = s.path().join("count-t00");
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"t00\"\nisolation = \"worktree\"\ncwd = {:?}\ncommand = {}\n",
            repo.display().to_string(),
            fake_command(&["--counter", counter.to_str().expect("utf-8"), "--quiet"])
        ),
    );
    s.run_ok(&["run", "--run-id", RUN, batch.to_str().expect("utf-8")]);
    assert_eq!(lines(&counter).len(), 1);
    // The log cut where the task's `TaskSetUp` record begins: its plan is the last record kept.
    let kinds: Vec<String> = s
        .events(RUN)
        .iter()
        .map(|e| crate::support::event_kind(e).0.to_owned())
        .collect();
    let setup = kinds.iter().position(|k| k == "TaskSetUp").expect("set up");
    assert_eq!(kinds[setup - 1], "WorktreePlanned", "{kinds:?}");
    let log = db(&s);
    let at = *find_all(&log, &records(&s)[setup])
        .first()
        .expect("the record in the log");
    std::fs::write(journal_dir(&s).join("db"), &log[..at]).expect("cut");

    let out = s.run_ok(&["--json", "recover", RUN]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["kept"].as_u64(), Some(setup as u64), "{report}");
    assert_eq!(report["restored"], serde_json::json!(["t00.1"]), "{report}");
    assert_eq!(report["not_restored"], serde_json::json!([]), "{report}");
    let resumed = s.run(&["resume", RUN]);
    assert_eq!(
        resumed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_eq!(s.status(RUN)["status"], "completed");
    assert_eq!(lines(&counter).len(), 1, "the finished task ran again");
    s.audit_clean(RUN);
    let worktrees = sortie_testkit::git(&repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(worktrees.matches("worktree ").count(), 1, "{worktrees}");
    let branches = sortie_testkit::git(&repo, &["branch", "--list", "sortie/*"]);
    assert_eq!(branches.trim(), "", "a branch left");
}

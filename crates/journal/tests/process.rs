//! The journal across processes: a writer SIGKILLed mid-append loses nothing it acknowledged,
//! a live run can be read from another process, and a second writer is refused with `Locked`.
//!
//! The child processes are this test binary re-executed with `SORTIE_JOURNAL_CHILD` set, running
//! the `__child` entry point below (sled's pattern), which does nothing in a normal run.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers: a failure is a test failure"
)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Stdio};

use sortie_core::Seq;
use sortie_journal::{Error, Journal};

const CHILD: &str = "SORTIE_JOURNAL_CHILD";
const DIR: &str = "SORTIE_JOURNAL_CHILD_DIR";

/// The events every child appends, in order: a realistic run long enough never to end.
fn stream() -> impl Iterator<Item = (sortie_core::Timestamp, sortie_core::Event)> {
    support::realistic(3_000, 3)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// Child mode `append`: open (or create) the journal, continue the stream where the journal
/// ends, and print `acked N` for every seq whose append has returned.
fn append_forever(dir: &Path) {
    let j = match Journal::open(dir) {
        Ok(j) => j,
        Err(Error::NotFound { .. }) => Journal::create(dir).unwrap(),
        Err(e) => panic!("{e}"),
    };
    let next = j.next_seq().0;
    let mut events = stream().skip(usize::try_from(next).unwrap());
    let mut n = 0u64;
    loop {
        n += 1;
        if n.is_multiple_of(5) {
            let batch: Vec<_> = events.by_ref().take(3).collect();
            let first = j.append_all(&batch).unwrap();
            for k in 0..batch.len() as u64 {
                say(&format!("acked {}", first.0 + k));
            }
        } else {
            let (at, e) = events.next().unwrap();
            let seq = j.append(at, &e).unwrap();
            say(&format!("acked {}", seq.0));
        }
    }
}

/// Child mode `hold`: create the journal, append 50 events, print `ready N`; then for every
/// `more K` line on stdin append K more and print `ready N`; exit on end of input.
fn hold(dir: &Path) {
    let j = Journal::create(dir).unwrap();
    let mut events = stream();
    let mut append = |k: usize| {
        for (at, e) in events.by_ref().take(k) {
            j.append(at, &e).unwrap();
        }
        say(&format!("ready {}", j.next_seq().0));
    };
    append(50);
    for line in std::io::stdin().lines() {
        let line = line.unwrap();
        if let Some(k) = line.strip_prefix("more ") {
            append(k.parse().unwrap());
        }
    }
}

/// Not a test: the entry point of the child processes the tests start (this binary run again
/// with `--exact __child` and [`CHILD`] set). In a normal run, with [`CHILD`] unset, it returns at
/// once and checks nothing; the leading underscores say so in the test list.
#[test]
fn __child() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let dir = std::env::var_os(DIR).unwrap();
    match mode.as_str() {
        "append" => append_forever(Path::new(&dir)),
        "hold" => hold(Path::new(&dir)),
        other => panic!("unknown child mode {other}"),
    }
}

#[allow(
    clippy::disallowed_methods,
    reason = "the test re-executes itself as the child; sortie_runner::spawn is not a dependency"
)]
fn spawn(mode: &str, dir: &Path) -> (Child, BufReader<ChildStdout>) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "__child",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(CHILD, mode)
        .env(DIR, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// The next line of the child starting with `prefix`, parsed as a number.
fn next_number(out: &mut BufReader<ChildStdout>, prefix: &str) -> Option<u64> {
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            return None;
        }
        if let Some(n) = line.trim().strip_prefix(prefix) {
            return Some(n.parse().unwrap());
        }
    }
}

/// Checks a journal after a crash: it opens, audits clean, holds every acknowledged seq, and
/// every record is the stream's event at that seq.
fn check_after_crash(dir: &Path, acked: u64) -> u64 {
    let j = Journal::open(dir).unwrap();
    let audit = j.audit();
    assert!(
        audit.is_clean(),
        "audit after a kill: {:?} {:?}",
        audit.first_bad,
        audit.ledger_mismatch
    );
    let n = j.next_seq().0;
    assert!(
        n >= acked,
        "seq {} was acknowledged but the journal holds {n} records",
        acked - 1
    );
    assert_eq!(audit.events, n);
    let records = j.read(Seq(0), None).map(Result::unwrap);
    for (r, (at, e)) in records.zip(stream()) {
        assert_eq!((r.at, &r.event), (at, &e), "record {}", r.seq);
    }
    n
}

#[test]
fn sigkill_while_appending_loses_no_acknowledged_append() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("runs").join("crash");
    let mut acked = 0u64; // every seq below this was acknowledged by some child
    for round in 0u64..24 {
        let (mut child, mut out) = spawn("append", &dir);
        // Kill after a varying number of acknowledgements, then a varying short while.
        let wait_for = 1 + (round * 37) % 300;
        let mut seen = 0;
        while seen < wait_for {
            let Some(seq) = next_number(&mut out, "acked ") else {
                break;
            };
            acked = acked.max(seq + 1);
            seen += 1;
        }
        if round % 3 != 0 {
            std::thread::sleep(std::time::Duration::from_micros(300 * (round % 7)));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // Acknowledgements printed before the kill count too.
        while let Some(seq) = next_number(&mut out, "acked ") {
            acked = acked.max(seq + 1);
        }
        assert!(seen > 0, "round {round}: the child acknowledged nothing");
        let held = check_after_crash(&dir, acked);
        assert!(held >= acked);
    }
}

#[test]
fn a_live_journal_is_readable_from_another_process_and_refuses_a_second_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("live");
    let (mut child, mut out) = spawn("hold", &dir);
    assert_eq!(next_number(&mut out, "ready "), Some(50));

    match Journal::open(&dir) {
        Err(Error::Locked { path }) => assert!(path.starts_with(&dir)),
        other => panic!("expected Locked, got {other:?}"),
    }
    assert!(matches!(Journal::create(&dir), Err(Error::Exists { .. })));

    let ro = Journal::open_read_only(&dir).unwrap();
    assert_eq!(ro.next_seq(), Seq(50));
    assert!(ro.audit().is_clean());
    assert_eq!(ro.replay(None).unwrap().next_seq, Seq(50));
    assert!(matches!(
        ro.append(
            sortie_core::Timestamp(0),
            &sortie_core::Event::RunInterrupted {
                reason: String::new()
            }
        ),
        Err(Error::ReadOnly)
    ));

    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "more 30").unwrap();
    stdin.flush().unwrap();
    assert_eq!(next_number(&mut out, "ready "), Some(80));
    let ro2 = Journal::open_read_only(&dir).unwrap();
    assert_eq!(ro2.next_seq(), Seq(80));
    assert!(ro2.audit().is_clean());
    assert_eq!(ro.next_seq(), Seq(50), "an older handle keeps its snapshot");

    drop(stdin);
    assert!(child.wait().unwrap().success());
    drop((ro, ro2));
    let j = Journal::open(&dir).unwrap();
    assert_eq!(j.next_seq(), Seq(80));
}

#[test]
fn read_only_copies_taken_during_appends_are_clean_prefixes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("busy");
    let (mut child, mut out) = spawn("append", &dir);
    let mut acked = 0u64;
    for _ in 0..10 {
        for _ in 0..50 {
            acked = acked.max(next_number(&mut out, "acked ").unwrap() + 1);
        }
        let ro = Journal::open_read_only(&dir).unwrap();
        let audit = ro.audit();
        assert!(audit.is_clean(), "{:?}", audit.first_bad);
        assert!(audit.events >= acked, "a copy lost acknowledged appends");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

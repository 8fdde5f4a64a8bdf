//! End-to-end tests of what a run shows while it goes: the live board under a real
//! pseudo-terminal of 80 columns (read back through a terminal emulator, `vt100`), and the
//! plain timestamped lines off a terminal.

use std::io::Read;
use std::sync::{Arc, Mutex};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};

use crate::support::{Scratch, fake_command, poll};

/// Labels long enough that a board line is wider than 80 columns before it is cut.
const LABELS: [&str; 3] = [
    "a-task-with-a-rather-long-label-1",
    "a-task-with-a-rather-long-label-2",
    "a-task-with-a-rather-long-label-3",
];

fn batch(s: &Scratch) -> std::path::PathBuf {
    let mut toml = String::from("concurrency = 3\n\n");
    for l in LABELS {
        toml.push_str(&format!(
            "[[tasks]]\nlabel = {l:?}\ncommand = {}\n\n",
            fake_command(&[
                "--sleep",
                "4",
                "--turns",
                "8",
                "--usage",
                "100,50,0.01",
                "--answer",
                &format!("{l} done"),
            ])
        ));
    }
    s.write("batch.toml", &toml)
}

/// A sortie in a terminal: the child and the pseudo-terminal's master side (its slave closed).
pub(crate) type InPty = (
    Box<dyn portable_pty::Child + Send + Sync>,
    Box<dyn portable_pty::MasterPty + Send>,
);

/// `sortie ARGS` on `s`'s state dir (`SORTIE_DIR`) in a new pseudo-terminal of `rows` x `cols`,
/// as a user's shell starts it: `TERM` set, colours allowed.
pub(crate) fn in_pty(s: &Scratch, rows: u16, cols: u16, args: &[&str]) -> InPty {
    let pty = native_pty_system()
        .openpty(PtySize {
            rows,
            cols,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("open a pty");
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_sortie"));
    cmd.cwd(s.path());
    cmd.env_remove("RUST_LOG");
    cmd.env_remove("NO_COLOR");
    cmd.env("SORTIE_DIR", s.state_dir().display().to_string());
    cmd.env("TERM", "xterm-256color");
    cmd.args(args);
    let child = pty
        .slave
        .spawn_command(cmd)
        .expect("spawn sortie in the pty");
    drop(pty.slave);
    (child, pty.master)
}

/// A terminal: the pty's output fed to an emulator, every screen seen kept for the checks.
struct Screen {
    parser: vt100::Parser,
    /// Every distinct screen seen (its rows).
    seen: Vec<Vec<String>>,
}

impl Screen {
    fn feed(&mut self, bytes: &[u8]) {
        self.parser.process(bytes);
        let screen = self.parser.screen();
        let (_, cols) = screen.size();
        let rows: Vec<String> = screen.rows(0, cols).collect();
        if self.seen.last().is_none_or(|last| *last != rows) {
            self.seen.push(rows);
        }
    }
}

fn is_board_line(row: &str) -> bool {
    row.starts_with("run ")
        || LABELS
            .iter()
            .any(|l| row.starts_with(&format!("  {}", &l[..18])))
}

#[test]
fn the_board_shows_each_running_task_with_its_activity_cut_to_80_columns_then_the_summary() {
    let s = Scratch::new();
    let batch = batch(&s);
    let (mut child, master) = in_pty(
        &s,
        30,
        80,
        &["run", &batch.display().to_string(), "--run-id", "boardrun"],
    );
    let screen = Arc::new(Mutex::new(Screen {
        parser: vt100::Parser::new(30, 80, 0),
        seen: Vec::new(),
    }));
    let mut reader = master.try_clone_reader().expect("pty reader");
    let feeder = {
        let screen = Arc::clone(&screen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                screen.lock().expect("screen").feed(&buf[..n]);
            }
        })
    };
    // Once the tasks show their activity at 80 columns, the terminal shrinks to 60: the board
    // follows at its next draw.
    poll("the board to show an activity", 30, || {
        let screen = screen.lock().expect("screen");
        let rows = screen.seen.last()?;
        rows.iter()
            .any(|r| is_board_line(r) && r.contains("working on"))
            .then_some(())
    });
    let resized_at = {
        let mut screen = screen.lock().expect("screen");
        master
            .resize(PtySize {
                rows: 30,
                cols: 60,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("resize the pty");
        screen.parser.screen_mut().set_size(30, 60);
        screen.seen.len()
    };
    let status = child.wait().expect("wait for sortie");
    // The reader ends when the pty has nothing more to give (its writer is gone).
    drop(master);
    let _ = feeder.join();
    assert!(status.success(), "sortie exited {status:?}");
    let screen = screen.lock().expect("screen");

    // Task lines appeared with their activity (the fake agent's progress lines).
    let with_activity: Vec<&Vec<String>> = screen
        .seen
        .iter()
        .filter(|rows| {
            rows.iter()
                .any(|r| is_board_line(r) && r.contains("tok  working on attempt"))
        })
        .collect();
    assert!(
        !with_activity.is_empty(),
        "no board line with an activity in any screen; last screen:\n{}",
        screen.parser.screen().contents()
    );
    // The header names the run and counts the running tasks.
    assert!(
        screen.seen.iter().any(|rows| rows
            .iter()
            .any(|r| r.starts_with("run boardrun [") && r.contains("running 3"))),
        "no header with the run id and three running tasks"
    );
    // They updated: the first task's line changed over the run (its clock, tokens, turn).
    let first: std::collections::BTreeSet<&String> = screen
        .seen
        .iter()
        .flat_map(|rows| rows.iter())
        .filter(|r| r.starts_with(&format!("  {}", &LABELS[0][..18])))
        .collect();
    assert!(
        first.len() > 2,
        "the first task's line never moved: {first:?}"
    );
    // Never wrapped: below the header, every row down to the first blank one is a whole task
    // line (a line that ran past the 80th column would leave its tail on a row of its own).
    // indicatif fills each line to the width and lets the terminal move to the next row, so the
    // emulator's own "wrapped" flag says nothing here: the rows do.
    // A screen read while a redraw was arriving may end in a line still being written: the
    // last row of the region is a wrap's tail only if the next screen still shows it so (a tail
    // stays; a line being written is finished by the next read).
    let mut boards = 0;
    for (i, rows) in screen.seen[..resized_at].iter().enumerate() {
        let Some(h) = rows.iter().position(|r| r.starts_with("run boardrun [")) else {
            continue;
        };
        boards += 1;
        let region: Vec<&String> = rows[h + 1..]
            .iter()
            .take_while(|r| !r.trim().is_empty())
            .collect();
        for (k, r) in region.iter().enumerate() {
            let whole = is_board_line(r) && r.chars().count() <= 80;
            let row = h + 1 + k;
            let being_written = k + 1 == region.len()
                && screen
                    .seen
                    .get(i + 1)
                    .is_none_or(|next| next.get(row) != Some(*r));
            assert!(
                whole || being_written,
                "a row below the header that is not a whole task line: {r:?}\nscreen:\n{}",
                rows.join("\n")
            );
        }
    }
    assert!(boards > 2, "the board was drawn {boards} time(s)");
    // After the resize, the last board drawn was cut to 60 columns.
    let last_board = screen.seen[resized_at..]
        .iter()
        .rev()
        .find(|rows| {
            rows.iter()
                .position(|r| r.starts_with("run boardrun ["))
                .is_some_and(|h| rows.get(h + 1).is_some_and(|r| !r.trim().is_empty()))
        })
        .expect("a board with task lines drawn after the resize");
    let h = last_board
        .iter()
        .position(|r| r.starts_with("run boardrun ["))
        .unwrap_or_default();
    let task_rows: Vec<&String> = last_board[h + 1..]
        .iter()
        .take_while(|r| !r.trim().is_empty())
        .collect();
    assert!(!task_rows.is_empty(), "{}", last_board.join("\n"));
    for r in task_rows {
        assert!(
            is_board_line(r),
            "at 60 columns: {r:?}\n{}",
            last_board.join("\n")
        );
    }
    // The board gave way to the summary: the final screen shows the summary, no board line.
    let last = screen.parser.screen().contents();
    let final_rows: Vec<String> = screen.parser.screen().rows(0, 60).collect();
    assert!(
        last.contains("total: 3 task(s) · completed 3"),
        "summary:\n{last}"
    );
    assert!(
        final_rows
            .iter()
            .any(|r| r.starts_with("task ") && r.contains("state")),
        "the summary's table:\n{last}"
    );
    assert!(
        !final_rows.iter().any(|r| r.starts_with("run boardrun [")),
        "the board is still on screen:\n{last}"
    );
}

#[test]
fn off_a_terminal_a_run_prints_plain_timestamped_lines() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"ok\"\ncommand = {}\n\n[[tasks]]\nlabel = \"bad\"\ncommand = {}\nmax_retries = 0\n",
            fake_command(&["--answer", "fine"]),
            fake_command(&["--exit", "2", "--answer", "broken"]),
        ),
    );
    let out = s.run(&["run", &batch.display().to_string(), "--run-id", "plainrun"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        !err.contains('\x1b'),
        "no escape sequences off a terminal:\n{err}"
    );
    for l in &lines {
        let (stamp, _) = l.split_at(8.min(l.len()));
        assert!(
            stamp.len() == 8 && stamp.as_bytes()[2] == b':' && stamp.as_bytes()[5] == b':',
            "not a timestamped line: {l:?}"
        );
    }
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert!(has("run plainrun: 2 task(s)"), "{err}");
    assert!(has("[ok] attempt 1 launching"), "{err}");
    assert!(has("[ok] completed"), "{err}");
    assert!(has("[bad] failed"), "{err}");
    // `--quiet` prints the summary only.
    let quiet = s.run(&["--quiet", "run", "--run-id", "quietrun", "--", "echo", "hi"]);
    assert_eq!(quiet.status.code(), Some(0));
    assert!(
        quiet.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&quiet.stderr)
    );
    assert!(String::from_utf8_lossy(&quiet.stdout).contains("hi"));
}

/// Issue 37: a run whose header outgrows 80 columns (a long run id, five states' counts) and
/// whose summary has long labels, two models per task, an artifact and a long error.
fn wide_batch(s: &Scratch) -> std::path::PathBuf {
    let mut toml = String::from("concurrency = 6\n\n");
    for i in 0..40 {
        let label = format!("a-task-with-a-rather-long-label-{i:02}");
        let mut args = vec![
            "--model",
            "{model}",
            "--fail-model",
            "a-long-primary-model-name:model_error",
            "--sleep",
            "1",
            "--usage",
            "1200,340,0.0123",
        ];
        if i % 20 == 7 {
            args.extend([
                "--exit",
                "3",
                "--stderr",
                "a long error that no terminal of 80 columns could hold on one line, \
                 not even a wide one",
            ]);
        }
        let mut extra = String::from(
            "model = \"a-long-primary-model-name\"\n\
             fallback_models = [\"a-long-backup-model-name\"]\n",
        );
        if i % 20 == 7 {
            extra.push_str("max_retries = 1\n");
        }
        if i == 3 {
            extra.push_str("output = \"artifacts/of-the-task/label-03.md\"\n");
        }
        toml.push_str(&format!(
            "[[tasks]]\nlabel = \"{label}\"\ncommand = {}\n{extra}\n",
            fake_command(&args)
        ));
    }
    s.write("wide.toml", &toml)
}

/// `text` without its colour and cursor sequences (`ESC [ ... letter`).
fn strip_csi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn at_80_columns_neither_the_board_nor_the_summary_wraps_and_the_header_keeps_its_clocks() {
    const RUN: &str = "issue37-eighty-columns-board";
    let s = Scratch::new();
    let batch = wide_batch(&s);
    let (mut child, master) = in_pty(
        &s,
        40,
        80,
        &["run", &batch.display().to_string(), "--run-id", RUN],
    );
    // Every screen seen, and every byte (the summary is read back from them).
    let seen: Arc<Mutex<(Screen, Vec<u8>)>> = Arc::new(Mutex::new((
        Screen {
            parser: vt100::Parser::new(40, 80, 0),
            seen: Vec::new(),
        },
        Vec::new(),
    )));
    let mut reader = master.try_clone_reader().expect("pty reader");
    let feeder = {
        let seen = Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut guard = seen.lock().expect("screen");
                guard.0.feed(&buf[..n]);
                guard.1.extend_from_slice(&buf[..n]);
            }
        })
    };
    let status = child.wait().expect("wait for sortie");
    drop(master);
    let _ = feeder.join();
    assert_eq!(status.exit_code(), 1, "two tasks fail");
    let guard = seen.lock().expect("screen");
    let (screen, bytes) = &*guard;
    let header = format!("run {RUN} [");
    // The board: its header and task rows stop short of the last column (a row that fills it
    // is one the terminal may wrap), and the header kept its elapsed time and estimate while
    // the states' counts grew. (Rows between draws may hold a log line's wrapped tail: log
    // lines are whole, and not the board.)
    let mut headers = Vec::new();
    for rows in &screen.seen {
        for r in rows {
            let board_row = r.starts_with(&header) || r.starts_with("  a-task-with-a-rath");
            assert!(
                !board_row || r.trim_end().chars().count() < 80,
                "a board row that fills the 80 columns: {r:?}\n{}",
                rows.join("\n")
            );
            if r.starts_with(&header) {
                headers.push(r.clone());
            }
        }
    }
    assert!(headers.len() > 2, "{headers:?}");
    assert!(
        headers.iter().any(|h| h.contains(" · ETA ")),
        "no header with the estimate: {headers:?}"
    );
    // The summary, read back as the lines written: none is wider than the terminal.
    let text = strip_csi(&String::from_utf8_lossy(bytes));
    // indicatif leaves the cursor at the end of its last (full) line: the table's head follows.
    let start = text
        .rmatch_indices("task ")
        .map(|(i, _)| i)
        .find(|&i| {
            text[i..]
                .lines()
                .next()
                .is_some_and(|l| l.contains(" state "))
        })
        .unwrap_or_else(|| panic!("no summary table in:\n{text}"));
    let summary: Vec<&str> = text[start..].split("\r\n").collect();
    assert!(summary.len() > 40, "{}", summary.join("\n"));
    for line in &summary {
        assert!(
            line.chars().count() <= 80,
            "a summary line of {} columns: {line:?}\n{}",
            line.chars().count(),
            summary.join("\n")
        );
    }
    let has = |needle: &str| summary.iter().any(|l| l.contains(needle));
    assert!(has("total: 40 task(s)"), "{}", summary.join("\n"));
    assert!(has("usage by model"));
    assert!(has("└ exited with code 3: a long error"));
    assert!(
        has("/artifacts/of-the-task/label-03.md") && has("  → /"),
        "the artifact on a line of its own:\n{}",
        summary.join("\n")
    );
}

/// #37: a label holding a screen clear and a title sequence, under a real terminal: the board
/// and the log lines above it show them escaped; the terminal never receives them.
#[test]
fn the_board_shows_a_labels_control_characters_escaped_never_sends_them() {
    let s = Scratch::new();
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"x\\u001b[2Jy\\u001b]0;pwned\\u0007\"\ncommand = {}\n",
            fake_command(&["--sleep", "3", "--turns", "4"])
        ),
    );
    let (mut child, master) = in_pty(
        &s,
        30,
        100,
        &["run", &batch.display().to_string(), "--run-id", "escaped"],
    );
    let mut reader = master.try_clone_reader().expect("pty reader");
    let feeder = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        all
    });
    let status = child.wait().expect("wait for sortie");
    drop(master);
    let bytes = feeder.join().expect("the reader");
    assert!(status.success(), "sortie exited {status:?}");
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(
        !has(b"\x1b]0;pwned"),
        "the title sequence reached the terminal"
    );
    assert!(!has(b"\x1b[2J"), "the screen clear reached the terminal");
    let mut parser = vt100::Parser::new(30, 100, 1000);
    parser.process(&bytes);
    let text = parser.screen().contents();
    assert!(
        text.contains("x\\x1b[2Jy\\x1b]0;pwned\\x07"),
        "the label shown escaped:\n{text}"
    );
}

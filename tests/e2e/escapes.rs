//! End-to-end tests of issue 37, finding 4: what sortie prints that it did not write itself (a
//! label, an agent's output or error) reaches the terminal with its control characters shown,
//! never obeyed: no ESC or BEL byte from a task clears or retitles the user's terminal through
//! the log lines, the summary, `status`, `results`, `replay`, `audit` or `list`. `logs` prints
//! the transcript raw, on purpose.

use crate::support::{Scratch, unique_run};

/// A label and an agent's output and error carrying a screen clear and an OSC title.
const LABEL: &str = "a\\u001b[2Jb\\u001b]0;pwned\\u0007";

fn batch(s: &Scratch) -> std::path::PathBuf {
    let script = "printf 'out \\033[2J \\033]0;pwned\\007\\n'; printf 'err \\033[2J\\033]0;t\\007\\n' >&2; exit 3";
    s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"{LABEL}\"\ncommand = [\"sh\", \"-c\", {script:?}]\nmax_retries = 0\n\n\
             [[tasks]]\nlabel = \"ok\"\ncommand = [\"sh\", \"-c\", \"printf 'done \\\\033[H\\\\n'\"]\n"
        ),
    )
}

fn raw(bytes: &[u8]) -> bool {
    bytes.iter().any(|b| matches!(b, 0x1b | 0x07 | 0x9b))
}

#[test]
fn no_command_but_logs_passes_a_tasks_control_characters_to_the_terminal() {
    let s = Scratch::new();
    let run = unique_run("escapes");
    let b = batch(&s);
    let out = s.run(&[
        "--outputs",
        "run",
        "--run-id",
        &run,
        b.to_str().expect("utf-8"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    for (what, bytes) in [("run's stdout", &out.stdout), ("run's stderr", &out.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(!raw(bytes), "{what} passes a control character:\n{text:?}");
        assert!(
            text.contains("a\\x1b[2Jb\\x1b]0;pwned\\x07"),
            "{what}: the label shown:\n{text}"
        );
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("err \\x1b[2J"),
        "the error shown"
    );
    let label = "a\u{1b}[2Jb\u{1b}]0;pwned\u{7}";
    for args in [
        vec!["status", run.as_str()],
        vec!["status", run.as_str(), "--task", label],
        vec!["results", run.as_str()],
        vec!["replay", run.as_str()],
        vec!["audit", run.as_str()],
        vec!["list"],
    ] {
        let out = s.run(&args);
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            !raw(&out.stdout) && !raw(&out.stderr),
            "sortie {args:?} passes a control character:\n{text:?}"
        );
    }
    let status = String::from_utf8_lossy(&s.run_ok(&["status", &run]).stdout).into_owned();
    assert!(status.contains("a\\x1b[2Jb"), "{status}");
    // `--json` carries the text as it is, escaped by JSON itself.
    let v = s.status(&run);
    assert_eq!(v["tasks"][0]["label"], label);
    // `logs` prints the agent's stream raw, on purpose.
    let logs = s.run_ok(&["logs", &run, label]);
    assert!(raw(&logs.stdout), "logs is raw: {:?}", logs.stdout);
}

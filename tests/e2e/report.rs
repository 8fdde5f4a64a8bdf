//! End-to-end test of `sortie report RUN --html FILE`: the report of a 50-task run with retries,
//! fallbacks and a held task is one self-contained file, and headless Chromium (Debian's
//! `chromium`, installed by `.ci/run`) renders its timeline rows, bars and shaded spans.

use std::path::{Path, PathBuf};

use crate::support::{Background, Scratch, event_kind, fake_command, poll, unique_run};
use sortie_testkit::Events;

const TASKS: usize = 50;
/// The task that is held for a while.
const HELD: usize = 25;

fn batch(s: &Scratch) -> PathBuf {
    let mut toml =
        String::from("concurrency = 8\n\n[defaults]\nmax_retries = 2\nkill_grace = \"1s\"\n\n");
    for i in 0..TASKS {
        let (args, extra): (Vec<&str>, &str) = if i == HELD {
            (
                vec!["--sleep", "3", "--turns", "12", "--usage", "120,12,0.012"],
                "",
            )
        } else if i % 7 == 3 {
            (
                vec![
                    "--attempt",
                    "{attempt}",
                    "--fail-attempts",
                    "1:error",
                    "--sleep",
                    "0.3",
                    "--usage",
                    "50,5,0.005",
                ],
                "",
            )
        } else if i % 11 == 5 {
            (
                vec![
                    "--model",
                    "{model}",
                    "--fail-model",
                    "primary:model_error",
                    "--usage",
                    "70,7,0.007",
                ],
                "model = \"primary\"\nfallback_models = [\"backup\"]\n",
            )
        } else {
            (vec!["--sleep", "0.2", "--usage", "30,3,0.003"], "")
        };
        toml.push_str(&format!(
            "[[tasks]]\nlabel = \"task-{i:02}\"\ncommand = {}\n{extra}\n",
            fake_command(&args)
        ));
    }
    s.write("batch.toml", &toml)
}

/// Debian's headless Chromium, if installed.
fn chromium() -> Result<PathBuf, String> {
    for name in ["chromium", "chromium-browser"] {
        for dir in ["/usr/bin", "/usr/local/bin"] {
            let p = Path::new(dir).join(name);
            if p.exists() {
                return Ok(p);
            }
        }
    }
    Err("no chromium in /usr/bin: `apt-get install chromium` (.ci/run does)".into())
}

/// Chromium's DOM of `file` after it loaded (`--dump-dom`), with a fresh profile and nothing
/// that reaches the network.
fn dump_dom(chromium: &Path, file: &Path, profile: &Path) -> String {
    let out = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", file.display()))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_html_report_of_a_50_task_run_shows_every_attempt_retries_fallbacks_and_the_held_span() {
    let s = Scratch::new();
    let run = unique_run("report");
    let b = batch(&s);
    let sortie = Background::start(
        &s,
        &run,
        &["run", &b.display().to_string(), "--run-id", &run],
    );
    let held = format!("task-{HELD:02}");
    poll("the held task to report usage", 60, || {
        let events = s.try_events(&run)?;
        (!events.of(HELD as u64, "AttemptProgress").is_empty()).then_some(())
    });
    s.run_ok(&["hold", &run, "--task", &held]);
    // Released once the journal shows the hold (its span's start), not after a fixed wait.
    poll("the hold to be journaled", 30, || {
        let events = s.try_events(&run)?;
        events
            .iter()
            .map(event_kind)
            .any(|(k, b)| k == "Control" && b["action"].get("hold").is_some())
            .then_some(())
    });
    s.run_ok(&["release", &run, "--task", &held]);
    let out = sortie.finish(120);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(&run);
    let retried = (0..TASKS).filter(|i| i % 7 == 3 && *i != HELD).count();
    let fallbacks = (0..TASKS)
        .filter(|i| i % 11 == 5 && i % 7 != 3 && *i != HELD)
        .count();
    assert_eq!(
        events.count("AttemptLaunching"),
        TASKS + retried + fallbacks
    );

    let file = s.path().join("report.html");
    s.run_ok(&["report", &run, "--html", &file.display().to_string()]);
    let html = std::fs::read_to_string(&file).expect("the report");
    // Self-contained: nothing to fetch.
    for external in ["http://", "https://", "<script", " src=", "url(", "<link"] {
        assert!(
            !html.contains(external),
            "the report refers to {external:?}"
        );
    }

    let Ok(chromium) = chromium() else {
        assert!(
            !sortie_testkit::real_agent::under_ci(),
            "the report test needs chromium under CI"
        );
        eprintln!("report test: SKIPPED the Chromium check: no chromium installed");
        return;
    };
    let dom = dump_dom(&chromium, &file, &s.path().join("chromium-profile"));
    let rows = dom.matches("class=\"row\"").count();
    assert_eq!(rows, TASKS, "a timeline row per task");
    let bars = dom.matches("class=\"bar ").count();
    assert_eq!(bars, TASKS + retried + fallbacks, "a bar per attempt");
    assert_eq!(
        dom.matches("data-attempts=\"2\"").count(),
        retried + fallbacks,
        "retried and fallen-back tasks have two attempts"
    );
    assert_eq!(
        dom.matches("bar failed").count(),
        retried + fallbacks,
        "their first attempts failed"
    );
    assert_eq!(
        dom.matches(" fallback\"").count(),
        fallbacks,
        "fallbacks are marked"
    );
    let held_row = dom
        .split("<div class=\"row\"")
        .find(|r| r.contains(&format!("data-task=\"{held}\"")))
        .expect("the held task's row");
    assert!(
        held_row.contains("class=\"span held\""),
        "the held span is shaded: {held_row}"
    );
    assert!(dom.contains("Cost and tokens by model") && dom.contains("backup"));
    assert!(dom.contains("<table class=\"summary\">"));
}

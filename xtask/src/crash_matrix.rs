//! `cargo xtask crash-matrix [--short] [--write]`: what a crash of the controller costs, in
//! public. The same small workload (each task a shell script that appends `start` to its own
//! counter file, is held, then appends `end`; an agent runs it as the one tool call the
//! project's loopback mock model asks for) runs under sortie and under GNU parallel
//! (`--joblog J --resume`), and the controller is SIGKILLed at one moment of each column:
//!
//! - no crash (the baseline the waste is counted against);
//! - launched: sortie killed once the attempts are journaled, before any is spawned (the
//!   engine's `before:spawn` hook); parallel once its jobs' shells run, before their side
//!   effect;
//! - running: killed once every task's side effect has begun and sortie journaled a start;
//! - ended: killed once the work ended and before its end was journaled (sortie: the loop
//!   frozen, every attempt's exit file written; parallel: the job ended after the kill);
//! - during a resume: the first resume killed once it took the work over, then resumed again;
//! - shepherd: sortie's shepherd SIGKILLed while the attempts run, sortie left alive.
//!
//! Then the run is resumed to its end, and four things are counted: runs of a task's work
//! begun again after one had begun (its script's pids), side effects begun twice (its
//! counter), tokens billed twice (the ledger, `sortie export`'s usage, beyond what the mock
//! logged it served; parallel keeps no ledger) and tokens served but wasted (served beyond
//! what the tasks that completed needed in the no-crash run). The moments come from gates the work waits on and the engine's pause hook,
//! never from timed kills.
//!
//! The table goes into README.md between two markers; the command fails when README's table
//! disagrees with what it measured (`--write` rewrites it). `--short` measures the rows CI
//! runs (sortie with a plain command and with pi, parallel with the plain command) and checks
//! those rows only.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

mod peer;
mod scene;
mod sortie;

use scene::Scene;

/// The longest any single wait may take, in seconds, before it counts as a hang.
const PATIENCE: u64 = 180;

/// Tasks per cell.
const TASKS: usize = 2;

/// README's markers around the table.
const BEGIN: &str = "<!-- crash-matrix:begin (cargo xtask crash-matrix --write) -->";
const END: &str = "<!-- crash-matrix:end -->";

/// What each task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// A plain command.
    Plain,
    /// The real pi against `tests/mock-llm/server.py`.
    Pi,
    /// The real Claude Code against `tests/mock-llm/anthropic_server.py`.
    Claude,
    /// The real Codex against `tests/mock-llm/codex_server.py`.
    Codex,
    /// A plain command as a job of the real Slurm cluster (`executor = "slurm"`; the peer
    /// runs each job with `srun`).
    Slurm,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Plain => "command",
            Work::Pi => "pi",
            Work::Claude => "Claude Code",
            Work::Codex => "Codex",
            Work::Slurm => "command on Slurm",
        }
    }

    /// The built-in agent profile, for an agent.
    fn agent(self) -> Option<&'static str> {
        match self {
            Work::Plain | Work::Slurm => None,
            Work::Pi => Some("pi"),
            Work::Claude => Some("claude"),
            Work::Codex => Some("codex"),
        }
    }
}

/// When the controller is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moment {
    None,
    Launched,
    Running,
    Ended,
    Resume,
    Shepherd,
}

const MOMENTS: [(Moment, &str); 6] = [
    (Moment::None, "no crash"),
    (Moment::Launched, "journaled, not spawned"),
    (Moment::Running, "while it runs"),
    (Moment::Ended, "ended, end not journaled"),
    (Moment::Resume, "during a resume"),
    (Moment::Shepherd, "shepherd killed"),
];

/// Who controls the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    Sortie,
    Parallel,
}

/// A row of the table.
#[derive(Debug, Clone, Copy)]
struct Row {
    controller: Controller,
    work: Work,
}

impl Row {
    fn label(self) -> String {
        match self.controller {
            Controller::Sortie => format!("sortie · {}", self.work.name()),
            Controller::Parallel => format!("GNU parallel · {}", self.work.name()),
        }
    }
}

/// The rows, in the table's order; `short` ones are measured by `--short` too.
const ROWS: [(Row, bool); 10] = [
    (row(Controller::Sortie, Work::Plain), true),
    (row(Controller::Parallel, Work::Plain), true),
    (row(Controller::Sortie, Work::Pi), true),
    (row(Controller::Parallel, Work::Pi), false),
    (row(Controller::Sortie, Work::Claude), false),
    (row(Controller::Parallel, Work::Claude), false),
    (row(Controller::Sortie, Work::Codex), false),
    (row(Controller::Parallel, Work::Codex), false),
    (row(Controller::Sortie, Work::Slurm), true),
    (row(Controller::Parallel, Work::Slurm), true),
];

const fn row(controller: Controller, work: Work) -> Row {
    Row { controller, work }
}

/// What a crash cost in one cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    /// Runs of a task's work begun again after one had begun.
    restarted: u64,
    /// Side effects begun again after one had begun.
    twice: u64,
    /// Tokens in the ledger beyond what the mock served (None: no ledger, or no tokens).
    billed_twice: Option<u64>,
    /// Tokens the mock served (None: no mock).
    served: Option<u64>,
    /// Tasks that did not end completed.
    failed: usize,
}

impl Counted {
    /// Counts `scene`'s files once its run is over: `completed` tasks, the `ledger`'s tokens.
    fn of(scene: &Scene, completed: usize, ledger: Option<u64>) -> Counted {
        let beyond_one = |n: u64| n.saturating_sub(1);
        let served = scene.served();
        Counted {
            restarted: (0..scene.tasks)
                .map(|t| beyond_one(scene.pids(t).len() as u64))
                .sum(),
            twice: (0..scene.tasks)
                .map(|t| beyond_one(scene.counts(t).0))
                .sum(),
            billed_twice: ledger.zip(served).map(|(l, s)| l.saturating_sub(s)),
            served,
            failed: scene.tasks.saturating_sub(completed),
        }
    }

    /// Whether no work was begun again, no side effect done twice and no token billed twice.
    fn kept_promise(self) -> bool {
        self.restarted == 0 && self.twice == 0 && self.billed_twice.unwrap_or(0) == 0
    }

    /// The cell's text: restarted / twice / billed twice / wasted (`–`: not applicable).
    /// Wasted: what the mock served beyond what the tasks that completed needed, a task's need
    /// being its share of the no-crash run's `baseline` (a task that did not complete needed
    /// nothing it was served).
    fn cell(self, baseline: Option<u64>) -> String {
        let opt = |v: Option<u64>| v.map_or("–".to_owned(), |n| n.to_string());
        let completed = (TASKS - self.failed.min(TASKS)) as u64;
        let needed = baseline.map(|b| b / TASKS as u64 * completed);
        let wasted = self.served.zip(needed).map(|(s, n)| s.saturating_sub(n));
        let mut text = format!(
            "{} / {} / {} / {}",
            self.restarted,
            self.twice,
            opt(self.billed_twice),
            opt(wasted)
        );
        if self.failed > 0 {
            let _ = write!(text, " ({} not completed)", self.failed);
        }
        text
    }
}

/// Parsed options.
#[derive(Debug, Default)]
pub(crate) struct Options {
    short: bool,
    write: bool,
    keep: bool,
}

/// Parses `[--short] [--write] [--keep]` (`--keep`: leave the scenes' directories).
pub(crate) fn options(args: &[String]) -> Result<Options> {
    let mut o = Options::default();
    for a in args {
        match a.as_str() {
            "--short" => o.short = true,
            "--write" => o.write = true,
            "--keep" => o.keep = true,
            other => bail!("unknown crash-matrix option {other:?}"),
        }
    }
    Ok(o)
}

/// Measures the matrix with the sortie binary `bin`, then checks (or writes) README's table.
pub(crate) fn run(root: &Path, bin: &Path, opts: &Options) -> Result<()> {
    let started = Instant::now();
    // Short paths: a run's control socket lives under it (a socket's path is at most 107 bytes).
    let scratch = std::env::temp_dir().join(format!("scm-{}", std::process::id()));
    // `--write` rewrites the whole table: every row must be measured.
    if opts.write && opts.short {
        bail!("--write rewrites the whole table: run the full matrix (without --short)");
    }
    let slurm = sortie_testkit::slurm::cluster_answers();
    if let Err(why) = &slurm {
        // Under CI the cluster is started first (.ci/run): its absence is a failure.
        if sortie_testkit::real_agent::under_ci() || opts.write {
            bail!("the Slurm rows need a cluster, and none answers: {why}");
        }
        eprintln!(
            "crash-matrix: the Slurm rows: SKIPPED, no Slurm cluster answers ({why}; start one \
             with .ci/slurm/up.sh and export the SLURM_CONF it prints)"
        );
    }
    let (mut lines, mut broken) = (Vec::new(), Vec::new());
    for (r, short) in ROWS {
        if (opts.short && !short) || (r.work == Work::Slurm && slurm.is_err()) {
            continue;
        }
        let (line, promises) = measure_row(&scratch, bin, r)?;
        eprintln!("crash-matrix: {line}");
        lines.push(line);
        broken.extend(promises);
    }
    let elapsed = started.elapsed();
    eprintln!(
        "crash-matrix: {} rows in {:.0} s",
        lines.len(),
        elapsed.as_secs_f64()
    );
    let table = table(&lines);
    println!("{table}");
    let readme = root.join("README.md");
    let text = fs::read_to_string(&readme).context("reading README.md")?;
    if opts.write {
        fs::write(&readme, with_table(&text, &table)?).context("writing README.md")?;
        eprintln!("crash-matrix: README.md's table written");
    } else {
        check_readme(&text, &lines)?;
        eprintln!("crash-matrix: README.md's table agrees");
    }
    if opts.keep {
        eprintln!("crash-matrix: the scenes are in {}", scratch.display());
    } else {
        let _ = fs::remove_dir_all(&scratch);
    }
    if !broken.is_empty() {
        bail!(
            "sortie broke its promise (no work begun again, no side effect twice, no token \
             billed twice) in {} cell(s):\n  {}",
            broken.len(),
            broken.join("\n  ")
        );
    }
    Ok(())
}

/// Measures every cell of row `r`: its table line, and the cells where sortie broke a promise.
fn measure_row(scratch: &Path, bin: &Path, r: Row) -> Result<(String, Vec<String>)> {
    let (mut cells, mut broken) = (Vec::new(), Vec::new());
    let mut baseline = None;
    for (i, (moment, name)) in MOMENTS.into_iter().enumerate() {
        if moment == Moment::Shepherd {
            match (r.controller, r.work) {
                (Controller::Parallel, _) => {
                    cells.push("no shepherd".to_owned());
                    continue;
                }
                // slurmd runs the job: sortie starts no shepherd for it.
                (Controller::Sortie, Work::Slurm) => {
                    cells.push("no shepherd (a job)".to_owned());
                    continue;
                }
                (Controller::Sortie, _) => {}
            }
        }
        let dir = scratch.join(cell_dir(r, i));
        let scene = Scene::new(dir.clone(), r.work, TASKS)?;
        let counted = match r.controller {
            Controller::Sortie => sortie::cell(&scene, bin, moment),
            Controller::Parallel => peer::cell(&scene, moment),
        };
        // A cell that failed leaves nothing running: its controller, its agents, its work.
        if counted.is_err() {
            scene.kill_all();
        }
        let counted =
            counted.with_context(|| format!("{}, {name} (scene {})", r.label(), dir.display()))?;
        if moment == Moment::None {
            let once = (0..TASKS).all(|t| scene.counts(t) == (1, 1));
            if !once || counted.failed > 0 || counted.restarted > 0 {
                bail!(
                    "{}: the run without a crash did not complete once: {counted:?}",
                    r.label()
                );
            }
            baseline = counted.served;
        }
        let cell = counted.cell(baseline);
        if r.controller == Controller::Sortie && !counted.kept_promise() {
            broken.push(format!("{}, {name}: {cell}", r.label()));
        }
        cells.push(cell);
    }
    Ok((format!("| {} | {} |", r.label(), cells.join(" | ")), broken))
}

/// A cell's scene directory: `s-pi-2` (sortie, pi, the third moment), `p-command-0`, ...
fn cell_dir(r: Row, moment: usize) -> PathBuf {
    let who = match r.controller {
        Controller::Sortie => "s",
        Controller::Parallel => "p",
    };
    let work = match r.work {
        Work::Slurm => "slurm",
        w => w.agent().unwrap_or("command"),
    };
    PathBuf::from(format!("{who}-{work}-{moment}"))
}

/// The markdown table of the measured `lines`.
fn table(lines: &[String]) -> String {
    let mut t = String::from("| controller · work |");
    for (_, name) in MOMENTS {
        let _ = write!(t, " {name} |");
    }
    t.push_str("\n|---|");
    t.push_str(&"---|".repeat(MOMENTS.len()));
    for l in lines {
        t.push('\n');
        t.push_str(l);
    }
    t
}

/// Where README's text between the markers is.
fn readme_block(text: &str) -> Result<std::ops::Range<usize>> {
    let start = text
        .find(BEGIN)
        .with_context(|| format!("README.md has no {BEGIN:?} marker"))?
        + BEGIN.len();
    let end = text[start..]
        .find(END)
        .with_context(|| format!("README.md has no {END:?} after its begin marker"))?;
    Ok(start..start + end)
}

/// `text` with the table between the markers replaced by `table`.
fn with_table(text: &str, table: &str) -> Result<String> {
    let block = readme_block(text)?;
    Ok(format!(
        "{}\n{table}\n{}",
        &text[..block.start],
        &text[block.end..]
    ))
}

/// Fails unless every measured line is README's line for that row, and (on a full run)
/// README has no other rows.
fn check_readme(text: &str, lines: &[String]) -> Result<()> {
    let block = readme_block(text)?;
    let readme: BTreeSet<&str> = text[block]
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("| ") && !l.starts_with("| controller"))
        .collect();
    let mut problems = Vec::new();
    for l in lines {
        if !readme.contains(l.as_str()) {
            let label = l.split(" | ").next().unwrap_or(l);
            let theirs = readme
                .iter()
                .find(|r| r.split(" | ").next() == Some(label))
                .copied()
                .unwrap_or("(no such row)");
            problems.push(format!("  measured: {l}\n  README:   {theirs}"));
        }
    }
    if lines.len() == ROWS.len() && readme.len() != lines.len() {
        problems.push(format!(
            "  README has {} rows, the matrix {}",
            readme.len(),
            lines.len()
        ));
    }
    if !problems.is_empty() {
        bail!(
            "README.md's crash matrix disagrees with what was measured (run `cargo xtask \
             crash-matrix --write` once the difference is understood):\n{}",
            problems.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_refuses_a_short_run_before_measuring_anything() {
        let opts = options(&["--short".to_owned(), "--write".to_owned()]).expect("options");
        let nowhere = Path::new("/nonexistent");
        let e = run(nowhere, nowhere, &opts).expect_err("a short run cannot write the table");
        assert!(e.to_string().contains("without --short"), "{e}");
    }

    fn readme(rows: &[&str]) -> String {
        format!(
            "# x\n\ntext\n\n{BEGIN}\n| controller · work | a |\n|---|---|\n{}\n{END}\n\nmore\n",
            rows.join("\n")
        )
    }

    #[test]
    fn the_table_is_written_between_the_markers_and_then_agrees() {
        let lines = vec!["| sortie · command | 0 / 0 / – / – |".to_owned()];
        let old = readme(&["| sortie · command | 2 / 2 / – / – |"]);
        let new = with_table(&old, &table(&lines)).expect("markers");
        assert!(new.starts_with("# x\n\ntext\n\n"), "{new}");
        assert!(new.ends_with(&format!("{END}\n\nmore\n")), "{new}");
        check_readme(&new, &lines).expect("the written table agrees");
        assert_eq!(
            with_table(&new, &table(&lines)).expect("markers"),
            new,
            "writing is idempotent"
        );
    }

    #[test]
    fn a_cell_readme_does_not_show_fails_naming_both() {
        let text = readme(&["| sortie · command | 0 / 0 / – / – |"]);
        let measured = vec!["| sortie · command | 2 / 2 / – / – |".to_owned()];
        let e = check_readme(&text, &measured).expect_err("they disagree");
        let e = e.to_string();
        assert!(
            e.contains("measured: | sortie · command | 2 / 2")
                && e.contains("README:   | sortie · command | 0 / 0"),
            "{e}"
        );
        let missing = vec!["| GNU parallel · pi | 0 / 0 / – / 0 |".to_owned()];
        let e = check_readme(&text, &missing).expect_err("no such row");
        assert!(e.to_string().contains("(no such row)"), "{e}");
        let e = check_readme("# no markers\n", &measured).expect_err("no markers");
        assert!(e.to_string().contains("marker"), "{e}");
    }

    #[test]
    fn a_cell_says_what_is_not_applicable_and_what_did_not_complete() {
        let c = Counted {
            restarted: 1,
            twice: 2,
            billed_twice: None,
            served: Some(1000),
            failed: 1,
        };
        // Two tasks needed 800 without a crash: the one that completed needed 400.
        assert_eq!(c.cell(Some(800)), "1 / 2 / – / 600 (1 not completed)");
        assert!(!c.kept_promise());
        let plain = Counted {
            served: None,
            failed: 0,
            restarted: 0,
            twice: 0,
            billed_twice: None,
        };
        assert_eq!(plain.cell(None), "0 / 0 / – / –");
        assert!(plain.kept_promise());
    }
}

//! `cargo xtask torture [--crashes N] [--seed S] [--tasks T]`: the crash torture, the
//! quality bar of crash safety (every crash resumes to a clean audit). A mixed batch of
//! fake-agent tasks (successes, transient failures, model fallbacks, stalls, slow tasks,
//! worktree tasks in a scratch git repository, artifacts; every task counts its answers in a
//! file of its own and logs the usage it reports, unique per attempt) is run by `sortie run`,
//! SIGKILLed at a random moment (a random delay, or right after a random journal event through
//! `SORTIE_TEST_PAUSE_AFTER`, or while the resume starts),
//! resumed, killed again, ... until N crashes happened. A crash is mostly that SIGKILL; one in
//! ten is an interrupt (SIGINT, SIGTERM or SIGHUP: sortie must exit 3 by itself, resumable,
//! charging no task), and one in ten a SIGKILL or SIGTERM of the run's shepherds while sortie
//! lives, followed by the usual SIGKILL of sortie: a moment later, or (one time in two) once
//! every agent the live sortie's own shepherd ran has ended. Meanwhile sortie, handed those
//! agents, waits for each to its own end: each must be recorded once (`AttemptFinished`), never
//! orphaned, never failed as "lost track", and no task may have processes of two attempts
//! alive at once (an agent beside its retry). A run that finishes before is checked and
//! followed by a fresh one. The last run is then resumed to its end.
//!
//! After every crash: `sortie audit` exits 0 and finds the journal whole, with a ledger total
//! equal to the sum over the journal's attempts of each attempt's last usage (from `sortie
//! export`); every attempt's usage is one the fake agent reported for that very attempt, and
//! never changes afterwards; a task the journal showed finished never runs again (its answer
//! counter and usage log stay as they were). After each resume has recorded its orphans, no
//! process of an attempt that was live at the crash is alive (found by the
//! `SORTIE_ATTEMPT=<run>/<task>/<attempt>/...` marker in `/proc`). At the end of every run:
//! it completed, every task finished exactly once and completed, answered at least once, its
//! attempts numbered 1, 2, ... with every orphan retried; a finished attempt's usage is the
//! agent's last report; no process of the run is left; `git worktree list` and the
//! `sortie/<run>/` branches hold exactly the worktrees the journal kept.
//!
//! Supervision is on (most tasks run under a supervisor that outlives sortie; a fifth are
//! `supervise = false`), so a resume also adopts attempts still running and records those that
//! ended while sortie was down. An attempt whose exit file is there right after a kill ended
//! while sortie was down: it must never be orphaned (which would run it again) and must be
//! recorded by the resume; after a resume found every live attempt, no process (agent or
//! supervisor) of an orphaned one is alive, and none of the run is left at its end.
//!
//! Any violation stops the torture with a message naming the seed, the crash and the run, and
//! leaves its directory for a post-mortem. The same module runs a short version as an
//! end-to-end test (`tests/e2e/torture.rs`), against the debug binary the tests build.
//!
//! The checks are in `torture_checks.rs`; the export's view, waits, the `/proc` scan and git
//! come from `sortie-testkit`, shared with the crash tests.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sortie_testkit::{Events, Journal, Usage, try_git as git, wait_exit};

// Explicit, so that xtask and the e2e test that includes this file find the same file.
#[path = "torture_checks.rs"]
mod checks;
#[path = "torture_damage.rs"]
mod damage;

/// The engine's test hook, `sortie_runner::engine::TEST_PAUSE_AFTER` (xtask does not build the
/// runner; `tests/e2e/torture.rs` checks that the two agree).
pub(crate) const PAUSE_AFTER: &str = "SORTIE_TEST_PAUSE_AFTER";

/// The longest any single wait of the torture may take before it counts as a hang.
const PATIENCE: Duration = Duration::from_secs(120);

/// Journal events after which a run may be frozen (then killed), and their weights.
const PAUSE_EVENTS: [(&str, u64); 15] = [
    ("AttemptLaunching", 4),
    ("AttemptStarted", 3),
    ("AttemptProgress", 3),
    ("AttemptFinished", 4),
    ("ArtifactWritten", 2),
    ("RetryScheduled", 2),
    ("TaskFinished", 3),
    ("AttemptOrphaned", 2),
    ("WorktreePlanned", 1),
    ("WorktreeFinalized", 1),
    // #10: a supervised attempt is placed before its supervisor starts; a resume finds it.
    ("AttemptPlaced", 2),
    ("AttemptAdopted", 1),
    ("AttemptRecorded", 1),
    // #33: a check runs (found again by a resume), and its verdict.
    ("VerifyStarted", 3),
    ("VerifyEnded", 2),
];

/// Events only a resume records.
const RESUME_EVENTS: [&str; 3] = ["AttemptOrphaned", "AttemptAdopted", "AttemptRecorded"];

/// What to torture, and how hard.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// SIGKILLs to deliver in all.
    pub(crate) crashes: u32,
    /// The PRNG's seed: the same seed makes the same batches and the same choices (the
    /// moments still depend on the machine).
    pub(crate) seed: u64,
    /// Tasks per batch.
    pub(crate) tasks: usize,
    /// The batch's concurrency.
    pub(crate) concurrency: u32,
    /// The longest random delay before a kill, in ms.
    pub(crate) max_delay_ms: u64,
    /// Print a line per crash.
    pub(crate) verbose: bool,
}

impl Options {
    /// The defaults of `cargo xtask torture`: 200 crashes of 24-task batches.
    pub(crate) fn new(seed: u64) -> Options {
        Options {
            crashes: 200,
            seed,
            tasks: 24,
            concurrency: 6,
            max_delay_ms: 4000,
            verbose: true,
        }
    }
}

/// Parses `[--crashes N] [--seed S] [--tasks T] [--quiet]`.
pub(crate) fn options(args: &[String]) -> Result<Options> {
    let mut o = Options::new(clock_seed());
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (flag.as_str(), None),
        };
        if name == "--quiet" {
            o.verbose = false;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .with_context(|| format!("{name} takes a value"))?,
        };
        let num = |v: &str| -> Result<u64> {
            v.parse()
                .with_context(|| format!("{name} takes a number, not {v:?}"))
        };
        match name {
            "--crashes" => o.crashes = u32::try_from(num(&value)?).context("--crashes")?,
            "--seed" => o.seed = num(&value)?,
            "--tasks" => o.tasks = usize::try_from(num(&value)?).context("--tasks")?.max(1),
            other => bail!("unknown torture option {other:?}"),
        }
    }
    Ok(o)
}

/// A seed from the clock, for runs without `--seed`.
pub(crate) fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x5eed)
        % 1_000_000_007
}

/// What the torture did.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// The seed.
    pub(crate) seed: u64,
    /// SIGKILLs delivered to a live sortie.
    pub(crate) crashes: u32,
    /// Of which right after a journal event (the pause hook), by event.
    pub(crate) paused_kills: BTreeMap<String, u32>,
    /// Of which while a resume was starting (before its orphans were checked).
    pub(crate) early_kills: u32,
    /// Of which interrupts (SIGINT, SIGTERM), each ended by sortie itself with exit 3.
    pub(crate) interrupts: u32,
    /// Of which kills (SIGKILL or SIGTERM) of the run's shepherds while sortie lived (then
    /// sortie's SIGKILL).
    pub(crate) shepherd_kills: u32,
    /// Of which kills that sortie lived through until every agent its shepherd ran had ended.
    pub(crate) shepherd_outlived: u32,
    /// The agents those shepherds ran: each waited for by sortie, recorded once, never
    /// orphaned, never beside its retry.
    pub(crate) shepherd_agents: u64,
    /// #32: damage-and-recover rounds (see `torture_damage.rs`), and of them those recover
    /// refused (nothing to rebuild from: the journal put back) and those it recovered.
    pub(crate) damage_rounds: u32,
    pub(crate) damage_refused: u32,
    pub(crate) damage_recovered: u32,
    /// `sortie resume` processes started.
    pub(crate) resumes: u32,
    /// Runs (batches) driven to their end.
    pub(crate) runs: u32,
    /// Attempts launched, in all runs.
    pub(crate) attempts: u64,
    /// Attempts recorded orphaned: killed by a resume, or found gone.
    pub(crate) orphans_killed: u64,
    /// See `orphans_killed`.
    pub(crate) orphans_gone: u64,
    /// Kills that fell between an attempt's end and its task's end.
    pub(crate) between: u64,
    /// Tasks by final state, in all runs.
    pub(crate) tasks_by_state: BTreeMap<String, u64>,
    /// Journal events in all runs.
    pub(crate) events: u64,
    /// Worktrees kept (and checked against git) in all runs.
    pub(crate) worktrees_kept: u64,
    /// Supervised attempts a resume found running (adopted) or ended (recorded from files).
    pub(crate) adopted: u64,
    /// See `adopted`.
    pub(crate) recorded: u64,
    /// Attempts seen ended while sortie was down (their exit file there right after a kill):
    /// none of them may be orphaned, each must be recorded.
    pub(crate) ended_down: u64,
    /// #34: tasks run sandboxed (`sandbox = "workspace"`: every other task, where the machine
    /// can sandbox), in all runs.
    pub(crate) sandboxed_tasks: u64,
    /// Wall time.
    pub(crate) elapsed: Duration,
}

impl Report {
    /// The counts, as printed by `cargo xtask torture`.
    pub(crate) fn text(&self) -> String {
        let mut s = String::new();
        let paused: Vec<String> = self
            .paused_kills
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let tasks: Vec<String> = self
            .tasks_by_state
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let _ = writeln!(
            s,
            "torture: seed {}: {} crashes ({} right after a journal event, {} while a resume \
             started, {} between an attempt's end and its task's end), {} resumes, {} runs",
            self.seed,
            self.crashes,
            self.paused_kills.values().sum::<u32>(),
            self.early_kills,
            self.between,
            self.resumes,
            self.runs
        );
        let _ = writeln!(
            s,
            "torture: {} attempts, {} orphaned ({} killed by a resume, {} gone), {} events, \
             {} worktrees kept; tasks: {}",
            self.attempts,
            self.orphans_killed + self.orphans_gone,
            self.orphans_killed,
            self.orphans_gone,
            self.events,
            self.worktrees_kept,
            tasks.join(", ")
        );
        let _ = writeln!(
            s,
            "torture: supervised attempts found by a resume: {} adopted, {} recorded from \
             their files ({} seen ended while sortie was down, none run again)",
            self.adopted, self.recorded, self.ended_down
        );
        let _ = writeln!(
            s,
            "torture: of the crashes, {} interrupts (SIGINT, SIGTERM, SIGHUP: exit 3 each time) \
             and {} kills of the shepherd while sortie lived ({} lived through by sortie until \
             the {} agents their shepherd ran had ended, each once, none orphaned)",
            self.interrupts, self.shepherd_kills, self.shepherd_outlived, self.shepherd_agents
        );
        let _ = writeln!(
            s,
            "torture: {} damage-and-recover rounds: {} recovered (audit whole and saying so, no \
             attempt number used twice, no finished task run again), {} refused by recover \
             (nothing to rebuild from; the journal put back)",
            self.damage_rounds, self.damage_recovered, self.damage_refused
        );
        let _ = writeln!(
            s,
            "torture: {} tasks sandboxed (sandbox = \"workspace\")",
            self.sandboxed_tasks
        );
        let _ = writeln!(s, "torture: kills after: {}", paused.join(", "));
        let _ = write!(
            s,
            "torture: no violation; elapsed {:.1} s",
            self.elapsed.as_secs_f64()
        );
        s
    }
}

/// A small deterministic PRNG (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Runs the torture with the `sortie` binary and fake agent given; `root` is where its scratch
/// directory goes (removed when no violation was found).
pub(crate) fn torture(opts: &Options, sortie: &Path, agent: &Path, root: &Path) -> Result<Report> {
    let started = Instant::now();
    let mut t = Torture {
        opts: opts.clone(),
        rng: Rng(opts.seed),
        sortie: sortie.to_owned(),
        agent: agent.to_owned(),
        root: root.to_owned(),
        sandbox: can_sandbox(sortie),
        report: Report {
            seed: opts.seed,
            ..Report::default()
        },
    };
    fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let result = t.all();
    t.report.elapsed = started.elapsed();
    match result {
        Ok(()) => {
            let _ = fs::remove_dir_all(root);
            Ok(t.report)
        }
        Err(e) => Err(e.context(format!(
            "torture with seed {} failed after {} crash(es); its files are kept in {}",
            opts.seed,
            t.report.crashes,
            root.display()
        ))),
    }
}

struct Torture {
    opts: Options,
    rng: Rng,
    sortie: PathBuf,
    agent: PathBuf,
    root: PathBuf,
    /// #34: whether this machine can sandbox (`sortie __sandbox --probe`).
    sandbox: bool,
    report: Report,
}

/// Whether `sortie __sandbox --probe` says this machine can sandbox.
fn can_sandbox(sortie: &Path) -> bool {
    Command::new(sortie)
        .args(["__sandbox", "--probe"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// One run (batch) under torture, and what its crashes so far have shown.
struct Gen {
    dir: PathBuf,
    state: PathBuf,
    run: String,
    labels: Vec<String>,
    repo: PathBuf,
    /// Per finished task: (answer counter lines, usage log lines) when first seen finished.
    frozen: BTreeMap<u64, (usize, usize)>,
    /// Every attempt's usage as last seen in the journal, and whether it was live then.
    seen_usage: BTreeMap<(u64, u64), (Usage, bool)>,
    /// Sortie processes started for this run (names the log files).
    starts: u32,
    /// Attempts whose exit file was there right after a kill, before they were recorded: they
    /// ended while sortie was down.
    ended_down: BTreeSet<(u64, u64)>,
    /// #32: the process of each attempt started before a damage round (see `torture_damage`).
    started_before_damage: BTreeMap<(u64, u64), (u64, u64)>,
}

/// How the next sortie process of a run will be killed.
#[derive(Debug, Clone)]
enum KillPlan {
    /// Right away (a resume: while it starts and reaps).
    Early,
    /// Once the first such event this process commits is durable.
    After(&'static str),
    /// After a delay, in ms.
    Delay(u64),
}

impl Torture {
    fn all(&mut self) -> Result<()> {
        let mut gen_no = 0;
        loop {
            gen_no += 1;
            let mut g = self.new_gen(gen_no)?;
            let finished = self.torture_gen(&mut g)?;
            if !finished {
                // The crashes are all spent: resume to the end, unharmed.
                let mut child = self.start(&mut g, true, None)?;
                let status = wait_exit(&mut child, PATIENCE)
                    .context("violation: the last resume hung")?
                    .code();
                let log = g.log(g.starts);
                if status != Some(0) {
                    bail!(
                        "violation: the last resume of run {} exited with {status:?}:\n{}",
                        g.run,
                        tail(&log)
                    );
                }
            }
            self.check_end(&mut g)?;
            self.report.runs += 1;
            if self.report.crashes >= self.opts.crashes {
                return Ok(());
            }
        }
    }

    /// Writes a fresh batch (and its scratch repository) for run number `n`.
    fn new_gen(&mut self, n: u32) -> Result<Gen> {
        let dir = self.root.join(format!("run{n}"));
        let repo = dir.join("repo");
        fs::create_dir_all(dir.join("out"))?;
        fs::create_dir_all(&repo)?;
        git(&repo, &["init", "-q", "-b", "main"])?;
        fs::write(repo.join("README"), "scratch repository of the torture\n")?;
        git(&repo, &["add", "README"])?;
        git(&repo, &["commit", "-q", "-m", "init"])?;
        let run = format!("torture-{}-{}-{n}", std::process::id(), self.opts.seed);
        let mut toml = format!(
            "concurrency = {}\n\n[defaults]\nmax_retries = 1000\nmax_orphans = 1000\nkill_grace = \"1s\"\n\
             attempt_timeout = \"5m\"\n",
            self.opts.concurrency
        );
        let mut labels = Vec::new();
        for i in 0..self.opts.tasks {
            let (label, body) = self.task(i, &dir, &repo);
            toml.push_str(&body);
            labels.push(label);
        }
        fs::write(dir.join("batch.toml"), toml)?;
        Ok(Gen {
            state: self.root.join("state"),
            dir,
            run,
            labels,
            repo,
            frozen: BTreeMap::new(),
            seen_usage: BTreeMap::new(),
            starts: 0,
            ended_down: BTreeSet::new(),
            started_before_damage: BTreeMap::new(),
        })
    }

    /// Task `i` of a batch: a random kind, its own counter and usage log, usage unique per
    /// task and attempt.
    fn task(&mut self, i: usize, dir: &Path, repo: &Path) -> (String, String) {
        let kinds = [
            "ok",
            "ok",
            "ok",
            "transient",
            "fallback",
            "stall",
            "slow",
            "worktree",
            "verify",
        ];
        let kind = kinds[self.rng.below(kinds.len() as u64) as usize];
        let label = format!("t{i:02}-{kind}");
        let turns = 1 + self.rng.below(4);
        let sleep_ms = 100 + self.rng.below(900);
        let usage = format!(
            "{},{},0.{:06}",
            1000 + 17 * i as u64 + self.rng.below(7),
            100 + 3 * i as u64,
            1000 + 37 * i as u64
        );
        let counter = dir.join(format!("count-{label}"));
        let usage_log = dir.join(format!("usage-{label}"));
        let mut args: Vec<String> = vec![
            "--attempt".into(),
            "{attempt}".into(),
            "--answer".into(),
            format!("answer of {label}"),
            "--usage".into(),
            usage,
            "--usage-per-attempt".into(),
            "--usage-log".into(),
            usage_log.display().to_string(),
            "--counter".into(),
            counter.display().to_string(),
            "--turns".into(),
            turns.to_string(),
            "--sleep".into(),
            format!("{:.3}", sleep_ms as f64 / 1000.0),
        ];
        let mut extra = String::new();
        let mut prefix: Option<PathBuf> = None;
        match kind {
            "transient" => args.extend(["--fail-attempts".into(), "1:error".into()]),
            "fallback" => {
                args.extend(["--model".into(), "{model}".into()]);
                args.extend(["--fail-model".into(), "a:model_error".into()]);
                extra.push_str("model = \"a\"\nfallback_models = [\"b\"]\n");
            }
            "stall" => {
                args.extend(["--stall-attempts".into(), "1".into()]);
                args.extend(["--turns".into(), "3".into()]);
                extra.push_str("stall_after = \"2s\"\nstall_kill_after = \"1s\"\n");
            }
            "slow" => args.extend(["--sleep".into(), "3".into(), "--turns".into(), "6".into()]),
            "worktree" => {
                extra.push_str(&format!(
                    "isolation = \"worktree\"\ncwd = {:?}\n",
                    repo.display().to_string()
                ));
                // Some change their worktree (kept), some do not (removed).
                if self.rng.chance(60) {
                    args.extend(["--write".into(), format!("{label}.txt:made by {label}")]);
                }
            }
            // #33: its check fails until a feedback round reached the command (the round's
            // SORTIE_VERIFY_FEEDBACK leaves a mark), then passes; every run of it is counted.
            "verify" => {
                let fed = dir.join(format!("fed-{label}"));
                let checks = dir.join(format!("checks-{label}"));
                extra.push_str(&format!(
                    "verify = \"echo ran >> '{}'; sleep 0.{}; test -e '{}'\"\nverify_rounds = 2\n",
                    checks.display(),
                    1 + self.rng.below(8),
                    fed.display()
                ));
                prefix = Some(fed);
            }
            _ => {}
        }
        if self.rng.chance(30) {
            extra.push_str(&format!("output = \"out/{label}.md\"\n"));
        }
        // Supervision is on by default; some tasks keep the direct path under torture too.
        if self.rng.chance(20) {
            extra.push_str("supervise = false\n");
        }
        // #34: every other task sandboxed (by its index: the random draws stay the seed's),
        // its counter and logs in the run's dir, the fake agent read from where it is.
        if self.sandbox && i.is_multiple_of(2) {
            extra.push_str(&format!(
                "sandbox = \"workspace\"\nsandbox_write = [{:?}]\nsandbox_read = [{:?}]\n",
                dir.display().to_string(),
                self.agent.display().to_string()
            ));
            self.report.sandboxed_tasks += 1;
        }
        let mut argv = Vec::new();
        if let Some(fed) = prefix {
            argv.extend([
                "sh".to_owned(),
                "-c".to_owned(),
                format!(
                    "[ -n \"$SORTIE_VERIFY_FEEDBACK\" ] && touch '{}'; exec \"$@\"",
                    fed.display()
                ),
                "sh".to_owned(),
            ]);
        }
        argv.extend(["python3".to_owned(), self.agent.display().to_string()]);
        argv.extend(args);
        let quoted: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
        let body = format!(
            "\n[[tasks]]\nlabel = \"{label}\"\ncommand = [{}]\n{extra}",
            quoted.join(", ")
        );
        (label, body)
    }

    /// Crashes run `g` until the crashes are spent (false) or it finishes (true).
    fn torture_gen(&mut self, g: &mut Gen) -> Result<bool> {
        let mut resuming = false;
        loop {
            let plan = self.kill_plan(resuming);
            let before = match &plan {
                KillPlan::After(event) if resuming => g.journal(&self.sortie)?.count(event),
                _ => 0,
            };
            let pause = match &plan {
                KillPlan::After(event) => Some(*event),
                _ => None,
            };
            let at_kill = if resuming {
                Some(g.journal(&self.sortie)?)
            } else {
                None
            };
            let mut child = self.start(g, resuming, pause)?;
            if resuming {
                self.report.resumes += 1;
            }
            // The run's journal must exist before a kill (a kill before `RunStarted` leaves no
            // run to resume); a resume's orphans are checked before any kill but an early one.
            if !resuming {
                wait_until(&mut child, || {
                    Ok(g.try_journal(&self.sortie)
                        .is_some_and(|j| j.count("RunStarted") > 0))
                })?;
            } else if !matches!(plan, KillPlan::Early)
                && let Some(j) = &at_kill
            {
                self.check_reaped(g, &mut child, j)?;
            }
            match &plan {
                KillPlan::Early => {}
                KillPlan::After(event) => {
                    let before = if resuming { before } else { 0 };
                    wait_until(&mut child, || {
                        Ok(g.try_journal(&self.sortie)
                            .is_some_and(|j| j.count(event) > before))
                    })?;
                }
                KillPlan::Delay(ms) => sleep_while_alive(&mut child, *ms)?,
            }
            if self.fault(g, &mut child, matches!(plan, KillPlan::Delay(_)))? {
                return Ok(true); // an interrupt found the run at its end
            }
            self.report.crashes += 1;
            match plan {
                KillPlan::After(event) => {
                    *self
                        .report
                        .paused_kills
                        .entry(event.to_owned())
                        .or_default() += 1;
                }
                KillPlan::Early => self.report.early_kills += 1,
                KillPlan::Delay(_) => {}
            }
            let j = self.check_after_kill(g)?;
            // #32: one crash in ten (and one at half-way if none yet), the journal is damaged
            // and recovered before the resume.
            let halfway = self.report.crashes == self.opts.crashes / 2;
            if j.count("RunFinished") == 0
                && (self.rng.chance(10) || (halfway && self.report.damage_rounds == 0))
            {
                self.damage_round(g, &j)?;
            }
            if self.opts.verbose {
                eprintln!(
                    "torture: crash {}/{} ({}, run {}): {} of {} tasks finished, {} attempts \
                     live, {} events",
                    self.report.crashes,
                    self.opts.crashes,
                    match plan {
                        KillPlan::Early => "while resuming".to_owned(),
                        KillPlan::After(e) => format!("after {e}"),
                        KillPlan::Delay(ms) => format!("after {ms} ms"),
                    },
                    g.run,
                    j.finished().len(),
                    g.labels.len(),
                    j.live_attempts().len(),
                    j.events().len()
                );
            }
            if j.count("RunFinished") > 0 {
                return Ok(true); // killed after its very end
            }
            if self.report.crashes >= self.opts.crashes {
                return Ok(false);
            }
            resuming = true;
        }
    }

    /// Ends the live sortie of `g` as this crash's fault: mostly SIGKILL; one in ten an
    /// interrupt, which sortie must end by itself with exit 3 (0 when the run was at its end:
    /// then true); one in ten a SIGKILL or SIGTERM of the run's shepherds first, sortie's a
    /// moment later or once the agents its own shepherd ran have ended (`check_shepherd_kill`).
    /// An interrupt needs a `running` loop: not one the pause hook froze (it waits for the
    /// kill), nor a resume still taking the run over.
    fn fault(&mut self, g: &Gen, child: &mut Child, running: bool) -> Result<bool> {
        if let Some(status) = child.try_wait()? {
            // It finished before the fault.
            if status.code() != Some(0) {
                bail!(
                    "violation: sortie (run {}) exited by itself with {status}:\n{}",
                    g.run,
                    tail(&g.log(g.starts))
                );
            }
            return Ok(true);
        }
        let roll = self.rng.below(10);
        if roll == 0 && running {
            let sig = ["INT", "TERM", "HUP"][self.rng.below(3) as usize];
            sortie_testkit::signal(child.id(), sig);
            let until = Instant::now() + PATIENCE;
            let status = loop {
                if let Some(status) = child.try_wait()? {
                    break status;
                }
                if Instant::now() > until {
                    let _ = child.kill();
                    bail!(
                        "violation: sortie (run {}) did not stop within {PATIENCE:?} of SIG{sig}",
                        g.run
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            self.report.interrupts += 1;
            return match status.code() {
                Some(3) => Ok(false),
                Some(0) => Ok(true),
                _ => bail!(
                    "violation: SIG{sig} made sortie (run {}) exit with {status}, not 3:\n{}",
                    g.run,
                    tail(&g.log(g.starts))
                ),
            };
        }
        if roll == 1 {
            let shepherds = sortie_testkit::shepherds_of(&g.run);
            // The agents the live sortie's own shepherd runs: they are handed to sortie.
            let ours: Vec<u32> = shepherds
                .iter()
                .map(|s| s.pid)
                .filter(|&p| parent_of(p) == Some(child.id()))
                .collect();
            let under: BTreeSet<(u64, u64)> = sortie_testkit::marked_processes(&g.run)
                .into_iter()
                .filter(|m| parent_of(m.pid).is_some_and(|p| ours.contains(&p)))
                .filter_map(|m| m.attempt)
                .collect();
            let sig = if self.rng.chance(50) { "KILL" } else { "TERM" };
            for s in &shepherds {
                sortie_testkit::signal(s.pid, sig);
            }
            if !shepherds.is_empty() {
                self.report.shepherd_kills += 1;
                // Not while the pause hook froze the loop: nothing is recorded then.
                if running && !under.is_empty() && self.rng.chance(50) {
                    self.check_shepherd_kill(g, child, &under)?;
                    self.report.shepherd_outlived += 1;
                    self.report.shepherd_agents += under.len() as u64;
                } else {
                    sleep_while_alive(child, self.rng.below(1500))?;
                }
            }
        }
        if let Some(status) = child.try_wait()? {
            // A run that lost its shepherd goes on as if nothing happened.
            if status.code() != Some(0) {
                bail!(
                    "violation: sortie (run {}) exited with {status} after its shepherd was \
                     killed:\n{}",
                    g.run,
                    tail(&g.log(g.starts))
                );
            }
            return Ok(true);
        }
        child.kill().context("SIGKILL sortie")?;
        child.wait().context("reaping sortie")?;
        Ok(false)
    }

    fn kill_plan(&mut self, resuming: bool) -> KillPlan {
        let roll = self.rng.below(100);
        if resuming && roll < 12 {
            return KillPlan::Early;
        }
        if roll < 40 {
            let total: u64 = PAUSE_EVENTS.iter().map(|(_, w)| w).sum();
            let mut pick = self.rng.below(total);
            for (event, w) in PAUSE_EVENTS {
                // Only a resume records orphans (and adopts or records attempts).
                if pick < w && (resuming || !RESUME_EVENTS.contains(&event)) {
                    return KillPlan::After(event);
                }
                pick = pick.saturating_sub(w);
            }
        }
        KillPlan::Delay(self.rng.below(self.opts.max_delay_ms + 1))
    }

    /// Starts `sortie run` (or `resume`) for `g`, output to log files, paused after `pause`.
    fn start(&self, g: &mut Gen, resume: bool, pause: Option<&str>) -> Result<Child> {
        g.starts += 1;
        let out = fs::File::create(g.dir.join(format!("sortie{}.out", g.starts)))?;
        let err = fs::File::create(g.log(g.starts))?;
        let mut c = g.sortie(&self.sortie);
        if resume {
            c.args(["resume", &g.run]);
        } else {
            c.args(["run", "--run-id", &g.run, "batch.toml"]);
        }
        c.stdout(out).stderr(err);
        match pause {
            Some(p) => c.env(PAUSE_AFTER, p),
            None => c.env_remove(PAUSE_AFTER),
        };
        c.spawn().context("starting sortie")
    }
}

impl Gen {
    fn sortie(&self, bin: &Path) -> Command {
        let mut c = Command::new(bin);
        c.current_dir(&self.dir)
            .env_remove("SORTIE_DIR")
            .env_remove("RUST_LOG")
            .env_remove(PAUSE_AFTER)
            .arg("--state-dir")
            .arg(&self.state)
            .stdin(Stdio::null());
        c
    }

    fn log(&self, n: u32) -> PathBuf {
        self.dir.join(format!("sortie{n}.err"))
    }

    /// The journal through `sortie export`.
    fn journal(&self, bin: &Path) -> Result<Journal> {
        let out = self
            .sortie(bin)
            .args(["export", &self.run])
            .output()
            .context("running sortie export")?;
        if !out.status.success() {
            bail!(
                "violation: sortie export {} failed: {}",
                self.run,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Journal::parse(&out.stdout).map_err(anyhow::Error::msg)
    }

    /// The same, or `None` while it cannot be read (the run does not exist yet, or a reader
    /// met the writer's lock).
    fn try_journal(&self, bin: &Path) -> Option<Journal> {
        let out = self.sortie(bin).args(["export", &self.run]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        Journal::parse(&out.stdout).ok()
    }

    fn lines(&self, prefix: &str, t: u64) -> usize {
        fs::read_to_string(
            self.dir
                .join(format!("{prefix}-{}", self.labels[t as usize])),
        )
        .map(|s| s.lines().count())
        .unwrap_or(0)
    }

    /// Answers task `t`'s agents gave (lines in its counter file).
    fn counter(&self, t: u64) -> usize {
        self.lines("count", t)
    }

    /// Usage reports task `t`'s agents made.
    fn usage_lines(&self, t: u64) -> usize {
        self.lines("usage", t)
    }

    /// Every usage report of every attempt, in order, from the agents' logs.
    fn reported(&self) -> Result<BTreeMap<(u64, u64), Vec<Usage>>> {
        let mut m: BTreeMap<(u64, u64), Vec<Usage>> = BTreeMap::new();
        for (t, label) in self.labels.iter().enumerate() {
            let Ok(text) = fs::read_to_string(self.dir.join(format!("usage-{label}"))) else {
                continue;
            };
            for line in text.lines() {
                // A line cut short by a kill is not a report sortie could have read.
                let Ok(v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                let u = &v["usage"];
                let usd = u["cost_usd"].as_f64().unwrap_or(0.0);
                m.entry((t as u64, num(&v["attempt"])))
                    .or_default()
                    .push(Usage {
                        input: num(&u["input"]),
                        output: num(&u["output"]),
                        nanos: (usd * 1e9).round() as u64,
                        turns: num(&u["turns"]),
                        ..Usage::default()
                    });
            }
        }
        Ok(m)
    }
}

fn num(v: &Value) -> u64 {
    v.as_u64().unwrap_or(u64::MAX)
}

/// Polls `done` every 100 ms until it holds or `child` exits; fails past [`PATIENCE`].
/// Sleeps `ms` milliseconds, or until `child` exits.
/// The parent of process `pid` (`/proc/<pid>/stat`'s fourth field), while it lives.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_ascii_whitespace().nth(1)?.parse().ok()
}

fn sleep_while_alive(child: &mut Child, ms: u64) -> Result<()> {
    let until = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < until && child.try_wait()?.is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn wait_until(child: &mut Child, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let until = Instant::now() + PATIENCE;
    loop {
        if done()? || child.try_wait()?.is_some() {
            return Ok(());
        }
        if Instant::now() >= until {
            bail!("violation: sortie neither got there nor ended within {PATIENCE:?} (a hang?)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last lines of a log file.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn canonical(p: &str) -> PathBuf {
    fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p))
}

//! The sortie side of the crash matrix: one run of a scene's tasks, crashed at one moment and
//! resumed to its end. Exact moments come from the engine's test hook
//! (`SORTIE_TEST_PAUSE_AFTER`: the loop freezes once an event is durable; `before:spawn`
//! once a round's launches are durable and nothing is spawned) and from the scene's gates,
//! never from a timed kill.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sortie_testkit::{Events, Journal, exit_recorded, shepherds_of, signal, unique_run};

use super::scene::{Scene, wait_until};
use super::{Counted, Moment, PATIENCE, Work};

/// The engine's test hook (`sortie_runner::engine::TEST_PAUSE_AFTER`).
const PAUSE_AFTER: &str = "SORTIE_TEST_PAUSE_AFTER";

/// Events a resume records about an attempt it found (adopted, recorded from its files, or
/// orphaned).
const FOUND: [&str; 3] = ["AttemptAdopted", "AttemptRecorded", "AttemptOrphaned"];

/// A sortie run of a scene.
struct Run<'a> {
    scene: &'a Scene,
    bin: &'a Path,
    run: String,
    starts: u32,
}

/// Runs `scene` under sortie, crashed at `moment`, to its end; counts what the crash cost.
pub(super) fn cell(scene: &Scene, bin: &Path, moment: Moment) -> Result<Counted> {
    let mut r = Run {
        scene,
        bin,
        run: unique_run("crash-matrix"),
        starts: 0,
    };
    r.write_batch()?;
    match moment {
        Moment::None => {
            scene.open(1)?;
            scene.open(2)?;
            let mut run = r.start(false, None)?;
            r.finish(&mut run)?;
        }
        Moment::Launched => {
            scene.open(1)?;
            scene.open(2)?;
            let mut run = r.start(false, Some("before:spawn"))?;
            r.wait_journal(&mut run, "every launch durable", |j| {
                j.count("AttemptLaunching") >= scene.tasks
            })?;
            r.kill(&mut run)?;
            r.resume_to_end()?;
        }
        Moment::Running | Moment::Resume => {
            scene.open(1)?;
            let mut run = r.start(false, Some("AttemptStarted"))?;
            r.wait_begun(&mut run)?;
            r.kill(&mut run)?;
            let found = r.journal()?.count_of(&FOUND);
            let mut resume = if moment == Moment::Resume {
                let mut first = r.start(true, Some("AttemptAdopted"))?;
                r.wait_journal(&mut first, "the resume's first adoption", |j| {
                    j.count_of(&FOUND) > found
                })?;
                r.kill(&mut first)?;
                let found = r.journal()?.count_of(&FOUND);
                let mut again = r.start(true, None)?;
                r.wait_found(&mut again, found)?;
                again
            } else {
                let mut resume = r.start(true, None)?;
                r.wait_found(&mut resume, found)?;
                resume
            };
            scene.open(2)?;
            r.finish(&mut resume)?;
        }
        Moment::Ended => {
            scene.open(1)?;
            let mut run = r.start(false, Some("AttemptStarted"))?;
            r.wait_begun(&mut run)?;
            scene.open(2)?;
            if scene.work == Work::Slurm {
                // A job's end is Slurm's to tell (sacct), not a file's.
                let prefix = format!("sortie:{}:", r.run);
                wait_until("every job ended (sacct)", PATIENCE, || {
                    let jobs = sortie_testkit::slurm::sacct_jobs(&prefix);
                    jobs.len() >= scene.tasks
                        && jobs.iter().all(|j| {
                            !["PENDING", "RUNNING", "COMPLETING"].contains(&j.state.as_str())
                        })
                })?;
            } else {
                r.wait_journal(&mut run, "every attempt's exit recorded", |j| {
                    let dirs = placed_dirs(j);
                    dirs.len() >= scene.tasks && dirs.iter().all(|d| exit_recorded(d))
                })?;
            }
            r.kill(&mut run)?;
            r.resume_to_end()?;
        }
        Moment::Shepherd => {
            scene.open(1)?;
            let mut run = r.start(false, None)?;
            r.wait_begun(&mut run)?;
            r.wait_journal(&mut run, "every attempt started", |j| {
                j.count("AttemptStarted") >= scene.tasks
            })?;
            let shepherds = shepherds_of(&r.run);
            if shepherds.is_empty() {
                bail!("run {} has no shepherd to kill", r.run);
            }
            for s in &shepherds {
                signal(s.pid, "KILL");
            }
            scene.open(2)?;
            r.finish(&mut run)?;
        }
    }
    r.count()
}

impl Run<'_> {
    fn write_batch(&self) -> Result<()> {
        let s = self.scene;
        let mut toml = format!(
            "concurrency = {}\n\n[defaults]\nmax_retries = 3\nmax_orphans = 3\n\
             attempt_timeout = \"5m\"\nkill_grace = \"1s\"\n",
            s.tasks
        );
        if let Some(agent) = s.work.agent() {
            toml.push_str(&format!("agent = \"{agent}\"\nmodel = \"{}\"\n", s.model()));
        }
        if s.work == Work::Slurm {
            toml.push_str("executor = \"slurm\"\n");
        }
        for t in 0..s.tasks {
            toml.push_str(&format!(
                "\n[[tasks]]\nlabel = \"t{t}\"\ncwd = \"work/t{t}\"\n"
            ));
            match s.work {
                Work::Plain | Work::Slurm => {
                    toml.push_str("command = [\"sh\", \"work.sh\"]\n");
                }
                _ => toml.push_str(&format!("prompt = \"{}\"\n", super::scene::PROMPT)),
            }
        }
        fs::write(s.dir.join("batch.toml"), toml).context("writing batch.toml")
    }

    fn command(&self) -> Command {
        let mut c = Command::new(self.bin);
        c.current_dir(&self.scene.dir)
            .env_remove("SORTIE_DIR")
            .env_remove("RUST_LOG")
            .env_remove(PAUSE_AFTER)
            .arg("--state-dir")
            .arg(self.scene.dir.join("state"))
            .stdin(Stdio::null());
        self.scene.agent_env(&mut c);
        c
    }

    /// Starts `sortie run` (or `resume`), frozen by the hook at `pause` when given.
    fn start(&mut self, resume: bool, pause: Option<&str>) -> Result<Child> {
        self.starts += 1;
        let log = |ext: &str| fs::File::create(self.log(self.starts, ext));
        let (out, err) = (log("out")?, log("err")?);
        let mut c = self.command();
        if resume {
            c.args(["resume", &self.run]);
        } else {
            c.args(["run", "--run-id", &self.run, "batch.toml"]);
        }
        if let Some(p) = pause {
            c.env(PAUSE_AFTER, p);
        }
        c.stdout(out).stderr(err);
        c.spawn().context("starting sortie")
    }

    fn log(&self, n: u32, ext: &str) -> PathBuf {
        self.scene.dir.join(format!("sortie{n}.{ext}"))
    }

    fn try_journal(&self) -> Option<Journal> {
        let out = self.command().args(["export", &self.run]).output().ok()?;
        if !out.status.success() {
            return None;
        }
        Journal::parse(&out.stdout).ok()
    }

    fn journal(&self) -> Result<Journal> {
        let mut j = None;
        wait_until("sortie export", PATIENCE, || {
            j = self.try_journal();
            j.is_some()
        })?;
        j.context("sortie export")
    }

    /// Waits until the journal shows `done`; fails when `child` ends first.
    fn wait_journal(
        &self,
        child: &mut Child,
        what: &str,
        done: impl Fn(&Journal) -> bool,
    ) -> Result<()> {
        let mut ended = None;
        wait_until(what, PATIENCE, || {
            if let Ok(Some(status)) = child.try_wait() {
                ended = Some(status);
                return true;
            }
            self.try_journal().is_some_and(|j| done(&j))
        })?;
        if let Some(status) = ended {
            bail!(
                "sortie (run {}) ended ({status}) before {what}: {}",
                self.run,
                self.tail()
            );
        }
        Ok(())
    }

    /// Waits until every task's side effect has begun and its start is journaled.
    fn wait_begun(&self, child: &mut Child) -> Result<()> {
        wait_until("every task's side effect begun", PATIENCE, || {
            self.scene.all_begun(1) || child.try_wait().ok().flatten().is_some()
        })?;
        self.wait_journal(child, "an attempt started", |j| {
            j.count("AttemptStarted") >= 1
        })
    }

    /// Waits until a resume has found every attempt a crash left running (beyond `before`
    /// such records).
    fn wait_found(&self, child: &mut Child, before: usize) -> Result<()> {
        let tasks = self.scene.tasks;
        self.wait_journal(child, "the resume to find the attempts", |j| {
            j.count_of(&FOUND) >= before + tasks
        })
    }

    fn kill(&self, child: &mut Child) -> Result<()> {
        child.kill().context("SIGKILL sortie")?;
        child.wait().context("reaping sortie")?;
        Ok(())
    }

    /// Waits for `child` to end; a run it did not finish is resumed to its end.
    fn finish(&mut self, child: &mut Child) -> Result<()> {
        sortie_testkit::wait_exit(child, Duration::from_secs(PATIENCE))
            .map_err(|e| anyhow::anyhow!("{e}: {}", self.tail()))?;
        if self.journal()?.count("RunFinished") == 0 {
            self.resume_to_end()?;
        }
        Ok(())
    }

    fn resume_to_end(&mut self) -> Result<()> {
        let mut child = self.start(true, None)?;
        sortie_testkit::wait_exit(&mut child, Duration::from_secs(PATIENCE))
            .map_err(|e| anyhow::anyhow!("{e}: {}", self.tail()))?;
        if self.journal()?.count("RunFinished") == 0 {
            bail!("run {} did not finish: {}", self.run, self.tail());
        }
        Ok(())
    }

    fn tail(&self) -> String {
        let text = fs::read_to_string(self.log(self.starts, "err")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(12)..].join("\n")
    }

    /// What the crash cost, once the run is finished and its work is over.
    fn count(&self) -> Result<Counted> {
        wait_until("the work's processes to end", PATIENCE, || {
            !self.scene.work_alive()
        })?;
        let j = self.journal()?;
        let completed = j
            .kinds()
            .filter(|(k, b)| *k == "TaskFinished" && b["result"]["state"] == "completed")
            .count();
        let ledger = self.scene.served().map(|_| {
            let u = j.total();
            u.input + u.output + u.cache_read + u.cache_write
        });
        Ok(Counted::of(self.scene, completed, ledger))
    }
}

/// The attempt dirs of every `AttemptPlaced`.
fn placed_dirs(j: &Journal) -> Vec<PathBuf> {
    j.kinds()
        .filter(|(k, _)| *k == "AttemptPlaced")
        .filter_map(|(_, b)| b["dir"].as_str().map(PathBuf::from))
        .collect()
}

/// Counting events by kind.
trait Count {
    fn count(&self, kind: &str) -> usize;
    fn count_of(&self, kinds: &[&str]) -> usize;
}

impl Count for Journal {
    fn count(&self, kind: &str) -> usize {
        self.count_of(&[kind])
    }

    fn count_of(&self, kinds: &[&str]) -> usize {
        self.kinds().filter(|(k, _)| kinds.contains(k)).count()
    }
}

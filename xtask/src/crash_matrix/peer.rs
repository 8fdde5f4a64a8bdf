//! The peer's side of the crash matrix: the same tasks as one shell line each under
//! `parallel --joblog J --resume`, its controller crashed at comparable moments and resumed.
//!
//! A crash of GNU parallel is a SIGKILL of the `parallel` process alone: the jobs it started
//! live on (reparented), as sortie's supervised attempts outlive sortie; the resume is the same
//! command line again, which runs every job its joblog does not list as done. parallel
//! journals a job only once it ended, so the moments are those of the job:
//! - launched: its shell runs, held before its side effect (sortie: journaled, not spawned);
//! - running: its side effect begun, held; the resume starts while it runs;
//! - ended: the job ended after the kill, before the resume (not in the joblog);
//! - during a resume: the resume is killed once it started its jobs, then resumed again.
//!
//! There is no shepherd to kill.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::scene::{PROMPT, Scene, quoted, wait_until};
use super::{Counted, Moment, PATIENCE, Work};

/// Runs `scene` under GNU parallel, crashed at `moment`, to its end; counts the same things.
pub(super) fn cell(scene: &Scene, moment: Moment) -> Result<Counted> {
    let mut p = Peer { scene, starts: 0 };
    p.write_jobs()?;
    match moment {
        Moment::None => {
            scene.open(1)?;
            scene.open(2)?;
            let mut run = p.start()?;
            p.finish(&mut run)?;
        }
        Moment::Launched => {
            let mut run = p.start()?;
            p.wait_spawned(&mut run, 1)?;
            kill(&mut run)?;
            let mut resume = p.start()?;
            p.wait_spawned(&mut resume, 2)?;
            scene.open(1)?;
            scene.open(2)?;
            p.finish(&mut resume)?;
        }
        Moment::Running | Moment::Resume => {
            scene.open(1)?;
            let mut run = p.start()?;
            p.wait_begun(&mut run, 1)?;
            kill(&mut run)?;
            let mut resume = p.start()?;
            p.wait_begun(&mut resume, 2)?;
            if moment == Moment::Resume {
                kill(&mut resume)?;
                resume = p.start()?;
                p.wait_begun(&mut resume, 3)?;
            }
            scene.open(2)?;
            p.finish(&mut resume)?;
        }
        Moment::Ended => {
            scene.open(1)?;
            let mut run = p.start()?;
            p.wait_begun(&mut run, 1)?;
            kill(&mut run)?;
            scene.open(2)?;
            wait_until("the orphaned jobs to end", PATIENCE, || !scene.work_alive())?;
            let mut resume = p.start()?;
            p.finish(&mut resume)?;
        }
        Moment::Shepherd => bail!("GNU parallel has no shepherd"),
    }
    p.count()
}

/// A GNU parallel run of a scene.
struct Peer<'a> {
    scene: &'a Scene,
    starts: u32,
}

impl Peer<'_> {
    /// One shell line per task: its work, or its agent run headless on the prompt.
    fn write_jobs(&self) -> Result<()> {
        let s = self.scene;
        let mut jobs = String::new();
        for t in 0..s.tasks {
            let cd = format!("cd {} && ", quoted(&s.task_dir(t)));
            let line = match s.work {
                Work::Plain => "sh work.sh".to_owned(),
                // One job step per task, from the task's directory (shared: one node).
                Work::Slurm => "srun --quiet --ntasks=1 sh work.sh".to_owned(),
                Work::Pi => format!(
                    "echo '{PROMPT}' | pi --mode json --offline --no-session --no-extensions \
                     --no-skills --model {} > agent.out 2>&1",
                    s.model()
                ),
                // As sortie runs it under `permissions = "edit"`, with no start-up traffic.
                Work::Claude => format!(
                    "echo '{PROMPT}' | DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 \
                     CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 claude -p --output-format \
                     stream-json --verbose --permission-mode acceptEdits --allowedTools Bash \
                     --model {} > agent.out 2>&1",
                    s.model()
                ),
                Work::Codex => format!(
                    "echo '{PROMPT}' | codex exec --json --skip-git-repo-check --sandbox \
                     workspace-write --model {} - > agent.out 2>&1",
                    s.model()
                ),
            };
            jobs.push_str(&cd);
            jobs.push_str(&line);
            jobs.push('\n');
        }
        fs::write(s.dir.join("jobs"), jobs).context("writing the jobs file")
    }

    /// `parallel --joblog joblog --resume -j TASKS :::: jobs`, as a fresh start and as every
    /// resume alike.
    fn start(&mut self) -> Result<Child> {
        self.starts += 1;
        let dir = &self.scene.dir;
        let log = |ext: &str| fs::File::create(dir.join(format!("parallel{}.{ext}", self.starts)));
        let mut c = Command::new("parallel");
        c.current_dir(dir)
            .args(["--joblog", "joblog", "--resume", "-j"])
            .arg(self.scene.tasks.to_string())
            .args(["::::", "jobs"])
            .stdin(Stdio::null())
            .stdout(log("out")?)
            .stderr(log("err")?);
        self.scene.agent_env(&mut c);
        c.spawn()
            .context("starting GNU parallel (apt-get install parallel)")
    }

    fn wait_spawned(&self, child: &mut Child, n: usize) -> Result<()> {
        wait_until("every job's shell", PATIENCE, || {
            self.scene.all_spawned(n) || exited(child)
        })?;
        self.check_alive(child, "its jobs began")
    }

    fn wait_begun(&self, child: &mut Child, n: u64) -> Result<()> {
        wait_until("every job's side effect", PATIENCE, || {
            self.scene.all_begun(n) || exited(child)
        })?;
        self.check_alive(child, "its jobs' side effects began")
    }

    fn check_alive(&self, child: &mut Child, what: &str) -> Result<()> {
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "GNU parallel ended ({status}) before {what}; see {}",
                self.scene.dir.display()
            );
        }
        Ok(())
    }

    fn finish(&self, child: &mut Child) -> Result<()> {
        sortie_testkit::wait_exit(child, Duration::from_secs(PATIENCE))?;
        Ok(())
    }

    /// What the crash cost, once every job (and every orphan) is over. parallel keeps no
    /// ledger: nothing is billed by it, so nothing is billed twice either.
    fn count(&self) -> Result<Counted> {
        wait_until("the orphaned jobs to end", PATIENCE, || {
            !self.scene.work_alive()
        })?;
        let completed = done_in_joblog(&self.scene.dir.join("joblog"))?;
        Ok(Counted::of(self.scene, completed, None))
    }
}

fn kill(child: &mut Child) -> Result<()> {
    child.kill().context("SIGKILL parallel")?;
    child.wait().context("reaping parallel")?;
    Ok(())
}

fn exited(child: &mut Child) -> bool {
    child.try_wait().ok().flatten().is_some()
}

/// Jobs the joblog lists as ended with exit 0 (its header skipped; a job listed by several
/// runs counted once).
fn done_in_joblog(path: &Path) -> Result<usize> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let done: std::collections::BTreeSet<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols.get(6) == Some(&"0")).then(|| cols[0])
        })
        .collect();
    Ok(done.len())
}

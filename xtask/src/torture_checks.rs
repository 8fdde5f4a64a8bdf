//! The torture's checks (see `torture.rs`): after every crash, the audit, the ledger, each
//! attempt's usage against what its agent reported, finished tasks frozen, no survivor of an
//! orphaned attempt once the resume recorded it; after a shepherd's death, its agents waited for
//! by sortie, each recorded once, never orphaned, none beside its retry; at the end of a run, every task completed once,
//! nothing left running, and git's worktrees and branches are the ones the journal kept.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sortie_testkit::{Events, Journal, Usage, marked_processes, supervisors_of, try_git as git};

use super::{Gen, PATIENCE, Torture, canonical, num, wait_until};

impl Torture {
    /// Once the resume has found every attempt live at the crash (orphaned, adopted or
    /// recorded), no process of an orphaned one (agent or supervisor) may be alive.
    pub(super) fn check_reaped(&self, g: &Gen, child: &mut Child, at_kill: &Journal) -> Result<()> {
        let live = at_kill.live_attempts();
        let resumed = at_kill.count("RunResumed");
        let mut done = false;
        let mut orphaned: BTreeSet<(u64, u64)> = BTreeSet::new();
        wait_until(child, || {
            let Some(j) = g.try_journal(&self.sortie) else {
                return Ok(false);
            };
            let of = |kind: &str| -> BTreeSet<(u64, u64)> {
                j.kinds()
                    .filter(|(k, _)| *k == kind)
                    .map(|(_, b)| (num(&b["task"]), num(&b["attempt"])))
                    .collect()
            };
            orphaned = of("AttemptOrphaned");
            let found: BTreeSet<(u64, u64)> = orphaned
                .iter()
                .copied()
                .chain(of("AttemptAdopted"))
                .chain(of("AttemptRecorded"))
                .collect();
            done = j.count("RunResumed") > resumed && live.is_subset(&found);
            Ok(done)
        })?;
        if !done {
            return Ok(()); // it exited first; that is checked by the caller
        }
        let survivors: Vec<String> = marked_processes(&g.run)
            .into_iter()
            .chain(supervisors_of(&g.run))
            .filter(|m| {
                m.attempt
                    .is_some_and(|k| live.contains(&k) && orphaned.contains(&k))
            })
            .map(|m| format!("pid {} (task, attempt) {:?}", m.pid, m.attempt))
            .collect();
        if !survivors.is_empty() {
            bail!(
                "violation: run {}: processes of attempts live at the crash survived the resume \
                 that recorded them orphaned: {}",
                g.run,
                survivors.join(", ")
            );
        }
        Ok(())
    }

    /// The live sortie's shepherd was just killed while it ran the attempts `under`: sortie,
    /// handed their agents, waits for each itself. Until each is recorded ended (or sortie
    /// exited, which `fault` judges), none may be orphaned (it would run again) and no task may
    /// have processes of two attempts alive at once (an agent beside its retry).
    pub(super) fn check_shepherd_kill(
        &self,
        g: &Gen,
        child: &mut Child,
        under: &BTreeSet<(u64, u64)>,
    ) -> Result<()> {
        let when = format!(
            "after crash {} (run {}), its shepherd killed",
            self.report.crashes, g.run
        );
        let until = Instant::now() + PATIENCE;
        loop {
            let mut alive: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
            for (t, a) in marked_processes(&g.run)
                .into_iter()
                .filter_map(|m| m.attempt)
            {
                alive.entry(t).or_default().insert(a);
            }
            if let Some((t, attempts)) = alive.iter().find(|(_, a)| a.len() > 1) {
                bail!(
                    "violation {when}: [{}] processes of attempts {attempts:?} alive at once",
                    g.labels[*t as usize]
                );
            }
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            if let Some(j) = g.try_journal(&self.sortie) {
                for &(t, a) in under {
                    if j.of(t, "AttemptOrphaned")
                        .iter()
                        .any(|b| num(&b["attempt"]) == a)
                    {
                        bail!(
                            "violation {when}: [{}] attempt {a} was orphaned, though its agent \
                             was handed to sortie: it runs again",
                            g.labels[t as usize]
                        );
                    }
                }
                let ended = j.finished_attempts();
                if under.iter().all(|k| ended.contains(k)) {
                    return Ok(());
                }
            }
            if Instant::now() > until {
                bail!(
                    "violation {when}: the attempts its shepherd ran ({under:?}) were not all \
                     recorded within {PATIENCE:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What must hold right after a kill; returns the journal. Also notes the live attempts
    /// that have already ended (their supervisor recorded their exit): they ended while sortie
    /// was down, and must be recorded from their files, never run again.
    pub(super) fn check_after_kill(&mut self, g: &mut Gen) -> Result<Journal> {
        let j = g.journal(&self.sortie)?;
        let when = format!("after crash {} (run {})", self.report.crashes, g.run);
        for (t, a) in j.live_attempts() {
            let dir = j
                .of(t, "AttemptPlaced")
                .iter()
                .find(|b| num(&b["attempt"]) == a)
                .and_then(|b| b["dir"].as_str().map(PathBuf::from));
            if dir.is_some_and(|d| sortie_testkit::exit_recorded(&d)) && g.ended_down.insert((t, a))
            {
                self.report.ended_down += 1;
            }
        }
        self.check_journal(g, &j, &when)?;
        self.report.between += j.ended_not_finished().len() as u64;
        Ok(j)
    }

    /// The checks of every crash and of the end: audit, ledger, usage against what the agents
    /// reported, finished tasks frozen, attempts' usage stable.
    fn check_journal(&self, g: &mut Gen, j: &Journal, when: &str) -> Result<()> {
        let out = g
            .sortie(&self.sortie)
            .args(["--json", "audit", &g.run])
            .output()
            .context("running sortie audit")?;
        if out.status.code() != Some(0) {
            bail!(
                "violation {when}: audit exited {:?}: {}{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let audit: Value = serde_json::from_slice(&out.stdout).context("audit --json")?;
        if audit["clean"] != true || !audit["ledger_mismatch"].is_null() {
            bail!("violation {when}: the audit is not clean: {audit}");
        }
        let total = j.total();
        if Usage::of(&audit["ledger"]["total"]) != Some(total) {
            bail!(
                "violation {when}: the ledger total {} is not the sum of each journaled \
                 attempt's last usage {total:?}",
                audit["ledger"]["total"]
            );
        }
        // A task may finish once; a finished task never runs again.
        for t in 0..g.labels.len() as u64 {
            let n = j.of(t, "TaskFinished").len();
            if n > 1 {
                bail!(
                    "violation {when}: [{}] finished {n} times",
                    g.labels[t as usize]
                );
            }
        }
        for t in j.finished() {
            let now = (g.counter(t), g.usage_lines(t));
            let before = *g.frozen.entry(t).or_insert(now);
            if now != before {
                bail!(
                    "violation {when}: [{}] had finished, yet ran again: (answers, usage \
                     reports) went from {before:?} to {now:?}",
                    g.labels[t as usize]
                );
            }
        }
        // An attempt that ended while sortie was down is recorded from its files, never
        // orphaned (which would run it again).
        for &(t, a) in &g.ended_down {
            let orphaned = j
                .of(t, "AttemptOrphaned")
                .iter()
                .any(|b| num(&b["attempt"]) == a);
            if orphaned {
                bail!(
                    "violation {when}: [{}] attempt {a} ended while sortie was down (its exit \
             file was there), yet a resume orphaned it: it would run again",
                    g.labels[t as usize]
                );
            }
        }
        // Every attempt's usage is one its agent reported (or none yet), never changes, and a
        // finished attempt holds the agent's last report.
        let reported = g.reported()?;
        let ended = j.finished_attempts();
        for (key, u) in j.attempt_usage() {
            let label = &g.labels[key.0 as usize];
            let theirs = reported.get(&key).map(Vec::as_slice).unwrap_or_default();
            if u != Usage::default() && !theirs.contains(&u) {
                bail!(
                    "violation {when}: [{label}] attempt {} holds usage {u:?}, which its agent \
                     never reported (it reported {theirs:?})",
                    key.1
                );
            }
            if ended.contains(&key) && theirs.last().copied().unwrap_or_default() != u {
                bail!(
                    "violation {when}: [{label}] attempt {} finished with usage {u:?}, but its \
                     agent's last report was {:?}",
                    key.1,
                    theirs.last()
                );
            }
            // An ended attempt's usage never changes again; a live one's (an adopted attempt
            // works on while sortie is down) only grows.
            let live = !ended.contains(&key) && j.live_attempts().contains(&key);
            if let Some((before, was_live)) = g.seen_usage.insert(key, (u, live))
                && before != u
                && (!was_live || !grows(before, u))
            {
                bail!(
                    "violation {when}: [{label}] attempt {}'s usage changed from {before:?} to \
                     {u:?}",
                    key.1
                );
            }
        }
        // #32: an interrupt or a shepherd's death is never the task's: no task ends for it,
        // and no attempt is failed as lost while its agent may run on.
        for e in j.events() {
            let ev = &e["event"];
            let lost = ev["AttemptFinished"]["outcome"]["error"]
                .as_str()
                .is_some_and(|m| m.contains("lost track of the agent process"));
            if lost {
                bail!("violation {when}: an attempt failed as lost while its agent may run: {e}");
            }
            if ev["TaskFinished"]["result"]["stop_reason"] == "interrupted" {
                bail!("violation {when}: a task ended for an interrupt or a crash: {e}");
            }
        }
        self.check_attempt_numbers(g, j, when)
    }

    /// What must hold once a run has ended.
    pub(super) fn check_end(&mut self, g: &mut Gen) -> Result<()> {
        let j = g.journal(&self.sortie)?;
        let when = format!("at the end of run {}", g.run);
        if !j
            .kinds()
            .any(|(k, b)| k == "RunFinished" && b["state"] == "completed")
        {
            bail!("violation {when}: the run did not finish completed");
        }
        self.check_journal(g, &j, &when)?;
        for (t, label) in g.labels.iter().enumerate() {
            let t = t as u64;
            let finished = j.of(t, "TaskFinished");
            let [end] = finished.as_slice() else {
                bail!(
                    "violation {when}: [{label}] finished {} times",
                    finished.len()
                );
            };
            let state = end["result"]["state"].as_str().unwrap_or("?").to_owned();
            if state != "completed" {
                bail!(
                    "violation {when}: [{label}] ended {state}: {}",
                    end["result"]
                );
            }
            *self.report.tasks_by_state.entry(state).or_default() += 1;
            // #33: each check's verdict once, and a checked task completes only on a pass.
            let verdicts = j.of(t, "VerifyEnded");
            let mut checked: Vec<u64> = verdicts.iter().map(|b| num(&b["attempt"])).collect();
            checked.dedup();
            if checked.len() != verdicts.len() {
                bail!("violation {when}: [{label}] a check's verdict was journaled twice");
            }
            if label.ends_with("-verify")
                && verdicts
                    .last()
                    .is_none_or(|b| b["verdict"]["passed"] != true)
            {
                bail!("violation {when}: [{label}] completed without a passing check");
            }
            if g.counter(t) == 0 {
                bail!("violation {when}: [{label}] completed, but its agent never answered");
            }
            let launched: Vec<u64> = j
                .of(t, "AttemptLaunching")
                .iter()
                .map(|b| num(&b["attempt"]))
                .collect();
            if launched != (1..=launched.len() as u64).collect::<Vec<_>>() {
                bail!("violation {when}: [{label}] attempts numbered {launched:?}");
            }
            for o in j.of(t, "AttemptOrphaned") {
                let a = num(&o["attempt"]);
                if !launched.contains(&(a + 1)) {
                    bail!("violation {when}: [{label}] orphaned attempt {a} was not retried");
                }
                if o["action"] == "killed" {
                    self.report.orphans_killed += 1;
                } else {
                    self.report.orphans_gone += 1;
                }
            }
            self.report.attempts += launched.len() as u64;
            self.report.adopted += j.of(t, "AttemptAdopted").len() as u64;
            self.report.recorded += j.of(t, "AttemptRecorded").len() as u64;
        }
        for &(t, a) in &g.ended_down {
            let recorded = j
                .of(t, "AttemptRecorded")
                .iter()
                .any(|b| num(&b["attempt"]) == a);
            if !recorded {
                bail!(
                    "violation {when}: [{}] attempt {a} ended while sortie was down, but no \
             resume recorded it",
                    g.labels[t as usize]
                );
            }
        }
        self.report.events += j.events().len() as u64;
        // No process of the run is left.
        let mut left = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            left = marked_processes(&g.run);
            left.extend(supervisors_of(&g.run));
            if left.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !left.is_empty() {
            bail!("violation {when}: processes of the run are still alive: {left:?}");
        }
        self.check_worktrees(g, &j, &when)
    }

    /// `git worktree list` and the run's branches hold exactly the worktrees the journal kept.
    fn check_worktrees(&mut self, g: &Gen, j: &Journal, when: &str) -> Result<()> {
        let mut kept_paths = BTreeSet::new();
        let mut kept_branches = BTreeSet::new();
        for (t, _) in g.labels.iter().enumerate() {
            let t = t as u64;
            let changed = j
                .of(t, "WorktreeFinalized")
                .last()
                .is_some_and(|f| f["changed"] == true);
            if let (true, Some(plan)) = (changed, j.of(t, "WorktreePlanned").last()) {
                kept_paths.insert(canonical(plan["path"].as_str().unwrap_or_default()));
                kept_branches.insert(plan["branch"].as_str().unwrap_or_default().to_owned());
            }
        }
        let listed = git(&g.repo, &["worktree", "list", "--porcelain"])?;
        let main = canonical(&g.repo.display().to_string());
        let worktrees: BTreeSet<PathBuf> = listed
            .lines()
            .filter_map(|l| l.strip_prefix("worktree "))
            .map(canonical)
            .filter(|p| *p != main)
            .collect();
        if worktrees != kept_paths {
            bail!(
                "violation {when}: git lists the worktrees {worktrees:?}, the journal kept \
                 {kept_paths:?}"
            );
        }
        let pattern = format!("sortie/{}/*", g.run);
        let branches: BTreeSet<String> = git(
            &g.repo,
            &["branch", "--list", "--format=%(refname:short)", &pattern],
        )?
        .lines()
        .map(str::to_owned)
        .collect();
        if branches != kept_branches {
            bail!(
                "violation {when}: the run's branches are {branches:?}, the journal kept \
                 {kept_branches:?}"
            );
        }
        self.report.worktrees_kept += kept_paths.len() as u64;
        Ok(())
    }
}

/// Whether `now` is `before` or more, counter by counter.
fn grows(before: Usage, now: Usage) -> bool {
    now.input >= before.input
        && now.output >= before.output
        && now.cache_read >= before.cache_read
        && now.cache_write >= before.cache_write
        && now.reasoning >= before.reasoning
        && now.nanos >= before.nanos
        && now.unreported >= before.unreported
        && now.turns >= before.turns
}

//! The torture's damage-and-recover round (see `torture.rs`): now and then, after sortie was
//! killed and before the run is resumed, the run's journal is damaged as a disk or a power loss
//! damages it (one byte flipped in the log's written part, the log cut at a random length, or a
//! 4 KiB page of it zeroed), then `sortie recover` rebuilds it. Recover either refuses (exit 4:
//! nothing readable; the journal is then put back as it was, and the run goes on) or succeeds,
//! and then:
//! - `sortie audit` exits 0, finds the journal whole, and says the run was recovered;
//! - no attempt number is used twice: an attempt the journal had started before the damage
//!   keeps its process when it appears again (restored from its files), never a new one under
//!   its number (checked after every later crash and at the run's end);
//! - and, through the torture's usual checks, no task that had finished runs again (its agent's
//!   counter), and the run ends with every task completed once.
//!
//! Before recover, every reader's answer is checked too: `audit` exits 0 (the damage hit only
//! what sled no longer reads) or 4, never anything else.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sortie_testkit::{Events, Journal};

use super::{Gen, Torture, num};

/// What a damage round did to the log.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Flip(usize),
    Cut(usize),
    ZeroPage(usize),
}

impl Torture {
    /// One damage-and-recover round on `g`, whose journal after the kill is `j` (see the
    /// module doc). The journal is damaged only when the run has one to damage.
    pub(super) fn damage_round(&mut self, g: &mut Gen, j: &Journal) -> Result<()> {
        let run_dir = g.state.join("runs").join(&g.run);
        let log = run_dir.join("journal").join("db");
        let Ok(bytes) = fs::read(&log) else {
            return Ok(());
        };
        let written = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        if written < 64 {
            return Ok(());
        }
        let backup = g.dir.join("undamaged");
        let _ = fs::remove_dir_all(&backup);
        copy_tree(&run_dir, &backup)?;
        let at = self.rng.below(written as u64) as usize;
        let damage = match self.rng.below(3) {
            0 => Damage::Flip(at),
            1 => Damage::Cut(at.max(1)),
            _ => Damage::ZeroPage(at / 4096 * 4096),
        };
        let mut damaged = bytes.clone();
        match damage {
            Damage::Flip(i) => damaged[i] ^= 1 << self.rng.below(8),
            Damage::Cut(n) => damaged.truncate(n),
            Damage::ZeroPage(p) => {
                let end = (p + 4096).min(damaged.len());
                damaged[p..end].fill(0);
            }
        }
        fs::write(&log, &damaged).with_context(|| format!("damaging {}", log.display()))?;
        self.report.damage_rounds += 1;
        let when = format!(
            "after crash {} (run {}), the log damaged ({damage:?} of {written} written bytes)",
            self.report.crashes, g.run
        );
        let audit = g
            .sortie(&self.sortie)
            .args(["audit", &g.run])
            .output()
            .context("running sortie audit")?;
        if !matches!(audit.status.code(), Some(0 | 4)) {
            bail!(
                "violation {when}: audit of the damaged journal exited {:?}: {}",
                audit.status.code(),
                String::from_utf8_lossy(&audit.stderr)
            );
        }
        let recover = g
            .sortie(&self.sortie)
            .args(["recover", &g.run])
            .output()
            .context("running sortie recover")?;
        match recover.status.code() {
            Some(0) => {}
            Some(4) => {
                // Nothing to rebuild from: the journal is put back, the run goes on.
                self.report.damage_refused += 1;
                fs::remove_dir_all(&run_dir)?;
                copy_tree(&backup, &run_dir)?;
                return Ok(());
            }
            other => bail!(
                "violation {when}: recover exited {other:?}: {}",
                String::from_utf8_lossy(&recover.stderr)
            ),
        }
        self.report.damage_recovered += 1;
        let audit = g
            .sortie(&self.sortie)
            .args(["audit", &g.run])
            .output()
            .context("running sortie audit")?;
        let text = String::from_utf8_lossy(&audit.stdout);
        if audit.status.code() != Some(0) || !text.contains("whole") || !text.contains("recovered")
        {
            bail!(
                "violation {when}: after recover, audit must find the journal whole and say it \
                 was recovered; it exited {:?}:\n{text}{}",
                audit.status.code(),
                String::from_utf8_lossy(&audit.stderr)
            );
        }
        // The processes of the attempts started before the damage: a number is never reused.
        for (key, pid) in started(j) {
            g.started_before_damage.entry(key).or_insert(pid);
        }
        // What the damage lost is not a change of the run's: an attempt's usage is seen again
        // afresh, and an attempt seen ended while sortie was down may be one whose end (and
        // the next attempt's launch) was lost, restored as orphaned (it is not run again).
        g.seen_usage.clear();
        g.ended_down.clear();
        let after = g.journal(&self.sortie)?;
        self.check_attempt_numbers(g, &after, &when)
    }

    /// No attempt number used twice: each attempt started before a damage round keeps its
    /// process whenever the journal shows it started.
    pub(super) fn check_attempt_numbers(&self, g: &Gen, j: &Journal, when: &str) -> Result<()> {
        for (key, pid) in started(j) {
            // pid 0: no process known here (an ended direct attempt restored from its files).
            if let Some(&before) = g.started_before_damage.get(&key)
                && before != pid
                && pid.0 != 0
            {
                bail!(
                    "violation {when}: [{}] attempt {} was started as {before:?} before the \
                     damage and again as {pid:?}: its number was used twice",
                    g.labels[key.0 as usize],
                    key.1
                );
            }
        }
        Ok(())
    }
}

/// Each started attempt's (task, attempt) and (pid, start time).
fn started(j: &Journal) -> BTreeMap<(u64, u64), (u64, u64)> {
    j.kinds()
        .filter(|(k, _)| *k == "AttemptStarted")
        .map(|(_, b)| {
            (
                (num(&b["task"]), num(&b["attempt"])),
                (num(&b["pid"]), num(&b["start_time"])),
            )
        })
        .collect()
}

/// Copies the files under `from` to `to` (sockets and FIFOs left out: not the run's record).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}

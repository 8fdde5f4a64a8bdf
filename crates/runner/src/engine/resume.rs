//! Taking over a run that no process owns: each attempt that was live when its run died is
//! found again through its executor (`AttemptPlaced` journaled where it runs) and is one of
//! three, journaled so:
//! - still running: `AttemptAdopted`, and followed from its files as if this process had
//!   launched it (its clocks re-armed from the journaled launch);
//! - ended while nobody watched: `AttemptRecorded`, and its outcome read from its files (the
//!   same driver, which finds the exit at once): it is not run again;
//! - gone without a status (a reboot, a killed supervisor, a direct child of the dead sortie):
//!   every process left of it is killed, then `AttemptOrphaned`: retried as transient, within
//!   `max_orphans`.
//!
//! No process of an attempt that is not adopted may survive, whether or not its pid made it
//! to the journal: the marker scan kills them all, sparing only the adopted ones.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sortie_core::{Event, OrphanAction, TaskId};

use super::Engine;
use crate::executor::{Adoption, Executor, Placement, Presence, Started};
use crate::{Error, Result, process};

/// What resume found of one live attempt.
struct Live {
    orphan: sortie_core::decide::Orphan,
    adoption: Option<Adoption>,
    presence: Presence,
}

/// The live attempts of one executor that polls in batch: each with its index in what resume
/// found.
struct InBatch {
    executor: Arc<dyn Executor>,
    found: Vec<(usize, Adoption)>,
}

impl Engine {
    /// This run's incarnation (see `process::marker`).
    pub(super) fn incarnation(&self) -> u64 {
        self.state.started_at.map_or(0, |t| t.0)
    }

    /// Resume's first duty: find each live attempt, adopt what runs, record what ended, and
    /// make sure nothing else of them survives before recording it orphaned.
    pub(super) async fn reap_orphans(&mut self) -> Result<()> {
        let plan = sortie_core::resume_plan(&self.state);
        let grace = Duration::from_secs(3);
        let survivor = |pid| Error::Survivor {
            pid,
            run: self.run_id.clone(),
        };
        let mut found = Vec::with_capacity(plan.orphans.len());
        // #11: the attempts of an executor that polls in batch (a batch scheduler) are found
        // with one query for all of them (below), by executor name in first-seen order.
        let mut batched: Vec<InBatch> = Vec::new();
        // Attempts adopted before (#11: Slurm jobs still known to the cluster) are not orphans.
        let mut spare: HashSet<_> = HashSet::new();
        for o in plan.orphans {
            if self.live.contains_key(&o.task) {
                spare.insert((o.task, o.attempt));
                continue;
            }
            let adoption = self.adoption(o.task);
            let executor = adoption
                .as_ref()
                .and_then(|a| self.executor_of(&a.placement.executor, o.task));
            let presence = match (&adoption, executor) {
                (Some(a), Some(ex)) if ex.can().polls_in_batch => {
                    let at = (found.len(), a.clone());
                    let name = &a.placement.executor;
                    let same = |b: &&mut InBatch| {
                        b.found
                            .first()
                            .is_some_and(|(_, f)| f.placement.executor == *name)
                    };
                    match batched.iter_mut().find(same) {
                        Some(b) => b.found.push(at),
                        None => batched.push(InBatch {
                            executor: ex,
                            found: vec![at],
                        }),
                    }
                    Presence::Gone
                }
                (Some(a), Some(ex)) => ex.find(a).await,
                _ => Presence::Gone,
            };
            found.push(Live {
                orphan: o,
                adoption,
                presence,
            });
        }
        for b in batched {
            let adoptions: Vec<Adoption> = b.found.iter().map(|(_, a)| a.clone()).collect();
            for ((i, _), presence) in b.found.iter().zip(b.executor.poll(&adoptions).await) {
                found[*i].presence = presence;
            }
        }
        // A gone attempt's supervisor goes first: it must record nothing after this.
        for l in &found {
            if l.presence == Presence::Gone
                && let Some(s) = l
                    .adoption
                    .as_ref()
                    .and_then(|a| crate::supervisor::read_started(&a.placement.dir))
            {
                let _ = process::kill_group_if_same(s.supervisor, s.supervisor_start, grace).await;
            }
        }
        spare.extend(
            found
                .iter()
                .filter(|l| l.presence != Presence::Gone)
                .map(|l| (l.orphan.task, l.orphan.attempt)),
        );
        // #33: the checks that were running: those that run on are spared too.
        let checks = self.find_checks(&plan.checks, &mut spare).await;
        let killed = process::kill_marked(&self.run_id, self.incarnation(), grace, &spare)
            .await
            .map_err(survivor)?;
        let mut events = Vec::new();
        let mut follow = Vec::new();
        for l in found {
            let o = &l.orphan;
            let (task, attempt) = (o.task, o.attempt);
            match (&l.presence, l.adoption) {
                (Presence::Alive, Some(a)) => {
                    let offset = std::fs::metadata(a.placement.stdout()).map_or(0, |m| m.len());
                    events.push(Event::AttemptAdopted {
                        task,
                        attempt,
                        offset,
                    });
                    follow.push((task, a, false));
                }
                (Presence::Ended(_), Some(a)) => {
                    events.push(Event::AttemptRecorded { task, attempt });
                    follow.push((task, a, true));
                }
                _ => {
                    let mut was_killed = killed.get(&(task, attempt)).copied().unwrap_or(false);
                    if let (Some(pid), Some(st)) = (o.pid, o.start_time) {
                        match process::kill_group_if_same(pid, st, grace).await {
                            process::KillResult::Killed => was_killed = true,
                            process::KillResult::Gone => {}
                            // Retrying while the old attempt still runs could do its work twice.
                            process::KillResult::Survived => return Err(survivor(pid)),
                        }
                    }
                    events.extend(self.sandbox_net(task, attempt));
                    let action = if was_killed {
                        OrphanAction::Killed
                    } else {
                        OrphanAction::Gone
                    };
                    events.push(Event::AttemptOrphaned {
                        task,
                        attempt,
                        action,
                    });
                }
            }
        }
        self.commit(events)?;
        for (task, adoption, ended) in follow {
            self.follow(task, adoption, ended);
        }
        self.follow_checks(checks);
        Ok(())
    }

    /// The journaled placement of `task`'s live attempt, and its journaled start.
    fn adoption(&self, task: TaskId) -> Option<Adoption> {
        let a = self.state.task(task)?.live_attempt()?;
        let p = a.placed.as_deref()?;
        let started = match (a.pid, a.start_time) {
            (Some(pid), Some(start_time)) => Some(Started { pid, start_time }),
            _ => None,
        };
        Some(Adoption {
            placement: Placement {
                executor: p.executor().to_owned(),
                task,
                attempt: a.attempt,
                dir: p.dir().into(),
                handle: p.handle.clone(),
            },
            started,
        })
    }

    /// Follows an adopted (or, `ended`, recorded) attempt with the ordinary driver: its
    /// stdout is read again from its start, but only the lines after the journaled offset
    /// (`AttemptRead`) are reported (the ones before rebuild the protocol reader's state: its
    /// usage, output and phase, so nothing is counted twice nor lost), its usage never below
    /// the journaled checkpoint, its stall clock from its
    /// stdout's last write. A recorded attempt's clocks are off: it ended by itself, its exit
    /// file says how.
    fn follow(&mut self, task: TaskId, adoption: Adoption, ended: bool) {
        let Some((mut ctx, _)) = self.attempt_ctx(task) else {
            return;
        };
        let live = self.state.task(task).and_then(|r| r.live_attempt());
        let seen = live.map_or(sortie_core::Usage::ZERO, |a| *a.usage());
        // #10: the lines before the journaled offset only rebuild the reader.
        ctx.read_until = live.and_then(|a| a.placed.as_deref()).map_or(0, |p| p.read);
        let last_output = std::fs::metadata(adoption.placement.stdout())
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(ctx.launched_at, |d| {
                sortie_core::Timestamp(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            });
        ctx.resumed = Some((seen, last_output));
        if ended {
            let never = Duration::from_secs(100 * 365 * 86_400);
            ctx.limits.attempt_timeout = never;
            ctx.limits.deadline_at = None;
            ctx.limits.stall_after = never;
        }
        ctx.adopt = Some(adoption);
        self.start_attempt(ctx);
    }
}

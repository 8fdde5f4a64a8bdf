//! Attempt reports become events: a task's reports in arrival order, one write for each task's
//! first report of the batch, one for each task's second, and so on; reports of an attempt that
//! is not live any more are dropped (fencing).

use std::collections::HashMap;

use sortie_core::{Attempt, Event, TaskId};

use super::Engine;
use crate::Result;
use crate::attempt::Msg;

impl Engine {
    /// Turns attempt reports into events. A round holds at most one event per task (see
    /// `commit`), so the batch is cut into rounds: the k-th round holds each task's k-th
    /// report, in arrival order. A task's reports keep their order; the rounds are as few as
    /// the most reports one task sent (an attempt that started and ended while the loop was
    /// busy: two), not one per task that repeats.
    pub(super) fn handle(&mut self, msgs: Vec<Msg>) -> Result<()> {
        let mut rounds: Vec<Vec<Msg>> = Vec::new();
        let mut count: HashMap<TaskId, usize> = HashMap::new();
        for msg in msgs {
            let k = count.entry(msg.task()).or_insert(0);
            if rounds.len() <= *k {
                rounds.push(Vec::new());
            }
            rounds[*k].push(msg);
            *k += 1;
        }
        for round in rounds {
            let mut events: Vec<Event> = Vec::with_capacity(round.len());
            for msg in round {
                let task = msg.task();
                if let Msg::Finished { .. } = msg {
                    self.live.remove(&task);
                }
                if let Msg::Activity {
                    task,
                    attempt,
                    text,
                } = &msg
                {
                    let live = self.state.task(*task).and_then(|r| r.live_attempt());
                    if live.is_some_and(|a| a.attempt == *attempt) {
                        self.observer.activity(&self.state, *task, *attempt, text);
                    }
                    continue;
                }
                if let Some(event) = self.event_for(msg) {
                    events.push(event);
                }
            }
            self.commit_acked(events)?;
        }
        Ok(())
    }

    /// Commits a round, then (#10) tells the transcripts' cutter: each `AttemptRead` in it is
    /// acknowledged (`process::write_read`: only once the journal holds it may the cutter cut
    /// below its offset), and the files of each placed attempt that finished in it are cut to
    /// the cap (`process::trim_ended`: the journal holds its whole stream now). An offset in
    /// the same block as the one journaled before it is not written again
    /// (`process::ack_moves`: the cutter reads an acknowledgement in whole blocks, so it would
    /// cut nothing more); a skipped one only ever makes the cutter wait, never cut unread bytes.
    fn commit_acked(&mut self, round: Vec<Event>) -> Result<()> {
        let told: Vec<(TaskId, Attempt, Option<u64>)> = round
            .iter()
            .filter_map(|e| match e {
                Event::AttemptRead {
                    task,
                    attempt,
                    offset,
                } => {
                    let before = self.journaled_read(*task, *attempt);
                    crate::process::ack_moves(before, *offset).then_some((
                        *task,
                        *attempt,
                        Some(*offset),
                    ))
                }
                Event::AttemptFinished { task, attempt, .. } => Some((*task, *attempt, None)),
                _ => None,
            })
            .collect();
        self.commit(round)?;
        for (task, attempt, read) in told {
            let Some(record) = self.state.task(task) else {
                continue;
            };
            let placed = record.attempts.iter().rev().find(|a| a.attempt == attempt);
            let Some(dir) = placed.and_then(|a| a.placed.as_deref()).map(|p| &p.dir) else {
                continue;
            };
            let dir = std::path::Path::new(dir);
            match read {
                Some(offset) => {
                    let stdout = dir.join(crate::process::STDOUT_FILE);
                    if let Err(e) = crate::process::write_read(&stdout, offset) {
                        tracing::debug!("cannot acknowledge {}: {e}", stdout.display());
                    }
                }
                None => crate::process::trim_ended(dir),
            }
        }
        Ok(())
    }

    /// The offset up to which the journal holds what a placed attempt's stdout said (0: none
    /// yet, or not placed).
    fn journaled_read(&self, task: TaskId, attempt: Attempt) -> u64 {
        let record = self.state.task(task);
        let placed = record.and_then(|r| r.attempts.iter().rev().find(|a| a.attempt == attempt));
        placed
            .and_then(|a| a.placed.as_deref())
            .map_or(0, |p| p.read)
    }

    /// The event an attempt's report becomes; reports of an attempt that is not live anymore
    /// (fencing) are dropped.
    fn event_for(&self, msg: Msg) -> Option<Event> {
        let live = self
            .state
            .task(msg.task())
            .and_then(|r| r.live_attempt())
            .map(|a| a.attempt);
        if live != Some(msg.attempt()) {
            tracing::debug!(
                "dropping a report for attempt {} of task {}",
                msg.attempt(),
                msg.task()
            );
            return None;
        }
        Some(match msg {
            Msg::Started {
                task,
                attempt,
                pid,
                start_time,
            } => Event::AttemptStarted {
                task,
                attempt,
                pid,
                start_time,
            },
            // The attempt's watchdog made its usage monotonic (the one place that does);
            // core's check refuses a decrease all the same.
            Msg::Progress {
                task,
                attempt,
                usage,
            } => Event::AttemptProgress {
                task,
                attempt,
                usage,
            },
            Msg::Stalled { task, attempt } => Event::AttemptStalled { task, attempt },
            Msg::SideEffects { task, attempt } => {
                if self.state.task(task)?.attempts.last()?.side_effects {
                    return None;
                }
                Event::AttemptSideEffects { task, attempt }
            }
            Msg::Finished {
                task,
                attempt,
                outcome,
                usage,
                output,
            } => Event::AttemptFinished {
                task,
                attempt,
                outcome,
                usage,
                output,
            },
            // Handled before: activity is shown, not journaled.
            Msg::Activity { .. } => return None,
            Msg::Handle {
                task,
                attempt,
                handle,
            } => Event::AttemptHandle {
                task,
                attempt,
                handle,
            },
            Msg::Read {
                task,
                attempt,
                offset,
            } => {
                let placed = self.state.task(task)?.live_attempt()?.placed.as_deref()?;
                if offset <= placed.read {
                    return None;
                }
                Event::AttemptRead {
                    task,
                    attempt,
                    offset,
                }
            }
            // #13: once per attempt (an adopted attempt's reader names it again).
            Msg::Session {
                task,
                attempt,
                session,
            } => {
                if self.state.task(task)?.attempts.last()?.session.is_some() {
                    return None;
                }
                Event::AttemptSession {
                    task,
                    attempt,
                    session,
                }
            }
        })
    }
}

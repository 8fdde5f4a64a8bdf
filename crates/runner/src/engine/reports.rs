//! Attempt reports become events: a batch of reports in arrival order, in as few writes as
//! the fencing allows (see `Engine::handle`); reports of an attempt that is not live any more
//! are dropped (fencing).

use std::collections::HashMap;

use sortie_core::{Attempt, Event, TaskId};

use super::Engine;
use crate::Result;
use crate::attempt::Msg;

impl Engine {
    /// Turns attempt reports into events, a round (one write, `commit`) at a time. A round may
    /// hold several reports of one task (`check_round` checks each against the task's record
    /// as the earlier ones leave it: an attempt's start and end share a write), but a report
    /// that follows the end of its task's attempt, or a second `SideEffects`, `Session` or
    /// `Read` of it, goes to a later round: whether it becomes an event at all (`event_for`'s
    /// fencing, once-only and forward-only checks) is read from the state the earlier ones
    /// made. A task's reports keep their order; the rounds are as few as that allows.
    pub(super) fn handle(&mut self, msgs: Vec<Msg>) -> Result<()> {
        let rounds = cut_rounds(msgs);
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

/// Cuts a batch of reports into rounds (see `Engine::handle`).
fn cut_rounds(msgs: Vec<Msg>) -> Vec<Vec<Msg>> {
    /// Where a task's next report goes: its round, and the reports that round holds
    /// that `event_for` judges against the state.
    #[derive(Default)]
    struct Slot {
        round: usize,
        side_effects: bool,
        session: bool,
        read: bool,
    }
    let mut rounds: Vec<Vec<Msg>> = Vec::new();
    let mut slots: HashMap<TaskId, Slot> = HashMap::new();
    for msg in msgs {
        let slot = slots.entry(msg.task()).or_default();
        let flag = match &msg {
            Msg::SideEffects { .. } => Some(&mut slot.side_effects),
            Msg::Session { .. } => Some(&mut slot.session),
            Msg::Read { .. } => Some(&mut slot.read),
            _ => None,
        };
        if let Some(flag) = flag {
            if *flag {
                *slot = Slot {
                    round: slot.round + 1,
                    ..Slot::default()
                };
            }
            match &msg {
                Msg::SideEffects { .. } => slot.side_effects = true,
                Msg::Session { .. } => slot.session = true,
                _ => slot.read = true,
            }
        }
        while rounds.len() <= slot.round {
            rounds.push(Vec::new());
        }
        let ends = matches!(msg, Msg::Finished { .. });
        rounds[slot.round].push(msg);
        if ends {
            *slot = Slot {
                round: slot.round + 1,
                ..Slot::default()
            };
        }
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use sortie_core::{AttemptOutcome, Usage};

    const A: TaskId = TaskId(0);
    const B: TaskId = TaskId(1);

    fn started(task: TaskId) -> Msg {
        Msg::Started {
            task,
            attempt: Attempt(1),
            pid: 1,
            start_time: 1,
        }
    }

    fn finished(task: TaskId) -> Msg {
        Msg::Finished {
            task,
            attempt: Attempt(1),
            outcome: AttemptOutcome::completed(),
            usage: Usage::ZERO,
            output: String::new(),
        }
    }

    fn side_effects(task: TaskId) -> Msg {
        Msg::SideEffects {
            task,
            attempt: Attempt(1),
        }
    }

    fn read(task: TaskId, offset: u64) -> Msg {
        Msg::Read {
            task,
            attempt: Attempt(1),
            offset,
        }
    }

    /// What each round holds: (task, report name).
    fn shape(rounds: &[Vec<Msg>]) -> Vec<Vec<(u32, &'static str)>> {
        rounds
            .iter()
            .map(|r| {
                r.iter()
                    .map(|m| {
                        let name = match m {
                            Msg::Started { .. } => "started",
                            Msg::Finished { .. } => "finished",
                            Msg::SideEffects { .. } => "side_effects",
                            Msg::Read { .. } => "read",
                            _ => "other",
                        };
                        (m.task().0, name)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn an_attempts_start_and_end_share_a_round() {
        let rounds = cut_rounds(vec![started(A), started(B), finished(A), finished(B)]);
        assert_eq!(
            shape(&rounds),
            vec![vec![
                (0, "started"),
                (1, "started"),
                (0, "finished"),
                (1, "finished")
            ]]
        );
    }

    #[test]
    fn a_report_after_its_attempts_end_or_a_second_once_only_report_waits_a_round() {
        let rounds = cut_rounds(vec![
            side_effects(A),
            read(A, 10),
            started(B),
            side_effects(A),
            read(A, 20),
            finished(B),
            started(B),
            finished(A),
        ]);
        assert_eq!(
            shape(&rounds),
            vec![
                vec![
                    (0, "side_effects"),
                    (0, "read"),
                    (1, "started"),
                    (1, "finished")
                ],
                vec![
                    (0, "side_effects"),
                    (0, "read"),
                    (1, "started"),
                    (0, "finished")
                ],
            ]
        );
    }
}

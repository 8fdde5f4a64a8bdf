//! Attempt reports become events: a task's reports in arrival order, one round for each task's
//! first report of the batch, one for each task's second, and so on (an attempt's start and
//! end share one); reports of an attempt that is not live any more are dropped (fencing). The
//! rounds are appended pending and made durable by the write of the round planned from them
//! ([`Engine::commit_pending`]); the reports that arrived while the loop was busy join the
//! write of the round it planned ([`Engine::commit_with_reports`]).

use std::collections::{HashMap, HashSet};

use sortie_core::{Attempt, Event, TaskId};

use super::Engine;
use crate::Result;
use crate::attempt::Msg;
use crate::clock::now;

/// What the transcripts' cutter is told once a round is durable: an `AttemptRead`'s offset
/// acknowledged, or (`None`) the attempt finished.
pub(super) type Told = Vec<(TaskId, Attempt, Option<u64>)>;

impl Engine {
    /// Turns attempt reports into events, a round at a time: the k-th round holds each task's
    /// k-th report, in arrival order (whether a report becomes an event at all, `event_for`'s
    /// fencing and once-only checks, is read from the state the earlier rounds made), except
    /// that an attempt's `Finished` right after its `Started` shares its round (`check_round`
    /// checks it against the task's record as the start leaves it). A task's reports keep
    /// their order. The rounds are appended pending (`commit_pending`): the round the loop
    /// plans from them next makes them durable in its own write, and nothing outside the loop
    /// learns of them before.
    pub(super) fn handle(&mut self, msgs: Vec<Msg>) -> Result<()> {
        let rounds = cut_rounds(msgs);
        for round in rounds {
            let events = self.report_events(round);
            let told = self.told(&events);
            self.commit_pending(events, told)?;
        }
        Ok(())
    }

    /// Group commit of a planned round with the reports waiting in the loop's queue: the
    /// first round of those reports (as `handle` cuts them) joins the planned events' one
    /// durable write, after them, when none of them is of a task the planned events are of
    /// (a task the round ends or launches has no live attempt to report: its reports are
    /// stale, and wait) and the round holds task events only; `check_round` checks the whole,
    /// as if each event were checked and applied in turn (else the two parts are committed
    /// one after the other). Every event is still durable before it is applied, and before
    /// the effects the planned round announces start. Returns the reports left for `handle`
    /// (later rounds, and those of the planned round's tasks), in their order.
    pub(super) fn commit_with_reports(&mut self, planned: Vec<Event>) -> Result<Vec<Msg>> {
        let mut msgs = Vec::new();
        while let Ok(m) = self.rx.try_recv() {
            msgs.push(m);
        }
        let task_events = planned
            .iter()
            .all(|e| !matches!(e, Event::Control { .. }) && e.task().is_some());
        if msgs.is_empty() || planned.is_empty() || !task_events {
            self.commit(planned)?;
            return Ok(msgs);
        }
        let touched: HashSet<TaskId> = planned.iter().filter_map(Event::task).collect();
        let (first, rest) = split_joining(&touched, msgs);
        let reports = self.report_events(first);
        if reports.is_empty() {
            self.commit(planned)?;
            return Ok(rest);
        }
        let told = self.told(&reports);
        let split = planned.len();
        let mut events = planned;
        events.extend(reports);
        let at = now();
        if self.state.check_round(at, &events).is_ok() {
            self.append_apply(at, events)?;
        } else {
            let reports = events.split_off(split);
            self.commit(events)?;
            self.commit(reports)?;
        }
        self.tell(told);
        Ok(rest)
    }

    /// The events of one round of reports (activity goes to the observer; an attempt's
    /// `Finished` ends its count as live).
    fn report_events(&mut self, round: Vec<Msg>) -> Vec<Event> {
        let mut events: Vec<Event> = Vec::with_capacity(round.len());
        for msg in round {
            let task = msg.task();
            if let Msg::Finished { .. } | Msg::Orphaned { .. } = msg {
                self.live.remove(&task);
            }
            // #33: a check's verdict is its last report.
            if let Msg::Verified { .. } = msg {
                self.checks.remove(&task);
            }
            if let Msg::Finished { outcome, .. } = &msg
                && sortie_core::decide::stops_the_run(
                    outcome,
                    self.stopping,
                    outcome.stop_reason == sortie_core::StopReason::Interrupted
                        && crate::layout::attempt::disk_full(self.run_dir.path()),
                )
            {
                tracing::warn!(
                    "stopping the run: {}; free space, then resume it",
                    outcome
                        .error
                        .as_deref()
                        .unwrap_or("its output could not be written")
                );
                self.stop_all(sortie_core::plan::Stopping::Interrupt);
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
            // #34: a sandboxed attempt's connections, journaled just before its end.
            if let Msg::Finished { task, attempt, .. } = &msg
                && let Some(net) = self.sandbox_net(*task, *attempt)
            {
                events.push(net);
            }
            if let Some(event) = self.event_for(msg) {
                events.push(event);
            }
        }
        events
    }

    /// What the transcripts' cutter is to be told of `round` once it is durable (#10): each
    /// `AttemptRead` in it acknowledged (`transcript::write_read`: only once the journal holds it
    /// may the cutter cut below its offset), and the files of each placed attempt that
    /// finished in it cut to the cap (`transcript::trim_ended`: the journal holds its whole stream
    /// now). An offset in the same block as the one journaled before it is not written again
    /// (`transcript::ack_moves`: the cutter reads an acknowledgement in whole blocks, so it would
    /// cut nothing more); a skipped one only ever makes the cutter wait, never cut unread bytes.
    fn told(&self, round: &[Event]) -> Told {
        round
            .iter()
            .filter_map(|e| match e {
                Event::AttemptRead {
                    task,
                    attempt,
                    offset,
                } => {
                    let before = self.journaled_read(*task, *attempt);
                    crate::transcript::ack_moves(before, *offset).then_some((
                        *task,
                        *attempt,
                        Some(*offset),
                    ))
                }
                Event::AttemptFinished { task, attempt, .. } => Some((*task, *attempt, None)),
                _ => None,
            })
            .collect()
    }

    /// Tells the cutter what `told` holds (its round is durable).
    pub(super) fn tell(&self, told: Told) {
        for (task, attempt, read) in told {
            let Some(record) = self.state.task(task) else {
                continue;
            };
            let placed = record.attempts.iter().rev().find(|a| a.attempt == attempt);
            let Some(placed) = placed.and_then(|a| a.placed.as_deref()) else {
                continue;
            };
            let dir = placed.dir();
            let dir = std::path::Path::new(&dir);
            match read {
                Some(offset) => {
                    let stdout = crate::executor::attempt_files(placed.executor(), dir).stdout;
                    if let Err(e) = crate::transcript::write_read(&stdout, offset) {
                        tracing::debug!("cannot acknowledge {}: {e}", stdout.display());
                    }
                }
                None => crate::transcript::trim_ended(dir),
            }
        }
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

    /// #34: the `SandboxNet` of a sandboxed attempt whose wrapper recorded connections (its
    /// `net.jsonl`, folded by core), when it is news; a line that does not read is skipped,
    /// named in the log.
    pub(super) fn sandbox_net(&self, task: TaskId, attempt: Attempt) -> Option<Event> {
        let file = self.run_dir.sandbox_net(task.0, attempt.0);
        let text = std::fs::read_to_string(&file).ok()?;
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            match serde_json::from_str::<sortie_core::sandbox_net::Connection>(line) {
                Ok(c) => records.push(c),
                // The last line of a helper killed mid-write.
                Err(e) => tracing::warn!("{}:{}: skipped: {e}", file.display(), i + 1),
            }
        }
        let event = Event::SandboxNet {
            task,
            attempt,
            flows: sortie_core::sandbox_net::fold(&records),
        };
        self.state.report_is_news(&event).then_some(event)
    }

    /// The event an attempt's report becomes, when it is news to the state (core's
    /// [`RunState::report_is_news`](sortie_core::RunState::report_is_news): a report of an
    /// attempt that is not live anymore is fenced off, a once-only fact or a read offset that
    /// does not move is dropped).
    fn event_for(&self, msg: Msg) -> Option<Event> {
        let event = report_event(msg)?;
        if !self.state.report_is_news(&event) {
            tracing::debug!(
                "dropping a report ({}) of attempt {:?} of task {:?}",
                event.name(),
                event.attempt(),
                event.task()
            );
            return None;
        }
        Some(event)
    }
}

/// The event an attempt's report would be journaled as (activity is shown, never journaled).
fn report_event(msg: Msg) -> Option<Event> {
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
        // The attempt's watchdog made its usage monotonic (the one place that does); core's
        // check refuses a decrease all the same.
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
        Msg::SideEffects { task, attempt } => Event::AttemptSideEffects { task, attempt },
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
        Msg::Orphaned {
            task,
            attempt,
            action,
        } => Event::AttemptOrphaned {
            task,
            attempt,
            action,
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
        } => Event::AttemptRead {
            task,
            attempt,
            offset,
        },
        Msg::Waiting { task, attempt } => Event::AttemptWaiting { task, attempt },
        // #33: the check's verdict; an interrupted check has none (resume runs it again).
        Msg::Verified {
            task,
            attempt,
            verdict,
        } => Event::VerifyEnded {
            task,
            attempt,
            verdict: verdict?,
        },
        // #13: once per attempt (an adopted attempt's reader names it again).
        Msg::Session {
            task,
            attempt,
            session,
        } => Event::AttemptSession {
            task,
            attempt,
            session,
        },
    })
}

/// Whether `msgs` are all attempts' starts (see `STARTS_LINGER`; none: false).
pub(super) fn only_starts(msgs: &[Msg]) -> bool {
    !msgs.is_empty() && msgs.iter().all(|m| matches!(m, Msg::Started { .. }))
}

/// Cuts a batch of reports into rounds (see `Engine::handle`): the k-th round holds each
/// task's k-th report, in arrival order, except that an attempt's `Finished` right after its
/// `Started` joins its round, and so does a `Read` right after a `Progress`: the journal then
/// never holds a usage checkpoint without the read offset it was taken at, which is what a
/// resume rebuilds a cut transcript's usage from (see `attempt::run`).
fn cut_rounds(msgs: Vec<Msg>) -> Vec<Vec<Msg>> {
    let mut rounds: Vec<Vec<Msg>> = Vec::new();
    // Per task: the round of its last report, and the report after which the next one may
    // join that round.
    let mut last: HashMap<TaskId, (usize, Joins)> = HashMap::new();
    for msg in msgs {
        let joins = match msg {
            Msg::Started { .. } => Joins::Finished,
            Msg::Progress { .. } => Joins::Read,
            _ => Joins::Nothing,
        };
        let round = match last.get(&msg.task()) {
            None => 0,
            Some((k, Joins::Finished)) if matches!(msg, Msg::Finished { .. }) => *k,
            Some((k, Joins::Read)) if matches!(msg, Msg::Read { .. }) => *k,
            Some((k, _)) => k + 1,
        };
        last.insert(msg.task(), (round, joins));
        while rounds.len() <= round {
            rounds.push(Vec::new());
        }
        rounds[round].push(msg);
    }
    rounds
}

/// The reports that join a planned round's write (the first round `cut_rounds` makes of those
/// not of a task in `touched`, the planned round's tasks), and the rest, in their order: a
/// task's reports either all wait or keep their order across the two.
fn split_joining(touched: &HashSet<TaskId>, msgs: Vec<Msg>) -> (Vec<Msg>, Vec<Msg>) {
    let (mut rest, free): (Vec<Msg>, Vec<Msg>) =
        msgs.into_iter().partition(|m| touched.contains(&m.task()));
    let mut rounds = cut_rounds(free).into_iter();
    let first = rounds.next().unwrap_or_default();
    rest.extend(rounds.flatten());
    (first, rest)
}

/// Which report of the same task may join the round of the one before it.
#[derive(Clone, Copy)]
enum Joins {
    Finished,
    Read,
    Nothing,
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

    fn progress(task: TaskId) -> Msg {
        Msg::Progress {
            task,
            attempt: Attempt(1),
            usage: Usage::ZERO,
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
                            Msg::Progress { .. } => "progress",
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
    fn only_starts_linger() {
        assert!(only_starts(&[started(A), started(B)]));
        assert!(!only_starts(&[started(A), finished(A)]));
        assert!(!only_starts(&[read(B, 10)]));
        assert!(!only_starts(&[]));
    }

    #[test]
    fn reports_join_a_planned_round_unless_of_its_tasks() {
        const C: TaskId = TaskId(2);
        let touched: HashSet<TaskId> = [C].into_iter().collect();
        let (first, rest) = split_joining(
            &touched,
            vec![
                started(A),
                finished(C),
                side_effects(B),
                finished(A),
                read(B, 10),
                started(C),
            ],
        );
        // A's start and end join; B's first report joins, its second waits; C's all wait.
        assert_eq!(
            shape(&[first]),
            vec![vec![(0, "started"), (1, "side_effects"), (0, "finished")]]
        );
        assert_eq!(
            shape(&[rest]),
            vec![vec![(2, "finished"), (2, "started"), (1, "read")]]
        );
    }

    #[test]
    fn other_reports_of_a_task_go_one_per_round() {
        let rounds = cut_rounds(vec![
            side_effects(A),
            read(A, 10),
            started(B),
            finished(B),
            started(B),
            finished(A),
        ]);
        assert_eq!(
            shape(&rounds),
            vec![
                vec![(0, "side_effects"), (1, "started"), (1, "finished")],
                vec![(0, "read"), (1, "started")],
                vec![(0, "finished")],
            ]
        );
    }

    /// A usage checkpoint and the read offset it was taken at go in one write: a crash between
    /// two writes would leave a checkpoint past the journaled offset, and a resume whose
    /// transcript was cut below that offset would count the lines between twice.
    #[test]
    fn a_checkpoint_and_its_read_offset_share_a_round() {
        let rounds = cut_rounds(vec![
            progress(A),
            read(A, 10),
            progress(B),
            side_effects(B),
            read(B, 20),
            read(A, 30),
        ]);
        assert_eq!(
            shape(&rounds),
            vec![
                vec![(0, "progress"), (0, "read"), (1, "progress")],
                vec![(1, "side_effects"), (0, "read")],
                vec![(1, "read")],
            ]
        );
    }
}

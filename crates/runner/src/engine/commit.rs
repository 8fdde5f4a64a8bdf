//! The one path for state changes (check every event, append them in one write, then apply
//! them in order and tell the planner; the observer hears of them once they are durable, which
//! a round's write makes them before it returns, and a round of reports' at the latest with
//! the round planned from them), and the run index it keeps.

use sortie_core::{Event, RunStatus, Seq, Stamped};

use super::Engine;
use super::reports::Told;
use crate::clock::now;
use crate::layout::index;
use crate::{Error, Result};

/// How many events, at most, between two high-water marks (and index updates) of a live run.
/// A mark costs two small atomic file writes (temp, fsync, rename), about a millisecond each
/// here, so even a run appending thousands of events a second spends well under 1% on them.
const MARK_EVERY_EVENTS: u64 = 4096;
/// Events between two snapshots of the run's state (at least; a run of more tasks than four
/// times this snapshots every quarter as many events as it has tasks). A resume, `status` and
/// the board read the newest snapshot and the tail after it, so the cadence bounds that tail.
/// Measured on the 100,000-task run (`scale_bench`, 2026-12-02): a snapshot every 100,000
/// events left a tail of 96,033 events at the crash and `status` 0.394 s, resume to its first
/// spawn 0.475 s; every 25,000, a tail of 21,033, 0.339 s and 0.374 s. Its writer pays 16
/// snapshots instead of 4 over its 496,033 events: 1.6 s instead of 0.55 s (about half of it
/// sled's reopen after every other one): 1.05 s more over a run that took 124 s (README), <1%.
const SNAPSHOT_EVERY_EVENTS: u64 = 16_384;
/// How many events a run of `tasks` tasks appends between two snapshots of its state (see
/// [`SNAPSHOT_EVERY_EVENTS`]); the scale benchmark writes its crashed run at this cadence too.
pub fn snapshot_every(tasks: usize) -> u64 {
    SNAPSHOT_EVERY_EVENTS.max(tasks as u64 / 4)
}

/// How long, at most, between two marks while events are appended.
const MARK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl Engine {
    /// Checks the events as a round (`RunState::check_round`: as if each were checked, then
    /// applied, in order; a round may hold several events of one task), appends them all
    /// durably in one write, then applies them in order.
    pub(super) fn commit(&mut self, events: Vec<Event>) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let at = now();
        self.state.check_round(at, &events)?;
        self.append_apply(at, events)
    }

    /// Appends a round that `check_round` accepted at `at` in one durable write (which also
    /// makes the pending rounds before it durable: they are acknowledged first, in order),
    /// then applies its events in order and tells the planner and the observer.
    pub(super) fn append_apply(
        &mut self,
        at: sortie_core::Timestamp,
        events: Vec<Event>,
    ) -> Result<()> {
        // On the loop's own thread: the append is a flush and an `fdatasync` of a few hundred
        // microseconds, shorter than handing it to another thread and waking this one again.
        let first = self
            .journal
            .append_all_at(at, &events)
            .map_err(|e| self.journal_error(e))?;
        self.acknowledge();
        for (i, event) in events.into_iter().enumerate() {
            let stamped = self.apply_one(first, i, at, event)?;
            self.observe(&stamped);
        }
        self.mark_if_due();
        Ok(())
    }

    /// Checks a round of attempt reports and appends it without waiting for it to be durable,
    /// then applies it: the planner plans from it at once, and the round it plans is written
    /// with it in one durable write. Nothing outside the loop learns of it before it is
    /// durable: the observer (the display, the `--on-task-end` hook), the transcripts' cutter
    /// (`told`), the mark and the index wait for the next durable commit or
    /// [`Engine::settle`], and so does every effect, which only a durable commit's round
    /// announces.
    pub(super) fn commit_pending(&mut self, events: Vec<Event>, told: Told) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let at = now();
        self.state.check_round(at, &events)?;
        let first = self
            .journal
            .append_pending_at(at, &events)
            .map_err(|e| self.journal_error(e))?;
        for (i, event) in events.into_iter().enumerate() {
            let stamped = self.apply_one(first, i, at, event)?;
            self.unsettled.push(stamped);
        }
        self.untold.extend(told);
        Ok(())
    }

    /// Makes the pending rounds durable (see [`Engine::commit_pending`]) and acknowledges them.
    pub(super) fn settle(&mut self) -> Result<()> {
        if self.unsettled.is_empty() && self.untold.is_empty() {
            return Ok(());
        }
        self.journal.settle().map_err(|e| self.journal_error(e))?;
        self.acknowledge();
        self.mark_if_due();
        Ok(())
    }

    /// Tells the observer and the transcripts' cutter of the pending rounds, now durable.
    fn acknowledge(&mut self) {
        for stamped in std::mem::take(&mut self.unsettled) {
            self.observe(&stamped);
        }
        let told = std::mem::take(&mut self.untold);
        self.tell(told);
    }

    /// Applies the `i`-th event of a round appended from `first`, and shows it to the planner.
    fn apply_one(
        &mut self,
        first: Seq,
        i: usize,
        at: sortie_core::Timestamp,
        event: Event,
    ) -> Result<Stamped> {
        let stamped = Stamped {
            seq: Seq(first.0 + i as u64),
            at,
            event,
        };
        self.state.apply(&stamped)?;
        if let Event::TaskFinished { task, .. } = &stamped.event {
            self.setup_failed.remove(task);
        }
        self.planner.observe(&self.state, &stamped.event);
        Ok(stamped)
    }

    /// Tells the observer of a durable event, after running the task-end hook of a task it
    /// ends.
    fn observe(&mut self, stamped: &Stamped) {
        if let Event::TaskFinished { task, result } = &stamped.event {
            self.task_end_hook(*task, result);
        }
        self.observer.event(&self.state, stamped);
        self.pause_after.1 |= self.pause_after.0.as_deref() == Some(stamped.event.name());
    }

    /// A mark (and an index update) when enough events or time went by since the last.
    fn mark_if_due(&mut self) {
        let (marked, when) = self.marked;
        if self.state.next_seq.0.saturating_sub(marked) >= MARK_EVERY_EVENTS
            || when.elapsed() >= MARK_EVERY
        {
            self.update_index();
        }
    }

    /// A failed append or presence check, naming the run and its journal.
    pub(super) fn journal_error(&self, source: sortie_journal::Error) -> Error {
        Error::JournalWrite {
            run: self.run_id.clone(),
            path: self.run_dir.journal(),
            source,
        }
    }

    /// Writes the journal's high-water mark beside it (`sortie_journal::Mark`) and brings the
    /// run's index entry up to date with the state and the mark (`sortie list` reads it, never
    /// a journal). The index only speeds up `list`; the journal stays the truth, and the two
    /// copies of the mark are how a journal that lost acknowledged records shows it.
    pub(super) fn update_index(&mut self) {
        let journal = &self.journal;
        // A snapshot (which carries the mark) every so many events and at the end of a run;
        // the mark alone otherwise.
        let ended = matches!(
            self.state.status,
            RunStatus::Finished { .. } | RunStatus::Interrupted { .. }
        );
        let every = snapshot_every(self.state.tasks.len());
        let snapshot = ended || self.state.next_seq.0.saturating_sub(self.snapshotted) >= every;
        let state = &self.state;
        let written = if snapshot {
            journal.write_snapshot(state)
        } else {
            journal.write_mark()
        };
        let mark = match written {
            Ok(mark) => mark,
            Err(e) => {
                tracing::warn!("could not write the journal's high-water mark: {e}");
                None
            }
        };
        if snapshot && mark.is_some() {
            self.snapshotted = self.state.next_seq.0;
            super::release_memory();
        }
        self.marked = (
            mark.map_or(self.marked.0, |m| m.records),
            std::time::Instant::now(),
        );
        if let Err(e) = index::record(&self.state_dir, &self.run_id, &self.state, mark, now()) {
            tracing::warn!("could not update the run index: {e}");
        }
    }
}

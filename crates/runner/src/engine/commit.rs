//! The one path for state changes (check every event, append them durably in one write, then
//! apply them in order and tell the planner and the observer), and the run index it keeps.

use std::sync::Arc;

use sortie_core::{Event, Seq, Stamped, Timestamp};

use super::Engine;
use crate::clock::now;
use crate::layout::index;
use crate::{Error, Result};

impl Engine {
    /// Checks every event against the state, appends them all durably in one write, then
    /// applies them in order. A round holds at most one event per task, so checking them all
    /// against the state before the first applies is sound.
    pub(super) fn commit(&mut self, events: Vec<Event>) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        for e in &events {
            self.state.check(e)?;
        }
        let at = now();
        let stamped_events: Vec<(Timestamp, Event)> = events.into_iter().map(|e| (at, e)).collect();
        let journal = Arc::clone(&self.journal);
        let first = tokio::task::block_in_place(|| journal.append_all(&stamped_events))
            .map_err(|e| self.journal_error(e))?;
        for (i, (at, event)) in stamped_events.into_iter().enumerate() {
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
            self.observer.event(&self.state, &stamped);
            self.pause_after.1 |= self.pause_after.0.as_deref() == Some(stamped.event.name());
        }
        Ok(())
    }

    /// A failed append or presence check, naming the run and its journal.
    pub(super) fn journal_error(&self, source: sortie_journal::Error) -> Error {
        Error::JournalWrite {
            run: self.run_id.clone(),
            path: self.run_dir.journal(),
            source,
        }
    }

    /// Brings the run's index entry up to date with the state (`sortie list` reads it, never
    /// a journal). The index only speeds up `list`; the journal stays the truth.
    pub(super) fn update_index(&self) {
        if let Err(e) = index::record(&self.state_dir, &self.run_id, &self.state, now()) {
            tracing::warn!("could not update the run index: {e}");
        }
    }
}

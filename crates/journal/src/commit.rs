//! Group commit: appends insert under one lock, in seq order, and share flushes.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sortie_core::{Event, Seq, Timestamp};

use crate::journal::{Journal, lock};
use crate::{Error, Result, codec};

/// What "durable" means for an append: what it survives once it has returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// A sled flush: the record is in the operating system's hands, so it survives the sortie
    /// process dying in any way (SIGKILL, panic, OOM). A power loss or kernel crash may lose
    /// up to about a second of appends (sled `fsync`s in the background once a second).
    /// Cheap: tens of microseconds per flush.
    #[default]
    Flush,
    /// A sled flush followed by `fdatasync` of the log: survives a power loss too. Costs a disk
    /// round trip per flush (milliseconds), which group commit shares between appenders.
    Sync,
}

/// The longest a flusher waits for writers to join its flush (see `Journal::wait_durable`).
const MAX_LINGER: Duration = Duration::from_millis(1);

/// What an insert did.
enum Inserted {
    /// No events: the next seq.
    Nothing(u64),
    /// The last seq inserted.
    UpTo(u64),
}

/// Group commit bookkeeping.
#[derive(Default)]
pub(crate) struct Commit {
    /// A thread is flushing (or about to) now.
    flushing: bool,
    /// Parked threads waiting for a flush to cover their seq.
    waiters: Vec<Waiter>,
    /// How many threads were inside `wait_durable` when the last flush ended: the writers
    /// that are likely to append again right away.
    active: u32,
    /// How long the last flush took.
    last_flush: Duration,
    /// The flusher, while it waits for writers to join its flush.
    lingerer: Option<std::thread::Thread>,
}

/// A thread parked in `wait_durable`.
struct Waiter {
    /// The last seq it appended.
    seq: u64,
    /// The thread, to unpark.
    thread: std::thread::Thread,
}

impl Journal {
    /// Appends one event and returns its seq once it is durable.
    pub fn append(&self, at: Timestamp, event: &Event) -> Result<Seq> {
        self.append_iter(std::iter::once((at, event)))
    }

    /// Appends events in order, all durable on return after a single flush; returns the seq of
    /// the first (the next seq when `events` is empty).
    pub fn append_all(&self, events: &[(Timestamp, Event)]) -> Result<Seq> {
        self.append_iter(events.iter().map(|(at, e)| (*at, e)))
    }

    /// [`Journal::append_all`] of events that all happened at `at`: the caller keeps its
    /// events as they are (a round of 100,000 `TaskQueued` paired with their time was a second
    /// copy of them, 25 MB).
    pub fn append_all_at(&self, at: Timestamp, events: &[Event]) -> Result<Seq> {
        self.append_iter(events.iter().map(|e| (at, e)))
    }

    /// [`Journal::append_all_at`] without waiting for the events to be durable: they are
    /// inserted in order, and the next durable append (or [`Journal::settle`]) covers them.
    /// Until then the caller must let nothing outside it act on them: a crash loses them, and
    /// nothing may have been done that only they would explain. Returns the seq of the first.
    pub fn append_pending_at(&self, at: Timestamp, events: &[Event]) -> Result<Seq> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let count = events.len() as u64;
        Ok(match self.insert(events.iter().map(|e| (at, e)))? {
            Inserted::Nothing(next) => Seq(next),
            Inserted::UpTo(last) => Seq(last + 1 - count),
        })
    }

    /// Returns once every event appended so far is durable (at once when they are).
    pub fn settle(&self) -> Result<()> {
        match self.inserted.load(Ordering::Acquire).checked_sub(1) {
            Some(last) => self.wait_durable(last),
            None => Ok(()),
        }
    }

    fn append_iter<'e>(
        &self,
        events: impl ExactSizeIterator<Item = (Timestamp, &'e Event)>,
    ) -> Result<Seq> {
        let count = events.len() as u64;
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let last = match self.insert(events)? {
            Inserted::Nothing(next) => return Ok(Seq(next)),
            Inserted::UpTo(last) => last,
        };
        self.wait_durable(last)?;
        Ok(Seq(last + 1 - count))
    }

    /// Encodes and inserts events under the writer lock, so that keys enter sled in seq order.
    fn insert<'e>(
        &self,
        events: impl ExactSizeIterator<Item = (Timestamp, &'e Event)>,
    ) -> Result<Inserted> {
        {
            let mut next = lock(&self.writer);
            let first = *next;
            let mut encoded = Vec::with_capacity(events.len());
            for (i, (at, event)) in (first..).zip(events) {
                let bytes =
                    codec::encode(Seq(i), at, event).map_err(|reason| Error::Unstorable {
                        event: event.name(),
                        reason,
                    })?;
                encoded.push(bytes);
            }
            if encoded.is_empty() {
                return Ok(Inserted::Nothing(first));
            }
            for bytes in encoded {
                self.store.insert(*next, bytes)?;
                *next += 1;
                self.inserted.store(*next, Ordering::Release);
            }
            Ok(Inserted::UpTo(*next - 1))
        }
    }

    /// Returns once `seq` is durable, flushing if no flush that covers it is under way.
    ///
    /// Group commit: a writer that finds no flush under way becomes the flusher for every
    /// record inserted when its flush starts; the others park until a flush covers them. The
    /// flusher then unparks exactly the writers it covered (they return without taking a lock)
    /// and hands the lead to one writer it did not cover, if any.
    ///
    /// Before flushing, the flusher lingers until as many writers wait as did at the end of the
    /// last flush (at most as long as that flush took, and never over 1 ms): the writers the
    /// last flush released are appending again, and would otherwise start the next flush with
    /// half a batch, splitting the writers into two alternating groups. A lone writer never
    /// lingers.
    fn wait_durable(&self, seq: u64) -> Result<()> {
        if self.durable.load(Ordering::Acquire) > seq {
            return Ok(());
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let result = self.wait_or_flush(seq);
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        result
    }

    fn wait_or_flush(&self, seq: u64) -> Result<()> {
        let me = std::thread::current();
        let mut c = lock(&self.commit);
        if let Some(flusher) = &c.lingerer
            && self.waiting.load(Ordering::Acquire) >= c.active
        {
            flusher.unpark();
        }
        loop {
            if self.durable.load(Ordering::Acquire) > seq {
                return Ok(());
            }
            if c.flushing {
                c.waiters.push(Waiter {
                    seq,
                    thread: me.clone(),
                });
                drop(c);
                std::thread::park();
                if self.durable.load(Ordering::Acquire) > seq {
                    return Ok(()); // the flusher removed our entry
                }
                // Handed the lead, or woken spuriously (then our entry is still listed).
                c = lock(&self.commit);
                c.waiters.retain(|w| w.thread.id() != me.id());
                continue;
            }
            c.flushing = true;
            let until = Instant::now() + c.last_flush.min(MAX_LINGER);
            while self.waiting.load(Ordering::Acquire) < c.active {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                c.lingerer = Some(me.clone());
                drop(c);
                std::thread::park_timeout(until - now);
                c = lock(&self.commit);
                c.lingerer = None;
            }
            let target = self.inserted.load(Ordering::Acquire);
            drop(c);
            let started = Instant::now();
            let mut flushed = self.store.flush();
            if flushed.is_ok() && self.sync.load(Ordering::Relaxed) {
                flushed = self.store.sync_data();
            }
            if flushed.is_ok() {
                // Written to a file no name reaches any more is not durable.
                flushed = self.store.check_linked();
            }
            self.flushes.fetch_add(1, Ordering::Relaxed);
            c = lock(&self.commit);
            c.flushing = false;
            c.last_flush = started.elapsed();
            c.active = self.waiting.load(Ordering::Acquire);
            if flushed.is_ok() {
                self.durable.fetch_max(target, Ordering::AcqRel);
            }
            let durable = self.durable.load(Ordering::Acquire);
            let mut next = None;
            c.waiters.retain(|w| {
                if w.seq < durable {
                    w.thread.unpark();
                    false
                } else if next.is_none() {
                    next = Some(w.thread.clone());
                    false
                } else {
                    true
                }
            });
            if let Some(t) = next {
                t.unpark();
            }
            // Our own record was inserted before `target` was read: covered, unless the flush
            // failed (then the next leader retries for the others).
            return flushed;
        }
    }
}

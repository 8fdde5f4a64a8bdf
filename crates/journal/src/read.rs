//! Reading: the checked iterator, replay, and the two-thread scan behind replay and audit.

use sortie_core::{RunState, Seq, Stamped};

use crate::journal::Journal;
use crate::{Error, Result, codec, store};

impl Journal {
    /// Reads records `from..=to` (`to` = None: to the end), each checked: key, stored seq and
    /// expected seq agree, version and CRC hold, the payload decodes. The iterator stops after
    /// the first error.
    pub fn read(&self, from: Seq, to: Option<Seq>) -> impl Iterator<Item = Result<Stamped>> + '_ {
        Reader {
            inner: Box::new(self.store.range(from.0)),
            checker: Checker { expected: from.0 },
            to: to.map(|s| s.0),
            done: false,
        }
    }

    /// The state as of `upto` inclusive (None: every record), folded through
    /// `RunState::apply`. A bad record is an error naming its seq.
    pub fn replay(&self, upto: Option<Seq>) -> Result<RunState> {
        self.replay_onto(RunState::new(), upto)
    }

    /// Folds the records from `state.next_seq` up to `upto` inclusive onto `state`.
    pub(crate) fn replay_onto(&self, mut state: RunState, upto: Option<Seq>) -> Result<RunState> {
        let mut failure = None;
        self.scan_from(state.next_seq, upto, |record| {
            fold_one(&mut state, record, &mut failure)
        });
        match failure {
            Some(e) => Err(e),
            None => Ok(state),
        }
    }

    /// Calls `f` with every checked record from seq 0 up to `upto` inclusive, in order, until
    /// `f` returns false or a record is bad (`f` sees that error, then the scan stops).
    ///
    /// sled's iteration costs about as much as decoding and applying together (its leaves hold
    /// 16 items, so a scan loads a page every few records). So the key space is cut into
    /// chunks (1/8 of the journal, 1024 to 32768 records), dealt alternately to two threads
    /// that scan, check and decode them, while this thread applies the records in order: both
    /// cores stay busy, each scanner working a chunk ahead while the other's is applied. Each
    /// scanner runs at most 64 batches (of up to 1024 records or 64 KiB) ahead, ~15 MB of
    /// decoded records. Without threads, it all runs here.
    pub(crate) fn scan(&self, upto: Option<Seq>, f: impl FnMut(Result<Stamped>) -> bool) {
        self.scan_from(Seq(0), upto, f);
    }

    /// [`Journal::scan`] from seq `from` on (the tail after a snapshot).
    pub(crate) fn scan_from(
        &self,
        from: Seq,
        upto: Option<Seq>,
        mut f: impl FnMut(Result<Stamped>) -> bool,
    ) {
        const DEPTH: usize = 64;
        const SCANNERS: u64 = 2;
        let from = from.0;
        let to = upto.map(|s| s.0);
        let known = self.next_seq().0;
        let end = to.map_or(known, |t| t.saturating_add(1).min(known));
        let span = end.saturating_sub(from);
        let chunk = (span / 8).clamp(1024, 32768);
        // Chunk i covers keys [from + i * chunk, from + (i + 1) * chunk); the last one runs to
        // `upto` (or to the very end, stray keys included).
        let chunks = span.div_ceil(chunk).max(1);
        let bounds = move |i: u64| {
            let until = if i + 1 == chunks {
                to.map(|t| t.saturating_add(1))
            } else {
                Some(from + (i + 1) * chunk)
            };
            (from + i * chunk, until)
        };
        let expected = std::cell::Cell::new(from);
        // Checks continuity across chunks and feeds `f`; false once the scan must stop.
        let mut feed = |item: Result<Stamped>| -> bool {
            let item = item.and_then(|s| {
                if s.seq.0 == expected.get() {
                    Ok(s)
                } else {
                    Err(Error::Corrupt {
                        seq: Seq(expected.get()),
                        reason: format!("missing: the next record is seq {}", s.seq),
                    })
                }
            });
            let ok = item.is_ok();
            expected.set(expected.get() + u64::from(ok));
            f(item) && ok
        };
        std::thread::scope(|scope| {
            let mut scanners = Vec::new();
            for first in 0..SCANNERS.min(chunks) {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Result<Stamped>>>(DEPTH);
                // Emptied batches go back to the scanner: a batch is ~200 KiB, and allocating
                // it in one thread and freeing it in another costs glibc an mmap, page faults
                // and a heap consolidation per batch.
                let (back, recycled) = std::sync::mpsc::channel::<Vec<Result<Stamped>>>();
                let spawned = std::thread::Builder::new()
                    .name("journal-scan".into())
                    .spawn_scoped(scope, move || {
                        for i in (first..chunks).step_by(SCANNERS as usize) {
                            let (from, until) = bounds(i);
                            let mut go = true;
                            let mut failed = false;
                            self.produce(
                                from,
                                until,
                                |batch| {
                                    failed = batch.last().is_some_and(Result::is_err);
                                    go = tx.send(batch).is_ok();
                                    go
                                },
                                || recycled.try_recv().unwrap_or_default(),
                            );
                            // An empty batch ends the chunk.
                            if !go || failed || tx.send(Vec::new()).is_err() {
                                return;
                            }
                        }
                    });
                match spawned {
                    Ok(_) => scanners.push((rx, back)),
                    Err(_) => break,
                }
            }
            if scanners.len() as u64 != SCANNERS.min(chunks) {
                scanners.clear(); // the scanners' next send fails and they stop
            }
            if scanners.is_empty() {
                // No thread: scan everything here.
                for i in 0..chunks {
                    let (from, until) = bounds(i);
                    let mut go = true;
                    self.produce(
                        from,
                        until,
                        |batch| {
                            go = batch.into_iter().all(&mut feed);
                            go
                        },
                        Vec::new,
                    );
                    if !go {
                        return;
                    }
                }
            } else {
                let n = scanners.len() as u64;
                for i in 0..chunks {
                    let Some((rx, back)) =
                        usize::try_from(i % n).ok().and_then(|k| scanners.get(k))
                    else {
                        return;
                    };
                    // Until the chunk's end marker (or the scanner stopped).
                    while let Ok(mut batch) = rx.recv() {
                        if batch.is_empty() {
                            break;
                        }
                        for item in batch.drain(..) {
                            if !feed(item) {
                                return; // drops the receivers: the scanners stop
                            }
                        }
                        let _ = back.send(batch);
                    }
                }
            }
            // Records this handle appended (or found at open) that are gone.
            if expected.get() < end {
                feed(Err(Error::Corrupt {
                    seq: Seq(expected.get()),
                    reason: format!("missing: the journal holds {end} records"),
                }));
            }
        });
    }

    /// Scans, checks and decodes the records with keys in `from..until` (`until` = None: to the
    /// end, garbage keys included), handing them to `send` in batches (vectors from `empty`),
    /// in order, until `send` returns false or a record is bad (the batch with the error is
    /// the last).
    fn produce(
        &self,
        from: u64,
        until: Option<u64>,
        mut send: impl FnMut(Vec<Result<Stamped>>) -> bool,
        mut empty: impl FnMut() -> Vec<Result<Stamped>>,
    ) {
        const BATCH: usize = 1024;
        const BATCH_BYTES: usize = 64 << 10;
        let limit = until.map(store::key);
        let mut checker = Checker { expected: from };
        let mut next_batch = || {
            let mut batch = empty();
            batch.reserve(BATCH);
            batch
        };
        let mut batch = next_batch();
        let mut bytes = 0;
        for raw in self.store.range(from) {
            if let (Ok(r), Some(limit)) = (&raw, &limit)
                && r.key() >= limit.as_slice()
            {
                break;
            }
            bytes += raw.as_ref().map_or(0, |r| r.value().len());
            let item = raw.and_then(|r| checker.check(&r));
            let failed = item.is_err();
            batch.push(item);
            if batch.len() == BATCH || bytes >= BATCH_BYTES || failed {
                bytes = 0;
                let full = std::mem::replace(&mut batch, next_batch());
                if !send(full) || failed {
                    return;
                }
            }
        }
        if !batch.is_empty() {
            send(batch);
        }
    }
}

/// Checks raw records in order: key, stored seq and expected seq agree, the record decodes.
struct Checker {
    expected: u64,
}

impl Checker {
    #[inline(always)]
    fn check(&mut self, raw: &store::RawRecord) -> Result<Stamped> {
        let seq = Seq(self.expected);
        let corrupt = |reason: String| Error::Corrupt { seq, reason };
        let Some(key) = store::seq_of_key(raw.key()) else {
            return Err(corrupt(format!(
                "a key of {} bytes follows seq {}",
                raw.key().len(),
                self.expected.wrapping_sub(1)
            )));
        };
        if key != self.expected {
            return Err(corrupt(format!("missing: the next record is seq {key}")));
        }
        let stamped = codec::decode(raw.value()).map_err(corrupt)?;
        if stamped.seq != seq {
            return Err(corrupt(format!(
                "the record under key {key} says it is seq {}",
                stamped.seq
            )));
        }
        self.expected += 1;
        Ok(stamped)
    }
}

/// The checked iterator behind [`Journal::read`].
struct Reader<'a> {
    inner: Box<dyn Iterator<Item = Result<store::RawRecord>> + 'a>,
    checker: Checker,
    to: Option<u64>,
    done: bool,
}

impl Iterator for Reader<'_> {
    type Item = Result<Stamped>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.to.is_some_and(|to| self.checker.expected > to) {
            return None;
        }
        let item = match self.inner.next()? {
            Ok(raw) => self.checker.check(&raw),
            Err(e) => Err(e),
        };
        self.done = item.is_err();
        Some(item)
    }
}

/// Applies one scanned record onto `state`: true to go on; false once the record is bad or
/// does not apply, its error kept in `failure` (the scan stops there).
pub(crate) fn fold_one(
    state: &mut RunState,
    record: Result<Stamped>,
    failure: &mut Option<Error>,
) -> bool {
    let applied = record.and_then(|r| {
        let seq = r.seq;
        state
            .apply_owned(r)
            .map_err(|violation| Error::Violation { seq, violation })
    });
    match applied {
        Ok(()) => true,
        Err(e) => {
            *failure = Some(e);
            false
        }
    }
}

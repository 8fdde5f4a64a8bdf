//! Snapshots: the run's state at a seq, written beside the journal, so that a reader starts
//! from the newest valid one and replays only the tail.
//!
//! A snapshot is a cache of the fold, never a source of truth: `audit` and `replay --at` still
//! fold from seq 0 (and `audit` checks that the snapshot equals the fold). It lives in
//! `<run-dir>/journal.snapshot` (the one before it in `journal.snapshot.1`), written atomically
//! (temp file, fsync, rename) by the run's owner, and is
//!
//! `[magic "sortie-snapshot\n"][version u8][schema u64][records u64][digest u32][len u64]`
//! `[crc u32][payload]`,
//!
//! all little-endian, where the payload is the bincode (serde) encoding of `RunState` after
//! `records` records, `digest` the CRC-32 of the stored bytes of the last of them (so the
//! snapshot carries the journal's high-water mark too: see `mark`), and the CRC covers everything
//! before it and the payload. `schema` is the build's fingerprint of core's source and the lock
//! file (`build.rs`): a snapshot written by other code is ignored, never misread, so fields that
//! other changes add to `RunState` or `TaskSpec` cannot be decoded into the wrong place.
//!
//! A snapshot that does not check out (bad CRC, other schema, more records than the journal
//! holds, a last record whose digest differs: stale, or of another journal) is ignored with a
//! warning, and the older one or a full fold is used instead.

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sortie_core::{RunState, Seq};

use crate::journal::Journal;
use crate::mark::{Mark, digest, private_file};
use crate::{Error, Result};

const MAGIC: &[u8; 16] = b"sortie-snapshot\n";
const VERSION: u8 = 1;
/// Bytes before the payload.
const HEADER: usize = 16 + 1 + 8 + 8 + 4 + 8 + 4;
/// How many records sled's log must have grown by since sled last opened it before a snapshot
/// reopens the database (see `Store::reopen`): an open reads ~32,768 records of log in about
/// as long as a reopen waits for sled's threads to let go of its lock.
const REOPEN_AFTER: u64 = 32_768;
/// The largest payload decoded (a 100,000-task state is tens of megabytes).
const MAX_PAYLOAD: usize = 1 << 30;

/// This build's schema fingerprint.
fn schema() -> u64 {
    u64::from_str_radix(env!("SORTIE_SNAPSHOT_SCHEMA"), 16).unwrap_or(0)
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_PAYLOAD>()
}

/// The newest snapshot of a run, and the one before it.
fn paths(run_dir: &Path) -> [PathBuf; 2] {
    [
        run_dir.join("journal.snapshot"),
        run_dir.join("journal.snapshot.1"),
    ]
}

fn crc(header: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header);
    h.update(payload);
    h.finalize()
}

/// Encodes a snapshot of `state`, taken at `mark`, into memory (see [`write_to`]).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn encode(mark: Mark, state: &RunState) -> Result<Vec<u8>> {
    let out = write_to(std::io::Cursor::new(Vec::new()), mark, state)
        .map_err(|e| e.into_error(Path::new("memory")))?;
    Ok(out.into_inner())
}

/// Why [`write_to`] failed: the writer's error, or the state's encoding.
pub(crate) enum WriteError {
    Io(std::io::Error),
    Encode(String),
}

impl WriteError {
    fn into_error(self, path: &Path) -> Error {
        match self {
            WriteError::Io(source) => Error::Io {
                path: path.to_owned(),
                source,
            },
            WriteError::Encode(reason) => Error::Unstorable {
                event: "snapshot",
                reason,
            },
        }
    }
}

/// A writer that counts and checksums what passes through it.
struct Summing<W> {
    inner: W,
    crc: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        let done = buf.get(..n).unwrap_or_default();
        self.crc.update(done);
        self.len += done.len() as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a snapshot of `state`, taken at `mark`, to `out` from its start: the payload is
/// streamed after room left for the header, then the header is written over that room. A
/// 100,000-task state encodes to tens of megabytes, which the run never holds whole in memory.
pub(crate) fn write_to<W: Write + Seek>(
    mut out: W,
    mark: Mark,
    state: &RunState,
) -> std::result::Result<W, WriteError> {
    out.write_all(&[0u8; HEADER]).map_err(WriteError::Io)?;
    let summing = Summing {
        inner: out,
        crc: crc32fast::Hasher::new(),
        len: 0,
    };
    let mut body = std::io::BufWriter::with_capacity(64 << 10, summing);
    bincode::serde::encode_into_std_write(state, &mut body, config()).map_err(|e| match e {
        bincode::error::EncodeError::Io { inner, .. } => WriteError::Io(inner),
        other => WriteError::Encode(other.to_string()),
    })?;
    let Summing {
        inner: mut out,
        crc: payload,
        len,
    } = body
        .into_inner()
        .map_err(|e| WriteError::Io(e.into_error()))?;
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.push(VERSION);
    header.extend_from_slice(&schema().to_le_bytes());
    header.extend_from_slice(&mark.records.to_le_bytes());
    header.extend_from_slice(&mark.digest.to_le_bytes());
    header.extend_from_slice(&len.to_le_bytes());
    let mut check = crc32fast::Hasher::new();
    check.update(&header);
    check.combine(&payload);
    header.extend_from_slice(&check.finalize().to_le_bytes());
    out.seek(SeekFrom::Start(0)).map_err(WriteError::Io)?;
    out.write_all(&header).map_err(WriteError::Io)?;
    Ok(out)
}

/// Decodes a snapshot, or says why it cannot be trusted.
pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<(Mark, RunState), String> {
    fn take<const N: usize>(b: &mut &[u8]) -> std::result::Result<[u8; N], String> {
        let (head, rest) = b
            .split_first_chunk::<N>()
            .ok_or_else(|| "it is cut short".to_owned())?;
        *b = rest;
        Ok(*head)
    }
    let mut b = bytes;
    if take::<16>(&mut b)? != *MAGIC {
        return Err("it is not a snapshot".into());
    }
    let [version] = take::<1>(&mut b)?;
    if version != VERSION {
        return Err(format!(
            "its version is {version}, this build reads {VERSION}"
        ));
    }
    let written_by = u64::from_le_bytes(take::<8>(&mut b)?);
    let records = u64::from_le_bytes(take::<8>(&mut b)?);
    let digest = u32::from_le_bytes(take::<4>(&mut b)?);
    let len = u64::from_le_bytes(take::<8>(&mut b)?);
    let stored = u32::from_le_bytes(take::<4>(&mut b)?);
    if usize::try_from(len).ok() != Some(b.len()) {
        return Err(format!("it says {len} bytes but holds {}", b.len()));
    }
    let header = bytes.get(..HEADER - 4).unwrap_or_default();
    if crc(header, b) != stored {
        return Err("its checksum does not match".into());
    }
    if written_by != schema() {
        return Err("it was written by another build of sortie".into());
    }
    let (state, read): (RunState, usize) = bincode::serde::decode_from_slice(b, config())
        .map_err(|e| format!("it does not decode: {e}"))?;
    if read != b.len() || state.next_seq.0 != records {
        return Err("it does not decode to the state it names".into());
    }
    Ok((Mark { records, digest }, state))
}

/// A run's newest snapshot, read and decoded on a thread of its own from the moment it is
/// started: [`Journal::replay_latest_from`] scans the tail after the seq its header names
/// meanwhile, and applies the tail once the decoded state checks out against the journal.
/// Dropped unused, its thread finishes on its own.
pub struct Prefetch {
    /// The mark the newest snapshot's header names (None: no snapshot, or not one).
    mark: Option<Mark>,
    /// Its decoding.
    decoding: Option<std::thread::JoinHandle<std::result::Result<(Mark, RunState), String>>>,
}

impl Prefetch {
    /// Starts reading and decoding the newest snapshot of the run in `run_dir`.
    pub fn start(run_dir: &Path) -> Prefetch {
        let [newest, _] = paths(run_dir);
        let mark = read_header(&newest).and_then(|h| peek(&h));
        let decoding = mark.and_then(|_| {
            std::thread::Builder::new()
                .name("snapshot-decode".into())
                .spawn(move || {
                    let bytes = fs::read(&newest).map_err(|e| e.to_string())?;
                    decode(&bytes)
                })
                .ok()
        });
        Prefetch { mark, decoding }
    }
}

/// The first [`HEADER`] bytes of a file, if it has as many.
fn read_header(path: &Path) -> Option<[u8; HEADER]> {
    use std::io::Read;
    let mut header = [0u8; HEADER];
    fs::File::open(path).ok()?.read_exact(&mut header).ok()?;
    Some(header)
}

/// The mark a snapshot's header names, without checking the rest: enough to start reading
/// the tail after it while [`decode`] checks the whole.
fn peek(bytes: &[u8]) -> Option<Mark> {
    let at = |from: usize| bytes.get(from..from + 8).and_then(|b| b.try_into().ok());
    if bytes.get(..16)? != MAGIC || *bytes.get(16)? != VERSION {
        return None;
    }
    let records = u64::from_le_bytes(at(25)?);
    let digest = u32::from_le_bytes(bytes.get(33..37)?.try_into().ok()?);
    Some(Mark { records, digest })
}

impl Journal {
    /// Writes a snapshot of `state`, the state after the first `state.next_seq` records of
    /// this journal, all durable (the run's owner calls this between appends, with the state
    /// after every record), then the journal's high-water mark (see `mark`). The previous
    /// snapshot is kept as the older one. Then, once the log grew by [`REOPEN_AFTER`] records
    /// since sled opened it, sled's database is closed and opened again, so that sled writes
    /// the snapshot of its own page table (see `Store::reopen`); a reopen
    /// that fails leaves the journal unable to append (the run stops, resumable). Returns the
    /// high-water mark (None: an empty journal).
    pub fn write_snapshot(&self, state: &RunState) -> Result<Option<Mark>> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let Some(high) = self.high_water()? else {
            return Ok(None);
        };
        let records = state.next_seq.0;
        let at = match records.checked_sub(1) {
            _ if records > high.records => None,
            None => Some(Mark { records, digest: 0 }),
            Some(last) => self.store.get(last)?.map(|b| Mark {
                records,
                digest: digest(&b),
            }),
        };
        let Some(at) = at else {
            return Err(Error::Unstorable {
                event: "snapshot",
                reason: format!(
                    "the state is after {records} records, the journal holds {}",
                    high.records
                ),
            });
        };
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let [newest, older] = paths(&self.run_dir);
        let tmp = self.run_dir.join(format!(
            ".journal.snapshot.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        let result = (|| {
            let f = private_file(&tmp).map_err(io(&tmp))?;
            let f = write_to(f, at, state).map_err(|e| e.into_error(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
            match fs::rename(&newest, &older) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&older)(e)),
            }
            fs::rename(&tmp, &newest).map_err(io(&newest))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result?;
        if let Ok(d) = fs::File::open(&self.run_dir) {
            let _ = d.sync_all();
        }
        high.write(&self.run_dir)?;
        self.reopen_if_grown()?;
        Ok(Some(high))
    }

    /// Closes and opens sled's database again once its log grew by [`REOPEN_AFTER`] records
    /// since sled last opened it: sled writes the snapshot of its own page table only when it
    /// opens a database, and the next open (a resume after a crash, a reader's copy) then
    /// reads only the log after this point instead of all of it (see `Store::reopen`). Not for
    /// a short log: reading it costs an open less than the reopen does. [`Journal::write_snapshot`]
    /// calls it; the run's owner also calls it just before it appends the run's last event, so
    /// that the reopen's memory is not added to that of the last event (a 100,000-task run's
    /// summary) and the snapshot after it has nothing left to reopen. Returns whether it
    /// reopened; a reopen that fails leaves the journal unable to append.
    pub fn reopen_if_grown(&self) -> Result<bool> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let records = self.next_seq().0;
        if records.saturating_sub(self.opened_at.load(Ordering::Relaxed)) < REOPEN_AFTER {
            return Ok(false);
        }
        self.store.reopen(crate::journal::WRITER_PATIENCE)?;
        self.opened_at.store(records, Ordering::Relaxed);
        Ok(true)
    }

    /// The newest snapshot that checks out against this journal (see the module docs), with
    /// the mark it was taken at; the ones that do not are said with a warning.
    pub fn snapshot(&self) -> Option<(Mark, RunState)> {
        let held = self.next_seq().0;
        for path in paths(&self.run_dir) {
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    tracing::warn!("ignoring snapshot {}: {e}", path.display());
                    continue;
                }
            };
            let checked = decode(&bytes).and_then(|(mark, state)| {
                if mark.records > held {
                    // A reader's copy of a live run can be older than the snapshot written
                    // since (a journal that lost records is refused by its mark at open).
                    tracing::debug!(
                        "passing over snapshot {}: it is after {} records, the journal holds                          {held}",
                        path.display(),
                        mark.records
                    );
                    return Ok(None);
                }
                let last = mark.records.checked_sub(1).map(|s| self.store.get(s));
                match last {
                    Some(Ok(Some(b))) if digest(&b) == mark.digest => Ok(Some((mark, state))),
                    None => Ok(Some((mark, state))),
                    _ => Err("the journal's record at its seq differs (stale)".into()),
                }
            });
            match checked {
                Ok(Some(found)) => return Some(found),
                Ok(None) => {}
                Err(why) => tracing::warn!("ignoring snapshot {}: {why}", path.display()),
            }
        }
        None
    }

    /// The state after every record, from the newest valid snapshot and the records after it
    /// (the whole journal when there is none). A tail that does not apply onto the snapshot
    /// (a snapshot that decoded but is wrong) is said with a warning and the whole journal is
    /// folded instead; a bad record is an error naming its seq, as for [`Journal::replay`].
    ///
    /// The newest snapshot is decoded on a thread of its own while the tail after the seq its
    /// header names is scanned and decoded (see [`Journal::scan`]): a 100,000-task state takes
    /// about as long to decode as a tail of as many records to read. The tail is applied once
    /// the snapshot checks out; one that does not is dropped with its tail, and the
    /// one-by-one way below (the older snapshot, or the whole journal) is taken.
    pub fn replay_latest(&self) -> Result<RunState> {
        self.replay_latest_from(Prefetch::start(&self.run_dir))
    }

    /// [`Journal::replay_latest`] from a snapshot whose decoding started before this journal
    /// was opened (sled's open of a big journal takes a while too): `prefetch` must be of this
    /// journal's run directory.
    pub fn replay_latest_from(&self, prefetch: Prefetch) -> Result<RunState> {
        match self.replay_newest(prefetch) {
            Some(done) => done,
            None => self.replay_latest_in_turn(),
        }
    }

    /// [`Journal::replay_latest`] from the newest snapshot, decoded while its tail is read;
    /// None when that snapshot is missing or does not check out (its warning left to the
    /// fallback, which reads it again).
    fn replay_newest(&self, prefetch: Prefetch) -> Option<Result<RunState>> {
        let Prefetch { mark, decoding } = prefetch;
        let mark = mark?;
        if mark.records > self.next_seq().0 || !self.ends_at(mark) {
            return None;
        }
        let mut decoding = decoding;
        let mut take = || -> Option<RunState> {
            match decoding.take()?.join() {
                Ok(Ok((m, state))) if m == mark => Some(state),
                _ => None,
            }
        };
        let mut state = None;
        let mut unusable = false;
        let mut failure = None;
        self.scan_from(Seq(mark.records), None, |record| {
            if state.is_none() {
                state = take();
            }
            let Some(state) = state.as_mut() else {
                unusable = true;
                return false;
            };
            crate::read::fold_one(state, record, &mut failure)
        });
        if state.is_none() && !unusable {
            state = take();
        }
        match (state, failure) {
            (None, _) => None,
            (Some(_), Some(Error::Violation { seq, violation })) => {
                tracing::warn!(
                    "ignoring the snapshot after {} records: the record at seq {seq} does not \
                     apply onto it ({violation}); replaying the whole journal",
                    mark.records
                );
                Some(self.replay(None))
            }
            (Some(_), Some(e)) => Some(Err(e)),
            (Some(state), None) => Some(Ok(state)),
        }
    }

    /// True when the journal's record before `mark.records` is the one the mark names.
    fn ends_at(&self, mark: Mark) -> bool {
        match mark.records.checked_sub(1).map(|s| self.store.get(s)) {
            None => true,
            Some(Ok(Some(b))) => digest(&b) == mark.digest,
            Some(_) => false,
        }
    }

    /// [`Journal::replay_latest`] one step after the other: the newest snapshot that checks
    /// out (older ones too, each that does not said with a warning), then its tail.
    fn replay_latest_in_turn(&self) -> Result<RunState> {
        let Some((mark, state)) = self.snapshot() else {
            return self.replay(None);
        };
        match self.replay_onto(state, None) {
            Ok(state) => Ok(state),
            Err(Error::Violation { seq, violation }) => {
                tracing::warn!(
                    "ignoring the snapshot after {} records: the record at seq {seq} does not \
                     apply onto it ({violation}); replaying the whole journal",
                    mark.records
                );
                self.replay(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// The newest of a run's snapshots that decodes (checksum, schema), without checking it
/// against a journal: salvage wants it even when the records it follows are lost.
pub(crate) fn newest_decodable(run_dir: &Path) -> Option<(Mark, RunState)> {
    paths(run_dir)
        .iter()
        .find_map(|p| fs::read(p).ok().and_then(|b| decode(&b).ok()))
}

/// Removes a run's snapshots (a recovered journal starts without them).
pub fn remove_snapshots(run_dir: &Path) -> Result<()> {
    for path in paths(run_dir) {
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path, source }),
        }
    }
    Ok(())
}

/// Where a run's snapshots are, newest first.
pub fn snapshot_paths(run_dir: &Path) -> [PathBuf; 2] {
    paths(run_dir)
}

/// Checks a snapshot equals the state folded to the same seq: `Some(why)` when it does not.
pub(crate) fn differs(snapshot: &RunState, folded: &RunState) -> Option<String> {
    (snapshot != folded).then(|| {
        format!(
            "the snapshot after {} records differs from the journal folded to that seq",
            snapshot.next_seq
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_round_trips_and_any_flipped_byte_is_refused() {
        let state = RunState::new();
        let mark = Mark {
            records: 0,
            digest: 7,
        };
        let bytes = encode(mark, &state).unwrap();
        assert_eq!(decode(&bytes).unwrap(), (mark, state));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "flip in byte {i} went unseen");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&vec![0u8; bytes.len()]).is_err());
        assert!(decode(&[]).is_err());
    }
}

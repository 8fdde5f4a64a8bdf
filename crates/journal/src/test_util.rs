//! Test hooks (the `test-util` feature): raw access to a journal's records, to corrupt them in
//! tests and measure the storage engine in benchmarks, and the fuzz targets' entry points. Not
//! a stable API, and not in a default build.

use std::path::Path;
use std::sync::atomic::Ordering;

use sortie_core::Seq;

use crate::journal::Journal;
use crate::{Error, Result};

impl Journal {
    /// The raw bytes of a record (for tests and forensic tools).
    pub fn raw_get(&self, seq: Seq) -> Result<Option<Vec<u8>>> {
        self.store.get(seq.0)
    }

    /// Overwrites the raw bytes stored under a key, without a flush (to corrupt journals in tests).
    pub fn raw_put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.store.put_raw(key, value)
    }

    /// Removes a raw key, without a flush (to corrupt journals in tests).
    pub fn raw_remove(&self, key: &[u8]) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        self.store.remove_raw(key)
    }

    /// How many flushes this handle has made (group commit makes it fewer than appends).
    pub fn flush_count(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Iterates every raw record without decoding it; returns how many there are and their
    /// total size (for benchmarks: the storage engine's share of a replay).
    pub fn raw_scan(&self) -> Result<(u64, u64)> {
        let (mut n, mut bytes) = (0, 0);
        for r in self.store.range(0) {
            let r = r?;
            n += 1;
            bytes += r.value().len() as u64;
        }
        Ok((n, bytes))
    }

    /// The sled directory, for diagnostics.
    pub fn db_path(&self) -> &Path {
        self.store.path()
    }
}

/// Entry points for the fuzz targets (`fuzz/`, `cargo xtask fuzz`): the record codec, which is
/// otherwise private. Not a stable API.
pub mod fuzzing {
    use sortie_core::{Event, Seq, Stamped, Timestamp};

    /// Decodes one stored record (version, CRC, payload) as a replay would.
    pub fn decode_record(bytes: &[u8]) -> Result<Stamped, String> {
        crate::codec::decode(bytes)
    }

    /// Frames `payload` with this build's version byte and the payload's correct CRC, so that
    /// arbitrary payloads reach the bincode decoder instead of stopping at the checksum.
    pub fn frame(payload: &[u8]) -> Vec<u8> {
        crate::codec::frame(payload)
    }

    /// Encodes one record as an append would.
    pub fn encode_record(seq: Seq, at: Timestamp, event: &Event) -> Result<Vec<u8>, String> {
        crate::codec::encode(seq, at, event)
    }

    /// Encodes a snapshot of `state` as `Journal::write_snapshot` would (with a zero digest).
    pub fn encode_snapshot(state: &sortie_core::RunState) -> Result<Vec<u8>, String> {
        let mark = crate::Mark {
            records: state.next_seq.0,
            digest: 0,
        };
        crate::snapshot::encode(mark, state).map_err(|e| e.to_string())
    }

    /// Decodes a snapshot as a reader would (checksum, version, schema, payload).
    pub fn decode_snapshot(bytes: &[u8]) -> Result<sortie_core::RunState, String> {
        crate::snapshot::decode(bytes).map(|(_, state)| state)
    }
}

//! The export format: one record as `sortie export` prints it, a JSON object per line.
//!
//! It is the journal's own v1 schema (`stored`), not core's serde derive: renaming a field of
//! core's event cannot change what users parse. `{"v":1,"seq":N,"at":MS,"event":{"Kind":{..}}}`,
//! the names as core spelled them when v1 was frozen; `tests/export.rs` pins it to a committed
//! file. Format v2's `{v1, ext}` pairs print as one object with the fields of both, and its
//! `...V2` variants keep their v1 names (`stored::v2`), so a v2 record exports as its v1 record
//! plus the fields added since: the export format only grows (new kinds, new fields), and `v`
//! stays 1 while it does.

use serde::Serialize;
use sortie_core::Stamped;

use crate::stored::StoredEvent;

/// The version of the export format, the `v` of every record.
pub const EXPORT_VERSION: u32 = 1;

/// One record in the export format (serialize it with serde, e.g. `serde_json::to_writer`).
#[derive(Debug, Clone, Serialize)]
pub struct ExportRecord {
    /// [`EXPORT_VERSION`].
    v: u32,
    /// The record's seq.
    seq: u64,
    /// Milliseconds since the Unix epoch.
    at: u64,
    /// The event, externally tagged by its kind.
    event: StoredEvent,
}

impl From<&Stamped> for ExportRecord {
    fn from(s: &Stamped) -> Self {
        ExportRecord {
            v: EXPORT_VERSION,
            seq: s.seq.0,
            at: s.at.0,
            event: StoredEvent::from(&s.event),
        }
    }
}

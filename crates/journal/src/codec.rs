//! The record codec: the only module that knows bincode.
//!
//! A record is `[version: u8][crc: u32 big-endian][payload]`, where the CRC-32 (crc32fast) covers
//! the version byte and the payload, and the payload is a bincode 2 (`config::standard()`, serde)
//! encoding of [`RecordV1`]: the seq, the timestamp and the [`StoredEvent`]. Decoding never
//! panics, whatever the bytes: every failure is a reason string that the caller turns into
//! `Error::Corrupt` naming the seq.

use bincode::config::{Config, standard};
use sortie_core::{Event, Seq, Stamped, Timestamp};

use crate::stored::{RecordV1, StoredEvent};

/// The format version written by this build.
pub(crate) const FORMAT_V1: u8 = 1;

/// Bytes before the payload: the version and the CRC.
const HEADER: usize = 5;

/// The largest payload accepted. Decoding is bounded by it, so that a corrupt length prefix can
/// never ask for more memory than this.
pub(crate) const MAX_PAYLOAD: usize = 256 << 20;

fn config() -> impl Config {
    standard().with_limit::<MAX_PAYLOAD>()
}

fn checksum(version: u8, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&[version]);
    h.update(payload);
    h.finalize()
}

/// Encodes one record.
pub(crate) fn encode(seq: Seq, at: Timestamp, event: &Event) -> Result<Vec<u8>, String> {
    let record = RecordV1 {
        seq: seq.0,
        at: at.0,
        event: StoredEvent::to_write(event),
    };
    let mut out = vec![FORMAT_V1, 0, 0, 0, 0];
    bincode::serde::encode_into_std_write(&record, &mut out, config())
        .map_err(|e| format!("cannot encode {}: {e}", event.name()))?;
    if out.len() - HEADER > MAX_PAYLOAD {
        return Err(format!(
            "{} encodes to {} bytes, more than the {MAX_PAYLOAD} a record may hold",
            event.name(),
            out.len() - HEADER
        ));
    }
    let crc = checksum(FORMAT_V1, &out[HEADER..]);
    out[1..HEADER].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

/// Frames a payload: this build's version byte and the payload's CRC before it (for the fuzz
/// targets, which must get past the checksum to reach the decoder).
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(FORMAT_V1);
    out.extend_from_slice(&checksum(FORMAT_V1, payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Decodes one record, checking its version and CRC. The returned seq is the one stored in the
/// record; the caller compares it with the key.
#[inline(always)]
pub(crate) fn decode(bytes: &[u8]) -> Result<Stamped, String> {
    let (&version, rest) = bytes
        .split_first()
        .ok_or_else(|| "empty record".to_owned())?;
    if version != FORMAT_V1 {
        return Err(format!(
            "unknown format version {version} (this build reads {FORMAT_V1})"
        ));
    }
    let (crc, payload) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| format!("record of {} bytes is too short", bytes.len()))?;
    let stored_crc = u32::from_be_bytes(*crc);
    let actual = checksum(version, payload);
    if stored_crc != actual {
        return Err(format!(
            "checksum mismatch (stored {stored_crc:08x}, computed {actual:08x})"
        ));
    }
    let (record, read): (RecordV1, usize) = bincode::serde::decode_from_slice(payload, config())
        .map_err(|e| format!("undecodable payload: {e}"))?;
    if read != payload.len() {
        return Err(format!(
            "{} trailing bytes after the payload",
            payload.len() - read
        ));
    }
    let event = Event::try_from(record.event)?;
    Ok(Stamped {
        seq: Seq(record.seq),
        at: Timestamp(record.at),
        event,
    })
}

/// The records framed in `bytes` wherever they lie (a damaged log's raw file, which sled no
/// longer reads past its damage): every offset holding this build's version byte is tried, and
/// what decodes with a matching CRC is a record. Bounded: a claimed length beyond the bytes
/// left is refused before anything is allocated for it.
pub(crate) fn scan(bytes: &[u8]) -> Vec<Stamped> {
    let mut found = Vec::new();
    let mut i = 0;
    while i + HEADER < bytes.len() {
        if bytes[i] != FORMAT_V1 {
            i += 1;
            continue;
        }
        match scan_at(&bytes[i..]) {
            Some((record, len)) => {
                found.push(record);
                i += len;
            }
            None => i += 1,
        }
    }
    found
}

/// The record framed at the start of `bytes`, and its length, if one is.
fn scan_at(bytes: &[u8]) -> Option<(Stamped, usize)> {
    let crc = u32::from_be_bytes(*bytes.get(1..HEADER)?.first_chunk::<4>()?);
    let payload = bytes.get(HEADER..)?;
    // Most records are small: a garbled length is refused by the small limit first, and the
    // large one is only tried when the bytes left could hold what it claims.
    let small = standard().with_limit::<{ 64 << 10 }>();
    let (record, read): (RecordV1, usize) = match bincode::serde::decode_from_slice(payload, small)
    {
        Ok(r) => r,
        Err(bincode::error::DecodeError::LimitExceeded) if payload.len() > 64 << 10 => {
            bincode::serde::decode_from_slice(payload, config()).ok()?
        }
        Err(_) => return None,
    };
    if checksum(FORMAT_V1, payload.get(..read)?) != crc {
        return None;
    }
    let event = Event::try_from(record.event).ok()?;
    Some((
        Stamped {
            seq: Seq(record.seq),
            at: Timestamp(record.at),
            event,
        },
        HEADER + read,
    ))
}

/// Encodes a growable struct (an extension of format v2, see `stored::v2::Grow`): bincode of its
/// fields in order, with no count, so that a later build may append fields.
pub(crate) fn encode_grow<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, String> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| format!("cannot encode: {e}"))
}

/// Decodes a growable struct written by [`encode_grow`], by this build or an earlier one: the
/// fields an earlier build did not write are missing at the end and take their defaults (the
/// struct must be `#[serde(default)]`). Bytes left over mean fields this build does not know (a
/// newer sortie wrote them): an error, because ignoring a field can change what a task may do.
pub(crate) fn decode_grow<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let mut fields = GrowFields { bytes, read: 0 };
    let value = T::deserialize(GrowDecoder {
        fields: &mut fields,
    })
    .map_err(|e| e.0)?;
    if fields.read != bytes.len() {
        return Err(format!(
            "{} bytes of fields this build does not know (written by a newer sortie?)",
            bytes.len() - fields.read
        ));
    }
    Ok(value)
}

/// A decoding error of [`decode_grow`].
#[derive(Debug)]
struct GrowError(String);

impl std::fmt::Display for GrowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for GrowError {}

impl serde::de::Error for GrowError {
    fn custom<M: std::fmt::Display>(msg: M) -> Self {
        GrowError(msg.to_string())
    }
}

/// The fields of a growable struct, decoded one at a time; the sequence ends with the bytes.
struct GrowFields<'a> {
    bytes: &'a [u8],
    read: usize,
}

/// Hands a struct's visitor the fields as a sequence (bincode's own layout of a struct).
struct GrowDecoder<'f, 'a> {
    fields: &'f mut GrowFields<'a>,
}

impl<'de> serde::Deserializer<'de> for GrowDecoder<'_, 'de> {
    type Error = GrowError;

    fn deserialize_any<V: serde::de::Visitor<'de>>(
        self,
        visitor: V,
    ) -> Result<V::Value, GrowError> {
        visitor.visit_seq(self.fields)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
        ignored_any
    }
}

impl<'de> serde::de::SeqAccess<'de> for GrowFields<'de> {
    type Error = GrowError;

    fn next_element_seed<T: serde::de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, GrowError> {
        let rest = self.bytes.get(self.read..).unwrap_or_default();
        if rest.is_empty() {
            return Ok(None);
        }
        let (value, read) = bincode::serde::seed_decode_from_slice(seed, rest, config())
            .map_err(|e| GrowError(format!("undecodable field: {e}")))?;
        self.read += read;
        Ok(Some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use sortie_core::{Attempt, TaskId};

    fn sample() -> Vec<u8> {
        encode(
            Seq(7),
            Timestamp(1234),
            &Event::AttemptLaunching {
                task: TaskId(3),
                attempt: Attempt(1),
                model: Some("m".into()),
            },
        )
        .unwrap()
    }

    #[test]
    fn round_trips() {
        let s = decode(&sample()).unwrap();
        assert_eq!(
            (s.seq, s.at, s.event.name()),
            (Seq(7), Timestamp(1234), "AttemptLaunching")
        );
    }

    #[test]
    fn a_run_start_is_written_with_its_bodies_shared_and_reads_back_equal() {
        let tasks = (0..4)
            .map(|i| sortie_core::TaskSpec::new(format!("t{i}"), "/w"))
            .collect();
        let batch = sortie_core::spec::Batch {
            tasks,
            agents: sortie_core::spec::AgentProfile::builtins(),
            config: sortie_core::spec::RunConfig::default(),
            source: "b.toml".into(),
        };
        let start = Event::RunStarted {
            run_id: sortie_core::RunId::new("r").unwrap(),
            batch,
            batch_digest: 7,
            host: "h".into(),
            pid: 1,
        };
        let bytes = encode(Seq(0), Timestamp(1), &start).unwrap();
        let (record, _): (RecordV1, usize) =
            bincode::serde::decode_from_slice(&bytes[HEADER..], config()).unwrap();
        assert!(
            matches!(record.event, StoredEvent::RunStartedShared { .. }),
            "{record:?}"
        );
        let back = decode(&bytes).unwrap().event;
        assert_eq!(back, start);
        let Event::RunStarted { batch, .. } = back else {
            unreachable!()
        };
        assert!(std::sync::Arc::ptr_eq(
            &batch.tasks[0].body,
            &batch.tasks[3].body
        ));
    }

    // #32: the scan finds the whole records wherever they lie, among garbage, and skips one
    // whose bytes were damaged; `RunRecovered` round-trips.
    #[test]
    fn the_scan_finds_every_whole_record_among_garbage() {
        let events = [
            Event::TaskQueued { task: TaskId(3) },
            Event::RunRecovered {
                kept: 17,
                scanned: 4,
                lost: Some((17, 40)),
                restored: vec![(TaskId(3), Attempt(2))],
                damaged: "/state/runs/r/damaged/1".into(),
            },
            Event::AttemptLaunching {
                task: TaskId(3),
                attempt: Attempt(1),
                model: Some("m".into()),
            },
        ];
        let mut bytes = vec![1, 0, 0, 0, 0, 1, 9, 9];
        let mut frames = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let frame = encode(Seq(i as u64), Timestamp(i as u64 * 10), e).unwrap();
            frames.push((bytes.len(), frame.len()));
            bytes.extend_from_slice(&frame);
            bytes.extend_from_slice(&[0, 1, 255, 1]);
        }
        let seqs = |b: &[u8]| scan(b).iter().map(|r| r.seq.0).collect::<Vec<_>>();
        assert_eq!(seqs(&bytes), [0, 1, 2]);
        assert_eq!(scan(&bytes)[1].event, events[1]);
        let (at, len) = frames[1];
        bytes[at + len / 2] ^= 0x10;
        assert_eq!(seqs(&bytes), [0, 2]);
        assert!(scan(&[]).is_empty() && scan(&[1; 64]).is_empty());
    }

    // #37: a wait for a machine slot and a discarded worktree round-trip.
    #[test]
    fn the_events_of_issue_37_read_as_written() {
        for e in [
            Event::AttemptWaiting {
                task: TaskId(4),
                attempt: Attempt(2),
            },
            Event::WorktreeDiscarded {
                task: TaskId(5),
                by: sortie_core::DiscardedBy::Gc,
                branch_kept: true,
            },
            Event::WorktreeDiscarded {
                task: TaskId(0),
                by: sortie_core::DiscardedBy::Discard,
                branch_kept: false,
            },
            // #33: a sample its item's pick did not choose.
            Event::WorktreeDiscarded {
                task: TaskId(3),
                by: sortie_core::DiscardedBy::Pick,
                branch_kept: false,
            },
        ] {
            let back = decode(&encode(Seq(7), Timestamp(70), &e).unwrap()).unwrap();
            assert_eq!((back.seq, back.at, back.event), (Seq(7), Timestamp(70), e));
        }
    }

    #[test]
    fn the_strings_read_borrowed_read_as_written_and_refuse_bad_utf8() {
        use sortie_core::AttemptOutcome;
        for model in [
            None,
            Some(String::new()),
            Some("anthropic/claude-é".to_owned()),
        ] {
            let e = Event::AttemptLaunching {
                task: TaskId(1),
                attempt: Attempt(2),
                model,
            };
            assert_eq!(
                decode(&encode(Seq(0), Timestamp(1), &e).unwrap())
                    .unwrap()
                    .event,
                e
            );
        }
        let finished = Event::AttemptFinished {
            task: TaskId(1),
            attempt: Attempt(2),
            outcome: AttemptOutcome::completed(),
            usage: sortie_core::Usage::ZERO,
            output: "done: ünïcode ✓ zzzz".to_owned(),
        };
        let bytes = encode(Seq(0), Timestamp(1), &finished).unwrap();
        assert_eq!(decode(&bytes).unwrap().event, finished);
        // The output's last bytes made invalid UTF-8 (and the record framed anew).
        let mut payload = bytes[HEADER..].to_vec();
        let at = payload.windows(4).position(|w| w == b"zzzz").unwrap();
        payload[at + 3] = 0xff;
        assert!(decode(&frame(&payload)).is_err());
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let good = sample();
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[i] ^= 1 << bit;
                assert!(
                    decode(&bad).is_err(),
                    "flip of bit {bit} in byte {i} went unseen"
                );
            }
        }
        assert!(decode(&good[..good.len() - 1]).is_err());
        assert!(decode(&[]).is_err());
    }

    /// Frames arbitrary bytes with a valid version and CRC, so that they reach bincode.
    fn framed(payload: &[u8]) -> Vec<u8> {
        frame(payload)
    }

    #[test]
    fn huge_length_prefixes_are_refused_not_allocated() {
        // seq, at, variant RunInterrupted (2), then a string length of u64::MAX.
        let payload = [0u8, 0, 2, 253, 255, 255, 255, 255, 255, 255, 255, 255];
        assert!(decode(&framed(&payload)).is_err());
        let payload = [0u8, 0, 2, 252, 0, 0, 0, 64];
        assert!(decode(&framed(&payload)).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn random_payloads_with_a_valid_frame_never_panic(
            payload in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let _ = decode(&framed(&payload));
        }

        #[test]
        fn mutated_records_never_panic(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let mut bytes = sample();
            for (i, b) in flips {
                let i = i.index(bytes.len());
                bytes[i] = b;
            }
            // Re-frame so that the mutated payload reaches bincode.
            let _ = decode(&framed(&bytes[HEADER..]));
        }
    }
}

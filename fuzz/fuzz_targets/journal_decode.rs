//! Fuzz target: decoding a journal record from arbitrary bytes.
//!
//! The input is decoded as stored bytes, and its tail (after the 5-byte header) is decoded again
//! as a payload under a correct frame, so that mutations reach bincode rather than stop at the
//! checksum. Whatever decodes must encode and decode back to the same record.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sortie_journal::fuzzing::{decode_record, encode_record, frame};

fuzz_target!(|data: &[u8]| {
    let _ = decode_record(data);
    let payload = data.get(5..).unwrap_or(data);
    if let Ok(record) = decode_record(&frame(payload)) {
        let bytes =
            encode_record(record.seq, record.at, &record.event).expect("a decoded record encodes");
        let again = decode_record(&bytes).expect("an encoded record decodes");
        assert_eq!(again, record, "a record changed through encode and decode");
    }
});

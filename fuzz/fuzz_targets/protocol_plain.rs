//! Fuzz target: the plain (with its SORTIE_USAGE and SORTIE_ERROR lines) protocol reader fed arbitrary stdout lines, then an arbitrary end.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sortie_core::Protocol;

fuzz_target!(|data: &[u8]| {
    sortie_fuzz::run_reader(Protocol::Plain, data);
});

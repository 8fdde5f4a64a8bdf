//! Fuzz target: the pi --mode json (and pi --mode rpc, the same reader) protocol reader fed arbitrary stdout lines, then an arbitrary end.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sortie_core::Protocol;

fuzz_target!(|data: &[u8]| {
    sortie_fuzz::run_reader(Protocol::PiJson, data);
});

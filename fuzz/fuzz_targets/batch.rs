//! Fuzz target: batch files. Each input is loaded as a TOML batch, as a JSON Lines batch, and
//! as the TOML defaults file of a one-task JSON Lines batch. Loading may refuse the input with
//! issues, never panic.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sortie_batch::{Overrides, load};

/// The directory the inputs are written to, one per process (paths in inputs resolve in it).
fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("sortie-fuzz-batch")
            .tempdir()
            .expect("a temporary directory")
            .keep();
        std::fs::write(dir.join("one.jsonl"), "{\"command\": [\"true\"]}\n")
            .expect("the one-task batch");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = dir();
    let overrides = Overrides::default();
    let toml = dir.join("batch.toml");
    let jsonl = dir.join("batch.jsonl");
    let defaults = dir.join("defaults.toml");
    std::fs::write(&toml, data).expect("write the input");
    let _ = load(&toml, None, &overrides);
    std::fs::write(&jsonl, data).expect("write the input");
    let _ = load(&jsonl, None, &overrides);
    std::fs::write(&defaults, data).expect("write the input");
    let _ = load(&dir.join("one.jsonl"), Some(&defaults), &overrides);
});

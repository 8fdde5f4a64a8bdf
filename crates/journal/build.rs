//! Computes the snapshot schema fingerprint (`SORTIE_SNAPSHOT_SCHEMA`): a hash of every source
//! file of `sortie-core` (whose `RunState` a snapshot holds) and of the workspace's lock file (the
//! serde and bincode that encode it). A snapshot written by other code than this build's is
//! ignored, never misread (`src/snapshot.rs`). Conservative on purpose: any edit of core makes
//! the next resume replay the whole journal once.

use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let core = manifest.join("../core/src");
    let lock = manifest.join("../../Cargo.lock");
    println!("cargo::rerun-if-changed={}", core.display());
    println!("cargo::rerun-if-changed={}", lock.display());
    let mut paths = Vec::new();
    files(&core, &mut paths);
    paths.sort();
    // FNV-1a over each file's path (relative to core) and bytes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    if paths.is_empty() {
        // Built without core's sources beside it: no two builds share snapshots.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        eat(&now.to_le_bytes());
    }
    for p in &paths {
        eat(p
            .strip_prefix(&core)
            .unwrap_or(p)
            .to_string_lossy()
            .as_bytes());
        eat(&std::fs::read(p).unwrap_or_default());
    }
    eat(&std::fs::read(&lock).unwrap_or_default());
    println!("cargo::rustc-env=SORTIE_SNAPSHOT_SCHEMA={h:016x}");
}

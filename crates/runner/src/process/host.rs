//! Facts about and settings of sortie's own process: its host's name, and surviving a
//! file-size limit.

use std::path::PathBuf;

use tokio::signal::unix::{SignalKind, signal};

use crate::{Error, Result};

/// A file-size limit (`ulimit -f`, RLIMIT_FSIZE: how a full disk is simulated, and a real limit
/// on some machines) makes a write past it raise SIGXFSZ, whose default action kills the
/// process without a word. With a handler installed, the write fails with EFBIG instead and the
/// journal's append returns an error, which stops the run cleanly (see `Error::JournalWrite`).
/// tokio keeps the handler for the life of the process; children get the default action back
/// at exec.
pub fn survive_file_size_limit() -> Result<()> {
    let xfsz = SignalKind::from_raw(nix::sys::signal::Signal::SIGXFSZ as i32);
    signal(xfsz).map(drop).map_err(|source| Error::Io {
        path: PathBuf::from("SIGXFSZ"),
        source,
    })
}

/// This machine's host name (journaled in `RunStarted`).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

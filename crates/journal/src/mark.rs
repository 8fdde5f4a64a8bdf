//! The acknowledged high-water mark: how many records the journal had made durable, and a digest
//! of the last of them, kept outside sled so that a journal that lost acknowledged records never
//! reads as whole.
//!
//! sled 0.34 treats a bad log entry as the end of its log: everything after it is dropped at
//! open, silently, and the per-record CRC never sees the loss. The mark is how the loss shows:
//! the writer writes it beside the journal (`<run-dir>/journal.mark`, atomically: temp file,
//! fsync, rename) every so often and at the end of a run, and every open compares it with what
//! sled gives back. Fewer records than acknowledged is [`Error::Truncated`]; a last acknowledged
//! record whose bytes changed is [`Error::Corrupt`]. The mark is written only after the records
//! it counts are durable, so it never counts more than a crash can leave; a mark file that is
//! missing or unreadable (a crash before the first one, or damage to the mark itself) is no mark,
//! said with a warning when unreadable, and never an error.
//!
//! The file is one line, `sortie-journal-mark 1 records=N digest=XXXXXXXX check=XXXXXXXX`, the
//! check being the CRC-32 of the text before it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sortie_core::Seq;

use crate::journal::Journal;
use crate::{Error, Result};

/// The journal's acknowledged high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// How many records were durable (the last one's seq is `records - 1`).
    pub records: u64,
    /// The CRC-32 of the stored bytes of the last of them.
    pub digest: u32,
}

const MAGIC: &str = "sortie-journal-mark 1";

/// Where a run's mark lives: beside its `journal/` directory, outside sled's files.
pub fn mark_path(run_dir: &Path) -> PathBuf {
    run_dir.join("journal.mark")
}

/// The digest of a stored record.
pub(crate) fn digest(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

impl Mark {
    fn encode(&self) -> String {
        let body = format!(
            "{MAGIC} records={} digest={:08x}",
            self.records, self.digest
        );
        let check = crc32fast::hash(body.as_bytes());
        format!("{body} check={check:08x}\n")
    }

    fn decode(text: &str) -> Option<Mark> {
        let line = text.strip_suffix('\n')?;
        let (body, check) = line.rsplit_once(" check=")?;
        if u32::from_str_radix(check, 16).ok()? != crc32fast::hash(body.as_bytes()) {
            return None;
        }
        let rest = body.strip_prefix(MAGIC)?.strip_prefix(" records=")?;
        let (records, digest) = rest.split_once(" digest=")?;
        Some(Mark {
            records: records.parse().ok()?,
            digest: u32::from_str_radix(digest, 16).ok()?,
        })
    }

    /// Reads a run's mark; `None` (with a warning when the file exists but cannot be read) when
    /// there is none to trust.
    pub fn read(run_dir: &Path) -> Option<Mark> {
        let path = mark_path(run_dir);
        match fs::read(&path) {
            Ok(bytes) => {
                let mark = std::str::from_utf8(&bytes).ok().and_then(Mark::decode);
                if mark.is_none() {
                    tracing::warn!(
                        "ignoring the journal's high-water mark {}: it cannot be read",
                        path.display()
                    );
                }
                mark
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(
                    "ignoring the journal's high-water mark {}: {e}",
                    path.display()
                );
                None
            }
        }
    }

    /// Writes a run's mark atomically (temp file, fsync, rename, fsync of the directory).
    pub(crate) fn write(&self, run_dir: &Path) -> Result<()> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let target = mark_path(run_dir);
        let tmp = run_dir.join(format!(
            ".journal.mark.{}.{}.tmp",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        let result = (|| {
            let mut f = private_file(&tmp).map_err(io(&tmp))?;
            f.write_all(self.encode().as_bytes()).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
            fs::rename(&tmp, &target).map_err(io(&target))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result?;
        if let Ok(d) = fs::File::open(run_dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Creates a file only the user can read (0600), like the rest of a run directory.
pub(crate) fn private_file(path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

impl Journal {
    /// The high-water mark of what this handle knows to be durable now (None while the journal
    /// is empty).
    pub fn high_water(&self) -> Result<Option<Mark>> {
        let records = self.durable.load(Ordering::Acquire);
        let Some(last) = records.checked_sub(1) else {
            return Ok(None);
        };
        match self.store.get(last)? {
            Some(bytes) => Ok(Some(Mark {
                records,
                digest: digest(&bytes),
            })),
            None => Err(Error::Truncated {
                from: Seq(last),
                to: Seq(last),
            }),
        }
    }

    /// Writes the journal's high-water mark beside it (see the module docs), and returns it.
    /// The writer calls this every so often and at the end of a run.
    pub fn write_mark(&self) -> Result<Option<Mark>> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        let Some(mark) = self.high_water()? else {
            return Ok(None);
        };
        mark.write(&self.run_dir)?;
        Ok(Some(mark))
    }

    /// Checks that this journal holds every record `mark` acknowledged, the last one unchanged:
    /// [`Error::Truncated`] naming the lost records, or [`Error::Corrupt`]. Every open checks the
    /// mark file; callers that keep another copy of the mark (the run index) check it too.
    pub fn check_mark(&self, mark: &Mark) -> Result<()> {
        let Some(last) = mark.records.checked_sub(1) else {
            return Ok(());
        };
        let held = self.next_seq().0;
        if held < mark.records {
            return Err(Error::Truncated {
                from: Seq(held),
                to: Seq(last),
            });
        }
        match self.store.get(last)? {
            Some(bytes) if digest(&bytes) == mark.digest => Ok(()),
            Some(_) => Err(Error::Corrupt {
                seq: Seq(last),
                reason: "the record differs from the one the journal acknowledged".into(),
            }),
            None => Err(Error::Truncated {
                from: Seq(last),
                to: Seq(last),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_round_trips_and_any_changed_byte_makes_it_no_mark() {
        let mark = Mark {
            records: 102,
            digest: 0xdead_beef,
        };
        let text = mark.encode();
        assert_eq!(Mark::decode(&text), Some(mark));
        for i in 0..text.len() {
            let mut bytes = text.clone().into_bytes();
            bytes[i] ^= 0x01;
            let changed = String::from_utf8_lossy(&bytes).into_owned();
            assert_eq!(Mark::decode(&changed), None, "byte {i} changed unseen");
        }
        assert_eq!(Mark::decode(""), None);
        assert_eq!(Mark::decode(&"\0".repeat(80)), None);
    }
}

//! #34: the secrets an attempt was given (its `env` references) masked in its transcript files
//! once it ended, in place and at their length: every offset into a file (a journaled read
//! offset, a cut's record, a `logs --follow` position) stays true. A secret as long as its tag
//! (`[redacted:NAME]`) or longer becomes the tag padded with `sortie_batch::PAD` (which
//! `sortie logs` leaves out); a shorter one becomes `*`s.
//!
//! Limits: the files hold the secret from when the agent printed it until the attempt ends
//! (`sortie logs` redacts on print meanwhile, when it can read the references itself); a
//! secret split across two lines, or printed in another encoding, is not found.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use sortie_batch::Redactor;

/// Masks every secret of `redactor` in `file` (a missing file has none); whether any was
/// found. Holes (a cut) read as zeros and are written back only where a secret was.
pub fn mask_file(file: &Path, redactor: &Redactor) -> std::io::Result<bool> {
    if redactor.is_empty() {
        return Ok(false);
    }
    let mut f = match OpenOptions::new().read(true).write(true).open(file) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    let mut masked = bytes.clone();
    if !redactor.mask_in_place(&mut masked) {
        return Ok(false);
    }
    // Only the changed ranges are written: a hole stays a hole.
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == masked[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != masked[i] {
            i += 1;
        }
        f.seek(SeekFrom::Start(start as u64))?;
        f.write_all(&masked[start..i])?;
    }
    f.sync_data()?;
    Ok(true)
}

/// Masks the secrets in each of `files`; a file that cannot be masked is warned about.
pub(crate) fn mask_files<'a>(files: impl IntoIterator<Item = &'a Path>, redactor: &Redactor) {
    for file in files {
        if let Err(e) = mask_file(file, redactor) {
            tracing::warn!("cannot redact the secrets in {}: {e}", file.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masked_file_keeps_its_length_and_reads_as_the_tag() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("stdout");
        std::fs::write(&file, "one\nkey is sk-live-0123456789abcdefghij-xyz\ntwo\n")?;
        let before = std::fs::metadata(&file)?.len();
        let mut r = Redactor::default();
        r.add("OPENAI_API_KEY", "sk-live-0123456789abcdefghij-xyz");
        assert!(mask_file(&file, &r)?);
        let bytes = std::fs::read(&file)?;
        assert_eq!(bytes.len() as u64, before);
        assert_eq!(
            sortie_batch::unpad(&bytes).as_ref(),
            b"one\nkey is [redacted:OPENAI_API_KEY]\ntwo\n"
        );
        assert!(!mask_file(&dir.path().join("absent"), &r)?);
        Ok(())
    }
}

//! The one way the loader reads a file a batch names: at most its documented limit
//! (`sortie_core::bounds::input_limits`), so a huge file or one that never ends
//! (`/dev/zero`) is an error naming the limit (the caller names the file), never a memory
//! exhaustion.

use std::io::{self, Read};
use std::path::Path;

use sortie_core::bounds::input_limits;

/// The bytes of `path`, a file of the kind `what` (for people: "a batch file") that holds at
/// most `limit` bytes. A larger file is an error of kind `FileTooLarge` saying the limit.
pub(crate) fn read_limited(path: &Path, what: &str, limit: u64) -> io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "it is larger than the {} {what} may be (the documented limit)",
                input_limits::format(limit)
            ),
        ));
    }
    Ok(bytes)
}

/// [`read_limited`] as UTF-8 text.
pub(crate) fn read_text(path: &Path, what: &str, limit: u64) -> io::Result<String> {
    String::from_utf8(read_limited(path, what, limit)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_past_its_limit_is_refused_with_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.txt");
        std::fs::write(&path, vec![b'x'; 2048]).unwrap();
        assert_eq!(
            read_limited(&path, "a test file", 2048).unwrap().len(),
            2048
        );
        let err = read_limited(&path, "a test file", 2047).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        let text = err.to_string();
        assert!(
            text.contains("larger than the 2047 bytes a test file may be"),
            "{text}"
        );
        let err = read_limited(Path::new("/dev/zero"), "a test file", 1024).unwrap_err();
        assert!(err.to_string().contains("larger than the 1 KiB"), "{err}");
    }
}

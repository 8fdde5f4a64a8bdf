//! The write end of an agent's stdin: a pipe to a child sortie spawned, or the FIFO that a
//! supervised agent's supervisor forwards to it (one line at a time; dropping it closes the
//! agent's stdin).

use std::io;
use std::path::Path;

use crate::layout::attempt::{STDIN_CLOSE, STDIN_FIFO};

/// The write end of a child's stdin (see [`spawn_piped`](super::spawn_piped)), or of a supervised
/// agent's stdin FIFO (see `layout::attempt::STDIN_FIFO`). Dropping it closes the agent's stdin.
#[derive(Debug)]
pub struct Stdin {
    inner: StdinEnd,
}

#[derive(Debug)]
enum StdinEnd {
    Child(tokio::process::ChildStdin),
    /// Its supervisor forwards what is written here; a close line closes the agent's stdin.
    Fifo(tokio::net::unix::pipe::Sender),
}

impl Stdin {
    pub(super) fn child(inner: tokio::process::ChildStdin) -> Stdin {
        Stdin {
            inner: StdinEnd::Child(inner),
        }
    }

    /// The stdin of the supervised attempt in `dir` (its supervisor holds the FIFO open: this
    /// never waits).
    pub fn fifo(dir: &Path) -> io::Result<Stdin> {
        let tx = tokio::net::unix::pipe::OpenOptions::new().open_sender(dir.join(STDIN_FIFO))?;
        Ok(Stdin {
            inner: StdinEnd::Fifo(tx),
        })
    }

    /// Writes one line (a newline is added) and flushes it. Fails when the child closed its
    /// end (it exited).
    pub async fn send_line(&mut self, line: &str) -> io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        match &mut self.inner {
            StdinEnd::Child(w) => {
                w.write_all(&bytes).await?;
                w.flush().await
            }
            StdinEnd::Fifo(w) => {
                w.write_all(&bytes).await?;
                w.flush().await
            }
        }
    }
}

impl Drop for Stdin {
    /// A FIFO stays open in the supervisor: the agent's stdin is closed by the close line.
    fn drop(&mut self) {
        if let StdinEnd::Fifo(w) = &self.inner {
            let _ = w.try_write(STDIN_CLOSE);
        }
    }
}

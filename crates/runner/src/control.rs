//! Live control of a run from another process: the protocol of the run's control socket
//! (`<run-dir>/control.sock`, one JSON line each way) and its client.
//!
//! The run's owner listens (`engine/control.rs`), accepts only peers of its own user (the
//! socket's peer credentials), and for each request decides a [`ControlAction`], journals it as
//! `Event::Control` (who, when, what), and carries it out: hold and release stop and continue a
//! task's process group, cancel stops one task's attempt (or the run), steer passes a message
//! to a steerable agent, concurrency changes the limit.
//!
//! [`ControlAction`]: sortie_core::ControlAction

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// A request to a live run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Request {
    /// Hold a task (by label), or the run.
    Hold {
        /// The task's label; `None`: the run.
        task: Option<String>,
    },
    /// Release a held task, or everything held.
    Release {
        /// The task's label; `None`: everything.
        task: Option<String>,
    },
    /// Cancel a task, or the run.
    Cancel {
        /// The task's label; `None`: the run.
        task: Option<String>,
    },
    /// Pass a message to a running task's agent.
    Steer {
        /// The task's label.
        task: String,
        /// The message.
        message: String,
    },
    /// Change how many tasks run at once.
    Concurrency {
        /// The new limit.
        n: u32,
    },
}

/// The run's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the action was journaled and carried out.
    pub ok: bool,
    /// What was done, or why not.
    pub message: String,
}

impl Reply {
    /// A refusal.
    pub fn refused(why: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            message: why.into(),
        }
    }

    /// An acceptance.
    pub fn done(what: impl Into<String>) -> Reply {
        Reply {
            ok: true,
            message: what.into(),
        }
    }
}

/// A request line as the socket reads it: the request, and, from a client that acts for someone
/// else (`sortie serve`: `web`), who that is; the run journals it before the peer's uid and pid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The request.
    #[serde(flatten)]
    pub req: Request,
    /// Who the client acts for (at most [`VIA_MAX`] characters of letters, digits and `-`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// The longest `via` a run accepts.
pub const VIA_MAX: usize = 32;

impl Envelope {
    /// The `via` when it is one a run journals (short, plain), else None.
    pub fn via(&self) -> Option<&str> {
        self.via.as_deref().filter(|v| {
            !v.is_empty()
                && v.len() <= VIA_MAX
                && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
    }
}

/// Sends `req` to the run listening on `socket` and returns its answer.
pub fn send(socket: &Path, req: &Request) -> std::io::Result<Reply> {
    send_via(socket, req, None)
}

/// [`send`] on behalf of `via` (journaled as who asked, before the peer's uid and pid).
pub fn send_via(socket: &Path, req: &Request, via: Option<&str>) -> std::io::Result<Reply> {
    let mut stream = UnixStream::connect(socket)?;
    let envelope = Envelope {
        req: req.clone(),
        via: via.map(str::to_owned),
    };
    let mut line = serde_json::to_string(&envelope).map_err(std::io::Error::other)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    stream.flush()?;
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    serde_json::from_str(&answer)
        .map_err(|e| std::io::Error::other(format!("the run answered something unreadable: {e}")))
}

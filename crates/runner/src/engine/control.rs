//! The run's control socket: accepting requests from other processes of the same user, and
//! turning each into a journaled `Event::Control` and its effect on the live attempts.

use std::path::{Path, PathBuf};

use sortie_core::{ControlAction, StopReason, TaskId};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::Engine;
use crate::Result;
use crate::attempt::{Ctl, StopRequest};
use crate::control::{Envelope, Reply, Request};

/// The longest request line read.
const MAX_REQUEST: u64 = 64 * 1024;

/// A request from a peer, with who sent it and where the answer goes.
pub(super) struct ControlMsg {
    pub(super) req: Request,
    pub(super) by: String,
    pub(super) reply: oneshot::Sender<Reply>,
}

/// The socket while the run is live; the file goes with it.
pub(super) struct Listener {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path` (a stale file from a crashed owner is replaced: this process holds the
/// owner lock) and sends each request to the loop. A socket that cannot be made costs the run
/// its live control, not its life: a warning says so.
pub(super) fn listen(path: &Path, tx: mpsc::UnboundedSender<ControlMsg>) -> Option<Listener> {
    let _ = std::fs::remove_file(path);
    let listener = match UnixListener::bind(path) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(
                "no live control for this run: cannot listen on {}: {e}",
                path.display()
            );
            return None;
        }
    };
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(stream, tx).await {
                    tracing::debug!("control connection: {e}");
                }
            });
        }
    });
    Some(Listener {
        path: path.to_path_buf(),
        task,
    })
}

/// One connection: the peer's credentials, one request line, one answer line.
async fn serve(stream: UnixStream, tx: mpsc::UnboundedSender<ControlMsg>) -> std::io::Result<()> {
    let cred = stream.peer_cred()?;
    let me = nix::unistd::geteuid().as_raw();
    let (read, mut write) = stream.into_split();
    let answer = if cred.uid() != me {
        Reply::refused(format!(
            "refused: the run belongs to uid {me}, not to uid {}",
            cred.uid()
        ))
    } else {
        let mut line = String::new();
        BufReader::new(read.take(MAX_REQUEST))
            .read_line(&mut line)
            .await?;
        match serde_json::from_str::<Envelope>(&line) {
            Err(e) => Reply::refused(format!("not a request: {e}")),
            Ok(envelope) => {
                let peer = match cred.pid() {
                    Some(pid) => format!("uid {} pid {pid}", cred.uid()),
                    None => format!("uid {}", cred.uid()),
                };
                // #35: `sortie serve` asks for the holder of its token: `web (uid .. pid ..)`.
                let by = match envelope.via() {
                    Some(via) => format!("{via} ({peer})"),
                    None => peer,
                };
                let req = envelope.req;
                let (reply, rx) = oneshot::channel();
                if tx.send(ControlMsg { req, by, reply }).is_err() {
                    Reply::refused("the run is ending")
                } else {
                    rx.await
                        .unwrap_or_else(|_| Reply::refused("the run is ending"))
                }
            }
        }
    };
    let mut text = serde_json::to_string(&answer).map_err(std::io::Error::other)?;
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    write.shutdown().await
}

impl Engine {
    /// Decides, journals and carries out one request; a refusal journals nothing.
    pub(super) fn control(&mut self, msg: ControlMsg) -> Result<()> {
        let reply = self.control_reply(msg.req, &msg.by)?;
        let _ = msg.reply.send(reply);
        Ok(())
    }

    fn control_reply(&mut self, req: Request, by: &str) -> Result<Reply> {
        let action = match self.action_of(req) {
            Ok(a) => a,
            Err(why) => return Ok(Reply::refused(why)),
        };
        let facts = sortie_core::control::ControlFacts {
            stopping: self.stopping.is_some(),
            steerable: action
                .task()
                .and_then(|t| self.live.get(&t))
                .is_some_and(|h| h.steerable),
        };
        let event = match sortie_core::control::decide(&self.state, by, action.clone(), facts) {
            Ok(event) => event,
            Err(why) => return Ok(Reply::refused(why)),
        };
        self.commit(vec![event])?;
        self.control_effects(&action, by);
        Ok(Reply::done(self.describe(&action)))
    }

    fn action_of(&self, req: Request) -> std::result::Result<ControlAction, String> {
        let task = |label: &str| -> std::result::Result<TaskId, String> {
            self.state
                .task_by_label(label)
                .ok_or_else(|| format!("no task {label:?} in this run"))
        };
        let opt = |label: Option<String>| label.as_deref().map(task).transpose();
        Ok(match req {
            Request::Hold { task } => ControlAction::Hold { task: opt(task)? },
            Request::Release { task } => ControlAction::Release { task: opt(task)? },
            Request::Cancel { task } => ControlAction::Cancel { task: opt(task)? },
            Request::Steer { task: t, message } => ControlAction::Steer {
                task: task(&t)?,
                message,
            },
            Request::Concurrency { n } => ControlAction::Concurrency { n },
        })
    }

    fn describe(&self, action: &ControlAction) -> String {
        let what = match action.task() {
            Some(t) => format!("task {}", self.state.label(t)),
            None => "the run".to_owned(),
        };
        match action {
            ControlAction::Hold { .. } => format!("{what} held"),
            ControlAction::Release { task: None } => "the run and every held task released".into(),
            ControlAction::Release { .. } => format!("{what} released"),
            ControlAction::Cancel { .. } => format!("{what} cancelled"),
            ControlAction::Steer { .. } => format!("{what}: message sent to its agent"),
            ControlAction::Concurrency { n } => format!("concurrency set to {n}"),
        }
    }

    /// What a journaled action does to the live attempts (the planner sees the rest in the
    /// state: held tasks do not launch, cancelled ones end, the concurrency is the new one).
    fn control_effects(&mut self, action: &ControlAction, by: &str) {
        match action {
            ControlAction::Hold { task: Some(t) } => {
                if let Some(h) = self.live.get(t) {
                    h.control(Ctl::Hold);
                }
            }
            ControlAction::Hold { task: None } => {
                for h in self.live.values() {
                    h.control(Ctl::Hold);
                }
            }
            ControlAction::Release { task: Some(t) } => {
                if let (false, Some(h)) = (self.state.control.run_held, self.live.get(t)) {
                    h.control(Ctl::Release);
                }
            }
            ControlAction::Release { task: None } => {
                for h in self.live.values() {
                    h.control(Ctl::Release);
                }
            }
            ControlAction::Cancel { task: Some(t) } => {
                if let Some(h) = self.live.get(t) {
                    h.stop(StopRequest {
                        reason: StopReason::Cancelled,
                        phase: None,
                        message: format!("cancelled by {by}"),
                    });
                }
                // #33: its check stops too, and fails.
                if let Some(c) = self.checks.get_mut(t) {
                    c.stop(StopReason::Cancelled);
                }
            }
            ControlAction::Cancel { task: None } => self.stop_all(sortie_core::Stopping::Cancel),
            ControlAction::Steer { task, message } => {
                if let Some(h) = self.live.get(task) {
                    h.control(Ctl::Steer(message.clone()));
                }
            }
            ControlAction::Concurrency { .. } => {}
        }
    }
}

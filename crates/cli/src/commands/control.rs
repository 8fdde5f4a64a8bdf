//! `sortie hold`, `release`, `cancel --task`, `steer`, `concurrency`: requests to a live run
//! through its control socket; the run journals each one it carries out.

use std::io::Write;

use serde::Serialize;
use sortie_runner::control::{self, Request};
use sortie_runner::layout::Owner;

use super::Code;
use crate::args::Global;
use crate::error::{CliError, Result};

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Answer<'a> {
    run_id: String,
    action: &'a str,
    ok: bool,
    message: String,
    /// A refusal, said as every `--json` error is (`error::json_error`): the message...
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// ...and the exit code.
    #[serde(skip_serializing_if = "Option::is_none")]
    code: Option<u8>,
}

fn action_name(req: &Request) -> &'static str {
    match req {
        Request::Hold { .. } => "hold",
        Request::Release { .. } => "release",
        Request::Cancel { .. } => "cancel",
        Request::Steer { .. } => "steer",
        Request::Concurrency { .. } => "concurrency",
    }
}

/// Sends `req` to live run `run` and prints its answer: exit 0 when it was carried out, 1 when
/// the run refused it, 2 when no process runs the run.
pub(crate) fn send(g: &Global, run: &str, req: Request) -> Result<Code> {
    let run = super::find_run(g, run)?;
    let dir = g.layout().run(&run);
    if !dir.exists() {
        return Err(CliError::usage(format_args!(
            "no run {run} in {} (see `sortie list`)",
            g.layout().root().display()
        )));
    }
    if !matches!(dir.owner(), Owner::Live { .. }) {
        return Err(CliError::usage(format_args!(
            "run {run} is not running: `{}` acts on a live run only",
            action_name(&req)
        )));
    }
    let reply = control::send(&dir.control_socket(), &req).map_err(|e| {
        CliError::from(anyhow::anyhow!(
            "cannot reach run {run} through {}: {e}",
            dir.control_socket().display()
        ))
    })?;
    let mut out = std::io::stdout().lock();
    if g.json {
        let answer = Answer {
            run_id: run.to_string(),
            action: action_name(&req),
            ok: reply.ok,
            message: reply.message.clone(),
            error: (!reply.ok).then(|| format!("run {run} refused: {}", reply.message)),
            code: (!reply.ok).then_some(Code::Failed as u8),
        };
        serde_json::to_writer_pretty(&mut out, &answer)?;
        writeln!(out)?;
    } else if reply.ok {
        writeln!(out, "run {run}: {}", reply.message)?;
    } else {
        eprintln!("sortie: run {run} refused: {}", reply.message);
    }
    Ok(if reply.ok { Code::Ok } else { Code::Failed })
}

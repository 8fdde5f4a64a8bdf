//! A run's transcripts (#10), listed from the journal's placements and the files: each
//! attempt's stdout and stderr, where they are, how big, what the cap cut, whether anything
//! may still write to one (`sortie logs --follow`), and their removal by `sortie gc`.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use serde::Serialize;
use sortie_core::state::AttemptEnd;
use sortie_core::{AttemptStatus, RunState, TaskId};

use super::kept::{Cut, read_cut};
use crate::executor::Placement;
use crate::layout::{Owner, RunDir};
use crate::supervisor;

/// One attempt's transcript.
#[derive(Debug, Clone, Serialize)]
pub struct Transcript {
    /// The attempt.
    pub attempt: u32,
    /// The executor that ran it (`local`: supervised, `direct`, `slurm`).
    pub executor: String,
    /// How it ended: `running`, `completed`, `partial`, `failed`, `orphaned`.
    pub end: String,
    /// Its stdout file: the transcript.
    pub path: PathBuf,
    /// Whether the file is there (`sortie gc` removes it with the run's other leftovers).
    pub exists: bool,
    /// The length of the stream the agent wrote, in bytes (the file's length: a cut keeps it).
    pub bytes: u64,
    /// What the file takes on disk, in bytes.
    pub disk_bytes: u64,
    /// The byte range the cap cut out of it, if any.
    pub cut: Option<Cut>,
    /// Its stderr file, and its length.
    pub stderr: PathBuf,
    /// See `stderr`.
    pub stderr_bytes: u64,
    /// The attempt dir it was placed with (its exit and start records are found by it).
    #[serde(skip)]
    pub dir: PathBuf,
}

impl Transcript {
    /// How its attempt ended, once its exit is recorded (in its dir, or the shepherd's log).
    pub fn exit(&self) -> Option<sortie_protocol::Exit> {
        supervisor::read_exit(&self.dir)
    }
}

/// The transcripts of `task`'s attempts, in order.
pub fn of_task(state: &RunState, run_dir: &RunDir, task: TaskId) -> Vec<Transcript> {
    let Some(rec) = state.task(task) else {
        return Vec::new();
    };
    rec.attempts
        .iter()
        .map(|a| {
            let placement = Placement::of_record(task, a, run_dir.attempt_dir(task.0, a.attempt.0));
            let files = placement.files();
            let (executor, dir) = (placement.executor, placement.dir);
            let (path, stderr) = (files.stdout, files.stderr);
            let meta = std::fs::metadata(&path).ok();
            let end = match &a.end {
                None => "running".to_owned(),
                Some(AttemptEnd::Finished { outcome, .. }) => match outcome.status {
                    AttemptStatus::Completed => "completed".to_owned(),
                    AttemptStatus::Partial => "partial".to_owned(),
                    AttemptStatus::Failed => "failed".to_owned(),
                },
                Some(AttemptEnd::Orphaned { .. }) => "orphaned".to_owned(),
            };
            Transcript {
                attempt: a.attempt.0,
                executor,
                end,
                exists: meta.is_some(),
                bytes: meta.as_ref().map_or(0, std::fs::Metadata::len),
                disk_bytes: meta.as_ref().map_or(0, |m| m.blocks() * 512),
                cut: read_cut(&path),
                stderr_bytes: std::fs::metadata(&stderr).map_or(0, |m| m.len()),
                path,
                stderr,
                dir,
            }
        })
        .collect()
}

/// Whether anything may still write to `t`: no exit is recorded, and its supervisor runs (a
/// supervised attempt) or its run's owner does (a direct one, whose output sortie writes; a
/// batch job, followed by its owner).
pub fn may_grow(t: &Transcript, run_dir: &RunDir) -> bool {
    let dir = t.dir.as_path();
    if supervisor::read_exit(dir).is_some() {
        return false;
    }
    if crate::executor::has_own_supervisor(&t.executor)
        && let Some(s) = supervisor::read_started(dir)
    {
        return crate::process::is_running(s.supervisor, s.supervisor_start);
    }
    matches!(run_dir.owner(), Owner::Live { .. })
}

/// What `sortie gc` removed of one run's transcripts.
#[derive(Debug, Clone, Serialize)]
pub struct Collected {
    /// The run.
    pub run: String,
    /// How many attempt dirs (transcripts, stderr, exit records) were removed.
    pub attempts: usize,
    /// What they took on disk, in bytes (prompt files included).
    pub bytes: u64,
}

/// Removes the transcripts (the attempt dirs, and the prompt files beside them) of every
/// finished run that ended at least `older_than` before `now`; the journal keeps each
/// attempt's outcome, usage and output. Live and unfinished runs, and runs that cannot be
/// read, are left alone.
pub fn gc(
    state_dir: &crate::layout::StateDir,
    older_than: std::time::Duration,
    now: sortie_core::Timestamp,
) -> Vec<Collected> {
    let mut out = Vec::new();
    let mut runs = state_dir.run_ids();
    runs.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    for run in runs {
        let dir = state_dir.run(&run);
        let (attempts, prompts) = (dir.attempts(), dir.prompts());
        if !attempts.exists() && !prompts.exists() {
            continue;
        }
        if let Owner::Live { .. } = dir.owner() {
            continue;
        }
        let Ok(state) =
            sortie_journal::Journal::open_read_only(dir.path()).and_then(|j| j.replay_latest())
        else {
            continue;
        };
        if !matches!(state.status, sortie_core::RunStatus::Finished { .. }) {
            continue;
        }
        let ended = state.last_at.map_or(0, |t| t.0);
        if now.0.saturating_sub(ended) < u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX) {
            continue;
        }
        // The attempts: their dirs, and the shepherd's attempts' stdout files beside them (not
        // the status log, nor the stderr, cut and read records).
        let count = std::fs::read_dir(&attempts).map_or(0, |d| {
            d.flatten()
                .filter(|e| {
                    e.file_type().is_ok_and(|t| t.is_dir())
                        || e.file_name()
                            .to_str()
                            .is_some_and(|n| n.ends_with(".stdout"))
                })
                .count()
        });
        let bytes = disk_usage(&attempts) + disk_usage(&prompts);
        let removed = [&attempts, &prompts]
            .iter()
            .all(|p| match std::fs::remove_dir_all(p) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                Err(e) => {
                    tracing::warn!("cannot remove {}: {e}", p.display());
                    false
                }
            });
        if removed || count > 0 {
            out.push(Collected {
                run: run.to_string(),
                attempts: count,
                bytes,
            });
        }
    }
    out
}

/// What the files under `path` take on disk (symlinks not followed).
fn disk_usage(path: &std::path::Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return own;
    };
    own + entries
        .flatten()
        .map(|e| disk_usage(&e.path()))
        .sum::<u64>()
}

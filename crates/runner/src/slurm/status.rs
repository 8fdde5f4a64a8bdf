//! What Slurm says about jobs: the batched queries (`squeue` for the jobs slurmctld still holds,
//! `sacct` for those it has forgotten, `scontrol` where there is no accounting), their parsing,
//! a job's end as an attempt's end, and the pace of the polls.
//!
//! Pitfalls handled here (see the project's Slurm facts): `squeue -j` of one unknown id exits 1
//! (so queries go by name, which exits 0 and prints nothing); `sacct` lags a few seconds and may
//! show a placeholder `allocation` row right after a start or an end (rows whose name is not the
//! job's are ignored); `sacct` without accounting exits 1 with "accounting storage is disabled";
//! `sacct`'s states may carry a suffix (`CANCELLED by 0`).

use std::time::Duration;

use sortie_core::{AttemptOutcome, AttemptStatus, Phase, StopReason};
use sortie_protocol::Exit;

use super::JobId;

/// A job's state, as `squeue`, `sacct` and `scontrol` name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Waiting for resources, held, or being requeued/configured: not started.
    Pending,
    /// Running (or suspended, or cleaning up after its script ended: not final yet).
    Running,
    /// Ended by itself with exit 0.
    Completed,
    /// Ended by itself with a nonzero exit, or failed to launch.
    Failed,
    /// Cancelled (`scancel`).
    Cancelled,
    /// Its time limit (or deadline) ran out.
    Timeout,
    /// Ran out of memory.
    OutOfMemory,
    /// The cluster lost it: a node failure, a preemption, a boot failure, a revoked job.
    Lost(String),
    /// A state this version does not know (treated as still live).
    Other(String),
}

impl JobState {
    /// The state named `s` (`sacct`'s `CANCELLED by 0` included).
    pub fn parse(s: &str) -> JobState {
        let word = s.split_whitespace().next().unwrap_or("");
        match word {
            "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD"
            | "RESV_DEL_HOLD" => JobState::Pending,
            "RUNNING" | "SUSPENDED" | "COMPLETING" | "RESIZING" | "SIGNALING" | "STAGE_OUT"
            | "STOPPED" => JobState::Running,
            "COMPLETED" => JobState::Completed,
            "FAILED" | "SPECIAL_EXIT" => JobState::Failed,
            "CANCELLED" => JobState::Cancelled,
            "TIMEOUT" | "DEADLINE" => JobState::Timeout,
            "OUT_OF_MEMORY" => JobState::OutOfMemory,
            "NODE_FAIL" | "PREEMPTED" | "BOOT_FAIL" | "REVOKED" => JobState::Lost(word.to_owned()),
            other => JobState::Other(other.to_owned()),
        }
    }

    /// True once the job is over: nothing of it runs anymore.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            JobState::Pending | JobState::Running | JobState::Other(_)
        )
    }
}

/// One job as a query reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    /// Its id.
    pub id: JobId,
    /// Its name (sortie's jobs: a [`JobKey`](super::JobKey) name).
    pub name: String,
    /// Its state.
    pub state: JobState,
    /// Slurm's reason (`NonZeroExitCode`, `TimeLimit`, `Resources`, ...), when given.
    pub reason: Option<String>,
    /// How its script ended, when it ended and the query says.
    pub exit: Option<Exit>,
}

/// `squeue`'s argv for every job of `names`, pending, running or recently ended (`-t all`: a
/// job stays listed `MinJobAge` after its end). Unknown names print nothing and exit 0. One
/// line per job: `id|name|state|reason|wait status|`.
pub fn squeue_args(names: &[String]) -> Vec<String> {
    vec![
        "squeue".to_owned(),
        "--noheader".to_owned(),
        "--states=all".to_owned(),
        format!("--name={}", names.join(",")),
        "--Format=JobID:|,Name:|,State:|,Reason:|,exit_code:|".to_owned(),
    ]
}

/// Parses [`squeue_args`]'s output; lines that do not parse are skipped.
pub fn parse_squeue(out: &str) -> Vec<JobStatus> {
    out.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.trim().split('|').map(str::trim).collect();
            let [id, name, state, reason, status, ..] = f[..] else {
                return None;
            };
            let state = JobState::parse(state);
            let exit = match (&state, status.parse::<i32>()) {
                (s, Ok(w)) if s.is_final() => Some(decode_wait_status(w)),
                _ => None,
            };
            Some(JobStatus {
                id: JobId(id.parse().ok()?),
                name: name.to_owned(),
                state,
                reason: known(reason),
                exit,
            })
        })
        .collect()
}

/// A wait status as `squeue`'s `exit_code` prints it (`1792` for exit 7, `9` for SIGKILL).
pub fn decode_wait_status(w: i32) -> Exit {
    if w & 0x7f == 0 {
        Exit::Code((w >> 8) & 0xff)
    } else {
        Exit::Signal(w & 0x7f)
    }
}

/// Which jobs an `sacct` query asks for.
#[derive(Debug, Clone, Copy)]
pub enum Accounting<'a> {
    /// These ids (after a job dropped out of `squeue`).
    Ids(&'a [JobId]),
    /// These names, submitted since `since` (`YYYY-MM-DDTHH:MM:SS`): a resume looking for jobs
    /// whose id never reached the journal.
    Names(&'a [String], &'a str),
}

/// `sacct`'s argv: allocations only, parsable, no header; `id|name|state|code:signal`.
pub fn sacct_args(which: Accounting<'_>) -> Vec<String> {
    let mut args = vec![
        "sacct".to_owned(),
        "--allocations".to_owned(),
        "--parsable2".to_owned(),
        "--noheader".to_owned(),
        "--format=JobID,JobName,State,ExitCode".to_owned(),
    ];
    match which {
        Accounting::Ids(ids) => {
            let ids: Vec<String> = ids.iter().map(JobId::to_string).collect();
            args.push(format!("--jobs={}", ids.join(",")));
        }
        Accounting::Names(names, since) => {
            args.push(format!("--name={}", names.join(",")));
            args.push(format!("--starttime={since}"));
        }
    }
    args
}

/// True when `sacct` failed because the cluster keeps no accounting (then only `squeue` and
/// `scontrol` know jobs, and only for `MinJobAge` after their end).
pub fn sacct_disabled(stderr: &str) -> bool {
    stderr.contains("accounting storage is disabled")
}

/// Parses [`sacct_args`]'s output. Rows named `allocation` (sacct's placeholder right after a
/// start or an end) and job steps are skipped; so is any row that does not parse.
pub fn parse_sacct(out: &str) -> Vec<JobStatus> {
    out.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.trim().split('|').collect();
            let [id, name, state, code, ..] = f[..] else {
                return None;
            };
            if name == "allocation" || id.contains('.') {
                return None;
            }
            let state = JobState::parse(state);
            let exit = if state.is_final() {
                parse_exit_code(code)
            } else {
                None
            };
            Some(JobStatus {
                id: JobId(id.parse().ok()?),
                name: name.to_owned(),
                reason: None,
                state,
                exit,
            })
        })
        .collect()
}

/// `code:signal` (sacct's and scontrol's `ExitCode`) as an exit.
fn parse_exit_code(s: &str) -> Option<Exit> {
    let (code, signal) = s.split_once(':')?;
    let (code, signal): (i32, i32) = (code.parse().ok()?, signal.parse().ok()?);
    Some(if signal != 0 {
        Exit::Signal(signal)
    } else {
        Exit::Code(code)
    })
}

/// `scontrol`'s argv for one job, one line (`--oneliner`). An unknown or purged id exits 1.
pub fn scontrol_args(job: JobId) -> Vec<String> {
    vec![
        "scontrol".to_owned(),
        "--oneliner".to_owned(),
        "show".to_owned(),
        "job".to_owned(),
        job.to_string(),
    ]
}

/// Parses `scontrol show job` output: one job per line with `--oneliner`, or blocks separated
/// by blank lines without it.
pub fn parse_scontrol(out: &str) -> Vec<JobStatus> {
    let mut jobs = Vec::new();
    for block in out.split("\n\n") {
        let field = |key: &str| {
            block
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        };
        let (Some(id), Some(state)) = (field("JobId"), field("JobState")) else {
            continue;
        };
        let Ok(id) = id.parse() else { continue };
        let state = JobState::parse(state);
        let exit = if state.is_final() {
            field("ExitCode").and_then(parse_exit_code)
        } else {
            None
        };
        jobs.push(JobStatus {
            id: JobId(id),
            name: field("JobName").unwrap_or("").to_owned(),
            reason: field("Reason").and_then(known),
            state,
            exit,
        });
    }
    jobs
}

/// A field's value, unless Slurm's "nothing" (`None`, `(null)`, empty).
fn known(s: &str) -> Option<String> {
    (!s.is_empty() && s != "None" && s != "(null)").then(|| s.to_owned())
}

/// How a job ended, for the attempt: the script's exit goes through the protocol reader like a
/// local process's; the ends that Slurm caused are the attempt's outcome as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEnd {
    /// Its script ended with this exit (completed, failed, or out of memory).
    Exited(Exit),
    /// It never ran its script (`FAILED` with exit 0: a launch failure).
    NotLaunched(Option<String>),
    /// `scancel` ended it (sortie's stop, or someone else's).
    Cancelled,
    /// Slurm's time limit ended it.
    TimedOut,
    /// The cluster lost it (`NODE_FAIL`, `PREEMPTED`, `BOOT_FAIL`, `REVOKED`).
    Lost(String),
}

/// The end of a job in a final state; `None` while it is pending or running.
pub fn job_end(job: &JobStatus) -> Option<JobEnd> {
    let exit = job.exit;
    Some(match &job.state {
        JobState::Pending | JobState::Running | JobState::Other(_) => return None,
        JobState::Completed => JobEnd::Exited(exit.unwrap_or(Exit::Code(0))),
        JobState::Failed => match exit {
            Some(Exit::Code(0)) | None => JobEnd::NotLaunched(job.reason.clone()),
            Some(e) => JobEnd::Exited(e),
        },
        JobState::OutOfMemory => JobEnd::Exited(match exit {
            Some(Exit::Code(0)) | None => Exit::Signal(9),
            Some(e) => e,
        }),
        JobState::Cancelled => JobEnd::Cancelled,
        JobState::Timeout => JobEnd::TimedOut,
        JobState::Lost(state) => JobEnd::Lost(state.clone()),
    })
}

impl JobEnd {
    /// The attempt's outcome for an end Slurm caused (not one the protocol reader classifies
    /// from an exit, nor one sortie asked for): a lost job or one that never launched is
    /// transient (retried); Slurm's time limit is the attempt's timeout; a cancel sortie did
    /// not send is an unexpected signal (transient, as a kill from outside is locally).
    pub fn outcome(&self, job: JobId) -> Option<AttemptOutcome> {
        match self {
            JobEnd::Exited(_) => None,
            JobEnd::NotLaunched(reason) => Some(AttemptOutcome::failed(
                StopReason::SpawnError,
                format!(
                    "Slurm job {job} failed to launch ({})",
                    reason.as_deref().unwrap_or("no reason given")
                ),
            )),
            JobEnd::Cancelled => Some(AttemptOutcome {
                signal: Some(15),
                ..AttemptOutcome::failed(
                    StopReason::UnexpectedSignal,
                    format!("Slurm job {job} was cancelled outside sortie"),
                )
            }),
            JobEnd::TimedOut => Some(AttemptOutcome {
                status: AttemptStatus::Failed,
                phase: Some(Phase::Running),
                ..AttemptOutcome::failed(
                    StopReason::Timeout,
                    format!("Slurm job {job} reached its time limit"),
                )
            }),
            JobEnd::Lost(state) => Some(AttemptOutcome::failed(
                StopReason::Error,
                format!("Slurm job {job} ended {state}: the cluster lost it"),
            )),
        }
    }
}

/// The pace of a run's status polls: quick while jobs change, slower while nothing does, never
/// below `min` nor above `max`, and back to `min` at the first change.
#[derive(Debug, Clone)]
pub struct PollPace {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl PollPace {
    /// A pace between `min` and `max` (`max` at least `min`), starting at `min`.
    pub fn new(min: Duration, max: Duration) -> PollPace {
        PollPace {
            min,
            max: max.max(min),
            current: min,
        }
    }

    /// The wait before the next poll, after a poll that saw a change (or not): the first
    /// unchanged poll keeps the pace, each further one makes the wait 1.5 times longer.
    pub fn next(&mut self, changed: bool) -> Duration {
        if changed {
            self.current = self.min;
        } else {
            let wait = self.current;
            self.current = (self.current * 3 / 2).min(self.max);
            return wait;
        }
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["sortie:r:0:1:a".to_owned(), "sortie:r:1:1:a".to_owned()]
    }

    #[test]
    fn one_squeue_asks_for_every_job_by_name() {
        assert_eq!(
            squeue_args(&names()),
            [
                "squeue",
                "--noheader",
                "--states=all",
                "--name=sortie:r:0:1:a,sortie:r:1:1:a",
                "--Format=JobID:|,Name:|,State:|,Reason:|,exit_code:|",
            ]
        );
    }

    // Captured from slurm-wlm 22.05.8 (the project's CI cluster).
    const SQUEUE: &str = "\
4|sortie:r-1.x:3:2:18c0a|FAILED|NonZeroExitCode|1792|
5|sortie:r-1.x:4:1:18c0a|RUNNING|None|0|
6|sortie:r-1.x:5:1:18c0a|PENDING|Resources|0|
7|sortie:r-1.x:6:1:18c0a|COMPLETED|None|0|
8|sortie:r-1.x:7:1:18c0a|CANCELLED|None|15|
garbage line
";

    #[test]
    fn squeue_lines_give_state_reason_and_exit() {
        let jobs = parse_squeue(SQUEUE);
        assert_eq!(jobs.len(), 5);
        assert_eq!(
            jobs[0],
            JobStatus {
                id: JobId(4),
                name: "sortie:r-1.x:3:2:18c0a".into(),
                state: JobState::Failed,
                reason: Some("NonZeroExitCode".into()),
                exit: Some(Exit::Code(7)),
            }
        );
        assert_eq!(jobs[1].state, JobState::Running);
        assert_eq!((jobs[1].reason.as_deref(), jobs[1].exit), (None, None));
        assert_eq!(jobs[2].reason.as_deref(), Some("Resources"));
        assert_eq!(jobs[3].exit, Some(Exit::Code(0)));
        assert_eq!(jobs[4].exit, Some(Exit::Signal(15)));
    }

    #[test]
    fn wait_statuses_decode_to_codes_and_signals() {
        assert_eq!(decode_wait_status(0), Exit::Code(0));
        assert_eq!(decode_wait_status(7 << 8), Exit::Code(7));
        assert_eq!(decode_wait_status(9), Exit::Signal(9));
        assert_eq!(decode_wait_status(0x80 | 11), Exit::Signal(11));
    }

    #[test]
    fn sacct_asks_by_ids_or_by_names_since_the_run_started() {
        let ids = [JobId(4), JobId(5)];
        let args = sacct_args(Accounting::Ids(&ids));
        assert!(args.contains(&"--jobs=4,5".to_owned()));
        assert!(args.contains(&"--allocations".to_owned()));
        let names = names();
        let args = sacct_args(Accounting::Names(&names, "2026-12-01T20:00:00"));
        assert!(args.contains(&"--name=sortie:r:0:1:a,sortie:r:1:1:a".to_owned()));
        assert!(args.contains(&"--starttime=2026-12-01T20:00:00".to_owned()));
    }

    #[test]
    fn sacct_rows_skip_placeholders_and_steps() {
        let out = "\
4|sortie:r-1.x:3:2:18c0a|FAILED|7:0
4.batch|batch|FAILED|7:0
5|sortie:r-1.x:4:1:18c0a|CANCELLED by 0|0:15
6|allocation|PENDING|0:0
7|sortie:r-1.x:6:1:18c0a|TIMEOUT|0:0
8|sortie:r-1.x:7:1:18c0a|RUNNING|0:0
";
        let jobs = parse_sacct(out);
        let seen: Vec<(u64, JobState, Option<Exit>)> = jobs
            .iter()
            .map(|j| (j.id.0, j.state.clone(), j.exit))
            .collect();
        assert_eq!(
            seen,
            [
                (4, JobState::Failed, Some(Exit::Code(7))),
                (5, JobState::Cancelled, Some(Exit::Signal(15))),
                (7, JobState::Timeout, Some(Exit::Code(0))),
                (8, JobState::Running, None),
            ]
        );
        assert!(sacct_disabled(
            "sacct: error: Slurm accounting storage is disabled\n"
        ));
        assert!(!sacct_disabled(""));
    }

    #[test]
    fn scontrol_gives_state_reason_exit_and_name() {
        let one = "JobId=2 JobName=sortie:r:1:1:a UserId=root(0) JobState=FAILED \
                   Reason=NonZeroExitCode Dependency=(null) ExitCode=3:0 Comment=x\n";
        let blocks = "JobId=9 JobName=x\n   JobState=RUNNING Reason=None ExitCode=0:0\n\n\
                      JobId=10 JobName=y\n   JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15\n";
        let jobs = parse_scontrol(one);
        assert_eq!(
            jobs,
            [JobStatus {
                id: JobId(2),
                name: "sortie:r:1:1:a".into(),
                state: JobState::Failed,
                reason: Some("NonZeroExitCode".into()),
                exit: Some(Exit::Code(3)),
            }]
        );
        let jobs = parse_scontrol(blocks);
        assert_eq!(jobs.len(), 2);
        assert_eq!(
            (jobs[0].state.clone(), jobs[0].exit),
            (JobState::Running, None)
        );
        assert_eq!(jobs[1].reason.as_deref(), Some("TimeLimit"));
        assert!(parse_scontrol("slurm_load_jobs error: Invalid job id specified\n").is_empty());
        assert_eq!(
            scontrol_args(JobId(2)),
            ["scontrol", "--oneliner", "show", "job", "2"]
        );
    }

    fn status(state: &str, exit: Option<Exit>, reason: Option<&str>) -> JobStatus {
        JobStatus {
            id: JobId(1),
            name: String::new(),
            state: JobState::parse(state),
            reason: reason.map(str::to_owned),
            exit,
        }
    }

    #[test]
    fn states_map_to_ends() {
        let end = |s, e, r| job_end(&status(s, e, r));
        assert_eq!(end("PENDING", None, Some("Priority")), None);
        assert_eq!(end("RUNNING", None, None), None);
        assert_eq!(end("COMPLETING", Some(Exit::Code(0)), None), None);
        assert_eq!(end("SOMETHING_NEW", None, None), None);
        assert_eq!(
            end("COMPLETED", Some(Exit::Code(0)), None),
            Some(JobEnd::Exited(Exit::Code(0)))
        );
        assert_eq!(
            end("FAILED", Some(Exit::Code(7)), Some("NonZeroExitCode")),
            Some(JobEnd::Exited(Exit::Code(7)))
        );
        assert_eq!(
            end("FAILED", Some(Exit::Code(0)), Some("JobLaunchFailure")),
            Some(JobEnd::NotLaunched(Some("JobLaunchFailure".into())))
        );
        assert_eq!(
            end("OUT_OF_MEMORY", Some(Exit::Code(0)), None),
            Some(JobEnd::Exited(Exit::Signal(9)))
        );
        assert_eq!(end("CANCELLED by 0", None, None), Some(JobEnd::Cancelled));
        assert_eq!(end("TIMEOUT", None, None), Some(JobEnd::TimedOut));
        assert_eq!(end("DEADLINE", None, None), Some(JobEnd::TimedOut));
        for lost in ["NODE_FAIL", "PREEMPTED", "BOOT_FAIL"] {
            assert_eq!(end(lost, None, None), Some(JobEnd::Lost(lost.into())));
        }
    }

    #[test]
    fn ends_slurm_caused_are_transient_except_the_time_limit() {
        use sortie_core::is_transient;
        let job = JobId(12);
        assert_eq!(JobEnd::Exited(Exit::Code(1)).outcome(job), None);
        let lost = JobEnd::Lost("NODE_FAIL".into()).outcome(job).unwrap();
        assert!(is_transient(&lost));
        assert_eq!(
            lost.error.as_deref(),
            Some("Slurm job 12 ended NODE_FAIL: the cluster lost it")
        );
        assert!(is_transient(
            &JobEnd::NotLaunched(None).outcome(job).unwrap()
        ));
        assert!(is_transient(&JobEnd::Cancelled.outcome(job).unwrap()));
        let timeout = JobEnd::TimedOut.outcome(job).unwrap();
        assert_eq!(
            (timeout.stop_reason, timeout.phase),
            (StopReason::Timeout, Some(Phase::Running))
        );
        assert!(!is_transient(&timeout));
    }

    #[test]
    fn polls_slow_down_while_nothing_changes_and_speed_up_at_a_change() {
        let s = Duration::from_millis;
        let mut pace = PollPace::new(s(500), s(2000));
        let waits: Vec<Duration> = [false, false, false, false, false, true, false]
            .into_iter()
            .map(|c| pace.next(c))
            .collect();
        assert_eq!(
            waits,
            [
                s(500),
                s(750),
                s(1125),
                Duration::from_micros(1_687_500),
                s(2000),
                s(500),
                s(500)
            ]
        );
    }
}

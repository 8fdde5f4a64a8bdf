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
    /// How long it has run (or ran), to the second, when the query says: `squeue`'s
    /// `TimeUsed`, `sacct`'s `Elapsed`, `scontrol`'s `RunTime`. A job's clocks count from its
    /// real start (now minus this), never from its submission: queue time is not run time.
    pub ran: Option<Duration>,
}

/// `squeue`'s argv for every job of `names`, pending, running or recently ended (`-t all`: a
/// job stays listed `MinJobAge` after its end). Unknown names print nothing and exit 0. One
/// line per job: `id|name|state|reason|wait status|time used|`.
pub fn squeue_args(names: &[String]) -> Vec<String> {
    vec![
        "squeue".to_owned(),
        "--noheader".to_owned(),
        "--states=all".to_owned(),
        format!("--name={}", names.join(",")),
        "--Format=JobID:|,Name:|,State:|,Reason:|,exit_code:|,TimeUsed:|".to_owned(),
    ]
}

/// Parses [`squeue_args`]'s output; lines that do not parse are skipped.
pub fn parse_squeue(out: &str) -> Vec<JobStatus> {
    out.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.trim().split('|').map(str::trim).collect();
            let [id, name, state, reason, status, ref rest @ ..] = f[..] else {
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
                ran: ran_of(&state, rest.first().copied()),
                state,
                reason: known(reason),
                exit,
            })
        })
        .collect()
}

/// How long a job ran, from a query's time field, unless it has not started (a pending job's
/// `0:00` says nothing of when it will).
fn ran_of(state: &JobState, field: Option<&str>) -> Option<Duration> {
    if *state == JobState::Pending {
        return None;
    }
    parse_elapsed(field?)
}

/// Slurm's elapsed time: `SS`, `M:SS`, `MM:SS`, `H:MM:SS` or `D-HH:MM:SS` (`squeue`'s
/// `TimeUsed` drops leading zero fields, `sacct` and `scontrol` print `HH:MM:SS`).
pub fn parse_elapsed(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (days, clock) = match s.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().ok()?, rest),
        None => (0, s),
    };
    let parts: Vec<u64> = clock
        .split(':')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let (h, m, sec) = match parts[..] {
        [sec] => (0, 0, sec),
        [m, sec] => (0, m, sec),
        [h, m, sec] => (h, m, sec),
        _ => return None,
    };
    if m >= 60 || sec >= 60 {
        return None;
    }
    Some(Duration::from_secs(((days * 24 + h) * 60 + m) * 60 + sec))
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

/// `sacct`'s argv: allocations only, parsable, no header; `id|name|state|code:signal|elapsed`.
pub fn sacct_args(which: Accounting<'_>) -> Vec<String> {
    let mut args = vec![
        "sacct".to_owned(),
        "--allocations".to_owned(),
        "--parsable2".to_owned(),
        "--noheader".to_owned(),
        "--format=JobID,JobName,State,ExitCode,Elapsed".to_owned(),
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

/// Where a run asks about the jobs `squeue` no longer lists, decided at run time by the first
/// `sacct` that answers: a cluster with accounting keeps asking `sacct` (one query for all
/// such jobs); one without it (`sacct` exits 1, "accounting storage is disabled") asks
/// `scontrol show job` instead, which knows a job until `MinJobAge` after its end, and stops
/// calling `sacct` at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Not decided yet: ask `sacct`, and decide from how it answers.
    Undecided,
    /// The cluster keeps accounting: `sacct`.
    Sacct,
    /// It keeps none: `scontrol`.
    Scontrol,
}

impl Lookup {
    /// The lookup after an `sacct` call that exited `success` with `stderr`. Only the answer
    /// "accounting storage is disabled" turns it to `scontrol`; any other failure (slurmdbd
    /// away for a moment, a timeout) decides nothing, and a success decides `sacct` for good.
    pub fn after_sacct(self, success: bool, stderr: &str) -> Lookup {
        match self {
            Lookup::Undecided if success => Lookup::Sacct,
            Lookup::Undecided if sacct_disabled(stderr) => Lookup::Scontrol,
            other => other,
        }
    }

    /// Whether this lookup asks `sacct` (undecided or decided so).
    pub fn asks_sacct(self) -> bool {
        self != Lookup::Scontrol
    }
}

/// Parses [`sacct_args`]'s output. Rows named `allocation` (sacct's placeholder right after a
/// start or an end) and job steps are skipped; so is any row that does not parse.
pub fn parse_sacct(out: &str) -> Vec<JobStatus> {
    out.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.trim().split('|').collect();
            let [id, name, state, code, ref rest @ ..] = f[..] else {
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
                ran: ran_of(&state, rest.first().copied()),
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

/// Parses `scontrol show job` output: one job per line with `--oneliner`, or blocks of lines
/// without it (several jobs when asked for all).
pub fn parse_scontrol(out: &str) -> Vec<JobStatus> {
    // A record starts at each `JobId=` (each line with --oneliner; a block without it).
    let mut records: Vec<String> = Vec::new();
    for line in out.lines() {
        match records.last_mut() {
            Some(r) if !line.trim_start().starts_with("JobId=") => {
                r.push(' ');
                r.push_str(line);
            }
            _ => records.push(line.to_owned()),
        }
    }
    let mut jobs = Vec::new();
    for block in &records {
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
            ran: ran_of(&state, field("RunTime")),
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
    /// Its script ended with this exit (completed or failed).
    Exited(Exit),
    /// Slurm killed it for using more memory than it asked for (`OUT_OF_MEMORY`), with its
    /// script's exit when known.
    OutOfMemory(Option<Exit>),
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
        JobState::OutOfMemory => JobEnd::OutOfMemory(exit),
        JobState::Cancelled => JobEnd::Cancelled,
        JobState::Timeout => JobEnd::TimedOut,
        JobState::Lost(state) => JobEnd::Lost(state.clone()),
    })
}

impl JobEnd {
    /// The exit to hand the protocol reader (which reads the output so far): the script's own
    /// when Slurm gave one, else SIGKILL (what a job Slurm ended without one went through).
    pub fn exit(&self, job: &JobStatus) -> Exit {
        match self {
            JobEnd::Exited(exit) => *exit,
            JobEnd::Cancelled => Exit::Signal(libc::SIGTERM),
            _ => job.exit.unwrap_or(Exit::Signal(libc::SIGKILL)),
        }
    }

    /// The attempt's outcome for an end Slurm caused (not one the protocol reader classifies
    /// from an exit, nor one sortie asked for), naming the job and its Slurm state:
    /// - `TIMEOUT` (or `DEADLINE`): Slurm's time limit is the attempt's timeout, as a local
    ///   attempt timeout reads (`timeout`, phase running; not retried);
    /// - `NODE_FAIL`, `PREEMPTED`, `BOOT_FAIL`, `REVOKED`: the cluster lost it, which is not
    ///   the task's fault: a transient error, retried;
    /// - `FAILED` before its script ran: a launch failure, transient;
    /// - `OUT_OF_MEMORY`: a failure of the task as specified (its memory), not retried;
    /// - `CANCELLED` by someone else: an unexpected signal (transient, as a kill from outside is
    ///   locally).
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
                    format!("Slurm job {job} was cancelled outside sortie (CANCELLED)"),
                )
            }),
            JobEnd::TimedOut => Some(AttemptOutcome {
                status: AttemptStatus::Failed,
                phase: Some(Phase::Running),
                ..AttemptOutcome::failed(
                    StopReason::Timeout,
                    format!("Slurm job {job} reached its time limit (TIMEOUT)"),
                )
            }),
            JobEnd::OutOfMemory(exit) => Some(AttemptOutcome {
                exit_code: match exit {
                    Some(Exit::Code(c)) if *c != 0 => Some(*c),
                    _ => None,
                },
                signal: match exit {
                    Some(Exit::Signal(s)) => Some(*s),
                    _ => Some(libc::SIGKILL),
                },
                ..AttemptOutcome::failed(
                    StopReason::NonzeroExit,
                    format!(
                        "Slurm job {job} ran out of memory (OUT_OF_MEMORY): it used more than \
                         it asked for; raise the task's `[slurm] mem`"
                    ),
                )
            }),
            JobEnd::Lost(state) => {
                let why = match state.as_str() {
                    "NODE_FAIL" => "its node failed",
                    "PREEMPTED" => "it was preempted",
                    "BOOT_FAIL" => "its node failed to boot",
                    "REVOKED" => "it was revoked (it ran on another cluster)",
                    _ => "the cluster lost it",
                };
                Some(AttemptOutcome::failed(
                    StopReason::Error,
                    format!("Slurm job {job} ended {state}: {why}"),
                ))
            }
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
                "--Format=JobID:|,Name:|,State:|,Reason:|,exit_code:|,TimeUsed:|",
            ]
        );
    }

    // Recorded from slurm-wlm 22.05.8 (the project's CI cluster, `.ci/slurm/up.sh`): one job
    // completed, one `exit 7`, one running, one submitted held (`-H`), one past its `-t 1`,
    // one cancelled; `squeue_args`' format, `sacct_args`' format, and `scontrol show job`.
    const SQUEUE: &str = include_str!("recorded/squeue-22.05.8.txt");
    const SACCT: &str = include_str!("recorded/sacct-22.05.8.txt");
    const SCONTROL: &str = include_str!("recorded/scontrol-oneliner-22.05.8.txt");
    const SCONTROL_BLOCKS: &str = include_str!("recorded/scontrol-block-22.05.8.txt");

    /// What squeue and scontrol say of the six recorded jobs: (id, state, exit, ran).
    fn recorded() -> Vec<(u64, JobState, Option<Exit>, Option<u64>)> {
        vec![
            (1038, JobState::Completed, Some(Exit::Code(0)), Some(2)),
            (1039, JobState::Failed, Some(Exit::Code(7)), Some(1)),
            (1040, JobState::Running, None, Some(103)),
            (1041, JobState::Pending, None, None),
            (1042, JobState::Timeout, Some(Exit::Code(143)), Some(65)),
            (1043, JobState::Cancelled, Some(Exit::Signal(15)), Some(17)),
        ]
    }

    /// The reasons squeue and scontrol give for the recorded jobs.
    fn assert_reasons(jobs: &[JobStatus]) {
        let by = |id| jobs.iter().find(|j| j.id == JobId(id)).unwrap();
        assert_eq!(by(1039).reason.as_deref(), Some("NonZeroExitCode"));
        assert_eq!(by(1041).reason.as_deref(), Some("JobHeldUser"));
        assert_eq!(by(1042).reason.as_deref(), Some("TimeLimit"));
        assert_eq!(by(1040).reason, None);
        assert_eq!(by(1038).reason, None);
    }

    /// (id, state, exit, ran in seconds) of each job.
    fn seen(jobs: &[JobStatus]) -> Vec<(u64, JobState, Option<Exit>, Option<u64>)> {
        let mut v: Vec<_> = jobs
            .iter()
            .map(|j| (j.id.0, j.state.clone(), j.exit, j.ran.map(|d| d.as_secs())))
            .collect();
        v.sort_by_key(|t| t.0);
        v
    }

    #[test]
    fn squeue_lines_give_state_reason_exit_and_run_time() {
        let mut out = SQUEUE.to_owned();
        out.push_str("garbage line\n");
        let jobs = parse_squeue(&out);
        assert_eq!(seen(&jobs), recorded());
        let by = |id| jobs.iter().find(|j| j.id == JobId(id)).unwrap();
        assert_eq!(by(1039).name, "rec-fail");
        assert_reasons(&jobs);
        // A format without the time field (an older sortie's query) still parses.
        let old = parse_squeue("5|sortie:r:4:1:a|RUNNING|None|0|\n");
        assert_eq!(
            (old[0].state.clone(), old[0].ran),
            (JobState::Running, None)
        );
    }

    #[test]
    fn elapsed_times_in_every_shape_slurm_prints() {
        let s = |n| Some(Duration::from_secs(n));
        assert_eq!(parse_elapsed("0:00"), s(0));
        assert_eq!(parse_elapsed("1:05"), s(65));
        assert_eq!(parse_elapsed("00:01:43"), s(103));
        assert_eq!(parse_elapsed("2:03:04"), s(7384));
        assert_eq!(parse_elapsed("1-02:03:04"), s(93_784));
        assert_eq!(parse_elapsed("59"), s(59));
        for bad in ["", "INVALID", "Unknown", "1:60", "a:00", "1:2:3:4", "-1:00"] {
            assert_eq!(parse_elapsed(bad), None, "{bad}");
        }
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
        let mut out = SACCT.to_owned();
        out.push_str("1039.batch|batch|FAILED|7:0|00:00:01\n6|allocation|PENDING|0:0|00:00:00\n");
        let jobs = parse_sacct(&out);
        assert_eq!(seen(&jobs), {
            // sacct says 0:0 for the job past its limit, and for the one `CANCELLED by 0`
            // where scontrol says 0:15.
            let mut v = recorded();
            v[4].2 = Some(Exit::Code(0));
            v[5].2 = Some(Exit::Code(0));
            v
        });
        assert!(sacct_disabled(
            "sacct: error: Slurm accounting storage is disabled\n"
        ));
        assert!(!sacct_disabled(""));
    }

    #[test]
    fn the_lookup_turns_to_scontrol_only_when_accounting_is_disabled() {
        let disabled = "sacct: error: Slurm accounting storage is disabled\n";
        let down = "sacct: error: slurm_persist_conn_open_without_init: failed to open \
                    persistent connection to host:localhost:6819: Connection refused\n";
        let u = Lookup::Undecided;
        assert_eq!(u.after_sacct(true, ""), Lookup::Sacct);
        assert_eq!(u.after_sacct(false, disabled), Lookup::Scontrol);
        // slurmdbd away for a moment decides nothing: the next poll asks sacct again.
        assert_eq!(u.after_sacct(false, down), Lookup::Undecided);
        assert!(u.asks_sacct());
        // Decided for good.
        assert_eq!(Lookup::Sacct.after_sacct(false, disabled), Lookup::Sacct);
        assert_eq!(Lookup::Scontrol.after_sacct(true, ""), Lookup::Scontrol);
        assert!(!Lookup::Scontrol.asks_sacct());
    }

    #[test]
    fn scontrol_gives_state_reason_exit_name_and_run_time() {
        let jobs = parse_scontrol(SCONTROL);
        assert_eq!(seen(&jobs), recorded());
        let by = |id| jobs.iter().find(|j| j.id == JobId(id)).unwrap();
        assert_eq!(by(1042).name, "rec-timeout");
        assert_reasons(&jobs);
        // Without --oneliner: blocks separated by blank lines.
        let blocks = parse_scontrol(SCONTROL_BLOCKS);
        assert_eq!(
            seen(&blocks),
            [
                (1039, JobState::Failed, Some(Exit::Code(7)), Some(1)),
                (1042, JobState::Timeout, Some(Exit::Code(143)), Some(65)),
            ]
        );
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
            ran: None,
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
            Some(JobEnd::OutOfMemory(Some(Exit::Code(0))))
        );
        assert_eq!(end("CANCELLED by 0", None, None), Some(JobEnd::Cancelled));
        assert_eq!(end("TIMEOUT", None, None), Some(JobEnd::TimedOut));
        assert_eq!(end("DEADLINE", None, None), Some(JobEnd::TimedOut));
        for lost in ["NODE_FAIL", "PREEMPTED", "BOOT_FAIL"] {
            assert_eq!(end(lost, None, None), Some(JobEnd::Lost(lost.into())));
        }
    }

    #[test]
    fn each_end_slurm_caused_reads_as_the_user_expects() {
        use sortie_core::is_transient;
        let job = JobId(12);
        assert_eq!(JobEnd::Exited(Exit::Code(1)).outcome(job), None);
        // Slurm's time limit reads as a local attempt timeout: timeout, running, not retried.
        let timeout = JobEnd::TimedOut.outcome(job).unwrap();
        assert_eq!(
            (timeout.status, timeout.stop_reason, timeout.phase),
            (
                AttemptStatus::Failed,
                StopReason::Timeout,
                Some(Phase::Running)
            )
        );
        assert_eq!(
            timeout.error.as_deref(),
            Some("Slurm job 12 reached its time limit (TIMEOUT)")
        );
        assert!(!is_transient(&timeout));
        // The cluster losing a job is transient, and the error names the state.
        for (state, why) in [
            ("NODE_FAIL", "its node failed"),
            ("PREEMPTED", "it was preempted"),
            ("BOOT_FAIL", "its node failed to boot"),
        ] {
            let lost = JobEnd::Lost(state.into()).outcome(job).unwrap();
            assert!(is_transient(&lost), "{state}");
            assert_eq!(lost.stop_reason, StopReason::Error);
            assert_eq!(
                lost.error.as_deref(),
                Some(format!("Slurm job 12 ended {state}: {why}").as_str())
            );
        }
        // Out of memory says so, and is not retried (the next attempt asks for as little).
        let oom = JobEnd::OutOfMemory(Some(Exit::Code(0)))
            .outcome(job)
            .unwrap();
        assert!(!is_transient(&oom));
        assert_eq!(oom.signal, Some(9));
        assert!(
            oom.error
                .as_deref()
                .unwrap()
                .starts_with("Slurm job 12 ran out of memory (OUT_OF_MEMORY)"),
            "{oom:?}"
        );
        let oom = JobEnd::OutOfMemory(Some(Exit::Code(137)))
            .outcome(job)
            .unwrap();
        assert_eq!(oom.exit_code, Some(137));
        assert!(is_transient(
            &JobEnd::NotLaunched(None).outcome(job).unwrap()
        ));
        let outside = JobEnd::Cancelled.outcome(job).unwrap();
        assert!(is_transient(&outside));
        assert_eq!(outside.stop_reason, StopReason::UnexpectedSignal);
        // The reader is handed the script's exit when Slurm gave one, else SIGKILL.
        let st = status("TIMEOUT", Some(Exit::Code(143)), Some("TimeLimit"));
        assert_eq!(JobEnd::TimedOut.exit(&st), Exit::Code(143));
        let st = status("NODE_FAIL", None, None);
        assert_eq!(JobEnd::Lost("NODE_FAIL".into()).exit(&st), Exit::Signal(9));
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

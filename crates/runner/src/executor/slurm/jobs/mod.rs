//! Slurm's jobs, as data: the arguments of the `sbatch`, `squeue`, `sacct`, `scontrol` and
//! `scancel` calls that run attempts on a cluster, the parsing of what they print, and how a job's
//! end maps to an attempt's outcome. Nothing here runs a command (the calls go through
//! [`process::run_tool`](crate::process::run_tool)); everything is tested from canned output.
//!
//! Invariants:
//! - An attempt's job is named from its identity alone, `sortie:<run>:<task>:<attempt>:<incarnation>`
//!   ([`JobKey`]), so that another sortie process finds it again by name (resume), and submitting
//!   it again under the same name is recognizable as a duplicate.
//! - Every job is `--no-requeue`: sortie is the only retry loop.
//! - Every status query asks for all of a run's jobs at once ([`squeue_args`], [`sacct_args`]).
//!
//! The files: this one names jobs and builds `sbatch`'s arguments; `status.rs` parses the
//! queries' output, maps a job's end to an outcome, and paces the polls.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use sortie_core::{Attempt, RunId, SlurmOptions, TaskId};

mod status;

pub use status::{
    Accounting, JobEnd, JobState, JobStatus, Lookup, PollPace, decode_wait_status, job_end,
    parse_elapsed, parse_sacct, parse_scontrol, parse_squeue, sacct_args, sacct_disabled,
    scontrol_args, squeue_args,
};

/// The prefix of every job name sortie gives.
const NAME_PREFIX: &str = "sortie:";

/// A Slurm job id (`--parsable` prints it bare, or as `id;cluster` on multi-cluster setups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Which attempt a job runs: its name and comment say it, and nothing else is needed to find
/// it again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobKey {
    /// The run.
    pub run: RunId,
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: Attempt,
    /// The run's incarnation (its start time), which tells a same-named run apart.
    pub incarnation: u64,
}

impl JobKey {
    /// The job's name: `sortie:<run>:<task>:<attempt>:<incarnation in hex>` (a run id has no
    /// `:`, `,` or `|`, so names split, list and print unambiguously).
    pub fn name(&self) -> String {
        format!(
            "{NAME_PREFIX}{}:{}:{}:{:x}",
            self.run, self.task.0, self.attempt.0, self.incarnation
        )
    }

    /// The key a job name gives, when it is one of sortie's.
    pub fn parse(name: &str) -> Option<JobKey> {
        let rest = name.strip_prefix(NAME_PREFIX)?;
        let mut parts = rest.rsplitn(4, ':');
        let incarnation = u64::from_str_radix(parts.next()?, 16).ok()?;
        let attempt = parts.next()?.parse().ok()?;
        let task = parts.next()?.parse().ok()?;
        let run = RunId::new(parts.next()?).ok()?;
        Some(JobKey {
            run,
            task: TaskId(task),
            attempt: Attempt(attempt),
            incarnation,
        })
    }

    /// The job's comment, for people reading `squeue` or `sacct`: the same identity with the
    /// task's label (cut to 200 bytes, without newlines or `|`).
    pub fn comment(&self, label: &str) -> String {
        let mut label: String = label
            .chars()
            .map(|c| if c.is_control() || c == '|' { ' ' } else { c })
            .collect();
        if label.len() > 200 {
            let mut cut = 200;
            while !label.is_char_boundary(cut) {
                cut -= 1;
            }
            label.truncate(cut);
        }
        format!(
            "sortie run={} task={} attempt={} incarnation={:x} label={label}",
            self.run, self.task.0, self.attempt.0, self.incarnation
        )
    }
}

/// One attempt's job, as `sbatch` is to submit it.
#[derive(Debug, Clone)]
pub struct Submission<'a> {
    /// Which attempt.
    pub key: &'a JobKey,
    /// The task's label (for the comment).
    pub label: &'a str,
    /// The task's `[slurm]` options.
    pub options: &'a SlurmOptions,
    /// The job's time limit: Slurm stops it even when sortie is not there to (None: the
    /// partition's).
    pub time_limit: Option<Duration>,
    /// Where it runs (on the cluster's shared filesystem).
    pub cwd: &'a Path,
    /// The files its stdout and stderr go to, which sortie follows.
    pub stdout: &'a Path,
    /// See `stdout`.
    pub stderr: &'a Path,
    /// What it runs (executed as is, through `exec`).
    pub argv: &'a [String],
}

/// `sbatch`'s argv (starting with `sbatch`) for a submission. The job prints its id alone
/// (`--parsable`), is never requeued by Slurm, and gets the submitter's environment (sbatch's
/// default, `--export=ALL`): sortie passes the attempt's variables to `sbatch` itself.
pub fn sbatch_args(s: &Submission<'_>) -> Vec<String> {
    let mut args = vec![
        "sbatch".to_owned(),
        "--parsable".to_owned(),
        "--no-requeue".to_owned(),
        format!("--job-name={}", s.key.name()),
        format!("--comment={}", s.key.comment(s.label)),
        format!("--chdir={}", s.cwd.display()),
        format!("--output={}", s.stdout.display()),
        format!("--error={}", s.stderr.display()),
    ];
    let o = s.options;
    if let Some(p) = &o.partition {
        args.push(format!("--partition={p}"));
    }
    if let Some(a) = &o.account {
        args.push(format!("--account={a}"));
    }
    if let Some(c) = o.cpus {
        args.push(format!("--cpus-per-task={c}"));
    }
    if let Some(m) = o.mem_mb {
        args.push(format!("--mem={m}M"));
    }
    if let Some(t) = s.time_limit {
        args.push(format!("--time={}", time_limit_minutes(t)));
    }
    args.extend(o.extra_args.iter().cloned());
    args.push(format!("--wrap={}", wrap_script(s.argv)));
    args
}

/// A time limit in Slurm's whole minutes, rounded up, at least 1 (Slurm's resolution: `-t 0:05`
/// becomes a minute anyway).
pub fn time_limit_minutes(limit: Duration) -> u64 {
    limit.as_secs().div_ceil(60).max(1)
}

/// The job's script body: `exec` of the argv, each word single-quoted, so that the job's exit
/// status is the command's.
fn wrap_script(argv: &[String]) -> String {
    let words: Vec<String> = argv.iter().map(|w| shell_quote(w)).collect();
    format!("exec {}", words.join(" "))
}

/// A word single-quoted for `sh` (a `'` inside becomes `'\''`).
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The job id `sbatch --parsable` printed (`id` or `id;cluster`).
pub fn parse_sbatch(stdout: &str) -> Option<JobId> {
    let line = stdout.lines().map(str::trim).rfind(|l| !l.is_empty())?;
    let id = line.split(';').next()?;
    id.parse().ok().map(JobId)
}

/// `scancel`'s argv for jobs (TERM to the job's processes, then SIGKILL after the cluster's
/// `KillWait`). It exits 0 even for an unknown id: the job's state must be checked after.
pub fn scancel_args(jobs: &[JobId]) -> Vec<String> {
    let mut args = vec!["scancel".to_owned()];
    args.extend(jobs.iter().map(JobId::to_string));
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn key() -> JobKey {
        JobKey {
            run: RunId::new("20261201-ab.c_d").unwrap(),
            task: TaskId(17),
            attempt: Attempt(3),
            incarnation: 0x18c0_a1b2,
        }
    }

    #[test]
    fn a_job_name_gives_back_its_attempt() {
        let k = key();
        assert_eq!(k.name(), "sortie:20261201-ab.c_d:17:3:18c0a1b2");
        assert_eq!(JobKey::parse(&k.name()), Some(k));
        for other in [
            "sortie:run:1:2",
            "job:run:1:2:ff",
            "sortie:run:x:2:ff",
            "sortie:bad/run:1:2:ff",
            "sortie:run:1:2:zz",
            "allocation",
        ] {
            assert_eq!(JobKey::parse(other), None, "{other}");
        }
    }

    #[test]
    fn a_comment_names_the_task_on_one_line() {
        let c = key().comment("fix|the\nbug");
        assert_eq!(
            c,
            "sortie run=20261201-ab.c_d task=17 attempt=3 incarnation=18c0a1b2 label=fix the bug"
        );
        assert!(key().comment(&"é".repeat(300)).len() < 300);
    }

    #[test]
    fn sbatch_gets_identity_files_limits_and_extra_args() {
        let k = key();
        let options = SlurmOptions {
            partition: Some("gpu".into()),
            account: Some("lab".into()),
            cpus: Some(4),
            mem_mb: Some(8192),
            extra_args: vec!["--qos=high".into()],
        };
        let argv = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            "echo 'hi' \"$X\"".to_owned(),
        ];
        let s = Submission {
            key: &k,
            label: "t",
            options: &options,
            time_limit: Some(Duration::from_secs(61)),
            cwd: &PathBuf::from("/shared/repo"),
            stdout: &PathBuf::from("/shared/run/attempts/17.3.stdout"),
            stderr: &PathBuf::from("/shared/run/attempts/17.3.stderr"),
            argv: &argv,
        };
        let args = sbatch_args(&s);
        assert_eq!(
            args,
            [
                "sbatch",
                "--parsable",
                "--no-requeue",
                "--job-name=sortie:20261201-ab.c_d:17:3:18c0a1b2",
                "--comment=sortie run=20261201-ab.c_d task=17 attempt=3 incarnation=18c0a1b2 label=t",
                "--chdir=/shared/repo",
                "--output=/shared/run/attempts/17.3.stdout",
                "--error=/shared/run/attempts/17.3.stderr",
                "--partition=gpu",
                "--account=lab",
                "--cpus-per-task=4",
                "--mem=8192M",
                "--time=2",
                "--qos=high",
                r#"--wrap=exec 'sh' '-c' 'echo '\''hi'\'' "$X"'"#,
            ]
        );
        let bare = Submission {
            options: &SlurmOptions::default(),
            time_limit: None,
            ..s
        };
        let args = sbatch_args(&bare);
        assert!(!args.iter().any(|a| a.starts_with("--partition")
            || a.starts_with("--time")
            || a.starts_with("--mem")));
    }

    #[test]
    fn time_limits_round_up_to_whole_minutes() {
        assert_eq!(time_limit_minutes(Duration::from_secs(0)), 1);
        assert_eq!(time_limit_minutes(Duration::from_secs(60)), 1);
        assert_eq!(time_limit_minutes(Duration::from_secs(61)), 2);
        assert_eq!(time_limit_minutes(Duration::from_secs(7200)), 120);
    }

    #[test]
    fn sbatch_parsable_output_gives_the_id() {
        assert_eq!(parse_sbatch("3\n"), Some(JobId(3)));
        assert_eq!(parse_sbatch("1234;cluster2\n"), Some(JobId(1234)));
        assert_eq!(
            parse_sbatch("sbatch: warning: something\n57\n"),
            Some(JobId(57))
        );
        assert_eq!(parse_sbatch(""), None);
        assert_eq!(parse_sbatch("Submitted batch job 5"), None);
    }

    #[test]
    fn scancel_names_every_job() {
        assert_eq!(scancel_args(&[JobId(4), JobId(9)]), ["scancel", "4", "9"]);
    }
}

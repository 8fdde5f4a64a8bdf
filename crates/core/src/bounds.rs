//! The documented range of every count and duration of a task and of the run (issue 14):
//! `validate_batch` refuses a value outside it, and the batch loader places the error at the
//! field's file and line. Re-exported as `spec::bounds`.

use std::time::Duration;

use crate::spec::TaskSpec;

/// The most tasks that run at once (`concurrency`).
pub const MAX_CONCURRENCY: u32 = 1024;

/// The most bytes sortie reads of each file a batch names (issue 37): a larger file (or one
/// that never ends, such as `/dev/zero`) is refused with its path and its limit, before it
/// can fill the memory.
pub mod input_limits {
    /// A batch file (TOML or JSON Lines) and a `--defaults` file: 64 MiB.
    pub const BATCH_FILE: u64 = 64 << 20;
    /// A `for_each = { file = ... }` list: 16 MiB.
    pub const FOR_EACH_FILE: u64 = 16 << 20;
    /// An `output_schema` file: 4 MiB.
    pub const SCHEMA_FILE: u64 = 4 << 20;
    /// A role file: 1 MiB.
    pub const ROLE_FILE: u64 = 1 << 20;

    /// A limit for people: `64 MiB`, `512 KiB`, `100 bytes`.
    pub fn format(bytes: u64) -> String {
        if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
            format!("{} MiB", bytes >> 20)
        } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
            format!("{} KiB", bytes >> 10)
        } else {
            format!("{bytes} bytes")
        }
    }
}

/// The documented range of every count and duration of a task, as `(field, low, high)`:
/// a value outside it is refused before anything runs. Where 0 means off it is the low end
/// and says so (see [`bounds_errors`]). Durations in seconds.
pub mod ranges {
    use std::time::Duration;

    const MINUTE: u64 = 60;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;

    /// `max_retries`: 0 to 1000 (0: no retry).
    pub const MAX_RETRIES: u32 = 1000;
    /// `attempt_timeout`: more than 0, at most 7 days.
    pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(7 * DAY);
    /// `deadline`: more than 0, at most 30 days.
    pub const DEADLINE: Duration = Duration::from_secs(30 * DAY);
    /// `stall_after`: 0 (off: never marked stalled, never stopped for silence) to 1 day.
    pub const STALL_AFTER: Duration = Duration::from_secs(DAY);
    /// `stall_kill_after`: 0 (off: a stalled attempt is marked, never stopped) to 1 day.
    pub const STALL_KILL_AFTER: Duration = Duration::from_secs(DAY);
    /// `kill_grace`: 0 (SIGKILL right after SIGTERM) to 1 hour.
    pub const KILL_GRACE: Duration = Duration::from_secs(HOUR);
    /// `max_turns`: 1 to 10,000.
    pub const MAX_TURNS: u32 = 10_000;
    /// `grace_turns`: 0 (stop at once on a breach) to 20.
    pub const GRACE_TURNS: u32 = 20;
    /// `max_tokens`: 1 to 10^12.
    pub const MAX_TOKENS: u64 = 1_000_000_000_000;
    /// `max_cost`: more than 0, at most $1,000,000 (in nano-dollars).
    pub const MAX_COST_NANOS: u64 = 1_000_000 * 1_000_000_000;
    /// `max_output.bytes`: 1 to 1 GiB.
    pub const MAX_OUTPUT_BYTES: u64 = 1 << 30;
    /// `max_output.lines`: 1 to 10,000,000.
    pub const MAX_OUTPUT_LINES: u64 = 10_000_000;
    /// `max_rate_limits`: 0 (a rate limit spends a retry) to 1000 (issue 14).
    pub const MAX_RATE_LIMITS: u32 = 1000;
    /// `max_orphans`: 0 (an attempt a crash of sortie cut short is not retried) to 1000
    /// (issue 10).
    pub const MAX_ORPHANS: u32 = 1000;
    /// `verify_timeout`: more than 0, at most 1 day (#33).
    pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(DAY);
    /// `verify_rounds`: 0 (a failed check fails the task) to 20 (#33).
    pub const VERIFY_ROUNDS: u32 = 20;

    /// A duration as its largest whole unit when exact (`7d`, `90s`), else in milliseconds.
    pub fn format(d: Duration) -> String {
        let ms = d.as_millis();
        let units: [(u128, &str); 4] = [
            (u128::from(DAY) * 1000, "d"),
            (u128::from(HOUR) * 1000, "h"),
            (u128::from(MINUTE) * 1000, "m"),
            (1000, "s"),
        ];
        units
            .iter()
            .find(|(u, _)| ms >= *u && ms.is_multiple_of(*u))
            .map_or_else(
                || format!("{ms}ms"),
                |(u, name)| format!("{}{name}", ms / u),
            )
    }
}

/// The problems of task `t`'s counts and durations against [`bounds`], each with the fields
/// its check read.
pub(crate) fn bounds_errors(t: &TaskSpec) -> Vec<(&'static [&'static str], String)> {
    use ranges::*;
    let mut out: Vec<(&'static [&'static str], String)> = Vec::new();
    let dur = ranges::format;
    let mut duration =
        |field: &'static [&'static str], d: Duration, zero_ok: bool, max: Duration| {
            if d.is_zero() && !zero_ok {
                out.push((field, format!("must be more than 0 (at most {})", dur(max))));
            } else if d > max {
                let low = if zero_ok { "0 (off)" } else { "more than 0" };
                out.push((
                    field,
                    format!("must be {low} to {} (found {})", dur(max), dur(d)),
                ));
            }
        };
    duration(
        &["attempt_timeout"],
        t.attempt_timeout,
        false,
        ATTEMPT_TIMEOUT,
    );
    if let Some(d) = t.deadline {
        duration(&["deadline"], d, false, DEADLINE);
    }
    duration(&["stall_after"], t.stall_after, true, STALL_AFTER);
    duration(
        &["stall_kill_after"],
        t.stall_kill_after,
        true,
        STALL_KILL_AFTER,
    );
    duration(&["kill_grace"], t.kill_grace, true, KILL_GRACE);
    duration(&["verify_timeout"], t.verify_timeout, false, VERIFY_TIMEOUT);
    let mut count = |field: &'static [&'static str], v: u64, low: u64, high: u64| {
        if v < low || v > high {
            out.push((
                field,
                format!("must be between {low} and {high} (found {v})"),
            ));
        }
    };
    count(
        &["max_retries"],
        u64::from(t.max_retries),
        0,
        u64::from(MAX_RETRIES),
    );
    count(
        &["grace_turns"],
        u64::from(t.grace_turns),
        0,
        u64::from(GRACE_TURNS),
    );
    count(
        &["max_rate_limits"],
        u64::from(t.max_rate_limits),
        0,
        u64::from(MAX_RATE_LIMITS),
    );
    count(
        &["max_orphans"],
        u64::from(t.max_orphans),
        0,
        u64::from(MAX_ORPHANS),
    );
    count(
        &["verify_rounds"],
        u64::from(t.verify_rounds),
        0,
        u64::from(VERIFY_ROUNDS),
    );
    if let Some(v) = t.max_turns {
        count(&["max_turns"], u64::from(v), 1, u64::from(MAX_TURNS));
    }
    if let Some(v) = t.max_tokens {
        count(&["max_tokens"], v, 1, MAX_TOKENS);
    }
    count(&["max_output"], t.max_output.bytes, 1, MAX_OUTPUT_BYTES);
    count(&["max_output"], t.max_output.lines, 1, MAX_OUTPUT_LINES);
    if let Some(v) = t.max_cost_nanos
        && (v == 0 || v > MAX_COST_NANOS)
    {
        out.push((
            &["max_cost"],
            format!(
                "must be more than 0 and at most 1000000 (US dollars; found {})",
                v as f64 / 1e9
            ),
        ));
    }
    out
}

pub use ranges::*;

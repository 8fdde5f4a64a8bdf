//! `cargo xtask bench`: the figures of the three benchmarks (the `key=value` lines of
//! `journal_bench`, `bench/dispatch.sh` and `scale_bench`) in one Markdown table, each next to
//! its target (README.md's performance table shows the same targets) and whether this run met it.

use std::collections::BTreeMap;
use std::fmt::Write;

/// One benchmark's `key=value` figures.
pub(crate) type Keys = BTreeMap<String, String>;

/// What the benchmarks of one `cargo xtask bench` printed (None: not run).
#[derive(Default)]
pub(crate) struct Figures {
    /// `journal_bench`.
    pub(crate) journal: Option<Keys>,
    /// `bench/dispatch.sh`.
    pub(crate) dispatch: Option<Keys>,
    /// `scale_bench`.
    pub(crate) scale: Option<Keys>,
}

/// Splits `a=1 b=2` into its pairs.
pub(crate) fn keys(line: String) -> Keys {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn num(keys: &Keys, key: &str) -> Option<f64> {
    keys.get(key)
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite())
}

/// A target: the figure must be at least (true) or below (false) this.
#[derive(Clone, Copy)]
enum Target {
    AtLeast(f64),
    Below(f64),
    None,
}

fn verdict(value: Option<f64>, target: Target) -> &'static str {
    match (value, target) {
        (None, _) => "not measured",
        (Some(_), Target::None) => "",
        (Some(v), Target::AtLeast(t)) if v >= t => "met",
        (Some(v), Target::Below(t)) if v < t => "met",
        (Some(_), _) => "**missed**",
    }
}

fn thousands(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The table, with the command that produced it and the load averages the benchmarks saw.
pub(crate) fn table(f: &Figures, command: &str) -> String {
    let mut rows: Vec<(String, String, String, &'static str)> = Vec::new();
    let mut row = |what: String, value: Option<f64>, shown: String, target: Target, t: &str| {
        rows.push((what, shown, t.to_owned(), verdict(value, target)));
    };
    let mut loads = Vec::new();
    if let Some(d) = &f.dispatch {
        let n = d.get("tasks").map_or("?", String::as_str);
        let p = d.get("concurrency").map_or("?", String::as_str);
        let (s, x, g) = (num(d, "sortie_s"), num(d, "xargs_s"), num(d, "parallel_s"));
        let ratio = num(d, "ratio");
        row(
            format!("dispatch: {n} × `true` at {p}, journaled: sortie ÷ `xargs -P {p}`"),
            ratio,
            match (ratio, s, x) {
                (Some(r), Some(s), Some(x)) => format!("{r:.2}× (sortie {s:.2} s, xargs {x:.2} s)"),
                _ => "?".into(),
            },
            Target::AtLeast(0.8),
            "≥ 0.8×",
        );
        let pratio = num(d, "parallel_ratio");
        row(
            format!("dispatch: sortie ÷ GNU `parallel -j {p}`"),
            pratio,
            match (pratio, g) {
                (Some(r), Some(g)) => format!("{r:.2}× (parallel {g:.2} s)"),
                _ => "not measured".into(),
            },
            Target::AtLeast(3.0),
            "≥ 3×",
        );
        // #10: the alternatives the shepherd is measured against, and the yardsticks of what
        // supervision itself costs (`dispatch_floor`), in the same run.
        for (key, secs, what, who) in [
            (
                "attempt_ratio",
                "attempt_s",
                "sortie, a supervisor per attempt",
                "sortie",
            ),
            (
                "direct_ratio",
                "direct_s",
                "sortie, `supervise = false`",
                "sortie",
            ),
            (
                "shepherd_ratio",
                "shepherd_s",
                "sortie's shepherd alone",
                "shepherd",
            ),
            (
                "floor_ratio",
                "floor_s",
                "floor (spawn, 2 files, status)",
                "floor",
            ),
        ] {
            let (r, t) = (num(d, key), num(d, secs));
            row(
                format!("dispatch, {what} ÷ `xargs -P {p}`"),
                r,
                match (r, t) {
                    (Some(r), Some(t)) => format!("{r:.2}× ({who} {t:.2} s)"),
                    _ => "not measured".into(),
                },
                Target::None,
                "",
            );
        }
        // #34: the same batch sandboxed, and the wrapper's cost per attempt.
        let sratio = num(d, "sandbox_ratio");
        row(
            "dispatch, `sandbox = \"workspace\"` ÷ unsandboxed (throughput)".to_owned(),
            sratio,
            match (sratio, num(d, "sandbox_s"), num(d, "sandbox_setup_ms")) {
                (Some(r), Some(t), Some(ms)) => {
                    format!("{r:.2}× (sandboxed {t:.2} s; the wrapper {ms:.2} ms per attempt)")
                }
                _ => "not measured".into(),
            },
            Target::AtLeast(0.8),
            "≥ 0.8×",
        );
        loads.push(format!(
            "dispatch {}",
            d.get("load").map_or("?", String::as_str)
        ));
    }
    if let Some(j) = &f.journal {
        for (key, what) in [
            ("sync_1_per_s", "durable appends (fdatasync), 1 writer"),
            (
                "sync_16_per_s",
                "durable appends (fdatasync), 16 writers, group commit",
            ),
        ] {
            let v = num(j, key);
            row(
                what.into(),
                v,
                v.map_or("?".into(), |v| format!("{} events/s", thousands(v))),
                Target::None,
                "",
            );
        }
        let events = num(j, "replay_events").map_or("?".into(), thousands);
        for (key, what) in [("replay_per_s", "replay"), ("audit_per_s", "audit")] {
            let v = num(j, key);
            row(
                format!("{what} of {events} events"),
                v,
                v.map_or("?".into(), |v| format!("{} events/s", thousands(v))),
                Target::AtLeast(1_000_000.0),
                "≥ 1,000,000/s",
            );
        }
        loads.push(format!(
            "journal {}",
            j.get("load").map_or("?", String::as_str)
        ));
    }
    if let Some(s) = &f.scale {
        let tasks = num(s, "resume_tasks").map_or("?".into(), thousands);
        let finished = num(s, "resume_finished").map_or("?".into(), thousands);
        let first = num(s, "resume_first_spawn_s");
        row(
            format!("`sortie resume` of {tasks} tasks ({finished} finished) to the first spawn"),
            first,
            first.map_or("?".into(), |v| {
                format!(
                    "{v:.3} s, {} s of CPU ({} events in the journal; median of {} rounds)",
                    num(s, "resume_first_cpu_s").map_or("?".into(), |c| format!("{c:.2}")),
                    num(s, "resume_events").map_or("?".into(), thousands),
                    s.get("rounds").map_or("1", String::as_str)
                )
            }),
            Target::Below(0.25),
            "< 0.25 s",
        );
        let status = num(s, "status_cpu_s");
        row(
            "`sortie status` of that run (CPU: user + system)".to_owned(),
            status,
            status.map_or("not measured".into(), |c| {
                format!(
                    "{c:.2} s of CPU, {} s wall",
                    num(s, "status_s").map_or("?".into(), |w| format!("{w:.2}"))
                )
            }),
            Target::Below(0.3),
            "< 0.3 s",
        );
        let rss = num(s, "resume_rss_mb");
        row(
            "`sortie resume` of that run: peak RSS".into(),
            rss,
            rss.map_or("?".into(), |v| format!("{v:.0} MB")),
            Target::None,
            "",
        );
        let run_rss = num(s, "run_rss_mb").filter(|v| *v > 0.0);
        let run_tasks = num(s, "run_tasks").map_or("?".into(), thousands);
        row(
            format!(
                "`sortie run` of {run_tasks} × `true` (concurrency {}): peak RSS",
                s.get("run_concurrency").map_or("?", String::as_str)
            ),
            run_rss,
            match (run_rss, num(s, "run_s")) {
                (Some(m), Some(t)) => format!("{m:.0} MB (run took {t:.1} s)"),
                _ => "not measured".into(),
            },
            Target::Below(100.0),
            "< 100 MB",
        );
        loads.push(format!(
            "scale {}",
            s.get("load").map_or("?", String::as_str)
        ));
    }
    let mut out = String::new();
    let _ = writeln!(out, "| measure | figure | target | |");
    let _ = writeln!(out, "| --- | --- | --- | --- |");
    for (what, shown, target, v) in &rows {
        let _ = writeln!(out, "| {what} | {shown} | {target} | {v} |");
    }
    let _ = writeln!(out);
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let _ = write!(
        out,
        "`{command}` on {cores} cores; load average after each: {}",
        loads.join(", ")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_marks_met_and_missed_targets() {
        let f = Figures {
            dispatch: Some(keys(
                "tasks=5000 concurrency=16 xargs_s=2.0 parallel_s=20.0 sortie_s=2.5 ratio=0.8 \
                 parallel_ratio=8.0 floor_s=1.6 floor_ratio=1.25 load=3.1"
                    .into(),
            )),
            journal: None,
            scale: Some(keys(
                "resume_tasks=100000 resume_finished=99000 resume_events=496033 \
                 resume_first_spawn_s=0.9 resume_first_cpu_s=0.8 resume_rss_mb=300 \
                 status_s=0.4 status_cpu_s=0.25 rounds=3 run_tasks=0 run_concurrency=64 \
                 run_s=NaN run_rss_mb=0.0 load=2"
                    .into(),
            )),
        };
        let t = table(&f, "cargo xtask bench");
        assert!(
            t.contains("| 0.80× (sortie 2.50 s, xargs 2.00 s) | ≥ 0.8× | met |"),
            "{t}"
        );
        assert!(
            t.contains("| 8.00× (parallel 20.00 s) | ≥ 3× | met |"),
            "{t}"
        );
        assert!(t.contains("| 1.25× (floor 1.60 s) |"), "{t}");
        assert!(
            t.contains("sortie's shepherd alone ÷ `xargs -P 16` | not measured |"),
            "{t}"
        );
        assert!(
            t.contains(
                "0.900 s, 0.80 s of CPU (496,033 events in the journal; median of 3 rounds) \
                 | < 0.25 s | **missed** |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| 0.25 s of CPU, 0.40 s wall | < 0.3 s | met |"),
            "{t}"
        );
        assert!(
            t.contains("| not measured | < 100 MB | not measured |"),
            "{t}"
        );
    }

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(1_234_567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
    }
}

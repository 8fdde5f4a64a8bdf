//! `cargo xtask fuzz [--seconds N] [--rss-mb M] [TARGET...]`: every cargo-fuzz target of
//! `fuzz/` for N seconds each (default 60), one after another, then a table of executions.
//!
//! The machine has a stable toolchain only: cargo fuzz runs with `RUSTC_BOOTSTRAP=1`, which lets
//! stable rustc take the `-Z` flags (sanitizer, coverage) that libFuzzer needs. Memory is
//! bounded by libFuzzer's `-rss_limit_mb` and `-malloc_limit_mb` (default 1024 MB): going over
//! is reported as a failure like a crash, with the input that did it. Inputs are seeded from
//! the repository's samples: journal records encoded by this build (the `fuzz_seeds` example),
//! the batch files of the batch loader's tests, the recorded agent streams. The corpus grows in
//! `fuzz/corpus/TARGET` and each target's log is `fuzz/logs/TARGET.log`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// The recorded agent streams (relative to the root), the protocol readers' seeds.
const AGENT_SAMPLES: &str = "crates/protocol/tests/fixtures/agents";

/// Every target with the directories of samples it is seeded from (relative to the root).
const TARGETS: &[(&str, &[&str])] = &[
    ("journal_decode", &["fuzz/seeds/journal_decode"]),
    ("batch", &["crates/batch/tests/batches", "examples"]),
    ("protocol_pi", &[AGENT_SAMPLES]),
    ("protocol_claude", &[AGENT_SAMPLES]),
    ("protocol_codex", &[AGENT_SAMPLES]),
    ("protocol_plain", &[AGENT_SAMPLES]),
];

/// What `cargo xtask fuzz` was asked.
pub(crate) struct Options {
    seconds: u64,
    rss_mb: u64,
    targets: Vec<String>,
}

/// Parses `[--seconds N] [--rss-mb M] [TARGET...]`.
pub(crate) fn options(args: &[String]) -> Result<Options> {
    let mut o = Options {
        seconds: 60,
        rss_mb: 1024,
        targets: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Result<u64> {
            let v = match &inline {
                Some(v) => v.clone(),
                None => it
                    .next()
                    .with_context(|| format!("{name} takes a number"))?
                    .clone(),
            };
            v.parse()
                .with_context(|| format!("{name} takes a number, not {v:?}"))
        };
        match flag {
            "--seconds" => o.seconds = value("--seconds")?,
            "--rss-mb" => o.rss_mb = value("--rss-mb")?,
            t if !t.starts_with('-') && TARGETS.iter().any(|(n, _)| *n == t) => {
                o.targets.push(t.to_owned());
            }
            other => bail!(
                "unexpected argument {other:?} (--seconds N, --rss-mb M, targets: {})",
                TARGETS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    if o.targets.is_empty() {
        o.targets = TARGETS.iter().map(|(n, _)| (*n).to_owned()).collect();
    }
    Ok(o)
}

/// One target's run.
struct Ran {
    target: String,
    secs: f64,
    execs: Option<u64>,
    peak_rss_mb: Option<u64>,
    corpus: usize,
    failure: Option<String>,
}

fn cargo_fuzz(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root)
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["fuzz"]);
    cmd
}

/// Runs the targets one after another and prints the table; fails when any target failed.
pub(crate) fn fuzz(root: &Path, o: &Options) -> Result<()> {
    let version = cargo_fuzz(root)
        .arg("--version")
        .output()
        .context("cannot run cargo fuzz")?;
    if !version.status.success() {
        bail!("cargo fuzz is not installed: cargo install cargo-fuzz");
    }
    let seeds = root.join("fuzz/seeds/journal_decode");
    let mut cmd = crate::cargo(root);
    cmd.args([
        "run",
        "-q",
        "-p",
        "sortie-journal",
        "--example",
        "fuzz_seeds",
        "--",
    ])
    .arg(&seeds);
    crate::step(cmd, "journal record seeds (fuzz_seeds example)")?;
    let mut build = cargo_fuzz(root);
    build.args(["build", "-O", "--fuzz-dir", "fuzz"]);
    crate::step(build, "cargo fuzz build -O (RUSTC_BOOTSTRAP=1)")?;

    let logs = root.join("fuzz/logs");
    std::fs::create_dir_all(&logs).context("creating fuzz/logs")?;
    let mut ran = Vec::new();
    for target in &o.targets {
        ran.push(run_one(root, &logs, target, o)?);
    }
    println!();
    println!(
        "{:<16} {:>8} {:>14} {:>10} {:>8} {:>8}  result",
        "target", "seconds", "executions", "exec/s", "corpus", "rss MB"
    );
    for r in &ran {
        let execs = r.execs.map_or("?".to_owned(), |e| e.to_string());
        let rate = r
            .execs
            .map_or("?".to_owned(), |e| format!("{:.0}", e as f64 / r.secs));
        let rss = r.peak_rss_mb.map_or("?".to_owned(), |m| m.to_string());
        println!(
            "{:<16} {:>8.0} {:>14} {:>10} {:>8} {:>8}  {}",
            r.target,
            r.secs,
            execs,
            rate,
            r.corpus,
            rss,
            r.failure.as_deref().unwrap_or("ok")
        );
    }
    println!(
        "(-max_total_time={} -rss_limit_mb={} -malloc_limit_mb={}; logs in fuzz/logs)",
        o.seconds, o.rss_mb, o.rss_mb
    );
    let failed: Vec<&str> = ran
        .iter()
        .filter(|r| r.failure.is_some())
        .map(|r| r.target.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("fuzz target(s) failed: {}", failed.join(", "));
    }
    Ok(())
}

fn run_one(root: &Path, logs: &Path, target: &str, o: &Options) -> Result<Ran> {
    let corpus = root.join("fuzz/corpus").join(target);
    let artifacts = root.join("fuzz/artifacts").join(target);
    std::fs::create_dir_all(&artifacts)
        .with_context(|| format!("creating {}", artifacts.display()))?;
    std::fs::create_dir_all(&corpus).with_context(|| format!("creating {}", corpus.display()))?;
    let seeds: Vec<PathBuf> = TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .map(|(_, dirs)| dirs.iter().map(|d| root.join(d)).filter(|d| d.is_dir()))
        .into_iter()
        .flatten()
        .collect();
    let log_path = logs.join(format!("{target}.log"));
    let mut log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    // The binary cargo fuzz built, run directly: sources edited during a long run must not
    // rebuild it halfway.
    let binary = root
        .join("fuzz/target")
        .join(host_triple())
        .join("release")
        .join(target);
    let mut cmd = Command::new(&binary);
    cmd.current_dir(root)
        .arg(format!("-artifact_prefix=fuzz/artifacts/{target}/"))
        .arg(&corpus)
        .args(&seeds)
        .arg(format!("-max_total_time={}", o.seconds))
        .arg(format!("-rss_limit_mb={}", o.rss_mb))
        .arg(format!("-malloc_limit_mb={}", o.rss_mb))
        .args(["-timeout=10", "-print_final_stats=1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    eprintln!(
        "xtask: fuzz {target} for {}s (log: {})",
        o.seconds,
        log_path.display()
    );
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let (mut execs, mut peak_rss_mb, mut failure) = (None, None, None);
    if let Some(stderr) = child.stderr.take() {
        for line in BufReader::new(stderr).lines() {
            let line = line.context("reading libFuzzer's output")?;
            writeln!(log, "{line}").context("writing the log")?;
            if let Some(n) = line.strip_prefix("stat::number_of_executed_units:") {
                execs = n.trim().parse().ok();
            } else if let Some(n) = line.strip_prefix("stat::peak_rss_mb:") {
                peak_rss_mb = n.trim().parse().ok();
            } else if line.starts_with("==") && line.contains("ERROR: libFuzzer")
                || line.contains("panicked at")
                || line.contains("ERROR: AddressSanitizer")
            {
                failure.get_or_insert_with(|| line.clone());
            } else if line.contains("Test unit written to") {
                let f = failure.get_or_insert_with(String::new);
                f.push_str(&format!(" [{}]", line.trim()));
            }
        }
    }
    let status = child.wait().context("waiting for the fuzz target")?;
    let secs = start.elapsed().as_secs_f64();
    if !status.success() && failure.is_none() {
        failure = Some(format!("the target failed ({status})"));
    }
    let corpus_len = std::fs::read_dir(&corpus).map_or(0, |d| d.count());
    Ok(Ran {
        target: target.to_owned(),
        secs,
        execs,
        peak_rss_mb,
        corpus: corpus_len,
        failure,
    })
}

/// The target triple cargo fuzz builds for (it always passes `--target`): this machine's.
fn host_triple() -> String {
    let out = Command::new("rustc").arg("-vV").output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        })
        .unwrap_or_else(|| "x86_64-unknown-linux-gnu".to_owned())
}

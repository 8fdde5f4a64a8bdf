//! sortie's developer tasks, run as `cargo xtask <task>`:
//!
//! - `ci`: `cargo fmt --check`, `cargo clippy -D warnings` and `cargo test`, on the workspace;
//! - `tidy`: forbidden dependency edges and missing `//!` file docs (also a test of this crate);
//! - `crash-matrix [--short] [--write]`: sortie and GNU parallel crashed at each kind of
//!   checkpoint, what each crash cost counted, the table checked against README's (see
//!   `crash_matrix.rs`);
//! - `torture [--crashes N] [--seed S] [--tasks T]`: a batch SIGKILLed N times at random
//!   moments and resumed, every invariant checked after each crash (see `torture.rs`);
//! - `proptest [--cases N]`: the model-based property tests in release mode with N cases
//!   (default 10000), then how many cases each property ran;
//! - `bench [journal|dispatch|scale|all|slurm|ray|serve]`: the journal, dispatch and scale
//!   benchmarks, then one table of every figure against its target (see `bench.rs`).
//!   `bench serve` (#35): `bench/serve.sh`, the run page of a 100,000-task run in Chromium.
//!   `bench pools` (#14): shared rate limits against a loopback mock provider (`bench/pools.sh`).
//! - `fuzz [--seconds N] [--rss-mb M] [TARGET...]`: every cargo-fuzz target for N seconds,
//!   one after another, then the executions of each (see `fuzz.rs`).
//! - `fixture`: rewrites the journal's committed format-v1 fixture (only with a format change,
//!   in its own commit; `crates/journal/tests/fixture.rs` reads it).

#![allow(clippy::disallowed_methods, reason = "xtask runs cargo and tools")]

mod bench;
mod crash_matrix;
mod fuzz;
mod tidy;
mod tidy_cli;
mod tidy_docs;
mod tidy_executors;
mod tidy_size;
mod torture;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  ci                        cargo fmt --check, clippy -D warnings, test (the whole workspace)
  tidy                      check dependency edges between crates and //! file docs
  crash-matrix [--short] [--write]
                            kill sortie (and GNU parallel) at each kind of checkpoint, count
                            work redone, side effects twice, tokens billed twice and wasted;
                            fail when README's table disagrees (--write rewrites it)
  torture [--crashes N] [--seed S] [--tasks T] [--quiet]
                            SIGKILL a run N times (default 200) at random moments, resume,
                            check every invariant after each crash (release build)
  proptest [--cases N]      model-based property tests in release mode (default 10000 cases)
  bench [journal|dispatch|scale|all|slurm|pools]
                            journal append/replay, dispatch against xargs and GNU parallel,
                            resume of a 100k-task run and a 100k-task batch's memory; then
                            one table with the targets (default all); slurm: 200 x `true`
                            through a Slurm cluster against Snakemake and xargs sbatch --wait
  fuzz [--seconds N] [--rss-mb M] [TARGET...]
                            every fuzz target N seconds (default 60) under cargo fuzz, one
                            after another, memory bounded to M MB (default 1024)
  fixture v1|v2             write a journal format fixture (crates/journal/tests/fixtures/
                            VERSION), once, when the format is made; never rewrite one that
                            is committed: it pins what old journals hold";

/// Where the dispatch benchmark script lives (relative to the workspace root).
const DISPATCH_BENCH: &str = "bench/dispatch.sh";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("ci") => ci(&root),
        Some("tidy") => {
            let problems = tidy::check(&root)?;
            report_tidy(&problems)
        }
        Some("torture") => torture_task(&root, &args[1..]),
        Some("crash-matrix") => crash_matrix_task(&root, &args[1..]),
        Some("proptest") => proptest(&root, cases(&args[1..])?),
        Some("bench") => bench(&root, args.get(1).map(String::as_str).unwrap_or("all")),
        Some("fuzz") => fuzz::fuzz(&root, &fuzz::options(&args[1..])?),
        Some("fixture") => fixture(&root, args.get(1).map(String::as_str)),
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown task {other:?}\n\n{USAGE}"),
        None => bail!("no task given\n\n{USAGE}"),
    }
}

/// The workspace root: the parent of this crate's directory.
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_owned()
}

/// The cargo that runs us (so that `+toolchain` and `CARGO` overrides carry over).
fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root);
    cmd
}

/// Runs a command with inherited output, failing when it fails.
fn step(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let status = cmd.status().with_context(|| format!("cannot run {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

fn ci(root: &Path) -> Result<()> {
    let mut fmt = cargo(root);
    fmt.args(["fmt", "--all", "--", "--check"]);
    step(fmt, "cargo fmt --all -- --check")?;
    let mut clippy = cargo(root);
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);
    step(
        clippy,
        "cargo clippy --workspace --all-targets -- -D warnings",
    )?;
    let mut test = cargo(root);
    test.args(["test", "--workspace", "--no-fail-fast"]);
    step(test, "cargo test --workspace --no-fail-fast")?;
    eprintln!("xtask: ci passed");
    Ok(())
}

/// `cargo xtask crash-matrix`: builds the debug binary (the matrix counts, it does not time),
/// then measures.
fn crash_matrix_task(root: &Path, args: &[String]) -> Result<()> {
    let opts = crash_matrix::options(args)?;
    let mut build = cargo(root);
    build.args(["build", "-p", "sortie-cli"]);
    step(build, "cargo build -p sortie-cli")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    crash_matrix::run(root, &target.join("debug").join("sortie"), &opts)
}

/// `cargo xtask torture`: builds the release binary (what users run; it also makes the
/// export and audit after every crash cheaper), then tortures it.
fn torture_task(root: &Path, args: &[String]) -> Result<()> {
    let opts = torture::options(args)?;
    let mut build = cargo(root);
    build.args(["build", "--release", "-p", "sortie-cli"]);
    step(build, "cargo build --release -p sortie-cli")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let sortie = target.join("release").join("sortie");
    let agent = root.join("examples/agents/fake-agent.py");
    let scratch = std::env::temp_dir().join(format!("sortie-torture-{}", std::process::id()));
    eprintln!(
        "xtask: torture: {} crashes, seed {}, {} tasks per run (rerun with --seed {})",
        opts.crashes, opts.seed, opts.tasks, opts.seed
    );
    let report = torture::torture(&opts, &sortie, &agent, &scratch)?;
    println!("{}", report.text());
    Ok(())
}

/// Where the journal's format fixtures live, one folder per version (relative to the root).
const JOURNAL_FIXTURES: &str = "crates/journal/tests/fixtures";

/// `cargo xtask fixture v1|v2`: writes a journal fixture with this build (the journal's
/// `write_fixture` example), then says how to check it.
fn fixture(root: &Path, version: Option<&str>) -> Result<()> {
    let Some(version @ ("v1" | "v2")) = version else {
        bail!("fixture: give the format version, v1 or v2\n\n{USAGE}");
    };
    let dir = root.join(JOURNAL_FIXTURES).join(version);
    if dir.exists() {
        bail!(
            "fixture: {} exists; a committed fixture is never rewritten (it is what journals \
             of that format hold). Remove it by hand only if it was never committed",
            dir.display()
        );
    }
    let mut write = cargo(root);
    write
        .args([
            "run",
            "-q",
            "-p",
            "sortie-journal",
            "--example",
            "write_fixture",
            "--",
            version,
        ])
        .arg(&dir);
    step(write, "cargo run -p sortie-journal --example write_fixture")?;
    eprintln!(
        "xtask: fixture: {} written; check it with `cargo test -p sortie-journal --test \
         fixture` (v1) or `--test fixture_v2` and commit it alone",
        dir.display()
    );
    Ok(())
}

fn report_tidy(problems: &[String]) -> Result<()> {
    if problems.is_empty() {
        eprintln!("xtask: tidy: ok");
        return Ok(());
    }
    for p in problems {
        eprintln!("tidy: {p}");
    }
    bail!("tidy found {} problem(s)", problems.len())
}

fn cases(args: &[String]) -> Result<u64> {
    match args {
        [] => Ok(10_000),
        [flag, n] if flag == "--cases" => n
            .parse()
            .with_context(|| format!("--cases takes a number, not {n:?}")),
        [flag] if flag.starts_with("--cases=") => {
            let n = &flag["--cases=".len()..];
            n.parse()
                .with_context(|| format!("--cases takes a number, not {n:?}"))
        }
        other => bail!("unexpected arguments {other:?}\n\n{USAGE}"),
    }
}

/// The model tests: (package, test target).
const MODEL_TESTS: [(&str, &str); 3] = [
    ("sortie-core", "model"),
    ("sortie-journal", "model"),
    ("sortie-journal", "snapshot"),
];

fn proptest(root: &Path, cases: u64) -> Result<()> {
    let mut ran: Vec<(String, String)> = Vec::new();
    for (package, test) in MODEL_TESTS {
        let what = format!("{package} --test {test} with PROPTEST_CASES={cases} (release)");
        eprintln!("xtask: {what}");
        let mut cmd = cargo(root);
        cmd.args([
            "test",
            "--release",
            "-p",
            package,
            "--test",
            test,
            "--",
            "--nocapture",
        ])
        .env("PROPTEST_CASES", cases.to_string())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("cannot run {what}"))?;
        // Pass the output through, keeping the `proptest: NAME: N cases` lines.
        if let Some(stderr) = child.stderr.take() {
            for line in BufReader::new(stderr).lines() {
                let line = line.context("reading cargo's output")?;
                eprintln!("{line}");
                if let Some(rest) = line.strip_prefix("proptest: ") {
                    ran.push((package.to_owned(), rest.to_owned()));
                }
            }
        }
        let status = child
            .wait()
            .with_context(|| format!("waiting for {what}"))?;
        if !status.success() {
            bail!("{what} failed ({status})");
        }
    }
    println!("cases per property:");
    for (package, line) in &ran {
        println!("  {package}: {line}");
    }
    if ran.is_empty() {
        bail!("no property reported how many cases it ran");
    }
    Ok(())
}

fn bench(root: &Path, which: &str) -> Result<()> {
    let (journal, dispatch, scale) = match which {
        "journal" => (true, false, false),
        "dispatch" => (false, true, false),
        "scale" => (false, false, true),
        "all" => (true, true, true),
        // #11: needs root and a Slurm cluster (started by the script when none answers), and
        // installs Snakemake from PyPI into a venv: never part of `all`.
        "slurm" => return slurm_bench(root),
        // #14: a loopback mock provider and 200 × 3 × 2 runs of curl: not part of `all`.
        "pools" => return pools_bench(root),
        // #36: a Ray head node (started by the script when none answers): not part of `all`.
        "ray" => return ray_bench(root),
        // #35: a 100,000-task run, then its page in headless Chromium: not part of `all`.
        "serve" => return serve_bench(root),
        other => {
            bail!(
                "unknown benchmark {other:?}: journal, dispatch, scale, all, slurm, pools, ray \
                 or serve"
            )
        }
    };
    let mut figures = bench::Figures::default();
    let mut build = cargo(root);
    build.args([
        "build",
        "--release",
        "-q",
        "-p",
        "sortie-cli",
        "-p",
        "sortie-journal",
        "-p",
        "sortie-runner",
        "--examples",
        "--bins",
    ]);
    step(
        build,
        "cargo build --release (sortie, journal_bench, scale_bench)",
    )?;
    let release = root.join("target/release");
    if journal {
        let cmd = Command::new(release.join("examples/journal_bench"));
        figures.journal = Some(bench::keys(keyed_output(
            cmd,
            "journal benchmark",
            "journal_bench ",
        )?));
    }
    if dispatch {
        let script = root.join(DISPATCH_BENCH);
        let mut cmd = Command::new("bash");
        cmd.arg(&script).current_dir(root);
        figures.dispatch = Some(bench::keys(keyed_output(
            cmd,
            &format!("dispatch benchmark ({DISPATCH_BENCH})"),
            "BENCH dispatch ",
        )?));
    }
    if scale {
        let mut cmd = Command::new(release.join("examples/scale_bench"));
        cmd.arg("--sortie").arg(release.join("sortie"));
        figures.scale = Some(bench::keys(keyed_output(
            cmd,
            "scale benchmark (resume of 100k tasks, 100k-task batch)",
            "scale_bench ",
        )?));
    }
    println!();
    println!(
        "{}",
        bench::table(&figures, &format!("cargo xtask bench {which}"))
    );
    Ok(())
}

/// Runs a benchmark, passing its output through, and returns its `PREFIX key=value ...` line.
fn keyed_output(mut cmd: Command, what: &str, prefix: &str) -> Result<String> {
    eprintln!("xtask: {what}");
    cmd.stdout(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("cannot run {what}"))?;
    let mut found = None;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.with_context(|| format!("reading the output of {what}"))?;
            println!("{line}");
            if let Some(rest) = line.strip_prefix(prefix) {
                found = Some(rest.to_owned());
            }
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    found.with_context(|| format!("{what} printed no `{prefix}...` line"))
}

/// `cargo xtask bench slurm` (#11): `bench/slurm.sh` with the release build: 200 × `true`
/// through one Slurm cluster, sortie against Snakemake's Slurm executor and `xargs -P 16
/// sbatch --wait` (wall time, jobs per second, slurmctld RPCs per job from `sdiag`).
fn slurm_bench(root: &Path) -> Result<()> {
    let mut build = cargo(root);
    build.args(["build", "--release", "-q", "-p", "sortie-cli", "--bins"]);
    step(build, "cargo build --release (sortie)")?;
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("bench/slurm.sh"))
        .arg(root.join("target/release/sortie"))
        .current_dir(root);
    keyed_output(cmd, "Slurm benchmark (bench/slurm.sh)", "slurm ").map(|_| ())
}

/// `cargo xtask bench ray` (#36): `bench/ray.sh` with the release build: 200 × `true` through
/// one Ray head node, sortie (`executor = "ray"`) against `xargs -P 16` of curl submits and
/// polls, 3 interleaved rounds (wall time, jobs per second, job-API requests per job from the
/// head's access log).
fn ray_bench(root: &Path) -> Result<()> {
    let mut build = cargo(root);
    build.args(["build", "--release", "-q", "-p", "sortie-cli", "--bins"]);
    step(build, "cargo build --release (sortie)")?;
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("bench/ray.sh"))
        .arg(root.join("target/release/sortie"))
        .current_dir(root);
    keyed_output(cmd, "Ray benchmark (bench/ray.sh)", "ray ").map(|_| ())
}

/// `cargo xtask bench serve` (#35): `bench/serve.sh` (it builds the release binary and the
/// `serve_bench` example itself): a finished run of 100,000 × `true`, its run page in headless
/// Chromium, cold (a new server) and warm, then the server's CPU while idle with the page open.
fn serve_bench(root: &Path) -> Result<()> {
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("bench/serve.sh")).current_dir(root);
    keyed_output(cmd, "serve benchmark (bench/serve.sh)", "serve_bench ").map(|_| ())
}

/// `cargo xtask bench pools` (#14): `bench/pools.sh` with the release build: 200 tasks (one
/// request each, through curl, held 6 s) against a loopback mock provider that answers 429
/// above 16 requests at once, at concurrency 64 with a fixed pool and with the adaptive one, 3 rounds
/// (429s drawn, share of the provider's capacity used, tasks not completed).
fn pools_bench(root: &Path) -> Result<()> {
    let mut build = cargo(root);
    build.args(["build", "--release", "-q", "-p", "sortie-cli", "--bins"]);
    step(build, "cargo build --release (sortie)")?;
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("bench/pools.sh"))
        .arg(root.join("target/release/sortie"))
        .current_dir(root);
    keyed_output(cmd, "pools benchmark (bench/pools.sh)", "pools ").map(|_| ())
}

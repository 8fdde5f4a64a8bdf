//! The command line, as clap derive structs; their doc comments are the help text.

use sortie_runner::layout::StateDir;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Run batches of coding-agent tasks in parallel; survive anything; resume without re-running
/// finished work or billing anything twice.
#[derive(Debug, Parser)]
#[command(
    name = "sortie",
    version,
    propagate_version = true,
    after_help = EXAMPLES
)]
pub(crate) struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub(crate) global: Global,
    /// The command.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The examples `sortie --help` ends with.
const EXAMPLES: &str = "\
Examples:
  sortie run batch.toml                      run a batch, with a live board on a terminal
  sortie run --detach batch.toml             start it in the background; prints the run id
  sortie wait 2026                           wait for the run whose id starts with 2026
  sortie hold RUN --task lint                stop one task (SIGSTOP); `release` goes on
  sortie steer RUN --task fix \"use the new API\"   message a pi-rpc agent
  sortie cancel RUN --task slow              end one task cancelled, the others go on
  sortie report RUN --html report.html       the run's timeline in one HTML file
  sortie replay RUN --task fix               what happened to one task, step by step
  sortie --json status RUN                   machine-readable (docs/cli.md)
  sortie completions bash > ~/.local/share/bash-completion/completions/sortie";

/// Options every command takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// Where runs are kept.
    #[arg(long, global = true, env = "SORTIE_DIR", default_value = ".sortie")]
    pub(crate) state_dir: PathBuf,
    /// Print machine-readable JSON on stdout.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// More log output on stderr (-v, -vv); RUST_LOG works too.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    /// Print no progress while a run goes, only its summary at the end.
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// Show every task's output in a run's summary (by default only for runs of at most 20
    /// tasks).
    #[arg(long, global = true)]
    pub(crate) outputs: bool,
    /// While this process runs a run (`run`, `resume`, `cancel`), run CMD through `sh -c` each
    /// time a task ends, with SORTIE_RUN, SORTIE_TASK, SORTIE_STATE, SORTIE_COST_USD,
    /// SORTIE_ARTIFACT and SORTIE_ERROR in its environment (a notification, a chat hook).
    #[arg(long, global = true, value_name = "CMD")]
    pub(crate) on_task_end: Option<String>,
    /// Which tasks' rows the summary and `status` list: set by `dispatch` from the command's
    /// `--all` and `--state`.
    #[arg(skip)]
    pub(crate) rows: sortie_core::view::RowFilter,
}

impl Global {
    /// The state dir's layout.
    pub(crate) fn layout(&self) -> StateDir {
        StateDir::new(&self.state_dir)
    }
}

/// sortie's commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a batch file (TOML or JSON Lines), a one-off prompt, or a one-off command.
    Run(RunArgs),
    /// Resume a run that crashed or was interrupted (default: the newest unfinished run).
    Resume(RunRef),
    /// Show a run's state, live or not (default: the newest run). With `--task`, one task and
    /// each attempt's transcript (path, size, what the cap cut).
    Status(StatusArgs),
    /// List the runs in the state dir, newest first.
    List,
    /// Show a run's timeline, and its state as of a seq.
    Replay(ReplayArgs),
    /// Check a run's journal (checksums, order, transitions) and print its usage ledger.
    Audit(RunId),
    /// Cancel a run: stop it if it is live; its unfinished tasks become cancelled. With
    /// `--task`, only that task of a live run (the others go on).
    Cancel(ControlArgs),
    /// Print a run's events as JSON Lines.
    Export(ExportArgs),
    /// Print the change a task made in its kept worktree (its patch); without a label, every
    /// kept worktree's, in task order.
    Diff(DiffArgs),
    /// Apply a kept worktree's change onto your checkout as uncommitted changes (three-way);
    /// a conflict changes nothing and exits 1. `--all`: every kept worktree, in task order,
    /// stopping at the first conflict.
    Apply(ApplyArgs),
    /// Remove a kept worktree and its branch (the patch stays in the run dir).
    Discard(TaskRef),
    /// Remove kept worktrees of finished runs older than a retention; a branch with commits
    /// found nowhere else is kept.
    Gc(GcArgs),
    /// Check a batch without running it: everything `run` would refuse, and what would fail
    /// only once it runs (programs on PATH, credentials, directories, repositories, artifact
    /// directories, prompt sizes). Nothing is spawned; exit 0 when ready, 2 with every problem.
    Check(CheckArgs),
    /// Rebuild a damaged run's journal from every record that can still be read (the damaged
    /// files are moved aside, untouched), say what was lost; then `sortie resume` continues it.
    Recover(RunId),
    /// Hold a live run, or one task of it: its processes are stopped (SIGSTOP), nothing of it
    /// launches, tasks that need it wait, and its stall and attempt clocks stop. A held run
    /// that crashes resumes held.
    Hold(ControlArgs),
    /// Release what `hold` held (without `--task`: the run and every held task).
    Release(ControlArgs),
    /// Send a message to a running task's agent (pi over RPC with `can_steer`).
    Steer(SteerArgs),
    /// Change how many tasks of a live run run at once.
    Concurrency(ConcurrencyArgs),
    /// Wait for a run to end and exit with its code (0 completed, 1 failed or partial, 3
    /// interrupted; 5 when `--timeout` passed first), printing its summary.
    Wait(WaitArgs),
    /// Run a finished run's batch again as a new run: the tasks selected (by default every
    /// task that did not complete) run again, the others are carried with their results; the
    /// new run names its parent.
    Rerun(RerunArgs),
    /// Write a run's post-mortem as one self-contained HTML file: a timeline of every attempt
    /// per task (coloured by outcome, retries and fallbacks visible, held and stalled spans
    /// shaded), cost and tokens by task and model, and the summary's table.
    Report(ReportArgs),
    /// Print a shell completion script: `sortie completions bash|zsh|fish`.
    Completions(CompletionsArgs),
    // #10: transcripts.
    /// Print an attempt's transcript: the agent's stdout as it wrote it (pi's, Claude's,
    /// Codex's JSON Lines), by default of the task's last attempt; `--follow` tails a live
    /// attempt until it ends. Raw on purpose, control characters included (pipe it through
    /// `cat -v` to see them shown); every other command shows them escaped.
    Logs(LogsArgs),
    // Issue 13: structured results.
    /// Print one record per task for scoring scripts: label, state, its validated structured
    /// result (`value`, for a task with an `output_schema`), error and usage (a table; with
    /// `--json` an array, with `--jsonl` one object per line).
    Results(ResultsArgs),
    // #35: the dashboard.
    /// Serve a live dashboard of the state dir's runs and a JSON API on 127.0.0.1: prints a
    /// URL holding a random access token (every request without it is refused); controls
    /// (hold, release, cancel, steer, concurrency) are journaled as asked by `web`.
    Serve(ServeArgs),
}

/// `sortie serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The port (0: any free one).
    #[arg(long, default_value_t = 7390)]
    pub(crate) port: u16,
    /// Open the URL in the browser.
    #[arg(long)]
    pub(crate) open: bool,
    /// Listen on ADDR instead of 127.0.0.1 (anyone who can reach it and holds the token can
    /// control your runs: a warning says so).
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: Option<std::net::IpAddr>,
}

/// `sortie status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The run's id (default: the newest run).
    pub(crate) run: Option<String>,
    /// Only this task, with its attempts' transcripts.
    #[arg(long, value_name = "LABEL")]
    pub(crate) task: Option<String>,
    /// Only the tasks in these states, comma-separated (`--state failed,partial`).
    #[arg(long, value_name = "STATES")]
    pub(crate) state: Option<String>,
    /// List every task's row, even of a run of more than 50 tasks (which lists only the tasks
    /// that did not complete, and one line per state).
    #[arg(long)]
    pub(crate) all: bool,
}

/// `sortie logs`.
#[derive(Debug, Args)]
pub(crate) struct LogsArgs {
    /// The run's id.
    pub(crate) run: String,
    /// The task's label.
    pub(crate) label: String,
    /// This attempt (default: the last).
    #[arg(long, value_name = "N")]
    pub(crate) attempt: Option<u32>,
    /// Keep printing what the attempt writes until it ends (from another terminal while the
    /// run goes).
    #[arg(short, long)]
    pub(crate) follow: bool,
    /// Its stderr instead of its stdout.
    #[arg(long)]
    pub(crate) stderr: bool,
    /// The output of the task's check (`verify`) of that attempt instead: its stdout, then
    /// its stderr (the last attempt that was checked by default).
    #[arg(long, conflicts_with_all = ["stderr", "follow"])]
    pub(crate) verify: bool,
}

/// `sortie results` (issue 13).
#[derive(Debug, Args)]
pub(crate) struct ResultsArgs {
    /// The run's id (or a unique prefix); the newest run by default.
    pub(crate) run: Option<String>,
    /// One JSON object per line (JSON Lines) instead of a table.
    #[arg(long)]
    pub(crate) jsonl: bool,
    /// Only the tasks in these states, comma-separated (`--state failed,partial`).
    #[arg(long, value_name = "STATES")]
    pub(crate) state: Option<String>,
}

/// `sortie completions`.
#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    #[arg(value_parser = ["bash", "zsh", "fish"])]
    pub(crate) shell: String,
}

/// `sortie report`.
#[derive(Debug, Args)]
pub(crate) struct ReportArgs {
    /// The run's id (or a unique prefix).
    pub(crate) run: String,
    /// Where to write the HTML file.
    #[arg(long)]
    pub(crate) html: PathBuf,
}

/// `sortie wait`.
#[derive(Debug, Args)]
pub(crate) struct WaitArgs {
    /// The run's id (or a unique prefix).
    pub(crate) run: String,
    /// Give up after this long ("30s", "2h"): exit 5, the run goes on.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) timeout: Option<std::time::Duration>,
    /// List every task's row, even of a run of more than 50 tasks (which lists only the tasks
    /// that did not complete, and one line per state).
    #[arg(long)]
    pub(crate) all: bool,
}

/// A live run, or one task of it.
#[derive(Debug, Args)]
pub(crate) struct ControlArgs {
    /// The run's id (or a unique prefix).
    pub(crate) run: String,
    /// Only this task (by label).
    #[arg(long)]
    pub(crate) task: Option<String>,
}

/// `sortie steer`.
#[derive(Debug, Args)]
pub(crate) struct SteerArgs {
    /// The run's id (or a unique prefix).
    pub(crate) run: String,
    /// The task (by label).
    #[arg(long)]
    pub(crate) task: String,
    /// The message.
    pub(crate) message: String,
}

/// `sortie concurrency`.
#[derive(Debug, Args)]
pub(crate) struct ConcurrencyArgs {
    /// The run's id (or a unique prefix).
    pub(crate) run: String,
    /// How many tasks may run at once (at least 1).
    #[arg(value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) n: u32,
}

/// `sortie run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The batch file: `.toml`, or `.jsonl` (one task per line).
    pub(crate) batch: Option<PathBuf>,
    /// List every task's row, even of a run of more than 50 tasks (which lists only the tasks
    /// that did not complete, and one line per state).
    #[arg(long)]
    pub(crate) all: bool,
    /// Defaults for a JSON Lines batch (a TOML file shaped like a batch, without tasks).
    #[arg(long)]
    pub(crate) defaults: Option<PathBuf>,
    /// Run one prompt instead of a batch file.
    #[arg(long, conflicts_with = "batch")]
    pub(crate) prompt: Option<String>,
    /// The agent profile (default for every task).
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// The model (default for every task).
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// How many tasks run at once [default: 4, or the batch file's].
    #[arg(long)]
    pub(crate) concurrency: Option<u32>,
    /// Stop launching after the first failed task.
    #[arg(long)]
    pub(crate) fail_fast: bool,
    /// Let agent tasks that may write share a checkout at the same time (off by default: such a
    /// batch is refused before anything runs).
    #[arg(long)]
    pub(crate) allow_shared_writes: bool,
    /// The run's id (default: a fresh one), for scripts.
    #[arg(long)]
    pub(crate) run_id: Option<String>,
    /// Run one command instead of a batch file: `sortie run -- CMD ARGS...`.
    #[arg(last = true)]
    pub(crate) command: Vec<String>,
    /// Where attempts run: `local`, or `slurm` (one sbatch job per attempt), for every task
    /// that does not say (#11).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(sortie_core::ExecutorKind::NAMES))]
    pub(crate) executor: Option<String>,
    /// Start the run in the background: print its id and return while it goes on (its output
    /// goes to `<state-dir>/logs/<run>.log`; `sortie wait RUN` waits for it).
    #[arg(long)]
    pub(crate) detach: bool,
}

/// A run, or by default the newest.
#[derive(Debug, Args)]
pub(crate) struct RunRef {
    /// The run's id.
    pub(crate) run: Option<String>,
}

/// A run.
#[derive(Debug, Args)]
pub(crate) struct RunId {
    /// The run's id.
    pub(crate) run: String,
}

/// `sortie replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// The run's id.
    pub(crate) run: String,
    /// Only this task's events.
    #[arg(long)]
    pub(crate) task: Option<String>,
    /// Stop at this seq and show the state as of it.
    #[arg(long)]
    pub(crate) at: Option<u64>,
}

/// A task of a run, by label.
#[derive(Debug, Args)]
pub(crate) struct TaskRef {
    /// The run's id.
    pub(crate) run: String,
    /// The task's label.
    pub(crate) label: String,
}

/// `sortie gc`.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Only runs that finished at least this long ago ("7d", "12h", "0s").
    #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
    pub(crate) older_than: std::time::Duration,
}

/// `sortie export`.
#[derive(Debug, Args)]
pub(crate) struct ExportArgs {
    /// The run's id.
    pub(crate) run: String,
    /// The format (only `jsonl`).
    #[arg(long, default_value = "jsonl", value_parser = ["jsonl"])]
    pub(crate) format: String,
}

/// `sortie check`.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The batch file: `.toml`, or `.jsonl` (one task per line).
    pub(crate) batch: PathBuf,
    /// Defaults for a JSON Lines batch.
    #[arg(long)]
    pub(crate) defaults: Option<PathBuf>,
    /// The agent profile (default for every task), as `run` takes it.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// The model (default for every task), as `run` takes it.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// How many tasks would run at once.
    #[arg(long)]
    pub(crate) concurrency: Option<u32>,
    /// As `run --allow-shared-writes`.
    #[arg(long)]
    pub(crate) allow_shared_writes: bool,
    /// As `run --executor` (#11).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(sortie_core::ExecutorKind::NAMES))]
    pub(crate) executor: Option<String>,
}

/// `sortie diff`.
#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The run's id.
    pub(crate) run: String,
    /// The task's label (default: every kept worktree of the run, in task order).
    pub(crate) label: Option<String>,
}

/// `sortie apply`.
#[derive(Debug, Args)]
pub(crate) struct ApplyArgs {
    /// The run's id.
    pub(crate) run: String,
    /// The task's label.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub(crate) label: Option<String>,
    /// Every kept worktree of the run's completed tasks, in task order, each all-or-nothing;
    /// stops at the first conflict and says what was applied and what was not.
    #[arg(long)]
    pub(crate) all: bool,
    /// With --all: also apply the kept work of tasks that did not complete (failed, partial,
    /// timed out, cancelled).
    #[arg(long, requires = "all")]
    pub(crate) include_failed: bool,
    /// Commit each task's change on the current branch, one commit per task (the index must
    /// hold nothing staged).
    #[arg(long)]
    pub(crate) commit: bool,
}

/// `sortie rerun`.
#[derive(Debug, Args)]
pub(crate) struct RerunArgs {
    /// The finished run whose batch runs again.
    pub(crate) run: String,
    /// Rerun the tasks that failed.
    #[arg(long)]
    pub(crate) failed: bool,
    /// Rerun the tasks that ended partial.
    #[arg(long)]
    pub(crate) partial: bool,
    /// Rerun the tasks that timed out.
    #[arg(long)]
    pub(crate) timeout: bool,
    /// Rerun this task (repeatable), whatever its end.
    #[arg(long = "task", value_name = "LABEL")]
    pub(crate) tasks: Vec<String>,
    /// The new run's id (default: a fresh one).
    #[arg(long)]
    pub(crate) run_id: Option<String>,
}

impl RunArgs {
    /// The batch overrides `run`'s flags give.
    pub(crate) fn overrides(&self, g: &Global) -> sortie_batch::Overrides {
        overrides(
            g,
            OverrideFlags {
                concurrency: self.concurrency,
                fail_fast: self.fail_fast,
                agent: self.agent.as_deref(),
                model: self.model.as_deref(),
                allow_shared_writes: self.allow_shared_writes,
                executor: self.executor.as_deref(),
            },
        )
    }
}

impl CheckArgs {
    /// The batch overrides `check`'s flags give (`run`'s, less `--fail-fast`).
    pub(crate) fn overrides(&self, g: &Global) -> sortie_batch::Overrides {
        overrides(
            g,
            OverrideFlags {
                concurrency: self.concurrency,
                fail_fast: false,
                agent: self.agent.as_deref(),
                model: self.model.as_deref(),
                allow_shared_writes: self.allow_shared_writes,
                executor: self.executor.as_deref(),
            },
        )
    }
}

/// The flags of `run` and `check` that override a batch's fields.
struct OverrideFlags<'a> {
    concurrency: Option<u32>,
    fail_fast: bool,
    agent: Option<&'a str>,
    model: Option<&'a str>,
    allow_shared_writes: bool,
    executor: Option<&'a str>,
}

/// The overrides `flags` give; isolated tasks' worktrees go under the state dir.
fn overrides(g: &Global, flags: OverrideFlags<'_>) -> sortie_batch::Overrides {
    sortie_batch::Overrides {
        concurrency: flags.concurrency,
        fail_fast: flags.fail_fast.then_some(true),
        agent: flags.agent.map(str::to_owned),
        model: flags.model.map(str::to_owned),
        allow_shared_writes: flags.allow_shared_writes.then_some(true),
        worktrees: Some(g.layout().absolute().worktrees()),
        executor: flags.executor.and_then(sortie_core::ExecutorKind::parse),
    }
}

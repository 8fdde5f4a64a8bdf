//! The attempt's driver: prepares the agent's home and session directory, spawns the child,
//! feeds its lines to the protocol reader and the watchdog, sleeps until the watchdog's next
//! deadline, and carries its decisions out (reports, stdin commands, the stop).

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sortie_core::decide::{self, LaunchFailure, OutcomeRules};
use sortie_core::{AttemptOutcome, StopReason, Usage};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::watch::{Decision, Watch};
use super::{AttemptCtx, Ctl, Msg, StopRequest};
use crate::agent::{self, HomePlan, home};
use crate::clock::Anchor;
use crate::executor::{Control, Execution, LaunchRequest, Sig};
use crate::process::{self, SpawnSpec, Stdin};
use sortie_protocol::{self as protocol, Exit, ProtocolReader, RunPhase};

/// What an attempt reports at its end: its outcome, usage and output.
pub(super) type Ended = (AttemptOutcome, Usage, String);

/// An attempt whose supervisor (the run's shepherd, or its own) is gone without recording its
/// end while sortie lives: its processes were stopped first, so that its retry never runs beside
/// it, and it is journaled as orphaned (`AttemptOrphaned`: a crash, never the task's fault).
#[derive(Debug)]
pub(super) struct Orphan {
    /// Whether its processes were still running (and were killed).
    pub(super) action: sortie_core::OrphanAction,
    /// Its usage as read to the end of its output.
    pub(super) usage: Usage,
}

enum Step {
    Line(Option<process::Line>),
    Exit(Result<Exit, process::WaitError>),
    Tick,
    Stop(Option<StopRequest>),
    Ctl(Option<Ctl>),
}

/// Runs the attempt to its end.
pub(super) async fn run(
    ctx: AttemptCtx,
    tx: &mpsc::UnboundedSender<Msg>,
    mut stop_rx: mpsc::UnboundedReceiver<StopRequest>,
    mut ctl_rx: mpsc::UnboundedReceiver<Ctl>,
    control: &OnceLock<Arc<dyn Control>>,
) -> Result<Ended, Orphan> {
    // The machine-wide cap: held from before the spawn to the attempt's end.
    // #37: an attempt that waited for its slot is journaled as waiting, and its attempt clock
    // starts when the wait ends.
    let (_slot, waited_until) = match crate::slots::Pool::configured() {
        None => (None, None),
        Some(pool) => match machine_slot(pool, &mut stop_rx, || {
            let _ = tx.send(Msg::Waiting {
                task: ctx.task,
                attempt: ctx.attempt,
            });
        })
        .await
        {
            Ok((slot, waited)) => (Some(slot), waited.then(Instant::now)),
            Err(ended) => return Ok(ended),
        },
    };
    let mut child = match launch(&ctx).await {
        Ok(child) => child,
        Err(ended) => return Ok(ended),
    };
    let (task, attempt) = (ctx.task, ctx.attempt);
    if ctx.placement.handle.is_none()
        && let Some(handle) = child.handle()
    {
        let _ = tx.send(Msg::Handle {
            task,
            attempt,
            handle,
        });
    }
    let _ = control.set(child.control());
    let started = match until_started(&ctx, child.as_mut(), &mut stop_rx).await {
        Ok(s) => s,
        Err(ended) => return Ok(ended),
    };
    // An adopted attempt whose start was journaled is not reported started again.
    if ctx.adopt.as_ref().is_none_or(|a| a.started.is_none()) {
        let _ = tx.send(Msg::Started {
            task,
            attempt,
            pid: started.pid,
            start_time: started.start_time,
        });
    }
    let mut reader = protocol::reader_for(ctx.launch.protocol);
    // #13: an agent that reports a resumed session's usage over the whole session counts
    // only this attempt's part.
    if let Some(base) = ctx.launch.usage_base {
        reader = protocol::rebased(reader, base);
    }
    // #37: an agent that reports no cost is charged at its model's price (after the rebase:
    // the attempt's own tokens).
    if let Some(price) = ctx.launch.price {
        reader = protocol::priced(reader, price);
    }
    let mut stdin = child.take_stdin();
    // An adopted agent got its prompt from the sortie that launched it.
    if ctx.adopt.is_none()
        && let (Some(drive), Some(w)) = (&ctx.launch.drive, stdin.as_mut())
        && let Err(e) = w.send_line(&drive.prompt_command).await
    {
        // It exited at once; its exit and stderr say why.
        tracing::debug!("cannot send the prompt to attempt {}: {e}", ctx.attempt);
        stdin = None;
    }
    let steerable = ctx
        .launch
        .drive
        .as_ref()
        .is_some_and(|d| d.wrap_up_command.is_some());
    // The clocks run from the journaled launch: an adopted attempt's timeout is re-armed
    // from it, not from the adoption.
    let anchor = Anchor::now();
    // #11: a batch job's clocks (stall, attempt timeout) start when it runs, not while it
    // waits in the cluster's queue, launched or adopted: from its real start, which the
    // scheduler tells (its run time so far); the deadline is a time of day and is not moved.
    let began = match child.ran_before() {
        Some(ran) => anchor.instant.checked_sub(ran).unwrap_or(anchor.instant),
        None if ctx.executor.can().clocks_from_real_start => anchor.instant,
        None => waited_until.unwrap_or_else(|| anchor.instant_of_past(ctx.launched_at)),
    };
    let mut watch = Watch::new(
        ctx.limits.clone(),
        began,
        anchor,
        steerable,
        stdin.is_some(),
    );
    if let Some((seen, last_output)) = ctx.resumed {
        // Silence before the job's start (its stdout's mtime predates it) is queue time too.
        watch.resume_from(anchor.instant_of_past(last_output).max(began), seen);
    }
    let mut driver = Driver {
        ctx: &ctx,
        tx,
        stopper: child.control(),
        stdin,
        watch,
        stop_task: None,
        activity: None,
        offset: 0,
        read_sent: 0,
        replaying: (ctx.read_until > 0).then_some(Usage::ZERO),
        session_sent: false,
        steer_repair: super::repair::SteerRepair::of(&ctx),
    };
    let exit = driver
        .watch_child(child.as_mut(), reader.as_mut(), &mut stop_rx, &mut ctl_rx)
        .await;
    let steered = driver.steer_repair.was_sent();
    let ended = driver.finish(child, reader, exit).await?;
    // Issue 13: a structured result is checked, and repaired once where the agent can be.
    Ok(super::repair::structured(&ctx, ended, steered, tx, &mut stop_rx, &mut ctl_rx).await)
}

/// Waits until the attempt runs (at once for a local one; a batch job may wait in the
/// cluster's queue). A stop request (Ctrl-C, a cancel, the run's budget) or the task's deadline
/// while it waits stops it through its executor (a queued job is cancelled, never left behind),
/// and that is the attempt's end, unless it ended by itself first.
async fn until_started(
    ctx: &AttemptCtx,
    child: &mut dyn Execution,
    stop_rx: &mut mpsc::UnboundedReceiver<StopRequest>,
) -> Result<crate::executor::Started, Ended> {
    let deadline = ctx.limits.deadline_at.map(|t| Anchor::now().instant_of(t));
    let mut open = true;
    let req = loop {
        tokio::select! {
            started = child.started() => {
                return started.map_err(|e| {
                    let msg = e.to_string();
                    (AttemptOutcome::failed(StopReason::SpawnError, msg.clone()), Usage::ZERO, msg)
                });
            }
            req = stop_rx.recv(), if open => match req {
                Some(req) => break req,
                None => open = false,
            },
            () = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => break StopRequest {
                reason: StopReason::Timeout,
                phase: Some(sortie_core::Phase::Queued),
                message: "deadline exceeded while waiting in the cluster's queue".into(),
            },
        }
    };
    let stopper = child.control();
    stopper.stop(req.reason, ctx.kill_grace).await;
    if stopper.sent_reason().is_none() {
        // It ran (and ended) before the stop reached it: its own end stands.
        return child.started().await.map_err(|e| {
            let msg = e.to_string();
            (
                AttemptOutcome::failed(StopReason::SpawnError, msg.clone()),
                Usage::ZERO,
                msg,
            )
        });
    }
    let mut outcome = AttemptOutcome::failed(req.reason, req.message.clone());
    outcome.phase = req.phase;
    Err((outcome, Usage::ZERO, req.message))
}

/// Prepares the home and the session directory, then launches the attempt through its
/// executor (or, for an attempt resume found, follows it again); a failure is the attempt's
/// end.
async fn launch(ctx: &AttemptCtx) -> Result<Box<dyn Execution>, Ended> {
    let failed = |at: LaunchFailure, msg: String| (at.outcome(msg.clone()), Usage::ZERO, msg);
    if let Some(adoption) = &ctx.adopt {
        return ctx
            .executor
            .adopt(adoption.clone())
            .await
            .map_err(|e| failed(LaunchFailure::Adopt, e.to_string()));
    }
    if let Some(e) = &ctx.env_error {
        return Err(failed(LaunchFailure::Secret, e.clone()));
    }
    let argv = match &ctx.launch.argv {
        Ok(argv) => argv.clone(),
        Err(e) => return Err(failed(LaunchFailure::Argv, e.to_string())),
    };
    if let Some((src, skip)) = &ctx.copy_from {
        let (src, dest, skip) = (src.clone(), ctx.cwd.clone(), skip.clone());
        let made = tokio::task::spawn_blocking(move || crate::copy::prepare(&src, &dest, &skip))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        match made {
            Ok(c) if c.made => tracing::debug!(
                "task {}: copied {} file(s), {} reflinked, {} bytes",
                ctx.task,
                c.files,
                c.reflinked,
                c.bytes
            ),
            Ok(_) => {}
            Err(e) => {
                let src = &ctx.copy_from.as_ref().map(|(s, _)| s.display().to_string());
                let msg = format!(
                    "cannot copy {} for `isolation = \"copy\"`: {e}",
                    src.as_deref().unwrap_or("its cwd")
                );
                return Err(failed(LaunchFailure::Copy, msg));
            }
        }
    }
    let env = match &ctx.launch.home {
        None => ctx.env.clone(),
        Some(plan) => match prepare_home(plan.clone()).await {
            Ok(home) => home.child_env(&ctx.env),
            Err(e) => {
                let at = match e {
                    agent::HomeError::Io { .. } => LaunchFailure::HomeFiles,
                    agent::HomeError::Invalid { .. } => LaunchFailure::HomeConfig,
                };
                return Err(failed(at, e.to_string()));
            }
        },
    };
    let mut spec = SpawnSpec {
        argv,
        cwd: ctx.cwd.clone(),
        env,
        marker: ctx.marker.clone(),
    };
    // #34: a sandboxed attempt runs through `sortie __sandbox`, or not at all.
    if let Some(plan) = &ctx.sandbox {
        spec = super::sandbox::confine(plan, spec, &ctx.launch)
            .map_err(|e| failed(LaunchFailure::Sandbox, e))?;
    }
    if let Some(dir) = &ctx.launch.session_dir
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        let msg = format!("cannot create the session directory {}: {e}", dir.display());
        return Err(failed(LaunchFailure::SessionDir, msg));
    }
    if let Some((file, prompt)) = &ctx.launch.stdin_prompt
        && let Err(e) = write_prompt(file, prompt)
    {
        let msg = format!("cannot write the prompt to {}: {e}", file.display());
        return Err(failed(LaunchFailure::PromptFile, msg));
    }
    let req = LaunchRequest {
        placement: ctx.placement.clone(),
        spawn: spec,
        piped_stdin: ctx.launch.drive.is_some(),
        stdin_file: ctx
            .launch
            .stdin_prompt
            .as_ref()
            .map(|(file, _)| file.clone()),
    };
    ctx.executor
        .launch(req)
        .await
        .map_err(|e| failed(LaunchFailure::Spawn(e.fault()), e.to_string()))
}

/// Waits for a free slot of the machine-wide pool; a stop request ends the wait (the attempt
/// ends with the request's reason, never spawned).
/// `waiting` is called once, when the first try finds no slot free; the slot comes back with
/// whether it was waited for.
async fn machine_slot(
    pool: &crate::slots::Pool,
    stop_rx: &mut mpsc::UnboundedReceiver<StopRequest>,
    waiting: impl FnOnce(),
) -> Result<(crate::slots::Slot, bool), Ended> {
    let mut open = true;
    let mut waiting = Some(waiting);
    loop {
        match pool.try_take() {
            Ok(Some(slot)) => return Ok((slot, waiting.is_none())),
            Ok(None) => {
                if let Some(say) = waiting.take() {
                    say();
                }
            }
            Err(e) => {
                let msg = format!(
                    "cannot take a machine-wide slot in {}: {e}",
                    pool.dir.display()
                );
                return Err((
                    AttemptOutcome::failed(StopReason::SpawnError, msg.clone()),
                    Usage::ZERO,
                    msg,
                ));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(crate::slots::POLL) => {}
            req = stop_rx.recv(), if open => match req {
                Some(req) => {
                    let mut outcome = AttemptOutcome::failed(req.reason, req.message.clone());
                    outcome.phase = req.phase;
                    return Err((outcome, Usage::ZERO, req.message));
                }
                None => open = false,
            },
        }
    }
}

/// Writes an attempt's prompt file (its directory created), for the child's stdin.
fn write_prompt(file: &std::path::Path, prompt: &str) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(file, prompt)
}

/// A live attempt's state beside its child: the watchdog and what carries out its decisions.
pub(super) struct Driver<'a> {
    pub(super) ctx: &'a AttemptCtx,
    pub(super) tx: &'a mpsc::UnboundedSender<Msg>,
    pub(super) stopper: Arc<dyn Control>,
    pub(super) stdin: Option<Stdin>,
    pub(super) watch: Watch,
    pub(super) stop_task: Option<JoinHandle<StopReason>>,
    /// The last activity reported, so that only changes are sent.
    pub(super) activity: Option<String>,
    /// #10: the end of the last line read (a supervised attempt's checkpoints journal it).
    pub(super) offset: u64,
    /// #10: the offset last sent as read (`Msg::Read`).
    pub(super) read_sent: u64,
    /// #10: while an adopted attempt's lines before the journaled offset are read again (they
    /// rebuild the reader's state and are not reported: the journal has what they said), the
    /// usage the reader made of them so far.
    pub(super) replaying: Option<Usage>,
    /// #13: whether the agent's session id was sent.
    pub(super) session_sent: bool,
    /// Issue 13: the repair request of a structured result, for an agent steered over stdin.
    pub(super) steer_repair: super::repair::SteerRepair,
}

impl Driver<'_> {
    /// Reads the child's lines and follows the clocks until the leader exited.
    pub(super) async fn watch_child(
        &mut self,
        child: &mut dyn Execution,
        reader: &mut dyn ProtocolReader,
        stop_rx: &mut mpsc::UnboundedReceiver<StopRequest>,
        ctl_rx: &mut mpsc::UnboundedReceiver<Ctl>,
    ) -> Result<Exit, process::WaitError> {
        let mut stdout_open = true;
        let mut stop_open = true;
        let mut ctl_open = true;
        loop {
            let wake = self.watch.next_deadline();
            let far = Instant::now() + Duration::from_secs(86_400 * 365);
            let accepts_stop = stop_open && self.watch.stopping().is_none();
            let step = tokio::select! {
                step = async {
                    if stdout_open {
                        Step::Line(child.next_line().await)
                    } else {
                        Step::Exit(child.wait().await)
                    }
                } => step,
                () = tokio::time::sleep_until(wake.unwrap_or(far)), if wake.is_some() => Step::Tick,
                req = stop_rx.recv(), if accepts_stop => Step::Stop(req),
                ctl = ctl_rx.recv(), if ctl_open => Step::Ctl(ctl),
            };
            let now = Instant::now();
            let decisions = match step {
                Step::Exit(exit) => return exit,
                Step::Line(Some(line)) => {
                    if child.stdout_offset() > self.ctx.read_until {
                        self.end_replay(child, reader);
                    }
                    let progress = reader.line(&line.text);
                    // #13: also while replaying (the engine journals it once).
                    self.report_session(reader.session());
                    if let Some(replayed) = &mut self.replaying {
                        if let Some(p) = &progress {
                            *replayed = p.usage;
                        }
                        // A run that ended before the crash: its stdin is closed now.
                        if matches!(reader.run_phase(), RunPhase::Ended { failed: false }) {
                            self.stdin = None;
                        }
                        continue;
                    }
                    self.offset = child.stdout_offset();
                    self.report_activity(progress.as_ref());
                    self.watch
                        .on_line(now, progress.as_ref(), reader.run_phase())
                }
                Step::Line(None) => {
                    self.end_replay(child, reader);
                    stdout_open = false;
                    continue;
                }
                Step::Tick => self.watch.on_tick(now),
                Step::Stop(Some(req)) => self.watch.on_stop_request(req).into_iter().collect(),
                Step::Stop(None) => {
                    // The run loop dropped its handle: no request can come anymore.
                    stop_open = false;
                    continue;
                }
                Step::Ctl(Some(ctl)) => {
                    self.control(now, ctl).await;
                    continue;
                }
                Step::Ctl(None) => {
                    ctl_open = false;
                    continue;
                }
            };
            // Issue 13: a structured result's repair request instead of the end of the run.
            let phase = reader.run_phase();
            let answer = self
                .steer_repair
                .checks(&decisions)
                .then(|| reader.answer())
                .flatten();
            let decisions = self.steer_repair(decisions, phase, answer).await;
            self.carry_out(decisions).await;
            self.report_read();
        }
    }

    /// #10: the lines read again are over. If the transcript was cut below the journaled
    /// offset, the reader never saw the cut lines: what the journal counted of the lines up to
    /// that offset (its checkpoint, taken at that offset: see `engine::reports`) less what the
    /// reader made of the ones it saw is theirs, and the reader counts it
    /// (`ProtocolReader::seed`). Without a cut the reader saw every line and needs nothing.
    fn end_replay(&mut self, child: &dyn Execution, reader: &mut dyn ProtocolReader) {
        let Some(replayed) = self.replaying.take() else {
            return;
        };
        if let Some((seen, _)) = self.ctx.resumed
            && child.cut_before()
        {
            let cut = seen.minus(&replayed);
            if cut != Usage::ZERO {
                tracing::debug!(
                    "attempt {}: the cut lines counted {cut:?}",
                    self.ctx.attempt
                );
                reader.seed(cut);
            }
        }
    }

    /// Carries a user's request out: hold (SIGSTOP through the executor's `signal`, the clocks
    /// stop), release (SIGCONT, the clocks go on), steer (the agent's steer command on its
    /// stdin).
    async fn control(&mut self, now: Instant, ctl: Ctl) {
        let attempt = self.ctx.attempt;
        match ctl {
            Ctl::Hold => match self.stopper.signal(Sig::Stop) {
                Ok(true) => self.watch.on_hold(now),
                Ok(false) => {}
                Err(e) => tracing::warn!("cannot hold attempt {attempt}: {e}"),
            },
            Ctl::Release => {
                if let Err(e) = self.stopper.signal(Sig::Cont) {
                    tracing::warn!("cannot release attempt {attempt}: {e}");
                }
                self.watch.on_release(now);
            }
            Ctl::Steer(message) => {
                let steer = self.ctx.launch.drive.as_ref().and_then(|d| d.steer_command);
                if let (Some(steer), Some(w)) = (steer, self.stdin.as_mut())
                    && let Err(e) = w.send_line(&steer(&message)).await
                {
                    tracing::warn!("cannot steer attempt {attempt}: {e}");
                }
            }
        }
    }

    /// #13: sends the agent's session id on once its stream named it (journaled at once, so
    /// that a crash cannot lose what a later attempt resumes).
    fn report_session(&mut self, session: Option<&str>) {
        let Some(id) = session else { return };
        if self.session_sent {
            return;
        }
        self.session_sent = true;
        let _ = self.tx.send(Msg::Session {
            task: self.ctx.task,
            attempt: self.ctx.attempt,
            session: id.to_owned(),
        });
    }

    /// #10: whether the attempt's stdout is followed from a file (its executor says): its
    /// read offset is journaled (`AttemptRead`), adoption reads on from it, and the
    /// transcript's cutter cuts below it.
    fn follows_files(&self) -> bool {
        self.ctx.executor.can().follows_files
    }

    /// #10: a stream followed from its file, read on by
    /// [`transcript::read_step`](crate::transcript::read_step) without usage held back (everything
    /// its lines said is sent: usage, side effects, its session): the offset is sent as read, so
    /// that the transcript's cutter may cut below it (it never cuts what the journal does not hold)
    /// even while the agent reports no usage.
    fn report_read(&mut self) {
        if self.replaying.is_some()
            || self.offset
                < self
                    .read_sent
                    .saturating_add(crate::transcript::read_step())
            || !self.watch.all_reported()
            || !self.follows_files()
        {
            return;
        }
        self.read_sent = self.offset;
        let _ = self.tx.send(Msg::Read {
            task: self.ctx.task,
            attempt: self.ctx.attempt,
            offset: self.offset,
        });
    }

    /// Sends the reader's activity on when it changed (the board shows it; it is not state).
    fn report_activity(&mut self, progress: Option<&protocol::Progress>) {
        let Some(text) = progress.and_then(|p| p.activity.as_ref()) else {
            return;
        };
        if self.activity.as_ref() == Some(text) {
            return;
        }
        self.activity = Some(text.clone());
        let _ = self.tx.send(Msg::Activity {
            task: self.ctx.task,
            attempt: self.ctx.attempt,
            text: text.clone(),
        });
    }

    /// Carries the watchdog's decisions out, in order.
    async fn carry_out(&mut self, decisions: Vec<Decision>) {
        let (task, attempt) = (self.ctx.task, self.ctx.attempt);
        let mut queue = VecDeque::from(decisions);
        while let Some(decision) = queue.pop_front() {
            match decision {
                Decision::Progress(usage) => {
                    let _ = self.tx.send(Msg::Progress {
                        task,
                        attempt,
                        usage,
                    });
                    // #10: how far the stream was read for it: adoption reads on from there.
                    if self.follows_files() {
                        let offset = self.offset;
                        self.read_sent = offset;
                        let _ = self.tx.send(Msg::Read {
                            task,
                            attempt,
                            offset,
                        });
                    }
                }
                Decision::Stalled => {
                    let _ = self.tx.send(Msg::Stalled { task, attempt });
                }
                Decision::SideEffects => {
                    let _ = self.tx.send(Msg::SideEffects { task, attempt });
                }
                Decision::WrapUp => {
                    let command = self.ctx.launch.drive.as_ref();
                    let command = command.and_then(|d| d.wrap_up_command.as_ref());
                    let sent = match (command, self.stdin.as_mut()) {
                        (Some(cmd), Some(w)) => w.send_line(cmd).await.is_ok(),
                        _ => false,
                    };
                    if !sent && let Some(stop) = self.watch.wrap_up_failed() {
                        queue.push_front(stop);
                    }
                }
                Decision::CloseStdin => self.stdin = None,
                Decision::Stop(req) => {
                    let stop = self.stopper.stop(req.reason, self.ctx.kill_grace);
                    self.stop_task = Some(tokio::spawn(stop));
                }
            }
        }
    }

    /// The leader exited: waits for the stop to finish, keeps the stderr tail, and classifies
    /// the attempt. When its supervisor is gone without recording its end, its processes are
    /// stopped first (they may run on, reparented) and it is an [`Orphan`].
    pub(super) async fn finish(
        mut self,
        child: Box<dyn Execution>,
        reader: Box<dyn ProtocolReader>,
        exit: Result<Exit, process::WaitError>,
    ) -> Result<Ended, Orphan> {
        if let Some(t) = self.stop_task.take() {
            let _ = t.await;
        }
        let exit = match exit {
            Ok(e) => e,
            Err(e) => return self.lost(e).await,
        };
        let stderr = child.stderr_tail();
        keep_stderr(&self.ctx.stderr_log, &stderr);
        drop(self.stdin);
        if let Exit::Signal(_) = exit {
            let (task, attempt) = (self.ctx.task, self.ctx.attempt);
            tracing::debug!("attempt {attempt} of task {task} ended by a signal");
        }
        // Core composes the outcome from the facts, in its one order.
        let rules = OutcomeRules {
            allow_denials: self.ctx.allow_denials,
            transient_on: &self.ctx.transient_on,
            plain: self.ctx.launch.protocol == sortie_core::Protocol::Plain,
        };
        let f = decide::attempt_outcome(
            reader.finish(exit, &stderr),
            &self.watch.end(self.stopper.sent_reason()),
            child.executor_end(),
            &stderr,
            rules,
            sortie_protocol::mark_rate_limit,
            child.output_lost().as_deref(),
        );
        Ok((f.outcome, f.usage, f.output))
    }

    /// How the attempt ended is unknown (its supervisor is gone without recording it, and its
    /// agent was not handed to sortie to wait for): its process group is stopped (TERM,
    /// `kill_grace`, KILL) before anything else, and core's `lost_attempt` says what follows
    /// (an [`Orphan`], retried, once it is stopped; partial, never retried, while it may run).
    async fn lost(self, e: process::WaitError) -> Result<Ended, Orphan> {
        use sortie_core::decide::{Lost, LostAgent, lost_attempt};
        let usage = self.watch.usage();
        let agent = match e.orphan {
            None => LostAgent::Unknown,
            Some(start_time) => {
                match process::kill_group_if_same(e.pid, start_time, self.ctx.kill_grace).await {
                    process::KillResult::Killed => {
                        LostAgent::Stopped(sortie_core::OrphanAction::Killed)
                    }
                    process::KillResult::Gone => {
                        LostAgent::Stopped(sortie_core::OrphanAction::Gone)
                    }
                    process::KillResult::Survived => LostAgent::Survived,
                }
            }
        };
        match lost_attempt(agent, &e.message) {
            Lost::Orphaned(action) => {
                tracing::debug!(
                    "attempt {} of task {}: {}; {action:?}",
                    self.ctx.attempt,
                    self.ctx.task,
                    e.message
                );
                Err(Orphan { action, usage })
            }
            Lost::Ended(outcome) => {
                let msg = outcome.error.clone().unwrap_or_default();
                Ok((outcome, usage, msg))
            }
        }
    }
}

/// Keeps the last 50 KiB of an attempt's stderr beside the journal. Best effort: a log that
/// cannot be written costs the post-mortem a detail, never the run.
fn keep_stderr(path: &Path, stderr: &str) {
    if stderr.is_empty() {
        return;
    }
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(path, stderr));
    if let Err(e) = written {
        tracing::warn!("cannot keep stderr in {}: {e}", path.display());
    }
}

/// Prepares an agent home off the async threads (it copies files).
async fn prepare_home(plan: HomePlan) -> Result<home::AgentHome, agent::HomeError> {
    let dir = plan.dir.clone();
    tokio::task::spawn_blocking(move || {
        let home = home::prepare(plan.agent, &plan.dir, &plan.user)?;
        if let Some((name, store)) = &plan.session_store {
            home::link_store(&plan.dir, name, store)?;
        }
        Ok(home)
    })
    .await
    .unwrap_or_else(|e| {
        Err(agent::HomeError::Io {
            path: dir,
            source: std::io::Error::other(e.to_string()),
        })
    })
}

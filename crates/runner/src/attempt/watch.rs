//! The attempt's watchdog as a state machine, pure over a clock: times come in, decisions come
//! out. It keeps the clocks (attempt timeout, deadline, stall), the stop requests and the usage
//! seen so far, and asks core what a usage update means for the task's budget
//! (`sortie_core::budget`: breach, wrap-up, grace turns); at the end it hands core's
//! `decide::attempt_outcome` what it knew ([`Watch::end`]). The attempt's driver feeds it the
//! child's lines and its timer, and carries its [`Decision`]s out.
//!
//! Rules:
//! - No output for `stall_after`: the attempt is marked stalled (reported once); output clears
//!   the mark (reported as progress); `stall_kill_after` more of silence stops it (`stalled`).
//!   0 turns each part off: `stall_after = 0` never marks nor stops for
//!   silence; `stall_kill_after = 0` marks a stalled attempt and never stops it.
//! - `attempt_timeout` after the start, or at the task's deadline: it is stopped (`timeout`,
//!   phase `running`).
//! - A budget reached (core's rules: the task's usage, earlier attempts included): a steerable
//!   agent whose stdin is open is asked to wrap up and given `grace_turns` more turns; still
//!   working after them, it is stopped. An agent that cannot be steered (or with
//!   `grace_turns = 0`) is stopped at once. Either way the stop is `budget`, and the output so
//!   far is kept.
//! - The first stop wins: once a stop is decided, no clock, budget or request decides another.
//! - Usage never goes backwards: every reading is folded in with [`Usage::max`], and the final
//!   usage is core's `final_usage` of the reader's last word and what was seen, in
//!   `attempt_outcome`. Nowhere else is an attempt's usage made monotonic (core's `check`
//!   refuses a decrease anyway).
//! - Progress is reported at most every [`PROGRESS_EVERY`] while usage moves; usage held back
//!   by the limit is reported once the limit allows (a timer), so the journal catches up even
//!   when the agent then goes silent.
//! - For an agent driven over stdin: its stdin is closed once its run ended; a run that ended
//!   failed gets [`RETRY_SETTLE`] for the agent's own retry first.
//!
//! Several timers due at the same instant are handled in the order: progress, settle, stall,
//! attempt timeout, deadline.

use std::time::Duration;

use sortie_core::budget::{BudgetStep, BudgetWatch, TaskBudget, WrapUpAsk};
use sortie_core::decide::WatchEnd;
use sortie_core::{Phase, StopReason, Timestamp, Usage};
use tokio::time::Instant;

use crate::clock::Anchor;
use sortie_protocol::{Progress, RunPhase};

/// How often at most a progress report is sent while usage moves.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// How long a driven agent whose last call failed may stay silent before its stdin is closed:
/// pi announces a retry of its own (`auto_retry_start`) right after such a run's end.
pub(super) const RETRY_SETTLE: Duration = Duration::from_secs(2);

/// An attempt's clocks and budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limits {
    /// How long the attempt may run.
    pub(crate) attempt_timeout: Duration,
    /// The task's deadline, if it has one (wall clock).
    pub(crate) deadline_at: Option<Timestamp>,
    /// Silence after which the attempt is marked stalled.
    pub(crate) stall_after: Duration,
    /// More silence after which a stalled attempt is stopped.
    pub(crate) stall_kill_after: Duration,
    /// The task's budgets (earlier attempts count; core's rules).
    pub(crate) budget: TaskBudget,
}

/// A request to stop an attempt (core's).
pub(crate) use sortie_core::decide::StopRequest;

/// What the watchdog decided; the driver carries it out in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Decision {
    /// Report this usage to the run loop.
    Progress(Usage),
    /// Report the attempt stalled.
    Stalled,
    /// Report that the agent ran a side-effecting tool (decided once).
    SideEffects,
    /// Send the agent the wrap-up command; if it cannot be sent, tell
    /// [`Watch::wrap_up_failed`].
    WrapUp,
    /// Close the agent's stdin (it exits then).
    CloseStdin,
    /// Stop the process group (TERM, grace, KILL). Decided at most once.
    Stop(StopRequest),
}

/// The watchdog of one attempt (see the module doc).
#[derive(Debug)]
pub(super) struct Watch {
    limits: Limits,
    /// The agent can be asked to wrap up (it has a wrap-up command).
    steerable: bool,
    /// The agent's stdin is open (an agent driven over stdin, until it is closed).
    stdin_open: bool,
    timeout_at: Instant,
    deadline_at: Option<Instant>,
    last_output: Instant,
    stalled: bool,
    usage: Usage,
    sent_usage: Usage,
    last_sent: Instant,
    settle_at: Option<Instant>,
    /// The budgets and the wrap-up, if one was asked (core's [`BudgetWatch`]).
    budget: BudgetWatch,
    side_effects_sent: bool,
    stop: Option<StopRequest>,
    /// Since when the attempt is held (its processes stopped by `sortie hold`): the stall and
    /// attempt clocks do not run meanwhile.
    held_since: Option<Instant>,
}

impl Watch {
    /// A watchdog for an attempt that started at `now`; `anchor` turns the wall-clock deadline
    /// into an instant.
    pub(super) fn new(
        limits: Limits,
        now: Instant,
        anchor: Anchor,
        steerable: bool,
        stdin_open: bool,
    ) -> Watch {
        let budget = BudgetWatch::new(limits.budget.clone());
        Watch {
            budget,
            timeout_at: now + limits.attempt_timeout,
            deadline_at: limits.deadline_at.map(|t| anchor.instant_of(t)),
            limits,
            steerable,
            stdin_open,
            last_output: now,
            stalled: false,
            usage: Usage::ZERO,
            sent_usage: Usage::ZERO,
            last_sent: now,
            settle_at: None,
            side_effects_sent: false,
            stop: None,
            held_since: None,
        }
    }

    /// The attempt's processes were stopped (`sortie hold`) at `now`: the stall and attempt
    /// clocks stop with them.
    pub(super) fn on_hold(&mut self, now: Instant) {
        self.held_since.get_or_insert(now);
    }

    /// The attempt's processes were continued at `now`: the stall and attempt clocks go on from
    /// where they stood when it was held.
    pub(super) fn on_release(&mut self, now: Instant) {
        if let Some(since) = self.held_since.take() {
            let held = now.saturating_duration_since(since);
            self.timeout_at += held;
            self.last_output += held;
        }
    }

    /// An adopted attempt: its last output was at `last_output` (its stdout's mtime), and its
    /// journaled usage is `seen`, which what its stream is read to again never goes below.
    pub(super) fn resume_from(&mut self, last_output: Instant, seen: Usage) {
        self.last_output = last_output;
        self.usage = seen;
        self.sent_usage = seen;
    }

    /// The usage seen so far (never going backwards).
    pub(super) fn usage(&self) -> Usage {
        self.usage
    }

    /// Issue 13: the agent driven over stdin was given one more prompt (a structured result's
    /// repair request) instead of having its stdin closed: it is closed at the end of that run.
    pub(super) fn reopen_stdin(&mut self) {
        self.stdin_open = true;
    }

    /// The stop decided, if any.
    pub(super) fn stopping(&self) -> Option<&StopRequest> {
        self.stop.as_ref()
    }

    /// When the watchdog next needs [`Watch::on_tick`], if ever.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let progress = (self.usage != self.sent_usage).then(|| self.last_sent + PROGRESS_EVERY);
        let clocks = if self.stop.is_some() {
            [None; 3]
        } else if self.held_since.is_some() {
            // Held: only the task's deadline (wall clock) runs.
            [None, None, self.deadline_at]
        } else {
            [self.stall_at(), Some(self.timeout_at), self.deadline_at]
        };
        [progress, self.settle_at]
            .into_iter()
            .chain(clocks)
            .flatten()
            .min()
    }

    /// A stdout line came at `now`, with what the reader made of it (`progress`) and where the
    /// agent's run stands after it (`phase`).
    pub(super) fn on_line(
        &mut self,
        now: Instant,
        progress: Option<&Progress>,
        phase: RunPhase,
    ) -> Vec<Decision> {
        let mut out = Vec::new();
        self.last_output = now;
        let mut report = std::mem::take(&mut self.stalled);
        if let Some(p) = progress {
            self.usage = self.usage.max(&p.usage);
            if p.side_effects && !self.side_effects_sent {
                self.side_effects_sent = true;
                out.push(Decision::SideEffects);
            }
            self.check_budget(phase, &mut out);
        }
        if self.stdin_open {
            match phase {
                // Its run ended: closing stdin lets it exit.
                RunPhase::Ended { failed: false } => self.close_stdin(&mut out),
                RunPhase::Ended { failed: true } => {
                    self.settle_at.get_or_insert(now + RETRY_SETTLE);
                }
                _ => self.settle_at = None,
            }
        }
        if self.usage != self.sent_usage && now.duration_since(self.last_sent) >= PROGRESS_EVERY {
            report = true;
        }
        if report {
            out.push(self.report(now));
        }
        out
    }

    /// #10: whether all the usage seen was reported (none held back by the rate limit).
    pub(super) fn all_reported(&self) -> bool {
        self.usage == self.sent_usage
    }

    /// The timer fired at `now`: whatever is due.
    pub(super) fn on_tick(&mut self, now: Instant) -> Vec<Decision> {
        let mut out = Vec::new();
        if self.usage != self.sent_usage && now >= self.last_sent + PROGRESS_EVERY {
            // Rate-limited, not dropped: usage held back by the limit is sent once it allows.
            out.push(self.report(now));
        }
        if self.settle_at.is_some_and(|at| now >= at) {
            // The failed run was not retried by the agent itself: let it exit.
            self.settle_at = None;
            self.close_stdin(&mut out);
        }
        if self.stop.is_some() {
            return out;
        }
        let held = self.held_since.is_some();
        if !held && self.stall_at().is_some_and(|at| now >= at) {
            if self.stalled {
                let message = format!(
                    "no output for {}",
                    humantime::format_duration(
                        self.limits.stall_after + self.limits.stall_kill_after
                    )
                );
                self.request_stop(StopReason::Stalled, None, message, &mut out);
            } else {
                self.stalled = true;
                out.push(Decision::Stalled);
            }
        }
        if !held && now >= self.timeout_at {
            let message = format!(
                "attempt timed out after {}",
                humantime::format_duration(self.limits.attempt_timeout)
            );
            self.request_stop(StopReason::Timeout, Some(Phase::Running), message, &mut out);
        }
        if self.deadline_at.is_some_and(|at| now >= at) {
            let message = "deadline exceeded while running".to_owned();
            self.request_stop(StopReason::Timeout, Some(Phase::Running), message, &mut out);
        }
        out
    }

    /// The run loop asks the attempt to stop (first stop wins). A `budget` request (the run's
    /// budget ran out) asks a steerable agent to wrap up within its grace turns instead, as a
    /// task budget does.
    pub(super) fn on_stop_request(&mut self, req: StopRequest) -> Option<Decision> {
        let mut out = Vec::new();
        if req.reason == StopReason::Budget && self.stop.is_none() {
            let steerable = self.steerable && self.stdin_open;
            match self
                .budget
                .ask_wrap_up(req.message.clone(), &self.usage, steerable)
            {
                WrapUpAsk::Asked => return Some(Decision::WrapUp),
                WrapUpAsk::AlreadyAsked => return None,
                WrapUpAsk::Cannot => {}
            }
        }
        self.request_stop(req.reason, req.phase, req.message, &mut out);
        out.pop()
    }

    /// The wrap-up command of [`Decision::WrapUp`] could not be sent: the agent is stopped.
    pub(super) fn wrap_up_failed(&mut self) -> Option<Decision> {
        let message = self.budget.wrap_up_failed()?;
        let mut out = Vec::new();
        self.request_stop(StopReason::Budget, None, message, &mut out);
        out.pop()
    }

    /// What the watchdog knew at the attempt's end, for core's `attempt_outcome`: the usage it
    /// saw, a wrap-up's account, the stop it decided, and the stop reason that reached the
    /// running child (`sent`, see `Stopper::sent_reason`).
    pub(super) fn end(&self, sent: Option<StopReason>) -> WatchEnd {
        WatchEnd {
            seen: self.usage,
            wrapped_up: self.budget.wrapped_up(),
            stop: self.stop.clone(),
            sent,
        }
    }

    /// When silence next matters: the stall mark, then the stop. None: off (`stall_after`
    /// is 0, or the attempt is marked and `stall_kill_after` is 0).
    fn stall_at(&self) -> Option<Instant> {
        let silence = if self.limits.stall_after.is_zero() {
            return None;
        } else if self.stalled {
            if self.limits.stall_kill_after.is_zero() {
                return None;
            }
            self.limits.stall_after + self.limits.stall_kill_after
        } else {
            self.limits.stall_after
        };
        Some(self.last_output + silence)
    }

    fn report(&mut self, now: Instant) -> Decision {
        self.sent_usage = self.usage;
        self.last_sent = now;
        Decision::Progress(self.usage)
    }

    fn close_stdin(&mut self, out: &mut Vec<Decision>) {
        if std::mem::take(&mut self.stdin_open) {
            out.push(Decision::CloseStdin);
        }
    }

    fn request_stop(
        &mut self,
        reason: StopReason,
        phase: Option<Phase>,
        message: String,
        out: &mut Vec<Decision>,
    ) {
        if self.stop.is_some() {
            return;
        }
        let req = StopRequest {
            reason,
            phase,
            message,
        };
        self.stop = Some(req.clone());
        out.push(Decision::Stop(req));
    }

    /// A budget breach, or a wrap-up that ran out of grace turns (core's rules).
    fn check_budget(&mut self, phase: RunPhase, out: &mut Vec<Decision>) {
        if self.stop.is_some() {
            return;
        }
        let steerable = self.steerable && self.stdin_open;
        match self
            .budget
            .on_usage(&self.usage, steerable, phase == RunPhase::Working)
        {
            Some(BudgetStep::WrapUp) => out.push(Decision::WrapUp),
            Some(BudgetStep::Stop(message)) => {
                self.request_stop(StopReason::Budget, None, message, out);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use sortie_core::decide::{Finished, OutcomeRules, attempt_outcome};
    use sortie_core::{AttemptOutcome, AttemptStatus, Cost};

    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// How the attempt ends through core's composition of its outcome, with no executor end
    /// and no task rules.
    fn conclude(w: &Watch, f: Finished, sent: Option<StopReason>) -> Finished {
        attempt_outcome(
            f,
            &w.end(sent),
            None,
            "",
            OutcomeRules::default(),
            |_, _| {},
            None,
        )
    }

    fn limits() -> Limits {
        Limits {
            attempt_timeout: 600 * S,
            deadline_at: None,
            stall_after: 30 * S,
            stall_kill_after: 60 * S,
            budget: TaskBudget {
                grace_turns: 2,
                ..TaskBudget::default()
            },
        }
    }

    /// A watchdog started at `t0`, the wall clock then at 1_000_000 ms.
    fn watch(limits: Limits, t0: Instant, steerable: bool) -> Watch {
        let anchor = Anchor {
            wall: Timestamp(1_000_000),
            instant: t0,
        };
        Watch::new(limits, t0, anchor, steerable, steerable)
    }

    fn turns(n: u32) -> Progress {
        Progress {
            usage: Usage {
                turns: n,
                ..Usage::ZERO
            },
            side_effects: false,
            activity: None,
        }
    }

    fn stops(d: &[Decision]) -> Vec<&StopRequest> {
        d.iter()
            .filter_map(|d| match d {
                Decision::Stop(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    fn finished(has_output: bool) -> Finished {
        Finished {
            outcome: AttemptOutcome::failed(StopReason::Error, "x"),
            usage: Usage::ZERO,
            output: if has_output {
                "done".into()
            } else {
                String::new()
            },
            has_output,
        }
    }

    /// Sleeps on the paused clock until the watchdog's next deadline, then ticks.
    async fn next_tick(w: &mut Watch) -> (Duration, Vec<Decision>) {
        let at = w.next_deadline().expect("a deadline");
        tokio::time::sleep_until(at).await;
        (at.elapsed(), w.on_tick(Instant::now()))
    }

    #[tokio::test(start_paused = true)]
    async fn held_time_counts_for_neither_the_stall_nor_the_attempt_clock() {
        let t0 = Instant::now();
        let mut w = watch(
            Limits {
                attempt_timeout: 100 * S,
                ..limits()
            },
            t0,
            false,
        );
        // Held after 20 s of silence, for an hour: nothing is due meanwhile.
        tokio::time::advance(20 * S).await;
        w.on_hold(Instant::now());
        assert_eq!(w.next_deadline(), None, "no clock runs while held");
        tokio::time::advance(3600 * S).await;
        assert_eq!(w.on_tick(Instant::now()), []);
        // Released: the stall comes after the 10 s of silence that were left.
        w.on_release(Instant::now());
        let released = Instant::now();
        let (_, d) = next_tick(&mut w).await;
        assert_eq!((d, released.elapsed()), (vec![Decision::Stalled], 10 * S));
        // Output restarts the silence; the attempt's timeout is 100 s of unheld time.
        let _ = w.on_line(Instant::now(), None, RunPhase::Unknown);
        tokio::time::advance(29 * S).await;
        let _ = w.on_line(Instant::now(), None, RunPhase::Unknown);
        tokio::time::advance(29 * S).await;
        let _ = w.on_line(Instant::now(), None, RunPhase::Unknown);
        let (_, d) = next_tick(&mut w).await;
        assert!(
            matches!(&d[..], [Decision::Stop(r)] if r.reason == StopReason::Timeout),
            "{d:?}"
        );
        assert_eq!(t0.elapsed(), 3600 * S + 100 * S);
    }

    #[tokio::test(start_paused = true)]
    async fn silence_marks_stalled_then_stops_and_output_clears_the_mark() {
        let t0 = Instant::now();
        let mut w = watch(limits(), t0, false);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(d, [Decision::Stalled]);
        assert_eq!(t0.elapsed(), 30 * S);
        // Output clears the mark, reported as progress, and restarts the silence.
        tokio::time::advance(5 * S).await;
        let d = w.on_line(Instant::now(), None, RunPhase::Unknown);
        assert_eq!(d, [Decision::Progress(Usage::ZERO)]);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!((d, t0.elapsed()), (vec![Decision::Stalled], 65 * S));
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(
            t0.elapsed(),
            125 * S,
            "stall_after + stall_kill_after of silence"
        );
        let stop = stops(&d);
        assert_eq!(stop.len(), 1);
        assert_eq!(stop[0].reason, StopReason::Stalled);
        assert_eq!(stop[0].message, "no output for 1m 30s");
        assert_eq!(w.next_deadline(), None, "nothing more once stopping");
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_budget_stop_asks_a_steerable_agent_to_wrap_up_and_stops_the_others() {
        let t0 = Instant::now();
        let req = StopRequest {
            reason: StopReason::Budget,
            phase: None,
            message: "the run's budget ran out".into(),
        };
        let mut steerable = watch(limits(), t0, true);
        assert_eq!(
            steerable.on_stop_request(req.clone()),
            Some(Decision::WrapUp)
        );
        assert_eq!(steerable.on_stop_request(req.clone()), None, "asked once");
        assert!(steerable.stopping().is_none(), "given its grace turns");
        let mut plain = watch(limits(), t0, false);
        assert_eq!(
            plain.on_stop_request(req.clone()),
            Some(Decision::Stop(req))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_turns_the_stall_clock_off() {
        let t0 = Instant::now();
        let mut l = limits();
        l.stall_after = Duration::ZERO;
        l.attempt_timeout = 3600 * S;
        let mut w = watch(l, t0, false);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(
            t0.elapsed(),
            3600 * S,
            "no stall before the attempt timeout"
        );
        assert_eq!(stops(&d)[0].reason, StopReason::Timeout);

        let t0 = Instant::now();
        let mut l = limits();
        l.stall_kill_after = Duration::ZERO;
        l.attempt_timeout = 3600 * S;
        let mut w = watch(l, t0, false);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!((d, t0.elapsed()), (vec![Decision::Stalled], 30 * S));
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(
            t0.elapsed(),
            3600 * S,
            "marked stalled, never stopped for it"
        );
        assert_eq!(stops(&d)[0].reason, StopReason::Timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn the_attempt_timeout_stops_it_in_phase_running() {
        let t0 = Instant::now();
        let mut l = limits();
        l.attempt_timeout = 10 * S;
        let mut w = watch(l, t0, false);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(t0.elapsed(), 10 * S);
        assert_eq!(
            d,
            [Decision::Stop(StopRequest {
                reason: StopReason::Timeout,
                phase: Some(Phase::Running),
                message: "attempt timed out after 10s".into(),
            })]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_wall_clock_deadline_stops_it_on_the_paused_clock() {
        let t0 = Instant::now();
        let mut l = limits();
        l.deadline_at = Some(Timestamp(1_000_000 + 7_500));
        let mut w = watch(l, t0, false);
        // Output keeps the stall clock away; the deadline does not move.
        tokio::time::advance(5 * S).await;
        w.on_line(Instant::now(), None, RunPhase::Unknown);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(7_500));
        let stop = stops(&d);
        assert_eq!(stop[0].reason, StopReason::Timeout);
        assert_eq!(stop[0].phase, Some(Phase::Running));
        assert_eq!(stop[0].message, "deadline exceeded while running");
        // A deadline already past stops at the first tick.
        let mut l = limits();
        l.deadline_at = Some(Timestamp(5));
        let mut w = watch(l, Instant::now(), false);
        assert_eq!(stops(&w.on_tick(Instant::now())).len(), 1);
    }

    #[test]
    fn a_budget_breach_of_a_steerable_agent_asks_to_wrap_up_then_stops_after_the_grace() {
        let t0 = Instant::now();
        let mut l = limits();
        l.budget.max_turns = Some(5);
        l.budget.prior = Usage {
            turns: 2,
            ..Usage::ZERO
        };
        let mut w = watch(l, t0, true);
        assert!(
            w.on_line(t0, Some(&turns(2)), RunPhase::Working)
                .iter()
                .all(|d| !matches!(d, Decision::WrapUp))
        );
        let d = w.on_line(t0, Some(&turns(3)), RunPhase::Working);
        assert_eq!(
            d,
            [Decision::WrapUp],
            "5 of 5 turns, earlier attempts count"
        );
        // Within the grace turns (5 + 2), nothing more.
        assert!(stops(&w.on_line(t0, Some(&turns(4)), RunPhase::Working)).is_empty());
        assert!(stops(&w.on_line(t0, Some(&turns(5)), RunPhase::Answered)).is_empty());
        // Still working at 7 turns: stopped.
        let d = w.on_line(t0, Some(&turns(5)), RunPhase::Working);
        let stop = stops(&d);
        assert_eq!(stop[0].reason, StopReason::Budget);
        assert_eq!(
            stop[0].message,
            "reached max turns budget (5 of 5); asked to wrap up, but still working after 2 \
             grace turn(s): stopped, not wrapped up"
        );
        let f = conclude(&w, finished(true), Some(StopReason::Budget));
        assert_eq!(f.outcome.stop_reason, StopReason::Budget);
        assert_eq!(f.outcome.status, AttemptStatus::Partial, "output kept");
        assert_eq!(f.outcome.error.as_deref(), Some(stop[0].message.as_str()));
    }

    #[test]
    fn an_agent_that_wraps_up_within_the_grace_is_partial_and_wrapped_up() {
        let t0 = Instant::now();
        let mut l = limits();
        l.budget.max_tokens = Some(10);
        let mut w = watch(l, t0, true);
        let mut p = turns(1);
        p.usage.output = 11;
        assert_eq!(
            w.on_line(t0, Some(&p), RunPhase::Working),
            [Decision::WrapUp]
        );
        let f = conclude(&w, finished(true), None);
        assert_eq!(f.outcome.status, AttemptStatus::Partial);
        assert_eq!(
            f.outcome.error.as_deref(),
            Some(
                "exceeded max tokens budget (11 of 10); asked to wrap up, and it wrapped up \
                 within 2 grace turn(s)"
            )
        );
        assert_eq!(f.usage.output, 11, "the usage seen is the floor");
    }

    #[test]
    fn a_breach_stops_at_once_an_agent_that_cannot_be_steered_or_has_no_grace() {
        let t0 = Instant::now();
        let mut l = limits();
        l.budget.max_cost_nanos = Some(1_000_000);
        let mut p = turns(1);
        p.usage.cost = Cost {
            nanos: 2_000_000,
            unreported: 0,
        };
        let mut w = watch(l.clone(), t0, false);
        let d = w.on_line(t0, Some(&p), RunPhase::Working);
        assert_eq!(
            stops(&d)[0].message,
            "exceeded max cost budget ($0.0020 of $0.0010); stopped at once (the agent cannot \
             be steered), not wrapped up"
        );
        l.budget.grace_turns = 0;
        let mut w = watch(l.clone(), t0, true);
        let d = w.on_line(t0, Some(&p), RunPhase::Working);
        assert!(
            stops(&d)[0]
                .message
                .ends_with("stopped at once (grace_turns = 0), not wrapped up")
        );
        // A wrap-up request that cannot be sent stops it.
        l.budget.grace_turns = 1;
        let mut w = watch(l, t0, true);
        assert_eq!(
            w.on_line(t0, Some(&p), RunPhase::Working),
            [Decision::WrapUp]
        );
        let Some(Decision::Stop(req)) = w.wrap_up_failed() else {
            panic!("a stop")
        };
        assert!(
            req.message
                .ends_with("stopped (the wrap-up request could not be sent)")
        );
        let f = conclude(&w, finished(false), Some(StopReason::Budget));
        assert_eq!(f.outcome.status, AttemptStatus::Failed, "no output to keep");
        assert_eq!(f.output, req.message);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_stop_wins_a_request_from_the_loop_included() {
        let t0 = Instant::now();
        let mut l = limits();
        l.attempt_timeout = 10 * S;
        let mut w = watch(l, t0, false);
        let req = StopRequest {
            reason: StopReason::Interrupted,
            phase: None,
            message: "interrupted".into(),
        };
        assert_eq!(
            w.on_stop_request(req.clone()),
            Some(Decision::Stop(req.clone()))
        );
        tokio::time::advance(3600 * S).await;
        assert!(
            stops(&w.on_tick(Instant::now())).is_empty(),
            "no timeout, no stall"
        );
        let mut again = req.clone();
        again.reason = StopReason::Cancelled;
        assert_eq!(w.on_stop_request(again), None);
        assert_eq!(w.stopping(), Some(&req));
        // Its end is sortie's doing only when the signal reached the child.
        let f = conclude(&w, finished(false), Some(StopReason::Interrupted));
        assert_eq!(f.outcome.stop_reason, StopReason::Interrupted);
        assert_eq!(f.outcome.error.as_deref(), Some("interrupted"));
        let f = conclude(&w, finished(false), None);
        assert_eq!(
            f.outcome.stop_reason,
            StopReason::Error,
            "it ended by itself first"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn usage_never_goes_backwards_and_progress_is_rate_limited() {
        let t0 = Instant::now();
        let mut w = watch(limits(), t0, false);
        let mut p = turns(1);
        p.usage.input = 100;
        p.usage.context_tokens = 70;
        // Too soon after the start: held back, then sent by the timer.
        assert_eq!(w.on_line(t0, Some(&p), RunPhase::Unknown), []);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(t0.elapsed(), PROGRESS_EVERY);
        assert_eq!(d, [Decision::Progress(p.usage)]);
        // A lagging reading does not lower a counter; the level follows the latest.
        let mut lag = turns(0);
        lag.usage.input = 40;
        lag.usage.context_tokens = 50;
        tokio::time::advance(PROGRESS_EVERY).await;
        let d = w.on_line(Instant::now(), Some(&lag), RunPhase::Unknown);
        let expect = Usage {
            input: 100,
            turns: 1,
            context_tokens: 50,
            ..Usage::ZERO
        };
        assert_eq!(d, [Decision::Progress(expect)]);
        // The reader's last word keeps the counters seen, and says whether the cost is known.
        let mut f = finished(true);
        f.usage.cost = Cost {
            nanos: 5,
            unreported: 0,
        };
        w.usage.cost.unreported = 1;
        let f = conclude(&w, f, None);
        assert_eq!(
            (f.usage.input, f.usage.cost),
            (
                100,
                Cost {
                    nanos: 5,
                    unreported: 0
                }
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_driven_agent_gets_its_stdin_closed_when_its_run_ended() {
        let t0 = Instant::now();
        let mut w = watch(limits(), t0, true);
        let ended = RunPhase::Ended { failed: false };
        assert_eq!(w.on_line(t0, None, ended), [Decision::CloseStdin]);
        assert_eq!(w.on_line(t0, None, ended), [], "closed once");
        // A failed run gets time for the agent's own retry; a new turn cancels the wait.
        let mut w = watch(limits(), t0, true);
        let failed = RunPhase::Ended { failed: true };
        assert_eq!(w.on_line(t0, None, failed), []);
        assert_eq!(w.next_deadline(), Some(t0 + RETRY_SETTLE));
        assert_eq!(w.on_line(t0, None, RunPhase::Working), []);
        assert_eq!(w.next_deadline(), Some(t0 + 30 * S), "the stall clock");
        w.on_line(t0, None, failed);
        let (_, d) = next_tick(&mut w).await;
        assert_eq!(
            (t0.elapsed(), d),
            (RETRY_SETTLE, vec![Decision::CloseStdin])
        );
    }
}

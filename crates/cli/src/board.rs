//! The live board on a terminal (indicatif's `MultiProgress` on stderr, log lines printed above
//! it): a header (run id, counts per state, tokens and cost so far, elapsed, ETA) and one line
//! per running task (label, attempt, model, elapsed, tokens, then what it is doing now: the
//! activity its reader reported, `stalled 1m30s`, or `held`). Every line is cut to one column
//! less than the terminal's width at each draw (a line that filled the last column would make
//! some terminals wrap it), so a resize is followed at the next draw and no line ever wraps; the
//! header puts the elapsed time and the estimate before the counts, so that growing counts are
//! what gets cut. A ticker redraws twice a second, so that clocks move while the agents are
//! silent.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sortie_core::{Attempt, Event, RunState, Stamped, TaskId};

/// How many running tasks the board lists at most before it summarises the rest.
const BOARD_TASKS: usize = 12;

/// What a row shows while its attempt waits for a machine-wide slot (`SORTIE_MACHINE_SLOTS`).
const SLOT_WAIT: &str = "waiting for a machine slot";

/// How often the ticker redraws.
const TICK: Duration = Duration::from_millis(500);

/// One running task's line.
#[derive(Debug, Clone)]
struct Row {
    label: String,
    attempt: Attempt,
    model: Option<String>,
    launched_at: u64,
    tokens: u64,
    activity: Option<String>,
    /// When the attempt was marked stalled, and the silence it took.
    stalled: Option<(u64, u64)>,
    held: bool,
}

/// What the header says.
#[derive(Debug, Default)]
struct Header {
    run_id: String,
    done: usize,
    total: usize,
    counts: BTreeMap<&'static str, usize>,
    tokens: u64,
    cost: String,
    started_at: Option<u64>,
    /// The whole run is held (`sortie hold RUN`).
    held: bool,
}

/// What the board shows, shared with the ticker.
struct Model {
    multi: MultiProgress,
    header: Header,
    header_bar: ProgressBar,
    rows: BTreeMap<TaskId, Row>,
    bars: Vec<ProgressBar>,
    /// Tasks ready to launch that their pool holds back (issue 14), in task order.
    waiting: Vec<Row>,
}

/// The live board; dropping it clears it from the terminal.
pub(crate) struct Board {
    model: Arc<Mutex<Model>>,
    stop: Arc<AtomicBool>,
    ticker: Option<JoinHandle<()>>,
}

fn line_bar() -> ProgressBar {
    let bar = ProgressBar::hidden();
    bar.set_style(ProgressStyle::with_template("{msg}").unwrap_or_else(|_| {
        // The template is a constant; the default style is a harmless fallback.
        ProgressStyle::default_spinner()
    }));
    bar
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Board {
    /// A board drawing on stderr (indicatif draws nothing when stderr is not a terminal).
    pub(crate) fn new() -> Board {
        Board::with_target(ProgressDrawTarget::stderr_with_hz(10))
    }

    fn with_target(target: ProgressDrawTarget) -> Board {
        let multi = MultiProgress::with_draw_target(target);
        let header_bar = multi.add(line_bar());
        let model = Arc::new(Mutex::new(Model {
            multi,
            header: Header::default(),
            header_bar,
            rows: BTreeMap::new(),
            bars: Vec::new(),
            waiting: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (model, stop) = (Arc::clone(&model), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("sortie-board".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        lock(&model).render(now_ms());
                    }
                })
                .ok()
        };
        Board {
            model,
            stop,
            ticker,
        }
    }

    /// Prints a log line above the board.
    pub(crate) fn println(&self, line: &str) {
        let m = lock(&self.model);
        let _ = m.multi.println(line);
    }

    /// Follows an applied event.
    pub(crate) fn event(&self, state: &RunState, s: &Stamped) {
        let mut m = lock(&self.model);
        m.header.update(state);
        if let Event::RunStarted { run_id, .. } = &s.event {
            m.header.run_id = run_id.to_string();
        }
        if let Some(task) = s.event.task() {
            m.follow(state, task, s);
        }
        for (task, row) in &mut m.rows {
            row.held = state.control.is_held(*task);
        }
        m.waiting = waiting_rows(state, s.at);
        m.render(s.at.0);
    }

    /// Follows a live attempt's activity.
    pub(crate) fn activity(&self, task: TaskId, attempt: Attempt, text: &str) {
        let mut m = lock(&self.model);
        if let Some(row) = m.rows.get_mut(&task)
            && row.attempt == attempt
        {
            row.activity = Some(text.to_owned());
        }
        m.render(now_ms());
    }

    /// Sets the run's id (for a resumed run, whose `RunStarted` is not observed).
    pub(crate) fn set_run_id(&self, run_id: &str) {
        lock(&self.model).header.run_id = run_id.to_owned();
    }

    /// Stops the ticker and clears the board, so that what follows (the summary) starts on a
    /// clean line.
    pub(crate) fn finish(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        let mut m = lock(&self.model);
        for bar in std::mem::take(&mut m.bars) {
            bar.finish_and_clear();
            m.multi.remove(&bar);
        }
        m.header_bar.finish_and_clear();
        let _ = m.multi.clear();
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        self.finish();
    }
}

fn lock(m: &Mutex<Model>) -> std::sync::MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Header {
    fn update(&mut self, state: &RunState) {
        self.total = state.tasks.len();
        self.done = state.done_count();
        self.counts.clear();
        for rec in &state.tasks {
            *self.counts.entry(rec.display_state()).or_insert(0) += 1;
        }
        let usage = state.usage_counters();
        self.tokens = usage.tokens();
        self.cost = usage.cost.to_string();
        self.started_at = state.started_at.map(|t| t.0);
        self.held = state.control.run_held;
    }

    /// The header as of `now`: the run and its progress, the elapsed time and the estimate,
    /// tokens and cost, then the counts per state (cut first when the width runs out).
    fn line(&self, now: u64) -> String {
        let mut parts = vec![format!(
            "run {} [{}/{}]",
            self.run_id, self.done, self.total
        )];
        if let Some(start) = self.started_at {
            let elapsed = now.saturating_sub(start);
            parts.push(short_duration(elapsed));
            if self.done > 0 && self.done < self.total {
                let per = elapsed / self.done as u64;
                let left = per * (self.total - self.done) as u64;
                parts.push(format!("ETA {}", short_duration(left)));
            }
        }
        if self.held {
            parts.push("HELD".to_owned());
        }
        parts.push(format!("{} tok", compact(self.tokens)));
        parts.push(self.cost.clone());
        let counts: Vec<String> = self
            .counts
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        parts.push(counts.join(", "));
        parts.join(" · ")
    }
}

impl Model {
    /// Brings task `task`'s row in line with the state after event `s`.
    fn follow(&mut self, state: &RunState, task: TaskId, s: &Stamped) {
        let Some(live) = state.task(task).and_then(|r| r.live_attempt()) else {
            self.rows.remove(&task);
            return;
        };
        let stall_after = state
            .spec(task)
            .map_or(0, |spec| spec.stall_after.as_millis() as u64);
        let row = self.rows.entry(task).or_insert_with(|| Row {
            label: state.label(task),
            attempt: live.attempt,
            model: live.model().map(str::to_owned),
            launched_at: live.launched_at.0,
            tokens: 0,
            activity: None,
            stalled: None,
            held: false,
        });
        if row.attempt != live.attempt {
            row.attempt = live.attempt;
            row.model = live.model().map(str::to_owned);
            row.launched_at = live.launched_at.0;
            row.activity = None;
            row.held = false;
        }
        row.tokens = live.usage().tokens();
        row.stalled = match (&s.event, live.stalled, row.stalled) {
            (Event::AttemptStalled { .. }, _, _) => Some((s.at.0, stall_after)),
            (_, true, Some(known)) => Some(known),
            (_, true, None) => Some((s.at.0, stall_after)),
            (_, false, _) => None,
        };
        // #37: an attempt waiting for a machine-wide slot says so; its clock starts with it.
        row.launched_at = live.clock_from().0;
        if live.is_waiting() {
            row.activity = Some(SLOT_WAIT.to_owned());
        } else if row.activity.as_deref() == Some(SLOT_WAIT) {
            row.activity = None;
        }
    }

    /// Redraws every line as of `now` (ms since the epoch).
    fn render(&mut self, now: u64) {
        let (height, width) = console::Term::stderr().size();
        let (height, fit) = (height as usize, (width as usize).saturating_sub(1).max(1));
        self.header_bar
            .set_message(cut(&self.header.line(now), fit));
        // The header, the rows and the "more" line fit on the screen, log lines above them.
        let room = BOARD_TASKS.min(height.saturating_sub(4).max(1));
        let mut lines: Vec<String> = self
            .rows
            .values()
            .take(room)
            .map(|r| cut(&r.line(now), fit))
            .collect();
        if self.rows.len() > room {
            lines.push(format!("  … and {} more running", self.rows.len() - room));
        }
        // Issue 14: the tasks their pool holds back, in the room left.
        let left = room.saturating_sub(lines.len());
        lines.extend(
            self.waiting
                .iter()
                .take(left)
                .map(|r| cut(&r.line(now), fit)),
        );
        while self.bars.len() < lines.len() {
            let bar = self.multi.add(line_bar());
            self.bars.push(bar);
        }
        while self.bars.len() > lines.len() {
            if let Some(bar) = self.bars.pop() {
                bar.finish_and_clear();
                self.multi.remove(&bar);
            }
        }
        for (bar, line) in self.bars.iter().zip(lines) {
            bar.set_message(line);
        }
    }
}

/// The rows of the tasks that are ready but held back by their pool (at most [`BOARD_TASKS`]);
/// none, without a pass over the tasks, when no pool holds back.
fn waiting_rows(state: &RunState, at: sortie_core::Timestamp) -> Vec<Row> {
    let run = state.batch.as_ref().map_or(1, |b| {
        state.control.concurrency.unwrap_or(b.config.concurrency)
    });
    if !state.pools.values().any(|p| p.holds(at, run, 0)) {
        return Vec::new();
    }
    (0..state.tasks.len() as u32)
        .map(TaskId)
        .filter_map(|task| {
            let pool = sortie_core::waiting_for_pool(state, task, at)?;
            let rec = state.task(task)?;
            let (attempt, model, since) = match &rec.state {
                sortie_core::TaskState::Retrying {
                    next,
                    model,
                    not_before,
                } => (*next, model.clone(), not_before.0),
                _ => {
                    let next = Attempt(rec.attempts.len() as u32 + 1);
                    let model = state
                        .spec(task)
                        .and_then(|s| sortie_core::model_for_attempt(s, next));
                    (next, model, rec.ready_at.map_or(at.0, |t| t.0))
                }
            };
            Some(Row {
                label: state.label(task),
                attempt,
                model,
                launched_at: since,
                tokens: 0,
                activity: Some(format!("waiting for pool {pool}")),
                stalled: None,
                held: state.control.is_held(task),
            })
        })
        .take(BOARD_TASKS)
        .collect()
}

impl Row {
    fn line(&self, now: u64) -> String {
        let doing = if self.held {
            "held".to_owned()
        } else if let Some((at, silence)) = self.stalled {
            format!(
                "stalled {}",
                short_duration(now.saturating_sub(at) + silence)
            )
        } else {
            self.activity.clone().unwrap_or_else(|| "-".to_owned())
        };
        // Labels, model names and the agents' activity are shown, never obeyed.
        let doing = crate::text::printable(&doing);
        format!(
            "  {:<20} #{:<2} {:<12} {:>6} {:>6} tok  {doing}",
            cut(&crate::text::printable(&self.label), 20),
            self.attempt.0,
            cut(
                &crate::text::printable(self.model.as_deref().unwrap_or("-")),
                12
            ),
            short_duration(now.saturating_sub(self.launched_at)),
            compact(self.tokens),
        )
    }
}

/// A duration as `4.2s`, `1m30s` or `2h05m`.
pub(crate) fn short_duration(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{}.{}s", s, ms % 1000 / 100),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A count as `950`, `12.3k` or `4.5M`.
pub(crate) fn compact(n: u64) -> String {
    match n {
        0..10_000 => n.to_string(),
        10_000..10_000_000 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// `s` cut to `n` characters, with `…` when it was longer.
pub(crate) fn cut(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_row_says_for_how_long_the_agent_was_silent() {
        let row = Row {
            label: "t".into(),
            attempt: Attempt(2),
            model: Some("m".into()),
            launched_at: 0,
            tokens: 12,
            activity: Some("bash ls".into()),
            stalled: Some((60_000, 30_000)),
            held: false,
        };
        let line = row.line(120_000);
        assert!(line.ends_with("stalled 1m30s"), "{line}");
        assert!(line.contains("#2"), "{line}");
        let held = Row { held: true, ..row };
        assert!(held.line(120_000).ends_with("held"));
    }

    #[test]
    fn durations_read_like_clocks() {
        assert_eq!(short_duration(4_250), "4.2s");
        assert_eq!(short_duration(90_000), "1m30s");
        assert_eq!(short_duration(7_500_000), "2h05m");
        assert_eq!(
            (compact(950), compact(12_345), compact(45_000_000)),
            ("950".into(), "12.3k".into(), "45.0M".into())
        );
    }
}

//! `sortie report RUN --html FILE`: one self-contained HTML page (no network, no external asset:
//! the style sheet is inline, there is no script) for the post-mortem of a run: a timeline of
//! every attempt per task, coloured by outcome, retries and fallbacks visible, held and stalled
//! spans shaded (like Nextflow's timeline report); cost and tokens by task and by model; and the
//! summary's table.
//!
//! The timeline is a fold of the journal's events (their times), the rest is the replayed
//! state's view, the same as `--json` shows.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use sortie_core::ledger::ledger;
use sortie_core::{ControlAction, Event, RunState, Stamped, TaskId};

use crate::board::{compact, short_duration};
use crate::output::RunView;

/// One attempt's bar.
#[derive(Debug, Clone)]
struct Bar {
    attempt: u32,
    model: Option<String>,
    start: u64,
    end: Option<u64>,
    /// `completed`, `failed`, `timeout`, `cancelled`, `interrupted`, `budget`, `running`.
    class: &'static str,
    what: String,
}

/// A shaded span on a task's row.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    end: Option<u64>,
    kind: &'static str,
}

/// The timeline of one task.
#[derive(Debug, Default, Clone)]
struct Row {
    bars: Vec<Bar>,
    spans: Vec<Span>,
}

/// The timeline: rows by task, and the run's span.
struct Timeline {
    rows: BTreeMap<TaskId, Row>,
    start: u64,
    end: u64,
}

fn close(spans: &mut [Span], kind: &str, at: u64) {
    for s in spans
        .iter_mut()
        .filter(|s| s.kind == kind && s.end.is_none())
    {
        s.end = Some(at);
    }
}

fn open(spans: &mut Vec<Span>, kind: &'static str, at: u64) {
    if !spans.iter().any(|s| s.kind == kind && s.end.is_none()) {
        spans.push(Span {
            start: at,
            end: None,
            kind,
        });
    }
}

fn outcome_class(status: &str, stop: &str) -> &'static str {
    match (status, stop) {
        ("completed", _) => "completed",
        (_, "timeout" | "stalled") => "timeout",
        (_, "cancelled") => "cancelled",
        (_, "interrupted") => "interrupted",
        (_, "budget") => "budget",
        _ => "failed",
    }
}

impl Timeline {
    fn of(state: &RunState, events: &[Stamped]) -> Timeline {
        let mut rows: BTreeMap<TaskId, Row> = (0..state.tasks.len())
            .map(|i| (TaskId(i as u32), Row::default()))
            .collect();
        let start = state.started_at.map_or(0, |t| t.0);
        let mut end = start;
        let mut run_held = false;
        for s in events {
            let at = s.at.0;
            end = end.max(at);
            match &s.event {
                Event::AttemptLaunching {
                    task,
                    attempt,
                    model,
                } => {
                    if let Some(r) = rows.get_mut(task) {
                        r.bars.push(Bar {
                            attempt: attempt.0,
                            model: model.clone(),
                            start: at,
                            end: None,
                            class: "running",
                            what: "running".into(),
                        });
                        if run_held {
                            open(&mut r.spans, "held", at);
                        }
                    }
                }
                Event::AttemptStalled { task, .. } => {
                    if let Some(r) = rows.get_mut(task) {
                        open(&mut r.spans, "stalled", at);
                    }
                }
                Event::AttemptProgress { task, .. } => {
                    if let Some(r) = rows.get_mut(task) {
                        close(&mut r.spans, "stalled", at);
                    }
                }
                Event::AttemptFinished { task, outcome, .. } => {
                    if let Some(r) = rows.get_mut(task) {
                        close(&mut r.spans, "stalled", at);
                        if let Some(b) = r.bars.last_mut() {
                            let status = serde_plain(&outcome.status);
                            let stop = outcome.stop_reason.to_string();
                            b.end = Some(at);
                            b.class = outcome_class(&status, &stop);
                            b.what = match &outcome.error {
                                Some(e) => format!(
                                    "{status} ({stop}): {}",
                                    e.lines().next().unwrap_or_default()
                                ),
                                None => format!("{status} ({stop})"),
                            };
                        }
                    }
                }
                Event::AttemptOrphaned { task, action, .. } => {
                    if let Some(r) = rows.get_mut(task) {
                        close(&mut r.spans, "stalled", at);
                        if let Some(b) = r.bars.last_mut() {
                            b.end = Some(at);
                            b.class = "interrupted";
                            b.what = format!("orphaned ({action:?})");
                        }
                    }
                }
                // #33: a check runs over the end of the attempt it checks; its verdict is told
                // on that attempt's bar.
                Event::VerifyStarted { task, .. } => {
                    if let Some(r) = rows.get_mut(task) {
                        open(&mut r.spans, "checking", at);
                    }
                }
                Event::VerifyEnded { task, verdict, .. } => {
                    if let Some(r) = rows.get_mut(task) {
                        close(&mut r.spans, "checking", at);
                        if let Some(b) = r.bars.last_mut() {
                            match &verdict.error {
                                None => b.what.push_str("; check passed"),
                                Some(e) => {
                                    b.what.push_str("; ");
                                    b.what.push_str(e.lines().next().unwrap_or_default());
                                    b.class = "failed";
                                }
                            }
                        }
                    }
                }
                Event::TaskFinished { task, .. } => {
                    if let Some(r) = rows.get_mut(task) {
                        close(&mut r.spans, "held", at);
                        close(&mut r.spans, "stalled", at);
                    }
                }
                Event::Control { action, .. } => match action {
                    ControlAction::Hold { task: Some(t) } => {
                        if let Some(r) = rows.get_mut(t) {
                            open(&mut r.spans, "held", at);
                        }
                    }
                    ControlAction::Hold { task: None } => {
                        run_held = true;
                        for (t, r) in rows.iter_mut() {
                            let live = state.task(*t).is_some_and(|rec| !rec.state.is_terminal());
                            if live && r.bars.last().is_some_and(|b| b.end.is_none()) {
                                open(&mut r.spans, "held", at);
                            }
                        }
                    }
                    ControlAction::Release { task: Some(t) } => {
                        if let Some(r) = rows.get_mut(t) {
                            close(&mut r.spans, "held", at);
                        }
                    }
                    ControlAction::Release { task: None } => {
                        run_held = false;
                        for r in rows.values_mut() {
                            close(&mut r.spans, "held", at);
                        }
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        Timeline {
            rows,
            start,
            end: end.max(start + 1),
        }
    }

    fn pos(&self, at: u64) -> f64 {
        (at.saturating_sub(self.start)) as f64 * 100.0 / (self.end - self.start) as f64
    }
}

/// An enum's serde name (`completed`, `failed`).
fn serde_plain<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Text made safe for HTML.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub(crate) const STYLE: &str = "
body{font:13px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.meta{color:#555;margin-bottom:12px}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.timeline{border-top:1px solid #ddd}
.row{display:flex;align-items:center;border-bottom:1px solid #eee;height:22px}
.label{width:220px;flex:none;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;padding-right:8px}
.track{position:relative;flex:1;height:16px;background:#fafafa}
.bar{position:absolute;top:2px;height:12px;border-radius:2px;min-width:2px;overflow:hidden;
  font-size:9px;line-height:12px;color:#fff;white-space:nowrap;box-sizing:border-box;padding:0 2px}
.bar.fallback{border:2px solid #222}
.span{position:absolute;top:0;height:16px;pointer-events:none}
.span.held{background:repeating-linear-gradient(45deg,rgba(0,0,0,.28) 0 4px,transparent 4px 8px)}
.span.stalled{background:rgba(255,170,0,.45)}
.span.checking{background:rgba(20,20,120,.35)}
.completed{background:#2e9e44}.failed{background:#d33}.timeout{background:#e67e22}
.cancelled{background:#888}.interrupted{background:#8e44ad}.budget{background:#c0a000}
.running{background:#3498db}
table{border-collapse:collapse;margin-top:4px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.err{color:#a00}
";

/// The report of a run: its state (replayed to the end), its events, and its summary view.
pub(crate) fn html(state: &RunState, events: &[Stamped], view: &RunView) -> String {
    let t = Timeline::of(state, events);
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>sortie run {id}</title><style>{STYLE}</style></head><body>\n\
         <h1>sortie run {id}</h1><div class=\"meta\">{status} · {n} task(s) · {tokens} tokens · \
         {cost} · {span}</div>\n",
        id = esc(&view.run_id),
        status = esc(&view.status),
        n = view.tasks.len(),
        tokens = view.usage.tokens(),
        cost = esc(&view.cost),
        span = short_duration(t.end - t.start),
    );
    h.push_str("<h2>Timeline</h2>\n");
    h.push_str(&timeline_html(state, events));
    usage_tables(&mut h, state);
    summary_table(&mut h, view);
    samples_table(&mut h, state);
    h.push_str("</body></html>\n");
    h
}

/// #35: the legend and the timeline of the report, alone (what `sortie serve`'s run page draws
/// live, under [`STYLE`]).
pub(crate) fn timeline_html(state: &RunState, events: &[Stamped]) -> String {
    let t = Timeline::of(state, events);
    let mut h = String::new();
    h.push_str("<div class=\"legend\">");
    for (class, name) in [
        ("completed", "completed"),
        ("failed", "failed"),
        ("timeout", "timeout or stalled"),
        ("cancelled", "cancelled"),
        ("interrupted", "interrupted"),
        ("running", "running"),
        ("span held", "held"),
        ("span stalled", "stalled"),
        ("span checking", "its check runs"),
    ] {
        let _ = write!(
            h,
            "<span><i class=\"{class}\" style=\"position:static\"></i>{name}</span>"
        );
    }
    h.push_str("<span><i class=\"completed\" style=\"border:2px solid #222\"></i>fallback model</span></div>\n");
    h.push_str("<div class=\"timeline\">\n");
    for (task, row) in &t.rows {
        timeline_row(&mut h, state, &t, *task, row);
    }
    h.push_str("</div>\n");
    h
}

fn timeline_row(h: &mut String, state: &RunState, t: &Timeline, task: TaskId, row: &Row) {
    let label = state.label(task);
    let first_model = row.bars.first().and_then(|b| b.model.clone());
    let _ = write!(
        h,
        "<div class=\"row\" data-task=\"{l}\" data-attempts=\"{n}\"><div class=\"label\" \
         title=\"{l}\">{l}</div><div class=\"track\">",
        l = esc(&label),
        n = row.bars.len()
    );
    for b in &row.bars {
        let end = b.end.unwrap_or(t.end);
        let (left, right) = (t.pos(b.start), t.pos(end));
        let fallback = b.attempt > 1 && b.model != first_model;
        let model = b.model.as_deref().unwrap_or("default model");
        let _ = write!(
            h,
            "<div class=\"bar {class}{fb}\" data-attempt=\"{a}\" style=\"left:{left:.3}%;\
             width:{w:.3}%\" title=\"{label} attempt {a} on {m}: {what} ({d})\">#{a}</div>",
            class = b.class,
            fb = if fallback { " fallback" } else { "" },
            a = b.attempt,
            w = (right - left).max(0.0),
            label = esc(&label),
            m = esc(model),
            what = esc(&b.what),
            d = short_duration(end.saturating_sub(b.start)),
        );
    }
    for s in &row.spans {
        let end = s.end.unwrap_or(t.end);
        let (left, right) = (t.pos(s.start), t.pos(end));
        let _ = write!(
            h,
            "<div class=\"span {k}\" style=\"left:{left:.3}%;width:{w:.3}%\" title=\"{k} for \
             {d}\"></div>",
            k = s.kind,
            w = (right - left).max(0.0),
            d = short_duration(end.saturating_sub(s.start)),
        );
    }
    h.push_str("</div></div>\n");
}

fn usage_tables(h: &mut String, state: &RunState) {
    let l = ledger(state);
    let head = "<tr><th>{}</th><th>input</th><th>output</th><th>cache read</th><th>cache \
                write</th><th>tokens</th><th>turns</th><th>cost</th></tr>\n";
    let row = |h: &mut String, name: &str, u: &sortie_core::Usage| {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td></tr>",
            esc(name),
            u.input,
            u.output,
            u.cache_read,
            u.cache_write,
            compact(u.tokens()),
            u.turns,
            esc(&u.cost.to_string())
        );
    };
    h.push_str("<h2>Cost and tokens by model</h2>\n<table class=\"models\">");
    h.push_str(&head.replace("{}", "model"));
    for (m, u) in &l.models {
        row(h, m.as_deref().unwrap_or("(default)"), u);
    }
    row(h, "total", &l.total);
    h.push_str("</table>\n<h2>Cost and tokens by task</h2>\n<table class=\"tasks-usage\">");
    h.push_str(&head.replace("{}", "task"));
    for (t, u) in &l.tasks {
        row(h, &state.label(*t), u);
    }
    h.push_str("</table>\n");
}

/// #33: the run's samples per item (none: nothing).
fn samples_table(h: &mut String, state: &RunState) {
    let items = crate::samples::items(state);
    if items.is_empty() {
        return;
    }
    h.push_str(
        "<h2>Samples</h2>\n<table class=\"samples\"><tr><th>item</th><th>n</th><th>passed</th>\
         <th>pass@1</th><th>pass@n</th><th>mean score</th><th>winner</th></tr>\n",
    );
    let num = |p: Option<&f64>| p.map_or("-".to_owned(), |p| format!("{p:.3}"));
    for i in &items {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td>{}</td></tr>",
            esc(&i.item),
            i.n,
            i.c,
            num(i.pass_at.first()),
            num(i.pass_at.last()),
            num(i.mean_score.as_ref()),
            esc(i.winner.as_deref().unwrap_or("-"))
        );
    }
    h.push_str("</table>\n");
}

fn summary_table(h: &mut String, v: &RunView) {
    h.push_str(
        "<h2>Summary</h2>\n<table class=\"summary\"><tr><th>task</th><th>state</th>\
         <th>attempts</th><th>models</th><th>tokens</th><th>cost</th><th>time</th>\
         <th>result</th><th>check</th><th>error</th></tr>\n",
    );
    for t in &v.tasks {
        let models: Vec<&str> = t
            .models
            .iter()
            .map(|m| m.as_deref().unwrap_or("default"))
            .collect();
        let kept = t
            .worktree
            .as_ref()
            .filter(|w| w.kept == Some(true))
            .map(|w| format!("worktree {}", w.path));
        let result = [t.artifact.clone(), kept]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ");
        // #33: how its check went, with its score when it is not all or nothing.
        let check = t.verify.as_ref().map_or(String::new(), |c| {
            if c.score > 0.0 && c.score < 1.0 {
                format!("{} (score {:.2})", c.text, c.score)
            } else {
                c.text.clone()
            }
        });
        let error = match (&t.error, t.state.as_str()) {
            (Some(e), s) if s != "completed" => e.lines().next().unwrap_or_default().to_owned(),
            _ => String::new(),
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"{}\" style=\"color:#fff\">{}</td><td class=\"n\">{}</td>\
             <td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td>{}</td><td>{}</td><td class=\"err\">{}</td></tr>",
            esc(&t.label),
            state_class(&t.state),
            esc(&t.state),
            t.attempts,
            esc(&models.join(" → ")),
            compact(t.usage.tokens()),
            esc(&t.usage.cost.to_string()),
            t.duration_ms.map(short_duration).unwrap_or_default(),
            esc(&result),
            esc(&check),
            esc(&error)
        );
    }
    let counts: Vec<String> = v.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
    let _ = write!(
        h,
        "</table>\n<p>total: {} task(s) · {} · {} tokens · {}</p>\n",
        v.tasks.len(),
        esc(&counts.join(", ")),
        v.usage.tokens(),
        esc(&v.cost)
    );
}

fn state_class(state: &str) -> &'static str {
    match state {
        "completed" => "completed",
        "failed" | "setup_error" => "failed",
        "timeout" => "timeout",
        "cancelled" | "skipped" => "cancelled",
        "interrupted" => "interrupted",
        "partial" => "budget",
        _ => "running",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<a href='x'>&\"</a>"),
            "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;"
        );
    }
}

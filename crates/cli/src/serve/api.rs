//! #35: the JSON API (`/api/v1/...`) and the pages' own reads: every answer is made from a
//! run's [`Snapshot`](super::runs::Snapshot) through the views `sortie status` prints.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sortie_core::{RunState, TaskId};
use sortie_runner::control::{self, Request};
use sortie_runner::layout::index;
use sortie_runner::transcript::{self, Kept, KeptReader};

use super::App;
use super::runs::{Failure, Snapshot};
use crate::output;

/// A run in `GET /api/v1/runs`: `sortie --json list`'s row and its counts and cost.
#[derive(Debug, Serialize)]
struct RunRow {
    run_id: String,
    status: String,
    live_pid: Option<u32>,
    tasks: u32,
    created: u64,
    source: String,
    parent: Option<String>,
    /// Task counts by state.
    counts: std::collections::BTreeMap<String, usize>,
    /// The run's cost, as text.
    cost: String,
    /// Its tokens.
    tokens: u64,
    /// When it started (ms since the epoch), once it did.
    started: Option<u64>,
    /// From its start to its last attempt's end (or now, while it runs), in ms.
    duration_ms: Option<u64>,
    /// Why it could not be read, when it could not.
    error: Option<String>,
}

fn internal(e: impl std::fmt::Display) -> Failure {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

fn json_response(text: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        text,
    )
        .into_response()
}

/// `GET /api/v1/runs`: every run, newest first.
pub(crate) async fn runs(State(app): State<Arc<App>>) -> Result<Response, Failure> {
    let layout = app.runs.layout.clone();
    let entries = tokio::task::spawn_blocking(move || {
        if layout.root().exists() {
            index::list(&layout).map_err(internal)
        } else {
            Ok(Vec::new())
        }
    })
    .await
    .map_err(internal)??;
    let mut rows = Vec::with_capacity(entries.len());
    for e in entries {
        let mut row = RunRow {
            run_id: e.run_id.to_string(),
            status: e.status.to_string(),
            live_pid: None,
            tasks: e.tasks,
            created: e.created.0,
            source: e.source.clone(),
            parent: e.parent.as_ref().map(ToString::to_string),
            counts: Default::default(),
            cost: String::new(),
            tokens: 0,
            started: None,
            duration_ms: None,
            error: e.damaged.clone(),
        };
        match app.runs.slot(e.run_id.as_str()).await {
            Ok(slot) => {
                let snap = slot.snap.borrow().clone();
                let head = output::view_head(&snap.run, &snap.state, snap.live_pid);
                row.status = head.status;
                row.live_pid = head.live_pid;
                row.counts = head.counts;
                row.cost = head.cost;
                row.tokens = head.usage.tokens();
                row.started = snap.state.started_at.map(|t| t.0);
                row.duration_ms = row.started.map(|s| head.now.max(s) - s);
            }
            Err((_, why)) => row.error = Some(why),
        }
        rows.push(row);
    }
    Ok(Json(rows).into_response())
}

/// `GET /api/v1/runs/{id}`: what `sortie --json status ID` prints.
pub(crate) async fn run(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let snap = app.runs.slot(&id).await?.snap.borrow().clone();
    let text = tokio::task::spawn_blocking(move || {
        let view = output::view(&snap.run, &snap.state, snap.live_pid, false);
        serde_json::to_string_pretty(&view).map_err(internal)
    })
    .await
    .map_err(internal)??;
    Ok(json_response(text))
}

/// `GET /api/v1/runs/{id}/head`: the run's view without its tasks, and how many records it has.
pub(crate) async fn head(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let snap = app.runs.slot(&id).await?.snap.borrow().clone();
    let view = output::view_head(&snap.run, &snap.state, snap.live_pid);
    let mut v = serde_json::to_value(&view).map_err(internal)?;
    v["started"] = serde_json::json!(snap.state.started_at.map(|t| t.0));
    v["now"] = serde_json::json!(view.now);
    v["tasks"] = serde_json::json!(snap.state.tasks.len());
    Ok(json_response(v.to_string()))
}

/// Some tasks' rows (`?i=0,5,9`), for a page that heard of their events.
#[derive(Debug, Deserialize)]
pub(crate) struct Picked {
    i: Option<String>,
}

/// `GET /api/v1/runs/{id}/rows`: the task table's columns (`?i=...`: only those tasks, as
/// `{"i": [...], ...}`), one array per column, for a table of 100,000 rows.
pub(crate) async fn rows(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(picked): Query<Picked>,
) -> Result<Response, Failure> {
    let snap = app.runs.slot(&id).await?.snap.borrow().clone();
    if let Some(some) = picked.i {
        let picked: Vec<usize> = some
            .split(',')
            .filter_map(|s| s.parse().ok())
            .filter(|i| *i < snap.state.tasks.len())
            .take(10_000)
            .collect();
        return Ok(json_response(columns(&snap, &picked)));
    }
    let text = tokio::task::spawn_blocking(move || all_rows(&snap))
        .await
        .map_err(internal)?;
    Ok(json_response(String::clone(&text)))
}

/// Every task's columns, made once per snapshot.
fn all_rows(snap: &Snapshot) -> Arc<String> {
    snap.rows
        .get_or_init(|| {
            let all: Vec<usize> = (0..snap.state.tasks.len()).collect();
            Arc::new(columns(snap, &all))
        })
        .clone()
}

/// A run made ready for its page before anyone asks: its table's columns.
pub(crate) fn warm(snap: &Snapshot) {
    all_rows(snap);
}

/// The columns of tasks `which`: index, label, state, model, cost (USD), tokens, attempts,
/// duration (ms), held.
fn columns(snap: &Snapshot, which: &[usize]) -> String {
    use std::fmt::Write as _;
    let state = &snap.state;
    let now = output::view_head(&snap.run, state, snap.live_pid).now;
    let n = which.len();
    let (mut label, mut st, mut model) = (String::new(), String::new(), String::new());
    let (mut cost, mut tokens, mut attempts, mut dur, mut held) = (
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
    );
    let mut idx = String::with_capacity(n * 6);
    for (k, &i) in which.iter().enumerate() {
        let Some(rec) = state.tasks.get(i) else {
            continue;
        };
        let t = output::task_view(state, i, rec, now, false);
        let sep = if k == 0 { "" } else { "," };
        let _ = write!(idx, "{sep}{i}");
        let _ = write!(label, "{sep}{}", json_str(&t.label));
        let _ = write!(st, "{sep}{}", json_str(&t.state));
        let _ = write!(
            model,
            "{sep}{}",
            t.model.as_deref().map_or("null".into(), json_str)
        );
        let _ = write!(cost, "{sep}{}", t.usage.cost.nanos as f64 / 1e9);
        let _ = write!(tokens, "{sep}{}", t.usage.tokens());
        let _ = write!(attempts, "{sep}{}", t.attempts);
        match t.duration_ms {
            Some(d) => {
                let _ = write!(dur, "{sep}{d}");
            }
            None => {
                let _ = write!(dur, "{sep}null");
            }
        }
        let _ = write!(held, "{sep}{}", u8::from(t.held));
    }
    format!(
        "{{\"i\":[{idx}],\"label\":[{label}],\"state\":[{st}],\"model\":[{model}],\
         \"cost\":[{cost}],\"tokens\":[{tokens}],\"attempts\":[{attempts}],\
         \"duration_ms\":[{dur}],\"held\":[{held}],\"next_seq\":{}}}",
        snap.next_seq
    )
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The biggest run whose timeline the page draws (every task a row of the report's).
const TIMELINE_TASKS: usize = 2_000;

/// `GET /api/v1/runs/{id}/timeline`: the HTML report's timeline of the run as it is now.
pub(crate) async fn timeline(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let slot = app.runs.slot(&id).await?;
    let snap = slot.snap.borrow().clone();
    if snap.state.tasks.len() > TIMELINE_TASKS {
        return Ok(format!(
            "<p>The timeline is drawn for runs of at most {TIMELINE_TASKS} tasks: see `sortie \
             report {} --html FILE`.</p>",
            snap.run
        )
        .into_response());
    }
    let layout = app.runs.layout.clone();
    let html = tokio::task::spawn_blocking(move || {
        let reader =
            sortie_runner::layout::open::RunReader::open(&layout, &snap.run).map_err(internal)?;
        let replay = reader.replay_checked(None).map_err(internal)?;
        Ok::<_, Failure>(crate::report::timeline_html(&replay.state, &replay.events))
    })
    .await
    .map_err(internal)??;
    Ok((
        [(header::CACHE_CONTROL, "no-store")],
        axum::response::Html(html),
    )
        .into_response())
}

fn task_of(state: &RunState, i: usize) -> Result<TaskId, Failure> {
    if i < state.tasks.len() {
        Ok(TaskId(i as u32))
    } else {
        Err((StatusCode::NOT_FOUND, format!("no task {i}")))
    }
}

/// `GET /api/v1/runs/{id}/tasks/{i}`: a task's view (`status --task --json`), its attempts'
/// transcripts, its sandbox's denied connections (`host:port ×count`) and the field that
/// would allow them.
pub(crate) async fn task(
    State(app): State<Arc<App>>,
    Path((id, i)): Path<(String, usize)>,
) -> Result<Response, Failure> {
    let snap = app.runs.slot(&id).await?.snap.borrow().clone();
    let task = task_of(&snap.state, i)?;
    let run_dir = app.runs.layout.run(&snap.run);
    let now = output::view_head(&snap.run, &snap.state, snap.live_pid).now;
    let rec = &snap.state.tasks[i];
    let view = output::task_view(&snap.state, i, rec, now, true);
    let transcripts = transcript::of_task(&snap.state, &run_dir, task);
    let steerable = snap.live_pid.is_some() && rec.live_attempt().is_some();
    // #34: its sandbox's denied connections, worded as `sortie status` prints them.
    let denied = sortie_core::sandbox_net::denied(&view.net);
    let v = serde_json::json!({
        "index": i,
        "denied": denied,
        "denied_field": sortie_core::sandbox_net::ALLOWING_FIELD,
        "task": view,
        "transcripts": transcripts,
        "live": snap.live_pid.is_some(),
        "steerable": steerable,
    });
    Ok(json_response(v.to_string()))
}

/// Where to read a transcript from.
#[derive(Debug, Deserialize)]
pub(crate) struct From_ {
    attempt: Option<u32>,
    #[serde(default)]
    from: u64,
    #[serde(default)]
    stderr: bool,
}

/// The most a transcript read answers at once.
const CHUNK: usize = 256 * 1024;

/// `GET /api/v1/runs/{id}/tasks/{i}/transcript?attempt=N&from=OFFSET`: the transcript's whole
/// lines from `from` on (`next`: where to ask from next), jumping over what its cap cut.
pub(crate) async fn transcript_part(
    State(app): State<Arc<App>>,
    Path((id, i)): Path<(String, usize)>,
    Query(q): Query<From_>,
) -> Result<Response, Failure> {
    let snap = app.runs.slot(&id).await?.snap.borrow().clone();
    let task = task_of(&snap.state, i)?;
    let run_dir = app.runs.layout.run(&snap.run);
    let all = transcript::of_task(&snap.state, &run_dir, task);
    let t = match q.attempt {
        Some(n) => all.iter().find(|t| t.attempt == n),
        None => all.last(),
    }
    .ok_or((StatusCode::NOT_FOUND, "no such attempt".to_owned()))?
    .clone();
    let path = if q.stderr {
        t.stderr.clone()
    } else {
        t.path.clone()
    };
    let ended = t.end != "running";
    let v = tokio::task::spawn_blocking(move || {
        let mut reader = KeptReader::new(&path, q.from);
        let mut buf = vec![0u8; CHUNK];
        let mut text = Vec::new();
        let mut cut = false;
        while text.len() < CHUNK {
            match reader.read(&mut buf).map_err(internal)? {
                Kept::Bytes(n) => text.extend_from_slice(&buf[..n]),
                Kept::Cut(_) => {
                    cut = true;
                    text.extend_from_slice(b"\n");
                }
                Kept::Idle => break,
            }
        }
        let mut next = reader.offset();
        // Whole lines only, unless the attempt ended (its last line may have no newline).
        if !ended && let Some(last) = text.iter().rposition(|b| *b == b'\n') {
            let extra = text.len() - last - 1;
            next -= extra as u64;
            text.truncate(last + 1);
        } else if !ended {
            next = q.from;
            text.clear();
        }
        Ok::<_, Failure>(serde_json::json!({
            "attempt": t.attempt,
            "from": q.from,
            "next": next,
            "text": String::from_utf8_lossy(&text),
            "cut": cut,
            "ended": ended,
        }))
    })
    .await
    .map_err(internal)??;
    Ok(json_response(v.to_string()))
}

/// `GET /api/v1/runs/{id}/tasks/{i}/check?attempt=N`: the output of the task's check (the
/// last one that ran), as `sortie logs --verify` prints it.
pub(crate) async fn check(
    State(app): State<Arc<App>>,
    Path((id, i)): Path<(String, usize)>,
    Query(q): Query<From_>,
) -> Result<Response, Failure> {
    let snap = app.runs.slot(&id).await?.snap.borrow().clone();
    task_of(&snap.state, i)?;
    let rec = &snap.state.tasks[i];
    let Some(checked) = rec
        .attempts
        .iter()
        .rev()
        .filter(|a| a.verify_started())
        .find(|a| q.attempt.is_none_or(|n| a.attempt.0 == n))
    else {
        return Ok("(no check ran)".into_response());
    };
    let path = app
        .runs
        .layout
        .run(&snap.run)
        .check_file(i as u32, checked.attempt.0, "log");
    let text = std::fs::read(&path).unwrap_or_default();
    Ok(String::from_utf8_lossy(&text).into_owned().into_response())
}

/// `GET /api/v1/runs/{id}/tasks/{i}/diff`: the patch of the task's kept worktree.
pub(crate) async fn diff(
    State(app): State<Arc<App>>,
    Path((id, i)): Path<(String, usize)>,
) -> Result<Response, Failure> {
    let snap = app.runs.slot(&id).await?.snap.borrow().clone();
    let task = task_of(&snap.state, i)?;
    let label = snap.state.label(task);
    let kept =
        sortie_runner::worktree::kept::find(&snap.state, &app.runs.layout, &snap.run, &label)
            .map_err(|e| (StatusCode::NOT_FOUND, e.to_string()))?;
    let patch = sortie_runner::worktree::kept::diff(&kept)
        .await
        .map_err(internal)?;
    Ok(String::from_utf8_lossy(&patch).into_owned().into_response())
}

/// What `POST /api/v1/runs/{id}/control` answers (as `sortie --json hold` ... print).
#[derive(Debug, Serialize)]
struct Answer {
    run_id: String,
    ok: bool,
    message: String,
}

/// `POST /api/v1/runs/{id}/control` with a request (`{"action": "hold", "task": "t"}`): sent
/// to the run's control socket on behalf of `web`, which journals it.
pub(crate) async fn control(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Json(req): Json<Request>,
) -> Result<Response, Failure> {
    let run = sortie_core::RunId::new(&id).map_err(|e| (StatusCode::NOT_FOUND, e.to_string()))?;
    let dir = app.runs.layout.run(&run);
    if !dir.exists() {
        return Err((StatusCode::NOT_FOUND, format!("no run {run}")));
    }
    if !matches!(dir.owner(), sortie_runner::layout::Owner::Live { .. }) {
        return Err((
            StatusCode::CONFLICT,
            format!("run {run} is not running: controls act on a live run only"),
        ));
    }
    let socket = dir.control_socket();
    let reply = tokio::task::spawn_blocking(move || control::send_via(&socket, &req, Some("web")))
        .await
        .map_err(internal)?
        .map_err(|e| internal(format!("cannot reach run {id}: {e}")))?;
    let status = if reply.ok {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    Ok((
        status,
        Json(Answer {
            run_id: run.to_string(),
            ok: reply.ok,
            message: reply.message,
        }),
    )
        .into_response())
}

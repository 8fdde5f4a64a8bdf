//! #35: `GET /api/v1/runs/{id}/events?after=SEQ`: the run's journal records as server-sent
//! events, each as `sortie export` writes it with its seq as the event's id, from the one after
//! `after` (or after the `Last-Event-ID` a reconnecting browser sends, which wins), then each
//! as it becomes durable: no gap, no duplicate.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde::Deserialize;

use super::App;
use super::runs::{Failure, Slot};

/// Where a stream starts.
#[derive(Debug, Deserialize)]
pub(crate) struct After {
    /// The last seq the client has (the stream starts after it); none: from the first record.
    after: Option<u64>,
}

/// The stream's state between two batches of records.
struct Follow {
    app: Arc<App>,
    slot: Arc<Slot>,
    rx: tokio::sync::watch::Receiver<Arc<super::runs::Snapshot>>,
    /// The seq of the next record to send.
    next: u64,
    /// Records read, not sent yet.
    pending: std::collections::VecDeque<(u64, Arc<str>)>,
}

/// The handler.
pub(crate) async fn events(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(q): Query<After>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let slot = app.runs.slot(&id).await?;
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let next = last.or(q.after).map_or(0, |s| s + 1);
    let rx = slot.snap.subscribe();
    let follow = Follow {
        app,
        slot,
        rx,
        next,
        pending: Default::default(),
    };
    Ok(Sse::new(stream_of(follow))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

fn stream_of(follow: Follow) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(follow, |mut f| async move {
        loop {
            if let Some((seq, json)) = f.pending.pop_front() {
                f.next = seq + 1;
                let event = Event::default().id(seq.to_string()).data(&*json);
                return Some((Ok(event), f));
            }
            let snap = f.rx.borrow_and_update().clone();
            if f.next < snap.next_seq {
                let (slot, layout, run) =
                    (f.slot.clone(), f.app.runs.layout.clone(), snap.run.clone());
                let (from, to) = (f.next, snap.next_seq);
                let read =
                    tokio::task::spawn_blocking(move || slot.events(&layout, &run, from, to)).await;
                match read {
                    Ok(Ok(events)) if !events.is_empty() => {
                        f.pending.extend(events);
                        continue;
                    }
                    // Nothing readable now: wait for the next change, then try again.
                    _ => {}
                }
            }
            if f.rx.changed().await.is_err() {
                return None;
            }
        }
    })
}

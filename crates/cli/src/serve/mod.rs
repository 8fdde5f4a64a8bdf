//! #35: `sortie serve`'s server: the routes (`GET` pages and assets, the JSON API under
//! `/api/v1`, the event streams), behind the token guard (`auth.rs`). Runs are read as
//! `sortie status` reads them (`runs.rs`); controls go through the run's control socket, as
//! `sortie hold` sends them, journaled as asked by `web`.

mod api;
mod assets;
pub(crate) mod auth;
mod runs;
mod sse;

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use sortie_runner::layout::StateDir;

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) runs: Arc<runs::Runs>,
    pub(crate) auth: Arc<auth::Auth>,
}

/// The server's routes over state dir `layout`, guarded by `auth`; the runs' preload started
/// (on the caller's tokio runtime).
pub(crate) fn router(layout: StateDir, auth: auth::Auth) -> Router {
    let auth = Arc::new(auth);
    let runs = runs::Runs::new(layout);
    // Every run read in the background from the start: a first visit finds its run read.
    tokio::spawn(runs.clone().preload(api::warm));
    let app = Arc::new(App {
        runs,
        auth: auth.clone(),
    });
    Router::new()
        .route("/", get(assets::page))
        .route("/runs/{id}", get(assets::page))
        .route("/assets/app.js", get(assets::script))
        .route("/assets/app.css", get(assets::style))
        .route("/api/v1/runs", get(api::runs))
        .route("/api/v1/runs/{id}", get(api::run))
        .route("/api/v1/runs/{id}/head", get(api::head))
        .route("/api/v1/runs/{id}/rows", get(api::rows))
        .route("/api/v1/runs/{id}/timeline", get(api::timeline))
        .route("/api/v1/runs/{id}/events", get(sse::events))
        .route("/api/v1/runs/{id}/control", post(api::control))
        .route("/api/v1/runs/{id}/tasks/{i}", get(api::task))
        .route(
            "/api/v1/runs/{id}/tasks/{i}/transcript",
            get(api::transcript_part),
        )
        .route("/api/v1/runs/{id}/tasks/{i}/check", get(api::check))
        .route("/api/v1/runs/{id}/tasks/{i}/diff", get(api::diff))
        .with_state(app)
        .layer(axum::middleware::from_fn_with_state(auth, auth::guard))
}

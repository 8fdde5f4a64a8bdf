//! #35: the pages' files, embedded in the binary (no CDN, no network: the pages work offline).
//! One page (`index.html`) draws both the run list (`/`) and a run (`/runs/{id}`); its script
//! and style are plain files beside this one; the timeline's style is the HTML report's.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

use super::App;

const PAGE: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const STYLE: &str = include_str!("assets/app.css");

/// The page, with this server's CSRF token for its `POST`s.
pub(crate) async fn page(State(app): State<Arc<App>>) -> Response {
    let page = PAGE.replace("{{CSRF}}", &app.auth.csrf);
    ([(header::CACHE_CONTROL, "no-store")], Html(page)).into_response()
}

/// `app.js`.
pub(crate) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

/// `app.css`: the report's style (the timeline's classes), then the page's, which wins.
pub(crate) async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        format!("{}\n{STYLE}", crate::report::STYLE),
    )
        .into_response()
}

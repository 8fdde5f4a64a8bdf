//! #35: who may use `sortie serve`: the holder of the random token in the URL it printed (then
//! a cookie, after the first visit), or of the token as a bearer header (API clients). A
//! request for another host name is refused (a DNS rebinding page would name its own), and a
//! `POST` from a browser also needs the page's CSRF token in a header and its own origin.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The header a page's `POST` carries its CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-sortie-csrf";

/// The server's secrets and the names it answers to.
#[derive(Debug)]
pub(crate) struct Auth {
    /// The access token (in the printed URL).
    pub(crate) token: String,
    /// The CSRF token the pages send back on `POST`.
    pub(crate) csrf: String,
    /// The cookie the token is kept in (named after the port: two servers do not mix).
    pub(crate) cookie: String,
    /// The `Host` values accepted (`127.0.0.1:PORT`, `localhost:PORT`, the listen address).
    pub(crate) hosts: Vec<String>,
}

/// 16 random bytes from the kernel, as hex.
pub(crate) fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares secrets in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// How a request showed the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shown {
    Query,
    Cookie,
    Bearer,
}

impl Auth {
    fn shown(&self, req: &Request) -> Option<Shown> {
        let h = req.headers();
        if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
            && let Some(t) = v.strip_prefix("Bearer ")
            && same(t.trim(), &self.token)
        {
            return Some(Shown::Bearer);
        }
        let query = req.uri().query().unwrap_or("");
        if query
            .split('&')
            .filter_map(|kv| kv.strip_prefix("token="))
            .any(|t| same(t, &self.token))
        {
            return Some(Shown::Query);
        }
        let cookies = h
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'));
        for c in cookies {
            if let Some((k, v)) = c.trim().split_once('=')
                && k == self.cookie
                && same(v, &self.token)
            {
                return Some(Shown::Cookie);
            }
        }
        None
    }

    fn host_ok(&self, h: &HeaderMap) -> bool {
        h.get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|host| self.hosts.iter().any(|ok| ok == host))
    }

    /// A browser's `POST`: its CSRF header, and its origin one of ours.
    fn post_ok(&self, h: &HeaderMap) -> Result<(), &'static str> {
        let csrf = h.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if !csrf.is_some_and(|c| same(c, &self.csrf)) {
            return Err("a POST from a page needs its CSRF token (the x-sortie-csrf header)");
        }
        let origin = h.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        match origin {
            Some(o) if self.hosts.iter().any(|host| o == format!("http://{host}")) => Ok(()),
            _ => Err("a POST from a page must come from this server's origin"),
        }
    }
}

fn refuse(status: StatusCode, why: &str) -> Response {
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(serde_json::json!({ "error": why })),
    )
        .into_response()
}

/// The middleware in front of every route.
pub(crate) async fn guard(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    if !auth.host_ok(req.headers()) {
        return refuse(
            StatusCode::FORBIDDEN,
            "this server answers 127.0.0.1 and localhost only",
        );
    }
    let Some(shown) = auth.shown(&req) else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "no access token: open the URL `sortie serve` printed",
        );
    };
    if req.method() == Method::POST
        && shown != Shown::Bearer
        && let Err(why) = auth.post_ok(req.headers())
    {
        return refuse(StatusCode::FORBIDDEN, why);
    }
    let mut resp = next.run(req).await;
    if shown == Shown::Query {
        let cookie = format!(
            "{}={}; Path=/; HttpOnly; SameSite=Strict",
            auth.cookie, auth.token
        );
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

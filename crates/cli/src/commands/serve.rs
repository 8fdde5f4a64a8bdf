//! `sortie serve [--port N] [--open] [--listen ADDR]`: the dashboard and JSON API of the state
//! dir's runs (`crate::serve`), until Ctrl-C.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::Code;
use crate::args::{Global, ServeArgs};
use crate::error::{CliError, Result, ResultExt};
use crate::serve::{auth, router};

/// Serves until interrupted.
pub(crate) fn serve(g: &Global, args: &ServeArgs) -> Result<Code> {
    let ip = args.listen.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    if !ip.is_loopback() {
        eprintln!(
            "sortie: warning: listening on {ip}, not 127.0.0.1: whoever can reach it and holds \
             the token can read and control your runs (the traffic is not encrypted)"
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, args.port))
            .await
            .map_err(|e| {
                CliError::usage(format_args!(
                    "cannot listen on {ip} port {}: {e}",
                    args.port
                ))
            })?;
        let port = listener.local_addr()?.port();
        let token = auth::random_token().context("cannot read /dev/urandom")?;
        let csrf = auth::random_token().context("cannot read /dev/urandom")?;
        let shown = match ip {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        let mut hosts = vec![format!("127.0.0.1:{port}"), format!("localhost:{port}")];
        hosts.push(format!("{shown}:{port}"));
        let url = format!("http://{}/?token={token}", hosts[hosts.len() - 1]);
        let auth = auth::Auth {
            token: token.clone(),
            csrf,
            cookie: format!("sortie-{port}"),
            hosts,
        };
        let app = router(g.layout(), auth);
        {
            let mut out = std::io::stdout().lock();
            if g.json {
                let v = serde_json::json!({ "url": url, "port": port, "token": token });
                writeln!(out, "{v}")?;
            } else {
                writeln!(out, "sortie serve: {url}")?;
            }
            out.flush()?;
        }
        eprintln!(
            "sortie: serving the runs of {} (Ctrl-C stops)",
            g.layout().root().display()
        );
        if args.open
            && let Err(e) = sortie_runner::detach::open_url(&url)
        {
            eprintln!("sortie: cannot open a browser ({e}): open the URL yourself");
        }
        tokio::select! {
            r = axum::serve(listener, app) => r.context("the server stopped")?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok::<_, CliError>(())
    })?;
    Ok(Code::Ok)
}

//! #35: `sortie serve`, tested as a user would: in a real browser (the system's headless
//! Chromium, driven over the DevTools protocol) on a live run of plain commands that wait for
//! files the test creates, and over plain HTTP: a task's state changes on the page without a
//! reload, the hold button stops the task's process and release resumes it (both journaled as
//! asked by `web`), a line the task prints after the page loaded appears in its transcript
//! panel, a request without the token is refused and changes nothing; the event stream resumes
//! after `after=SEQ` (or `Last-Event-ID`) without a gap or a duplicate; a sandboxed task's
//! panel names the connection its sandbox denied; a task's panel follows a retry's new
//! transcript; and docs/cli.md's API examples are what the server answers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use headless_chrome::{Browser, LaunchOptions, Tab};
use serde_json::Value;
use sortie_testkit::Events;

use crate::support::{Background, Scratch, event_kind, poll, unique_run};

/// A `sortie serve` in the background: its URL's parts.
struct Served {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    base: String,
    token: String,
    port: u16,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGINT,
            );
        }
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new tab on `run`'s page (`fragment`: `#task=N` opens a task's panel), navigated.
fn open_run(browser: &Browser, sv: &Served, run: &str, fragment: &str) -> std::sync::Arc<Tab> {
    let tab = browser.new_tab().expect("a tab");
    tab.navigate_to(&format!(
        "{}/runs/{run}?token={}{fragment}",
        sv.base, sv.token
    ))
    .expect("navigate");
    tab.wait_until_navigated().expect("navigated");
    tab
}

/// Starts `sortie serve --port 0` and reads the URL it prints.
fn serve(s: &Scratch) -> Served {
    let mut child = s
        .sortie()
        .args(["serve", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn sortie serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the URL line");
    let url = line
        .trim()
        .strip_prefix("sortie serve: ")
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    let (base, token) = url.split_once("/?token=").expect("a token in the URL");
    let port = base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");
    Served {
        child,
        base: base.to_owned(),
        token: token.to_owned(),
        port,
    }
}

/// An HTTP answer: status, headers (lowercase names), body.
struct Answer {
    status: u16,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request to the server, `headers` as `Name: value` lines.
fn http(sv: &Served, method: &str, path: &str, headers: &[String], body: &str) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", sv.port)).expect("connect");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n",
        sv.port
    );
    for h in headers {
        req.push_str(h);
        req.push_str("\r\n");
    }
    if !body.is_empty() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Answer {
        status,
        body: if chunked {
            dechunk(rest)
        } else {
            rest.to_owned()
        },
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

fn bearer(sv: &Served) -> String {
    format!("Authorization: Bearer {}", sv.token)
}

/// The system's Chromium, headless (as root, without its sandbox), if installed (under CI it
/// must be: `.ci/run` installs it).
fn browser() -> Option<Browser> {
    let Some(path) = ["chromium", "chromium-browser"]
        .iter()
        .flat_map(|b| ["/usr/bin", "/usr/local/bin"].map(|d| Path::new(d).join(b)))
        .find(|p| p.is_file())
    else {
        assert!(
            !sortie_testkit::real_agent::under_ci(),
            "the serve test needs chromium under CI"
        );
        eprintln!("serve test: SKIPPED the browser: no chromium installed");
        return None;
    };
    let browser = Browser::new(
        LaunchOptions::default_builder()
            .path(Some(path))
            .sandbox(false)
            .idle_browser_timeout(Duration::from_secs(300))
            .build()
            .expect("launch options"),
    )
    .expect("start Chromium");
    Some(browser)
}

/// Evaluates `js` in the page, as JSON.
fn eval(tab: &Tab, js: &str) -> Value {
    tab.evaluate(js, true)
        .unwrap_or_else(|e| panic!("{js}: {e}"))
        .value
        .unwrap_or(Value::Null)
}

/// Waits until `js` is true in the page.
fn wait_js(tab: &Tab, what: &str, js: &str) {
    poll(what, 30, || {
        (eval(tab, js) == Value::Bool(true)).then_some(())
    });
}

/// The one-letter state of a process in `/proc/PID/stat` (`T`: stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// The pid of task `i`'s first attempt, once started.
fn attempt_pid(s: &Scratch, run: &str, i: u64) -> u32 {
    poll("the attempt to start", 30, || {
        let events = s.try_events(run)?;
        events
            .of(i, "AttemptStarted")
            .first()
            .and_then(|e| e["pid"].as_u64())
            .map(|p| p as u32)
    })
}

/// The `Control` events' `by`s.
fn controls(s: &Scratch, run: &str) -> Vec<String> {
    s.events(run)
        .iter()
        .map(event_kind)
        .filter(|(k, _)| *k == "Control")
        .map(|(_, b)| b["by"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A plain command that waits for file `flag` (in the scratch dir), printing `before` first
/// and `after` once the file is there.
fn gated(s: &Scratch, before: &str, flag: &str, after: &str) -> String {
    let flag = s.path().join(flag);
    format!(
        "[\"sh\", \"-c\", \"echo {before}; while [ ! -e {f} ]; do sleep 0.05; done; echo {after}\"]",
        f = flag.display()
    )
}

#[test]
fn the_run_page_follows_a_live_run_and_its_controls_hold_and_release_a_task() {
    let s = Scratch::new();
    let run = unique_run("serve");
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 2\n\n[[tasks]]\nlabel = \"gate\"\ncommand = {}\n\n\
             [[tasks]]\nlabel = \"sleeper\"\ncommand = {}\n",
            gated(&s, "first-line", "GO", "printed-after-the-page-loaded"),
            gated(&s, "sleeping", "WAKE", "awake"),
        ),
    );
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    let sleeper = attempt_pid(&s, &run, 1);
    attempt_pid(&s, &run, 0);
    let sv = serve(&s);

    // Without the token: refused, and nothing changes.
    let before = controls(&s, &run);
    let api = http(&sv, "GET", "/api/v1/runs", &[], "");
    assert_eq!(api.status, 401, "{}", api.body);
    let page = http(&sv, "GET", &format!("/runs/{run}"), &[], "");
    assert_eq!(page.status, 401, "{}", page.body);
    let hold = r#"{"action":"hold","task":"sleeper"}"#;
    let post = http(
        &sv,
        "POST",
        &format!("/api/v1/runs/{run}/control"),
        &[],
        hold,
    );
    assert!([401, 403].contains(&post.status), "{}", post.body);
    // With the token in a cookie, as a browser would send it, but no CSRF header: refused.
    let cookie = format!("Cookie: sortie-{}={}", sv.port, sv.token);
    let origin = format!("Origin: http://127.0.0.1:{}", sv.port);
    let post = http(
        &sv,
        "POST",
        &format!("/api/v1/runs/{run}/control"),
        &[cookie.clone(), origin],
        hold,
    );
    assert_eq!(post.status, 403, "{}", post.body);
    assert_eq!(proc_state(sleeper).map(|c| c != 'T'), Some(true));
    assert_eq!(
        controls(&s, &run),
        before,
        "a refused request journals nothing"
    );

    let Some(browser) = browser() else {
        std::fs::write(s.path().join("GO"), "").expect("GO");
        std::fs::write(s.path().join("WAKE"), "").expect("WAKE");
        assert!(sortie.finish(60).status.success());
        return;
    };
    let tab = open_run(&browser, &sv, &run, "");
    wait_js(
        &tab,
        "the table's rows",
        r#"document.querySelectorAll('.tr[data-label="gate"][data-state="running"]').length == 1"#,
    );
    // A mark that a reload would lose.
    eval(&tab, "window.__kept = 42; true");

    // The transcript panel of `gate`, then a line it prints after the page loaded.
    eval(
        &tab,
        r#"document.querySelector('.tr[data-label="gate"]').click(); true"#,
    );
    wait_js(
        &tab,
        "the transcript's first line",
        "(document.getElementById('transcript')||{}).textContent?.includes('first-line') === true",
    );
    std::fs::write(s.path().join("GO"), "").expect("GO");
    wait_js(
        &tab,
        "the line printed after the page loaded",
        "document.getElementById('transcript').textContent.includes('printed-after-the-page-loaded')",
    );
    // Its end shows on the page, without a reload.
    wait_js(
        &tab,
        "gate's row to say completed",
        r#"document.querySelectorAll('.tr[data-label="gate"][data-state="completed"]').length == 1"#,
    );
    assert_eq!(eval(&tab, "window.__kept"), 42, "the page was not reloaded");

    // Hold and release `sleeper` with the task panel's buttons.
    eval(
        &tab,
        r#"document.querySelector('.tr[data-label="sleeper"]').click(); true"#,
    );
    wait_js(&tab, "the hold button", "!!document.getElementById('hold')");
    eval(&tab, "document.getElementById('hold').click(); true");
    poll("the held process to stop", 30, || {
        (proc_state(sleeper) == Some('T')).then_some(())
    });
    wait_js(
        &tab,
        "the page to say held",
        r#"document.querySelector('.tr[data-label="sleeper"]').textContent.includes('held')"#,
    );
    wait_js(
        &tab,
        "the release button",
        "!!document.getElementById('release')",
    );
    eval(&tab, "document.getElementById('release').click(); true");
    poll("the released process to go on", 30, || {
        proc_state(sleeper).filter(|c| *c != 'T').map(|_| ())
    });
    let by = controls(&s, &run);
    assert_eq!(by.len(), 2, "{by:?}");
    assert!(by.iter().all(|b| b.starts_with("web (uid ")), "{by:?}");

    std::fs::write(s.path().join("WAKE"), "").expect("WAKE");
    wait_js(
        &tab,
        "the run to end on the page",
        r#"document.querySelectorAll('.tr[data-state="completed"]').length == 2"#,
    );
    let out = sortie.finish(60);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_sandboxed_tasks_panel_shows_the_connection_its_sandbox_denied() {
    if !crate::sandbox::can_sandbox() {
        return;
    }
    let s = Scratch::new();
    let home = s.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    // An address outside that no `sandbox_hosts` lists (TEST-NET-1: the sandbox's forwarder
    // resets the connection; nothing leaves the machine).
    s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"net\"\nsandbox = \"workspace\"\n\
         command = [\"bash\", \"-c\", \"(exec 3<>/dev/tcp/192.0.2.1/443 && echo ping >&3 && \
         read -r l <&3) 2>/dev/null; true\"]\n",
    );
    let out = s
        .sortie()
        .env("HOME", &home)
        .args(["run", "--run-id", "net", "batch.toml"])
        .output()
        .expect("run sortie");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = String::from_utf8_lossy(&s.run(&["status", "net"]).stdout).into_owned();
    assert!(
        status.contains("denied: 192.0.2.1:443 ×1 (sandbox_hosts)"),
        "{status}"
    );
    let sv = serve(&s);
    let Some(browser) = browser() else {
        return;
    };
    let tab = open_run(&browser, &sv, "net", "#task=0");
    wait_js(
        &tab,
        "the task's panel",
        "(document.querySelector('#task h2')||{}).textContent?.includes('net') === true",
    );
    let denied = eval(
        &tab,
        "(document.getElementById('denied')||{}).textContent || ''",
    );
    assert_eq!(
        denied,
        "sandbox denied: 192.0.2.1:443 ×1 (sandbox_hosts)",
        "{}",
        eval(&tab, "document.getElementById('task').textContent")
    );
}

#[test]
fn a_task_panel_follows_the_new_attempts_transcript_when_the_task_retries() {
    let s = Scratch::new();
    let run = unique_run("retry");
    let tried = s.path().join("tried");
    let go = s.path().join("GO");
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"flaky\"\ntransient_on = [\"flaky\"]\n\
             command = [\"sh\", \"-c\", \"if [ -e {t} ]; then echo second-try; else \
             touch {t}; echo first-try; while [ ! -e {g} ]; do sleep 0.05; done; \
             echo flaky >&2; exit 1; fi\"]\n",
            t = tried.display(),
            g = go.display(),
        ),
    );
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    attempt_pid(&s, &run, 0);
    let sv = serve(&s);
    let Some(browser) = browser() else {
        std::fs::write(&go, "").expect("GO");
        assert!(sortie.finish(60).status.success());
        return;
    };
    let tab = open_run(&browser, &sv, &run, "#task=0");
    wait_js(
        &tab,
        "the first attempt's transcript",
        "(document.getElementById('transcript')||{}).textContent?.includes('first-try') === true",
    );
    std::fs::write(&go, "").expect("GO");
    wait_js(
        &tab,
        "the second attempt's transcript",
        "document.getElementById('transcript').textContent.includes('second-try')",
    );
    assert_eq!(
        eval(
            &tab,
            "document.getElementById('transcript').textContent.includes('first-try')"
        ),
        Value::Bool(false),
        "the panel shows the new attempt's transcript alone"
    );
    assert_eq!(eval(&tab, "document.getElementById('attempt').value"), "2");
    let out = sortie.finish(60);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads server-sent events from `stream` until `n` arrived or `stop` says so: (id, data).
fn read_events(
    reader: &mut BufReader<TcpStream>,
    mut stop: impl FnMut(&[(u64, Value)]) -> bool,
) -> Vec<(u64, Value)> {
    let mut got = Vec::new();
    let (mut id, mut data) = (None, String::new());
    let mut line = String::new();
    while !stop(&got) {
        line.clear();
        if reader.read_line(&mut line).expect("read the stream") == 0 {
            break;
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if let Some(v) = l.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(v) = l.strip_prefix("data:") {
            data.push_str(v.trim_start());
        } else if l.is_empty() && !data.is_empty() {
            let v: Value = serde_json::from_str(&data).expect("an event's data is JSON");
            got.push((id.expect("every event has an id"), v));
            data.clear();
        }
    }
    got
}

/// Opens the event stream of `run` (`query`, and a `Last-Event-ID` when given).
fn open_stream(sv: &Served, run: &str, query: &str, last: Option<u64>) -> BufReader<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", sv.port)).expect("connect");
    let mut req = format!(
        "GET /api/v1/runs/{run}/events{query} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\
         Accept: text/event-stream\r\n{}\r\n",
        sv.port,
        bearer(sv)
    );
    if let Some(last) = last {
        req.push_str(&format!("Last-Event-ID: {last}\r\n"));
    }
    req.push_str("\r\n");
    (&stream).write_all(req.as_bytes()).expect("send");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    assert!(line.contains(" 200 "), "{line}");
    loop {
        line.clear();
        reader.read_line(&mut line).expect("a header");
        if line == "\r\n" {
            break;
        }
    }
    reader
}

/// The seq of a chunked stream is not needed: `read_events` reads lines, and a chunk's size
/// line is neither an `id:` nor a `data:` line, nor empty.
#[test]
fn the_event_stream_resumes_after_a_seq_without_a_gap_or_a_duplicate() {
    let s = Scratch::new();
    let run = unique_run("sse");
    let batch = s.write(
        "batch.toml",
        &format!(
            "concurrency = 1\n\n[[tasks]]\nlabel = \"gate\"\ncommand = {}\n\n\
             [[tasks]]\nlabel = \"next\"\ncommand = [\"echo\", \"next\"]\n",
            gated(&s, "waiting", "GO", "going"),
        ),
    );
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    attempt_pid(&s, &run, 0);
    let sv = serve(&s);

    // The first few records, then the connection is dropped mid-stream.
    let mut first = open_stream(&sv, &run, "", None);
    let a = read_events(&mut first, |got| got.len() >= 3);
    drop(first);
    let last = a.last().expect("three events").0;
    // More records become durable while no one listens: the gate opens, the run ends.
    std::fs::write(s.path().join("GO"), "").expect("GO");
    let out = sortie.finish(60);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let total = s.events(&run).len() as u64;

    let ends = |got: &[(u64, Value)]| got.last().is_some_and(|(id, _)| *id + 1 >= total);
    let mut again = open_stream(&sv, &run, &format!("?after={last}"), None);
    let b = read_events(&mut again, ends);
    // A browser's reconnection: the original URL, and the last id it had in a header (which wins).
    let mut browser_like = open_stream(&sv, &run, "?after=0", Some(last));
    let c = read_events(&mut browser_like, ends);
    assert_eq!(
        b.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        c.iter().map(|(id, _)| *id).collect::<Vec<_>>()
    );

    let ids: Vec<u64> = a.iter().chain(&b).map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        (0..total).collect::<Vec<_>>(),
        "every record once, in order"
    );
    let exported = s.events(&run);
    for (id, v) in a.iter().chain(&b) {
        assert_eq!(v["seq"], *id, "the id is the record's seq");
        assert_eq!(
            v, &exported[*id as usize],
            "the record as `sortie export` writes it"
        );
    }
}

/// docs/cli.md's `sortie serve` section: each API example (a request line, then its answer)
/// is asked of a server over a finished run, and the answer has the documented keys.
#[test]
fn the_api_examples_of_docs_cli_md_are_what_the_server_answers() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cli.md"))
        .expect("docs/cli.md");
    let section: String = doc
        .split("\n## `sortie serve`")
        .nth(1)
        .expect("a `sortie serve` section")
        .split("\n## ")
        .next()
        .unwrap_or_default()
        .to_owned();
    let examples = api_examples(&section);
    let asked: Vec<&str> = examples.iter().map(|e| e.0.as_str()).collect();
    for want in [
        "GET /api/v1/runs",
        "GET /api/v1/runs/{id}",
        "GET /api/v1/runs/{id}/events?after=SEQ",
        "POST /api/v1/runs/{id}/control",
    ] {
        assert!(asked.contains(&want), "no example of {want}: {asked:?}");
    }

    let s = Scratch::new();
    let run = unique_run("apidoc");
    let batch = s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"gate\"\ncommand = {}\n",
            gated(&s, "waiting", "GO", "going")
        ),
    );
    let sortie = Background::start(
        &s,
        &run,
        &["run", &batch.display().to_string(), "--run-id", &run],
    );
    attempt_pid(&s, &run, 0);
    let sv = serve(&s);
    for (request, body, answer) in &examples {
        let (method, path) = request.split_once(' ').expect("METHOD PATH");
        let path = path.replace("{id}", &run).replace("SEQ", "0");
        let keys = |v: &Value| -> Vec<String> {
            let one = if let Value::Array(a) = v {
                a.first().cloned().unwrap_or(Value::Null)
            } else {
                v.clone()
            };
            let mut k: Vec<String> = one
                .as_object()
                .map(|o| o.keys().cloned().collect())
                .unwrap_or_default();
            k.sort();
            k
        };
        if path.contains("/events") {
            let query = path
                .split_once("/events")
                .map(|(_, q)| q)
                .unwrap_or_default();
            let mut stream = open_stream(&sv, &run, query, None);
            let got = read_events(&mut stream, |g| !g.is_empty());
            assert_eq!(got[0].0, 1, "after=0 starts at seq 1");
            assert_eq!(keys(&got[0].1), keys(answer), "{request}");
            continue;
        }
        let got = http(&sv, method, &path, &[bearer(&sv)], body);
        assert_eq!(got.status, 200, "{request}: {}", got.body);
        assert_eq!(keys(&got.json()), keys(answer), "{request}: {}", got.body);
    }
    std::fs::write(s.path().join("GO"), "").expect("GO");
    assert!(sortie.finish(60).status.success());
}

/// The examples of a section: each ```http block holds a request line (and a JSON body for a
/// POST), the ```json block after it the answer (for the event stream: one event's data).
fn api_examples(section: &str) -> Vec<(String, String, Value)> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut block: Option<(String, String)> = None;
    for line in section.lines() {
        match (&mut block, line) {
            (None, l) if l.starts_with("```") && l.len() > 3 => {
                block = Some((l[3..].to_owned(), String::new()));
            }
            (Some(_), "```") => blocks.extend(block.take()),
            (Some((_, b)), l) => {
                b.push_str(l);
                b.push('\n');
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for pair in blocks.windows(2) {
        if let [(kind, req), (next, answer)] = pair
            && kind == "http"
            && next == "json"
        {
            let mut lines = req.lines();
            let request = lines.next().unwrap_or_default().trim().to_owned();
            let body = lines.collect::<Vec<_>>().join("\n").trim().to_owned();
            let answer = serde_json::from_str(answer)
                .unwrap_or_else(|e| panic!("the answer to {request} does not parse: {e}"));
            out.push((request, body, answer));
        }
    }
    out
}

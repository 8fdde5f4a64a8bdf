//! #35: the benchmark of `sortie serve` (`bench/serve.sh` runs it; not a test): the run page of
//! a finished run (100,000 tasks in the script) opened in headless Chromium, driven over the
//! DevTools protocol, and timed with the browser's Performance API: from navigation to the
//! table drawn, then a filter typed and answered (the rows redrawn): first cold (a new server,
//! the page opened the moment it printed its URL; then another new server, the page opened
//! `--settle` seconds after it started), then warm (`--rounds` visits). Then the server's CPU
//! time while idle with the page open, over `--idle` seconds (default 60), from `/proc`.
//!
//! `serve_bench --sortie target/release/sortie --state-dir DIR --run ID [--rounds 3]
//! [--settle 5] [--idle 60]`
//!
//! Prints one line per round, then `serve_bench key=value ...`.

#![allow(clippy::unwrap_used, reason = "a benchmark: any failure aborts it")]
#![allow(clippy::disallowed_methods, reason = "a benchmark starts sortie serve")]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use headless_chrome::{Browser, LaunchOptions};

struct Args {
    sortie: PathBuf,
    state_dir: PathBuf,
    run: String,
    rounds: usize,
    idle: u64,
    /// How long after the server started its settled first visit comes, in seconds.
    settle: u64,
    /// Only a screenshot of the run page with task 0's panel open (README's picture).
    screenshot: Option<PathBuf>,
}

fn args() -> Args {
    let mut a = Args {
        sortie: PathBuf::from("target/release/sortie"),
        state_dir: PathBuf::from(".sortie"),
        run: String::new(),
        rounds: 3,
        idle: 60,
        settle: 5,
        screenshot: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_default();
        match k.as_str() {
            "--sortie" => a.sortie = v.into(),
            "--state-dir" => a.state_dir = v.into(),
            "--run" => a.run = v,
            "--rounds" => a.rounds = v.parse().unwrap(),
            "--idle" => a.idle = v.parse().unwrap(),
            "--settle" => a.settle = v.parse().unwrap(),
            "--screenshot" => a.screenshot = Some(v.into()),
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!a.run.is_empty(), "--run ID");
    a
}

/// User + system CPU of `pid`, in clock ticks (`/proc/PID/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Waits until `js` is true in the page (60 s at most).
fn wait_js(tab: &headless_chrome::Tab, js: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    while tab.evaluate(js, false).unwrap().value != Some(serde_json::Value::Bool(true)) {
        assert!(Instant::now() < until, "gave up waiting for {js}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The page with a task's panel open, its transcript and the timeline drawn, as a PNG.
fn screenshot(tab: &headless_chrome::Tab, page: &str, png: &std::path::Path) {
    use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
    tab.navigate_to(page).unwrap();
    tab.wait_until_navigated().unwrap();
    wait_js(
        tab,
        "document.querySelectorAll('#transcript .msg').length > 3 && \
         !!document.querySelector('#timeline .row')",
    );
    std::thread::sleep(Duration::from_millis(300));
    let bytes = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    std::fs::write(png, bytes).unwrap();
}

/// `sortie serve` started on the state dir: the process and the run page's URL.
fn start_server(a: &Args) -> (std::process::Child, String) {
    let mut server = Command::new(&a.sortie)
        .args(["--state-dir"])
        .arg(&a.state_dir)
        .args(["serve", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("sortie serve: ")
        .unwrap()
        .to_owned();
    let (base, token) = url.split_once("/?token=").unwrap();
    let page = format!("{base}/runs/{}?token={token}", a.run);
    (server, page)
}

fn stop(mut server: std::process::Child) {
    let _ = server.kill();
    let _ = server.wait();
}

/// One visit of the run page: (table drawn, thread free, a filter answered), in ms since
/// navigation, and how many rows.
fn visit(tab: &headless_chrome::Tab, page: &str) -> (f64, f64, f64, serde_json::Value) {
    tab.navigate_to(page).unwrap();
    tab.wait_until_navigated().unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    let (ready, idle) = loop {
        let v = tab
            .evaluate(
                "JSON.stringify(window.sortie && window.sortie.idle ? \
                 [window.sortie.ready, window.sortie.idle] : null)",
                false,
            )
            .unwrap()
            .value
            .and_then(|v| {
                v.as_str()
                    .and_then(|s| serde_json::from_str::<[f64; 2]>(s).ok())
            });
        if let Some([ready, idle]) = v {
            break (ready, idle);
        }
        assert!(Instant::now() < until, "the table was never drawn");
        std::thread::sleep(Duration::from_millis(20));
    };
    // A filter typed: the rows answering it drawn (layout forced), timed in the page.
    let filter = tab
        .evaluate(
            "(() => { const t0 = performance.now(); const q = document.getElementById('q'); \
             q.value = 'task-4242'; q.dispatchEvent(new Event('input')); \
             const n = document.querySelectorAll('#rows .tr').length; \
             document.body.offsetHeight; \
             return n > 0 ? performance.now() - t0 : -1; })()",
            false,
        )
        .unwrap()
        .value
        .and_then(|v| v.as_f64())
        .unwrap();
    assert!(filter >= 0.0, "the filter found no row");
    let rows = tab
        .evaluate("window.sortie.cols.label.length", false)
        .unwrap()
        .value
        .unwrap();
    (ready, idle, filter, rows)
}

fn main() {
    let a = args();
    let browser = Browser::new(
        LaunchOptions::default_builder()
            .path(Some("/usr/bin/chromium".into()))
            .sandbox(false)
            .window_size(Some((1280, 1100)))
            .idle_browser_timeout(Duration::from_secs(a.idle + 300))
            .build()
            .unwrap(),
    )
    .unwrap();
    let tab = browser.new_tab().unwrap();
    // The browser's own first navigation (its renderer started) is not the page's.
    tab.navigate_to("about:blank").unwrap();
    tab.wait_until_navigated().unwrap();
    if let Some(png) = &a.screenshot {
        let (server, page) = start_server(&a);
        screenshot(&tab, &format!("{page}#task=0"), png);
        stop(server);
        return;
    }
    // Cold, at once: the page opened the moment the server printed its URL (the server's
    // first read of the run, started in the background when it started, still under way).
    let (server, page) = start_server(&a);
    let (_, idle, filter, rows) = visit(&tab, &page);
    let cold_now = idle + filter;
    println!(
        "cold, navigation as the server started: interactive at {cold_now:.0} ms ({rows} rows)"
    );
    stop(server);
    // Cold, settled: a new server (a new origin: nothing cached), the page opened SETTLE
    // seconds after it started; its first visit of the run.
    let (server, page) = start_server(&a);
    std::thread::sleep(Duration::from_secs(a.settle));
    let (_, idle, filter, _) = visit(&tab, &page);
    let cold_settled = idle + filter;
    println!(
        "cold, first visit {}s after the server started: interactive at {cold_settled:.0} ms",
        a.settle
    );
    // Warm: the same server, the page visited again.
    let mut drawn = Vec::new();
    let mut interactive = Vec::new();
    let mut filters = Vec::new();
    for round in 1..=a.rounds {
        let (ready, idle, filter, rows) = visit(&tab, &page);
        // Interactive: drawn, the thread free, and a filter answered from there.
        let answered = idle + filter;
        println!(
            "round {round}: table drawn {ready:.0} ms after navigation, thread free at \
             {idle:.0} ms, a filter answered in {filter:.1} ms: interactive at {answered:.0} ms \
             ({rows} rows)"
        );
        drawn.push(ready);
        filters.push(filter);
        interactive.push(answered);
    }
    // Idle: the page open (its event stream connected), nothing happening.
    let pid = server.id();
    let hz = 100.0;
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(a.idle));
    let idle_cpu_s = (cpu_ticks(pid) - before) as f64 / hz;
    let per_minute = idle_cpu_s * 60.0 / a.idle as f64;
    println!("server CPU while idle with the page open: {per_minute:.3} s per minute");
    println!(
        "serve_bench cold_now_ms={cold_now:.0} cold_settled_ms={cold_settled:.0} drawn_ms={:.0} \
         filter_ms={:.1} interactive_ms={:.0} idle_cpu_s_per_min={per_minute:.3}",
        median(drawn),
        median(filters),
        median(interactive)
    );
    drop(tab);
    drop(browser);
    stop(server);
}

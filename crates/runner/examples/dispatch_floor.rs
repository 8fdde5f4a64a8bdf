//! Two yardsticks for `bench/dispatch.sh`: what a supervised dispatcher cannot avoid, without
//! the rest of sortie.
//!
//! - `dispatch_floor inprocess N DIR`: 16 threads start N × `true`, each with a stdout and a
//!   stderr file of its own created for it in DIR, and append a `started` and an `exit` line
//!   per attempt to one status log: the files and records a supervised attempt needs, with no
//!   process between the dispatcher and the agent, no journal and no protocol.
//! - `dispatch_floor shepherd SORTIE N DIR`: sortie's own per-run shepherd (`SORTIE
//!   __shepherd`), driven over its stdin and stdout as sortie drives it, 16 attempts at a
//!   time: the supervised spawn path alone, without sortie's engine, journal or followers.
//!
//! Each prints nothing and exits 0 when every attempt exited 0; the caller times it.

#![allow(
    clippy::disallowed_methods,
    reason = "a yardstick: it spawns `true` and the shepherd itself, without sortie's spawn"
)]

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// As many attempts at a time as the benchmark's `-P`.
const AT_ONCE: usize = 16;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["inprocess", n, dir] => count(n).and_then(|n| in_process(n, Path::new(dir))),
        ["shepherd", sortie, n, dir] => {
            count(n).and_then(|n| through_shepherd(Path::new(sortie), n, Path::new(dir)))
        }
        _ => Err("usage: dispatch_floor inprocess N DIR | shepherd SORTIE N DIR".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dispatch_floor: {e}");
            ExitCode::FAILURE
        }
    }
}

fn count(n: &str) -> Result<usize, String> {
    n.parse().map_err(|e| format!("{n}: not a count: {e}"))
}

/// The stdout and stderr paths of attempt `i`, named as the shepherd's are.
fn files_of(dir: &Path, i: usize) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{i}.1.stdout")),
        dir.join(format!("{i}.1.stderr")),
    )
}

fn in_process(n: usize, dir: &Path) -> Result<(), String> {
    let io = |what: &Path| {
        let what = what.display().to_string();
        move |e: std::io::Error| format!("{what}: {e}")
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let log_path = dir.join("status.log");
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io(&log_path))?;
    let log = Arc::new(Mutex::new(log));
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..AT_ONCE)
        .map(|_| {
            let (log, next, dir) = (Arc::clone(&log), Arc::clone(&next), dir.to_owned());
            std::thread::spawn(move || -> Result<(), String> {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok(());
                    }
                    let (stdout, stderr) = files_of(&dir, i);
                    let out = File::create(&stdout).map_err(io(&stdout))?;
                    let err = File::create(&stderr).map_err(io(&stderr))?;
                    let mut child = Command::new("true")
                        .stdin(Stdio::null())
                        .stdout(out)
                        .stderr(err)
                        .process_group(0)
                        .spawn()
                        .map_err(|e| format!("cannot start true: {e}"))?;
                    let record = |line: String| {
                        let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                        log.write_all(line.as_bytes())
                            .map_err(|e| format!("status log: {e}"))
                    };
                    record(format!("started {i} {}\n", child.id()))?;
                    let status = child.wait().map_err(|e| format!("wait: {e}"))?;
                    record(format!("exit {i} {status}\n"))?;
                    if !status.success() {
                        return Err(format!("attempt {i}: true {status}"));
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker
            .join()
            .map_err(|_| "a worker panicked".to_owned())??;
    }
    Ok(())
}

fn through_shepherd(sortie: &Path, n: usize, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let cwd = std::env::current_dir().map_err(|e| format!("current dir: {e}"))?;
    let mut shepherd = Command::new(sortie)
        .arg(sortie_runner::supervisor::SHEPHERD_ARG)
        .env(
            sortie_runner::supervisor::SHEPHERD_MARKER,
            "dispatch-floor/1",
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {} {}: {e}", sortie.display(), "__shepherd"))?;
    let (Some(mut requests), Some(replies)) = (shepherd.stdin.take(), shepherd.stdout.take())
    else {
        return Err("the shepherd's pipes are missing".into());
    };
    let mut replies = BufReader::new(replies).lines();
    let mut line = || -> Result<String, String> {
        replies
            .next()
            .ok_or("the shepherd closed its stdout")?
            .map_err(|e| format!("reading the shepherd: {e}"))
    };
    let ready = line()?;
    if !ready.starts_with("ready ") {
        return Err(format!("the shepherd said {ready:?}, not ready"));
    }
    let mut send = |i: usize| -> Result<(), String> {
        let (stdout, stderr) = files_of(dir, i);
        let request = serde_json::json!({
            "op": "spawn",
            "id": i,
            "dir": dir.join(format!("{i}.1")),
            "files": {"stdout": stdout, "stderr": stderr},
            "argv": ["true"],
            "cwd": cwd,
            "env": [],
            "marker": ["SORTIE_ATTEMPT", format!("dispatch-floor/{i}")],
            "stdin": null,
        });
        writeln!(requests, "{request}").map_err(|e| format!("writing to the shepherd: {e}"))
    };
    let mut sent = 0;
    while sent < n.min(AT_ONCE) {
        send(sent)?;
        sent += 1;
    }
    let mut exits: HashMap<String, usize> = HashMap::new();
    let mut ended = 0;
    while ended < n {
        let reply = line()?;
        let mut words = reply.split_whitespace();
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("started"), ..) => {}
            (Some("exit"), Some(id), Some(how), Some(value)) => {
                if (how, value) != ("code", "0") {
                    return Err(format!("attempt {id} ended with {how} {value}"));
                }
                *exits.entry(id.to_owned()).or_default() += 1;
                ended += 1;
                if sent < n {
                    send(sent)?;
                    sent += 1;
                }
            }
            _ => return Err(format!("the shepherd said {reply:?}")),
        }
    }
    if exits.len() != n {
        return Err(format!("{} attempts ended, of {n}", exits.len()));
    }
    writeln!(requests, "{}", serde_json::json!({"op": "close"}))
        .map_err(|e| format!("writing to the shepherd: {e}"))?;
    drop(requests);
    shepherd
        .wait()
        .map_err(|e| format!("waiting for the shepherd: {e}"))?;
    Ok(())
}

//! #34: the real pi and Claude Code, each sandboxed by default (a built-in agent profile, no
//! `sandbox` in the batch), and Codex with `sandbox = "workspace"` and `permissions = "full"`
//! (its own sandbox cannot start inside sortie's: docs/sandbox.md, "Not yet"), against the
//! project's mock providers on 127.0.0.1
//! (reached through the sandbox's forwarding of the agent's provider `host:port`). The mock
//! scripts one bash tool call that tries what a hijacked agent would: read `~/.ssh/id_test`,
//! write `$HOME/pwned`, connect to another port of the host's loopback (a listener the test
//! runs), and write a file of its own in its working directory. Each forbidden step fails
//! (the files are unchanged, the listener sees no connection), the own write succeeds, the
//! agent reaches its mock for its answer, and the task completes.
//!
//! Skipped, saying why, without the pinned CLI (or python3), or on a machine that cannot
//! sandbox, unless `CI` is set (see `sortie_testkit::real_agent`).

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sortie_testkit::real_agent::{
    ANSWER, MockServer, PI_VARS, attempts, claude_found, codex_found, codex_user, pi_found,
    pi_user, should_run,
};

use crate::support::{Background, Scratch, unique_run};

/// What the tool call's steps printed, in order, when the sandbox holds.
const HELD: &str = "read_ssh denied\nwrite_home denied\nconnect denied\nwrite_own ok\n";

/// The fake user's home with a key, the host's listener, and the tool call's command.
struct Trap {
    s: Scratch,
    home: PathBuf,
    work: PathBuf,
    /// Set when the host's other listener accepted a connection.
    reached: Arc<AtomicBool>,
    /// Set when the test is over (the listener's thread ends).
    done: Arc<AtomicBool>,
    command: String,
}

impl Drop for Trap {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}

/// A listener of the host's loopback that greets whoever connects with `hello` and says it was
/// reached; its port.
fn greeter(reached: Arc<AtomicBool>, done: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        while !done.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut conn, _)) => {
                    reached.store(true, Ordering::SeqCst);
                    let _ = conn.write_all(b"hello\n");
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    });
    port
}

impl Trap {
    fn new() -> Trap {
        let s = Scratch::new();
        let home = s.path().join("home");
        std::fs::create_dir_all(home.join(".ssh")).expect("mkdir .ssh");
        std::fs::write(home.join(".ssh/id_test"), "secret key\n").expect("key");
        let work = s.path().join("work");
        std::fs::create_dir_all(&work).expect("mkdir work");
        let reached = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let port = greeter(reached.clone(), done.clone());
        // One line: each step in its own bash, its verdict appended to results.txt. The
        // connection counts only if the host's listener greets it (a forwarder may accept
        // and close a connection it refuses).
        let command = format!(
            "r() {{ if bash -c \"$2\" >/dev/null 2>&1; then echo \"$1 ok\"; else echo \"$1 denied\"; fi >> results.txt; }}; \
             r read_ssh 'cat \"$HOME/.ssh/id_test\"'; r write_home 'echo x > \"$HOME/pwned\"'; \
             r connect 'exec 3<>/dev/tcp/127.0.0.1/{port} && read -t 5 l <&3 && test \"$l\" = hello'; r write_own 'echo mine > mine.txt'; \
             cat results.txt"
        );
        Trap {
            s,
            home,
            work,
            reached,
            done,
            command,
        }
    }

    /// The batch of one task run by `agent` on `model`, with `extra` lines.
    fn batch(&self, agent: &str, model: &str, extra: &str) -> PathBuf {
        self.s.write(
            "batch.toml",
            &format!(
                "[[tasks]]\nlabel = \"trap\"\nagent = \"{agent}\"\ncwd = \"work\"\n\
                 model = \"{model}\"\nattempt_timeout = \"3m\"\nmax_retries = 0\n{extra}\
                 prompt = \"Run the checks.\"\n"
            ),
        )
    }

    /// Runs `cmd` (`sortie` with the agent's environment) on `batch` and checks what a user
    /// would: the run completed, the task's steps were refused but its own write, nothing
    /// outside changed, the listener saw nothing, and the mock served the agent twice (the
    /// tool call, then the answer).
    fn check(self, mut cmd: Command, batch: &Path, mock: &MockServer, run: &str) {
        cmd.args(["run", "--run-id", run])
            .arg(batch)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let out = Background::from_command(cmd, run).finish(300);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let events = self.s.events(run);
        let trap = attempts(&events, 0);
        assert_eq!(out.status.code(), Some(0), "{trap:?} {stderr}");
        assert_eq!(trap.len(), 1, "{trap:?}");
        assert_eq!(trap[0].status, "completed", "{trap:?}");
        let results = std::fs::read_to_string(self.work.join("results.txt")).unwrap_or_default();
        if results != HELD {
            let logs = self.s.run(&["logs", run, "trap"]);
            let stderr_log = self
                .s
                .state_dir()
                .join("runs")
                .join(run)
                .join("logs/0.1.stderr");
            panic!(
                "the tool call's steps said {results:?}, not {HELD:?}: {trap:?}\n{}{}\n{}",
                String::from_utf8_lossy(&logs.stdout),
                String::from_utf8_lossy(&logs.stderr),
                std::fs::read_to_string(stderr_log).unwrap_or_default()
            );
        }
        assert_eq!(
            std::fs::read_to_string(self.work.join("mine.txt"))
                .ok()
                .as_deref(),
            Some("mine\n")
        );
        assert!(
            !self.home.join("pwned").exists(),
            "the agent wrote $HOME/pwned"
        );
        assert_eq!(
            std::fs::read_to_string(self.home.join(".ssh/id_test")).expect("key"),
            "secret key\n"
        );
        assert!(
            !self.reached.load(Ordering::SeqCst),
            "the host's other listener saw a connection"
        );
        assert!(mock.served().len() >= 2, "{:?}", mock.served());
        // The policy reached the mock by its host and port, and nothing else of loopback.
        let policy = self
            .s
            .state_dir()
            .join("runs")
            .join(run)
            .join("sandbox/0.1/policy.json");
        let policy = std::fs::read_to_string(&policy).expect("the attempt's policy");
        let hosts: serde_json::Value = serde_json::from_str(&policy).expect("json");
        let want = format!("127.0.0.1:{}", mock.port);
        assert!(
            hosts["hosts"]
                .as_array()
                .expect("hosts")
                .iter()
                .any(|h| h == want.as_str()),
            "{policy}"
        );
    }
}

/// Whether this machine can sandbox; if not, the test is skipped saying why (or fails under
/// CI, through `should_run`).
fn sandbox_found() -> Result<(), String> {
    let out = Command::new(env!("CARGO_BIN_EXE_sortie"))
        .args(["__sandbox", "--probe"])
        .output()
        .map_err(|e| format!("cannot run the probe: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "this machine cannot sandbox: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The mock `script` answering `model` with a tool call running `command`, then [`ANSWER`].
fn mock_with(dir: &Path, script: &str, model_flag: &str, model: &str, command: &str) -> MockServer {
    let mut args: Vec<String> = vec![
        model_flag.into(),
        model.into(),
        "--command".into(),
        command.into(),
    ];
    if script == "codex_server.py" {
        args.insert(0, "--print-port".into());
    } else {
        args.extend(["--answer".into(), ANSWER.into()]);
    }
    MockServer::start(dir, script, &args)
}

#[test]
fn real_pi_sandboxed_reaches_its_mock_and_nothing_else() {
    if !should_run("real_sandbox_pi", pi_found().and_then(|()| sandbox_found())) {
        return;
    }
    let t = Trap::new();
    let mock = mock_with(t.s.path(), "server.py", "--model", "tool=tool", &t.command);
    // pi's auth.json is linked into its home from the user's: the sandbox must read it.
    pi_user(&t.home, mock.port, &["tool"]);
    let batch = t.batch("pi", "mock/tool", "");
    let mut cmd = t.s.sortie();
    cmd.env("HOME", &t.home);
    for name in PI_VARS {
        cmd.env_remove(name);
    }
    let run = unique_run("real-sandbox-pi");
    t.check(cmd, &batch, &mock, &run);
}

#[test]
fn real_claude_sandboxed_reaches_its_mock_and_nothing_else() {
    if !should_run(
        "real_sandbox_claude",
        claude_found().and_then(|()| sandbox_found()),
    ) {
        return;
    }
    let t = Trap::new();
    let mock = mock_with(
        t.s.path(),
        "anthropic_server.py",
        "--model",
        "tool=tool",
        &t.command,
    );
    let batch = t.batch("claude", "tool", "");
    let mut cmd = t.s.sortie();
    mock.claude_env(&mut cmd, &t.home);
    let run = unique_run("real-sandbox-claude");
    t.check(cmd, &batch, &mock, &run);
}

/// Codex confined by sortie's sandbox alone (`permissions = "full"`: Codex starts no sandbox of
/// its own; its bubblewrap cannot start inside sortie's, and Codex refuses its legacy Landlock
/// sandbox for any filesystem-restricted mode: docs/sandbox.md, "Not yet").
#[test]
fn real_codex_sandboxed_reaches_its_mock_and_nothing_else() {
    if !should_run(
        "real_sandbox_codex",
        codex_found().and_then(|()| sandbox_found()),
    ) {
        return;
    }
    let t = Trap::new();
    let mock = mock_with(
        t.s.path(),
        "codex_server.py",
        "--model-scenario",
        "tool=tool",
        &t.command,
    );
    codex_user(&t.home, mock.port);
    let batch = t.batch(
        "codex",
        "tool",
        "sandbox = \"workspace\"\npermissions = \"full\"\nenv = { MOCK_API_KEY = \"mock-key\" }\n",
    );
    let mut cmd = t.s.sortie();
    cmd.env("HOME", &t.home).env_remove("CODEX_HOME");
    let run = unique_run("real-sandbox-codex");
    t.check(cmd, &batch, &mock, &run);
}

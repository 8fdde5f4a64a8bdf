//! #34: a plain command with `sandbox = "workspace"`, in a temporary `HOME` made by the test,
//! tries what a hostile agent would (write outside its worktree, into another task's worktree
//! and the run's journal; read `~/.ssh` and `env.json`; connect to a loopback port of the host;
//! resolve a name) and does its own work (writes and commits in its worktree, uses `TMPDIR`):
//! every forbidden step fails, every allowed one succeeds, the task completes: as the test's
//! user (root, in CI) and as an unprivileged one (uid 1000, through `setpriv`). With
//! `sandbox_hosts`, it reaches the host listed and nothing else, and its denied connections
//! are journaled and shown.

use std::path::PathBuf;

use sortie_testkit::git;

use crate::support::Scratch;

/// Whether this machine can sandbox (the probe `sortie check` reports); a machine that cannot
/// skips the test, saying so.
pub(crate) fn can_sandbox() -> bool {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sortie"))
        .args(["__sandbox", "--probe"])
        .output()
        .expect("run the probe");
    if !out.status.success() {
        eprintln!(
            "skipped: this machine cannot sandbox: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out.status.success()
}

#[test]
fn a_sandboxed_command_does_its_work_and_nothing_else() {
    if !can_sandbox() {
        return;
    }
    hostile_box(&Scratch::new(), None, None);
}

/// The same on Slurm: the wrapper runs in the job, on the compute node, through the same
/// sortie binary (a real cluster, `.ci/slurm/up.sh`; skipped with a reason when none answers,
/// failed under CI).
#[test]
fn slurm_a_sandboxed_job_does_its_work_and_nothing_else() {
    if !can_sandbox()
        || !sortie_testkit::slurm::should_run(
            "slurm_a_sandboxed_job_does_its_work_and_nothing_else",
        )
    {
        return;
    }
    let run = sortie_testkit::unique_run("slurmsbx");
    let _cleanup = sortie_testkit::slurm::CancelOnDrop(format!("sortie:{run}:"));
    hostile_box(&Scratch::new(), None, Some(&run));
}

/// The uid the unprivileged case runs as.
const USER: u32 = 1000;

#[test]
fn an_unprivileged_user_is_sandboxed_as_root_is() {
    if !can_sandbox() {
        return;
    }
    let s = Scratch::new();
    if nix::unistd::getuid().is_root() {
        // sortie as uid 1000 (no groups), everything it touches that uid's own.
        hostile_box(&s, Some(USER), None);
    } else {
        // Not root: this test's own user is the unprivileged one.
        hostile_box(&s, None, None);
    }
}

/// A plain command in a worktree, sandboxed, tries the forbidden steps and does its work;
/// with `as_uid`, sortie runs as that uid (through `setpriv`), the scratch dir its own; with
/// `slurm`, the tasks are Slurm jobs of the run of that id.
fn hostile_box(s: &Scratch, as_uid: Option<u32>, slurm: Option<&str>) {
    let home = s.path().join("home");
    std::fs::create_dir_all(home.join(".ssh")).expect("mkdir home");
    std::fs::write(home.join(".ssh/id_test"), "secret key\n").expect("write key");
    let repo = s.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("f.txt"), "one\n").expect("write f.txt");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    // A listener of the host's loopback: the sandbox has a loopback of its own.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let run = slurm.unwrap_or("sbx");
    let state = s.state_dir();
    let other = state.join("worktrees").join(run).join("other");
    let run_dir = state.join("runs").join(run);
    let script = format!(
        r#"r() {{ if sh -c "$2" >/dev/null 2>&1; then echo "$1 ok"; else echo "$1 denied"; fi >> results.txt; }}
r write_home 'echo x > "$HOME/outside"'
r write_other 'echo x > {other}/evil'
r write_journal 'echo x > {run_dir}/evil'
r read_ssh 'cat "$HOME/.ssh/id_test"'
r read_env 'cat {run_dir}/env.json'
r connect 'bash -c "exec 3<>/dev/tcp/127.0.0.1/{port} && echo hi >&3 && read -r l <&3 && test -n \\"\\$l\\""'
r resolve 'getent hosts example.com'
r write_own 'echo mine > mine.txt'
r tmp 'echo t > "$TMPDIR/t" && test -s "$TMPDIR/t"'
r commit 'git add mine.txt && git -c user.name=t -c user.email=t@e commit -qm mine'
"#,
        other = other.display(),
        run_dir = run_dir.display(),
    );
    s.write("box.sh", &script);
    let defaults = if slurm.is_some() {
        "[defaults]\nexecutor = \"slurm\"\n\n"
    } else {
        ""
    };
    let batch = format!(
        "{defaults}[[tasks]]\nlabel = \"other\"\ncwd = \"repo\"\nisolation = \"worktree\"\n\
         command = [\"true\"]\nenv = {{ TOKEN = \"s3cret\" }}\n\n\
         [[tasks]]\nlabel = \"box\"\ncwd = \"repo\"\nisolation = \"worktree\"\n\
         sandbox = \"workspace\"\nneeds = [\"other\"]\nsandbox_read = [\"{}\"]\n\
         command = [\"sh\", \"{}\"]\n",
        s.path().join("box.sh").display(),
        s.path().join("box.sh").display(),
    );
    s.write("batch.toml", &batch);
    let mut cmd = match as_uid {
        None => s.sortie(),
        Some(uid) => {
            // The binary copied where that uid can run it (the checkout may be root's own).
            let bin = s.path().join("sortie");
            std::fs::copy(env!("CARGO_BIN_EXE_sortie"), &bin).expect("copy sortie");
            let chown = std::process::Command::new("chown")
                .arg("-R")
                .arg(format!("{uid}:{uid}"))
                .arg(s.path())
                .status()
                .expect("chown");
            assert!(chown.success());
            let mut c = std::process::Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg(&bin)
                .current_dir(s.path())
                .env_remove("SORTIE_DIR")
                .arg("--state-dir")
                .arg(&state)
                .stdin(std::process::Stdio::null());
            c
        }
    };
    let out = cmd
        .env("HOME", &home)
        .args(["run", "--run-id", run, "batch.toml"])
        .output()
        .expect("run sortie");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mine: PathBuf = state.join("worktrees").join(run).join("box");
    let results = std::fs::read_to_string(mine.join("results.txt")).expect("results");
    let want = "write_home denied\nwrite_other denied\nwrite_journal denied\nread_ssh denied\n\
                read_env denied\nconnect denied\nresolve denied\nwrite_own ok\ntmp ok\n\
                commit ok\n";
    assert_eq!(results, want);
    assert!(!home.join("outside").exists());
    assert!(!other.join("evil").exists());
    assert!(!run_dir.join("evil").exists());
    assert!(
        listener.accept().is_err(),
        "the host's listener saw a connection"
    );
    assert_eq!(
        std::fs::read_to_string(mine.join("mine.txt"))
            .ok()
            .as_deref(),
        Some("mine\n")
    );
    if let Some(uid) = as_uid {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(mine.join("mine.txt")).expect("mine.txt");
        assert_eq!(meta.uid(), uid, "the task ran as uid {uid}");
    }
}

#[test]
fn check_says_whether_the_machine_can_sandbox_and_what_a_task_may_do() {
    let s = Scratch::new();
    s.write(
        "batch.toml",
        "[[tasks]]\nlabel = \"box\"\ncommand = [\"true\"]\nsandbox = \"workspace\"\n\
         sandbox_write = [\"/srv/cache\"]\nsandbox_hosts = [\"pypi.org:443\"]\n\n\
         [[tasks]]\nlabel = \"free\"\ncommand = [\"true\"]\n",
    );
    let out = s.run(&["--json", "check", "batch.toml"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let machine = &v["sandbox"]["machine"];
    assert_eq!(machine["ok"].as_bool(), Some(can_sandbox()), "{v}");
    let tasks = v["sandbox"]["tasks"].as_array().expect("tasks");
    assert_eq!(tasks.len(), 1, "{v}");
    assert_eq!(tasks[0]["label"], "box");
    assert_eq!(tasks[0]["sandbox_write"][0], "/srv/cache");
    assert_eq!(tasks[0]["sandbox_hosts"][0], "pypi.org:443");
    let text = s.run(&["check", "batch.toml"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("sandbox box: writes its working directory"),
        "{text}"
    );
    // A host that is not host:port is an error at its line.
    s.write(
        "bad.toml",
        "[[tasks]]\nlabel = \"box\"\ncommand = [\"true\"]\nsandbox_hosts = [\"pypi.org\"]\n",
    );
    let bad = s.run(&["check", "bad.toml"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stdout).contains("is not host:port"));
}

/// A listener on the host's loopback that answers one connection with `hello`, and says what
/// it was sent.
fn mock_server() -> (u16, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let serve = std::thread::spawn(move || {
        let (conn, _) = listener.accept().expect("accept");
        let mut reader = std::io::BufReader::new(conn.try_clone().expect("clone"));
        let mut got = String::new();
        reader.read_line(&mut got).expect("read");
        (&conn).write_all(b"hello\n").expect("write");
        got
    });
    (port, serve)
}

#[test]
fn a_sandboxed_command_reaches_its_listed_host_only_and_its_denials_are_journaled() {
    if !can_sandbox() {
        return;
    }
    let s = Scratch::new();
    let home = s.path().join("home");
    std::fs::create_dir_all(&home).expect("mkdir home");
    // A host listener the task may not reach: it must see no connection.
    let forbidden = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    forbidden.set_nonblocking(true).expect("nonblocking");
    let denied_port = forbidden.local_addr().expect("addr").port();
    let (allowed_port, served) = mock_server();
    let script = format!(
        r#"r() {{ if sh -c "$2" >/dev/null 2>&1; then echo "$1 ok"; else echo "$1 denied"; fi >> results.txt; }}
r allowed 'bash -c "exec 3<>/dev/tcp/127.0.0.1/{allowed_port} && echo ping >&3 && read -r l <&3 && test \"\$l\" = hello"'
r forbidden 'bash -c "exec 3<>/dev/tcp/127.0.0.1/{denied_port} && echo ping >&3 && read -r l <&3 && test -n \"\$l\""'
r resolve 'getent hosts example.com'
r outside 'timeout 60 bash -c "exec 3<>/dev/tcp/192.0.2.1/443 && echo ping >&3 && read -r l <&3 && test -n \"\$l\""'
r resolve_listed 'getent hosts pypi.org | grep -q "^198\.18\."'
"#
    );
    s.write("net.sh", &script);
    s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"net\"\nsandbox = \"workspace\"\n\
             sandbox_hosts = [\"127.0.0.1:{allowed_port}\", \"pypi.org:443\"]\nsandbox_read = [\"{}\"]\n\
             command = [\"sh\", \"{}\"]\n",
            s.path().join("net.sh").display(),
            s.path().join("net.sh").display(),
        ),
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
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let results = std::fs::read_to_string(s.path().join("results.txt")).expect("results");
    assert_eq!(
        results,
        "allowed ok\nforbidden denied\nresolve denied\noutside denied\nresolve_listed ok\n"
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary.contains(&format!("network denied: 127.0.0.1:{denied_port} ×1")),
        "{summary}"
    );
    assert_eq!(served.join().expect("the mock server"), "ping\n");
    assert!(
        forbidden.accept().is_err(),
        "the forbidden listener saw a connection"
    );
    // Journaled once, and shown by status.
    let status = s.run(&["--json", "status", "net"]);
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    let flows = v["tasks"][0]["net"].as_array().expect("net flows").clone();
    let flow = |host: &str, port: u64| {
        flows
            .iter()
            .find(|f| f["host"] == host && f["port"] == port)
            .unwrap_or_else(|| panic!("no flow {host}:{port} in {v}"))
            .clone()
    };
    let denied = flow("127.0.0.1", u64::from(denied_port));
    assert_eq!(
        (denied["allowed"].as_bool(), denied["count"].as_u64()),
        (Some(false), Some(1))
    );
    let allowed = flow("127.0.0.1", u64::from(allowed_port));
    assert_eq!(allowed["allowed"].as_bool(), Some(true));
    assert_eq!(
        (allowed["bytes_out"].as_u64(), allowed["bytes_in"].as_u64()),
        (Some(5), Some(6))
    );
    assert_eq!(flow("example.com", 0)["allowed"].as_bool(), Some(false));
    assert_eq!(flow("192.0.2.1", 443)["allowed"].as_bool(), Some(false));
    let text = s.run(&["status", "net"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "denied: 127.0.0.1:{denied_port} ×1, 192.0.2.1:443 ×1, example.com (name lookup) ×"
        )),
        "{text}"
    );
    assert!(text.contains("(sandbox_hosts)"), "{text}");
    let audit = s.run(&["--json", "audit", "net"]);
    let audit: serde_json::Value = serde_json::from_slice(&audit.stdout).expect("audit json");
    assert_eq!(audit["clean"], true, "{audit}");
    assert_eq!(audit["network"]["attempts"], 1, "{audit}");
    assert_eq!(audit["network"]["allowed"], 1, "{audit}");
}

/// An attempt that ends while sortie is dead (SIGKILLed, the run's shepherd keeping the
/// attempt): `sortie resume` records it from its files and journals its connections all the
/// same, once.
#[test]
fn a_sandboxed_attempt_that_ended_while_sortie_was_dead_has_its_connections_journaled() {
    if !can_sandbox() {
        return;
    }
    let s = Scratch::new();
    let forbidden = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    forbidden.set_nonblocking(true).expect("nonblocking");
    let port = forbidden.local_addr().expect("addr").port();
    let script = format!(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo hi >&3 && read -r l <&3' \
         >/dev/null 2>&1\ntouch tried\nwhile [ ! -e go ]; do sleep 0.05; done\n"
    );
    s.write("wait.sh", &script);
    s.write(
        "batch.toml",
        &format!(
            "[[tasks]]\nlabel = \"late\"\nsandbox = \"workspace\"\nsandbox_read = [\"{}\"]\n\
             command = [\"sh\", \"{}\"]\n",
            s.path().join("wait.sh").display(),
            s.path().join("wait.sh").display(),
        ),
    );
    let run = "late";
    let mut sortie = s.spawn(&["run", "--run-id", run, "batch.toml"]);
    sortie_testkit::poll("the attempt's connection", 60, || {
        s.path().join("tried").exists().then_some(())
    });
    assert!(
        sortie_testkit::kill9(&mut sortie),
        "sortie was still running"
    );
    std::fs::write(s.path().join("go"), "").expect("write go");
    let attempt = s.state_dir().join("runs").join(run).join("attempts");
    sortie_testkit::poll("the attempt's end, recorded by the shepherd", 60, || {
        let ended = std::fs::read_dir(&attempt).ok()?.flatten().any(|e| {
            let path = e.path();
            let text = path.to_string_lossy();
            let dir = match text.strip_suffix(".stdout") {
                Some(d) => std::path::PathBuf::from(d),
                None => path.clone(),
            };
            sortie_testkit::exit_recorded(&dir)
        });
        ended.then_some(())
    });
    let out = sortie_testkit::finish(
        s.sortie().args(["resume", run]).spawn().expect("resume"),
        120,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = s.events(run);
    let net: Vec<&serde_json::Value> = events
        .iter()
        .filter_map(|e| e["event"].get("SandboxNet"))
        .collect();
    assert_eq!(net.len(), 1, "one SandboxNet: {net:?}");
    let flows = net[0]["flows"].as_array().expect("flows");
    assert!(
        flows
            .iter()
            .any(|f| f["port"] == u64::from(port) && f["allowed"] == false),
        "{flows:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["event"].get("AttemptRecorded").is_some()),
        "the attempt was recorded from its files"
    );
    assert!(forbidden.accept().is_err(), "the listener saw a connection");
    let text = s.run(&["status", run]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains(&format!("denied: 127.0.0.1:{port} ×1")),
        "{}",
        String::from_utf8_lossy(&text.stdout)
    );
}

//! #34: a plain command with `sandbox = "workspace"`, in a temporary `HOME` made by the test,
//! tries what a hostile agent would (write outside its worktree, into another task's worktree
//! and the run's journal; read `~/.ssh` and `env.json`; connect to a loopback port of the host;
//! resolve a name) and does its own work (writes and commits in its worktree, uses `TMPDIR`):
//! every forbidden step fails, every allowed one succeeds, the task completes: as the test's
//! user (root, in CI) and as an unprivileged one (uid 1000, through `setpriv`).

use std::path::PathBuf;

use sortie_testkit::git;

use crate::support::Scratch;

/// Whether this machine can sandbox (the probe `sortie check` reports); a machine that cannot
/// skips the test, saying so.
fn can_sandbox() -> bool {
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
    hostile_box(&Scratch::new(), None);
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
        hostile_box(&s, Some(USER));
    } else {
        // Not root: this test's own user is the unprivileged one.
        hostile_box(&s, None);
    }
}

/// A plain command in a worktree, sandboxed, tries the forbidden steps and does its work;
/// with `as_uid`, sortie runs as that uid (through `setpriv`), the scratch dir its own.
fn hostile_box(s: &Scratch, as_uid: Option<u32>) {
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
    let run = "sbx";
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
r connect 'bash -c "exec 3<>/dev/tcp/127.0.0.1/{port} && echo hi >&3 && read -t 3 l <&3"'
r resolve 'getent hosts example.com'
r write_own 'echo mine > mine.txt'
r tmp 'echo t > "$TMPDIR/t" && test -s "$TMPDIR/t"'
r commit 'git add mine.txt && git -c user.name=t -c user.email=t@e commit -qm mine'
"#,
        other = other.display(),
        run_dir = run_dir.display(),
    );
    s.write("box.sh", &script);
    let batch = format!(
        "[[tasks]]\nlabel = \"other\"\ncwd = \"repo\"\nisolation = \"worktree\"\n\
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

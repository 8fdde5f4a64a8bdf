//! Helpers shared by the end-to-end tests: a scratch state dir, running `sortie`, reading its
//! journal through `export`, and finding processes of a run through their environment marker.

#![allow(dead_code, reason = "each test module uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// A scratch directory with a state dir, where batches are written and `sortie` runs.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Writes a file under the scratch dir and returns its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    /// A `sortie` command with `--state-dir` set, run from the scratch dir.
    pub fn sortie(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sortie"));
        c.current_dir(self.dir.path())
            .env_remove("SORTIE_DIR")
            .env_remove("RUST_LOG")
            .arg("--state-dir")
            .arg(self.state_dir())
            .stdin(Stdio::null());
        c
    }

    /// Runs `sortie ARGS` to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.sortie().args(args).output().expect("run sortie")
    }

    /// Starts `sortie ARGS` in the background (stdout and stderr piped).
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.sortie()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sortie")
    }

    /// The run's events, through `sortie export`.
    pub fn events(&self, run: &str) -> Vec<serde_json::Value> {
        let out = self.run(&["export", run]);
        assert!(
            out.status.success(),
            "export failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).expect("export prints JSON lines"))
            .collect()
    }

    /// `sortie status --json RUN`.
    pub fn status(&self, run: &str) -> serde_json::Value {
        let out = self.run(&["--json", "status", run]);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
    }
}

/// The fake agent shipped in `examples/agents/`.
pub fn fake_agent() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/agents/fake-agent.py")
}

/// A TOML array (`["python3", "<fake agent>", args...]`) for a task's `command`.
pub fn fake_command(args: &[&str]) -> String {
    let mut parts = vec!["python3".to_owned(), fake_agent().display().to_string()];
    parts.extend(args.iter().map(|a| (*a).to_owned()));
    let quoted: Vec<String> = parts.iter().map(|p| format!("{p:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Pids of live processes whose environment marks them as attempts of `run`.
pub fn live_processes_of(run: &str) -> Vec<u32> {
    let needle = format!("SORTIE_ATTEMPT={run}/");
    let mut pids = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // Zombies have no environment left to read and are not alive in any useful sense.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        {
            continue;
        }
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if env
                .split(|b| *b == 0)
                .any(|kv| kv.starts_with(needle.as_bytes()))
            {
                pids.push(pid);
            }
        }
    }
    pids
}

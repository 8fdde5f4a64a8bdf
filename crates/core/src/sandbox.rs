//! #34: a task's kernel sandbox (`sandbox = "workspace"`): which paths an attempt may write
//! and read, and which `host:port`s it may reach. The runner finds the facts (the task's
//! working directory, the attempt's agent home and temporary directory, the agent's install,
//! a worktree's git dirs) and writes the policy this module decides into the attempt's files;
//! `sortie __sandbox` applies it (Landlock, a network namespace) before it execs the agent.

use serde::{Deserialize, Serialize};

/// Whether a task's attempts run sandboxed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sandbox {
    /// The attempt has the user's full rights (the default, for now, for every task: see
    /// docs/sandbox.md).
    #[default]
    Off,
    /// Writes only its workspace, reads the system and its own directories, loopback only.
    Workspace,
}

impl Sandbox {
    /// The names a batch file uses.
    pub const NAMES: [&'static str; 2] = ["workspace", "off"];

    /// The name a batch file uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Sandbox::Off => "off",
            Sandbox::Workspace => "workspace",
        }
    }

    /// The mode named `name`, as a batch file writes it.
    pub fn parse(name: &str) -> Option<Sandbox> {
        match name {
            "off" => Some(Sandbox::Off),
            "workspace" => Some(Sandbox::Workspace),
            _ => None,
        }
    }
}

/// Checks a `sandbox_hosts` entry: `host:port`, a port from 1 to 65535.
pub fn check_host(entry: &str) -> Result<(), String> {
    let Some((host, port)) = entry.rsplit_once(':') else {
        return Err(format!("{entry:?} is not host:port"));
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(format!("{entry:?}: {host:?} is not a host name"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{entry:?}: {port:?} is not a port (1 to 65535)")),
    }
}

/// The system's directories every sandboxed attempt may read (and execute from).
pub const SYSTEM_READ: &[&str] = &[
    "/usr", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/opt", "/proc",
    "/sys", "/dev", "/nix",
];

/// The device nodes every sandboxed attempt may write.
pub const DEVICE_WRITE: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/tty",
    "/dev/full",
    "/dev/pts",
    "/dev/ptmx",
    "/dev/shm",
];

/// What the runner found for one attempt: the paths its policy is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The task's working directory (its worktree, its copy, else its `cwd`).
    pub workdir: String,
    /// The attempt's agent home, when its agent has one.
    pub home: Option<String>,
    /// The attempt's private temporary directory (`TMPDIR`).
    pub tmp: String,
    /// The agent's install: the directory tree of its resolved program.
    pub install: Option<String>,
    /// A worktree's git dirs the agent writes to commit (the common dir's `objects`, `refs`,
    /// `logs`, and the worktree's own admin dir).
    pub git_write: Vec<String>,
    /// A worktree's root and git common dir, read (config, packed refs, hooks).
    pub git_read: Vec<String>,
    /// The session directories the agent keeps its conversation in.
    pub sessions: Vec<String>,
}

/// An attempt's sandbox: what it may write, read and reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Paths written (and read) with everything under them.
    pub write: Vec<String>,
    /// Paths read (and executed) with everything under them.
    pub read: Vec<String>,
    /// `host:port`s the task may reach (`sandbox_hosts`).
    pub hosts: Vec<String>,
    /// The private temporary directory, set as `TMPDIR`.
    pub tmp: String,
}

/// The policy of an attempt of a task with these `sandbox_write`, `sandbox_read` and
/// `sandbox_hosts`, from the facts the runner found. Relative paths of the task's lists are
/// the task's working directory's.
pub fn policy(
    facts: &Facts,
    sandbox_write: &[String],
    sandbox_read: &[String],
    hosts: &[String],
) -> Policy {
    let under_work = |p: &String| -> String {
        if p.starts_with('/') {
            p.clone()
        } else {
            format!("{}/{p}", facts.workdir.trim_end_matches('/'))
        }
    };
    let mut write = vec![facts.workdir.clone(), facts.tmp.clone()];
    write.extend(facts.home.iter().cloned());
    write.extend(facts.sessions.iter().cloned());
    write.extend(facts.git_write.iter().cloned());
    write.extend(DEVICE_WRITE.iter().map(|s| (*s).to_owned()));
    write.extend(sandbox_write.iter().map(under_work));
    let mut read: Vec<String> = SYSTEM_READ.iter().map(|s| (*s).to_owned()).collect();
    read.extend(facts.install.iter().cloned());
    read.extend(facts.git_read.iter().cloned());
    read.extend(sandbox_read.iter().map(under_work));
    dedup(&mut write);
    dedup(&mut read);
    Policy {
        write,
        read,
        hosts: hosts.to_vec(),
        tmp: facts.tmp.clone(),
    }
}

/// Drops repeated entries, keeping the first of each.
fn dedup(list: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    list.retain(|p| seen.insert(p.clone()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_host_and_port() {
        assert!(check_host("pypi.org:443").is_ok());
        assert!(check_host("127.0.0.1:8080").is_ok());
        assert!(check_host("pypi.org").is_err());
        assert!(check_host("pypi.org:0").is_err());
        assert!(check_host(":80").is_err());
        assert!(check_host("a b:80").is_err());
    }

    #[test]
    fn a_policy_writes_its_workspace_and_reads_the_system() {
        let facts = Facts {
            workdir: "/w/t".into(),
            home: Some("/s/agents/0.1".into()),
            tmp: "/s/tmp/0.1".into(),
            install: Some("/opt/node".into()),
            ..Facts::default()
        };
        let p = policy(&facts, &["out".into()], &["/data".into()], &[]);
        assert!(p.write.contains(&"/w/t".to_owned()));
        assert!(p.write.contains(&"/w/t/out".to_owned()));
        assert!(p.write.contains(&"/s/agents/0.1".to_owned()));
        assert!(p.read.contains(&"/usr".to_owned()));
        assert!(p.read.contains(&"/data".to_owned()));
        assert!(
            !p.read
                .iter()
                .any(|r| r == "/s" || r == "/root" || r == "/home")
        );
        assert_eq!(p.read.iter().filter(|r| *r == "/opt").count(), 1);
    }
}

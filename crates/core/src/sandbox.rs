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
    /// The attempt has the user's full rights (the default of a task's own command; a built-in
    /// agent profile's tasks default to `Workspace`: the batch's resolution decides).
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
    /// The install of the program's interpreter (a script's `#!`: Node's prefix, say), and
    /// of the package tree it is in (`<prefix>/lib/node_modules/...`: `<prefix>`).
    pub runtimes: Vec<String>,
    /// A worktree's git dirs the agent writes to commit (the common dir's `objects`, `refs`,
    /// `logs`, and the worktree's own admin dir).
    pub git_write: Vec<String>,
    /// A worktree's root and git common dir, read (config, packed refs, hooks).
    pub git_read: Vec<String>,
    /// The session directories the agent keeps its conversation in.
    pub sessions: Vec<String>,
    /// Directories the agent itself writes outside its home (Codex's
    /// `/tmp/codex-daemon-<uid>`, which it finds without `TMPDIR`).
    pub agent_write: Vec<String>,
    /// Files the agent home links to in the user's config (its credentials): read and
    /// written, each file alone, so that a token the agent refreshes reaches the user's file.
    pub linked_files: Vec<String>,
    /// Directories the agent home links to in the user's config (extensions, skills): read.
    pub linked_dirs: Vec<String>,
    /// The agent's provider: the base URLs it talks to (its environment's or its config's
    /// base URL, else its provider's public API), each reached as `host:port`.
    pub providers: Vec<String>,
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
    write.extend(facts.agent_write.iter().cloned());
    write.extend(facts.git_write.iter().cloned());
    write.extend(facts.linked_files.iter().cloned());
    write.extend(DEVICE_WRITE.iter().map(|s| (*s).to_owned()));
    write.extend(sandbox_write.iter().map(under_work));
    let mut read: Vec<String> = SYSTEM_READ.iter().map(|s| (*s).to_owned()).collect();
    read.extend(facts.install.iter().cloned());
    read.extend(facts.runtimes.iter().cloned());
    read.extend(facts.git_read.iter().cloned());
    read.extend(facts.linked_dirs.iter().cloned());
    read.extend(sandbox_read.iter().map(under_work));
    let mut hosts = hosts.to_vec();
    hosts.extend(facts.providers.iter().filter_map(|u| host_of_url(u)));
    dedup(&mut write);
    dedup(&mut read);
    dedup(&mut hosts);
    Policy {
        write,
        read,
        hosts,
        tmp: facts.tmp.clone(),
    }
}

/// The `host:port` a base URL reaches (`http://127.0.0.1:8080/v1` → `127.0.0.1:8080`,
/// `https://api.anthropic.com` → `api.anthropic.com:443`); None for what is not an http(s)
/// URL with a host. An IPv6 literal keeps its brackets (`[::1]:8080`).
pub fn host_of_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inner, after) = v6.split_once(']')?;
        let port = after.strip_prefix(':');
        (format!("[{inner}]"), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    let port = match port {
        None | Some("") => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
    };
    let entry = format!("{}:{port}", host.to_ascii_lowercase());
    check_host(&entry).ok().map(|()| entry)
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

    #[test]
    fn a_provider_url_is_reached_as_host_and_port() {
        let cases = [
            ("http://127.0.0.1:8080/v1", Some("127.0.0.1:8080")),
            ("https://api.anthropic.com", Some("api.anthropic.com:443")),
            ("http://Mock.Local/v1?x=1", Some("mock.local:80")),
            ("https://user:pw@gw.example:8443/", Some("gw.example:8443")),
            ("http://[::1]:9/v1", Some("[::1]:9")),
            ("http://h:0/", None),
            ("http://h:99999/", None),
            ("ftp://h/", None),
            ("127.0.0.1:8080", None),
            ("http:///v1", None),
        ];
        for (url, want) in cases {
            assert_eq!(host_of_url(url).as_deref(), want, "{url}");
        }
    }

    #[test]
    fn a_policy_reaches_its_provider_and_reads_its_linked_credentials() {
        let facts = Facts {
            workdir: "/w/t".into(),
            tmp: "/s/tmp".into(),
            providers: vec![
                "http://127.0.0.1:8080/v1".into(),
                "https://api.openai.com/v1".into(),
                "http://127.0.0.1:8080".into(),
            ],
            linked_files: vec!["/home/u/.pi/agent/auth.json".into()],
            linked_dirs: vec!["/home/u/.pi/agent/skills".into()],
            ..Facts::default()
        };
        let p = policy(&facts, &[], &[], &["pypi.org:443".into()]);
        assert_eq!(
            p.hosts,
            ["pypi.org:443", "127.0.0.1:8080", "api.openai.com:443"]
        );
        assert!(p.write.contains(&"/home/u/.pi/agent/auth.json".to_owned()));
        assert!(p.read.contains(&"/home/u/.pi/agent/skills".to_owned()));
        assert!(!p.write.contains(&"/home/u/.pi/agent/skills".to_owned()));
    }
}

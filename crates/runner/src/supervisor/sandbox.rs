//! #34: `sortie __sandbox <policy-file> <argv...>`, the exec wrapper of a sandboxed attempt.
//! The supervisor, the shepherd or the direct executor starts it in place of the agent (its
//! argv wrapped by [`wrap`]); being a fresh process it is single-threaded, so it can enter
//! a user and network namespace of its own (loopback only, brought up), restrict itself with
//! Landlock (the policy's paths; signals and abstract sockets scoped), set `TMPDIR`, and exec
//! the agent, which inherits all of it, as does every process the agent starts. It keeps the
//! agent's pid (exec), so supervision and the pid-reuse guard see the agent itself.
//!
//! `sortie __sandbox --probe` does the same steps with no policy and exits 0, or says on
//! stderr which feature this machine lacks (see [`probe`]).

use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};
use nix::sched::{CloneFlags, unshare};
use sortie_core::sandbox::Policy;

use super::sandbox_net::{enter_forwarded, probe_rules};

/// The hidden subcommand of the wrapper.
pub const SANDBOX_ARG: &str = "__sandbox";

/// Its probe flag.
const PROBE_ARG: &str = "--probe";

/// The exit code of a wrapper that could not make the sandbox (the agent never ran).
const SETUP_FAILED: i32 = 125;

/// The wrapper's body: `args` are `<policy-file> <argv...>` or `--probe`. Returns the exit
/// code when it does not exec.
pub fn sandbox_main(args: &[String]) -> i32 {
    if args.first().map(String::as_str) == Some(PROBE_ARG) {
        return match enter(&Policy::default(), None) {
            Ok(abi) => {
                println!("ok landlock-abi>={abi}");
                0
            }
            Err(e) => {
                eprintln!("{e}");
                SETUP_FAILED
            }
        };
    }
    let (Some(file), Some(program)) = (args.first(), args.get(1)) else {
        eprintln!("sortie __sandbox: usage: __sandbox <policy-file> <program> [args...]");
        return SETUP_FAILED;
    };
    let policy = match read_policy(Path::new(file)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sortie: sandbox: cannot read the policy {file}: {e}");
            return SETUP_FAILED;
        }
    };
    let dir = Path::new(file).parent().unwrap_or(Path::new("."));
    if let Err(e) = enter(&policy, Some(dir)) {
        eprintln!("sortie: sandbox: {e}");
        return SETUP_FAILED;
    }
    #[allow(clippy::disallowed_methods, reason = "the sandbox's exec of the agent")]
    let mut cmd = std::process::Command::new(program);
    cmd.args(&args[2..]);
    if !policy.tmp.is_empty() {
        cmd.env("TMPDIR", &policy.tmp);
    }
    let err = cmd.exec();
    eprintln!("sortie: sandbox: cannot run {program}: {err}");
    match err.kind() {
        io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// Reads a policy file (JSON, written by [`write_policy`]).
fn read_policy(file: &Path) -> io::Result<Policy> {
    let text = fs::read(file)?;
    serde_json::from_slice(&text).map_err(io::Error::other)
}

/// Writes `policy` to `file` (mode 0600), for the wrapper to read.
pub(crate) fn write_policy(file: &Path, policy: &Policy) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(policy).map_err(io::Error::other)?;
    crate::files::write_atomic(file, &text, 0o600).map_err(|e| io::Error::other(e.to_string()))
}

/// `argv` run through the wrapper `sortie` (this binary) with the policy in `file`.
pub(crate) fn wrap(sortie: &Path, file: &Path, argv: Vec<String>) -> Vec<String> {
    let mut out = vec![
        sortie.display().to_string(),
        SANDBOX_ARG.to_owned(),
        file.display().to_string(),
    ];
    out.extend(argv);
    out
}

/// Enters the sandbox: a user and network namespace (with forwarding, when `dir`, the
/// attempt's sandbox dir, is given), then Landlock. Returns the Landlock ABI it found (at
/// least). The probe (no `dir`) also loads the forwarding's rules into its namespace, so that
/// a kernel without nftables is found before a task needs it.
fn enter(policy: &Policy, dir: Option<&Path>) -> Result<u8, String> {
    let abi = landlock_abi().ok_or_else(|| {
        "this kernel has no Landlock (Linux 5.13 or later, enabled in the `lsm=` boot \
         parameter): the task cannot run sandboxed; set `sandbox = \"off\"` to run it \
         unconfined"
            .to_owned()
    })?;
    match dir {
        Some(dir) => enter_forwarded(policy, dir)?,
        None => {
            enter_network()?;
            probe_rules()?;
        }
    }
    restrict(policy)?;
    Ok(abi)
}

/// A user and network namespace of its own, with the same uid and gid inside, and loopback up.
fn enter_network() -> Result<(), String> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET).map_err(|e| no_userns(&e))?;
    let write = |name: &str, text: String| {
        fs::write(format!("/proc/self/{name}"), text)
            .map_err(|e| format!("cannot write /proc/self/{name}: {e}"))
    };
    write("setgroups", "deny".into())?;
    write("uid_map", format!("{uid} {uid} 1"))?;
    write("gid_map", format!("{gid} {gid} 1"))?;
    loopback_up().map_err(|e| format!("cannot bring up the loopback interface: {e}"))
}

/// Why a user namespace could not be made.
pub(super) fn no_userns(e: &nix::Error) -> String {
    format!(
        "cannot make a user and network namespace ({e}): this machine does not allow \
         unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone, \
         user.max_user_namespaces, or an AppArmor rule); the task cannot run sandboxed; set \
         `sandbox = \"off\"` to run it unconfined"
    )
}

/// Sets `lo` up in this process's network namespace (`SIOCSIFFLAGS`).
#[allow(
    unsafe_code,
    reason = "an interface's flags are only reachable through ioctl; no crate of the workspace \
              wraps SIOCSIFFLAGS"
)]
pub(super) fn loopback_up() -> io::Result<()> {
    // SAFETY: `socket` takes no pointer; its descriptor is owned by `OwnedFd` at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just opened by this thread and not owned elsewhere.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // SAFETY: `ifreq` is a plain C struct for which all zero bytes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the `ifreq` passed, which lives
    // through both calls; the union's `ifru_flags` is the member these requests use.
    unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The highest Landlock ABI this kernel offers of those this build knows (None: no Landlock).
fn landlock_abi() -> Option<u8> {
    let abis = [
        (6, ABI::V6),
        (5, ABI::V5),
        (4, ABI::V4),
        (3, ABI::V3),
        (2, ABI::V2),
        (1, ABI::V1),
    ];
    abis.into_iter().find_map(|(n, abi)| {
        let made = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .and_then(|r| {
                if n >= 6 {
                    r.scope(Scope::from_all(abi))
                } else {
                    Ok(r)
                }
            })
            .and_then(|r| r.create());
        made.is_ok().then_some(n)
    })
}

/// Restricts this process (and what it execs) to the policy's paths with Landlock.
fn restrict(policy: &Policy) -> Result<(), String> {
    let abi = ABI::V6;
    let err = |e: landlock::RulesetError| format!("cannot make the Landlock ruleset: {e}");
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .map_err(err)?;
    let rules = policy
        .read
        .iter()
        .map(|p| (p, AccessFs::from_read(abi)))
        .chain(policy.write.iter().map(|p| (p, AccessFs::from_all(abi))));
    for (path, access) in rules {
        let Ok(meta) = fs::metadata(path) else {
            continue;
        };
        let access = if meta.is_dir() {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        let Ok(fd) = PathFd::new(path) else {
            continue;
        };
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(err)?;
    }
    let status = ruleset.restrict_self().map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(
            "Landlock did not enforce the ruleset: the task cannot run sandboxed; set \
                    `sandbox = \"off\"` to run it unconfined"
                .into(),
        );
    }
    Ok(())
}

/// What the probe found: Ok with the Landlock ABI, or why this machine cannot sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// Landlock (this ABI at least) and user and network namespaces work.
    Yes {
        /// The Landlock ABI.
        abi: u8,
    },
    /// The reason it cannot.
    No(String),
}

/// Whether this machine can sandbox, found once per process by running `sortie __sandbox
/// --probe` (the program `sortie`): it enters a namespace and restricts itself, which this
/// process, with its threads, cannot.
pub fn probe(sortie: &Path) -> &'static Support {
    static FOUND: OnceLock<Support> = OnceLock::new();
    FOUND.get_or_init(|| probe_now(sortie))
}

/// Runs the probe.
fn probe_now(sortie: &Path) -> Support {
    #[allow(
        clippy::disallowed_methods,
        reason = "the sandbox's probe, a short-lived tool"
    )]
    let out = std::process::Command::new(sortie)
        .arg(SANDBOX_ARG)
        .arg(PROBE_ARG)
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Err(e) => Support::No(format!("cannot run {} to probe: {e}", sortie.display())),
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let abi = text
                .trim()
                .rsplit_once(">=")
                .and_then(|(_, n)| n.parse().ok())
                .unwrap_or(1);
            Support::Yes { abi }
        }
        Ok(o) => Support::No(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
    }
}

/// A program's install: the directory tree holding its resolved file (`<prefix>/bin/x` →
/// `<prefix>`), when that is not the root.
pub(crate) fn install_of(program: &Path) -> Option<PathBuf> {
    let real = fs::canonicalize(program).ok()?;
    let dir = real.parent()?;
    // `<prefix>/bin/node`: the prefix; a version manager's shim (pyenv's, rbenv's, asdf's
    // `<root>/shims/python3`): the manager's root, which holds the versions it picks from.
    let prefix = if dir.file_name().is_some_and(|n| n == "bin" || n == "shims") {
        dir.parent()?
    } else {
        dir
    };
    (prefix != Path::new("/")).then(|| prefix.to_path_buf())
}

//! #34: a sandboxed attempt's network with forwarding: what `sortie __sandbox` does before it
//! restricts itself with Landlock.
//!
//! Before it leaves the host's namespaces the wrapper forks the outer helper (which stays in
//! the host's network namespace) and reads the ports the host listens on. It then enters a
//! user (mapped to root, for the setup), network and mount namespace of its own: loopback
//! up, a default route through loopback (so that a connection anywhere reaches the rules
//! instead of failing as unreachable), `/etc/resolv.conf` naming `127.0.0.1` and a minimal
//! `/etc/hosts` bound over the host's, and nftables rules (over netlink) sending every TCP connection
//! that leaves loopback (and those to the host's listening ports and the policy's loopback
//! ports) to the forwarder, other traffic that leaves loopback rejected. It forks the inner
//! helper (forwarder and name server, `sandbox_relay`), enters one more user namespace
//! mapping the user back to itself (so the agent holds no capability over the rules), and
//! returns to restrict itself and exec. The helpers are the agent's children, in its process
//! group; they die with it.

use std::fs;
use std::io;
use std::net::{TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::Signal;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::unistd::{ForkResult, Pid, fork, getppid};
use sortie_core::sandbox::Policy;
use sortie_core::sandbox_net;

use super::sandbox_relay::{host_listening, inner, outer};

/// The file of an attempt's connections, in its sandbox dir (beside the policy).
use crate::layout::SANDBOX_NET_FILE as NET_FILE;

/// Enters the sandbox's namespaces with forwarding (see the module's doc): `dir` is the
/// attempt's sandbox dir, where `net.jsonl`, `resolv.conf` and `hosts` go.
pub(super) fn enter_forwarded(policy: &Policy, dir: &Path) -> Result<(), String> {
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    let mut ports = host_listening();
    ports.extend(sandbox_net::loopback_ports(&policy.hosts));
    ports.sort_unstable();
    ports.dedup();
    let resolv = dir.join("resolv.conf");
    let hosts_file = dir.join("hosts");
    fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    )
    .and_then(|()| fs::write(&hosts_file, "127.0.0.1 localhost\n::1 localhost\n"))
    .map_err(|e| {
        format!(
            "cannot write the sandbox's name files in {}: {e}",
            dir.display()
        )
    })?;
    let (outer_end, inner_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("cannot make the sandbox's socket pair: {e}"))?;
    let log = dir.join(NET_FILE);
    let hosts = policy.hosts.clone();
    let inner_raw = std::os::fd::AsRawFd::as_raw_fd(&inner_end);
    helper(move || {
        // The child's copy of the inner end: the link must close when the inner side ends.
        let _ = nix::unistd::close(inner_raw);
        outer(hosts, outer_end, &log);
    })?;
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS)
        .map_err(|e| super::sandbox::no_userns(&e))?;
    map_ids(&format!("0 {uid} 1"), &format!("0 {gid} 1"))?;
    super::sandbox::loopback_up().map_err(|e| format!("cannot bring up loopback: {e}"))?;
    default_route().map_err(|e| format!("cannot route through loopback: {e}"))?;
    bind_names(&resolv, &hosts_file)?;
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot listen for the sandbox's forwarder: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("cannot read the forwarder's port: {e}"))?
        .port();
    let dns = UdpSocket::bind("127.0.0.1:53")
        .map_err(|e| format!("cannot listen for the sandbox's name server: {e}"))?;
    load_rules(port, &ports)?;
    let hosts = policy.hosts.clone();
    helper(move || inner(hosts, listener, dns, inner_end))?;
    // The agent's own namespace: the user is itself again, without the setup's rights.
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| super::sandbox::no_userns(&e))?;
    map_ids(&format!("{uid} 0 1"), &format!("{gid} 0 1"))
}

/// Writes this process's user namespace's maps.
fn map_ids(uid_map: &str, gid_map: &str) -> Result<(), String> {
    let write = |name: &str, text: &str| {
        fs::write(format!("/proc/self/{name}"), text)
            .map_err(|e| format!("cannot write /proc/self/{name}: {e}"))
    };
    write("setgroups", "deny")?;
    write("uid_map", uid_map)?;
    write("gid_map", gid_map)
}

/// Forks a helper running `body`; it ends when this process (the agent, once it execs) does.
fn helper(body: impl FnOnce()) -> Result<(), String> {
    let me = Pid::this();
    #[allow(
        unsafe_code,
        reason = "the wrapper is single-threaded here: the child may run Rust code after fork"
    )]
    // SAFETY: `sortie __sandbox` has started no thread (it has to be single-threaded to enter
    // a user namespace), so the child's copy of the address space is consistent.
    let forked = unsafe { fork() };
    match forked.map_err(|e| format!("cannot fork the sandbox's helper: {e}"))? {
        ForkResult::Parent { .. } => Ok(()),
        ForkResult::Child => {
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            if getppid() != me {
                std::process::exit(0);
            }
            quiet_stdio();
            // The parent-death signal alone was seen not to arrive once the agent, this
            // process's parent, had exec'd and exited: the helper also watches for its
            // reparenting.
            let _ = std::thread::Builder::new()
                .name("watch".into())
                .stack_size(64 << 10)
                .spawn(move || {
                    while getppid() == me {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    std::process::exit(0);
                });
            body();
            std::process::exit(0);
        }
    }
}

/// Points a helper's stdin and stdout at `/dev/null` (stderr stays: its errors go to the
/// attempt's transcript), so that it holds no pipe of the agent's open.
fn quiet_stdio() {
    if let Ok(null) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let null = OwnedFd::from(null);
        for fd in [0, 1] {
            let _ = nix::unistd::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd);
        }
    }
}

/// Loads the nftables rules (see [`super::nft`]): TCP leaving loopback, and to `ports` on
/// loopback, redirected to the forwarder on `forwarder`; anything else leaving loopback
/// rejected.
fn load_rules(forwarder: u16, ports: &[u16]) -> Result<(), String> {
    super::nft::load(forwarder, ports).map_err(|e| {
        format!(
            "cannot load the sandbox's nftables rules ({e}): this kernel lacks nf_tables or its \
             NAT (CONFIG_NF_TABLES, CONFIG_NFT_NAT, CONFIG_NFT_REDIR, CONFIG_NFT_REJECT); the \
             task cannot run sandboxed; set `sandbox = \"off\"` to run it unconfined"
        )
    })
}

/// The probe's check that this kernel takes the rules (in the probe's own namespace).
pub(super) fn probe_rules() -> Result<(), String> {
    load_rules(1, &[])
}

/// Binds the sandbox's `resolv.conf` and `hosts` over the system's, in this process's mount
/// namespace (made private first, so nothing leaks back).
fn bind_names(resolv: &Path, hosts: &Path) -> Result<(), String> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make the sandbox's mounts private: {e}"))?;
    for (file, over) in [(resolv, "/etc/resolv.conf"), (hosts, "/etc/hosts")] {
        if fs::metadata(over).is_err() {
            continue;
        }
        mount(
            Some(file),
            over,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("cannot bind {} over {over}: {e}", file.display()))?;
    }
    Ok(())
}

/// Adds `default dev lo` to this network namespace's routes (`SIOCADDRT`).
#[allow(
    unsafe_code,
    reason = "a route is only reachable through ioctl or netlink; no crate of the workspace \
              wraps either"
)]
fn default_route() -> io::Result<()> {
    // SAFETY: `socket` takes no pointer; its descriptor is owned by `OwnedFd` at once.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor just opened by this thread and not owned elsewhere.
    let sock = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
    let mut dev = *b"lo\0";
    // SAFETY: `rtentry` is a plain C struct for which all zero bytes is a valid value.
    let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
    for addr in [&mut route.rt_dst, &mut route.rt_genmask] {
        addr.sa_family = libc::AF_INET as libc::sa_family_t;
    }
    route.rt_flags = libc::RTF_UP;
    route.rt_dev = dev.as_mut_ptr().cast();
    // SAFETY: SIOCADDRT reads the `rtentry` passed and the device name it points to, both of
    // which live through the call.
    let done = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SIOCADDRT,
            &route,
        )
    };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

//! #34: the two helpers of a sandboxed attempt's network, linked by a unix socket pair (a
//! unix socket works across network namespaces):
//!
//! - the inner one, in the sandbox's namespace: the forwarder every TCP connection the rules
//!   redirect arrives at (it reads the connection's original destination, decides with core's
//!   [`sandbox_net`](sortie_core::sandbox_net) whether the policy allows it, passes an
//!   allowed one's socket to the outer helper, resets a denied one at once), and the name
//!   server on `127.0.0.1:53` answering the names the policy lists with stand-in addresses
//!   (other names: NXDOMAIN);
//! - the outer one, in the host's namespace: it connects each allowed connection to its real
//!   `host:port` (the name resolved by the host's resolver; the bytes are bridged as they
//!   are, TLS untouched), counts the bytes each way, and writes a line per connection (when
//!   it opens and again when it closes) and per denial to the attempt's `net.jsonl`.
//!
//! Neither is the agent: the wrapper forks them before it restricts itself and execs.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType, rdata::A};
use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, getsockopt, recvmsg, sendmsg, setsockopt,
    sockopt,
};
use sortie_core::sandbox_net::{self, Connection, LOOKUP_PORT};

/// A message's kind: an allowed connection, its socket attached.
const ALLOWED: u8 = 1;
/// A denied connection (no socket).
const DENIED: u8 = 2;
/// A name lookup that was refused (the name follows).
const LOOKUP: u8 = 3;

/// How long the outer helper waits for a host to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The inner helper: serves `listener` (the forwarder) and `dns` until the process is
/// killed (its parent, the agent, ends it by ending).
pub(super) fn inner(hosts: Vec<String>, listener: TcpListener, dns: UdpSocket, link: OwnedFd) {
    let link = Arc::new(link);
    let names = hosts.clone();
    let dns_link = Arc::clone(&link);
    let _ = std::thread::Builder::new()
        .name("dns".into())
        .spawn(move || serve_dns(&names, &dns, &dns_link));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let Ok(dst) = getsockopt(&stream, sockopt::OriginalDst) else {
            reset(stream);
            continue;
        };
        let addr = Ipv4Addr::from(u32::from_be(dst.sin_addr.s_addr));
        let port = u16::from_be(dst.sin_port);
        let host = sandbox_net::host_of(&hosts, addr);
        let mut msg = Vec::with_capacity(7);
        let allowed = sandbox_net::allows(&hosts, &host, port);
        msg.push(if allowed { ALLOWED } else { DENIED });
        msg.extend_from_slice(&addr.octets());
        msg.extend_from_slice(&port.to_be_bytes());
        let fds = [stream.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let sent = sendmsg::<()>(
            link.as_raw_fd(),
            &[io::IoSlice::new(&msg)],
            if allowed { &cmsg } else { &[] },
            MsgFlags::empty(),
            None,
        );
        if sent.is_err() || !allowed {
            reset(stream);
        }
    }
}

/// Closes `stream` with a reset, so that the program sees its connection refused at once.
fn reset(stream: TcpStream) {
    let _ = setsockopt(
        &stream,
        sockopt::Linger,
        &libc::linger {
            l_onoff: 1,
            l_linger: 0,
        },
    );
}

/// The name server: the policy's names get their stand-in address; every other name is
/// refused (NXDOMAIN) and the refusal told to the outer helper.
fn serve_dns(hosts: &[String], sock: &UdpSocket, link: &OwnedFd) {
    let mut buf = [0u8; 1500];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if query.metadata.message_type != MessageType::Query {
            continue;
        }
        let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
        reply.metadata.recursion_desired = query.metadata.recursion_desired;
        reply.metadata.recursion_available = true;
        for q in &query.queries {
            reply.add_query(q.clone());
            let name = q.name().to_ascii();
            match sandbox_net::fake_address(hosts, &name) {
                Some(addr) if q.query_type() == RecordType::A => {
                    reply.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(addr))));
                }
                // A listed name has no other record (no IPv6 address: connections go by the
                // stand-in IPv4 address).
                Some(_) => {}
                None => {
                    reply.metadata.response_code = ResponseCode::NXDomain;
                    let mut msg = vec![LOOKUP];
                    msg.extend_from_slice(name.trim_end_matches('.').as_bytes());
                    let _ = sendmsg::<()>(
                        link.as_raw_fd(),
                        &[io::IoSlice::new(&msg)],
                        &[],
                        MsgFlags::empty(),
                        None,
                    );
                }
            }
        }
        if let Ok(bytes) = reply.to_vec() {
            let _ = sock.send_to(&bytes, from);
        }
    }
}

/// The outer helper's record: `net.jsonl`, one line per record.
struct Log {
    file: Mutex<File>,
    next: AtomicU64,
}

impl Log {
    /// A new connection's number.
    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Appends `c`, one write per line.
    fn write(&self, c: &Connection) {
        let Ok(mut line) = serde_json::to_vec(c) else {
            return;
        };
        line.push(b'\n');
        if let Ok(mut f) = self.file.lock() {
            let _ = f.write_all(&line);
        }
    }
}

/// The outer helper: takes the inner one's messages until the link closes (the sandbox
/// ended), recording each in `log` and bridging each allowed connection.
pub(super) fn outer(hosts: Vec<String>, link: OwnedFd, log: &Path) {
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("sortie: sandbox: cannot open {}: {e}", log.display());
            return;
        }
    };
    let log = Arc::new(Log {
        file: Mutex::new(file),
        // Numbered from the helper's pid: a repair round runs the wrapper again into the same
        // file, and its connections are others.
        next: AtomicU64::new(u64::from(std::process::id()) << 32),
    });
    let hosts = Arc::new(hosts);
    loop {
        let mut buf = [0u8; 512];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let (n, fd) = {
            let mut iov = [io::IoSliceMut::new(&mut buf)];
            let Ok(msg) = recvmsg::<()>(
                link.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) else {
                return;
            };
            let fd = msg.cmsgs().ok().and_then(|mut c| {
                c.find_map(|c| match c {
                    ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
                    _ => None,
                })
            });
            (msg.bytes, fd)
        };
        if n == 0 {
            return;
        }
        #[allow(unsafe_code, reason = "a descriptor SCM_RIGHTS just gave this process")]
        // SAFETY: the kernel installed `fd` in this process for this message; nothing else
        // owns it.
        let stream = fd.map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
        take(&hosts, &log, &buf[..n], stream);
    }
}

/// One message of the inner helper.
fn take(hosts: &Arc<Vec<String>>, log: &Arc<Log>, msg: &[u8], stream: Option<OwnedFd>) {
    let record = |host: String, port, allowed| Connection {
        id: log.id(),
        host,
        port,
        allowed,
        bytes_out: 0,
        bytes_in: 0,
    };
    match (msg.first().copied(), msg.get(1..7)) {
        (Some(LOOKUP), _) => {
            let name = String::from_utf8_lossy(&msg[1..]).into_owned();
            log.write(&record(name, LOOKUP_PORT, false));
        }
        (Some(kind @ (ALLOWED | DENIED)), Some(dst)) => {
            let addr = Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]);
            let port = u16::from_be_bytes([dst[4], dst[5]]);
            let host = sandbox_net::host_of(hosts, addr);
            // The outer helper decides again: the inner one runs beside the agent.
            let allowed = kind == ALLOWED && sandbox_net::allows(hosts, &host, port);
            let c = record(host, port, allowed);
            log.write(&c);
            if let (true, Some(fd)) = (allowed, stream) {
                let log = Arc::clone(log);
                let _ = std::thread::Builder::new()
                    .name("bridge".into())
                    .spawn(move || bridge(c, TcpStream::from(fd), &log));
            }
        }
        _ => {}
    }
}

/// Connects `inside` to its host and copies both ways until both are done, then records the
/// connection again with its bytes.
fn bridge(mut c: Connection, inside: TcpStream, log: &Log) {
    let target = (c.host.as_str(), c.port);
    let outside = std::net::ToSocketAddrs::to_socket_addrs(&target)
        .ok()
        .and_then(|mut addrs| {
            addrs.find_map(|a| TcpStream::connect_timeout(&a, CONNECT_TIMEOUT).ok())
        });
    let Some(outside) = outside else {
        reset(inside);
        return;
    };
    let (Ok(in2), Ok(out2)) = (inside.try_clone(), outside.try_clone()) else {
        return;
    };
    let up = std::thread::Builder::new()
        .name("bridge-out".into())
        .spawn(move || copy(in2, out2));
    c.bytes_in = copy(outside, inside);
    c.bytes_out = up.ok().and_then(|h| h.join().ok()).unwrap_or(0);
    log.write(&c);
}

/// Copies `from` into `to` until `from` ends, then ends `to`'s writing; the bytes copied.
fn copy(mut from: TcpStream, mut to: TcpStream) -> u64 {
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                total += n as u64;
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
    total
}

/// The TCP ports the host listens on (any address, IPv4 and IPv6): read before the wrapper
/// leaves the host's namespace, so that a connection to one of them on the sandbox's loopback
/// is forwarded (and journaled) instead of refused unseen. Asked of the kernel's socket
/// diagnostics (`NETLINK_SOCK_DIAG`, listening sockets only; `/proc/net/tcp` lists every
/// socket, ~10 ms per attempt on a busy host), the proc files when netlink cannot answer.
pub(super) fn host_listening() -> Vec<u16> {
    let mut ports = listening_by_netlink().unwrap_or_else(|_| listening_by_proc());
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The listening TCP ports, by a `SOCK_DIAG_BY_FAMILY` dump of each family.
fn listening_by_netlink() -> io::Result<Vec<u16>> {
    use netlink_packet_core::{
        NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    };
    use netlink_packet_sock_diag::SockDiagMessage;
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_SOCK_DIAG};

    let mut socket = Socket::new(NETLINK_SOCK_DIAG)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut ports = Vec::new();
    let mut buf = vec![0u8; 32 << 10];
    for (family, id) in [
        (AF_INET, SocketId::new_v4()),
        (AF_INET6, SocketId::new_v6()),
    ] {
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut request = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::empty(),
                states: StateFlags::LISTEN,
                socket_id: id,
            })
            .into(),
        );
        request.finalize();
        let mut bytes = vec![0u8; request.buffer_len()];
        request.serialize(&mut bytes);
        socket.send(&bytes, 0)?;
        'dump: loop {
            let size = socket.recv(&mut &mut buf[..], 0)?;
            let mut at = 0;
            while at < size {
                let reply = <NetlinkMessage<SockDiagMessage>>::deserialize(&buf[at..size])
                    .map_err(|e| io::Error::other(e.to_string()))?;
                match reply.payload {
                    NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
                        ports.push(r.header.socket_id.source_port);
                    }
                    NetlinkPayload::Done(_) => break 'dump,
                    NetlinkPayload::Error(e) => return Err(io::Error::other(e.to_string())),
                    _ => {}
                }
                let len = reply.header.length as usize;
                if len == 0 {
                    break;
                }
                at += len;
            }
        }
    }
    Ok(ports)
}

/// The listening TCP ports, from `/proc/net/tcp` and `/proc/net/tcp6`.
fn listening_by_proc() -> Vec<u16> {
    let mut ports = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let mut cols = line.split_whitespace();
            let (Some(local), Some(state)) = (cols.nth(1), cols.nth(1)) else {
                continue;
            };
            // 0A: LISTEN.
            if state != "0A" {
                continue;
            }
            if let Some(port) = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    ports
}

//! #34: the sandbox's nftables rules, sent to the kernel over netlink (`NETLINK_NETFILTER`) in
//! one batch, as `nft -f` would send them, without running `nft` (a process per attempt, ~5 ms
//! of its libraries and parser). The crates that build these messages generate their
//! constants with bindgen at build time (libclang on every machine that builds sortie); the
//! few messages the sandbox needs are encoded here from the kernel's UAPI
//! (`linux/netfilter/nf_tables.h`, `linux/netfilter/nfnetlink.h`).
//!
//! The rules, as `nft` would list them:
//!
//! ```text
//! table ip sortie {
//!   chain nat_out { type nat hook output priority -100; policy accept;
//!     ip daddr != 127.0.0.0/8 meta l4proto tcp redirect to :FORWARDER
//!     ip daddr 127.0.0.0/8 meta l4proto tcp tcp dport PORT redirect to :FORWARDER  (each) }
//!   chain nat_post { type nat hook postrouting priority 100; policy accept;
//!     ip saddr 0.0.0.0 snat to 127.0.0.1 }
//!   chain filter_out { type filter hook output priority 0; policy accept;
//!     ip daddr != 127.0.0.0/8 meta l4proto != tcp reject }
//! }
//! ```

use std::io;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

// netlink(7) and nfnetlink.
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_APPEND: u16 = 0x800;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 0x2;
const NLA_F_NESTED: u16 = 0x8000;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFPROTO_IPV4: u8 = 2;
// nf_tables messages.
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_NEWRULE: u16 = 6;
// Attributes: table, chain, hook, rule, list, expression, data.
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
// Hooks (NF_INET_*), the accept policy, registers.
const NF_INET_LOCAL_OUT: u32 = 3;
const NF_INET_POST_ROUTING: u32 = 4;
const NF_ACCEPT: u32 = 1;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;

/// The table's name.
const TABLE: &str = "sortie";

/// An expression of a rule: its name and its attributes (type, value).
struct Expr {
    name: &'static str,
    attrs: Vec<(u16, Value)>,
}

/// An attribute's value.
enum Value {
    U32(u32),
    U8(u8),
    /// Data (`NFTA_DATA_VALUE` nested in the attribute).
    Data(Vec<u8>),
}

/// `ip daddr` (or `saddr`), `tcp dport`: a header field loaded into register 1.
fn payload(base: u32, offset: u32, len: u32) -> Expr {
    // NFTA_PAYLOAD_DREG, _BASE, _OFFSET, _LEN.
    let attrs = vec![
        (1, Value::U32(NFT_REG_1)),
        (2, Value::U32(base)),
        (3, Value::U32(offset)),
        (4, Value::U32(len)),
    ];
    Expr {
        name: "payload",
        attrs,
    }
}

/// The network header (`NFT_PAYLOAD_NETWORK_HEADER`) and the transport header.
const NETWORK: u32 = 1;
const TRANSPORT: u32 = 2;

/// Register 1 masked with `mask` (`bitwise`).
fn mask(mask: &[u8]) -> Expr {
    // NFTA_BITWISE_SREG, _DREG, _LEN, _MASK, _XOR.
    let attrs = vec![
        (1, Value::U32(NFT_REG_1)),
        (2, Value::U32(NFT_REG_1)),
        (3, Value::U32(mask.len() as u32)),
        (4, Value::Data(mask.to_vec())),
        (5, Value::Data(vec![0; mask.len()])),
    ];
    Expr {
        name: "bitwise",
        attrs,
    }
}

/// Register 1 compared with `data`: equal (or not, `eq = false`) or the rule stops.
fn cmp(eq: bool, data: &[u8]) -> Expr {
    // NFTA_CMP_SREG, _OP (NFT_CMP_EQ 0, NFT_CMP_NEQ 1), _DATA.
    let attrs = vec![
        (1, Value::U32(NFT_REG_1)),
        (2, Value::U32(u32::from(!eq))),
        (3, Value::Data(data.to_vec())),
    ];
    Expr { name: "cmp", attrs }
}

/// `meta l4proto` into register 1.
fn l4proto() -> Expr {
    // NFTA_META_DREG, _KEY (NFT_META_L4PROTO 16).
    let attrs = vec![(1, Value::U32(NFT_REG_1)), (2, Value::U32(16))];
    Expr {
        name: "meta",
        attrs,
    }
}

/// `data` into register `reg`.
fn immediate(reg: u32, data: &[u8]) -> Expr {
    // NFTA_IMMEDIATE_DREG, _DATA.
    let attrs = vec![(1, Value::U32(reg)), (2, Value::Data(data.to_vec()))];
    Expr {
        name: "immediate",
        attrs,
    }
}

/// `redirect to :port` (the port in register 2).
fn redirect() -> Expr {
    // NFTA_REDIR_REG_PROTO_MIN.
    Expr {
        name: "redir",
        attrs: vec![(1, Value::U32(NFT_REG_2))],
    }
}

/// `snat to` the address in register 1.
fn snat() -> Expr {
    // NFTA_NAT_TYPE (NFT_NAT_SNAT 0), _FAMILY, _REG_ADDR_MIN.
    let attrs = vec![
        (1, Value::U32(0)),
        (2, Value::U32(u32::from(NFPROTO_IPV4))),
        (3, Value::U32(NFT_REG_1)),
    ];
    Expr { name: "nat", attrs }
}

/// `reject` (ICMP port unreachable).
fn reject() -> Expr {
    // NFTA_REJECT_TYPE (NFT_REJECT_ICMP_UNREACH 0), _ICMP_CODE (ICMP_PORT_UNREACH 3).
    let attrs = vec![(1, Value::U32(0)), (2, Value::U8(3))];
    Expr {
        name: "reject",
        attrs,
    }
}

/// The batch of messages that makes the rules (see the module's doc): `forwarder` is the
/// port the TCP connections go to, `ports` the loopback ports sent there too.
pub(super) fn batch(forwarder: u16, ports: &[u16]) -> Vec<u8> {
    let mut b = Batch::default();
    b.control(NFNL_MSG_BATCH_BEGIN);
    b.message(NFT_MSG_NEWTABLE, NLM_F_CREATE, |m| {
        m.string(NFTA_TABLE_NAME, TABLE);
    });
    let chains = [
        ("nat_out", "nat", NF_INET_LOCAL_OUT, -100i32),
        ("nat_post", "nat", NF_INET_POST_ROUTING, 100),
        ("filter_out", "filter", NF_INET_LOCAL_OUT, 0),
    ];
    for (name, kind, hook, priority) in chains {
        b.message(NFT_MSG_NEWCHAIN, NLM_F_CREATE, |m| {
            m.string(NFTA_CHAIN_TABLE, TABLE);
            m.string(NFTA_CHAIN_NAME, name);
            m.nested(NFTA_CHAIN_HOOK, |h| {
                h.u32(NFTA_HOOK_HOOKNUM, hook);
                h.u32(NFTA_HOOK_PRIORITY, priority as u32);
            });
            m.u32(NFTA_CHAIN_POLICY, NF_ACCEPT);
            m.string(NFTA_CHAIN_TYPE, kind);
        });
    }
    let daddr = || payload(NETWORK, 16, 4);
    let eight = [255, 0, 0, 0];
    let loopback = [127, 0, 0, 0];
    let tcp = [libc::IPPROTO_TCP as u8];
    let to_forwarder = || [immediate(NFT_REG_2, &forwarder.to_be_bytes()), redirect()];
    let leaving = [
        daddr(),
        mask(&eight),
        cmp(false, &loopback),
        l4proto(),
        cmp(true, &tcp),
    ];
    b.rule(
        "nat_out",
        leaving.into_iter().chain(to_forwarder()).collect(),
    );
    for port in ports {
        let to_port = [
            daddr(),
            mask(&eight),
            cmp(true, &loopback),
            l4proto(),
            cmp(true, &tcp),
            payload(TRANSPORT, 2, 2),
            cmp(true, &port.to_be_bytes()),
        ];
        b.rule(
            "nat_out",
            to_port.into_iter().chain(to_forwarder()).collect(),
        );
    }
    let unsourced = vec![
        payload(NETWORK, 12, 4),
        cmp(true, &[0, 0, 0, 0]),
        immediate(NFT_REG_1, &[127, 0, 0, 1]),
        snat(),
    ];
    b.rule("nat_post", unsourced);
    let other = vec![
        daddr(),
        mask(&eight),
        cmp(false, &loopback),
        l4proto(),
        cmp(false, &tcp),
        reject(),
    ];
    b.rule("filter_out", other);
    b.control(NFNL_MSG_BATCH_END);
    b.bytes
}

/// Loads the rules into this process's network namespace; an error says what the kernel
/// refused.
pub(super) fn load(forwarder: u16, ports: &[u16]) -> io::Result<()> {
    let bytes = batch(forwarder, ports);
    let expected = acks_expected(&bytes);
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    bind(fd, &NetlinkAddr::new(0, 0))?;
    // A kernel that never answered would hold the attempt at its start: an error instead.
    setsockopt(&sock, sockopt::ReceiveTimeout, &TimeVal::new(5, 0))?;
    let mut sent = 0;
    while sent < bytes.len() {
        sent += send(fd, &bytes[sent..], MsgFlags::empty())?;
    }
    let mut acked = 0;
    let mut buf = vec![0u8; 16 << 10];
    while acked < expected {
        let n = recv(fd, &mut buf, MsgFlags::empty())?;
        if n == 0 {
            break;
        }
        let mut at = 0;
        while at + 20 <= n {
            let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]);
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if kind == NLMSG_ERROR {
                let code =
                    i32::from_ne_bytes([buf[at + 16], buf[at + 17], buf[at + 18], buf[at + 19]]);
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
                acked += 1;
            }
            let step = (len as usize + 3) & !3;
            if step == 0 {
                break;
            }
            at += step;
        }
    }
    Ok(())
}

/// How many acknowledgements `batch` asks for (its messages but the batch's own two).
fn acks_expected(bytes: &[u8]) -> usize {
    let mut at = 0;
    let mut count = 0;
    while at + 8 <= bytes.len() {
        let len = u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
        let flags = u16::from_ne_bytes([bytes[at + 6], bytes[at + 7]]);
        if flags & NLM_F_ACK != 0 {
            count += 1;
        }
        at += (len as usize + 3) & !3;
    }
    count
}

/// A batch being encoded: netlink messages, each aligned to 4 bytes.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    seq: u32,
}

impl Batch {
    /// A batch's begin or end (`res_id`: the nftables subsystem).
    fn control(&mut self, kind: u16) {
        self.header(kind, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES);
        self.end_message(self.bytes.len() - 20);
    }

    /// An nftables message of `kind` for the IPv4 family, its attributes written by `body`.
    fn message(&mut self, kind: u16, flags: u16, body: impl FnOnce(&mut Attrs)) {
        let start = self.bytes.len();
        self.header(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            NFPROTO_IPV4,
            0,
        );
        let mut attrs = Attrs {
            bytes: std::mem::take(&mut self.bytes),
        };
        body(&mut attrs);
        self.bytes = attrs.bytes;
        self.end_message(start);
    }

    /// A rule appended to `chain`.
    fn rule(&mut self, chain: &str, exprs: Vec<Expr>) {
        self.message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, |m| {
            m.string(NFTA_RULE_TABLE, TABLE);
            m.string(NFTA_RULE_CHAIN, chain);
            m.nested(NFTA_RULE_EXPRESSIONS, |list| {
                for e in &exprs {
                    list.nested(NFTA_LIST_ELEM, |elem| {
                        elem.string(NFTA_EXPR_NAME, e.name);
                        elem.nested(NFTA_EXPR_DATA, |data| {
                            for (kind, value) in &e.attrs {
                                match value {
                                    Value::U32(v) => data.u32(*kind, *v),
                                    Value::U8(v) => data.raw(*kind, &[*v]),
                                    Value::Data(d) => {
                                        data.nested(*kind, |v| v.raw(NFTA_DATA_VALUE, d));
                                    }
                                }
                            }
                        });
                    });
                }
            });
        });
    }

    /// `nlmsghdr` (its length filled in by [`Self::end_message`]) and `nfgenmsg`.
    fn header(&mut self, kind: u16, flags: u16, family: u8, res_id: u16) {
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(&flags.to_ne_bytes());
        self.bytes.extend_from_slice(&self.seq.to_ne_bytes());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        self.seq += 1;
        // nfgenmsg: family, NFNETLINK_V0, res_id (big-endian).
        self.bytes.push(family);
        self.bytes.push(0);
        self.bytes.extend_from_slice(&res_id.to_be_bytes());
    }

    /// Writes the length of the message that began at `start`.
    fn end_message(&mut self, start: usize) {
        let len = (self.bytes.len() - start) as u32;
        self.bytes[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }
}

/// Attributes being written into a message.
struct Attrs {
    bytes: Vec<u8>,
}

impl Attrs {
    /// An attribute of `kind` holding `value`, padded to 4 bytes.
    fn raw(&mut self, kind: u16, value: &[u8]) {
        let len = 4 + value.len();
        self.bytes.extend_from_slice(&(len as u16).to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(value);
        self.pad();
    }

    /// A big-endian `u32` attribute (netfilter's attributes are in network order).
    fn u32(&mut self, kind: u16, value: u32) {
        self.raw(kind, &value.to_be_bytes());
    }

    /// A NUL-terminated string attribute.
    fn string(&mut self, kind: u16, value: &str) {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.raw(kind, &bytes);
    }

    /// A nested attribute, its members written by `body`.
    fn nested(&mut self, kind: u16, body: impl FnOnce(&mut Attrs)) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&0u16.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        body(self);
        let len = (self.bytes.len() - start) as u16;
        self.bytes[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages of a batch: (type, flags, length), read back from its bytes.
    fn messages(bytes: &[u8]) -> Vec<(u16, u16, usize)> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes(bytes[at + 4..at + 6].try_into().unwrap());
            let flags = u16::from_ne_bytes(bytes[at + 6..at + 8].try_into().unwrap());
            out.push((kind, flags, len));
            assert!(len.is_multiple_of(4), "every message stays aligned");
            at += len;
        }
        assert_eq!(at, bytes.len());
        out
    }

    #[test]
    fn the_batch_has_a_table_three_chains_and_a_rule_per_port_between_begin_and_end() {
        let few = messages(&batch(4000, &[]));
        let more = messages(&batch(4000, &[22, 8080]));
        assert_eq!(few.len(), 2 + 1 + 3 + 3);
        assert_eq!(more.len(), few.len() + 2);
        assert_eq!(more[0].0, NFNL_MSG_BATCH_BEGIN);
        assert_eq!(more.last().unwrap().0, NFNL_MSG_BATCH_END);
        let rules = more
            .iter()
            .filter(|m| m.0 == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE)
            .count();
        assert_eq!(rules, 5);
        assert_eq!(acks_expected(&batch(4000, &[22, 8080])), more.len() - 2);
    }

    #[test]
    fn the_forwarders_port_and_the_listed_ports_are_in_network_order() {
        let bytes = batch(0x1234, &[0x5678]);
        let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        assert!(has(&[0x12, 0x34]));
        assert!(has(&[0x56, 0x78]));
        assert!(has(b"redir\0"));
        assert!(has(b"filter_out\0"));
    }
}

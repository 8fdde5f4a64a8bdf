//! #34: a sandboxed attempt's network, the pure part: which `host:port`s its policy lets it
//! reach, the stand-in addresses its name server gives the names it may reach (and the way
//! back from an address to the name), and the fold of its connections into the compact
//! flows one `SandboxNet` event journals (host, port, allowed or denied, how many, bytes each
//! way). `sortie __sandbox` forwards and records; the runner folds its record when the
//! attempt's end is journaled.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// The port a name lookup is recorded under (a lookup has no port).
pub const LOOKUP_PORT: u16 = 0;

/// The field that allows a denied flow, as the views name it.
pub const ALLOWING_FIELD: &str = "sandbox_hosts";

/// The first stand-in address (198.18.0.0/15, the benchmarking range no host uses).
const FAKE_BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);

/// How many stand-in addresses there are (the /15 but its first and last).
const FAKE_COUNT: u32 = (1 << 17) - 2;

/// One connection (or name lookup) of a sandboxed attempt, as its wrapper records it: one
/// line per record, the later record of the same `id` replacing the earlier (a connection is
/// recorded when it opens and again when it closes, with its bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    /// Its number in the attempt.
    pub id: u64,
    /// The name it was for (a name the policy lists), else the address.
    pub host: String,
    /// The port ([`LOOKUP_PORT`] for a name lookup).
    pub port: u16,
    /// Whether the policy allowed it.
    pub allowed: bool,
    /// Bytes the attempt sent.
    #[serde(default)]
    pub bytes_out: u64,
    /// Bytes it received.
    #[serde(default)]
    pub bytes_in: u64,
}

/// The connections of an attempt to one `host:port`, allowed or denied, folded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Flow {
    /// The name, else the address.
    pub host: String,
    /// The port ([`LOOKUP_PORT`] for name lookups).
    pub port: u16,
    /// Whether they were allowed.
    pub allowed: bool,
    /// How many.
    pub count: u32,
    /// Bytes sent, all of them together.
    pub bytes_out: u64,
    /// Bytes received.
    pub bytes_in: u64,
}

impl Flow {
    /// `host:port`, or `host (name lookup)`.
    pub fn target(&self) -> String {
        if self.port == LOOKUP_PORT {
            format!("{} (name lookup)", self.host)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Folds an attempt's records into its flows: the last record of each connection counts,
/// flows sorted denied first, then by host and port.
pub fn fold(records: &[Connection]) -> Vec<Flow> {
    let mut last: std::collections::BTreeMap<u64, &Connection> = Default::default();
    for r in records {
        last.insert(r.id, r);
    }
    let mut flows: Vec<Flow> = Vec::new();
    for c in last.values() {
        match flows
            .iter_mut()
            .find(|f| f.host == c.host && f.port == c.port && f.allowed == c.allowed)
        {
            Some(f) => {
                f.count = f.count.saturating_add(1);
                f.bytes_out = f.bytes_out.saturating_add(c.bytes_out);
                f.bytes_in = f.bytes_in.saturating_add(c.bytes_in);
            }
            None => flows.push(Flow {
                host: c.host.clone(),
                port: c.port,
                allowed: c.allowed,
                count: 1,
                bytes_out: c.bytes_out,
                bytes_in: c.bytes_in,
            }),
        }
    }
    flows.sort_by(|a, b| (a.allowed, &a.host, a.port).cmp(&(b.allowed, &b.host, b.port)));
    flows
}

/// The flows of all of a task's attempts (their `SandboxNet`s), merged into one list as
/// [`fold`] sorts it.
pub fn merge<'a>(flows: impl IntoIterator<Item = &'a Flow>) -> Vec<Flow> {
    let mut out: Vec<Flow> = Vec::new();
    for f in flows {
        match out
            .iter_mut()
            .find(|o| o.host == f.host && o.port == f.port && o.allowed == f.allowed)
        {
            Some(o) => {
                o.count = o.count.saturating_add(f.count);
                o.bytes_out = o.bytes_out.saturating_add(f.bytes_out);
                o.bytes_in = o.bytes_in.saturating_add(f.bytes_in);
            }
            None => out.push(f.clone()),
        }
    }
    out.sort_by(|a, b| (a.allowed, &a.host, a.port).cmp(&(b.allowed, &b.host, b.port)));
    out
}

/// The denied flows of `flows`, as the views list them: `example.com:443 ×3`.
pub fn denied(flows: &[Flow]) -> Vec<String> {
    flows
        .iter()
        .filter(|f| !f.allowed)
        .map(|f| format!("{} ×{}", f.target(), f.count))
        .collect()
}

/// A name as compared: lower case, without a final dot; `localhost` is `127.0.0.1` (the
/// sandbox's `/etc/hosts` says so).
fn normal(name: &str) -> String {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" {
        "127.0.0.1".to_owned()
    } else {
        name
    }
}

/// The `(host, port)` of each entry of a policy's `hosts` (entries that are not `host:port`
/// are skipped: the batch checked them).
fn entries(hosts: &[String]) -> impl Iterator<Item = (String, u16)> + '_ {
    hosts.iter().filter_map(|h| {
        let (host, port) = h.rsplit_once(':')?;
        Some((normal(host.trim_matches(['[', ']'])), port.parse().ok()?))
    })
}

/// The names (not addresses) the hosts list, each once, in their order.
fn names(hosts: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (host, _) in entries(hosts) {
        if host.parse::<std::net::IpAddr>().is_err() && !out.contains(&host) {
            out.push(host);
        }
    }
    out
}

/// Whether `hosts` let an attempt reach `host` on `port` (a name as its stand-in address
/// maps back to it, an address only when listed as that address).
pub fn allows(hosts: &[String], host: &str, port: u16) -> bool {
    let host = normal(host);
    entries(hosts).any(|(h, p)| h == host && p == port)
}

/// The stand-in address the sandbox's name server answers for `name`, when `hosts` list it
/// (on any port); other names do not resolve.
pub fn fake_address(hosts: &[String], name: &str) -> Option<Ipv4Addr> {
    let name = normal(name);
    let i = names(hosts).iter().position(|n| *n == name)?;
    let i = u32::try_from(i).ok().filter(|i| *i < FAKE_COUNT)?;
    Some(Ipv4Addr::from(FAKE_BASE + 1 + i))
}

/// The host a connection to `addr` is for: the name whose stand-in it is, else the address.
pub fn host_of(hosts: &[String], addr: Ipv4Addr) -> String {
    let n = u32::from(addr).wrapping_sub(FAKE_BASE + 1);
    if n < FAKE_COUNT
        && let Some(name) = names(hosts).get(n as usize)
    {
        return name.clone();
    }
    addr.to_string()
}

/// The loopback ports `hosts` list (`127.0.0.1:PORT`, `localhost:PORT`): the sandbox sends
/// them to the host's loopback.
pub fn loopback_ports(hosts: &[String]) -> Vec<u16> {
    let mut out: Vec<u16> = entries(hosts)
        .filter(|(h, _)| h.parse::<Ipv4Addr>().is_ok_and(|a| a.is_loopback()))
        .map(|(_, p)| p)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> Vec<String> {
        [
            "pypi.org:443",
            "PyPI.org:80",
            "127.0.0.1:8080",
            "files.example:443",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn names_get_stand_ins_that_map_back() {
        let h = hosts();
        let a = fake_address(&h, "pypi.org.").expect("listed");
        assert_eq!(a, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(
            fake_address(&h, "files.example"),
            Some(Ipv4Addr::new(198, 18, 0, 2))
        );
        assert_eq!(fake_address(&h, "example.com"), None);
        assert_eq!(fake_address(&h, "127.0.0.1"), None);
        assert_eq!(host_of(&h, a), "pypi.org");
        assert_eq!(host_of(&h, Ipv4Addr::new(198, 18, 0, 9)), "198.18.0.9");
        assert_eq!(host_of(&h, Ipv4Addr::new(10, 0, 0, 1)), "10.0.0.1");
    }

    #[test]
    fn a_host_is_allowed_on_its_listed_ports_only() {
        let h = hosts();
        assert!(allows(&h, "pypi.org", 443));
        assert!(allows(&h, "PYPI.ORG", 80));
        assert!(!allows(&h, "pypi.org", 22));
        assert!(allows(&h, "127.0.0.1", 8080));
        assert!(!allows(&h, "127.0.0.1", 8081));
        assert!(!allows(&h, "example.com", 443));
        assert!(!allows(&[], "pypi.org", 443));
        assert_eq!(loopback_ports(&h), vec![8080]);
        let local = ["localhost:9000".to_owned()];
        assert!(allows(&local, "127.0.0.1", 9000));
        assert_eq!(loopback_ports(&local), vec![9000]);
        assert_eq!(fake_address(&local, "localhost"), None);
    }

    #[test]
    fn records_fold_into_flows_the_last_record_of_a_connection_counting() {
        let c = |id, host: &str, port, allowed, o, i| Connection {
            id,
            host: host.into(),
            port,
            allowed,
            bytes_out: o,
            bytes_in: i,
        };
        let records = [
            c(0, "pypi.org", 443, true, 0, 0),
            c(1, "example.com", 443, false, 0, 0),
            c(0, "pypi.org", 443, true, 10, 200),
            c(2, "example.com", 443, false, 0, 0),
            c(3, "pypi.org", 443, true, 5, 7),
            c(4, "example.com", LOOKUP_PORT, false, 0, 0),
        ];
        let flows = fold(&records);
        assert_eq!(flows.len(), 3);
        assert_eq!(
            (flows[0].target(), flows[0].count),
            ("example.com (name lookup)".to_owned(), 1)
        );
        assert_eq!(
            (flows[1].target(), flows[1].count),
            ("example.com:443".to_owned(), 2)
        );
        assert_eq!(
            (flows[2].count, flows[2].bytes_out, flows[2].bytes_in),
            (2, 15, 207)
        );
        assert_eq!(
            denied(&flows),
            vec!["example.com (name lookup) ×1", "example.com:443 ×2"]
        );
        assert!(fold(&[]).is_empty());
        let twice = merge(flows.iter().chain(&flows));
        assert_eq!((twice[1].count, twice[2].bytes_in), (4, 414));
    }
}

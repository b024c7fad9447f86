//! The DNS entry point's settings (`[dns]`): off unless given a port. See docs/operations.md.

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};

/// A cell answering DNS for its ring's name (`--dns-port`, `--cluster-name`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DnsConfig {
    /// UDP and TCP port the cell answers DNS on; 0 (the default): no DNS.
    pub port: u16,
    /// Address the DNS listener binds.
    pub listen: IpAddr,
    /// The ring's name (`--cluster-name`): `NAME` has the A/AAAA records of the ring's
    /// Active cells, `_memcache._tcp.NAME` their SRV records (with their client ports),
    /// `cell-ID.NAME` each cell's address; any other name is NXDOMAIN.
    pub name: String,
    /// TTL of every record, short so clients follow cells as they come and go.
    pub ttl_secs: u32,
    /// A TCP DNS connection idle this long is closed.
    pub tcp_timeout_ms: u64,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            port: 0,
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            name: "cellcache.local".into(),
            ttl_secs: 5,
            tcp_timeout_ms: 5_000,
        }
    }
}

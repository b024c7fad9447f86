//! `server.listen` (memcached's `-l`): the addresses a cell listens on, each with its own
//! port or `server.port`, and memcached's `notls:` prefix for a listener without TLS.

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};

/// The addresses a cell listens on (never empty). memcached's `-l` takes
/// `addr[,addr…]`, each `IP` or `IP:PORT` (`[IPv6]:PORT`), and may be repeated; the TOML
/// key takes a string of that form or a list. An entry without a port uses `server.port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddrs(Vec<ListenAddr>);

/// One `-l` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenAddr {
    pub ip: IpAddr,
    /// Its own port (`IP:PORT`), else `server.port`.
    pub port: Option<u16>,
    /// `notls:ADDR`: served without TLS when the others speak TLS (`server.tls`).
    pub notls: bool,
}

/// A `-l` entry that is neither an IP address nor `IP:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("listen address {0:?}: not an IP address or IP:PORT")]
pub struct BadListenAddr(pub String);

impl std::str::FromStr for ListenAddr {
    type Err = BadListenAddr;
    fn from_str(part: &str) -> Result<Self, BadListenAddr> {
        let (notls, addr) = match part.strip_prefix("notls:") {
            Some(rest) => (true, rest),
            None => (false, part),
        };
        if let Ok(ip) = addr.parse::<IpAddr>() {
            return Ok(ListenAddr {
                ip,
                port: None,
                notls,
            });
        }
        addr.parse::<SocketAddr>()
            .map(|a| ListenAddr {
                ip: a.ip(),
                port: Some(a.port()),
                notls,
            })
            .map_err(|_| BadListenAddr(part.to_string()))
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.notls {
            f.write_str("notls:")?;
        }
        match self.port {
            None => write!(f, "{}", self.ip),
            Some(port) => write!(f, "{}", SocketAddr::new(self.ip, port)),
        }
    }
}

impl ListenAddrs {
    /// The addresses of `spec` (`addr[,addr…]`), appended to `self` (`-l` repeated).
    pub fn extend_from_spec(&mut self, spec: &str) -> Result<(), BadListenAddr> {
        for part in spec.split(',') {
            self.0.push(part.trim().parse()?);
        }
        Ok(())
    }

    /// A repeated `-l spec`: as memcached 1.6.18, a repetition of addresses already listed
    /// is ignored (`-l a -l a` listens once), anything else is appended (memcached matches
    /// the argument as a substring of its list; cellcache compares addresses).
    pub fn add_repeated(&mut self, spec: &str) -> Result<(), BadListenAddr> {
        let more = ListenAddrs::parse(spec)?;
        if more.0.iter().all(|a| self.0.contains(a)) {
            return Ok(());
        }
        self.0.extend(more.0);
        Ok(())
    }

    /// Parses `addr[,addr…]`.
    pub fn parse(spec: &str) -> Result<Self, BadListenAddr> {
        let mut l = ListenAddrs(Vec::new());
        l.extend_from_spec(spec)?;
        Ok(l)
    }

    /// The first entry's IP: the one a ring member advertises.
    pub fn first(&self) -> IpAddr {
        self.0[0].ip
    }

    /// Every entry as a socket address, `port` filling in those without their own.
    pub fn socket_addrs(&self, port: u16) -> Vec<SocketAddr> {
        self.0
            .iter()
            .map(|a| SocketAddr::new(a.ip, a.port.unwrap_or(port)))
            .collect()
    }

    /// The `notls:` entries as socket addresses.
    pub fn plain_socket_addrs(&self, port: u16) -> Vec<SocketAddr> {
        self.0
            .iter()
            .filter(|a| a.notls)
            .map(|a| SocketAddr::new(a.ip, a.port.unwrap_or(port)))
            .collect()
    }

    /// Whether any entry is `notls:`.
    pub fn any_plain(&self) -> bool {
        self.0.iter().any(|a| a.notls)
    }
}

impl From<IpAddr> for ListenAddrs {
    fn from(ip: IpAddr) -> Self {
        ListenAddrs(vec![ListenAddr {
            ip,
            port: None,
            notls: false,
        }])
    }
}

impl std::fmt::Display for ListenAddrs {
    /// As memcached's `stats settings inter`: the entries as given, joined by commas.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl Serialize for ListenAddrs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.len() == 1 {
            s.collect_str(&self.0[0])
        } else {
            s.collect_seq(self.0.iter().map(|a| a.to_string()))
        }
    }
}

impl<'de> Deserialize<'de> for ListenAddrs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Spec {
            One(String),
            Many(Vec<String>),
        }
        let specs = match Spec::deserialize(d)? {
            Spec::One(s) => vec![s],
            Spec::Many(v) => v,
        };
        let mut l = ListenAddrs(Vec::new());
        for spec in &specs {
            l.extend_from_spec(spec).map_err(serde::de::Error::custom)?;
        }
        if l.0.is_empty() {
            return Err(serde::de::Error::custom("server.listen needs an address"));
        }
        Ok(l)
    }
}

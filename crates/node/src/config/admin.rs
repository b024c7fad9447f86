//! The admin listener's settings (`[admin]`): where the operators' HTTP plane listens, who
//! may use it, and its limits. See docs/security.md.

use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};

/// How far above the client port the admin port is by default (`admin.port = 0`): 11211 →
/// 31211, beside the peer port's 10000.
pub const ADMIN_PORT_OFFSET: u16 = 20_000;

/// The admin plane: `cellcache ctl` and the ring's commands over HTTP, apart from the
/// memcached port (which speaks only memcached).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Serve the admin plane. Off: no `ctl` for this cell.
    pub enabled: bool,
    /// Address the admin listener binds: loopback by default, so only this host's users
    /// reach it. Any other address needs `token_file`.
    pub listen: IpAddr,
    /// Port of the admin listener; 0 = the client port + 20000 when that is free, else any
    /// free port (the log says which).
    pub port: u16,
    /// File holding the admin token (one line; `cellcache ctl secret new` writes a suitable
    /// one). When set, every request must carry `Authorization: Bearer <token>`; `ctl`
    /// sends it with `--admin-token-file`. Empty: no token, allowed only on loopback.
    pub token_file: String,
    /// Connections the admin listener holds at once; past it new ones are closed at once.
    pub connections_max: usize,
    /// A connection is closed this long after it was accepted, finished or not: a slow or
    /// idle client cannot hold a slot.
    pub connection_timeout_ms: u64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            enabled: true,
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            token_file: String::new(),
            connections_max: 64,
            connection_timeout_ms: 30_000,
        }
    }
}

impl AdminConfig {
    /// Why these settings cannot run, if they cannot.
    pub fn problem(&self) -> Option<String> {
        if !self.enabled {
            return None;
        }
        if !self.listen.is_loopback() && self.token_file.is_empty() {
            return Some(format!(
                "admin.listen {} is not a loopback address: anyone who reaches it could \
                 change the ring; give admin.token_file (--admin-token-file) too",
                self.listen
            ));
        }
        if self.connections_max == 0 || self.connection_timeout_ms == 0 {
            return Some(
                "admin.connections_max and admin.connection_timeout_ms must be > 0".into(),
            );
        }
        None
    }
}

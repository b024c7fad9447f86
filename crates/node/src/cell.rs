//! The state every connection of a cell shares: the store, the protocol limits, the
//! counters and the clock. Read-only after start except for atomics.

use crate::config::NodeConfig;
use crate::counters::Counters;
use cellcache_io::{EngineStats, IoEngineKind, Shutdown};
use cellcache_proto::Limits;
use cellcache_store::Store;
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Version reported by `version` and `stats`: the memcached protocol level first, so
/// clients that parse `major.minor.patch` to enable features see a 1.6-compatible server.
pub const VERSION: &str = concat!("1.6.21-cellcache-", env!("CARGO_PKG_VERSION"));

pub struct Cell {
    pub store: Store,
    pub limits: Limits,
    pub config: NodeConfig,
    pub counters: Counters,
    /// Request service times (`crate::latency`).
    pub latency: crate::latency::Latency,
    /// `stats detail`'s per-prefix counts.
    pub detail: crate::detail::Detail,
    /// Open client connections and listeners, for `stats conns`.
    pub conns: crate::conns::ConnRegistry,
    /// The level the last `verbosity` command set (reported by `stats settings`, as
    /// memcached's; cellcache's logging follows `log.level`, not this).
    pub verbosity: std::sync::atomic::AtomicU32,
    pub shutdown: Shutdown,
    /// Set once the engine runs (its counters feed `stats`).
    pub engine_stats: OnceLock<Arc<EngineStats>>,
    /// Set once the engine runs with client TLS (`server.tls`): its certificates
    /// (`refresh_certs`) and counters (`stats`).
    pub tls: OnceLock<ClientTls>,
    /// The engine actually running (`auto` resolved).
    pub engine: OnceLock<IoEngineKind>,
    pub started: Instant,
    pub started_unix: u64,
    /// The ring's figures for `stats cellcache`, set once the cell is a ring member. The
    /// cell knows nothing else of the ring: the ring module, above it, sets this hook.
    pub ring_figures: OnceLock<Arc<dyn RingFigures>>,
    /// The users clients log in as (`server.auth_file`, memcached `-Y`); `None`: clients
    /// need no login. Set before the engine starts.
    pub credentials: Option<crate::credentials::Credentials>,
    /// The cache tier (`[tier]`): the backing store this cell fronts; `None`: a plain cache.
    /// Set before the engine starts.
    pub tier: Option<Arc<crate::tier::Tier>>,
    /// Failed logins per client address (`server.auth_failures_max`).
    pub login_throttle: crate::throttle::LoginThrottle,
    /// The automatic policy that switches the eviction policy (`[switching]`).
    pub auto_switch: crate::blocks::auto::AutoSwitch,
}

/// Client TLS of a running cell.
pub struct ClientTls {
    pub certs: Arc<cellcache_io::tls::TlsCerts>,
    pub stats: Arc<cellcache_io::tls::TlsStats>,
}

/// What a ring member adds to `stats cellcache` (its `cluster_*` lines).
pub trait RingFigures: Send + Sync {
    fn write_stats(&self, out: &mut Vec<u8>);
}

impl Cell {
    pub fn new(config: NodeConfig, store: Store, limits: Limits, shutdown: Shutdown) -> Self {
        let detail = crate::detail::Detail::new(
            config.server.detail_enabled,
            // validate() keeps the delimiter ASCII.
            u8::try_from(config.server.detail_delimiter).unwrap_or(b':'),
            config.server.detail_prefixes_max,
        );
        let login_throttle = crate::throttle::LoginThrottle::new(
            config.server.auth_failures_max,
            std::time::Duration::from_secs(config.server.auth_failure_window_secs),
            config.server.auth_throttle_addresses_max,
        );
        let auto_switch = crate::blocks::auto::AutoSwitch::new(&config.switching);
        Cell {
            store,
            limits,
            config,
            counters: Counters::default(),
            latency: Default::default(),
            detail,
            conns: crate::conns::ConnRegistry::default(),
            verbosity: std::sync::atomic::AtomicU32::new(0),
            shutdown,
            engine_stats: OnceLock::new(),
            tls: OnceLock::new(),
            engine: OnceLock::new(),
            started: Instant::now(),
            started_unix: unix_now_secs(),
            ring_figures: OnceLock::new(),
            login_throttle,
            credentials: None,
            tier: None,
            auto_switch,
        }
    }

    /// Unix seconds as the store wants them (never 0: 0 means "never expires" there).
    pub fn now(&self) -> u32 {
        u32::try_from(unix_now_secs()).unwrap_or(u32::MAX).max(1)
    }

    pub fn uptime_secs(&self) -> u64 {
        self.started.elapsed().as_secs()
    }
}

pub(crate) fn unix_now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

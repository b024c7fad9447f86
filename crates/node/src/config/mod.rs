//! The cell's configuration: one TOML document whose every field has a documented default.
//!
//! Sources, lowest precedence first: embedded defaults (`NodeConfig::default()`), the TOML
//! file given with `--config`, environment variables `CELLCACHE_<SECTION>__<FIELD>` (e.g.
//! `CELLCACHE_SERVER__PORT=11311`, `CELLCACHE_STORE__MEMORY_LIMIT_BYTES=...`), then command
//! line flags (applied by the binary). Unknown keys are errors, so a typo never silently
//! leaves a default in force. `cellcache.example.toml` at the repository root is the
//! annotated reference; a test keeps it equal to the defaults.

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

mod admin;
mod autoscale;
mod dns;
mod listen;
mod peer_tls;
mod switching;
mod tier;
pub use admin::{ADMIN_PORT_OFFSET, AdminConfig};
pub use autoscale::{
    AutoscaleConfig, CommandProvisionerConfig, DockerProvisionerConfig,
    KubernetesProvisionerConfig, LocalProvisionerConfig, ProvisionerKind,
};
pub use cellcache_io::{EngineConfig, IoEngineKind};
pub use cellcache_store::StoreConfig;
pub use dns::DnsConfig;
pub use listen::{BadListenAddr, ListenAddr, ListenAddrs};
pub use peer_tls::{PEER_TLS_SERVER_NAME_DEFAULT, PeerTlsConfig};
pub use switching::SwitchingConfig;
pub use tier::{TierConfig, WritePolicy};

/// Everything a cell can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    pub server: ServerConfig,
    pub io: EngineConfig,
    pub store: StoreConfig,
    pub protocol: ProtocolConfig,
    pub log: LogConfig,
    pub cluster: ClusterConfig,
    pub admin: AdminConfig,
    pub dns: DnsConfig,
    pub autoscale: AutoscaleConfig,
    pub tier: TierConfig,
    pub switching: SwitchingConfig,
}

/// When a master acknowledges a write: after its backups applied it, or at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationMode {
    /// After every backup applied it (default).
    #[default]
    Sync,
    /// At once; backups catch up in the background.
    Async,
}

impl ReplicationMode {
    /// Its name in the configuration, `ctl switch` and `stats settings`.
    pub fn name(self) -> &'static str {
        match self {
            ReplicationMode::Sync => "sync",
            ReplicationMode::Async => "async",
        }
    }

    /// The mode a name stands for.
    pub fn from_name(name: &str) -> Option<ReplicationMode> {
        match name {
            "sync" => Some(ReplicationMode::Sync),
            "async" => Some(ReplicationMode::Async),
            _ => None,
        }
    }
}

/// What a master does with a write when a backup cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NoBackupPolicy {
    /// Answer `SERVER_ERROR` (the write may or may not have been applied).
    #[default]
    Refuse,
    /// Acknowledge anyway, log a warning and count it (`stats`: `cluster_unreplicated_acks`).
    Accept,
}

/// The ring (see docs/cluster.md). Timing of the ring, the wire and the consensus group
/// sit in the sub-tables `[cluster.ring]`, `[cluster.wire]` and `[cluster.raft]`; peer
/// TLS in `[cluster.tls]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// Run the cell as a member of a ring (a ring of one without `join`). Off: a plain
    /// memcached-compatible server with no peer listener.
    pub enabled: bool,
    /// TCP port for inter-cell traffic. 0: the client port + 10000 when that is a valid
    /// port and free, otherwise any free port.
    pub peer_port: u16,
    /// Host (IP or name) other cells and clients reach this cell at, put in the map with
    /// the client and peer ports; empty: the listen address (which must then not be
    /// unspecified, e.g. 0.0.0.0).
    pub advertise_host: String,
    /// Address (`host:port`, a cell's client port) of any cell of the ring to join; empty
    /// bootstraps a new ring of one (`serve --join`).
    pub join: String,
    /// With `join`: the id of the cell to divide (as `ctl status` prints it); empty: the
    /// cell with the largest range. A provisioner sets it to the cell that ran short.
    pub divide: String,
    /// This cell was started by a provisioner (`[autoscale]`): autoscaling may absorb it
    /// when idle. Cells an operator started are never absorbed by autoscaling.
    pub provisioned: bool,
    /// Start outside any ring and wait to be brought in by `cellcache ctl split` (the
    /// cell answers keyed requests with `SERVER_ERROR` until then).
    pub standby: bool,
    /// Directory of the membership file (`ring-HOST_PORT.toml`: the ring's identity and its
    /// cells' client addresses), written while the ring has other cells, so that a
    /// restarted cell rejoins its ring as a new cell instead of starting a second ring.
    /// Empty: `$XDG_STATE_HOME/cellcache`, else `$HOME/.local/state/cellcache`; `off`: no
    /// file (a restarted first cell then only learns of its old ring when a cell of it
    /// calls, and stops).
    pub state_dir: String,
    /// Copies of each item (master + backups) of a ring this cell bootstraps, 1..=5.
    pub replication_factor: u8,
    /// `sync` acknowledges writes after the backups applied them, `async` before.
    pub replication: ReplicationMode,
    /// `refuse` or `accept` writes when a backup is unreachable.
    pub no_backup: NoBackupPolicy,
    /// How long a request may wait for its key's master (forwarding, map refresh, lease)
    /// before the client gets `SERVER_ERROR` (retryable).
    pub request_timeout_ms: u64,
    /// Requests one client connection may have waiting on other cells or on backups; past
    /// it the connection stops reading until replies drain.
    pub in_flight_per_connection_max: usize,
    /// Timeout of a connection attempt to a peer.
    pub peer_connect_timeout_ms: u64,
    /// A request to a peer unanswered this long means the peer is gone without closing the
    /// connection (paused, partitioned): the connection is dropped and its waiting requests
    /// re-routed. Above `request_timeout_ms`, since a master may hold a reply that long
    /// while its backups acknowledge.
    pub peer_reply_timeout_ms: u64,
    /// A cell that left the ring (absorbed) keeps refusing what other cells forward to it
    /// this long before it stops, so a cell that has not yet learnt the change learns it
    /// from the refusal and sends the request to the new master, rather than losing it
    /// with the connection.
    pub leave_linger_ms: u64,
    /// Threads of the peer runtime: the inter-cell links, the peer listener, replication and
    /// the consensus group (the I/O engine's workers serve clients apart from them).
    pub peer_threads: usize,
    /// After the linger, a leaving cell waits at most this long for the consensus group to
    /// stop counting it as a voter before it stops (so the cells left keep a quorum).
    pub leave_voters_wait_ms: u64,
    /// Bytes of frames queued for one peer connection and not yet written, each way: a link
    /// past it refuses new requests at once (the caller routes them again) and drops one-way
    /// frames; the peer listener stops reading a connection whose replies are queued past
    /// it (a peer that does not read its replies). One frame always fits an empty queue.
    pub peer_queue_bytes_max: usize,
    /// Forwarded requests one peer connection may have in progress on this cell; past it
    /// they are refused at once (busy) and the forwarding cell tries again within its
    /// `request_timeout_ms`.
    pub peer_forwards_in_flight_max: usize,
    /// File holding the ring's secret (`cellcache ctl secret new PATH` writes one): every
    /// peer connection starts with a mutual proof of it, and a peer without it is closed
    /// before any of its frames is read. Every cell of a ring needs the same file. Empty:
    /// no secret, and anyone who reaches the peer port can act as a cell (logged loudly).
    pub secret_file: String,
    /// Mutual TLS on peer connections, with operator-provided certificates; off by default.
    pub tls: PeerTlsConfig,
    /// A peer connection must finish its handshake (TLS when on, the secret's proofs and
    /// its `Hello`) within this long, or is closed.
    pub peer_handshake_timeout_ms: u64,
    /// Peer connections open at once on the peer listener; past it new ones are closed.
    pub peer_connections_max: usize,
    /// The consensus leader probes a cell another cell suspects of having crashed before it
    /// commits its eviction, waiting this long for an answer; an answer refutes the
    /// suspicion (one bad link does not evict a healthy cell). 0: no probe.
    pub indirect_probe_timeout_ms: u64,
    /// Bytes of replication records per frame (snapshot chunks and live batches); a value
    /// longer than this is replicated in parts of this size, so a live write waits behind
    /// at most one part of a large item.
    pub replication_chunk_bytes: usize,
    /// Unacknowledged replication bytes kept per backup; past it the backup is resynced.
    pub replication_backlog_bytes_max: usize,
    /// Live-record bytes queued for a division child (before it has the whole snapshot)
    /// above which the parent's writes wait for it while it answers: backpressure, so a
    /// write volume above what the child's link carries cannot starve the hand-off.
    pub handoff_lag_bytes_max: usize,
    /// Snapshot streaming rate during hand-off and re-replication (bytes/s; 0 = unlimited).
    pub handoff_bytes_per_sec: u64,
    /// Most voters of the consensus group (the rest of the cells are learners); an odd
    /// number votes, an even cap or cell count rounds down.
    pub voters_max: usize,
    /// The ring's recent events (divisions, absorptions) a cell keeps for `GET /events`.
    pub events_kept: usize,
    /// Ring timing (heartbeats, leases, suspicion).
    pub ring: cellcache_cluster::RingConfig,
    /// Inter-cell frame limits.
    pub wire: cellcache_cluster::WireConfig,
    /// Consensus group timing.
    pub raft: cellcache_cluster::raft::RaftConfig,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            peer_port: 0,
            advertise_host: String::new(),
            join: String::new(),
            divide: String::new(),
            provisioned: false,
            standby: false,
            state_dir: String::new(),
            replication_factor: 2,
            replication: ReplicationMode::Sync,
            no_backup: NoBackupPolicy::Refuse,
            request_timeout_ms: 3_000,
            in_flight_per_connection_max: 1_024,
            peer_connect_timeout_ms: 1_000,
            peer_reply_timeout_ms: 6_000,
            leave_linger_ms: 3_000,
            peer_threads: 2,
            leave_voters_wait_ms: 10_000,
            peer_queue_bytes_max: 64 << 20,
            peer_forwards_in_flight_max: 4_096,
            secret_file: String::new(),
            tls: PeerTlsConfig::default(),
            peer_handshake_timeout_ms: 2_000,
            peer_connections_max: 256,
            indirect_probe_timeout_ms: 250,
            replication_chunk_bytes: 256 * 1024,
            replication_backlog_bytes_max: 64 << 20,
            handoff_bytes_per_sec: 256 << 20,
            handoff_lag_bytes_max: 1 << 20,
            voters_max: 5,
            events_kept: 100,
            ring: Default::default(),
            wire: Default::default(),
            raft: Default::default(),
        }
    }
}

/// Limits of the client protocol. The largest value is `store.item_size_max_bytes`, so
/// there is one source of truth for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProtocolConfig {
    /// Longest key accepted (memcached: 250).
    pub key_bytes_max: usize,
    /// Longest command line; a longer one closes the connection (as memcached), except a
    /// retrieval line, which is taken in batches of the keys within this many bytes.
    pub line_bytes_max: usize,
    /// Most keys executed per batch of a get/gets/gat/gats line (any number per line).
    pub keys_per_get_max: usize,
}

impl Default for ProtocolConfig {
    fn default() -> Self {
        let l = cellcache_proto::Limits::default();
        Self {
            key_bytes_max: l.key_bytes_max,
            line_bytes_max: l.line_bytes_max,
            keys_per_get_max: l.keys_per_get_max,
        }
    }
}

/// Where the cell listens for memcached clients and which engine moves the bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Addresses to listen on (memcached `-l`): one string (`"127.0.0.1"`, or
    /// comma-separated `"127.0.0.1,::1"` as memcached's `-l a,b`) or a list of them. The
    /// first is the one a ring member advertises.
    pub listen: ListenAddrs,
    /// TCP port for the memcached protocol (memcached `-p`); 0 picks a free port.
    pub port: u16,
    /// I/O engine: `auto` picks the best the kernel allows.
    pub io_engine: IoEngineKind,
    /// Honour the `shutdown` command (memcached `-A`); off by default.
    pub shutdown_command: bool,
    /// Honour `flush_all` (on by default); off (memcached `-F`) answers it
    /// `CLIENT_ERROR flush_all not allowed`, as memcached.
    pub flush_enabled: bool,
    /// Which protocol clients speak (memcached `-B`): `auto` (each connection by its first
    /// byte, 0x80 for binary), `ascii` (a binary request is read as text, exactly as
    /// memcached `-B ascii` does) or `binary` (only binary frames; anything else closes
    /// the connection as a bad magic byte does).
    pub binding_protocol: BindingProtocol,
    /// Count gets, hits, sets and deletes per key prefix from the start (`stats detail
    /// on` turns it on at run time; memcached `-D` also turns it on).
    pub detail_enabled: bool,
    /// The byte ending a key's prefix for `stats detail` (memcached `-D`, default `:`).
    pub detail_delimiter: char,
    /// Most prefixes `stats detail` keeps; keys of further prefixes are not counted.
    pub detail_prefixes_max: usize,
    /// Requests one connection may have executed per turn (memcached `-R`, default 20, at
    /// least 1). A connection that reaches it with more input waiting stops, is counted in
    /// `stats` as `conn_yields`, and is served again after the other ready connections, so
    /// one pipelining client cannot starve the rest.
    pub requests_per_event_max: u32,
    /// File of `user:password` lines (memcached `-Y`): clients must log in before anything
    /// else — text connections with memcached's login (`set <any> 0 0 <n>` whose data is
    /// `<user> <password>`), binary ones with SASL PLAIN — and are refused until they do.
    /// Read once at start; a malformed file stops the start. Empty: no authentication.
    pub auth_file: String,
    /// Failed logins one client address may make per `auth_failure_window_secs`; past it
    /// its logins are refused unchecked (a right password too) until the window ends, so
    /// passwords cannot be guessed faster. 0: no limit.
    pub auth_failures_max: u32,
    /// The window of `auth_failures_max`, opened by an address's first failed login.
    pub auth_failure_window_secs: u64,
    /// Client addresses the login limit tracks at once (memory bound); past it, new
    /// addresses are not limited until a window ends (logged).
    pub auth_throttle_addresses_max: usize,
    /// TLS for clients (memcached `-Z` and `-o ssl_*`): `[server.tls]`.
    pub tls: cellcache_io::tls::TlsConfig,
}

/// memcached's `-B`: the protocol(s) a client connection may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BindingProtocol {
    /// Chosen per connection from its first byte (memcached's default).
    #[default]
    Auto,
    /// Text protocol only.
    Ascii,
    /// Binary protocol only.
    Binary,
}

impl BindingProtocol {
    /// The value memcached's `stats settings` reports as `binding_protocol`.
    pub fn memcached_name(self) -> &'static str {
        match self {
            Self::Auto => "auto-negotiate",
            Self::Ascii => "ascii",
            Self::Binary => "binary",
        }
    }
}

impl std::str::FromStr for BindingProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "ascii" => Ok(Self::Ascii),
            "binary" => Ok(Self::Binary),
            other => Err(format!(
                "Invalid value for binding protocol: {other}\n -- should be one of auto, binary, or ascii"
            )),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: ListenAddrs::from(IpAddr::from([127, 0, 0, 1])),
            port: 11211,
            io_engine: IoEngineKind::Auto,
            shutdown_command: false,
            flush_enabled: true,
            binding_protocol: BindingProtocol::Auto,
            detail_enabled: false,
            detail_delimiter: ':',
            detail_prefixes_max: 10_000,
            requests_per_event_max: 20,
            auth_file: String::new(),
            auth_failures_max: 10,
            auth_failure_window_secs: 60,
            auth_throttle_addresses_max: 65_536,
            tls: cellcache_io::tls::TlsConfig::default(),
        }
    }
}

impl ServerConfig {
    /// The first listening address (the one a ring member advertises).
    pub fn addr(&self) -> SocketAddr {
        self.addrs()[0]
    }

    /// Every listening address, in order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.listen.socket_addrs(self.port)
    }

    /// The listeners served without TLS under `tls.enabled` (memcached's `-l notls:ADDR`).
    pub fn plain_addrs(&self) -> Vec<SocketAddr> {
        self.listen.plain_socket_addrs(self.port)
    }
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `tracing` filter directive, e.g. `info` or `cellcache_node=debug,info`.
    pub level: String,
    /// `text` for people, `json` for log pipelines.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Why a configuration was refused. Each message names the file as the user typed it and
/// says the cause once: callers add context, not a restatement.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` path does not exist.
    #[error("config file {path} does not exist")]
    Missing { path: String },
    /// The `--config` path is a directory (or another non-file).
    #[error("config file {path} is not a file")]
    NotAFile { path: String },
    /// The file exists but cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file or the environment does not fit the configuration's shape.
    /// (`error` is deliberately not a `source`: the message already says all of it.)
    #[error("{}", describe(path.as_deref(), error))]
    Load {
        path: Option<String>,
        error: Box<figment::Error>,
    },
    /// A value or a relation between values is out of range.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// figment's messages on one line, each naming where the value came from: the file as the
/// user typed it (figment only knows "TOML source string", since the file is read here), or
/// figment's own name for the environment.
fn describe(path: Option<&str>, e: &figment::Error) -> String {
    e.clone()
        .into_iter()
        .map(|e| {
            let from_file = e
                .metadata
                .as_ref()
                .is_some_and(|m| m.name.contains("TOML source string"));
            let text = e
                .to_string()
                .replace(" in TOML source string", "")
                .replace("key \"default.", "key \"")
                .replace('\n', " ");
            match path {
                Some(p) if from_file => format!("config file {p}: {text}"),
                _ => text,
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Prefix of environment variables that override configuration fields.
pub const ENV_PREFIX: &str = "CELLCACHE_";

impl NodeConfig {
    /// Defaults, then `file` (if any), then `CELLCACHE_*` environment variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        // Every field is `<SECTION>__<FIELD>`; other CELLCACHE_* variables (a wrapper
        // script's, the test harness's) are not configuration and must not be refused.
        let env = Env::prefixed(ENV_PREFIX)
            .filter(|key| key.as_str().contains("__"))
            .split("__");
        Self::load_from(file, env)
    }

    /// Like [`NodeConfig::load`] with an explicit environment provider (tests use it to
    /// avoid racing on the process environment).
    pub fn load_from(file: Option<&Path>, env: Env) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(NodeConfig::default()));
        let mut shown = None;
        if let Some(path) = file {
            // Read here rather than through figment's file provider, which silently skips a
            // missing or unreadable file and a directory, and rewrites the path in messages.
            let typed = path.display().to_string();
            let meta = std::fs::metadata(path).map_err(|source| match source.kind() {
                std::io::ErrorKind::NotFound => ConfigError::Missing {
                    path: typed.clone(),
                },
                _ => ConfigError::Read {
                    path: typed.clone(),
                    source,
                },
            })?;
            if !meta.is_file() {
                return Err(ConfigError::NotAFile { path: typed });
            }
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: typed.clone(),
                source,
            })?;
            figment = figment.merge(Toml::string(&text));
            shown = Some(typed);
        }
        let config: NodeConfig = figment
            .merge(env)
            .extract()
            .map_err(|e| ConfigError::Load {
                path: shown,
                error: Box::new(e),
            })?;
        Ok(config)
    }

    /// Parses a TOML document on top of the defaults (no environment).
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Figment::from(Serialized::defaults(NodeConfig::default()))
            .merge(Toml::string(text))
            .extract()
            .map_err(|e| ConfigError::Load {
                path: None,
                error: Box::new(e),
            })
    }

    /// Checks the relations between limits; a cell refuses to start on failure.
    /// Raises a memory limit below the store's minimum (two slabs and the index per shard)
    /// to that minimum, as memcached gives each slab class its first page past `-m`;
    /// returns the limit asked for when it did. [`crate::Node::start`] logs it.
    pub fn raise_memory_to_minimum(&mut self) -> Option<usize> {
        let min = self.store.memory_limit_min_bytes();
        let asked = self.store.memory_limit_bytes;
        // An item over half the memory is refused (validate), as memcached refuses it.
        (asked < min && !self.item_over_half_the_memory()).then(|| {
            self.store.memory_limit_bytes = min;
            asked
        })
    }

    /// memcached's rule: `-I` may be at most half of `-m`.
    fn item_over_half_the_memory(&self) -> bool {
        self.store.item_size_max_bytes > self.store.memory_limit_bytes / 2
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |e: &dyn std::fmt::Display| ConfigError::Invalid(e.to_string());
        if self.item_over_half_the_memory() {
            return Err(ConfigError::Invalid(format!(
                "item size limit {} (-I, store.item_size_max_bytes) above half the memory limit \
                 {} (-m, store.memory_limit_bytes): Cannot set item size limit higher than 1/2 \
                 of memory max (as memcached)",
                self.store.item_size_max_bytes, self.store.memory_limit_bytes
            )));
        }
        self.io.validate().map_err(|e| invalid(&e))?;
        if self.server.listen.any_plain() && !self.server.tls.enabled {
            return Err(ConfigError::Invalid(
                "'notls' option is valid only when SSL is enabled (-Z, server.tls.enabled)".into(),
            ));
        }
        self.store.validate().map_err(|e| invalid(&e))?;
        self.switching.validate().map_err(|e| invalid(&e))?;
        self.autoscale
            .policy()
            .validate()
            .map_err(|e| invalid(&e))?;
        if !self.cluster.divide.is_empty()
            && self
                .cluster
                .divide
                .parse::<cellcache_cluster::CellId>()
                .is_err()
        {
            return Err(ConfigError::Invalid(format!(
                "cluster.divide {:?} is not a cell id (as `ctl status` prints one)",
                self.cluster.divide
            )));
        }
        if self.autoscale.enabled
            && self.autoscale.provisioner == ProvisionerKind::Command
            && self.autoscale.command.program.is_empty()
        {
            return Err(ConfigError::Invalid(
                "autoscale.provisioner = \"command\" needs autoscale.command.program".into(),
            ));
        }
        let limits = self.protocol_limits();
        limits.validate().map_err(|e| invalid(&e))?;
        if self.io.input_buffer_max_bytes < limits.frame_bytes_max() {
            return Err(ConfigError::Invalid(format!(
                "io.input_buffer_max_bytes ({}) must hold the largest request: a command line \
                 (protocol.line_bytes_max {}) plus a value ({} bytes, from \
                 store.item_size_max_bytes {})",
                self.io.input_buffer_max_bytes,
                limits.line_bytes_max,
                limits.value_bytes_max(),
                limits.item_size_max
            )));
        }
        if !self.server.detail_delimiter.is_ascii()
            || self.server.detail_delimiter.is_ascii_control()
        {
            return Err(ConfigError::Invalid(format!(
                "server.detail_delimiter {:?} must be one printable ASCII character",
                self.server.detail_delimiter
            )));
        }
        if self.server.requests_per_event_max == 0 {
            return Err(ConfigError::Invalid(
                "server.requests_per_event_max must be at least 1 (memcached -R: \"Number of \
                 requests per event must be greater than 0\")"
                    .into(),
            ));
        }
        if let Some(problem) = self.admin.problem() {
            return Err(ConfigError::Invalid(problem));
        }
        if let Some(problem) = self.tier.problem(self.cluster.enabled) {
            return Err(ConfigError::Invalid(problem));
        }
        let c = &self.cluster;
        if !(1..=5).contains(&c.replication_factor) {
            return Err(ConfigError::Invalid(format!(
                "cluster.replication_factor ({}) must be 1..=5",
                c.replication_factor
            )));
        }
        if c.peer_threads == 0 {
            return Err(ConfigError::Invalid(
                "cluster.peer_threads must be at least 1".into(),
            ));
        }
        if c.enabled && c.advertise_host.is_empty() && self.server.listen.first().is_unspecified() {
            return Err(ConfigError::Invalid(format!(
                "server.listen {} cannot be advertised to other cells: set cluster.advertise_host",
                self.server.listen.first()
            )));
        }
        let r = &c.ring;
        if !(r.heartbeat_interval_ms < r.lease_ms && r.lease_ms < r.suspicion_timeout_ms) {
            return Err(ConfigError::Invalid(
                "cluster.ring: heartbeat_interval_ms < lease_ms < suspicion_timeout_ms is required"
                    .into(),
            ));
        }
        // A forwarded request carries a whole item: it must fit one frame. (Replication cuts
        // values over `replication_chunk_bytes` into parts; forwarding does not.)
        let record_max =
            self.store.item_size_max_bytes + cellcache_cluster::wire::payload::KEY_BYTES_MAX + 64;
        if c.enabled && (c.wire.frame_payload_bytes_max as usize) < record_max {
            return Err(ConfigError::Invalid(format!(
                "cluster.wire.frame_payload_bytes_max ({}) must hold the largest item a \
                 forwarded request carries (store.item_size_max_bytes {} + key + 64 bytes)",
                c.wire.frame_payload_bytes_max, self.store.item_size_max_bytes
            )));
        }
        if c.peer_reply_timeout_ms <= c.request_timeout_ms {
            return Err(ConfigError::Invalid(format!(
                "cluster.peer_reply_timeout_ms ({}) must exceed cluster.request_timeout_ms ({}): \
                 a master may hold a reply that long while its backups acknowledge",
                c.peer_reply_timeout_ms, c.request_timeout_ms
            )));
        }
        if c.voters_max == 0
            || c.in_flight_per_connection_max == 0
            || c.peer_queue_bytes_max == 0
            || c.peer_forwards_in_flight_max == 0
            || c.peer_handshake_timeout_ms == 0
            || c.peer_connections_max == 0
        {
            return Err(ConfigError::Invalid(
                "cluster.voters_max, cluster.in_flight_per_connection_max, \
                 cluster.peer_queue_bytes_max, cluster.peer_forwards_in_flight_max, \
                 cluster.peer_handshake_timeout_ms and cluster.peer_connections_max must be > 0"
                    .into(),
            ));
        }
        if c.replication_chunk_bytes == 0
            || c.replication_chunk_bytes > c.wire.frame_payload_bytes_max as usize / 2
        {
            return Err(ConfigError::Invalid(
                "cluster.replication_chunk_bytes must be in 1..=wire.frame_payload_bytes_max/2"
                    .into(),
            ));
        }
        c.tls.check().map_err(ConfigError::Invalid)?;
        Ok(())
    }

    /// memcached's `-I`: items up to `item` bytes as memcached counts them. Whatever must hold
    /// one such item grows with it (a slab, a connection's input buffer, an inter-cell
    /// frame), so `-I 4m` alone starts, as it does on memcached.
    pub fn set_item_size_max(&mut self, item: usize) -> Result<(), ConfigError> {
        if item < cellcache_store::ITEM_SIZE_MAX_MIN_BYTES {
            return Err(ConfigError::Invalid(format!(
                "-I {item}: Item max size cannot be less than 1024 bytes (as memcached)"
            )));
        }
        self.store.item_size_max_bytes = item;
        self.store.slab_size_bytes = self.store.slab_size_bytes.max(item);
        let frame = self.protocol_limits().frame_bytes_max();
        self.io.input_buffer_max_bytes = self.io.input_buffer_max_bytes.max(frame);
        let record = item + cellcache_cluster::wire::payload::KEY_BYTES_MAX + 64;
        let record = u32::try_from(record).map_err(|_| {
            ConfigError::Invalid(format!("-I {item}: too large for an inter-cell frame"))
        })?;
        let wire = &mut self.cluster.wire.frame_payload_bytes_max;
        *wire = (*wire).max(record);
        Ok(())
    }

    /// The parser's limits, derived from the protocol and store sections.
    pub fn protocol_limits(&self) -> cellcache_proto::Limits {
        cellcache_proto::Limits {
            key_bytes_max: self.protocol.key_bytes_max,
            line_bytes_max: self.protocol.line_bytes_max,
            item_size_max: self.store.item_size_max_bytes,
            cas_enabled: self.store.cas_enabled,
            keys_per_get_max: self.protocol.keys_per_get_max,
        }
    }
}

#[cfg(test)]
mod tests;

//! A cell: wires the I/O engine, the memcached protocol, the store and (later) the cluster.
//!
//! Data flow of one request: `io` engine → [`conn`] (a `Session`: framing, pipelining,
//! reply order) → `proto::parse` → [`local`] (executes against the store; [`meta`] for the
//! meta commands, [`stats`] for `stats`) → reply bytes → back to the engine. A binary
//! protocol connection goes through [`binary`], which runs each frame as a meta command on
//! the same path and re-encodes the reply.
//!
//! Architecture invariant: the node is the only crate that reads the clock; it passes
//! `now` into the store once per batch of input.

#![forbid(unsafe_code)]

pub mod admin;
pub mod blocks;
pub mod cell;
pub mod cluster;
pub mod config;
pub mod conn;
pub mod conns;
pub mod counters;
pub mod credentials;
pub mod detail;
pub mod dns;
pub mod latency;
pub mod local;
pub mod memory;
pub mod meta;
pub mod outcome;
pub mod provision;
pub mod stats;
pub mod throttle;
pub mod tier;

use cell::Cell;
use cellcache_io::{RunningEngine, Shutdown};
use config::NodeConfig;
use std::net::SocketAddr;
use std::sync::Arc;

/// Why a cell did not start. Each variant says what failed; its source says why.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Memory(#[from] memory::DoesNotFit),
    #[error(transparent)]
    AuthFile(#[from] credentials::AuthFileError),
    #[error("binding the client port {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("allocating the store")]
    Store(#[source] cellcache_store::ConfigError),
    #[error("joining the ring")]
    Ring(#[source] cluster::StartError),
    #[error("starting the I/O engine")]
    Engine(#[source] cellcache_io::IoError),
    #[error("starting the automatic switching thread")]
    AutoSwitch(#[source] std::io::Error),
    #[error("client TLS (server.tls, memcached -Z)")]
    Tls(#[from] cellcache_io::tls::TlsError),
    #[error(transparent)]
    Admin(#[from] admin::AdminError),
    #[error(transparent)]
    Dns(#[from] dns::DnsError),
    #[error(transparent)]
    Tier(#[from] tier::TierStartError),
}

/// An error and its sources on one line, `outer: cause: root`, each said once (a message
/// that already contains its source's text is not followed by it again): for log lines
/// and replies, where the error's own `Display` gives only the outermost part.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        let text = cause.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = cause.source();
    }
    parts.join(": ")
}

/// A running cell.
pub struct Node {
    pub cell: Arc<Cell>,
    /// The cell's ring membership (empty for a standalone or standby cell).
    pub ring: Arc<cluster::Slot>,
    engine: RunningEngine,
    /// The admin plane (off with `admin.enabled = false`).
    admin: Option<admin::Admin>,
    /// The DNS entry point (on with `dns.port`).
    dns: Option<dns::Dns>,
}

impl Node {
    /// Allocates the store, binds the listener and starts the engine's threads.
    pub fn start(mut config: NodeConfig, shutdown: Shutdown) -> Result<Node, StartError> {
        if let Some(asked) = config.raise_memory_to_minimum() {
            tracing::warn!(
                asked_bytes = asked,
                using_bytes = config.store.memory_limit_bytes,
                "memory limit below the store's minimum (two slabs and the index per shard); \
                 using the minimum"
            );
        }
        config.validate()?;
        memory::check_fits(config.store.memory_limit_bytes)?;
        // Before anything is allocated or bound: a bad auth file is a one-line error.
        let credentials = credentials::Credentials::load(&config.server.auth_file)?;
        // Read and checked before anything else starts: a bad file stops the start here.
        let tls = if config.server.tls.enabled {
            Some(cellcache_io::tls::TlsCerts::load(&config.server.tls)?)
        } else {
            None
        };
        let limits = config.protocol_limits();
        let c = &config.cluster;
        let repl = cluster::repl::Replicator::new(cluster::repl::ReplPolicy {
            accept_unreachable: c.no_backup == config::NoBackupPolicy::Accept,
            chunk_bytes: c.replication_chunk_bytes,
            backlog_bytes_max: c.replication_backlog_bytes_max,
            stream_bytes_per_sec: c.handoff_bytes_per_sec,
            io_timeout: std::time::Duration::from_millis(c.peer_reply_timeout_ms),
            child_lag_bytes_max: c.handoff_lag_bytes_max,
            child_answer_window: std::time::Duration::from_millis(c.ring.lease_ms),
        });
        // Several listeners (-l a,b) share one port, and a ring member's address goes into
        // the map: resolve port 0 to a free port now.
        if config.cluster.enabled || (config.server.port == 0 && config.server.addrs().len() > 1) {
            let at = SocketAddr::new(config.server.listen.first(), config.server.port);
            let bind_error = |source| StartError::Bind { addr: at, source };
            let probe = std::net::TcpListener::bind(at).map_err(bind_error)?;
            config.server.port = probe.local_addr().map_err(bind_error)?.port();
        }
        // Every client address is bound (and the engine chosen) before the ring hears of
        // this cell: a taken port or an engine the kernel refuses fails the start here, not
        // after the ring has put a member into its map that never serves. They listen at
        // once (only then are they this cell's); clients that connect while the cell joins
        // wait in the backlog until the engine accepts, once the cell knows what it owns.
        let bound = cellcache_io::bind(config.server.io_engine, &config.server.addrs(), &config.io)
            .map_err(StartError::Engine)?;
        // The admin port too (client port + 20000 by default): `-p`, or the port the
        // engine's first listener was given for port 0.
        let client = match config.server.port {
            0 => bound.local_addr(),
            port => SocketAddr::new(config.server.listen.first(), port),
        };
        let admin_prepared = admin::prepare(&config.admin, client)?;
        let dns_ready = dns::prepare(&config.dns)?;
        // The tier before the store: its change feed goes to the tier (validate keeps the
        // tier to standalone cells, whose feed has no other reader).
        let tier = if config.tier.enabled() {
            Some(tier::Tier::start(&config.tier)?)
        } else {
            None
        };
        let store = if config.cluster.enabled {
            cellcache_store::Store::with_change_sink(config.store.clone(), repl.clone())
        } else if let Some(t) = &tier {
            cellcache_store::Store::with_change_sink(config.store.clone(), t.clone())
        } else {
            cellcache_store::Store::new(config.store.clone())
        }
        .map_err(StartError::Store)?;
        tracing::info!(
            memory_limit_bytes = config.store.memory_limit_bytes,
            slab_size_bytes = config.store.slab_size_bytes,
            item_size_max_bytes = config.store.item_size_max_bytes,
            "store allocated"
        );
        let engine_config = config.io.clone();
        let mut cell = Cell::new(config, store, limits, shutdown.clone());
        cell.credentials = credentials;
        cell.tier = tier;
        let cell = Arc::new(cell);
        blocks::auto::AutoSwitch::spawn(cell.clone()).map_err(StartError::AutoSwitch)?;
        // The ring next: the engine accepts on the bound client ports once this cell knows
        // what it owns.
        let ring = if cell.config.cluster.enabled && cell.config.cluster.standby {
            tracing::info!("standby: waiting for `ctl split` to bring this cell into a ring");
            Arc::new(cluster::Slot::standby(repl))
        } else {
            let ring = Arc::new(cluster::Slot::default());
            if cell.config.cluster.enabled {
                let join = cell.config.cluster.join.clone();
                // Checked by `validate`: empty or an id.
                let parent = cell.config.cluster.divide.parse().ok();
                cluster::Cluster::start(cell.clone(), repl, &join, parent.as_ref(), &ring)
                    .map_err(StartError::Ring)?;
            }
            ring
        };
        let service = Arc::new(conn::ClientService {
            cell: cell.clone(),
            ring: ring.clone(),
        });
        let engine = match tls {
            Some(certs) => {
                let input_max = engine_config.input_buffer_max_bytes;
                let plain = cell.config.server.plain_addrs();
                let service =
                    cellcache_io::tls::TlsService::new(service, certs.clone(), input_max, plain);
                let stats = service.stats();
                let _ = cell.tls.set(cell::ClientTls { certs, stats });
                cellcache_io::serve(bound, &engine_config, Arc::new(service), shutdown)
            }
            None => cellcache_io::serve(bound, &engine_config, service, shutdown),
        }
        .map_err(StartError::Engine)?;
        cell.conns.set_listeners(&engine.listeners);
        let _ = cell.engine_stats.set(engine.stats.clone());
        let _ = cell.engine.set(engine.engine);
        let admin = admin::start(admin_prepared, cell.clone(), ring.clone())?;
        let dns = dns::start(dns_ready, cell.clone(), ring.clone())?;
        Ok(Node {
            cell,
            ring,
            engine,
            admin,
            dns,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.engine.local_addr
    }

    /// The DNS listener's address, if the DNS entry point runs.
    pub fn dns_addr(&self) -> Option<SocketAddr> {
        self.dns.as_ref().map(|d| d.addr)
    }

    /// The admin listener's address, if the admin plane runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.addr)
    }

    /// Blocks until the engine stopped (after the shutdown was triggered).
    /// Logs what the cell abandons, if it stops in the middle of ring work (a signal stops
    /// a cell promptly in every state; its peers treat what it left undone as after a crash).
    pub fn join(self) {
        self.engine.join();
        if let Some(tier) = &self.cell.tier {
            // A graceful stop hands every dirty write to the store first.
            tier.drain(std::time::Duration::from_millis(
                tier.config.shutdown_flush_timeout_ms,
            ));
        }
        if let Some(admin) = self.admin {
            admin.stop();
        }
        if let Some(cluster) = self.ring.cluster.get() {
            // A ring shut down takes the cells this one started along; a cell absorbed
            // leaves them serving their ranges (the next decider absorbs them in turn).
            if let Some(scale) = cluster.autoscale.get()
                && !cluster.left()
            {
                scale.shutdown();
            }
            let work = cluster.in_progress();
            if !work.is_empty() {
                tracing::warn!("stopped while {}: abandoned", work.join("; "));
            }
        }
        self.ring.stop();
    }
}

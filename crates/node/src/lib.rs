//! A cell: wires the I/O engine, the memcached protocol, the store and (later) the cluster.
//!
//! Data flow of one request: `io` engine → [`conn`] (a `Session`: framing, pipelining,
//! reply order) → `proto::parse` → [`local`] (executes against the store; [`meta`] for the
//! meta commands, [`stats`] for `stats`) → reply bytes → back to the engine.
//!
//! Architecture invariant: the node is the only crate that reads the clock; it passes
//! `now` into the store once per batch of input.

pub mod cell;
pub mod config;
pub mod conn;
pub mod counters;
pub mod local;
pub mod meta;
pub mod stats;

use anyhow::Context;
use cell::Cell;
use cellcache_io::{RunningEngine, Shutdown};
use config::NodeConfig;
use std::net::SocketAddr;
use std::sync::Arc;

/// A running cell.
pub struct Node {
    pub cell: Arc<Cell>,
    engine: RunningEngine,
}

impl Node {
    /// Allocates the store, binds the listener and starts the engine's threads.
    pub fn start(config: NodeConfig, shutdown: Shutdown) -> anyhow::Result<Node> {
        config.validate()?;
        let limits = config.protocol_limits();
        let store =
            cellcache_store::Store::new(config.store.clone()).context("allocating the store")?;
        tracing::info!(
            memory_limit_bytes = config.store.memory_limit_bytes,
            slab_size_bytes = config.store.slab_size_bytes,
            item_size_max_bytes = config.store.item_size_max_bytes,
            "store allocated"
        );
        let addr = config.server.addr();
        let engine_config = config.io.clone();
        let cell = Arc::new(Cell::new(config, store, limits, shutdown.clone()));
        let service = Arc::new(conn::ClientService { cell: cell.clone() });
        let engine = cellcache_io::start(
            cell.config.server.io_engine,
            addr,
            &engine_config,
            service,
            shutdown,
        )
        .context("starting the I/O engine")?;
        let _ = cell.engine_stats.set(engine.stats.clone());
        let _ = cell.engine.set(engine.engine);
        Ok(Node { cell, engine })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.engine.local_addr
    }

    /// Blocks until the engine stopped (after the shutdown was triggered).
    pub fn join(self) {
        self.engine.join();
    }
}

//! Engine configuration: every limit the I/O layer enforces, with memcached-like defaults.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Which engine moves bytes. `auto` picks the best one the kernel allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IoEngineKind {
    #[default]
    Auto,
    Epoll,
}

impl std::str::FromStr for IoEngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "epoll" => Ok(Self::Epoll),
            other => Err(format!(
                "unknown io engine {other:?} (expected auto or epoll)"
            )),
        }
    }
}

/// Limits and knobs shared by all engines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
    /// Connections open at once; past it a new client gets `ERROR Too many open connections`.
    pub max_connections: usize,
    /// Listen backlog passed to `listen(2)`.
    pub listen_backlog: u32,
    /// Bytes read per `read(2)` call into a connection's input buffer.
    pub read_chunk_bytes: usize,
    /// Largest unconsumed input a connection may hold; past it the client is disconnected.
    /// Must exceed the largest frame the protocol accepts (item_size_max + a command line).
    pub input_buffer_max_bytes: usize,
    /// Pending output above which the engine stops reading from the connection.
    pub output_buffer_high_bytes: usize,
    /// Close connections idle this long; 0 disables (memcached's default).
    pub idle_timeout_secs: u64,
    /// How long shutdown waits for in-flight output to drain before closing sockets.
    pub shutdown_grace_millis: u64,
    /// Set TCP_NODELAY on accepted sockets.
    pub tcp_nodelay: bool,
    /// Readiness events fetched per poll call.
    pub events_per_poll: usize,
    /// Largest buffer capacity kept on an idle connection; larger ones are released.
    pub idle_buffer_keep_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 0,
            max_connections: 1024,
            listen_backlog: 1024,
            read_chunk_bytes: 16 * 1024,
            input_buffer_max_bytes: 2 * 1024 * 1024 + 64 * 1024,
            output_buffer_high_bytes: 4 * 1024 * 1024,
            idle_timeout_secs: 0,
            shutdown_grace_millis: 2_000,
            tcp_nodelay: true,
            events_per_poll: 1024,
            idle_buffer_keep_bytes: 64 * 1024,
        }
    }
}

impl EngineConfig {
    /// Worker count after resolving 0 to the number of cores.
    pub fn worker_threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    pub fn idle_timeout(&self) -> Option<Duration> {
        (self.idle_timeout_secs > 0).then(|| Duration::from_secs(self.idle_timeout_secs))
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_millis)
    }

    /// Checks relations between limits; the node refuses to start when this fails.
    pub fn validate(&self) -> Result<(), crate::IoError> {
        let err = |m: &str| Err(crate::IoError::Config(m.to_string()));
        if self.max_connections == 0 {
            return err("max_connections must be at least 1");
        }
        if self.read_chunk_bytes == 0 || self.events_per_poll == 0 {
            return err("read_chunk_bytes and events_per_poll must be at least 1");
        }
        if self.input_buffer_max_bytes < self.read_chunk_bytes {
            return err("input_buffer_max_bytes must be at least read_chunk_bytes");
        }
        if self.output_buffer_high_bytes == 0 {
            return err("output_buffer_high_bytes must be at least 1");
        }
        Ok(())
    }
}

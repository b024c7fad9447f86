//! Engine configuration: every limit the I/O layer enforces, with memcached-like defaults.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Which engine moves bytes. `auto` picks the best one the kernel allows: `uring` when
/// [`crate::uring_support`] succeeds, else `epoll` (the choice and its reason are logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum IoEngineKind {
    #[default]
    Auto,
    /// Blocking sockets, one OS thread per connection (the classic multi-threaded server).
    Threads,
    /// Edge-triggered epoll, one non-blocking event loop per core.
    Epoll,
    /// io_uring, one ring per core: multishot accept/receive, provided buffer rings.
    Uring,
}

impl IoEngineKind {
    /// Every engine a caller can name, `auto` first.
    pub const ALL: [IoEngineKind; 4] = [Self::Auto, Self::Threads, Self::Epoll, Self::Uring];

    /// The name used in configuration files and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Threads => "threads",
            Self::Epoll => "epoll",
            Self::Uring => "uring",
        }
    }
}

impl std::fmt::Display for IoEngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

impl std::str::FromStr for IoEngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!("unknown io engine {s:?} (expected auto, threads, epoll or uring)")
            })
    }
}

/// Smallest connection thread stack accepted: below it ordinary std calls overflow.
const MIN_THREAD_STACK_BYTES: usize = 64 * 1024;
/// The kernel's limit on io_uring submission queue entries.
const MAX_URING_QUEUE_ENTRIES: u32 = 32768;
/// The kernel's limit on entries in one provided buffer ring.
const MAX_URING_PROVIDED_BUFFERS: u16 = 32768;

/// Limits and knobs shared by all engines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Worker threads (`epoll`, `uring`); 0 means one per available core. The `threads`
    /// engine ignores it: it runs one thread per connection.
    pub threads: usize,
    /// Connections open at once; past it a new client gets `ERROR Too many open connections`.
    pub max_connections: usize,
    /// Connections one client address may hold open at once; past it that address's new
    /// connections get the same `ERROR Too many open connections`, so one host (or an
    /// attacker's idle connections) cannot take every `max_connections` slot. 0: half of
    /// `max_connections`; `max_connections` or more: no per-address limit. Clients behind
    /// one NAT or proxy share an address: raise it for them.
    pub connections_per_address_max: usize,
    /// Apply `connections_per_address_max` to loopback clients too. Off by default: a local
    /// user can exhaust the host in other ways, and benchmarks run many connections there.
    pub connections_per_address_loopback: bool,
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
    /// Close a connection that holds part of a request this long without completing it (a
    /// client sending a request byte by byte, or not reading its replies); 0 disables.
    /// Idle connections (nothing pending) are `idle_timeout_secs`'s.
    pub request_timeout_secs: u64,
    /// How long shutdown waits for in-flight output to drain before closing sockets.
    pub shutdown_grace_millis: u64,
    /// Set TCP_NODELAY on accepted sockets.
    pub tcp_nodelay: bool,
    /// Readiness events fetched per poll call.
    pub events_per_poll: usize,
    /// Largest buffer capacity kept on an idle connection; larger ones are released.
    pub idle_buffer_keep_bytes: usize,
    /// `threads` engine: stack size of each connection thread. Sessions run on it, so it
    /// must hold the deepest protocol call chain; memory is reserved lazily by the kernel.
    pub connection_thread_stack_bytes: usize,
    /// `uring` engine: submission queue entries per ring (the completion queue is twice
    /// that; the kernel keeps overflowing completions rather than dropping them).
    pub uring_queue_entries: u32,
    /// `uring` engine: receive buffers of `read_chunk_bytes` each in a worker's provided
    /// buffer ring; a power of two, at most 32768. Memory per worker is the product.
    pub uring_provided_buffers: u16,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            threads: 0,
            max_connections: 1024,
            connections_per_address_max: 0,
            connections_per_address_loopback: false,
            listen_backlog: 1024,
            read_chunk_bytes: 16 * 1024,
            input_buffer_max_bytes: 2 * 1024 * 1024 + 64 * 1024,
            output_buffer_high_bytes: 4 * 1024 * 1024,
            idle_timeout_secs: 0,
            request_timeout_secs: 30,
            shutdown_grace_millis: 2_000,
            tcp_nodelay: true,
            events_per_poll: 1024,
            idle_buffer_keep_bytes: 64 * 1024,
            connection_thread_stack_bytes: 256 * 1024,
            uring_queue_entries: 1024,
            uring_provided_buffers: 256,
        }
    }
}

impl EngineConfig {
    /// How many connections a client at `ip` may hold (`connections_per_address_max`);
    /// `None` when only `max_connections` applies to it.
    pub fn address_limit(&self, ip: std::net::IpAddr) -> Option<usize> {
        if ip.to_canonical().is_loopback() && !self.connections_per_address_loopback {
            return None;
        }
        let limit = match self.connections_per_address_max {
            0 => (self.max_connections / 2).max(1),
            n => n,
        };
        (limit < self.max_connections).then_some(limit)
    }

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

    /// [`EngineConfig::request_timeout_secs`], `None` when off.
    pub fn request_timeout(&self) -> Option<Duration> {
        (self.request_timeout_secs > 0).then(|| Duration::from_secs(self.request_timeout_secs))
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
        if self.connection_thread_stack_bytes < MIN_THREAD_STACK_BYTES {
            return err("connection_thread_stack_bytes must be at least 64 KiB");
        }
        if self.uring_queue_entries == 0 || self.uring_queue_entries > MAX_URING_QUEUE_ENTRIES {
            return err("uring_queue_entries must be between 1 and 32768");
        }
        if !self.uring_provided_buffers.is_power_of_two()
            || self.uring_provided_buffers > MAX_URING_PROVIDED_BUFFERS
        {
            return err("uring_provided_buffers must be a power of two, at most 32768");
        }
        if u32::try_from(self.read_chunk_bytes).is_err() {
            return err("read_chunk_bytes must fit in 32 bits");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_round_trip_through_fromstr_and_display() {
        for kind in IoEngineKind::ALL {
            assert_eq!(kind.to_string().parse::<IoEngineKind>(), Ok(kind));
        }
        assert!("kqueue".parse::<IoEngineKind>().is_err());
    }

    #[test]
    fn engine_kind_and_config_deserialize_as_the_toml_file_writes_them() {
        let kind: IoEngineKind = serde_json::from_str("\"uring\"").unwrap();
        assert_eq!(kind, IoEngineKind::Uring);
        assert!(serde_json::from_str::<IoEngineKind>("\"Uring\"").is_err());
        let config: EngineConfig =
            serde_json::from_str(r#"{"threads": 3, "uring_provided_buffers": 64}"#).unwrap();
        assert_eq!(config.threads, 3);
        assert_eq!(config.uring_provided_buffers, 64);
        assert_eq!(
            config.max_connections,
            EngineConfig::default().max_connections
        );
        assert!(serde_json::from_str::<EngineConfig>(r#"{"thread": 3}"#).is_err());
    }

    #[test]
    fn defaults_validate_and_bad_uring_limits_do_not() {
        assert!(EngineConfig::default().validate().is_ok());
        let odd = EngineConfig {
            uring_provided_buffers: 300,
            ..Default::default()
        };
        assert!(odd.validate().is_err());
        let tiny_stack = EngineConfig {
            connection_thread_stack_bytes: 1024,
            ..Default::default()
        };
        assert!(tiny_stack.validate().is_err());
    }
}

//! The cache tier's settings (`[tier]`): which durable store the cell fronts, when a write
//! is acknowledged, and the write-back engine's limits. See docs/tier.md.

use serde::{Deserialize, Serialize};

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum WritePolicy {
    /// After the backing store has it durably (default).
    #[default]
    Through,
    /// From memory; flushed in the background within `write_back_window_ms`.
    Back,
}

impl std::str::FromStr for WritePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "through" => Ok(WritePolicy::Through),
            "back" => Ok(WritePolicy::Back),
            _ => Err(format!("write policy {s:?}: expected through or back")),
        }
    }
}

impl WritePolicy {
    /// Its name in the configuration and in `stats`.
    pub fn name(self) -> &'static str {
        match self {
            WritePolicy::Through => "through",
            WritePolicy::Back => "back",
        }
    }
}

/// `[tier]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TierConfig {
    /// The durable store behind the cell: `redb:PATH` (an embedded file, one per cell) or
    /// `postgres://user@host:port/db`. Empty: none (a plain cache).
    pub backing_store: String,
    /// `through`: a write is acknowledged once the store has it durably; `back`: at once,
    /// flushed within `write_back_window_ms`.
    pub write_policy: WritePolicy,
    /// Write-back: how long a written key stays dirty before its flush is due (writes to it
    /// meanwhile cost one store write). A crash of the cell loses at most this much.
    pub write_back_window_ms: u64,
    /// Bytes (keys and values) written and not yet confirmed by the store, at most; past
    /// it writes get `SERVER_ERROR` until the store catches up. Both policies.
    pub write_back_max_dirty_bytes: usize,
    /// Keys in one store transaction at most.
    pub flush_batch_items_max: usize,
    /// Bytes of values in one store transaction, about (a batch holds at least one key).
    pub flush_batch_bytes_max: usize,
    /// Store transactions in flight at once.
    pub flush_batches_in_flight_max: usize,
    /// Keys written to the store per second at most; 0: unthrottled.
    pub flush_items_per_sec_max: u64,
    /// The pause after a failed store write, doubled per consecutive failure.
    pub retry_backoff_initial_ms: u64,
    /// The longest pause between retries.
    pub retry_backoff_max_ms: u64,
    /// Write-through: how long a client waits for the store to confirm its write before it
    /// gets `SERVER_ERROR` (the write stays dirty and is still flushed).
    pub write_through_timeout_ms: u64,
    /// How long a read-through load may take before the waiting requests get
    /// `SERVER_ERROR` (the load is abandoned; nothing is cached from it).
    pub load_timeout_ms: u64,
    /// Keys being loaded at once; past it a missing key gets `SERVER_ERROR`.
    pub loads_in_flight_max: usize,
    /// How long a key the store does not have is answered as a miss without asking the
    /// store again; 0: never cached.
    pub negative_cache_ms: u64,
    /// Keys remembered as absent at most.
    pub negative_cache_keys_max: usize,
    /// PostgreSQL: the table (created if missing; a plain identifier).
    pub postgres_table: String,
    /// PostgreSQL: connections in the pool.
    pub postgres_pool_size: usize,
    /// PostgreSQL: bound on connecting and on waiting for a pooled connection.
    pub postgres_timeout_ms: u64,
    /// A graceful stop (SIGTERM, `shutdown`) waits this long at most for the store to take
    /// every dirty write before the process exits.
    pub shutdown_flush_timeout_ms: u64,
    /// Threads of the tier's runtime (loads and flushes; redb's calls run on its blocking
    /// pool).
    pub runtime_threads: usize,
}

impl Default for TierConfig {
    fn default() -> Self {
        TierConfig {
            backing_store: String::new(),
            write_policy: WritePolicy::Through,
            write_back_window_ms: 1000,
            write_back_max_dirty_bytes: 64 << 20,
            flush_batch_items_max: 256,
            flush_batch_bytes_max: 4 << 20,
            flush_batches_in_flight_max: 2,
            flush_items_per_sec_max: 0,
            retry_backoff_initial_ms: 50,
            retry_backoff_max_ms: 5000,
            write_through_timeout_ms: 5000,
            load_timeout_ms: 5000,
            loads_in_flight_max: 4096,
            negative_cache_ms: 0,
            negative_cache_keys_max: 65_536,
            postgres_table: "cellcache_items".into(),
            postgres_pool_size: 8,
            postgres_timeout_ms: 5000,
            shutdown_flush_timeout_ms: 10_000,
            runtime_threads: 2,
        }
    }
}

impl TierConfig {
    /// Whether a backing store is configured.
    pub fn enabled(&self) -> bool {
        !self.backing_store.is_empty()
    }

    /// Why these settings cannot run, if they cannot.
    pub fn problem(&self, ring: bool) -> Option<String> {
        if !self.enabled() {
            return None;
        }
        if let Err(e) = cellcache_tier::Spec::parse(&self.backing_store) {
            return Some(format!("tier.backing_store: {e}"));
        }
        if ring {
            return Some(
                "tier.backing_store needs a standalone cell (--standalone, cluster.enabled = \
                 false): the tier does not run in a ring yet (docs/tier.md, what remains)"
                    .into(),
            );
        }
        if let Err(e) = cellcache_tier::check_table_name(&self.postgres_table) {
            return Some(e.to_string());
        }
        let zero = [
            (
                "write_back_max_dirty_bytes",
                self.write_back_max_dirty_bytes,
            ),
            ("flush_batch_items_max", self.flush_batch_items_max),
            ("flush_batch_bytes_max", self.flush_batch_bytes_max),
            (
                "flush_batches_in_flight_max",
                self.flush_batches_in_flight_max,
            ),
            ("loads_in_flight_max", self.loads_in_flight_max),
            ("postgres_pool_size", self.postgres_pool_size),
            ("runtime_threads", self.runtime_threads),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, v)| *v == 0) {
            return Some(format!("tier.{name} must be at least 1"));
        }
        let zero_ms = [
            ("write_through_timeout_ms", self.write_through_timeout_ms),
            ("load_timeout_ms", self.load_timeout_ms),
            ("postgres_timeout_ms", self.postgres_timeout_ms),
            ("retry_backoff_initial_ms", self.retry_backoff_initial_ms),
        ];
        if let Some((name, _)) = zero_ms.iter().find(|(_, v)| *v == 0) {
            return Some(format!("tier.{name} must be at least 1"));
        }
        if self.retry_backoff_max_ms < self.retry_backoff_initial_ms {
            return Some("tier.retry_backoff_max_ms is below retry_backoff_initial_ms".into());
        }
        None
    }

    /// The write-back engine's settings under `policy` (write-through flushes at once).
    pub fn engine(&self, policy: WritePolicy) -> cellcache_tier::WriteBackConfig {
        cellcache_tier::WriteBackConfig {
            window_ms: match policy {
                WritePolicy::Through => 0,
                WritePolicy::Back => self.write_back_window_ms,
            },
            dirty_bytes_max: self.write_back_max_dirty_bytes,
            batch_items_max: self.flush_batch_items_max,
            batch_bytes_max: self.flush_batch_bytes_max,
            batches_in_flight_max: self.flush_batches_in_flight_max,
            items_per_sec_max: self.flush_items_per_sec_max,
            backoff_initial_ms: self.retry_backoff_initial_ms,
            backoff_max_ms: self.retry_backoff_max_ms,
        }
    }

    /// PostgreSQL's settings.
    pub fn postgres(&self) -> cellcache_tier::PostgresConfig {
        cellcache_tier::PostgresConfig {
            table: self.postgres_table.clone(),
            pool_size: self.postgres_pool_size,
            timeout: std::time::Duration::from_millis(self.postgres_timeout_ms),
        }
    }
}

//! Store configuration: every limit of the store, with documented defaults and validation.

use serde::{Deserialize, Serialize};

/// How the store is split across worker threads (SPEC H1: switchable later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Layout {
    /// One arena, index and eviction order behind one lock.
    #[default]
    Shared,
    /// `shards` independent shards, each with `memory_limit / shards` bytes and its own lock;
    /// a key's shard is chosen from hash bits that are mixed, not the ring's high bits.
    Partitioned {
        /// Number of shards (≥ 1).
        shards: usize,
    },
}

/// Which slab is cleared when space is needed (SPEC M3, H1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum EvictionPolicyKind {
    /// Seed 001's slab-level LRU: the least recently used slab.
    #[default]
    SlabLru,
    /// Among the `candidates` least recently used slabs, the one with fewest live bytes
    /// (dead space from deletes/overwrites is cleared first, hot data kept longer).
    LeastLiveOfLru {
        /// How many LRU-tail slabs are compared (≥ 1).
        candidates: usize,
    },
    /// Slabs cleared in FIFO order, but a victim slab keeps (compacts) the items read since
    /// they were written and drops only the unread ones.
    SecondChanceFifo,
}

impl std::fmt::Display for EvictionPolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvictionPolicyKind::SlabLru => write!(f, "slab_lru"),
            EvictionPolicyKind::LeastLiveOfLru { candidates } => {
                write!(f, "least_live_of_lru({candidates})")
            }
            EvictionPolicyKind::SecondChanceFifo => write!(f, "second_chance_fifo"),
        }
    }
}

/// Configuration of a [`crate::Store`]. Deserializable so the node's TOML embeds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Total bytes for arena plus index, allocated at start. Default 64 MiB.
    pub memory_limit_bytes: usize,
    /// Slab size in bytes. Default 1 MiB.
    pub slab_size_bytes: usize,
    /// Largest value accepted, ≤ `slab_size_bytes` minus the largest header. Default 1 MiB
    /// minus [`ITEM_HEADER_RESERVE_BYTES`] so that a value of this size still fits a slab.
    pub item_size_max_bytes: usize,
    /// Layout of shards. Default shared.
    pub layout: Layout,
    /// Eviction policy. Default slab LRU.
    pub eviction: EvictionPolicyKind,
    /// Mean arena bytes per item (header + key + value) the index is sized for: the index gets
    /// enough slots for `arena / index_item_bytes_expected` items at `index_load_target`.
    /// Smaller items than this fill the index first, which then evicts like the arena does.
    /// Default 120 (≈ 100-byte values with short keys).
    pub index_item_bytes_expected: usize,
    /// Fraction of index slots expected to be used, in permille. Default 950.
    pub index_load_target_permille: u32,
    /// Cuckoo displacements tried before the index counts as full. Default 500.
    pub index_kicks_max: usize,
    /// A full slab whose dead bytes exceed this fraction (permille) of its size is compacted
    /// in place before any slab is evicted. 1000 disables compaction. Default 250.
    pub compaction_dead_permille: u32,
}

/// Bytes reserved for the largest item header so that an `item_size_max_bytes` value with a
/// 250-byte key still fits a slab: ctrl, key_len, value_len varint, flags, expiry, cas varint,
/// key.
pub const ITEM_HEADER_RESERVE_BYTES: usize = 2 + 5 + 4 + 4 + 10 + KEY_LEN_MAX;

/// Smallest slab accepted.
pub const SLAB_SIZE_MIN_BYTES: usize = 1 << 10;
/// Largest slab accepted: offsets and lengths inside a slab are 32-bit.
pub const SLAB_SIZE_MAX_BYTES: usize = 1 << 30;
/// Upper bound of `index_kicks_max` (its undo path is preallocated).
pub const INDEX_KICKS_MAX_LIMIT: usize = 100_000;

/// Longest key (SPEC D1).
pub const KEY_LEN_MAX: usize = 250;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            memory_limit_bytes: 64 << 20,
            slab_size_bytes: 1 << 20,
            item_size_max_bytes: (1 << 20) - ITEM_HEADER_RESERVE_BYTES,
            layout: Layout::Shared,
            eviction: EvictionPolicyKind::SlabLru,
            index_item_bytes_expected: 120,
            index_load_target_permille: 950,
            index_kicks_max: 500,
            compaction_dead_permille: 250,
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Slab size must be in 1 KiB..=1 GiB (offsets inside a slab are 32-bit).
    #[error("slab_size_bytes {0} out of range (1024..=2^30)")]
    SlabSize(usize),
    /// Each shard needs at least two slabs' worth of memory.
    #[error(
        "memory_limit_bytes {limit} too small for {shards} shard(s) of 2 slabs of {slab} bytes plus index"
    )]
    MemoryTooSmall {
        /// configured limit
        limit: usize,
        /// shard count
        shards: usize,
        /// slab size
        slab: usize,
    },
    /// Arena offsets must fit in 40 bits.
    #[error("memory_limit_bytes {0} above 2^40 per shard")]
    MemoryTooLarge(usize),
    /// The largest item must fit one slab.
    #[error("item_size_max_bytes {item} + header reserve {reserve} exceeds slab_size_bytes {slab}")]
    ItemSizeMax {
        /// configured item size max
        item: usize,
        /// header reserve
        reserve: usize,
        /// slab size
        slab: usize,
    },
    /// Partitioned layout needs at least one shard.
    #[error("layout partitioned needs shards >= 1")]
    Shards,
    /// Index sizing values out of range.
    #[error("index sizing invalid: {0}")]
    IndexSizing(&'static str),
    /// Compaction threshold out of range.
    #[error("compaction_dead_permille {0} above 1000")]
    Compaction(u32),
    /// Eviction policy parameter invalid.
    #[error("eviction policy candidates must be >= 1")]
    EvictionCandidates,
    /// The system refused the memory for the arena and index at start.
    #[error(
        "the system refused {bytes} bytes for the store (memory_limit_bytes {limit}): not that much memory is available"
    )]
    OutOfMemory {
        /// bytes of the allocation refused
        bytes: usize,
        /// memory_limit_bytes
        limit: usize,
    },
    /// A run-time limit above the memory preallocated at start.
    #[error("memory limit {requested} above the {allocated} bytes preallocated at start")]
    MemoryLimitAboveArena {
        /// requested bytes
        requested: usize,
        /// memory_limit_bytes at start
        allocated: usize,
    },
}

impl StoreConfig {
    /// Number of shards the layout asks for.
    pub fn shard_count(&self) -> usize {
        match self.layout {
            Layout::Shared => 1,
            Layout::Partitioned { shards } => shards,
        }
    }

    /// Checks every relation between the limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let slab = self.slab_size_bytes;
        if !(SLAB_SIZE_MIN_BYTES..=SLAB_SIZE_MAX_BYTES).contains(&slab) {
            return Err(ConfigError::SlabSize(slab));
        }
        if self.item_size_max_bytes + ITEM_HEADER_RESERVE_BYTES > slab {
            return Err(ConfigError::ItemSizeMax {
                item: self.item_size_max_bytes,
                reserve: ITEM_HEADER_RESERVE_BYTES,
                slab,
            });
        }
        let shards = self.shard_count();
        if shards == 0 {
            return Err(ConfigError::Shards);
        }
        if self.index_item_bytes_expected == 0 {
            return Err(ConfigError::IndexSizing(
                "index_item_bytes_expected must be > 0",
            ));
        }
        if !(100..=1000).contains(&self.index_load_target_permille) {
            return Err(ConfigError::IndexSizing(
                "index_load_target_permille must be 100..=1000",
            ));
        }
        if !(1..=INDEX_KICKS_MAX_LIMIT).contains(&self.index_kicks_max) {
            return Err(ConfigError::IndexSizing(
                "index_kicks_max must be in 1..=100000",
            ));
        }
        if self.compaction_dead_permille > 1000 {
            return Err(ConfigError::Compaction(self.compaction_dead_permille));
        }
        if let EvictionPolicyKind::LeastLiveOfLru { candidates: 0 } = self.eviction {
            return Err(ConfigError::EvictionCandidates);
        }
        let per_shard = self.memory_limit_bytes / shards;
        if per_shard > 1 << 40 {
            return Err(ConfigError::MemoryTooLarge(self.memory_limit_bytes));
        }
        let sizing = crate::shard::ShardSizing::compute(self, per_shard);
        if sizing.slab_count < 2 || sizing.index_buckets == 0 {
            return Err(ConfigError::MemoryTooSmall {
                limit: self.memory_limit_bytes,
                shards,
                slab,
            });
        }
        Ok(())
    }
}

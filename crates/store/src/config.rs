//! Store configuration: every limit of the store, with documented defaults and validation.

use serde::{Deserialize, Serialize};

/// How the store is split across worker threads (one interface for both, so a later mediator
/// can switch between them).
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

/// Which slab is cleared when space is needed, and what happens to its items.
///
/// In TOML either a name — `"lru"` (also `"slab_lru"`), `"s3fifo"`, `"second_chance_fifo"` —
/// which takes the policy's defaults, or a table `{ kind = "...", ... }` with its parameters.
/// Names are what `CELLCACHE_STORE__EVICTION=s3fifo` and `--eviction s3fifo` give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionPolicyKind {
    /// Slab-level LRU: the least recently used slab.
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
    /// S3-FIFO (Yang et al., SOSP '23) at slab granularity: new items land in a small
    /// probationary FIFO of slabs; clearing its oldest slab moves the items accessed since
    /// they were written into the main FIFO's open slab and drops the rest, remembering
    /// their key hashes in a ghost table (a key written again while remembered goes to
    /// main); main slabs are cleared the same way, items with accesses left staying in main.
    S3Fifo {
        /// Share of the slabs in use the small queue may hold before it is cleared first,
        /// per mille (1..=900). Default 100.
        small_permille: u32,
        /// Ghost table entries (4 bytes each, carved out of the arena as whole slabs) per
        /// index slot, per mille; 0 disables the ghost. Default 900.
        ghost_permille: u32,
    },
}

impl EvictionPolicyKind {
    /// S3-FIFO with its default parameters.
    pub const S3FIFO: EvictionPolicyKind = EvictionPolicyKind::S3Fifo {
        small_permille: 100,
        ghost_permille: 900,
    };

    /// The policy's short name: what TOML, `--eviction` and `ctl switch` call it.
    pub fn name(&self) -> &'static str {
        match self {
            EvictionPolicyKind::SlabLru => "lru",
            EvictionPolicyKind::LeastLiveOfLru { .. } => "least_live_of_lru",
            EvictionPolicyKind::SecondChanceFifo => "second_chance_fifo",
            EvictionPolicyKind::S3Fifo { .. } => "s3fifo",
        }
    }

    /// The policy a name stands for, with its default parameters.
    pub fn from_name(name: &str) -> Option<EvictionPolicyKind> {
        Some(match name {
            "lru" | "slab_lru" => EvictionPolicyKind::SlabLru,
            "least_live_of_lru" => EvictionPolicyKind::LeastLiveOfLru { candidates: 8 },
            "second_chance_fifo" => EvictionPolicyKind::SecondChanceFifo,
            "s3fifo" => EvictionPolicyKind::S3FIFO,
            _ => return None,
        })
    }
}

impl std::str::FromStr for EvictionPolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        EvictionPolicyKind::from_name(s).ok_or_else(|| {
            format!(
                "unknown eviction policy {s:?} (lru, s3fifo, second_chance_fifo, least_live_of_lru)"
            )
        })
    }
}

/// The table form of [`EvictionPolicyKind`] in TOML.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", deny_unknown_fields)]
enum PolicyTable {
    #[serde(alias = "lru")]
    SlabLru,
    LeastLiveOfLru {
        candidates: usize,
    },
    SecondChanceFifo,
    S3fifo {
        #[serde(default = "small_permille_default")]
        small_permille: u32,
        #[serde(default = "ghost_permille_default")]
        ghost_permille: u32,
    },
}

fn small_permille_default() -> u32 {
    100
}
fn ghost_permille_default() -> u32 {
    900
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PolicyRepr {
    Name(String),
    Table(PolicyTable),
}

impl Serialize for EvictionPolicyKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            EvictionPolicyKind::SlabLru
            | EvictionPolicyKind::SecondChanceFifo
            | EvictionPolicyKind::S3Fifo {
                small_permille: 100,
                ghost_permille: 900,
            } => s.serialize_str(self.name()),
            EvictionPolicyKind::LeastLiveOfLru { candidates } => {
                PolicyTable::LeastLiveOfLru { candidates }.serialize(s)
            }
            EvictionPolicyKind::S3Fifo {
                small_permille,
                ghost_permille,
            } => PolicyTable::S3fifo {
                small_permille,
                ghost_permille,
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for EvictionPolicyKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match PolicyRepr::deserialize(d)? {
            PolicyRepr::Name(name) => name.parse().map_err(serde::de::Error::custom)?,
            PolicyRepr::Table(PolicyTable::SlabLru) => EvictionPolicyKind::SlabLru,
            PolicyRepr::Table(PolicyTable::LeastLiveOfLru { candidates }) => {
                EvictionPolicyKind::LeastLiveOfLru { candidates }
            }
            PolicyRepr::Table(PolicyTable::SecondChanceFifo) => {
                EvictionPolicyKind::SecondChanceFifo
            }
            PolicyRepr::Table(PolicyTable::S3fifo {
                small_permille,
                ghost_permille,
            }) => EvictionPolicyKind::S3Fifo {
                small_permille,
                ghost_permille,
            },
        })
    }
}

impl std::fmt::Display for EvictionPolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EvictionPolicyKind::LeastLiveOfLru { candidates } => {
                write!(f, "least_live_of_lru({candidates})")
            }
            EvictionPolicyKind::S3Fifo {
                small_permille,
                ghost_permille,
            } => write!(f, "s3fifo(small {small_permille}, ghost {ghost_permille})"),
            other => f.write_str(other.name()),
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
    /// Largest item, counted as memcached 1.6 counts it (its `-I`, `item_size_max`): an item
    /// fits when [`item_size_bytes`] of its key, value and flags is at most this. At most
    /// `slab_size_bytes` (an item is never split across slabs) and at least 1024 (memcached's
    /// floor). Default 1 MiB, memcached's default.
    pub item_size_max_bytes: usize,
    /// Evict to make room (memcached's default). Off (memcached `-M`): a write that finds no
    /// free space, after reclaiming dead and expired space by compaction, fails with
    /// [`crate::StoreError::OutOfMemory`] (`SERVER_ERROR out of memory storing object`)
    /// instead of clearing a slab or an index slot of live items. Default on.
    pub evictions: bool,
    /// Items carry a CAS unique in memcached's accounting (memcached `-C` turns it off: each
    /// item counts [`ITEM_CAS_BYTES`] less against `item_size_max_bytes`). cellcache keeps a
    /// CAS per item either way (replication orders versions by it); the protocol layer hides
    /// it when this is off. Default on.
    pub cas_enabled: bool,
    /// Layout of shards. Default shared.
    pub layout: Layout,
    /// Eviction policy. Default slab LRU (`"lru"`).
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

/// Bytes memcached 1.6 counts for an item beyond its key and value: its item header with the
/// CAS field, the key's terminating NUL and the value's `\r\n` (measured on 1.6.18: with a
/// 1-byte key and `-I 1m` the largest value is 1 048 516 = 1 048 576 − 1 − 59).
pub const ITEM_OVERHEAD_BYTES: usize = 59;
/// Extra bytes memcached counts when an item's client flags are not 0.
pub const ITEM_FLAGS_BYTES: usize = 4;
/// Bytes of [`ITEM_OVERHEAD_BYTES`] that are the CAS field, which memcached `-C` drops
/// (measured: `-C -I 1m` takes 1 048 524 with a 1-byte key).
pub const ITEM_CAS_BYTES: usize = 8;
/// Smallest `item_size_max_bytes` accepted (memcached: "Item max size cannot be less than
/// 1024 bytes").
pub const ITEM_SIZE_MAX_MIN_BYTES: usize = 1024;

// cellcache's own encoding of an item is never longer than memcached's accounting of it, so
// an item that passes the memcached check fits a slab of `item_size_max_bytes`.
const _: () = assert!(crate::item::HEADER_BYTES_MAX <= ITEM_OVERHEAD_BYTES);

/// The size memcached 1.6 accounts to an item against `item_size_max` (its `-I`):
/// key + value + [`ITEM_OVERHEAD_BYTES`], + [`ITEM_FLAGS_BYTES`] when `flags` ≠ 0,
/// − [`ITEM_CAS_BYTES`] without CAS (`-C`).
pub fn item_size_bytes(key_len: usize, value_len: usize, flags: u32, cas: bool) -> usize {
    let flags_bytes = if flags != 0 { ITEM_FLAGS_BYTES } else { 0 };
    let cas_saved = if cas { 0 } else { ITEM_CAS_BYTES };
    key_len
        .saturating_add(value_len)
        .saturating_add(ITEM_OVERHEAD_BYTES + flags_bytes - cas_saved)
}

/// Smallest slab accepted.
pub const SLAB_SIZE_MIN_BYTES: usize = 1 << 10;
/// Largest slab accepted: offsets and lengths inside a slab are 32-bit.
pub const SLAB_SIZE_MAX_BYTES: usize = 1 << 30;
/// Upper bound of `index_kicks_max` (its undo path is preallocated).
pub const INDEX_KICKS_MAX_LIMIT: usize = 100_000;

/// Longest key (memcached's 250 bytes).
pub const KEY_LEN_MAX: usize = cellcache_keyspace::KEY_BYTES_MAX;

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            memory_limit_bytes: 64 << 20,
            slab_size_bytes: 1 << 20,
            item_size_max_bytes: 1 << 20,
            evictions: true,
            cas_enabled: true,
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
    /// The largest item must fit one slab, and be at least 1024 bytes (as memcached).
    #[error("item_size_max_bytes {item} must be in 1024..=slab_size_bytes ({slab})")]
    ItemSizeMax {
        /// configured item size max
        item: usize,
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
    /// S3-FIFO parameters out of range.
    #[error("s3fifo needs small_permille in 1..=900 and ghost_permille in 0..=4000")]
    S3Fifo,
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
        if !(ITEM_SIZE_MAX_MIN_BYTES..=slab).contains(&self.item_size_max_bytes) {
            return Err(ConfigError::ItemSizeMax {
                item: self.item_size_max_bytes,
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
        if let EvictionPolicyKind::S3Fifo {
            small_permille,
            ghost_permille,
        } = self.eviction
        {
            if !(1..=900).contains(&small_permille) || ghost_permille > 4000 {
                return Err(ConfigError::S3Fifo);
            }
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

    /// The smallest `memory_limit_bytes` these settings accept: per shard, two slabs and
    /// the index that goes with them.
    pub fn memory_limit_min_bytes(&self) -> usize {
        let shards = self.shard_count().max(1);
        let fits = |budget: usize| {
            let s = crate::shard::ShardSizing::compute(self, budget);
            s.slab_count >= 2 && s.index_buckets > 0
        };
        let mut hi = 2 * self.slab_size_bytes.max(1);
        while !fits(hi) {
            hi *= 2;
        }
        let mut lo = 0;
        // The sizing grows with the budget: the first budget that fits.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) { hi = mid } else { lo = mid }
        }
        hi * shards
    }

    /// Whether an item of this key, value and flags is within `item_size_max_bytes`, as
    /// memcached decides it ([`item_size_bytes`]).
    pub fn item_fits(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        item_size_bytes(key_len, value_len, flags, self.cas_enabled) <= self.item_size_max_bytes
    }

    /// Largest value an item can hold (1-byte key, flags 0).
    pub fn value_bytes_max(&self) -> usize {
        let overhead = item_size_bytes(1, 0, 0, self.cas_enabled);
        self.item_size_max_bytes.saturating_sub(overhead)
    }
}

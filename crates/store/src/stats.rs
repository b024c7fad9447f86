//! Counters for memcached's `stats`, `stats items` and `stats slabs`.

/// Store-wide statistics (sums over shards at the moment of the call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Items currently indexed (may include expired items not yet reclaimed).
    pub curr_items: u64,
    /// Items ever stored.
    pub total_items: u64,
    /// Arena bytes of live items (headers included).
    pub bytes: u64,
    /// Arena bytes written but no longer live (deleted/overwritten/expired, awaiting reuse).
    pub dead_bytes: u64,
    /// Items removed by slab eviction.
    pub evicted_items: u64,
    /// Slabs cleared by eviction.
    pub evicted_slabs: u64,
    /// Evicted items that were never read.
    pub evicted_unfetched: u64,
    /// Expired items found and reclaimed (on access or while clearing a slab), and items
    /// dropped by `flush_all` (their memory is reclaimed at once).
    pub reclaimed: u64,
    /// Expired items that were never read.
    pub expired_unfetched: u64,
    /// Slabs compacted in place.
    pub compactions: u64,
    /// Items kept by a second-chance eviction (read since written, compacted instead of dropped).
    pub second_chance_items: u64,
    /// Dead bytes recovered by compaction.
    pub compacted_bytes: u64,
    /// Items an S3-FIFO clearing kept (moved to the main queue, or kept there) because
    /// accesses were counted for them.
    pub promoted_items: u64,
    /// New items S3-FIFO's ghost table remembered (dropped from its small queue unread and
    /// written again soon): they go to the main queue.
    pub ghost_hits: u64,
    /// Slabs holding S3-FIFO's ghost table instead of items.
    pub slabs_ghost: u64,
    /// Key hashes S3-FIFO's ghost table can hold.
    pub ghost_entries: u64,
    /// Slabs on the free list.
    pub slabs_free: u64,
    /// Slabs on the partial list.
    pub slabs_partial: u64,
    /// Slabs on the full list.
    pub slabs_full: u64,
    /// Arena bytes (all shards).
    pub arena_bytes: u64,
    /// Index bytes (all shards).
    pub index_bytes: u64,
    /// Index slots (all shards).
    pub index_slots: u64,
    /// Configured memory limit.
    pub memory_limit_bytes: u64,
    /// Last CAS handed out.
    pub cas_counter: u64,
    /// Get hits / misses.
    pub get_hits: u64,
    /// Get misses.
    pub get_misses: u64,
    /// Get misses that found the item expired (memcached's `get_expired`).
    pub get_expired: u64,
    /// Items evicted from a full index bucket pair to make room for a new key.
    pub index_full_evictions: u64,
    /// Number of shards.
    pub shards: u64,
}

/// Per-shard counters, summed into [`Stats`].
#[derive(Debug, Clone, Default)]
pub(crate) struct ShardCounters {
    pub total_items: u64,
    pub evicted_items: u64,
    pub evicted_slabs: u64,
    pub evicted_unfetched: u64,
    pub reclaimed: u64,
    pub expired_unfetched: u64,
    pub compactions: u64,
    pub compacted_bytes: u64,
    pub second_chance_items: u64,
    pub promoted_items: u64,
    pub ghost_hits: u64,
    pub get_hits: u64,
    pub get_misses: u64,
    pub get_expired: u64,
    pub index_full_evictions: u64,
}

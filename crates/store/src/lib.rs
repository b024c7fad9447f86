//! cellcache-store: the in-memory store of one cell — a preallocated slab arena with byte-packed
//! items, a cuckoo index that can enumerate key-hash ranges, slab-level eviction, expiry, and a
//! change feed. No I/O and no clock: `now` (unix seconds, ≥ 1) is passed to every operation.
//!
//! Guarantees: memory stays within `memory_limit_bytes` (arena + index) plus
//! [`Store::overhead_bytes_max`]; a read never returns a stale or foreign value; an evicted or
//! expired key is simply absent; every mutation is reported in order to the [`ChangeSink`].
//! See docs/store.md for the layout and the reasons behind it.

#![forbid(unsafe_code)]

mod config;
mod eviction;
mod expiry;
mod feed;
mod ghost;
mod index;
mod item;
mod ops;
mod prealloc;
mod shard;
mod slab;
mod stats;
mod store;

pub use cellcache_keyspace::{HashRange, key_hash};
pub use config::{
    ConfigError, EvictionPolicyKind, INDEX_KICKS_MAX_LIMIT, ITEM_CAS_BYTES, ITEM_FLAGS_BYTES,
    ITEM_OVERHEAD_BYTES, ITEM_SIZE_MAX_MIN_BYTES, KEY_LEN_MAX, Layout, SLAB_SIZE_MAX_BYTES,
    SLAB_SIZE_MIN_BYTES, StoreConfig, item_size_bytes,
};
pub use eviction::{
    Clearing, EvictionPolicy, LeastLiveOfLru, S3Fifo, SecondChanceFifo, SlabLru, SlabView,
};
pub use expiry::{Expiry, RELATIVE_EXPTIME_MAX_SECS};
pub use feed::{Change, ChangeKind, ChangeSink};
pub use ops::{
    ArithOutcome, ArithRequest, DeleteOptions, DeleteOutcome, ItemView, OwnedItem, ReadOptions,
    StoreError, WriteMode, WriteOutcome, WriteRequest,
};
pub use slab::SlabId;
pub use stats::Stats;
pub use store::{DropStep, FillOutcome, ScanCursor, Store};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn store_is_send_sync() {
        assert_send_sync::<Store>();
    }
}

//! Change feed: every mutation, in order, for a later replication layer (backups, range
//! hand-off, re-replication after a cell leaves).
//!
//! A [`ChangeSink`] installed at construction is called synchronously, under the lock of the
//! shard that applied the mutation, with the item's full resulting state. Sequence numbers come
//! from one store-wide counter taken under that lock, so for any one key (one shard) the order
//! of calls equals the order of sequence numbers equals the order of application; calls from
//! different shards may arrive concurrently. Evictions, expiry reclaim, range drops and read-side
//! bits (fetched, win token) are local cache decisions and are not reported. A sink must be fast
//! and must not call back into the store (it would deadlock on the shard lock).

use crate::expiry::Expiry;
use cellcache_keyspace::HashRange;

/// One mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind<'a> {
    /// The key now holds exactly this item.
    Put {
        /// key
        key: &'a [u8],
        /// value
        value: &'a [u8],
        /// client flags
        flags: u32,
        /// expiry
        expiry: Expiry,
        /// CAS
        cas: u64,
        /// invalidated (meta I)
        stale: bool,
    },
    /// The key was deleted.
    Delete {
        /// key
        key: &'a [u8],
    },
    /// The key's expiry changed (CAS unchanged).
    Touch {
        /// key
        key: &'a [u8],
        /// new expiry
        expiry: Expiry,
    },
    /// Every item whose key hash is in `range` was invalidated (flush_all taking effect;
    /// `HashRange::FULL` for a whole store). Emitted once, with every shard lock held, so it
    /// is ordered against all other changes.
    Flush {
        /// The hashes flushed.
        range: HashRange,
    },
}

/// A mutation with its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change<'a> {
    /// Store-wide unique, increasing within a shard.
    pub seq: u64,
    /// What changed.
    pub kind: ChangeKind<'a>,
}

/// Receives the change feed.
pub trait ChangeSink: Send + Sync {
    /// Called in order under the shard lock (every shard's, for a flush): it must not call
    /// into the store, nor take a lock that is held anywhere while the store is called.
    fn record(&self, change: &Change<'_>);
}

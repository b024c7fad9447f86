//! Requests, outcomes and errors of store operations.
//!
//! Cache outcomes (`Stored`, `NotStored`, `Exists`, `NotFound`) are values; operating failures
//! (too large, out of memory, non-numeric) are [`StoreError`]s.

use crate::expiry::Expiry;

/// Which storage command a [`WriteRequest`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Store unconditionally (`set`; `cas` is `Set` with `compare_cas`).
    Set,
    /// Store only if absent.
    Add,
    /// Store only if present.
    Replace,
    /// Append to a present value; keeps its flags and expiry.
    Append,
    /// Prepend to a present value; keeps its flags and expiry.
    Prepend,
}

/// One write covering set/add/replace/append/prepend/cas and meta `ms`.
#[derive(Debug, Clone, Copy)]
pub struct WriteRequest<'a> {
    /// Storage command.
    pub mode: WriteMode,
    /// Key, 1..=250 bytes.
    pub key: &'a [u8],
    /// Value (or the part to append/prepend).
    pub value: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// Expiry (see [`Expiry::from_protocol`]).
    pub expiry: Expiry,
    /// Store only if the current item's CAS equals this (`cas` command, meta `C`).
    pub compare_cas: Option<u64>,
    /// Give the stored item this CAS instead of a fresh one (replication, meta `E`).
    pub new_cas: Option<u64>,
    /// Meta `I`: when `compare_cas` is older than the item's CAS, store anyway but mark stale.
    pub invalidate: bool,
}

impl<'a> WriteRequest<'a> {
    /// A plain `set` with no flags and no expiry.
    pub fn set(key: &'a [u8], value: &'a [u8]) -> WriteRequest<'a> {
        WriteRequest {
            mode: WriteMode::Set,
            key,
            value,
            flags: 0,
            expiry: Expiry::NEVER,
            compare_cas: None,
            new_cas: None,
            invalidate: false,
        }
    }
}

/// Result of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Stored with this CAS.
    Stored {
        /// CAS of the stored item.
        cas: u64,
    },
    /// Condition of add/replace/append/prepend not met.
    NotStored,
    /// `compare_cas` did not match.
    Exists,
    /// `compare_cas` given but the key is absent.
    NotFound,
}

/// Options of a delete.
#[derive(Debug, Clone, Copy, Default)]
pub struct DeleteOptions {
    /// Delete only if the item's CAS equals this.
    pub compare_cas: Option<u64>,
    /// Meta `md I`: mark the item stale instead of removing it. As memcached, the stale
    /// item gets a new CAS (`new_cas` when given, meta `E`), so a writer holding the old CAS
    /// can still store over it with `ms I`.
    pub invalidate: bool,
    /// CAS for the invalidated item (meta `md E`); a fresh one when `None`.
    pub new_cas: Option<u64>,
}

/// Result of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Removed (or marked stale).
    Deleted,
    /// Absent.
    NotFound,
    /// CAS mismatch.
    Exists,
}

/// incr / decr and meta `ma`.
#[derive(Debug, Clone, Copy)]
pub struct ArithRequest {
    /// Amount.
    pub delta: u64,
    /// `decr` (floors at 0) instead of `incr` (wraps at 2^64).
    pub decrement: bool,
    /// Meta `ma N`: create a missing item with this value and expiry.
    pub autovivify: Option<(u64, Expiry)>,
    /// Apply only if the item's CAS equals this.
    pub compare_cas: Option<u64>,
    /// Give the result this CAS (replication).
    pub new_cas: Option<u64>,
}

impl ArithRequest {
    /// Plain `incr delta`.
    pub fn incr(delta: u64) -> ArithRequest {
        ArithRequest {
            delta,
            decrement: false,
            autovivify: None,
            compare_cas: None,
            new_cas: None,
        }
    }
    /// Plain `decr delta`.
    pub fn decr(delta: u64) -> ArithRequest {
        ArithRequest {
            decrement: true,
            ..ArithRequest::incr(delta)
        }
    }
}

/// Result of incr/decr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithOutcome {
    /// New value and CAS.
    Value {
        /// value after the operation
        value: u64,
        /// new CAS
        cas: u64,
        /// The item was missing and created from `autovivify` (meta `ma N`): memcached's
        /// quiet mode still answers that, unlike an ordinary success.
        created: bool,
    },
    /// Absent.
    NotFound,
    /// CAS mismatch.
    Exists,
}

/// Options of a read (get, gets, gat, mg).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Set a new expiry before reading (gat/gats, mg `T`).
    pub touch: Option<crate::Expiry>,
    /// Do not set the fetched bit or move the slab in LRU order (mg without bump).
    pub no_bump: bool,
    /// Meta: claim the win token if nobody holds it yet (reported in [`ItemView::won`]).
    pub claim_win: bool,
}

/// A borrowed view of an item, valid inside the read callback only (the shard lock is held, so
/// its slab cannot be evicted, compacted or reused meanwhile).
#[derive(Debug, Clone, Copy)]
pub struct ItemView<'a> {
    /// Key bytes.
    pub key: &'a [u8],
    /// Value bytes.
    pub value: &'a [u8],
    /// Client flags.
    pub flags: u32,
    /// CAS unique.
    pub cas: u64,
    /// Expiry.
    pub expiry: Expiry,
    /// Was read before this access (mg `h`).
    pub fetched_before: bool,
    /// Marked stale by an invalidation (mg `X`).
    pub stale: bool,
    /// This read claimed the win token (mg `W`).
    pub won: bool,
    /// Someone else holds the win token (mg `Z`).
    pub win_token_taken: bool,
    /// Unix second of the last access to the item's slab before this one (per slab, mg `l`).
    pub slab_last_access_secs: u32,
    /// Bytes the item takes in the arena (mg `s` reports value length; this is footprint).
    pub item_bytes: usize,
    /// Stored through a base64 key (meta `b`; see [`crate::Store::mark_key_binary`]).
    pub key_binary: bool,
}

/// An item copied out of the store (range hand-off, replication snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedItem {
    /// Key.
    pub key: Vec<u8>,
    /// Value.
    pub value: Vec<u8>,
    /// Client flags.
    pub flags: u32,
    /// Expiry.
    pub expiry: Expiry,
    /// CAS.
    pub cas: u64,
    /// Stale (invalidated) state.
    pub stale: bool,
}

impl OwnedItem {
    /// Copies a view.
    pub fn from_view(v: &ItemView<'_>) -> OwnedItem {
        OwnedItem {
            key: v.key.to_vec(),
            value: v.value.to_vec(),
            flags: v.flags,
            expiry: v.expiry,
            cas: v.cas,
            stale: v.stale,
        }
    }
}

/// Operating failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The item, counted as memcached counts it ([`crate::item_size_bytes`]), is above
    /// `item_size_max_bytes` (or the result of append/prepend/incr would be).
    #[error("object too large for cache: item of {len} bytes > item_size_max {max}")]
    TooLarge {
        /// the item's size as memcached counts it (key + value + overhead)
        len: usize,
        /// the limit
        max: usize,
    },
    /// Key empty or longer than 250 bytes.
    #[error("key length {0} not in 1..=250")]
    KeyLength(usize),
    /// No space could be made (index or arena).
    #[error("out of memory storing object")]
    OutOfMemory,
    /// incr/decr on a value that is not a decimal u64.
    #[error("cannot increment or decrement non-numeric value")]
    NonNumeric,
}

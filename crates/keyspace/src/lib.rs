//! cellcache-keyspace: what every other crate must agree on about keys, defined once.
//!
//! - [`key_hash`]: a key's position on the 64-bit hash ring. The store indexes by it, the
//!   ring places by it, a hand-off selects by it: one function, or cells would disagree
//!   about which keys a range holds.
//! - [`HashRange`]: an inclusive arc of that ring (what a cell masters, what a flush or a
//!   hand-off covers).
//! - [`KEY_BYTES_MAX`]: the longest key (memcached's 250 bytes), which the parser, the
//!   store, the inter-cell codec and the benchmark client all hold to.

#![forbid(unsafe_code)]

pub mod range;

pub use range::{HashRange, RangeError};

/// The longest key, in bytes (memcached's `KEY_MAX_LENGTH`).
pub const KEY_BYTES_MAX: usize = 250;

/// The 64-bit ring position of a key: xxh3-64 of its bytes.
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is part of the ring's format: cells of different builds must agree on it.
    #[test]
    fn the_key_hash_is_xxh3_64() {
        assert_eq!(key_hash(b""), 0x2d06_8005_38d3_94c2);
        assert_ne!(key_hash(b"a"), key_hash(b"b"));
    }
}

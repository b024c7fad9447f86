//! Key names: a fixed prefix followed by the key's index, zero-padded to a fixed width.
//!
//! Every key of a space has the same length, so `--key-len 14` means exactly 14 bytes on the
//! wire, which the capacity experiment relies on. Writing a key appends to a caller buffer and
//! allocates nothing.
//!
//! A space may be confined to a range of the key-hash ring (`--key-hash-range`, the range a
//! cell of a ring masters as `ctl status` prints it): its keys are then the first `count`
//! numbers whose name hashes into the range, so a load can be sent to a key's master alone
//! (direct) or to another cell only (every request forwarded).

use std::sync::Arc;

use cellcache_keyspace::{HashRange, key_hash};
use thiserror::Error;

/// Why a key space is invalid.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("the key space needs at least one key")]
    Empty,
    #[error("key prefix {0:?} contains a space or control character")]
    BadPrefix(String),
    #[error("keys would be {len} bytes; memcached allows at most {max}")]
    TooLong { len: usize, max: usize },
    #[error(
        "only {found} of {count} keys hash into {range} among the first {scanned} names: \
         the range is too narrow for that many keys"
    )]
    RangeTooNarrow {
        range: HashRange,
        count: u64,
        found: u64,
        scanned: u64,
    },
}

/// A range-confined space scans at most this many names per key it needs: a range holding
/// 1/64 of the ring needs 64 on average, so only ranges far narrower than any cell's are
/// refused.
const RANGE_SCAN_PER_KEY_MAX: u64 = 1024;

/// memcached's key length limit.
pub use cellcache_keyspace::KEY_BYTES_MAX;

/// `count` keys named `<prefix><index>` with the index zero-padded to `width` digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: Vec<u8>,
    count: u64,
    width: usize,
    /// Confined to a hash range: the range, and key `i`'s number in the name.
    within: Option<(HashRange, Arc<[u64]>)>,
}

fn digits(mut n: u64) -> usize {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

impl KeySpace {
    /// A space of `count` keys; `key_len`, when given, pads keys to at least that many bytes.
    pub fn new(prefix: &str, count: u64, key_len: Option<usize>) -> Result<Self, KeyError> {
        if count == 0 {
            return Err(KeyError::Empty);
        }
        if prefix.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(KeyError::BadPrefix(prefix.to_owned()));
        }
        let min_width = digits(count - 1);
        let width = key_len.map_or(min_width, |len| {
            len.saturating_sub(prefix.len()).max(min_width)
        });
        let len = prefix.len() + width;
        if len > KEY_BYTES_MAX {
            return Err(KeyError::TooLong {
                len,
                max: KEY_BYTES_MAX,
            });
        }
        Ok(Self {
            prefix: prefix.as_bytes().to_vec(),
            count,
            width,
            within: None,
        })
    }

    /// A space of `count` keys whose names all hash into `range`: the first `count` numbers
    /// in ascending order whose name does. The names are as wide as the numbers scanned need
    /// (at least `key_len`, when given), and every key still has the same length.
    pub fn within(
        prefix: &str,
        count: u64,
        key_len: Option<usize>,
        range: HashRange,
    ) -> Result<Self, KeyError> {
        let scan_max = count.saturating_mul(RANGE_SCAN_PER_KEY_MAX);
        // Wide enough for every number the scan may reach, so widths never change midway.
        let names = Self::new(prefix, scan_max, key_len)?;
        let mut numbers = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        let mut name = Vec::with_capacity(names.key_len());
        let mut scanned = 0;
        while scanned < scan_max && (numbers.len() as u64) < count {
            name.clear();
            names.write_key(scanned, &mut name);
            if range.contains(key_hash(&name)) {
                numbers.push(scanned);
            }
            scanned += 1;
        }
        if (numbers.len() as u64) < count {
            return Err(KeyError::RangeTooNarrow {
                range,
                count,
                found: numbers.len() as u64,
                scanned,
            });
        }
        Ok(Self {
            count,
            within: Some((range, numbers.into())),
            ..names
        })
    }

    /// The hash range the keys are confined to, if any.
    pub fn hash_range(&self) -> Option<HashRange> {
        self.within.as_ref().map(|(r, _)| *r)
    }

    /// Number of keys.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Length in bytes of every key.
    pub fn key_len(&self) -> usize {
        self.prefix.len() + self.width
    }

    /// Appends key number `index` (taken modulo the key count) to `out`.
    pub fn write_key(&self, index: u64, out: &mut Vec<u8>) {
        let i = index % self.count;
        let mut n = match &self.within {
            // `i < count == numbers.len()`.
            Some((_, numbers)) => numbers[i as usize],
            None => i,
        };
        out.extend_from_slice(&self.prefix);
        let start = out.len();
        out.resize(start + self.width, b'0');
        for slot in out[start..].iter_mut().rev() {
            *slot = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
    }

    /// Key number `index` as a new vector (convenience for tests and one-off requests).
    pub fn key(&self, index: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.key_len());
        self.write_key(index, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_fixed_length_and_distinct_names() {
        let space = KeySpace::new("key:", 1000, None).unwrap();
        assert_eq!(space.key(0), b"key:000");
        assert_eq!(space.key(999), b"key:999");
        assert_eq!(space.key(1000), b"key:000", "indices wrap");
        let padded = KeySpace::new("k", 500_000, Some(14)).unwrap();
        assert_eq!(padded.key_len(), 14);
        assert_eq!(padded.key(123_456), b"k0000000123456");
        let all: std::collections::HashSet<_> = (0..1000).map(|i| space.key(i)).collect();
        assert_eq!(all.len(), 1000);
    }

    #[test]
    fn a_confined_space_names_only_keys_of_its_range() {
        let quarter = HashRange::new(0x4000_0000_0000_0000, 0x7fff_ffff_ffff_ffff);
        let space = KeySpace::within("k", 2000, Some(10), quarter).unwrap();
        assert_eq!(space.count(), 2000);
        assert_eq!(space.hash_range(), Some(quarter));
        let keys: std::collections::HashSet<_> = (0..2000).map(|i| space.key(i)).collect();
        assert_eq!(keys.len(), 2000, "distinct names");
        for k in &keys {
            assert_eq!(k.len(), space.key_len());
            assert!(k.len() >= 10);
            assert!(quarter.contains(key_hash(k)), "{k:?} outside the range");
        }
        // The complement gets none of them.
        let rest = KeySpace::within(
            "k",
            2000,
            Some(10),
            HashRange::new(0x8000_0000_0000_0000, 0x3fff_ffff_ffff_ffff),
        )
        .unwrap();
        assert!((0..2000).all(|i| !keys.contains(&rest.key(i))));
        assert_eq!(space.key(2000), space.key(0), "indices wrap");
    }

    #[test]
    fn a_range_too_narrow_is_refused() {
        let one_hash = HashRange::new(7, 7);
        assert!(matches!(
            KeySpace::within("k", 3, None, one_hash),
            Err(KeyError::RangeTooNarrow {
                found: 0,
                scanned: 3072,
                ..
            })
        ));
    }

    #[test]
    fn rejects_bad_spaces() {
        assert_eq!(
            KeySpace::new("a b", 1, None),
            Err(KeyError::BadPrefix("a b".into()))
        );
        assert_eq!(KeySpace::new("a", 0, None), Err(KeyError::Empty));
        assert!(matches!(
            KeySpace::new("a", 10, Some(300)),
            Err(KeyError::TooLong { .. })
        ));
    }
}

//! Key names: a fixed prefix followed by the key's index, zero-padded to a fixed width.
//!
//! Every key of a space has the same length, so `--key-len 14` means exactly 14 bytes on the
//! wire, which the capacity experiment relies on. Writing a key appends to a caller buffer and
//! allocates nothing.

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
}

/// memcached's key length limit.
pub use cellcache_keyspace::KEY_BYTES_MAX;

/// `count` keys named `<prefix><index>` with the index zero-padded to `width` digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: Vec<u8>,
    count: u64,
    width: usize,
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
        })
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
        let mut n = index % self.count;
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

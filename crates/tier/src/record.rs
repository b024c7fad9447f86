//! What a backing store holds per key, and the operations the tier sends it.
//!
//! A record is the item as a client sees it: value, client flags and expiry (absolute unix
//! seconds, 0 = never). CAS values are the cell's and are not stored: a record loaded after a
//! restart gets a fresh CAS. The embedded store keeps a record as one byte string
//! ([`Record::encode`]): flags and expiry as little-endian u32s, then the value.

use std::sync::Arc;

/// One key's durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The value's bytes.
    pub value: Arc<[u8]>,
    /// memcached's client flags.
    pub flags: u32,
    /// Absolute unix seconds at which the item expires; 0 = never.
    pub expiry_unix: u32,
}

/// Bytes of a record's header in its encoded form.
const HEADER_BYTES: usize = 8;

impl Record {
    /// Whether the record has expired at `now_unix` (it is then as good as absent).
    pub fn expired(&self, now_unix: u32) -> bool {
        self.expiry_unix != 0 && self.expiry_unix <= now_unix
    }

    /// The embedded store's byte form.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.value.len());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.expiry_unix.to_le_bytes());
        out.extend_from_slice(&self.value);
        out
    }

    /// Reads [`Record::encode`]'s form back.
    pub fn decode(bytes: &[u8]) -> Option<Record> {
        let flags = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
        let expiry_unix = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
        Some(Record {
            value: Arc::from(&bytes[HEADER_BYTES..]),
            flags,
            expiry_unix,
        })
    }
}

/// An op and the key it is for.
pub type KeyedOp = (Arc<[u8]>, Op);

/// A change to send to the backing store. Each is the key's whole new state except
/// `Touch`, which changes only the expiry of what the store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// The key now holds this record.
    Put(Record),
    /// The key is gone (deleted, or expired).
    Delete,
    /// The key's expiry changed (touch, gat).
    Touch {
        /// The new expiry, absolute unix seconds; 0 = never.
        expiry_unix: u32,
    },
}

impl Op {
    /// The bytes this op holds in memory (its value), for the dirty-bytes bound.
    pub fn value_bytes(&self) -> usize {
        match self {
            Op::Put(r) => r.value.len(),
            Op::Delete | Op::Touch { .. } => 0,
        }
    }

    /// `self` followed by `later`, as one op: the later state wins, except that a touch
    /// after a put changes the put's expiry (a touch after a delete cannot happen: a touch
    /// of an absent key changes nothing, so the feed never reports one).
    pub fn then(self, later: Op) -> Op {
        match (self, later) {
            (Op::Put(mut r), Op::Touch { expiry_unix }) => {
                r.expiry_unix = expiry_unix;
                Op::Put(r)
            }
            (_, later) => later,
        }
    }

    /// The op to send at `now_unix`: a put whose item has expired meanwhile is sent as a
    /// delete (expiries flush as deletes).
    pub fn at(self, now_unix: u32) -> Op {
        match self {
            Op::Put(r) if r.expired(now_unix) => Op::Delete,
            op => op,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(v: &[u8], expiry_unix: u32) -> Record {
        Record {
            value: Arc::from(v),
            flags: 7,
            expiry_unix,
        }
    }

    #[test]
    fn encode_decode_round_trip() {
        let r = rec(b"hello", 99);
        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode(b"short"), None);
    }

    #[test]
    fn then_keeps_the_later_state() {
        let put = Op::Put(rec(b"a", 0));
        assert_eq!(
            put.clone().then(Op::Touch { expiry_unix: 5 }),
            Op::Put(rec(b"a", 5))
        );
        assert_eq!(put.clone().then(Op::Delete), Op::Delete);
        assert_eq!(Op::Delete.then(put.clone()), put);
        assert_eq!(
            Op::Touch { expiry_unix: 1 }.then(Op::Touch { expiry_unix: 2 }),
            Op::Touch { expiry_unix: 2 }
        );
    }

    #[test]
    fn expired_puts_flush_as_deletes() {
        assert_eq!(Op::Put(rec(b"a", 10)).at(10), Op::Delete);
        assert_eq!(Op::Put(rec(b"a", 11)).at(10), Op::Put(rec(b"a", 11)));
        assert_eq!(Op::Put(rec(b"a", 0)).at(10), Op::Put(rec(b"a", 0)));
    }
}

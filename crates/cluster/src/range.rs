//! Contiguous ranges of the 64-bit key-hash ring.
//!
//! A [`HashRange`] is an inclusive arc `[start, end]` walked clockwise from `start`, so it may
//! wrap past `u64::MAX` back to 0. Because both bounds are inclusive, a range is never empty,
//! and the full ring is the range whose `end` is just before its `start` (e.g. `[0, u64::MAX]`
//! or `[7, 6]`). Every operation is total: nothing here panics or overflows; lengths are
//! `u128` because the full ring holds 2^64 hashes.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a range operation is impossible.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize,
)]
pub enum RangeError {
    /// A range of one hash cannot be divided.
    #[error("range {0} holds a single hash and cannot be split")]
    TooSmall(HashRange),
    /// Two ranges that are not adjacent (first's end + 1 == second's start) cannot merge.
    #[error("ranges {0} and {1} are not adjacent")]
    NotAdjacent(HashRange, HashRange),
}

/// An inclusive, clockwise arc of the hash ring; see the module docs. The derived order
/// (by `start`, then `end`) only exists so ranges can key sorted collections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HashRange {
    /// First hash in the range.
    pub start: u64,
    /// Last hash in the range (inclusive); smaller than `start` when the range wraps.
    pub end: u64,
}

impl HashRange {
    /// The whole ring, `[0, u64::MAX]`: what the first cell masters.
    pub const FULL: HashRange = HashRange {
        start: 0,
        end: u64::MAX,
    };

    /// The arc from `start` clockwise to `end`, both included.
    pub fn new(start: u64, end: u64) -> Self {
        HashRange { start, end }
    }

    /// Number of hashes in the range, 1 ..= 2^64.
    pub fn len(&self) -> u128 {
        u128::from(self.end.wrapping_sub(self.start)) + 1
    }

    /// Ranges are never empty; provided for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether this range is the whole ring.
    pub fn is_full(&self) -> bool {
        self.end.wrapping_add(1) == self.start
    }

    /// Whether the arc passes from `u64::MAX` to 0.
    pub fn wraps(&self) -> bool {
        self.end < self.start
    }

    /// Whether `hash` lies on the arc.
    pub fn contains(&self, hash: u64) -> bool {
        hash.wrapping_sub(self.start) <= self.end.wrapping_sub(self.start)
    }

    /// Whether every hash of `other` lies in `self`.
    pub fn covers(&self, other: &HashRange) -> bool {
        // Measure both arcs as offsets from our start; other fits iff its far end does.
        let offset = u128::from(other.start.wrapping_sub(self.start));
        offset + other.len() <= self.len()
    }

    /// Whether the two arcs share at least one hash.
    pub fn overlaps(&self, other: &HashRange) -> bool {
        self.contains(other.start) || other.contains(self.start)
    }

    /// Cell division: the first half stays with the parent, the second half goes to the child.
    /// For odd lengths the parent keeps the smaller half.
    pub fn split_in_half(&self) -> Result<(HashRange, HashRange), RangeError> {
        let len = self.len();
        if len < 2 {
            return Err(RangeError::TooSmall(*self));
        }
        // len / 2 <= 2^63, so it fits in u64.
        let first_len = (len / 2) as u64;
        let first = HashRange::new(self.start, self.start.wrapping_add(first_len - 1));
        let second = HashRange::new(self.start.wrapping_add(first_len), self.end);
        Ok((first, second))
    }

    /// Absorption: `self` followed by the adjacent `next` as one arc.
    pub fn merge(&self, next: &HashRange) -> Result<HashRange, RangeError> {
        if self.end.wrapping_add(1) != next.start || self.len() + next.len() > 1u128 << 64 {
            return Err(RangeError::NotAdjacent(*self, *next));
        }
        Ok(HashRange::new(self.start, next.end))
    }
}

impl fmt::Display for HashRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#018x}, {:#018x}]", self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn full_ring_and_wrap() {
        assert!(HashRange::FULL.is_full());
        assert_eq!(HashRange::FULL.len(), 1u128 << 64);
        let wrap = HashRange::new(u64::MAX - 1, 1);
        assert!(wrap.wraps());
        assert_eq!(wrap.len(), 4);
        for h in [u64::MAX - 1, u64::MAX, 0, 1] {
            assert!(wrap.contains(h));
        }
        assert!(!wrap.contains(2) && !wrap.contains(u64::MAX - 2));
        assert!(HashRange::new(7, 6).is_full());
    }

    #[test]
    fn split_full_and_single() {
        let (a, b) = HashRange::FULL.split_in_half().unwrap();
        assert_eq!(a, HashRange::new(0, (1 << 63) - 1));
        assert_eq!(b, HashRange::new(1 << 63, u64::MAX));
        assert_eq!(a.merge(&b).unwrap(), HashRange::FULL);
        assert!(HashRange::new(5, 5).split_in_half().is_err());
        let (a, b) = HashRange::new(u64::MAX, 0).split_in_half().unwrap();
        assert_eq!(
            (a, b),
            (HashRange::new(u64::MAX, u64::MAX), HashRange::new(0, 0))
        );
        assert!(HashRange::new(0, 3).merge(&HashRange::new(5, 6)).is_err());
        // A full ring cannot absorb anything more.
        assert!(
            HashRange::new(0, u64::MAX)
                .merge(&HashRange::new(0, 0))
                .is_err()
        );
    }

    fn arb_range() -> impl Strategy<Value = HashRange> {
        prop_oneof![
            (any::<u64>(), any::<u64>()).prop_map(|(s, e)| HashRange::new(s, e)),
            (any::<u64>(), 0u64..4).prop_map(|(s, l)| HashRange::new(s, s.wrapping_add(l))),
            (u64::MAX - 8..=u64::MAX, 0u64..16)
                .prop_map(|(s, l)| HashRange::new(s, s.wrapping_add(l))),
        ]
    }

    proptest! {
        #[test]
        fn split_partitions_the_range(r in arb_range(), h in any::<u64>()) {
            if let Ok((a, b)) = r.split_in_half() {
                prop_assert_eq!(a.len() + b.len(), r.len());
                prop_assert!(a.len() <= b.len() && b.len() - a.len() <= 1);
                prop_assert!(!a.overlaps(&b));
                prop_assert_eq!(a.merge(&b).unwrap(), r);
                prop_assert_eq!(r.contains(h), a.contains(h) || b.contains(h));
                prop_assert!(r.covers(&a) && r.covers(&b));
                prop_assert!(!a.covers(&r) && !a.covers(&b));
                for edge in [r.start, r.end, a.end, b.start] {
                    prop_assert!(a.contains(edge) != b.contains(edge));
                }
            } else {
                prop_assert_eq!(r.len(), 1);
            }
        }

        #[test]
        fn overlap_is_symmetric_and_matches_membership(a in arb_range(), b in arb_range()) {
            prop_assert_eq!(a.overlaps(&b), b.overlaps(&a));
            // Any shared edge point proves overlap; a non-overlap means no edge is shared.
            let shared = [a.start, a.end, b.start, b.end].iter().any(|&h| a.contains(h) && b.contains(h));
            prop_assert_eq!(a.overlaps(&b), shared);
        }

        #[test]
        fn contains_matches_walk(r in arb_range(), off in 0u64..64) {
            let inside = r.start.wrapping_add(off);
            prop_assert_eq!(r.contains(inside), u128::from(off) < r.len());
        }
    }
}

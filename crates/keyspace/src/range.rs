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

    /// The hashes in both arcs, as at most two arcs (two when one arc wraps into both ends
    /// of the other).
    pub fn intersect(&self, other: &HashRange) -> Vec<HashRange> {
        let mut out = Vec::new();
        for (a0, a1) in self.segments() {
            for (b0, b1) in other.segments() {
                let (lo, hi) = (a0.max(b0), a1.min(b1));
                if lo <= hi {
                    out.push((lo, hi));
                }
            }
        }
        join_segments(out)
    }

    /// The hashes of `self` that are not in `other`, as at most two arcs.
    pub fn minus(&self, other: &HashRange) -> Vec<HashRange> {
        let mut out = Vec::new();
        for (a0, a1) in self.segments() {
            let mut pieces = vec![(a0, a1)];
            for (b0, b1) in other.segments() {
                pieces = pieces
                    .into_iter()
                    .flat_map(|(p0, p1)| {
                        let mut rest = Vec::new();
                        if b1 < p0 || b0 > p1 {
                            rest.push((p0, p1));
                        } else {
                            if b0 > p0 {
                                rest.push((p0, b0 - 1));
                            }
                            if b1 < p1 {
                                rest.push((b1 + 1, p1));
                            }
                        }
                        rest
                    })
                    .collect();
            }
            out.extend(pieces);
        }
        join_segments(out)
    }

    /// The arc as one or two non-wrapping segments `(lo, hi)`, `lo <= hi`.
    fn segments(&self) -> Vec<(u64, u64)> {
        if self.is_full() {
            vec![(0, u64::MAX)]
        } else if self.wraps() {
            vec![(self.start, u64::MAX), (0, self.end)]
        } else {
            vec![(self.start, self.end)]
        }
    }

    /// The parts of the ring that none of `keep` covers, as non-wrapping ranges (what a cell
    /// may drop once it holds only `keep`).
    pub fn gaps(keep: &[HashRange]) -> Vec<HashRange> {
        let mut spans: Vec<(u64, u64)> = keep.iter().flat_map(|r| r.segments()).collect();
        spans.sort_unstable();
        let mut out = Vec::new();
        let mut next: u64 = 0;
        for (s, e) in spans {
            if s > next {
                out.push(HashRange::new(next, s - 1));
            }
            if e == u64::MAX {
                return out;
            }
            next = next.max(e + 1);
        }
        out.push(HashRange::new(next, u64::MAX));
        out
    }

    /// Absorption: `self` followed by the adjacent `next` as one arc.
    pub fn merge(&self, next: &HashRange) -> Result<HashRange, RangeError> {
        if self.end.wrapping_add(1) != next.start || self.len() + next.len() > 1u128 << 64 {
            return Err(RangeError::NotAdjacent(*self, *next));
        }
        Ok(HashRange::new(self.start, next.end))
    }
}

/// Non-overlapping segments as arcs, joining a segment that ends at `u64::MAX` with one that
/// starts at 0 into one wrapping arc.
fn join_segments(mut segs: Vec<(u64, u64)>) -> Vec<HashRange> {
    segs.sort_unstable();
    let low = segs.first().filter(|s| s.0 == 0).copied();
    let high = segs.last().filter(|s| s.1 == u64::MAX).copied();
    if let (Some(l), Some(h)) = (low, high) {
        if segs.len() > 1 {
            segs.remove(segs.len() - 1);
            segs.remove(0);
            segs.push((h.0, l.1));
        }
    }
    segs.into_iter()
        .map(|(a, b)| HashRange::new(a, b))
        .collect()
}

impl fmt::Display for HashRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:#018x}, {:#018x}]", self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gaps_are_the_complement() {
        let r = HashRange::new;
        assert_eq!(HashRange::gaps(&[HashRange::FULL]), vec![]);
        assert_eq!(HashRange::gaps(&[r(0, 9)]), vec![r(10, u64::MAX)]);
        assert_eq!(
            HashRange::gaps(&[r(10, 19), r(30, 39)]),
            vec![r(0, 9), r(20, 29), r(40, u64::MAX)]
        );
        // Adjacent and overlapping ranges leave no gap between them.
        assert_eq!(
            HashRange::gaps(&[r(0, 9), r(10, 19), r(5, 25)]),
            vec![r(26, u64::MAX)]
        );
        // A wrapping range covers both ends.
        assert_eq!(
            HashRange::gaps(&[r(u64::MAX - 9, 9)]),
            vec![r(10, u64::MAX - 10)]
        );
        assert_eq!(
            HashRange::gaps(&[r(u64::MAX - 9, 9), r(10, u64::MAX - 10)]),
            vec![]
        );
    }

    use super::*;
    use proptest::prelude::*;

    fn arc() -> impl Strategy<Value = HashRange> {
        // Small numbers near both ends of the ring, so arcs meet, wrap and touch the ends.
        let point = prop_oneof![0u64..16, (u64::MAX - 15)..=u64::MAX];
        (point.clone(), point).prop_map(|(a, b)| HashRange::new(a, b))
    }

    fn points() -> impl Iterator<Item = u64> {
        (0u64..20).chain((u64::MAX - 19)..=u64::MAX)
    }

    proptest! {
        #[test]
        fn intersect_and_minus_agree_with_membership(a in arc(), b in arc()) {
            let both = a.intersect(&b);
            let rest = a.minus(&b);
            prop_assert!(both.len() <= 2 && rest.len() <= 2);
            for h in points() {
                let in_both = both.iter().filter(|r| r.contains(h)).count();
                let in_rest = rest.iter().filter(|r| r.contains(h)).count();
                prop_assert_eq!(in_both, usize::from(a.contains(h) && b.contains(h)), "{} {} {}", a, b, h);
                prop_assert_eq!(in_rest, usize::from(a.contains(h) && !b.contains(h)), "{} {} {}", a, b, h);
            }
        }
    }

    #[test]
    fn intersections_that_wrap() {
        let wrap = HashRange::new(u64::MAX - 1, 1);
        assert_eq!(wrap.intersect(&HashRange::FULL), vec![wrap]);
        assert_eq!(
            HashRange::FULL.minus(&wrap),
            vec![HashRange::new(2, u64::MAX - 2)]
        );
        assert_eq!(
            HashRange::new(1, u64::MAX - 1).intersect(&wrap),
            vec![
                HashRange::new(1, 1),
                HashRange::new(u64::MAX - 1, u64::MAX - 1)
            ]
        );
        assert!(HashRange::new(3, 4).minus(&HashRange::new(0, 9)).is_empty());
        assert_eq!(
            wrap.minus(&HashRange::new(0, 0)),
            vec![HashRange::new(1, 1), HashRange::new(u64::MAX - 1, u64::MAX)]
        );
    }

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

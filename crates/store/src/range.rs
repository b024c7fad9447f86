//! Inclusive ranges of the 64-bit key-hash ring (SPEC M5).

/// Keys whose [`crate::key_hash`] lies in `start..=end`, wrapping around `u64::MAX` when
/// `start > end`. `HashRange::FULL` is the whole ring; an empty range is not representable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashRange {
    /// First hash included.
    pub start: u64,
    /// Last hash included.
    pub end: u64,
}

impl HashRange {
    /// The whole ring.
    pub const FULL: HashRange = HashRange {
        start: 0,
        end: u64::MAX,
    };

    /// `start..=end`, wrapping when `start > end`.
    pub fn new(start: u64, end: u64) -> HashRange {
        HashRange { start, end }
    }

    /// Whether `hash` is in the range.
    pub fn contains(&self, hash: u64) -> bool {
        if self.start <= self.end {
            self.start <= hash && hash <= self.end
        } else {
            hash >= self.start || hash <= self.end
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_wrapping_and_full() {
        let r = HashRange::new(10, 20);
        assert!(r.contains(10) && r.contains(20) && !r.contains(9) && !r.contains(21));
        let w = HashRange::new(u64::MAX - 1, 1);
        assert!(w.contains(u64::MAX) && w.contains(0) && w.contains(1) && !w.contains(2));
        assert!(HashRange::FULL.contains(0) && HashRange::FULL.contains(u64::MAX));
        assert!(HashRange::new(5, 5).contains(5) && !HashRange::new(5, 5).contains(6));
    }
}

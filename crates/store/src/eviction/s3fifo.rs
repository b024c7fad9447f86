//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction", SOSP '23) over
//! slabs instead of items.
//!
//! The paper's three queues map onto the arena as follows. A newly opened slab, which new items
//! are appended to, joins the **small** FIFO (probation). The **main** FIFO holds slabs of
//! items that proved themselves: its open slab (the shard's `main_head`) receives the items
//! promoted out of small slabs. Frequency is the paper's 2-bit counter per item, kept in the
//! item's index slot (no memory of its own; a read or a rewrite adds one, up to 3): clearing a
//! small slab promotes the items counted at least once, clearing a main slab keeps (moves to
//! main's open slab) those counted at least once, one count spent, and drops the rest. The
//! **ghost** queue is the shard's `Ghost` table of key hashes of items dropped from small
//! unread; a key written again while its hash is there goes straight to main's open slab (or,
//! without room there, to small counted once, so its slab's first clearing promotes it).
//!
//! The victim is small's oldest slab while small holds more than `small_permille` of the slabs
//! in use (or main is empty), otherwise main's oldest. One-hit wonders and scans pass through
//! small and leave without displacing main; a hot item in a small slab no longer pins its cold
//! neighbours as under slab LRU, because clearing splits a slab by item.

use super::{Clearing, EvictionPolicy, LruList, SlabView};
use crate::slab::SlabId;

/// S3-FIFO's small and main queues of slabs (the ghost lives in the shard's arena).
pub struct S3Fifo {
    small: LruList,
    main: LruList,
    small_permille: u32,
}

impl S3Fifo {
    /// For a shard of `slabs` slabs whose small queue may hold `small_permille` of those in
    /// use before it is cleared first.
    pub fn new(slabs: usize, small_permille: u32) -> S3Fifo {
        S3Fifo {
            small: LruList::new(slabs),
            main: LruList::new(slabs),
            small_permille,
        }
    }

    /// Slabs in the small and the main queue.
    pub fn lens(&self) -> (usize, usize) {
        (self.small.len, self.main.len)
    }

    fn small_over_target(&self) -> bool {
        let in_use = (self.small.len + self.main.len) as u64;
        self.small.len as u64 * 1000 > u64::from(self.small_permille) * in_use
    }
}

impl EvictionPolicy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }
    fn on_open(&mut self, slab: SlabId) {
        self.main.unlink(slab);
        self.small.push_front(slab);
    }
    fn on_access(&mut self, _slab: SlabId) {}
    fn on_release(&mut self, slab: SlabId) {
        self.small.unlink(slab);
        self.main.unlink(slab);
    }
    fn on_main(&mut self, slab: SlabId) {
        self.small.unlink(slab);
        self.main.push_front(slab);
    }
    fn victim(&mut self, _view: &dyn SlabView, exclude: Option<SlabId>) -> Option<SlabId> {
        let oldest = |list: &LruList| list.iter_from_tail().find(|&s| Some(s) != exclude);
        if self.small_over_target() || self.main.len == 0 {
            oldest(&self.small).or_else(|| oldest(&self.main))
        } else {
            oldest(&self.main).or_else(|| oldest(&self.small))
        }
    }
    fn clearing(&self, victim: SlabId) -> Clearing {
        Clearing::Promote {
            ghost: self.small.contains(victim),
        }
    }
    fn clearing_order(&self) -> Vec<SlabId> {
        // Small first: its items are the least proven; main's oldest before its newest.
        self.small
            .iter_from_tail()
            .chain(self.main.iter_from_tail())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoView;
    impl SlabView for NoView {
        fn live_bytes(&self, _slab: SlabId) -> u32 {
            0
        }
    }

    #[test]
    fn small_is_cleared_first_until_it_is_within_its_share() {
        let mut p = S3Fifo::new(10, 200);
        for s in 0..5 {
            p.on_open(s);
        }
        // Everything is small and main is empty: small's oldest goes, asking for the ghost.
        assert_eq!(p.victim(&NoView, None), Some(0));
        assert_eq!(p.clearing(0), Clearing::Promote { ghost: true });
        p.on_main(0);
        p.on_main(1);
        p.on_main(2);
        p.on_main(3);
        // small {4} of 5 in use = 200 per mille: not over, so main's oldest.
        assert_eq!(p.lens(), (1, 4));
        assert_eq!(p.victim(&NoView, None), Some(0));
        assert_eq!(p.clearing(0), Clearing::Promote { ghost: false });
        assert_eq!(p.victim(&NoView, Some(0)), Some(1));
        p.on_open(5);
        // small {4, 5} of 6 > 200 per mille: small's oldest, never the excluded one.
        assert_eq!(p.victim(&NoView, None), Some(4));
        assert_eq!(p.victim(&NoView, Some(4)), Some(5));
        assert_eq!(p.clearing_order(), vec![4, 5, 0, 1, 2, 3]);
        for s in 0..6 {
            p.on_release(s);
        }
        assert_eq!(p.lens(), (0, 0));
        assert_eq!(p.victim(&NoView, None), None);
    }
}

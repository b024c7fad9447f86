//! Eviction policies: which in-use slab is cleared when the shard needs space.
//!
//! Policy is kept apart from mechanism: the shard tells the policy when a slab starts being used,
//! is accessed and is released, and asks it for a victim and for what clearing it does with
//! the victim's items ([`Clearing`]). Every policy keeps its O(1) orders of slabs as intrusive
//! doubly-linked lists over arrays; S3-FIFO's two queues are in `s3fifo.rs`.

use crate::slab::{NIL, SlabId};

mod s3fifo;
pub use s3fifo::S3Fifo;

/// What clearing a victim slab does with its live items (expired ones always leave).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clearing {
    /// Every item leaves; the slab becomes free.
    All,
    /// Items read since they were written stay, compacted to the slab's start with their
    /// fetched bit cleared, and the slab re-enters through `on_open`; the rest leave.
    KeepFetched,
    /// Items with accesses counted (the index slot's counter, bumped by reads and rewrites)
    /// move to the main queue's open slab; the rest leave. `ghost` (S3-FIFO's small queue):
    /// the leaving items' key hashes go into the ghost table and the moved ones keep their
    /// count; otherwise (its main queue) a kept item spends one count.
    Promote {
        /// Remember the hashes of the items that leave.
        ghost: bool,
    },
}

/// What a policy may look at when choosing a victim.
pub trait SlabView {
    /// Bytes of live items in the slab.
    fn live_bytes(&self, slab: SlabId) -> u32;
}

/// A slab-level eviction policy. Called with the shard lock held.
pub trait EvictionPolicy: Send {
    /// Short name for stats.
    fn name(&self) -> &'static str;
    /// The slab started holding items (it becomes most recently used).
    fn on_open(&mut self, slab: SlabId);
    /// An item in the slab was read or written.
    fn on_access(&mut self, slab: SlabId);
    /// The slab was cleared and returned to the free list.
    fn on_release(&mut self, slab: SlabId);
    /// The slab to clear next, never `exclude`; `None` when no slab is in use.
    fn victim(&mut self, view: &dyn SlabView, exclude: Option<SlabId>) -> Option<SlabId>;
    /// The slabs in use, in the order this policy would clear them (the next victim first):
    /// a range streamed in this order and written in it elsewhere leaves the receiver with
    /// the same recency (the warm hand-off of a division).
    fn clearing_order(&self) -> Vec<SlabId>;
    /// What clearing `victim` does with its items. A kept item leaves the next time round
    /// unless read again.
    fn clearing(&self, _victim: SlabId) -> Clearing {
        Clearing::All
    }
    /// The slab became the open slab of the main queue ([`Clearing::Promote`] moves items
    /// into it); for a policy with one queue it is simply the newest.
    fn on_main(&mut self, slab: SlabId) {
        self.on_release(slab);
        self.on_open(slab);
    }
}

/// O(1) recency order of slabs: head = most recent.
pub(crate) struct LruList {
    prev: Vec<SlabId>,
    next: Vec<SlabId>,
    linked: Vec<bool>,
    head: SlabId,
    tail: SlabId,
    len: usize,
}

impl LruList {
    fn new(slabs: usize) -> LruList {
        LruList {
            prev: vec![NIL; slabs],
            next: vec![NIL; slabs],
            linked: vec![false; slabs],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    fn contains(&self, id: SlabId) -> bool {
        self.linked.get(id as usize).copied().unwrap_or(false)
    }

    fn unlink(&mut self, id: SlabId) {
        let i = id as usize;
        if !self.linked[i] {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p != NIL {
            self.next[p as usize] = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        } else {
            self.tail = p;
        }
        self.linked[i] = false;
        self.len -= 1;
    }

    fn push_front(&mut self, id: SlabId) {
        let i = id as usize;
        self.unlink(id);
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = id;
        } else {
            self.tail = id;
        }
        self.head = id;
        self.linked[i] = true;
        self.len += 1;
    }

    /// Least recent first.
    fn iter_from_tail(&self) -> impl Iterator<Item = SlabId> + '_ {
        std::iter::successors((self.tail != NIL).then_some(self.tail), |&s| {
            let p = self.prev[s as usize];
            (p != NIL).then_some(p)
        })
    }
}

/// Slab-level LRU: on access the slab moves to the front; the victim is the back.
pub struct SlabLru {
    list: LruList,
}

impl SlabLru {
    /// For a shard of `slabs` slabs.
    pub fn new(slabs: usize) -> SlabLru {
        SlabLru {
            list: LruList::new(slabs),
        }
    }
}

impl EvictionPolicy for SlabLru {
    fn name(&self) -> &'static str {
        "slab_lru"
    }
    fn on_open(&mut self, slab: SlabId) {
        self.list.push_front(slab);
    }
    fn on_access(&mut self, slab: SlabId) {
        if self.list.head != slab {
            self.list.push_front(slab);
        }
    }
    fn on_release(&mut self, slab: SlabId) {
        self.list.unlink(slab);
    }
    fn victim(&mut self, _view: &dyn SlabView, exclude: Option<SlabId>) -> Option<SlabId> {
        self.list.iter_from_tail().find(|&s| Some(s) != exclude)
    }
    fn clearing_order(&self) -> Vec<SlabId> {
        self.list.iter_from_tail().collect()
    }
}

/// Slab LRU that compares the `candidates` least recent slabs and clears the one with the fewest
/// live bytes: slabs emptied by deletes and overwrites go first, so fewer live items are lost per
/// freed slab. O(candidates) per eviction, O(1) per access.
pub struct LeastLiveOfLru {
    list: LruList,
    candidates: usize,
}

impl LeastLiveOfLru {
    /// For a shard of `slabs` slabs, comparing `candidates` (≥ 1) slabs per eviction.
    pub fn new(slabs: usize, candidates: usize) -> LeastLiveOfLru {
        LeastLiveOfLru {
            list: LruList::new(slabs),
            candidates: candidates.max(1),
        }
    }
}

impl EvictionPolicy for LeastLiveOfLru {
    fn name(&self) -> &'static str {
        "least_live_of_lru"
    }
    fn on_open(&mut self, slab: SlabId) {
        self.list.push_front(slab);
    }
    fn on_access(&mut self, slab: SlabId) {
        if self.list.head != slab {
            self.list.push_front(slab);
        }
    }
    fn on_release(&mut self, slab: SlabId) {
        self.list.unlink(slab);
    }
    fn victim(&mut self, view: &dyn SlabView, exclude: Option<SlabId>) -> Option<SlabId> {
        self.list
            .iter_from_tail()
            .filter(|&s| Some(s) != exclude)
            .take(self.candidates)
            .min_by_key(|&s| view.live_bytes(s))
    }
    fn clearing_order(&self) -> Vec<SlabId> {
        self.list.iter_from_tail().collect()
    }
}

/// FIFO of slabs with a second chance for items (in the spirit of Segcache's merge eviction):
/// slabs are cleared in the order they were opened, regardless of reads, but a victim slab keeps
/// the items read since they were written — compacted to its start, fetched bit cleared — and
/// re-enters the queue as newest; only unread items leave. Slab LRU keeps or drops a slab as a
/// whole, so one hot item pins its cold neighbours; here hot items are gathered together and
/// cold ones leave. Reads cost nothing in the policy (no list update).
pub struct SecondChanceFifo {
    list: LruList,
}

impl SecondChanceFifo {
    /// For a shard of `slabs` slabs.
    pub fn new(slabs: usize) -> SecondChanceFifo {
        SecondChanceFifo {
            list: LruList::new(slabs),
        }
    }
}

impl EvictionPolicy for SecondChanceFifo {
    fn name(&self) -> &'static str {
        "second_chance_fifo"
    }
    fn on_open(&mut self, slab: SlabId) {
        self.list.push_front(slab);
    }
    fn on_access(&mut self, _slab: SlabId) {}
    fn on_release(&mut self, slab: SlabId) {
        self.list.unlink(slab);
    }
    fn victim(&mut self, _view: &dyn SlabView, exclude: Option<SlabId>) -> Option<SlabId> {
        self.list.iter_from_tail().find(|&s| Some(s) != exclude)
    }
    fn clearing(&self, _victim: SlabId) -> Clearing {
        Clearing::KeepFetched
    }
    fn clearing_order(&self) -> Vec<SlabId> {
        self.list.iter_from_tail().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Live(Vec<u32>);
    impl SlabView for Live {
        fn live_bytes(&self, slab: SlabId) -> u32 {
            self.0[slab as usize]
        }
    }

    #[test]
    fn lru_evicts_least_recent_and_respects_exclude() {
        let mut p = SlabLru::new(4);
        let v = Live(vec![0; 4]);
        for s in 0..4 {
            p.on_open(s);
        }
        p.on_access(0);
        assert_eq!(p.victim(&v, None), Some(1));
        assert_eq!(p.victim(&v, Some(1)), Some(2));
        p.on_release(1);
        assert_eq!(p.victim(&v, None), Some(2));
        for s in [0, 2, 3] {
            p.on_release(s);
        }
        assert_eq!(p.victim(&v, None), None);
    }

    #[test]
    fn least_live_picks_emptiest_among_tail() {
        let mut p = LeastLiveOfLru::new(4, 2);
        let v = Live(vec![10, 5, 1, 0]);
        for s in 0..4 {
            p.on_open(s);
        }
        // Tail order: 0, 1, 2, 3 — candidates are 0 and 1.
        assert_eq!(p.victim(&v, None), Some(1));
        assert_eq!(p.victim(&v, Some(1)), Some(2));
    }

    #[test]
    fn second_chance_fifo_ignores_reads_and_retains() {
        let mut p = SecondChanceFifo::new(3);
        let v = Live(vec![0; 3]);
        for s in 0..3 {
            p.on_open(s);
        }
        p.on_access(0);
        assert_eq!(p.victim(&v, None), Some(0), "reads do not reorder a FIFO");
        assert_eq!(p.clearing(0), Clearing::KeepFetched);
        // A retained slab re-enters as newest.
        p.on_release(0);
        p.on_open(0);
        assert_eq!(p.victim(&v, None), Some(1));
    }
}

//! Slab bookkeeping: per-slab metadata and the free / partial / full lists.
//!
//! Lists are intrusive doubly-linked lists over arrays indexed by slab number, so every move
//! between lists is O(1) and costs no allocation. A slab is in exactly one list at a time. New
//! and compacted slabs go to the head of the partial list and writes only look at that head (the
//! `lla_u` variant of the data-structure benchmark in docs/benchmarks/store.md), which keeps
//! allocation O(1).

/// A slab number inside one shard.
pub type SlabId = u32;

pub(crate) const NIL: SlabId = SlabId::MAX;

/// Which list a slab is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListId {
    Free = 0,
    Partial = 1,
    Full = 2,
    /// Holds the S3-FIFO ghost table instead of items (`crate::ghost`).
    Ghost = 3,
}

/// Metadata of one slab.
#[derive(Debug, Clone)]
pub(crate) struct SlabMeta {
    /// Byte offset of the slab in the arena.
    pub start: u64,
    /// Bytes usable in this slab (the last slab of an arena may be shorter).
    pub len: u32,
    /// Bytes written (items are appended; the rest is free tail).
    pub write_offset: u32,
    /// Bytes of items the index still points at.
    pub live_bytes: u32,
    /// CAS counter when the slab was opened: item CAS values are stored relative to it.
    pub cas_base: u64,
    /// Unix second of the last get or set that touched an item here.
    pub last_access: u32,
    /// Already waiting in the compaction queue.
    pub compaction_queued: bool,
    pub list: ListId,
    prev: SlabId,
    next: SlabId,
}

/// The three lists plus metadata of every slab.
pub(crate) struct Slabs {
    pub meta: Vec<SlabMeta>,
    head: [SlabId; 4],
    tail: [SlabId; 4],
    count: [usize; 4],
}

impl Slabs {
    /// All slabs start free, in address order.
    pub fn new(arena_len: u64, slab_size: u64) -> Slabs {
        let n = arena_len.div_ceil(slab_size) as usize;
        let mut s = Slabs {
            meta: Vec::with_capacity(n),
            head: [NIL; 4],
            tail: [NIL; 4],
            count: [0; 4],
        };
        for i in 0..n {
            let start = i as u64 * slab_size;
            s.meta.push(SlabMeta {
                start,
                len: (arena_len - start).min(slab_size) as u32,
                write_offset: 0,
                live_bytes: 0,
                cas_base: 0,
                last_access: 0,
                compaction_queued: false,
                list: ListId::Free,
                prev: NIL,
                next: NIL,
            });
            s.push_tail(ListId::Free, i as SlabId);
        }
        s
    }

    pub fn len(&self) -> usize {
        self.meta.len()
    }

    pub fn count(&self, list: ListId) -> usize {
        self.count[list as usize]
    }

    pub fn head(&self, list: ListId) -> Option<SlabId> {
        let h = self.head[list as usize];
        (h != NIL).then_some(h)
    }

    fn push_tail(&mut self, list: ListId, id: SlabId) {
        let l = list as usize;
        let m = &mut self.meta[id as usize];
        m.list = list;
        m.prev = self.tail[l];
        m.next = NIL;
        if self.tail[l] != NIL {
            self.meta[self.tail[l] as usize].next = id;
        } else {
            self.head[l] = id;
        }
        self.tail[l] = id;
        self.count[l] += 1;
    }

    fn push_head(&mut self, list: ListId, id: SlabId) {
        let l = list as usize;
        let m = &mut self.meta[id as usize];
        m.list = list;
        m.next = self.head[l];
        m.prev = NIL;
        if self.head[l] != NIL {
            self.meta[self.head[l] as usize].prev = id;
        } else {
            self.tail[l] = id;
        }
        self.head[l] = id;
        self.count[l] += 1;
    }

    fn unlink(&mut self, id: SlabId) {
        let (list, prev, next) = {
            let m = &self.meta[id as usize];
            (m.list as usize, m.prev, m.next)
        };
        if prev != NIL {
            self.meta[prev as usize].next = next;
        } else {
            self.head[list] = next;
        }
        if next != NIL {
            self.meta[next as usize].prev = prev;
        } else {
            self.tail[list] = prev;
        }
        self.count[list] -= 1;
    }

    /// Moves a slab to the head of `list` (partial) or its tail (free, full).
    pub fn move_to(&mut self, id: SlabId, list: ListId) {
        self.unlink(id);
        match list {
            ListId::Partial => self.push_head(list, id),
            ListId::Free | ListId::Full | ListId::Ghost => self.push_tail(list, id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_move_and_count() {
        let mut s = Slabs::new(10 * 1024 + 100, 1024);
        assert_eq!(s.len(), 11);
        assert_eq!(s.meta[10].len, 100);
        assert_eq!(s.count(ListId::Free), 11);
        s.move_to(3, ListId::Partial);
        s.move_to(5, ListId::Partial);
        assert_eq!(s.head(ListId::Partial), Some(5));
        s.move_to(5, ListId::Full);
        assert_eq!(s.head(ListId::Partial), Some(3));
        assert_eq!(
            (
                s.count(ListId::Free),
                s.count(ListId::Partial),
                s.count(ListId::Full)
            ),
            (9, 1, 1)
        );
        s.move_to(3, ListId::Free);
        s.move_to(5, ListId::Free);
        assert_eq!(s.count(ListId::Free), 11);
        assert_eq!(s.head(ListId::Partial), None);
    }
}

//! Making room in a shard: clearing a slab (eviction, with or without second chance),
//! compacting a mostly-dead slab in place, and allocating the bytes of a new item.

use super::*;
use crate::eviction::Clearing;

impl Shard {
    /// Clears slab `s`: its live items leave the index, the slab becomes free.
    pub(super) fn evict_slab(&mut self, s: SlabId, now: u32) {
        let mut off = 0;
        while let Some((loc, h)) = self.item_in_slab(s, off) {
            off += h.total_len as u64;
            if let Some(slot) = self.live_slot(loc, &h) {
                let why = if Expiry::at(h.expiry).is_expired(now) {
                    Unlink::Expired
                } else {
                    Unlink::Evicted
                };
                self.unlink(slot, loc, &h, why);
                if self.slabs.meta[s as usize].list == ListId::Free {
                    // Its last live item left: the slab was released (write offset reset).
                    break;
                }
            }
        }
        if self.slabs.meta[s as usize].list != ListId::Free {
            self.release(s);
        }
        self.counters.evicted_slabs += 1;
    }

    /// Second-chance clearing of slab `s`: items read since written stay (compacted to the slab's
    /// start, fetched bit cleared), everything else leaves the index. The slab then becomes the
    /// partial head and most recent; if nothing stayed it is free.
    fn evict_slab_keeping_fetched(&mut self, s: SlabId, now: u32) {
        let start = self.slabs.meta[s as usize].start;
        let (mut dst, mut off, mut kept) = (0u64, 0u64, 0u64);
        // Same in-place walk as compaction: items only move down.
        while let Some((loc, h)) = self.item_in_slab(s, off) {
            off += h.total_len as u64;
            let Some(slot) = self.live_slot(loc, &h) else {
                continue;
            };
            let expired = Expiry::at(h.expiry).is_expired(now);
            if expired || h.ctrl & CTRL_FETCHED == 0 {
                let why = if expired {
                    Unlink::Expired
                } else {
                    Unlink::Evicted
                };
                self.unlink(slot, loc, &h, why);
                if self.slabs.meta[s as usize].list == ListId::Free {
                    break;
                }
                continue;
            }
            self.arena[loc as usize] &= !CTRL_FETCHED;
            let new_loc = start + dst;
            if new_loc != loc {
                self.arena
                    .copy_within(loc as usize..loc as usize + h.total_len, new_loc as usize);
                self.index.set_loc(slot, new_loc);
            }
            dst += h.total_len as u64;
            kept += 1;
        }
        self.counters.evicted_slabs += 1;
        self.counters.second_chance_items += kept;
        let m = &mut self.slabs.meta[s as usize];
        if m.list == ListId::Free {
            return;
        }
        debug_assert_eq!(u64::from(m.live_bytes), dst);
        m.write_offset = dst as u32;
        self.slabs.move_to(s, ListId::Partial);
        // The slab re-enters the eviction order as newest, as if just opened.
        self.policy.on_release(s);
        self.policy.on_open(s);
    }

    /// Compacts one queued slab in place; false if none qualifies any more.
    fn compact_one(&mut self, now: u32) -> bool {
        while let Some(s) = self.compaction_queue.pop_front() {
            let m = &mut self.slabs.meta[s as usize];
            m.compaction_queued = false;
            let dead = u64::from(m.write_offset - m.live_bytes);
            if m.list != ListId::Full
                || dead * 1000 < u64::from(self.compaction_dead_permille) * u64::from(m.len)
            {
                continue;
            }
            let start = m.start;
            let old_offset = m.write_offset;
            let mut dst = 0u64;
            let mut off = 0u64;
            // Items only move down (dst <= loc), so the item at `off` is never overwritten
            // before it is read; the write offset keeps its old value until the walk ends.
            while let Some((loc, h)) = self.item_in_slab(s, off) {
                off += h.total_len as u64;
                let Some(slot) = self.live_slot(loc, &h) else {
                    continue;
                };
                if Expiry::at(h.expiry).is_expired(now) {
                    self.unlink(slot, loc, &h, Unlink::Expired);
                    if self.slabs.meta[s as usize].list == ListId::Free {
                        break;
                    }
                    continue;
                }
                let new_loc = start + dst;
                if new_loc != loc {
                    self.arena
                        .copy_within(loc as usize..loc as usize + h.total_len, new_loc as usize);
                    self.index.set_loc(slot, new_loc);
                }
                dst += h.total_len as u64;
            }
            let m = &mut self.slabs.meta[s as usize];
            if m.list == ListId::Free {
                // Every remaining item had expired: the slab was released as a whole.
                self.counters.compactions += 1;
                self.counters.compacted_bytes += u64::from(old_offset);
                return true;
            }
            debug_assert_eq!(u64::from(m.live_bytes), dst);
            m.write_offset = dst as u32;
            self.counters.compactions += 1;
            self.counters.compacted_bytes += u64::from(old_offset) - dst;
            if self.main_head != Some(s) {
                // The main head stays off the partial list: new items never land in it.
                self.slabs.move_to(s, ListId::Partial);
            }
            return true;
        }
        false
    }

    /// Reserves `len_for(cas_base)` bytes for a new item whose CAS is `cas`.
    pub(super) fn alloc(
        &mut self,
        len_for: impl Fn(u64) -> usize,
        cas: u64,
        now: u32,
    ) -> Result<(u64, usize), StoreError> {
        // Each round makes progress (fills, opens, compacts or clears a slab). A slab is visited
        // at most twice by clearing (a second-chance pass clears fetched bits, the next one drops)
        // and each visit takes two rounds: 5 rounds per slab bound it.
        for _ in 0..5 * self.slabs.len() + 5 {
            if let Some(h) = self.slabs.head(ListId::Partial) {
                let m = &mut self.slabs.meta[h as usize];
                let len = len_for(m.cas_base);
                if m.write_offset as usize + len <= m.len as usize {
                    let loc = m.start + u64::from(m.write_offset);
                    m.write_offset += len as u32;
                    m.live_bytes += len as u32;
                    if m.write_offset == m.len {
                        self.slabs.move_to(h, ListId::Full);
                    }
                    return Ok((loc, len));
                }
                self.slabs.move_to(h, ListId::Full);
                if self.slabs.meta[h as usize].live_bytes == 0 {
                    self.release(h);
                } else {
                    self.maybe_queue_compaction(h);
                }
                continue;
            }
            if let Some(f) = self
                .slabs
                .head(ListId::Free)
                .filter(|_| self.slabs_in_use() < self.slab_quota)
            {
                let m = &mut self.slabs.meta[f as usize];
                if len_for(cas) > m.len as usize {
                    // Only the arena's last slab can be shorter than an item. Rotate it behind
                    // the other free slabs; if it is the only free one, make room instead.
                    if self.slabs.count(ListId::Free) > 1 {
                        self.slabs.move_to(f, ListId::Free);
                        continue;
                    }
                } else {
                    m.cas_base = cas;
                    m.last_access = now;
                    self.slabs.move_to(f, ListId::Partial);
                    self.policy.on_open(f);
                    continue;
                }
            }
            if self.compact_one(now) {
                continue;
            }
            if !self.evictions {
                // memcached -M: dead and expired space was reclaimed above; live items stay.
                break;
            }
            let view = LiveView(&self.slabs.meta);
            let Some(victim) = self.policy.victim(&view, None) else {
                break;
            };
            match self.policy.clearing(victim) {
                Clearing::All => self.evict_slab(victim, now),
                Clearing::KeepFetched => self.evict_slab_keeping_fetched(victim, now),
                Clearing::Promote { ghost } => self.evict_slab_promoting(victim, ghost, now),
            }
        }
        Err(StoreError::OutOfMemory)
    }
}

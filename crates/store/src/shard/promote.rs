//! S3-FIFO's mechanism in a shard: the ghost table's slabs, and clearing a victim slab by
//! moving its accessed items into the main queue's open slab (`main_head`).
//!
//! Clearing walks the victim once, in address order. Expired items leave; items without
//! counted accesses (the index slot's counter) leave too, into the ghost if the victim was a
//! small slab; the others are re-encoded at the end of the main head (their CAS relative to
//! its base), a main victim's spending one count.
//! When the main head cannot take the next item, the victim itself becomes the main head and
//! its remaining accessed items slide down in place, as compaction does (an item only ever
//! moves towards lower addresses of its own slab, never over one not yet read). So clearing
//! needs no free slab and allocates nothing, and a slab freed by it is free at once.
//!
//! Moving items between slabs is what the store's other clearings never do; a range scan
//! (`Store::scan_range`) that visited the main head before an item moved into it would miss
//! the item, so each clearing ticks the shard's `move_clock`, every slab records the tick at
//! which items last moved into it (`moved_in`), and a scan visits again, after its pass, the
//! slabs moved into since the pass began (`Shard::moved_into_since`).

use super::*;
use crate::ghost::Ghost;
use crate::index::FREQ_MAX;

impl Shard {
    /// Takes the ghost table's slabs out of the free list for a policy that wants a ghost of
    /// `permille` entries per index slot: whole slabs, rounded to the nearest (at least one
    /// when `permille` > 0), at most an eighth of the shard's slabs; none in a shard of fewer
    /// than 8 slabs.
    pub(super) fn reserve_ghost(&mut self, permille: u32) {
        let count = self.ghost_slabs_wanted(permille);
        if count == 0 {
            return;
        }
        let n = self.slabs.len();
        let mut slabs = Vec::with_capacity(count);
        // Full-length free slabs only (the arena's last slab may be shorter).
        for s in 0..n as SlabId {
            if slabs.len() == count {
                break;
            }
            let m = &self.slabs.meta[s as usize];
            if m.list == ListId::Free && u64::from(m.len) == self.slab_size {
                slabs.push(s);
            }
        }
        let mut starts = Vec::with_capacity(slabs.len());
        for &s in &slabs {
            let m = &self.slabs.meta[s as usize];
            let (start, len) = (m.start as usize, m.len as usize);
            self.arena[start..start + len].fill(0);
            starts.push(m.start);
            self.slabs.move_to(s, ListId::Ghost);
        }
        self.ghost = Some(Ghost::new(starts, self.slab_size as usize));
    }

    /// Slabs a ghost of `permille` entries per index slot takes (see `reserve_ghost`).
    pub(super) fn ghost_slabs_wanted(&self, permille: u32) -> usize {
        let n = self.slabs.len();
        if permille == 0 || n < 8 {
            return 0;
        }
        let entries = self.index.capacity() as u64 * u64::from(permille) / 1000;
        let bytes = entries * crate::ghost::ENTRY_BYTES as u64;
        let wanted = ((bytes + self.slab_size / 2) / self.slab_size).max(1) as usize;
        wanted.min(n / 8)
    }

    /// Entries the ghost table holds (0 without one).
    pub fn ghost_capacity(&self) -> usize {
        self.ghost.as_ref().map_or(0, Ghost::capacity)
    }

    /// Whether `hash` was dropped from the small queue recently (and forgets it).
    pub(super) fn ghost_take(&mut self, hash: u64) -> bool {
        match self.ghost.as_mut() {
            Some(g) => g.take(&mut self.arena, hash),
            None => false,
        }
    }

    /// Slabs items were moved into after `since` (a value of [`Shard::move_clock`]): a scan
    /// whose pass began then visits them again.
    pub fn moved_into_since(&self, since: u64) -> Vec<SlabId> {
        (0..self.slabs.len() as SlabId)
            .filter(|&s| self.moved_in[s as usize] > since)
            .collect()
    }

    /// Ticks once per S3-FIFO clearing.
    pub fn move_clock(&self) -> u64 {
        self.move_clock
    }

    /// Reserves `len_for(cas_base)` bytes at the end of the main head for a new item; `None`
    /// without a main head or room in it.
    pub(super) fn alloc_in_main_head(
        &mut self,
        len_for: impl Fn(u64) -> usize,
    ) -> Option<(u64, usize)> {
        let m = self.main_head?;
        let meta = &mut self.slabs.meta[m as usize];
        let len = len_for(meta.cas_base);
        if meta.write_offset as usize + len > meta.len as usize {
            return None;
        }
        let loc = meta.start + u64::from(meta.write_offset);
        meta.write_offset += len as u32;
        meta.live_bytes += len as u32;
        Some((loc, len))
    }

    /// Counts an access to the item of index `slot` (saturating), if the policy counts.
    pub(super) fn bump_freq(&mut self, slot: usize) {
        if self.counts_frequency {
            let f = self.index.freq(slot);
            if f < FREQ_MAX {
                self.index.set_freq(slot, f + 1);
            }
        }
    }

    fn make_main_head(&mut self, s: SlabId) {
        self.main_head = Some(s);
        self.policy.on_main(s);
        if self.slabs.meta[s as usize].list != ListId::Full {
            // Off the partial list: new items must not land in a main slab.
            self.slabs.move_to(s, ListId::Full);
        }
    }

    /// Re-encodes the item at `loc` (index `slot`) at the end of the main head; false if
    /// there is no main head or it has no room left.
    fn move_to_main_head(&mut self, slot: usize, loc: u64, h: &Header) -> bool {
        let Some(m) = self.main_head else {
            return false;
        };
        let mut key = [0u8; KEY_LEN_MAX];
        let b = loc as usize;
        key[..h.key_len]
            .copy_from_slice(&self.arena[b + h.key_offset..b + h.key_offset + h.key_len]);
        let fields = ItemFields {
            key: &key[..h.key_len],
            value_len: h.value_len,
            flags: h.flags,
            expiry: h.expiry,
            cas: h.cas,
            state: h.ctrl & CTRL_STATE,
        };
        let meta = &self.slabs.meta[m as usize];
        let len = item::encoded_len(&fields, meta.cas_base);
        if meta.write_offset as usize + len > meta.len as usize {
            self.main_head = None;
            return false;
        }
        let new_loc = meta.start + u64::from(meta.write_offset);
        let base = meta.cas_base;
        let n = new_loc as usize;
        let value_at = len - h.value_len;
        self.arena
            .copy_within(b + h.value_offset()..b + h.total_len, n + value_at);
        item::encode_head(&mut self.arena[n..n + len], &fields, base);
        let meta = &mut self.slabs.meta[m as usize];
        meta.write_offset += len as u32;
        meta.live_bytes += len as u32;
        self.moved_in[m as usize] = self.move_clock;
        self.index.set_loc(slot, new_loc);
        self.counters.promoted_items += 1;
        self.kill(loc, h.total_len);
        true
    }

    /// Clears slab `s` for S3-FIFO (module doc): accessed items go to the main head, the rest
    /// leave, into the ghost when `ghost`.
    pub(super) fn evict_slab_promoting(&mut self, s: SlabId, ghost: bool, now: u32) {
        if self.main_head == Some(s) {
            self.main_head = None;
        }
        self.move_clock += 1;
        let start = self.slabs.meta[s as usize].start;
        // Some(bytes kept) once `s` itself is the main head.
        let mut in_place: Option<u64> = None;
        let mut off = 0u64;
        while let Some((loc, h)) = self.item_in_slab(s, off) {
            off += h.total_len as u64;
            let Some(slot) = self.live_slot(loc, &h) else {
                continue;
            };
            let expired = Expiry::at(h.expiry).is_expired(now);
            let freq = self.index.freq(slot);
            if expired || freq == 0 {
                if ghost && !expired {
                    let b = loc as usize;
                    let hash = crate::key_hash(
                        &self.arena[b + h.key_offset..b + h.key_offset + h.key_len],
                    );
                    if let Some(g) = self.ghost.as_mut() {
                        g.insert(&mut self.arena, hash);
                    }
                }
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
            // Kept: from small with its count (measured: resetting it, or promoting only
            // items counted twice, does no better), in main with one count spent.
            if !ghost {
                self.index.set_freq(slot, freq - 1);
            }
            if in_place.is_none() {
                if self.move_to_main_head(slot, loc, &h) {
                    if self.slabs.meta[s as usize].list == ListId::Free {
                        break;
                    }
                    continue;
                }
                // The main head is full: this slab takes its place, keeping the rest here.
                self.make_main_head(s);
                in_place = Some(0);
            }
            let dst = in_place.unwrap_or(0);
            let new_loc = start + dst;
            if new_loc != loc {
                self.arena
                    .copy_within(loc as usize..loc as usize + h.total_len, new_loc as usize);
                self.index.set_loc(slot, new_loc);
            }
            self.counters.promoted_items += 1;
            in_place = Some(dst + h.total_len as u64);
        }
        self.counters.evicted_slabs += 1;
        let m = &mut self.slabs.meta[s as usize];
        if m.list == ListId::Free {
            return;
        }
        let kept = in_place.unwrap_or(0);
        debug_assert_eq!(u64::from(m.live_bytes), kept);
        m.write_offset = kept as u32;
        if kept == 0 {
            self.release(s);
        }
    }
}

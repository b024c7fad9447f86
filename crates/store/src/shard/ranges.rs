//! A shard by hash range and as a whole: visiting, scanning and dropping the items of a
//! range, inserting an item as-is (hand-off, replication), statistics and invariant checks.

use super::*;

impl Shard {
    /// A view of the item at `loc` (read-side bits as stored, no win claimed).
    fn view_at(&self, loc: u64, h: &Header) -> ItemView<'_> {
        let b = loc as usize;
        ItemView {
            key: &self.arena[b + h.key_offset..b + h.key_offset + h.key_len],
            value: &self.arena[b + h.value_offset()..b + h.total_len],
            flags: h.flags,
            cas: h.cas,
            expiry: Expiry::at(h.expiry),
            fetched_before: h.ctrl & CTRL_FETCHED != 0,
            stale: h.ctrl & CTRL_STALE != 0,
            won: false,
            win_token_taken: h.ctrl & CTRL_WIN != 0,
            slab_last_access_secs: self.slabs.meta[slab_of(loc, self.slab_size) as usize]
                .last_access,
            item_bytes: h.total_len,
            key_binary: h.ctrl & CTRL_KEY_BINARY != 0,
        }
    }

    /// Calls `f` for every live, unexpired item whose key hash is in `range`.
    pub fn for_each_in_range(
        &mut self,
        range: HashRange,
        now: u32,
        f: &mut dyn FnMut(ItemView<'_>),
    ) {
        for slot in 0..self.index.capacity() {
            let Some(loc) = self.index.loc_at(slot) else {
                continue;
            };
            let h = self.header(loc);
            let b = loc as usize;
            let key = &self.arena[b + h.key_offset..b + h.key_offset + h.key_len];
            if !range.contains(crate::key_hash(key)) || Expiry::at(h.expiry).is_expired(now) {
                continue;
            }
            f(self.view_at(loc, &h));
        }
    }

    /// Number of slabs.
    pub fn slab_count(&self) -> usize {
        self.slabs.len()
    }

    /// Every slab once, for a scan: those in use in the order the eviction policy would
    /// clear them (coldest first), then the rest.
    pub fn scan_order(&self) -> Vec<SlabId> {
        let mut order = self.policy.clearing_order();
        let mut listed = vec![false; self.slabs.len()];
        for &s in &order {
            if let Some(seen) = listed.get_mut(s as usize) {
                *seen = true;
            }
        }
        order.extend(
            (0..self.slabs.len())
                .filter(|&s| !listed[s])
                .map(|s| s as SlabId),
        );
        // S3-FIFO moves items into its main head: visited last, it misses none of them.
        if let Some(h) = self.main_head {
            order.retain(|&s| s != h);
            order.push(h);
        }
        order
    }

    /// Calls `f` for every live, unexpired item of slab `s` whose key hash is in `range`.
    pub fn scan_slab(
        &mut self,
        s: SlabId,
        range: HashRange,
        now: u32,
        f: &mut dyn FnMut(ItemView<'_>),
    ) {
        if s as usize >= self.slabs.len() {
            return;
        }
        let mut off = 0u64;
        while let Some((loc, h)) = self.item_in_slab(s, off) {
            off += h.total_len as u64;
            let b = loc as usize;
            let hash = crate::key_hash(&self.arena[b + h.key_offset..b + h.key_offset + h.key_len]);
            if !range.contains(hash)
                || Expiry::at(h.expiry).is_expired(now)
                || self.index.find_loc(self.index.probe(hash), loc).is_none()
            {
                continue;
            }
            f(self.view_at(loc, &h));
        }
    }

    /// Removes every item whose key hash is in `range` and passes `pick`; returns how many.
    pub fn drop_range(&mut self, range: HashRange, pick: &dyn Fn(u64) -> bool) -> usize {
        let mut dropped = 0;
        for slot in 0..self.index.capacity() {
            let Some(loc) = self.index.loc_at(slot) else {
                continue;
            };
            let h = self.header(loc);
            let b = loc as usize;
            let hash = crate::key_hash(&self.arena[b + h.key_offset..b + h.key_offset + h.key_len]);
            if range.contains(hash) && pick(hash) {
                self.unlink(slot, loc, &h, Unlink::Deleted);
                dropped += 1;
            }
        }
        dropped
    }

    /// Removes the items of slab `s` whose key hash `drop` accepts; returns how many. Items
    /// are found first and unlinked after, so the walk never reads a slab its own removals
    /// released.
    pub fn drop_in_slab(&mut self, s: SlabId, drop: &dyn Fn(u64) -> bool) -> usize {
        if s as usize >= self.slabs.len() {
            return 0;
        }
        let mut doomed = Vec::new();
        let mut off = 0u64;
        while let Some((loc, h)) = self.item_in_slab(s, off) {
            off += h.total_len as u64;
            let b = loc as usize;
            let hash = crate::key_hash(&self.arena[b + h.key_offset..b + h.key_offset + h.key_len]);
            if !drop(hash) {
                continue;
            }
            if let Some(slot) = self.index.find_loc(self.index.probe(hash), loc) {
                doomed.push((slot, loc, h));
            }
        }
        for (slot, loc, h) in &doomed {
            self.unlink(*slot, *loc, h, Unlink::Deleted);
        }
        doomed.len()
    }

    /// Stores an item exactly as given (CAS, flags, expiry, stale), e.g. from a range hand-off.
    pub fn insert_item(
        &mut self,
        hash: u64,
        item: &OwnedItem,
        now: u32,
        ctx: &Ctx<'_>,
    ) -> Result<(), StoreError> {
        Self::check_key(&item.key)?;
        self.check_size(item.key.len(), item.value.len(), item.flags)?;
        ctx.cas_for(Some(item.cas));
        let state = if item.stale { CTRL_STALE } else { 0 };
        let loc = self.store_item(
            hash,
            &item.key,
            &item.value,
            item.flags,
            item.expiry,
            item.cas,
            state,
            now,
        )?;
        self.emit_put(loc, ctx);
        Ok(())
    }

    /// `stats reset`: zeroes the counters (gauges such as items and bytes are not counters).
    pub fn reset_counters(&mut self) {
        self.counters = ShardCounters::default();
    }

    pub fn add_stats(&self, s: &mut Stats) {
        let c = &self.counters;
        s.curr_items += self.index.len() as u64;
        s.total_items += c.total_items;
        s.evicted_items += c.evicted_items;
        s.evicted_slabs += c.evicted_slabs;
        s.evicted_unfetched += c.evicted_unfetched;
        s.reclaimed += c.reclaimed;
        s.expired_unfetched += c.expired_unfetched;
        s.compactions += c.compactions;
        s.compacted_bytes += c.compacted_bytes;
        s.second_chance_items += c.second_chance_items;
        s.promoted_items += c.promoted_items;
        s.ghost_hits += c.ghost_hits;
        s.slabs_ghost += self.slabs.count(ListId::Ghost) as u64;
        s.ghost_entries += self.ghost_capacity() as u64;
        s.get_hits += c.get_hits;
        s.get_misses += c.get_misses;
        s.get_expired += c.get_expired;
        s.index_full_evictions += c.index_full_evictions;
        for m in &self.slabs.meta {
            s.bytes += u64::from(m.live_bytes);
            s.dead_bytes += u64::from(m.write_offset - m.live_bytes);
        }
        s.slabs_free += self.slabs.count(ListId::Free) as u64;
        s.slabs_partial += self.slabs.count(ListId::Partial) as u64;
        s.slabs_full += self.slabs.count(ListId::Full) as u64;
        s.arena_bytes += self.arena.len() as u64;
        s.index_bytes += self.index.bytes() as u64;
        s.index_slots += self.index.capacity() as u64;
        s.shards += 1;
    }

    /// Checks internal invariants (tests): live bytes equal the items the index points at.
    pub fn check_invariants(&self) {
        let mut live = vec![0u64; self.slabs.len()];
        for slot in 0..self.index.capacity() {
            if let Some(loc) = self.index.loc_at(slot) {
                live[slab_of(loc, self.slab_size) as usize] += self.header(loc).total_len as u64;
            }
        }
        for (i, m) in self.slabs.meta.iter().enumerate() {
            assert_eq!(u64::from(m.live_bytes), live[i], "slab {i} live bytes");
            assert!(m.write_offset <= m.len);
        }
        // Every ghost slab holds the ghost's table, and only those (none leaks).
        let per_slab = self.slab_size as usize / 16 * 4;
        assert_eq!(
            self.slabs.count(ListId::Ghost) * per_slab,
            self.ghost_capacity(),
            "ghost slabs"
        );
        if let Some(h) = self.main_head {
            assert_eq!(self.slabs.meta[h as usize].list, ListId::Full, "main head");
        }
    }
}

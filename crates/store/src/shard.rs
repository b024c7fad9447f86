//! One shard: arena, index, slab lists and eviction policy behind one lock.
//!
//! Everything here runs with the shard's mutex held (taken by [`crate::Store`]), so plain `&mut`
//! access is the whole concurrency story inside a shard.
//!
//! Liveness: an arena item is live exactly when an index slot points at it. Each slab counts its
//! live bytes; everything else between its start and its write offset is dead (deleted,
//! overwritten, expired). A slab whose live bytes reach zero goes straight back to the free list.
//! A full slab whose dead fraction reaches `compaction_dead_permille` is queued, and when a write
//! needs space and no slab is free, a queued slab is compacted in place (live items slide down,
//! index slots are repointed) before any slab is evicted — so dead space is reclaimed without
//! losing live items. Only then is the policy's victim slab cleared.
//!
//! Writers never write in place over an existing item (except the expiry field and state bits):
//! a new version is appended and the index slot repointed, which keeps every step of a write
//! simple to reason about while old bytes become dead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{ConfigError, EvictionPolicyKind, KEY_LEN_MAX, StoreConfig};
use crate::eviction::{EvictionPolicy, LeastLiveOfLru, SecondChanceFifo, SlabLru, SlabView};
use crate::expiry::Expiry;
use crate::feed::{Change, ChangeKind, ChangeSink};
use crate::index::{Index, SLOT_BYTES, SLOTS_PER_BUCKET};
use crate::item::{
    self, CTRL_FETCHED, CTRL_KEY_BINARY, CTRL_STALE, CTRL_STATE, CTRL_WIN, Header, ItemFields,
};
use crate::ops::*;
use crate::range::HashRange;
use crate::slab::{ListId, SlabId, SlabMeta, Slabs};
use crate::stats::{ShardCounters, Stats};

/// How one shard's memory budget is divided between index and arena.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardSizing {
    pub arena_bytes: usize,
    pub slab_count: usize,
    pub index_buckets: usize,
}

impl ShardSizing {
    /// The index gets slots for `budget / (item + slot/load)` items at the target load; the
    /// arena gets the rest, its last slab possibly shorter, so no byte of the budget is idle.
    pub fn compute(c: &StoreConfig, budget: usize) -> ShardSizing {
        let load = f64::from(c.index_load_target_permille) / 1000.0;
        let per_item = c.index_item_bytes_expected as f64 + SLOT_BYTES as f64 / load;
        let items = budget as f64 / per_item;
        let slots = (items / load).ceil() as usize;
        let bucket_bytes = SLOTS_PER_BUCKET * SLOT_BYTES;
        let index_buckets = slots.div_ceil(SLOTS_PER_BUCKET).max(1);
        let arena_bytes = budget.saturating_sub(index_buckets * bucket_bytes);
        let slab_count = if arena_bytes >= 2 * c.slab_size_bytes {
            arena_bytes.div_ceil(c.slab_size_bytes)
        } else {
            0
        };
        ShardSizing {
            arena_bytes,
            slab_count,
            index_buckets,
        }
    }
}

/// Store-wide state a shard needs while applying an operation.
pub(crate) struct Ctx<'a> {
    pub cas: &'a AtomicU64,
    pub seq: &'a AtomicU64,
    pub sink: Option<&'a dyn ChangeSink>,
}

impl Ctx<'_> {
    fn next_cas(&self) -> u64 {
        self.cas.fetch_add(1, Ordering::Relaxed) + 1
    }
    fn cas_for(&self, explicit: Option<u64>) -> u64 {
        match explicit {
            Some(c) => {
                // Keep locally generated CAS values above any adopted one (a promoted backup
                // must not hand out a CAS it already holds).
                self.cas.fetch_max(c, Ordering::Relaxed);
                c
            }
            None => self.next_cas(),
        }
    }
    /// Reports a flush of `range`; called by the store with every shard lock held.
    pub fn emit_flush(&self, range: HashRange) {
        self.emit(ChangeKind::Flush { range });
    }

    fn emit(&self, kind: ChangeKind<'_>) {
        if let Some(sink) = self.sink {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
            sink.record(&Change { seq, kind });
        }
    }
}

struct LiveView<'a>(&'a [SlabMeta]);
impl SlabView for LiveView<'_> {
    fn live_bytes(&self, slab: SlabId) -> u32 {
        self.0[slab as usize].live_bytes
    }
}

/// Why an indexed item leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unlink {
    Deleted,
    Expired,
    Evicted,
}

pub(crate) struct Shard {
    arena: Vec<u8>,
    slab_size: u64,
    slabs: Slabs,
    index: Index,
    policy: Box<dyn EvictionPolicy>,
    item_size_max: usize,
    /// memcached's item accounting counts a CAS field (not under `-C`).
    cas_counted: bool,
    /// Off (memcached `-M`): fail writes instead of evicting live items.
    evictions: bool,
    compaction_dead_permille: u32,
    compaction_queue: VecDeque<SlabId>,
    scratch: Vec<u8>,
    counters: ShardCounters,
    /// Most slabs that may hold items (partial + full); below the slab count after a
    /// run-time `cache_memlimit` lowered the limit. The arena itself never shrinks.
    slab_quota: usize,
}

fn slab_of(loc: u64, slab_size: u64) -> SlabId {
    (loc / slab_size) as SlabId
}

impl Shard {
    /// Allocates (and writes once, see `prealloc`) the shard's arena and index; the
    /// memory error if the system refuses them.
    pub fn new(c: &StoreConfig, budget: usize) -> Result<Shard, ConfigError> {
        let sizing = ShardSizing::compute(c, budget);
        let refused = || ConfigError::OutOfMemory {
            bytes: budget,
            limit: c.memory_limit_bytes,
        };
        let arena = crate::prealloc::zeroed(sizing.arena_bytes).ok_or_else(refused)?;
        let index = Index::new(sizing.index_buckets, c.index_kicks_max).ok_or_else(refused)?;
        let slabs = Slabs::new(sizing.arena_bytes as u64, c.slab_size_bytes as u64);
        // Each slab is queued for compaction at most once, so this never grows.
        let slab_count = slabs.len();
        let policy: Box<dyn EvictionPolicy> = match c.eviction {
            EvictionPolicyKind::SlabLru => Box::new(SlabLru::new(slabs.len())),
            EvictionPolicyKind::LeastLiveOfLru { candidates } => {
                Box::new(LeastLiveOfLru::new(slabs.len(), candidates))
            }
            EvictionPolicyKind::SecondChanceFifo => Box::new(SecondChanceFifo::new(slabs.len())),
        };
        Ok(Shard {
            arena,
            slab_size: c.slab_size_bytes as u64,
            slabs,
            index,
            policy,
            item_size_max: c.item_size_max_bytes,
            cas_counted: c.cas_enabled,
            evictions: c.evictions,
            compaction_dead_permille: c.compaction_dead_permille,
            compaction_queue: VecDeque::with_capacity(slab_count),
            scratch: Vec::new(),
            counters: ShardCounters::default(),
            slab_quota: usize::MAX,
        })
    }

    /// Bytes of this shard's index (fixed at start).
    pub fn index_bytes(&self) -> usize {
        self.index.bytes()
    }

    /// Limits the slabs in use to `quota` (at least 1), evicting least-valuable slabs until
    /// the shard fits. Raising it again only lets later writes open more free slabs.
    pub fn set_slab_quota(&mut self, quota: usize, now: u32) {
        self.slab_quota = quota.max(1);
        while self.slabs_in_use() > self.slab_quota {
            let view = LiveView(&self.slabs.meta);
            let Some(victim) = self.policy.victim(&view, None) else {
                break;
            };
            self.evict_slab(victim, now);
        }
    }

    fn slabs_in_use(&self) -> usize {
        self.slabs.count(ListId::Partial) + self.slabs.count(ListId::Full)
    }

    /// Heap bytes this shard holds beyond its arena and index (slab metadata, LRU arrays,
    /// compaction queue and scratch buffer at their bounds).
    pub fn metadata_bytes_max(&self) -> usize {
        let n = self.slabs.len();
        n * (std::mem::size_of::<SlabMeta>() + 2 * 4 + 1 + std::mem::size_of::<SlabId>())
            + item::encoded_len_max(KEY_LEN_MAX, self.item_size_max)
            + self.index.path_bytes()
            + std::mem::size_of::<Shard>()
    }

    fn header(&self, loc: u64) -> Header {
        let base = self.slabs.meta[slab_of(loc, self.slab_size) as usize].cas_base;
        item::decode(&self.arena[loc as usize..], base)
    }

    fn key_at(&self, loc: u64) -> &[u8] {
        let h = item::decode(&self.arena[loc as usize..], 0);
        &self.arena[loc as usize + h.key_offset..loc as usize + h.key_offset + h.key_len]
    }

    fn find_slot(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let p = self.index.probe(hash);
        self.index.find(p, |_, loc| self.key_at(loc) == key)
    }

    /// The live, unexpired item for `key`: (slot, loc, header). Reclaims it if expired.
    fn lookup(&mut self, hash: u64, key: &[u8], now: u32) -> Option<(usize, u64, Header)> {
        let slot = self.find_slot(hash, key)?;
        let loc = self.index.loc_at(slot)?;
        let h = self.header(loc);
        if Expiry::at(h.expiry).is_expired(now) {
            self.unlink(slot, loc, &h, Unlink::Expired);
            return None;
        }
        Some((slot, loc, h))
    }

    fn unlink(&mut self, slot: usize, loc: u64, h: &Header, why: Unlink) {
        self.index.remove(slot);
        let unfetched = h.ctrl & CTRL_FETCHED == 0;
        match why {
            Unlink::Deleted => {}
            Unlink::Expired => {
                self.counters.reclaimed += 1;
                self.counters.expired_unfetched += u64::from(unfetched);
            }
            Unlink::Evicted => {
                self.counters.evicted_items += 1;
                self.counters.evicted_unfetched += u64::from(unfetched);
            }
        }
        self.kill(loc, h.total_len);
    }

    /// Marks `len` bytes at `loc` dead and reclaims or queues its slab.
    fn kill(&mut self, loc: u64, len: usize) {
        let s = slab_of(loc, self.slab_size);
        let m = &mut self.slabs.meta[s as usize];
        m.live_bytes -= len as u32;
        if m.live_bytes == 0 {
            self.release(s);
        } else {
            self.maybe_queue_compaction(s);
        }
    }

    fn maybe_queue_compaction(&mut self, s: SlabId) {
        let m = &mut self.slabs.meta[s as usize];
        let dead = u64::from(m.write_offset - m.live_bytes);
        if m.list == ListId::Full
            && !m.compaction_queued
            && self.compaction_dead_permille < 1000
            && dead * 1000 >= u64::from(self.compaction_dead_permille) * u64::from(m.len)
        {
            m.compaction_queued = true;
            self.compaction_queue.push_back(s);
        }
    }

    fn release(&mut self, s: SlabId) {
        let m = &mut self.slabs.meta[s as usize];
        m.write_offset = 0;
        m.live_bytes = 0;
        // `compaction_queued` stays: it says whether the slab is in the queue, and a stale
        // entry is skipped when popped. Resetting it here could queue the slab twice.
        self.slabs.move_to(s, ListId::Free);
        self.policy.on_release(s);
    }

    /// Drops every item (flush_all taking effect).
    pub fn clear_all(&mut self) {
        self.index.clear();
        for s in 0..self.slabs.len() as SlabId {
            if self.slabs.meta[s as usize].list != ListId::Free {
                self.release(s);
            }
        }
        self.compaction_queue.clear();
        for m in &mut self.slabs.meta {
            m.compaction_queued = false;
        }
    }

    /// The item at byte `off` of slab `s`, if `off` is below the slab's write offset. Slab walks
    /// step with this instead of collecting items, so that clearing or compacting a slab
    /// allocates nothing (the memory bound of SPEC M1 is checked with a counting allocator).
    fn item_in_slab(&self, s: SlabId, off: u64) -> Option<(u64, Header)> {
        let m = &self.slabs.meta[s as usize];
        if off >= u64::from(m.write_offset) {
            return None;
        }
        let loc = m.start + off;
        Some((loc, self.header(loc)))
    }

    /// Index slot pointing at the item at `loc`, if it is live.
    fn live_slot(&self, loc: u64, h: &Header) -> Option<usize> {
        let key = &self.arena[loc as usize + h.key_offset..loc as usize + h.key_offset + h.key_len];
        let p = self.index.probe(crate::key_hash(key));
        self.index.find_loc(p, loc)
    }

    /// Clears slab `s`: its live items leave the index, the slab becomes free.
    fn evict_slab(&mut self, s: SlabId, now: u32) {
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
            self.slabs.move_to(s, ListId::Partial);
            return true;
        }
        false
    }

    /// Reserves `len_for(cas_base)` bytes for a new item whose CAS is `cas`.
    fn alloc(
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
            if self.policy.retain_fetched() {
                self.evict_slab_keeping_fetched(victim, now);
            } else {
                self.evict_slab(victim, now);
            }
        }
        Err(StoreError::OutOfMemory)
    }

    /// Writes a new item version and points the index at it, replacing any older version.
    #[allow(clippy::too_many_arguments)]
    fn store_item(
        &mut self,
        hash: u64,
        key: &[u8],
        value: &[u8],
        flags: u32,
        expiry: Expiry,
        cas: u64,
        state: u8,
        now: u32,
    ) -> Result<u64, StoreError> {
        let fields = ItemFields {
            key,
            value_len: value.len(),
            flags,
            expiry: expiry.as_unix_secs(),
            cas,
            state,
        };
        let (loc, len) = self.alloc(|base| item::encoded_len(&fields, base), cas, now)?;
        let s = slab_of(loc, self.slab_size);
        let base = self.slabs.meta[s as usize].cas_base;
        let buf = &mut self.arena[loc as usize..loc as usize + len];
        let vo = item::encode_head(buf, &fields, base);
        buf[vo..].copy_from_slice(value);

        let p = self.index.probe(hash);
        let existing = self.index.find(p, |_, l| l != loc && self.key_at(l) == key);
        if let Some(slot) = existing {
            let old = self.index.loc_at(slot).unwrap_or(loc);
            let old_len = self.header(old).total_len;
            self.index.set_loc(slot, loc);
            self.kill(old, old_len);
        } else {
            if self.index.insert(p, loc).is_err() {
                // The key's two buckets are full and no displacement path was found. Evict one
                // item from those buckets — the one whose slab was used least recently — which
                // frees a slot exactly where it is needed (the index acts as a set-associative
                // cache here) instead of clearing whole slabs that may not help this bucket.
                let victim = self
                    .index
                    .bucket_slots(p)
                    .filter_map(|slot| Some((slot, self.index.loc_at(slot)?)))
                    .filter(|&(_, l)| l != loc)
                    .min_by_key(|&(_, l)| {
                        self.slabs.meta[slab_of(l, self.slab_size) as usize].last_access
                    });
                let inserted = match victim {
                    Some((slot, l)) => {
                        let h = self.header(l);
                        let why = if Expiry::at(h.expiry).is_expired(now) {
                            Unlink::Expired
                        } else {
                            Unlink::Evicted
                        };
                        if why == Unlink::Evicted && !self.evictions {
                            self.kill(loc, len);
                            return Err(StoreError::OutOfMemory);
                        }
                        self.unlink(slot, l, &h, why);
                        self.counters.index_full_evictions += 1;
                        self.index.insert(p, loc).is_ok()
                    }
                    None => false,
                };
                if !inserted {
                    self.kill(loc, len);
                    return Err(StoreError::OutOfMemory);
                }
            }
        }
        let m = &mut self.slabs.meta[s as usize];
        m.last_access = now;
        self.policy.on_access(s);
        self.counters.total_items += 1;
        Ok(loc)
    }

    fn check_key(key: &[u8]) -> Result<(), StoreError> {
        if key.is_empty() || key.len() > KEY_LEN_MAX {
            Err(StoreError::KeyLength(key.len()))
        } else {
            Ok(())
        }
    }

    /// memcached's size check: the whole item, counted as memcached counts it.
    fn check_size(&self, key_len: usize, value_len: usize, flags: u32) -> Result<(), StoreError> {
        let len = crate::config::item_size_bytes(key_len, value_len, flags, self.cas_counted);
        if len > self.item_size_max {
            Err(StoreError::TooLarge {
                len,
                max: self.item_size_max,
            })
        } else {
            Ok(())
        }
    }

    fn emit_put(&self, loc: u64, ctx: &Ctx<'_>) {
        if ctx.sink.is_some() {
            let h = self.header(loc);
            let b = loc as usize;
            ctx.emit(ChangeKind::Put {
                key: &self.arena[b + h.key_offset..b + h.key_offset + h.key_len],
                value: &self.arena[b + h.value_offset()..b + h.total_len],
                flags: h.flags,
                expiry: Expiry::at(h.expiry),
                cas: h.cas,
                stale: h.ctrl & CTRL_STALE != 0,
            });
        }
    }

    pub fn write(
        &mut self,
        hash: u64,
        req: &WriteRequest<'_>,
        now: u32,
        ctx: &Ctx<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        Self::check_key(req.key)?;
        self.check_size(req.key.len(), req.value.len(), req.flags)?;
        let existing = self.lookup(hash, req.key, now);
        let present = existing.is_some();
        match req.mode {
            WriteMode::Add if present => return Ok(WriteOutcome::NotStored),
            WriteMode::Replace | WriteMode::Append | WriteMode::Prepend if !present => {
                return Ok(WriteOutcome::NotStored);
            }
            _ => {}
        }
        let mut state = 0;
        let mut keep_expiry = None;
        if let Some(expected) = req.compare_cas {
            match &existing {
                None => return Ok(WriteOutcome::NotFound),
                Some((_, _, h)) if h.cas != expected => {
                    if req.invalidate && expected < h.cas {
                        // As memcached's CAS_STALE: the new value stays stale, keeps the
                        // item's TTL and whether its win token was already handed out.
                        state = CTRL_STALE | (h.ctrl & CTRL_WIN);
                        keep_expiry = Some(Expiry::at(h.expiry));
                    } else {
                        return Ok(WriteOutcome::Exists);
                    }
                }
                Some(_) => {}
            }
        }
        let cas = ctx.cas_for(req.new_cas);
        let loc = match (req.mode, existing) {
            (WriteMode::Append | WriteMode::Prepend, Some((_, loc, h))) => {
                let total = h.value_len + req.value.len();
                self.check_size(req.key.len(), total, h.flags)?;
                // The old value must be copied out first: making room may evict or compact it.
                let mut buf = std::mem::take(&mut self.scratch);
                buf.clear();
                // Exact, not amortized growth: the scratch buffer's bound is one largest item.
                buf.reserve_exact(total);
                let old = &self.arena[loc as usize + h.value_offset()..loc as usize + h.total_len];
                if req.mode == WriteMode::Append {
                    buf.extend_from_slice(old);
                    buf.extend_from_slice(req.value);
                } else {
                    buf.extend_from_slice(req.value);
                    buf.extend_from_slice(old);
                }
                let r = self.store_item(
                    hash,
                    req.key,
                    &buf,
                    h.flags,
                    Expiry::at(h.expiry),
                    cas,
                    state | (h.ctrl & CTRL_KEY_BINARY),
                    now,
                );
                self.scratch = buf;
                r?
            }
            _ => self.store_item(
                hash,
                req.key,
                req.value,
                req.flags,
                keep_expiry.unwrap_or(req.expiry),
                cas,
                state,
                now,
            )?,
        };
        self.emit_put(loc, ctx);
        Ok(WriteOutcome::Stored { cas })
    }

    pub fn read<R>(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        opts: ReadOptions,
        ctx: &Ctx<'_>,
        f: impl FnOnce(ItemView<'_>) -> R,
    ) -> Option<R> {
        // A touch is applied after the value is read (as memcached's gat/mg T): a touch to
        // a past or negative exptime still returns the value once, then the item expires.
        let Some((slot, loc, h)) = self.lookup(hash, key, now) else {
            self.counters.get_misses += 1;
            return None;
        };
        debug_assert_eq!(self.index.loc_at(slot), Some(loc));
        self.counters.get_hits += 1;
        let s = slab_of(loc, self.slab_size);
        let last_access = self.slabs.meta[s as usize].last_access;
        let ctrl = h.ctrl;
        let mut won = false;
        let mut new_ctrl = ctrl;
        if opts.claim_win && ctrl & CTRL_WIN == 0 {
            new_ctrl |= CTRL_WIN;
            won = true;
        }
        if !opts.no_bump {
            new_ctrl |= CTRL_FETCHED;
            self.slabs.meta[s as usize].last_access = now;
            self.policy.on_access(s);
        }
        // Hot items are read from several threads: write the byte only when it changes, so
        // repeated hits do not dirty the item's cache line.
        if new_ctrl != ctrl {
            self.arena[loc as usize] = new_ctrl;
        }
        let b = loc as usize;
        let result = f(ItemView {
            key: &self.arena[b + h.key_offset..b + h.key_offset + h.key_len],
            value: &self.arena[b + h.value_offset()..b + h.total_len],
            flags: h.flags,
            cas: h.cas,
            expiry: opts.touch.unwrap_or(Expiry::at(h.expiry)),
            fetched_before: ctrl & CTRL_FETCHED != 0,
            stale: ctrl & CTRL_STALE != 0,
            won,
            win_token_taken: ctrl & CTRL_WIN != 0,
            slab_last_access_secs: last_access,
            item_bytes: h.total_len,
            key_binary: ctrl & CTRL_KEY_BINARY != 0,
        });
        if let Some(expiry) = opts.touch {
            // The item was just found under this lock, so the touch finds it too (it may only
            // fail to rewrite a header without an expiry field when memory is exhausted, and
            // then the item keeps its old expiry, as a failed memcached touch does).
            self.touch(hash, key, expiry, now, ctx);
        }
        Some(result)
    }

    pub fn touch(
        &mut self,
        hash: u64,
        key: &[u8],
        expiry: Expiry,
        now: u32,
        ctx: &Ctx<'_>,
    ) -> bool {
        let Some((_, loc, h)) = self.lookup(hash, key, now) else {
            return false;
        };
        if let Some(off) = h.expiry_offset {
            let at = loc as usize + off;
            self.arena[at..at + 4].copy_from_slice(&expiry.as_unix_secs().to_le_bytes());
        } else if !expiry.is_never() {
            // No expiry field to overwrite: write a new version with the same CAS and state.
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.reserve_exact(h.key_len + h.value_len);
            buf.extend_from_slice(
                &self.arena[loc as usize + h.key_offset..loc as usize + h.total_len],
            );
            let (k, v) = buf.split_at(h.key_len);
            let state = h.ctrl & CTRL_STATE;
            let r = self.store_item(hash, k, v, h.flags, expiry, h.cas, state, now);
            self.scratch = buf;
            match r {
                // The item moved to another slab: report its full state, so that a range scan
                // that already passed the new slab still gets the item through the feed.
                Ok(new_loc) => {
                    self.emit_put(new_loc, ctx);
                    return true;
                }
                Err(_) => return false,
            }
        }
        ctx.emit(ChangeKind::Touch { key, expiry });
        true
    }

    /// Marks the item as stored through a base64 key (meta `b`), in place.
    pub fn mark_key_binary(&mut self, hash: u64, key: &[u8], now: u32) {
        if let Some((_, loc, h)) = self.lookup(hash, key, now) {
            self.arena[loc as usize] = h.ctrl | CTRL_KEY_BINARY;
        }
    }

    pub fn delete(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        opts: DeleteOptions,
        ctx: &Ctx<'_>,
    ) -> DeleteOutcome {
        let Some((slot, loc, h)) = self.lookup(hash, key, now) else {
            return DeleteOutcome::NotFound;
        };
        if opts.compare_cas.is_some_and(|c| c != h.cas) {
            return DeleteOutcome::Exists;
        }
        if opts.invalidate {
            // A new version with a new CAS (memcached's md I): copy the key and value out
            // first, since making room for the new version may move or evict the old one.
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.reserve_exact(h.key_len + h.value_len);
            buf.extend_from_slice(
                &self.arena[loc as usize + h.key_offset..loc as usize + h.total_len],
            );
            let (k, v) = buf.split_at(h.key_len);
            let state = (h.ctrl & (CTRL_FETCHED | CTRL_KEY_BINARY)) | CTRL_STALE;
            let cas = ctx.cas_for(opts.new_cas);
            let r = self.store_item(hash, k, v, h.flags, Expiry::at(h.expiry), cas, state, now);
            self.scratch = buf;
            match r {
                Ok(new_loc) => self.emit_put(new_loc, ctx),
                // No room for the new version: mark the old one stale in place, keeping its
                // CAS (the invalidation itself must not fail for lack of memory).
                Err(_) => {
                    if let Some((_, loc, h)) = self.lookup(hash, key, now) {
                        self.arena[loc as usize] = (h.ctrl | CTRL_STALE) & !CTRL_WIN;
                        self.emit_put(loc, ctx);
                    }
                }
            }
        } else {
            self.unlink(slot, loc, &h, Unlink::Deleted);
            ctx.emit(ChangeKind::Delete { key });
        }
        DeleteOutcome::Deleted
    }

    pub fn arith(
        &mut self,
        hash: u64,
        key: &[u8],
        now: u32,
        req: &ArithRequest,
        ctx: &Ctx<'_>,
    ) -> Result<ArithOutcome, StoreError> {
        Self::check_key(key)?;
        let Some((_, loc, h)) = self.lookup(hash, key, now) else {
            let Some((initial, expiry)) = req.autovivify else {
                return Ok(ArithOutcome::NotFound);
            };
            let cas = ctx.cas_for(req.new_cas);
            let digits = initial.to_string();
            let loc = self.store_item(hash, key, digits.as_bytes(), 0, expiry, cas, 0, now)?;
            self.emit_put(loc, ctx);
            return Ok(ArithOutcome::Value {
                value: initial,
                cas,
                created: true,
            });
        };
        if req.compare_cas.is_some_and(|c| c != h.cas) {
            return Ok(ArithOutcome::Exists);
        }
        let value = &self.arena[loc as usize + h.value_offset()..loc as usize + h.total_len];
        let current = parse_counter(value).ok_or(StoreError::NonNumeric)?;
        let new = if req.decrement {
            current.saturating_sub(req.delta)
        } else {
            current.wrapping_add(req.delta)
        };
        // memcached keeps the value's length when the result is shorter, padding the digits
        // with spaces (it rewrites the number in place); a longer result grows the value.
        let mut digits = new.to_string().into_bytes();
        if digits.len() < value.len() {
            digits.resize(value.len(), b' ');
        }
        self.check_size(key.len(), digits.len(), h.flags)?;
        let cas = ctx.cas_for(req.new_cas);
        let loc = self.store_item(
            hash,
            key,
            &digits,
            h.flags,
            Expiry::at(h.expiry),
            cas,
            h.ctrl & CTRL_KEY_BINARY,
            now,
        )?;
        self.emit_put(loc, ctx);
        Ok(ArithOutcome::Value {
            value: new,
            cas,
            created: false,
        })
    }

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

    /// Number of slabs (scan positions).
    pub fn slab_count(&self) -> usize {
        self.slabs.len()
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
        s.get_hits += c.get_hits;
        s.get_misses += c.get_misses;
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
    }
}

/// memcached's rule: the value must be a decimal u64, optionally followed by spaces (memcached
/// itself pads shrunk counters with spaces).
/// The number an `incr`/`decr` reads from a stored value, as memcached's `safe_strtoull`
/// does: leading whitespace (`isspace`: space, `\t`, `\n`, `\v`, `\f`, `\r`), an optional
/// sign, at least one decimal digit, and then either the end of the value or whitespace
/// (what follows that is ignored: `"1 2"` reads 1). A `-` is accepted only when the
/// magnitude is 0, since strtoull negates and memcached refuses a result that went negative.
/// A value of whitespace only is not a number: memcached's strtoull then runs past the value
/// into the bytes after it in its slab, which gives no defined answer to copy.
fn parse_counter(value: &[u8]) -> Option<u64> {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let start = value.iter().position(|&b| !is_space(b))?;
    let mut rest = &value[start..];
    let negative = match rest.first() {
        Some(b'-') => {
            rest = &rest[1..];
            true
        }
        Some(b'+') => {
            rest = &rest[1..];
            false
        }
        _ => false,
    };
    let digits_end = rest
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(rest.len());
    if digits_end == 0 || rest.get(digits_end).is_some_and(|&b| !is_space(b)) {
        return None;
    }
    let mut n: u64 = 0;
    for &d in &rest[..digits_end] {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative && n != 0 {
        return None;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::parse_counter;

    #[test]
    fn counter_parsing_follows_memcached() {
        assert_eq!(parse_counter(b"42"), Some(42));
        assert_eq!(parse_counter(b"7  "), Some(7));
        assert_eq!(parse_counter(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_counter(b"18446744073709551616"), None);
        assert_eq!(parse_counter(b""), None);
        assert_eq!(parse_counter(b"-1"), None);
        assert_eq!(parse_counter(b"12a"), None);
    }

    /// Values memcached 1.6.18 reads as numbers (measured: `set n 0 0 4` `  12`, `incr n 1`
    /// answers 13), and those it calls non-numeric.
    #[test]
    fn counter_parsing_accepts_what_strtoull_accepts() {
        assert_eq!(parse_counter(b"  12"), Some(12));
        assert_eq!(parse_counter(b" 12 "), Some(12));
        assert_eq!(parse_counter(b"\t12"), Some(12));
        assert_eq!(parse_counter(b"+12"), Some(12));
        assert_eq!(parse_counter(b"012"), Some(12));
        assert_eq!(parse_counter(b"1 2"), Some(1));
        assert_eq!(parse_counter(b"-0"), Some(0));
        assert_eq!(parse_counter(b"00000000000000000000012"), Some(12));
        assert_eq!(parse_counter(b"  "), None);
        assert_eq!(parse_counter(b"+"), None);
        assert_eq!(parse_counter(b"-12"), None);
        assert_eq!(parse_counter(b"0x10"), None);
        assert_eq!(parse_counter(b"99999999999999999999"), None);
    }
}

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
use crate::eviction::{
    EvictionPolicy, LeastLiveOfLru, S3Fifo, SecondChanceFifo, SlabLru, SlabView,
};
use crate::expiry::Expiry;
use crate::feed::{Change, ChangeKind, ChangeSink};
use crate::ghost::Ghost;
use crate::index::{Index, SLOT_BYTES, SLOTS_PER_BUCKET};
use crate::item::{
    self, CTRL_FETCHED, CTRL_KEY_BINARY, CTRL_STALE, CTRL_STATE, CTRL_WIN, Header, ItemFields,
};
use crate::ops::*;
use crate::slab::{ListId, SlabId, SlabMeta, Slabs};
use crate::stats::{ShardCounters, Stats};
use cellcache_keyspace::HashRange;

mod ops;
mod presence;
mod promote;
mod ranges;
mod space;
mod switch;

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

/// What a lookup found.
enum Lookup {
    /// The item: its index slot, location and header.
    Live(usize, u64, Header),
    /// The item had expired: it was reclaimed.
    Expired,
    /// No item.
    Absent,
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
    /// S3-FIFO: the main queue's open slab, which promoted items are moved into. It is kept
    /// on the full list, so new items never land in it.
    main_head: Option<SlabId>,
    /// S3-FIFO: ticks once per clearing (`shard::promote`).
    move_clock: u64,
    /// S3-FIFO: per slab, the `move_clock` at which items were last moved into it (0: never);
    /// a range scan visits the slabs moved into after its pass began again.
    moved_in: Vec<u64>,
    /// S3-FIFO's ghost table, in slabs of the arena (`ListId::Ghost`).
    ghost: Option<Ghost>,
    /// The policy reads the index's access counters (S3-FIFO): reads and rewrites count.
    counts_frequency: bool,
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
        let policy = switch::new_policy(c.eviction, slabs.len());
        let mut shard = Shard {
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
            main_head: None,
            move_clock: 0,
            moved_in: vec![0; slab_count],
            ghost: None,
            counts_frequency: matches!(c.eviction, EvictionPolicyKind::S3Fifo { .. }),
        };
        if let EvictionPolicyKind::S3Fifo { ghost_permille, .. } = c.eviction {
            shard.reserve_ghost(ghost_permille);
        }
        Ok(shard)
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
        // Per slab: its metadata, two recency lists (S3-FIFO's small and main; the other
        // policies use one), its compaction queue entry, `main_since` and a ghost entry.
        n * (std::mem::size_of::<SlabMeta>()
            + 2 * (2 * 4 + 1)
            + std::mem::size_of::<SlabId>()
            + 8
            + 8
            + std::mem::size_of::<SlabId>())
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

    /// The first stage of a read ahead: asks for the cache lines of `hash`'s index buckets
    /// (see [`Index::touch`]; the result only feeds `black_box`).
    pub(crate) fn touch_buckets(&self, hash: u64) -> u64 {
        self.index.touch(self.index.probe(hash))
    }

    /// The second stage: asks for the first cache line of every item whose slot's tag
    /// matches `hash` (the header and key [`Shard::find_slot`] compares), once the buckets
    /// are in cache.
    pub(crate) fn touch_items(&self, hash: u64) -> u64 {
        let mut touched = 0;
        self.index.find(self.index.probe(hash), |_, loc| {
            touched ^= u64::from(self.arena[loc as usize]);
            false
        });
        touched
    }

    fn find_slot(&self, hash: u64, key: &[u8]) -> Option<usize> {
        let p = self.index.probe(hash);
        self.index.find(p, |_, loc| self.key_at(loc) == key)
    }

    /// The live, unexpired item for `key`: (slot, loc, header). Reclaims it if expired.
    fn lookup(&mut self, hash: u64, key: &[u8], now: u32) -> Option<(usize, u64, Header)> {
        match self.lookup_why(hash, key, now) {
            Lookup::Live(slot, loc, h) => Some((slot, loc, h)),
            Lookup::Expired | Lookup::Absent => None,
        }
    }

    /// [`Shard::lookup`], saying whether a miss found the item expired (and reclaimed it).
    fn lookup_why(&mut self, hash: u64, key: &[u8], now: u32) -> Lookup {
        let Some((slot, loc)) = self
            .find_slot(hash, key)
            .and_then(|slot| Some((slot, self.index.loc_at(slot)?)))
        else {
            return Lookup::Absent;
        };
        let h = self.header(loc);
        if Expiry::at(h.expiry).is_expired(now) {
            self.unlink(slot, loc, &h, Unlink::Expired);
            return Lookup::Expired;
        }
        Lookup::Live(slot, loc, h)
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
        if self.main_head == Some(s) {
            self.main_head = None;
        }
        // `compaction_queued` stays: it says whether the slab is in the queue, and a stale
        // entry is skipped when popped. Resetting it here could queue the slab twice.
        self.slabs.move_to(s, ListId::Free);
        self.policy.on_release(s);
    }

    /// Drops every item (flush_all taking effect); returns how many there were.
    pub fn clear_all(&mut self) -> usize {
        let items = self.index.len();
        self.index.clear();
        for s in 0..self.slabs.len() as SlabId {
            if !matches!(
                self.slabs.meta[s as usize].list,
                ListId::Free | ListId::Ghost
            ) {
                self.release(s);
            }
        }
        self.compaction_queue.clear();
        for m in &mut self.slabs.meta {
            m.compaction_queued = false;
        }
        items
    }

    /// Counts `items` whose memory a flush reclaimed.
    pub fn count_reclaimed(&mut self, items: usize) {
        self.counters.reclaimed += items as u64;
    }

    /// The item at byte `off` of slab `s`, if `off` is below the slab's write offset. Slab walks
    /// step with this instead of collecting items, so that clearing or compacting a slab
    /// allocates nothing (the memory bound, `memory_limit` plus `Store::overhead_bytes_max`, is
    /// checked with a counting allocator in tests/memory.rs).
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
        // A key S3-FIFO dropped from its small queue unread and wanted again soon goes to the
        // main queue's open slab; without room there, to the small queue marked accessed, so
        // its slab's first clearing moves it to main.
        let admitted = self.ghost_take(hash);
        let in_main = if admitted {
            self.counters.ghost_hits += 1;
            self.alloc_in_main_head(|base| item::encoded_len(&fields, base))
        } else {
            None
        };
        let (loc, len) = match in_main {
            Some(place) => place,
            None => self.alloc(|base| item::encoded_len(&fields, base), cas, now)?,
        };
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
            // A rewrite of a present key is an access (S3-FIFO's frequency).
            self.bump_freq(slot);
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
        if admitted && in_main.is_none() {
            // In the small queue, counted as accessed: its slab's first clearing promotes it.
            if let Some(slot) = self.index.find_loc(p, loc) {
                self.bump_freq(slot);
            }
        }
        let m = &mut self.slabs.meta[s as usize];
        m.last_access = now;
        self.policy.on_access(s);
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
}
